r"""Closed-form variances of the polynomial sketches, public as :mod:`rfgp.variance` (where the
formulas are documented).

Internal: the public names are exported by :mod:`rfgp.variance`.
"""

from __future__ import annotations

import math
from typing import Tuple

import torch
from torch import Tensor

from rfgp._ops import next_power_of_two
from rfgp._validation import check_bool, check_int

__all__ = [
    "pair_moments",
    "srht_pair_count",
    "unstructured_variance",
    "unstructured_pseudo_variance",
    "gaussian_sketch_variance",
    "rademacher_sketch_variance",
    "tensorsrht_variance",
    "tensorsrht_variance_terms",
    "tensorsketch_variance",
    "sketch_variance",
]

# (fourth moment E|z|^4, q = E[Re(z)^2]) of one weight entry.
_WEIGHT_MOMENTS = {
    ("gaussian", False): (3.0, 1.0),
    ("gaussian", True): (2.0, 0.5),
    ("rademacher", False): (1.0, 1.0),
    ("rademacher", True): (1.0, 0.5),
}


# ---------------------------------------------------------------------------------- helpers
def _pair(x: Tensor, y: Tensor) -> Tuple[Tensor, Tensor]:
    for name, t in (("x", x), ("y", y)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if not t.is_floating_point():
            raise TypeError(f"{name} must have a real floating dtype, got {t.dtype}")
        if t.dim() < 1:
            raise ValueError(f"{name} must have shape (..., d), got a scalar")
    if x.shape[-1] != y.shape[-1]:
        raise ValueError(
            f"x and y must have the same last dimension d, got {x.shape[-1]} and {y.shape[-1]}"
        )
    dtype = torch.promote_types(torch.promote_types(x.dtype, y.dtype), torch.float64)
    return x.to(dtype), y.to(dtype)


def pair_moments(x: Tensor, y: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    r"""``(s, N, S)``: :math:`x^\top y`, :math:`\|x\|^2\|y\|^2`, :math:`\sum_k x_k^2 y_k^2`.

    Row-wise for broadcast ``(..., d)`` inputs, computed in (at least) float64.

    Args:
        x, y: ``(..., d)`` inputs (broadcast), already scaled, bias coordinate appended.

    Returns:
        Three ``(...)`` float64 tensors ``(s, N, S)``.

    Raises:
        TypeError: if ``x`` or ``y`` is not a real floating tensor.
        ValueError: if they are scalars or their last dimensions differ.

    Example:
        >>> [float(t) for t in pair_moments(torch.tensor([1.0, 2.0]), torch.tensor([3.0, 1.0]))]
        [5.0, 50.0, 13.0]
    """
    x, y = _pair(x, y)
    s = (x * y).sum(-1)
    n = (x * x).sum(-1) * (y * y).sum(-1)
    sq = (x * x * y * y).sum(-1)
    return s, n, sq


def _power_difference(a: Tensor, b: Tensor, p: int) -> Tensor:
    # a^p - b^p = (a - b) sum_k a^k b^(p-1-k): no cancellation when a is close to b.
    total = torch.zeros_like(a * b)
    a_pow = torch.ones_like(total)
    for k in range(p):
        total = total + a_pow * b ** (p - 1 - k)
        a_pow = a_pow * a
    return (a - b) * total


def srht_pair_count(num_features: int, padded_dim: int) -> int:
    r""":math:`c(D, d) = \lfloor D/d \rfloor d (d-1) + r (r-1)`, :math:`r = D \bmod d`.

    The number of ordered pairs of distinct TensorSRHT features that share a block.

    Args:
        num_features: ``D >= 1``.
        padded_dim: block size ``d >= 1`` (the input dimension padded to a power of two).

    Returns:
        ``c(D, d)`` as an int.

    Example:
        >>> [srht_pair_count(D, 8) for D in (1, 2, 8, 9, 19)]
        [0, 2, 56, 56, 118]
    """
    check_int("num_features", num_features)
    check_int("padded_dim", padded_dim)
    full, rest = divmod(num_features, padded_dim)
    return full * padded_dim * (padded_dim - 1) + rest * (rest - 1)


# ---------------------------------------------------------------------------------- unstructured
def unstructured_variance(
    x: Tensor, y: Tensor, degree: int, num_features: int, fourth_moment: float, q: float
) -> Tensor:
    r"""Variance of an unstructured sketch with i.i.d. weight entries (Theorem 2).

    .. math::
        \mathbb{V} = \tfrac1D\big[(m_4 S + N - S + ((2q-1)^2 + 1)(s^2 - S))^p - s^{2p}\big]

    Args:
        x, y: ``(..., d)`` inputs (broadcast).
        degree: ``p >= 1``.
        num_features: ``D >= 1``.
        fourth_moment: :math:`m_4 = \mathbb{E}|z|^4` of a weight entry (>= 1).
        q: :math:`\mathbb{E}[\mathrm{Re}(z)^2]` in ``[0, 1]`` (1 for real weights).

    Returns:
        ``(...)`` float64 tensor.

    Example:
        >>> x = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64) / 30 ** 0.5
        >>> y = torch.tensor([4.0, 3.0, 2.0, 1.0], dtype=torch.float64) / 30 ** 0.5
        >>> round(float(unstructured_variance(x, y, 2, 1, 3.0, 1.0)), 6)   # real Gaussian
        3.37037
    """
    check_int("degree", degree)
    check_int("num_features", num_features)
    s, n, sq = pair_moments(x, y)
    base = fourth_moment * sq + n - sq + ((2 * q - 1) ** 2 + 1) * (s * s - sq)
    return _power_difference(base, s * s, degree) / num_features


def unstructured_pseudo_variance(
    x: Tensor, y: Tensor, degree: int, num_features: int, fourth_moment: float, q: float
) -> Tensor:
    r"""Pseudo-variance :math:`\mathbb{E}[(\hat k - s^p)^2]` of an unstructured sketch.

    .. math::
        \mathrm{PV} = \tfrac1D\big[(m_4 S + 2 (s^2 - S) + (2q-1)^2 (N - S))^p - s^{2p}\big]

    (for real weights, ``q = 1``, it equals the variance).

    Args:
        x, y, degree, num_features, fourth_moment, q: as in :func:`unstructured_variance`.

    Returns:
        ``(...)`` float64 tensor.

    Example:
        >>> x = torch.tensor([0.6, 0.8], dtype=torch.float64)
        >>> round(float(unstructured_pseudo_variance(x, x.flip(0), 1, 1, 1.0, 0.5)), 12)
        0.4608
    """
    check_int("degree", degree)
    check_int("num_features", num_features)
    s, n, sq = pair_moments(x, y)
    base = fourth_moment * sq + 2 * (s * s - sq) + (2 * q - 1) ** 2 * (n - sq)
    return _power_difference(base, s * s, degree) / num_features


def _ctr_combine(variance: Tensor, pseudo: Tensor) -> Tensor:
    return 0.5 * (variance + pseudo)


def _weight_sketch_variance(
    projection: str, x: Tensor, y: Tensor, degree: int, num_features: int, is_complex: bool,
    ctr: bool,
) -> Tensor:
    # The Gaussian and Rademacher sketches differ only in the moments of one weight entry.
    _check_ctr(is_complex, ctr)
    m4, q = _WEIGHT_MOMENTS[(projection, is_complex)]
    v = unstructured_variance(x, y, degree, num_features, m4, q)
    if ctr:
        return _ctr_combine(v, unstructured_pseudo_variance(x, y, degree, num_features, m4, q))
    return v


def gaussian_sketch_variance(
    x: Tensor, y: Tensor, degree: int, num_features: int, complex: bool = False,
    ctr: bool = False,
) -> Tensor:
    r"""Variance of the Gaussian sketch (Eq. 20 real, Eq. 21 complex; CtR: Eq. 6 of CtR paper).

    Real :math:`\tfrac1D[(N + 2s^2)^p - s^{2p}]`, complex :math:`\tfrac1D[(N + s^2)^p -
    s^{2p}]`, CtR :math:`\tfrac1{2D}[(N + s^2)^p + (2 s^2)^p - 2 s^{2p}]`.

    Args:
        x, y, degree, num_features, complex, ctr: as in :func:`sketch_variance`.

    Returns:
        ``(...)`` float64 tensor.

    Example:
        >>> x, y = torch.tensor([1.0, 0.0]), torch.tensor([1.0, 0.0])
        >>> float(gaussian_sketch_variance(x, y, 1, 1))
        2.0
        >>> float(gaussian_sketch_variance(x, y, 1, 1, complex=True))
        1.0
    """
    return _weight_sketch_variance("gaussian", x, y, degree, num_features, complex, ctr)


def rademacher_sketch_variance(
    x: Tensor, y: Tensor, degree: int, num_features: int, complex: bool = False,
    ctr: bool = False,
) -> Tensor:
    r"""Variance of the Rademacher sketch (Eq. 18 real, Eq. 19 complex; CtR).

    Real :math:`\tfrac1D[(N + 2a)^p - s^{2p}]`, complex :math:`\tfrac1D[(N + a)^p - s^{2p}]`,
    CtR :math:`\tfrac1{2D}[(N + a)^p + (s^2 + a)^p - 2 s^{2p}]`, with :math:`a = s^2 - S`.

    Args:
        x, y, degree, num_features, complex, ctr: as in :func:`sketch_variance`.

    Returns:
        ``(...)`` float64 tensor.

    Example:
        >>> x, y = torch.tensor([1.0, 0.0]), torch.tensor([1.0, 0.0])
        >>> float(rademacher_sketch_variance(x, y, 3, 4))   # d = 1 in effect: exact
        0.0
    """
    return _weight_sketch_variance("rademacher", x, y, degree, num_features, complex, ctr)


# ---------------------------------------------------------------------------------- TensorSRHT
def tensorsrht_variance_terms(
    x: Tensor, y: Tensor, degree: int, complex: bool = False, pseudo: bool = False,
    ctr: bool = False,
) -> Tuple[Tensor, Tensor]:
    r"""Single-feature variance and same-block covariance of TensorSRHT (App. C, Eq. 67).

    Returns ``(V, Cov)`` with :math:`\mathbb{V}[\hat k] = V / D + c(D, d') / D^2 \cdot Cov`:
    :math:`V = (N + ((2q-1)^2+1) a)^p - s^{2p}` (the Rademacher-type single-feature variance)
    and :math:`Cov = (s^2 - V^{(1)}/(d'-1))^p - s^{2p}`, with ``d'`` the power of two ``>= d``
    (``Cov = 0`` when ``d' = 1``). With ``pseudo=True`` both are the pseudo-variance analogues
    (:math:`V^{(1)} \to \mathrm{PV}^{(1)} = a + (2q-1)^2 (N - S)`); with ``ctr=True`` (needs
    ``complex=True``) both are the averages of the two, the terms of the CtR variance. The
    Maclaurin allocation builds its convex surrogates from these.

    Args:
        x, y: ``(..., d)`` inputs (broadcast), already scaled, bias coordinate appended.
        degree: ``p >= 1``.
        complex: complex weights (``q = 1/2``) instead of real ones (``q = 1``).
        pseudo: the pseudo-variance analogues instead of the variance terms.
        ctr: the Complex-to-Real terms (average of the two); needs ``complex=True``.

    Returns:
        ``(V, Cov)``, two ``(...)`` float64 tensors.

    Example:
        >>> x = torch.tensor([0.5 ** 0.5, 0.5 ** 0.5], dtype=torch.float64)
        >>> [round(float(t), 12) for t in tensorsrht_variance_terms(x, x, 2)]
        [3.0, -1.0]
    """
    check_int("degree", degree)
    _check_ctr(complex, ctr)
    if ctr:
        v_single, v_cov = tensorsrht_variance_terms(x, y, degree, True)
        p_single, p_cov = tensorsrht_variance_terms(x, y, degree, True, pseudo=True)
        return _ctr_combine(v_single, p_single), _ctr_combine(v_cov, p_cov)
    padded = next_power_of_two(x.shape[-1])
    s, n, sq = pair_moments(x, y)
    q = 0.5 if complex else 1.0
    a = s * s - sq
    if pseudo:
        single = _power_difference(sq + 2 * a + (2 * q - 1) ** 2 * (n - sq), s * s, degree)
        first = a + (2 * q - 1) ** 2 * (n - sq)
    else:
        single = _power_difference(n + ((2 * q - 1) ** 2 + 1) * a, s * s, degree)
        first = n - sq + (2 * q - 1) ** 2 * a
    if padded == 1:
        return single, torch.zeros_like(single)
    cov = _power_difference(s * s - first / (padded - 1), s * s, degree)
    return single, cov


def tensorsrht_variance(
    x: Tensor, y: Tensor, degree: int, num_features: int, complex: bool = False,
    ctr: bool = False,
) -> Tensor:
    r"""Variance of TensorSRHT (Theorem 5 real, Theorem 10 complex; CtR via Eq. 6).

    .. math::
        \mathbb{V} = \tfrac1D V^{(p)} - \tfrac{c(D, d')}{D^2}
            \big[s^{2p} - (s^2 - V^{(1)}/(d'-1))^p\big]

    with ``d'`` the zero-padded input dimension (next power of two of ``x.shape[-1]``; the
    bias coordinate, if any, must already be appended) and signs and permutations independent
    across degrees and blocks.

    Args:
        x, y, degree, num_features, complex, ctr: as in :func:`sketch_variance`.

    Returns:
        ``(...)`` float64 tensor.

    Example:
        >>> x = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64) / 30 ** 0.5
        >>> y = torch.tensor([4.0, 3.0, 2.0, 1.0], dtype=torch.float64) / 30 ** 0.5
        >>> round(float(tensorsrht_variance(x, y, 2, 6)), 6)
        0.348921
    """
    _check_ctr(complex, ctr)
    check_int("num_features", num_features)
    padded = next_power_of_two(x.shape[-1])
    pairs = srht_pair_count(num_features, padded) / num_features**2
    single, cov = tensorsrht_variance_terms(x, y, degree, complex, ctr=ctr)
    return single / num_features + pairs * cov


# ---------------------------------------------------------------------------------- TensorSketch
def tensorsketch_variance(
    x: Tensor, y: Tensor, degree: int, num_features: int, complex: bool = False,
    ctr: bool = False,
) -> Tensor:
    r"""Variance of TensorSketch (FFT-convolved count sketches with ``D`` buckets).

    Real signs:
    :math:`\tfrac1D(T_B + T_C - 2T_0) + \tfrac{\gcd(2, D)}{D^2}(T - T_B - T_C + T_0)` with
    :math:`T_0 = s^{2p}`, :math:`T_B = (N + a)^p`, :math:`T_C = (s^2 + a)^p`,
    :math:`T = (N + 2a)^p`. Complex signs: :math:`(T_B - T_0)/D` (pseudo-variance
    :math:`(T_C - T_0)/D`), the same as the complex Rademacher sketch.

    Args:
        x, y, degree, num_features, complex, ctr: as in :func:`sketch_variance`.

    Returns:
        ``(...)`` float64 tensor.

    Example:
        >>> x, y = torch.tensor([0.6, 0.8]), torch.tensor([0.8, 0.6])
        >>> v1 = tensorsketch_variance(x, y, 3, 1)   # one bucket: a real Rademacher sketch
        >>> bool(torch.isclose(v1, rademacher_sketch_variance(x, y, 3, 1)))
        True
    """
    _check_ctr(complex, ctr)
    check_int("degree", degree)
    check_int("num_features", num_features)
    s, n, sq = pair_moments(x, y)
    a = s * s - sq
    t0 = s * s
    diff_b = _power_difference(n + a, t0, degree)  # T_B - T_0
    diff_c = _power_difference(s * s + a, t0, degree)  # T_C - T_0
    if complex:
        v = diff_b / num_features
        if ctr:
            return _ctr_combine(v, diff_c / num_features)
        return v
    # T - T_B - T_C + T_0 = (T - T_B) - (T_C - T_0)
    joint = _power_difference(n + 2 * a, n + a, degree) - diff_c
    g = math.gcd(2, num_features)
    return (diff_b + diff_c) / num_features + g * joint / num_features**2


# ---------------------------------------------------------------------------------- dispatcher
def _check_ctr(is_complex, ctr) -> None:
    check_bool("complex", is_complex)
    check_bool("ctr", ctr)
    if ctr and not is_complex:
        raise ValueError(
            "ctr=True is the real part of a complex sketch and needs complex=True, got "
            "complex=False"
        )


_DISPATCH = {  # the projections of rfgp.kernels._sketches, in its order
    "gaussian": gaussian_sketch_variance,
    "rademacher": rademacher_sketch_variance,
    "tensorsketch": tensorsketch_variance,
    "tensorsrht": tensorsrht_variance,
}


def sketch_variance(
    x: Tensor,
    y: Tensor,
    degree: int,
    num_features: int,
    projection: str = "rademacher",
    complex: bool = False,
    ctr: bool = False,
) -> Tensor:
    r"""Exact :math:`\mathbb{V}[\hat k(x, y)]` of a polynomial sketch, row-wise.

    For the sketches of :func:`rfgp.kernels.sample_sketch` /
    :func:`~rfgp.kernels.apply_sketch` (estimator of :math:`(x^\top y)^p`).

    Args:
        x, y: ``(..., d)`` inputs, broadcast against each other; already scaled, with any bias
            coordinate appended (TensorSRHT pads ``d`` to a power of two internally).
        degree: ``p >= 1``.
        num_features: ``D >= 1``; for ``complex=True`` the number of complex features.
        projection: ``"gaussian"``, ``"rademacher"``, ``"tensorsketch"`` or ``"tensorsrht"``.
        complex: complex weights (variance of the complex estimator
            :math:`\mathbb{E}|\hat k - s^p|^2`).
        ctr: variance of the real part (Complex-to-Real features, ``2 D`` real columns);
            needs ``complex=True``.

    Returns:
        ``(...)`` float64 tensor (differentiable w.r.t. ``x`` and ``y``).

    Raises:
        TypeError: if ``x`` or ``y`` is not a real floating tensor, or ``complex`` or ``ctr``
            is not a bool.
        ValueError: for an unknown ``projection``, ``ctr=True`` without ``complex=True``, or
            ``degree`` / ``num_features`` not a positive integer.

    Example:
        >>> x = torch.rand(5, 3, dtype=torch.float64)
        >>> v = sketch_variance(x, x.flip(0), 3, 8, projection="tensorsrht", complex=True, ctr=True)
        >>> v.shape
        torch.Size([5])
    """
    if projection not in _DISPATCH:
        raise ValueError(f"projection must be one of {list(_DISPATCH)}, got {projection!r}")
    return _DISPATCH[projection](x, y, degree, num_features, complex=complex, ctr=ctr)
