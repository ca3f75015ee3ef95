"""Batch Thompson sampling on random-feature sample paths (rfgp.bayesopt)."""

from __future__ import annotations

import pytest
import torch
from gpytorch.kernels import ScaleKernel

from rfgp import RandomFeatureGP, StaleFitError
from rfgp.bayesopt import maximize_paths, posterior_num_features, thompson_sample
from rfgp.kernels import (
    FourierFeatureKernel,
    GaussianSketchKernel,
    MaclaurinKernel,
    PolynomialSketchKernel,
    SphericalFeatureKernel,
)

DT = torch.float64
BOUNDS = torch.tensor([[-1.0, -1.0], [1.0, 1.0]], dtype=DT)
CENTRE = torch.tensor([0.3, -0.4], dtype=DT)
NAN, INF = float("nan"), float("inf")


def bowl(x):
    """A smooth function with its maximum at CENTRE inside the box."""
    return -((x - CENTRE) ** 2).sum(-1)


def data(n=200, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = 2 * torch.rand(n, 2, generator=g, dtype=DT) - 1
    return x, bowl(x)


def test_maximize_paths_finds_each_paths_maximum():
    # Three concave paths with different maximisers, one inside and two on the boundary.
    centres = torch.tensor([[0.2, 0.5], [-0.7, 0.1], [1.5, -2.0]], dtype=DT)

    def paths(x):
        return -((x.unsqueeze(0) - centres.unsqueeze(1)) ** 2).sum(-1)  # (3, M)

    best, values = maximize_paths(
        paths, BOUNDS, raw_samples=64, steps=300, lr=0.05,
        generator=torch.Generator().manual_seed(0),
    )
    expected = centres.clamp(-1.0, 1.0)  # the box's closest point maximises a radial bowl
    torch.testing.assert_close(best, expected, atol=2e-3, rtol=0)
    torch.testing.assert_close(values, paths(best).diagonal())


def test_sample_paths_are_differentiable_in_x():
    x, y = data(50)
    gp = RandomFeatureGP(FourierFeatureKernel(64, seed=0).double(), noise=1e-2).fit(x, y)
    paths = gp.sample_functions(3, generator=torch.Generator().manual_seed(1))
    point = torch.tensor([[0.1, 0.2]], dtype=DT, requires_grad=True)
    grad = torch.autograd.grad(paths(point)[1].sum(), point)[0]
    eps = 1e-6
    fd = torch.stack(
        [
            (paths(point.detach() + eps * e)[1] - paths(point.detach() - eps * e)[1]) / (2 * eps)
            for e in torch.eye(2, dtype=DT)
        ],
        dim=-1,
    )
    torch.testing.assert_close(grad, fd, atol=1e-6, rtol=1e-5)


def kernels():
    yield "fourier", ScaleKernel(FourierFeatureKernel(256, spectral="matern52", seed=0))
    yield "polynomial-complex", PolynomialSketchKernel(
        2, 128, bias=1.0, projection="gaussian", complex=True, seed=0
    )
    yield "maclaurin", MaclaurinKernel("exponential", 128, seed=0)
    yield "gaussian-sketch", GaussianSketchKernel(128, seed=0)
    yield "spherical", SphericalFeatureKernel(128, degree=3, seed=0)
    yield "sum-product", ScaleKernel(
        FourierFeatureKernel(128, active_dims=[0], seed=1)
        * FourierFeatureKernel(128, active_dims=[1], seed=2)
    ) + PolynomialSketchKernel(2, 64, bias=1.0, projection="rademacher", seed=3)


@pytest.mark.parametrize("name,kernel", list(kernels()), ids=[n for n, _ in kernels()])
def test_thompson_batch_lies_in_the_box_and_ascends_each_path(name, kernel):
    x, y = data()
    gp = RandomFeatureGP(kernel.double(), noise=1e-2).fit(x, (y - y.mean()) / y.std())
    g = torch.Generator().manual_seed(3)
    q = 5
    batch = thompson_sample(gp, BOUNDS, q, raw_samples=128, steps=30, generator=g)
    assert batch.shape == (q, 2)
    assert bool(((batch >= BOUNDS[0]) & (batch <= BOUNDS[1])).all())
    # Same draws again: every maximiser beats (or ties) the path's best start.
    g = torch.Generator().manual_seed(3)
    paths = gp.sample_functions(q, generator=g)
    best, values = maximize_paths(paths, BOUNDS, raw_samples=128, steps=30, generator=g)
    torch.testing.assert_close(best, batch)
    g0 = torch.Generator().manual_seed(3)
    paths0 = gp.sample_functions(q, generator=g0)
    _, start_values = maximize_paths(paths0, BOUNDS, raw_samples=128, steps=0, generator=g0)
    assert bool((values >= start_values - 1e-12).all())


def test_concentrated_posterior_puts_the_batch_at_the_maximiser():
    # Many exact observations: every posterior draw is close to the function itself.
    x, y = data(400)
    kernel = ScaleKernel(FourierFeatureKernel(512, seed=0)).double()
    kernel.base_kernel.lengthscale = torch.tensor(1.0, dtype=DT)
    gp = RandomFeatureGP(kernel, noise=1e-6).fit(x, y)
    batch = thompson_sample(gp, BOUNDS, 8, steps=200, lr=0.02,
                            generator=torch.Generator().manual_seed(0))
    assert (batch - CENTRE).norm(dim=-1).max() < 0.05


def test_heteroscedastic_noise_and_fit_stream():
    x, y = data(300)
    noise = 1e-3 + 0.1 * (x[:, 0] > 0).to(DT)  # per-point noise variances
    kernel = FourierFeatureKernel(128, seed=0).double()
    gp = RandomFeatureGP(kernel, noise=1.0)
    gp.fit_stream((x[i : i + 100], y[i : i + 100], noise[i : i + 100]) for i in range(0, 300, 100))
    batch = thompson_sample(gp, BOUNDS, 4, raw_samples=128, steps=20,
                            generator=torch.Generator().manual_seed(0))
    assert batch.shape == (4, 2)
    # fit_stream equals fit on all data: the same draws give the same batch.
    full = RandomFeatureGP(kernel, noise=1.0, solve="weight").fit(x, y, noise=noise)
    again = thompson_sample(full, BOUNDS, 4, raw_samples=128, steps=20,
                            generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(again, batch)


def test_several_outputs_need_an_objective():
    x, _ = data(40)
    kernel = FourierFeatureKernel(64, seed=0).double()  # two independent outputs
    gp = RandomFeatureGP(kernel, noise=1e-2).fit(x, torch.stack([bowl(x), -bowl(x)], -1))
    with pytest.raises(ValueError, match="objective"):
        thompson_sample(gp, BOUNDS, 2, raw_samples=16, steps=1)
    batch = thompson_sample(gp, BOUNDS, 2, raw_samples=16, steps=2, objective=lambda v: v[..., 0])
    assert batch.shape == (2, 2)


def test_argument_checks():
    paths = lambda x: x.sum(-1, keepdim=True).T  # noqa: E731
    with pytest.raises(ValueError, match=r"bounds must have shape \(2, d\)"):
        maximize_paths(paths, torch.zeros(3, 2, dtype=DT))
    with pytest.raises(ValueError, match="lower < upper"):
        maximize_paths(paths, torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=DT))
    with pytest.raises(ValueError, match="num_restarts"):
        maximize_paths(paths, BOUNDS, num_restarts=0)
    with pytest.raises(ValueError, match="inside bounds"):
        maximize_paths(paths, BOUNDS, candidates=torch.full((1, 2), 3.0, dtype=DT))
    with pytest.raises(ValueError, match=r"candidates must have shape \(C, 2\)"):
        maximize_paths(paths, BOUNDS, candidates=torch.zeros(1, 3, dtype=DT))


@pytest.mark.parametrize(
    "bounds,error,match",
    [
        (torch.tensor([[0.0, NAN], [1.0, 1.0]], dtype=DT), ValueError, "bounds must be finite"),
        (torch.tensor([[0.0, -INF], [1.0, 1.0]], dtype=DT), ValueError, "bounds must be finite"),
        (torch.tensor([[0, 0], [1, 1]]), TypeError, "bounds must have a floating dtype"),
        (torch.zeros(2, 0, dtype=DT), ValueError, r"bounds must have shape \(2, d\)"),
        (torch.tensor(1.0, dtype=DT), ValueError, "bounds must have at least 2"),
    ],
    ids=["nan", "inf", "integer", "empty", "0-d"],
)
def test_thompson_sample_rejects_bad_bounds(bounds, error, match):
    x, y = data(30)
    gp = RandomFeatureGP(FourierFeatureKernel(32, seed=0).double(), noise=1e-2).fit(x, y)
    with pytest.raises(error, match=match):
        thompson_sample(gp, bounds, 2, raw_samples=8, steps=1)


@pytest.mark.parametrize(
    "q,error", [(0, ValueError), (2.0, TypeError), (True, TypeError)], ids=["0", "float", "bool"]
)
def test_thompson_sample_rejects_bad_q(q, error):
    x, y = data(30)
    gp = RandomFeatureGP(FourierFeatureKernel(32, seed=0).double(), noise=1e-2).fit(x, y)
    with pytest.raises(error, match="q must be an integer"):
        thompson_sample(gp, BOUNDS, q, raw_samples=8, steps=1)


def test_maximize_paths_rejects_non_finite_settings():
    paths = lambda x: x.sum(-1, keepdim=True).T  # noqa: E731
    with pytest.raises(ValueError, match="lr must be a finite real number"):
        maximize_paths(paths, BOUNDS, lr=float("nan"))
    with pytest.raises(ValueError, match="candidates must be finite"):
        maximize_paths(paths, BOUNDS, candidates=torch.tensor([[0.0, float("nan")]], dtype=DT))


def test_a_model_changed_after_fit_is_refitted_or_refused():
    x, y = data(60)
    kernel = FourierFeatureKernel(64, seed=0).double()
    gp = RandomFeatureGP(kernel, noise=1e-2).fit(x, y)
    kernel.lengthscale = 0.3  # the held data is refitted under the new lengthscale
    batch = thompson_sample(gp, BOUNDS, 3, raw_samples=32, steps=5,
                            generator=torch.Generator().manual_seed(0))
    fresh = RandomFeatureGP(kernel, noise=1e-2).fit(x, y)
    expected = thompson_sample(fresh, BOUNDS, 3, raw_samples=32, steps=5,
                               generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(batch, expected)
    streamed = RandomFeatureGP(kernel, noise=1e-2).fit_stream([(x, y)])
    kernel.lengthscale = 0.5  # no data held: no stale answer, an error
    with pytest.raises(StaleFitError, match="lengthscale"):
        thompson_sample(streamed, BOUNDS, 3, raw_samples=32, steps=5)


@pytest.mark.parametrize("factor", [0.5, 1.0, 2.0, 3.0])
def test_posterior_num_features_is_the_smallest_power_of_two_above_factor_n(factor):
    minimum, maximum = 64, 4096
    for n in [1, 2, 31, 32, 33, 100, 255, 256, 257, 1000, 2047, 2048, 2049, 10**6]:
        d = posterior_num_features(n, factor, minimum, maximum)
        assert minimum <= d <= maximum and d & (d - 1) == 0  # a power of two in range
        if d < maximum:
            assert d >= factor * n  # enough features ...
        if d > minimum:
            assert d / 2 < factor * n  # ... and the fewest such


def test_posterior_num_features_clips_to_even_bounds():
    assert posterior_num_features(1) == 512
    assert posterior_num_features(10**6) == 4096
    assert posterior_num_features(600, maximum=1000) == 1000  # not a power of two: the bound
    assert posterior_num_features(5, minimum=6, maximum=6) == 6


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        ({"num_data": 0}, ValueError, "num_data must be an integer >= 1"),
        ({"num_data": 10.0}, TypeError, "num_data must be an integer"),
        ({"factor": 0.0}, ValueError, "factor must be a finite real number > 0"),
        ({"factor": float("nan")}, ValueError, "factor must be a finite real number > 0"),
        ({"minimum": 1}, ValueError, "minimum must be an integer >= 2"),
        ({"minimum": 513}, ValueError, "minimum must be even"),
        ({"maximum": 511}, ValueError, r"maximum must be an integer >= 512"),
        ({"maximum": 1025}, ValueError, "maximum must be even"),
    ],
    ids=["zero", "float", "factor0", "factor-nan", "minimum1", "odd-min", "max<min", "odd-max"],
)
def test_posterior_num_features_rejects_bad_arguments(kwargs, error, match):
    arguments = {"num_data": 100, **kwargs}
    with pytest.raises(error, match=match):
        posterior_num_features(**arguments)


