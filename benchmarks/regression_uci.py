"""Accuracy per second on UCI regression: rfgp's default recipe against the sparse GPs.

Every bundled UCI set (``rfgp.datasets.UCI_DATASETS``), random 90/10 splits, inputs and targets
standardised with the training statistics; all metrics are in units of the standardised
targets. Per split and method: test RMSE, test MNLL of ``y`` (the predictive variance includes
the noise), the wall time of fit + prediction, the coverage of the central 95% interval, and a
calibration error (the mean over the central intervals of levels 10%, 20%, ..., 90%, 95% of
|empirical coverage - level|).

Methods, each run as a new user would run it, with fixed step counts:

* ``rfgp default``: ``rfgp.sklearn.RandomFeatureGPRegressor(random_state=0)``, all defaults
  (the recipe :func:`rfgp.inference.recipe.fit_auto`).
* ``rfgp evidence maximum``: ``RandomFeatureGPRegressor(random_state=0, max_lengthscale=None)``,
  the recipe without its bounded alternative: the unbounded evidence maximum on every set
  (with the recipe's lengthscale average around it).
* ``rfgp tuned``: ``fit_auto`` with the best settings found (see ``TUNED``).
* ``SGPR M``: GPyTorch ``InducingPointKernel`` around ``ScaleKernel(RBFKernel(ARD))``, M
  inducing points drawn from the training inputs (all of them when there are fewer), Adam
  (lr 0.1) for ``--sgpr-steps`` steps on the exact marginal likelihood.
* ``SVGP``: GPyTorch ``VariationalStrategy`` (500 learned inducing points, Cholesky variational
  distribution), ``ScaleKernel(RBFKernel(ARD))``, Adam (lr 0.01), minibatches of 1024 rows,
  ``--svgp-steps`` steps.
* ``exact GP``: GPyTorch ``ExactGP``, ``ScaleKernel(RBFKernel(ARD))``, Adam (lr 0.1),
  ``--sgpr-steps`` steps, only for training sets up to ``--exact-max`` rows.
* ``RFF + RidgeCV``: scikit-learn ``RBFSampler(n_components=4096)`` (default ``gamma``) and
  ``RidgeCV`` (default alphas); its predictive variance is the training residuals' mean square
  (it has no other).

A larger set (``power-plant x R``) repeats the power-plant rows ``R`` times, each copy with
inputs jittered by 1% of their standard deviation and targets by Gaussian noise of 10% of their
standard deviation, and runs rfgp and the sparse baselines only.

The evaluation profile breaks one log-marginal-likelihood-with-gradient evaluation (the unit of
the evidence search) into its parts.

Usage::

    python benchmarks/regression_uci.py            # the full run (about 30 minutes on 2 cores)
    python benchmarks/regression_uci.py --quick    # a short run (smaller sets, fewer steps)

Writes docs/benchmarks/regression_uci.md and regression_uci.png (MNLL against time per set).
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
from typing import Optional

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _pages import best_of, write_page  # noqa: E402
from rfgp.inference.recipe import FitReport, fit_auto  # noqa: E402

from rfgp import metrics  # noqa: E402
from rfgp.datasets import UCI_DATASETS, load_uci, standardize, train_test_split  # noqa: E402
from rfgp.inference.evidence import (  # noqa: E402
    fourier_negative_log_evidence,
    negative_log_evidence,
)

OUT = ROOT / "docs" / "benchmarks"
#: rfgp tuned: a 4000-row subsample for the first search (the default takes 2000).
TUNED = dict(subsample=4000, refine_iterations=30)
METHODS = ["rfgp default", "rfgp evidence maximum", "rfgp tuned", "SGPR 512", "SGPR 1024",
           "SVGP", "exact GP", "RFF + RidgeCV"]
LEVELS = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95]


# ====================================================================== metrics
def repeated_inputs(xtr: torch.Tensor, xte: torch.Tensor) -> np.ndarray:
    """Which test rows have an input equal, in every column, to a training row's."""
    seen = {row.tobytes() for row in xtr.numpy()}
    return np.array([row.tobytes() in seen for row in xte.numpy()], dtype=bool)


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


# ====================================================================== methods
def rfgp_default(xtr, ytr, xte, **params):
    from rfgp.sklearn import RandomFeatureGPRegressor

    reg = RandomFeatureGPRegressor(random_state=0, **params).fit(xtr.numpy(), ytr.numpy())
    mean, std = reg.predict(xte.numpy(), return_std=True)
    report = reg.fit_report_
    info = {"D": report.num_features, "n_iter": reg.n_iter_,
            "bounded": report.lengthscale_bound is not None, "cv": report.cv_scores,
            "stages": {k: round(v, 2) for k, v in report.seconds.items()}}
    return mean, std**2 + reg.noise_, info, reg


