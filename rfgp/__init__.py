"""rfgp: random-feature Gaussian processes for PyTorch and GPyTorch."""

from rfgp import kernels, metrics, ops
from rfgp.inference import RandomFeatureGP

__version__ = "0.1.0"

__all__ = ["kernels", "metrics", "ops", "RandomFeatureGP", "__version__"]
