"""Calibration: the final model's outputscale and noise maximise its own evidence."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from rfgp import RandomFeatureGP
from rfgp.inference._calibration import (
    kernel_spectral_statistics,
    maximize_scale_evidence,
    spectral_statistics,
)
from rfgp.inference._evidence import negative_log_evidence
from rfgp.inference._feature_map import FeatureMap
from rfgp.kernels._composition import as_feature_kernel
from rfgp.recipes import FitReport, fit_auto
from rfgp.recipes._start import make_ard_kernel
from tests.helpers import DT, gen


def _reference_nll(phi, y, factor, noise):
    """-log p(y) from torch's multivariate normal with covariance a Phi Phi^T + s I."""
    cov = factor * phi @ phi.T + noise * torch.eye(phi.shape[0], dtype=DT)
    dist = torch.distributions.MultivariateNormal(torch.zeros(phi.shape[0], dtype=DT), cov)
    return -dist.log_prob(y.T).sum()


@pytest.mark.parametrize("shape", [(40, 12), (12, 40)], ids=["weight-space", "function-space"])
def test_spectral_evidence_is_the_gaussian_evidence(shape):
    g = gen(0)
    phi = torch.randn(*shape, generator=g, dtype=DT)
    y = torch.randn(shape[0], 2, generator=g, dtype=DT)
    weight = spectral_statistics(phi.T @ phi, phi.T @ y, float(y.square().sum()), shape[0])
    function = kernel_spectral_statistics(phi @ phi.T, y)
    for factor, noise in [(0.3, 0.2), (2.0, 1e-3), (1e-4, 5.0)]:
        expected = _reference_nll(phi, y, factor, noise)
        args = (torch.tensor(math.log(factor), dtype=DT), torch.tensor(noise, dtype=DT))
        torch.testing.assert_close(weight.negative_log_evidence(*args), expected, rtol=1e-10,
                                   atol=0)
        torch.testing.assert_close(function.negative_log_evidence(*args), expected,
                                   rtol=1e-10, atol=0)


def test_the_maximum_is_a_stationary_point_of_the_gaussian_evidence():
    g = gen(1)
    phi = torch.randn(300, 20, generator=g, dtype=DT) / math.sqrt(20)
    y = phi @ torch.randn(20, generator=g, dtype=DT) * 2 + 0.3 * torch.randn(
        300, generator=g, dtype=DT)
    evidence = spectral_statistics(phi.T @ phi, phi.T @ y, float(y @ y), 300)
    factor, noise, value = maximize_scale_evidence(evidence, noise=1.0)
    theta = torch.tensor([math.log(factor), math.log(noise)], dtype=DT, requires_grad=True)
    nll = _reference_nll(phi, y.unsqueeze(-1), theta[0].exp(), theta[1].exp())
    (grad,) = torch.autograd.grad(nll, theta)
    assert float(grad.abs().max()) < 1e-5
    assert value == pytest.approx(float(nll.detach()), rel=1e-10)


@pytest.mark.parametrize("true_factor", [1.0, 1e2, 1e3])
def test_the_maximum_is_reached_from_a_start_far_below_the_factor(true_factor):
    # A slowly decaying spectrum (lambda_i ~ i^-1.5) whose targets want a factor up to 1,000
    # times the start's: the evidence is nearly flat along the factor and its Hessian turns
    # indefinite on the way. The maximum is still reached: the derivative of the profile
    # -log p(c, sigma^2(c)) in log c (sigma^2(c) its closed-form best noise) vanishes there,
    # and no point of a fine grid of c is better.
    from rfgp.inference._calibration import ScaleEvidence

    g = gen(11)
    n, width, noise = 20000, 2000, 0.01
    lam = 1e4 * torch.arange(1, width + 1, dtype=DT) ** -1.5
    weights = torch.randn(width, generator=g, dtype=DT) * math.sqrt(true_factor)
    errors = torch.randn(width, generator=g, dtype=DT) * math.sqrt(noise)
    projections = (lam * weights + lam.sqrt() * errors) ** 2
    squares = float((projections / lam).sum()) + (n - width) * noise
    evidence = ScaleEvidence(lam, projections, squares, n, 1)

    def profile(log_c):
        c = math.exp(log_c)
        quad = squares - c * float((projections / (1 + c * lam)).sum())
        return 0.5 * (float(torch.log1p(c * lam).sum()) + n * math.log(quad / n)) / n

    factor, fitted_noise, _ = maximize_scale_evidence(evidence, noise=1.0, condition=1e-10)
    at = math.log(factor / fitted_noise)
    slope = (profile(at + 1e-4) - profile(at - 1e-4)) / 2e-4
    curvature = (profile(at + 1e-2) - 2 * profile(at) + profile(at - 1e-2)) / 1e-4
    assert abs(slope) < 1e-3 * curvature + 1e-9
    assert profile(at) <= min(profile(at + 0.05 * k) for k in range(-200, 201)) + 1e-12


