"""rfgp: random-feature Gaussian processes for PyTorch and GPyTorch."""

from rfgp import allocation, kernels, metrics, ops, variance
from rfgp.inference import RandomFeatureGP
from rfgp.kernels.operator import helmholtz_components

__version__ = "0.1.0"

__all__ = [
    "allocation",
    "kernels",
    "metrics",
    "ops",
    "variance",
    "RandomFeatureGP",
    "helmholtz_components",
    "__version__",
]
