"""The recipes as a hostile user calls them: inputs that require grad, reports of the wrong
kind, half-precision data, a shaped outputscale, targets at extreme scales, and the options
checked before any work."""

from __future__ import annotations

import pytest
import torch

from rfgp.recipes import ClassifierFitReport, FitReport, fit_auto, fit_classifier_auto
from rfgp.recipes._laplace import lengthscale_mixture_kernel
from rfgp.recipes._start import initial_hyperparameters
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
