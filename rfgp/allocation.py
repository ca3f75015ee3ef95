"""Deprecated module: the degree allocation of Maclaurin features moved to
:mod:`rfgp.kernels.maclaurin.allocation`, beside the kernel that uses it.
"""

from rfgp._deprecation import moved_names

_MOVED = [
    "surrogate_variance",
    "incremental_allocation",
    "AllocationStatistics",
    "AllocationResult",
    "allocation_objective",
    "optimize_allocation",
    "allocation_statistics",
    "maclaurin_coefficients",
    "VarianceFn",
]

__getattr__ = moved_names(
    __name__, {name: "rfgp.kernels.maclaurin.allocation" for name in _MOVED}
)
