r"""A per-class affine map of a Dirichlet classifier's latents, chosen over the temperature by
cross-validation on the held-out rows.

The temperature (:mod:`~rfgp.classification._held_out_temperature`) rescales every class's
latent alike. The Dirichlet transform's distortion is not alike across classes: its targets
are centred per class, so with unequal class frequencies each class's latent approaches a
plateau and a ceiling of its own (adult, 24% of one class: at the held-out temperature the
top bin stays under-confident, 0.967 / 0.981, while the bins from 0.70 to 0.84 are
over-confident by 4 to 5 points, and no one scale mends both). The family

.. math::
    p(y = c \mid x) = \mathbb{E}\big[\mathrm{softmax}(s \odot f(x) + o)\big]_c,
    \qquad s \in \mathbb{R}^C_{>0},\ o \in \mathbb{R}^C,\ \textstyle\sum_c o_c = 0,

holds the temperature (:math:`s = 1/T`, :math:`o = 0`) and has :math:`2C - 1` free numbers
(the softmax ignores a common shift of :math:`o`). Its maximum-likelihood map on the
validation rows (mean-field probabilities, L-BFGS from :math:`s = 1/T`, :math:`o = 0`) is
taken over the temperature only where it predicts better on rows it was not fitted to:
:data:`CV_FOLDS`-fold cross-validation on the validation rows, each fold's temperature
(by the recipe's own search) and map fitted on the other folds and scored on it, the map kept
where its cross-validated NLL is lower. The cross-validation runs only where the map's
in-sample gain can survive it: its expected out-of-sample NLL is the in-sample one plus about
:math:`k / N_v` for :math:`k = 2C - 2` more numbers than the temperature (Akaike; leave-one-out
cross-validation is asymptotically the same criterion), so a total in-sample gain of at most
:math:`k` nats keeps the temperature without the folds' cost (letter: 23 to 25 nats against
50; run all the same, the map's cross-validated NLL was 0.153 to 0.177 against the
temperature's 0.110 to 0.127); on adult and MAGIC (two classes, two more numbers) the map
wins (adult: 0.32626 against 0.32699; MAGIC's three splits by 0.0018 to 0.0024). The map
is kept only where it is an interior maximum: the temperature was bracketed (the held-out
rows identify a finite scale), the fit ended at a stationary point
(:data:`GRADIENT_TOLERANCE`) and every class's scale lies within a factor
:data:`SCALE_RANGE` of :math:`1/T`; a class whose held-out rows are all ranked
correctly has no finite maximum-likelihood scale, and sharpening it without bound would make
every later error cost without bound.

Internal: not part of the public API (see :mod:`rfgp.classification`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import torch
from torch import Tensor

from rfgp._softmax import softmax_expectation
from rfgp.classification._held_out_temperature import (
    TemperatureChoice,
    _bracketed,
    held_out_temperature,
)

__all__ = ["CV_FOLDS", "GRADIENT_TOLERANCE", "SCALE_RANGE", "ClassMapChoice", "fit_class_map",
           "held_out_class_map"]

#: Folds of the cross-validation that compares the map with the temperature.
CV_FOLDS = 5
#: The most a class's scale may differ from ``1 / T`` (either way) for the map to be kept.
SCALE_RANGE = 10.0
#: The largest gradient component of the mean held-out NLL at which a fitted map counts as
#: the likelihood's maximum. Fits with a maximum end below 2e-6 (adult, MAGIC); a class whose
#: rows are all ranked correctly has none, and its scale creeps on with a gradient near
#: ``exp(-s m)`` for a margin ``m``, far above this at any scale a fit reaches.
GRADIENT_TOLERANCE = 1e-5
#: L-BFGS iterations of one map's fit (2C - 1 numbers): two classes converge in a few; on
#: 26-class letter the in-sample gain at 60 is within 0.2 nats (of 1,600 rows) of 200's.
_MAX_ITERATIONS = 60


@dataclass(frozen=True)
class ClassMapChoice:
    """The held-out choice between the temperature and the per-class map.

    Attributes:
        scales, offsets: ``(C,)`` the map :math:`s`, :math:`o` where it was chosen, else
            ``None`` (the temperature stands).
        nll: the held-out NLL of the map fitted on all validation rows (``nan`` where it was
            not fitted).
        cv_nll: ``{"temperature": ..., "class_map": ...}`` the cross-validated NLLs (empty
            where the comparison did not run: no bracketed temperature, a map outside
            :data:`SCALE_RANGE`, or an in-sample gain of at most ``2C - 2`` nats).
    """

    scales: Optional[Tensor]
    offsets: Optional[Tensor]
    nll: float
    cv_nll: Dict[str, float]


def _row_nll(scales: Tensor, offsets: Tensor, means: Tensor, variances: Tensor,
             labels: Tensor) -> Tensor:
    log_proba = softmax_expectation(scales * means + offsets, scales.square() * variances,
                                    method="mean_field", log=True)
    return -log_proba.gather(1, labels.reshape(-1, 1)).squeeze(1)


def fit_class_map(means: Tensor, variances: Tensor, labels: Tensor,
                  start_scale: float = 1.0) -> Tuple[Tensor, Tensor, bool]:
    r"""The maximum-likelihood per-class map :math:`(s, o)` of the rows' latent moments
    (mean-field probabilities), by L-BFGS over :math:`\log s` and the centred :math:`o`
    from :math:`s = ` ``start_scale``, :math:`o = 0`.

    Args:
        means, variances: ``(N, C)`` the latent moments.
        labels: ``(N,)`` class indices.
        start_scale: the common scale to start from (``1 / T``).

    Returns:
        ``(scales, offsets, converged)``: ``(C,)`` each (offsets summing to zero), and whether
        the fit ended at a stationary point (every component of the mean NLL's gradient at
        most :data:`GRADIENT_TOLERANCE`, finite).

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> logits = torch.randn(20000, 2, generator=g, dtype=torch.float64)
        >>> labels = torch.multinomial(torch.softmax(logits * torch.tensor([1.0, 3.0]), -1),
        ...                            1, generator=g).squeeze(1)
        >>> s, o, ok = fit_class_map(logits, torch.zeros_like(logits), labels)
        >>> ok and abs(float(s[1] / s[0]) - 3.0) < 0.3
        True
    """
    dtype = means.dtype
    log_scales = torch.full((means.shape[1],), math.log(start_scale), dtype=dtype,
                            requires_grad=True)
    raw = torch.zeros(means.shape[1], dtype=dtype, requires_grad=True)
    optimiser = torch.optim.LBFGS([log_scales, raw], max_iter=_MAX_ITERATIONS,
                                  line_search_fn="strong_wolfe", tolerance_grad=1e-6,
                                  tolerance_change=1e-9)
    means, variances = means.detach(), variances.detach()

    def closure() -> Tensor:
        optimiser.zero_grad()
        loss = _row_nll(log_scales.exp(), raw - raw.mean(), means, variances, labels).mean()
        loss.backward()
        return loss

    with torch.enable_grad():
        optimiser.step(closure)
        closure()  # the gradient at the end point
    gradient = torch.cat([log_scales.grad, raw.grad])
    converged = bool(torch.isfinite(gradient).all()
                     and float(gradient.abs().max()) <= GRADIENT_TOLERANCE)
    return log_scales.detach().exp(), (raw - raw.mean()).detach(), converged


def held_out_class_map(means: Tensor, variances: Tensor, labels: Tensor,
                       temperature: TemperatureChoice) -> ClassMapChoice:
    r"""The per-class map where it cross-validates better than the temperature on the
    validation rows (module docstring), else ``scales = offsets = None``.

    Args:
        means, variances: ``(N_v, C)`` the validation rows' latent moments.
        labels: ``(N_v,)`` their class indices.
        temperature: the temperature chosen on all of them
            (:func:`~rfgp.classification._held_out_temperature.held_out_temperature`).

    Returns:
        :class:`ClassMapChoice`.

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> logits = torch.randn(20000, 2, generator=g, dtype=torch.float64)
        >>> labels = torch.multinomial(torch.softmax(logits * torch.tensor([0.5, 2.0]), -1),
        ...                            1, generator=g).squeeze(1)
        >>> zero = torch.zeros_like(logits)
        >>> choice = held_out_class_map(logits, zero, labels,
        ...                             held_out_temperature(logits, zero, labels))
        >>> choice.scales is not None  # the classes' scales differ fourfold
        True
    """
    none = ClassMapChoice(None, None, math.nan, {})
    n, t = means.shape[0], temperature.temperature
    # Where the held-out rows place no minimum of the temperature, no finite scale is
    # identified, and the map would sharpen without bound too.
    if (t == 1.0 and not _bracketed(temperature.evaluations, t)) or n < 2 * CV_FOLDS:
        return none
    with torch.no_grad():
        scales, offsets, converged = fit_class_map(means, variances, labels, 1.0 / t)
        if not converged or float((scales * t).log().abs().max()) > math.log(SCALE_RANGE):
            return none
        ones = torch.ones(means.shape[1], dtype=means.dtype, device=means.device)
        nll = float(_row_nll(scales, offsets, means, variances, labels).mean())
        at_t = float(_row_nll(ones / t, 0 * ones, means, variances, labels).mean())
        if n * (at_t - nll) <= 2 * means.shape[1] - 2:  # Akaike: no gain expected out of sample
            return ClassMapChoice(None, None, nll, {})
        order = torch.randperm(n, generator=torch.Generator().manual_seed(0))
        order = order.to(means.device)
        by_temperature = torch.empty(n, dtype=means.dtype, device=means.device)
        by_map = torch.empty_like(by_temperature)
        for k in range(CV_FOLDS):
            test = order[k::CV_FOLDS]
            train = torch.cat([order[j::CV_FOLDS] for j in range(CV_FOLDS) if j != k])
            m, v, y = means[train], variances[train], labels[train]
            fold_t = held_out_temperature(m, v, y).temperature
            by_temperature[test] = _row_nll(ones / fold_t, 0 * ones, means[test],
                                            variances[test], labels[test])
            s, o, _ = fit_class_map(m, v, y, 1.0 / fold_t)
            by_map[test] = _row_nll(s, o, means[test], variances[test], labels[test])
        cv = {"temperature": float(by_temperature.mean()), "class_map": float(by_map.mean())}
    if not cv["class_map"] < cv["temperature"]:  # NaN keeps the temperature too
        return ClassMapChoice(None, None, nll, cv)
    return ClassMapChoice(scales, offsets, nll, cv)

