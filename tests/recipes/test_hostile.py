"""The recipes as a hostile user calls them: inputs that require grad, reports of the wrong
kind, half-precision data, a shaped outputscale, targets at extreme scales, and the options
checked before any work."""

from __future__ import annotations

import math

import pytest
import torch

from rfgp._initial import initial_hyperparameters
from rfgp.recipes import ClassifierFitReport, FitReport, fit_auto, fit_classifier_auto
from rfgp.recipes._laplace import lengthscale_mixture_kernel
from tests.helpers import DT, gen


def _data(n=60, seed=0):
    g = gen(seed)
    x = torch.randn(n, 3, generator=g, dtype=DT)
    y = torch.sin(2 * x).sum(-1)
    return x, y - y.mean()


def test_inputs_and_targets_that_require_grad_are_used_detached():
    x, y = _data()
    plain = fit_auto(x, y, num_features=32, seed=0)
    tracked = fit_auto(x.clone().requires_grad_(True), y.clone().requires_grad_(True),
                       num_features=32, seed=0)
    torch.testing.assert_close(tracked.predict(x[:5]), plain.predict(x[:5]), rtol=0, atol=0)
    labels = (x[:, 0] > 0).long()
    clf = fit_classifier_auto(x.clone().requires_grad_(True), labels, num_features=32, seed=0)
    assert clf.predict(x[:5]).shape == (5,)


@pytest.mark.parametrize("report", [{}, FitReport, "report", ClassifierFitReport])
def test_a_report_of_the_wrong_kind_is_named(report):
    x, y = _data()
    if report is ClassifierFitReport:  # a subclass instance is a FitReport: accepted
        fit_auto(x, y, num_features=32, report=ClassifierFitReport())
        return
    with pytest.raises(TypeError, match="report must be a FitReport instance"):
        fit_auto(x, y, num_features=32, report=report)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_data_is_refused_naming_the_supported_dtypes(dtype):
    x, y = _data()
    with pytest.raises(TypeError, match="float32 or float64"):
        fit_auto(x.to(dtype), y.to(dtype), num_features=32)
    with pytest.raises(TypeError, match="float32 or float64"):
        fit_classifier_auto(x.to(dtype), (x[:, 0] > 0).long(), num_features=32)


def test_a_float32_fit_is_a_float32_model_near_the_float64_maximum():
    x, y = _data(200)
    high, low = FitReport(), FitReport()
    fit_auto(x, y, num_features=64, seed=0, lengthscale_draws=0, report=high)
    b = fit_auto(x.float(), y.float(), num_features=64, seed=0, lengthscale_draws=0,
                 report=low)
    mean32, std32 = b.predict(x[:20].float(), return_std=True)
    assert mean32.dtype == torch.float32 and bool(torch.isfinite(std32).all())
    # float32's line searches stop earlier: on this noise-free target its search ends at a
    # lower maximum of the evidence (-1.82 against -2.09 nats per datum), not elsewhere.
    assert min(low.losses["search"]) - min(high.losses["search"]) < 0.5


def test_a_mixture_outputscale_must_be_0d():
    ells = torch.ones(2, 3, dtype=DT)
    with pytest.raises(ValueError, match="outputscale must be a 0-d tensor"):
        lengthscale_mixture_kernel(16, ells, torch.ones(2, dtype=DT))


def test_initial_hyperparameters_of_huge_targets_are_finite_or_refused():
    x, y = _data()
    # 1e100: squares of 1e200 are float64 numbers; the mean square scales exactly.
    big = initial_hyperparameters(x, y * 2.0**332)
    base = initial_hyperparameters(x, y)
    assert float(big["noise"]) == pytest.approx(float(base["noise"]) * 2.0**664, rel=1e-12)
    # 1e200: the variance itself is not a float64 number.
    with pytest.raises(ValueError, match="mean square"):
        initial_hyperparameters(x, y * 1e200)


@pytest.mark.parametrize("options, error", [
    ({"time_budget": 0.0}, ValueError), ({"time_budget": float("nan")}, ValueError),
    ({"machine_rate": -1.0}, ValueError), ({"calibrate": 1}, TypeError),
    ({"progress": "yes"}, TypeError), ({"num_features": 33}, ValueError),
    ({"search_features": 2.0}, TypeError), ({"no_such_option": 1}, TypeError),
    # Counts beyond torch's int64 sizes, and a tolerance whose square overflows.
    ({"num_features": 2**64}, ValueError), ({"search_features": 2**64}, ValueError),
    ({"lengthscale_draws": 2**64}, ValueError), ({"tolerance": 1e308}, ValueError),
    ({"tolerance": 2.0}, ValueError),
])
def test_options_are_refused_by_name_before_any_work(options, error):
    x, y = _data()
    name = next(iter(options))
    with pytest.raises(error, match=name):
        fit_auto(x, y, **options)


def test_progress_shows_the_stages():
    x, y = _data()
    report = FitReport()
    fit_auto(x, y, num_features=32, progress=True, report=report)
    assert "refit" in report.seconds and report.timing().count("\n") >= 1


