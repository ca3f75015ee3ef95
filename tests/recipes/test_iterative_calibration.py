"""Calibration beyond the D x D path (the Krylov calibration, which calibrate_scales' "cg" path
and so fit_auto and calibrated_fit use): the scales from products alone are the maximum of the
same evidence that the weight-space calibration maximises exactly. Its own tests are in
tests/inference/test_krylov_calibration.py; these are the root search's, which it replaced."""

from __future__ import annotations

import math

import pytest
import torch

from rfgp.inference._calibration import feature_model_evidence
from rfgp.inference._krylov_features import calibrate_by_krylov
from rfgp.recipes import FitReport, RegressionOptions, fit_auto
from rfgp.recipes._start import make_ard_kernel
from tests.helpers import DT, gen


def _problem(n=3000, d=3, width=512, seed=0, columns=1):
    g = gen(seed)
    x = torch.rand(n, d, generator=g, dtype=DT)
    f = torch.sin(6 * x[:, 0]) + x[:, 1] ** 2
    y = torch.stack([f * (1 + t) + 0.1 * torch.randn(n, generator=g, dtype=DT)
                     for t in range(columns)], -1)
    y = (y - y.mean(0)).squeeze(-1)
    kernel = make_ard_kernel(width, d, seed=seed)
    kernel.base_kernel.lengthscale = torch.tensor([[0.3, 0.5, 1.0]], dtype=DT)
    return kernel, x, y


def _exact_profile(evidence, log_c):
    """The profile's value -log p / (N T) and its derivative in log c, from the exact
    eigendecomposition (module docstring of rfgp.inference._krylov_calibration)."""
    lam, proj = evidence.eigenvalues, evidence.projections
    n, t = evidence.num_data, evidence.num_columns
    c = math.exp(log_c)
    quad = evidence.target_squares - c * float((proj / (1 + c * lam)).sum())
    trace = float((1 / (1 + c * lam)).sum())
    norm = float((proj / (1 + c * lam) ** 2).sum())
    slope = t * (lam.numel() - trace) - n * t * c * norm / quad
    value = 0.5 * (n * t + t * float(torch.log1p(c * lam).sum())
                   + n * t * (math.log(quad / (n * t)) + math.log(2 * math.pi)))
    return value / (n * t), slope / (n * t)


@pytest.mark.parametrize("columns", [1, 2])
def test_the_scales_are_a_root_of_the_exact_profile_within_its_standard_error(columns):
    kernel, x, y = _problem(columns=columns)
    exact = feature_model_evidence(kernel, x, y)
    out = calibrate_by_krylov(kernel, x, y, 0.05, generator=gen(1))
    log_c = math.log(out.factor / out.noise)
    value, slope = _exact_profile(exact, log_c)
    # The returned point is the root of the projection's estimated slope: the estimate is off
    # by its standard error (the bisection's width is far below it).
    assert abs(slope) <= 4 * out.gradient_standard_error
    # The noise is the profile's sigma^2(c), and the evidence the exact one at that point.
    assert out.log_evidence == pytest.approx(-value, abs=4 * out.standard_error + 1e-9)
    assert out.gradient_standard_error > 0 and out.standard_error > 0


def test_the_scales_agree_with_the_weight_space_maximum():
    from rfgp.inference._calibration import maximize_scale_evidence

    kernel, x, y = _problem(seed=2)
    exact = feature_model_evidence(kernel, x, y)
    factor, noise, loss = maximize_scale_evidence(exact, 0.05)
    out = calibrate_by_krylov(kernel, x, y, 0.05, generator=gen(3))
    # The evidence is flat along the factor; at the two points it agrees to the estimate's
    # error, and the noise (the better determined scale) to a percent.
    assert out.noise == pytest.approx(noise, rel=0.01)
    assert -out.log_evidence == pytest.approx(loss / y.numel(), abs=4 * out.standard_error
                                              + 1e-4)


