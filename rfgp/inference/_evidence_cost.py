r"""The cost of one evaluation of an evidence and its gradient, in multiply-adds, for whoever
plans a search of hyperparameters: the random-feature evidence (:func:`feature_evidence_cost`)
and the exact kernel's, on every row or summed over blocks of neighbouring rows
(:func:`exact_evidence_cost`). The fit's own cost model is :mod:`~rfgp.inference._fit_cost`'s.

Internal: not part of the public API (see :mod:`rfgp.inference`).
"""

from __future__ import annotations

import math

from rfgp._validation import check_int
from rfgp.inference._blocks import kd_levels

__all__ = ["EXACT_DISTANCE_COST", "EXACT_ELEMENTWISE_COST", "exact_evidence_cost",
           "feature_evidence_cost"]

#: Multiply-adds per entry of an exact evidence's ``n x n`` matrices (elementwise passes), and
#: per entry and input (distances, gradient sums): fitted to evaluations with their gradients
#: on 400 to 1,000 rows of 4 to 32 inputs, where counting the Cholesky factor and the
#: distances alone fell short by 2 to 5 times.
EXACT_ELEMENTWISE_COST = 100.0
EXACT_DISTANCE_COST = 8.0


def feature_evidence_cost(num_rows: int, num_features: int, input_dim: int) -> float:
    r"""Multiply-adds of one evaluation of the random-feature evidence and its gradient:
    :math:`2 n D^2 + 2 n D d + D^3` (the Gram matrix and its derivative products, the
    projections, the factor)."""
    n, m = float(num_rows), float(num_features)
    return 2 * n * m * m + 2 * n * m * input_dim + m**3


def exact_evidence_cost(num_rows: int, input_dim: int, block_rows: int = 0) -> float:
    r"""Multiply-adds of one evaluation of the exact evidence and its gradient on ``num_rows``
    rows, :math:`n^3 + c_2 n^2 + c_d n^2 d`, or summed over the blocks that
    :func:`~rfgp.inference._blocks.kd_blocks` cuts for ``block_rows`` (``N / 2^k`` rows each).

    The cubic term is the Cholesky factor and the inverse the gradient needs
    (:math:`n^3 / 3 + 2 n^3 / 3`); :math:`c_d n^2 d` (:data:`EXACT_DISTANCE_COST`) the
    distances and the lengthscales' gradient sums; :math:`c_2 n^2`
    (:data:`EXACT_ELEMENTWISE_COST`) the elementwise passes over the ``n x n`` matrices,
    which run at memory speed, not at a product's.

    Args:
        num_rows: ``n`` (at least 1); input_dim: ``d`` (at least 0).
        block_rows: the most rows of a block (0: one block of every row).

    Returns:
        The multiply-adds as a float; ``math.inf`` where they exceed the float range.

    Raises:
        TypeError / ValueError: for a non-integer or out-of-range argument.

    Example:
        >>> exact_evidence_cost(3000, 4, 1000) == 4 * exact_evidence_cost(750, 4)
        True
        >>> exact_evidence_cost(10**200, 4)
        inf
    """
    num_rows = check_int("num_rows", num_rows)
    input_dim = check_int("input_dim", input_dim, minimum=0)
    block_rows = check_int("block_rows", block_rows, minimum=0)
    try:
        if block_rows and num_rows > block_rows:
            blocks = 2 ** kd_levels(num_rows, block_rows)
            # ceil(num_rows / blocks) in integers: a float quotient of huge counts overflows.
            return blocks * exact_evidence_cost(-(-num_rows // blocks), input_dim)
        n = float(num_rows)
        return n**3 + (EXACT_ELEMENTWISE_COST + EXACT_DISTANCE_COST * input_dim) * n * n
    except OverflowError:
        # A count of multiply-adds beyond the float range: more than any budget holds.
        return math.inf
