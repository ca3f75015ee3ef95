r"""Low-rank predictive variances of the iterative solve (rfgp/inference/_cg_variance.py).

The facts checked: with :math:`\hat E \preceq E` and :math:`\tau \ge \|E - \hat E\|`, the
low-rank covariance satisfies :math:`\Sigma \preceq \hat\Sigma \preceq (1 + \tau)\Sigma`
(every variance is at least the exact one and at most :math:`1 + \tau` times it), and
:math:`\tau` bounds :math:`\|E - \hat E\|`. The exact :math:`\Sigma` comes from the Cholesky
(weight-space) solve of the same features; the iterative mean solve only enters through its
tolerance (``TIGHT``), so "at least the exact one" holds up to a relative ``SLACK``.
"""

from __future__ import annotations

import math

import pytest
import torch
from gpytorch.kernels import ScaleKernel

from rfgp import RandomFeatureGP
from rfgp.inference import _cg_routes as cg_routes
from rfgp.inference._cg_dense import (
    ITERATIVE_RATE_SHARE,
    PROBE_ROWS,
    DenseInverse,
    dense_cost,
    dense_pays,
    forecast_form,
    keep_building,
)
from rfgp.inference._cg_routes import VarianceRoutes, served_factor
from rfgp.inference._cg_rows import RowDenseInverse, row_precision_holds
from rfgp.inference._cg_variance import (
    LANCZOS_RUNS,
    LANCZOS_STEPS,
    START_RANK,
    LowRankInverse,
    norm_bound,
)
from rfgp.inference._feature_map import FeatureMap
from rfgp.inference._feature_operator import FeatureOperator
from rfgp.inference._nystrom import NystromPreconditioner
from rfgp.kernels import FourierFeatureKernel, PolynomialSketchKernel

DT = torch.float64
TIGHT = 1e-11
# Rounding of B's products in float64 (condition number ~1e5 here): far below every tolerance.
SLACK = 1e-9


def _data(n=600, d=3, columns=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, d, generator=g, dtype=DT)
    f = torch.sin(5 * x[:, 0]) + x[:, 1]
    y = f if columns is None else torch.stack([f * (c + 1) for c in range(columns)], -1)
    return x, y + 0.1 * torch.randn(y.shape, generator=g, dtype=DT), torch.rand(60, d,
                                                                                  generator=g,
                                                                                  dtype=DT)


def _fourier(num=768):
    kernel = FourierFeatureKernel(num, seed=0).double()
    kernel.lengthscale = 0.2
    return kernel


def _complex(num=384):
    return PolynomialSketchKernel(3, num, bias=1.0, projection="rademacher", complex=True,
                                  seed=0).double()


CASES = {
    "real": (_fourier, None, 0.01),
    "complex": (_complex, None, 0.01),
    "noise groups": (_fourier, 2, "rows"),
}


def _fit_pair(case, n=600, **options):
    """The weight-space and the CG fit of a case; the CG fit's variances come from the
    low-rank form (``cg_variance="lowrank"``) unless ``options`` say otherwise: on these
    small problems ``"auto"`` forms ``B`` at once, which costs less than any form."""
    options.setdefault("cg_variance", "lowrank")
    make_kernel, columns, noise = CASES[case]
    x, y, xt = _data(n=n, columns=columns)
    fit_noise = None
    if noise == "rows":
        fit_noise = 0.005 + 0.02 * torch.rand(y.shape, generator=torch.Generator().manual_seed(1),
                                              dtype=DT)
        fit_noise[:, 1] = 2 * fit_noise[:, 0]
        noise = 1.0
    exact = RandomFeatureGP(make_kernel(), noise=noise, solve="weight").fit(x, y, fit_noise)
    fast = RandomFeatureGP(make_kernel(), noise=noise, solve="cg", cg_tolerance=TIGHT,
                           **options).fit(x, y, fit_noise)
    return exact, fast, xt


@pytest.mark.parametrize("case", list(CASES))
def test_low_rank_variances_lie_between_the_exact_ones_and_their_bound(case):
    exact, fast, xt = _fit_pair(case, cg_variance_tolerance=1e-3)
    var0 = exact.predict(xt, return_std=True)[1].square()
    var1 = fast.predict(xt, return_std=True)[1].square()
    bounds = fast.cg_info["variance_bounds"]
    assert len(bounds) == len(fast.factorization_groups) == len(exact.factorization_groups)
    assert max(bounds) <= 1e-3
    ratio = (var1 / var0).reshape(xt.shape[0], -1)
    for cols, bound in zip(fast.factorization_groups, bounds):
        assert float(ratio[:, cols].min()) >= 1 - SLACK
        assert float(ratio[:, cols].max()) <= 1 + bound + SLACK


def _dense_excess(fast):
    """E = P^-1/2 B P^-1/2 - I of the fit's first group, and its low-rank form."""
    solver = fast._state.solver
    inverse = solver.low_rank_inverses()[0]
    op = solver.operator
    eye = torch.eye(op.width, dtype=op.vector_dtype)
    pre = solver.preconditioners[0]
    whitened = pre.inverse_sqrt(eye)
    excess = pre.inverse_sqrt(op.apply(whitened, [0] * op.width)) - eye
    basis = inverse.basis
    low = basis @ torch.diag(inverse.eigenvalues.to(basis.dtype)) @ basis.transpose(0, 1).conj()
    return 0.5 * (excess + excess.transpose(0, 1).conj()), low, inverse


