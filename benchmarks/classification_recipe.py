"""The classifier's default: the evidence recipe against fixed hyperparameters.

``rfgp.sklearn.RandomFeatureGPClassifier()`` fits by the classification recipe
(:func:`rfgp.classification.fit_classifier_auto`: ARD lengthscales and outputscale maximise the
evidence of the Dirichlet-transformed labels at 512 orthogonal features, then a refit with ``D``
chosen from ``N`` and ``C``). Before it, the estimator used an RBF kernel with lengthscale 1,
256 iid features and no hyperparameter fit; that default is ``optimizer=None,
num_features=256`` now. Both run here, and the recipe followed by a choice of
``alpha_epsilon`` on a validation split (``optimizer="validation"``) as a third, on
scikit-learn's bundled data sets (iris, wine, breast cancer, digits), inputs standardised on
the training part, five random 75/25 splits each, one process, one thread, side by side.

Per fit: test accuracy, test NLL (mean of ``-log p(true class)`` from ``predict_log_proba``,
Monte Carlo with 1000 draws), the expected calibration error of the top-class confidence (15
bins, :func:`rfgp.metrics.expected_calibration_error`) and the wall time of ``fit``.

Run: ``python benchmarks/classification_recipe.py`` (``--quick``: two splits, no digits).
Writes docs/benchmarks/classification_recipe.md.
"""

from __future__ import annotations

import argparse
import math
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rfgp import metrics  # noqa: E402
from rfgp.sklearn import RandomFeatureGPClassifier  # noqa: E402

OUT = ROOT / "docs" / "benchmarks" / "classification_recipe.md"
METHODS = {
    "old default (`optimizer=None, num_features=256`)":
        lambda seed: RandomFeatureGPClassifier(optimizer=None, num_features=256,
                                               random_state=seed),
    "new default (`RandomFeatureGPClassifier()`)":
        lambda seed: RandomFeatureGPClassifier(random_state=seed),
    "recipe + alpha on validation (`optimizer=\"validation\"`)":
        lambda seed: RandomFeatureGPClassifier(optimizer="validation", random_state=seed),
}
BEGIN, END = "<!-- results -->", "<!-- /results -->"


def datasets(quick: bool):
    from sklearn.datasets import load_breast_cancer, load_digits, load_iris, load_wine

    loaders = {"iris": load_iris, "wine": load_wine, "breast_cancer": load_breast_cancer}
    if not quick:
        loaders["digits"] = load_digits
    for name, loader in loaders.items():
        x, y = loader(return_X_y=True)
        yield name, x.astype(np.float64), y


def split(x, y, seed):
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(y))
    cut = int(round(0.75 * len(y)))
    train, test = order[:cut], order[cut:]
    mean, std = x[train].mean(0), x[train].std(0)
    std = np.where(std > 0, std, 1.0)
    return (x[train] - mean) / std, y[train], (x[test] - mean) / std, y[test]


def evaluate(make, seed, data):
    x_train, y_train, x_test, y_test = data
    est = make(seed)
    start = time.perf_counter()
    est.fit(x_train, y_train)
    fit_time = time.perf_counter() - start
    log_proba = est.predict_log_proba(x_test)
    index = np.searchsorted(est.classes_, y_test)
    proba = torch.from_numpy(np.exp(log_proba))
    labels = torch.from_numpy(index)
    features = est.classifier_.kernel
    while hasattr(features, "base_kernel"):
        features = features.base_kernel
    return {
        "accuracy": float((est.classes_[log_proba.argmax(1)] == y_test).mean()),
        "nll": float(-log_proba[np.arange(len(y_test)), index].mean()),
        "ece": float(metrics.expected_calibration_error(proba, labels, 15)),
        "time": fit_time,
        "num_features": int(features.num_features),
        "iterations": int(getattr(est, "n_iter_", 0)),
    }


def evidence_cost(repeats: int = 3):
    """Seconds of one evaluation of the 10-class evidence with its gradient (digits' size:
    N = 1348, D = 512): the closed form of the recipe against automatic differentiation
    through one weighted Gram matrix per class. Best of ``repeats``."""
    from rfgp.inference._heteroscedastic_evidence import heteroscedastic_negative_log_evidence
    from rfgp.likelihoods import dirichlet_transform

    n, width, classes = 1348, 512, 10
    g = torch.Generator().manual_seed(0)
    z = torch.randn(n, width, dtype=torch.float64, generator=g) / width**0.5
    labels = torch.randint(0, classes, (n,), generator=g)
    targets, noise = dirichlet_transform(labels, classes, 0.01)
    targets = targets - targets.mean(0)

    def per_class(z, y, s):
        total = z.new_zeros(())
        for c in range(classes):
            w = 1.0 / s[:, c]
            bmat = torch.eye(width, dtype=z.dtype) + z.T @ (z * w[:, None])
            chol = torch.linalg.cholesky(bmat)
            h = z.T @ (w * y[:, c])
            alpha = torch.cholesky_solve(h[:, None], chol)[:, 0]
            total = total + 0.5 * ((w * y[:, c] ** 2).sum() - h @ alpha
                                   + 2 * chol.diagonal().log().sum() + s[:, c].log().sum()
                                   + n * math.log(2 * math.pi))
        return total

    out = {}
    for name, fn in (("closed form (shared Z^T Z)", heteroscedastic_negative_log_evidence),
                     ("autograd, one Gram per class", per_class)):
        best, value = math.inf, None
        for _ in range(repeats):
            zz = z.clone().requires_grad_(True)
            start = time.perf_counter()
            value = fn(zz, targets, noise)
            value.backward()
            best = min(best, time.perf_counter() - start)
        out[name] = (best, float(value.detach()))
    return out


