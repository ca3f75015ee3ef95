"""Dirichlet-based GP classification (Milios et al., 2018).

* :class:`DirichletGPClassifier` on exact and random-feature kernels.
* :func:`softmax_expectation`, the class probabilities
  :math:`\\mathbb{E}[\\mathrm{softmax}(f)]` (Monte Carlo, mean-field, log-normal; the methods
  in :data:`PROBA_METHODS`), and :func:`latent_moments`.
* :class:`DirichletExactGP`, the exact GP per class.
* :func:`encode_labels`: class labels as indices.
* :func:`select_alpha` over :data:`ALPHA_GRID`.

The label transform and the GPyTorch likelihood are in :mod:`rfgp.likelihoods`; the default
fitting recipe, :func:`rfgp.fit_classifier_auto`, in :mod:`rfgp.recipes`. The modules behind
these names are internal and say so by their ``_`` prefix.
"""

from rfgp._softmax import PROBA_METHODS, latent_moments, softmax_expectation  # noqa: I001
from rfgp.classification._exact import DirichletExactGP
from rfgp.classification._inputs import encode_labels
from rfgp.classification._selection import ALPHA_GRID, select_alpha
from rfgp.classification._classifier import DirichletGPClassifier

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