@pytest.mark.parametrize("case", ["real", "complex"])
def test_the_bound_holds_for_the_neglected_part_of_the_excess(case):
    _, fast, _ = _fit_pair(case, cg_variance_tolerance=0.05)
    excess, low, inverse = _dense_excess(fast)
    # E is positive semi-definite (P <= B) and its sketch under-approximates it.
    scale = float(torch.linalg.eigvalsh(excess).abs().max())
    assert float(torch.linalg.eigvalsh(excess).min()) >= -SLACK * max(scale, 1.0)
    neglected = torch.linalg.eigvalsh(excess - low)
    assert float(neglected.min()) >= -SLACK * max(scale, 1.0)
    assert float(neglected.max()) <= inverse.bound
    # The bound is a Lanczos estimate over 1 - eps plus the rounding allowance of the sketch
    # (10 eps sqrt(W) ||P||), not far above the truth; or tr F (F >= 0, so ||F|| <= tr F),
    # taken without a Lanczos run where it is already within the tolerance.
    trace = float(torch.linalg.eigvalsh(excess - low).clamp_min(0).sum())
    if inverse.bound <= 0.05 and inverse.bound >= trace:
        return
    pre = fast._state.solver.preconditioners[0]
    allowance = 10 * torch.finfo(DT).eps * excess.shape[0] ** 0.5 * (1 + float(
        pre.eigenvalues.max()))
    assert inverse.bound <= 2.0 * float(neglected.max()) + allowance


@pytest.mark.parametrize("room", [True, False])
def test_a_small_rank_cap_reports_its_bound_and_refines_each_query_to_the_tolerance(
        room, monkeypatch):
    # The dense route would answer these 60 rows more cheaply; "lowrank" never forms B, and
    # "auto" does not without room for it.
    monkeypatch.setattr(cg_routes, "dense_fits", lambda *args: room)
    variance = "lowrank" if room else "auto"
    x, y, xt = _data(n=1500)
    make = lambda: _fourier(1024)  # noqa: E731
    exact = RandomFeatureGP(make(), noise=1e-3, solve="weight").fit(x, y)
    var0 = exact.predict(xt, return_std=True)[1].square()
    # The variances do not depend on the mean solve: the default CG tolerance serves.
    capped = RandomFeatureGP(make(), noise=1e-3, solve="cg", preconditioner_rank=16,
                             cg_variance_rank=8, cg_variance_tolerance=1e-3,
                             cg_variance=variance).fit(x, y)
    var1 = capped.predict(xt, return_std=True)[1].square()
    (bound,) = capped.cg_info["variance_bounds"]
    assert capped.cg_info["variance_ranks"] == [8] and bound > 1e-3
    assert capped.cg_info["variance_routes"] == ["refined"]
    # Beyond the bound, a CG per query preconditioned by the low-rank form stops at the
    # certified bracket [exact, (1 + tolerance) exact].
    assert float((var1 / var0).min()) >= 1 - SLACK
    assert float((var1 / var0).max()) <= 1 + 1e-3
    grown = RandomFeatureGP(make(), noise=1e-3, solve="cg", preconditioner_rank=16,
                            cg_variance_tolerance=1e-2, cg_variance="lowrank").fit(x, y)
    var2 = grown.predict(xt, return_std=True)[1].square()
    (rank,), (bound,) = grown.cg_info["variance_ranks"], grown.cg_info["variance_bounds"]
    assert rank > START_RANK and bound <= 1e-2
    assert float((var2 / var0).min()) >= 1 - SLACK
    assert float((var2 / var0).max()) <= 1 + bound


def test_a_form_between_the_tolerance_and_twice_it_serves_scaled_within_the_tolerance():
    # The form at rank 32 has a bound tau (about 0.05); at a tolerance t = 0.75 tau (tau > t,
    # but within 2t / (1 - t)) it serves without refinement, its variances times
    # (1 + t) / (1 + tau): each within t of the exact one, either way, where the unscaled
    # form could be up to tau > t above it.
    x, y, xt = _data(n=1500)

    def make():
        kernel = _fourier(1024)
        kernel.lengthscale = 0.8
        return kernel

    exact = RandomFeatureGP(make(), noise=0.1, solve="weight").fit(x, y)
    var0 = exact.predict(xt, return_std=True)[1].square()
    options = dict(noise=0.1, solve="cg", preconditioner_rank=16, cg_variance_rank=32,
                   cg_variance="lowrank")
    probe = RandomFeatureGP(make(), cg_variance_tolerance=1e-8, **options).fit(x, y)
    probe.predict(xt[:2], return_std=True)
    (tau,) = probe.cg_info["variance_bounds"]
    t = 0.75 * tau
    assert tau <= 2 * t / (1 - t)
    served = RandomFeatureGP(make(), cg_variance_tolerance=t, **options).fit(x, y)
    var1 = served.predict(xt, return_std=True)[1].square()
    assert served.cg_info["variance_routes"] == ["lowrank"]
    assert served.cg_info["variance_bounds"] == [tau]  # the same form
    ratio = var1 / var0
    assert float((ratio - 1).abs().max()) <= t + SLACK
    # and they are the form's own (upper-bound) variances times the factor
    k = served_factor(tau, t)
    assert k < 1.0
    probe_var = probe.predict(xt, return_std=True)[1].square()  # refined: exact to 1e-8
    torch.testing.assert_close(ratio, var1 / probe_var, rtol=1e-6, atol=0)


def test_the_served_factor_keeps_the_bracket_within_the_tolerance():
    for t in (1e-4, 1e-2, 0.3):
        for tau in (0.5 * t, t, 1.5 * t, 2 * t / (1 - t)):
            k = served_factor(tau, t)
            # the form's v_hat in [v, (1 + tau) v]: k v_hat in [k v, k (1 + tau) v]
            assert k <= 1.0
            assert k * (1 + tau) <= 1 + t + 1e-12 and k >= 1 - t - 1e-12
            assert (k == 1.0) == (tau <= t)


