"""GaussianSketchKernel and choose_truncation."""

import math

import gpytorch
import pytest
import torch

from rfgp.kernels import GaussianSketchKernel
from rfgp.kernels._gaussian_sketch import choose_truncation
from rfgp.metrics import kernel_distance
from tests.helpers import assert_resampled_gram_is_unbiased


def points(n, d, seed, scale=0.5):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g, dtype=torch.float64) * scale


@pytest.mark.parametrize("variant", ["coordinate", "degree"])
def test_truncated_kernel_converges_to_rbf(variant):
    x = points(12, 3, 0)
    rbf = gpytorch.kernels.RBFKernel().double()
    rbf.lengthscale = 0.9
    exact = rbf(x).to_dense()
    errors = []
    for s in [2, 6, 14]:
        k = GaussianSketchKernel(64, truncation=s, variant=variant, input_dim=3).double()
        k.lengthscale = 0.9
        errors.append(float((k.expected_matrix(x, x) - exact).abs().max()))
        # K - K_s is PSD for both variants (a sum of dropped squared features).
        assert torch.linalg.eigvalsh(exact - k.expected_matrix(x, x)).min() > -1e-12
    assert errors[2] < errors[1] < errors[0] and errors[2] < 1e-6


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["coordinate", "degree"])
def test_sketch_is_unbiased_for_the_truncated_kernel(variant):
    x = points(3, 3, 1)
    k = GaussianSketchKernel(32, truncation=5, variant=variant, input_dim=3).double()
    target = k.expected_matrix(x, x)
    g = torch.Generator().manual_seed(2)
    assert_resampled_gram_is_unbiased(k, x, target, g, 1500)


def test_diagonal_and_variance_correction():
    x = points(5, 2, 3, scale=1.5)
    for variant in ["coordinate", "degree"]:
        k = GaussianSketchKernel(40, truncation=4, variant=variant, input_dim=2).double()
        diag = torch.diagonal(k.expected_matrix(x, x))
        torch.testing.assert_close(k.variance_correction(x), 1.0 - diag)


def test_choose_truncation_bounds_the_distance_bias():
    x, y = points(30, 3, 4, 0.8), points(30, 3, 5, 0.8) + 0.2
    for variant in ["coordinate", "degree"]:
        for alpha in [1e-2, 1e-5]:
            s = choose_truncation(torch.cat([x, y]), alpha, variant=variant)
            k = GaussianSketchKernel(64, truncation=s, variant=variant, input_dim=3).double()
            k.lengthscale = 1.0
            z = torch.cat([x, y])
            beta = torch.full((60,), 1 / 30, dtype=torch.float64)
            beta[30:] *= -1
            truncated = beta @ k.expected_matrix(z, z) @ beta
            exact = kernel_distance(x, y)
            assert 0 <= float(exact - truncated) <= alpha
            # s is the smallest such truncation under the bound: s - 1 violates it.
            if s > 1:
                k1 = GaussianSketchKernel(64, truncation=s - 1, variant=variant, input_dim=3)
                k1 = k1.double()
                k1.lengthscale = 1.0
                kept = torch.diagonal(k1.expected_matrix(z, z))
                assert 4 * float((1 - kept).max()) > alpha
    # Table of the digest (Poisson tail, xi = 4): R = 1 in scaled units, alpha = 1e-4 -> 11.
    assert choose_truncation(math.sqrt(2.0), 1e-4, variant="degree") == 11


def test_bad_input():
    with pytest.raises(ValueError, match="variant"):
        GaussianSketchKernel(16, variant="tree")
    with pytest.raises(ValueError, match="truncation"):
        GaussianSketchKernel(16, truncation=0)
    with pytest.raises(ValueError, match="num_features must be 1"):
        GaussianSketchKernel(16, truncation=1, variant="degree")
    with pytest.raises(ValueError, match="alpha"):
        choose_truncation(1.0, 0.0)
    with pytest.raises(ValueError, match="input_dim"):
        choose_truncation(1.0, 1e-3, variant="coordinate")
