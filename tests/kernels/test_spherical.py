"""SphericalFeatureKernel: the fitted mixture, its features and bad input."""

import math

import pytest
import torch

from rfgp.kernels import DotProductKernel, SphericalFeatureKernel
from rfgp.kernels.spherical import fit_spherical_mixture, spherical_polynomial


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
