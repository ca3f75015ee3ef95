"""rfgp: random-feature Gaussian processes for PyTorch and GPyTorch."""

from rfgp import inference, kernels, likelihoods, metrics, ops
from rfgp.inference.dirichlet import DirichletGPClassifier

__version__ = "0.1.0"

__all__ = [
    "DirichletGPClassifier",
    "inference",
    "kernels",
    "likelihoods",
    "metrics",
    "ops",
    "__version__",
]
