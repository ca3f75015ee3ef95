"""What a temperature can do for the Dirichlet classifier's calibration: test NLL and ECE
against the temperature of one fitted model.

For each (set, split) of ``classification_uci.py``, the default recipe
(``fit_classifier_auto(seed=split)``, the default budget) is fitted once, and its test
probabilities :math:`\\mathbb{E}[\\mathrm{softmax}(f / T)]` are scored at every temperature
``T`` of a grid (``exp(linspace(log 0.4, log 2.5, 21))``, with 1 and the recipe's own choice),
by ``predict_proba`` (1,000 draws, seed 0) with the fitted model's ``temperature`` set. The
grid's least test ECE is an oracle: no temperature, however chosen, gives a lower one on these
test rows; where it stays above a target the one-parameter family is what limits the
calibration, not the held-out rows' resolution of it. The page also shows the recipe's
held-out NLL at the temperatures it evaluated, and the reliability bins of the top-class
confidence at ``T = 1`` and at the oracle's ``T``.

Usage::

    python benchmarks/classification_temperature.py --sets adult magic --splits 3
    python benchmarks/classification_temperature.py --page-only
    python benchmarks/classification_temperature.py --quick   # smoke run to a temp dir

Writes docs/benchmarks/classification_temperature.md (records in
``classification_temperature.jsonl``).
"""

from __future__ import annotations

import argparse
import math
import platform
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _harness import Records, run_missing, timed  # noqa: E402
from _pages import write_page as write_kept  # noqa: E402
from classification_uci import SETS, load_split, scores  # noqa: E402

from rfgp import fit_classifier_auto  # noqa: E402
from rfgp.recipes import ClassifierFitReport  # noqa: E402
from rfgp.recipes._schedule import default_budget  # noqa: E402

OUT = ROOT / "docs" / "benchmarks"
GRID = np.exp(np.linspace(math.log(0.4), math.log(2.5), 21))
TARGET_ECE = 0.02


def sweep(name: str, split: int, quick: bool) -> dict:
    """Fit the default once on (``name``, ``split``) and score its test probabilities at every
    temperature of the grid (with 1 and the recipe's choice)."""
    xtr, ytr, xte, yte = load_split(name, split, quick)
    report = ClassifierFitReport()
    budget = default_budget(xtr.shape[0]) / (20 if quick else 1)
    clf, seconds = timed(lambda: fit_classifier_auto(xtr, ytr, seed=split, time_budget=budget,
                                                     report=report))
    chosen = float(clf.temperature)
    temperatures = sorted({*(float(t) for t in GRID), 1.0, chosen})
    points = []
    for t in temperatures:
        clf.temperature = t
        torch.manual_seed(0)
        s = scores(clf.predict_proba(xte).numpy(), yte.numpy())
        points.append({"temperature": t, **s})
    return {"set": name, "split": split, "n_train": xtr.shape[0], "n_test": xte.shape[0],
            "fit_seconds": seconds, "quick": quick, "chosen": chosen,
            "D": clf.kernel.base_kernel.num_features, "alpha": clf.alpha_epsilon,
            "held_out": {str(k): v for k, v in
                         report.choice.get("temperature_evaluations", {}).items()},
            "points": points}


def _at(record: dict, temperature: float) -> dict:
    return min(record["points"], key=lambda p: abs(p["temperature"] - temperature))


def _bins(point: dict) -> str:
    rel = point["reliability"]
    cells = [f"{c:.3f}/{a:.3f} ({n})" for c, a, n in
             zip(rel["confidence"], rel["accuracy"], rel["count"]) if n > 0]
    return ", ".join(cells)


def write_page(rows, out_dir: Path) -> None:
    lines = [
        "# The Dirichlet classifier's temperature: test NLL and ECE against `T`", "",
        "Written by `benchmarks/classification_temperature.py` from "
        "`classification_temperature.jsonl` (protocol in the script's docstring): the "
        "default recipe fitted once per (set, split), its test probabilities "
        "`E[softmax(f / T)]` scored at each temperature. `oracle T`: the grid's temperature "
        "of least test ECE (chosen on the test rows: a bound on what any temperature can "
        "do, not a method). ECE: 15 bins of the top-class confidence.", "",
        f"Machine: {platform.processor() or platform.machine()}, torch {torch.__version__}.",
        "",
        "| set | split | D | alpha | recipe's T | test NLL / ECE at T = 1 | at the recipe's T "
        "| oracle T | test NLL / ECE there | least NLL (its T) | fit (s) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    if any(r.get("quick") for r in rows):
        lines[2:2] = ["**Smoke run (`--quick`): these numbers check the script.**", ""]
    for r in rows:
        one, own = _at(r, 1.0), _at(r, r["chosen"])
        oracle = min(r["points"], key=lambda p: p["ece"])
        least = min(r["points"], key=lambda p: p["nll"])
        lines.append(
            f"| {r['set']} | {r['split']} | {r['D']} | {r['alpha']:g} | {r['chosen']:.3f} "
            f"| {one['nll']:.4f} / {one['ece']:.4f} | {own['nll']:.4f} / {own['ece']:.4f} "
            f"| {oracle['temperature']:.3f} | {oracle['nll']:.4f} / {oracle['ece']:.4f} "
            f"| {least['nll']:.4f} ({least['temperature']:.3f}) | {r['fit_seconds']:.1f} |")
    lines += ["", f"Sets where no temperature reaches ECE {TARGET_ECE}: "
              + (", ".join(sorted({f"{r['set']} split {r['split']}" for r in rows
                                   if min(p["ece"] for p in r["points"]) > TARGET_ECE}))
                 or "none") + "."]
    lines += ["", "## Reliability bins", "",
              "Each bin: mean confidence / accuracy (rows), at `T = 1` and at the oracle `T`.",
              ""]
    for r in rows:
        oracle = min(r["points"], key=lambda p: p["ece"])
        lines += [f"* {r['set']} split {r['split']}, `T = 1`: {_bins(_at(r, 1.0))}",
                  f"* {r['set']} split {r['split']}, `T = {oracle['temperature']:.3f}`: "
                  f"{_bins(oracle)}"]
    lines += ["", "## The recipe's held-out NLL at the temperatures it evaluated", ""]
    for r in rows:
        held = ", ".join(f"{float(t):.3f}: {v:.5f}" for t, v in
                         sorted(r["held_out"].items(), key=lambda kv: float(kv[0])))
        lines.append(f"* {r['set']} split {r['split']}: {held or '-'}")
    write_kept(out_dir / "classification_temperature.md", "\n".join(lines) + "\n")
    print(f"wrote {out_dir / 'classification_temperature.md'}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sets", nargs="+", default=["adult", "magic"], choices=SETS)
    parser.add_argument("--splits", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--page-only", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    out_dir = args.out or (Path(tempfile.mkdtemp()) if args.quick else OUT)
    out_dir.mkdir(parents=True, exist_ok=True)
    records = Records(out_dir / "classification_temperature.jsonl")
    if not args.page_only:
        def tasks():
            for name in args.sets:
                for split in range(1 if (name == "adult" or args.quick) else args.splits):
                    yield {"set": name, "split": split}

        def run(task):
            row = sweep(task["set"], task["split"], args.quick)
            records.append(row)
            print(f"{task['set']} {task['split']}: chosen T {row['chosen']:.3f}, "
                  f"least ECE {min(p['ece'] for p in row['points']):.4f}", flush=True)

        run_missing(records, tasks(), ("set", "split"), run)
    write_page(records.rows(), out_dir)


if __name__ == "__main__":
    main()