def test_the_scales_are_recovered_within_their_standard_errors():
    # y = sqrt(a) Phi w + eps with a = 4 and noise 0.25 on N = 20000 rows of D = 50 features:
    # the noise MLE's relative standard error is about sqrt(2 / (N - D)) = 1%, the factor's
    # (chi-square of D = 50 weights) about sqrt(2 / D) = 20%.
    g = gen(2)
    n, width = 20000, 50
    phi = torch.randn(n, width, generator=g, dtype=DT)
    y = 2.0 * phi @ torch.randn(width, generator=g, dtype=DT) + 0.5 * torch.randn(
        n, generator=g, dtype=DT)
    evidence = spectral_statistics(phi.T @ phi, phi.T @ y, float(y @ y), n)
    factor, noise, _ = maximize_scale_evidence(evidence, noise=1.0)
    assert noise == pytest.approx(0.25, rel=0.05)
    assert factor == pytest.approx(4.0, rel=0.8)


def test_the_noise_floor_holds():
    g = gen(3)
    phi = torch.randn(30, 40, generator=g, dtype=DT)
    y = phi @ torch.randn(40, generator=g, dtype=DT)  # exactly in the span: noise -> 0
    evidence = kernel_spectral_statistics(phi @ phi.T, y)
    _, noise, _ = maximize_scale_evidence(evidence, noise=1.0, noise_floor=1e-3)
    assert noise >= 1e-3


def _sine_data(n, seed, frequency=12.0, noise=0.05):
    """sin(12 x) on [0, 1] with noise variance 0.0025, less its exact mean over [0, 1]."""
    g = gen(seed)
    x = torch.rand(n, 1, generator=g, dtype=DT)
    y = torch.sin(frequency * x[:, 0]) + noise * torch.randn(n, generator=g, dtype=DT)
    return x, y - (1 - math.cos(frequency)) / frequency


def test_fit_auto_ends_at_the_final_models_evidence_maximum():
    x, y = _sine_data(500, 4)
    report = FitReport()
    gp = fit_auto(x, y, num_features=32, seed=0, report=report)
    # The final model's features (outputscale included) and noise: -log p is stationary in
    # the log of a common factor on the outputscale(s) and in the log noise.
    kernel = gp.kernel
    with torch.no_grad():
        z = FeatureMap(kernel).real_rows(x)
    theta = torch.zeros(2, dtype=DT, requires_grad=True)
    noise = gp.noise.detach()
    # (of the targets less the prior mean the search chose)
    nll = negative_log_evidence(z * (theta[0] / 2).exp(), (y - gp.prior_mean).unsqueeze(-1),
                                noise * theta[1].exp())
    (grad,) = torch.autograd.grad(nll / y.numel(), theta)
    assert float(grad.abs().max()) < 1e-6
    assert report.calibration["chosen"] in report.calibration["evidence"]


@pytest.mark.parametrize("columns", [1, 2])
def test_the_final_fit_reuses_the_calibrations_products_exactly(columns):
    # The final weight-space fit takes the Gram matrix the calibration formed (rescaled from
    # the search's units) instead of a second pass: its posterior must be that of a plain fit
    # of the same kernel and noise. Inputs and targets far from unit scale, so the units and
    # the outputscale factor are not 1.
    x, y = _sine_data(500, 9)
    x = 1000.0 * x
    y = 1e-3 * (y if columns == 1 else torch.stack([y, -2 * y], -1))
    gp = fit_auto(x, y, num_features=48, seed=0)
    assert gp.solve_used == "weight"
    plain = RandomFeatureGP(copy.deepcopy(gp.kernel), noise=gp.noise.detach().clone(),
                            prior_mean=gp.prior_mean)
    plain.fit(x, y)
    xt = x[:50] * 1.01
    fitted = gp._state
    mean, std = gp.predict(xt, return_std=True)
    assert gp._state is fitted  # the posterior predicted from is the reused one, not a refit
    mean0, std0 = plain.predict(xt, return_std=True)
    torch.testing.assert_close(mean, mean0, rtol=1e-8, atol=1e-8 * float(y.abs().max()))
    torch.testing.assert_close(std, std0, rtol=1e-8, atol=0.0)
    torch.testing.assert_close(gp.log_marginal_likelihood(), plain.log_marginal_likelihood(),
                               rtol=1e-10, atol=1e-8)


