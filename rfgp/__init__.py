"""rfgp: random-feature Gaussian processes for PyTorch and GPyTorch."""

from rfgp import kernels, ops, variance

__version__ = "0.1.0"

__all__ = ["kernels", "ops", "variance", "__version__"]
