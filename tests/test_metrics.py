"""Tests of rfgp.metrics against closed forms and torch.distributions."""

from __future__ import annotations

import math

import pytest
import torch

from rfgp import metrics

DT = torch.float64


def _rand(*shape, seed=0):
    return torch.rand(*shape, generator=torch.Generator().manual_seed(seed), dtype=DT)


def test_gaussian_kl_matches_torch_distributions():
    ma, me = _rand(50, seed=1), _rand(50, seed=2)
    va, ve = 0.1 + _rand(50, seed=3), 0.1 + _rand(50, seed=4)
    expected = torch.distributions.kl_divergence(
        torch.distributions.Normal(ma, va.sqrt()), torch.distributions.Normal(me, ve.sqrt())
    ).sum()
    torch.testing.assert_close(metrics.gaussian_kl(ma, va, me, ve), expected, rtol=1e-12, atol=0)


def test_gaussian_kl_is_not_the_printed_eq93_and_is_non_negative():
    m = torch.zeros(1, dtype=DT)
    va, ve = torch.ones(1, dtype=DT), torch.full((1,), 0.5, dtype=DT)
    # printed Eq. 93: s_e^2/s_a^2 + log(s_e^2/s_a^2) - 1 = 0.5 - 0.693 - 1 < 0
    printed = 0.5 * (0.5 + math.log(0.5) - 1)
    kl = metrics.gaussian_kl(m, va, m, ve)
    assert printed < 0 < float(kl)
    torch.testing.assert_close(kl, torch.tensor(0.5 * (2 - math.log(2) - 1), dtype=DT))
    same = _rand(10)
    assert float(metrics.gaussian_kl(same, same + 1, same, same + 1)) == 0.0


def test_gaussian_kl_averages_outputs():
    ma, me = _rand(20, 3, seed=1), _rand(20, 3, seed=2)
    va, ve = 0.1 + _rand(20, 3, seed=3), 0.1 + _rand(20, 3, seed=4)
    per = [metrics.gaussian_kl(ma[:, t], va[:, t], me[:, t], ve[:, t]) for t in range(3)]
    torch.testing.assert_close(metrics.gaussian_kl(ma, va, me, ve), sum(per) / 3)


def test_relative_frobenius_error():
    k = _rand(6, 6)
    k = k @ k.T
    assert float(metrics.relative_frobenius_error(k, k)) == 0.0
    torch.testing.assert_close(
        metrics.relative_frobenius_error(1.2 * k, k), torch.tensor(0.2, dtype=DT)
    )
    # scale invariant
    torch.testing.assert_close(
        metrics.relative_frobenius_error(3 * 1.2 * k, 3 * k), torch.tensor(0.2, dtype=DT)
    )
    imag = torch.complex(k, _rand(6, 6, seed=5))
    assert float(metrics.relative_frobenius_error(imag, k)) == 0.0
    torch.testing.assert_close(
        metrics.relative_frobenius_error(imag, k, real_part=False),
        torch.linalg.norm(imag.imag) / torch.linalg.norm(k),
    )


def test_mnll_nmse_rmse():
    y, mean, var = _rand(30, seed=1), _rand(30, seed=2), 0.2 + _rand(30, seed=3)
    expected = -torch.distributions.Normal(mean, var.sqrt()).log_prob(y).mean()
    torch.testing.assert_close(metrics.mnll(y, mean, var), expected)
    assert abs(float(metrics.nmse(y, y.mean().expand(30))) - 1.0) < 1e-12
    assert float(metrics.nmse(y, y)) == 0.0
    torch.testing.assert_close(metrics.rmse(y, mean), ((y - mean) ** 2).mean().sqrt())
    y2 = torch.stack([y, 2 * y], -1)
    assert abs(float(metrics.nmse(y2, y2.mean(0).expand(30, 2))) - 1.0) < 1e-12


def test_metric_errors():
    a = torch.ones(3, dtype=DT)
    with pytest.raises(ValueError, match="same shape"):
        metrics.rmse(a, torch.ones(4, dtype=DT))
    with pytest.raises(ValueError, match="var must be positive"):
        metrics.mnll(a, a, torch.zeros(3, dtype=DT))
    with pytest.raises(ValueError, match="var_exact must be non-negative"):
        metrics.gaussian_kl(a, a, a, -a)
    with pytest.raises(TypeError, match="approx"):
        metrics.relative_frobenius_error([1.0], a)
    with pytest.raises(ValueError, match="exact must not be all zeros"):
        metrics.relative_frobenius_error(a, 0 * a)


# ------------------------------------------------------------------------------ hostile input
NAN = float("nan")


