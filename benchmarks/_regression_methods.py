"""What the regression benchmarks share: the splits, the scores of a Gaussian prediction and
GPyTorch's models as a new user would fit them (SGPR, SVGP, the exact GP, with RBF ARD kernels,
in float64).

Each baseline ``fit(xtr, ytr, xte, ...)`` returns ``(mean, variance, info)`` of the test
targets (the variance of ``y``: the noise included); the ``*_model`` and ``*_trainer``
functions give the pieces to benchmarks that score a model along its training.
"""

from __future__ import annotations

import time
from typing import Optional

import numpy as np
import torch
from _elbo import train_until_elbo_stalls
from _exact_gp import exact_gp as cholesky_exact_gp

from rfgp import metrics
from rfgp.datasets import standardize, train_test_split

__all__ = ["LEVELS", "exact_gp", "exact_model", "exact_trainer", "gpytorch_predict", "rbf_ard",
           "rfgp_default", "scores", "sgpr", "sgpr_model", "standardised_split", "svgp",
           "svgp_model", "svgp_trainer"]

#: The levels of the central intervals whose coverage the calibration error averages.
LEVELS = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95]


def standardised_split(x, y, split: int):
    """The random 90/10 split number ``split``, inputs and targets standardised with the
    training rows' statistics: ``(x_train, y_train, x_test, y_test)``."""
    xtr, ytr, xte, yte = train_test_split(x, y, 0.1, torch.Generator().manual_seed(split))
    xtr, xte, _, _ = standardize(xtr, xte)
    ytr, yte, _, _ = standardize(ytr, yte)
    return xtr, ytr, xte, yte


def scores(y: np.ndarray, mean: np.ndarray, var: np.ndarray,
           repeated: Optional[np.ndarray] = None) -> dict:
    """RMSE, MNLL, 95% coverage, calibration error and the coverage per level; with a
    ``repeated`` mask also the MNLL over the test rows whose input a training row repeats and
    over the others."""
    from scipy.stats import norm

    y, mean, var = (np.asarray(a, dtype=np.float64).ravel() for a in (y, mean, var))
    z = np.abs(y - mean) / np.sqrt(var)
    coverage = {p: float(np.mean(z <= norm.ppf(0.5 + p / 2))) for p in LEVELS}
    extra = {}
    if repeated is not None and repeated.any():
        nll = 0.5 * np.log(2 * np.pi * var) + 0.5 * (y - mean) ** 2 / var
        extra = {"n_repeated": int(repeated.sum()), "mnll_repeated": float(nll[repeated].mean()),
                 "mnll_unique": float(nll[~repeated].mean())}
    return {
        "rmse": float(np.sqrt(np.mean((y - mean) ** 2))),
        "mnll": float(metrics.mnll(torch.from_numpy(y), torch.from_numpy(mean),
                                   torch.from_numpy(var))),
        "cov95": coverage[0.95],
        "cal": float(np.mean([abs(coverage[p] - p) for p in LEVELS])),
        "cov": {str(p): c for p, c in coverage.items()},
        **extra,
    }


def rfgp_default(xtr, ytr, xte, seed=0, **params):
    from rfgp.sklearn import RandomFeatureGPRegressor

    reg = RandomFeatureGPRegressor(random_state=seed, **params).fit(xtr.numpy(), ytr.numpy())
    start = time.perf_counter()
    # the predictive of y, held to the variance tolerance of what the scores read
    mean, std = reg.predict(xte.numpy(), return_std=True, observation_noise=True)
    predict_seconds = time.perf_counter() - start
    report = reg.fit_report_
    schedule = report.schedule
    info = {"D": report.num_features, "n_iter": reg.n_iter_, "budget": schedule.budget,
            "refine_rows": schedule.refine_rows, "local_starts": schedule.local_starts,
            "stages": {k: round(v, 2) for k, v in report.seconds.items()},
            "predicted": {k: round(v, 2) for k, v in schedule.predicted.items()},
            "calibration": {k: v for k, v in report.calibration.items()
                            if k in ("chosen", "outputscale_factor", "lengthscale_factor",
                                     "noise_before", "noise_after")},
            "predict_seconds": round(predict_seconds, 2)}
    cg = getattr(reg.gp_, "cg_info", None) or {}
    if cg.get("variance_routes") is not None:  # the iterative path: how its variances went
        info["variance"] = {"routes": cg["variance_routes"], "ranks": cg.get("variance_ranks"),
                            "bounds": cg.get("variance_bounds")}
    return mean, std**2, info


