r"""Low-rank predictive variances of the iterative solve (rfgp/inference/_cg_variance.py).

The facts checked: with :math:`\hat E \preceq E` and :math:`\tau \ge \|E - \hat E\|`, the
low-rank covariance satisfies :math:`\Sigma \preceq \hat\Sigma \preceq (1 + \tau)\Sigma`
(every variance is at least the exact one and at most :math:`1 + \tau` times it), and
:math:`\tau` bounds :math:`\|E - \hat E\|`. The exact :math:`\Sigma` comes from the Cholesky
(weight-space) solve of the same features; the iterative mean solve only enters through its
tolerance (``TIGHT``), so "at least the exact one" holds up to a relative ``SLACK``.
"""

from __future__ import annotations

import pytest
import torch

from rfgp import RandomFeatureGP
from rfgp.inference._cg_variance import START_RANK, LowRankInverse, norm_bound
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


def _fit_pair(case, **options):
    make_kernel, columns, noise = CASES[case]
    x, y, xt = _data(columns=columns)
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
    # (10 eps sqrt(W) ||P||): not far above the truth.
    pre = fast._state.solver.preconditioners[0]
    allowance = 10 * torch.finfo(DT).eps * excess.shape[0] ** 0.5 * (1 + float(
        pre.eigenvalues.max()))
    assert inverse.bound <= 2.0 * float(neglected.max()) + allowance


def test_a_small_rank_cap_reports_its_bound_and_refines_each_query_to_the_tolerance():
    x, y, xt = _data(n=1500)
    make = lambda: _fourier(1024)  # noqa: E731
    exact = RandomFeatureGP(make(), noise=1e-3, solve="weight").fit(x, y)
    var0 = exact.predict(xt, return_std=True)[1].square()
    # The variances do not depend on the mean solve: the default CG tolerance serves.
    capped = RandomFeatureGP(make(), noise=1e-3, solve="cg", preconditioner_rank=16,
                             cg_variance_rank=8, cg_variance_tolerance=1e-3).fit(x, y)
    var1 = capped.predict(xt, return_std=True)[1].square()
    (bound,) = capped.cg_info["variance_bounds"]
    assert capped.cg_info["variance_ranks"] == [8] and bound > 1e-3
    # Beyond the bound, a CG per query preconditioned by the low-rank form stops at the
    # certified bracket [exact, (1 + tolerance) exact].
    assert float((var1 / var0).min()) >= 1 - SLACK
    assert float((var1 / var0).max()) <= 1 + 1e-3
    grown = RandomFeatureGP(make(), noise=1e-3, solve="cg", preconditioner_rank=16,
                            cg_variance_tolerance=1e-2).fit(x, y)
    var2 = grown.predict(xt, return_std=True)[1].square()
    (rank,), (bound,) = grown.cg_info["variance_ranks"], grown.cg_info["variance_bounds"]
    assert rank > START_RANK and bound <= 1e-2
    assert float((var2 / var0).min()) >= 1 - SLACK
    assert float((var2 / var0).max()) <= 1 + bound


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
    assert 1 - SLACK <= float((var2 / var3).min()) <= float((var2 / var3).max()) <= 1 + bound
    low.float()
    assert low.cg_info["variance_ranks"] is None


def test_state_round_trip_recomputes_the_same_variances():
    _, fast, xt = _fit_pair("noise groups")
    std = fast.predict(xt, return_std=True)[1]
    loaded = RandomFeatureGP(_fourier(), solve="cg", cg_tolerance=TIGHT)
    loaded.load_state_dict(fast.state_dict())
    torch.testing.assert_close(loaded.predict(xt, return_std=True)[1], std, rtol=1e-12,
                               atol=0)


def test_norm_bound_brackets_the_largest_eigenvalue():
    g = torch.Generator().manual_seed(0)
    q = torch.linalg.qr(torch.randn(400, 400, generator=g, dtype=DT))[0]
    values = torch.cat([torch.tensor([3.0, 2.9], dtype=DT), torch.rand(398, generator=g,
                                                                       dtype=DT)])
    a = q @ torch.diag(values) @ q.T
    bound = norm_bound(lambda v: a @ v, 400, DT, a.device, torch.Generator().manual_seed(1))
    assert 3.0 <= bound <= 3.0 * 1.2


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
    ({"cg_variance_rank": 0}, "cg_variance_rank"),
])
def test_bad_variance_settings_are_rejected_by_name(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RandomFeatureGP(_fourier(), solve="cg", **kwargs)
