"""Tests of the default fitting recipe: the data-driven start, the choice of D, the evidence search
running to convergence, and the multi-fidelity refit against direct fits."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rfgp import RandomFeatureGP
from rfgp._initial import initial_hyperparameters
from rfgp.inference._evidence import fourier_negative_log_evidence, negative_log_evidence
from rfgp.inference._evidence_search import maximize_evidence, two_path_search
from rfgp.recipes import FitReport, fit_auto
from rfgp.recipes._start import make_ard_kernel
from tests.helpers import DT, gen


def rff_gp_data(n: int, noise: float, seed: int = 0, lengthscale=(0.5, 2.0)):
    """Draws from a GP whose kernel is exactly an RFF kernel (weights w ~ N(0, I))."""
    g = gen(seed)
    kernel = make_ard_kernel(256, len(lengthscale), seed=seed + 100)
    kernel.base_kernel.lengthscale = torch.tensor([lengthscale], dtype=DT)
    kernel.outputscale = torch.tensor(1.0, dtype=DT)
    x = torch.randn(n, len(lengthscale), generator=g, dtype=DT)
    with torch.no_grad():
        phi = kernel.base_kernel.features(x) * kernel.outputscale.sqrt()
    w = torch.randn(phi.shape[1], generator=g, dtype=DT)
    y = phi @ w + math.sqrt(noise) * torch.randn(n, generator=g, dtype=DT)
    return x, y, kernel


# ----------------------------------------------------------------------------- initialisation
def test_initial_lengthscales_scale_with_each_column():
    # Rescaling column j by c rescales lengthscale j by c exactly: the median is taken over
    # distances of the columns divided by their standard deviations.
    g = gen(0)
    x = torch.randn(300, 3, generator=g, dtype=DT)
    y = torch.randn(300, generator=g, dtype=DT)
    c = torch.tensor([1.0, 7.0, 0.01], dtype=DT)
    a = initial_hyperparameters(x, y)["lengthscale"]
    b = initial_hyperparameters(x * c, y)["lengthscale"]
    torch.testing.assert_close(b, a * c, rtol=1e-12, atol=0)


def test_initial_lengthscale_is_sqrt_median_chi2_for_gaussian_inputs():
    # For x ~ N(0, I_d) the difference of two rows is N(0, 2 I), so ||diff||^2 / 2 ~ chi2_d and
    # l = median(||diff||) / sqrt(2) = sqrt(median chi2_d) (Wilson-Hilferty for the median).
    d = 6
    x = torch.randn(1000, d, generator=gen(1), dtype=DT)
    ell = initial_hyperparameters(x, torch.ones(1000, dtype=DT))["lengthscale"]
    median_chi2 = d * (1 - 2 / (9 * d)) ** 3
    # l_j / s_j is the common factor m / sqrt(2) (s_j the column's sample standard deviation);
    # about 5e5 dependent pairs: the median's relative error is a few per mille; 3% is ample.
    factor = ell / x.std(0)
    torch.testing.assert_close(factor, torch.full((d,), math.sqrt(median_chi2), dtype=DT),
                               rtol=0.03, atol=0)


def test_initial_scales_split_the_targets_mean_square():
    x = torch.randn(50, 2, generator=gen(2), dtype=DT)
    y = 3.0 * torch.randn(50, 2, generator=gen(3), dtype=DT)
    init = initial_hyperparameters(x, y, signal_fraction=0.8)
    m = float(y.square().mean())
    assert float(init["outputscale"]) == pytest.approx(0.8 * m, rel=1e-12)
    assert float(init["noise"]) == pytest.approx(0.2 * m, rel=1e-12)


def test_initial_hyperparameters_of_a_single_row():
    one = initial_hyperparameters(torch.zeros(1, 2, dtype=DT), torch.zeros(1, dtype=DT))
    # No pair of rows: s_j = 1 and m = 1, so l_j = 1 / sqrt(2).
    torch.testing.assert_close(one["lengthscale"], torch.full((2,), 0.5**0.5, dtype=DT))
    assert float(one["outputscale"] + one["noise"]) == pytest.approx(1.0)


# ----------------------------------------------------------------------------- evidence
def test_closed_form_evidence_gradient_passes_gradcheck():
    g = gen(20)
    z = torch.randn(15, 4, generator=g, dtype=DT, requires_grad=True)
    y = torch.randn(15, 2, generator=g, dtype=DT)
    noise = torch.tensor(0.3, dtype=DT, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, s: negative_log_evidence(a, y, s), (z, noise))
    # Fewer rows than features: the function-space branch.
    z = torch.randn(6, 9, generator=g, dtype=DT, requires_grad=True)
    y = torch.randn(6, 2, generator=g, dtype=DT)
    assert torch.autograd.gradcheck(lambda a, s: negative_log_evidence(a, y, s), (z, noise))


def test_closed_form_evidence_equals_the_solvers_evidence_and_gradient():
    x, y, kernel = rff_gp_data(300, 0.1, seed=13)
    y2 = torch.stack([y, -0.5 * y + 0.1], dim=-1)
    gp = RandomFeatureGP(kernel, noise=0.1)
    noise = torch.tensor(0.07, dtype=DT, requires_grad=True)
    params = [p for p in kernel.parameters() if p.requires_grad] + [noise]
    a = -gp.log_marginal_likelihood(x, y2, noise)
    grads_a = torch.autograd.grad(a, params)
    z = kernel.base_kernel.features(x) * kernel.outputscale.sqrt()
    b = negative_log_evidence(z, y2, noise)
    grads_b = torch.autograd.grad(b, params)
    torch.testing.assert_close(b, a, rtol=1e-10, atol=0)
    for ga, gb in zip(grads_a, grads_b):
        torch.testing.assert_close(gb, ga, rtol=1e-8, atol=1e-10)


def test_fourier_evidence_is_the_gaussian_density_of_its_features_with_its_gradient():
    # The fused form against the Gaussian log density of N(0, Z Z^T + s I) built from
    # Z = sqrt(a / M) [cos P, sin P] by autograd: value and gradients in P, a and s.
    g = gen(22)
    proj = torch.randn(30, 6, generator=g, dtype=DT, requires_grad=True)
    y = torch.randn(30, 2, generator=g, dtype=DT)
    a = torch.tensor(1.7, dtype=DT, requires_grad=True)
    s = torch.tensor(0.25, dtype=DT, requires_grad=True)
    fused = fourier_negative_log_evidence(proj, y, a, s)
    z = torch.cat([proj.cos(), proj.sin()], dim=-1) * (a / 6).sqrt()
    mvn = torch.distributions.MultivariateNormal(
        torch.zeros(30, dtype=DT), z @ z.T + s * torch.eye(30, dtype=DT))
    expected = -(mvn.log_prob(y[:, 0]) + mvn.log_prob(y[:, 1]))
    torch.testing.assert_close(fused, expected, rtol=1e-10, atol=0)
    for gf, ge in zip(torch.autograd.grad(fused, (proj, a, s)),
                      torch.autograd.grad(expected, (proj, a, s))):
        torch.testing.assert_close(gf, ge, rtol=1e-8, atol=1e-10)
    assert torch.autograd.gradcheck(
        lambda p_, a_, s_: fourier_negative_log_evidence(p_, y, a_, s_), (proj, a, s))


def test_fourier_evidence_rejects_shapes_outside_weight_space():
    p = torch.randn(10, 5, dtype=DT)
    y = torch.randn(10, 1, dtype=DT)
    one = torch.tensor(1.0, dtype=DT)
    with pytest.raises(ValueError, match="N >= 2M"):
        fourier_negative_log_evidence(torch.randn(9, 5, dtype=DT), y[:9], one, one)
    with pytest.raises(ValueError, match="proj must have shape"):
        fourier_negative_log_evidence(p, y[:9], one, one)
    with pytest.raises(ValueError, match="proj must have shape"):
        fourier_negative_log_evidence(p[None], y, one, one)
    with pytest.raises(ValueError, match="0-d"):
        fourier_negative_log_evidence(p, y, one.reshape(1), one)


@pytest.mark.parametrize("sampling,spectral", [("iid", "rbf"), ("orthogonal", "matern32"),
                                               ("structured", "rbf"), ("structured", "matern52")])
def test_fourier_evidence_of_a_kernels_projections_equals_its_features_evidence(
    sampling, spectral
):
    # The recipe's fused form from the kernel's projections against negative_log_evidence of
    # the kernel's own features times sqrt(outputscale): value and every parameter's gradient.
    from gpytorch.kernels import ScaleKernel

    from rfgp.kernels import FourierFeatureKernel

    g = gen(23)
    x = torch.randn(120, 3, generator=g, dtype=DT)
    y = torch.randn(120, 1, generator=g, dtype=DT)
    kernel = ScaleKernel(FourierFeatureKernel(32, spectral=spectral, sampling=sampling,
                                              input_dim=3, ard_num_dims=3, seed=5)).to(DT)
    kernel.base_kernel.lengthscale = torch.tensor([[0.7, 1.3, 2.0]], dtype=DT)
    kernel.outputscale = torch.tensor(1.9, dtype=DT)
    noise = torch.tensor(0.2, dtype=DT, requires_grad=True)
    params = list(kernel.parameters()) + [noise]
    base = kernel.base_kernel
    proj = base.projections(base.prepare_input(x) / base.lengthscale)
    fused = fourier_negative_log_evidence(proj, y, kernel.outputscale, noise)
    grads_fused = torch.autograd.grad(fused, params)
    reference = negative_log_evidence(base.features(x) * kernel.outputscale.sqrt(), y, noise)
    grads_reference = torch.autograd.grad(reference, params)
    torch.testing.assert_close(fused, reference, rtol=1e-12, atol=0)
    for a, b in zip(grads_fused, grads_reference):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("form", ["features", "fourier"])
def test_closed_form_evidences_reject_bad_targets_and_scales(form):
    from linear_operator.utils.errors import NotPSDError

    g = gen(24)
    p = torch.randn(20, 3, generator=g, dtype=DT)
    y = torch.randn(20, 1, generator=g, dtype=DT)
    one = torch.tensor(1.0, dtype=DT)

    def call(y_=y, noise=one, outputscale=one):
        if form == "fourier":
            return fourier_negative_log_evidence(p, y_, outputscale, noise)
        return negative_log_evidence(p * outputscale.sqrt(), y_, noise)

    with pytest.raises(ValueError, match="NaN or infinite"):
        call(y_=y * float("nan"))
    with pytest.raises(ValueError, match="NaN or infinite"):
        call(y_=y.clone().index_fill_(0, torch.tensor([3]), float("inf")))
    with pytest.raises(TypeError, match="dtype"):
        call(y_=y.float())
    for bad in (0.0, -0.1, float("inf"), float("nan")):
        with pytest.raises(NotPSDError, match="noise must be positive and finite"):
            call(noise=torch.tensor(bad, dtype=DT))
    if form == "fourier":
        with pytest.raises(NotPSDError, match="outputscale must be positive and finite"):
            call(outputscale=torch.tensor(-1.0, dtype=DT))
    assert torch.isfinite(call())


def test_evidence_search_of_fourier_features_in_weight_space_equals_the_feature_path(
    monkeypatch,
):
    # maximize_evidence builds random Fourier features inside the fused evidence when N >= D.
    # With the fused evidence replaced by the features' own autograd graph (the kernel's
    # features times sqrt(outputscale) into negative_log_evidence), the search must end at the
    # same optimum: the recipe hands the fused form the right projections and scales.
    import rfgp.inference._evidence as evidence

    x, y, _ = rff_gp_data(400, 0.05, seed=14)
    results = []
    for reference in (False, True):
        k = make_ard_kernel(64, 2, seed=3)
        k.base_kernel.lengthscale = torch.tensor([[1.0, 1.0]], dtype=DT)
        gp = RandomFeatureGP(k, noise=0.3)
        if reference:
            def autograd_form(proj, y_, a, s, k=k):
                assert proj.shape == (400, 32)
                return negative_log_evidence(k.base_kernel.features(x) * a.sqrt(), y_, s)

            monkeypatch.setattr(evidence, "fourier_negative_log_evidence", autograd_form)
        maximize_evidence(gp, x, y, 200, 1e-7)
        results.append(torch.cat([k.base_kernel.lengthscale.detach().reshape(-1),
                                  k.outputscale.detach().reshape(1),
                                  gp.noise.detach().reshape(1)]))
    torch.testing.assert_close(results[0], results[1], rtol=1e-4, atol=0)


def test_closed_form_evidence_holds_with_fewer_rows_than_features():
    # With N < D the weight-space identities (Woodbury, tr K^{-1} = (N - D + tr B^{-1}) / s)
    # still hold: the value and gradient equal the exact N x N Gaussian's.
    g = gen(21)
    z = torch.randn(12, 40, generator=g, dtype=DT, requires_grad=True)
    y = torch.randn(12, 1, generator=g, dtype=DT)
    noise = torch.tensor(0.2, dtype=DT, requires_grad=True)
    a = negative_log_evidence(z, y, noise)
    cov = z @ z.T + noise * torch.eye(12, dtype=DT)
    b = -torch.distributions.MultivariateNormal(torch.zeros(12, dtype=DT), cov).log_prob(y[:, 0])
    torch.testing.assert_close(a, b, rtol=1e-10, atol=0)
    for ga, gb in zip(torch.autograd.grad(a, (z, noise)), torch.autograd.grad(b, (z, noise))):
        torch.testing.assert_close(ga, gb, rtol=1e-8, atol=1e-10)


def test_evidence_search_with_fewer_rows_than_features_reaches_the_solvers_optimum():
    # N = 100 < D = 256: the search (closed-form gradient) stops where the solver's own
    # evidence is stationary.
    x, y, _ = rff_gp_data(100, noise=0.05, seed=22)
    kernel = make_ard_kernel(256, 2, seed=3)
    init = initial_hyperparameters(x, y)
    kernel.base_kernel.lengthscale = init["lengthscale"].reshape(1, -1)
    kernel.outputscale = init["outputscale"]
    gp = RandomFeatureGP(kernel, noise=init["noise"])
    losses, _, converged = maximize_evidence(gp, x, y, max_iterations=300, tolerance=1e-7)
    assert converged and min(losses) < losses[0]
    log_noise = gp.noise.detach().log().requires_grad_(True)
    value = -gp.log_marginal_likelihood(x, y, log_noise.exp()) / x.shape[0]
    raw = [p for p in kernel.parameters() if p.requires_grad]
    for grad in torch.autograd.grad(value, [*raw, log_noise]):
        assert float(grad.abs().max()) < 1e-4


# ----------------------------------------------------------------------------- convergence
def test_evidence_search_converges_to_a_stationary_point():
    x, y, _ = rff_gp_data(1500, noise=0.01, seed=4)
    init = initial_hyperparameters(x, y)
    kernel = make_ard_kernel(256, 2, seed=104)  # the generating frequencies
    kernel.base_kernel.lengthscale = init["lengthscale"].reshape(1, -1)
    kernel.outputscale = init["outputscale"]
    gp = RandomFeatureGP(kernel, noise=init["noise"])
    losses, iterations, converged = maximize_evidence(gp, x, y, max_iterations=200,
                                                      tolerance=1e-6)
    assert converged and iterations > 3
    assert min(losses) < losses[0]
    # Stationary: the gradient of the per-datum evidence in the searched coordinates (the raw
    # kernel parameters and the log-noise) vanishes.
    log_noise = gp.noise.detach().log().requires_grad_(True)
    value = -gp.log_marginal_likelihood(x, y, log_noise.exp()) / x.shape[0]
    raw = [p for p in kernel.parameters() if p.requires_grad]
    for g in torch.autograd.grad(value, [*raw, log_noise]):
        assert float(g.abs().max()) < 1e-4
    # The noise estimate: the MLE's relative standard error is about sqrt(2 / N) = 3.7%.
    assert float(gp.noise) == pytest.approx(0.01, rel=0.2)


def test_fit_auto_reports_convergence_and_stages():
    x, y, _ = rff_gp_data(600, noise=0.05, seed=5)
    report = FitReport()
    gp = fit_auto(x, y, num_features=1024, search_features=128, subsample=300,
                  refine_iterations=3, report=report)
    assert report.converged["search"] and report.iterations["search"] > 3
    assert report.iterations["refine"] <= 3
    assert set(report.seconds) == {"search", "refine", "local", "laplace", "refit"}
    assert gp.feature_map.num_features == 1024 and gp.num_data == 600


def test_refinement_uses_a_superset_of_the_subsample_and_raises_the_evidence():
    x, y, _ = rff_gp_data(600, noise=0.05, seed=23)
    capped = FitReport()
    fit_auto(x, y, num_features=64, search_features=64, subsample=200, refine_rows=400,
             refine_iterations=2, report=capped)
    assert capped.subsample == 200 and capped.refine_rows == 400
    searched, refined = FitReport(), FitReport()
    # The kernel at the maximum (no Laplace average), whose evidence the search raised.
    options = dict(num_features=64, search_features=64, subsample=200, seed=1,
                   lengthscale_draws=0, local_search=False)
    a = fit_auto(x, y, refine_iterations=0, report=searched, **options)
    b = fit_auto(x, y, refine_iterations=5, report=refined, **options)
    assert searched.refine_rows == 0 and refined.refine_rows == 600
    assert "refine" not in searched.iterations and refined.iterations["refine"] <= 5
    # The refinement starts at the subsample's optimum and keeps its best point: the evidence
    # of all rows can only rise.
    assert float(b.log_marginal_likelihood()) >= float(a.log_marginal_likelihood()) - 1e-9
    # Without more rows than the subsample there is nothing to refine.
    small = FitReport()
    fit_auto(x, y, num_features=64, subsample=600, report=small)
    assert small.refine_rows == 0 and set(small.iterations) == {"search"}


# ----------------------------------------------------------------------------- multi-fidelity
@pytest.mark.parametrize("exact_rows", [0, 1000], ids=["feature-evidence", "exact-evidence"])
def test_refit_at_equal_features_reproduces_a_direct_fit(exact_rows):
    x, y, _ = rff_gp_data(400, noise=0.05, seed=6)
    xq = torch.randn(20, 2, generator=gen(7), dtype=DT)
    report = FitReport()
    auto = fit_auto(x, y, calibrate=False, num_features=256, search_features=256,
                    subsample=1000, seed=3,
                    tolerance=1e-5, exact_rows=exact_rows, report=report, lengthscale_draws=0)
    assert report.evidence == {"search": "exact" if exact_rows else "features"}
    # The same steps by hand: start, converged search on all rows, fit.
    init = initial_hyperparameters(x, y, generator=gen(3))
    kernel = make_ard_kernel(256, 2, seed=3)
    kernel.base_kernel.lengthscale = init["lengthscale"].reshape(1, -1)
    kernel.outputscale = init["outputscale"]
    direct = RandomFeatureGP(kernel, noise=init["noise"])
    two_path_search(direct, x, y, 200, 1e-5, exact=bool(exact_rows), mean=True)
    assert bool(direct.prior_mean != 0)
    direct.fit(x, y)
    m1, s1 = auto.predict(xq, return_std=True)
    m2, s2 = direct.predict(xq, return_std=True)
    # (the recipe centres the targets before its stages, the direct fit in its own: their
    # last bits differ)
    torch.testing.assert_close(m1, m2, rtol=0, atol=1e-9)
    torch.testing.assert_close(s1, s2, rtol=0, atol=1e-10)


def test_refit_with_more_features_is_the_direct_fit_at_the_searched_hyperparameters():
    x, y, _ = rff_gp_data(500, noise=0.05, seed=8)
    xq = torch.randn(20, 2, generator=gen(9), dtype=DT)
    auto = fit_auto(x, y, calibrate=False, num_features=1024, search_features=128, subsample=250,
                    refine_iterations=2, seed=5, lengthscale_draws=0)
    kernel = make_ard_kernel(1024, 2, seed=5)
    kernel.base_kernel.lengthscale = auto.kernel.base_kernel.lengthscale.detach()
    kernel.outputscale = auto.kernel.outputscale.detach()
    direct = RandomFeatureGP(kernel, noise=auto.noise.clone(),
                             prior_mean=auto.prior_mean).fit(x, y)
    m1, s1 = auto.predict(xq, return_std=True)
    m2, s2 = direct.predict(xq, return_std=True)
    torch.testing.assert_close(m1, m2, rtol=0, atol=1e-10)
    torch.testing.assert_close(s1, s2, rtol=0, atol=1e-10)


@pytest.mark.slow
def test_fit_auto_recovers_the_generating_hyperparameters():
    # Data from an RFF GP with lengthscales (0.5, 2), outputscale 1 and noise 0.01: the recipe's
    # estimates (search on a subsample, all rows at the end) land near them.
    x, y, _ = rff_gp_data(3000, noise=0.01, seed=10)
    report = FitReport()
    gp = fit_auto(x, y, num_features=1024, subsample=1500, refine_iterations=0, seed=0,
                  report=report)
    ell = report.lengthscale
    assert 0.35 < float(ell[0]) < 0.7 and 1.3 < float(ell[1]) < 3.0
    assert float(gp.noise) == pytest.approx(0.01, rel=0.3)


def test_fit_auto_checks_its_arguments():
    x, y = torch.zeros(5, 2, dtype=DT), torch.zeros(5, dtype=DT)
    with pytest.raises(ValueError, match="spectral"):
        fit_auto(x, y, spectral="laplace")
    with pytest.raises(ValueError, match="subsample"):
        fit_auto(x, y, subsample=1)
    with pytest.raises(ValueError, match="refine_rows"):
        fit_auto(x, y, refine_rows=1)
    with pytest.raises(TypeError, match="num_features"):
        fit_auto(x, y, num_features=64.0)


def test_negative_log_evidence_checks_shapes():
    y = torch.rand(6, dtype=DT)
    z, s = torch.rand(6, 3, dtype=DT), torch.tensor(0.1, dtype=DT)
    with pytest.raises(ValueError, match="y shape"):
        negative_log_evidence(z, y, s)
    with pytest.raises(ValueError, match="y shape"):
        negative_log_evidence(z, y[:5, None], s)
    with pytest.raises(ValueError, match="noise must be a 0-d"):
        negative_log_evidence(z, y[:, None], s.expand(6))


# ----------------------------------------------------------------------------- scikit-learn
def test_sklearn_default_is_the_recipe():
    from rfgp.sklearn import RandomFeatureGPRegressor

    x, y, _ = rff_gp_data(300, noise=0.05, seed=11)
    y = 3.0 * y.numpy() + 2.0
    reg = RandomFeatureGPRegressor(random_state=0).fit(x.numpy(), y)
    gp = fit_auto(x, torch.from_numpy((y - y.mean()) / y.std()), seed=0)  # random_state=0
    xq = torch.randn(10, 2, generator=gen(12), dtype=DT)
    mean, std = reg.predict(xq.numpy(), return_std=True)
    m, s = gp.predict(xq, return_std=True)
    np.testing.assert_allclose(mean, m.numpy() * y.std() + y.mean(), rtol=0, atol=1e-9)
    np.testing.assert_allclose(std, s.numpy() * y.std(), rtol=0, atol=1e-9)
    assert reg.fit_report_.num_features == gp.feature_map.num_features
    assert reg.n_iter_ > 3


def test_sklearn_recipe_targets_are_the_documented_standardisation(monkeypatch):
    # The recipe's searches can end on their iteration caps, where the last bit of a target
    # may move the fit: the estimator's targets must be exactly the documented ones.
    import rfgp.sklearn._regressor as regressor_module
    from rfgp.sklearn import RandomFeatureGPRegressor

    seen = {}

    class Stop(Exception):
        pass

    def capture(x, y, **options):
        seen["x"], seen["y"] = x, y
        raise Stop

    monkeypatch.setattr(regressor_module, "fit_auto", capture)
    g = np.random.default_rng(3)
    x = g.normal(size=(517, 3))
    for y in (1e3 + 3.7 * g.normal(size=517), g.normal(size=(517, 2)) * [1e-90, 1e90]):
        with pytest.raises(Stop):
            RandomFeatureGPRegressor(random_state=0).fit(x, y)
        expected = (y - y.mean(axis=0)) / y.std(axis=0)
        assert np.array_equal(seen["y"].numpy().reshape(expected.shape), expected)
        assert np.array_equal(seen["x"].numpy(), x)
    # Beyond the squares' range the statistics are taken on y / max|y|: finite, unit spread.
    with pytest.raises(Stop):
        RandomFeatureGPRegressor(random_state=0).fit(x, 1e160 * g.normal(size=517))
    assert np.isfinite(seen["y"].numpy()).all()
    assert abs(float(seen["y"].std(unbiased=False)) - 1.0) < 1e-12


# ----------------------------------------------------------------------------- exact search
@pytest.mark.parametrize("nu", [None, 0.5, 1.5, 2.5])
def test_stationary_kernel_is_gpytorch_kernel(nu):
    import gpytorch

    from rfgp.kernels._fourier import stationary_kernel

    g = gen(11)
    x1 = torch.randn(7, 3, generator=g, dtype=DT)
    x2 = torch.randn(5, 3, generator=g, dtype=DT)
    ls = torch.tensor([0.4, 1.3, 3.0], dtype=DT)
    ref = (gpytorch.kernels.RBFKernel(ard_num_dims=3) if nu is None
           else gpytorch.kernels.MaternKernel(nu=nu, ard_num_dims=3)).double()
    ref.lengthscale = ls
    with torch.no_grad():
        expected = ref(x1, x2).to_dense()
        same = ref(x1, x1).to_dense()
    torch.testing.assert_close(stationary_kernel(x1, x2, ls, nu), expected, rtol=1e-10,
                               atol=1e-12)
    torch.testing.assert_close(stationary_kernel(x1, x1, ls, nu), same, rtol=1e-10, atol=1e-12)
    ls_var = ls.clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda v: stationary_kernel(x1, x2, v, nu), (ls_var,))
    with pytest.raises(ValueError, match="nu must be"):
        stationary_kernel(x1, x2, ls, 1.0)


def test_kernel_evidence_is_the_gaussian_density_with_its_gradient():
    from linear_operator.utils.errors import NotPSDError

    from rfgp.inference._evidence import kernel_negative_log_evidence

    g = gen(12)
    a = torch.randn(25, 10, generator=g, dtype=DT)
    y = torch.randn(25, 3, generator=g, dtype=DT)
    noise = torch.tensor(0.3, dtype=DT)
    cov = a @ a.T + noise * torch.eye(25, dtype=DT)
    mvn = torch.distributions.MultivariateNormal(torch.zeros(25, dtype=DT), cov)
    expected = -mvn.log_prob(y.T).sum()
    torch.testing.assert_close(kernel_negative_log_evidence(a @ a.T, y, noise), expected)
    # Gradient through a parametrised (symmetric) K, the targets and the noise.
    args = (a.clone().requires_grad_(True), y.clone().requires_grad_(True),
            noise.clone().requires_grad_(True))
    assert torch.autograd.gradcheck(
        lambda a_, y_, s_: kernel_negative_log_evidence(a_ @ a_.T, y_, s_), args
    )
    with pytest.raises(NotPSDError, match="not positive definite"):
        kernel_negative_log_evidence(-torch.eye(4, dtype=DT), y[:4], torch.tensor(0.1, dtype=DT))


def test_exact_search_maximises_the_exact_evidence():
    # On few rows the search maximises the exact kernel's evidence: its gradient vanishes at
    # the result, which beats the random-feature search's hyperparameters on that evidence.
    from rfgp.inference._evidence import kernel_negative_log_evidence
    from rfgp.kernels._fourier import stationary_kernel

    x, y, _ = rff_gp_data(300, noise=0.05, seed=13)

    def exact_loss(gp):
        # the evidence of the targets less the prior mean the search chose with them
        base = gp.kernel.base_kernel
        k = stationary_kernel(x, x, base.lengthscale, base.nu) * gp.kernel.outputscale
        return kernel_negative_log_evidence(k, (y - gp.prior_mean).unsqueeze(-1), gp.noise)

    options = dict(num_features=128, search_features=128, seed=0, tolerance=1e-6,
                   lengthscale_draws=0, calibrate=False)
    exact = fit_auto(x, y, exact_rows=1000, **options)
    approx = fit_auto(x, y, exact_rows=0, **options)
    with torch.no_grad():
        assert float(exact_loss(exact)) < float(exact_loss(approx))
    params = [p for p in exact.kernel.parameters() if p.requires_grad]
    grads = torch.autograd.grad(exact_loss(exact) / y.numel(), params)
    assert max(float(gr.abs().max()) for gr in grads) < 1e-4
    with pytest.raises(TypeError, match="FourierFeatureKernel"):
        from gpytorch.kernels import ScaleKernel

        from rfgp.kernels import PolynomialSketchKernel

        other = RandomFeatureGP(ScaleKernel(PolynomialSketchKernel(2, 16, seed=0)).double(),
                                noise=0.1)
        maximize_evidence(other, x, y, exact=True)


def test_exact_search_pieces_reject_bad_input():
    from linear_operator.utils.errors import NotPSDError

    from rfgp.inference._evidence import kernel_negative_log_evidence
    from rfgp.inference._selection import minimize_lbfgs
    from rfgp.kernels._fourier import stationary_kernel

    x = torch.randn(4, 2, dtype=DT)
    ls = torch.tensor([0.5, 1.0], dtype=DT)
    bad_x = x.clone()
    bad_x[0, 0] = float("nan")
    with pytest.raises(ValueError, match="x1 must be finite"):
        stationary_kernel(bad_x, x, ls)
    with pytest.raises(TypeError, match="x2 must have a floating dtype"):
        stationary_kernel(x, torch.zeros(3, 2, dtype=torch.long), ls)
    with pytest.raises(ValueError, match="x1 must have at least 2"):
        stationary_kernel(torch.tensor(1.0, dtype=DT), x, ls)
    with pytest.raises(ValueError, match="lengthscale must be positive"):
        stationary_kernel(x, x, torch.tensor([0.5, 0.0], dtype=DT))
    with pytest.raises(ValueError, match="same d columns"):
        stationary_kernel(x, torch.randn(3, 3, dtype=DT), ls)
    # Extreme scales: tiny and huge lengthscales give the identity and the all-ones matrix.
    torch.testing.assert_close(stationary_kernel(x, x, ls * 1e-200), torch.eye(4, dtype=DT))
    torch.testing.assert_close(stationary_kernel(x, x, ls * 1e200, 2.5), torch.ones(4, 4, dtype=DT))

    y = torch.randn(4, 1, dtype=DT)
    k = stationary_kernel(x, x, ls)
    noise = torch.tensor(0.1, dtype=DT)
    with pytest.raises(ValueError, match=r"k must have shape \(N, N\)"):
        kernel_negative_log_evidence(k[:3], y, noise)
    with pytest.raises(ValueError, match=r"N >= 1"):
        kernel_negative_log_evidence(k[:0, :0], y[:0], noise)
    with pytest.raises(ValueError, match="noise must be a 0-d tensor"):
        kernel_negative_log_evidence(k, y, noise.reshape(1))
    with pytest.raises(NotPSDError, match="NaN or infinite"):
        kernel_negative_log_evidence(k * float("nan"), y, noise)

    w = torch.zeros(1, dtype=DT, requires_grad=True)
    with pytest.raises(ValueError, match="max_iterations"):
        minimize_lbfgs([w], lambda: (w**2).sum(), 0, 1e-6)
    with pytest.raises(ValueError, match="tolerance"):
        minimize_lbfgs([w], lambda: (w**2).sum(), 10, float("nan"))
    with pytest.raises(ValueError, match="exact_rows"):
        fit_auto(x, y[:, 0], exact_rows=-1)


def test_minimize_lbfgs_backs_off_from_infeasible_points():
    # The minimum at w = -1 lies outside the allowed w > 0: the line search never lands there
    # and the best feasible point evaluated is restored.
    from rfgp.inference._selection import minimize_lbfgs

    w = torch.tensor([2.0], dtype=DT, requires_grad=True)
    seen = []

    def loss():
        seen.append(float(w.detach()))
        return ((w + 1.0) ** 2).sum()

    losses, _, _ = minimize_lbfgs([w], loss, 20, 1e-8, feasible=lambda: bool((w > 0).all()))
    assert float(w.detach()) > 0 and all(v > 0 for v in seen)
    assert min(losses) == pytest.approx(float(((w.detach() + 1.0) ** 2).sum()))


@pytest.mark.parametrize("rows", [80, 20], ids=["weight-space", "function-space"])
@pytest.mark.parametrize("spectral", ["rbf", "matern32"])
def test_fourier_kernel_evidence_is_the_features_or_the_exact_kernels(rows, spectral):
    # At explicit hyperparameters: the features' evidence equals negative_log_evidence of the
    # kernel's own features scaled by sqrt(s) (set as its parameters), in both spaces, value
    # and gradient; the exact form equals the dense Gaussian of the exact kernel.
    from rfgp.inference._evidence import (
        fourier_kernel_negative_log_evidence,
        kernel_negative_log_evidence,
    )
    from rfgp.kernels._fourier import stationary_kernel

    g = gen(31)
    x = torch.randn(rows, 2, generator=g, dtype=DT)
    y = torch.randn(rows, 2, generator=g, dtype=DT)
    k = make_ard_kernel(32, 2, spectral, seed=2)
    base = k.base_kernel
    ell = torch.tensor([0.7, 1.6], dtype=DT, requires_grad=True)
    s = torch.tensor(1.3, dtype=DT, requires_grad=True)
    noise = torch.tensor(0.2, dtype=DT)
    value = fourier_kernel_negative_log_evidence(base, base.prepare_input(x), y, ell, s, noise)
    grads = torch.autograd.grad(value, [ell, s])
    base.lengthscale = ell.detach().reshape(1, -1)
    ell_p = base.raw_lengthscale
    reference = negative_log_evidence(base.features(x) * s.sqrt(), y, noise)
    ref_grads = torch.autograd.grad(reference, [ell_p, s])
    torch.testing.assert_close(value, reference, rtol=1e-12, atol=0)
    # The raw parameter's gradient is the lengthscale's times d l / d raw = sigmoid(raw).
    torch.testing.assert_close(grads[0] * torch.sigmoid(ell_p.detach()).reshape(-1),
                               ref_grads[0].reshape(-1), rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(grads[1], ref_grads[1], rtol=1e-9, atol=1e-12)
    exact = fourier_kernel_negative_log_evidence(base, x, y, ell.detach(), s.detach(), noise,
                                                 exact=True)
    dense = stationary_kernel(x, x, ell.detach(), base.nu) * s.detach()
    torch.testing.assert_close(exact, kernel_negative_log_evidence(dense, y, noise),
                               rtol=1e-10, atol=0)


def test_fourier_kernel_evidence_rejects_a_subclass_with_its_own_features():
    from rfgp.inference._evidence import fourier_kernel_negative_log_evidence
    from rfgp.kernels import FourierFeatureKernel

    class Doubled(FourierFeatureKernel):
        def _features(self, x):
            return 2.0 * super()._features(x)

    k = Doubled(16, input_dim=2, seed=0)
    x = k.prepare_input(torch.randn(40, 2, dtype=DT))
    one = torch.ones((), dtype=DT)
    with pytest.raises(TypeError, match="redefines the features"):
        fourier_kernel_negative_log_evidence(k, x, torch.zeros(40, 1, dtype=DT),
                                             torch.ones(2, dtype=DT), one, one)
