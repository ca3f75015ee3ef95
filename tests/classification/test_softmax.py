"""Tests of the Gaussian-softmax approximations in rfgp._softmax."""

import math

import numpy as np
import pytest
import torch

from rfgp.classification import latent_moments, softmax_expectation
from tests.classification.data import DTYPE


# ------------------------------------------------------------------------------ E[softmax]
def _quadrature_binary(mean, var, nodes=200):
    # E[sigmoid(f_1 - f_0)] with f_1 - f_0 ~ N(m, v), by Gauss-Hermite quadrature.
    t, w = np.polynomial.hermite.hermgauss(nodes)
    t = torch.as_tensor(t, dtype=DTYPE)
    w = torch.as_tensor(w, dtype=DTYPE) / math.sqrt(math.pi)
    m = (mean[:, 1] - mean[:, 0]).unsqueeze(-1)
    s = (var[:, 0] + var[:, 1]).sqrt().unsqueeze(-1)
    return (torch.sigmoid(m + math.sqrt(2) * s * t) * w).sum(-1)


def _latents(m, c, max_var, seed):
    g = torch.Generator().manual_seed(seed)
    mean = -7 * torch.rand(m, c, generator=g, dtype=DTYPE)
    var = max_var * torch.rand(m, c, generator=g, dtype=DTYPE)
    return mean, var


def test_mc_probabilities_unbiased_against_quadrature():
    mean, var = _latents(50, 2, 4.0, seed=1)
    exact = _quadrature_binary(mean, var)
    num_samples = 4000
    p = softmax_expectation(mean, var, "mc", num_samples, torch.Generator().manual_seed(2))
    # standard error of an average of S values in [0, 1]: at most 0.5 / sqrt(S)
    assert ((p[:, 1] - exact).abs() < 5 * 0.5 / math.sqrt(num_samples)).all()
    torch.testing.assert_close(p.sum(-1), torch.ones(50, dtype=DTYPE))


def test_mc_variance_decreases_with_samples():
    mean, var = _latents(1, 3, 2.0, seed=3)
    spreads = []
    for s in (100, 1600):
        draws = torch.stack([
            softmax_expectation(mean, var, "mc", s, torch.Generator().manual_seed(r))
            for r in range(40)
        ])
        spreads.append(draws.std(0).max())
    # standard error falls like 1 / sqrt(S): a factor 4 here
    assert spreads[0] / spreads[1] > 2.5


def test_mc_is_deterministic_with_generator():
    mean, var = _latents(5, 3, 1.0, seed=4)
    a = softmax_expectation(mean, var, "mc", 100, torch.Generator().manual_seed(7))
    b = softmax_expectation(mean, var, "mc", 100, torch.Generator().manual_seed(7))
    assert torch.equal(a, b)


@pytest.mark.parametrize("method", ["mc", "mean_field", "lognormal"])
def test_zero_variance_gives_softmax(method):
    mean, _ = _latents(6, 4, 1.0, seed=5)
    p = softmax_expectation(mean, torch.zeros_like(mean), method, 10)
    torch.testing.assert_close(p, torch.softmax(mean, -1))


def test_mean_field_error_binary_against_quadrature():
    # C = 2: the mean-field rule is the probit approximation of E[sigmoid]; documented error
    # about 0.012 (max) for latent variances up to 4.
    mean, var = _latents(400, 2, 4.0, seed=6)
    exact = _quadrature_binary(mean, var)
    approx = softmax_expectation(mean, var, "mean_field")[:, 1]
    lognormal = softmax_expectation(mean, var, "lognormal")[:, 1]
    assert (approx - exact).abs().max() < 0.02
    assert (approx - exact).abs().mean() < 0.006
    assert (lognormal - exact).abs().mean() > 5 * (approx - exact).abs().mean()


def test_mean_field_error_ten_classes_against_mc():
    mean, var = _latents(100, 10, 1.0, seed=7)
    num_samples = 10000
    ref = softmax_expectation(mean, var, "mc", num_samples, torch.Generator().manual_seed(8))
    stderr = 0.5 / math.sqrt(num_samples)
    err = (softmax_expectation(mean, var, "mean_field") - ref).abs()
    err_ln = (softmax_expectation(mean, var, "lognormal") - ref).abs()
    # documented: mean abs error about 0.007 and max about 0.06 for variances up to 1
    assert err.mean() < 0.01 + stderr
    assert err.max() < 0.08 + 5 * stderr
    assert err.mean() < err_ln.mean()



# ------------------------------------------------------------------------------ one MC draw set
def test_mc_row_probabilities_do_not_depend_on_other_rows():
    # The draws are shared by the rows: a row alone gets exactly its probabilities in a batch.
    mean, var = _latents(30, 4, 2.0, seed=9)
    full = softmax_expectation(mean, var, "mc", 300, torch.Generator().manual_seed(1))
    alone = softmax_expectation(mean[7:8], var[7:8], "mc", 300, torch.Generator().manual_seed(1))
    torch.testing.assert_close(alone, full[7:8], rtol=1e-12, atol=0)
    chunked = softmax_expectation(mean, var, "mc", 300, torch.Generator().manual_seed(1),
                                  chunk_size=7)
    torch.testing.assert_close(chunked, full, rtol=1e-12, atol=0)