# --- seeds: one rule, the integers a torch.Generator takes -------------------------------


@pytest.mark.parametrize("seed, error", [
    (2**64, ValueError), (-1, ValueError), ("x", TypeError), (1.0, TypeError),
    (True, TypeError),
])
def test_every_recipe_seed_follows_one_rule(seed, error):
    from rfgp.recipes import calibrated_fit

    x, y = _data()
    rule = r"seed must be an integer in \[0, 2\*\*64 - 1\]"
    with pytest.raises(error, match=rule):
        fit_auto(x, y, num_features=32, seed=seed)
    with pytest.raises(error, match=rule):
        fit_classifier_auto(x, (x[:, 0] > 0).long(), num_features=32, seed=seed)
    kernel = lengthscale_mixture_kernel(16, torch.ones(2, 3, dtype=DT), torch.tensor(1.0, dtype=DT))
    for solve in ("weight", "cg"):
        with pytest.raises(error, match=rule):
            calibrated_fit(kernel, x, y, 1.0, solve=solve, seed=seed)
    with pytest.raises(error, match=rule):
        lengthscale_mixture_kernel(16, torch.ones(2, 3, dtype=DT), torch.tensor(1.0, dtype=DT),
                                   seed=seed)


def test_the_largest_seed_is_a_seed():
    ells = torch.ones(2, 3, dtype=DT)
    top = lengthscale_mixture_kernel(16, ells, torch.tensor(1.0, dtype=DT), seed=2**64 - 1)
    again = lengthscale_mixture_kernel(16, ells, torch.tensor(1.0, dtype=DT), seed=2**64 - 1)
    # The same draws: every random buffer agrees.
    buffers = [(name, a, b) for (name, a), b in zip(top.state_dict().items(),
                                                    again.state_dict().values())
               if isinstance(a, torch.Tensor)]
    assert buffers
    for name, a, b in buffers:
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)


# --- calibrated_fit and maximize_scale_evidence: their numbers checked ---------------------


@pytest.mark.parametrize("floor, error", [
    ("0.1", TypeError), (float("inf"), ValueError), (float("nan"), ValueError),
    (-0.1, ValueError), (None, TypeError),
])
def test_a_bad_noise_floor_is_named(floor, error):
    from rfgp.inference._calibration import feature_model_evidence, maximize_scale_evidence
    from rfgp.recipes import calibrated_fit

    x, y = _data()
    kernel = lengthscale_mixture_kernel(16, torch.ones(2, 3, dtype=DT), torch.tensor(1.0, dtype=DT))
    for solve in ("weight", "cg"):
        with pytest.raises(error, match="noise_floor must be a"):
            calibrated_fit(kernel, x, y, 1.0, solve=solve, noise_floor=floor)
    evidence = feature_model_evidence(kernel, x, y)
    with pytest.raises(error, match="noise_floor must be a"):
        maximize_scale_evidence(evidence, 1.0, noise_floor=floor)


@pytest.mark.parametrize("condition, error", [
    (-1.0, ValueError), (float("nan"), ValueError), (float("inf"), ValueError),
    ("1e-8", TypeError),
])
def test_a_bad_condition_is_named(condition, error):
    from rfgp.inference._calibration import maximize_scale_evidence, spectral_statistics

    g = gen(3)
    phi = torch.randn(50, 8, generator=g, dtype=DT)
    y = torch.randn(50, generator=g, dtype=DT)
    evidence = spectral_statistics(phi.T @ phi, phi.T @ y, float(y @ y), 50)
    with pytest.raises(error, match="condition must be a"):
        maximize_scale_evidence(evidence, 1.0, condition=condition)
    with pytest.raises(TypeError, match="evidence must be a ScaleEvidence"):
        maximize_scale_evidence((phi, y), 1.0)


def test_a_valid_condition_bounds_the_noise_from_below():
    from rfgp.inference._calibration import maximize_scale_evidence, spectral_statistics

    # y in the span of the features: without a bound the noise falls to its floor; with c the
    # noise is at least c a lambda_max (module docstring), and positive.
    g = gen(4)
    phi = torch.randn(50, 8, generator=g, dtype=DT)
    y = phi @ torch.randn(8, generator=g, dtype=DT)
    evidence = spectral_statistics(phi.T @ phi, phi.T @ y, float(y @ y), 50)
    top = float(evidence.eigenvalues.max())
    for condition in (0.0, 1e-6, 1e-3):
        factor, noise, loss = maximize_scale_evidence(evidence, 1.0, condition=condition)
        assert noise > 0 and math.isfinite(loss)
        assert noise >= condition * factor * top * (1 - 1e-12)


# --- targets without variation --------------------------------------------------------------


