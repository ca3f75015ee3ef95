"""Inference on random-feature kernels: the weight-space GP solver and the Dirichlet classifier."""

from rfgp.inference.dirichlet import (
    ALPHA_GRID,
    DirichletExactGP,
    DirichletGPClassifier,
    DirichletLikelihood,
    dirichlet_transform,
    softmax_expectation,
    validate_labels,
)

__all__ = [
    "ALPHA_GRID",
    "DirichletExactGP",
    "DirichletGPClassifier",
    "DirichletLikelihood",
    "dirichlet_transform",
    "softmax_expectation",
    "validate_labels",
]