def rfgp_recipe(xtr, ytr, xte, **options):
    report = FitReport()
    gp = fit_auto(xtr, ytr, report=report, seed=0, **options)
    with torch.no_grad():
        mean, std = gp.predict(xte, return_std=True)
    info = {"D": report.num_features, "n_iter": sum(report.iterations.values()),
            "stages": {k: round(v, 1) for k, v in report.seconds.items()}}
    return mean.numpy(), (std.square() + gp.noise).numpy(), info


def _gpytorch_predict(model, likelihood, xte):
    import gpytorch

    model.eval()
    likelihood.eval()
    with torch.no_grad(), gpytorch.settings.fast_pred_var():
        pred = likelihood(model(xte))
    return pred.mean.numpy(), pred.variance.numpy()


def _rbf_ard(d):
    import gpytorch

    return gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=d))


def sgpr_model(xtr, ytr, num_inducing, seed=0):
    """GPyTorch SGPR (``InducingPointKernel`` around :func:`_rbf_ard`, constant mean) in
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
                _rbf_ard(x.shape[1]), inducing_points=z, likelihood=likelihood)

        def forward(self, x):
            return gpytorch.distributions.MultivariateNormal(
                self.mean_module(x), self.covar_module(x))

    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    model = SGPR(xtr, ytr, likelihood).double()
    likelihood.double()
    return model, likelihood


def sgpr(xtr, ytr, xte, num_inducing, steps, seed=0):
    model, likelihood = sgpr_model(xtr, ytr, num_inducing, seed)
    exact_trainer(model, likelihood, xtr, ytr)(steps)
    mean, var = _gpytorch_predict(model, likelihood, xte)
    return mean, var, {"M": model.covar_module.inducing_points.shape[0]}


def exact_model(xtr, ytr):
    """GPyTorch ``ExactGP`` with :func:`_rbf_ard` and a constant mean, float64:
    ``(model, likelihood)``."""
    import gpytorch

    class Exact(gpytorch.models.ExactGP):
        def __init__(self, x, y, likelihood):
            super().__init__(x, y, likelihood)
            self.mean_module = gpytorch.means.ConstantMean()
            self.covar_module = _rbf_ard(x.shape[1])

        def forward(self, x):
            return gpytorch.distributions.MultivariateNormal(
                self.mean_module(x), self.covar_module(x))

    likelihood = gpytorch.likelihoods.GaussianLikelihood().double()
    model = Exact(xtr, ytr, likelihood).double()
    return model, likelihood


def exact_gp(xtr, ytr, xte, steps):
    model, likelihood = exact_model(xtr, ytr)
    exact_trainer(model, likelihood, xtr, ytr)(steps)
    mean, var = _gpytorch_predict(model, likelihood, xte)
    return mean, var, {}


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
    inducing points drawn from the training inputs, :func:`_rbf_ard`, constant mean) in float64:
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
            self.covar_module = _rbf_ard(z.shape[1])

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


def svgp(xtr, ytr, xte, steps, num_inducing=500, batch=1024, seed=0):
    model, likelihood, g = svgp_model(xtr, num_inducing, seed)
    svgp_trainer(model, likelihood, xtr, ytr, g, batch)(steps)
    mean, var = _gpytorch_predict(model, likelihood, xte)
    return mean, var, {"M": model.variational_strategy.inducing_points.shape[0]}


def rff_ridge(xtr, ytr, xte):
    from sklearn.kernel_approximation import RBFSampler
    from sklearn.linear_model import RidgeCV
    from sklearn.pipeline import make_pipeline

    model = make_pipeline(RBFSampler(n_components=4096, random_state=0), RidgeCV())
    model.fit(xtr.numpy(), ytr.numpy())
    resid = float(np.mean((model.predict(xtr.numpy()) - ytr.numpy()) ** 2))
    mean = model.predict(xte.numpy())
    return mean, np.full_like(mean, resid), {}


# ====================================================================== data
def load_set(name: str, repeats: int = 1, seed: int = 0):
    x, y = load_uci(name)
    if repeats == 1:
        return x, y
    g = torch.Generator().manual_seed(seed)
    xs = x.repeat(repeats, 1)
    ys = y.repeat(repeats)
    xs = xs + 0.01 * x.std(0) * torch.randn(xs.shape, generator=g, dtype=xs.dtype)
    ys = ys + 0.1 * y.std() * torch.randn(ys.shape, generator=g, dtype=ys.dtype)
    return xs, ys


# ====================================================================== profile
def profile_evaluation(rows: int, num_features: int, input_dim: int = 4, repeats: int = 5):
    """Seconds of the parts of one evidence-with-gradient evaluation (the minimum of repeats)."""
    from rfgp.inference.recipe import make_ard_kernel

    from rfgp import RandomFeatureGP

    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, input_dim, dtype=torch.float64, generator=g)
    y = torch.randn(rows, dtype=torch.float64, generator=g)
    kernel = make_ard_kernel(num_features, input_dim, seed=0)
    gp = RandomFeatureGP(kernel, noise=0.1)
    log_noise = torch.tensor(math.log(0.1), dtype=torch.float64, requires_grad=True)

    def best(fn):
        return best_of(fn, repeats)

    out = {}
    with torch.no_grad():
        out["features"] = best(lambda: kernel.base_kernel.features(x))
        z = kernel.base_kernel.features(x)
        out["Gram Z^T Z"] = best(lambda: z.T @ z)
        bmat = z.T @ z + torch.eye(num_features, dtype=torch.float64)
        out["Cholesky of B"] = best(lambda: torch.linalg.cholesky(bmat))
    out["evidence + gradient (autograd, RandomFeatureGP.log_marginal_likelihood)"] = best(
        lambda: (-gp.log_marginal_likelihood(x, y, log_noise.exp())).backward())

    def closed_form():
        z = kernel.base_kernel.features(x) * kernel.outputscale.sqrt()
        negative_log_evidence(z, y.unsqueeze(-1), log_noise.exp()).backward()

    out["evidence + gradient (closed form from the features)"] = best(closed_form)
    base = kernel.base_kernel

    def fused():
        fourier_negative_log_evidence(
            base.scaled_projections(x), y.unsqueeze(-1),
            kernel.outputscale, log_noise.exp()).backward()

    out["evidence + gradient (fused Fourier form, the recipe)"] = best(fused)
    # The floor: forward features + Gram + Cholesky, and in the backward pass one more N x D^2
    # product (Z B^-1), the Cholesky's inverse and the features' backward.
    out["floor (2 x (features + Gram + Cholesky))"] = 2 * (
        out["features"] + out["Gram Z^T Z"] + out["Cholesky of B"])
    return out


# ====================================================================== driver
def make_plan(args):
    """``(label, data name, repeats, splits, methods)`` per set, the most expensive first."""
    base = ["rfgp default", "rfgp evidence maximum", "SGPR 512", "SGPR 1024", "SVGP",
            "RFF + RidgeCV"]
    if args.quick:
        return [("concrete", "concrete", 1, 1, base + ["rfgp tuned", "exact GP"]),
                ("power-plant x 2", "power-plant", 2, 1, ["rfgp default", "SGPR 512"])]
    plan = [("power-plant", "power-plant", 1, args.big_splits, base + ["rfgp tuned"]),
            (f"power-plant x {args.repeats}", "power-plant", args.repeats, 1,
             ["rfgp default", "SGPR 512", "SVGP"])]
    sizes = {name: load_uci(name)[0].shape[0] for name in UCI_DATASETS}
    for name in sorted((n for n in UCI_DATASETS if n != "power-plant"), key=lambda n: -sizes[n]):
        splits = args.splits if sizes[name] <= args.small_rows else args.big_splits
        plan.append((name, name, 1, splits, base + ["exact GP"]))
    if args.sets:
        plan = [p for p in plan if p[0] in args.sets]
    return plan


def standardised_split(x, y, split: int):
    """The random 90/10 split number ``split``, inputs and targets standardised with the
    training rows' statistics: ``(x_train, y_train, x_test, y_test)``."""
    xtr, ytr, xte, yte = train_test_split(x, y, 0.1, torch.Generator().manual_seed(split))
    xtr, xte, _, _ = standardize(xtr, xte)
    ytr, yte, _, _ = standardize(ytr, yte)
    return xtr, ytr, xte, yte


