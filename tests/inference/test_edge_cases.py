"""Edge cases of RandomFeatureGP, each a correct answer or a clear error: empty queries, empty
validation sets, learning rates, jitter, 3-D inputs, failed fits, tiny and huge noise, targets of
extreme scale, memory that cannot exist, streaming with a data-dependent allocation."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from linear_operator.utils.errors import NotPSDError

from rfgp import RandomFeatureGP
from rfgp.kernels import CurlFreeFeatureKernel, FourierFeatureKernel, MaclaurinKernel

DT = torch.float64


def _data(n=60, outputs=1, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 2, generator=g, dtype=DT)
    y = torch.sin(6 * x[:, 0]) + 0.1 * torch.randn(n, generator=g, dtype=DT)
    if outputs > 1:
        y = torch.stack([y * (t + 1) for t in range(outputs)], -1)
    return x, y, torch.rand(10, 2, generator=g, dtype=DT)


def _kernel(num=40):
    k = FourierFeatureKernel(num, seed=0).double()
    k.lengthscale = 0.3
    return k


@pytest.mark.parametrize("solve", ["weight", "function"])
def test_predict_on_zero_rows_returns_empty_results(solve):
    x, y, xt = _data(outputs=3)
    gp = RandomFeatureGP(_kernel(), noise=0.1, solve=solve).fit(x, y)
    mean, std = gp.predict(xt[:0], return_std=True)
    assert mean.shape == std.shape == (0, 3)
    assert gp.sample_functions(4)(xt[:0]).shape == (4, 0, 3)
    single = RandomFeatureGP(_kernel(), noise=0.1, solve=solve).fit(x, y[:, 0])
    assert single.predict(xt[:0]).shape == (0,)
    vector = RandomFeatureGP(CurlFreeFeatureKernel(16, seed=0).double(), noise=0.1).fit(x, y[:, :2])
    assert vector.predict(xt[:0]).shape == (0, 2)


def test_empty_evidence_and_validation_set_raise():
    x, y, xt = _data()
    gp = RandomFeatureGP(_kernel(), noise=0.1)
    with pytest.raises(ValueError, match="at least one row"):
        gp.log_marginal_likelihood(x[:0], y[:0])
    with pytest.raises(ValueError, match="x_val must hold at least one row"):
        gp.select_noise(x, y, xt[:0], y[:0])


def test_learning_rate_jitter_and_input_rank_are_checked():
    x, y, xt = _data()
    gp = RandomFeatureGP(_kernel(), noise=0.1)
    for lr in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="lr must be"):
            gp.optimize_hyperparameters(x, y, lr=lr)
    for jitter in (float("nan"), float("inf"), -1e-6):
        with pytest.raises(ValueError, match="jitter must be"):
            RandomFeatureGP(_kernel(), jitter=jitter)
    gp.fit(x, y)
    with pytest.raises(ValueError, match=r"x must have shape \(N, d\)"):
        gp.predict(xt.unsqueeze(0))
    with pytest.raises(ValueError, match=r"x must have shape \(N, d\)"):
        gp.fit(x.unsqueeze(0), y)


def test_failed_fit_stream_and_fit_leave_the_earlier_fit_intact():
    x, y, xt = _data()
    gp = RandomFeatureGP(_kernel(), noise=0.1).fit(x, y)
    before = gp.predict(xt)
    with pytest.raises(ValueError, match="layout"):
        gp.fit_stream([(x[:30], y[:30]), (x[30:], torch.stack([y[30:], y[30:]], -1))])
    with pytest.raises(ValueError, match="finite"):
        gp.fit(x, torch.full_like(y, float("nan")))
    assert torch.equal(gp.predict(xt), before) and gp.num_data == 60


def test_fit_stream_with_an_unallocated_maclaurin_kernel_asks_for_an_allocation():
    x, y, xt = _data(200)
    kernel = MaclaurinKernel("exponential", 32, seed=0).double()
    gp = RandomFeatureGP(kernel, noise=0.1)
    with pytest.raises(ValueError, match=r"kernel\.allocate\(x_sample\)"):
        gp.fit_stream([(x[:100], y[:100]), (x[100:], y[100:])])
    kernel.allocate(x)
    streamed = gp.fit_stream([(x[:100], y[:100]), (x[100:], y[100:])]).predict(xt)
    full = RandomFeatureGP(kernel, noise=0.1, solve="weight").fit(x, y).predict(xt)
    torch.testing.assert_close(streamed, full, rtol=1e-10, atol=1e-12)


def test_impossible_buffers_raise_memory_error_naming_the_shape():
    x, y, _ = _data()
    with pytest.raises(MemoryError, match=r"\(1000000, 1000000\).*num_features"):
        RandomFeatureGP(FourierFeatureKernel(10**6, seed=0).double(), solve="weight").fit(x, y)
    with pytest.raises(MemoryError, match="chunk_size"):
        RandomFeatureGP(_kernel(1024), solve="weight").fit(x, y, chunk_size=10**9)
    big = torch.rand(3 * 10**6, 1, dtype=DT)
    with pytest.raises(MemoryError, match=r"\(6000000, 3000000\).*fit_stream"):
        RandomFeatureGP(FourierFeatureKernel(4, seed=0).double(), solve="function").fit(
            big, big[:, 0])


def test_memory_guard_honours_the_address_space_limit(monkeypatch):
    # ulimit -v below the physical memory: the guard's clear error, not a raw allocation one.
    import resource

    from rfgp.inference._linalg import available_memory, check_memory

    cpu = torch.device("cpu")
    physical = available_memory(cpu)
    limit = 10**8
    monkeypatch.setattr(resource, "getrlimit",
                        lambda which: (limit, resource.RLIM_INFINITY)
                        if which == resource.RLIMIT_AS else (resource.RLIM_INFINITY,) * 2)
    assert available_memory(cpu) == min(physical, limit)
    with pytest.raises(MemoryError, match=r"\(5000, 5000\) \(float64\) needs 2e\+08 bytes, more "
                                          r"than the 1e\+08 bytes .*smaller"):
        check_memory((5000, 5000), torch.float64, cpu, "B", "make it smaller")
    check_memory((1000, 1000), torch.float64, cpu, "B", "")  # 8e6 bytes fit
    monkeypatch.setattr(resource, "getrlimit", lambda which: (resource.RLIM_INFINITY,) * 2)
    assert available_memory(cpu) == physical


def _projection_std(phi, phi_test):
    """Posterior std of the noise-free limit: the prior std orthogonal to the data's features."""
    _, _, vh = torch.linalg.svd(phi, full_matrices=False)
    rest = phi_test - phi_test @ vh.T @ vh
    return rest.square().sum(-1).sqrt()


