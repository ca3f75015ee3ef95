"""rfgp: random-feature Gaussian processes for PyTorch and GPyTorch."""

from rfgp import (
    classification,
    datasets,
    inference,
    kernels,
    likelihoods,
    metrics,
    recipes,
    variance,
)
from rfgp.classification import DirichletGPClassifier
from rfgp.inference import RandomFeatureGP, StaleFitError, helmholtz_components
from rfgp.recipes import fit_auto, fit_classifier_auto

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
    "recipes",
    "variance",
    "__version__",
]