def run_set(task):
    """All splits and methods of one data set, in one process; rows and the equivalence check."""
    (label, name, repeats, splits, methods), args = task
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    rows, equivalent = [], None
    x, y = load_set(name, repeats)
    for split in range(splits):
        xtr, ytr, xte, yte = standardised_split(x, y, split)
        repeated = repeated_inputs(xtr, xte)
        for method in methods:
            if method == "exact GP" and xtr.shape[0] > args.exact_max:
                continue
            if method == "SGPR 512" and repeats > 1:
                steps = args.big_sgpr_steps
            else:
                steps = args.sgpr_steps
            start = time.perf_counter()
            extra = None
            if method == "rfgp default":
                mean, var, info, extra = rfgp_default(xtr, ytr, xte)
            elif method == "rfgp evidence maximum":
                mean, var, info, _ = rfgp_default(xtr, ytr, xte, max_lengthscale=None)
            elif method == "rfgp tuned":
                mean, var, info = rfgp_recipe(xtr, ytr, xte, **TUNED)
            elif method.startswith("SGPR"):
                mean, var, info = sgpr(xtr, ytr, xte, int(method.split()[1]), steps)
                info["steps"] = steps
            elif method == "SVGP":
                mean, var, info = svgp(xtr, ytr, xte, args.svgp_steps)
            elif method == "exact GP":
                mean, var, info = exact_gp(xtr, ytr, xte, args.sgpr_steps)
            else:
                mean, var, info = rff_ridge(xtr, ytr, xte)
            seconds = time.perf_counter() - start
            row = {"set": label, "n_train": xtr.shape[0], "n_test": xte.shape[0],
                   "d": xtr.shape[1], "split": split,
                   "method": method, "time": seconds,
                   **scores(yte.numpy(), mean, var, repeated),
                   "info": info}
            rows.append(row)
            print(f"{label:18s} {split} {method:14s} rmse {row['rmse']:.3f} mnll "
                  f"{row['mnll']:7.3f} cov95 {row['cov95']:.2f} time {seconds:7.1f}s {info}",
                  flush=True)
            if extra is not None and split == 0 and xtr.shape[0] <= args.check_max:
                equivalent = equivalence(extra, xtr, ytr, xte)
    return {"label": label, "rows": rows, "equivalence": equivalent}