@pytest.mark.parametrize("rank", [None, 32])
def test_a_start_far_from_the_root_grows_the_preconditioner(rank):
    # Started at a noise 10^4 times the root's, the runs move c towards the root, and a
    # sketch sized at the start would leave the root's condition number near 1 + c lambda_r.
    # The automatic rank grows from the condition each run met and promises at the next (the
    # fixed rank 32 cannot): the preconditioner handed to the fit keeps B's condition near
    # the target.
    from rfgp.inference._calibration import maximize_scale_evidence
    from rfgp.inference._nystrom import RANK_STOP_EIGENVALUE

    kernel, x, y = _problem(seed=2)
    exact = feature_model_evidence(kernel, x, y)
    _, noise, _ = maximize_scale_evidence(exact, 100.0)
    out = calibrate_by_krylov(kernel, x, y, 100.0, rank=rank, generator=gen(3))
    assert out.noise == pytest.approx(noise, rel=0.01)
    c = out.factor / out.noise
    with torch.no_grad():
        phi = kernel.base_kernel.features(x) * kernel.outputscale.sqrt()
    b = c * phi.T @ phi + torch.eye(phi.shape[1], dtype=DT)
    root = out.preconditioner.inverse_sqrt(torch.eye(phi.shape[1], dtype=DT))
    spectrum = torch.linalg.eigvalsh(root @ b @ root)
    condition = float(spectrum[-1] / spectrum[0])
    if rank is None:
        # Refinement stops once a solve meets at most 1 + 2 x the stop eigenvalue; the Ritz
        # values it measures by are a lower bound, close after the handful of iterations.
        assert condition <= 1.5 * (1 + 2 * RANK_STOP_EIGENVALUE)
    else:
        assert out.rank == 32 and condition > 1 + 2 * RANK_STOP_EIGENVALUE


def test_the_condition_bound_caps_the_ratio():
    kernel, x, _ = _problem()
    # A target the features fit exactly drives the noise down without bound.
    with torch.no_grad():
        y = kernel.base_kernel.features(x) @ torch.randn(512, generator=gen(4), dtype=DT)
    y = y - y.mean()
    gram = feature_model_evidence(kernel, x, y)
    top = float(gram.eigenvalues.max())
    out = calibrate_by_krylov(kernel, x, y, 1.0, condition=1e-8, generator=gen(5))
    # The sketch's top eigenvalue is at most the true one, so the bound holds up to it.
    assert out.factor / out.noise <= 1.0 / (1e-8 * top) * 1.05


def test_fit_auto_on_the_iterative_path_is_the_weight_space_model():
    g = gen(6)
    x = torch.rand(1500, 2, generator=g, dtype=DT)
    y = torch.sin(6 * x[:, 0]) + 0.1 * torch.randn(1500, generator=g, dtype=DT)
    y = y - y.mean()
    options = dict(num_features=512, seed=0, local_search=False, lengthscale_draws=0,
                   cv_folds=0)
    weight_report, cg_report = FitReport(), FitReport()
    weight = fit_auto(x, y, solve="weight", report=weight_report, **options)
    cg = fit_auto(x, y, solve="cg", report=cg_report, **options)
    assert weight.solve_used != "cg" and cg.solve_used == "cg"
    assert cg_report.schedule.final_solve == "cg"
    assert cg_report.calibration["iterative"]["choice_features"] == 512
    # The same kernel, and scales that maximise the same evidence (to the estimate's error):
    # the predictions agree closely.
    q = torch.rand(50, 2, generator=g, dtype=DT)
    mean_w, std_w = weight.predict(q, return_std=True)
    mean_c, std_c = cg.predict(q, return_std=True)
    torch.testing.assert_close(mean_c, mean_w, rtol=0, atol=2e-3)
    torch.testing.assert_close(std_c, std_w, rtol=0.03, atol=0)
    assert float(cg.noise) == pytest.approx(float(weight.noise), rel=0.02)


