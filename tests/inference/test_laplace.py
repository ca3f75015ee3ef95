"""Tests of the Laplace approximation over the log-hyperparameters, its lengthscale draws, the
lengthscale-averaged kernel and its place in the default recipe."""

from __future__ import annotations

import math

import pytest
import torch
from gpytorch.kernels import AdditiveKernel, ScaleKernel

from rfgp.inference._evidence_search import maximize_evidence
from rfgp.inference._laplace import evidence_hessian, lengthscale_draws
from rfgp.kernels import FourierFeatureKernel
from rfgp.kernels._fourier import cos_sin_features, stationary_kernel
from rfgp.recipes import FitReport, fit_auto
from rfgp.recipes._laplace import lengthscale_mixture_kernel
from rfgp.recipes._start import make_ard_kernel
from tests.helpers import DT, gen


def data(n: int = 80, d: int = 2, seed: int = 0):
    g = gen(seed)
    x = torch.randn(n, d, generator=g, dtype=DT)
    y = torch.sin(2 * x[:, 0]) + 0.3 * x[:, 1] + 0.1 * torch.randn(n, generator=g, dtype=DT)
    return x, y


def gaussian_nll(cov: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """-log N(y; 0, cov) per datum, twice differentiable (plain autograd)."""
    chol = torch.linalg.cholesky(cov)
    alpha = torch.cholesky_solve(y.unsqueeze(-1), chol)
    n = y.numel()
    value = 0.5 * (y.unsqueeze(-1) * alpha).sum() + chol.diagonal().log().sum()
    return (value + 0.5 * n * math.log(2 * math.pi)) / n


def exact_loss(theta, x, y):
    d = x.shape[1]
    z = x / theta[:d].exp()
    sq = (z.unsqueeze(1) - z.unsqueeze(0)).square().sum(-1)
    cov = theta[d].exp() * torch.exp(-0.5 * sq) + theta[d + 1].exp() * torch.eye(len(y), dtype=DT)
    return gaussian_nll(cov, y)


# ----------------------------------------------------------------------------- the Hessian
def test_exact_hessian_matches_second_derivatives_by_autograd():
    x, y = data()
    theta = torch.tensor([math.log(0.8), math.log(1.7), math.log(1.2), math.log(0.05)], dtype=DT)
    reference = torch.autograd.functional.hessian(lambda t: exact_loss(t, x, y), theta)
    kernel = FourierFeatureKernel(64, input_dim=2, seed=0)
    h = evidence_hessian(kernel, x, y, theta[:2].exp(), theta[2].exp(), theta[3].exp())
    # Forward differences with step 1e-4: truncation error about 1e-4 of the third derivative.
    torch.testing.assert_close(h, reference, rtol=2e-3, atol=2e-3 * float(reference.abs().max()))


@pytest.mark.parametrize("exact", [True, False])
def test_hessian_of_float32_inputs_is_the_float64_hessian(exact):
    # A float64-sized step on float32 gradients gave Hessians off by 4% (exact) and 15%
    # (features) here; computed in float64, float32 inputs differ only by their rounding.
    g = gen(3)
    x = torch.randn(60, 3, generator=g, dtype=DT)
    y = torch.sin(2 * x).sum(-1)
    y = y - y.mean()
    ell = torch.full((3,), 0.6, dtype=DT)
    scale, noise = torch.tensor(1.5, dtype=DT), torch.tensor(1e-3, dtype=DT)
    h64 = evidence_hessian(FourierFeatureKernel(64, input_dim=3, seed=0), x, y, ell, scale,
                           noise, exact=exact)
    x32, y32 = x.float(), y.float()
    h32 = evidence_hessian(FourierFeatureKernel(64, input_dim=3, seed=0), x32, y32,
                           ell.float(), scale.float(), noise.float(), exact=exact)
    assert h32.dtype == torch.float32
    # the inputs' own float32 rounding (relative 6e-8) moves the Hessian by about that much
    torch.testing.assert_close(h32.double(), h64, rtol=0, atol=1e-5 * float(h64.abs().max()))


def test_feature_hessian_matches_second_derivatives_by_autograd():
    # The random-feature evidence: weight space (N >= D), with the kernel's own frequencies.
    x, y = data(n=120)
    kernel = FourierFeatureKernel(32, input_dim=2, sampling="orthogonal", seed=3)
    kernel.ensure_weights(x)

    def loss(t):
        proj = kernel.projections(x / t[:2].exp())
        z = cos_sin_features(proj, 1.0) * (t[2].exp() / proj.shape[1]).sqrt()
        cov = z @ z.T + t[3].exp() * torch.eye(len(y), dtype=DT)
        return gaussian_nll(cov, y)

    theta = torch.tensor([math.log(0.6), math.log(2.0), 0.1, math.log(0.02)], dtype=DT)
    reference = torch.autograd.functional.hessian(loss, theta)
    h = evidence_hessian(kernel, x, y, theta[:2].exp(), theta[2].exp(), theta[3].exp(),
                         exact=False)
    torch.testing.assert_close(h, reference, rtol=2e-3, atol=2e-3 * float(reference.abs().max()))


def test_hessian_at_the_evidence_maximum_is_positive_semidefinite():
    x, y = data(n=150)
    from rfgp import RandomFeatureGP

    kernel = make_ard_kernel(64, 2, seed=0)
    gp = RandomFeatureGP(kernel, noise=torch.tensor(0.1, dtype=DT))
    maximize_evidence(gp, x, y, 200, 1e-8, exact=True)
    h = evidence_hessian(kernel.base_kernel, x, y, kernel.base_kernel.lengthscale.reshape(-1),
                         kernel.outputscale, gp.noise.to(DT))
    # At a maximum the curvature of -log p is non-negative in every direction, up to the
    # forward differences' O(1e-4) relative error.
    assert float(torch.linalg.eigvalsh(h).min()) > -1e-3 * float(h.abs().max())


@pytest.mark.parametrize("exact", [True, False])
@pytest.mark.parametrize("offset", [1.7e12, -1e12, 1e8])
def test_hessian_and_evidence_are_invariant_to_an_offset_of_the_inputs(exact, offset):
    # Both evidences depend on x through differences alone (stationary kernel, cos/sin pairs).
    # x + offset rounds x to the offset's ulp; (x + offset) - offset is those rounded inputs,
    # exactly. The two must give the same Hessian up to rounding (~1e-16 / step, step 1e-4),
    # not one that lost the offset's digits in omega^T x / l or in expanded distances.
    from rfgp.inference._evidence import fourier_kernel_negative_log_evidence

    x, y = data()
    shifted = x + offset
    rounded = shifted - offset
    kernel = FourierFeatureKernel(64, input_dim=2, seed=0).double()
    ell = torch.tensor([0.7, 1.3], dtype=DT)
    one = torch.ones((), dtype=DT)
    h = evidence_hessian(kernel, shifted, y, ell, one, 0.05 * one, exact=exact)
    reference = evidence_hessian(kernel, rounded, y, ell, one, 0.05 * one, exact=exact)
    torch.testing.assert_close(h, reference, rtol=0, atol=1e-8 * float(reference.abs().max()))
    value = fourier_kernel_negative_log_evidence(kernel, shifted, y.unsqueeze(-1), ell, one,
                                                 0.05 * one, exact)
    expected = fourier_kernel_negative_log_evidence(kernel, rounded, y.unsqueeze(-1), ell, one,
                                                    0.05 * one, exact)
    assert float(value) == pytest.approx(float(expected), rel=1e-12)


@pytest.mark.parametrize("bad, match", [
    (dict(lengthscale=torch.tensor([1.0], dtype=DT)), "lengthscale must hold 2"),
    (dict(lengthscale=torch.tensor([1.0, -1.0], dtype=DT)), "lengthscale must hold 2"),
    (dict(outputscale=torch.tensor(0.0, dtype=DT)), "outputscale must be one positive"),
    (dict(noise=torch.tensor([0.1, 0.2], dtype=DT)), "noise must be one positive"),
    (dict(step=0.0), "step"),
])
def test_hessian_rejects_bad_arguments(bad, match):
    x, y = data(n=20)
    args = dict(lengthscale=torch.ones(2, dtype=DT), outputscale=torch.tensor(1.0, dtype=DT),
                noise=torch.tensor(0.1, dtype=DT))
    args.update(bad)
    with pytest.raises(ValueError, match=match):
        evidence_hessian(FourierFeatureKernel(16, input_dim=2), x, y, **args)


def test_hessian_rejects_other_kernels_and_bad_rows():
    x, y = data(n=20)
    one = torch.tensor(1.0, dtype=DT)
    with pytest.raises(TypeError, match="FourierFeatureKernel"):
        evidence_hessian(ScaleKernel(FourierFeatureKernel(16)), x, y, torch.ones(2, dtype=DT),
                         one, one)
    bad = y.clone()
    bad[3] = math.nan
    with pytest.raises(ValueError, match="y"):
        evidence_hessian(FourierFeatureKernel(16), x, bad, torch.ones(2, dtype=DT), one, one)


# ----------------------------------------------------------------------------- the draws
def test_draws_follow_the_floored_inverse_hessian_marginal():
    # H (total nats) with a correlation between log l_1 and log s: the marginal of log l is
    # the lengthscale block of (H + tau I)^-1 (eigenvalues here all positive), not the inverse
    # of H's block.
    h = torch.tensor([[300.0, 0.0, 150.0, 0.0],
                      [0.0, 50.0, 0.0, 0.0],
                      [150.0, 0.0, 100.0, 0.0],
                      [0.0, 0.0, 0.0, 400.0]], dtype=DT)
    ell = torch.tensor([0.5, 3.0], dtype=DT)
    n = 20000
    draws = lengthscale_draws(ell, h, n, gen(0))
    expected = torch.linalg.inv(h + torch.eye(4, dtype=DT))[:2, :2]
    logs = draws.log() - ell.log()
    cov = logs.T @ logs / n
    # Sample covariance of n Gaussian draws: standard error sqrt((S_ii S_jj + S_ij^2) / n).
    se = ((expected.diagonal().outer(expected.diagonal()) + expected.square()) / n).sqrt()
    assert bool(((cov - expected).abs() < 5 * se).all()), (cov, expected)
    assert bool((logs.mean(0).abs() < 5 * (expected.diagonal() / n).sqrt()).all())


def test_flat_directions_get_the_precision_floor():
    # Zero curvature (an input switched off): variance 1 / tau in log l.
    h = torch.diag(torch.tensor([0.0, 0.0, 10.0, 10.0], dtype=DT))
    draws = lengthscale_draws(torch.tensor([200.0, 1.0], dtype=DT), h, 4000, gen(1),
                              precision_floor=4.0)
    sd = draws.log().std(0)
    # Standard error of a sample standard deviation: sd / sqrt(2 (n - 1)).
    assert bool(((sd - 0.5).abs() < 5 * 0.5 / math.sqrt(2 * 3999)).all()), sd


def test_fixed_lengthscales_stay_and_draws_respect_the_bound():
    h = torch.eye(5, dtype=DT) * 2.0
    ell = torch.tensor([1.0, 4.0, 2.0], dtype=DT)
    upper = torch.tensor([10.0, 4.0, 2.5], dtype=DT)
    fixed = torch.tensor([False, True, False])
    draws = lengthscale_draws(ell, h, 500, gen(2), fixed=fixed, upper=upper)
    assert bool((draws[:, 1] == 4.0).all())
    assert bool((draws <= upper).all()) and bool((draws > 0).all())
    assert float(draws[:, 2].max()) == 2.5  # sd 1/sqrt(3) in log: many draws above the bound
    assert float(draws[:, 0].std()) > 0


def test_draws_are_reproducible_from_the_generator():
    h = torch.eye(4, dtype=DT)
    ell = torch.ones(2, dtype=DT)
    torch.testing.assert_close(lengthscale_draws(ell, h, 7, gen(5)),
                               lengthscale_draws(ell, h, 7, gen(5)), rtol=0, atol=0)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(hessian=torch.eye(3, dtype=DT)), ValueError, "shape \\(4, 4\\)"),
    (dict(lengthscale=torch.tensor([1.0, 0.0], dtype=DT)), ValueError, "positive"),
    (dict(lengthscale=torch.tensor(1.0, dtype=DT)), ValueError, "lengthscale"),
    (dict(num_draws=0), ValueError, "num_draws"),
    (dict(num_draws=2.5), TypeError, "num_draws"),
    (dict(fixed=torch.tensor([0.0, 1.0])), TypeError, "boolean"),
    (dict(fixed=torch.tensor([True])), ValueError, "fixed must hold 2"),
    (dict(upper=torch.tensor([1.0, math.inf], dtype=DT)), ValueError, "upper"),
    (dict(precision_floor=0.0), ValueError, "precision_floor"),
    (dict(hessian=torch.full((4, 4), math.nan, dtype=DT)), ValueError, "hessian"),
    (dict(lengthscale=torch.tensor([1.0, math.inf], dtype=DT)), ValueError, "lengthscale"),
    (dict(lengthscale=torch.ones(0, dtype=DT)), ValueError, "lengthscale"),
])
def test_draws_reject_bad_arguments(kwargs, error, match):
    args = dict(lengthscale=torch.ones(2, dtype=DT), hessian=torch.eye(4, dtype=DT),
                num_draws=3)
    args.update(kwargs)
    with pytest.raises(error, match=match):
        lengthscale_draws(**args)


