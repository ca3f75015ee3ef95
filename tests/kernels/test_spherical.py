"""SphericalFeatureKernel: the fitted mixture, its features and bad input."""

import math

import pytest
import torch

from rfgp.kernels import DotProductKernel, SphericalFeatureKernel
from rfgp.kernels._spherical import fit_spherical_mixture, spherical_polynomial


def points(n, d, seed, scale=0.5):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g, dtype=torch.float64) * scale


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


def test_spherical_polynomial_is_a_dot_product_kernel_on_the_sphere():
    # For unit rows ||x - y||^2 = 2 - 2 x^T y, so (1 - ||x - y||^2 / a^2)^p is the polynomial
    # kernel with lengthscale a / sqrt(2) and bias 1 - 2 / a^2.
    x = points(6, 3, 2)
    x = x / x.norm(dim=-1, keepdim=True)
    a, degree = 3.0, 2
    dot = DotProductKernel("polynomial", degree=degree, bias=1 - 2 / a**2).double()
    dot.lengthscale = a / math.sqrt(2)
    expected = dot(x, x).to_dense().detach()
    torch.testing.assert_close(spherical_polynomial(x, x, degree, a), expected)
    k = SphericalFeatureKernel(16, degree=degree, a=a, seed=0).double()
    torch.testing.assert_close(k.exact_matrix(x, x), expected)


def test_bad_input():
    with pytest.raises(ValueError, match="degree"):
        SphericalFeatureKernel(16, degree=0)
    with pytest.raises(ValueError, match="a must"):
        SphericalFeatureKernel(16, degree=2, a=1.0)
    with pytest.raises(ValueError, match="num_features"):
        SphericalFeatureKernel(15, degree=2)


def test_lengthscale_divides_the_inputs():
    # Phi_l(x) = Phi_1(x / l) with the same random weights, one l per input with ARD.
    x = points(7, 3, 5)
    unit = SphericalFeatureKernel(64, degree=3, ard_num_dims=3, seed=0).double()
    torch.testing.assert_close(unit.lengthscale, torch.ones(1, 3, dtype=torch.float64))
    ls = torch.tensor([0.5, 2.0, 3.0], dtype=torch.float64)
    scaled = SphericalFeatureKernel(64, degree=3, ard_num_dims=3, seed=0).double()
    scaled.lengthscale = ls
    # (float64 tolerances: the lengthscale is stored through softplus and read back)
    torch.testing.assert_close(scaled.features(x), unit.features(x / ls))
    torch.testing.assert_close(scaled.exact_matrix(x, x), unit.exact_matrix(x / ls, x / ls))
    assert (scaled.features(x) - unit.features(x)).abs().max() > 0.1


def test_scalar_lengthscale_on_the_sphere_is_the_scale_a_times_l():
    # (1 - ||x - y||^2 / (a l)^2)^p in closed form, for unit rows and l >= 1 (distances / l
    # stay in [0, 2], the fitted range).
    x = points(9, 4, 3)
    x = x / x.norm(dim=-1, keepdim=True)
    k = SphericalFeatureKernel(16, degree=3, a=2.0, seed=0).double()
    k.lengthscale = 1.5
    sq = ((x.unsqueeze(1) - x.unsqueeze(0)) ** 2).sum(-1)
    torch.testing.assert_close(k.exact_matrix(x, x), (1 - sq / 3.0**2) ** 3)


def test_features_estimate_the_fitted_kernel_at_the_scaled_distance():
    x = points(12, 3, 8)
    ls = torch.tensor([0.7, 1.3, 2.0], dtype=torch.float64)
    k = SphericalFeatureKernel(8000, degree=2, ard_num_dims=3, seed=1).double()
    k.lengthscale = ls
    phi = k.features(x)
    fitted = k.fitted_kernel(torch.cdist(x / ls, x / ls))
    # Per entry: a mean of M = 4000 terms C cos(.), each bounded by C ~ 1: 5 standard errors.
    bound = 5 * float(k.mixture_weights.sum()) / math.sqrt(4000)
    assert (phi @ phi.T - fitted).abs().max() < bound


def test_lengthscale_is_learnable():
    x = points(10, 2, 4)
    k = SphericalFeatureKernel(32, degree=2, ard_num_dims=2, seed=0).double()
    k(x).to_dense().sum().backward()
    grad = k.raw_lengthscale.grad
    assert grad is not None and grad.shape == (1, 2) and bool((grad != 0).all())
