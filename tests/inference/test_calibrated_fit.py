"""The calibrated fit: the scales maximise the feature model's own evidence, and the fit that
reuses the calibration's products is the plain fit of the calibrated model."""

from __future__ import annotations

import copy

import pytest
import torch
from gpytorch.kernels import ScaleKernel

from rfgp import RandomFeatureGP
from rfgp.inference import calibrate_scales, fit_calibrated
from rfgp.inference._evidence import negative_log_evidence
from rfgp.inference._feature_map import FeatureMap
from rfgp.kernels import FourierFeatureKernel
from tests.helpers import DT, gen


def _problem(n=400, num_features=64, seed=0):
    g = gen(seed)
    x = torch.rand(n, 2, generator=g, dtype=DT)
    y = torch.sin(5 * x[:, 0]) * x[:, 1] + 0.1 * torch.randn(n, generator=g, dtype=DT)
    kernel = ScaleKernel(FourierFeatureKernel(num_features, sampling="orthogonal", input_dim=2,
                                              ard_num_dims=2, seed=seed)).double()
    kernel.base_kernel.lengthscale = torch.tensor([[0.3, 0.5]], dtype=DT)
    return kernel, x, y - y.mean()


def test_the_weight_calibration_is_a_stationary_point_of_the_feature_evidence():
    kernel, x, y = _problem()
    calibration = calibrate_scales(kernel, x, y, 1.0)
    with torch.no_grad():
        z = FeatureMap(kernel).real_rows(x)
    theta = torch.zeros(2, dtype=DT, requires_grad=True)
    nll = negative_log_evidence(z * (theta[0] / 2).exp() * calibration.factor**0.5,
                                y.unsqueeze(-1), calibration.noise * theta[1].exp())
    (grad,) = torch.autograd.grad(nll / y.numel(), theta)
    assert float(grad.abs().max()) < 1e-6
    assert calibration.loss == pytest.approx(float(nll.detach()), rel=1e-9)


@pytest.mark.parametrize("target_unit", [1.0, 8.0])
def test_the_fit_that_reuses_the_gram_matrix_is_the_plain_fit(target_unit):
    # Calibrated on y, fitted on target_unit * y (a power of two: the rescaling is exact) at
    # target_unit^2 times the calibrated outputscale: the reused Gram matrix and projections
    # give the predictions of a fit that forms its own.
    kernel, x, y = _problem(seed=1)
    calibration = calibrate_scales(kernel, x, y, 1.0)
    assert calibration.reuse is not None
    final = copy.deepcopy(kernel)
    final.outputscale = kernel.outputscale.detach() * calibration.factor * target_unit**2
    gp = fit_calibrated(final, x, target_unit * y, calibration, target_unit)
    plain = RandomFeatureGP(copy.deepcopy(final),
                            noise=torch.as_tensor(calibration.noise * target_unit**2, dtype=DT))
    plain.fit(x, target_unit * y)
    xq = torch.rand(30, 2, generator=gen(2), dtype=DT)
    for a, b in zip(gp.predict(xq, return_std=True), plain.predict(xq, return_std=True)):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10)


def test_the_cg_calibration_finds_the_weight_calibrations_maximum():
    # The iterative calibration maximises the same evidence from feature products alone: its
    # noise agrees with the exact maximum to within the root's 1% width in c and the probes'
    # error, and its fit predicts as the weight-space fit of the same scales.
    kernel, x, y = _problem(n=1500, num_features=128, seed=3)
    exact = calibrate_scales(kernel, x, y, 0.1)
    iterative = calibrate_scales(kernel, x, y, 0.1, path="cg")
    assert iterative.path == "cg" and iterative.iterative is not None
    assert iterative.noise == pytest.approx(exact.noise, rel=0.05)
    assert iterative.factor == pytest.approx(exact.factor, rel=0.1)
    final = copy.deepcopy(kernel)
    final.outputscale = kernel.outputscale.detach() * iterative.factor
    gp = fit_calibrated(final, x, y, iterative)
    plain = RandomFeatureGP(copy.deepcopy(final), noise=iterative.noise).fit(x, y)
    xq = x[:40]
    torch.testing.assert_close(gp.predict(xq), plain.predict(xq), rtol=1e-4, atol=1e-5)


