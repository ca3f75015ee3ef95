"""More features for the recipe's model: accuracy against ``D`` when every ``D`` calibrates its
own scales.

Does the default model keep improving as its feature count grows past what the default budget
buys on two cores? Per data set:

* data: a bundled UCI set (random 90/10 split with seed 0, inputs and targets standardised
  with the training statistics: split 0 of ``benchmarks/regression_uci.py``);
* lengthscales: one default ``rfgp.fit_auto(x, y, seed=0)`` on the training rows (its Laplace
  draws, or its lengthscales without them), then fixed;
* for each ``D`` in ``--sizes``: the model with those lengthscales and ``D`` random Fourier
  features, its outputscale and noise chosen by its own evidence
  (``rfgp.recipes.calibrated_fit``: weight space up to 8192 features, conjugate gradients by
  feature products beyond, and ``--both`` at 8192 too); calibration plus fit seconds; test
  RMSE on every test row; MNLL and 95% coverage (latent variance plus noise) on the first
  ``--mnll-rows`` test rows (each variance of a CG fit is a CG solve, so they are fewer).

Usage::

    python benchmarks/calibrated_features.py --sets pol bike          # CPU, about 30 minutes
    python benchmarks/calibrated_features.py --quick                  # a minute, temp folder
    python benchmarks/calibrated_features.py --sets pol --sizes 8192 --reuse-model  # the fits alone
    python benchmarks/calibrated_features.py --sets pol --reuse-model --device cuda \
        --records out.jsonl --models docs/benchmarks/calibrated_features.jsonl --deadline 200
    python benchmarks/calibrated_features.py --page-only  # after appending out.jsonl's records

Records are appended to docs/benchmarks/calibrated_features.jsonl; the page
docs/benchmarks/calibrated_features.md is written from them.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
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

from rfgp import fit_auto  # noqa: E402
from rfgp.datasets import load_uci, standardize, train_test_split  # noqa: E402
from rfgp.kernels import RandomFeatureKernel  # noqa: E402
from rfgp.recipes import FitReport, calibrated_fit  # noqa: E402
from rfgp.recipes._laplace import lengthscale_mixture_kernel  # noqa: E402
from rfgp.recipes._start import make_ard_kernel  # noqa: E402

OUT = ROOT / "docs" / "benchmarks"
Z95 = 1.959963984540054


def load(name: str, rows: int):
    x, y = load_uci(name)
    x, y = x[:rows], y[:rows]
    xtr, ytr, xte, yte = train_test_split(x, y, 0.1, torch.Generator().manual_seed(0))
    xtr, xte, _, _ = standardize(xtr, xte)
    ytr, yte, _, _ = standardize(ytr, yte)
    return xtr, ytr, xte, yte


def recipe_model(xtr, ytr) -> dict:
    report = FitReport()
    started = time.perf_counter()
    gp = fit_auto(xtr, ytr, seed=0, report=report)
    seconds = time.perf_counter() - started
    draws = report.lengthscale_draws
    return {"seconds": seconds, "num_features": report.num_features,
            "lengthscale": report.lengthscale.tolist(),
            "draws": None if draws is None else draws.tolist(),
            "noise": float(gp.noise)}


def kernel_at(model: dict, size: int, dim: int):
    if model["draws"] is not None:
        draws = torch.tensor(model["draws"], dtype=torch.float64)
        return lengthscale_mixture_kernel(size, draws, torch.tensor(1.0, dtype=torch.float64),
                                          "rbf", 0)
    kernel = make_ard_kernel(size, dim, seed=0)
    kernel.base_kernel.lengthscale = torch.tensor(model["lengthscale"], dtype=torch.float64)
    return kernel


def measure(name, size, solve, model, data, mnll_rows, device="cpu") -> dict:
    xtr, ytr, xte, yte = (t.to(device) for t in data)
    kernel = kernel_at(model, size, xtr.shape[1])
    # The weights are drawn on the CPU from the seed, so every device fits the same features.
    for part in kernel.modules():
        if isinstance(part, RandomFeatureKernel):
            part.features(data[0][:1])
    kernel = kernel.to(device)
    synchronize(device)
    started = time.perf_counter()
    gp = calibrated_fit(kernel, xtr, ytr, model["noise"], solve=solve)
    synchronize(device)
    seconds = time.perf_counter() - started
    with torch.no_grad():
        mean = gp.predict(xte)
        m = min(mnll_rows, xte.shape[0])
        started = time.perf_counter()
        mu, std = gp.predict(xte[:m], return_std=True)
        synchronize(device)
        variance_seconds = time.perf_counter() - started
    noise = float(gp.noise)
    var = std.square() + noise
    nll = 0.5 * torch.log(2 * math.pi * var) + 0.5 * (yte[:m] - mu).square() / var
    inside = ((yte[:m] - mu).abs() <= Z95 * var.sqrt()).double().mean()
    info = gp.cg_info or {}
    return {"set": name, "D": size, "solve": gp.solve_used, "device": device_name(device),
            "seconds": seconds,
            "cg_iterations": info.get("iterations"),
            "preconditioner_ranks": info.get("preconditioner_ranks"),
            "variance_seconds": variance_seconds, "mnll_rows": m, "noise": noise,
            "rmse": float((mean - yte).square().mean().sqrt()),
            "mnll": float(nll.mean()), "coverage": float(inside)}


def device_of(record: dict) -> str:
    """The device a record was measured on (the earliest records, all CPU, do not say)."""
    return record.get("device", "x86_64")


def latest(records: list) -> list:
    """The last record of each (set, D, solve, device), and of each set's recipe fit."""
    kept = {}
    for r in records:
        key = ((r["set"], "recipe") if r.get("kind") == "recipe"
               else (r["set"], r["D"], r["solve"], device_of(r)))
        kept[key] = r
    return list(kept.values())