# ----------------------------------------------------------------------------- the average kernel
def test_mixture_kernel_estimates_the_average_of_the_kernels():
    g = gen(4)
    x = torch.randn(20, 3, generator=g, dtype=DT)
    ells = torch.tensor([[0.7, 1.5, 3.0], [1.2, 0.9, 2.0], [2.0, 2.0, 0.6], [1.0, 1.0, 1.0]],
                        dtype=DT)
    s = torch.tensor(1.8, dtype=DT)
    kernel = lengthscale_mixture_kernel(2**15, ells, s, seed=1)
    with torch.no_grad():
        estimate = kernel(x).to_dense()
    exact = s * torch.stack([stationary_kernel(x, x, ell) for ell in ells]).mean(0)
    # Each of the M = 2^14 frequencies' cosines has variance at most 1/2 (orthogonal blocks have
    # less), each part weighs s / S over M / S of them: variance at most s^2 / (2 M).
    sd = float(s) / math.sqrt(2 * 2**14)
    assert float((estimate - exact).abs().max()) < 5 * sd


def test_mixture_kernel_parts_sizes_and_seeds():
    ells = torch.ones(5, 2, dtype=DT)
    k = lengthscale_mixture_kernel(24, ells, torch.tensor(1.0, dtype=DT), seed=0)
    sizes = [part.base_kernel.num_features for part in k.kernels]
    assert isinstance(k, AdditiveKernel) and sum(sizes) == 24 and sizes == [6, 6, 4, 4, 4]
    for part in k.kernels:
        torch.testing.assert_close(part.outputscale, torch.tensor(0.2, dtype=DT))
    # More draws than frequencies: one frequency per part, the first draws.
    k = lengthscale_mixture_kernel(4, ells, torch.tensor(1.0, dtype=DT))
    assert [part.base_kernel.num_features for part in k.kernels] == [2, 2]
    x = torch.randn(6, 2, dtype=DT)
    with torch.no_grad():
        same = lengthscale_mixture_kernel(24, ells, torch.tensor(1.0, dtype=DT), seed=3)(x)
        again = lengthscale_mixture_kernel(24, ells, torch.tensor(1.0, dtype=DT), seed=3)(x)
        other = lengthscale_mixture_kernel(24, ells, torch.tensor(1.0, dtype=DT), seed=4)(x)
    torch.testing.assert_close(same.to_dense(), again.to_dense(), rtol=0, atol=0)
    assert not torch.allclose(same.to_dense(), other.to_dense())


