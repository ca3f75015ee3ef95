r"""The cost model of a fit: the feature grid and the one rule that turns a budget into a
feature count, the limits of each solve path, and the multiply-adds of the weight-space
(``D x D`` or ``N x N``) calibrated final fit. The CG path's costs and the choice of path are
in :mod:`~rfgp.inference._cg_cost`.

Every count is the leading terms of the fit's matrix products and factorisations, in
multiply-adds; divide by a machine's multiply-add rate (:func:`measure_machine_rate`) for
seconds. The evidence search's evaluations are counted in
:mod:`~rfgp.inference._evidence_cost`. The feature count a
budget affords is always found by :func:`largest_features_within`: the largest power of two
whose cost fits, because a feature map's error shrinks only as :math:`D^{-1/2}` while its fit
grows at least linearly in :math:`D`.

Internal: not part of the public API (see :mod:`rfgp.inference`).
"""

from __future__ import annotations

import math
from typing import Callable

__all__ = [
    "CHOICE_FEATURES",
    "DENSE_SPEEDUP",
    "FEATURE_STEP",
    "MAX_FUNCTION_FEATURES",
    "MAX_ITERATIVE_FEATURES",
    "MAX_WEIGHT_FEATURES",
    "classifier_fit_cost",
    "feature_grid",
    "final_fit_cost",
    "largest_features_within",
]


#: How much faster than the reference rate (``REFERENCE_RATE``) the calibrated final fit's
#: dense work runs (its Gram or kernel matrix, eigendecomposition and Cholesky factor: large
#: products and blocked factorisations, where the rate's mixed work also holds memory-bound
#: passes and overhead):
#: on the reference machine, 13,500 rows of 26 inputs, the weight-space calibrated fit at
#: 4,096 / 6,144 / 8,192 features took 11.0 / 26.3 / 58.2 s where its counts at the reference
#: rate forecast 22.7 / 53.0 / 118.1 s (an eigendecomposition alone runs at 1.9 times the
#: rate for its 4 D^3, a large product at 3.2 times). The spectrum is now taken through the
#: tridiagonal form without eigenvectors (``_spectrum.py``): about 3.1 D^3 at a large
#: product's rate on a two-core machine from 2,048 to 8,192 features (a dense
#: eigendecomposition 5.0 to 6.5), counted as 2 D^3 here.
DENSE_SPEEDUP = 2.0
#: Most features of a weight-space (``D x D``) final fit.
MAX_WEIGHT_FEATURES = 8192
#: Most features of a function-space (``N x N``) final fit, on few rows.
MAX_FUNCTION_FEATURES = 32768
#: Most features of an iterative (``solve="cg"``) final fit.
MAX_ITERATIVE_FEATURES = 65536
#: Step of the feature grid from which feature counts are its multiples (:func:`feature_grid`).
FEATURE_STEP = 1024
#: Features of the weight-space calibration that chooses among candidate lengthscales and
#: starts the iterative calibration of a larger final model.
CHOICE_FEATURES = 2048


