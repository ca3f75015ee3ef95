"""Accuracy against time on the bundled UCI sets: rfgp at several budgets against SGPR, SVGP and
the exact GP.

For every bundled UCI set with at least 5,000 rows, split 0 of ``regression_uci.py`` (random
90/10, inputs and targets standardised with the training rows), in one process, one method after
the other:

* ``rfgp x k``: ``RandomFeatureGPRegressor(random_state=0, time_budget=k * B)`` for ``k`` in
  1/4, 1/2, 1, 2, 4, 8, where ``B`` is the default budget (read from the default fit, run
  first);
* ``SGPR M`` for M = 256, 512, 1024 and 2048 (GPyTorch, 100 Adam steps, as in
  ``regression_uci.py``); M = 2048 only where it finishes within an hour: its training stops
  once the forecast of its time (seconds so far times 100 over the steps run, from the second
  step on) exceeds 3,600 s, and the page lists it as unfinished with that forecast;
* ``SVGP``: 500 inducing points, trained until its ELBO stops improving;
* ``exact GP``: L-BFGS hyperparameters and a float64 Cholesky posterior
  (``benchmarks/_exact_gp.py``), where the training set has at most 20,000 rows.

Each record (the format of ``regression_uci.jsonl``: set, split, method, time, RMSE, MNLL,
coverage, ...) is appended to ``docs/benchmarks/regression_curves.jsonl`` as it finishes, so a
run resumes. The page plots test MNLL and RMSE against wall time, one figure per set, and
checks the targets: at the time of each SGPR point the rfgp curve (its best MNLL among the
budgets finished by then) is at least as good; at 8x the default budget the RMSE is within 10%
of the exact GP's; the default's own time is at most SGPR M = 512's and its MNLL at least as
good; the 95% coverage lies in [0.93, 0.97] at every budget. The wall times depend on what
else the machine runs: run it on an idle machine.

Usage::

    python benchmarks/regression_curves.py                  # every set with >= 5,000 rows
    python benchmarks/regression_curves.py --sets pol bike
    python benchmarks/regression_curves.py --page-only
    python benchmarks/regression_curves.py --quick          # smoke test: tiny, to a temp dir

Writes ``docs/benchmarks/regression_curves.md`` and ``regression_curves_<set>.png``.
"""

from __future__ import annotations

import argparse
import datetime
import math
import platform
import subprocess
import sys
import tempfile
import warnings
from functools import partial
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _harness import Records  # noqa: E402
from _pages import write_page  # noqa: E402
from _regression_methods import (  # noqa: E402
    Unfinished,
    exact_gp,
    rfgp_default,
    sgpr,
    standardised_split,
    svgp,
)
from regression_uci import EXACT_MAX, load_rows, record_fit  # noqa: E402

from rfgp.datasets import UCI_DATASETS, load_uci  # noqa: E402
from rfgp.recipes._schedule import default_budget as recipe_default_budget  # noqa: E402

OUT = ROOT / "docs" / "benchmarks"
MULTIPLIERS = [1.0, 0.25, 0.5, 2.0, 4.0, 8.0]  # 1 first: it fixes the default budget B
INDUCING = [256, 512, 1024, 2048]
#: Inducing points from which SGPR must finish within LIMIT_SECONDS (else: unfinished).
LIMITED_FROM, LIMIT_SECONDS = 2048, 3600.0
MIN_ROWS = 5000
SGPR_STEPS = 100


def rfgp_label(multiplier: float) -> str:
    return f"rfgp x{multiplier:g}"


def default_budget(rows, name: str, num_rows: int) -> float:
    """The default's budget B on ``name``: from its record (the ``x1`` fit) where there is
    one, else the recipe's own default for ``num_rows`` training rows (the same number: the
    budget is a function of the rows only)."""
    for r in rows:
        if r["set"] == name and r["method"] == rfgp_label(1.0):
            return float(r["info"]["budget"])
    return recipe_default_budget(num_rows)


def run(args, records: Records) -> None:
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    stamp = run_stamp()
    for name in args.sets:
        x, y = load_uci(name)
        xtr, ytr, xte, yte = standardised_split(x, y, 0)
        if args.max_train:
            xtr, ytr = xtr[:args.max_train], ytr[:args.max_train]
        done = records.done("set", "split", "method")
        for multiplier in args.multipliers if "rfgp" in args.methods else ():
            method = rfgp_label(multiplier)
            if (name, 0, method) in done:
                continue
            params = {}
            if multiplier != 1.0:
                params["time_budget"] = multiplier * default_budget(load_rows(records), name,
                                                                    xtr.shape[0])
            record_fit(records, {"set": name, "split": 0, "method": method, "run": stamp},
                       partial(rfgp_default, xtr, ytr, xte, **params), xtr, yte, args.threads,
                       method)
        for m in args.inducing if "sgpr" in args.methods else ():
            method = f"SGPR {m}"
            if (name, 0, method) in done:
                continue
            head = {"set": name, "split": 0, "method": method, "run": stamp}
            limit = LIMIT_SECONDS if m >= LIMITED_FROM else None
            try:
                record_fit(records, head, partial(sgpr, xtr, ytr, xte, m, args.sgpr_steps,
                                                  time_limit=limit),
                           xtr, yte, args.threads, method)
            except Unfinished as stop:
                records.append({**head, "unfinished": True, "forecast": stop.forecast,
                                "steps": stop.steps, "threads": args.threads})
                print(f"{name:18s} {method:15s} unfinished: {stop}", flush=True)
        if "svgp" in args.methods and (name, 0, "SVGP") not in done:
            record_fit(records, {"set": name, "split": 0, "method": "SVGP", "run": stamp},
                       partial(svgp, xtr, ytr, xte, max_epochs=args.svgp_epochs), xtr, yte,
                       args.threads, "SVGP")
        if ("exact" in args.methods and (name, 0, "exact GP") not in done
                and xtr.shape[0] <= EXACT_MAX):
            record_fit(records, {"set": name, "split": 0, "method": "exact GP", "run": stamp},
                       partial(exact_gp, xtr, ytr, xte, max_rows=args.exact_rows), xtr, yte,
                       args.threads, "exact GP")