@pytest.mark.parametrize("kwargs, error", [
    (dict(num_features=7), ValueError),
    (dict(num_features=0), ValueError),
    (dict(lengthscales=torch.ones(3, dtype=DT)), ValueError),
    (dict(lengthscales=-torch.ones(2, 2, dtype=DT)), ValueError),
    (dict(lengthscales=torch.full((2, 2), math.nan, dtype=DT)), ValueError),
    (dict(lengthscales=torch.full((2, 2), math.inf, dtype=DT)), ValueError),
    (dict(lengthscales=torch.ones(0, 2, dtype=DT)), ValueError),
    (dict(lengthscales=torch.ones(2, 2, dtype=torch.int64)), TypeError),
    (dict(outputscale=torch.tensor(math.nan, dtype=DT)), ValueError),
    (dict(outputscale=torch.tensor(-1.0, dtype=DT)), ValueError),
    (dict(spectral="cosine"), ValueError),
    (dict(seed=-1), ValueError),
])
def test_mixture_kernel_rejects_bad_arguments(kwargs, error):
    args = dict(num_features=8, lengthscales=torch.ones(2, 2, dtype=DT),
                outputscale=torch.tensor(1.0, dtype=DT))
    args.update(kwargs)
    with pytest.raises(error):
        lengthscale_mixture_kernel(**args)


