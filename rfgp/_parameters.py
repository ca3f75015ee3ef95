r"""The declared constraints of every public entry point's arguments: one table.

:data:`PARAMETER_CONSTRAINTS` maps each entry point (:func:`rfgp.fit_auto`,
:func:`rfgp.fit_classifier_auto`, :class:`~rfgp.recipes.RegressionOptions`,
:class:`~rfgp.recipes.ClassifierOptions`, :func:`rfgp.recipes.calibrated_fit`, the
scikit-learn estimators and :func:`rfgp.sklearn.make_kernel`) to ``{argument: [constraint,
...]}``, in the manner of scikit-learn's ``_parameter_constraints``; each entry point checks
its arguments against its entry once, with :func:`~rfgp._validation.validate_parameters`
(which names the argument, what was expected and what was received), and the helpers behind
it trust them. An argument that two entry points share has one constraint: the estimators'
recipe parameters are the recipes' options (``max_iter`` is ``max_iterations``, ``kernel``
names a ``spectral``).

The data (``x``, ``y``, ``labels``, an estimator's ``X``) are not declared here: their content
is checked where the rows are first read (:func:`~rfgp._validation.check_evidence_rows`, the
data sources of :mod:`rfgp._data`, the classifier's label encoding).

Example:
    >>> from rfgp._validation import validate_parameters
    >>> validate_parameters(PARAMETER_CONSTRAINTS["calibrated_fit"], {"solve": "cg"})
    {'solve': 'cg'}
    >>> validate_parameters(PARAMETER_CONSTRAINTS["fit_auto"], {"cv_folds": 1})
    Traceback (most recent call last):
    ...
    ValueError: cv_folds must be 0 (no cross-validation) or an integer >= 2, got 1
"""

from __future__ import annotations

from typing import Any, Dict, List

import numpy as np
from gpytorch.kernels import AdditiveKernel, Kernel, ScaleKernel
from torch import Tensor

from rfgp._report import ClassifierFitReport, FitReport
from rfgp._softmax import PROBA_METHODS
from rfgp._validation import (
    BOOLEAN,
    MAX_COUNT,
    MAX_SEED,
    InstanceOf,
    Integral,
    Interval,
    Options,
    Real,
)
from rfgp.kernels import MATERN_NU, PROJECTIONS
from rfgp.kernels._fourier import SAMPLINGS

__all__ = ["DATA_ARGUMENTS", "ESTIMATOR_KERNELS", "PARAMETER_CONSTRAINTS", "SEED"]

Table = Dict[str, List[Any]]

#: The one rule of every seed: the integers a ``torch.Generator`` takes.
SEED = Interval(Integral, 0, MAX_SEED,
                text="an integer in [0, 2**64 - 1] (a torch.Generator's seeds)")
_POSITIVE = Interval(Real, 0, None, closed="neither")
_FEATURES = Interval(Integral, 2, MAX_COUNT, multiple_of=2,
                     text="an even integer in [2, 2**62] (a cosine and a sine per frequency)")
_ROWS = Interval(Integral, 2, None)

#: The options both recipes share (:class:`~rfgp.recipes.RecipeOptions`).
_RECIPE: Table = {
    "spectral": [Options(tuple(MATERN_NU))],
    "num_features": [_FEATURES, None],
    "search_features": [_FEATURES],
    "subsample": [_ROWS],
    "refine_rows": [_ROWS],
    "refine_iterations": [Interval(Integral, 0, None)],
    "max_iterations": [Interval(Integral, 1, None)],
    # A gradient tolerance on the loss per datum above 1 stops every search at its start
    # (and its square, L-BFGS's change tolerance, overflows beyond 1e154).
    "tolerance": [Interval(Real, 0, 1, closed="right")],
    "time_budget": [_POSITIVE, None],
    "machine_rate": [_POSITIVE],
    "progress": [BOOLEAN],
    "seed": [SEED],
}

