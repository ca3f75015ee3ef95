"""Inference with random-feature kernels: the weight-space GP solver and what works with it.

The public names are the ones below; the modules behind them (solvers, statistics, noise
layouts, the fit's state, factorisations) are internal and say so by their ``_`` prefix.
"""

from rfgp.inference._blocks import kd_blocks
from rfgp.inference._calibrated_fit import (
    ScaleCalibration,
    calibrate_scales,
    calibrate_source_scales,
    calibrated_fit,
    fit_calibrated,
    fit_calibrated_source,
    stream_fit,
)
from rfgp.inference._calibration import (
    ScaleEvidence,
    feature_model_evidence,
    maximize_scale_evidence,
)
from rfgp.inference._cross_validation import cross_validate, held_out_log_density
from rfgp.inference._evidence import (
    fourier_kernel_negative_log_evidence,
    negative_log_evidence,
)
from rfgp.inference._feature_gp import RandomFeatureGP
from rfgp.inference._fit_cost import (
    CHOICE_FEATURES,
    MAX_ITERATIVE_FEATURES,
    MAX_WEIGHT_FEATURES,
    cg_fit_cost,
    cg_fit_seconds,
    cg_num_features,
    classifier_fit_cost,
    exact_evidence_cost,
    feature_evidence_cost,
    final_fit_cost,
    final_path,
    iterative_fit_cost,
    largest_features_within,
    measure_machine_rate,
)
from rfgp.inference._fit_state import StaleFitError
from rfgp.inference._heteroscedastic_evidence import heteroscedastic_negative_log_evidence
from rfgp.inference._iterative_calibration import IterativeCalibration, calibrate_by_products
from rfgp.inference._laplace import evidence_hessian, lengthscale_draws
from rfgp.inference._paths import SamplePaths
from rfgp.inference._selection import ConvergenceWarning
from rfgp.inference._stochastic_evidence import stochastic_log_evidence
from rfgp.inference._vector_field import helmholtz_components

__all__ = [
    "CHOICE_FEATURES",
    "MAX_ITERATIVE_FEATURES",
    "MAX_WEIGHT_FEATURES",
    "ConvergenceWarning",
    "IterativeCalibration",
    "RandomFeatureGP",
    "SamplePaths",
    "ScaleCalibration",
    "ScaleEvidence",
    "StaleFitError",
    "calibrate_by_products",
    "calibrate_scales",
    "calibrate_source_scales",
    "calibrated_fit",
    "cg_fit_cost",
    "classifier_fit_cost",
    "cg_fit_seconds",
    "cg_num_features",
    "cross_validate",
    "evidence_hessian",
    "exact_evidence_cost",
    "feature_evidence_cost",
    "final_fit_cost",
    "feature_model_evidence",
    "final_path",
    "fit_calibrated",
    "fit_calibrated_source",
    "fourier_kernel_negative_log_evidence",
    "held_out_log_density",
    "heteroscedastic_negative_log_evidence",
    "helmholtz_components",
    "iterative_fit_cost",
    "kd_blocks",
    "largest_features_within",
    "lengthscale_draws",
    "maximize_scale_evidence",
    "measure_machine_rate",
    "negative_log_evidence",
    "stochastic_log_evidence",
    "stream_fit",
]
