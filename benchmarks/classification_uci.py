"""Classification at scale: rfgp's classifier against GPyTorch's GP classifiers and scikit-learn.

The bundled UCI classification sets (``rfgp.datasets.load_uci_classification``): letter
(20,000 rows, 16 inputs, 26 classes) and MAGIC (19,020 rows, 10 inputs, 2 classes) on random
80/20 splits (3), adult (105 inputs after one-hot encoding, 2 classes) on its given split
(32,561 training rows in ``adult.data``, 16,281 test rows in ``adult.test``; ``--adult-seeds
k`` runs each method on it with seeds ``0 .. k-1``, counted as adult's "splits"). Inputs are
standardised with the training rows' statistics. Per split and method: test accuracy, NLL
(mean of ``-log p(true class)``), the expected calibration error of the top-class confidence
(15 bins, :func:`rfgp.metrics.expected_calibration_error`), the Brier score
(:math:`\\frac1N \\sum_n \\sum_c (p_{nc} - [y_n = c])^2`) and the wall time of fit and
prediction.

Methods, each as a user would run it:

* ``rfgp default``: :func:`rfgp.fit_classifier_auto` with its default time budget
  (:func:`rfgp.recipes._schedule.default_budget`; ``D`` and ``alpha_epsilon`` chosen by the
  held-out NLL), ``seed`` = split; probabilities by its ``predict_proba`` (Monte Carlo, 1000
  draws). ``rfgp 4x budget``: four times the default budget. ``rfgp fixed alpha``: the
  default budget with ``select_alpha=False`` (``alpha_epsilon = 0.01``, the schedule's ``D``).
  The probabilities are read at the held-out temperature or, where it cross-validates
  better on the held-out rows, a per-class affine map of the latents (note ``class map``).
  Records named ``earlier: ...`` were taken before the held-out choice became the default
  (``earlier: rfgp default`` is then ``alpha_epsilon = 0.01``; ``earlier: rfgp alpha`` chose
  it by refitting six candidates).
* ``--paper``: the fixed-``D`` protocol of Wacker, Kanagawa and Filippone (Improved random
  features for dot product kernels, Section 6.4.2, Gaussian kernel): ``D = d, 3d, 5d`` with
  ``d`` the inputs padded to a power of two (MAGIC 16, adult 128), ``alpha_epsilon`` chosen
  on a 90/10 split from ``1e-5 .. 1``; methods ``rfgp D=kd`` (the recipe at
  ``num_features = k d``). The paper reports those runs as bar charts only (its one
  classification table, Table 3, is for a polynomial kernel), and letter is not among its
  sets; the page lists our numbers without paper values.
* ``SVGP M`` (M = 512, 1024): GPyTorch ``ApproximateGP`` with ``VariationalStrategy`` (M
  inducing points drawn from the training rows, learned; Cholesky variational distribution),
  ``ScaleKernel(RBFKernel(ARD))``, constant mean; binary sets one latent GP with
  ``BernoulliLikelihood``, multi-class sets ``C`` independent latent GPs
  (``IndependentMultitaskVariationalStrategy``) with ``SoftmaxLikelihood`` (no mixing);
  Adam (lr 0.01) on minibatches of 1024 rows, epochs until the ELBO stops improving (no gain
  above 1e-3 nats per datum for 3 epochs, at most 100 epochs); probabilities from 256
  likelihood samples.
* ``exact Dirichlet GP``: GPyTorch ``ExactGP`` with ``DirichletClassificationLikelihood``
  (``C`` batched GPs, ``ScaleKernel(RBFKernel(ARD))``), Adam (lr 0.1) for 50 steps on the
  exact marginal likelihood, probabilities from 256 posterior draws of the latents; on at
  most 10,000 training rows (``--exact-rows``; a random subsample of larger training sets),
  and at most ``sqrt(5e8 / C)`` (4,385 on letter) so that the ``C`` kernel matrices fit in
  4 GB.
* scikit-learn ``LogisticRegression`` (``max_iter=1000``), ``MLPClassifier`` (defaults,
  ``max_iter=500``) and ``HistGradientBoostingClassifier`` (defaults), ``random_state`` =
  split.

Every finished (set, split, method) is appended to
``docs/benchmarks/classification_uci.jsonl`` (``_harness.Records``); the page is written from
that file, so a run cut short keeps what it finished. Times: wall-clock seconds in one process.

Usage::

    python benchmarks/classification_uci.py                 # every set and method
    python benchmarks/classification_uci.py --sets magic    # some sets
    python benchmarks/classification_uci.py --methods "rfgp default" HistGB
    python benchmarks/classification_uci.py --page-only     # rewrite the page
    python benchmarks/classification_uci.py --quick         # smoke run to a temp dir
    python benchmarks/classification_uci.py --paper         # the paper's fixed-D protocol

``--quick``: every method on 1,000 training and 500 test rows, one split, tiny settings (a
check of the script; its numbers mean nothing).

Writes docs/benchmarks/classification_uci.md and a reliability diagram per set,
docs/benchmarks/classification_uci_<set>.png.
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _gp_classifiers import EXACT_MAX, exact_dirichlet, svgp  # noqa: E402
from _harness import Records, grouped, mean_spread, run_missing, timed  # noqa: E402
from _pages import write_page as write_kept  # noqa: E402

from rfgp import fit_classifier_auto, metrics  # noqa: E402
from rfgp.datasets import (  # noqa: E402
    UCI_CLASSIFICATION_DATASETS,
    load_uci_classification,
    standardize,
)
from rfgp.recipes import ClassifierFitReport  # noqa: E402
from rfgp.recipes._schedule import default_budget  # noqa: E402

OUT = ROOT / "docs" / "benchmarks"
RECORDS = OUT / "classification_uci.jsonl"
SETS = ["letter", "magic", "adult"]
METHODS = ["rfgp default", "rfgp 4x budget", "rfgp fixed alpha", "SVGP 512", "SVGP 1024",
           "exact Dirichlet GP", "LogisticRegression", "MLP", "HistGB"]
#: The paper's fixed-D runs (D = k d, d padded to a power of two) and the sets it shares.
PAPER_METHODS = ["rfgp D=1d", "rfgp D=3d", "rfgp D=5d"]
PAPER_SETS = ["magic", "adult"]
SPLITS = 3
TEST_FRACTION = 0.2


# ====================================================================== data
def load_split(name: str, split: int, quick: bool):
    """``(x_train, y_train, x_test, y_test)`` of split ``split``, float64 inputs standardised
    with the training statistics, int64 labels."""
    if name == "adult":
        xtr, ytr = load_uci_classification("adult", split="train")
        xte, yte = load_uci_classification("adult", split="test")
    else:
        x, y = load_uci_classification(name)
        g = torch.Generator().manual_seed(split)
        order = torch.randperm(x.shape[0], generator=g)
        cut = int(round(TEST_FRACTION * x.shape[0]))
        xte, yte, xtr, ytr = x[order[:cut]], y[order[:cut]], x[order[cut:]], y[order[cut:]]
    if quick:
        g = torch.Generator().manual_seed(100 + split)
        train = torch.randperm(xtr.shape[0], generator=g)[:1000]
        test = torch.randperm(xte.shape[0], generator=g)[:500]
        xtr, ytr, xte, yte = xtr[train], ytr[train], xte[test], yte[test]
    xtr, xte, _, _ = standardize(xtr, xte)
    return xtr, ytr, xte, yte


def scores(probs: np.ndarray, labels: np.ndarray) -> dict:
    """Accuracy, NLL, ECE (15 bins), Brier score and the reliability diagram's bins."""
    p = torch.as_tensor(probs, dtype=torch.float64)
    p = p / p.sum(-1, keepdim=True)  # float32 outputs: rows to sum to one in float64
    y = torch.as_tensor(labels, dtype=torch.long)
    onehot = torch.nn.functional.one_hot(y, p.shape[1]).to(p)
    diagram = metrics.reliability_diagram(p, y, 15)
    return {
        "accuracy": float(metrics.accuracy(p, y)),
        "nll": float(metrics.mnll_classification(p, y)),
        "ece": float(metrics.expected_calibration_error(p, y, 15)),
        "brier": float((p - onehot).square().sum(-1).mean()),
        "reliability": {"confidence": diagram["confidence"].nan_to_num(-1).tolist(),
                        "accuracy": diagram["accuracy"].nan_to_num(-1).tolist(),
                        "count": diagram["count"].tolist()},
    }