# ----------------------------------------------------------------------------- in the recipe
def test_fit_auto_averages_the_lengthscales_by_default():
    x, y = data(n=200, d=3, seed=1)
    report = FitReport()
    gp = fit_auto(x, y - y.mean(), num_features=256, report=report, seed=0,
                  max_lengthscale=None)
    draws = report.lengthscale_draws
    tree = gp.kernel.tree  # the model wraps the sum in its composed feature map
    assert isinstance(tree, AdditiveKernel) and len(tree.kernels) == 32
    assert draws.shape == (32, 3) and "laplace" in report.seconds
    assert gp.feature_map.num_features == 256
    for part, ell in zip(tree.kernels, draws):
        torch.testing.assert_close(part.base_kernel.lengthscale.reshape(-1), ell)
    # The draws scatter around the maximum (a few hundred rows leave a visible spread).
    spread = (draws.log() - report.lengthscale.log()).std(0)
    assert bool((spread > 0).all()) and bool((spread < 1.5).all())
    with torch.no_grad():
        mean, std = gp.predict(x[:5], return_std=True)
    assert bool(torch.isfinite(mean).all()) and bool((std > 0).all())


def test_fit_auto_without_draws_keeps_the_kernel_at_the_maximum():
    x, y = data(n=200, d=3, seed=1)
    report = FitReport()
    gp = fit_auto(x, y - y.mean(), num_features=256, report=report, seed=0, cv_folds=0,
                  lengthscale_draws=0)
    assert isinstance(gp.kernel, ScaleKernel) and report.lengthscale_draws is None
    torch.testing.assert_close(gp.kernel.base_kernel.lengthscale.reshape(-1),
                               report.lengthscale)


