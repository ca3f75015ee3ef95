"""Deprecated location of the Dirichlet GP classifier; import from :mod:`rfgp.classification`
(classifier, softmax approximations, alpha selection) and :mod:`rfgp.likelihoods` (the label
transform and :class:`~rfgp.likelihoods.DirichletLikelihood`) instead."""

import warnings

from rfgp.classification import (
    ALPHA_GRID,
    DirichletExactGP,
    DirichletGPClassifier,
    softmax_expectation,
)
from rfgp.likelihoods import DirichletLikelihood, dirichlet_transform, validate_labels

warnings.warn(
    "rfgp.inference.dirichlet is deprecated; import the classifier, softmax_expectation and "
    "ALPHA_GRID from rfgp.classification and the likelihood, dirichlet_transform and "
    "validate_labels from rfgp.likelihoods",
    DeprecationWarning,
    stacklevel=2,
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
