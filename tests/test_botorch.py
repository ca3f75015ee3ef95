"""The BoTorch adapter: posterior identities, gradients, acquisition optimisation, conditioning."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("botorch")

from botorch.acquisition import (  # noqa: E402
    LogExpectedImprovement,
    UpperConfidenceBound,
    qLogExpectedImprovement,
)
from botorch.optim import optimize_acqf  # noqa: E402
from botorch.posteriors.gpytorch import GPyTorchPosterior  # noqa: E402
from gpytorch.kernels import ScaleKernel  # noqa: E402

from rfgp import RandomFeatureGP, StaleFitError  # noqa: E402
from rfgp.botorch import RandomFeatureModel  # noqa: E402
from rfgp.kernels import FourierFeatureKernel, PolynomialSketchKernel  # noqa: E402

DT = torch.float64
BOUNDS = torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=DT)
CENTRE = torch.tensor([0.3, 0.6], dtype=DT)
NOISE = 1e-3


def bowl(x):
    return -((x - CENTRE) ** 2).sum(-1) * 10


def fitted(n=60, kernel=None, solve="auto", seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 2, generator=g, dtype=DT)
    if kernel is None:
        kernel = ScaleKernel(FourierFeatureKernel(64, seed=0)).double()
        kernel.base_kernel.lengthscale = torch.tensor(0.4, dtype=DT)
    gp = RandomFeatureGP(kernel, noise=NOISE, solve=solve).fit(x, bowl(x))
    return gp, x


def dense_posterior(gp, x, xs):
    """The GP posterior of the features' kernel by the N x N (function-space) formula."""
    k = gp.kernel
    with torch.no_grad():
        kxx = k(x).to_dense() + NOISE * torch.eye(x.shape[0], dtype=DT)
        ksx = k(xs, x).to_dense()
        kss = k(xs).to_dense()
    mean = ksx @ torch.linalg.solve(kxx, bowl(x))
    cov = kss - ksx @ torch.linalg.solve(kxx, ksx.T)
    return mean, cov


@pytest.mark.parametrize("solve", ["weight", "function"])
def test_joint_posterior_over_batches_equals_the_dense_gp(solve):
    gp, x = fitted(solve=solve, n=40)
    model = RandomFeatureModel(gp)
    xs = torch.rand(3, 4, 2, dtype=DT)  # b = 3 batches of q = 4 points
    post = model.posterior(xs)
    assert isinstance(post, GPyTorchPosterior)
    assert post.mean.shape == (3, 4, 1)
    for b in range(3):
        mean, cov = dense_posterior(gp, x, xs[b])
        torch.testing.assert_close(post.mean[b, :, 0], mean, atol=1e-7, rtol=1e-6)
        torch.testing.assert_close(post.mvn.covariance_matrix[b], cov, atol=1e-7, rtol=1e-6)
    noisy = model.posterior(xs, observation_noise=True)
    torch.testing.assert_close(
        noisy.variance - post.variance, torch.full_like(post.variance, NOISE)
    )
    given = model.posterior(xs, observation_noise=torch.full((1, 1), 0.5, dtype=DT))
    torch.testing.assert_close(given.variance - post.variance, torch.full_like(post.variance, 0.5))


