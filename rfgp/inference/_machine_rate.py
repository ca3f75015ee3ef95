"""The rate at which the cost model's multiply-adds become seconds (:mod:`._fit_cost` counts
them): the reference machine's, and this machine's measured against it.

Internal: not part of the public API (see :mod:`rfgp.inference`).
"""

from __future__ import annotations

import math
import time

import torch

from rfgp._validation import check_dtype, check_int

__all__ = ["REFERENCE_PRODUCT_RATE", "REFERENCE_RATE", "measure_machine_rate", "product_rate"]

#: Multiply-adds per second of the reference machine (two CPU cores, double precision) at which
#: the cost model's counts match its seconds: the rate at which the recipes' default schedule
#: converts seconds of budget into work. A fixed number, so that a schedule depends on the
#: data's size and the budget alone and a fit is reproducible.
REFERENCE_RATE = 2.5e10
#: Multiply-adds per second of a 1,024-square ``float64`` matrix product on the reference machine
#: (:func:`product_rate`; 7.6e10 to 8.2e10 measured): a large product runs about three times
#: faster than the cost model's mixed work (:data:`REFERENCE_RATE`).
REFERENCE_PRODUCT_RATE = 8.0e10


def measure_machine_rate(size: int = 1024, repeats: int = 3,
                         dtype: torch.dtype = torch.float64) -> float:
    r"""This machine's rate in the cost model's unit: pass it as ``machine_rate`` to budget in
    this machine's seconds.

    The cost model's counts are fitted to the reference machine's seconds at
    :data:`REFERENCE_RATE`, a rate that mixes large products with memory-bound passes and
    per-step overhead; a large matrix product alone runs faster there,
    :data:`REFERENCE_PRODUCT_RATE`. This machine's rate is the reference rate scaled by how much
    faster its ``size x size`` product runs (:func:`product_rate`, the best of ``repeats``, in
    the floating ``dtype``, a ``torch.dtype`` or its name, e.g. ``"float32"``):

    .. math::
        r = r_{\text{ref}} \, \frac{p}{p_{\text{ref}}}.

    On the reference machine it is about :data:`REFERENCE_RATE` (its product rate instead
    would budget three times the work its seconds hold). Taken at the reference's size and
    dtype (1,024, ``float64``) the ratio compares like with like; elsewhere it is the
    product's own speed-up.

    Example:
        >>> measure_machine_rate(64, 1) > 0
        True
    """
    return REFERENCE_RATE * product_rate(size, repeats, dtype) / REFERENCE_PRODUCT_RATE


def product_rate(size: int = 1024, repeats: int = 3, dtype: torch.dtype = torch.float64) -> float:
    """This machine's multiply-adds per second in a ``size x size`` matrix product (the best
    of ``repeats``, after one product that warms the library up) in the floating ``dtype``.

    Example:
        >>> product_rate(64, 1) > 0
        True
    """
    size = check_int("size", size, minimum=2)
    repeats = check_int("repeats", repeats)
    # A floating dtype (the products the fits run); integer and unknown dtypes are refused.
    dtype = check_dtype("dtype", dtype)
    a = torch.randn(size, size, dtype=dtype)
    best = math.inf
    for _ in range(repeats + 1):  # the first product warms the library up
        started = time.perf_counter()
        a @ a
        best = min(best, time.perf_counter() - started)
    return size**3 / max(best, 1e-9)
