"""Posterior mean, standard deviation and sample-path values are differentiable at the query:
autograd gradients with respect to x equal central finite differences (float64)."""

from __future__ import annotations

import pytest
import torch

from rfgp import RandomFeatureGP
from rfgp.kernels import FourierFeatureKernel
from tests.helpers import ComplexFourierKernel

DT = torch.float64


def _model(kind, solve):
    g = torch.Generator().manual_seed(0)
    x = torch.rand(60, 2, generator=g, dtype=DT)
    y = torch.sin(5 * x[:, 0]) * torch.cos(3 * x[:, 1])
    kernel = (FourierFeatureKernel(40, seed=0) if kind == "real" else
              ComplexFourierKernel(24, seed=0)).double()
    kernel.lengthscale = 0.3
    return RandomFeatureGP(kernel, noise=0.05, solve=solve).fit(x, y)


def _finite_difference(fn, x, h=1e-6):
    grad = torch.zeros_like(x)
    for i in range(x.shape[0]):
        for j in range(x.shape[1]):
            step = torch.zeros_like(x)
            step[i, j] = h
            grad[i, j] = (fn(x + step) - fn(x - step)) / (2 * h)
    return grad


def _check(fn, x):
    query = x.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(fn(query), query)
    with torch.no_grad():
        expected = _finite_difference(fn, x)
    torch.testing.assert_close(grad, expected, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("kind", ["real", "complex"])
@pytest.mark.parametrize("solve", ["weight", "function"])
def test_mean_std_and_posterior_gradients_match_finite_differences(kind, solve):
    gp = _model(kind, solve)
    x = torch.rand(4, 2, generator=torch.Generator().manual_seed(1), dtype=DT)
    _check(lambda q: gp.predict(q).sum(), x)
    _check(lambda q: gp.predict(q, return_std=True)[1].sum(), x)
    _check(lambda q: gp.posterior(q).mean.sum(), x)
    _check(lambda q: gp.posterior(q).variance.sum(), x)


@pytest.mark.parametrize("kind", ["real", "complex"])
def test_sample_path_gradients_match_finite_differences(kind):
    gp = _model(kind, "weight")
    paths = gp.sample_functions(3, generator=torch.Generator().manual_seed(2))
    x = torch.rand(4, 2, generator=torch.Generator().manual_seed(3), dtype=DT)
    weights = torch.tensor([1.0, -2.0, 0.5], dtype=DT)
    _check(lambda q: (paths(q) * weights[:, None]).sum(), x)


def test_no_graph_without_a_query_gradient():
    gp = _model("real", "weight")
    x = torch.rand(3, 2, dtype=DT)
    assert not gp.predict(x).requires_grad
    assert not gp.sample_functions(2)(x).requires_grad