def gpytorch_predict(model, likelihood, xte):
    import gpytorch

    model.eval()
    likelihood.eval()
    with torch.no_grad(), gpytorch.settings.fast_pred_var():
        pred = likelihood(model(xte))
    return pred.mean.numpy(), pred.variance.numpy()


def rbf_ard(d):
    import gpytorch

    return gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=d))


def sgpr_model(xtr, ytr, num_inducing, seed=0):
    """GPyTorch SGPR (``InducingPointKernel`` around :func:`rbf_ard`, constant mean) in
    float64, its ``num_inducing`` inducing points drawn from the training inputs without
    replacement: ``(model, likelihood)``."""
    import gpytorch

    g = torch.Generator().manual_seed(seed)
    z = xtr[torch.randperm(xtr.shape[0], generator=g)[:num_inducing]].clone()

    class SGPR(gpytorch.models.ExactGP):
        def __init__(self, x, y, likelihood):
            super().__init__(x, y, likelihood)
            self.mean_module = gpytorch.means.ConstantMean()
            self.covar_module = gpytorch.kernels.InducingPointKernel(
                rbf_ard(x.shape[1]), inducing_points=z, likelihood=likelihood)

        def forward(self, x):
            return gpytorch.distributions.MultivariateNormal(
                self.mean_module(x), self.covar_module(x))

    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    model = SGPR(xtr, ytr, likelihood).double()
    likelihood.double()
    return model, likelihood


class Unfinished(Exception):
    """A run stopped because its forecast time exceeds its limit; ``forecast`` (seconds) and
    ``steps`` (the steps it ran) say how far it got."""

    def __init__(self, forecast: float, steps: int) -> None:
        super().__init__(f"forecast {forecast:.0f} s after {steps} steps")
        self.forecast, self.steps = forecast, steps


def sgpr(xtr, ytr, xte, num_inducing, steps, seed=0, time_limit=None):
    """SGPR trained for ``steps`` Adam steps: ``(mean, var, info)``. With ``time_limit``
    (seconds), the training stops after two steps or more as soon as the forecast of its time
    (the seconds so far times ``steps`` over the steps run) exceeds the limit, raising
    :class:`Unfinished`."""
    began = time.perf_counter()
    model, likelihood = sgpr_model(xtr, ytr, num_inducing, seed)
    train = exact_trainer(model, likelihood, xtr, ytr)
    for done in range(1, steps + 1):
        train(1)
        forecast = (time.perf_counter() - began) * steps / done
        if time_limit is not None and done >= 2 and forecast > time_limit:
            raise Unfinished(forecast, done)
    mean, var = gpytorch_predict(model, likelihood, xte)
    return mean, var, {"M": model.covar_module.inducing_points.shape[0]}


def exact_model(xtr, ytr):
    """GPyTorch ``ExactGP`` with :func:`rbf_ard` and a constant mean, float64:
    ``(model, likelihood)``."""
    import gpytorch

    class Exact(gpytorch.models.ExactGP):
        def __init__(self, x, y, likelihood):
            super().__init__(x, y, likelihood)
            self.mean_module = gpytorch.means.ConstantMean()
            self.covar_module = rbf_ard(x.shape[1])

        def forward(self, x):
            return gpytorch.distributions.MultivariateNormal(
                self.mean_module(x), self.covar_module(x))

    likelihood = gpytorch.likelihoods.GaussianLikelihood().double()
    model = Exact(xtr, ytr, likelihood).double()
    return model, likelihood