def test_float32_data_calibrates_and_fits_as_float64_data_on_the_weight_path():
    # 20,000 rows of a smooth function with noise variance 1e-4: the Gram matrix's largest
    # eigenvalue grows like N, and a float32 conditioning bound (1e-5 of it) binds there,
    # holding the noise above the evidence's maximum (27% above it here). The weight path
    # sums and factorises in float64, so float32 inputs give the float64 model: the same
    # features (float32 rounding of the inputs aside) and the same scales.
    from rfgp.recipes import calibrated_fit

    g = gen(7)
    x = torch.rand(20_000, 2, generator=g, dtype=torch.float32)
    f = torch.sin(5 * x[:, 0]) * x[:, 1]
    y = f + 0.01 * torch.randn(20_000, generator=g)
    kernel = ScaleKernel(FourierFeatureKernel(256, sampling="orthogonal", input_dim=2,
                                              ard_num_dims=2, seed=3))
    kernel.base_kernel.lengthscale = torch.tensor([[0.3, 0.5]])
    fits = {dt: calibrated_fit(copy.deepcopy(kernel).to(dt), x.to(dt), (y - y.mean()).to(dt),
                               noise=1.0, solve="weight") for dt in (torch.float32, DT)}
    noise32, noise64 = (float(fits[dt].noise) for dt in (torch.float32, DT))
    assert noise64 < 4e-4  # the features fit the function: the noise is near the truth's
    assert noise32 == pytest.approx(noise64, rel=1e-3)
    xq = torch.rand(500, 2, generator=g)
    mean32 = fits[torch.float32].predict(xq).double()
    mean64 = fits[DT].predict(xq.double())
    # float32 rounding of inputs and features moves the mean by far less than the noise
    assert float((mean32 - mean64).abs().max()) < 1e-3


def test_a_served_evidence_is_dropped_when_the_outputscale_changes_after_the_fit():
    # The served estimate belongs to the fitted model: a new outputscale makes a new model,
    # whose evidence is estimated anew (never the stale value), within its standard error of
    # the exact evidence of the same features at the new outputscale.
    from rfgp.recipes import fit_auto

    g = gen(12)
    n = 1500
    x = torch.rand(n, 3, generator=g, dtype=DT)
    y = 37.0 * (torch.sin(6 * x[:, 0]) + 0.05 * torch.randn(n, generator=g, dtype=DT))
    y = y - y.mean()
    gp = fit_auto(x, y, solve="cg", num_features=512, seed=0, local_search=False,
                  lengthscale_draws=0, cv_folds=0)
    served = float(gp.log_marginal_likelihood())
    assert gp._state.solver.known_evidence is not None
    gp.kernel.outputscale = gp.kernel.outputscale.detach() * 4
    again = float(gp.log_marginal_likelihood())
    assert gp._state.solver.known_evidence is None and again != served
    exact = float(RandomFeatureGP(gp.kernel, noise=gp.noise.detach(), solve="weight",
                                  prior_mean=gp.prior_mean)
                  .fit(x, y).log_marginal_likelihood())
    assert abs(again - exact) <= 5 * gp._state.solver.evidence_standard_error + 1e-9 * abs(exact)


@pytest.mark.parametrize("columns", [1, 2])
def test_a_cg_fit_serves_its_calibration_evidence_until_it_is_refitted(columns):
    # The Krylov calibration estimated the evidence of the very model the CG fit fits: its
    # log_marginal_likelihood() is that estimate (no new probes), within the estimate's own
    # standard error of the exact evidence of the same features (8 probes: a deviation beyond
    # 5 estimated standard errors has probability below 2e-3 under Student's t with 7 degrees
    # of freedom), in the data's units; a new noise drops it.
    from rfgp.recipes import fit_auto

    g = gen(11)
    n = 1500
    x = torch.rand(n, 3, generator=g, dtype=DT)
    f = torch.sin(6 * x[:, 0]) + x[:, 1] ** 2
    y = torch.stack([(1 + t) * f + 0.05 * torch.randn(n, generator=g, dtype=DT)
                     for t in range(columns)], -1).squeeze(-1) * 37.0  # not a power of two
    y = y - y.mean(0)
    gp = fit_auto(x, y, solve="cg", num_features=512, seed=0, local_search=False,
                  lengthscale_draws=0, cv_folds=0)
    solver = gp._state.solver
    assert gp.solve_used == "cg" and solver.known_evidence is not None
    served = float(gp.log_marginal_likelihood())
    error = gp._state.solver.evidence_standard_error
    assert (served, error) == solver.known_evidence and error > 0
    exact = float(RandomFeatureGP(gp.kernel, noise=gp.noise.detach(), solve="weight",
                                  prior_mean=gp.prior_mean)
                  .fit(x, y).log_marginal_likelihood())
    assert abs(served - exact) <= 5 * error + 1e-9 * abs(exact)
    # A new noise: a new factorisation, a new estimate of the new model's evidence.
    gp.noise = gp.noise.detach() * 2
    again = float(gp.log_marginal_likelihood())
    assert gp._state.solver.known_evidence is None
    exact = float(RandomFeatureGP(gp.kernel, noise=gp.noise.detach(), solve="weight",
                                  prior_mean=gp.prior_mean)
                  .fit(x, y).log_marginal_likelihood())
    assert abs(again - exact) <= 5 * gp._state.solver.evidence_standard_error + 1e-9 * abs(exact)
