"""The recipe's answer does not depend on the units of the inputs or the targets.

``fit_auto`` searches on inputs and targets divided by powers of two near their spreads and
scales the result back. Two consequences are tested: scaling the data by powers of two scales
every result exactly (the search sees the same bits), and scaling it by other factors, as
large as 1e10 or as small as 1e-10, still reaches the same evidence maximum (L-BFGS on raw
parameters is not scale-free, so before the working units a search on inputs 1e10 times larger
stopped at its start). Inputs and targets near the ends of float64's range (1e+-200) work too.
"""

from __future__ import annotations

import math

import pytest
import torch

from rfgp._units import column_scale, column_unit
from rfgp.recipes import FitReport, fit_auto
from rfgp.recipes._search import bounded_lengthscale
from rfgp.recipes._start import make_ard_kernel
from tests.helpers import DT, gen


def _data(n=120, idle=False, seed=0):
    g = gen(seed)
    x = torch.randn(n, 2, generator=g, dtype=DT)
    signal = torch.sin(2.0 * x[:, 0]) + (0.0 if idle else 0.5 * torch.cos(1.5 * x[:, 1]))
    y = signal + 0.05 * torch.randn(n, generator=g, dtype=DT)
    return x, y - y.mean(), torch.randn(15, 2, generator=g, dtype=DT)


def _fit(x, y, **options):
    report = FitReport()
    gp = fit_auto(x, y, num_features=256, seed=0, report=report, **options)
    return gp, report


def test_powers_of_two_scale_every_result_exactly():
    # The second input carries nothing: the bound and its cross-validation take part, so the
    # bound and the held-out scores are scaled back too.
    x, y, xq = _data(idle=True)
    gp, report = _fit(x, y)
    assert report.cv_scores, "the bound was not weighed: the test would miss its scaling"
    c = torch.tensor([2.0**40, 2.0**-30], dtype=DT)
    v = 2.0**20
    gp_s, report_s = _fit(x * c, y * v)
    mean, std = gp.predict(xq, return_std=True)
    mean_s, std_s = gp_s.predict(xq * c, return_std=True)
    # The search is the same bit for bit; the final solve runs in the data's own units, so
    # the predictions agree to its rounding.
    torch.testing.assert_close(mean_s, mean * v, rtol=1e-10, atol=0)
    # The predictive variance is a difference (prior less what the data explain): its last
    # bits differ in the final solve of the data's own units.
    torch.testing.assert_close(std_s, std * v, rtol=1e-9, atol=0)
    torch.testing.assert_close(report_s.lengthscale, report.lengthscale * c, rtol=1e-12, atol=0)
    torch.testing.assert_close(report_s.lengthscale_draws, report.lengthscale_draws * c,
                               rtol=1e-12, atol=0)
    torch.testing.assert_close(report_s.initial["lengthscale"], report.initial["lengthscale"] * c,
                               rtol=1e-12, atol=0)
    assert float(gp_s.noise) == pytest.approx(float(gp.noise) * v**2, rel=1e-12)
    # A log density per datum of y * v is that of y less log v.
    for key in ("unbounded", "bounded"):
        assert report_s.cv_scores[key] == pytest.approx(
            report.cv_scores[key] - math.log(v), abs=1e-9)
    assert report_s.losses["search"][-1] == pytest.approx(
        report.losses["search"][-1] + math.log(v), abs=1e-9)
    if report.lengthscale_bound is not None:
        torch.testing.assert_close(report_s.lengthscale_bound, report.lengthscale_bound * c,
                                   rtol=1e-12, atol=0)


@pytest.mark.parametrize("c, v", [((1e10, 1e-10), 1e6), ((1e3, 7.0), 1e-8),
                                  ((1e-10, 3e-4), 1.0)])
def test_other_units_reach_the_same_evidence_maximum(c, v):
    # Every input matters: the evidence has one maximum, which a converged search finds from
    # any units. The gradient tolerance is 1e-4 per datum, so the lengthscales agree to well
    # under a percent and the predictions to a small share of the noise (0.05).
    x, y, xq = _data()
    c = torch.tensor(c, dtype=DT)
    gp, report = _fit(x, y, lengthscale_draws=0)
    gp_s, report_s = _fit(x * c, y * v, lengthscale_draws=0)
    assert report_s.converged["search"]
    torch.testing.assert_close(report_s.lengthscale / c, report.lengthscale, rtol=0.01, atol=0)
    assert float(gp_s.noise) / v**2 == pytest.approx(float(gp.noise), rel=0.02)
    mean, std = gp.predict(xq, return_std=True)
    mean_s, std_s = gp_s.predict(xq * c, return_std=True)
    torch.testing.assert_close(mean_s / v, mean, rtol=0, atol=5e-3)
    torch.testing.assert_close(std_s / v, std, rtol=0.02, atol=0)


