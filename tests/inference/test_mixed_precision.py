"""Mixed precision: float32 features with float64 statistics and factorisation
(``statistics_dtype=torch.float64``) match the float64 fit far better than a pure float32 fit."""

from __future__ import annotations

import copy

import pytest
import torch

from rfgp import RandomFeatureGP
from rfgp.kernels import FourierFeatureKernel


def _problem(n, num_features):
    g = torch.Generator().manual_seed(0)
    x = torch.rand(n, 8, generator=g)
    y = torch.sin(x.sum(-1)) + 0.3 * torch.randn(n, generator=g)
    kernel = FourierFeatureKernel(num_features, seed=0)
    kernel.features(x[:1])  # draw the float32 weights; the float64 reference uses the same values
    return x, y, torch.rand(500, 8, generator=g), kernel


def _relative_error(values, reference):
    return float((values.double() - reference).norm() / reference.norm())


def test_mixed_precision_fit_matches_the_float64_fit():
    x, y, xt, kernel = _problem(20000, 256)
    reference = RandomFeatureGP(copy.deepcopy(kernel).double(), noise=0.01).fit(
        x.double(), y.double()).predict(xt.double(), return_std=True)
    mixed_gp = RandomFeatureGP(kernel, noise=0.01, statistics_dtype=torch.float64).fit(x, y)
    mixed = mixed_gp.predict(xt, return_std=True)
    single = RandomFeatureGP(kernel, noise=0.01).fit(x, y).predict(xt, return_std=True)
    assert mixed[0].dtype == torch.float32 and mixed_gp.dtype == torch.float32
    # float32 features carry a relative rounding error of ~6e-8; the float64 statistics keep the
    # predictions within a small multiple of it, while float32 accumulation and Cholesky lose
    # three to four more digits over 20000 rows.
    assert _relative_error(mixed[0], reference[0]) < 2e-6
    assert _relative_error(mixed[1], reference[1]) < 2e-6
    assert _relative_error(single[0], reference[0]) > 100 * _relative_error(mixed[0], reference[0])


@pytest.mark.parametrize("solve", ["weight", "function"])
def test_mixed_precision_small_fits_and_updates(solve):
    x, y, xt, kernel = _problem(300, 64)
    reference = RandomFeatureGP(copy.deepcopy(kernel).double(), noise=0.1, solve=solve)
    reference.fit(x[:40].double(), y[:40].double()).update(x[40:].double(), y[40:].double())
    gp = RandomFeatureGP(kernel, noise=0.1, solve=solve, statistics_dtype=torch.float64)
    gp.fit(x[:40], y[:40]).update(x[40:], y[40:])
    torch.testing.assert_close(gp.predict(xt).double(), reference.predict(xt.double()),
                               rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gp.log_marginal_likelihood(),
                               reference.log_marginal_likelihood(), rtol=1e-6, atol=1e-6)


def test_statistics_dtype_is_checked():
    with pytest.raises(ValueError, match="statistics_dtype"):
        RandomFeatureGP(FourierFeatureKernel(8), statistics_dtype=torch.float16)