def _low_rank_capped(**options):
    """A fit whose low-rank form stays above its tolerance (rank cap 8, tolerance 1e-8), so
    that its variances take the refined or the dense route."""
    return dict(dict(preconditioner_rank=16, cg_variance_rank=8, cg_variance_tolerance=1e-8,
                     cg_variance="auto"), **options)


@pytest.mark.parametrize("case", list(CASES))
def test_the_dense_route_is_exact_with_its_gradient_and_joint_covariance(case, monkeypatch):
    if case == "complex":
        # The sketch's Gram has rank ~20, so one refining iteration per row beats forming B;
        # the route is forced to check the Hermitian factor.
        monkeypatch.setattr(cg_routes, "dense_pays", lambda *args: True)
    exact, fast, xt = _fit_pair(case, **_low_rank_capped())
    q0, q1 = xt.clone().requires_grad_(True), xt.clone().requires_grad_(True)
    std0 = exact.predict(q0, return_std=True)[1]
    std1 = fast.predict(q1, return_std=True)[1]
    assert fast.cg_info["variance_routes"] == ["dense"] * len(fast.factorization_groups)
    torch.testing.assert_close(std1, std0, rtol=1e-9, atol=0)
    std0.sum().backward()
    std1.sum().backward()
    torch.testing.assert_close(q1.grad, q0.grad, rtol=1e-7, atol=1e-10)
    cov0 = exact.posterior(xt[:12]).covariance_matrix
    cov1 = fast.posterior(xt[:12]).covariance_matrix
    torch.testing.assert_close(cov1, cov0, rtol=1e-9, atol=1e-12)


def test_the_dense_route_comes_first_where_it_costs_less_than_the_forecast_form():
    # W = 768 features on 600 rows: forming B (N W^2 + W^3 / 3) costs less than the form's
    # forecast build at rank 8 plus a refinement of every row, so no form is built.
    exact, fast, xt = _fit_pair("real", **_low_rank_capped())
    solver = fast._state.solver
    assert solver.routes.dense_first(0, xt.shape[0])
    var0 = exact.predict(xt, return_std=True)[1].square()
    var1 = fast.predict(xt, return_std=True)[1].square()
    assert fast.cg_info["variance_routes"] == ["dense"]
    assert fast.cg_info["variance_ranks"] is None  # no low-rank form was built
    torch.testing.assert_close(var1, var0, rtol=1e-9, atol=0)


def test_a_built_form_weighs_the_dense_route_on_the_rows_asked_for_and_a_refit_drops_it():
    exact, fast, xt = _fit_pair("real", **_low_rank_capped())
    solver = fast._state.solver
    (low,) = solver.low_rank_inverses()  # a form exists: the probe's rule decides
    assert low.bound > 1e-8
    fast.predict(xt[:PROBE_ROWS], return_std=True)  # too few rows to weigh: refined
    assert fast.cg_info["variance_routes"] == ["refined"]
    (iterations,) = solver.routes.refine_iterations.values()
    op, (pre,) = solver.operator, solver.preconditioners
    pays = dense_pays(op.width, solver.num_rows, xt.shape[0], iterations, pre.rank, low.rank)
    fast.predict(xt, return_std=True)
    assert fast.cg_info["variance_routes"] == ["dense" if pays else "refined"]
    assert pays  # 60 rows at about 100 iterations each against a 768-wide factor
    # A later small query reuses the factor, exact.
    var0 = exact.predict(xt[:3], return_std=True)[1].square()
    var1 = fast.predict(xt[:3], return_std=True)[1].square()
    assert fast.cg_info["variance_routes"] == ["dense"]
    torch.testing.assert_close(var1, var0, rtol=1e-9, atol=0)
    fast.noise = 0.02  # a new noise drops the factor (a stale one would give noise 0.01's)
    exact.noise = 0.02
    torch.testing.assert_close(fast.predict(xt, return_std=True)[1],
                               exact.predict(xt, return_std=True)[1], rtol=1e-9, atol=0)


def test_the_rows_of_a_chunked_prediction_are_weighed_together(monkeypatch):
    # predict() computes 8-row chunks; the decision sees all 60 rows, not 8.
    seen = []
    original = VarianceRoutes.dense_first

    def spy(self, g, rows, floor=0.0, forms=None):
        seen.append(rows)
        return original(self, g, rows, floor, forms)

    monkeypatch.setattr(VarianceRoutes, "dense_first", spy)
    _, fast, xt = _fit_pair("real", **_low_rank_capped())
    fast.predict(xt, return_std=True, chunk_size=8)
    assert seen[0] == xt.shape[0]
    assert fast._state.solver.expected_rows == 0  # reset after the prediction


def test_the_dense_route_is_refused_where_float32_cannot_resolve_b():
    x, y, xt = _data(n=1500)
    # noise 1e-3: B's condition number (~1e5) is within float32's 1 / eps for CG, but a
    # Cholesky factor's relative error kappa eps would exceed a tenth of the 1% tolerance.
    gp = RandomFeatureGP(_fourier(1024).float(), noise=1e-3, solve="cg",
                         **_low_rank_capped(cg_variance_tolerance=1e-2)).fit(x.float(), y.float())
    (pre,) = gp._state.solver.preconditioners
    assert (1 + float(pre.eigenvalues.max())) * torch.finfo(torch.float32).eps > 1e-3
    assert not any(gp._state.solver.routes.dense_forms())
    gp.predict(xt.float(), return_std=True)
    assert gp.cg_info["variance_routes"] == ["refined"]


def test_dense_pays_compares_the_two_costs():
    # Forming B costs 5 N W^2 / 8 + W^3 / 3 and W^2 per row; refining costs 2 N W k per row
    # at the share s of the rate: dense from M = (5 N W^2 / 8 + W^3 / 3) / (2 N W k / s - W^2).
    n, w, k = 10**5, 1000, 10
    rows = (0.625 * n * w * w + w**3 / 3) / (2 * n * w * k / ITERATIVE_RATE_SHARE - w * w)
    assert not dense_pays(w, n, math.floor(rows), k)
    assert dense_pays(w, n, math.ceil(rows), k)
    assert not dense_pays(1000, 10**5, 10**6, 0)