def plot(records: list, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sets = sorted({r["set"] for r in records if "D" in r})
    fig, axes = plt.subplots(2, len(sets), figsize=(4 * len(sets), 6), squeeze=False)
    for col, name in enumerate(sets):
        for solve, style in (("weight", "s-"), ("cg", "o-")):
            rows = sorted((r for r in records if r.get("set") == name and r.get("solve") == solve
                           and "D" in r), key=lambda r: r["D"])
            if rows:
                axes[0][col].plot([r["D"] for r in rows], [r["rmse"] for r in rows], style,
                                  label=solve)
                axes[1][col].plot([r["D"] for r in rows], [r["mnll"] for r in rows], style,
                                  label=solve)
        axes[0][col].set_title(name)
        for row in (0, 1):
            axes[row][col].set_xscale("log", base=2)
            axes[row][col].legend()
        axes[0][col].set_ylabel("test RMSE")
        axes[1][col].set_ylabel("test MNLL (first rows)")
        axes[1][col].set_xlabel("D")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write_markdown(records: list, path: Path) -> None:
    lines = [
        "# More features for the recipe's model",
        "",
        "Generated by `benchmarks/calibrated_features.py` from the records in "
        "`calibrated_features.jsonl` (see the script's docstring for the protocol). The "
        "lengthscales are the default `fit_auto`'s; every `D` chooses its own outputscale and "
        "noise by its evidence (`rfgp.recipes.calibrated_fit`). MNLL and coverage are over the "
        "first test rows (the count is in the table).",
        "",
    ]
    for model in (r for r in records if r.get("kind") == "recipe"):
        lines.append(f"- {model['set']} ({model['rows']} training rows, {model['machine']}, "
                     f"{model['threads']} thread(s)): the default fit took "
                     f"{model['seconds']:.0f} s at D = {model['num_features']}.")
    lines += ["", "| set | D | solve | device | calibration + fit s | noise | RMSE | MNLL | "
              "coverage | test rows (MNLL) | variance s | fit's CG iterations (Nyström rank) |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted((r for r in records if "D" in r), key=lambda r: (
            r["set"], r["D"], r["solve"], device_of(r))):
        cg = "-"
        if r.get("cg_iterations") is not None:
            cg = f"{r['cg_iterations']} ({', '.join(map(str, r['preconditioner_ranks']))})"
        lines.append(f"| {r['set']} | {r['D']:,} | {r['solve']} | "
                     f"{device_of(r)} | {r['seconds']:.1f} | "
                     f"{r['noise']:.4g} | {r['rmse']:.4f} | {r['mnll']:.4f} | "
                     f"{r['coverage']:.3f} | {r['mnll_rows']} | {r['variance_seconds']:.1f} | "
                     f"{cg} |")
    write_page(path, "\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--sets", nargs="*", default=["pol", "bike"])
    parser.add_argument("--sizes", type=int, nargs="+",
                        default=[1024, 2048, 4096, 8192, 16384, 32768])
    parser.add_argument("--both", type=int, nargs="*", default=[8192],
                        help="sizes fitted by both paths")
    parser.add_argument("--rows", type=int, default=10**6)
    parser.add_argument("--mnll-rows", type=int, default=300)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--reuse-model", action="store_true",
                        help="take each set's last recorded recipe lengthscales instead of "
                             "running fit_auto again (to remeasure the fits alone)")
    parser.add_argument("--device", default="cpu", help="where the fits run (the recipe fit "
                        "that finds the lengthscales always runs on the CPU)")
    parser.add_argument("--records", type=Path, default=None,
                        help="the JSON-lines file the results are appended to (default: "
                             "calibrated_features.jsonl in the output folder)")
    parser.add_argument("--models", type=Path, default=None,
                        help="with --reuse-model, the records to take the lengthscales from "
                             "(default: --records)")
    parser.add_argument("--deadline", type=float, default=math.inf,
                        help="seconds after which no further fit starts")
    parser.add_argument("--page-only", action="store_true",
                        help="rebuild the page and plot from the records (after appending "
                             "another machine's records) without fitting")
    args = parser.parse_args()
    if args.quick:
        args.sets, args.sizes, args.both, args.rows, args.mnll_rows = (
            ["pol"], [256, 512], [512], 1500, 50)
    folder = args.out or (Path(tempfile.gettempdir()) if args.quick else OUT)
    folder.mkdir(parents=True, exist_ok=True)
    records_path = args.records or folder / "calibrated_features.jsonl"
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    started = time.perf_counter()
    for name in [] if args.page_only else args.sets:
        data = load(name, args.rows)
        if args.reuse_model:
            recorded = [json.loads(line) for line in
                        (args.models or records_path).read_text().splitlines() if line]
            model = [r for r in recorded if r.get("kind") == "recipe" and r["set"] == name][-1]
        else:
            model = recipe_model(data[0], data[1])
            record = dict(model, kind="recipe", set=name, rows=data[0].shape[0],
                          threads=args.threads,
                          machine=platform.processor() or platform.machine())
            with records_path.open("a") as f:
                f.write(json.dumps(record) + "\n")
        for size in args.sizes:
            solves = ["weight", "cg"] if size in args.both else ["auto"]
            for solve in solves:
                if time.perf_counter() - started > args.deadline:
                    break
                out = measure(name, size, solve, model, data, args.mnll_rows, args.device)
                print(json.dumps(out), flush=True)
                with records_path.open("a") as f:
                    f.write(json.dumps(out) + "\n")
    records = latest([json.loads(line) for line in records_path.read_text().splitlines()
                      if line])
    plot(records, folder / "calibrated_features.png")
    write_markdown(records, folder / "calibrated_features.md")
    print(f"wrote {folder / 'calibrated_features.md'}")


if __name__ == "__main__":
    main()
