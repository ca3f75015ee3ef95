"""Where the compiled TensorSRHT path's forward + backward goes: a developer's profile.

Times the internal numba kernels alone (the forward kernel, and the backward kernel stopped
after its recomputed transforms and gathers, after the products with the incoming gradient, and
complete) against the whole forward + backward through ``PolynomialSketchKernel.real_features``,
on the setting of part 2 of ``benchmarks/polynomial_sketches.py`` (d = 1024: 1023 inputs + the
bias, degree 7, D = 5d, float32, real features). It reaches into
``rfgp.kernels._sketches._srht_numba``, which the benchmarks, as users of the public API, do not.

Usage::

    python tools/tensorsrht_stages.py [--rows N] [--repeats R] [--threads T ...]

Prints a Markdown table: each stage's time and its share of the whole forward + backward.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rfgp.kernels import PolynomialSketchKernel  # noqa: E402
from rfgp.kernels._sketches import _srht_numba  # noqa: E402

STAGES = [
    ("forward kernel: features (transforms, gathers, products, store)",
     lambda tm: tm["forward"]),
    ("backward: transforms and gathers recomputed per tile", lambda tm: tm["backward-1"]),
    ("backward: products of the other degrees' factors with the incoming gradient",
     lambda tm: tm["backward-2"] - tm["backward-1"]),
    ("backward: scatter, transposed transforms, signed accumulation, store",
     lambda tm: tm["backward-3"] - tm["backward-2"]),
    ("other: input checks, lengthscale and bias, reductions, autograd",
     lambda tm: tm["whole"] - tm["forward"] - tm["backward-3"]),
]


def timings(num_rows: int, repeats: int) -> dict:
    """Best-of-``repeats`` seconds of the whole forward + backward and of each kernel stage."""
    degree, size = 7, 5 * 1024
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(num_rows, 1023, generator=gen)
    x = x / x.norm(dim=-1, keepdim=True)
    grad = torch.randn(num_rows, size, generator=gen)
    k = PolynomialSketchKernel(degree, size, bias=1.0, projection="tensorsrht", seed=0)
    k.real_features(x[:128]).sum().backward()  # draws the weights, compiles the kernels
    w = {name: getattr(k, name) for name in k.random_weight_names}
    with torch.no_grad():
        scale = k.lengthscale.reshape(-1)
        root = k.bias.sqrt().reshape(())

    def whole():
        k.zero_grad(set_to_none=True)
        k.real_features(x).backward(grad)

    fns = {"whole": whole,
           "forward": lambda: _srht_numba.tensorsrht(x, w["signs"], w["indices"], False, scale,
                                                     root)}
    for stage in (1, 2, 3):
        fns[f"backward-{stage}"] = lambda stage=stage: _srht_numba.tensorsrht_backward(
            x, w["signs"], w["indices"], False, grad, scale, root, stages=stage)
    best = {key: float("inf") for key in fns}
    for _ in range(repeats):  # alternated, so that other jobs' load spreads over all stages
        for key, fn in fns.items():
            start = time.perf_counter()
            fn()
            best[key] = min(best[key], time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=10_000, help="N (default 10^4)")
    parser.add_argument("--repeats", type=int, default=3, help="rounds (best of)")
    parser.add_argument("--threads", type=int, nargs="+", default=[1], help="torch threads")
    args = parser.parse_args()
    if not _srht_numba.available():
        sys.exit("the compiled kernels are unavailable here (numba missing or "
                 "RFGP_DISABLE_NUMBA set)")
    results = {}
    for count in args.threads:
        torch.set_num_threads(count)
        results[count] = timings(args.rows, args.repeats)
    print("| stage | " + " | ".join(f"{t} thread(s): time (s) | share" for t in results) + " |")
    print("|---|" + "---|---|" * len(results))
    for name, value in STAGES:
        cells = [f"{value(tm):.3f} | {value(tm) / tm['whole']:.0%}" for tm in results.values()]
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