def test_dense_inverse_of_complex_rows_is_the_hermitian_form():
    g = torch.Generator().manual_seed(2)
    a = torch.randn(6, 6, generator=g, dtype=torch.complex128)
    b = a @ a.conj().T + torch.eye(6, dtype=torch.complex128)
    rows = torch.randn(4, 6, generator=g, dtype=torch.complex128)
    inv = DenseInverse(torch.linalg.cholesky(b))
    reference = rows @ torch.linalg.solve(b, rows.conj().T)
    var, cov = inv.predict(rows, True)
    torch.testing.assert_close(var, reference.diagonal().real)
    torch.testing.assert_close(cov, reference.real)


def test_joint_covariance_is_bracketed_in_the_loewner_order_and_differentiable():
    exact, fast, xt = _fit_pair("real", cg_variance_tolerance=0.05)
    q0, q1 = xt[:12].clone().requires_grad_(True), xt[:12].clone().requires_grad_(True)
    cov0 = exact.posterior(q0).covariance_matrix
    cov1 = fast.posterior(q1).covariance_matrix
    (bound,) = fast.cg_info["variance_bounds"]
    assert torch.equal(cov1, cov1.transpose(0, 1))
    c0, c1 = cov0.detach(), cov1.detach()
    scale = float(torch.linalg.eigvalsh(c0).max())
    assert float(torch.linalg.eigvalsh(c1 - c0).min()) >= -SLACK * scale
    assert float(torch.linalg.eigvalsh((1 + bound) * c0 - c1).min()) >= -SLACK * scale
    # The gradient is that of the low-rank form, which the tight tolerance makes exact.
    _, tight, _ = _fit_pair("real", cg_variance_tolerance=1e-9)
    q2 = xt[:12].clone().requires_grad_(True)
    cov2 = tight.posterior(q2).covariance_matrix
    cov0.sum().backward()
    cov2.sum().backward()
    assert float((q2.grad - q0.grad).abs().max() / q0.grad.abs().max()) < 1e-6


def test_std_gradient_of_complex_features_equals_the_cholesky_one():
    exact, fast, xt = _fit_pair("complex", cg_variance_tolerance=1e-9)
    q0, q1 = xt.clone().requires_grad_(True), xt.clone().requires_grad_(True)
    exact.predict(q0, return_std=True)[1].sum().backward()
    fast.predict(q1, return_std=True)[1].sum().backward()
    assert float((q1.grad - q0.grad).abs().max() / q0.grad.abs().max()) < 1e-6


def test_the_exact_option_solves_per_query_and_the_cache_follows_the_fit():
    exact, fast, xt = _fit_pair("real", cg_variance="exact")
    var0 = exact.predict(xt, return_std=True)[1].square()
    var1 = fast.predict(xt, return_std=True)[1].square()
    assert float(((var1 - var0) / var0).abs().max()) < 1e-6
    assert fast.cg_info["variance_ranks"] is None  # no low-rank form was built
    _, low, _ = _fit_pair("real")
    low.predict(xt, return_std=True)
    assert low.cg_info["variance_ranks"] is not None
    low.noise = 0.02  # the refactorisation drops it; the next variance rebuilds it
    var2 = low.predict(xt, return_std=True)[1].square()
    exact.noise = 0.02
    var3 = exact.predict(xt, return_std=True)[1].square()
    (bound,) = low.cg_info["variance_bounds"]
    # The rebuilt form's bracket [v, (1 + tau) v], scaled by k = min(1, (1 + t)/(1 + tau)) where
    # tau exceeds the tolerance t = 1e-2 (within 2t / (1 - t), where it serves): [k v, (1 + t) v]
    assert low.cg_info["variance_routes"] == ["lowrank"] and bound <= 2e-2 / 0.99
    k = served_factor(bound, 1e-2)
    ratio = var2 / var3
    assert k - SLACK <= float(ratio.min()) <= float(ratio.max()) <= min(1 + bound, 1.01) + SLACK
    low.float()
    assert low.cg_info["variance_ranks"] is None


def test_state_round_trip_recomputes_the_same_variances():
    _, fast, xt = _fit_pair("noise groups")
    std = fast.predict(xt, return_std=True)[1]
    loaded = RandomFeatureGP(_fourier(), solve="cg", cg_tolerance=TIGHT)
    loaded.load_state_dict(fast.state_dict())
    torch.testing.assert_close(loaded.predict(xt, return_std=True)[1], std, rtol=1e-12,
                               atol=0)


def test_features_without_signal_take_a_rank_zero_form_certified_by_the_trace():
    # Outputscale 1e-9 against noise 0.1: tr(B - I) ~ N 1e-8 is far below the tolerance, so
    # the form needs no sketch and no Lanczos run: no products with B at all.
    x, y, xt = _data()
    weak = ScaleKernel(_fourier()).double()
    weak.outputscale = 1e-9
    exact = RandomFeatureGP(ScaleKernel(_fourier()).double(), noise=0.1, solve="weight")
    exact.kernel.outputscale = 1e-9
    exact.fit(x, y)
    fast = RandomFeatureGP(weak, noise=0.1, solve="cg", cg_tolerance=TIGHT,
                           cg_variance="lowrank").fit(x, y)
    solver = fast._state.solver
    calls = []
    apply = solver.operator.apply
    solver.operator.apply = lambda v, cols: calls.append(v.shape[1]) or apply(v, cols)
    var1 = fast.predict(xt, return_std=True)[1].square()
    var0 = exact.predict(xt, return_std=True)[1].square()
    (rank,), (bound,) = fast.cg_info["variance_ranks"], fast.cg_info["variance_bounds"]
    # tr E <= tr(B - I) = N a / sigma^2 (each Fourier row has ||phi||^2 = a), plus rounding.
    assert rank == 0 and calls == [] and bound <= 1.001 * x.shape[0] * 1e-9 / 0.1
    assert float((var1 / var0).min()) >= 1 - SLACK
    assert float((var1 / var0).max()) <= 1 + bound + SLACK