def test_calibration_makes_the_few_feature_model_honest():
    # The search on 800 rows maximises the exact kernel's evidence (short lengthscale, small
    # noise); 16 features drawn at that lengthscale are far from its kernel. Calibrated (the
    # outputscale and noise of the 16-feature model by its own evidence), the model's 95%
    # intervals cover the test targets; kept at the search's, they cover far fewer. 4000 test
    # points: the coverage's standard error is under 0.004.
    x, y = _sine_data(800, 5)
    xt, yt = _sine_data(4000, 6)
    coverage = {}
    for calibrate in (False, True):
        gp = fit_auto(x, y, num_features=16, seed=0, calibrate=calibrate, lengthscale_draws=0)
        mean, std = gp.predict(xt, return_std=True)
        half = 1.96 * (std.square() + gp.noise).sqrt()
        coverage[calibrate] = float(((yt - mean).abs() <= half).double().mean())
    # The evidence of a misspecified 16-feature model need not give exactly 95%: calibrated,
    # the intervals hold at least their nominal share (they may hold more).
    assert 0.93 <= coverage[True] <= 0.995
    assert coverage[False] < 0.8


def test_calibration_keeps_multi_output_and_mixture_kernels():
    x, y = _sine_data(400, 7)
    y2 = torch.stack([y, 2 * y], -1)
    gp = fit_auto(x, y2, num_features=64, seed=0)
    assert gp.predict(x[:5]).shape == (5, 2)
    assert isinstance(as_feature_kernel(gp.kernel), type(gp.kernel))


def test_the_condition_keeps_the_solve_factorisable_on_a_noise_free_target():
    # y in the span of the features: the evidence alone sends the noise to its floor and the
    # factor without bound. With the condition c the noise stays at least c a lambda_max, so
    # a G / noise + I has a condition number of at most about 1 + 1/c.
    g = gen(8)
    phi = torch.randn(400, 30, generator=g, dtype=DT)
    y = phi @ torch.randn(30, generator=g, dtype=DT)
    evidence = spectral_statistics(phi.T @ phi, phi.T @ y, float(y @ y), 400)
    factor, noise, _ = maximize_scale_evidence(evidence, 1.0, 1e-12, condition=1e-10)
    top = float(evidence.eigenvalues.max())
    assert noise >= 1e-10 * factor * top * (1 - 1e-9)
    assert math.isfinite(factor) and factor * top / noise <= 1.01e10
    matrix = factor * phi.T @ phi / noise + torch.eye(30, dtype=DT)
    torch.linalg.cholesky(matrix)  # factorises


def test_candidates_are_compared_at_fewer_features_then_the_final_model_calibrates(
        monkeypatch):
    # Two candidates (the refinement's end and the local stage's best) compared at 16
    # features; the chosen lengthscales' 64-feature model then sits at its own evidence
    # maximum in its outputscale and noise, and its fit is a plain fit of that model.
    from rfgp.recipes import _refit

    monkeypatch.setattr(_refit, "CHOICE_FEATURES", 16)
    x, y = _sine_data(1500, 10)
    report = FitReport()
    gp = fit_auto(x, y, num_features=32, seed=0, report=report, subsample=300,
                  refine_rows=1500, exact_rows=300, time_budget=600, lengthscale_draws=0)
    assert len(report.calibration["candidates"]) == 2
    assert report.calibration["choice_features"] == 16
    with torch.no_grad():
        z = FeatureMap(gp.kernel).real_rows(x)
    theta = torch.zeros(2, dtype=DT, requires_grad=True)
    nll = negative_log_evidence(z * (theta[0] / 2).exp(), (y - gp.prior_mean).unsqueeze(-1),
                                gp.noise.detach() * theta[1].exp())
    (grad,) = torch.autograd.grad(nll / y.numel(), theta)
    assert float(grad.abs().max()) < 1e-6
    plain = RandomFeatureGP(copy.deepcopy(gp.kernel), noise=gp.noise.detach().clone(),
                            prior_mean=gp.prior_mean).fit(x, y)
    fitted = gp._state
    torch.testing.assert_close(gp.predict(x[:20]), plain.predict(x[:20]), rtol=1e-8, atol=1e-10)
    assert gp._state is fitted