def test_maximisers_of_increasing_paths_are_the_upper_corner_exactly():
    # lower + 1 * (upper - lower) rounds one ulp above upper for these bounds; each path is
    # increasing in every coordinate, so its maximiser is the upper corner itself.
    bounds = torch.tensor([[-1.0608166785462863] * 2, [1.3782524720257012] * 2], dtype=DT)
    assert bool((bounds[0] + (bounds[1] - bounds[0]) > bounds[1]).all())
    g = torch.Generator().manual_seed(0)
    best, values = maximize_paths(lambda z: z.sum(-1, keepdim=True).T, bounds, steps=200,
                                  lr=0.1, generator=g)
    assert bool((best >= bounds[0]).all()) and bool((best <= bounds[1]).all())
    assert torch.equal(best, bounds[1:])
    assert torch.equal(values, bounds[1].sum().reshape(1))


def test_bounds_with_an_infinite_width_are_refused():
    bounds = torch.tensor([[-1e308, 0.0], [1e308, 1.0]], dtype=DT)
    with pytest.raises(ValueError, match=r"finite width .* dimension\(s\) \[0\]"):
        maximize_paths(lambda z: z.T, bounds)


def test_generator_must_be_a_torch_generator():
    x, y = data(30)
    gp = RandomFeatureGP(FourierFeatureKernel(32, seed=0).double(), noise=1e-2).fit(x, y)
    message = "generator must be a torch.Generator or None, got str 'x'"
    with pytest.raises(TypeError, match=message):
        maximize_paths(lambda z: z.T, BOUNDS, generator="x")
    with pytest.raises(TypeError, match=message):
        thompson_sample(gp, BOUNDS, 2, generator="x")
    with pytest.raises(TypeError, match=message):
        gp.sample_functions(2, generator="x")
    with pytest.raises(TypeError, match="generator must be a torch.Generator or None, got int 0"):
        gp.sample_functions(2, generator=0)