def run(args, partial: Path) -> dict:
    torch.set_num_threads(args.threads)
    plan = make_plan(args)
    results = {"plan": [p[:4] for p in plan], "rows": [], "equivalence": {}, "profile": {}}
    tasks = [(p, args) for p in plan]
    if args.jobs > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(args.jobs, mp_context=context) as pool:
            done = list(_collect(pool.map(run_set, tasks), partial))
    else:
        done = list(_collect(map(run_set, tasks), partial))
    for part in done:
        results["rows"] += part["rows"]
        if part["equivalence"] is not None:
            results["equivalence"][part["label"]] = part["equivalence"]
    for rows, features in ([2000, 512], [8611, 512], [8611, 4096]):
        if args.quick and rows > 2000:
            continue
        results["profile"][f"N = {rows}, D = {features}"] = profile_evaluation(rows, features)
    return results


def _collect(parts, partial: Path):
    # Each finished set is appended to a JSON-lines file, so a cut-off run keeps its sets.
    for part in parts:
        with partial.open("a") as handle:
            handle.write(json.dumps(part, default=str) + "\n")
        yield part


def equivalence(reg, xtr, ytr, xte) -> dict:
    """The estimator's default fit against ``fit_auto`` on the same standardised targets."""
    from sklearn.utils import check_random_state

    # The estimator's own target scaling, so that both fits see the same bits: the search
    # can end in different local maxima from targets that differ in the last bits.
    y_mean, y_std = reg._y_mean, reg._y_std
    seed = int(check_random_state(0).randint(np.iinfo(np.int32).max))
    gp = fit_auto(xtr, torch.from_numpy((ytr.numpy() - y_mean) / y_std), seed=seed)
    with torch.no_grad():
        mean, std = gp.predict(xte, return_std=True)
    mean_est, std_est = reg.predict(xte.numpy(), return_std=True)
    return {
        "mean": float(np.abs(mean.numpy() * y_std + y_mean - mean_est).max()),
        "std": float(np.abs(std.numpy() * y_std - std_est).max()),
    }


def recheck_equivalence(args, partial: Path) -> None:
    """Rerun :func:`equivalence` on the first split of every set in the partial results."""
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    labels = {p[0]: p for p in make_plan(args)}
    parts = [json.loads(line) for line in partial.read_text().splitlines()]
    for part in parts:
        if part["equivalence"] is None or part["label"] not in labels:
            continue
        _, name, repeats, _, _ = labels[part["label"]]
        x, y = load_set(name, repeats)
        xtr, ytr, xte, _ = standardised_split(x, y, 0)
        reg = rfgp_default(xtr, ytr, xte)[3]
        part["equivalence"] = equivalence(reg, xtr, ytr, xte)
        print(f"{part['label']}: {part['equivalence']}", flush=True)
    partial.write_text("".join(json.dumps(part) + "\n" for part in parts))


# ====================================================================== report
def summarise(results):
    table = {}
    for row in results["rows"]:
        table.setdefault((row["set"], row["method"]), []).append(row)
    return table


def plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    table = summarise(results)
    sets = list(dict.fromkeys(r["set"] for r in results["rows"]))
    methods = [m for m in METHODS if any(r["method"] == m for r in results["rows"])]
    cols = min(4, len(sets))
    rows_ = math.ceil(len(sets) / cols)
    fig, axes = plt.subplots(rows_, cols, figsize=(4.2 * cols, 3.4 * rows_), squeeze=False)
    markers = dict(zip(METHODS, "oX*sD^vP"))
    handles = {}
    for ax, name in zip(axes.flat, sets):
        points = {}
        for method in methods:
            rows = table.get((name, method))
            if rows:
                points[method] = (np.array([r["time"] for r in rows]),
                                  np.array([r["mnll"] for r in rows]))
        low = min(m.mean() for _, m in points.values())
        top = low + 2.0  # far worse points are marked at the top edge, with their value
        for method, (t, m) in points.items():
            colour = f"C{METHODS.index(method)}"
            shown = min(m.mean(), top)
            handles[method] = ax.errorbar(
                t.mean(), shown, xerr=t.std(), yerr=m.std() if m.mean() < top else None,
                fmt=markers[method], color=colour, capsize=2, ms=7)
            if m.mean() > top:
                ax.annotate(f"{m.mean():.2g}", (t.mean(), shown), textcoords="offset points",
                            xytext=(4, -10), fontsize=7, color=colour)
        ax.set_ylim(low - 0.1 * (top - low), top + 0.1 * (top - low))
        ax.set_xscale("log")
        # Minor-tick labels of a log axis spanning less than a decade overlap: leave them out.
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_title(name)
        ax.set_xlabel("wall time (s)")
        ax.set_ylabel("test MNLL (lower is better)")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(sets):]:
        ax.axis("off")
    fig.legend([handles[m] for m in methods if m in handles],
               [m for m in methods if m in handles], loc="lower right", fontsize=8,
               bbox_to_anchor=(0.98, 0.08))
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _fmt(values, digits=3):
    values = np.asarray(values)
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{values.mean():.{digits}f} ± {values.std():.{digits}f}"


def targets(results, args):
    table = summarise(results)
    lines = []
    sets = list(dict.fromkeys(r["set"] for r in results["rows"]))
    for name in sets:
        default = table.get((name, "rfgp default"))
        if not default:
            continue
        mnll = np.mean([r["mnll"] for r in default])
        time_ = np.mean([r["time"] for r in default])
        parts = []
        for m, factor in (("SGPR 1024", 0.25), ("SGPR 512", 1.0)):
            other = table.get((name, m))
            if not other:
                parts.append(f"{m}: not run")
                continue
            o_mnll = np.mean([r["mnll"] for r in other])
            o_time = np.mean([r["time"] for r in other])
            ok = mnll <= o_mnll and time_ <= factor * o_time
            steps = {r["info"].get("steps") for r in other}
            verdict = "met" if ok else "not met"
            if steps != {args.sgpr_steps}:
                verdict += f", but SGPR ran only {sorted(steps)[0]} steps: no fair comparison"
            parts.append(
                f"{m}: MNLL {mnll:.3f} vs {o_mnll:.3f}, time {time_:.1f} s vs "
                f"{o_time:.1f} s (ratio {time_ / o_time:.2f}, needs <= {factor:g}) -> "
                f"**{verdict}**")
        lines.append(f"* {name}: " + "; ".join(parts))
    return lines


def repeat_counts(name: str):
    """``(rows repeating an earlier row's input, rows, groups with one target, groups with
    differing targets)`` of a bundled set."""
    x, y = load_uci(name)
    _, group = torch.unique(x, dim=0, return_inverse=True)
    sizes = torch.bincount(group)
    same = differ = 0
    for g in (sizes > 1).nonzero().reshape(-1).tolist():
        targets = y[group == g]
        if bool((targets == targets[0]).all()):
            same += 1
        else:
            differ += 1
    return int((sizes - 1).clamp_min(0).sum()), x.shape[0], same, differ


def repeated_section(results):
    """MNLL on the test rows whose input repeats a training row's, and on the others."""
    table = summarise(results)
    sets = [name for name in dict.fromkeys(r["set"] for r in results["rows"])
            if any("n_repeated" in r for r in table.get((name, "rfgp default"), []))]
    if not sets:
        return []
    counts = [repeat_counts(name) for name in sets]
    out = ["", "## Repeated inputs", "",
           "Some bundled sets hold rows whose inputs repeat another row's exactly, so a random "
           "split puts copies on both sides: "
           + "; ".join(f"{name}: {rows} of {total} rows repeat an earlier row's input, in "
                       f"{same} groups with one target (a duplicated record) and {differ} with "
                       "differing targets (repeated measurements)"
                       for name, (rows, total, same, differ) in zip(sets, counts))
           + ". A model that fits the training rows more closely (lower noise, shorter "
           "lengthscales) gains on a test row that duplicates a training record and loses on a "
           "repeated measurement, whatever it does elsewhere. MNLL over the test rows with a "
           "repeated input and over the others (mean over the splits that hold any):", "",
           "| data set | test rows repeated | method | MNLL repeated | MNLL others |",
           "|---|---|---|---|---|"]
    for name in sets:
        for method in METHODS:
            rows = [r for r in table.get((name, method), []) if "n_repeated" in r]
            if not rows:
                continue
            share = np.mean([r["n_repeated"] / r["n_test"] for r in rows])
            out.append(f"| {name} | {share:.1%} | {method} | "
                       f"{_fmt([r['mnll_repeated'] for r in rows])} | "
                       f"{_fmt([r['mnll_unique'] for r in rows])} |")
    return out