def test_reused_products_of_the_wrong_shape_are_refused():
    # The fit's internal reuse hook checks what it is given instead of fitting a wrong model.
    x, y = _sine_data(200, 11)
    gp = RandomFeatureGP(make_ard_kernel(32, x.shape[1], seed=0), noise=0.1)
    width = 64  # real features of 32 random Fourier features
    with pytest.raises(ValueError, match="products must be"):
        gp._fit_batches([(x, y, None)], None,
                        reuse=(torch.eye(width - 2, dtype=DT), torch.zeros(width, 1, dtype=DT)))
    with pytest.raises(ValueError, match="products must be"):
        gp._fit_batches([(x, y, None)], None,
                        reuse=(torch.eye(width, dtype=DT), torch.zeros(width, 2, dtype=DT)))
    assert not gp.is_fitted


# ---------------------------------------------------------------- the lengthscale factor
def test_the_scale_search_walks_to_the_grid_point_nearest_the_minimum():
    from rfgp.recipes._scale import SCALE_STEP, scale_search

    def walk(optimum):
        calls = []

        def evaluate(c):
            calls.append(c)
            return math.log(c / optimum) ** 2, c

        return evaluate, calls

    grid = [SCALE_STEP**k for k in range(-6, 7)]
    for optimum in (0.3, 0.55, 0.9, 1.0, 1.3, 2.6):
        evaluate, calls = walk(optimum)
        factor, model, losses = scale_search(evaluate, math.log(1 / optimum) ** 2, 1.0)
        nearest = min(grid, key=lambda c: abs(math.log(c / optimum)))
        assert factor == pytest.approx(nearest, rel=1e-12) and model == factor
        # every factor tried is in the record, and the walk went one way from 1 at a time
        assert set(losses) == {1.0, *calls}
        assert len(calls) <= 2 + abs(round(math.log(nearest) / math.log(SCALE_STEP)))
    # a bound on the factor stops the upward walk; a NaN loss never counts as better
    evaluate, calls = walk(3.0)
    assert scale_search(evaluate, math.log(1 / 3.0) ** 2, 1.0, largest=1.3)[0] == pytest.approx(
        1 / SCALE_STEP)
    factor, _, _ = scale_search(lambda c: (math.nan, c), 1.0, 1.0)
    assert factor == 1.0
    # the schedule's count of evaluations caps the walk; a gain within the margin is no gain
    evaluate, calls = walk(0.3)
    factor, _, losses = scale_search(evaluate, math.log(1 / 0.3) ** 2, 1.0, evaluations=2)
    assert calls == [SCALE_STEP, SCALE_STEP**2] and factor == pytest.approx(SCALE_STEP**2)
    evaluate, calls = walk(0.3)
    assert scale_search(evaluate, math.log(1 / 0.3) ** 2, 1.0, evaluations=0)[0] == 1.0
    assert calls == []
    gain = math.log(1 / 0.3) ** 2 - math.log(SCALE_STEP / 0.3) ** 2
    evaluate, calls = walk(0.3)
    assert scale_search(evaluate, math.log(1 / 0.3) ** 2, 1.0, margin=1.01 * gain)[0] == 1.0


def test_the_final_model_walks_down_the_lengthscale_factor_while_its_evidence_rises():
    # sin(25 x) with noise 0.01: a search of 16 features on half the rows cannot follow it and
    # calls most of it noise at a long lengthscale; the final 256-feature model's lengthscales
    # are the search's times a factor c = SCALE_STEP^k < 1.
    # Rebuilt independently at c * SCALE_STEP and c / SCALE_STEP and calibrated (outputscale
    # and noise by their own evidence), neither model has an evidence larger by SCALE_EVIDENCE.
    from rfgp.inference import calibrate_scales
    from rfgp.recipes._scale import SCALE_EVIDENCE, SCALE_STEP

    x, y = _sine_data(600, 12, frequency=25.0, noise=0.01)
    report = FitReport()
    gp = fit_auto(x, y, num_features=256, search_features=16, subsample=300, exact_rows=100,
                  seed=0, report=report, lengthscale_draws=0, local_search=False)
    factor = report.calibration["lengthscale_factor"]
    record = report.calibration["factor_evidence"]
    assert factor < 1.0
    assert factor in record and record[factor] == min(record.values())
    kernel = gp.kernel
    base = kernel.base_kernel.lengthscale.detach().clone()
    torch.testing.assert_close(base.reshape(-1), report.lengthscale.reshape(-1))

    def loss(scale):
        trial = copy.deepcopy(kernel)
        trial.base_kernel.lengthscale = base * scale
        with torch.no_grad():
            return calibrate_scales(trial, x, y, float(gp.noise)).loss

    at = loss(1.0)
    assert at <= loss(1 / SCALE_STEP) - SCALE_EVIDENCE  # the last step taken, as a nat's gain
    if len(record) <= report.schedule.settings["refit"]["scale_evaluations"]:
        assert at <= loss(SCALE_STEP) + SCALE_EVIDENCE  # the walk stopped: no further gain