# ====================================================================== page
def curve(rows, prefix: str):
    """``(times, rows)`` of a method family, sorted by time."""
    family = sorted((r for r in rows if r["method"].startswith(prefix)), key=lambda r: r["time"])
    return np.array([r["time"] for r in family]), family


def plot(rows, name: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for ax, key in zip(axes, ("mnll", "rmse")):
        for prefix, style in (("rfgp", "o-"), ("SGPR", "s--")):
            times, family = curve(rows, prefix)
            if len(family):
                ax.plot(times, [r[key] for r in family], style, label=prefix)
                for t, r in zip(times, family):
                    ax.annotate(r["method"].split()[-1], (t, r[key]), fontsize=7,
                                textcoords="offset points", xytext=(3, 3))
        for method, marker in (("SVGP", "D"), ("exact GP", "*")):
            for r in rows:
                if r["method"] == method:
                    ax.plot(r["time"], r[key], marker, ms=9, label=method)
        ax.set_xscale("log")
        ax.set_xlabel("wall time (s)")
        ax.set_ylabel(f"test {key.upper()}")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"{name} (N = {rows[0]['n_train']}, d = {rows[0]['d']})")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def dominance(rows) -> list:
    """Per SGPR point: the best rfgp MNLL among the budgets whose fit took no longer."""
    times, family = curve(rows, "rfgp")
    out = []
    for r in sorted((r for r in rows if r["method"].startswith("SGPR")), key=lambda r: r["time"]):
        ready = [f["mnll"] for t, f in zip(times, family) if t <= r["time"]]
        best = min(ready) if ready else math.nan
        verdict = ("met" if ready and best <= r["mnll"] else
                   "**missed**" + ("" if ready else " (no rfgp fit that fast)"))
        out.append(f"{r['method']} ({r['time']:.0f} s, MNLL {r['mnll']:.3f}): rfgp "
                   f"{best:.3f}, {verdict}")
    return out


def default_against_sgpr(rows, inducing: int = 512) -> list:
    """The default's own time at most SGPR M = ``inducing``'s, and its MNLL at least as good."""
    default = next((r for r in rows if r["method"] == rfgp_label(1.0)), None)
    sgpr_point = next((r for r in rows if r["method"] == f"SGPR {inducing}"), None)
    if default is None or sgpr_point is None:
        return []
    faster, better = default["time"] <= sgpr_point["time"], default["mnll"] <= sgpr_point["mnll"]
    return [f"default (x1) against SGPR {inducing}: time {default['time']:.0f} s against "
            f"{sgpr_point['time']:.0f} s ({'met' if faster else '**missed**'}), MNLL "
            f"{default['mnll']:.3f} against {sgpr_point['mnll']:.3f} "
            f"({'met' if better else '**missed**'})"]


def coverage_range(rows, low: float = 0.93, high: float = 0.97) -> list:
    """The 95% intervals' coverage at every rfgp budget, against ``[low, high]``."""
    _, family = curve(rows, "rfgp")
    if not family:
        return []
    values = [r["cov95"] for r in family]
    outside = [r["method"] for r in family if not low <= r["cov95"] <= high]
    return [f"95% coverage at every budget in [{low}, {high}]: {min(values):.3f} to "
            f"{max(values):.3f}, " + ("met" if not outside else
                                      f"**missed** ({', '.join(outside)})")]


def run_stamp() -> dict:
    """The run a record comes from: the UTC date and the source's commit (``None`` outside a
    git checkout), so that a page of records re-run at different times says which is which."""
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, cwd=Path(__file__).parent, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = None
    return {"date": datetime.datetime.now(datetime.timezone.utc).date().isoformat(),
            "commit": commit or None}