def bound_section(results):
    """How often the default kept the bounded search, and what it did to the MNLL and time
    against the unbounded evidence maximum (paired over the splits)."""
    table = summarise(results)
    out = ["", "## The bounded alternative against the evidence maximum", "",
           "Splits on which the default kept the bounded search (the unbounded maximum had a "
           "lengthscale beyond the bound and cross-validation did not prefer it by more than a "
           "standard error), and the paired difference of the test MNLL, default minus "
           "the estimator with `max_lengthscale=None` (mean ± standard error over the splits; "
           "negative: the default is better).", "",
           "| data set | bound binds | bound kept | MNLL difference | time default (s) | "
           "time evidence maximum (s) |", "|---|---|---|---|---|---|"]
    for name in dict.fromkeys(r["set"] for r in results["rows"]):
        default = table.get((name, "rfgp default"))
        plain = table.get((name, "rfgp evidence maximum"))
        if not default or not plain:
            continue
        by_split = {r["split"]: r for r in plain}
        pairs = [(r, by_split[r["split"]]) for r in default if r["split"] in by_split]
        diff = np.array([a["mnll"] - b["mnll"] for a, b in pairs])
        se = diff.std(ddof=1) / math.sqrt(len(diff)) if len(diff) > 1 else float("nan")
        binds = sum(bool(a["info"].get("cv")) or bool(a["info"].get("bounded")) for a, _ in pairs)
        kept = sum(bool(a["info"].get("bounded")) for a, _ in pairs)
        out.append(f"| {name} | {binds} of {len(pairs)} | {kept} of {len(pairs)} | "
                   f"{diff.mean():+.3f} ± {se:.3f} | {np.mean([a['time'] for a, _ in pairs]):.1f} "
                   f"| {np.mean([b['time'] for _, b in pairs]):.1f} |")
    return out