def test_posterior_is_differentiable_in_x():
    gp, _ = fitted()
    model = RandomFeatureModel(gp)
    point = torch.tensor([[0.2, 0.7], [0.5, 0.5]], dtype=DT, requires_grad=True)

    def summary(p):
        post = model.posterior(p)
        return post.mean.sum() + post.mvn.covariance_matrix.sum()

    grad = torch.autograd.grad(summary(point), point)[0]
    eps = 1e-6
    fd = torch.zeros_like(point)
    with torch.no_grad():
        for i in range(2):
            for j in range(2):
                e = torch.zeros_like(point)
                e[i, j] = eps
                fd[i, j] = (summary(point + e) - summary(point - e)) / (2 * eps)
    torch.testing.assert_close(grad, fd, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "make_acqf,q",
    [
        (lambda m, best: LogExpectedImprovement(m, best_f=best), 1),
        (lambda m, best: qLogExpectedImprovement(m, best_f=best), 3),
        (lambda m, best: UpperConfidenceBound(m, beta=0.5), 1),
    ],
    ids=["LogEI", "qLogEI", "UCB"],
)
def test_optimize_acqf_runs_on_the_model(make_acqf, q):
    torch.manual_seed(0)
    gp, x = fitted(n=80)
    model = RandomFeatureModel(gp)
    acqf = make_acqf(model, bowl(x).max())
    candidates, value = optimize_acqf(acqf, BOUNDS, q=q, num_restarts=3, raw_samples=64)
    assert candidates.shape == (q, 2)
    assert bool(((candidates >= 0) & (candidates <= 1)).all())
    assert torch.isfinite(value).all()
    # optimize_acqf ascended: its candidates score at least as well as random points.
    with torch.no_grad():
        random_values = acqf(torch.rand(64, q, 2, dtype=DT))
    assert value.max() >= random_values.max() - 1e-9


def test_posterior_mean_maximiser_is_the_function_maximiser():
    # UCB with beta = 0 is the posterior mean; with dense exact data it peaks at CENTRE.
    torch.manual_seed(0)
    gp, _ = fitted(n=300)
    acqf = UpperConfidenceBound(RandomFeatureModel(gp), beta=0.0)
    candidate, _ = optimize_acqf(acqf, BOUNDS, q=1, num_restarts=4, raw_samples=128)
    assert (candidate[0] - CENTRE).norm() < 0.03


def test_condition_on_observations_equals_refitting():
    gp, x = fitted(n=30)
    model = RandomFeatureModel(gp)
    new_x = torch.rand(5, 2, dtype=DT)
    new_y = bowl(new_x).unsqueeze(-1)
    conditioned = model.condition_on_observations(new_x, new_y)
    all_x = torch.cat([x, new_x])
    refit = RandomFeatureGP(gp.kernel, noise=NOISE).fit(all_x, bowl(all_x))
    xs = torch.rand(7, 2, dtype=DT)
    torch.testing.assert_close(conditioned.posterior(xs).mean[:, 0], refit.predict(xs))
    assert gp.num_data == 30 and conditioned.gp.num_data == 35


def test_complex_and_composed_kernels_work():
    kernel = (
        FourierFeatureKernel(32, active_dims=[0], seed=1)
        + PolynomialSketchKernel(2, 16, bias=1.0, projection="gaussian", complex=True, seed=2)
    ).double()
    gp, x = fitted(kernel=kernel, n=50)
    post = RandomFeatureModel(gp).posterior(torch.rand(2, 2, dtype=DT))
    assert post.mean.shape == (2, 1)
    assert (post.variance >= -1e-10).all()


def test_argument_checks():
    with pytest.raises(TypeError, match="rfgp.RandomFeatureGP"):
        RandomFeatureModel(object())
    with pytest.raises(ValueError, match="fitted"):
        RandomFeatureModel(RandomFeatureGP(FourierFeatureKernel(8)))
    model = RandomFeatureModel(fitted()[0])
    for bad in ([1], [], [0.0], [True], [-1]):
        with pytest.raises(ValueError, match="output_indices"):
            model.posterior(torch.rand(2, 2, dtype=DT), output_indices=bad)
    with pytest.raises(ValueError, match="observation_noise must broadcast"):
        model.posterior(torch.rand(2, 2, dtype=DT), observation_noise=torch.ones(3, 1, dtype=DT))
    with pytest.raises(ValueError, match="Y must have shape"):
        model.condition_on_observations(torch.rand(2, 2, dtype=DT), torch.rand(3, 1, dtype=DT))