def test_bounded_lengthscales_are_held_at_the_bound_in_every_draw():
    # Input 2 carries nothing: the maximum switches it off, the bound (cv_folds=0: kept) binds
    # there, and the Laplace draws leave it at the bound.
    g = gen(7)
    x = torch.randn(150, 2, generator=g, dtype=DT)
    y = torch.sin(2 * x[:, 0]) + 0.05 * torch.randn(150, generator=g, dtype=DT)
    report = FitReport()
    fit_auto(x, y - y.mean(), num_features=128, report=report, cv_folds=0, seed=0)
    bound = report.lengthscale_bound
    assert bound is not None
    at_bound = report.lengthscale >= 0.99 * bound
    assert bool(at_bound[1])
    draws = report.lengthscale_draws
    assert bool((draws[:, at_bound] == report.lengthscale[at_bound]).all())
    assert bool((draws <= bound).all())


@pytest.mark.parametrize("value, error", [(-1, ValueError), (2.0, TypeError), (True, TypeError)])
def test_fit_auto_rejects_bad_draw_counts(value, error):
    x, y = data(n=30)
    with pytest.raises(error, match="lengthscale_draws"):
        fit_auto(x, y, num_features=16, lengthscale_draws=value)


def test_averaged_fit_round_trips_through_state_dict_and_goes_stale_on_change():
    from rfgp import RandomFeatureGP
    from rfgp.inference._fit_state import StaleFitError

    x, y = data(n=120, d=2, seed=3)
    report = FitReport()
    gp = fit_auto(x, y - y.mean(), num_features=64, report=report, seed=0, lengthscale_draws=4)
    xq = torch.randn(7, 2, generator=gen(8), dtype=DT)
    mean, std = gp.predict(xq, return_std=True)
    # A model of the same structure (other values, other frequencies) takes the whole state.
    fresh = RandomFeatureGP(
        lengthscale_mixture_kernel(64, torch.ones(4, 2, dtype=DT), torch.tensor(1.0, dtype=DT),
                                   seed=99),
        noise=torch.tensor(0.5, dtype=DT))
    fresh.load_state_dict(gp.state_dict())
    m2, s2 = fresh.predict(xq, return_std=True)
    torch.testing.assert_close(m2, mean, rtol=0, atol=0)
    torch.testing.assert_close(s2, std, rtol=0, atol=0)
    # A part's lengthscale changed after the fit: the fitted posterior is never reused. The
    # model holding its data refits; the loaded checkpoint, without data, raises.
    for model in (gp, fresh):
        part = model.kernel.tree.kernels[2].base_kernel
        part.lengthscale = part.lengthscale.detach() * 2
    refitted = gp.predict(xq)
    assert not torch.allclose(refitted, mean)
    with pytest.raises(StaleFitError, match="lengthscale"):
        fresh.predict(xq)


