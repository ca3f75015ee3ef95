"""The CG path through the rows' form: with more features than rows the calibration runs on
products with G = Phi Phi^T (N x N) and the fit solves through one Cholesky factor of
I + c G. Both are the same mathematics as the weight space's, so they are checked against
it: the exact evidence maximum, the weight-space posterior, the exact log evidence."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from gpytorch.kernels import ScaleKernel

from rfgp import RandomFeatureGP
from rfgp.inference import calibrate_scales, calibrated_fit, fit_calibrated
from rfgp.inference._calibrated_fit import rows_route_open
from rfgp.inference._calibration import kernel_spectral_statistics, maximize_scale_evidence
from rfgp.inference._cg_cost import iterative_fit_cost, rows_fit_cost, rows_route
from rfgp.inference._cg_rows import RowsFit, fit_by_rows
from rfgp.inference._feature_map import FeatureMap
from rfgp.inference._feature_operator import FeatureOperator
from rfgp.inference._krylov_calibration import krylov_scale_calibration
from rfgp.inference._krylov_features import calibrate_by_rows
from rfgp.kernels import FourierFeatureKernel
from rfgp.recipes._final_cost import cg_route_costs
from tests.helpers import DT, gen


def _problem(n=300, num_features=512, columns=1, seed=0, noise=0.05):
    g = gen(seed)
    x = torch.rand(n, 2, generator=g, dtype=DT)
    f = torch.sin(6 * x[:, 0]) * x[:, 1]
    y = torch.stack([(1 + t) * f + noise * torch.randn(n, generator=g, dtype=DT)
                     for t in range(columns)], -1).squeeze(-1)
    kernel = ScaleKernel(FourierFeatureKernel(num_features, sampling="orthogonal", input_dim=2,
                                              ard_num_dims=2, seed=seed)).double()
    kernel.base_kernel.lengthscale = torch.tensor([[0.3, 0.5]], dtype=DT)
    return kernel, x, y - y.mean(0)


def _exact_calibration(kernel, x, y, noise):
    """The exact maximum of the feature model's evidence (one eigendecomposition)."""
    with torch.no_grad():
        z = FeatureMap(kernel).real_rows(x)
    evidence = kernel_spectral_statistics(z @ z.T, y.reshape(x.shape[0], -1))
    return maximize_scale_evidence(evidence, noise, 0.0)


@pytest.mark.parametrize("columns", [1, 2])
def test_the_rows_calibration_finds_the_exact_evidence_maximum(columns):
    # The Krylov calibration on products with Phi Phi^T maximises the same evidence as the
    # weight space's: its noise within 1% of the exact maximum (the root is accepted within
    # 10% in c, where the profile is flat to second order), its log evidence within 5 of its
    # own standard errors (8 probes: beyond that has probability below 2e-3 under Student's t
    # with 7 degrees of freedom) and a 1e-4 relative allowance for the Galerkin projection.
    kernel, x, y = _problem(columns=columns, seed=columns)
    factor, noise, loss = _exact_calibration(kernel, x, y, 0.1)
    out, gram = calibrate_by_rows(kernel, x, y, 0.1, generator=torch.Generator().manual_seed(0))
    assert tuple(gram.shape) == (x.shape[0], x.shape[0])
    assert out.noise == pytest.approx(noise, rel=0.01)
    exact = -loss / y.numel()
    assert abs(out.log_evidence - exact) <= 5 * out.standard_error + 1e-4 * abs(exact)


def test_the_function_space_profile_is_the_weight_spaces_on_the_same_features():
    # One model, two forms: the weight space's (G = Phi^T Phi, b = Phi^T y) and the rows'
    # (G = Phi Phi^T, b = y) give the same root and evidence up to their probes' spread.
    kernel, x, y = _problem(n=500, num_features=256, seed=4)
    with torch.no_grad():
        z = FeatureMap(kernel).real_rows(x)
    weight = krylov_scale_calibration(lambda v: z.T @ (z @ v), z.T @ y, float(y @ y), 500, 0.1,
                                      generator=torch.Generator().manual_seed(1))
    rows = krylov_scale_calibration(lambda v: z @ (z.T @ v), y, float(y @ y), 500, 0.1,
                                    generator=torch.Generator().manual_seed(1),
                                    function_space=True)
    assert rows.noise == pytest.approx(weight.noise, rel=0.01)
    spread = 5 * math.hypot(rows.standard_error, weight.standard_error)
    assert abs(rows.log_evidence - weight.log_evidence) <= spread