def _regression_calls(a, b, c):
    return {
        "mnll": lambda: metrics.mnll(a, b, c.abs() + 1),
        "rmse": lambda: metrics.rmse(a, b),
        "nmse": lambda: metrics.nmse(a, b),
        "gaussian_kl": lambda: metrics.gaussian_kl(a, c.abs() + 1, b, c.abs() + 1),
        "relative_frobenius_error": lambda: metrics.relative_frobenius_error(a, b),
        "kernel_distance": lambda: metrics.kernel_distance(a, b),
    }


@pytest.mark.parametrize("name", ["mnll", "rmse", "nmse", "gaussian_kl",
                                  "relative_frobenius_error", "kernel_distance"])
@pytest.mark.parametrize("bad", [NAN, float("inf")])
def test_non_finite_input_raises(name, bad):
    a, b, c = _rand(6, 2, seed=1), _rand(6, 2, seed=2), _rand(6, 2, seed=3)
    a[2, 1] = bad
    with pytest.raises(ValueError, match="must be finite"):
        _regression_calls(a, b, c)[name]()


@pytest.mark.parametrize("name", ["mnll", "rmse", "nmse", "gaussian_kl",
                                  "relative_frobenius_error", "kernel_distance"])
def test_empty_input_raises(name):
    e = torch.zeros(0, 2, dtype=DT)
    with pytest.raises(ValueError, match="must not be empty|must be non-empty"):
        _regression_calls(e, e, e)[name]()


@pytest.mark.parametrize("name", ["mnll", "rmse", "nmse", "gaussian_kl",
                                  "relative_frobenius_error"])
def test_numpy_input_gives_the_tensor_answer(name):
    a, b, c = _rand(6, 2, seed=1), _rand(6, 2, seed=2), _rand(6, 2, seed=3)
    expected = _regression_calls(a, b, c)[name]()
    got = _regression_calls(a.numpy(), b.numpy(), c.numpy())[name]() if name not in (
        "mnll", "gaussian_kl") else {
        "mnll": lambda: metrics.mnll(a.numpy(), b.numpy(), (c.abs() + 1).numpy()),
        "gaussian_kl": lambda: metrics.gaussian_kl(a.numpy(), (c.abs() + 1).numpy(),
                                                   b.numpy(), (c.abs() + 1).numpy()),
    }[name]()
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    x, y = _rand(5, 2, seed=4), _rand(7, 2, seed=5)
    torch.testing.assert_close(metrics.kernel_distance(x.numpy(), y.numpy()),
                               metrics.kernel_distance(x, y))


def test_nmse_reference_variance_shape_must_match_the_outputs():
    y, m = _rand(30, seed=1), _rand(30, seed=2)
    with pytest.raises(ValueError, match=r"reference_variance must be a scalar or have shape \(\)"):
        metrics.nmse(y, m, torch.ones(3, dtype=DT))
    y2, m2 = _rand(30, 3, seed=1), _rand(30, 3, seed=2)
    ref = torch.tensor([1.0, 2.0, 4.0], dtype=DT)
    per = [((y2[:, t] - m2[:, t]).square().mean() / ref[t]) for t in range(3)]
    torch.testing.assert_close(metrics.nmse(y2, m2, ref), sum(per) / 3)
    torch.testing.assert_close(metrics.nmse(y, m, 2.0), ((y - m) ** 2).mean() / 2)
    with pytest.raises(ValueError, match="reference_variance must be a scalar or have shape"):
        metrics.nmse(y2, m2, torch.ones(2, dtype=DT))
    with pytest.raises(ValueError, match="reference_variance must be positive"):
        metrics.nmse(y, m, 0.0)
    with pytest.raises(ValueError, match="variance of y must be positive"):
        metrics.nmse(torch.ones(4, dtype=DT), torch.zeros(4, dtype=DT))


def test_integer_and_list_inputs_raise_type_errors():
    with pytest.raises(TypeError, match="y must have a floating dtype"):
        metrics.rmse(torch.arange(3), torch.arange(3))
    with pytest.raises(TypeError, match="y must be a torch.Tensor or NumPy array"):
        metrics.rmse([1.0], torch.ones(1, dtype=DT))
    with pytest.raises(TypeError, match="mean_approx must be real"):
        metrics.gaussian_kl(torch.ones(2, dtype=torch.complex128), *(torch.ones(2, dtype=DT),) * 3)
    with pytest.raises(ValueError, match="block_size must be an integer >= 1"):
        metrics.kernel_distance(_rand(3, 2), _rand(3, 2), block_size=0)


# Powers of two near 1e+-200 scale every value exactly; 1e+-200 themselves up to rounding.
EXACT_SCALES = [2.0**664, 2.0**-664]
DECIMAL_SCALES = [1e200, 1e-200]


