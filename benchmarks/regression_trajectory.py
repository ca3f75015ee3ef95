"""Accuracy against training time: the sparse GPs' whole training run against rfgp's default.

``regression_uci.py`` stops each GPyTorch baseline after a fixed number of Adam steps, so its
table compares rfgp's default with one point of each baseline's training. This study records
the baselines' test metrics along their training, at checkpoints, and sets rfgp's default
against every point: how long each baseline takes to reach rfgp's test MNLL, and how good it
is after rfgp's time.

Per bundled UCI set (split 0 of ``regression_uci.py``: random 90/10, inputs and targets
standardised with the training statistics; float64; one thread):

* ``rfgp default``: ``RandomFeatureGPRegressor(random_state=0)`` (the recipe ``fit_auto``),
  fit and prediction timed together; and ``rfgp evidence maximum`` (``max_lengthscale=None``).
* ``SGPR 512``, ``SGPR 1024``: GPyTorch SGPR, Adam (lr 0.1) on the exact marginal likelihood,
  checkpoints after ``--sgpr-checkpoints`` steps.
* ``exact GP`` (training sets of at most 1000 rows): GPyTorch ``ExactGP``, the same optimiser
  and checkpoints.
* ``SVGP``: GPyTorch SVGP, 500 learned inducing points, Adam (lr 0.01) on minibatches of 1024
  rows, checkpoints after ``--svgp-checkpoints`` steps.

The baselines are built and trained exactly as in ``regression_uci.py`` (the same functions).
The time of a checkpoint is the training time up to it (the model's construction included)
plus one prediction of the test rows there; the earlier checkpoints' predictions are not
counted. Before any timing, every method runs once on 64 rows, so that no method pays the
process's one-time costs (imports, first optimiser construction).

Usage::

    python benchmarks/regression_trajectory.py          # full run, about 30 minutes on 2 cores
    python benchmarks/regression_trajectory.py --quick  # a short run into a temporary folder

Writes docs/benchmarks/regression_trajectory.md, .json and .png (test MNLL against time).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _pages import write_page  # noqa: E402
from _regression_methods import (  # noqa: E402
    exact_model,
    exact_trainer,
    gpytorch_predict,
    rfgp_default,
    scores,
    sgpr_model,
    standardised_split,
    svgp_model,
    svgp_trainer,
)

from rfgp.datasets import UCI_DATASETS, load_uci  # noqa: E402

OUT = ROOT / "docs" / "benchmarks"
RFGP = ["rfgp default", "rfgp evidence maximum"]
BASELINES = ["SGPR 512", "SGPR 1024", "exact GP", "SVGP"]


def _baseline(method, xtr, ytr):
    """``(model, likelihood, run)`` of a GPyTorch baseline, ``run(steps)`` training it on."""
    if method.startswith("SGPR"):
        model, likelihood = sgpr_model(xtr, ytr, int(method.split()[1]))
        return model, likelihood, exact_trainer(model, likelihood, xtr, ytr)
    if method == "exact GP":
        model, likelihood = exact_model(xtr, ytr)
        return model, likelihood, exact_trainer(model, likelihood, xtr, ytr)
    model, likelihood, generator = svgp_model(xtr)
    return model, likelihood, svgp_trainer(model, likelihood, xtr, ytr, generator)


def trajectory(method, xtr, ytr, xte, yte, checkpoints):
    """The baseline's test scores after each number of steps in ``checkpoints`` (increasing),
    each with the time to train that far plus one prediction."""
    torch.manual_seed(0)  # SVGP's variational start draws from the global generator
    started = time.perf_counter()
    model, likelihood, run = _baseline(method, xtr, ytr)
    trained, done, points = time.perf_counter() - started, 0, []
    for steps in checkpoints:
        started = time.perf_counter()
        run(steps - done)
        trained += time.perf_counter() - started
        done = steps
        started = time.perf_counter()
        mean, var = gpytorch_predict(model, likelihood, xte)
        predicted = time.perf_counter() - started
        points.append({"steps": steps, "time": trained + predicted,
                       **scores(yte.numpy(), mean, var)})
    return points


def _rfgp_point(method, xtr, ytr, xte, yte):
    started = time.perf_counter()
    params = {"max_lengthscale": None} if method == "rfgp evidence maximum" else {}
    mean, var, _ = rfgp_default(xtr, ytr, xte, **params)
    seconds = time.perf_counter() - started
    return [{"steps": None, "time": seconds, **scores(yte.numpy(), mean, var)}]


def warm_up(xtr, ytr, xte):
    """Every method once on 64 rows, untimed: the process's one-time costs paid up front."""
    x, y = xtr[:64], ytr[:64]
    rfgp_default(x, y, xte[:8])
    for method in ["SGPR 512", "exact GP", "SVGP"]:
        model, likelihood, run = _baseline(method, x, y)
        run(2)
        gpytorch_predict(model, likelihood, xte[:8])