@pytest.mark.parametrize(
    "X,error,match",
    [
        (torch.tensor([[0.0, float("nan")]], dtype=DT), ValueError, "X must be finite"),
        (torch.tensor([[0.0, float("inf")]], dtype=DT), ValueError, "X must be finite"),
        (torch.zeros(1, 2, dtype=torch.long), TypeError, "X must have a floating dtype"),
        (torch.tensor(0.5, dtype=DT), ValueError, "X must have at least 2"),
        (torch.zeros(0, 2, dtype=DT), ValueError, r"X must hold q >= 1 points"),
        (torch.zeros(3, 0, 2, dtype=DT), ValueError, r"X must hold q >= 1 points"),
    ],
    ids=["nan", "inf", "integer", "0-d", "empty", "empty-q"],
)
def test_posterior_rejects_bad_points(X, error, match):
    model = RandomFeatureModel(fitted()[0])
    with pytest.raises(error, match=match):
        model.posterior(X)


def test_bad_noise_and_targets_are_rejected():
    model = RandomFeatureModel(fitted()[0])
    x = torch.rand(2, 2, dtype=DT)
    with pytest.raises(ValueError, match="observation_noise must be finite"):
        model.posterior(x, observation_noise=torch.full((2, 1), float("nan"), dtype=DT))
    with pytest.raises(ValueError, match="Y must be finite"):
        model.condition_on_observations(x, torch.tensor([[float("nan")], [1.0]], dtype=DT))
    with pytest.raises(TypeError, match="Y must have a floating dtype"):
        model.condition_on_observations(x, torch.ones(2, 1, dtype=torch.long))


def test_a_model_changed_after_fit_is_refitted_or_refused():
    gp, x = fitted()
    model = RandomFeatureModel(gp)
    xs = torch.rand(4, 2, dtype=DT)
    gp.kernel.base_kernel.lengthscale = torch.tensor(0.2, dtype=DT)  # data held: refitted
    fresh = RandomFeatureGP(gp.kernel, noise=NOISE).fit(x, bowl(x))
    torch.testing.assert_close(model.posterior(xs).mean[:, 0], fresh.posterior(xs).mean)
    streamed = RandomFeatureModel(
        RandomFeatureGP(gp.kernel, noise=NOISE).fit_stream([(x, bowl(x))])
    )
    gp.kernel.base_kernel.lengthscale = torch.tensor(0.5, dtype=DT)  # nothing held: refused
    with pytest.raises(StaleFitError, match="lengthscale"):
        streamed.posterior(xs)
    with pytest.raises(StaleFitError, match="lengthscale"):
        streamed.condition_on_observations(xs[:1], torch.zeros(1, 1, dtype=DT))


# ---------------------------------------------------------------- several outputs
def two_output_data(n=50, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 2, generator=g, dtype=DT)
    y = torch.stack([bowl(x), torch.sin(4 * x[:, 0]) * x[:, 1]], -1)
    return x, y


def rff_kernel():
    kernel = ScaleKernel(FourierFeatureKernel(64, seed=0)).double()
    kernel.base_kernel.lengthscale = torch.tensor(0.4, dtype=DT)
    return kernel


