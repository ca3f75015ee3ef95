"""Inference with random-feature kernels: the weight-space GP solver."""

from rfgp.inference.feature_gp import RandomFeatureGP
from rfgp.inference.fit_state import StaleFitError
from rfgp.inference.paths import SamplePaths
from rfgp.inference.selection import ConvergenceWarning

__all__ = ["ConvergenceWarning", "RandomFeatureGP", "SamplePaths", "StaleFitError"]