@pytest.mark.parametrize("columns", [1, 2])
def test_the_fit_through_the_rows_is_the_weight_space_posterior(columns):
    # Woodbury's identity makes the rows' solve the weight space's: the means, variances and
    # joint covariances of the same kernel and noise agree to rounding, without a CG
    # iteration, and the sketch waits for a solve that needs it.
    kernel, x, y = _problem(columns=columns, seed=5 + columns)
    assert rows_route_open(x, kernel)
    gp = calibrated_fit(kernel, x, y, noise=0.1, solve="cg")
    solver = gp._state.solver
    assert gp.solve_used == "cg" and solver.iterations == 0 and solver.sketch_pending
    plain = RandomFeatureGP(copy.deepcopy(gp.kernel), noise=gp.noise.detach().clone(),
                            solve="weight").fit(x, y)
    xq = torch.rand(25, 2, generator=gen(9), dtype=DT)
    with torch.no_grad():
        mean, std = gp.predict(xq, return_std=True)
        mean0, std0 = plain.predict(xq, return_std=True)
        cov = gp.posterior(xq).covariance_matrix
        cov0 = plain.posterior(xq).covariance_matrix
    torch.testing.assert_close(mean, mean0, rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(std, std0, rtol=1e-7, atol=1e-10)
    torch.testing.assert_close(cov, cov0, rtol=1e-7, atol=1e-10)
    assert solver.variance_routes[0] == "dense"
    # The served evidence is the calibration's estimate of this model's.
    served = float(gp.log_marginal_likelihood())
    exact = float(plain.log_marginal_likelihood())
    assert abs(served - exact) <= 5 * solver.evidence_standard_error + 1e-9 * abs(exact)


def test_the_sketch_deferred_by_the_rows_fit_is_built_by_the_first_solve():
    kernel, x, y = _problem(seed=12)
    gp = calibrated_fit(kernel, x, y, noise=0.1, solve="cg")
    solver = gp._state.solver
    assert solver.sketch_pending and solver.preconditioners[0].rank == 0
    rhs = torch.randn(solver.operator.width, 1, generator=gen(1), dtype=DT)
    with torch.no_grad():
        result = solver.solve(rhs, [0], "a test solve")
    assert not solver.sketch_pending and solver.preconditioners[0].rank > 0
    # the solve is B^-1 rhs, which the rows' mean weights also are of their own rhs
    torch.testing.assert_close(solver.operator.apply(result.solution, [0]), rhs,
                               rtol=0, atol=1e-5 * float(rhs.norm()))


def test_a_refit_at_a_new_noise_goes_by_cg_and_matches_the_weight_space():
    kernel, x, y = _problem(seed=13)
    gp = calibrated_fit(kernel, x, y, noise=0.1, solve="cg")
    gp.noise = gp.noise.detach() * 3
    plain = RandomFeatureGP(copy.deepcopy(gp.kernel), noise=gp.noise.detach().clone(),
                            solve="weight").fit(x, y)
    xq = torch.rand(10, 2, generator=gen(2), dtype=DT)
    with torch.no_grad():
        torch.testing.assert_close(gp.predict(xq), plain.predict(xq), rtol=1e-4, atol=1e-6)
    assert gp._state.solver.iterations > 0 and not gp._state.solver.sketch_pending


def test_a_saved_rows_fit_loads_and_predicts_as_before(tmp_path):
    kernel, x, y = _problem(seed=14)
    gp = calibrated_fit(kernel, x, y, noise=0.1, solve="cg")
    xq = torch.rand(10, 2, generator=gen(3), dtype=DT)
    with torch.no_grad():
        before = gp.predict(xq, return_std=True)
    path = tmp_path / "rows.pt"
    torch.save(gp.state_dict(), path)
    again = RandomFeatureGP(copy.deepcopy(gp.kernel), noise=gp.noise.detach().clone(),
                            solve="cg")
    again.load_state_dict(torch.load(path, weights_only=False))
    assert again._state.solver.sketch_pending
    with torch.no_grad():
        after = again.predict(xq, return_std=True)
    for a, b in zip(before, after):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-9)


