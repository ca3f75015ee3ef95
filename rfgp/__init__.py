"""rfgp: random-feature Gaussian processes for PyTorch and GPyTorch."""

from rfgp import (
    classification,
    datasets,
    inference,
    kernels,
    likelihoods,
    metrics,
    ops,
    variance,
)
from rfgp.classification import DirichletGPClassifier, fit_classifier_auto
from rfgp.inference import RandomFeatureGP, StaleFitError, fit_auto
from rfgp.inference.vector_field import helmholtz_components

__version__ = "0.1.0"

__all__ = [
    "RandomFeatureGP",
    "StaleFitError",
    "fit_auto",
    "DirichletGPClassifier",
    "fit_classifier_auto",
    "helmholtz_components",
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