def summary(values):
    values = np.asarray(values)
    return f"{values.mean():.3f} ± {values.std():.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    splits = 2 if args.quick else 5
    started = time.perf_counter()
    rows = []
    for name, x, y in datasets(args.quick):
        results = {m: [] for m in METHODS}
        for seed in range(splits):
            data = split(x, y, seed)
            for method, make in METHODS.items():
                results[method].append(evaluate(make, seed, data))
        n_train = int(round(0.75 * len(y)))
        base = None
        for method, runs in results.items():
            t = np.array([r["time"] for r in runs])
            base = t if base is None else base
            rows.append(
                f"| {name} (N = {n_train}, d = {x.shape[1]}, C = {len(np.unique(y))}) | {method} "
                f"| {summary([r['accuracy'] for r in runs])} "
                f"| {summary([r['nll'] for r in runs])} "
                f"| {summary([r['ece'] for r in runs])} "
                f"| {t.mean():.2f} | {np.median(t / base):.1f} "
                f"| {runs[0]['num_features']} | {np.mean([r['iterations'] for r in runs]):.0f} |"
            )
            print(rows[-1], flush=True)
    cost = evidence_cost()
    closed = next(iter(cost.values()))[0]
    cost_rows = [f"| {name} | {sec:.3f} | {sec / closed:.1f} | {val:.6f} |"
                 for name, (sec, val) in cost.items()]
    print("\n".join(cost_rows), flush=True)
    total = time.perf_counter() - started
    table = [
        BEGIN,
        "",
        "| data set | method | accuracy | test NLL | ECE | fit time (s) | time ratio | D "
        "| iterations |",
        "|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        f"One process, `torch.set_num_threads(1)`, float64, on {platform.processor() or 'CPU'} "
        f"({platform.system()}), a machine shared with other jobs: the times are noisy; the "
        f"ratios come from fits run side by side. Whole run: {total:.0f} s.",
        "",
        "One evaluation of the 10-class evidence with its gradient at digits' size (N = 1348, "
        "D = 512, best of 3; the same value both ways):",
        "",
        "| method | seconds | ratio | -log evidence |",
        "|---|---|---|---|",
        *cost_rows,
        "",
        END,
    ]
    lines = [
        "# Classification: the default recipe",
        "",
        "`rfgp.sklearn.RandomFeatureGPClassifier()` fits by the classification recipe "
        "(`rfgp.classification.fit_classifier_auto`): shared ARD lengthscales and the "
        "outputscale maximise the summed log evidence of the C Dirichlet-transformed regression "
        "problems (their noise fixed by the transform, `alpha_epsilon = 0.01`) at 512 "
        "orthogonal random Fourier features on up to 2000 rows, by L-BFGS with the gradient in "
        "closed form; then the classifier is refitted on all rows with D chosen from N and C "
        "(the schedule of `rfgp.recipes._classification.plan_classifier`). The old default, an "
        "RBF kernel with lengthscale 1 "
        "and 256 iid features without any fit, is `optimizer=None, num_features=256`.",
        "",
        f"scikit-learn's bundled data sets, inputs standardised on the training part, "
        f"{splits} random 75/25 splits each (mean ± standard deviation over the splits); NLL: "
        "mean negative log predicted probability of the true class; ECE: expected calibration "
        "error of the top-class confidence, 15 bins; fit time: wall time of `fit`, and its "
        "ratio to the old default's fit (median over the splits); D: features of the final "
        "fit; iterations: L-BFGS iterations of the evidence search.",
        "",
        *table,
        "",
        "Run: `python benchmarks/classification_recipe.py`.",
        "",
    ]
    if not args.quick:
        text = OUT.read_text() if OUT.exists() else ""
        if BEGIN in text and END in text:
            # Keep the hand-written discussion around the table.
            head, rest = text.split(BEGIN, 1)
            text = head + "\n".join(table) + rest.split(END, 1)[1]
        else:
            text = "\n".join(lines)
        OUT.write_text(text)
        print(f"wrote {OUT}")
    else:
        print("\n".join(lines))


if __name__ == "__main__":
    main()