def _norm_three_matrix():
    """A random symmetric 400 x 400 matrix of norm 3 (eigenvalues 3, 2.9 and 398 in [0, 1])."""
    g = torch.Generator().manual_seed(0)
    q = torch.linalg.qr(torch.randn(400, 400, generator=g, dtype=DT))[0]
    values = torch.cat([torch.tensor([3.0, 2.9], dtype=DT), torch.rand(398, generator=g,
                                                                       dtype=DT)])
    return q @ torch.diag(values) @ q.T


def test_norm_bound_brackets_the_largest_eigenvalue():
    a = _norm_three_matrix()
    bound = norm_bound(lambda v: a @ v, 400, DT, a.device, torch.Generator().manual_seed(1))
    assert 3.0 <= bound <= 3.0 * 1.2


def test_norm_bound_of_independent_runs_holds_over_many_starts_in_half_the_passes():
    # A top eigenvalue 1.0 barely above the next (0.999) and a mass of small ones: a short
    # run from a random start can fall well short of it. Each of 200 seeded bounds may do so
    # with probability at most 1e-4 (all runs short together), so with probability 0.98
    # none does; they run half the passes of one 24-step run and are not looser than it.
    g = torch.Generator().manual_seed(3)
    q = torch.linalg.qr(torch.randn(300, 300, generator=g, dtype=DT))[0]
    values = torch.cat([torch.tensor([1.0, 0.999], dtype=DT), 0.5 * torch.rand(298, generator=g,
                                                                              dtype=DT)])
    a = q @ torch.diag(values) @ q.T
    passes = []

    def product(v):
        passes.append(v.shape[1])
        return a @ v

    bounds = [norm_bound(product, 300, DT, a.device, torch.Generator().manual_seed(seed))
              for seed in range(200)]
    assert min(bounds) >= 1.0
    assert len(passes) == 200 * 12 and set(passes) == {LANCZOS_RUNS}
    single = [norm_bound(lambda v: a @ v, 300, DT, a.device,
                         torch.Generator().manual_seed(seed), steps=24, runs=1)
              for seed in range(20)]
    assert max(bounds) <= max(single)