def write_markdown(rows, out: Path) -> None:
    unfinished = [r for r in rows if r.get("unfinished")]
    rows = [r for r in rows if not r.get("unfinished")]
    sets = list(dict.fromkeys(r["set"] for r in rows))
    threads = sorted({r["threads"] for r in rows})
    lines = ["# Accuracy against time: rfgp's budgets, SGPR, SVGP and the exact GP", "",
             "Split 0 of `regression_uci.py` (random 90/10, standardised with the training "
             "rows); RMSE and MNLL of y in units of the standardised targets. `rfgp x k`: "
             "`RandomFeatureGPRegressor(random_state=0, time_budget=k B)`, B the default budget. "
             "SGPR: 100 Adam steps (M = 2048 only where its forecast is within an hour); "
             "SVGP: 500 inducing points until the ELBO stops improving; "
             "exact GP: L-BFGS hyperparameters on at most 10,000 rows and a float64 Cholesky "
             "posterior on all training rows (sets up to 20,000 training rows). Gaps: RMSE and "
             "MNLL minus the exact GP's. Every point ran with this script on the same kind of "
             "two-core machine, a set's methods one after the other in one process; points "
             "re-run after a later change of rfgp carry their run's date and commit (the "
             "`run` field of their records; the hand-written section below names the "
             "re-runs), so a set's points need not all come from one process. Times depend "
             "on the machine's load.", "",
             f"Records of `python benchmarks/regression_curves.py` "
             f"({platform.processor() or platform.machine()}, Python "
             f"{platform.python_version()}, torch {torch.__version__}, {threads} thread(s)).", ""]
    for name in sets:
        rs = [r for r in rows if r["set"] == name]
        exact = next((r for r in rs if r["method"] == "exact GP"), None)
        lines += [f"## {name} (N = {rs[0]['n_train']}, d = {rs[0]['d']})", "",
                  "| method | time (s) | RMSE | MNLL | RMSE gap to exact GP | MNLL gap to exact "
                  "GP | 95% coverage | D or M |", "|---|---|---|---|---|---|---|---|"]
        for r in sorted(rs, key=lambda r: r["time"]):
            gaps = ((f"{r['rmse'] - exact['rmse']:+.3f}", f"{r['mnll'] - exact['mnll']:+.3f}")
                    if exact else ("-", "-"))
            size = r["info"].get("D", r["info"].get("M", "-"))
            lines.append(f"| {r['method']} | {r['time']:.1f} | {r['rmse']:.3f} | "
                         f"{r['mnll']:.3f} | {gaps[0]} | {gaps[1]} | {r['cov95']:.3f} | {size} |")
        lines += [f"\n{r['method']}: unfinished, its training forecast at {r['forecast']:.0f} s "
                  f"after {r['steps']} steps (limit {LIMIT_SECONDS:.0f} s)."
                  for r in unfinished if r["set"] == name]
        lines += ["", f"![{name}](regression_curves_{name}.png)", "", "Targets:", ""]
        lines += [f"- {line}" for line in dominance(rs) + default_against_sgpr(rs)
                  + coverage_range(rs)]
        eight = next((r for r in rs if r["method"] == rfgp_label(8.0)), None)
        if eight and exact:
            ratio = eight["rmse"] / exact["rmse"]
            lines.append(f"- RMSE at 8x within 10% of the exact GP's: {ratio:.3f} of it, "
                         + ("met" if ratio <= 1.1 else "**missed**"))
        lines.append("")
        plot(rs, name, out / f"regression_curves_{name}.png")
    write_page(out / "regression_curves.md", "\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", nargs="*", default=None)
    parser.add_argument("--multipliers", type=float, nargs="*", default=MULTIPLIERS)
    parser.add_argument("--inducing", type=int, nargs="*", default=INDUCING)
    parser.add_argument("--sgpr-steps", type=int, default=SGPR_STEPS)
    parser.add_argument("--svgp-epochs", type=int, default=300)
    parser.add_argument("--max-train", type=int, default=None,
                        help="use only the first rows of the training split (smoke tests)")
    parser.add_argument("--methods", nargs="*", default=["rfgp", "sgpr", "svgp", "exact"],
                        choices=["rfgp", "sgpr", "svgp", "exact"],
                        help="the method families to run (records of the others are kept)")
    parser.add_argument("--exact-rows", type=int, default=10000,
                        help="rows of the exact GP's final hyperparameter optimisation "
                             "(at most 10^4; its posterior conditions on every training row)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--page-only", action="store_true")
    parser.add_argument("--quick", action="store_true",
                        help="power-plant, 600 training rows, two budgets, SGPR 64 for 10 "
                             "steps, SVGP 2 epochs, into a temporary folder")
    args = parser.parse_args()
    out = args.out or OUT
    if args.quick:
        out = Path(tempfile.mkdtemp())
        args.sets, args.max_train, args.multipliers = ["power-plant"], 600, [1.0, 0.25]
        args.inducing, args.sgpr_steps, args.svgp_epochs = [64], 10, 2
    if args.sets is None:
        sizes = {name: load_uci(name)[0].shape[0] for name in UCI_DATASETS}
        args.sets = sorted((n for n in UCI_DATASETS if sizes[n] >= MIN_ROWS), key=sizes.get)
    out.mkdir(parents=True, exist_ok=True)
    records = Records(out / "regression_curves.jsonl")
    if not args.page_only:
        run(args, records)
    write_markdown(load_rows(records), out)
    print(f"wrote {out / 'regression_curves.md'}")


if __name__ == "__main__":
    main()
