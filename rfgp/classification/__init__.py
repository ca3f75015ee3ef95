"""Dirichlet-based GP classification (Milios et al., 2018).

* :mod:`~rfgp.softmax`: :func:`softmax_expectation`, the class probabilities
  :math:`\\mathbb{E}[\\mathrm{softmax}(f)]` (Monte Carlo, mean-field, log-normal).
* :mod:`~rfgp.classification.exact`: :class:`DirichletExactGP`, the exact GP per class.
* :mod:`~rfgp.classification.inputs`: :func:`encode_labels` and the input checks.
* :mod:`~rfgp.classification.classifier`: :class:`DirichletGPClassifier` on exact and
  random-feature kernels.
* :mod:`~rfgp.classification.selection`: :func:`select_alpha` over :data:`ALPHA_GRID`.

The label transform and the GPyTorch likelihood are in :mod:`rfgp.likelihoods`; the default
fitting recipe, :func:`rfgp.fit_classifier_auto`, in :mod:`rfgp.recipes`.
"""

from rfgp.softmax import PROBA_METHODS, latent_moments, softmax_expectation  # noqa: I001
from rfgp.classification.exact import DirichletExactGP
from rfgp.classification.inputs import encode_labels
from rfgp.classification.selection import ALPHA_GRID, select_alpha
from rfgp.classification.classifier import DirichletGPClassifier

__all__ = [
    "ALPHA_GRID",
    "DirichletExactGP",
    "DirichletGPClassifier",
    "PROBA_METHODS",
    "encode_labels",
    "latent_moments",
    "select_alpha",
    "softmax_expectation",
]