def run_set(task):
    """All methods of one data set (split 0), in one process."""
    name, args = task
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    x, y = load_uci(name)
    xtr, ytr, xte, yte = standardised_split(x, y, 0)
    if args.quick:
        xtr, ytr = xtr[:args.quick_rows], ytr[:args.quick_rows]
    warm_up(xtr, ytr, xte)
    runs = {}
    for method in RFGP + BASELINES:
        if method == "exact GP" and xtr.shape[0] > args.exact_max:
            continue
        if method in RFGP:
            runs[method] = _rfgp_point(method, xtr, ytr, xte, yte)
        else:
            checkpoints = args.svgp_checkpoints if method == "SVGP" else args.sgpr_checkpoints
            runs[method] = trajectory(method, xtr, ytr, xte, yte, checkpoints)
        last = runs[method][-1]
        print(f"{name:18s} {method:22s} mnll {last['mnll']:7.3f} time {last['time']:7.1f}s",
              flush=True)
    return {"set": name, "n_train": xtr.shape[0], "d": xtr.shape[1], "runs": runs}


# ====================================================================== page
def reach(points, target):
    """The first checkpoint whose test MNLL is at most ``target``, or ``None``."""
    return next((p for p in points if p["mnll"] <= target), None)


def at_time(points, seconds):
    """The last checkpoint reached within ``seconds``, or ``None``."""
    within = [p for p in points if p["time"] <= seconds]
    return within[-1] if within else None


def summary_rows(result):
    """One line per baseline: the time to reach rfgp's default MNLL and the MNLL at its time."""
    ref = result["runs"]["rfgp default"][0]
    lines = []
    for method in BASELINES:
        points = result["runs"].get(method)
        if not points:
            continue
        hit = reach(points, ref["mnll"])
        if hit is None:
            best = min(points, key=lambda p: p["mnll"])
            reached = (f"not in {points[-1]['steps']} steps ({points[-1]['time']:.1f} s; best "
                       f"{best['mnll']:.3f} after {best['steps']})")
        else:
            reached = (f"{hit['time']:.1f} s ({hit['steps']} steps; {hit['time'] / ref['time']:.1f}"
                       " x rfgp's time)")
        then = at_time(points, ref["time"])
        then = ("no checkpoint yet" if then is None
                else f"{then['mnll']:.3f} ({then['steps']} steps)")
        lines.append(f"| {result['set']} | {method} | {reached} | {then} |")
    return lines


def plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = 3
    rows = (len(results) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.4 * rows), squeeze=False)
    styles = {"rfgp default": ("*", "C3"), "rfgp evidence maximum": ("P", "C1"),
              "SGPR 512": ("o", "C0"), "SGPR 1024": ("s", "C2"), "exact GP": ("^", "C4"),
              "SVGP": ("v", "C5")}
    for ax, result in zip(axes.flat, results):
        for method, points in result["runs"].items():
            marker, colour = styles[method]
            times = [p["time"] for p in points]
            mnll = [p["mnll"] for p in points]
            size = 12 if method in RFGP else 5
            ax.plot(times, mnll, marker=marker, color=colour, ms=size, label=method,
                    lw=1 if len(points) > 1 else 0)
        ref = result["runs"]["rfgp default"][0]["mnll"]
        finite = [p["mnll"] for points in result["runs"].values() for p in points]
        low = min(finite)
        ax.set_ylim(low - 0.05 * abs(low) - 0.05, max(ref + 1.0, low + 0.5))
        ax.set_xscale("log")
        ax.set_title(f"{result['set']} (N = {result['n_train']})")
        ax.set_xlabel("seconds (training + one prediction)")
        ax.set_ylabel("test MNLL")
    for ax in list(axes.flat)[len(results):]:
        ax.axis("off")
    # One legend for every method drawn in any panel (the exact GP runs on the small sets only).
    labels = {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            labels.setdefault(label, handle)
    fig.legend(labels.values(), labels.keys(), loc="lower center", ncol=len(labels),
               fontsize=8)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_markdown(results, args, path, seconds):
    command = " ".join(["python benchmarks/regression_trajectory.py", *sys.argv[1:]])
    lines = [
        "# Accuracy against training time: the sparse GPs' training run against rfgp's default",
        "",
        f"Generated by `{command}` in one run ({seconds:.0f} s; {platform.machine()}, Python "
        f"{platform.python_version()}, torch {torch.__version__}, {args.threads} thread(s) per "
        f"process, {args.jobs} data sets in parallel). Split 0 of the UCI benchmark "
        "(`regression_uci.py`), with its baselines, built and trained by the same functions: "
        "SGPR and the exact GP with Adam (lr 0.1) on the marginal likelihood, SVGP with Adam "
        "(lr 0.01) on minibatches of 1024 rows and 500 learned inducing points; the exact GP "
        f"only up to {args.exact_max} training rows. The test scores are recorded at checkpoints "
        f"(SGPR and exact GP after {', '.join(map(str, args.sgpr_checkpoints))} steps, SVGP "
        f"after {', '.join(map(str, args.svgp_checkpoints))}); the time of a checkpoint is the "
        "training time up to it plus one prediction of the test rows. rfgp's default is "
        "`RandomFeatureGPRegressor(random_state=0)`, fit and prediction; one point. Every "
        "method ran once on 64 rows before any timing, so no method pays the process's "
        "one-time costs. MNLL of `y` (noise included), in units of the standardised targets. "
        "One split: the per-split spread of the UCI benchmark (up to 0.08 nats) applies to "
        "every number here.",
        "",
        "## Time to reach rfgp's accuracy",
        "",
        "For each baseline: when its test MNLL first reached rfgp's default (at the "
        "checkpoints), and its test MNLL at the last checkpoint within rfgp's time.",
        "",
        "| data set | rfgp default: MNLL, time |",
        "|---|---|",
    ]
    for result in results:
        ref = result["runs"]["rfgp default"][0]
        fast = result["runs"]["rfgp evidence maximum"][0]
        lines.append(f"| {result['set']} | {ref['mnll']:.3f} in {ref['time']:.1f} s (evidence "
                     f"maximum: {fast['mnll']:.3f} in {fast['time']:.1f} s) |")
    lines += ["", "| data set | baseline | reaches rfgp's MNLL after | its MNLL at rfgp's time |",
              "|---|---|---|---|"]
    for result in results:
        lines += summary_rows(result)
    lines += ["", "![test MNLL against time](regression_trajectory.png)", "",
              "## Every checkpoint", "",
              "| data set | method | steps | time (s) | RMSE | MNLL | 95% coverage |",
              "|---|---|---|---|---|---|---|"]
    for result in results:
        for method, points in result["runs"].items():
            for p in points:
                steps = "-" if p["steps"] is None else p["steps"]
                lines.append(f"| {result['set']} | {method} | {steps} | {p['time']:.1f} | "
                             f"{p['rmse']:.3f} | {p['mnll']:.3f} | {p['cov95']:.2f} |")
    write_page(path, "\n".join(lines) + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="a short run (few rows and steps) into a temporary folder")
    parser.add_argument("--quick-rows", type=int, default=300)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=2, help="data sets run in parallel")
    parser.add_argument("--sets", nargs="*", default=list(UCI_DATASETS))
    parser.add_argument("--sgpr-checkpoints", type=int, nargs="+",
                        default=[10, 25, 50, 100, 200])
    parser.add_argument("--svgp-checkpoints", type=int, nargs="+", default=[100, 300, 1000])
    parser.add_argument("--exact-max", type=int, default=1000)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.quick:
        args.sgpr_checkpoints, args.svgp_checkpoints = [2, 5], [2, 5]
    folder = args.out or (Path(tempfile.gettempdir()) if args.quick else OUT)
    folder.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    # The largest set first: with two workers it runs beside all the others.
    sets = sorted(args.sets, key=lambda s: -load_uci(s)[0].shape[0])
    tasks = [(name, args) for name in sets]
    if args.jobs > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(args.jobs, mp_context=context) as pool:
            results = list(pool.map(run_set, tasks))
    else:
        results = list(map(run_set, tasks))
    seconds = time.perf_counter() - started
    (folder / "regression_trajectory.json").write_text(
        json.dumps({"results": results, "seconds": seconds}, indent=1, default=float))
    plot(results, folder / "regression_trajectory.png")
    write_markdown(results, args, folder / "regression_trajectory.md", seconds)
    print(f"wrote {folder / 'regression_trajectory.md'} ({seconds:.0f} s)")


if __name__ == "__main__":
    main()
