"""Hyperparameter training: time per marginal-likelihood evaluation with gradient, rfgp vs GPyTorch.

Data: the UCI combined-cycle power-plant set bundled with rfgp (9568 rows, 4 inputs), inputs and
targets standardised on a random 90% training split (the remaining 10% give a test RMSE after
training). Two kernels, each with ``D = 1024`` real feature columns and an outputscale
(``ScaleKernel``); float64 throughout:

* TensorSRHT sketch of the polynomial kernel ``(x^T y / l^2 + b)^3`` (ARD lengthscale, learned
  bias; ``PolynomialSketchKernel(projection="tensorsrht")``), once through the compiled kernel
  (forward and backward, when numba is installed) and once through the GEMM path;
* orthogonal random Fourier features of the RBF kernel (``FourierFeatureKernel(sampling=
  "orthogonal")``, ARD lengthscale).

One *evaluation* is what every optimiser step needs: the negative log marginal likelihood per
data point and its gradient with respect to all hyperparameters (kernel parameters and the
noise). Compared side by side, in alternation within each round (minimum over the rounds):

* ``rfgp``: ``RandomFeatureGP.log_marginal_likelihood(x, y, noise)`` (feature-space Woodbury
  form, ``O(N D^2 + D^3)``) and ``backward``;
* ``GPyTorch ExactGP + rfgp kernel``: an ``ExactGP`` whose covariance is the same rfgp kernel
  (same weights: the same features), ``ExactMarginalLogLikelihood`` and ``backward``;
* ``GPyTorch ExactGP + exact kernel``: the kernel the features approximate (rfgp's exact
  ``DotProductKernel`` for the polynomial, GPyTorch's ``RBFKernel``), with GPyTorch's default
  settings (conjugate gradients and Lanczos above 800 rows), for scale.

Then each rfgp model is trained end to end (``optimize_hyperparameters``, L-BFGS) and the run
reports its evaluations, time and test RMSE.

Usage::

    python benchmarks/training.py             # full run (N = 8611 training rows), 1 and all threads
    python benchmarks/training.py --quick     # N = 1500, one round

Writes docs/benchmarks/training.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import platform
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import gpytorch  # noqa: E402

from rfgp import RandomFeatureGP  # noqa: E402
from rfgp.datasets import load_uci, standardize, train_test_split  # noqa: E402
from rfgp.kernels import (  # noqa: E402
    DotProductKernel,
    FourierFeatureKernel,
    PolynomialSketchKernel,
)

OUT = ROOT / "docs" / "benchmarks"
NUM_FEATURES = 1024
DEGREE = 3
NOISE = 0.1
DTYPE = torch.float64


# --------------------------------------------------------------------------------- data
def load_data(num_rows):
    x, y = load_uci("power-plant", dtype=DTYPE)
    g = torch.Generator().manual_seed(0)
    x_train, y_train, x_test, y_test = train_test_split(x, y, 0.1, generator=g)
    x_train, x_test, _, _ = standardize(x_train, x_test)
    y_train, y_test, _, _ = standardize(y_train, y_test)
    if num_rows is not None:
        x_train, y_train = x_train[:num_rows], y_train[:num_rows]
    return x_train, y_train, x_test, y_test


# --------------------------------------------------------------------------------- models
def sketch_kernel(d):
    return gpytorch.kernels.ScaleKernel(PolynomialSketchKernel(
        DEGREE, NUM_FEATURES, bias=1.0, projection="tensorsrht", ard_num_dims=d, input_dim=d,
        seed=0)).to(DTYPE)


def fourier_kernel(d):
    return gpytorch.kernels.ScaleKernel(FourierFeatureKernel(
        NUM_FEATURES, sampling="orthogonal", ard_num_dims=d, input_dim=d, seed=0)).to(DTYPE)


def exact_kernel(name, d):
    if name == "sketch":
        base = DotProductKernel("polynomial", degree=DEGREE, bias=1.0, ard_num_dims=d)
    else:
        base = gpytorch.kernels.RBFKernel(ard_num_dims=d)
    return gpytorch.kernels.ScaleKernel(base).to(DTYPE)


class ExactModel(gpytorch.models.ExactGP):
    def __init__(self, x, y, likelihood, covar):
        super().__init__(x, y, likelihood)
        self.mean_module = gpytorch.means.ZeroMean()
        self.covar_module = covar

    def forward(self, inp):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(inp),
                                                         self.covar_module(inp))


def rfgp_evaluation(kernel, x, y):
    gp = RandomFeatureGP(kernel, noise=NOISE)
    log_noise = torch.tensor(math.log(NOISE), dtype=DTYPE, requires_grad=True)
    params = [p for p in kernel.parameters()] + [log_noise]

    def evaluate():
        for p in params:
            p.grad = None
        loss = -gp.log_marginal_likelihood(x, y, log_noise.exp()) / y.numel()
        loss.backward()
        return float(loss)

    return evaluate


def gpytorch_evaluation(kernel, x, y):
    likelihood = gpytorch.likelihoods.GaussianLikelihood().to(DTYPE)
    likelihood.noise = NOISE
    model = ExactModel(x, y, likelihood, kernel).to(DTYPE)
    model.train()
    likelihood.train()
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
    params = list(model.parameters())

    def evaluate():
        for p in params:
            p.grad = None
        loss = -mll(model(x), y)
        loss.backward()
        return float(loss)

    return evaluate


def compiled_available() -> bool:
    """Whether TensorSRHT takes the compiled kernels here: numba installed and not switched off
    by ``RFGP_DISABLE_NUMBA``."""
    disabled = os.environ.get("RFGP_DISABLE_NUMBA", "").strip() not in ("", "0")
    return importlib.util.find_spec("numba") is not None and not disabled


def compiled_off(fn):
    """``fn`` run with the compiled TensorSRHT kernels switched off (``RFGP_DISABLE_NUMBA=1``,
    read at every call)."""

    def run():
        previous = os.environ.get("RFGP_DISABLE_NUMBA")
        os.environ["RFGP_DISABLE_NUMBA"] = "1"
        try:
            return fn()
        finally:
            if previous is None:
                del os.environ["RFGP_DISABLE_NUMBA"]
            else:
                os.environ["RFGP_DISABLE_NUMBA"] = previous

    return run


def time_evaluations(x, y, rounds):
    d = x.shape[1]
    fns = {}
    for name, make in (("sketch", sketch_kernel), ("fourier", fourier_kernel)):
        kernel = make(d)
        fns[(name, "rfgp")] = rfgp_evaluation(kernel, x, y)
        if name == "sketch":
            fns[(name, "rfgp-gemm")] = compiled_off(rfgp_evaluation(kernel, x, y))
        fns[(name, "gpytorch-rf")] = gpytorch_evaluation(make(d), x, y)
        fns[(name, "gpytorch-exact")] = gpytorch_evaluation(exact_kernel(name, d), x, y)
    losses = {key: fn() for key, fn in fns.items()}  # warm-up (compilation, caches)
    best = {key: math.inf for key in fns}
    for _ in range(rounds):
        for key, fn in fns.items():
            start = time.perf_counter()
            fn()
            best[key] = min(best[key], time.perf_counter() - start)
    return best, losses


def train_end_to_end(x, y, x_test, y_test, iterations):
    rows = {}
    d = x.shape[1]
    for name, make in (("sketch", sketch_kernel), ("fourier", fourier_kernel)):
        kernel = make(d)
        gp = RandomFeatureGP(kernel, noise=NOISE)
        count = [0]
        original = gp.log_marginal_likelihood

        def counted(*args, original=original, count=count, **kwargs):
            count[0] += 1
            return original(*args, **kwargs)

        gp.log_marginal_likelihood = counted
        start = time.perf_counter()
        losses = gp.optimize_hyperparameters(x, y, num_iterations=iterations)
        elapsed = time.perf_counter() - start
        with torch.no_grad():
            rmse = float((gp.predict(x_test) - y_test).square().mean().sqrt())
        rows[name] = (count[0], elapsed, losses[-1], rmse)
    return rows


# --------------------------------------------------------------------------------- report
LABELS = {
    ("sketch", "rfgp"): "rfgp RandomFeatureGP, TensorSRHT",
    ("sketch", "rfgp-gemm"): "rfgp RandomFeatureGP, TensorSRHT (GEMM path)",
    ("sketch", "gpytorch-rf"): "GPyTorch ExactGP + the same TensorSRHT kernel",
    ("sketch", "gpytorch-exact"): "GPyTorch ExactGP + exact polynomial kernel",
    ("fourier", "rfgp"): "rfgp RandomFeatureGP, orthogonal Fourier",
    ("fourier", "gpytorch-rf"): "GPyTorch ExactGP + the same Fourier kernel",
    ("fourier", "gpytorch-exact"): "GPyTorch ExactGP + exact RBF kernel",
}


def report(results, train, args, n, elapsed):
    compiled = compiled_available()
    threads = list(results)
    lines = [
        "# Hyperparameter training: time per marginal-likelihood evaluation",
        "",
        f"Command: `{' '.join(['python benchmarks/training.py', *sys.argv[1:]])}` "
        f"({elapsed:.0f} s). Machine: {platform.machine()}, {platform.processor() or 'cpu'}, "
        f"torch {torch.__version__}, gpytorch {gpytorch.__version__}, "
        f"{os.cpu_count()} cores shared with other jobs (load average {args.load[0]:.1f} -> "
        f"{args.load[1]:.1f} during the run; timings are noisy and the ratios come from one "
        "run, methods timed in alternation). GPU numbers are not measured yet.",
        "",
        f"Data: UCI power plant (bundled), N = {n} standardised training rows, d = 4. Kernels "
        f"with D = {NUM_FEATURES} real feature columns, ScaleKernel, ARD lengthscales, float64: "
        f"the TensorSRHT sketch of `(x^T y / l^2 + b)^{DEGREE}` (learned bias) and orthogonal "
        "random Fourier features of the RBF kernel. One evaluation: negative log marginal "
        "likelihood per point and its gradient with respect to every hyperparameter and the "
        f"noise (minimum over {args.rounds} rounds). The compiled TensorSRHT kernel was "
        + ("available (numba installed): forward and backward run through it" if compiled
           else "NOT available (numba missing): every TensorSRHT row is the GEMM path")
        + ". With d = 4 the padded dimension is d' = 8, so the features themselves are cheap "
        "here; the evaluation is dominated by the D x D Gram matrix, its Cholesky and their "
        "backward.",
        "",
        "## Time per evaluation with gradient",
        "",
        "| model | " + " | ".join(f"{t} thread(s): time (s) | this / rfgp" for t in threads) + " |",
        "|---|" + "---|---|" * len(threads),
    ]
    for key, label in LABELS.items():
        cells = []
        for t in threads:
            best = results[t][0]
            ref = best[(key[0], "rfgp")]
            cells.append(f"{best[key]:.4f} | {best[key] / ref:.1f}x")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += [""]
    for t in threads:
        best, losses = results[t]
        s, f = best, best
        lines.append(
            f"{t} thread(s): rfgp is {s[('sketch', 'gpytorch-rf')] / s[('sketch', 'rfgp')]:.1f}x "
            "faster than GPyTorch's ExactGP with the same TensorSRHT kernel and "
            f"{s[('sketch', 'gpytorch-exact')] / s[('sketch', 'rfgp')]:.1f}x faster than the "
            "exact polynomial GP; with the Fourier kernel "
            f"{f[('fourier', 'gpytorch-rf')] / f[('fourier', 'rfgp')]:.1f}x and "
            f"{f[('fourier', 'gpytorch-exact')] / f[('fourier', 'rfgp')]:.1f}x. The compiled "
            "TensorSRHT path against its GEMM path inside the same evaluation: "
            f"{s[('sketch', 'rfgp-gemm')] / s[('sketch', 'rfgp')]:.2f}x."
        )
        lines.append("")
    lines += [
        "Loss values at the starting point (the two GPyTorch models with rfgp kernels must "
        "agree with rfgp; GPyTorch's CG/Lanczos estimate of the exact GP's is stochastic):",
        "",
        "| model | loss |",
        "|---|---|",
    ]
    first = results[threads[0]][1]
    for key, label in LABELS.items():
        lines.append(f"| {label} | {first[key]:.6f} |")
    lines += [
        "",
        "## End-to-end: `RandomFeatureGP.optimize_hyperparameters` (L-BFGS)",
        "",
        f"{threads[-1]} thread(s), {args.iterations} L-BFGS iterations at most, starting from "
        f"lengthscale 1, outputscale {0.693:.3f} (GPyTorch's default), noise {NOISE}; test "
        "RMSE on the held-out 10% (standardised targets).",
        "",
        "| kernel | evaluations | time (s) | time / evaluation (s) | final loss | test RMSE |",
        "|---|---|---|---|---|---|",
    ]
    for name, label in (("sketch", "TensorSRHT"), ("fourier", "orthogonal Fourier")):
        count, seconds, loss, rmse = train[name]
        lines.append(f"| {label} | {count} | {seconds:.2f} | {seconds / max(count, 1):.4f} | "
                     f"{loss:.4f} | {rmse:.4f} |")
    lines.append("")
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="N = 1500, one round")
    parser.add_argument("--rows", type=int, default=None, help="training rows (default: all)")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--iterations", type=int, default=None)
    parser.add_argument("--threads", type=int, nargs="+", default=None,
                        help="thread counts (default: 1 and all)")
    args = parser.parse_args()
    args.rows = args.rows or (1500 if args.quick else None)
    args.rounds = args.rounds or (1 if args.quick else 2)
    args.iterations = args.iterations or (5 if args.quick else 10)
    threads = args.threads or sorted({1, os.cpu_count() or 1})
    start = time.time()
    load_before = os.getloadavg()[0]
    x, y, x_test, y_test = load_data(args.rows)
    results = {}
    for t in threads:
        torch.set_num_threads(t)
        print(f"timing evaluations, {t} thread(s)", flush=True)
        results[t] = time_evaluations(x, y, args.rounds)
        for key, value in results[t][0].items():
            print(f"  {key}: {value:.4f} s", flush=True)
    print("end-to-end training", flush=True)
    train = train_end_to_end(x, y, x_test, y_test, args.iterations)
    args.load = (load_before, os.getloadavg()[0])
    lines = report(results, train, args, x.shape[0], time.time() - start)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "training.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