def exact_gp(xtr, ytr, xte, seed=0, max_rows=10000):
    """The exact GP baseline: evidence-maximising hyperparameters by L-BFGS (continued on at
    most ``max_rows`` rows), the exact posterior by a float64 Cholesky over every training
    row (``benchmarks/_exact_gp.py``)."""
    return cholesky_exact_gp(xtr, ytr, xte, seed=seed, max_rows=max_rows)


def exact_trainer(model, likelihood, xtr, ytr, lr=0.1):
    """``run(steps)``: ``steps`` more Adam steps (learning rate ``lr``, one optimiser kept
    across calls) on the exact marginal likelihood of an ``ExactGP`` (SGPR included)."""
    import gpytorch

    opt = torch.optim.Adam(model.parameters(), lr=lr)
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)

    def run(steps):
        model.train()
        likelihood.train()
        for _ in range(steps):
            opt.zero_grad()
            loss = -mll(model(xtr), ytr)
            loss.backward()
            opt.step()

    return run


def svgp_model(xtr, num_inducing=500, seed=0):
    """GPyTorch SVGP (``VariationalStrategy``, Cholesky variational distribution, learned
    inducing points drawn from the training inputs, :func:`rbf_ard`, constant mean) in float64:
    ``(model, likelihood, generator)``, the generator to draw the minibatches with."""
    import gpytorch

    g = torch.Generator().manual_seed(seed)
    z = xtr[torch.randperm(xtr.shape[0], generator=g)[:num_inducing]].clone()

    class SVGP(gpytorch.models.ApproximateGP):
        def __init__(self):
            dist = gpytorch.variational.CholeskyVariationalDistribution(z.shape[0])
            strategy = gpytorch.variational.VariationalStrategy(
                self, z, dist, learn_inducing_locations=True)
            super().__init__(strategy)
            self.mean_module = gpytorch.means.ConstantMean()
            self.covar_module = rbf_ard(z.shape[1])

        def forward(self, x):
            return gpytorch.distributions.MultivariateNormal(
                self.mean_module(x), self.covar_module(x))

    model = SVGP().double()
    likelihood = gpytorch.likelihoods.GaussianLikelihood().double()
    return model, likelihood, g


def svgp_trainer(model, likelihood, xtr, ytr, generator, batch=1024, lr=0.01):
    """``run(steps)``: ``steps`` more Adam steps (one optimiser kept across calls) on the
    variational ELBO, each on the next ``batch`` rows of a random order of the training rows
    (a new order when too few rows are left)."""
    import gpytorch

    opt = torch.optim.Adam([*model.parameters(), *likelihood.parameters()], lr=lr)
    mll = gpytorch.mlls.VariationalELBO(likelihood, model, num_data=ytr.shape[0])
    n = xtr.shape[0]
    order = {"perm": torch.randperm(n, generator=generator), "pos": 0}

    def run(steps):
        model.train()
        likelihood.train()
        for _ in range(steps):
            if order["pos"] + batch > n:
                order["perm"], order["pos"] = torch.randperm(n, generator=generator), 0
            idx = order["perm"][order["pos"]:order["pos"] + batch]
            order["pos"] += batch
            opt.zero_grad()
            loss = -mll(model(xtr[idx]), ytr[idx])
            loss.backward()
            opt.step()

    return run


def svgp(xtr, ytr, xte, num_inducing=500, batch=1024, seed=0, tolerance=1e-3, patience=3,
         max_epochs=300):
    """SVGP trained until its ELBO stops improving: epochs of minibatch steps until the mean
    loss per datum of an epoch has not improved on the best by more than ``tolerance`` for
    ``patience`` epochs (or ``max_epochs``)."""

    model, likelihood, g = svgp_model(xtr, num_inducing, seed)
    epochs, _ = train_until_elbo_stalls(model, likelihood, xtr, ytr, g, batch=batch,
                                        tolerance=tolerance, patience=patience,
                                        max_epochs=max_epochs)
    mean, var = gpytorch_predict(model, likelihood, xte)
    return mean, var, {"M": model.variational_strategy.inducing_points.shape[0],
                       "epochs": epochs}
