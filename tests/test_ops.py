"""Tests of rfgp._ops: the fast Walsh–Hadamard transform, padding and the seeded samplers."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.linalg
import torch

from rfgp._ops import (
    check_finite,
    complex_gaussian,
    complex_rademacher,
    fwht,
    gaussian,
    hadamard_matrix,
    make_generator,
    next_power_of_two,
    pad_to_power_of_two,
    rademacher,
)

POWERS = [1 << k for k in range(13)]  # 1 .. 4096


def dense_hadamard(d: int) -> torch.Tensor:
    # Independent reference: scipy's Sylvester construction.
    return torch.from_numpy(scipy.linalg.hadamard(d).astype(np.float64))


# ---------------------------------------------------------------- fwht: correctness
@pytest.mark.parametrize("d", POWERS)
def test_fwht_matches_dense_hadamard(d, generator):
    x = torch.randn(3, d, generator=generator, dtype=torch.float64)
    expected = x @ dense_hadamard(d)
    torch.testing.assert_close(fwht(x), expected, rtol=1e-12, atol=1e-10 * math.sqrt(d))


@pytest.mark.parametrize("d", [1, 2, 16, 64, 128, 2048])
def test_fwht_of_identity_is_hadamard(d):
    eye = torch.eye(d, dtype=torch.float64)
    torch.testing.assert_close(fwht(eye), dense_hadamard(d), rtol=0, atol=1e-10)
    torch.testing.assert_close(
        fwht(eye, normalized=True), hadamard_matrix(d, normalized=True), rtol=0, atol=1e-12
    )


@pytest.mark.parametrize("d", [4, 32, 512])
def test_fwht_batch_dimensions(d, generator):
    x = torch.randn(2, 3, 5, d, generator=generator, dtype=torch.float64)
    y = fwht(x)
    assert y.shape == x.shape
    expected = (x.reshape(-1, d) @ dense_hadamard(d)).reshape(x.shape)
    torch.testing.assert_close(y, expected, rtol=1e-12, atol=1e-10)
    # A 1-D input is a single vector.
    torch.testing.assert_close(fwht(x[0, 0, 0]), expected[0, 0, 0], rtol=1e-12, atol=1e-10)


def test_fwht_non_contiguous_input(generator):
    x = torch.randn(64, 7, generator=generator, dtype=torch.float64).T  # (7, 64), strided
    assert not x.is_contiguous()
    torch.testing.assert_close(fwht(x), x @ dense_hadamard(64), rtol=1e-12, atol=1e-10)


@pytest.mark.parametrize("d", [1, 8, 256])
def test_fwht_complex_is_linear_in_real_and_imaginary_parts(d, generator):
    re = torch.randn(4, d, generator=generator, dtype=torch.float64)
    im = torch.randn(4, d, generator=generator, dtype=torch.float64)
    z = torch.complex(re, im)
    out = fwht(z)
    assert out.dtype == torch.complex128
    torch.testing.assert_close(out, torch.complex(fwht(re), fwht(im)), rtol=1e-12, atol=1e-10)
    out64 = fwht(z.to(torch.complex64))
    assert out64.dtype == torch.complex64


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fwht_keeps_dtype(dtype):
    x = torch.ones(2, 16, dtype=dtype)
    assert fwht(x).dtype == dtype


@pytest.mark.parametrize("d", [1, 2, 64, 128, 4096])
def test_normalized_fwht_is_an_orthogonal_involution(d, generator):
    x = torch.randn(3, d, generator=generator, dtype=torch.float64)
    y = fwht(x, normalized=True)
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1), rtol=1e-12, atol=0)
    torch.testing.assert_close(fwht(y, normalized=True), x, rtol=0, atol=1e-12)
    # Unnormalised: H H = d I.
    torch.testing.assert_close(fwht(fwht(x)), d * x, rtol=1e-12, atol=1e-9)


@pytest.mark.parametrize("d", [1, 2, 8, 128])
def test_fwht_gradcheck_real(d, generator):
    x = torch.randn(2, d, generator=generator, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: fwht(t, normalized=True), (x,))
    assert torch.autograd.gradgradcheck(lambda t: fwht(t), (x,))


@pytest.mark.parametrize("d", [4, 128])
def test_fwht_gradcheck_complex(d, generator):
    x = torch.randn(2, d, generator=generator, dtype=torch.complex128, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: fwht(t), (x,))


def test_fwht_gradient_is_the_transform(generator):
    # d/dx <fwht(x), v> = H v because H is symmetric.
    x = torch.randn(32, generator=generator, dtype=torch.float64, requires_grad=True)
    v = torch.randn(32, generator=generator, dtype=torch.float64)
    (fwht(x) @ v).backward()
    torch.testing.assert_close(x.grad, dense_hadamard(32) @ v, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------- padding
@pytest.mark.parametrize("d", [3, 5, 20, 100, 1000])
def test_fwht_pad_equals_transform_of_zero_padded_input(d, generator):
    x = torch.randn(2, d, generator=generator, dtype=torch.float64)
    padded_dim = 1 << (d - 1).bit_length()
    padded = torch.cat([x, torch.zeros(2, padded_dim - d, dtype=torch.float64)], dim=-1)
    out = fwht(x, pad=True)
    assert out.shape == (2, padded_dim)
    torch.testing.assert_close(out, padded @ dense_hadamard(padded_dim), rtol=1e-12, atol=1e-10)


def test_pad_to_power_of_two():
    x = torch.arange(6.0).reshape(2, 3)
    out = pad_to_power_of_two(x)
    assert out.shape == (2, 4)
    torch.testing.assert_close(out[:, :3], x)
    assert torch.all(out[:, 3] == 0)
    along_rows = pad_to_power_of_two(torch.ones(3, 5), dim=0)
    assert along_rows.shape == (4, 5)
    assert torch.all(along_rows[3] == 0)
    already = torch.ones(2, 8)
    assert pad_to_power_of_two(already) is already


@pytest.mark.parametrize("n, expected", [(1, 1), (2, 2), (3, 4), (5, 8), (8, 8), (1025, 2048)])
def test_next_power_of_two(n, expected):
    assert next_power_of_two(n) == expected


# ---------------------------------------------------------------- errors
@pytest.mark.parametrize("bad", [0, -3])
def test_next_power_of_two_rejects_bad_input(bad):
    with pytest.raises(ValueError, match="n must be an integer >= 1"):
        next_power_of_two(bad)


@pytest.mark.parametrize("bad", [2.0, True])
def test_next_power_of_two_rejects_non_integers(bad):
    with pytest.raises(TypeError, match="n must be an integer"):
        next_power_of_two(bad)


def test_fwht_errors():
    with pytest.raises(ValueError, match=r"last dimension of x must be a power of two.*got 6"):
        fwht(torch.ones(2, 6))
    with pytest.raises(ValueError, match="x must have at least one dimension"):
        fwht(torch.tensor(1.0))
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        fwht(np.ones(4))


def test_hadamard_matrix_properties_and_errors():
    for n in [1, 2, 4, 32]:
        h = hadamard_matrix(n)
        torch.testing.assert_close(h, dense_hadamard(n))
        hn = hadamard_matrix(n, normalized=True, dtype=torch.float32)
        assert hn.dtype == torch.float32
        torch.testing.assert_close(hn @ hn, torch.eye(n), rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="n must be a power of two, got 12"):
        hadamard_matrix(12)


# ---------------------------------------------------------------- samplers
def test_make_generator_reproducible_and_validated():
    assert make_generator(None) is None
    a = torch.randn(5, generator=make_generator(7))
    b = torch.randn(5, generator=make_generator(7))
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    with pytest.raises(TypeError, match="seed must be an integer"):
        make_generator(1.5)


def test_samplers_do_not_touch_global_rng():
    torch.manual_seed(99)
    expected = torch.rand(3)
    torch.manual_seed(99)
    gen = make_generator(0)
    gaussian((10,), gen)
    rademacher((10,), gen)
    complex_rademacher((10,), gen)
    complex_gaussian((10,), gen)
    torch.testing.assert_close(torch.rand(3), expected, rtol=0, atol=0)


def test_rademacher_values_and_moments(generator):
    n = 40000
    s = rademacher((n,), generator)
    assert s.dtype == torch.float64
    assert set(s.unique().tolist()) == {-1.0, 1.0}
    assert abs(s.mean().item()) < 5 / math.sqrt(n)


def test_complex_rademacher_values_and_moments(generator):
    n = 40000
    s = complex_rademacher((n,), generator)
    assert s.dtype == torch.complex128
    torch.testing.assert_close(s.abs(), torch.ones(n, dtype=torch.float64))
    assert torch.all((s.real == 0) | (s.imag == 0))
    # E[s] = 0 and E[s^2] = 0 (the four values are equally likely); the standard error is 1/sqrt(n).
    assert s.mean().abs().item() < 5 / math.sqrt(n)
    assert (s * s).mean().abs().item() < 5 / math.sqrt(n)


def test_complex_gaussian_moments(generator):
    n = 40000
    z = complex_gaussian((n,), generator)
    assert z.dtype == torch.complex128
    # E|z|^2 = 1 (Var |z|^2 = 1), E[z^2] = 0 (Var = 1 per component / 2).
    assert abs(z.abs().pow(2).mean().item() - 1.0) < 5 / math.sqrt(n)
    assert (z * z).mean().abs().item() < 5 / math.sqrt(n)
    assert complex_gaussian((3,), generator, dtype=torch.complex64).dtype == torch.complex64


def test_gaussian_moments(generator):
    n = 40000
    g = gaussian((n,), generator)
    assert abs(g.mean().item()) < 5 / math.sqrt(n)
    assert abs(g.var().item() - 1) < 5 * math.sqrt(2 / n)


def test_check_finite():
    check_finite("x", torch.ones(3))
    with pytest.raises(ValueError, match=r"weights must be finite, but 2 entries"):
        check_finite("weights", torch.tensor([1.0, float("nan"), float("inf")]))


@pytest.mark.parametrize(
    "values, expected",
    [
        ([1.0, -2.0, 0.0], True),
        ([1.0, float("nan")], False),
        ([float("inf"), 1.0], False),
        ([float("-inf"), float("inf")], False),
        ([3.0e38, 3.0e38], True),  # finite entries whose float32 sum overflows
        ([], True),
    ],
)
def test_all_finite(values, expected):
    from rfgp._ops import all_finite

    x = torch.tensor(values, dtype=torch.float32)
    assert all_finite(x) is expected
    assert all_finite(x) == bool(torch.isfinite(x).all())


def test_samplers_refuse_a_generator_that_is_not_one():
    from rfgp._ops import complex_gaussian, gaussian, rademacher

    for sampler in (gaussian, rademacher, complex_gaussian):
        with pytest.raises(TypeError, match="generator must be a torch.Generator or None, got "
                                            "str 'x'"):
            sampler((3,), "x")


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128, torch.float32])
def test_adjoint_products_equal_the_conjugate_transposed_product(dtype):
    # A^H B as (B^H A)^H summed over row chunks; the result is (W, k), contiguous, with no
    # lazy conjugation left in it.
    from rfgp._ops import add_adjoint_product_, adjoint_sum

    g = torch.Generator().manual_seed(0)
    a = torch.randn(70, 9, generator=g, dtype=dtype)
    b = torch.randn(70, 3, generator=g, dtype=dtype)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-13, atol=1e-13)
    expected = a.mH @ b
    acc = torch.zeros(3, 9, dtype=dtype)
    for rows in (slice(0, 30), slice(30, 31), slice(31, 70)):
        assert add_adjoint_product_(acc, a[rows], b[rows]) is acc
    summed = adjoint_sum(acc)
    torch.testing.assert_close(summed, expected, **tol)
    assert summed.shape == (9, 3) and summed.is_contiguous() and not summed.is_conj()
