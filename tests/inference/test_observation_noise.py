"""Predictive standard deviations of new observations (``observation_noise=True``).

The variance of a new observation is the latent one plus the model noise, :math:`\\sigma^2 +
s`. The direct solves return it exactly; the iterative solve holds it within its variance
tolerance :math:`t` of :math:`\\sigma^2 + s` (not of :math:`\\sigma^2`): a low-rank form of
bound :math:`\\tau` serves a row as it is where :math:`\\hat v (\\tau - t) \\le t s (1 + \\tau)`,
the other rows are refined by CG to :math:`t (\\phi^H u + s)`. The tests check those brackets
against the weight-space posterior, that the form's build stops sooner where the noise
dominates, and the refusals.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rfgp import RandomFeatureGP
from rfgp.inference._cg_routes import FLOOR_OPEN_ROWS, certified
from rfgp.inference._iterative import conjugate_gradients
from rfgp.kernels import FourierFeatureKernel
from rfgp.sklearn import RandomFeatureGPRegressor

DT = torch.float64
# Rounding of B's products in float64: far below every tolerance here.
SLACK = 1e-9


def _data(n=2000, d=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, d, generator=g, dtype=DT)
    y = torch.sin(6 * x[:, 0]) + 0.3 * torch.randn(n, generator=g, dtype=DT)
    # test rows inside the data (small latent variance) and far outside (the prior's)
    xt = torch.cat([torch.rand(300, d, generator=g, dtype=DT),
                    3 + torch.rand(20, d, generator=g, dtype=DT)])
    return x, y, xt


def _kernel(num=2048, lengthscale=0.6):
    kernel = FourierFeatureKernel(num, seed=0).double()
    kernel.lengthscale = lengthscale
    return kernel


@pytest.mark.parametrize("targets", [1, 2])
def test_the_direct_solve_adds_the_model_noise_of_each_output(targets):
    x, y, xt = _data(n=400)
    if targets == 2:
        y = torch.stack([y, 2 * y], -1)
    noise = torch.tensor([0.1, 0.4][:targets], dtype=DT)
    gp = RandomFeatureGP(_kernel(256), noise=noise if targets == 2 else 0.1).fit(x, y)
    mean, std = gp.predict(xt, return_std=True)
    mean_y, std_y = gp.predict(xt, return_std=True, observation_noise=True)
    assert torch.equal(mean, mean_y)
    expected = std.square() + (noise if targets == 2 else noise[0])
    torch.testing.assert_close(std_y.square(), expected, rtol=1e-13, atol=0)


@pytest.mark.parametrize("variance", ["lowrank", "auto"])
def test_iterative_variances_of_new_observations_are_within_the_tolerance_of_the_sum(variance):
    # A slowly decaying spectrum (preconditioner rank 16, form cap 512): the form's bound
    # stays above the latent tolerance, so rows are certified one by one or refined.
    x, y, xt = _data()
    noise, tolerance = 0.5, 1e-2
    exact = RandomFeatureGP(_kernel(), noise=noise).fit(x, y)
    truth = exact.predict(xt, return_std=True)[1].square() + noise
    fast = RandomFeatureGP(_kernel(), noise=noise, solve="cg", cg_variance=variance,
                           preconditioner_rank=16, cg_variance_rank=512,
                           cg_variance_tolerance=tolerance).fit(x, y)
    got = fast.predict(xt, return_std=True, observation_noise=True)[1].square()
    if variance == "auto":
        # B (2048 features, 2000 rows) costs less than the form even at the bound a typical
        # row needs with the noise added: it is formed first, and every variance is exact.
        assert fast.cg_info["variance_routes"] == ["dense"]
        torch.testing.assert_close(got, truth, rtol=SLACK, atol=0)
        return
    (bound,) = fast.cg_info["variance_bounds"]
    assert bound > fast.cg_settings.variance_bound  # the latent tolerance is not met
    # Each lies in [v + s, v + s + t (v + s)]: the form's and CG's values are upper bounds.
    assert float((got / truth).min()) >= 1 - SLACK
    assert float((got / truth).max()) <= 1 + tolerance + SLACK
    # The latent variances of the same fit still meet their own tolerance of v.
    latent = fast.predict(xt, return_std=True)[1].square()
    ratio = latent / (truth - noise)
    assert float(ratio.min()) >= 1 - SLACK and float(ratio.max()) <= 1 + tolerance + SLACK


def test_the_form_stops_sooner_where_the_noise_dominates_and_a_latent_call_rebuilds_it():
    x, y, xt = _data()
    noise, tolerance = 2.0, 1e-2
    options = dict(noise=noise, solve="cg", cg_variance="lowrank", preconditioner_rank=16,
                   cg_variance_tolerance=tolerance)
    exact = RandomFeatureGP(_kernel(), noise=noise).fit(x, y)
    latent_truth = exact.predict(xt, return_std=True)[1].square()
    latent_first = RandomFeatureGP(_kernel(), **options).fit(x, y)
    latent_first.predict(xt, return_std=True)
    (full_rank,) = latent_first.cg_info["variance_ranks"]
    gp = RandomFeatureGP(_kernel(), **options).fit(x, y)
    got = gp.predict(xt, return_std=True, observation_noise=True)[1].square()
    (rank,), (bound,) = gp.cg_info["variance_ranks"], gp.cg_info["variance_bounds"]
    assert rank < full_rank and bound > tolerance
    # The form stopped where it left at most FLOOR_OPEN_ROWS rows uncertified.
    routes = gp._state.solver.routes
    served = routes.low_rank[0]
    assert routes.stopped[0]
    assert served.rank == rank
    assert float((got / (latent_truth + noise)).max()) <= 1 + tolerance + SLACK
    assert float((got / (latent_truth + noise)).min()) >= 1 - SLACK
    # A latent call cannot use that form: it is built again, to the latent tolerance.
    latent = gp.predict(xt, return_std=True)[1].square()
    assert not gp._state.solver.routes.stopped[0]
    assert gp.cg_info["variance_ranks"] == [full_rank]
    assert float((latent / latent_truth).max()) <= 1 + tolerance + SLACK
    assert float((latent / latent_truth).min()) >= 1 - SLACK


def test_certified_rows_are_within_the_tolerance_of_the_sum_at_either_end_of_the_bracket():
    g = torch.Generator().manual_seed(0)
    tolerance = 1e-2
    for _ in range(20):
        bound = float(torch.rand(1, generator=g)) * 3 + tolerance
        floor = float(torch.rand(1, generator=g))
        exact = torch.rand(500, generator=g, dtype=DT) * 0.2
        for served in (exact, exact * (1 + bound)):  # the form's two extremes
            ok = certified(served, bound, tolerance, floor)
            # The served value's true variance is anywhere in [served / (1 + bound), served].
            low = served / (1 + bound)
            worst = (served - low)[ok]
            assert bool((worst <= tolerance * (low[ok] + floor) * (1 + 1e-12)).all())
    # Without a finite bound the form is an upper bound alone (the true variance anywhere in
    # [0, v_hat]): only rows whose whole error, v_hat, is within t s are certified.
    served = torch.rand(500, generator=g, dtype=DT) * 0.01
    ok = certified(served, float("inf"), tolerance, 0.5)
    assert bool((served[ok] <= tolerance * 0.5).all()) and bool(ok.any()) and not ok.all()
    # Without a floor only a bound within the tolerance certifies.
    v = torch.rand(10, dtype=DT)
    assert not certified(v, 2e-2, 1e-2, 0.0).any() and certified(v, 1e-2, 1e-2, 0.0).all()


def test_cg_with_an_energy_floor_stops_within_the_tolerance_of_the_quadratic_form_plus_it():
    g = torch.Generator().manual_seed(0)
    q, _ = torch.linalg.qr(torch.randn(200, 200, generator=g, dtype=DT))
    a = q @ torch.diag(torch.logspace(0, 4, 200, dtype=DT)) @ q.T
    b = torch.randn(200, 3, generator=g, dtype=DT)
    form = (b * torch.linalg.solve(a, b)).sum(0)
    floor = torch.tensor([0.0, 1.0, 1e6], dtype=DT)
    rho = 1e-3
    result = conjugate_gradients(lambda v: a @ v, b, None, 1.0, 500, relative_energy=rho,
                                 energy_floor=floor)
    upper = (b * result.solution).sum(0) + result.energy  # b^H w + r^H A^-1 r (no P)
    assert bool((upper >= form * (1 - SLACK)).all())
    assert bool((upper <= form + rho * (form + floor) + SLACK * form).all())
    plain = conjugate_gradients(lambda v: a @ v, b, None, 1.0, 500, relative_energy=rho)
    # A floor far above the form is met at once; a zero floor is the plain test.
    assert result.iterations <= plain.iterations
    torch.testing.assert_close(result.solution[:, 0], plain.solution[:, 0])
    with pytest.raises(ValueError, match="energy_floor"):
        conjugate_gradients(lambda v: a @ v, b, energy_floor=floor)


def test_gradients_flow_through_certified_and_refined_rows():
    x, y, xt = _data()
    gp = RandomFeatureGP(_kernel(), noise=0.5, solve="cg", cg_variance="lowrank",
                         preconditioner_rank=16, cg_variance_rank=256).fit(x, y)
    query = xt[:40].clone().requires_grad_(True)
    std = gp.predict(query, return_std=True, observation_noise=True)[1]
    std.sum().backward()
    assert query.grad is not None and bool(torch.isfinite(query.grad).all())
    exact = RandomFeatureGP(_kernel(), noise=0.5).fit(x, y)
    reference = xt[:40].clone().requires_grad_(True)
    exact.predict(reference, return_std=True, observation_noise=True)[1].sum().backward()
    # Each variance is within 1% of the exact one: the gradients of the served values agree
    # with the exact ones to the same order (the form's are of its own upper bound).
    scale = float(reference.grad.abs().max())
    assert float((query.grad - reference.grad).abs().max()) <= 0.1 * scale


def test_a_noise_changed_after_the_fit_is_the_one_added_and_conditioned_on():
    x, y, xt = _data(n=400)
    gp = RandomFeatureGP(_kernel(256), noise=0.1).fit(x, y)
    gp.noise = 0.3
    fresh = RandomFeatureGP(_kernel(256), noise=0.3).fit(x, y)
    got = gp.predict(xt, return_std=True, observation_noise=True)[1]
    want = fresh.predict(xt, return_std=True)[1].square() + 0.3
    torch.testing.assert_close(got.square(), want, rtol=1e-10, atol=0)


def test_refusals_name_the_argument():
    x, y, xt = _data(n=200)
    gp = RandomFeatureGP(_kernel(64), noise=0.1).fit(x, y)
    with pytest.raises(TypeError, match="observation_noise"):
        gp.predict(xt, return_std=True, observation_noise="yes")
    with pytest.raises(ValueError, match="return_std"):
        gp.predict(xt, observation_noise=True)
    fixed = RandomFeatureGP(_kernel(64), noise=0.1).fit(x, y, torch.full_like(y, 0.1))
    with pytest.raises(ValueError, match="fixed noise"):
        fixed.predict(xt, return_std=True, observation_noise=True)
    # latent predictions of a fixed-noise fit are unaffected
    assert fixed.predict(xt, return_std=True)[1].shape == (xt.shape[0],)


@pytest.mark.parametrize("targets", [1, 2])
def test_the_estimator_adds_noise_to_its_std_and_covariance(targets):
    x, y, xt = _data(n=300, d=3)
    Y = y.numpy() if targets == 1 else np.stack([y.numpy(), 3 * y.numpy()], -1)
    reg = RandomFeatureGPRegressor(num_features=128, max_iter=5, random_state=0).fit(
        x.numpy(), Y)
    mean, std = reg.predict(xt.numpy(), return_std=True)
    mean_y, std_y = reg.predict(xt.numpy(), return_std=True, observation_noise=True)
    np.testing.assert_array_equal(mean, mean_y)
    np.testing.assert_allclose(std_y**2, std**2 + reg.noise_, rtol=1e-10)
    _, cov = reg.predict(xt.numpy()[:7], return_cov=True)
    _, cov_y = reg.predict(xt.numpy()[:7], return_cov=True, observation_noise=True)
    rows = np.arange(7)
    np.testing.assert_allclose(cov_y[rows, rows], cov[rows, rows] + reg.noise_, rtol=1e-12)
    off = ~np.eye(7, dtype=bool)
    np.testing.assert_array_equal(cov_y[off], cov[off])
    with pytest.raises(ValueError, match="observation_noise"):
        reg.predict(xt.numpy(), observation_noise=True)
    with pytest.raises(TypeError, match="observation_noise"):
        reg.predict(xt.numpy(), return_std=True, observation_noise=1)


def test_a_prediction_of_fewer_rows_than_the_allowance_refines_them_on_a_first_rank_form():
    # Ten rows: refining them all costs less than any doubling, so the build stops at its
    # first rank without a Lanczos run, and every row is still within the tolerance.
    x, y, xt = _data()
    noise, tolerance = 0.5, 1e-2
    exact = RandomFeatureGP(_kernel(), noise=noise).fit(x, y)
    truth = exact.predict(xt[:10], return_std=True)[1].square() + noise
    gp = RandomFeatureGP(_kernel(), noise=noise, solve="cg", cg_variance="lowrank",
                         preconditioner_rank=16, cg_variance_tolerance=tolerance).fit(x, y)
    got = gp.predict(xt[:10], return_std=True, observation_noise=True)[1].square()
    from rfgp.inference._cg_variance import START_RANK

    assert gp.cg_info["variance_ranks"] == [START_RANK]
    assert float((got / truth).min()) >= 1 - SLACK
    assert float((got / truth).max()) <= 1 + tolerance + SLACK


def test_the_open_rows_allowance_is_a_fraction_of_the_first_doubling():
    # A refined row costs a few products with B; FLOOR_OPEN_ROWS of them cost about as much
    # as the START_RANK products of the form's first rank.
    from rfgp.inference._cg_variance import START_RANK

    assert 0 < FLOOR_OPEN_ROWS <= START_RANK


@pytest.mark.parametrize("noise", [0.01, 0.5, 2.0])
def test_with_a_floor_the_dense_route_is_weighed_at_the_bound_a_typical_row_needs(
        noise, monkeypatch):
    # The mean of v_i / s_i over the training rows is tr(B^-1 (B - I)) / N (the degrees of
    # freedom per row); the trace t = tr(P^-1 (B - I)) of the one pass is at least that
    # (P <= B for a Nystrom preconditioner), and the form is forecast at floor_bound of it.
    from rfgp.inference import _cg_routes
    from rfgp.inference._cg_routes import floor_bound

    x, y, xt = _data()
    tolerance = 1e-2
    gp = RandomFeatureGP(_kernel(), noise=noise, solve="cg", preconditioner_rank=16,
                         cg_variance_tolerance=tolerance).fit(x, y)
    solver = gp._state.solver
    routes = solver.routes
    seen = []
    original = _cg_routes.dense_first

    def spy(*args, **kwargs):
        seen.append(args[4])
        return original(*args, **kwargs)

    monkeypatch.setattr(_cg_routes, "dense_first", spy)
    routes.dense_first(0, xt.shape[0])
    routes.dense_first(0, xt.shape[0], noise)
    latent = solver.settings.variance_bound
    b = solver.operator.dense(0)
    dof = float(b.shape[0] - torch.linalg.inv(b).diagonal().sum())
    t = routes.traces[0][0]
    assert t >= dof * (1 - 1e-9)
    assert seen[0] == latent
    assert seen[1] == max(latent, floor_bound(t / x.shape[0], tolerance))
    # more noise, fewer degrees of freedom per row: a looser bound for the form
    assert (seen[1] > latent) == (floor_bound(t / x.shape[0], tolerance) > latent)