@pytest.mark.parametrize("solve", ["weight", "function"])
def test_outputs_of_a_multi_column_fit_are_the_per_column_models(solve):
    # Columns share the features and the noise, so column t's posterior is that of a model
    # fitted on column t alone, and the outputs are independent a posteriori.
    x, y = two_output_data()
    model = RandomFeatureModel(RandomFeatureGP(rff_kernel(), noise=NOISE, solve=solve).fit(x, y))
    assert model.num_outputs == 2
    xs = torch.rand(3, 4, 2, dtype=DT)
    post = model.posterior(xs)
    assert post.mean.shape == (3, 4, 2)
    cov = post.mvn.covariance_matrix  # (3, 8, 8)
    assert cov.shape == (3, 8, 8)
    for t in range(2):
        single = RandomFeatureModel(
            RandomFeatureGP(rff_kernel(), noise=NOISE, solve=solve).fit(x, y[:, t])
        )
        ref = single.posterior(xs)
        torch.testing.assert_close(post.mean[..., t], ref.mean[..., 0], rtol=1e-8, atol=1e-10)
        rows = [i * 2 + t for i in range(4)] if post.mvn._interleaved else list(
            range(4 * t, 4 * t + 4)
        )
        block = cov[:, rows][:, :, rows]
        torch.testing.assert_close(block, ref.mvn.covariance_matrix, rtol=1e-7, atol=1e-10)
        chosen = model.posterior(xs, output_indices=[t])
        torch.testing.assert_close(chosen.mean, ref.mean, rtol=1e-8, atol=1e-10)
        torch.testing.assert_close(chosen.mvn.covariance_matrix, ref.mvn.covariance_matrix,
                                   rtol=1e-7, atol=1e-10)
    other = [i * 2 + 1 for i in range(4)] if post.mvn._interleaved else list(range(4, 8))
    first = [i * 2 for i in range(4)] if post.mvn._interleaved else list(range(4))
    assert cov[:, first][:, :, other].abs().max() < 1e-12
    noisy = model.posterior(xs, observation_noise=True).mvn.covariance_matrix
    torch.testing.assert_close(noisy - cov, NOISE * torch.eye(8, dtype=DT).expand(3, 8, 8))
    given = torch.tensor([0.1, 0.2], dtype=DT)  # per output
    noisy = model.posterior(xs, observation_noise=given).mvn.covariance_matrix
    torch.testing.assert_close(
        (noisy - cov).diagonal(dim1=-2, dim2=-1).reshape(3, -1).sort(-1).values,
        given.repeat_interleave(4).expand(3, 8),
    )


def test_vector_field_outputs_are_the_joint_posterior_blocks():
    from rfgp.kernels import CurlFreeFeatureKernel

    g = torch.Generator().manual_seed(2)
    x = torch.rand(40, 2, generator=g, dtype=DT)
    field = torch.stack([torch.cos(3 * x[:, 0]), torch.sin(3 * x[:, 1])], -1)
    gp = RandomFeatureGP(CurlFreeFeatureKernel(32, input_dim=2, seed=0).to(DT), noise=1e-2)
    model = RandomFeatureModel(gp.fit(x, field))
    assert model.num_outputs == 2
    xs = torch.rand(2, 3, 2, generator=g, dtype=DT)
    post = model.posterior(xs)
    assert post.mean.shape == (2, 3, 2)
    for b in range(2):
        ref = gp.posterior(xs[b])  # the joint posterior of these 3 points, 2 outputs each
        torch.testing.assert_close(post.mean[b], ref.mean, rtol=1e-8, atol=1e-10)
        torch.testing.assert_close(post.mvn.covariance_matrix[b], ref.covariance_matrix,
                                   rtol=1e-7, atol=1e-10)


def test_acquisition_on_a_scalarised_two_output_model():
    from botorch.acquisition.objective import ScalarizedPosteriorTransform

    x, y = two_output_data(n=60)
    gp = RandomFeatureGP(rff_kernel(), noise=NOISE).fit(x, y)
    model = RandomFeatureModel(gp)
    weights = torch.tensor([1.0, 0.0], dtype=DT)  # the bowl alone: its maximiser is CENTRE
    transform = ScalarizedPosteriorTransform(weights)
    best = float((y @ weights).max())
    for acqf in (
        UpperConfidenceBound(model, beta=0.01, posterior_transform=transform),
        LogExpectedImprovement(model, best_f=best, posterior_transform=transform),
        qLogExpectedImprovement(model, best_f=best, posterior_transform=transform),
    ):
        point, _ = optimize_acqf(acqf, BOUNDS, q=1, num_restarts=4, raw_samples=64)
        assert point.shape == (1, 2)
        assert torch.isfinite(point).all()
    mean_point, _ = optimize_acqf(
        UpperConfidenceBound(model, beta=0.0, posterior_transform=transform), BOUNDS, q=1,
        num_restarts=4, raw_samples=64,
    )
    assert (mean_point[0] - CENTRE).norm() < 0.1


