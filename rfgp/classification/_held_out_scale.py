r"""The outputscale factor of a Dirichlet classifier chosen by its held-out NLL.

At fixed features, ``D`` and ``alpha_epsilon``, the held-out negative log likelihood
:math:`\ell(t)` of the classifier whose outputscale is :math:`e^t` times the one its
features were built with (:meth:`~rfgp.classification._held_out.HeldOutStatistics.nll`, one
Cholesky factor per class and evaluation) is minimised over :math:`t = \log a` by golden
section. Why this criterion and not the evidence: the evidence of the transformed targets,
:math:`\sum_c \log N(\tilde y_c; 0, a K + S_c)`, is the density of Gaussian stand-ins for the
labels, not the predictive probability of labels the classifier is judged by; the held-out
NLL is that probability on rows the fit has not seen, and it is already the criterion that
chose ``D`` and ``alpha_epsilon`` (at the factor 1). The two disagree: on MAGIC the evidence
put the factor at 0.16, and the returned model was not the one the held-out choice scored.

The search: :math:`\ell` at :math:`t = 0` (given) and :math:`\pm` :data:`FIRST_STEP`; where
:math:`t = 0` is not the lowest, steps grow by the golden ratio downhill until :math:`\ell`
rises (a bracket), within :math:`|t| \le` :data:`LOG_FACTOR_RANGE` (where it still falls
at the range's end, the bracket is the last step up to that end); then golden-section steps
shrink the bracket :math:`a < b < c` (:math:`\ell(b) \le \ell(a), \ell(c)`) until both of its
sides are at most :data:`LOG_FACTOR_TOLERANCE`. Where :math:`\ell` is unimodal, its
minimiser lies in the final bracket, so :math:`\ell(b \pm \delta) \ge \ell(b)` for every
:math:`\delta \ge` :data:`LOG_FACTOR_TOLERANCE`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

from rfgp.classification._held_out import HeldOutStatistics, held_out_cost

__all__ = ["SCALE_EVALUATIONS", "ScaleChoice", "held_out_scale", "held_out_scale_cost"]

#: The first steps in ``log a`` either side of the factor 1.
FIRST_STEP = 0.5
#: The search stops when the bracket's sides are at most this in ``log a`` (10%): the
#: held-out NLL changes by second-order amounts within it.
LOG_FACTOR_TOLERANCE = 0.1
#: Factors from ``exp(-12)`` to ``exp(12)`` of the outputscale, the evidence calibration's
#: range (on letter, with ``alpha_epsilon = 1e-4``, the held-out NLL falls beyond 400).
LOG_FACTOR_RANGE = 12.0
#: Evaluations the cost model expects: the two first steps and the golden-section steps that
#: shrink a bracket of ``±FIRST_STEP`` to sides of ``LOG_FACTOR_TOLERANCE`` (the bracket
#: shrinks by about 0.7 per step).
SCALE_EVALUATIONS = 8
#: The most evaluations the search makes (a bracket found after the longest expansion).
MAX_SCALE_EVALUATIONS = 20

_GOLDEN = (1 + math.sqrt(5)) / 2
_INNER = 2 - _GOLDEN  # 0.382: the new point's place in the larger side


@dataclass(frozen=True)
class ScaleChoice:
    """The search's result: the ``factor`` on the outputscale, its held-out ``nll`` and every
    evaluation as ``{factor: nll}`` (the factor 1 included)."""

    factor: float
    nll: float
    evaluations: Dict[float, float]


def held_out_scale_cost(train_rows: int, validation_rows: int, num_features: int,
                        num_classes: int) -> float:
    r"""Multiply-adds of :func:`held_out_scale` as the cost model expects it:
    :data:`SCALE_EVALUATIONS` held-out NLLs on the Gram matrices the choice already holds, each
    a Cholesky factor and the validation variances per class (:math:`C (D^3/3 + N_v D^2)`, or
    ``N_t`` in place of ``D`` on fewer training rows than features).

    Example:
        >>> held_out_scale_cost(1000, 100, 64, 3) == 8 * 3 * (64**3 / 3 + 100 * 64**2)
        True
    """
    args = (train_rows, validation_rows, num_features, num_classes)
    return held_out_cost(*args, SCALE_EVALUATIONS) - held_out_cost(*args, 0)


def held_out_scale(statistics: HeldOutStatistics, alpha: float,
                   at_one: Optional[float] = None) -> ScaleChoice:
    r"""The outputscale factor :math:`a` that minimises the held-out NLL of ``statistics``'
    classifier at ``alpha`` (see the module docstring for the search and the criterion).

    Args:
        statistics: the held-out statistics of one feature map
            (:func:`~rfgp.classification._held_out.held_out_statistics`).
        alpha: the ``alpha_epsilon`` of the transform.
        at_one: the held-out NLL at the factor 1 where known (the choice's table holds it).

    Returns:
        :class:`ScaleChoice`; its ``factor`` is 1 where no other factor was lower.

    Example:
        >>> import torch
        >>> from gpytorch.kernels import ScaleKernel
        >>> from rfgp.classification._held_out import held_out_statistics
        >>> from rfgp.kernels import FourierFeatureKernel
        >>> k = ScaleKernel(FourierFeatureKernel(32, seed=0)).double()
        >>> x = torch.randn(80, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
        >>> labels = (x[:, 0] > 0).long()
        >>> s = held_out_statistics(k, x[:60], labels[:60], x[60:], labels[60:], 2)
        >>> choice = held_out_scale(s, 0.01)
        >>> choice.nll <= choice.evaluations[1.0]
        True
    """
    values: Dict[float, float] = {}

    def value(t: float) -> float:
        if t not in values:
            nll = float(statistics.nll(alpha, math.exp(t)))
            values[t] = nll if math.isfinite(nll) else math.inf
        return values[t]

    if at_one is not None:
        values[0.0] = float(at_one) if math.isfinite(at_one) else math.inf
    below, above = value(-FIRST_STEP), value(FIRST_STEP)
    if value(0.0) <= min(below, above):
        a, b, c = -FIRST_STEP, 0.0, FIRST_STEP
    else:
        a, b, c = _expand(value, -FIRST_STEP if below < above else FIRST_STEP)
    while max(b - a, c - b) > LOG_FACTOR_TOLERANCE and len(values) < MAX_SCALE_EVALUATIONS:
        a, b, c = _golden_step(value, a, b, c)
    return ScaleChoice(math.exp(b), values[b],
                       {math.exp(t): nll for t, nll in sorted(values.items())})


def _expand(value, step: float) -> Tuple[float, float, float]:
    """A bracket ``(a, b, c)``, ``a < c``, with ``value(b)`` at most its ends, found by steps
    growing by the golden ratio from 0 towards ``step``'s side. Where the values still fall
    at the range's end, that end is both ``b`` and its side's end: the golden-section steps
    then search between it and the last step for the lowest value within the range."""
    a, b = 0.0, step
    while True:
        c = max(-LOG_FACTOR_RANGE, min(LOG_FACTOR_RANGE, b + _GOLDEN * (b - a)))
        if value(c) >= value(b):
            return (a, b, c) if a < c else (c, b, a)
        if abs(c) == LOG_FACTOR_RANGE:
            return (c, c, b) if c < b else (b, c, c)
        a, b = b, c


def _golden_step(value, a: float, b: float, c: float) -> Tuple[float, float, float]:
    """One golden-section step: a point in the larger side of ``(a, b, c)`` and the smaller
    bracket that keeps the lowest value inside."""
    x = b + _INNER * (c - b) if c - b > b - a else b - _INNER * (b - a)
    if value(x) < value(b):
        return (b, x, c) if x > b else (a, x, b)
    return (a, b, x) if x > b else (x, b, c)
