r"""Error metrics for kernel approximations and GP predictions.

* :func:`relative_frobenius_error`: :math:`\|\hat K - K\|_F / \|K\|_F`.
* :func:`gaussian_kl`: KL divergence between factorised Gaussian posteriors (the corrected
  Eq. 93 of Wacker et al.).
* :func:`mnll`, :func:`nmse`, :func:`rmse`: predictive scores.
* :func:`kernel_distance`: the kernel distance (MMD) between two point sets, exact or sketched.
* :func:`accuracy`, :func:`mnll_classification`, :func:`reliability_diagram`,
  :func:`expected_calibration_error`: classification scores.

All functions take tensors (or NumPy arrays) and return 0-d tensors (differentiable where the
inputs are). Inputs must be non-empty and finite, and paired inputs must have the same shape;
anything else raises a ``ValueError`` or ``TypeError`` that names the argument, never a NaN.
Values of any magnitude are divided by a power of two near their largest entry before they are
squared (an exact division, no rounding), so targets of ``1e200`` or ``1e-200`` neither
overflow nor underflow: the scores scale exactly as the formulas say.
"""

from rfgp.metrics._classification import (
    accuracy,
    expected_calibration_error,
    mnll_classification,
    reliability_diagram,
)
from rfgp.metrics._kernel_distance import kernel_distance
from rfgp.metrics._regression import gaussian_kl, mnll, nmse, relative_frobenius_error, rmse

__all__ = [
    "relative_frobenius_error",
    "gaussian_kl",
    "mnll",
    "nmse",
    "rmse",
    "kernel_distance",
    "accuracy",
    "mnll_classification",
    "reliability_diagram",
    "expected_calibration_error",
]
