r"""The subsample statistics of Maclaurin degree allocation: per-degree U-statistics.

The allocation objective (:mod:`~rfgp.kernels._maclaurin.allocation`) needs, per degree
:math:`n`, the single-feature sketch variance :math:`V_n` and (structured sketches) the
within-block covariance :math:`C_n` summed over the subsample's pairs :math:`i \ne j`, and the
truncation bias of every truncation degree. :func:`allocation_statistics` computes them once, in
float64 row chunks; the optimiser then runs on these sums alone.

References:
    Wacker, Kanagawa, Filippone, *Improved Random Features for Dot Product Kernels*,
    JMLR 2024, Sections 5.3-5.4, Appendix C.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch import Tensor

__all__ = ["AllocationStatistics", "VarianceFn", "allocation_statistics"]

#: signature of :func:`rfgp.variance.sketch_variance` restricted to what
#: the optimiser needs: ``variance_fn(x, y, degree, num_features) -> (...)`` for row-wise
#: pairs ``x, y (..., d)``.
VarianceFn = Callable[[Tensor, Tensor, int, int], Tensor]


@dataclass
class AllocationStatistics:
    r"""U-statistics over a subsample that the allocation objective needs (all sums over
    ordered pairs ``i != j``; ``num_pairs = m (m - 1)``).

    Attributes:
        coefficients: ``(L+1,)`` Maclaurin coefficients ``a_n`` (on length-scaled inputs).
        variance_sums: ``(L+1,)`` :math:`\sum r_i^2 r_j^2 V_n(x_i, x_j)`, single-feature
            variance of the degree-``n`` sketch (entry 0 unused).
        covariance_sums: ``(L+1,)`` same for the within-block covariance (0 if unstructured).
        truncation_bias: ``(L+1,)`` :math:`\sum (k_{ij} - \sum_{n \le p} a_n r_i r_j c_{ij}^n)^2`
            for each truncation ``p`` (all degrees ``<= p`` with ``a_n > 0`` present).
        bias_linear, bias_gram, kernel_sq: the same bias for any set ``S`` of present degrees as
            the quadratic form ``kernel_sq - 2 sum_S a_n bias_linear[n] + sum_{S x S} a a'
            bias_gram`` (used for allocations that skip degrees, e.g. random ones).
        num_pairs: ``m (m - 1)``.
        block_dim: block size ``d`` of a TensorSRHT sketch, ``None`` otherwise.
        structure: ``"none"`` (``V/D``), ``"tensorsrht"`` (convex surrogate) or
            ``"tensorsketch"`` (exact real TensorSketch variance ``V/D + gcd(2, D) C/D^2``;
            not convex in ``D``, so the greedy is a heuristic there).

    Built by :func:`allocation_statistics` (see its example).

    References:
        Wacker, Kanagawa, Filippone, *Improved Random Features for Dot Product Kernels*,
        JMLR 2024, Section 5.3.
    """

    coefficients: Tensor
    variance_sums: Tensor
    covariance_sums: Tensor
    truncation_bias: Tensor
    bias_linear: Tensor
    bias_gram: Tensor
    kernel_sq: float
    num_pairs: int
    block_dim: Optional[int] = None
    structure: str = "none"

    @property
    def max_degree(self) -> int:
        """``L``, the largest degree with a coefficient."""
        return self.coefficients.numel() - 1


def allocation_statistics(
    z: Tensor,
    coefficients: Tensor,
    exact_kernel: Callable[[Tensor, Tensor], Tensor],
    variance_fn: VarianceFn,
    row_scale: Optional[Tensor] = None,
    block_dim: Optional[int] = None,
    chunk_size: Optional[int] = None,
    structure: Optional[str] = None,
) -> AllocationStatistics:
    r"""Per-degree U-statistics of a subsample ``z`` for the allocation objective.

    The single-feature variance ``V_n = variance_fn(x, y, n, 1)`` and, for structured
    sketches, the within-block covariance ``C_n = 2 variance_fn(x, y, n, 2) - V_n`` (two
    features share a block: ``V(2) = V/2 + C/2``) are summed over pairs. Everything runs in
    float64 in row chunks, ``O(L m^2 d)`` time and ``O(chunk m d)`` memory.

    Args:
        z: ``(m, d)`` subsample, already divided by the lengthscale.
        coefficients: ``(L+1,)`` Maclaurin coefficients ``a_0..a_L``.
        exact_kernel: ``(m1, d), (m2, d) -> (m1, m2)`` the kernel being approximated (row
            scale included).
        variance_fn: ``(x, y, degree, num_features) -> (...)`` variance of the degree-``n``
            sketch for row-wise pairs (e.g. a partial of
            :func:`rfgp.variance.sketch_variance`).
        row_scale: ``(m,)`` factor ``r(x)`` (Gaussian kernel), ``None`` for 1.
        block_dim: block size of a TensorSRHT sketch (the padded input dimension), ``None``
            for unstructured sketches.
        structure: ``"none"``, ``"tensorsrht"`` or ``"tensorsketch"``; default
            ``"tensorsrht"`` if ``block_dim`` is given, else ``"none"``. For TensorSketch the
            two sums are ``A`` and ``C`` of ``V(D) = A/D + gcd(2, D) C/D^2``, recovered from
            ``V(1)`` and ``V(3)``.
        chunk_size: rows per chunk (default: keeps each chunk near 2^21 pair-entries per degree).

    Returns:
        :class:`AllocationStatistics`.

    Raises:
        ValueError: for an unknown ``structure``, ``structure="tensorsrht"`` without
            ``block_dim``, ``z`` not of shape ``(m, d)`` with ``m >= 2``, or variances that
            overflow.

    Example:
        >>> from rfgp.kernels._maclaurin import allocation_objective, maclaurin_coefficients
        >>> from rfgp.variance import sketch_variance
        >>> z = torch.randn(10, 3, dtype=torch.float64,
        ...                 generator=torch.Generator().manual_seed(0)) / 3
        >>> a = maclaurin_coefficients("polynomial", 2, degree=2, bias=1.0)
        >>> stats = allocation_statistics(z, a, lambda x, y: (x @ y.T + 1) ** 2, sketch_variance)
        >>> stats.num_pairs, stats.max_degree, stats.structure
        (90, 2, 'none')
        >>> stats.truncation_bias[-1].item() < 1e-20   # all degrees present: no bias
        True
        >>> g4, g8 = allocation_objective(stats, [1, 4, 4]), allocation_objective(stats, [1, 8, 8])
        >>> round(g4 / g8, 6)   # no bias: the variance halves with twice the features
        2.0

    References:
        Wacker, Kanagawa, Filippone, *Improved Random Features for Dot Product Kernels*,
        JMLR 2024, Section 5.3 and Appendix C.
    """
    if structure is None:
        structure = "none" if block_dim is None else "tensorsrht"
    if structure not in ("none", "tensorsrht", "tensorsketch"):
        raise ValueError(
            f"structure must be one of ['none', 'tensorsketch', 'tensorsrht'], got {structure!r}"
        )
    if structure == "tensorsrht" and block_dim is None:
        raise ValueError("block_dim must be given for structure='tensorsrht', got None")
    if z.dim() != 2:
        raise ValueError(f"z must have shape (m, d), got {tuple(z.shape)}")
    m, d = z.shape
    if m < 2:
        raise ValueError(f"z must hold at least 2 rows (pairs i != j), got {m}")
    z = z.detach().to(torch.float64)
    a = coefficients.detach().to(torch.float64).cpu()
    top = a.numel() - 1
    r = (torch.ones(m, dtype=torch.float64, device=z.device) if row_scale is None
         else row_scale.detach().to(torch.float64))
    if chunk_size is None:
        chunk_size = max(1, (1 << 21) // (m * max(d, top + 1)))
    variance_sums = torch.zeros(top + 1, dtype=torch.float64)
    covariance_sums = torch.zeros(top + 1, dtype=torch.float64)
    truncation_bias = torch.zeros(top + 1, dtype=torch.float64)
    bias_linear = torch.zeros(top + 1, dtype=torch.float64)
    bias_gram = torch.zeros(top + 1, top + 1, dtype=torch.float64)
    kernel_sq = 0.0
    for start in range(0, m, chunk_size):
        rows = slice(start, min(m, start + chunk_size))
        zi = z[rows]
        b = zi.shape[0]
        off_diag = torch.ones(b, m, dtype=torch.bool, device=z.device)
        idx = torch.arange(b, device=z.device)
        off_diag[idx, idx + start] = False
        mask = off_diag.to(torch.float64)
        scale = r[rows, None] * r[None, :]
        k = exact_kernel(zi, z).to(torch.float64) * mask
        kernel_sq += float((k * k).sum())
        inner = zi @ z.T
        powers = torch.stack([inner.pow(n) for n in range(top + 1)]) * scale * mask  # (L+1, b, m)
        bias_linear += (powers * k).sum((-1, -2)).cpu()
        flat = powers.reshape(top + 1, -1)
        bias_gram += (flat @ flat.T).cpu()
        partial = torch.zeros_like(k)
        for p in range(top + 1):
            partial = partial + a[p].item() * powers[p]
            residual = k - partial  # k and every power are masked already
            truncation_bias[p] += float((residual * residual).sum())
        x_pairs, y_pairs = zi[:, None, :], z[None, :, :]
        weight = scale * scale * mask
        for n in range(1, top + 1):
            if a[n] == 0:
                continue
            v1 = variance_fn(x_pairs, y_pairs, n, 1).to(torch.float64)
            if structure == "tensorsketch":
                # V(1) = A + C and V(3) = A/3 + C/9.
                v3 = variance_fn(x_pairs, y_pairs, n, 3).to(torch.float64)
                joint = 1.5 * (v1 - 3.0 * v3)
                covariance_sums[n] += float(_finite_sum(joint * weight, f"degree {n}"))
                v1 = v1 - joint
            elif structure == "tensorsrht":
                v2 = variance_fn(x_pairs, y_pairs, n, 2).to(torch.float64)
                covariance_sums[n] += float(
                    _finite_sum((2.0 * v2 - v1) * weight, f"covariance of degree {n}")
                )
            variance_sums[n] += float(_finite_sum(v1 * weight, f"variance of degree {n}"))
    return AllocationStatistics(
        coefficients=a,
        variance_sums=variance_sums,
        covariance_sums=covariance_sums,
        truncation_bias=truncation_bias,
        bias_linear=bias_linear,
        bias_gram=bias_gram,
        kernel_sq=kernel_sq,
        num_pairs=m * (m - 1),
        block_dim=block_dim,
        structure=structure,
    )


def _finite_sum(values: Tensor, what: str) -> Tensor:
    if not torch.isfinite(values).all():
        bad = int((~torch.isfinite(values)).sum())
        raise ValueError(
            f"the {what} overflowed for {bad} pairs of the subsample; scale the inputs (a "
            "larger lengthscale) or lower max_degree"
        )
    return values.sum()
