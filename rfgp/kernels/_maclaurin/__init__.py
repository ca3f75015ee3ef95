r"""Maclaurin random features, beside the closed-form sketch variances and the degree allocation
that choose their degrees.

* :mod:`~rfgp.kernels._maclaurin.kernel`: :class:`MaclaurinKernel`.
* :mod:`~rfgp.kernels._maclaurin.variance`: closed-form variances of every polynomial sketch
  (public as :mod:`rfgp.variance`).
* :mod:`~rfgp.kernels._maclaurin.allocation`: the optimiser over degree counts (Algorithms 2-3
  of Wacker et al.).
* :mod:`~rfgp.kernels._maclaurin.degree_statistics`: the subsample's per-degree U-statistics the
  optimiser runs on.

Internal: the public names are exported by :mod:`rfgp.kernels` and :mod:`rfgp.variance`.
"""

from rfgp.kernels._maclaurin.allocation import (
    AllocationResult,
    AllocationStatistics,
    allocation_objective,
    allocation_statistics,
    maclaurin_coefficients,
    optimize_allocation,
)
from rfgp.kernels._maclaurin.kernel import ALLOCATIONS, TARGETS, MaclaurinKernel

__all__ = [
    "MaclaurinKernel",
    "TARGETS",
    "ALLOCATIONS",
    "AllocationResult",
    "AllocationStatistics",
    "allocation_objective",
    "allocation_statistics",
    "maclaurin_coefficients",
    "optimize_allocation",
]
