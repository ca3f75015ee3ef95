"""GP regression on a real UCI data set: the exact GP beside random-feature GPs.

The data is the bundled ``concrete`` set (1030 mixtures, 8 inputs, compressive strength),
standardised with the training statistics and split 90/10. First rfgp's default recipe,
``rfgp.fit_auto`` (data-driven start, L-BFGS on the evidence to convergence, a refit with many
random Fourier features; see its docstring). Then GPyTorch ``ExactGP`` models trained with Adam
on the exact marginal likelihood:

* the exact GP with an ARD ``RBFKernel`` (``O(N^3)`` per step);
* the same model with ``FourierFeatureKernel`` in place of the RBF kernel (iid, orthogonal and
  structured frequencies). Its covariance is a low-rank ``LinearOperator`` and prediction goes
  through GPyTorch's ``LinearPredictionStrategy``, so a step costs ``O(N D^2)``.

It prints test RMSE, MNLL (mean negative log predictive density, in standardised units) and the
fit time of each model, and saves a plot of predictions against the truth.

Usage::

    python -m rfgp.demo [output_dir] --only regression      # default output_dir: demo_output/

The plot needs matplotlib (the ``plot`` extra); without it the rows are still computed.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Dict, List

import gpytorch
import torch

import rfgp
from rfgp import metrics
from rfgp.datasets import load_uci, standardize, train_test_split
from rfgp.demo import pyplot
from rfgp.kernels import FourierFeatureKernel

DATASET = "concrete"
TRAINING_STEPS = 100
LEARNING_RATE = 0.1
NUM_FEATURES = 256  # feature columns: 128 frequencies, cos and sin


class GPRegressionModel(gpytorch.models.ExactGP):
    def __init__(self, x, y, likelihood, kernel):
        super().__init__(x, y, likelihood)
        self.mean_module = gpytorch.means.ConstantMean()
        self.covar_module = gpytorch.kernels.ScaleKernel(kernel)

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def make_kernels(input_dim: int) -> Dict[str, gpytorch.kernels.Kernel]:
    return {
        "exact GP (RBF)": gpytorch.kernels.RBFKernel(ard_num_dims=input_dim),
        f"RFF, D={NUM_FEATURES}": FourierFeatureKernel(
            NUM_FEATURES, sampling="iid", ard_num_dims=input_dim, seed=0),
        f"ORF, D={NUM_FEATURES}": FourierFeatureKernel(
            NUM_FEATURES, sampling="orthogonal", ard_num_dims=input_dim, seed=0),
        f"SORF (pad_to=64), D={NUM_FEATURES}": FourierFeatureKernel(
            NUM_FEATURES, sampling="structured", pad_to=64, ard_num_dims=input_dim, seed=0),
    }


def fit(model, likelihood, x, y) -> float:
    """Adam on the exact marginal likelihood; returns the wall time in seconds."""
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
    optimizer = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)
    model.train()
    likelihood.train()
    start = time.perf_counter()
    for _ in range(TRAINING_STEPS):
        optimizer.zero_grad()
        loss = -mll(model(x), y)
        loss.backward()
        optimizer.step()
    return time.perf_counter() - start


def evaluate(model, likelihood, x, y):
    model.eval()
    likelihood.eval()
    with torch.no_grad():
        predictive = likelihood(model(x))
    mean, var = predictive.mean, predictive.variance
    return mean, var, metrics.rmse(y, mean).item(), metrics.mnll(y, mean, var).item()


def main(output_dir: str = "demo_output") -> List[dict]:
    """Run the comparison, save ``regression.png`` into ``output_dir`` and return summary rows.

    Returns:
        one dict per model: ``method``, ``data``, ``metrics`` (``{"RMSE": .., "MNLL": ..}``) and
        ``time_s`` (the fit time).
    """
    output = Path(output_dir)
    output.mkdir(parents=True, exist_ok=True)
    x, y = load_uci(DATASET)
    x_train, y_train, x_test, y_test = train_test_split(
        x, y, test_fraction=0.1, generator=torch.Generator().manual_seed(0))
    x_train, x_test, _, _ = standardize(x_train, x_test)
    y_train, y_test, _, _ = standardize(y_train, y_test)
    data = f"{DATASET} (N={len(x_train)}+{len(x_test)}, d={x.shape[1]})"

    rows, predictions = [], {}
    start = time.perf_counter()
    gp = rfgp.fit_auto(x_train, y_train, seed=0)  # standardised targets: zero prior mean fits
    fit_time = time.perf_counter() - start
    mean, std = gp.predict(x_test, return_std=True)
    var = std.square() + gp.noise.detach()  # the predictive variance of y: noise included
    rmse, mnll = metrics.rmse(y_test, mean).item(), metrics.mnll(y_test, mean, var).item()
    method = f"rfgp.fit_auto (D={gp.feature_map.num_features})"
    predictions[method] = (mean.detach(), var)
    rows.append({"method": method, "data": data,
                 "metrics": {"RMSE": rmse, "MNLL": mnll}, "time_s": fit_time})
    print(f"  {method:34s} RMSE {rmse:.3f}  MNLL {mnll:7.3f}  fit {fit_time:6.2f} s", flush=True)
    # Dense solves (not CG) for the exact GP, so that it is the reference it claims to be.
    with gpytorch.settings.max_cholesky_size(10_000):
        for method, kernel in make_kernels(x.shape[1]).items():
            likelihood = gpytorch.likelihoods.GaussianLikelihood()
            model = GPRegressionModel(x_train, y_train, likelihood, kernel).double()
            likelihood = likelihood.double()
            fit_time = fit(model, likelihood, x_train, y_train)
            mean, var, rmse, mnll = evaluate(model, likelihood, x_test, y_test)
            predictions[method] = (mean, var)
            rows.append({"method": method, "data": data,
                         "metrics": {"RMSE": rmse, "MNLL": mnll}, "time_s": fit_time})
            print(f"  {method:34s} RMSE {rmse:.3f}  MNLL {mnll:7.3f}  fit {fit_time:6.2f} s",
                  flush=True)

    plt = pyplot()
    if plt is None:
        return rows
    fig, axes = plt.subplots(1, len(predictions), figsize=(4 * len(predictions), 4),
                             sharex=True, sharey=True)
    order = torch.argsort(y_test)
    for ax, (method, (mean, var)), row in zip(axes, predictions.items(), rows):
        ax.errorbar(y_test[order], mean[order], yerr=2 * var[order].sqrt(), fmt="o", ms=3,
                    alpha=0.6, elinewidth=0.8)
        lim = [y_test.min().item() - 0.5, y_test.max().item() + 0.5]
        ax.plot(lim, lim, "k--", lw=1)
        ax.set_title(f"{method}\nRMSE {row['metrics']['RMSE']:.3f}, "
                     f"MNLL {row['metrics']['MNLL']:.2f}", fontsize=9)
        ax.set_xlabel("true (standardised)")
    axes[0].set_ylabel("predicted mean +- 2 sd")
    fig.suptitle(f"GP regression on {data}: test set")
    fig.tight_layout()
    fig.savefig(output / "regression.png", dpi=100)
    plt.close(fig)
    return rows