@pytest.mark.parametrize("c", EXACT_SCALES + DECIMAL_SCALES)
def test_rmse_nmse_and_frobenius_error_are_scale_equivariant(c):
    y, mean = _rand(30, 2, seed=1), _rand(30, 2, seed=2)
    exact = c in EXACT_SCALES
    check = (lambda a, b: torch.testing.assert_close(a, b, rtol=0, atol=0)) if exact else (
        lambda a, b: torch.testing.assert_close(a, b, rtol=1e-14, atol=0))
    check(metrics.rmse(c * y, c * mean), c * metrics.rmse(y, mean))
    check(metrics.nmse(c * y, c * mean), metrics.nmse(y, mean))
    k = _rand(5, 5, seed=3)
    check(metrics.relative_frobenius_error(c * (k + 0.1), c * k),
          metrics.relative_frobenius_error(k + 0.1, k))


@pytest.mark.parametrize("c", [2.0**300, 2.0**-300, 1e150, 1e-150])
def test_mnll_and_reference_nmse_shift_and_keep_under_scaling(c):
    # With y, mu scaled by c and the variance by c^2, the MNLL shifts by log c; the NMSE with
    # a reference variance scaled by c^2 is unchanged.
    y, mean, var = _rand(20, seed=4), _rand(20, seed=5), _rand(20, seed=6).abs() + 0.1
    torch.testing.assert_close(metrics.mnll(c * y, c * mean, c * c * var),
                               metrics.mnll(y, mean, var) + math.log(c), rtol=1e-14, atol=0)
    ref = torch.tensor(0.7, dtype=DT)
    torch.testing.assert_close(metrics.nmse(c * y, c * mean, c * c * ref),
                               metrics.nmse(y, mean, ref), rtol=1e-14, atol=0)


@pytest.mark.parametrize("c", [1e200, 1e-200])
def test_mnll_of_residuals_far_above_the_variance_is_finite(c):
    # var = c v: the residual term c (y - mu)^2 / (2 v) is near 1e200 (finite) at c = 1e200;
    # (c (y - mu))^2 itself would overflow, and underflow at c = 1e-200.
    y, mean, var = _rand(20, seed=4), _rand(20, seed=5), _rand(20, seed=6).abs() + 0.1
    expected = (0.5 * torch.log(2 * math.pi * c * var)).mean() + (
        c * (y - mean).square() / (2 * var)).mean()
    torch.testing.assert_close(metrics.mnll(c * y, c * mean, c * var), expected, rtol=1e-13,
                               atol=0)


def test_nmse_of_tiny_targets_is_not_constant():
    y = _rand(40, seed=7)
    for c in (1e-200, 2.0**-664, 1e-300):
        torch.testing.assert_close(metrics.nmse(c * y, 0.5 * c * y), metrics.nmse(y, 0.5 * y),
                                   rtol=1e-14, atol=0)
    with pytest.raises(ValueError, match="y is constant"):
        metrics.nmse(torch.full((3,), 1e-200, dtype=DT), torch.zeros(3, dtype=DT))


@pytest.mark.parametrize("c", [2.0**100, 2.0**-100])
def test_float32_metrics_are_scale_equivariant(c):
    # float32 squares overflow past 1.8e19 and underflow below 1e-19.
    y, mean = _rand(30, seed=8).float(), _rand(30, seed=9).float()
    assert metrics.rmse(c * y, c * mean) == c * metrics.rmse(y, mean)
    assert metrics.nmse(c * y, c * mean) == metrics.nmse(y, mean)
    assert metrics.relative_frobenius_error(c * y, c * mean) == (
        metrics.relative_frobenius_error(y, mean))


def test_nmse_refuses_constant_targets_whose_variance_rounds_above_zero():
    y = torch.full((3,), 0.1, dtype=DT)
    assert y.var(unbiased=False) > 0  # the rounding this test is about
    with pytest.raises(ValueError, match="y is constant"):
        metrics.nmse(y, torch.zeros(3, dtype=DT))
    two = torch.stack([torch.tensor([0.0, 1.0, 2.0], dtype=DT), y], -1)
    with pytest.raises(ValueError, match="y is constant"):
        metrics.nmse(two, torch.zeros(3, 2, dtype=DT))


@pytest.mark.parametrize("c", [1e200, 1e-200])
def test_gaussian_kl_mean_term_neither_overflows_nor_underflows(c):
    # Equal variances c v: the KL is sum (c d)^2 / (2 c v) = c sum d^2 / (2 v).
    m_a, m_e, v = _rand(10, seed=10), _rand(10, seed=11), _rand(10, seed=12) + 0.5
    expected = c * ((m_e - m_a).square() / (2 * v)).sum()
    torch.testing.assert_close(metrics.gaussian_kl(c * m_a, c * v, c * m_e, c * v,
                                                   min_variance=1e-300), expected,
                               rtol=1e-13, atol=0)
