"""The benchmarks' exact GP baseline (``benchmarks/_exact_gp.py``, imported by path): its
gradient, its evidence maximum against a dense reference, and its posterior."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.linalg
import scipy.optimize
import torch
from scipy import stats

PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "_exact_gp.py"
spec = importlib.util.spec_from_file_location("benchmark_exact_gp", PATH)
exact = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = exact  # dataclasses look their module up there
spec.loader.exec_module(exact)


def data(n=60, seed=0):
    gen = np.random.default_rng(seed)
    x = gen.uniform(-2, 2, size=(n, 2))
    y = np.sin(2 * x[:, 0]) * np.cos(x[:, 1]) + 0.3 + 0.1 * gen.standard_normal(n)
    return x, y


def reference_covariance(theta, x):
    """``s exp(-|x - x'|^2 / (2 l^2)) + sigma^2 I`` in numpy, independently of the module."""
    ls, s = np.exp(theta[:2]), np.exp(theta[2])
    noise = np.exp(theta[3]) + exact.NOISE_FLOOR
    diff = (x[:, None, :] - x[None, :, :]) / ls
    return s * np.exp(-0.5 * (diff**2).sum(-1)) + noise * np.eye(len(x))


def reference_log_evidence(theta, x, y):
    """The Gaussian log density of ``y`` by a numpy Cholesky (scipy's ``multivariate_normal``
    agrees; see the first test)."""
    cov = reference_covariance(theta, x)
    try:
        factor = scipy.linalg.cho_factor(cov, lower=True)
    except np.linalg.LinAlgError:
        return -np.inf
    r = y - theta[4]
    return float(-0.5 * r @ scipy.linalg.cho_solve(factor, r)
                 - np.log(np.diagonal(factor[0])).sum() - 0.5 * len(y) * np.log(2 * np.pi))


def reference_maximum(x, y):
    """The evidence maximum by derivative-free optimisation of the dense log density from
    several starts (Nelder–Mead, then Powell to polish)."""
    best = None
    for log_ls in (-1.0, 0.0, 1.0):
        theta = np.array([log_ls, log_ls, 0.0, math.log(0.1), float(y.mean())])
        for method, options in (("Nelder-Mead", {"xatol": 1e-10, "fatol": 1e-12,
                                                 "maxiter": 40000, "maxfev": 40000}),
                                ("Powell", {"xtol": 1e-10, "ftol": 1e-14})):
            theta = scipy.optimize.minimize(lambda t: -reference_log_evidence(t, x, y), theta,
                                            method=method, options=options).x
        value = reference_log_evidence(theta, x, y)
        if best is None or value > best[0]:
            best = (value, theta)
    return best


def test_gradient_matches_finite_differences():
    x, y = data()
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    theta = np.array([0.2, -0.4, 0.3, -2.5, 0.1])
    value, grad = exact.negative_log_evidence(theta, xt, yt)
    numeric = scipy.optimize.approx_fprime(
        theta, lambda t: exact.negative_log_evidence(t, xt, yt)[0], 1e-7)
    # Forward differences: error ~ h * curvature + eps / h ~ 1e-7, well inside 1e-5.
    np.testing.assert_allclose(grad, numeric, rtol=0, atol=1e-5)
    assert value == pytest.approx(-reference_log_evidence(theta, x, y) / len(y), rel=1e-10)
    density = stats.multivariate_normal(mean=np.full(len(y), theta[4]),
                                        cov=reference_covariance(theta, x))
    assert reference_log_evidence(theta, x, y) == pytest.approx(density.logpdf(y), rel=1e-10)


def test_reaches_the_evidence_maximum_of_a_dense_reference():
    x, y = data()
    hyper = exact.fit_hyperparameters(torch.from_numpy(x), torch.from_numpy(y))
    theta = hyper.to_vector()
    ours = reference_log_evidence(theta, x, y)
    best, _ = reference_maximum(x, y)
    # The same function at its maximum: L-BFGS to a gradient of 1e-6 per datum is at least as
    # high as the derivative-free search, up to that search's own accuracy.
    assert ours >= best - 1e-6
    assert abs(ours - best) < 1e-4
    assert hyper.info["projected_gradient"] < 1e-5
    # An interior optimum: no log-parameter at its bound.
    low, high = exact.LOG_BOUNDS["lengthscale"]
    assert np.all((theta[:2] > low + 1) & (theta[:2] < high - 1))
    assert -hyper.info["nll_per_datum"] * len(y) == pytest.approx(ours, abs=1e-8)


def test_starts_on_a_subsample_then_converge_on_all_rows():
    x, y = data(n=150, seed=1)
    hyper = exact.fit_hyperparameters(torch.from_numpy(x), torch.from_numpy(y), start_rows=50,
                                      max_rows=150)
    assert hyper.info["start_rows"] == 50 and hyper.info["rows"] == 150
    value, grad = exact.negative_log_evidence(hyper.to_vector(), torch.from_numpy(x),
                                              torch.from_numpy(y))
    assert np.abs(grad).max() < 1e-5
    assert len(hyper.info["starts"]) == 4


def test_posterior_matches_the_dense_formulas():
    x, y = data()
    xs = np.random.default_rng(3).uniform(-2, 2, size=(37, 2))
    hyper = exact.ExactHyperparameters(np.array([0.7, 1.3]), 1.2, 0.02, 0.1)
    theta = hyper.to_vector()
    cov = reference_covariance(theta, x)
    cross = 1.2 * np.exp(-0.5 * (((xs[:, None, :] - x[None, :, :]) / hyper.lengthscale)**2)
                         .sum(-1))  # [37, 60]
    mean = 0.1 + cross @ np.linalg.solve(cov, y - 0.1)
    var = 1.2 - np.einsum("ij,ji->i", cross, np.linalg.solve(cov, cross.T))
    posterior = exact.ExactPosterior(torch.from_numpy(x), torch.from_numpy(y), hyper, block=16)
    for chunk in (5, 1024):
        got_mean, got_var = posterior.predict(torch.from_numpy(xs), chunk=chunk)
        np.testing.assert_allclose(got_mean, mean, rtol=0, atol=1e-10)
        np.testing.assert_allclose(got_var, var, rtol=0, atol=1e-10)
    assert posterior.log_evidence == pytest.approx(reference_log_evidence(theta, x, y),
                                                   rel=1e-12)


def test_exact_gp_returns_the_variance_of_y():
    x, y = data()
    xs = torch.from_numpy(x[:7])
    mean, var, info = exact.exact_gp(torch.from_numpy(x), torch.from_numpy(y), xs)
    hyper = exact.ExactHyperparameters(np.array(info["lengthscale"]), info["outputscale"],
                                       info["noise"], info["mean"])
    # Rounded lengthscales in the record: compare with a loose tolerance.
    _, latent = exact.ExactPosterior(torch.from_numpy(x), torch.from_numpy(y), hyper).predict(xs)
    np.testing.assert_allclose(var - info["noise"], latent, rtol=1e-3, atol=1e-8)
    assert mean.shape == (7,) and np.all(var > info["noise"])
