"""Inference with random-feature kernels: the weight-space GP solver and what works with it.

The public names are the ones below; the modules behind them (solvers, statistics, noise
layouts, the fit's state, factorisations, the evidence and its derivatives, the cost model of
the fit) are internal and say so by their ``_`` prefix.

Users call the solver and its errors, :func:`stochastic_log_evidence`,
:func:`helmholtz_components` and :func:`calibrated_fit`. The other names below are the
inference layer's answer to :mod:`rfgp.recipes` (the cost model, the calibration and fit the
recipes' last stage runs, the evidences their searches maximise): the recipes import them from
here, not from the modules behind them, and they are not documented for users.
"""

from rfgp.inference._blocks import kd_blocks
from rfgp.inference._calibrated_fit import (
    ScaleCalibration,
    calibrate_scales,
    calibrate_source_scales,
    calibrated_fit,
    fit_calibrated,
    fit_calibrated_source,
)
from rfgp.inference._cg_cost import final_path, row_capped_features
from rfgp.inference._cross_validation import cross_validate
from rfgp.inference._evidence_cost import exact_evidence_cost, feature_evidence_cost
from rfgp.inference._evidence_search import (
    WARM_UP_STEPS,
    EvidenceObjective,
    SearchResult,
    dirichlet_objective,
    maximize_evidence,
    search_evidence,
    search_two_paths,
    two_path_search,
)
from rfgp.inference._feature_gp import RandomFeatureGP
from rfgp.inference._fit_cost import (
    CHOICE_FEATURES,
    FEATURE_STEP,
    MAX_ITERATIVE_FEATURES,
    MAX_WEIGHT_FEATURES,
    classifier_fit_cost,
    final_fit_cost,
    largest_features_within,
)
from rfgp.inference._fit_state import StaleFitError
from rfgp.inference._laplace import evidence_hessian, lengthscale_draws
from rfgp.inference._machine_rate import measure_machine_rate
from rfgp.inference._paths import SamplePaths
from rfgp.inference._selection import ConvergenceWarning
from rfgp.inference._stochastic_evidence import stochastic_log_evidence
from rfgp.inference._vector_field import helmholtz_components

__all__ = [
    # For users (the API pages document these).
    "ConvergenceWarning",
    "RandomFeatureGP",
    "SamplePaths",
    "StaleFitError",
    "calibrated_fit",
    "helmholtz_components",
    "stochastic_log_evidence",
    # For rfgp.recipes (the inference layer's names the recipes import; not user-facing).
    "CHOICE_FEATURES",
    "FEATURE_STEP",
    "WARM_UP_STEPS",
    "EvidenceObjective",
    "SearchResult",
    "dirichlet_objective",
    "maximize_evidence",
    "search_evidence",
    "search_two_paths",
    "two_path_search",
    "MAX_ITERATIVE_FEATURES",
    "MAX_WEIGHT_FEATURES",
    "ScaleCalibration",
    "calibrate_scales",
    "calibrate_source_scales",
    "classifier_fit_cost",
    "cross_validate",
    "evidence_hessian",
    "exact_evidence_cost",
    "feature_evidence_cost",
    "final_fit_cost",
    "final_path",
    "fit_calibrated",
    "fit_calibrated_source",
    "kd_blocks",
    "largest_features_within",
    "lengthscale_draws",
    "measure_machine_rate",
    "row_capped_features",
]
