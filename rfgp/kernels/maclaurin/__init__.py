r"""Maclaurin random features, beside the closed-form sketch variances and the degree allocation
that choose their degrees.

* :mod:`~rfgp.kernels.maclaurin.kernel`: :class:`MaclaurinKernel`.
* :mod:`~rfgp.kernels.maclaurin.variance`: closed-form variances of every polynomial sketch
  (also importable as :mod:`rfgp.variance`).
* :mod:`~rfgp.kernels.maclaurin.allocation`: the optimiser over degree counts (Algorithms 2-3
  of Wacker et al.).
"""

from rfgp.kernels.maclaurin.kernel import ALLOCATIONS, TARGETS, MaclaurinKernel

__all__ = ["MaclaurinKernel", "TARGETS", "ALLOCATIONS"]