def test_calibrated_fit_takes_either_path_to_the_same_model_and_leaves_the_kernel():
    from rfgp.recipes import calibrated_fit
    from rfgp.recipes._laplace import lengthscale_mixture_kernel

    kernel, x, y = _problem(n=2000)
    before = float(kernel.outputscale)
    weight = calibrated_fit(kernel, x, y, noise=1.0, solve="weight")
    cg = calibrated_fit(kernel, x, y, noise=1.0, solve="cg")
    assert float(kernel.outputscale) == before
    assert cg.solve_used == "cg" and weight.solve_used != "cg"
    exact = feature_model_evidence(kernel, x, y)
    from rfgp.inference._calibration import maximize_scale_evidence

    factor, noise, _ = maximize_scale_evidence(exact, 1.0)
    assert float(weight.noise) == pytest.approx(noise, rel=1e-8)
    # (the outputscale passes through its positive constraint: about 1e-6 of rounding)
    assert float(weight.kernel.outputscale) == pytest.approx(before * factor, rel=1e-5)
    assert float(cg.noise) == pytest.approx(noise, rel=0.01)
    q = x[:40]
    torch.testing.assert_close(cg.predict(q), weight.predict(q), rtol=0, atol=2e-3)
    # A Laplace mixture's parts are scaled together.
    draws = torch.tensor([[0.3, 0.5, 1.0], [0.35, 0.45, 1.2]], dtype=DT)
    mixture = lengthscale_mixture_kernel(256, draws, torch.tensor(1.0, dtype=DT))
    fitted = calibrated_fit(mixture, x, y, noise=1.0)
    _, noise, _ = maximize_scale_evidence(feature_model_evidence(mixture, x, y), 1.0)
    # The same maximum from Gram sums taken in another order: Newton stops within its
    # tolerance of it (9e-8 apart on one thread; the noise's own uncertainty, sqrt(2 / N),
    # is 3e-2)
    assert float(fitted.noise) == pytest.approx(noise, rel=1e-6)
    assert [float(part.outputscale) for part in mixture.kernels] == [0.5, 0.5]


def test_calibrated_fit_names_its_bad_arguments():
    from rfgp.kernels import FourierFeatureKernel
    from rfgp.recipes import calibrated_fit

    kernel, x, y = _problem(n=100)
    with pytest.raises(ValueError, match="solve"):
        calibrated_fit(kernel, x, y, 1.0, solve="lu")
    with pytest.raises(ValueError, match="noise"):
        calibrated_fit(kernel, x, y, 0.0)
    with pytest.raises(TypeError, match="ScaleKernel"):
        calibrated_fit(FourierFeatureKernel(64, seed=0).double(), x, y, 1.0)
    with pytest.raises(ValueError, match="finite|NaN|nan"):
        calibrated_fit(kernel, x, y * float("nan"), 1.0)
    with pytest.raises(TypeError, match="float32 or float64"):
        calibrated_fit(kernel, x.half(), y, 1.0)
    bad_x = x.clone()
    bad_x[0, 0] = float("inf")
    with pytest.raises(ValueError, match="finite|inf"):
        calibrated_fit(kernel, bad_x, y, 1.0)
    with pytest.raises(ValueError):
        calibrated_fit(kernel, x[:0], y[:0], 1.0)
    with pytest.raises(ValueError):
        calibrated_fit(kernel, torch.tensor(1.0, dtype=DT), torch.tensor(1.0, dtype=DT), 1.0)