@pytest.mark.parametrize("method", ["mc", "mean_field", "lognormal"])
def test_log_path_is_accurate_for_tiny_probabilities(method):
    # Means 800 apart: the small probability is about exp(-800), zero in float64 once
    # exponentiated, but its logarithm is the finite log-softmax value.
    mean = torch.tensor([[0.0, -800.0]], dtype=DTYPE)
    var = torch.zeros_like(mean)
    logp = softmax_expectation(mean, var, method, 10, log=True)
    assert torch.isfinite(logp).all()
    torch.testing.assert_close(logp, torch.log_softmax(mean, -1), rtol=1e-12, atol=1e-12)
    assert softmax_expectation(mean, var, method, 10)[0, 1] == 0


# ------------------------------------------------------------------------------ hostile input
@pytest.mark.parametrize("method", ["mc", "mean_field", "lognormal"])
def test_numpy_input_and_zero_rows(method):
    mean, var = _latents(5, 3, 1.0, seed=10)
    p_np = softmax_expectation(mean.numpy(), var.numpy(), method, 50,
                               torch.Generator().manual_seed(0))
    p_t = softmax_expectation(mean, var, method, 50, torch.Generator().manual_seed(0))
    torch.testing.assert_close(p_np, p_t)
    empty = softmax_expectation(torch.zeros(0, 3, dtype=DTYPE), torch.zeros(0, 3, dtype=DTYPE),
                                method, 10)
    assert empty.shape == (0, 3)


@pytest.mark.parametrize(
    "mean, variance, kwargs, error, match",
    [
        (torch.zeros(2, 3), -torch.ones(2, 3), {}, ValueError, "variance must be non-negative"),
        (torch.zeros(2, 3), torch.full((2, 3), float("nan")), {}, ValueError,
         "variance must be finite"),
        (torch.full((2, 3), float("inf")), torch.ones(2, 3), {}, ValueError,
         "mean must be finite"),
        (torch.zeros(2, 3, dtype=torch.long), torch.ones(2, 3, dtype=torch.long), {}, TypeError,
         "mean must have a real floating dtype"),
        (np.zeros((2, 3), dtype=np.int64), np.ones((2, 3)), {}, TypeError,
         "mean must have a real floating dtype"),
        ([[0.0, 0.0]], [[1.0, 1.0]], {}, TypeError, "mean must be a torch.Tensor or NumPy"),
        (torch.zeros(2, 3), torch.ones(2, 4), {}, ValueError, "same shape"),
        (torch.zeros(2, 3), torch.ones(2, 3, dtype=DTYPE), {}, TypeError, "same dtype"),
        (torch.zeros(()), torch.ones(()), {}, ValueError, "trailing class dimension"),
        (torch.zeros(2, 0), torch.ones(2, 0), {}, ValueError, "trailing class dimension"),
        (torch.zeros(2, 3), torch.ones(2, 3), {"chunk_size": 0}, ValueError,
         "chunk_size must be an integer >= 1"),
        (torch.zeros(2, 3), torch.ones(2, 3), {"num_samples": 0}, ValueError,
         "num_samples must be an integer >= 1"),
        (torch.zeros(2, 3), torch.ones(2, 3), {"num_samples": 10.0}, TypeError,
         "num_samples must be an integer"),
        (torch.zeros(2, 3), torch.ones(2, 3), {"method": "probit"}, ValueError, "method"),
        (torch.zeros(2, 3), torch.ones(2, 3), {"generator": 0}, TypeError,
         "generator must be a torch.Generator"),
        (torch.zeros(2, 3), torch.ones(2, 3), {"log": 1}, TypeError, "log must be a bool"),
    ],
)
def test_bad_input_raises_clear_errors(mean, variance, kwargs, error, match):
    with pytest.raises(error, match=match):
        softmax_expectation(mean, variance, **kwargs)


def test_round_off_negative_variance_is_zero():
    mean = torch.tensor([[0.5, -0.5]], dtype=DTYPE)
    p = softmax_expectation(mean, torch.tensor([[-1e-15, 0.0]], dtype=DTYPE), "mean_field")
    torch.testing.assert_close(p, torch.softmax(mean, -1))


def test_latent_moments_layouts():
    import gpytorch

    mean = torch.arange(6, dtype=DTYPE).reshape(3, 2)  # [M, C]
    var = 1 + mean
    batch = gpytorch.distributions.MultivariateNormal(mean.T, torch.diag_embed(var.T))
    for latent in (batch, torch.distributions.Normal(mean, var.sqrt()), (mean, var)):
        m, v = latent_moments(latent)
        torch.testing.assert_close(m, mean)
        torch.testing.assert_close(v, var)
    with pytest.raises(TypeError, match="latent must be"):
        latent_moments(mean)
