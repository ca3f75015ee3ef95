"""Low-level operations shared by the feature maps.

* :func:`fwht`: the fast Walsh–Hadamard transform, ``O(d log d)`` per vector, for real and
  complex inputs with any leading batch dimensions, differentiable.
* :func:`pad_to_power_of_two` / :func:`next_power_of_two`: the zero padding that Hadamard-based
  methods need.
* Seeded samplers (:func:`make_generator`, :func:`rademacher`, :func:`complex_rademacher`,
  :func:`gaussian`, :func:`complex_gaussian`) that take an optional ``torch.Generator`` and never
  reseed the global random state.
* :func:`power_of_two_scale` / :func:`column_power_of_two_scale`: exact divisors that bring
  values of any magnitude near 1 before they are squared or summed.
* :func:`add_adjoint_product_` / :func:`adjoint_sum`: the products :math:`A^H B` of tall
  feature blocks with a few columns, summed in the form a CPU's BLAS streams.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Optional, Sequence

import torch
from torch import Tensor

from rfgp._validation import all_finite, check_finite, check_generator, check_int

__all__ = [
    "next_power_of_two",
    "pad_to_power_of_two",
    "hadamard_matrix",
    "fwht",
    "make_generator",
    "generator_device",
    "complex_dtype",
    "rademacher",
    "complex_rademacher",
    "gaussian",
    "complex_gaussian",
    "check_finite",
    "all_finite",
    "power_of_two_scale",
    "column_power_of_two_scale",
    "add_adjoint_product_",
    "adjoint_sum",
]

# Largest Hadamard block applied as one dense product. Blocks of 32-128 keep each small GEMM in
# cache while the number of passes over the data stays log2(d) / 6 or so.
_MAX_BLOCK_LOG2 = 7


def next_power_of_two(n: int) -> int:
    r"""Smallest power of two ``>= n``: :math:`2^{\lceil \log_2 n \rceil}`.

    Args:
        n: a positive integer.

    Returns:
        The power of two (an ``int``).

    Example:
        >>> next_power_of_two(5), next_power_of_two(8)
        (8, 8)
    """
    n = check_int("n", n)
    return 1 << (n - 1).bit_length()


def pad_to_power_of_two(x: Tensor, dim: int = -1) -> Tensor:
    r"""Zero-pad ``x`` along ``dim`` to the next power of two (no copy if already one).

    Hadamard-based methods need :math:`d' = 2^{\lceil \log_2 d \rceil}` coordinates; zeros
    leave every inner product :math:`x^\top y` unchanged.

    Args:
        x: tensor of any shape.
        dim: the dimension to pad.

    Returns:
        ``x`` with ``x.shape[dim]`` padded to :func:`next_power_of_two` of it.

    Example:
        >>> pad_to_power_of_two(torch.ones(2, 3)).shape
        torch.Size([2, 4])
    """
    size = x.shape[dim]
    target = next_power_of_two(size)
    if target == size:
        return x
    dim = dim % x.dim()
    pad = [0, 0] * (x.dim() - dim - 1) + [0, target - size]
    return torch.nn.functional.pad(x, pad)


@lru_cache(maxsize=64)
def _hadamard_cpu_float64(n: int) -> Tensor:
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


def hadamard_matrix(
    n: int,
    normalized: bool = False,
    dtype: torch.dtype = torch.float64,
    device: Optional[torch.device] = None,
) -> Tensor:
    r"""Dense Sylvester Hadamard matrix ``H_n`` with entries ``(-1)^{popcount(i & j)}``.

    Args:
        n: order, a power of two.
        normalized: divide by ``sqrt(n)`` so that ``H H = I``.
        dtype, device: of the result.

    Returns:
        ``(n, n)`` tensor of ``+-1`` entries (``+-1/sqrt(n)`` when ``normalized``), symmetric.

    Raises:
        ValueError: if ``n`` is not a power of two.

    Example:
        >>> hadamard_matrix(2)
        tensor([[ 1.,  1.],
                [ 1., -1.]], dtype=torch.float64)
    """
    if next_power_of_two(n) != n:
        raise ValueError(f"n must be a power of two, got {n}")
    h = _hadamard_cpu_float64(n)
    if normalized:
        h = h / math.sqrt(n)
    return h.to(device=device, dtype=dtype)


@lru_cache(maxsize=128)
def _hadamard_factor(n: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    # Private cache (fwht never hands these tensors out), so no host-to-device copy per call.
    return hadamard_matrix(n, dtype=dtype, device=device)


def _block_sizes(log2_d: int) -> list[int]:
    num_blocks = max(1, math.ceil(log2_d / _MAX_BLOCK_LOG2))
    base, extra = divmod(log2_d, num_blocks)
    return [1 << (base + (1 if i < extra else 0)) for i in range(num_blocks)]


def fwht(x: Tensor, normalized: bool = False, pad: bool = False) -> Tensor:
    r"""Fast Walsh–Hadamard transform along the last dimension.

    Computes ``y = x H_d`` (``H_d`` the Sylvester Hadamard matrix, symmetric, so also ``H_d x``
    for column vectors) in ``O(d log d)`` per vector. ``H_d`` is written as a Kronecker product
    ``H_{a_1} ⊗ ... ⊗ H_{a_k}`` of small blocks (``a_i <= 128``); each block is one dense matrix
    product over a reshaped view (no transposed copies), so the work runs as a few GEMMs instead
    of ``log2 d`` elementwise passes.

    Args:
        x: ``(..., d)`` real or complex tensor; ``d`` a power of two unless ``pad=True``.
        normalized: multiply by ``1/sqrt(d)`` (then the transform is orthogonal and involutive).
        pad: zero-pad ``d`` to the next power of two first.

    Returns:
        Tensor of shape ``(..., d')`` with ``d'`` the (padded) length, same dtype as ``x``.

    Example:
        >>> fwht(torch.tensor([1.0, 0.0, 0.0, 0.0]))
        tensor([1., 1., 1., 1.])
    """
    if not isinstance(x, Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() == 0:
        raise ValueError("x must have at least one dimension, got a scalar tensor")
    if pad:
        x = pad_to_power_of_two(x)
    d = x.shape[-1]
    if next_power_of_two(d) != d:
        raise ValueError(
            f"the last dimension of x must be a power of two (or pass pad=True), got {d}"
        )
    if d == 1:
        return x.clone()
    lead = x.shape[:-1]
    sizes = _block_sizes(d.bit_length() - 1)
    factors = [_hadamard_factor(a, x.dtype, x.device) for a in sizes]
    # With x viewed as (rows, a_1, ..., a_k) (row-major), H_d = H_{a_1} ⊗ ... ⊗ H_{a_k} acts on
    # each axis separately. The last axis is one contiguous (rows * d / a_k, a_k) @ H GEMM; every
    # other axis i is a batched left product H_{a_i} @ (rows * a_1..a_{i-1}, a_i, a_{i+1}..a_k),
    # which needs no transposed copy of the data.
    y = x.reshape(-1, sizes[-1]) @ factors[-1]
    inner = sizes[-1]
    for a, h in zip(reversed(sizes[:-1]), reversed(factors[:-1])):
        y = torch.matmul(h, y.reshape(-1, a, inner))
        inner *= a
    y = y.reshape(*lead, d)
    if normalized:
        y = y / math.sqrt(d)
    return y


def make_generator(
    seed: Optional[int] = None, device: Optional[torch.device] = None
) -> Optional[torch.Generator]:
    """A ``torch.Generator`` seeded with ``seed``, or ``None`` (the global RNG) if seed is None.

    Args:
        seed: an integer seed, or ``None``.
        device: device of the generator (default CPU).

    Returns:
        A seeded ``torch.Generator`` or ``None``.

    Example:
        >>> a = torch.randn(3, generator=make_generator(0))
        >>> torch.equal(a, torch.randn(3, generator=make_generator(0))), make_generator(None)
        (True, None)
    """
    if seed is None:
        return None
    seed = check_int("seed", seed, minimum=None)
    gen = torch.Generator(device=device if device is not None else "cpu")
    gen.manual_seed(seed)
    return gen


def generator_device(generator: Optional[torch.Generator]) -> torch.device:
    """The device random draws with ``generator`` land on: its own, or the CPU for ``None``.

    Example:
        >>> generator_device(None), generator_device(torch.Generator())
        (device(type='cpu'), device(type='cpu'))
    """
    check_generator("generator", generator)
    return generator.device if generator is not None else torch.device("cpu")


def complex_dtype(dtype: torch.dtype) -> torch.dtype:
    """The complex dtype of complex features of real inputs of ``dtype``.

    complex64 for float32 (and lower precisions), complex128 otherwise.

    Example:
        >>> complex_dtype(torch.float32), complex_dtype(torch.float64)
        (torch.complex64, torch.complex128)
    """
    return torch.complex64 if dtype == torch.float32 else torch.complex128


def gaussian(
    shape: Sequence[int],
    generator: Optional[torch.Generator] = None,
    dtype: torch.dtype = torch.float64,
) -> Tensor:
    r"""Standard normal draws :math:`N(0, 1)` (on the generator's device).

    Args:
        shape: shape of the result.
        generator: ``torch.Generator`` (``None``: the global RNG).
        dtype: real floating dtype.

    Returns:
        A tensor of ``shape``.

    Example:
        >>> gaussian((2, 3), make_generator(0)).shape
        torch.Size([2, 3])
    """
    return torch.randn(*shape, generator=generator, dtype=dtype, device=generator_device(generator))


def rademacher(
    shape: Sequence[int],
    generator: Optional[torch.Generator] = None,
    dtype: torch.dtype = torch.float64,
) -> Tensor:
    """Uniform draws from ``{-1, +1}`` (mean 0, variance 1).

    Args:
        shape: shape of the result.
        generator: ``torch.Generator`` (``None``: the global RNG).
        dtype: dtype of the result.

    Returns:
        A tensor of ``shape`` with entries ``-1`` or ``1``.

    Example:
        >>> r = rademacher((1000,), make_generator(0))
        >>> sorted(r.unique().tolist()), bool(r.mean().abs() < 0.1)
        ([-1.0, 1.0], True)
    """
    device = generator_device(generator)
    bits = torch.randint(0, 2, tuple(shape), generator=generator, device=device)
    return (2 * bits - 1).to(dtype)


def complex_rademacher(
    shape: Sequence[int],
    generator: Optional[torch.Generator] = None,
    dtype: torch.dtype = torch.complex128,
) -> Tensor:
    r"""Uniform draws from ``{1, -1, i, -i}``: :math:`E[z] = E[z^2] = 0`, :math:`E|z|^2 = 1`.

    Args:
        shape: shape of the result.
        generator: ``torch.Generator`` (``None``: the global RNG).
        dtype: complex dtype of the result.

    Returns:
        A complex tensor of ``shape``.

    Example:
        >>> z = complex_rademacher((4,), make_generator(0))
        >>> z.dtype, bool((z.abs() == 1).all())
        (torch.complex128, True)
    """
    k = torch.randint(0, 4, tuple(shape), generator=generator, device=generator_device(generator))
    real = torch.tensor([1.0, -1.0, 0.0, 0.0], dtype=torch.float64, device=k.device)[k]
    imag = torch.tensor([0.0, 0.0, 1.0, -1.0], dtype=torch.float64, device=k.device)[k]
    return torch.complex(real, imag).to(dtype)


def complex_gaussian(
    shape: Sequence[int],
    generator: Optional[torch.Generator] = None,
    dtype: torch.dtype = torch.complex128,
) -> Tensor:
    r"""Standard complex normal draws :math:`(v + i w) / \sqrt2` with :math:`v, w \sim N(0, 1)`.

    :math:`E|z|^2 = 1` and :math:`E[z^2] = 0` (circular).

    Args:
        shape: shape of the result.
        generator: ``torch.Generator`` (``None``: the global RNG).
        dtype: complex dtype of the result.

    Returns:
        A complex tensor of ``shape``.

    Example:
        >>> z = complex_gaussian((20000,), make_generator(0))
        >>> bool(abs(z.abs().pow(2).mean() - 1) < 0.05), bool(z.pow(2).mean().abs() < 0.05)
        (True, True)
    """
    real_dtype = torch.float64
    v = gaussian(shape, generator, real_dtype)
    w = gaussian(shape, generator, real_dtype)
    return (torch.complex(v, w) / math.sqrt(2.0)).to(dtype)


def power_of_two_scale(values: Tensor) -> float:
    """The power of two nearest below ``max |values|`` (1 for zeros): dividing by it is exact
    and keeps values of any magnitude finite in squared sums.

    Example:
        >>> power_of_two_scale(torch.tensor([3.0, -5.0]))
        4.0
        >>> power_of_two_scale(torch.tensor([1e160], dtype=torch.float64)) == 2.0**531
        True
    """
    largest = float(values.detach().abs().max()) if values.numel() else 0.0
    if largest == 0.0 or not math.isfinite(largest):
        return 1.0
    return 2.0 ** math.floor(math.log2(largest))


def column_power_of_two_scale(values: Tensor) -> Tensor:
    """Per column (over the leading dimension), the power of two nearest below the largest
    ``|value|`` (1 for zero columns, at least the smallest normal number, so that its inverse
    is finite), shape ``values.shape[1:]``, in ``values``' real dtype.

    The exponent comes from ``frexp``, so the scale is an exact power of two and dividing by it
    changes no significand: a statistic of ``values / scale`` times ``scale`` is the statistic
    of ``values`` as the same arithmetic would give at scale 1, without overflow or underflow.

    Example:
        >>> values = torch.tensor([[3e200, 0.0], [-5e200, 0.0]], dtype=torch.float64)
        >>> column_power_of_two_scale(values).tolist() == [2.0**666, 1.0]
        True
    """
    peak = values.detach().abs().amax(0)
    _, exponent = torch.frexp(peak)  # peak = m 2^e with m in [0.5, 1)
    scale = torch.ldexp(torch.ones_like(peak), exponent - 1).clamp_min(torch.finfo(peak.dtype).tiny)
    return torch.where((peak > 0) & torch.isfinite(peak), scale, torch.ones_like(peak))


# ======================================================================= adjoint products
# Why these exist: the product A^H B of a tall (n, W) block with a thin (n, k) one is, as
# ``a.mH @ b``, a BLAS call on the transposed A, which CPU BLAS libraries run several times
# slower than the same numbers taken as (B^H A)^H, which streams A's rows (two cores, float64,
# 4,096 x 16,384: 2 columns 7.3 times, 9 columns 3.6 times, 64 columns 2.4 times slower; one
# column and square products alike). Every pass of an iterative solve takes this product.


def add_adjoint_product_(acc: Tensor, a: Tensor, b: Tensor) -> Tensor:
    r"""Accumulate :math:`B^H A` into ``acc`` (shape ``(k, W)``) in place: ``acc`` holds the
    adjoint of the running sum :math:`\sum A^H B`, which :func:`adjoint_sum` turns back into
    ``(W, k)`` once the chunks are summed.

    Example:
        >>> a = torch.randn(40, 6, dtype=torch.float64)
        >>> b = torch.randn(40, 2, dtype=torch.float64)
        >>> acc = torch.zeros(2, 6, dtype=torch.float64)
        >>> for rows in (slice(0, 25), slice(25, 40)):
        ...     _ = add_adjoint_product_(acc, a[rows], b[rows])
        >>> torch.allclose(adjoint_sum(acc), a.T @ b)
        True
    """
    return acc.addmm_(b.mH, a)


def adjoint_sum(acc: Tensor) -> Tensor:
    """The contiguous conjugate transpose of ``acc`` (an accumulator of
    :func:`add_adjoint_product_`), with any lazy conjugation resolved."""
    return acc.mH.resolve_conj().contiguous()
