r"""The temperature of a Dirichlet classifier's probabilities, chosen by its held-out NLL.

The classifier's probabilities are :math:`\mathbb{E}[\mathrm{softmax}(f / T)]` over its
latent posterior. The Dirichlet transform caps the latent means a fit can reach: with two
classes at ``alpha_epsilon = 0.1`` the transformed targets of the two classes differ by
:math:`\log(1.1/0.1) + (\log 11 - \log(1/1.1 + 1))/2 = 3.27`, so a fit's top probability is
about :math:`\mathrm{sigmoid}(3.27) = 0.963` even where the rows are all of one class, and
a smaller ``alpha_epsilon`` that lifts the cap also moves the plateau the means approach.
The temperature is the one scalar that rescales the latent scale the probabilities are read
on, without refitting: at the chosen ``D``, ``alpha_epsilon`` and outputscale the validation
rows' latent moments are computed once (one Cholesky factor per class), and the held-out NLL
:math:`\ell(T) = -\frac{1}{N_v}\sum_n \log \mathbb{E}[\mathrm{softmax}(f_n / T)]_{y_n}`
(mean-field probabilities, as every held-out choice of the recipe) is minimised over
:math:`\log(1/T)` by the outputscale factor's search
(:func:`~rfgp.classification._held_out_scale.held_out_scale`: golden section from
:math:`T = 1` to sides of 0.1 in :math:`\log T`), to its lowest value: the maximum
likelihood temperature of the held-out rows. Unlike the outputscale factor's, this search
does not stop at the held-out NLL's paired standard error nor prefer the value nearest
:math:`T = 1` within it: the outputscale the features were fitted with is a reason to stay
near the factor 1, but the transform gives :math:`T = 1` no such standing. Its ceiling makes
the probabilities too low where the rows are all of one class, so the held-out rows' own
minimum sits below 1 (MAGIC's three splits and adult: :math:`T` = 0.79 to 0.89 on the
held-out rows and 0.83 to 0.91 on the test rows, including the two where a gain below its
paired error had kept :math:`T = 1`, at a test NLL 0.003 to 0.004 higher). A temperature is
kept only where the evaluations bracket it (a higher NLL on both sides): on validation rows
that the model classifies without error the NLL falls towards :math:`T \to 0` for ever, and
sharpening without bound would make every later error cost without bound. The NLL is a proper
scoring rule: where the latent means are a multiple :math:`m` of the log-odds the labels are
drawn from (and the variances vanish), its expectation is least at :math:`T = m`.

Internal: not part of the public API (see :mod:`rfgp.classification`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict

import torch
from torch import Tensor

from rfgp._softmax import softmax_expectation
from rfgp.classification._held_out_scale import held_out_scale

__all__ = ["TemperatureChoice", "held_out_temperature"]


@dataclass(frozen=True)
class TemperatureChoice:
    """The ``temperature`` chosen, its held-out ``nll`` and every evaluation as
    ``{temperature: nll}`` (1 included)."""

    temperature: float
    nll: float
    evaluations: Dict[float, float]


class _Sharpened:
    """``row_nll(alpha, factor)``: the held-out rows' NLLs of the probabilities
    :math:`\\mathbb{E}[\\mathrm{softmax}(a f)]` at fixed latent moments, :math:`a = 1/T` in
    the place of the outputscale factor (``alpha`` is fixed in the moments)."""

    def __init__(self, means: Tensor, variances: Tensor, labels: Tensor) -> None:
        self.means, self.variances, self.labels = means, variances, labels.reshape(-1, 1)

    def row_nll(self, alpha: float, factor: float = 1.0) -> Tensor:
        log_proba = softmax_expectation(factor * self.means, factor * factor * self.variances,
                                        method="mean_field", log=True)
        return -log_proba.gather(1, self.labels).squeeze(1)


def held_out_temperature(means: Tensor, variances: Tensor, labels: Tensor) -> TemperatureChoice:
    r"""The temperature :math:`T` chosen by the held-out NLL of the validation rows' latent
    moments (module docstring).

    Args:
        means, variances: ``(N_v, C)`` the validation rows' latent moments
            (:meth:`~rfgp.classification._held_out.HeldOutStatistics.moments`).
        labels: ``(N_v,)`` their class indices.

    Returns:
        :class:`TemperatureChoice`; its ``temperature`` is 1 where the held-out NLL is
        lowest there or where its minimum is not bracketed.

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> logits = torch.randn(20000, 2, generator=g, dtype=torch.float64)
        >>> labels = torch.multinomial(torch.softmax(logits, -1), 1, generator=g).squeeze(1)
        >>> choice = held_out_temperature(3 * logits, torch.zeros_like(logits), labels)
        >>> 2.5 < choice.temperature < 3.6  # the means are three times the log-odds
        True
    """
    with torch.no_grad():
        scale = held_out_scale(_Sharpened(means, variances, labels), 0.0, resolution=False)
    evaluations = {1.0 / a: nll for a, nll in scale.evaluations.items()}
    chosen, nll = 1.0 / scale.factor, scale.nll
    if chosen != 1.0 and not _bracketed(evaluations, chosen):
        chosen, nll = 1.0, evaluations[1.0]  # no minimum the rows can place: T = 1
    return TemperatureChoice(chosen, nll, dict(sorted(evaluations.items())))


def _bracketed(evaluations: Dict[float, float], chosen: float) -> bool:
    """Whether an evaluated temperature on each side of ``chosen`` has a higher NLL: the
    held-out rows place a minimum there. Where the NLL only falls towards one end (sharper
    and sharper probabilities on validation rows that hold no error against them), no
    temperature is identified, and sharpening without bound would be overconfidence."""
    best = evaluations[chosen]
    return (any(t < chosen and v > best for t, v in evaluations.items())
            and any(t > chosen and v > best for t, v in evaluations.items()))
