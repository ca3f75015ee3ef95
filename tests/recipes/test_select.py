"""Tests of the recipe's bounded-lengthscale alternative and its choice by cross-validation: the
closed-form exact evidence, the bound on the search, the folds and held-out densities, the
one-standard-error rule, and the recipe keeping the evidence maximum when inputs are irrelevant."""

from __future__ import annotations

import math

import pytest
import torch
from linear_operator.utils.errors import NotPSDError

from rfgp import RandomFeatureGP
from rfgp._units import column_scale
from rfgp.inference._cross_validation import cross_validate, held_out_log_density, kfold_indices
from rfgp.inference._evidence import (
    kernel_negative_log_evidence,
    stationary_negative_log_evidence,
)
from rfgp.kernels._fourier import stationary_kernel
from rfgp.recipes import FitReport, RegressionOptions, fit_auto
from rfgp.recipes._search import bounded_lengthscale, maximize_evidence
from rfgp.recipes._select import prefer_unbounded
from rfgp.recipes._start import make_ard_kernel
from tests.helpers import DT, gen

NUS = [None, 0.5, 1.5, 2.5]


# ----------------------------------------------------------------------------- exact evidence
@pytest.mark.parametrize("columns", [1, 2])
@pytest.mark.parametrize("nu", NUS)
def test_stationary_evidence_is_the_kernel_evidence_with_its_gradient(nu, columns):
    # Inputs far from the origin and on different scales: the centred identity behind the
    # lengthscale gradient must not lose digits to the columns' offsets.
    g = gen(0)
    x = torch.randn(20, 3, generator=g, dtype=DT) * torch.tensor([1.0, 5.0, 0.1]) + 40.0
    y = torch.randn(20, columns, generator=g, dtype=DT)
    ls = torch.tensor([0.8, 4.0, 0.2], dtype=DT, requires_grad=True)
    s = torch.tensor(1.7, dtype=DT, requires_grad=True)
    noise = torch.tensor(0.05, dtype=DT, requires_grad=True)
    value = stationary_negative_log_evidence(x, y, ls, s, noise, nu)
    reference = kernel_negative_log_evidence(stationary_kernel(x, x, ls, nu) * s, y, noise)
    torch.testing.assert_close(value, reference)
    grads = torch.autograd.grad(value, (ls, s, noise))
    expected = torch.autograd.grad(reference, (ls, s, noise))
    for got, want in zip(grads, expected):
        torch.testing.assert_close(got, want, rtol=1e-8, atol=1e-10)
    assert torch.autograd.gradcheck(
        lambda a, b, c, t: stationary_negative_log_evidence(x, t, a, b, c, nu),
        (ls, s, noise, y.clone().requires_grad_(True)),
    )


def test_stationary_evidence_with_repeated_inputs_has_a_finite_gradient():
    # Matern-1/2 has a singular slope at distance 0; repeated rows must not turn it into NaN.
    x = torch.tensor([[0.0, 1.0], [0.0, 1.0], [1.0, 2.0]], dtype=DT)
    y = torch.tensor([[0.3], [0.1], [-0.2]], dtype=DT)
    ls = torch.tensor([0.7, 1.3], dtype=DT, requires_grad=True)
    value = stationary_negative_log_evidence(x, y, ls, torch.tensor(1.0, dtype=DT),
                                             torch.tensor(0.1, dtype=DT), 0.5)
    (grad,) = torch.autograd.grad(value, ls)
    assert bool(torch.isfinite(grad).all())