def test_tiny_noise_keeps_the_prior_or_raises():
    # 30 rows, 80 features: the noise-free posterior keeps the prior off the data's span. The
    # function-space solve gets it; the weight-space matrix G / 1e-30 + I cannot hold the prior
    # in float64 and must say so rather than answer with a jitter that erases it.
    x, y, xt = _data(30)
    kernel = _kernel(80)
    kernel.lengthscale = 0.05  # short: the 30 rows leave much of the prior unexplained
    expected = _projection_std(kernel.features(x), kernel.features(xt))
    _, std = RandomFeatureGP(kernel, noise=1e-30, solve="function").fit(x, y).predict(
        xt, return_std=True)
    torch.testing.assert_close(std, expected, rtol=0, atol=1e-6)
    assert float(expected.max()) > 0.3
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            _, std_w = RandomFeatureGP(kernel, noise=1e-30, solve="weight").fit(x, y).predict(
                xt, return_std=True)
        except NotPSDError as err:
            assert "solve='function'" in str(err)
        else:
            torch.testing.assert_close(std_w, expected, rtol=0, atol=1e-3)


@pytest.mark.parametrize("solve", ["weight", "function"])
def test_targets_of_extreme_scale(solve):
    x, y, xt = _data()
    gp = RandomFeatureGP(_kernel(), noise=0.1, solve=solve).fit(x, y)
    huge = RandomFeatureGP(_kernel(), noise=0.1, solve=solve).fit(x, y * 1e160)
    mean, std = huge.predict(xt, return_std=True)
    torch.testing.assert_close(mean, gp.predict(xt) * 1e160, rtol=1e-12, atol=0)
    assert torch.isfinite(std).all()
    with pytest.raises(ValueError, match="not representable"):
        huge.log_marginal_likelihood()
    tiny = RandomFeatureGP(_kernel(), noise=0.1, solve=solve).fit(x, y * 1e-300)
    torch.testing.assert_close(tiny.predict(xt), gp.predict(xt) * 1e-300, rtol=1e-12, atol=0)


@pytest.mark.parametrize("solve", ["weight", "function"])
def test_huge_noise_gives_the_prior_and_a_finite_evidence(solve):
    x, y, xt = _data()
    kernel = _kernel()
    gp = RandomFeatureGP(kernel, noise=1e200, solve=solve).fit(x, y)
    mean, std = gp.predict(xt, return_std=True)
    prior_std = kernel.features(xt).square().sum(-1).sqrt()
    torch.testing.assert_close(std, prior_std, rtol=1e-12, atol=0)
    assert mean.abs().max() < 1e-190
    lml = gp.log_marginal_likelihood()
    expected = -0.5 * (60 * math.log(2 * math.pi * 1e200) + float(y.square().sum()) / 1e200)
    assert math.isfinite(float(lml))
    assert float(lml) == pytest.approx(expected, rel=1e-12)
    with pytest.raises(ValueError, match="not representable in torch.float32"):
        RandomFeatureGP(_kernel().float(), noise=1e200).fit(x.float(), y.float())
    with pytest.raises(ValueError, match="not representable in torch.float32"):
        RandomFeatureGP(_kernel().float()).fit(x.float(), y.float(), noise=1e200)


def test_targets_with_no_columns_are_rejected_by_every_fitting_entry_point():
    # An (N, 0) target holds no data to fit: each entry point names the argument instead of
    # fitting nothing, dividing by zero or indexing an empty column.
    from gpytorch.kernels import ScaleKernel

    from rfgp import fit_auto
    from rfgp.inference._cross_validation import cross_validate, held_out_log_density

    x, y, _ = _data()
    empty = y[:, None][:, :0]
    message = r"y must have at least one target column, got shape \(60, 0\)"
    gp = RandomFeatureGP(_kernel(), noise=0.1)
    with pytest.raises(ValueError, match=message):
        gp.fit(x, empty)
    with pytest.raises(ValueError, match=message):
        gp.fit_stream([(x, empty)])
    with pytest.raises(ValueError, match=message):
        fit_auto(x, empty)
    kernel = ScaleKernel(_kernel()).double()
    noise = torch.tensor(0.1, dtype=DT)
    with pytest.raises(ValueError, match="y_train must have at least one target column"):
        held_out_log_density(kernel, noise, x, empty, x, empty)
    with pytest.raises(ValueError, match="at least one target column"):
        cross_validate(lambda xs, ys: iter(()), x, empty, 5)
    assert not gp.is_fitted