def test_build_on_a_known_spectrum_is_exact_at_full_rank():
    b = torch.diag(torch.tensor([1e4, 50.0, 3.0, 1.5, 1.0, 1.0], dtype=DT))
    pre = NystromPreconditioner(torch.eye(6, 1, dtype=DT), torch.tensor([1e4 - 1], dtype=DT))
    inverse = LowRankInverse.build(lambda v: b @ v, pre, 1e-10, 6)
    rows = torch.randn(5, 6, generator=torch.Generator().manual_seed(0), dtype=DT)
    exact = ((rows @ torch.linalg.inv(b)) * rows).sum(-1)
    torch.testing.assert_close(inverse.variances(rows), exact, rtol=1e-10, atol=0)
    torch.testing.assert_close(inverse.covariance(rows), rows @ torch.linalg.inv(b) @ rows.T,
                               rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("kwargs, match", [
    ({"cg_variance": "fast"}, "cg_variance"),
    ({"cg_variance_tolerance": 0.0}, "cg_variance_tolerance"),
    ({"cg_variance_tolerance": 1.0}, "cg_variance_tolerance"),
    ({"cg_variance_rank": 0}, "cg_variance_rank"),
])
def test_bad_variance_settings_are_rejected_by_name(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RandomFeatureGP(_fourier(), solve="cg", **kwargs)


@pytest.mark.parametrize("case", ["real", "complex"])
def test_preconditioned_trace_is_the_trace_of_p_inverse_times_the_gram(case):
    _, fast, _ = _fit_pair(case)
    solver = fast._state.solver
    op, (pre,) = solver.operator, solver.preconditioners
    weights = pre.eigenvalues / (1 + pre.eigenvalues)
    t, m = op.preconditioned_trace(0, pre.basis, weights)
    gram = op.dense(0) - torch.eye(op.width, dtype=op.vector_dtype)
    expected = torch.diagonal(pre.inverse(gram)).real.sum()
    assert abs(t - float(expected)) <= 1e-10 * float(torch.diagonal(gram).real.sum())
    assert abs(m - float(torch.diagonal(gram).real.sum())) <= 1e-12 * m


def test_the_forecast_takes_the_measured_trace_and_the_rounding_shift():
    # A power law beyond the 512 held eigenvalues holds far more than the measured trace
    # says; rescaled to the measured mass, the forecast bound at rank r is at most the
    # k = r_P term of the sketch residual: mass + s + (mass + s W) / r; and no eigenvalue of
    # E + sI is below s, so neither is the bound.
    slow = 1e4 / torch.arange(1, 513, dtype=DT)
    width, rows, tol, cap, shift, mass = 8192, 10**4, 1e-2, 2048, 1e-3, 0.5
    _, plain, _, _ = forecast_form(slow, width, rows, tol, cap)
    rank, bound, _, _ = forecast_form(slow, width, rows, tol, cap, mass + shift * width, shift)
    assert bound < plain
    assert shift <= bound <= mass + shift + (mass + shift * width) / rank
    # a measured trace within the tolerance: the form is of rank 0 at no further cost
    assert forecast_form(slow, width, rows, tol, cap, 0.5 * tol, shift) == (0, 0.5 * tol, 0.0, 0)


def test_a_form_the_trace_shows_empty_is_taken_before_b_and_the_trace_pass_runs_once(
        monkeypatch):
    # Long lengthscales: the 64-rank preconditioner holds (almost) all of the features'
    # Gram, so the one-pass trace of E is within the tolerance and the form is of rank 0:
    # no reason to form B, whatever the rows.
    calls = []
    original = FeatureOperator.preconditioned_trace

    def counted(self, *args):
        calls.append(1)
        return original(self, *args)

    monkeypatch.setattr(FeatureOperator, "preconditioned_trace", counted)
    x, y, xt = _data()
    kernel = FourierFeatureKernel(256, seed=0).double()
    kernel.lengthscale = 3.0
    exact = RandomFeatureGP(FourierFeatureKernel(256, seed=0).double(), noise=0.01,
                            solve="weight")
    exact.kernel.lengthscale = 3.0
    exact.fit(x, y)
    fast = RandomFeatureGP(kernel, noise=0.01, solve="cg", cg_tolerance=TIGHT,
                           preconditioner_rank=64, cg_variance="auto").fit(x, y)
    var0 = exact.predict(xt, return_std=True)[1].square()
    var1 = fast.predict(xt, return_std=True)[1].square()
    assert fast.cg_info["variance_routes"] == ["lowrank"]
    assert fast.cg_info["variance_ranks"] == [0]
    (bound,) = fast.cg_info["variance_bounds"]
    assert bound <= 1e-2
    assert len(calls) == 1  # the forecast's trace is the form's
    ratio = var1 / var0
    assert float(ratio.min()) >= 1 - SLACK
    assert float(ratio.max()) <= 1 + bound + SLACK


def test_a_build_stops_where_its_measured_bounds_say_it_will_not_pay():
    # B = I + diag(mu), mu flat at 0.05 over 600 directions: no rank below the width brings
    # the sketch's bound near 1e-3, and the doublings show it (the bound barely moves).
    width = 600
    b = torch.diag(1.0 + torch.full((width,), 0.05, dtype=DT))
    pre = NystromPreconditioner(torch.zeros(width, 0, dtype=DT), torch.zeros(0, dtype=DT))
    seen = []

    def proceed(history):
        seen.append(list(history))
        return keep_building(history, 1e-3, 0.0, 512, width, 10**4, 100)

    full = LowRankInverse.build(lambda v: b @ v, pre, 1e-3, 512)
    stopped = LowRankInverse.build(lambda v: b @ v, pre, 1e-3, 512, proceed=proceed)
    assert full.rank == 512 and full.bound > 1e-3  # the cap, and still above the tolerance
    assert stopped.rank == 2 * START_RANK  # two ranks measured, then stopped
    assert [rank for rank, _ in seen[-1]] == [START_RANK, 2 * START_RANK]
    assert stopped.bound > 1e-3
    # Its variances remain an upper bound within its (larger) bound.
    rows = torch.randn(5, width, generator=torch.Generator().manual_seed(0), dtype=DT)
    exact = ((rows @ torch.linalg.inv(b)) * rows).sum(-1)
    ratio = stopped.variances(rows) / exact
    assert float(ratio.min()) >= 1 - 1e-9
    assert float(ratio.max()) <= 1 + stopped.bound + 1e-9


def test_norm_bound_above_stops_early_only_where_the_bound_exceeds_it():
    a = _norm_three_matrix()
    calls = []

    def product(v):
        calls.append(1)
        return a @ v

    def bound(above=None):
        calls.clear()
        out = norm_bound(product, 400, DT, a.device, torch.Generator().manual_seed(1),
                         above=above)
        return out, len(calls)

    full, full_calls = bound()
    # Far below the norm: the run stops after a few products, and what it returns still
    # exceeds `above` (the question asked) without exceeding the full bound.
    early, early_calls = bound(above=0.5)
    assert early > 0.5 and early <= full + 1e-12 and early_calls < full_calls
    # Above the full bound: every step runs and the bound is the same number.
    late, late_calls = bound(above=10.0)
    assert late == full and late_calls == full_calls


def test_a_rank_skipped_on_a_cliff_costs_one_doubling_and_never_a_bound():
    # E with exactly 128 eigenvalues of 1 and the rest 1e-7: the rank-128 form keeps
    # eigenvalues of 1, above the tolerance, so its bound is not run although it would pass
    # (the cliff is at exactly that rank): the build doubles once, and the form it serves
    # is bracketed by its own bound.
    width = 600
    mu = torch.full((width,), 1e-7, dtype=DT)
    mu[:128] = 1.0
    q = torch.linalg.qr(torch.randn(width, width, generator=torch.Generator().manual_seed(3),
                                    dtype=DT))[0]
    b = q @ torch.diag(1.0 + mu) @ q.T
    pre = NystromPreconditioner(torch.zeros(width, 0, dtype=DT), torch.zeros(0, dtype=DT))
    form = LowRankInverse.build(lambda v: b @ v, pre, 1e-3, 512)
    assert form.rank == 256 and form.bound <= 1e-3
    rows = torch.randn(5, width, generator=torch.Generator().manual_seed(0), dtype=DT)
    exact = ((rows @ torch.linalg.inv(b)) * rows).sum(-1)
    ratio = form.variances(rows) / exact
    assert float(ratio.min()) >= 1 - 1e-9
    assert float(ratio.max()) <= 1 + form.bound + 1e-9


def test_a_build_without_the_dense_route_checks_its_lower_ranks_in_a_few_passes():
    # B - I with a slowly decaying spectrum: every rank below the cap fails the tolerance.
    width = 600
    mu = 5.0 / torch.arange(1, width + 1, dtype=DT)
    b = torch.diag(1.0 + mu)
    pre = NystromPreconditioner(torch.zeros(width, 0, dtype=DT), torch.zeros(0, dtype=DT))
    products = []

    def apply(v):
        products.append(v.shape[1])
        return b @ v

    def full_checks(history):  # a `proceed` that never stops: every Lanczos run is whole
        return True

    early = LowRankInverse.build(apply, pre, 1e-3, 512)
    early_products = list(products)
    products.clear()
    whole = LowRankInverse.build(apply, pre, 1e-3, 512, proceed=full_checks)
    # The same sketch (its draws do not depend on the bounds run), the same final rank and the
    # same bound at the cap (each rank's Lanczos starts are its own); the lower ranks keep
    # sketched eigenvalues above the tolerance (5/k at k = 128 and 256), so they run no
    # Lanczos at all, where the whole build runs LANCZOS_STEPS passes at each.
    assert early.rank == whole.rank == 512
    assert early.bound == whole.bound and early.bound > 1e-3
    torch.testing.assert_close(early.eigenvalues, whole.eigenvalues, rtol=0, atol=0)
    checks = lambda seen: sum(1 for k in seen if k == LANCZOS_RUNS)  # noqa: E731
    assert checks(early_products) == LANCZOS_STEPS and checks(products) == 3 * LANCZOS_STEPS
    assert early.products < whole.products
    # The form is still bracketed by its bound.
    rows = torch.randn(5, width, generator=torch.Generator().manual_seed(0), dtype=DT)
    exact = ((rows @ torch.linalg.inv(b)) * rows).sum(-1)
    ratio = early.variances(rows) / exact
    assert float(ratio.min()) >= 1 - 1e-9
    assert float(ratio.max()) <= 1 + early.bound + 1e-9


def test_the_serving_cost_is_the_cheaper_route_for_the_rows_asked_for():
    from rfgp.inference._cg_dense import ITERATIVE_RATE_SHARE, SERVING_RANK, serving_cost
    from rfgp.inference._cg_variance import LANCZOS_STEPS, START_RANK

    w, n = 8192, 13500
    slow = 1e4 / torch.arange(1, 1025, dtype=torch.float64)
    fast = 1e4 * torch.exp(-torch.arange(1024.0, dtype=torch.float64) / 8)
    # The form, forecast on the spectrum: its build and, per row, its application and the
    # refinement its bound leaves.
    for spectrum in (slow, fast):
        rank, bound, build, iterations = forecast_form(spectrum, w, n, 1e-2, 2048)
        per_row = iterations * (2 * n * w + 2 * w * (2 * 1024 + rank)) + 2 * w * (1024 + rank)
        for rows in (0, 100, 1350):
            form = serving_cost(w, n, rows, spectrum, dense=False)
            assert form == pytest.approx(build + rows * per_row, rel=1e-12)
            # the dense factor at the passes' rate share caps it where B fits
            dense = ITERATIVE_RATE_SHARE * (0.625 * n * w * w + w**3 / 3 + rows * w * w)
            assert serving_cost(w, n, rows, spectrum) == pytest.approx(min(form, dense))
    assert serving_cost(w, n, 1350, slow) < serving_cost(w, n, 1350, slow, dense=False)
    assert serving_cost(w, n, 1350, fast) == serving_cost(w, n, 1350, fast, dense=False)
    # Without a spectrum: a form of SERVING_RANK doubling from START_RANK, LANCZOS_STEPS
    # products per rank tried, that meets the tolerance beside a preconditioner of its rank.
    ranks = [START_RANK * 2**k for k in range(4)]
    assert ranks[-1] == SERVING_RANK
    build = ((len(ranks) * LANCZOS_STEPS + SERVING_RANK) * 2.0 * n * w
             + sum(8.0 * w * r**2 for r in ranks))
    rows = 1350
    expected = build + rows * 2.0 * w * 2 * SERVING_RANK
    assert serving_cost(w, n, rows, dense=False) == pytest.approx(expected, rel=1e-12)
    # a narrow model's form is as wide as the model
    assert serving_cost(256, n, 0, dense=False) < serving_cost(512, n, 0, dense=False)


# ---------------------------------------------------------------------- the rows' form of B
def _rows_pair(case, n=300, **options):
    """A fit of more features than rows (768 real, 384 complex, on ``n`` rows) whose
    variances take the dense route: the rows' ``K`` is then the cheaper form."""
    return _fit_pair(case, n, **_low_rank_capped(**dict(dict(cg_variance_tolerance=1e-3),
                                                        **options)))


def _rounding(fast):
    r"""The rows' form's relative error bound :math:`(1 + \lambda_{\max})^2 \epsilon`."""
    largest = max(float(p.eigenvalues.max()) for p in fast._state.solver.preconditioners)
    return (1.0 + largest) ** 2 * torch.finfo(DT).eps


@pytest.mark.parametrize("case", list(CASES))
def test_the_rows_form_is_exact_with_its_gradient_and_joint_covariance(case, monkeypatch):
    # Woodbury: phi B^-1 phi^H = |phi|^2 - |L^-1 Psi phi^H|^2 with L L^H = I + Psi Psi^H; the
    # difference is exact up to (1 + lambda_max)^2 eps of each variance.
    monkeypatch.setattr(cg_routes, "dense_pays", lambda *args: True)
    exact, fast, xt = _rows_pair(case)
    q0, q1 = xt.clone().requires_grad_(True), xt.clone().requires_grad_(True)
    std0 = exact.predict(q0, return_std=True)[1]
    std1 = fast.predict(q1, return_std=True)[1]
    routes = fast._state.solver.routes
    assert fast.cg_info["variance_routes"] == ["dense"] * len(fast.factorization_groups)
    assert all(isinstance(form, RowDenseInverse) for form in routes.dense.values())
    rtol = _rounding(fast)
    assert rtol < 1e-4  # the guard's tenth of the tolerance
    torch.testing.assert_close(std1, std0, rtol=rtol, atol=0)
    std0.sum().backward()
    std1.sum().backward()
    torch.testing.assert_close(q1.grad, q0.grad, rtol=1e-5, atol=1e-8)
    cov0 = exact.posterior(xt[:12]).covariance_matrix
    cov1 = fast.posterior(xt[:12]).covariance_matrix
    scale = float(cov0.diagonal().max())
    torch.testing.assert_close(cov1, cov0, rtol=0, atol=rtol * scale)


def test_the_rows_form_needs_more_features_than_rows_kept_features_and_the_precision():
    def form(fast, xt):
        fast.predict(xt, return_std=True)
        (built,) = fast._state.solver.routes.dense.values()
        return type(built)

    _, fast, xt = _rows_pair("real")
    assert fast._state.solver.routes.dense_forms() == (True, True)
    assert form(fast, xt) is RowDenseInverse
    # recomputed features (no cache): every block of K would recompute them
    _, fast, xt = _rows_pair("real", cache_bytes=0)
    assert fast._state.solver.routes.dense_forms() == (True, False)
    assert form(fast, xt) is DenseInverse
    # a tolerance the difference cannot keep: (1 + lambda)^2 eps above its tenth
    _, fast, xt = _rows_pair("real", cg_variance_tolerance=1e-9)
    assert 10 * _rounding(fast) > 1e-9
    assert fast._state.solver.routes.dense_forms() == (True, False)
    assert form(fast, xt) is DenseInverse
    # as many rows as features: B is the smaller matrix
    _, fast, xt = _rows_pair("real", n=800)
    assert fast._state.solver.routes.dense_forms() == (True, False)


def test_the_rows_form_serves_where_b_does_not_fit(monkeypatch):
    # the memory admits the rows' K (300 x 300) but not B (768 x 768)
    monkeypatch.setattr(cg_routes, "dense_fits", lambda width, *args: width < 768)
    exact, fast, xt = _rows_pair("real")
    assert fast._state.solver.routes.dense_forms() == (False, True)
    var0 = exact.predict(xt, return_std=True)[1].square()
    var1 = fast.predict(xt, return_std=True)[1].square()
    (built,) = fast._state.solver.routes.dense.values()
    assert isinstance(built, RowDenseInverse)
    torch.testing.assert_close(var1, var0, rtol=_rounding(fast), atol=0)


@pytest.mark.parametrize("complex_solve", [False, True])
def test_row_matrix_is_i_plus_psi_psi_h_over_chunks_with_row_noise(complex_solve):
    # Psi = S^-1/2 Phi with a noise per row and per target column; chunks of 7 rows, so K is
    # assembled from blocks, the ones above the diagonal mirrored.
    kernel = _complex(32) if complex_solve else _fourier(32)
    fm = FeatureMap(kernel)
    g = torch.Generator().manual_seed(3)
    x = torch.rand(30, 3, generator=g, dtype=DT)
    noise = 0.1 + torch.rand(30, 2, generator=g, dtype=DT)
    op = FeatureOperator(fm, [(x, torch.zeros(30, 2, dtype=DT), noise)], complex_solve, DT,
                         chunk=7, cache_bytes=1 << 20)
    op.dense(0)
    assert op.holds_all()
    phi = fm.rows(x)
    phi = phi if complex_solve else torch.cat([phi.real, phi.imag], -1) if phi.is_complex() else phi
    for column in (0, 1):
        psi = phi / noise[:, column].sqrt().unsqueeze(1)
        k = torch.eye(30, dtype=psi.dtype) + psi @ psi.conj().T
        torch.testing.assert_close(op.row_matrix(column), k, rtol=1e-12, atol=1e-12)
        q = torch.randn(4, phi.shape[1], generator=g, dtype=DT).to(psi.dtype)
        torch.testing.assert_close(op.row_products(q, column), psi @ q.conj().T)
        b = torch.eye(phi.shape[1], dtype=psi.dtype) + psi.conj().T @ psi
        reference = (q @ torch.linalg.solve(b, q.conj().T)).diagonal().real
        torch.testing.assert_close(RowDenseInverse.build(op, column).variances(q), reference)


def test_dense_cost_is_that_of_the_cheaper_open_form():
    n, m = 10_000, 1_000
    w = 2 * n
    # B's Gram from its upper block triangle: 5/8 of N W^2 (four panels)
    weights = 0.625 * n * w * w + w**3 / 3 + m * w * w
    rows = n * n * w / 2 + n**3 / 3 + m * (n * w + n * n)
    assert dense_cost(w, n, m) == weights
    assert dense_cost(w, n, m, by_rows=True) == rows < weights / 3
    assert dense_cost(w, n, m, weights=False, by_rows=True) == rows
    assert dense_cost(w, n, m, weights=False) == float("inf")
    assert dense_cost(n // 2, n, m, by_rows=True) == dense_cost(n // 2, n, m)
    assert row_precision_holds(2e6, DT, 1e-2) and not row_precision_holds(3e6, DT, 1e-2)


def test_the_rows_form_follows_a_new_noise_after_the_fit():
    # The rows' K holds the noise: a changed noise drops the factor, never a stale answer.
    exact, fast, xt = _rows_pair("real")
    fast.predict(xt, return_std=True)
    (built,) = fast._state.solver.routes.dense.values()
    assert isinstance(built, RowDenseInverse)
    fast.noise = 0.02
    exact.noise = 0.02
    var0 = exact.predict(xt, return_std=True)[1].square()
    var1 = fast.predict(xt, return_std=True)[1].square()
    torch.testing.assert_close(var1, var0, rtol=_rounding(fast), atol=0)