def test_stationary_evidence_rejects_bad_input():
    x, y = torch.randn(5, 2, dtype=DT), torch.randn(5, 1, dtype=DT)
    ls, one = torch.ones(2, dtype=DT), torch.tensor(1.0, dtype=DT)
    with pytest.raises(ValueError, match=r"lengthscale \(d,\)"):
        stationary_negative_log_evidence(x, y, torch.ones(3, dtype=DT), one, one)
    with pytest.raises(ValueError, match=r"y \(N, T\)"):
        stationary_negative_log_evidence(x, y[:4], ls, one, one)
    with pytest.raises(ValueError, match="0-d"):
        stationary_negative_log_evidence(x, y, ls, one.reshape(1), one)
    with pytest.raises(ValueError, match="nu must be"):
        stationary_negative_log_evidence(x, y, ls, one, one, 3.5)
    with pytest.raises(NotPSDError, match="NaN or infinite"):
        stationary_negative_log_evidence(x, y, ls, one * float("nan"), one)
    with pytest.raises(NotPSDError, match="not positive definite"):
        stationary_negative_log_evidence(x, y, ls, one, -one * 5.0)
    with pytest.raises(TypeError, match="one floating dtype"):
        stationary_negative_log_evidence(x, y.float(), ls, one, one)
    with pytest.raises(TypeError, match="one floating dtype"):
        stationary_negative_log_evidence(x.long(), y.long(), ls.long(), one.long(), one.long())
    with pytest.raises(ValueError, match="N >= 1"):
        stationary_negative_log_evidence(x[:0], y[:0], ls, one, one)


