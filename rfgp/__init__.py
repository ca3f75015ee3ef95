"""rfgp: random-feature Gaussian processes for PyTorch and GPyTorch."""

from rfgp import (
    allocation,
    classification,
    datasets,
    inference,
    kernels,
    likelihoods,
    metrics,
    ops,
    variance,
)
from rfgp.classification import DirichletGPClassifier
from rfgp.inference import RandomFeatureGP
from rfgp.kernels.operator import helmholtz_components

__version__ = "0.1.0"

__all__ = [
    "RandomFeatureGP",
    "DirichletGPClassifier",
    "helmholtz_components",
    "allocation",
    "classification",
    "datasets",
    "inference",
    "kernels",
    "likelihoods",
    "metrics",
    "ops",
    "variance",
    "__version__",
]