def test_fit_by_rows_declines_what_its_single_noise_form_cannot_hold():
    # A noise per row (or per column) has no single K = I + G / s: the fit goes by CG.
    fm = FeatureMap(FourierFeatureKernel(64, seed=0).double())
    x = torch.rand(12, 2, generator=gen(4), dtype=DT)
    y = torch.randn(12, 2, generator=gen(5), dtype=DT)
    phi = fm.rows(x)
    per_row = FeatureOperator(fm, [(x, y, torch.full((12, 2), 0.1, dtype=DT))], False, DT,
                              chunk=4, cache_bytes=1 << 20)
    assert fit_by_rows(per_row, RowsFit(phi @ phi.T), per_row.noise_groups()) is None
    columns = FeatureOperator(fm, [(x, y, None)], False, DT, chunk=4, cache_bytes=1 << 20)
    columns.column_noise = torch.tensor([0.1, 0.2], dtype=DT)
    assert fit_by_rows(columns, RowsFit(phi @ phi.T), columns.noise_groups()) is None
    other = FeatureOperator(fm, [(x, y, None)], False, DT, chunk=4, cache_bytes=1 << 20)
    other.column_noise = torch.tensor([0.1, 0.1], dtype=DT)
    assert fit_by_rows(other, RowsFit(phi[:6] @ phi[:6].T), other.noise_groups()) is None
    fitted = fit_by_rows(other, RowsFit(phi @ phi.T), other.noise_groups())
    b = torch.eye(64, dtype=DT) + phi.T @ phi / 0.1
    torch.testing.assert_close(fitted[0], torch.linalg.solve(b, phi.T @ y / 0.1))


@pytest.mark.parametrize("cache_bytes", [0, 5 * 64 * 8, 1 << 20])
def test_the_rows_products_need_not_keep_the_features(cache_bytes):
    # K = I + Psi Psi^T and Psi Q^T from an operator that keeps none, some or all of its
    # features (those not kept are computed again, into one shared buffer): the same numbers,
    # so the fit through the rows and its variances serve where the features exceed the cache.
    fm = FeatureMap(FourierFeatureKernel(64, seed=0).double())
    x = torch.rand(13, 2, generator=gen(6), dtype=DT)
    y = torch.randn(13, 1, generator=gen(7), dtype=DT)
    op = FeatureOperator(fm, [(x, y, None)], False, DT, chunk=4, cache_bytes=cache_bytes)
    op.column_noise = torch.tensor([0.5], dtype=DT)
    phi = fm.rows(x)
    with torch.no_grad():
        torch.testing.assert_close(op.row_matrix(0), torch.eye(13, dtype=DT) + phi @ phi.T / 0.5)
        q = torch.randn(3, 64, generator=gen(8), dtype=DT)
        torch.testing.assert_close(op.row_products(q, 0), phi @ q.T / 0.5**0.5)
        weights, inverse = fit_by_rows(op, RowsFit(phi @ phi.T), op.noise_groups())
    b = torch.eye(64, dtype=DT) + phi.T @ phi / 0.5
    torch.testing.assert_close(weights, torch.linalg.solve(b, phi.T @ y / 0.5))
    torch.testing.assert_close(inverse.variances(q),
                               (q * torch.linalg.solve(b, q.T).T).sum(-1))


def test_the_features_route_is_kept_where_the_rows_are_not_fewer():
    kernel, x, y = _problem(n=600, num_features=256, seed=15)  # 256 features, 600 rows
    assert not rows_route_open(x, kernel)
    calibration = calibrate_scales(kernel, x, y, 0.1, path="cg")
    assert not isinstance(calibration.reuse, RowsFit)
    # nor for features of several outputs per input, whose rows' matrix is N p x N p
    from rfgp.kernels import CurlFreeFeatureKernel

    vector = ScaleKernel(CurlFreeFeatureKernel(512, input_dim=2, seed=0)).double()
    assert not rows_route_open(x[:100], vector)
    # and a caller may refuse the rows where they are open
    kernel, x, y = _problem(seed=16)
    calibration = calibrate_scales(kernel, x, y, 0.1, path="cg", rows=False)
    assert not isinstance(calibration.reuse, RowsFit)
    final = copy.deepcopy(kernel)
    final.outputscale = kernel.outputscale.detach() * calibration.factor
    gp = fit_calibrated(final, x, y, calibration)
    assert gp._state.solver.iterations > 0


