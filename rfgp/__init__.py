"""rfgp: random-feature Gaussian processes for PyTorch and GPyTorch."""

from rfgp import allocation, kernels, metrics, ops, variance
from rfgp.inference import RandomFeatureGP

__version__ = "0.1.0"

__all__ = ["allocation", "kernels", "metrics", "ops", "variance", "RandomFeatureGP", "__version__"]