def test_conditioning_a_two_output_model_equals_refitting():
    x, y = two_output_data(n=60)
    model = RandomFeatureModel(RandomFeatureGP(rff_kernel(), noise=NOISE).fit(x[:40], y[:40]))
    conditioned = model.condition_on_observations(x[40:], y[40:])
    refit = RandomFeatureModel(RandomFeatureGP(rff_kernel(), noise=NOISE).fit(x, y))
    xs = torch.rand(2, 3, 2, dtype=DT)
    a, b = conditioned.posterior(xs), refit.posterior(xs)
    torch.testing.assert_close(a.mean, b.mean, rtol=1e-7, atol=1e-9)
    torch.testing.assert_close(a.mvn.covariance_matrix, b.mvn.covariance_matrix,
                               rtol=1e-6, atol=1e-9)
    with pytest.raises(ValueError, match=r"Y must have shape \(n, num_outputs\) = \(2, 2\)"):
        model.condition_on_observations(x[:2], y[:2, :1])


def test_outputs_follow_a_refit_of_the_wrapped_gp():
    # The model reads its outputs from the GP it wraps: a refit on other targets is never stale.
    x, y = two_output_data()
    gp = RandomFeatureGP(rff_kernel(), noise=NOISE).fit(x, y[:, 0])
    model = RandomFeatureModel(gp)
    assert model.num_outputs == 1
    gp.fit(x, y)
    assert model.num_outputs == 2
    assert model.posterior(torch.rand(3, 2, dtype=DT)).mean.shape == (3, 2)


@pytest.mark.parametrize("solve", ["weight", "function"])
def test_observation_noise_follows_the_requested_outputs(solve):
    x, y = two_output_data()
    noise = torch.tensor([0.1, 0.5], dtype=DT)
    gp = RandomFeatureGP(rff_kernel(), noise=noise, solve=solve).fit(x, y)
    model = RandomFeatureModel(gp)
    xs = torch.rand(3, 4, 2, generator=torch.Generator().manual_seed(3), dtype=DT)
    for outputs in ([1, 0], [1], [0], [0, 1]):
        latent = model.posterior(xs, output_indices=outputs)
        noisy = model.posterior(xs, output_indices=outputs, observation_noise=True)
        # The noise of output t on the variances of output t, in the requested order ...
        torch.testing.assert_close(noisy.variance - latent.variance,
                                   noise[outputs].expand(3, 4, len(outputs)), rtol=0, atol=1e-12)
        # ... and nothing off the diagonal.
        added = noisy.mvn.covariance_matrix - latent.mvn.covariance_matrix
        torch.testing.assert_close(added, torch.diag_embed(added.diagonal(dim1=-2, dim2=-1)),
                                   rtol=0, atol=1e-12)


def test_vector_field_observation_noise_per_output():
    from rfgp.kernels import CurlFreeFeatureKernel

    g = torch.Generator().manual_seed(2)
    x = torch.rand(40, 2, generator=g, dtype=DT)
    field = torch.stack([torch.cos(3 * x[:, 0]), torch.sin(3 * x[:, 1])], -1)
    noise = torch.tensor([0.01, 0.2], dtype=DT)
    gp = RandomFeatureGP(CurlFreeFeatureKernel(32, input_dim=2, seed=0).to(DT), noise=noise)
    model = RandomFeatureModel(gp.fit(x, field))
    xs = torch.rand(2, 3, 2, generator=g, dtype=DT)
    for outputs in ([1, 0], [1]):
        added = (model.posterior(xs, output_indices=outputs, observation_noise=True).variance
                 - model.posterior(xs, output_indices=outputs).variance)
        torch.testing.assert_close(added, noise[outputs].expand(2, 3, len(outputs)), rtol=0,
                                   atol=1e-12)


