"""rfgp: random-feature Gaussian processes for PyTorch and GPyTorch."""

from rfgp import kernels, ops
from rfgp.kernels.operator import helmholtz_components

__version__ = "0.1.0"

__all__ = ["kernels", "ops", "helmholtz_components", "__version__"]
