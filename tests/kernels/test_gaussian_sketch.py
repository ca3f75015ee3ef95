"""GaussianSketchKernel, choose_truncation, kernel_distance and SphericalFeatureKernel."""

import math

import gpytorch
import pytest
import torch
from scipy.stats import binom

from rfgp.kernels import GaussianSketchKernel, SphericalFeatureKernel
from rfgp.kernels.gaussian_sketch import choose_truncation
from rfgp.kernels.spherical import fit_spherical_mixture, spherical_polynomial
from rfgp.metrics import kernel_distance


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


@pytest.mark.parametrize("variant", ["coordinate", "degree"])
def test_sketch_is_unbiased_for_the_truncated_kernel(variant):
    x = points(3, 3, 1)
    k = GaussianSketchKernel(32, truncation=5, variant=variant, input_dim=3).double()
    target = k.expected_matrix(x, x)
    g = torch.Generator().manual_seed(2)
    draws = []
    for _ in range(1500):
        k.resample(g)
        phi = k.features(x)
        draws.append(phi @ phi.T)
    draws = torch.stack(draws)
    stderr = draws.std(0) / math.sqrt(draws.shape[0])
    assert ((draws.mean(0) - target).abs() <= 5 * stderr + 1e-12).all()


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


@pytest.mark.parametrize("variant", ["coordinate", "degree"])
def test_sketched_kernel_distance_relative_plus_additive_error(variant):
    # |D_hat^2 - D^2| <= eps D^2 + alpha with probability >= 9/10 per draw; over 20 draws the
    # number of failures is Binomial(20, <= 0.1): more than binom.ppf(0.999) would reject.
    eps, alpha = 0.5, 1e-4
    x = points(40, 3, 6)
    y = x + 0.2 * points(40, 3, 7, 1.0)
    s = choose_truncation(torch.cat([x, y]), alpha, variant=variant)
    num = 3 * 16 * 4 if variant == "coordinate" else 3 * s * s // 1
    k = GaussianSketchKernel(int(num), truncation=s, variant=variant, input_dim=3).double()
    k.lengthscale = 1.0
    exact = float(kernel_distance(x, y))
    g = torch.Generator().manual_seed(8)
    failures = 0
    for _ in range(20):
        k.resample(g)
        estimate = float(kernel_distance(x, y, k))
        failures += abs(estimate - exact) > eps * exact + alpha
    assert failures <= binom.ppf(0.999, 20, 0.1)


def test_kernel_distance_exact_forms():
    x, y = points(7, 2, 9), points(5, 2, 10)
    rbf = gpytorch.kernels.RBFKernel().double()
    rbf.lengthscale = 0.7
    kxx, kyy, kxy = (rbf(a, b).to_dense() for a, b in ((x, x), (y, y), (x, y)))
    expected = kxx.mean() + kyy.mean() - 2 * kxy.mean()
    torch.testing.assert_close(kernel_distance(x, y, rbf), expected)
    torch.testing.assert_close(kernel_distance(x, y, lengthscale=0.7), expected)
    torch.testing.assert_close(kernel_distance(x, y, lengthscale=0.7, squared=False),
                               expected.sqrt())
    torch.testing.assert_close(kernel_distance(x, y, rbf, block_size=2), expected)
    assert float(kernel_distance(x, x)) == pytest.approx(0.0, abs=1e-12)
    # Sketched estimate = the exact distance under the feature kernel k_hat = Phi Phi^T.
    k = GaussianSketchKernel(32, truncation=6, seed=0).double()
    z = torch.cat([x, y])
    phi = k.features(z)
    beta = torch.cat([torch.full((7,), 1 / 7, dtype=torch.float64),
                      torch.full((5,), -1 / 5, dtype=torch.float64)])
    torch.testing.assert_close(kernel_distance(x, y, k), beta @ (phi @ phi.T) @ beta)
    scaled = gpytorch.kernels.ScaleKernel(k).double()
    scaled.outputscale = 2.0
    torch.testing.assert_close(kernel_distance(x, y, scaled), 2 * kernel_distance(x, y, k))


def test_spherical_features_match_their_fitted_kernel():
    fit_scales, fit_weights, error = fit_spherical_mixture(3, 2.0)
    assert error < 0.06 and (fit_weights > 0).all()
    x = points(20, 4, 11)
    x = x / x.norm(dim=-1, keepdim=True)
    for sampling in ["iid", "orthogonal"]:
        k = SphericalFeatureKernel(4000, degree=3, sampling=sampling, seed=0).double()
        phi = k.features(x)
        fitted = k.fitted_kernel(torch.cdist(x, x))
        # Per-entry Monte Carlo error of M = 2000 bounded (|cos| <= 1) terms times C ~ 1.
        assert (phi @ phi.T - fitted).abs().max() < 5 * 1.1 / math.sqrt(2000) * 2
        assert (phi @ phi.T - spherical_polynomial(x, x, 3)).abs().max() < 0.2
        fresh = SphericalFeatureKernel(4000, degree=3, sampling=sampling)
        fresh.load_state_dict(k.state_dict())
        torch.testing.assert_close(fresh.features(x), phi)


def test_bad_input():
    with pytest.raises(ValueError, match="variant"):
        GaussianSketchKernel(16, variant="tree")
    with pytest.raises(ValueError, match="truncation"):
        GaussianSketchKernel(16, truncation=0)
    with pytest.raises(ValueError, match="batch_shape"):
        GaussianSketchKernel(16, batch_shape=torch.Size([2]))
    with pytest.raises(ValueError, match="alpha"):
        choose_truncation(1.0, 0.0)
    with pytest.raises(ValueError, match="input_dim"):
        choose_truncation(1.0, 1e-3, variant="coordinate")
    with pytest.raises(ValueError, match="x and y"):
        kernel_distance(torch.zeros(3, 2), torch.zeros(3, 3))
    with pytest.raises(TypeError, match="kernel"):
        kernel_distance(torch.zeros(3, 2), torch.zeros(3, 2), kernel="rbf")
    with pytest.raises(ValueError, match="degree"):
        SphericalFeatureKernel(16, degree=0)
    with pytest.raises(ValueError, match="a must"):
        SphericalFeatureKernel(16, degree=2, a=1.0)
    with pytest.raises(ValueError, match="num_features"):
        SphericalFeatureKernel(15, degree=2)
