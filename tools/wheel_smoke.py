"""Build rfgp's sdist and wheel and check the wheel in a fresh virtual environment.

Steps: ``python -m build`` (the sdist, then the wheel built from it, as pip would) into a
temporary folder; a new virtual environment there (without the system's site-packages); torch
installed first (``--torch``, the CPU build pinned by the Makefile), then the wheel with the
``sklearn`` extra; and, run from an empty temporary folder so that the source tree cannot be
imported, :func:`check`: the installed package, its version, its license and bundled data,
and GP regression on the bundled ``concrete`` set by ``rfgp.fit_auto`` and by
``rfgp.sklearn.RandomFeatureGPRegressor`` (finite predictions, test RMSE well below the 1 of
predicting the mean on standardised targets).

Usage::

    python tools/wheel_smoke.py [--torch "torch==2.13.0"] [--keep]   # make wheel-smoke
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: test RMSE (standardised targets) that a working fit stays below; the mean predictor has ~1
RMSE_LIMIT = 0.6


def check() -> None:
    """The checks run by the fresh environment's Python (``--check``)."""
    import importlib.metadata
    import importlib.resources
    import math

    import numpy as np
    import torch

    import rfgp
    from rfgp import metrics
    from rfgp.datasets import load_uci, load_wind, standardize, train_test_split
    from rfgp.sklearn import RandomFeatureGPRegressor

    # One thread: the fits are small, and OpenMP threads competing on a busy machine made them
    # several times slower.
    torch.set_num_threads(1)
    installed = Path(rfgp.__file__).resolve()
    assert Path(sys.prefix).resolve() in installed.parents, f"rfgp imported from {installed}"
    assert importlib.metadata.version("rfgp") == rfgp.__version__
    licenses = [f for f in importlib.metadata.files("rfgp") if f.name == "LICENSE"]
    assert licenses, "the wheel carries no LICENSE"
    data = importlib.resources.files("rfgp.datasets") / "data"
    for note in ("README.md", "uci/LICENSE-source.txt", "uci-large/LICENSE-source.txt",
                 "wind/LICENSE-source.txt"):
        assert (data / note).is_file(), f"missing bundled file data/{note}"
    assert load_uci("elevators")[0].shape == (16599, 18)  # a gzip-compressed set
    assert load_wind() is not None

    x, y = load_uci("concrete")
    x_train, y_train, x_test, y_test = train_test_split(
        x, y, test_fraction=0.1, generator=torch.Generator().manual_seed(0))
    x_train, x_test, _, _ = standardize(x_train, x_test)
    y_train, y_test, _, _ = standardize(y_train, y_test)

    start = time.perf_counter()
    gp = rfgp.fit_auto(x_train, y_train, num_features=256, seed=0)
    mean, std = gp.predict(x_test, return_std=True)
    assert bool(torch.isfinite(mean).all() and torch.isfinite(std).all() and (std > 0).all())
    rmse = float(metrics.rmse(y_test, mean))
    print(f"fit_auto (D=256): test RMSE {rmse:.3f} ({time.perf_counter() - start:.1f} s)")
    assert rmse < RMSE_LIMIT, f"fit_auto's test RMSE {rmse:.3f} >= {RMSE_LIMIT}"

    start = time.perf_counter()
    model = RandomFeatureGPRegressor(num_features=256, random_state=0)
    pred, sd = model.fit(x_train.numpy(), y_train.numpy()).predict(x_test.numpy(),
                                                                      return_std=True)
    assert np.isfinite(pred).all() and np.isfinite(sd).all()
    rmse = math.sqrt(float(np.mean((pred - y_test.numpy()) ** 2)))
    print(f"RandomFeatureGPRegressor (D=256): test RMSE {rmse:.3f} "
          f"({time.perf_counter() - start:.1f} s)")
    assert rmse < RMSE_LIMIT, f"the estimator's test RMSE {rmse:.3f} >= {RMSE_LIMIT}"
    print(f"rfgp {rfgp.__version__} from {installed.parent}: wheel smoke test passed")


def _run(*cmd: str, cwd: Path | None = None) -> None:
    print("+", " ".join(cmd), flush=True)
    start = time.perf_counter()
    subprocess.run(cmd, cwd=cwd, check=True)
    print(f"  ({time.perf_counter() - start:.0f} s)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--torch", default="torch==2.13.0",
                        help="the torch requirement, installed first")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    parser.add_argument("--check", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.check:
        check()
        return
    start = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="rfgp-wheel-"))
    try:
        _run(sys.executable, "-m", "build", "-q", "--outdir", str(work / "dist"), str(ROOT))
        wheels = sorted((work / "dist").glob("rfgp-*.whl"))
        assert len(wheels) == 1, f"expected one wheel, built {wheels}"
        _run(sys.executable, "-m", "venv", str(work / "venv"))
        python = str(work / "venv" / "bin" / "python")
        _run(python, "-m", "pip", "install", "-q", args.torch)
        _run(python, "-m", "pip", "install", "-q", f"{wheels[0]}[sklearn]")
        empty = work / "run"
        empty.mkdir()
        _run(python, str(Path(__file__).resolve()), "--check", cwd=empty)
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    print(f"wheel smoke test: {time.perf_counter() - start:.0f} s in all")


if __name__ == "__main__":
    main()