def test_the_routes_are_weighed_by_their_costs():
    # G costs N^2 D / 2 once where every product pass reads N D entries twice, and the
    # features' route forms the rows' K for its variances anyway: with several features per
    # row the rows' route is the cheaper, near the rows the features' (few iterations); below
    # the rows, or streamed, the rows' form is not open at all.
    assert rows_route(12000, 32768) and not rows_route(12000, 8192)
    assert not rows_route(12000, 32768, streamed=True)
    by_features, by_rows = cg_route_costs(12000, 65536, 26, 1)
    assert by_rows < by_features
    by_features, by_rows = cg_route_costs(14000, 32768, 18, 1)
    assert by_features < by_rows
    assert cg_route_costs(12000, 8192, 26, 1)[1] == math.inf
    # with more iterations the features' route pays per pass, the rows' per product with G
    many = rows_fit_cost(12000, 32768, 26, iterations=120) - rows_fit_cost(12000, 32768, 26)
    more = (iterative_fit_cost(12000, 32768, 26, iterations=120)
            - iterative_fit_cost(12000, 32768, 26))
    assert 0 < many < more
    # the rows' cost grows with D only through forming G and the features
    step = rows_fit_cost(12000, 65536, 26) - rows_fit_cost(12000, 32768, 26)
    assert step == pytest.approx(32768 * (12000**2 / 2 / 2.0 + 12000 * (2 * 26 + 9)))


@pytest.mark.parametrize("bad, match", [
    ("nan_y", "finite"), ("inf_x", "finite"), ("empty", "x"), ("scalar_y", "y"),
])
def test_bad_input_to_a_fit_through_the_rows_is_refused_at_the_edge(bad, match):
    kernel, x, y = _problem(seed=17)
    assert rows_route_open(x, kernel)
    if bad == "nan_y":
        y = y.clone()
        y[3] = float("nan")
    elif bad == "inf_x":
        x = x.clone()
        x[5, 0] = float("inf")
    elif bad == "empty":
        x, y = x[:0], y[:0]
    else:
        y = y[0]
    with pytest.raises((ValueError, TypeError), match=match):
        calibrated_fit(kernel, x, y, noise=0.1, solve="cg")


def test_a_fit_through_the_rows_follows_the_targets_scale_and_a_changed_kernel():
    # Targets a million times larger: about the same model in their units (the noise times
    # 1e12, within the few percent that accepting a root within 10% in c leaves), and through
    # the rows exactly the weight-space posterior of its own kernel and noise; and an
    # outputscale changed after the fit gives the new model's posterior, never the fitted one's.
    kernel, x, y = _problem(seed=18)
    gp = calibrated_fit(kernel, x, y, noise=0.1, solve="cg")
    big = calibrated_fit(kernel, x, y * 1e6, noise=0.1 * 1e12, solve="cg")
    assert big._state.solver.sketch_pending
    xq = torch.rand(8, 2, generator=gen(4), dtype=DT)
    with torch.no_grad():
        assert float(big.noise) == pytest.approx(float(gp.noise) * 1e12, rel=0.05)
        same = RandomFeatureGP(copy.deepcopy(big.kernel), noise=big.noise.detach().clone(),
                               solve="weight").fit(x, y * 1e6)
        for a, b in zip(big.predict(xq, return_std=True), same.predict(xq, return_std=True)):
            torch.testing.assert_close(a / 1e6, b / 1e6, rtol=1e-7, atol=1e-9)
        gp.kernel.outputscale = gp.kernel.outputscale.detach() * 4
        plain = RandomFeatureGP(copy.deepcopy(gp.kernel), noise=gp.noise.detach().clone(),
                                solve="weight").fit(x, y)
        mean, std = gp.predict(xq, return_std=True)
        mean0, std0 = plain.predict(xq, return_std=True)
    torch.testing.assert_close(mean, mean0, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(std, std0, rtol=1e-3, atol=1e-6)