def test_paths_without_gradients_need_steps_zero():
    with pytest.raises(ValueError, match="paths must be differentiable in x .* steps=0"):
        maximize_paths(lambda z: bowl(z).detach().unsqueeze(0), BOUNDS, steps=3)
    # steps=0 is the derivative-free use: the best random candidate, a box point.
    g = torch.Generator().manual_seed(0)
    best, value = maximize_paths(lambda z: bowl(z).detach().unsqueeze(0), BOUNDS, steps=0,
                                 generator=g)
    assert torch.equal(value, bowl(best))


def test_ascent_runs_under_no_grad():
    # A caller's torch.no_grad() must not switch the gradient ascent off.
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        best, _ = maximize_paths(lambda z: bowl(z).unsqueeze(0), BOUNDS, steps=300, lr=0.05,
                                 generator=g)
    torch.testing.assert_close(best[0], CENTRE, atol=1e-3, rtol=0)


def test_paths_returning_nan_are_refused():
    with pytest.raises(ValueError, match="paths must return values that are not NaN, got 8 NaN"):
        maximize_paths(lambda z: torch.full((1, z.shape[0]), float("nan"), dtype=DT), BOUNDS,
                       raw_samples=8)


def test_thompson_sample_refuses_a_classifier_by_name():
    from rfgp import DirichletGPClassifier

    x, y = data(30)
    clf = DirichletGPClassifier(FourierFeatureKernel(32, seed=0).double()).fit(x, (y > -0.5).long())
    with pytest.raises(TypeError, match="model must be a fitted rfgp.RandomFeatureGP .* got a "
                                        "DirichletGPClassifier"):
        thompson_sample(clf, BOUNDS, 2)


def test_half_precision_bounds_are_refused():
    # Adam's steps underflow in float16 and the maximisers came back NaN.
    with pytest.raises(TypeError, match="bounds must have dtype torch.float32 or torch.float64, "
                                        "got torch.float16"):
        maximize_paths(lambda z: z.T, BOUNDS.half(), steps=2)


def test_maximisers_are_detached_from_bounds_that_require_grad():
    bounds = BOUNDS.clone().requires_grad_(True)
    for steps in (0, 2):
        best, value = maximize_paths(lambda z: bowl(z).unsqueeze(0), bounds, steps=steps,
                                     raw_samples=16)
        assert not best.requires_grad and not value.requires_grad
