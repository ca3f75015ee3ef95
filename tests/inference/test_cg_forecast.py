"""The CG path's forecast from a smaller model's spectrum: the extended spectrum, the sketch's
residual, the forecast's cost and the recipe's use of it."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from rfgp.inference._calibrated_fit import ScaleCalibration
from rfgp.inference._cg_cost import CG_ITERATIONS, SKETCH_RANK, iterative_fit_cost
from rfgp.inference._cg_forecast import (
    FORECAST_RANKS,
    CGForecast,
    cg_iterations_on,
    forecast_cg,
    preconditioned_spectrum,
    sketch_residual,
    spectrum_at,
)
from rfgp.recipes import FitReport, fit_auto
from tests.helpers import DT, gen

INDEX = torch.arange(1, 2049, dtype=DT)


@pytest.mark.parametrize("power", [0.5, 1.0, 2.5])
def test_a_power_law_spectrum_is_continued_exactly(power):
    lam = INDEX ** -power
    mu = spectrum_at(lam.flip(0), 3.0, 8192)  # any order in
    full = 3.0 * torch.arange(1, 8193, dtype=DT) ** -power
    assert mu.shape == (8192,)
    torch.testing.assert_close(mu, full, rtol=1e-9, atol=0)


def test_the_spectrum_is_cut_where_it_ends_and_truncated_to_the_width():
    lam = torch.zeros(2048, dtype=DT)
    lam[:100] = torch.linspace(10.0, 1.0, 100, dtype=DT)
    mu = spectrum_at(lam, 1.0, 4096)
    assert float(mu[100:].abs().max()) == 0.0 and float(mu[0]) == 10.0
    assert spectrum_at(lam, 1.0, 64).shape == (64,)


def test_the_sketch_residual_vanishes_on_a_spectrum_the_rank_holds_and_never_grows_with_it():
    mu = torch.zeros(1000, dtype=DT)
    mu[:30] = 1e6
    assert sketch_residual(mu, 32) == 0.0  # 30 <= r - 2: k = 30 leaves nothing
    slow = 1e4 / INDEX
    residuals = [sketch_residual(slow, r) for r in (64, 128, 256, 512, 1024)]
    assert all(b <= a for a, b in zip(residuals, residuals[1:]))
    # Bounded by the first eigenvalue beyond the rank's oversampling and the whole tail:
    # k = r / 2 is one candidate of the minimum.
    r, k = 512, 256
    assert residuals[3] <= float(slow[k] + slow[k:].sum() / (r - k)) + 1e-9


def test_the_forecast_is_the_cost_models_at_its_own_iterations_and_rank():
    lam = 1e3 / INDEX**2
    f = forecast_cg(lam, 0.5, 20000, 8192, 8)
    assert isinstance(f, CGForecast) and f.rank in FORECAST_RANKS and f.num_features == 8192
    shaped = preconditioned_spectrum(spectrum_at(lam, 0.5, 8192), f.rank)
    assert f.condition == pytest.approx(float(1 / shaped.min()))
    assert f.multiply_adds == pytest.approx(iterative_fit_cost(
        20000, 8192, 8, iterations=f.iterations, rank=f.rank))
    # At the constants the cost model is unchanged.
    assert iterative_fit_cost(20000, 8192, 8) == iterative_fit_cost(
        20000, 8192, 8, iterations=CG_ITERATIONS, rank=SKETCH_RANK)


def test_the_preconditioned_spectrum_holds_k_at_one_and_scales_the_rest():
    mu = 1e4 / INDEX**1.5
    shaped = preconditioned_spectrum(mu, 512)
    held = int((shaped == 1.0).sum())
    residual = sketch_residual(mu, 512)
    assert 0 < held < 512 and float(shaped.max()) == 1.0
    torch.testing.assert_close(shaped[held + 5:], (1 + mu[held + 5:]) / (1 + residual))


@pytest.mark.parametrize("spread", [10.0, 100.0])
def test_cg_on_the_clustered_spectrum_takes_the_iterations_of_cg_on_the_whole_one(spread):
    # CG on diag(values) with b = 1, run in full: the clustered run must stop within a few
    # iterations of it (the clusters' widths are 1/256 of the log range), at the condition
    # numbers (up to about 400) the forecasts meet; beyond 10^3 finite-precision CG on the
    # whole spectrum takes up to a third more iterations than on the clusters.
    values = torch.logspace(0, -math.log10(spread), 20000, dtype=DT) ** 1.3
    b = torch.ones_like(values)
    x, r = torch.zeros_like(b), b.clone()
    p, rr, full = r.clone(), float(r @ r), None
    for it in range(1, 5000):
        ap = values * p
        alpha = rr / float(p @ ap)
        x, r = x + alpha * p, r - alpha * ap
        new = float(r @ r)
        if math.sqrt(new) <= 1e-8 * math.sqrt(float(b @ b)):
            full = it
            break
        p, rr = r + new / rr * p, new
    clustered = cg_iterations_on(values, 1e-8)
    assert full is not None and abs(clustered - full) <= max(3, 0.15 * full)
    # And more spread takes more iterations than the bound's floor.
    assert clustered >= 1


def test_less_noise_forecasts_more_iterations_and_more_cost():
    lam = 1e3 / INDEX**1.5
    noisy, clean = (forecast_cg(lam, c, 20000, 8192, 8) for c in (1.0, 1e4))
    assert clean.condition > noisy.condition
    assert clean.multiply_adds > noisy.multiply_adds


def _recipe_data(planned, spectrum_decay, noise, solve="cg", path="cg"):
    lam = 1e4 * INDEX ** -spectrum_decay
    choice = ScaleCalibration("weight", 1.0, noise, spectrum=lam)
    data = SimpleNamespace(schedule=SimpleNamespace(num_features=planned, settings={},
                                                    final_solve=path),
                           options=SimpleNamespace(num_features=None, solve=solve),
                           num_rows=20000, input_dim=8, source=None)
    return data, choice


def test_the_recipe_lowers_the_planned_features_only_where_the_forecast_costs_more():
    from rfgp.recipes._final_cost import forecast_final, variance_cost

    def with_variances(size):
        # the fit's forecast and its first variances' on the same spectrum
        fit = forecast_cg(choice.spectrum, 1.0, 20000, size, 8)
        held = spectrum_at(choice.spectrum, 1.0, size)[:fit.rank]
        return fit.multiply_adds + variance_cost(20000, size, "cg", held)

    # A slowly decaying spectrum and little noise: many iterations, so fewer features.
    data, choice = _recipe_data(16384, 1.0, 1.0)
    lowered = forecast_final(data, choice, 1)[0]
    assert lowered.num_features < 16384
    booked = iterative_fit_cost(20000, 16384, 8) + variance_cost(20000, 16384, "cg")
    assert with_variances(lowered.num_features) <= booked
    # The next size of the grid would not have fitted.
    assert with_variances(lowered.num_features + 1024) > booked
    # A fast decay and much noise: fewer iterations than the constant, D never raised on the
    # CG path (the forecast's costs there are not sure enough to spend to the last second).
    data, choice = _recipe_data(16384, 2.0, 10.0)
    kept = forecast_final(data, choice, 1)[0]
    assert kept.num_features == 16384 and kept.iterations < CG_ITERATIONS
    data.schedule.settings["refit"] = {"share": 4 * booked}
    assert forecast_final(data, choice, 1)[0].num_features == 16384
    # A given D, or no spectrum (function space): no forecast.
    data.options.num_features = 16384
    assert forecast_final(data, choice, 1)[0] is None


def test_the_forecast_weighs_the_weight_space_where_the_cg_routes_are_dear():
    # Under solve="auto" a size the D x D solve allows costs its cheaper path: where the
    # forecast makes CG dear (many iterations), the planned CG model is lowered to the weight
    # space's largest affordable D, never below the CG-only answer (each size's cost can
    # only fall), within the same booking.
    from rfgp.inference import final_path
    from rfgp.inference._fit_cost import MAX_WEIGHT_FEATURES
    from rfgp.recipes._final_cost import forecast_final

    data, choice = _recipe_data(16384, 1.0, 0.01)
    cg_only = forecast_final(data, choice, 1)[0]
    data, choice = _recipe_data(16384, 1.0, 0.01, solve="auto")
    forecast, route = forecast_final(data, choice, 1)
    weight = route == "weight"
    assert weight and forecast.num_features <= MAX_WEIGHT_FEATURES
    assert forecast.num_features >= cg_only.num_features
    path, cost = final_path(20000, forecast.num_features, 8, "auto")
    assert path == "weight"
    assert cost <= iterative_fit_cost(20000, 16384, 8) + variance_cost_of(20000, 16384)
    # a noisy, fast-decaying spectrum keeps the planned CG model
    data, choice = _recipe_data(16384, 2.0, 10.0, solve="auto")
    forecast, route = forecast_final(data, choice, 1)
    weight = route == "weight"
    assert not weight and forecast.num_features == 16384


def test_a_weight_space_plan_takes_cg_at_its_features_where_the_forecast_converges_fast():
    # Little signal in much noise: CG converges in a few iterations, so the D x D solve
    # (N D^2 whatever the spectrum) costs more than CG at the same D; the seconds the plan
    # paid for its D in weight space then buy the largest D whose CG fit costs them.
    from rfgp.inference import final_path
    from rfgp.recipes._final_cost import cg_route_costs, forecast_final

    data, choice = _recipe_data(8192, 2.0, 1e4, solve="auto", path="weight")
    forecast, route = forecast_final(data, choice, 1)
    assert route in ("features", "rows") and forecast.num_features >= 8192
    assert forecast.iterations < CG_ITERATIONS
    by_weight = final_path(20000, 8192, 8, "auto")[1]
    scale = choice.factor / choice.noise
    assert min(cg_route_costs(20000, forecast.num_features, 8, 1, False, forecast,
                              choice.spectrum, scale)) <= by_weight
    at_plan = forecast_cg(choice.spectrum, scale, 20000, 8192, 8)
    assert min(cg_route_costs(20000, 8192, 8, 1, False, at_plan, choice.spectrum,
                              scale)) < by_weight

    def cheapest(size):  # either CG route on the forecast at that size
        fit = forecast_cg(choice.spectrum, scale, 20000, size, 8)
        return min(cg_route_costs(20000, size, 8, 1, False, fit, choice.spectrum, scale))

    # The final fit's share of the budget buys the largest D whose forecast cost fits it.
    from rfgp.inference import MAX_ITERATIVE_FEATURES

    for share in (1.2 * by_weight, 3 * by_weight):
        data.schedule.settings["refit"] = {"share": share}
        raised, route = forecast_final(data, choice, 1)
        assert route in ("features", "rows") and raised.num_features > 8192
        assert cheapest(raised.num_features) <= share
        assert (raised.num_features == MAX_ITERATIVE_FEATURES
                or cheapest(raised.num_features + 1024) > share)
    assert raised.num_features == MAX_ITERATIVE_FEATURES  # the larger share: the grid's top
    # Where more features cannot move the posterior (the caller's signal test), the plan's D.
    kept, route = forecast_final(data, choice, 1, grow=False)
    assert route in ("features", "rows") and kept.num_features == 8192
    # A slowly decaying spectrum and little noise: many iterations, the weight space kept
    # at the plan's D (it was paid for).
    data, choice = _recipe_data(8192, 1.0, 0.01, solve="auto", path="weight")
    forecast, route = forecast_final(data, choice, 1)
    assert route == "weight" and forecast.num_features == 8192
    # solve="weight" never takes CG, and a given D or no spectrum keeps the weight space.
    data, choice = _recipe_data(8192, 2.0, 1e4, solve="weight", path="weight")
    assert forecast_final(data, choice, 1)[1] == "weight"
    data, choice = _recipe_data(8192, 2.0, 1e4, solve="auto", path="weight")
    data.options.num_features = 8192
    assert forecast_final(data, choice, 1) == (None, "weight")


def test_fit_auto_fits_a_weight_space_plan_by_cg_where_the_forecast_says_so(monkeypatch):
    # The same D and lengthscales by either path: the CG fit's calibrated noise is the
    # weight-space fit's to the Krylov estimate's accuracy (its evidence's curvature here is
    # N / 2 per unit log-noise squared, so a few percent), and so are its predictions.
    import rfgp.recipes._refit as refit

    real = refit.forecast_final
    seen = []

    def by_cg(data, choice, candidates, grow=True):
        forecast, route = real(data, choice, candidates, grow)
        seen.append((data.schedule.final_solve, route))
        planned = data.schedule.num_features
        return CGForecast(planned, 512, 10.0, 2.0, 1.0), "features"

    g = gen(5)
    x = torch.rand(2500, 2, generator=g, dtype=DT)
    y = torch.sin(6 * x[:, 0]) * torch.cos(3 * x[:, 1]) + 0.1 * torch.randn(2500, generator=g,
                                                                             dtype=DT)
    y = y - y.mean()
    options = dict(seed=0, local_search=False, lengthscale_draws=0, cv_folds=0, subsample=1000,
                   time_budget=12.0, anytime=False)
    weight_report = FitReport()
    weight_gp = fit_auto(x, y, report=weight_report, solve="weight", **options)
    assert weight_report.schedule.final_solve == "weight"
    assert weight_report.num_features > 2048  # compared at fewer features: weighed
    monkeypatch.setattr(refit, "forecast_final", by_cg)
    report = FitReport()
    gp = fit_auto(x, y, report=report, **options)
    assert seen and seen[0][0] == "weight"
    assert report.schedule.final_solve == "cg"
    assert report.num_features == weight_report.num_features
    assert report.calibration["iterative"]["route"] == "features"
    assert abs(math.log(float(gp.noise) / float(weight_gp.noise))) < 0.05
    xt = torch.rand(200, 2, generator=g, dtype=DT)
    with torch.no_grad():
        gap = (gp.predict(xt) - weight_gp.predict(xt)).abs().max()
    assert float(gap) < 0.05 * float(weight_gp.noise) ** 0.5


def variance_cost_of(rows, features):
    from rfgp.recipes._final_cost import variance_cost

    return variance_cost(rows, features, "cg")


def test_fit_auto_fits_the_features_the_forecast_leaves(monkeypatch):
    import rfgp.recipes._refit as refit

    def lowered(data, choice, candidates, grow=True):
        return CGForecast(512, 512, 10.0, 2.0, 1.0), "features"

    monkeypatch.setattr(refit, "forecast_final", lowered)
    g = gen(3)
    x = torch.rand(1200, 2, generator=g, dtype=DT)
    y = torch.sin(6 * x[:, 0]) + 0.05 * torch.randn(1200, generator=g, dtype=DT)
    report = FitReport()
    gp = fit_auto(x, y - y.mean(), solve="cg", seed=0, local_search=False, lengthscale_draws=0,
                  cv_folds=0, report=report)
    assert report.schedule.final_solve == "cg"
    assert report.num_features == 512 and report.schedule.num_features == 512
    assert report.calibration["iterative"]["forecast"]["features"] == 512
    assert gp.kernel(x[:2]).to_dense().shape == (2, 2)
    assert report.calibration["iterative"]["forecast"]["planned_features"] > 512
    assert math.isfinite(float(gp.noise))