@pytest.mark.parametrize("columns", [1, 2])
def test_zero_targets_are_refused_naming_y_by_every_recipe_path(columns):
    from rfgp.recipes import calibrated_fit

    x, _ = _data(40)
    zeros = torch.zeros(40, columns, dtype=DT).squeeze(-1)
    message = "y must not be zero in every entry"
    with pytest.raises(ValueError, match=f"fit_auto: {message}"):
        fit_auto(x, zeros, num_features=32)
    # 16 features (weight space on 40 rows), 64 (the N x N path), and CG.
    for features, solve in ((16, "weight"), (64, "weight"), (16, "cg")):
        kernel = lengthscale_mixture_kernel(features, torch.ones(2, 3, dtype=DT),
                                            torch.tensor(1.0, dtype=DT))
        with pytest.raises(ValueError, match=f"calibrated_fit: {message}"):
            calibrated_fit(kernel, x, zeros, 1.0, solve=solve)
    # One row of zeros is refused too, not fitted with a noise of 1e-300.
    with pytest.raises(ValueError, match=message):
        fit_auto(x[:1], zeros[:1], num_features=32)


def test_one_zero_column_beside_a_varying_one_is_fitted():
    x, y = _data(40)
    both = torch.stack([y, torch.zeros_like(y)], -1)
    gp = fit_auto(x, both, num_features=32, seed=0, lengthscale_draws=0)
    mean = gp.predict(x[:5])
    # The posterior mean is linear in the targets: a zero column predicts zero.
    assert bool((mean[:, 1] == 0).all()) and bool(torch.isfinite(mean).all())


# --- the calibration at every scale of the targets and from any start ----------------------


def _calibration_problem():
    from rfgp.recipes._start import make_ard_kernel

    x, y = _data(60)
    return make_ard_kernel(32, 3, seed=0), x, y


@pytest.mark.parametrize("target_scale", [1e-150, 1e-100, 1e-20, 1e20, 1e100, 1e150])
@pytest.mark.parametrize("condition", [0.0, 1e-10])
def test_the_weight_calibration_is_equivariant_in_the_targets_scale(target_scale, condition):
    from rfgp.inference._calibration import feature_model_evidence, maximize_scale_evidence

    # Targets times s: the evidence's maximum is at s^2 times both scales, and -log p is
    # N log s larger. (A NaN Hessian at 1e-100 used to leave Newton at its start.)
    kernel, x, y = _calibration_problem()
    base = maximize_scale_evidence(feature_model_evidence(kernel, x, y), 1.0,
                                   condition=condition)
    scaled = maximize_scale_evidence(feature_model_evidence(kernel, x, y * target_scale),
                                     target_scale**2, condition=condition)
    assert scaled[0] / target_scale**2 == pytest.approx(base[0], rel=1e-6)
    assert scaled[1] / target_scale**2 == pytest.approx(base[1], rel=1e-6)
    assert scaled[2] - 60 * math.log(target_scale) == pytest.approx(base[2], abs=1e-8)


@pytest.mark.parametrize("start", [1e-300, 1e-30, 1e30, 1e300])
@pytest.mark.parametrize("condition", [0.0, 1e-10])
def test_the_weight_calibration_reaches_the_maximum_from_a_far_start(start, condition):
    from rfgp.inference._calibration import feature_model_evidence, maximize_scale_evidence

    # From a noise 1e30 times off, the clamped Newton steps used to stop short (or in the
    # condition bound's flat region) at a loss 3 to 200 times the maximum's.
    kernel, x, y = _calibration_problem()
    evidence = feature_model_evidence(kernel, x, y)
    base = maximize_scale_evidence(evidence, 1.0, condition=condition)
    far = maximize_scale_evidence(evidence, start, condition=condition)
    assert far[2] == pytest.approx(base[2], abs=1e-8)
    assert far[0] == pytest.approx(base[0], rel=1e-4) and far[1] == pytest.approx(base[1],
                                                                                  rel=1e-4)


@pytest.mark.parametrize("solve", ["weight", "cg"])
@pytest.mark.parametrize("target_scale, start", [
    (1.0, 1e-30), (1.0, 1e30), (1e150, 1e300), (1e-150, 1e-300), (1e100, 1.0),
])
def test_calibrated_fit_is_equivariant_and_indifferent_to_its_start(solve, target_scale, start):
    from rfgp.recipes import calibrated_fit

    # The kernel stays at outputscale softplus(0) while the targets are scaled: the maximum
    # is 1e300 times away from the start. The CG path is a stochastic estimate of the same
    # maximum (its noise within a percent, as the weight path's within rounding).
    kernel, x, y = _calibration_problem()
    base = calibrated_fit(kernel, x, y, 1.0, solve=solve)
    fitted = calibrated_fit(kernel, x, y * target_scale, start, solve=solve)
    tolerance = 1e-5 if solve == "weight" else 0.01
    assert float(fitted.noise) / target_scale**2 == pytest.approx(float(base.noise),
                                                                  rel=tolerance)
    assert float(fitted.kernel.outputscale.detach()) / target_scale**2 == pytest.approx(
        float(base.kernel.outputscale.detach()), rel=3 * tolerance)
    mean, std = fitted.predict(x[:5], return_std=True)
    base_mean, base_std = base.predict(x[:5], return_std=True)
    torch.testing.assert_close(mean / target_scale, base_mean, rtol=3 * tolerance, atol=0)
    torch.testing.assert_close(std / target_scale, base_std, rtol=3 * tolerance, atol=0)
