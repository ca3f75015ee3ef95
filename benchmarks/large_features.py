"""Many features: the iterative solve (``solve="cg"``) against the Cholesky solve as ``D`` grows.

Random features approach the exact GP as ``D`` grows; past about 8192 features the weight-space
solve's ``D x D`` matrix and its Cholesky factor no longer fit, and ``solve="cg"`` (matrix-free
preconditioned conjugate gradients) takes over. Per data set:

* data: the bundled ``keggundirected``, ``tamielectric`` and ``bike`` sets
  (``rfgp.datasets.load_uci``; random 90/10 split, inputs and targets standardised with the
  training statistics) and a synthetic set of 10^5 rows, ``d = 8``,
  ``f(x) = sum_j sin(2 x_j) / sqrt(d)`` plus noise of known variance 0.01;
* hyperparameters (``bike``'s noise comes out near 1e-6: its count target is a sum of two of its
  inputs, which makes its systems ill-conditioned for CG and its MNLL large at any ``D``):
  found once by ``rfgp.fit_auto`` on the first 4000 training rows at 512
  features (no Laplace average, no local stage), then fixed: lengthscales, outputscale and
  noise; only the solver and ``D`` vary (random Fourier features, seed 0);
* for each ``D`` in ``--sizes`` (1024 ... 65536): a CG fit (relative residual 1e-6, automatic
  Nyström rank) and, while ``D <= --cholesky-max``, a Cholesky fit (``solve="weight"``); test
  RMSE on every test row, MNLL (latent variance plus noise) on the first ``--mnll-rows`` test
  rows (each variance is a CG solve); fit time and peak memory (in a spawned process: on the
  CPU a fresh one per fit, and the growth of its peak resident set during the fit; on a GPU
  ``torch.cuda.max_memory_allocated`` during the fit); the wall time of the whole measurement
  (data, fit and scores);
* CG iterations to the 1e-6 residual with the preconditioner and, while
  ``D <= --plain-max``, without (``preconditioner_rank=0``, at most 5000 iterations).

Usage::

    python benchmarks/large_features.py                 # full run (hours on 2 cores; use a GPU)
    python benchmarks/large_features.py --device cuda   # on a GPU
    python benchmarks/large_features.py --quick         # about a minute, into a temporary folder

On a machine lent for minutes, search the hyperparameters beforehand on any machine and keep
each result as it comes::

    python benchmarks/large_features.py --sets bike synthetic --hyper-only hyper.json
    python benchmarks/large_features.py --device cuda --sets bike synthetic --hyper hyper.json \
        --records out.jsonl --deadline 300

Writes docs/benchmarks/large_features.md, .json and .png (RMSE and fit time against ``D``).
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import platform
import resource
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _pages import device_name, synchronize, write_page  # noqa: E402

OUT = ROOT / "docs" / "benchmarks"
SETS = ["keggundirected", "tamielectric", "bike", "synthetic"]
SYNTHETIC_NOISE = 0.01


# ====================================================================== data
def load(name: str, rows: int):
    """``(x_train, y_train, x_test, y_test)``, standardised with the training statistics."""
    from rfgp.datasets import load_uci, standardize, train_test_split

    if name == "synthetic":
        g = torch.Generator().manual_seed(0)
        x = torch.rand(rows, 8, generator=g, dtype=torch.float64) * 4 - 2
        y = torch.sin(2 * x).sum(-1) / math.sqrt(8)
        y = y + math.sqrt(SYNTHETIC_NOISE) * torch.randn(rows, generator=g, dtype=torch.float64)
    else:
        x, y = load_uci(name)
        x, y = x[:rows], y[:rows]
    xtr, ytr, xte, yte = train_test_split(x, y, 0.1, torch.Generator().manual_seed(0))
    xtr, xte, _, _ = standardize(xtr, xte)
    if name == "synthetic":  # keep the known noise variance: targets are not rescaled
        return xtr, ytr, xte, yte
    ytr, yte, _, _ = standardize(ytr, yte)
    return xtr, ytr, xte, yte


def hyperparameters(name: str, rows: int, search_rows: int) -> dict:
    """Lengthscales, outputscale and noise from a cheap evidence search at small ``D``."""
    from rfgp import fit_auto

    xtr, ytr, _, _ = load(name, rows)
    gp = fit_auto(xtr[:search_rows], ytr[:search_rows], num_features=512, search_features=512,
                  lengthscale_draws=0, local_search=False, cv_folds=0, seed=0)
    fm = gp.feature_map
    outputscale = 1.0 if fm.scale is None else float(fm.scale.outputscale)
    return {"lengthscale": fm.base.lengthscale.detach().reshape(-1).tolist(),
            "outputscale": outputscale, "noise": float(gp.noise)}


# ====================================================================== one fit
def measure(spec: dict) -> dict:
    """One fit and its test scores, in a fresh process (its peak memory is the fit's)."""
    from gpytorch.kernels import ScaleKernel

    from rfgp import RandomFeatureGP
    from rfgp.kernels import FourierFeatureKernel

    torch.set_num_threads(spec["threads"])
    warnings.filterwarnings("ignore")
    device = torch.device(spec["device"])
    xtr, ytr, xte, yte = (t.to(device) for t in load(spec["set"], spec["rows"]))
    hyper = spec["hyper"]
    base = FourierFeatureKernel(spec["D"], ard_num_dims=xtr.shape[1], seed=0).double()
    base.lengthscale = torch.tensor(hyper["lengthscale"], dtype=torch.float64)
    kernel = ScaleKernel(base).double()
    kernel.outputscale = hyper["outputscale"]
    kernel = kernel.to(device)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    options = {} if spec["solve"] == "weight" else {"preconditioner_rank": spec["rank"],
                                                    "max_cg_iterations": spec["max_iterations"]}
    gp = RandomFeatureGP(kernel, noise=hyper["noise"], solve=spec["solve"], **options)
    synchronize(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    started = time.perf_counter()
    gp.fit(xtr, ytr)
    synchronize(device)
    seconds = time.perf_counter() - started
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device) / 2**20
    else:
        # The process's peak resident set above its peak before the fit (data, imports).
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - before
    out = {"set": spec["set"], "D": spec["D"], "solve": spec["solve"], "rank": spec["rank"],
           "seconds": seconds, "peak_mb": peak}
    if spec["solve"] == "cg":
        out["iterations"] = gp.cg_info["iterations"]
        out["preconditioner_rank"] = gp.cg_info["preconditioner_ranks"]
    if spec.get("scores", True):
        with torch.no_grad():
            mean = gp.predict(xte)
            out["rmse"] = float((mean - yte).square().mean().sqrt())
            m = min(spec["mnll_rows"], xte.shape[0])
            mu, std = gp.predict(xte[:m], return_std=True)
            var = std.square() + hyper["noise"]
            nll = 0.5 * torch.log(2 * math.pi * var) + 0.5 * (yte[:m] - mu).square() / var
            out["mnll"] = float(nll.mean())
    return out


class Worker:
    """A spawned process that runs :func:`measure` (its peak memory is the fits', not this
    process's), stopped and replaced when a fit outlasts its time, or this process itself for
    ``--quick`` (the memory column is then not the fit's alone)."""

    def __init__(self, inline: bool, device: str):
        self.inline = inline
        # On the CPU the peak resident set is the process's, so each fit gets a fresh one; on
        # a GPU the allocator's peak is reset per fit and one process serves them all.
        self.fits_per_process = 1 if device == "cpu" else None
        self.pool = None

    def run(self, spec: dict, timeout: float) -> dict:
        if self.inline:
            return measure(spec)
        if self.pool is None:
            self.pool = multiprocessing.get_context("spawn").Pool(
                1, maxtasksperchild=self.fits_per_process)
        head = {"set": spec["set"], "D": spec["D"], "solve": spec["solve"], "rank": spec["rank"]}
        try:
            # An infinite deadline waits without limit (get() takes no infinite timeout).
            return self.pool.apply_async(measure, (spec,)).get(
                timeout if math.isfinite(timeout) else None)
        except multiprocessing.TimeoutError:
            self.close()
            return dict(head, error=f"stopped after {timeout:.0f} s (--deadline)")
        except Exception as err:  # a fit that does not fit in memory is a result too
            return dict(head, error=f"{type(err).__name__}: {err}"[:200])

    def close(self) -> None:
        if self.pool is not None:
            self.pool.terminate()
            self.pool.join()
            self.pool = None


# ====================================================================== pages
def plot(results: list, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sets = sorted({r["set"] for r in results})
    fig, axes = plt.subplots(2, len(sets), figsize=(4 * len(sets), 6.5), squeeze=False)
    for col, name in enumerate(sets):
        for solve, style in (("cg", "o-"), ("weight", "s--")):
            rows = [r for r in results if r["set"] == name and r["solve"] == solve
                    and r.get("rank") is None and "rmse" in r]
            if not rows:
                continue
            sizes = [r["D"] for r in rows]
            axes[0][col].plot(sizes, [r["rmse"] for r in rows], style, label=solve)
            axes[1][col].plot(sizes, [r["seconds"] for r in rows], style, label=solve)
        axes[0][col].set_title(name)
        for row in (0, 1):
            axes[row][col].set_xscale("log", base=2)
            axes[row][col].legend()
        axes[0][col].set_ylabel("test RMSE")
        axes[1][col].set_ylabel("fit seconds")
        axes[1][col].set_yscale("log")
        axes[1][col].set_xlabel("D")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _cell(value, fmt):
    return "—" if value is None else format(value, fmt)


def write_markdown(results: list, hyper: dict, args, path: Path, seconds: float) -> None:
    lines = [
        "# Many features: conjugate gradients against Cholesky",
        "",
        f"Generated by `benchmarks/large_features.py` ({'quick' if args.quick else 'full'} "
        f"run, {seconds:.0f} s, device {args.device}, {args.threads} thread(s), "
        f"{platform.processor() or platform.machine()}). See the script's docstring for the "
        "protocol. Hyperparameters (fixed for every `D`):",
        "",
    ]
    for name, h in hyper.items():
        lines.append(f"- {name}: outputscale {h['outputscale']:.3g}, noise {h['noise']:.3g}, "
                     f"lengthscales {', '.join(f'{v:.3g}' for v in h['lengthscale'])}")
    lines += ["", "| set | D | solve | fit s | peak MB | RMSE | MNLL | CG iterations "
              "(Nyström / none) | Nyström rank |", "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        if r.get("rank") == 0:
            continue
        if "error" in r:
            lines.append(f"| {r['set']} | {r['D']} | {r['solve']} | {r['error']} |||||")
            continue
        plain = next((p for p in results if p["set"] == r["set"] and p["D"] == r["D"]
                      and p.get("rank") == 0 and "iterations" in p), None)
        iters = "—"
        if r["solve"] == "cg":
            iters = f"{r['iterations']} / {plain['iterations'] if plain else '—'}"
        ranks = ", ".join(str(k) for k in r.get("preconditioner_rank", [])) or "—"
        lines.append(f"| {r['set']} | {r['D']} | {r['solve']} | {r['seconds']:.2f} | "
                     f"{r['peak_mb']:.0f} | {_cell(r.get('rmse'), '.4f')} | "
                     f"{_cell(r.get('mnll'), '.4f')} | {iters} | {ranks} |")
    write_page(path, "\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="small sets and D (about a minute) into a temporary folder")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--sets", nargs="*", default=SETS)
    parser.add_argument("--sizes", type=int, nargs="+",
                        default=[1024, 2048, 4096, 8192, 16384, 32768, 65536])
    parser.add_argument("--cholesky-max", type=int, default=8192)
    parser.add_argument("--plain-max", type=int, default=8192)
    parser.add_argument("--rows", type=int, default=100_000,
                        help="rows per set (the synthetic set's size; the UCI sets' at most)")
    parser.add_argument("--mnll-rows", type=int, default=1000)
    parser.add_argument("--search-rows", type=int, default=4000)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--hyper", type=Path, default=None,
                        help="read each set's hyperparameters from this JSON file (written by "
                             "--hyper-only) instead of searching")
    parser.add_argument("--hyper-only", type=Path, default=None,
                        help="search the sets' hyperparameters, write them here and stop")
    parser.add_argument("--records", type=Path, default=None,
                        help="append each result to this JSON-lines file as it is measured")
    parser.add_argument("--deadline", type=float, default=math.inf,
                        help="seconds after which no fit starts and a running one is stopped")
    args = parser.parse_args()
    if args.quick:
        args.sizes, args.rows, args.mnll_rows, args.search_rows = [256, 512], 1000, 100, 300
        args.cholesky_max, args.plain_max = 512, 256
    folder = args.out or (Path(tempfile.gettempdir()) if args.quick else OUT)
    folder.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    started = time.perf_counter()
    if args.hyper_only is not None:
        found = {name: hyperparameters(name, args.rows, args.search_rows) for name in args.sets}
        args.hyper_only.write_text(json.dumps(found, indent=1))
        print(f"wrote {args.hyper_only} ({time.perf_counter() - started:.0f} s)")
        return
    given = json.loads(args.hyper.read_text()) if args.hyper is not None else {}
    results, hyper = [], {}
    worker = Worker(args.quick, args.device)
    for name in args.sets:
        hyper[name] = given.get(name) or hyperparameters(name, args.rows, args.search_rows)
        for size in args.sizes:
            spec = {"set": name, "D": size, "rows": args.rows, "hyper": hyper[name],
                    "device": args.device, "threads": args.threads, "rank": None,
                    "max_iterations": 5000, "mnll_rows": args.mnll_rows}
            plan = [dict(spec, solve="cg")]
            if size <= args.cholesky_max:
                plan.append(dict(spec, solve="weight"))
            if size <= args.plain_max:
                plan.append(dict(spec, solve="cg", rank=0, scores=False))
            for item in plan:
                left = args.deadline - (time.perf_counter() - started)
                if left <= 0:
                    break
                began = time.perf_counter()
                result = worker.run(item, left)
                result["wall_seconds"] = time.perf_counter() - began  # scores and start-up too
                result["device_name"] = device_name(args.device)
                results.append(result)
                print(json.dumps(result), flush=True)
                if args.records is not None:
                    with args.records.open("a") as f:
                        f.write(json.dumps(result) + "\n")
    worker.close()
    seconds = time.perf_counter() - started
    (folder / "large_features.json").write_text(
        json.dumps({"hyperparameters": hyper, "results": results, "seconds": seconds},
                   indent=1, default=float))
    plot(results, folder / "large_features.png")
    write_markdown(results, hyper, args, folder / "large_features.md", seconds)
    print(f"wrote {folder / 'large_features.md'} ({seconds:.0f} s)")


if __name__ == "__main__":
    main()