def test_fit_auto_keeps_the_maximum_with_a_warning_when_the_hessian_fails(monkeypatch):
    from linear_operator.utils.errors import NotPSDError

    import rfgp.recipes._laplace as recipe

    def unfactorisable(*args, **kwargs):
        raise NotPSDError("not positive definite next to the maximum")

    monkeypatch.setattr(recipe, "evidence_hessian", unfactorisable)
    x, y = data(n=60)
    report = FitReport()
    with pytest.warns(RuntimeWarning, match="not averaged"):
        gp = fit_auto(x, y - y.mean(), num_features=32, report=report, max_lengthscale=None)
    assert report.lengthscale_draws is None and isinstance(gp.kernel, ScaleKernel)
    torch.testing.assert_close(gp.kernel.base_kernel.lengthscale.reshape(-1), report.lengthscale)


def test_fit_auto_on_a_single_zero_row_is_refused_naming_y():
    # One centred target is zero: the evidence has no maximum (it grows as the outputscale
    # and the noise shrink together), so there are no scales to draw around: refused by name.
    with pytest.raises(ValueError, match="y must not be zero in every entry"):
        fit_auto(torch.tensor([[0.3, -1.0]], dtype=DT), torch.zeros(1, dtype=DT),
                 num_features=16, report=FitReport())


def test_fit_auto_on_a_single_row_needs_no_draws():
    # One non-zero target: the fit stays finite with or without an average.
    gp = fit_auto(torch.tensor([[0.3, -1.0]], dtype=DT), torch.ones(1, dtype=DT),
                  num_features=16, report=FitReport())
    mean, std = gp.predict(torch.zeros(2, 2, dtype=DT), return_std=True)
    assert bool(torch.isfinite(mean).all()) and bool(torch.isfinite(std).all())


def test_fit_auto_averages_with_several_target_columns():
    # (N, T) targets share the kernel: one Hessian of the evidence summed over the columns.
    x, y = data(n=120, d=2, seed=5)
    ys = torch.stack([y - y.mean(), torch.cos(x[:, 1]) - torch.cos(x[:, 1]).mean()], -1)
    report = FitReport()
    gp = fit_auto(x, ys, num_features=64, report=report, max_lengthscale=None,
                  lengthscale_draws=8)
    assert report.lengthscale_draws.shape == (8, 2)
    mean, std = gp.predict(x[:4], return_std=True)
    assert mean.shape == (4, 2) and bool(torch.isfinite(std).all())


def test_a_report_passed_again_describes_the_new_fit_only():
    x, y = data(n=60)
    report = FitReport()
    fit_auto(x, y - y.mean(), num_features=32, report=report, max_lengthscale=None)
    assert "laplace" in report.seconds and report.lengthscale_draws is not None
    fit_auto(x, y - y.mean(), num_features=32, report=report, max_lengthscale=None,
             lengthscale_draws=0)
    assert "laplace" not in report.seconds and report.lengthscale_draws is None
    assert set(report.seconds) == {"search", "refit"}
