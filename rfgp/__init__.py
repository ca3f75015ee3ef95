"""rfgp: random-feature Gaussian processes for PyTorch and GPyTorch."""

from rfgp import inference, kernels, likelihoods, metrics, ops, variance
from rfgp.inference import DirichletGPClassifier, RandomFeatureGP

__version__ = "0.1.0"

__all__ = [
    "DirichletGPClassifier",
    "RandomFeatureGP",
    "inference",
    "kernels",
    "likelihoods",
    "metrics",
    "ops",
    "variance",
    "__version__",
]
