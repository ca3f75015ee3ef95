"""Held-out log densities: the exact path against a dense Gaussian-process reference."""

from __future__ import annotations

import math

import pytest
import torch
from gpytorch.kernels import ScaleKernel

from rfgp.inference._cross_validation import held_out_log_density
from rfgp.kernels import FourierFeatureKernel

DT = torch.float64


def _dense_log_density(x_train, y_train, x_test, y_test, lengthscale, scale, noise):
    """log N(y_i; mu_i, var_i + noise) of the exact RBF GP, written out with torch.linalg."""
    def k(a, b):
        return scale * torch.exp(-0.5 * torch.cdist(a / lengthscale, b / lengthscale) ** 2)

    cov = k(x_train, x_train) + noise * torch.eye(x_train.shape[0], dtype=DT)
    cross = k(x_train, x_test)
    mean = cross.T @ torch.linalg.solve(cov, y_train)
    var = scale - (cross * torch.linalg.solve(cov, cross)).sum(0) + noise
    return -0.5 * (math.log(2 * math.pi) + var.log() + (y_test - mean) ** 2 / var)


@pytest.mark.parametrize("dims", [[0, 2], [1]])
def test_exact_held_out_density_uses_the_kernels_active_dims(dims):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(60, 3, generator=g, dtype=DT)
    y = torch.sin(2 * x).sum(-1)
    y = y - y.mean()
    kernel = ScaleKernel(FourierFeatureKernel(32, active_dims=dims, seed=0)).double()
    kernel.base_kernel.lengthscale = torch.tensor(0.7, dtype=DT)
    kernel.outputscale = torch.tensor(1.3, dtype=DT)
    noise = torch.tensor(0.05, dtype=DT)
    got = held_out_log_density(kernel, noise, x[:40], y[:40], x[40:], y[40:], exact=True)
    want = _dense_log_density(x[:40, dims], y[:40], x[40:, dims], y[40:], 0.7, 1.3, 0.05)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-10)


def test_exact_held_out_density_names_active_dims_beyond_the_columns():
    x = torch.randn(10, 2, dtype=DT)
    kernel = ScaleKernel(FourierFeatureKernel(8, active_dims=[3])).double()
    with pytest.raises(ValueError, match="active_dims must index the 2 columns of x_train"):
        held_out_log_density(kernel, torch.tensor(0.1, dtype=DT), x, x[:, 0], x, x[:, 0],
                             exact=True)