def test_stationary_evidence_is_invariant_to_the_input_scale():
    # Scaling inputs and lengthscales together leaves the kernel unchanged, at extreme scales
    # too; the lengthscale gradient scales inversely.
    g = gen(3)
    x = torch.randn(25, 2, generator=g, dtype=DT)
    y = torch.randn(25, 1, generator=g, dtype=DT)
    s, noise = torch.tensor(1.3, dtype=DT), torch.tensor(0.2, dtype=DT)
    ls = torch.tensor([0.7, 2.0], dtype=DT, requires_grad=True)
    value = stationary_negative_log_evidence(x, y, ls, s, noise)
    (grad,) = torch.autograd.grad(value, ls)
    for c in (1e-150, 1e150):
        lsc = (ls.detach() * c).requires_grad_(True)
        scaled = stationary_negative_log_evidence(x * c, y, lsc, s, noise)
        torch.testing.assert_close(scaled, value, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(torch.autograd.grad(scaled, lsc)[0] * c, grad, rtol=1e-9,
                                   atol=1e-12)


# ----------------------------------------------------------------------------- the bound
def test_bounded_lengthscale_keeps_any_raw_value_inside_and_restores_the_constraint():
    kernel = make_ard_kernel(16, 3, seed=0)
    kernel.base_kernel.lengthscale = torch.tensor([[0.5, 7.0, 2.0]], dtype=DT)
    upper = torch.tensor([4.0, 4.0, 1.0], dtype=DT)
    original = type(kernel.base_kernel.raw_lengthscale_constraint)
    with bounded_lengthscale(kernel, upper):
        # A value at or above its bound starts at 0.9 times it; others are kept.
        torch.testing.assert_close(kernel.base_kernel.lengthscale.detach().reshape(-1),
                                   torch.tensor([0.5, 3.6, 0.9], dtype=DT))
        for raw in (-50.0, 0.0, 50.0):
            kernel.base_kernel.raw_lengthscale.data.fill_(raw)
            assert bool((kernel.base_kernel.lengthscale <= upper).all())
        kernel.base_kernel.raw_lengthscale.data.fill_(0.0)
        reached = kernel.base_kernel.lengthscale.detach().clone()
    assert type(kernel.base_kernel.raw_lengthscale_constraint) is original
    torch.testing.assert_close(kernel.base_kernel.lengthscale.detach(), reached)
    with pytest.raises(ValueError, match="finite and positive"):
        with bounded_lengthscale(kernel, torch.tensor([1.0, 0.0, 1.0], dtype=DT)):
            pass
    with pytest.raises(ValueError, match="finite and positive"):
        with bounded_lengthscale(kernel, torch.tensor([1.0, float("nan"), 1.0], dtype=DT)):
            pass
    with pytest.raises(ValueError, match=r"one entry per lengthscale \(3\)"):
        with bounded_lengthscale(kernel, torch.ones(2, dtype=DT)):
            pass
    # a failed bound leaves the kernel as it was
    assert type(kernel.base_kernel.raw_lengthscale_constraint) is original


def _irrelevant_input_data(n: int = 200, seed: int = 0):
    """y depends on input 0 alone; input 1 is noise: the evidence maximum switches it off."""
    g = gen(seed)
    x = torch.randn(n, 2, generator=g, dtype=DT)
    y = torch.sin(2.0 * x[:, 0]) + 0.1 * torch.randn(n, generator=g, dtype=DT)
    return x, y - y.mean()


def test_bounded_search_is_a_stationary_point_of_the_bounded_problem():
    # With the bound binding, the search ends at the bound in the switched-off input (its
    # gradient there pushes outwards) and at a stationary point in every other direction.
    x, y = _irrelevant_input_data()
    gp = RandomFeatureGP(make_ard_kernel(64, 2, seed=0), noise=0.1)
    maximize_evidence(gp, x, y, max_iterations=200, tolerance=1e-8, exact=True)
    assert float(gp.kernel.base_kernel.lengthscale.detach()[0, 1]) > 10.0  # switched off
    upper = torch.tensor([3.0, 3.0], dtype=DT)
    maximize_evidence(gp, x, y, max_iterations=200, tolerance=1e-8, exact=True,
                      max_lengthscale=upper)
    ls = gp.kernel.base_kernel.lengthscale.detach().reshape(-1).clone().requires_grad_(True)
    scale = gp.kernel.outputscale.detach().clone().requires_grad_(True)
    noise = gp.noise.detach().clone().requires_grad_(True)
    value = stationary_negative_log_evidence(x, y[:, None], ls, scale, noise) / y.numel()
    g_ls, g_s, g_n = torch.autograd.grad(value, (ls, scale, noise))
    assert float(ls[1]) == pytest.approx(3.0, rel=1e-3)
    assert float(g_ls[1]) < 0  # the evidence would grow past the bound
    assert abs(float(g_ls[0])) < 1e-5 and abs(float(g_s)) < 1e-5 and abs(float(g_n)) < 1e-4


def test_bound_that_does_not_bind_changes_nothing():
    x, y = _irrelevant_input_data()
    y = torch.sin(2.0 * x[:, 0]) + torch.sin(2.0 * x[:, 1])  # both inputs matter
    first = RandomFeatureGP(make_ard_kernel(64, 2, seed=0), noise=0.1)
    second = RandomFeatureGP(make_ard_kernel(64, 2, seed=0), noise=0.1)
    maximize_evidence(first, x, y, 200, 1e-8, exact=True)
    maximize_evidence(second, x, y, 200, 1e-8, exact=True,
                      max_lengthscale=torch.tensor([1e3, 1e3], dtype=DT))
    torch.testing.assert_close(first.kernel.base_kernel.lengthscale,
                               second.kernel.base_kernel.lengthscale, rtol=1e-3, atol=0)


def test_column_scale_is_the_standard_deviation_with_constant_columns_at_one():
    x = torch.tensor([[1.0, 5.0, 0.0], [3.0, 5.0, 0.0], [5.0, 5.0, 3.0]], dtype=DT)
    torch.testing.assert_close(column_scale(x), torch.stack([x[:, 0].std(), torch.tensor(1.0,
                               dtype=DT), x[:, 2].std()]))
    torch.testing.assert_close(column_scale(x[:1]), torch.ones(3, dtype=DT))


# ----------------------------------------------------------------------------- folds and scores
def test_held_out_density_and_cross_validate_reject_bad_input():
    x, y = _irrelevant_input_data(30)
    k = make_ard_kernel(16, 2, seed=0)
    noise = torch.tensor(0.1, dtype=DT)
    bad_x = x.clone()
    bad_x[3, 1] = float("nan")
    with pytest.raises(ValueError, match="x_train.*NaN"):
        held_out_log_density(k, noise, bad_x[:20], y[:20], x[20:], y[20:], exact=True)
    with pytest.raises(ValueError, match="y_test.*inf"):
        held_out_log_density(k, noise, x[:20], y[:20], x[20:], y[20:] / 0.0, exact=True)
    with pytest.raises(ValueError, match="x_test must have 2 columns"):
        held_out_log_density(k, noise, x[:20], y[:20], x[20:, :1], y[20:])
    with pytest.raises(ValueError, match="y_test must have the columns"):
        held_out_log_density(k, noise, x[:20], y[:20], x[20:], y[20:, None].expand(10, 2))
    with pytest.raises(ValueError, match="x_train must not be empty"):
        held_out_log_density(k, noise, x[:0], y[:0], x[20:], y[20:])
    with pytest.raises(TypeError, match="y_train must have the dtype"):
        held_out_log_density(k, noise, x[:20], y[:20].float(), x[20:], y[20:])
    with pytest.raises(ValueError, match="noise must have at most 0"):
        held_out_log_density(k, noise.reshape(1), x[:20], y[:20], x[20:], y[20:])
    with pytest.raises(ValueError, match="noise.*NaN"):
        held_out_log_density(k, noise * float("nan"), x[:20], y[:20], x[20:], y[20:])
    # a non-positive noise cannot be factorised, in either path: the worst score
    for exact in (True, False):
        dens = held_out_log_density(k, -noise, x[:20], y[:20], x[20:], y[20:], exact=exact)
        assert bool((dens == -math.inf).all())

    def search(xf, yf):
        yield k, noise

    with pytest.raises(ValueError, match="y.*NaN"):
        cross_validate(search, x, y * float("nan"), 3, gen(0))
    with pytest.raises(TypeError, match="floating"):
        cross_validate(search, x.long(), y, 3, gen(0))
    with pytest.raises(ValueError, match="num_rows"):
        cross_validate(search, x[:2], y[:2], 3, gen(0))


def test_fit_auto_rejects_rows_of_two_dtypes():
    x, y = _irrelevant_input_data(30)
    with pytest.raises(TypeError, match="y must have the dtype of x"):
        fit_auto(x, y.float())


def test_kfold_indices_partition_the_rows():
    parts = kfold_indices(23, 5, gen(0))
    sizes = sorted(p.numel() for p in parts)
    assert sizes == [4, 4, 5, 5, 5]
    assert sorted(torch.cat(parts).tolist()) == list(range(23))
    with pytest.raises(ValueError, match="folds"):
        kfold_indices(10, 1)
    with pytest.raises(ValueError, match="num_rows"):
        kfold_indices(3, 5)


def test_exact_held_out_density_is_the_gaussian_conditional():
    # The exact GP's predictive of y at the test rows, from the joint Gaussian by the
    # conditioning formula on the full (train + test) covariance.
    g = gen(1)
    x = torch.randn(25, 2, generator=g, dtype=DT)
    y = torch.randn(25, 2, generator=g, dtype=DT)
    kernel = make_ard_kernel(16, 2, "matern32", seed=0)
    kernel.base_kernel.lengthscale = torch.tensor([[0.7, 1.9]], dtype=DT)
    kernel.outputscale = torch.tensor(1.3, dtype=DT)
    noise = torch.tensor(0.2, dtype=DT)
    got = held_out_log_density(kernel, noise, x[:20], y[:20], x[20:], y[20:], exact=True)
    full = 1.3 * stationary_kernel(x, x, kernel.base_kernel.lengthscale, 1.5)
    full = full + noise * torch.eye(25, dtype=DT)
    a, b = slice(0, 20), slice(20, 25)
    gain = torch.linalg.solve(full[a, a], full[a, b]).T
    mean = gain @ y[a]
    var = (full[b, b] - gain @ full[a, b]).diagonal()
    want = torch.distributions.Normal(mean, var.sqrt().unsqueeze(-1)).log_prob(y[b]).sum(-1)
    torch.testing.assert_close(got, want)


def test_random_feature_held_out_density_converges_to_the_exact_one():
    # Same hyperparameters; the features' error shrinks like D^(-1/2): 64 times the features,
    # about 8 times less error, averaged over five draws of the frequencies.
    x, y = _irrelevant_input_data(60)
    noise = torch.tensor(0.05, dtype=DT)
    gaps = []
    for features in (128, 8192):
        total = 0.0
        for seed in range(5):
            kernel = make_ard_kernel(features, 2, seed=seed)
            kernel.base_kernel.lengthscale = torch.tensor([[0.8, 2.0]], dtype=DT)
            exact = held_out_log_density(kernel, noise, x[:40], y[:40], x[40:], y[40:], True)
            approx = held_out_log_density(kernel, noise, x[:40], y[:40], x[40:], y[40:])
            total += float((approx - exact).abs().mean()) / 5
        gaps.append(total)
    assert gaps[1] < gaps[0] / 4 and gaps[1] < 0.01


def test_cross_validate_scores_each_candidate_on_its_held_out_rows():
    # Against the same loop written out: each row scored once, while its fold was held out.
    x, y = _irrelevant_input_data(50)
    lengthscales = (0.5, 5.0)

    def search(xf, yf):
        kernel = make_ard_kernel(16, 2, seed=0)
        for value in lengthscales:
            kernel.base_kernel.lengthscale = torch.tensor([[value, value]], dtype=DT)
            yield kernel, torch.tensor(0.05, dtype=DT)

    scores = cross_validate(search, x, y, 4, gen(7), exact=True)
    parts = kfold_indices(50, 4, gen(7))
    assert scores.shape == (2, 50)
    for c, value in enumerate(lengthscales):
        kernel = make_ard_kernel(16, 2, seed=0)
        kernel.base_kernel.lengthscale = torch.tensor([[value, value]], dtype=DT)
        for k, held in enumerate(parts):
            rest = torch.cat([p for j, p in enumerate(parts) if j != k])
            want = held_out_log_density(kernel, torch.tensor(0.05, dtype=DT), x[rest], y[rest],
                                        x[held], y[held], exact=True)
            torch.testing.assert_close(scores[c, held], want)
    assert float(scores[0].mean()) > float(scores[1].mean())  # the lengthscale that fits


def test_a_candidate_that_cannot_factorise_scores_minus_infinity():
    x, y = _irrelevant_input_data(30)

    def search(xf, yf):
        kernel = make_ard_kernel(16, 2, seed=0)
        yield kernel, torch.tensor(0.1, dtype=DT)
        yield kernel, torch.tensor(-5.0, dtype=DT)  # negative noise: not positive definite

    scores = cross_validate(search, x, y, 3, gen(0), exact=True)
    assert bool(torch.isfinite(scores[0]).all()) and bool((scores[1] == -math.inf).all())
    assert prefer_unbounded(scores)[0]


# ----------------------------------------------------------------------------- the choice
def test_one_standard_error_rule():
    # The bounded (regularised) candidate is kept unless the unbounded one is better by more
    # than the standard error of the paired difference.
    g = gen(0)
    base = torch.randn(400, generator=g, dtype=DT)
    noise = torch.randn(400, generator=g, dtype=DT)  # paired differences: mean 0, sd 1
    se = 1.0 / math.sqrt(400)
    close = torch.stack([base + 0.5 * se + noise - noise.mean(), base])
    clear = torch.stack([base + 3.0 * se + noise - noise.mean(), base])
    assert not prefer_unbounded(close)[0]
    assert prefer_unbounded(clear)[0]
    better, report = prefer_unbounded(clear)
    assert report["standard_error"] == pytest.approx(float(noise.std()) * se)
    assert report["unbounded"] - report["bounded"] == pytest.approx(3.0 * se)


def test_fit_auto_keeps_the_evidence_maximum_when_an_input_is_irrelevant():
    # Bounding an irrelevant input's lengthscale adds a spurious slow variation along it; the
    # cross-validation sees it and keeps the unbounded maximum (the bound binds: it runs).
    x, y = _irrelevant_input_data(200)
    report = FitReport()
    fit_auto(x, y, num_features=256, seed=0, report=report)
    assert set(report.cv_scores) == {"unbounded", "bounded", "standard_error"}
    assert report.lengthscale_bound is None
    assert report.cv_scores["unbounded"] > report.cv_scores["bounded"]
    assert float(report.lengthscale[1]) > RegressionOptions().max_lengthscale * 2


def test_fit_auto_applies_the_bound_without_cross_validation_when_asked():
    x, y = _irrelevant_input_data(200)
    x = x * torch.tensor([1.0, 10.0], dtype=DT)  # the bound is in units of each column's spread
    report = FitReport()
    fit_auto(x, y, num_features=256, seed=0, report=report, cv_folds=0)
    bound = RegressionOptions().max_lengthscale * column_scale(x)
    torch.testing.assert_close(report.lengthscale_bound, bound)
    assert report.cv_scores == {} and "select" in report.seconds
    ls = report.lengthscale
    assert bool((ls <= bound).all()) and float(ls[1]) == pytest.approx(float(bound[1]), rel=1e-2)
    unbounded = FitReport()
    fit_auto(x, y, num_features=256, seed=0, max_lengthscale=None, report=unbounded)
    assert float(unbounded.lengthscale[1]) > float(bound[1])


def test_fit_auto_skips_the_choice_when_the_bound_does_not_bind_or_rows_are_few():
    g = gen(2)
    x = torch.randn(150, 2, generator=g, dtype=DT)
    y = torch.sin(2.0 * x[:, 0]) + torch.sin(2.0 * x[:, 1])
    report = FitReport()
    fit_auto(x, y, num_features=128, seed=0, report=report)
    assert report.cv_scores == {} and report.lengthscale_bound is None
    assert "select" not in report.seconds
    small, ys = _irrelevant_input_data(20)
    report = FitReport()
    fit_auto(small, ys, num_features=64, seed=0, report=report)  # 20 < 5 folds x 5 rows
    assert report.cv_scores == {} and report.lengthscale_bound is None
    # A search on a subsample (N > subsample) keeps the evidence maximum, in both stages.
    x, y = _irrelevant_input_data(200)
    report = FitReport()
    fit_auto(x, y, num_features=64, seed=0, report=report, subsample=100, cv_folds=0)
    assert report.cv_scores == {} and report.lengthscale_bound is None
    assert "select" not in report.seconds and report.refine_rows == 200
    assert float(report.lengthscale[1]) > RegressionOptions().max_lengthscale


def test_fit_auto_checks_the_bound_arguments():
    x, y = torch.randn(30, 2, dtype=DT), torch.randn(30, dtype=DT)
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="max_lengthscale"):
            fit_auto(x, y, max_lengthscale=bad)
    with pytest.raises(TypeError, match="max_lengthscale"):
        fit_auto(x, y, max_lengthscale="4")
    with pytest.raises(ValueError, match="cv_folds"):
        fit_auto(x, y, cv_folds=1)
    with pytest.raises(ValueError, match="cv_folds"):
        fit_auto(x, y, cv_folds=-2)
    with pytest.raises(TypeError, match="cv_folds"):
        fit_auto(x, y, cv_folds=5.0)
    gp = RandomFeatureGP(make_ard_kernel(8, 2, seed=0).base_kernel, noise=0.1)
    with pytest.raises(TypeError, match="ScaleKernel"):
        maximize_evidence(gp, x, y, max_lengthscale=torch.ones(2, dtype=DT))