def write_markdown(results, args, path):
    table = summarise(results)
    sets = list(dict.fromkeys(r["set"] for r in results["rows"]))
    methods = [m for m in METHODS if any(r["method"] == m for r in results["rows"])]
    out = ["# Regression on UCI data: accuracy and calibration per second", ""]
    out += [
        "rfgp's default is the recipe `rfgp.inference.recipe.fit_auto` (also what "
        "`RandomFeatureGPRegressor()` runs): ARD lengthscales from the inputs' spread (median "
        "heuristic), outputscale and noise from the targets' mean square; L-BFGS on the log "
        "marginal likelihood, run to convergence (gradient tolerance 1e-4 per datum), with 512 "
        "orthogonal random Fourier features on a random subsample of at most 2000 rows "
        "(gradient in closed form, in function space when there are fewer rows than features; "
        "with at most 1000 rows the exact kernel's evidence instead, and with 1001 to 2000 "
        "rows the exact evidences of blocks of at most 1000 neighbouring rows, a balanced k-d "
        "partition); "
        "when the search holds every row and that maximum has a lengthscale beyond 4 standard "
        "deviations of its input, the same search with every lengthscale bounded there, kept "
        "unless 5-fold cross-validation (hyperparameters refitted on each fold) shows the "
        "unbounded maximum better by more than one standard error; "
        "when N > 2000, 30 more L-BFGS iterations on all rows (at most 10000, a random "
        "superset of the subsample), then the exact kernel's evidence on blocks of at most "
        "1000 neighbouring rows of those (a balanced k-d partition) maximised from d + 1 "
        "starts (the refinement's end, and that point with one lengthscale at a tenth), the "
        "highest kept; the kernel averaged over 32 lengthscale vectors drawn "
        "from the Laplace approximation of the evidence at the search's end (lengthscales on "
        "the bound held there), each with D / 32 of the features; then one refit on "
        "all rows with D features, D the largest power of two up to 8192 whose fit costs at "
        "most 8e11 multiply-adds for N rows, and up to 32768 where the fit is in function "
        "space and its N x D feature rows hold at most 8192^2 numbers (32768 on the sets of "
        "at most 2048 rows, 8192 on power-plant, 2048 on the 10^5-row set). RBF kernel.", ""]
    rerun = ("--from-partial", "--recheck-equivalence")
    command = " ".join(["python benchmarks/regression_uci.py"]
                       + [a for a in sys.argv[1:] if a not in rerun])
    recheck = ""
    if getattr(args, "recheck_equivalence", False):
        recheck = (" (the check of the scikit-learn estimator against `fit_auto` rerun after it "
                   "with `--from-partial --recheck-equivalence`)")
    out += [
        f"Generated by `{command}` in one run{recheck}, all methods side by side in one "
        "process per data set, float64 "
        f"({platform.processor() or platform.machine()}, Python {platform.python_version()}, "
        f"torch {torch.__version__}). The machine was shared with other jobs, so absolute times "
        "are noisy; compare the ratios within a row of the same set.", "",
        "Random 90/10 splits, inputs and targets standardised with the training statistics; "
        "RMSE and MNLL are in units of the standardised targets; the MNLL is that of `y` "
        "(noise included). Coverage: share of test targets inside the central 95% predictive "
        "interval. Calibration error: mean over the central intervals of levels 10%, ..., 90%, "
        "95% of |empirical coverage - level|. Entries are mean ± standard deviation over "
        "the splits.", "",
        "## What ran (every reduction stated)", "",
    ]
    out.append("* splits: " + ", ".join(
        f"{label} {splits}" for label, _, _, splits in results["plan"]) + ".")
    out += [
        f"* SGPR and the exact GP: Adam (lr 0.1), {args.sgpr_steps} steps; SGPR with M at least "
        "the training set's size uses all training inputs as inducing points. SVGP: Adam (lr "
        f"0.01), {args.svgp_steps} minibatch steps of 1024 rows, 500 learned inducing points.",
        f"* exact GP only where the training set has at most {args.exact_max} rows.",
        "* the repeated set runs rfgp's default, SVGP and SGPR M = 512 with only "
        f"{args.big_sgpr_steps} Adam steps (to show the time of a step: {args.sgpr_steps} steps "
        f"would take about {args.sgpr_steps // max(args.big_sgpr_steps, 1)} times its time "
        "shown here); SGPR M = 1024 and the exact GP do not fit this run.",
        f"* rfgp tuned = `fit_auto(x, y, {', '.join(f'{k}={v!r}' for k, v in TUNED.items())})`, "
        "on power-plant only (on the sets below 2000 rows the subsample is all rows).",
        f"* {args.threads} thread(s) per process and {args.jobs} data sets in parallel: on this "
        "machine (2 cores shared with other jobs) two threads per process were many times "
        "slower than one (the threads wait for each other); every method of a data set ran in "
        "the same process, one after the other.",
        "",
        "## Results", "",
        "| data set | N | method | RMSE | MNLL | time (s) | 95% coverage | calibration error |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in sets:
        for method in methods:
            rows = table.get((name, method))
            if not rows:
                continue
            out.append(
                f"| {name} | {rows[0]['n_train']} | {method} | {_fmt([r['rmse'] for r in rows])} "
                f"| {_fmt([r['mnll'] for r in rows])} | {_fmt([r['time'] for r in rows], 1)} "
                f"| {_fmt([r['cov95'] for r in rows], 2)} | {_fmt([r['cal'] for r in rows])} |")
    out += ["", "![MNLL against wall time](regression_uci.png)", "",
            "## Targets", "",
            "rfgp's default must reach an MNLL at least as good as SGPR M = 1024 in at most a "
            "quarter of its time, and at least as good as SGPR M = 512 in less time (means over "
            "the splits):", ""]
    out += targets(results, args)
    out += repeated_section(results)
    out += bound_section(results)
    out += ["", "## The scikit-learn default is the recipe", "",
            "`RandomFeatureGPRegressor(random_state=0)` against `fit_auto` with the "
            "estimator's seed, on the targets scaled as the estimator scales them (the same "
            "bits), first split of each set: largest absolute difference of the predictive "
            "mean and standard deviation. Zero: the estimator runs the recipe and nothing "
            "else. (Targets that differ in the last bits can send the search to another local "
            "maximum of the evidence.)", "",
            "| data set | mean | std |", "|---|---|---|"]
    for name, diff in results["equivalence"].items():
        out.append(f"| {name} | {diff['mean']:.2e} | {diff['std']:.2e} |")
    out += ["", "## Coverage of rfgp's default", "",
            "Empirical coverage of the central intervals (mean over splits):", "",
            "| data set | " + " | ".join(f"{int(p * 100)}%" for p in LEVELS) + " |",
            "|---|" + "---|" * len(LEVELS)]
    for name in sets:
        rows = table.get((name, "rfgp default"))
        if rows:
            out.append(f"| {name} | " + " | ".join(
                f"{np.mean([r['cov'][str(p)] for r in rows]):.2f}" for p in LEVELS) + " |")
    out += ["", "Where the default's 95% interval under- or over-covers: a coverage more than two "
            "binomial standard errors (sqrt(0.95 x 0.05 / test rows), pooled over the splits) "
            "from 0.95.", ""]
    for name in sets:
        rows = table.get((name, "rfgp default"))
        if not rows:
            continue
        n_test = sum(r.get("n_test", round(r["n_train"] / 9)) for r in rows)
        cov = np.mean([r["cov95"] for r in rows])
        se = math.sqrt(0.95 * 0.05 / n_test)
        verdict = ("under-covers" if cov < 0.95 - 2 * se else
                   "over-covers" if cov > 0.95 + 2 * se else "consistent with 95%")
        out.append(f"* {name}: {cov:.3f} on {n_test} test rows (standard error {se:.3f}): "
                   f"{verdict}.")
    out += ["", "## One evidence evaluation", "",
            "Seconds (minimum of 5) of the parts of one log-marginal-likelihood evaluation with "
            "its gradient, orthogonal RFF with ARD lengthscales, d = 4. The evidence search of "
            "the recipe runs at the first size (2000 rows, D = 512).", "",
            "| size | " + " | ".join(next(iter(results["profile"].values())).keys()) + " |",
            "|---|" + "---|" * len(next(iter(results["profile"].values())))]
    for size, parts in results["profile"].items():
        out.append(f"| {size} | " + " | ".join(f"{v:.3f}" for v in parts.values()) + " |")
    write_page(path, "\n".join(out) + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--splits", type=int, default=1, help="splits of the small sets")
    parser.add_argument("--small-rows", type=int, default=1000,
                        help="sets up to this many rows are small")
    parser.add_argument("--big-splits", type=int, default=1, help="splits of the other sets")
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--sgpr-steps", type=int, default=30)
    parser.add_argument("--big-sgpr-steps", type=int, default=2,
                        help="Adam steps of SGPR on the repeated set")
    parser.add_argument("--svgp-steps", type=int, default=100)
    parser.add_argument("--exact-max", type=int, default=500)
    parser.add_argument("--jobs", type=int, default=2, help="data sets run in parallel")
    parser.add_argument("--from-partial", action="store_true",
                        help="only write the page from the sets a previous run finished")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--check-max", type=int, default=20000,
                        help="compare the estimator with fit_auto up to this many rows")
    parser.add_argument("--recheck-equivalence", action="store_true",
                        help="with --from-partial: rerun the estimator-against-fit_auto check "
                             "of each finished set and store it in the partial results")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--sets", nargs="*", default=None,
                        help="run only these sets (labels, e.g. concrete 'power-plant x 11')")
    args = parser.parse_args()
    if args.quick:
        args.sgpr_steps, args.svgp_steps = 20, 50
    if args.out is None:  # a quick run does not overwrite the page
        args.out = Path(tempfile.gettempdir()) if args.quick else OUT
    name = "regression_uci_quick" if args.quick else "regression_uci"
    args.out.mkdir(parents=True, exist_ok=True)
    partial = args.out / f"{name}.partial.jsonl"
    started = time.perf_counter()
    torch.set_num_threads(args.threads)
    if args.from_partial:
        results = {"plan": [p[:4] for p in make_plan(args)], "rows": [], "equivalence": {},
                   "profile": {}}
        if args.recheck_equivalence:
            recheck_equivalence(args, partial)
        for line in partial.read_text().splitlines():
            part = json.loads(line)
            results["rows"] += part["rows"]
            if part["equivalence"] is not None:
                results["equivalence"][part["label"]] = part["equivalence"]
        results["plan"] = [p for p in results["plan"]
                           if any(r["set"] == p[0] for r in results["rows"])]
        for rows, features in ([2000, 512], [8611, 512]):
            results["profile"][f"N = {rows}, D = {features}"] = profile_evaluation(rows, features)
    else:
        partial.unlink(missing_ok=True)
        results = run(args, partial)
    results["total_seconds"] = time.perf_counter() - started
    (args.out / f"{name}.json").write_text(json.dumps(results, default=str, indent=1))
    plot(results, args.out / f"{name}.png")
    write_markdown(results, args, args.out / f"{name}.md")
    print(f"total {results['total_seconds']:.0f} s")


if __name__ == "__main__":
    main()