# ====================================================================== methods
def rfgp_fit(xtr, ytr, xte, seed, budget_factor=1.0, **options):
    budget = budget_factor * default_budget(xtr.shape[0])
    report = ClassifierFitReport()
    clf = fit_classifier_auto(xtr, ytr, seed=seed, time_budget=budget, report=report,
                              **options)
    info = {"D": clf.kernel.base_kernel.num_features, "budget": budget,
            "scale factor": report.calibration["factor"], "alpha": clf.alpha_epsilon,
            "temperature": round(clf.temperature, 4),
            "class map": _describe_map(clf.class_map),
            "search paths": report.schedule.settings["search_paths"],
            "seconds": {stage: round(took, 1) for stage, took in report.seconds.items()},
            "predicted": {stage: round(took, 1)
                          for stage, took in report.schedule.predicted.items()}}
    return clf.predict_proba(xte).numpy(), info


def _describe_map(class_map) -> str:
    """The per-class map ``(s, o)`` of the latents in a few characters: ``none``, or the
    scales and offsets (two classes), or their ranges."""
    if class_map is None:
        return "none"
    s, o = (v.tolist() for v in class_map)
    if len(s) <= 3:
        return "s " + "/".join(f"{v:.3g}" for v in s) + ", o " + "/".join(f"{v:.3g}" for v in o)
    return f"s {min(s):.3g} to {max(s):.3g}, o {min(o):.3g} to {max(o):.3g}"