_REGRESSION: Table = {
    **_RECIPE,
    "exact_rows": [Interval(Integral, 0, None)],
    "max_lengthscale": [_POSITIVE, None],
    "cv_folds": [Interval(Integral, 0, None, exclude=(1,),
                          text="0 (no cross-validation) or an integer >= 2")],
    "lengthscale_draws": [Interval(Integral, 0, MAX_COUNT)],
    "local_search": [BOOLEAN],
    "calibrate": [BOOLEAN],
    "anytime": [BOOLEAN],
    "solve": [Options(("auto", "weight", "cg"))],
    "distributed": [BOOLEAN],
    "prior_mean": [Options(("constant", "zero"))],
}

_CLASSIFIER: Table = {
    **_RECIPE,
    "num_classes": [_ROWS, None],
    "alpha_epsilon": [_POSITIVE],
    "select_alpha": [BOOLEAN],
    "two_paths": [BOOLEAN, None],
    "num_samples": [Interval(Integral, 1, MAX_COUNT)],
}

#: The kernel names of the scikit-learn estimators (:data:`rfgp.sklearn.KERNELS`).
ESTIMATOR_KERNELS = ("rbf", "matern12", "matern32", "matern52", "polynomial", "exponential",
                     "gaussian_maclaurin", "gaussian_sketch")

#: A named kernel's hyperparameters, checked whatever the path (scikit-learn validates every
#: parameter at ``fit``, used or not).
_KERNEL: Table = {
    "num_features": [Interval(Integral, 1, MAX_COUNT), None],
    "lengthscale": [_POSITIVE],
    "sampling": [Options(SAMPLINGS)],
    "degree": [Interval(Integral, 1, None)],
    "bias": [Interval(Real, 0, None)],
    "projection": [Options(PROJECTIONS)],
}

_ESTIMATOR: Table = {
    **_KERNEL,
    "kernel": [Options(ESTIMATOR_KERNELS), InstanceOf(Kernel, "an rfgp kernel")],
    "max_iter": _RECIPE["max_iterations"],
    "random_state": [None, InstanceOf(np.random.RandomState, "a numpy RandomState"), SEED],
}

#: entry point -> ``{argument: [constraint, ...]}``.
PARAMETER_CONSTRAINTS: Dict[str, Table] = {
    "RegressionOptions": _REGRESSION,
    "ClassifierOptions": _CLASSIFIER,
    "fit_auto": {"report": [InstanceOf(FitReport), None], **_REGRESSION},
    "fit_classifier_auto": {"report": [InstanceOf(ClassifierFitReport), None], **_CLASSIFIER},
    "calibrated_fit": {
        "kernel": [InstanceOf((ScaleKernel, AdditiveKernel),
                              "a ScaleKernel around a random-feature kernel, or a sum of such "
                              "(its outputscale is calibrated)")],
        "noise": [_POSITIVE],
        "solve": _REGRESSION["solve"],
        "noise_floor": [Interval(Real, 0, None)],
        "seed": [SEED],
        # (its finiteness and shape: check_prior_mean, with the targets' columns at the fit)
        "prior_mean": [InstanceOf((Real, Tensor), "a number or a 1-D tensor")],
    },
    "make_kernel": {**_KERNEL, "name": [Options(ESTIMATOR_KERNELS)],
                    "num_features": [Interval(Integral, 1, MAX_COUNT)], "seed": [SEED, None]},
    "RandomFeatureGPRegressor": {
        **_ESTIMATOR,
        "noise": [_POSITIVE],
        "optimizer": [Options(("auto", "lbfgs", "adam", None))],
        "normalize_y": [BOOLEAN],
        **{name: _REGRESSION[name] for name in (
            "time_budget", "max_lengthscale", "cv_folds", "lengthscale_draws", "local_search",
            "distributed")},
    },
    "RandomFeatureGPClassifier": {
        **_ESTIMATOR,
        "alpha_epsilon": _CLASSIFIER["alpha_epsilon"],
        "optimizer": [Options(("auto", "validation", None))],
        "proba_method": [Options(PROBA_METHODS)],
        "mc_samples": _CLASSIFIER["num_samples"],
        "select_alpha": _CLASSIFIER["select_alpha"],
    },
}

#: The data arguments of the entry points, checked where the rows are read, not here.
DATA_ARGUMENTS = frozenset({"x", "y", "labels"})