@pytest.mark.parametrize("bad", [-1.0, -1e-300])
def test_negative_observation_noise_is_refused_by_name(bad):
    model = RandomFeatureModel(fitted()[0])
    x = torch.rand(2, 2, dtype=DT)
    with pytest.raises(ValueError, match="observation_noise must hold non-negative noise "
                                         "variances, got minimum -1"):
        model.posterior(x, observation_noise=torch.full((2, 1), bad, dtype=DT))
    with pytest.raises(ValueError, match="observation_noise must be finite"):
        model.posterior(x, observation_noise=torch.full((2, 1), float("inf"), dtype=DT))
    with pytest.raises(TypeError, match="observation_noise must be a bool or a tensor"):
        model.posterior(x, observation_noise=0.1)


def test_observation_noise_true_needs_a_model_noise():
    # A fit with fixed per-row noise has no noise for new points: the model noise (1.0 by
    # default) is unrelated to it.
    g = torch.Generator().manual_seed(0)
    x = torch.rand(30, 2, generator=g, dtype=DT)
    gp = RandomFeatureGP(rff_kernel()).fit(x, bowl(x), torch.full((30,), 1e-3, dtype=DT))
    model = RandomFeatureModel(gp)
    with pytest.raises(ValueError, match="observation_noise=True adds the model noise, but the "
                                         "GP was fitted with fixed noise variances"):
        model.posterior(x[:2], observation_noise=True)
    noisy = model.posterior(x[:2], observation_noise=torch.full((2, 1), 1e-3, dtype=DT))
    torch.testing.assert_close(noisy.variance - model.posterior(x[:2]).variance,
                               torch.full((2, 1), 1e-3, dtype=DT), rtol=0, atol=1e-12)


def test_numpy_integer_output_indices_are_indices():
    x, y = two_output_data()
    model = RandomFeatureModel(RandomFeatureGP(rff_kernel(), noise=NOISE).fit(x, y))
    xs = torch.rand(3, 2, dtype=DT)
    torch.testing.assert_close(model.posterior(xs, output_indices=[np.int64(1)]).mean,
                               model.posterior(xs, output_indices=[1]).mean, rtol=0, atol=0)
    with pytest.raises(ValueError, match="output_indices must be None"):
        model.posterior(xs, output_indices=[np.bool_(True)])


def test_a_batch_of_coincident_points_samples_one_value_each_time():
    # q points at one place have a joint covariance of rank one: singular, so a dense
    # covariance cannot be factorised without jitter. Monte-Carlo acquisitions (qLogEI over
    # q = 4 candidates that an optimiser has brought together) must still sample; every draw
    # then takes one value at all q points (up to the jitter's square root), with the
    # posterior's variance.
    gp, _ = fitted(n=60)
    model = RandomFeatureModel(gp)
    point = torch.tensor([0.4, 0.5], dtype=DT)
    post = model.posterior(point.expand(1, 4, 2))
    samples = post.rsample(torch.Size([4000]))  # (4000, 1, 4, 1)
    assert samples.shape == (4000, 1, 4, 1)
    spread = samples[..., 0] - samples[..., :1, 0]
    assert float(spread.abs().max()) < 1e-3
    variance = float(post.variance[0, 0, 0])
    # the draws' variance within 5 standard errors (chi-square: sd = var * sqrt(2 / n))
    drawn = float(samples[:, 0, 0, 0].var())
    assert abs(drawn - variance) < 5 * variance * (2 / 4000) ** 0.5


def test_q_log_expected_improvement_optimises_a_batch_of_four():
    torch.manual_seed(0)
    gp, x = fitted(n=80)
    acqf = qLogExpectedImprovement(RandomFeatureModel(gp), best_f=bowl(x).max())
    candidates, value = optimize_acqf(acqf, BOUNDS, q=4, num_restarts=4, raw_samples=128)
    assert candidates.shape == (4, 2) and torch.isfinite(value).all()