@pytest.mark.parametrize("scale", [1e-200, 1e200])
def test_inputs_near_the_ends_of_float64_fit(scale):
    # Squares of these values overflow or underflow: the column spreads and the lengthscale
    # bound are computed without them.
    x, y, xq = _data()
    torch.testing.assert_close(column_scale(x * scale), column_scale(x) * scale, rtol=1e-12,
                               atol=0)
    gp, _ = _fit(x, y, lengthscale_draws=0)
    gp_s, report_s = _fit(x * scale, y, lengthscale_draws=0)
    assert torch.isfinite(report_s.lengthscale).all() and bool(report_s.lengthscale.gt(0).all())
    mean, std = gp.predict(xq, return_std=True)
    mean_s, std_s = gp_s.predict(xq * scale, return_std=True)
    torch.testing.assert_close(mean_s, mean, rtol=0, atol=5e-3)
    torch.testing.assert_close(std_s, std, rtol=0.02, atol=0)
    # With an idle input the bound binds (kept without cross-validation): 4 standard
    # deviations of each column.
    x, y, _ = _data(idle=True)
    _, report_s = _fit(x * scale, y, cv_folds=0)
    assert report_s.lengthscale_bound is not None
    torch.testing.assert_close(report_s.lengthscale_bound, 4.0 * column_scale(x * scale),
                               rtol=1e-12, atol=0)


@pytest.mark.parametrize("scale, dtype", [(1e-200, DT), (1e200, DT), (1e25, torch.float32),
                                          (1e-25, torch.float32)])
def test_targets_whose_variance_is_not_representable_are_named(scale, dtype):
    # The outputscale and the noise are variances in the targets' units: at these scales they
    # overflow or vanish in the dtype, and the error says so instead of failing in the fit.
    x, y, _ = _data()
    with pytest.raises(ValueError, match=r"y: the targets' root mean square.*rescale the targets"):
        fit_auto(x.to(dtype), (y * scale).to(dtype), num_features=64)


def test_targets_at_large_but_representable_scales_fit():
    x, y, xq = _data()
    gp, _ = _fit(x, y, lengthscale_draws=0)
    gp_s, _ = _fit(x, y * 1e120, lengthscale_draws=0)
    mean, std = gp.predict(xq, return_std=True)
    mean_s, std_s = gp_s.predict(xq, return_std=True)
    torch.testing.assert_close(mean_s / 1e120, mean, rtol=0, atol=5e-3)
    torch.testing.assert_close(std_s / 1e120, std, rtol=0.02, atol=0)


@pytest.mark.parametrize("upper", [1e-60, 1e60])
def test_lengthscale_bounds_outside_float32_range_hold(upper):
    # The bound must not pass through torch's default dtype (float32), where these values are
    # 0 or infinite.
    kernel = make_ard_kernel(16, 2, seed=0)
    bound = torch.tensor([upper, 2 * upper], dtype=DT)
    kernel.base_kernel.lengthscale = bound * 5
    with bounded_lengthscale(kernel, bound):
        inside = kernel.base_kernel.lengthscale.detach().reshape(-1)
        torch.testing.assert_close(inside, 0.9 * bound, rtol=1e-12, atol=0)
        kernel.base_kernel.raw_lengthscale.data.fill_(40.0)
        top = kernel.base_kernel.lengthscale.detach().reshape(-1)
        assert bool((top <= bound).all()) and bool((top > 0.999 * bound).all())


# ----------------------------------------------------------------------------- the classifier
def _labels(n=200, seed=0):
    g = gen(seed)
    x = torch.randn(n, 2, generator=g, dtype=DT)
    f = torch.sin(2 * x[:, 0]) + torch.cos(1.5 * x[:, 1])
    labels = (f + 0.3 * torch.randn(n, generator=g, dtype=DT) > 0.3).long()
    return x, labels, torch.randn(15, 2, generator=g, dtype=DT)


def _classifier(x, labels):
    from rfgp.recipes import ClassifierFitReport, fit_classifier_auto

    report = ClassifierFitReport()
    model = fit_classifier_auto(x, labels, num_features=256, seed=0, report=report)
    return model, report


def test_classifier_recipe_at_powers_of_two_is_the_same_fit():
    x, labels, xq = _labels()
    model, report = _classifier(x, labels)
    c = torch.tensor([2.0**-40, 2.0**30], dtype=DT)
    model_s, report_s = _classifier(x * c, labels)
    torch.testing.assert_close(report_s.lengthscale, report.lengthscale * c, rtol=1e-12, atol=0)
    torch.testing.assert_close(model_s.predict_proba(xq * c), model.predict_proba(xq),
                               rtol=0, atol=1e-10)


@pytest.mark.parametrize("c", [(1e10, 1e10), (1e-10, 1e3)])
def test_classifier_recipe_reaches_the_same_maximum_in_other_units(c):
    # Both inputs matter: one evidence maximum, found from any units (before the working
    # units, inputs 1e10 times larger stopped the search after a few iterations at its start).
    x, labels, xq = _labels()
    c = torch.tensor(c, dtype=DT)
    model, report = _classifier(x, labels)
    model_s, report_s = _classifier(x * c, labels)
    assert report_s.converged["search"]
    torch.testing.assert_close(report_s.lengthscale / c, report.lengthscale, rtol=0.01, atol=0)
    torch.testing.assert_close(model_s.predict_proba(xq * c), model.predict_proba(xq),
                               rtol=0, atol=2e-3)


def test_column_unit_is_the_power_of_two_nearest_each_spread():
    # Spreads 3 * 2^10 (log2 = 11.58: 2^12), 2^-7 exactly, and a constant column (unit 1).
    g = gen(3)
    z = torch.randn(500, 1, generator=g, dtype=DT)
    z = (z - z.mean()) / z.std()
    x = torch.cat([z * 3 * 2.0**10, z * 2.0**-7, torch.full_like(z, 5.0)], 1)
    torch.testing.assert_close(column_unit(x), torch.tensor([2.0**12, 2.0**-7, 1.0], dtype=DT),
                               rtol=0, atol=0)
