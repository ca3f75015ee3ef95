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
sides are at most :data:`LOG_FACTOR_TOLERANCE`.

The search stops at the held-out NLL's own resolution. :math:`\ell` is a mean over
:math:`N_v` validation rows, and two factors' means share their rows, so the error of a
difference :math:`\ell(t) - \ell(u)` is the paired standard error
:math:`\mathrm{se}(t, u) = \mathrm{sd}_n\big(\ell_n(t) - \ell_n(u)\big) / \sqrt{N_v}`
(:func:`paired_standard_error`, from the per-row NLLs
:meth:`~rfgp.classification._held_out.HeldOutStatistics.row_nll`); a difference below it is
not evidence that one factor predicts better than the other. So the bracket stops growing
at a step that lowers :math:`\ell` by less than its :math:`\mathrm{se}`, and stops shrinking
at a step that does, or once both ends of the bracket are within their :math:`\mathrm{se}`
of its middle (for a parabola through a golden-section bracket no further step can gain
more than the larger of those two rises). Of the evaluated factors whose :math:`\ell` is
within one :math:`\mathrm{se}` of the lowest (and not above :math:`\ell(0)`), the one
closest to 1 in :math:`|\log a|` is chosen: among factors the held-out rows cannot tell
apart, the one nearest the outputscale the features were fitted with is the least
extrapolated. On letter (1,600 held-out rows) the NLL still fell beyond :math:`a = e^{4.74}`,
by :math:`4.6 \cdot 10^{-4}` in all up to :math:`e^{12}`, while the step to :math:`e^{8.16}`
had a paired error of :math:`5.8 \cdot 10^{-4}`; the search now stops there. Where the
paired error is zero (or not finite, an infinite row NLL) the rule is the plain golden
section: where :math:`\ell` is unimodal, its minimiser then lies in the final bracket, so
:math:`\ell(b \pm \delta) \ge \ell(b)` for every :math:`\delta \ge`
:data:`LOG_FACTOR_TOLERANCE`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import torch
from torch import Tensor

from rfgp.classification._held_out import HeldOutStatistics, held_out_cost

__all__ = ["SCALE_EVALUATIONS", "ScaleChoice", "held_out_scale", "held_out_scale_cost",
           "paired_standard_error"]

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
#: shrinks by about 0.7 per step); the paired standard error often stops it sooner.
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
    r"""Multiply-adds of :func:`held_out_scale` and the temperature's choice after it as the
    cost model expects them: :data:`SCALE_EVALUATIONS` held-out NLLs on the Gram matrices the
    choice already holds and one more for the latent moments the temperature is chosen on,
    each a Cholesky factor and the validation variances per class
    (:math:`C (D^3/3 + N_v D^2)`, or ``N_t`` in place of ``D`` on fewer training rows than
    features).

    Example:
        >>> held_out_scale_cost(1000, 100, 64, 3) == 9 * 3 * (64**3 / 3 + 100 * 64**2)
        True
    """
    args = (train_rows, validation_rows, num_features, num_classes)
    return held_out_cost(*args, SCALE_EVALUATIONS + 1) - held_out_cost(*args, 0)


def paired_standard_error(rows: Tensor, other: Tensor) -> float:
    r"""The standard error of the difference of two held-out NLLs over the same rows,

    .. math::
        \mathrm{se} = \sqrt{\tfrac{1}{N_v - 1} \textstyle\sum_n (d_n - \bar d)^2}
            \big/ \sqrt{N_v}, \qquad d_n = \ell_n - \ell'_n,

    the sample standard deviation of the per-row differences over :math:`\sqrt{N_v}`: the
    rows are shared, so their common difficulty cancels in :math:`d_n`.

    Args:
        rows, other: ``(N_v,)`` per-row NLLs of two factors
            (:meth:`~rfgp.classification._held_out.HeldOutStatistics.row_nll`).

    Returns:
        The standard error as a float; 0 where a difference is not finite (an infinite row
        NLL: no error can be told, and the comparison falls back to the values) or there are
        fewer than two rows.

    Example:
        >>> paired_standard_error(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([0.0, 0.0, 0.0]))
        0.5773502691896258
    """
    differences = (rows - other).to(torch.float64)
    if differences.numel() < 2 or not bool(torch.isfinite(differences).all()):
        return 0.0
    return float(differences.std() / math.sqrt(differences.numel()))