def test_the_fits_reuse_what_the_calibration_computed(monkeypatch):
    from rfgp import RandomFeatureGP
    from rfgp.inference import _nystrom
    from rfgp.recipes import calibrated_fit

    kernel, x, y = _problem(n=2000)
    # Weight space: the fit takes the calibration's Gram matrix, rescaled by the outputscale
    # factor; its posterior is that of a plain fit of the calibrated kernel and noise.
    weight = calibrated_fit(kernel, x, y, noise=1.0, solve="weight")
    plain = RandomFeatureGP(weight.kernel, noise=weight.noise.detach().clone()).fit(x, y)
    fitted, q = weight._state, x[:30] + 0.01
    mean, std = weight.predict(q, return_std=True)
    assert weight._state is fitted  # no refit on the first prediction
    mean0, std0 = plain.predict(q, return_std=True)
    torch.testing.assert_close(mean, mean0, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(std, std0, rtol=1e-9, atol=0.0)
    # CG: the calibration's Nyström preconditioner at its root is the fit's (one sketch in
    # all), and the fit converges with it to the weight-space model.
    sketches = []
    original = _nystrom.NystromSketch.__init__

    def counted(self, *args, **kwargs):
        sketches.append(1)
        original(self, *args, **kwargs)

    monkeypatch.setattr(_nystrom.NystromSketch, "__init__", counted)
    cg = calibrated_fit(kernel, x, y, noise=1.0, solve="cg")
    assert len(sketches) == 1 and cg.cg_info["preconditioner_ranks"][0] > 0
    assert cg.cg_info["iterations"] < 50
    torch.testing.assert_close(cg.predict(q), mean, rtol=0, atol=2e-3)
    # A refit after a new noise sketches its own preconditioner again.
    cg.noise = cg.noise * 2
    cg.predict(q)
    assert len(sketches) == 2


def _dense_negative_log_evidence(kernel_matrix, y, factor, noise):
    """-log N(y | 0, factor K + noise I) per datum, by a dense Cholesky factor."""
    n = y.shape[0]
    cov = factor * kernel_matrix + noise * torch.eye(n, dtype=DT)
    chol = torch.linalg.cholesky(cov)
    alpha = torch.cholesky_solve(y.reshape(n, 1), chol)
    value = 0.5 * (float(y @ alpha[:, 0]) + 2 * float(chol.diagonal().log().sum())
                   + n * math.log(2 * math.pi))
    return value / n


@pytest.mark.parametrize("columns", [1, 2])
def test_a_binding_noise_floor_is_the_constrained_maximum_of_the_dense_evidence(columns):
    from rfgp.recipes import calibrated_fit

    # Noise 0.01 below a floor of 0.1: the evidence's maximum over the factor with the noise
    # held at the floor, not the unconstrained ratio a / noise times the floor.
    kernel, x, y = _problem(n=300, width=128, seed=7, columns=columns)
    floor = 0.1
    with torch.no_grad():
        k0 = kernel(x).to_dense()
    targets = y.reshape(300, -1)

    def dense(log_factor):
        return sum(_dense_negative_log_evidence(k0, targets[:, t], math.exp(log_factor), floor)
                   for t in range(targets.shape[1]))

    # The dense optimum over log a by golden sections (the evidence is unimodal in it here).
    low, high = math.log(1e-3), math.log(1e3)
    ratio = (math.sqrt(5) - 1) / 2
    for _ in range(80):
        a, b = high - ratio * (high - low), low + ratio * (high - low)
        low, high = (low, b) if dense(a) < dense(b) else (a, high)
    best = 0.5 * (low + high)
    curvature = (dense(best + 1e-2) - 2 * dense(best) + dense(best - 1e-2)) / 1e-4
    out = calibrate_by_krylov(kernel, x, y, 1.0, noise_floor=floor, generator=gen(8))
    assert out.noise == floor and out.noise_at_floor
    # The root's slope estimate is off by its standard error (per datum and column); with
    # 0.01 in log c to spare, the loss is then within a quadratic's reach of the optimum.
    step = 0.01 + 4 * out.gradient_standard_error * columns / curvature
    assert abs(math.log(out.factor) - best) <= step
    assert dense(math.log(out.factor)) - dense(best) <= 0.5 * curvature * step**2 + 1e-9
    # calibrated_fit's CG path is this calibration; its weight path the exact maximum.
    cg = calibrated_fit(kernel, x, y, noise=1.0, solve="cg", noise_floor=floor)
    weight = calibrated_fit(kernel, x, y, noise=1.0, solve="weight", noise_floor=floor)
    outputscale = float(kernel.outputscale.detach())
    assert abs(math.log(float(cg.kernel.outputscale.detach()) / outputscale) - best) <= step
    assert abs(math.log(float(weight.kernel.outputscale.detach()) / outputscale) - best) <= 1e-3
    assert float(cg.noise) == pytest.approx(floor, rel=1e-12)


def test_a_final_model_whose_features_cannot_matter_stays_at_the_choice_model(monkeypatch):
    from rfgp.recipes import _refit

    g = gen(7)
    x = torch.rand(3000, 2, generator=g, dtype=DT)
    y = torch.sin(6 * x[:, 0]) + 0.1 * torch.randn(3000, generator=g, dtype=DT)
    options = dict(solve="cg", seed=0, local_search=False, cv_folds=0)
    grown_report = FitReport()
    grown = fit_auto(x, y, report=grown_report, **options)
    signal = grown_report.calibration["signal"]
    # A clear signal: 2 s / sqrt(2048) far above a tenth, so D grows past the choice model.
    assert not _refit.features_cannot_matter(signal, 2048)
    assert grown.solve_used == "cg" and grown_report.num_features > 2048
    # Where the rule says more features cannot move the posterior, the final model is the
    # choice's 2,048-feature model, fitted in weight space.
    monkeypatch.setattr(_refit, "features_cannot_matter", lambda s, m: True)
    kept_report = FitReport()
    kept = fit_auto(x, y, report=kept_report, **options)
    assert kept.solve_used == "weight" and kept_report.num_features == 2048
    assert kept_report.schedule.final_solve == "weight"
    assert kept_report.schedule.num_features == 2048


def test_a_weight_space_model_whose_features_cannot_matter_stays_at_the_choice_model(
        monkeypatch):
    from rfgp.recipes import _refit
    from rfgp.recipes._regression import plan_regression

    # The rule holds on the weight path too: a plan of more weight-space features than the
    # choice model's 2,048 is kept at 2,048 where more features cannot move the posterior,
    # and fitted as planned where they can; the signal it read is the choice model's,
    # reported.
    g = gen(11)
    x = torch.rand(3000, 2, generator=g, dtype=DT)
    y = torch.sin(6 * x[:, 0]) + 0.1 * torch.randn(3000, generator=g, dtype=DT)
    options = dict(solve="weight", seed=0, local_search=False, cv_folds=0, time_budget=13.0,
                   anytime=False)
    planned = plan_regression(3000, 2, RegressionOptions(**options).checked()).num_features
    assert 2048 < planned <= 3000
    read = []

    def rule(answer):
        def cannot_matter(signal, features):
            read.append((signal, features))
            return answer
        return cannot_matter

    for answer, features in ((True, 2048), (False, planned)):
        monkeypatch.setattr(_refit, "features_cannot_matter", rule(answer))
        read.clear()
        report = FitReport()
        gp = fit_auto(x, y, report=report, **options)
        assert report.num_features == features and gp.solve_used == "weight"
        assert report.schedule.num_features == features
        signal = report.calibration["signal"]
        assert signal > 0
        # the choice model's D; where more can matter, again at the plan's D (whether the
        # forecast may raise it)
        assert read == ([(signal, 2048)] if answer else [(signal, 2048), (signal, planned)])


def test_features_cannot_matter_is_a_tenth_of_the_noise_from_the_monte_carlo_error():
    from rfgp.recipes._refit import SIGNAL_TOLERANCE, features_cannot_matter

    # 2 s / sqrt(m) against a tenth: the boundary at s = 0.05 sqrt(m).
    for m in (256, 2048, 8192):
        edge = SIGNAL_TOLERANCE * math.sqrt(m) / 2
        assert features_cannot_matter(edge * (1 - 1e-9), m)
        assert not features_cannot_matter(edge * (1 + 1e-9), m)
