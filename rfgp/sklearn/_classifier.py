"""The scikit-learn classifier: :class:`RandomFeatureGPClassifier`."""

from __future__ import annotations

import warnings
from typing import Any, Optional

import numpy as np
import torch
from linear_operator.utils.warnings import NumericalWarning
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, column_or_1d, validate_data

from rfgp.classification import DirichletGPClassifier, softmax_expectation
from rfgp.inference._feature_gp import ConvergenceWarning
from rfgp.recipes import (
    ClassifierFitReport,
    ClassifierOptions,
    fit_classifier_auto,
)
from rfgp.recipes._classification import plan_classifier
from rfgp.sklearn._support import (
    RECIPE_KERNELS,
    as_tensor,
    check_params,
    kernel_from,
    make_kernel,
    recipe_options,
    seed_from,
    store_params,
)

__all__ = ["RandomFeatureGPClassifier"]


class RandomFeatureGPClassifier(ClassifierMixin, BaseEstimator):
    r"""Dirichlet-based GP classification with random features, as a scikit-learn estimator.

    The labels become ``C`` regression problems on the Dirichlet-transformed targets
    (Milios et al., 2018) with a fixed noise per point and class, solved in closed form by
    :class:`rfgp.DirichletGPClassifier` with a random-feature kernel. The class probabilities
    are :math:`p_c(x) = \mathbb{E}[\mathrm{softmax}(f(x) / T)_c]` under the latent posterior
    :math:`f_c(x) \sim N(\mu_c(x), v_c(x))`, :math:`T` the fitted classifier's ``temperature``
    (the recipe chooses it by the held-out NLL; 1 otherwise); with ``proba_method="mc"`` a
    fixed set of ``mc_samples`` standard normal draws is shared by all rows, so the
    probabilities of a point do not depend on the other rows of ``X``.

    By default (``optimizer="auto"`` with a Fourier kernel: ``"rbf"`` or a Matérn) the fit is
    rfgp's classification recipe, :func:`rfgp.fit_classifier_auto`, with the same options
    (:class:`rfgp.recipes.ClassifierOptions`; ``random_state=s`` is its ``seed=s``): ARD
    lengthscales and the outputscale, shared by the ``C`` classes, maximise the summed
    evidence of the transformed labels, and the classifier is refitted on all rows with
    ``num_features`` features (default: the most the time budget allows for ``N`` rows and
    ``C`` classes), ``alpha_epsilon`` and the final ``D`` chosen together by the held-out
    NLL on a validation split (``select_alpha=True``, the default; ``False`` keeps
    ``alpha_epsilon``); ``lengthscale`` and ``sampling`` are then not used.
    ``optimizer="validation"`` is the same recipe with the choice always on (and, for the
    other kernels, ``alpha_epsilon`` chosen on a validation split). With ``optimizer=None``
    (and with the other kernels) the kernel built from the arguments is used as it is.

    Args:
        kernel: a name in :data:`KERNELS` or a :class:`~rfgp.kernels.RandomFeatureKernel`,
            deep-copied at ``fit``.
        num_features: ``D`` of a named kernel; ``None`` chooses it from the number of rows
            and classes (:func:`rfgp.recipes._classification.plan_classifier`).
        lengthscale: lengthscale of a named kernel (not used by the recipe).
        sampling: frequency sampling of the Fourier kernels (``"iid"``, ``"orthogonal"``,
            ``"structured"``; the recipe uses orthogonal frequencies).
        degree: degree ``p`` of ``"polynomial"``.
        bias: bias ``b`` of ``"polynomial"``.
        projection: sketch of the dot-product kernels.
        alpha_epsilon: Dirichlet concentration added to every class (the recipe's choice
            replaces it unless ``select_alpha=False``).
        select_alpha: in the recipe, choose ``alpha_epsilon`` and ``D`` by the held-out NLL
            (:func:`rfgp.fit_classifier_auto`).
        optimizer: ``"auto"`` (the recipe), ``"validation"`` (the recipe, or the kernel as
            given for the other kernels, then ``alpha_epsilon`` chosen from
            :data:`rfgp.classification.ALPHA_GRID` by the MNLL on a random 10% validation split,
            :meth:`rfgp.DirichletGPClassifier.select_alpha`, and a refit on all data) or
            ``None`` (keep the hyperparameters).
        max_iter: L-BFGS iterations of the recipe's evidence search.
        proba_method: ``"mc"``, ``"mean_field"`` or ``"lognormal"`` (see
            :func:`rfgp.classification.softmax_expectation`).
        mc_samples: Monte Carlo samples of ``"mc"``.
        random_state: seed (an int in ``[0, 2**64 - 1]``, ``RandomState`` or ``None``) of the
            features and draws.

    Attributes:
        classes_ (ndarray): the class labels (any type ``np.unique`` sorts).
        classifier_ (DirichletGPClassifier): the fitted model (labels ``0 .. C-1``).
        fit_report_ (ClassifierFitReport or None): what the recipe did (recipe fits only).
        n_iter_ (int): L-BFGS iterations of the recipe (0 without it).
        n_features_in_ (int): number of input columns seen in ``fit``.

    Example:
        >>> from sklearn.datasets import load_iris
        >>> from rfgp.sklearn import RandomFeatureGPClassifier
        >>> X, y = load_iris(return_X_y=True)
        >>> X = (X - X.mean(0)) / X.std(0)
        >>> clf = RandomFeatureGPClassifier(random_state=0).fit(X, y)
        >>> clf.predict_proba(X[:2]).shape, bool(clf.score(X, y) > 0.9)
        ((2, 3), True)

    References:
        Milios, Camoriano, Michiardi, Rosasco, Filippone, *Dirichlet-based Gaussian Processes
        for Large-scale Calibrated Classification*, NeurIPS 2018.
    """

    def __init__(
        self,
        kernel: Any = "rbf",
        num_features: Optional[int] = None,
        lengthscale: float = 1.0,
        sampling: str = "iid",
        degree: int = 2,
        bias: float = 1.0,
        projection: str = "rademacher",
        alpha_epsilon: float = 0.01,
        select_alpha: bool = True,
        optimizer: Optional[str] = "auto",
        max_iter: int = 200,
        proba_method: str = "mc",
        mc_samples: int = 1000,
        random_state: Any = None,
    ) -> None:
        store_params(self, locals())

    def fit(self, X: Any, y: Any) -> RandomFeatureGPClassifier:
        """Fit one latent GP per class to the Dirichlet-transformed labels.

        Args:
            X: ``(n_samples, n_features)`` inputs.
            y: ``(n_samples,)`` labels of any type (at least two classes).

        Returns:
            ``self``.
        """
        X, y = validate_data(self, X, y, dtype=np.float64)
        y = column_or_1d(y, warn=True)
        try:
            check_classification_targets(y)
        except TypeError as error:
            # Labels that cannot be sorted together (1 and "a") fail with this TypeError in
            # scikit-learn's own classifiers too; this one says why.
            names = sorted({type(v).__name__ for v in y.tolist()})
            raise TypeError(
                "y must hold labels of one kind, all strings or all numbers (as scikit-learn's "
                f"encoders require), got a mix of {names}"
            ) from error
        self.classes_, encoded = np.unique(y, return_inverse=True)
        if len(self.classes_) < 2:
            raise ValueError(
                f"{type(self).__name__} needs at least 2 classes in y, got "
                f"{len(self.classes_)} class"
            )
        params = check_params(self)
        alpha, num_features = params["alpha_epsilon"], params["num_features"]
        seed = seed_from(self.random_state)
        x_t, labels = as_tensor(X), torch.as_tensor(encoded, dtype=torch.long)
        num_classes = len(self.classes_)
        recipe = isinstance(self.kernel, str) and self.kernel in RECIPE_KERNELS
        options = recipe_options(
            ClassifierOptions, self, ("max_iter", "alpha_epsilon", "select_alpha"),
            spectral=self.kernel if recipe else "rbf",
            num_features=num_features if recipe else None, num_classes=num_classes,
            num_samples=int(self.mc_samples), seed=seed,
            **({"select_alpha": True} if self.optimizer == "validation" else {}))
        self.fit_report_ = None
        self.n_iter_ = 0
        if self.optimizer is not None and recipe:
            report = ClassifierFitReport()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ConvergenceWarning)
                warnings.simplefilter("ignore", NumericalWarning)
                model = fit_classifier_auto(x_t, labels, report=report, **vars(options))
            self.fit_report_ = report
            self.n_iter_ = sum(report.iterations.values())
        else:
            if isinstance(self.kernel, str):
                if num_features is None:
                    num_features = plan_classifier(X.shape[0], X.shape[1], num_classes,
                                                   options).num_features
                kernel = make_kernel(
                    self.kernel, num_features, self.lengthscale, self.sampling, self.degree,
                    self.bias, self.projection, seed,
                )
            else:
                kernel = kernel_from(self, seed, X.shape[0])
            model = DirichletGPClassifier(
                kernel, alpha_epsilon=alpha, num_classes=num_classes, seed=seed,
            )
            if self.optimizer == "validation":
                model.select_alpha(x_t, labels, seed=seed)
            else:
                model.fit(x_t, labels)
        self.classifier_ = model
        self._draw_seed = seed
        return self

    def _probabilities(self, X: Any, log: bool) -> np.ndarray:
        check_is_fitted(self)
        X = validate_data(self, X, reset=False, dtype=np.float64)
        mean, variance = self.classifier_.probability_moments(as_tensor(X))
        # Monte Carlo draws from a fixed seed are shared by all rows: a row's probabilities do
        # not depend on the other rows of X.
        generator = torch.Generator().manual_seed(self._draw_seed)
        proba = softmax_expectation(
            mean, variance, method=self.proba_method,
            num_samples=int(self.mc_samples), generator=generator, log=log,
        )
        return proba.numpy()

    def predict_proba(self, X: Any) -> np.ndarray:
        """Class probabilities ``(n_samples, n_classes)``, columns in the order of ``classes_``.

        Args:
            X: ``(n_samples, n_features)`` inputs.

        Returns:
            ``(n_samples, n_classes)`` array whose rows sum to 1.
        """
        return self._probabilities(X, log=False)

    def predict_log_proba(self, X: Any) -> np.ndarray:
        """Log class probabilities, averaged in log space (accurate where they underflow).

        Args:
            X: ``(n_samples, n_features)`` inputs.

        Returns:
            ``(n_samples, n_classes)`` array; ``logsumexp`` of every row is 0.
        """
        return self._probabilities(X, log=True)

    def predict(self, X: Any) -> np.ndarray:
        """The most probable class of every row.

        Args:
            X: ``(n_samples, n_features)`` inputs.

        Returns:
            ``(n_samples,)`` array of labels, with the type of ``classes_``.
        """
        proba = self.predict_proba(X)  # checks that the estimator is fitted
        return self.classes_[np.argmax(proba, axis=1)]
