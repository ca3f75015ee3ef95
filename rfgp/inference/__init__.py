"""Inference with random-feature kernels: the weight-space GP solver and Dirichlet classifier."""

from rfgp.inference.dirichlet import (
    ALPHA_GRID,
    DirichletExactGP,
    DirichletGPClassifier,
    DirichletLikelihood,
    dirichlet_transform,
    softmax_expectation,
    validate_labels,
)
from rfgp.inference.feature_gp import RandomFeatureGP
from rfgp.inference.recipe import fit_auto

__all__ = [
    "ALPHA_GRID",
    "DirichletExactGP",
    "DirichletGPClassifier",
    "DirichletLikelihood",
    "RandomFeatureGP",
    "dirichlet_transform",
    "fit_auto",
    "softmax_expectation",
    "validate_labels",
]
