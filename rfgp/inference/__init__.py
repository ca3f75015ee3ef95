"""Inference with random-feature kernels: the weight-space GP solver and what works with it.

The public names are the ones below; the modules behind them (solvers, statistics, noise
layouts, the fit's state, factorisations, the evidence and its derivatives, the cost model of
the iterative solve) are internal and say so by their ``_`` prefix.
"""

from rfgp.inference._feature_gp import RandomFeatureGP
from rfgp.inference._fit_state import StaleFitError
from rfgp.inference._paths import SamplePaths
from rfgp.inference._selection import ConvergenceWarning
from rfgp.inference._stochastic_evidence import stochastic_log_evidence
from rfgp.inference._vector_field import helmholtz_components

__all__ = [
    "ConvergenceWarning",
    "RandomFeatureGP",
    "SamplePaths",
    "StaleFitError",
    "helmholtz_components",
    "stochastic_log_evidence",
]
