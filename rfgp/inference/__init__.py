"""Inference with random-feature kernels: the weight-space GP solver."""

from typing import Any

from rfgp.inference.feature_gp import RandomFeatureGP
from rfgp.inference.fit_state import StaleFitError
from rfgp.inference.paths import SamplePaths
from rfgp.inference.selection import ConvergenceWarning

__all__ = ["ConvergenceWarning", "RandomFeatureGP", "SamplePaths", "StaleFitError"]

# The Dirichlet classifier moved to rfgp.classification (and its likelihood to
# rfgp.likelihoods); the old names still resolve here, with a DeprecationWarning.
_MOVED = {
    "ALPHA_GRID": "rfgp.classification",
    "DirichletExactGP": "rfgp.classification",
    "DirichletGPClassifier": "rfgp.classification",
    "softmax_expectation": "rfgp.classification",
    "DirichletLikelihood": "rfgp.likelihoods",
    "dirichlet_transform": "rfgp.likelihoods",
    "validate_labels": "rfgp.likelihoods",
}


def __getattr__(name: str) -> Any:
    if name in _MOVED:
        import importlib
        import warnings

        warnings.warn(
            f"rfgp.inference.{name} is deprecated; import it from {_MOVED[name]}",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(_MOVED[name]), name)
    raise AttributeError(f"module 'rfgp.inference' has no attribute {name!r}")
