r"""Degree allocation for optimised Maclaurin features (Algorithms 2 and 3 of Wacker et al.).

A dot-product kernel :math:`k(x, y) = \sum_{n \ge 0} a_n (x^\top y)^n` (optionally times a row
scale :math:`r(x) r(y)`, for the Gaussian kernel) is approximated by the truncated estimator

.. math::
    \hat k(x, y) = r(x) r(y) \Big[a_0 + \sum_{n=1}^{p} a_n \Phi_n(x)^\top \overline{\Phi_n(y)}\Big],

with independent degree-``n`` polynomial sketches :math:`\Phi_n` of :math:`D_n` features each.
The truncation degree :math:`p` and the counts :math:`D_n` minimise the integrated squared error
on a subsample :math:`x_1, \dots, x_m` (a U-statistic, diagonal pairs excluded):

.. math::
    g(p, D) = \frac{1}{m(m-1)} \sum_{i \ne j} \Big[ \sum_{n \le p} a_n^2 r_i^2 r_j^2\,
        V[\Phi_n(x_i)^\top \overline{\Phi_n(x_j)}]
        + \big(k(x_i, x_j) - \mathbb{E}\hat k(x_i, x_j)\big)^2
    \Big].

For a fixed ``p`` only the variance part depends on the counts and it is a sum of convex
decreasing functions of each :math:`D_n`, so the greedy *incremental algorithm* (Algorithm 2,
one feature at a time to the degree whose term decreases most) is exact; Algorithm 3 repeats
it for every ``p`` in ``[min_degree, max_degree]`` and keeps the best.

Structured sketches (TensorSRHT) have a variance that is not convex in :math:`D_n`; it is
replaced by the convex surrogate of the paper's Appendix C, built from the single-feature
variance ``V`` and the covariance ``C`` of two features in the same block of ``d`` features:

.. math::
    f(D) = \begin{cases} (V - C)/D + C & C \le 0 \text{ and } D \le d \\
                         (V + (d-1) C)/D & \text{otherwise,} \end{cases}

with the branch chosen from the covariance summed over the pairs. Unstructured sketches have
``C = 0`` and ``f(D) = V / D``.

This module holds the optimiser only; the sums over the subsample's pairs that it runs on are
:func:`~rfgp.kernels._maclaurin.degree_statistics.allocation_statistics`, whose per-pair
variances come from a function with the signature of :func:`rfgp.variance.sketch_variance`, so
that every sketch of the package (real or complex, any projection) can serve a degree. It lives
apart from :mod:`rfgp.kernels._maclaurin.variance` (the closed forms) because it is a different
idea: the optimisation over allocations.

References:
    Wacker, Kanagawa, Filippone, *Improved Random Features for Dot Product Kernels*,
    JMLR 2024, Sections 5.3-5.4, Algorithms 2-3, Appendix C.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence

import torch
from torch import Tensor

from rfgp.kernels._maclaurin.degree_statistics import (
    AllocationStatistics,
    allocation_statistics,
)

__all__ = [
    "AllocationStatistics",
    "AllocationResult",
    "surrogate_variance",
    "incremental_allocation",
    "optimize_allocation",
    "allocation_statistics",
    "allocation_objective",
    "maclaurin_coefficients",
]


def surrogate_variance(
    variance: float, covariance: float, num_features: int, block_dim: Optional[int] = None
) -> float:
    r"""Convex surrogate of a sketch's variance with ``num_features`` features (App. C).

    .. math::
        f(D) = \begin{cases} (V - C)/D + C & C \le 0 \text{ and } D \le d \\
                             (V + (d-1) C)/D & \text{otherwise.} \end{cases}

    Args:
        variance: the single-feature variance ``V`` (may be a sum over pairs of inputs).
        covariance: the covariance ``C`` of two features of one structured block (a sum over
            the same pairs); 0 for unstructured sketches.
        num_features: ``D >= 1``, the number of features of the sketch.
        block_dim: block size ``d`` of a structured (TensorSRHT) sketch; ``None`` for
            unstructured sketches, where the result is ``V / D``.

    Returns:
        The surrogate ``f(D)`` (a float): convex and non-increasing in ``D``.

    Raises:
        ValueError: if ``num_features < 1``.

    Example:
        >>> surrogate_variance(3.0, 0.0, 3)
        1.0
        >>> surrogate_variance(1.0, -1.0, 2, block_dim=2)   # degree 1, D = d: exact, zero
        0.0
    """
    if num_features < 1:
        raise ValueError(f"num_features must be >= 1, got {num_features}")
    if block_dim is None or covariance == 0.0:
        return variance / num_features
    if covariance <= 0.0 and num_features <= block_dim:
        return (variance - covariance) / num_features + covariance
    return (variance + (block_dim - 1) * covariance) / num_features


def incremental_allocation(
    costs: Sequence[Callable[[int], float]], budget: int
) -> List[int]:
    r"""Algorithm 2: minimise :math:`\sum_n f_n(D_n)` s.t. :math:`\sum_n D_n = B, D_n \ge 1`.

    Starts from one feature per term and gives the remaining ``budget - len(costs)`` features
    one at a time to the term whose cost decreases most (ties: the lowest index). Exact when
    every ``f_n`` is convex and non-increasing on the positive integers. ``O(len(costs) B)``.

    Args:
        costs: one callable ``f_n(D) -> float`` per term.
        budget: total number of features ``B >= len(costs)``.

    Returns:
        The counts ``[D_1, ..., D_p]``.

    Example:
        >>> incremental_allocation([lambda n: 4.0 / n, lambda n: 1.0 / n], 3)
        [2, 1]
    """
    if budget < len(costs):
        raise ValueError(
            f"budget must be at least the number of terms ({len(costs)}), got {budget}"
        )
    counts = [1] * len(costs)
    if not costs:
        return counts
    current = [f(1) for f in costs]
    following = [f(2) for f in costs]
    for _ in range(budget - len(costs)):
        gains = [current[i] - following[i] for i in range(len(costs))]
        best = max(range(len(costs)), key=lambda i: (gains[i], -i))
        counts[best] += 1
        current[best] = following[best]
        following[best] = costs[best](counts[best] + 1)
    return counts


@dataclass
class AllocationResult:
    """Outcome of :func:`optimize_allocation`.

    Attributes:
        degree_counts: ``(L+1,)`` int64 features per degree; entry 0 is 1 when the constant
            feature ``sqrt(a_0)`` is used (``a_0 > 0``), else 0. Sums to the budget.
        truncation_degree: ``p*``, the largest degree with features.
        objective: ``g(p*, D*)`` (mean squared error per pair of the subsample).
        objectives: ``{p: g(p, D(p))}`` for every feasible ``p`` tried.

    Example:
        >>> result = AllocationResult(torch.tensor([1, 6, 1]), 2, 0.25)
        >>> int(result.degree_counts.sum()), result.truncation_degree, result.objectives
        (8, 2, {})
    """

    degree_counts: Tensor
    truncation_degree: int
    objective: float
    objectives: Dict[int, float] = field(default_factory=dict)


def _degree_cost(stats: AllocationStatistics, n: int) -> Callable[[int], float]:
    a2 = float(stats.coefficients[n]) ** 2
    # Variances are non-negative; a tiny negative sum is rounding from cancellation
    # (e.g. d = 1 Rademacher sketches, whose variance is exactly 0).
    v = max(float(stats.variance_sums[n]), 0.0)
    c = float(stats.covariance_sums[n])
    block = stats.block_dim
    if stats.structure == "tensorsketch":
        def cost(num: int) -> float:
            return a2 * max(v / num + math.gcd(2, num) * c / num**2, 0.0)

        return cost

    def cost(num: int) -> float:
        return a2 * surrogate_variance(v, c, num, block)

    return cost


def _bias(stats: AllocationStatistics, present: Sequence[int]) -> float:
    present = sorted(set(present) | ({0} if float(stats.coefficients[0]) > 0 else set()))
    positive = [n for n in range(stats.max_degree + 1) if float(stats.coefficients[n]) > 0]
    top = max(present) if present else 0
    if present == [n for n in positive if n <= top]:
        return float(stats.truncation_bias[top])
    idx = torch.tensor(present, dtype=torch.long)
    a = stats.coefficients[idx]
    value = (
        stats.kernel_sq
        - 2.0 * float((a * stats.bias_linear[idx]).sum())
        + float(a @ stats.bias_gram[idx][:, idx] @ a)
    )
    return max(value, 0.0)


def allocation_objective(stats: AllocationStatistics, degree_counts: Sequence[int]) -> float:
    r"""The objective :math:`g` (Eq. 49-51, 55) of any allocation.

    Args:
        stats: from :func:`allocation_statistics`.
        degree_counts: features per degree ``0..L`` (entry 0 is ignored: the constant is exact).

    Returns:
        Mean over ordered pairs of variance plus squared bias (the surrogate variance for
        structured sketches).

    Raises:
        ValueError: if ``degree_counts`` has more entries than the degrees in ``stats``.

    Example:
        See :func:`allocation_statistics` (twice the features halve an unbiased objective)
        and :func:`optimize_allocation`.

    References:
        Wacker, Kanagawa, Filippone, *Improved Random Features for Dot Product Kernels*,
        JMLR 2024, Eq. 49-51 and 55.
    """
    counts = [int(c) for c in degree_counts]
    if len(counts) > stats.max_degree + 1:
        raise ValueError(
            f"degree_counts must have at most {stats.max_degree + 1} entries, got {len(counts)}"
        )
    present = [n for n in range(1, len(counts)) if counts[n] > 0]
    variance = sum(_degree_cost(stats, n)(counts[n]) for n in present)
    return (variance + _bias(stats, present)) / stats.num_pairs


def optimize_allocation(
    stats: AllocationStatistics,
    budget: int,
    min_degree: int = 1,
    max_degree: Optional[int] = None,
) -> AllocationResult:
    r"""Algorithm 3: the truncation degree and feature counts minimising :math:`g`.

    The constant term ``sqrt(a_0)`` is exact and **counts as one feature of the budget** when
    ``a_0 > 0`` (so ``budget - 1`` features are spread over degrees ``1..p``); degrees with
    ``a_n = 0`` get no features. A truncation ``p`` is feasible when every degree
    ``1 <= n <= p`` with ``a_n > 0`` can get one feature.

    Args:
        stats: from :func:`allocation_statistics`.
        budget: total number of feature columns ``D`` (constant included).
        min_degree, max_degree: range of truncation degrees tried (``max_degree`` defaults to
            the largest degree in ``stats``).

    Returns:
        :class:`AllocationResult`.

    Raises:
        ValueError: if no truncation degree in the range is feasible with this budget.

    Example:
        >>> from rfgp.variance import sketch_variance
        >>> z = torch.rand(12, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
        >>> a = maclaurin_coefficients("exponential", 4)   # exp(x^T y), degrees 0..4
        >>> stats = allocation_statistics(z, a, lambda x, y: torch.exp(x @ y.T), sketch_variance)
        >>> result = optimize_allocation(stats, budget=16)
        >>> int(result.degree_counts.sum()), int(result.degree_counts[0])   # constant: 1 feature
        (16, 1)
        >>> allocation_objective(stats, result.degree_counts) == result.objective
        True

    References:
        Wacker, Kanagawa, Filippone, *Improved Random Features for Dot Product Kernels*,
        JMLR 2024, Algorithm 3.
    """
    top = stats.max_degree if max_degree is None else min(max_degree, stats.max_degree)
    if min_degree < 1 or min_degree > top:
        raise ValueError(
            f"min_degree must be in [1, {top}] (max_degree), got {min_degree}"
        )
    has_constant = float(stats.coefficients[0]) > 0
    random_budget = budget - int(has_constant)
    best: Optional[AllocationResult] = None
    objectives: Dict[int, float] = {}
    for p in range(min_degree, top + 1):
        degrees = [n for n in range(1, p + 1) if float(stats.coefficients[n]) > 0]
        if not degrees or len(degrees) > random_budget:
            continue
        alloc = incremental_allocation([_degree_cost(stats, n) for n in degrees], random_budget)
        counts = [0] * (stats.max_degree + 1)
        counts[0] = int(has_constant)
        for n, c in zip(degrees, alloc):
            counts[n] = c
        g = allocation_objective(stats, counts)
        objectives[p] = g
        # Strict improvement only: ties keep the smaller (cheaper) truncation.
        if best is None or g < best.objective:
            best = AllocationResult(torch.tensor(counts, dtype=torch.long), max(degrees), g)
    if best is None:
        raise ValueError(
            f"budget ({budget} features, {int(has_constant)} of them the constant) is too small "
            f"for any truncation degree in [{min_degree}, {top}] with non-zero coefficients"
        )
    best.objectives = objectives
    return best


def maclaurin_coefficients(target: str, max_degree: int, degree: Optional[int] = None,
                           bias: float = 0.0) -> Tensor:
    r"""Maclaurin coefficients ``a_0..a_L`` of a dot-product kernel on length-scaled inputs.

    * ``"polynomial"``: :math:`(x^\top y + b)^p`, :math:`a_n = \binom{p}{n} b^{p-n}` (``L = p``);
    * ``"exponential"`` / ``"gaussian"``: :math:`e^{x^\top y}`, :math:`a_n = 1/n!` (``L`` =
      ``max_degree``).

    Args:
        target: ``"polynomial"``, ``"exponential"`` or ``"gaussian"``.
        max_degree: ``L`` of the exponential series (ignored for ``"polynomial"``).
        degree: ``p`` of ``"polynomial"`` (required there).
        bias: ``b`` of ``"polynomial"``.

    Returns:
        ``(L+1,)`` float64 tensor ``a_0..a_L``.

    Raises:
        ValueError: for an unknown ``target`` or ``"polynomial"`` without ``degree``.

    Example:
        >>> maclaurin_coefficients("polynomial", 10, degree=2, bias=1.0)
        tensor([1., 2., 1.], dtype=torch.float64)
    """
    if target == "polynomial":
        if degree is None:
            raise ValueError("degree must be given for target='polynomial', got None")
        return torch.tensor(
            [math.comb(degree, n) * (bias ** (degree - n) if degree > n else 1.0)
             for n in range(degree + 1)],
            dtype=torch.float64,
        )
    if target in ("exponential", "gaussian"):
        return torch.tensor([1.0 / math.factorial(n) for n in range(max_degree + 1)],
                            dtype=torch.float64)
    raise ValueError(
        f"target must be one of ['exponential', 'gaussian', 'polynomial'], got {target!r}"
    )