def padded_inputs(d: int) -> int:
    """``d`` padded to a power of two, as the paper pads its inputs."""
    return 1 << max(0, (d - 1).bit_length())


def sklearn_fit(method, xtr, ytr, xte, seed):
    from sklearn.ensemble import HistGradientBoostingClassifier
    from sklearn.linear_model import LogisticRegression
    from sklearn.neural_network import MLPClassifier

    est = {"LogisticRegression": lambda: LogisticRegression(max_iter=1000),
           "MLP": lambda: MLPClassifier(max_iter=500, random_state=seed),
           "HistGB": lambda: HistGradientBoostingClassifier(random_state=seed)}[method]()
    est.fit(xtr.numpy(), ytr.numpy())
    probs = np.zeros((xte.shape[0], int(ytr.max()) + 1))
    probs[:, est.classes_] = est.predict_proba(xte.numpy())
    return probs, {}


def run_method(method, xtr, ytr, xte, num_classes, seed, quick, exact_rows=EXACT_MAX):
    if method == "rfgp default":
        return rfgp_fit(xtr, ytr, xte, seed)
    if method == "rfgp 4x budget":
        return rfgp_fit(xtr, ytr, xte, seed, 4.0)
    if method == "rfgp fixed alpha":
        return rfgp_fit(xtr, ytr, xte, seed, select_alpha=False)
    if method in PAPER_METHODS:
        factor = int(method.split("=")[1][:-1])
        return rfgp_fit(xtr, ytr, xte, seed,
                        num_features=factor * padded_inputs(xtr.shape[1]))
    if method.startswith("SVGP"):
        m = int(method.split()[1])
        return svgp(xtr, ytr, xte, num_classes, m // 16 if quick else m, seed, quick)
    if method == "exact Dirichlet GP":
        return exact_dirichlet(xtr, ytr, xte, num_classes, seed, quick, exact_rows)
    return sklearn_fit(method, xtr, ytr, xte, seed)


# ====================================================================== driver
def run(args, records: Records) -> None:
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")

    def tasks():
        for name in args.sets:
            splits = (1 if args.quick else args.adult_seeds if name == "adult"
                      else args.splits)
            for split in range(splits):
                for method in args.methods:
                    yield {"set": name, "split": split, "method": method}

    data = {}

    def fit(task):
        name, split, method = task["set"], task["split"], task["method"]
        # adult's "splits" are seeds on its one given split: loaded once for all of them
        key = (name, 0 if name == "adult" and not args.quick else split)
        if key not in data:
            data.clear()
            data[key] = load_split(name, split, args.quick)
        xtr, ytr, xte, yte = data[key]
        num_classes = len(UCI_CLASSIFICATION_DATASETS[name].classes)
        (probs, info), seconds = timed(
            lambda: run_method(method, xtr, ytr, xte, num_classes, split, args.quick,
                               args.exact_rows))
        row = {**task, "n_train": xtr.shape[0], "n_test": xte.shape[0], "d": xtr.shape[1],
               "classes": num_classes, "time": seconds, "threads": args.threads,
               "quick": args.quick, **scores(probs, yte.numpy()), "info": info}
        records.append(row)
        print(f"{name:7s} {split} {method:20s} acc {row['accuracy']:.4f} "
              f"nll {row['nll']:.4f} ece {row['ece']:.4f} brier {row['brier']:.4f} "
              f"time {seconds:7.1f}s", flush=True)

    run_missing(records, tasks(), ("set", "split", "method"), fit)


# ====================================================================== page
def plot_reliability(rows, name, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 5))
    ax.plot([0, 1], [0, 1], color="grey", lw=0.8, ls="--")
    for method in dict.fromkeys(r["method"] for r in rows):
        # the first split's diagram of each method
        rel = next(r for r in rows if r["method"] == method)["reliability"]
        pts = [(c, a) for c, a, n in zip(rel["confidence"], rel["accuracy"], rel["count"])
               if n > 0]
        if pts:
            ax.plot(*zip(*pts), marker="o", ms=3, lw=1, label=method)
    ax.set_xlabel("confidence (top class)")
    ax.set_ylabel("accuracy")
    ax.set_title(f"{name}: reliability (15 bins, split 0)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def gaps(rs) -> list:
    """rfgp's default against HistGradientBoosting and against the GPyTorch classifier of
    the lowest NLL, on the splits both ran (differences of the means: rfgp minus other)."""
    mean = {}
    for (method,), ms in grouped(rs, "method").items():
        mean[method] = {k: float(np.mean([r[k] for r in ms]))
                        for k in ("accuracy", "nll", "ece", "time")}
    if "rfgp default" not in mean:
        return []
    ours = mean["rfgp default"]
    gpytorch_runs = [m for m in mean if m.startswith("SVGP") or m.startswith("exact")]
    others = (["HistGB"] if "HistGB" in mean else []) + (
        [min(gpytorch_runs, key=lambda m: mean[m]["nll"])] if gpytorch_runs else [])
    out = [""]
    for other in others:
        theirs = mean[other]
        out.append(
            f"rfgp default minus {other}: accuracy {ours['accuracy'] - theirs['accuracy']:+.4f}, "
            f"NLL {ours['nll'] - theirs['nll']:+.3f}, ECE {ours['ece'] - theirs['ece']:+.3f}, "
            f"time ratio {ours['time'] / theirs['time']:.2g}.  ")
    return out


def _note(value) -> str:
    """A value of a run's notes: numbers to 6 significant digits, stage times as
    ``stage seconds`` separated by slashes."""
    if isinstance(value, dict):
        return "/".join(f"{key} {_note(item)}" for key, item in value.items())
    return f"{value:g}" if isinstance(value, float) else str(value)


def write_page(rows, out_dir: Path, page: Path, args) -> None:
    lines = [
        "# Classification on UCI data: rfgp against GPyTorch's GP classifiers and "
        "scikit-learn", "",
        "Written by `benchmarks/classification_uci.py` from `classification_uci.jsonl` "
        "(the method and protocol are in the script's docstring). Letter and MAGIC: random "
        "80/20 splits; adult: its given split (adult.data / adult.test), its \"splits\" "
        "the methods' seeds. Entries: mean ± standard deviation over the splits run. NLL: "
        "mean `-log p(true class)`; ECE: 15 bins of the top-class confidence; Brier: mean "
        "squared error of the probability vector; time: fit and prediction, wall-clock "
        "seconds.", "",
        f"Machine: {platform.processor() or platform.machine()}, "
        f"torch {torch.__version__}, {sorted({r['threads'] for r in rows}) or '-'} "
        "thread(s). **The timings were taken on a machine shared with other jobs** (two "
        "cores, loaded): they are upper bounds, and ratios between methods of one set are "
        "only indicative.",
    ]
    if any(r.get("quick") for r in rows):
        lines += ["", "**Smoke run (`--quick`: 1,000 training rows, tiny settings): these "
                  "numbers check the script, they measure nothing.**"]
    for name in dict.fromkeys(r["set"] for r in rows):
        rs = [r for r in rows if r["set"] == name]
        lines += ["", f"## {name}", "",
                  f"{rs[0]['n_train']} training rows, {rs[0]['n_test']} test rows, "
                  f"{rs[0]['d']} inputs, {rs[0]['classes']} classes.", "",
                  "| method | splits | accuracy | NLL | ECE | Brier | time (s) | notes |",
                  "|---|---|---|---|---|---|---|---|"]
        order = METHODS + PAPER_METHODS  # then the earlier records, in their order
        for (method,), ms in sorted(grouped(rs, "method").items(), key=lambda item: (
                order.index(item[0][0]) if item[0][0] in order else len(order))):
            note = ", ".join(f"{k} {_note(v)}" for k, v in ms[0]["info"].items())
            lines.append(
                f"| {method} | {len(ms)} | {mean_spread([r['accuracy'] for r in ms], 4)} "
                f"| {mean_spread([r['nll'] for r in ms])} "
                f"| {mean_spread([r['ece'] for r in ms])} "
                f"| {mean_spread([r['brier'] for r in ms])} "
                f"| {mean_spread([r['time'] for r in ms], 1)} | {note} |")
        lines += gaps(rs)
        missing = [m for m in args.methods if not any(r["method"] == m for r in rs)]
        if missing:
            lines += ["", f"Not run on {name}: {', '.join(missing)}."]
        figure = out_dir / f"classification_uci_{name}.png"
        plot_reliability(rs, name, figure)
        lines += ["", f"![{name} reliability]({figure.name})"]
    write_kept(page, "\n".join(lines) + "\n")
    print(f"wrote {page}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sets", nargs="+", default=None, choices=SETS)
    parser.add_argument("--methods", nargs="+", default=None, choices=METHODS + PAPER_METHODS)
    parser.add_argument("--paper", action="store_true",
                        help="the paper's fixed-D runs (D = d, 3d, 5d) on MAGIC and adult")
    parser.add_argument("--splits", type=int, default=SPLITS)
    parser.add_argument("--adult-seeds", type=int, default=1,
                        help="seeds per method on adult's given split (its 'splits')")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--exact-rows", type=int, default=EXACT_MAX,
                        help="most training rows of the exact Dirichlet GP (a random subsample)")
    parser.add_argument("--quick", action="store_true",
                        help="every method on a small subsample, one split, to a temp dir")
    parser.add_argument("--page-only", action="store_true")
    parser.add_argument("--out", type=Path, default=None,
                        help="folder of the records, page and plots (default docs/benchmarks)")
    args = parser.parse_args(argv)
    args.sets = args.sets or (PAPER_SETS if args.paper else SETS)
    args.methods = args.methods or (PAPER_METHODS if args.paper else METHODS)
    out_dir = args.out or (Path(tempfile.mkdtemp()) if args.quick else OUT)
    out_dir.mkdir(parents=True, exist_ok=True)
    records = Records(out_dir / RECORDS.name)
    if not args.page_only:
        run(args, records)
    write_page(records.rows(), out_dir, out_dir / "classification_uci.md", args)


if __name__ == "__main__":
    main()