def held_out_scale(statistics: HeldOutStatistics, alpha: float,
                   at_one: Optional[Tensor] = None, resolution: bool = True) -> ScaleChoice:
    r"""The outputscale factor :math:`a` chosen by the held-out NLL of ``statistics``'
    classifier at ``alpha``: the one closest to 1 among those whose NLL is within one paired
    standard error of the lowest the search found (see the module docstring for the search,
    its stopping rule and the criterion).

    Args:
        statistics: the held-out statistics of one feature map
            (:func:`~rfgp.classification._held_out.held_out_statistics`); any object with its
            ``row_nll(alpha, factor)``.
        alpha: the ``alpha_epsilon`` of the transform.
        at_one: the per-row held-out NLLs at the factor 1 where known (the choice's table
            holds them), ``(N_v,)``.
        resolution: whether the search stops at the held-out NLL's resolution and prefers
            the factor nearest 1 within it; ``False``: the plain golden section to
            :data:`LOG_FACTOR_TOLERANCE`, the lowest value found (the temperature, whose
            value 1 the Dirichlet transform gives no preference, see
            :mod:`~rfgp.classification._held_out_temperature`).

    Returns:
        :class:`ScaleChoice`; its ``factor`` is 1 where no other factor was lower by more
        than its paired standard error.

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
    rows: Dict[float, Tensor] = {}
    values: Dict[float, float] = {}

    def value(t: float) -> float:
        if t not in values:
            if t not in rows:
                rows[t] = statistics.row_nll(alpha, math.exp(t))
            nll = float(rows[t].mean())
            values[t] = nll if math.isfinite(nll) else math.inf
        return values[t]

    def error(t: float, u: float) -> float:
        return paired_standard_error(rows[t], rows[u]) if resolution else 0.0

    if at_one is not None:
        rows[0.0] = at_one
    below, above = value(-FIRST_STEP), value(FIRST_STEP)
    if value(0.0) <= min(below, above):
        bracket = (-FIRST_STEP, 0.0, FIRST_STEP)
    else:
        bracket = _expand(value, error, -FIRST_STEP if below < above else FIRST_STEP)
    if bracket is not None:
        a, b, c = bracket
        while (max(b - a, c - b) > LOG_FACTOR_TOLERANCE and len(values) < MAX_SCALE_EVALUATIONS
               and not _flat(value, error, a, b, c)):
            previous = b
            a, b, c = _golden_step(value, a, b, c)
            if b != previous and value(previous) - value(b) < error(previous, b):
                break  # a gain below its own error: the rows cannot resolve a better factor
    best = min(values, key=values.__getitem__)
    tied = [t for t in values if t == best or (
        values[t] <= values[0.0] and values[t] - values[best] <= error(t, best))]
    chosen = min(tied, key=lambda t: (abs(t), values[t]))
    return ScaleChoice(math.exp(chosen), values[chosen],
                       {math.exp(t): nll for t, nll in sorted(values.items())})


def _expand(value, error, step: float) -> Optional[Tuple[float, float, float]]:
    """A bracket ``(a, b, c)``, ``a < c``, with ``value(b)`` at most its ends, found by steps
    growing by the golden ratio from 0 towards ``step``'s side (where ``value(step)`` is
    below ``value(0)``); None once a step lowers the value by less than ``error`` of its two
    ends. Where the values still fall at the range's end, that end is both ``b`` and its
    side's end: the golden-section steps then search between it and the last step for the
    lowest value within the range."""
    a, b = 0.0, step
    while True:
        if value(a) - value(b) < error(a, b):
            return None
        if abs(b) == LOG_FACTOR_RANGE:
            return (b, b, a) if b < a else (a, b, b)
        c = max(-LOG_FACTOR_RANGE, min(LOG_FACTOR_RANGE, b + _GOLDEN * (b - a)))
        if value(c) >= value(b):
            return (a, b, c) if a < c else (c, b, a)
        a, b = b, c


def _flat(value, error, a: float, b: float, c: float) -> bool:
    """Whether both ends of the bracket are within their paired standard error of its middle
    (a bracket with the range's end as its middle and one end is not flat: the values fell
    up to that end by more than their error)."""
    if a == b or b == c:
        return False
    return all(value(end) - value(b) < error(end, b) for end in (a, c))


def _golden_step(value, a: float, b: float, c: float) -> Tuple[float, float, float]:
    """One golden-section step: a point in the larger side of ``(a, b, c)`` and the smaller
    bracket that keeps the lowest value inside."""
    x = b + _INNER * (c - b) if c - b > b - a else b - _INNER * (b - a)
    if value(x) < value(b):
        return (b, x, c) if x > b else (a, x, b)
    return (a, b, x) if x > b else (x, b, c)
