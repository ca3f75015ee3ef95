"""rfgp: random-feature Gaussian processes for PyTorch and GPyTorch."""

from rfgp import allocation, datasets, inference, kernels, likelihoods, metrics, ops, variance
from rfgp.inference import DirichletGPClassifier, RandomFeatureGP
from rfgp.kernels.operator import helmholtz_components

__version__ = "0.1.0"

__all__ = [
    "RandomFeatureGP",
    "DirichletGPClassifier",
    "helmholtz_components",
    "allocation",
    "datasets",
    "inference",
    "kernels",
    "likelihoods",
    "metrics",
    "ops",
    "variance",
    "__version__",
]