def feature_grid(smallest: int, largest: int, step: int = 0, cap: int = 0) -> list:
    r"""The feature counts a budget chooses among, ascending: :math:`2^k\,\text{smallest}`
    up to ``step``, then the multiples of ``step`` (``step = 0``: powers of two throughout),
    each at most ``largest``; and ``cap`` where it lies in ``[smallest, largest]`` (a width
    tied to the data, e.g. the rows, which the CG path allows as its largest).

    Every count is even where ``smallest``, ``step`` and ``cap`` are: the Fourier features
    take any even count (their orthogonal ``d x d`` blocks are truncated to it).

    Example:
        >>> feature_grid(512, 5000, 1024, cap=4500)
        [512, 1024, 2048, 3072, 4096, 4500]
        >>> feature_grid(256, 4096)
        [256, 512, 1024, 2048, 4096]
    """
    sizes, size = [], smallest
    while size <= largest:
        sizes.append(size)
        size = (size // step + 1) * step if step and size >= step else 2 * size
    if smallest <= cap <= largest and cap not in sizes:
        sizes = sorted(sizes + [cap])
    return sizes


def largest_features_within(cost: Callable[[int], float], budget: float, smallest: int,
                            largest: int, step: int = 0, cap: int = 0) -> int:
    r"""The largest :math:`D` of :func:`feature_grid` ``(smallest, largest, step, cap)`` with
    :math:`\text{cost}(D) \le \text{budget}`; ``smallest`` where none fits.

    Every size is tried (not only until the first that does not fit): a cost need not grow
    with :math:`D` where the path changes (the ``D x D`` solve gives way to CG). An infinite
    cost (no solve path at that :math:`D`) never fits, not even an unbounded budget. The
    sizes that fit only gain members as the budget grows, so the answer never falls with it.

    Args:
        cost: multiply-adds (or seconds) of a fit with ``D`` features.
        budget: what the fit may cost, in ``cost``'s unit.
        smallest, largest: the range of ``D`` (``smallest`` positive).
        step, cap: the grid's step and its extra width (:func:`feature_grid`).

    Example:
        >>> largest_features_within(lambda m: m**2, 1e6, 256, 65536)
        512
        >>> largest_features_within(lambda m: m**2, 1e7, 256, 65536, step=1024)
        3072
        >>> largest_features_within(lambda m: m**2, 1.0, 256, 65536)
        256
    """
    best = smallest
    for size in feature_grid(smallest, largest, step, cap):
        value = cost(size)
        if value <= budget and math.isfinite(value):
            best = size
    return best




# ====================================================================== the calibrated final fit
def final_fit_cost(num_rows: int, num_features: int, input_dim: int,
                   candidates: int = 1) -> float:
    r"""Multiply-adds of the calibrated final fit on the ``D x D`` (or ``N x N``) path. In
    weight space, one calibration costs the features (:math:`N D d`), the Gram matrix
    (:math:`\frac58 N D^2` as a blocked product of its upper triangle) and its
    spectrum with the targets' weights on it (about :math:`2 D^3`), these dense counts at
    :data:`DENSE_SPEEDUP` times the reference rate (divided by it here); there is one per
    candidate lengthscale at
    :math:`\min(D, D_c)` features (:data:`CHOICE_FEATURES`), one more at :math:`D` where
    several candidates were compared at fewer, and the Cholesky factor (the fit reuses the
    chosen Gram matrix). In function space (``N < D``), the features, the kernel matrix
    :math:`N^2 D` and its eigendecomposition per candidate (at :math:`\min(D, D_c)` features,
    and once more at :math:`D` where several were compared at fewer), and the fit's features,
    kernel matrix and factor.

    Example:
        >>> n, m, d = 10**4, 2048, 8
        >>> final_fit_cost(n, m, d) == n * m * d + (0.625 * n * m**2 + 2 * m**3 + m**3 / 3) / 2
        True
        >>> final_fit_cost(n, m, d, 2) > final_fit_cost(n, m, d)
        True
    """
    n, m, k = float(num_rows), float(num_features), max(1, candidates)
    s = 1.0 / DENSE_SPEEDUP
    if n < m:
        def kernel_calibration(width: float) -> float:
            return n * width * input_dim + s * (n * n * width + 2 * n**3)

        fit = n * m * input_dim + s * (n * n * m + n**3 / 3)
        if k > 1 and m > CHOICE_FEATURES:
            return k * kernel_calibration(CHOICE_FEATURES) + kernel_calibration(m) + fit
        return k * kernel_calibration(m) + fit

    def calibration(width: float) -> float:
        return n * width * input_dim + s * (0.625 * n * width * width + 2 * width**3)

    if k > 1 and m > CHOICE_FEATURES:
        return k * calibration(CHOICE_FEATURES) + calibration(m) + s * m**3 / 3
    return k * calibration(m) + s * m**3 / 3


def classifier_fit_cost(num_rows: int, num_features: int, num_classes: int,
                        calibrated: bool = True) -> float:
    r"""Multiply-adds of the Dirichlet classifier's ``C``-class final fit with its outputscale
    calibration by the evidence (``rfgp/classification/_calibration.py``), or without it
    (``calibrated=False``, where the outputscale was chosen before). The calibration costs the
    Gram matrices, :math:`2 N D^2` (the shared one and each class's correction on its own
    rows), and one spectrum per class, :math:`2 C D^3`, or on fewer rows than
    features the kernel matrix :math:`N^2 D` and :math:`2 C N^3`; the fit the cheaper of the
    weight space, :math:`2 N D^2 + C D^3 / 3` (the Gram matrices again, one Cholesky factor
    per class), and the function space, :math:`N^2 D + C N^3 / 3`.

    Example:
        >>> n, d, c = 1000, 64, 3
        >>> weight = 2 * n * d**2 + 2 * c * d**3 + 2 * n * d**2 + c * d**3 / 3
        >>> classifier_fit_cost(n, d, c) == weight
        True
        >>> classifier_fit_cost(n, d, c, calibrated=False) == 2 * n * d**2 + c * d**3 / 3
        True
    """
    n, m, c = float(num_rows), float(num_features), num_classes
    if not calibrated:
        calibration = 0.0
    elif n < m:
        calibration = n * n * m + 2 * c * n**3
    else:
        calibration = 2 * n * m * m + 2 * c * m**3
    return calibration + min(2 * n * m * m + c * m**3 / 3, n * n * m + c * n**3 / 3)
