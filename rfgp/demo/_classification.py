"""Dirichlet GP classification with random features against the exact Dirichlet GP.

Data: scikit-learn's bundled ``load_digits`` (10 classes, d = 64) and ``load_breast_cancer``
(2 classes, d = 30), inputs min-shifted to be non-negative and scaled to unit norm, a 75/25
split. Kernels: the Gaussian (RBF) kernel with the median-heuristic lengthscale and the
polynomial kernel ``((1 + x^T y) / 2)^7`` of the papers' experiments. ``alpha_epsilon`` is chosen on
a validation split with the random Fourier feature model and reused by every model (the papers'
protocol). Prints accuracy, MNLL and expected calibration error and saves a reliability diagram.

Run: ``python -m rfgp.demo --only classification`` (about 20 s on 2 cores; needs scikit-learn, the
``sklearn`` extra, for the data; the plot needs matplotlib, the ``plot`` extra).
"""

from __future__ import annotations

import math
import os
import time
from typing import Dict, List

import gpytorch
import torch
from sklearn.datasets import load_breast_cancer, load_digits

from rfgp import DirichletGPClassifier, metrics
from rfgp.demo import pyplot
from rfgp.kernels import DotProductKernel, FourierFeatureKernel, PolynomialSketchKernel

DTYPE = torch.float64
DEGREE = 7


def load(name: str, seed: int = 0):
    """Non-negative, unit-norm inputs and a seeded 75/25 split."""
    data = load_digits() if name == "digits" else load_breast_cancer()
    x = torch.as_tensor(data.data, dtype=DTYPE)
    y = torch.as_tensor(data.target, dtype=torch.long)
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(x.shape[0], generator=g)
    n_train = int(0.75 * x.shape[0])
    train, test = perm[:n_train], perm[n_train:]
    x = x - x[train].min(0).values
    x = torch.nn.functional.normalize(x, dim=-1)
    return x[train], y[train], x[test], y[test]


def median_lengthscale(x: torch.Tensor) -> float:
    return float(torch.cdist(x, x).median())


def kernels(x_train) -> Dict[str, gpytorch.kernels.Kernel]:
    d = x_train.shape[1]
    padded = 1 << math.ceil(math.log2(d + 1))
    ls = median_lengthscale(x_train)
    rbf = gpytorch.kernels.RBFKernel().to(DTYPE)
    rbf.lengthscale = ls
    rff = FourierFeatureKernel(512, seed=0).to(DTYPE)
    rff.lengthscale = ls
    # ((1 + x^T y) / 2)^p = (x^T y / l^2 + b)^p with l^2 = 2 and b = 1/2
    poly = DotProductKernel("polynomial", degree=DEGREE, bias=0.5).to(DTYPE)
    poly.lengthscale = math.sqrt(2.0)
    out = {"exact RBF": rbf, "RFF RBF (D=512 real)": rff, f"exact poly p={DEGREE}": poly}
    for complex_, num in ((False, 4 * padded), (True, 2 * padded)):
        k = PolynomialSketchKernel(DEGREE, num, bias=0.5, projection="tensorsrht",
                                   complex=complex_, seed=0).to(DTYPE)
        k.lengthscale = math.sqrt(2.0)
        kind = "complex" if complex_ else "real"
        out[f"TensorSRHT poly p={DEGREE} (D={num} {kind})"] = k
    return out


def evaluate(name: str, results: List[dict], diagrams: Dict[str, dict]) -> None:
    x, y, xt, yt = load(name)
    ks = kernels(x)
    chooser = DirichletGPClassifier(ks["RFF RBF (D=512 real)"], seed=0)
    chooser.select_alpha(x, y, alphas=(1e-3, 1e-2, 1e-1), refit=False)
    alpha = chooser.alpha_epsilon
    for method, kernel in ks.items():
        start = time.perf_counter()
        clf = DirichletGPClassifier(kernel, alpha_epsilon=alpha, seed=0, num_samples=1000)
        clf.fit(x, y)
        probs = clf.predict_proba(xt)
        elapsed = time.perf_counter() - start
        results.append({
            "method": method,
            "data": name,
            "alpha_epsilon": alpha,
            "accuracy": float(metrics.accuracy(probs, yt)),
            "mnll": float(metrics.mnll_classification(probs, yt)),
            "ece": float(metrics.expected_calibration_error(probs, yt)),
            "time_s": elapsed,
        })
        if method in ("exact RBF", "RFF RBF (D=512 real)") or "complex" in method:
            diagrams[f"{name}: {method}"] = metrics.reliability_diagram(probs, yt, num_bins=10)


def plot(diagrams: Dict[str, dict], path: str) -> None:
    plt = pyplot()
    if plt is None:
        return
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.5))
    for ax, data in zip(axes, ("digits", "breast_cancer")):
        ax.plot([0, 1], [0, 1], "k--", lw=1, label="perfect calibration")
        for label, diagram in diagrams.items():
            if not label.startswith(data + ":"):
                continue
            keep = diagram["count"] > 0
            ax.plot(diagram["confidence"][keep], diagram["accuracy"][keep], "o-",
                    label=label.split(": ", 1)[1])
        ax.set_title(f"{data}: reliability diagram")
        ax.set_xlabel("confidence (max class probability)")
        ax.set_ylabel("accuracy")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(output_dir: str = "demo_output") -> List[dict]:
    """Run both data sets, save the reliability diagram and return one row per (method, data).

    Returns:
        The demo's rows: dicts with ``method``, ``data``, ``metrics`` (``accuracy``, ``MNLL``,
        ``ECE``) and ``time_s``.
    """
    os.makedirs(output_dir, exist_ok=True)
    results: List[dict] = []
    diagrams: Dict[str, dict] = {}
    for name in ("digits", "breast_cancer"):
        evaluate(name, results, diagrams)
    plot(diagrams, os.path.join(output_dir, "classification_reliability.png"))
    header = f"{'data':<14}{'method':<38}{'acc':>7}{'MNLL':>8}{'ECE':>8}{'time s':>8}"
    print(header)
    for r in results:
        print(f"{r['data']:<14}{r['method']:<38}{r['accuracy']:7.3f}{r['mnll']:8.3f}"
              f"{r['ece']:8.3f}{r['time_s']:8.2f}")
    # The demo's row format: method, data, metrics (name -> value), time_s.
    return [{"method": r["method"], "data": r["data"],
             "metrics": {"accuracy": r["accuracy"], "MNLL": r["mnll"], "ECE": r["ece"]},
             "time_s": r["time_s"]} for r in results]
