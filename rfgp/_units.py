r"""Units: the recipes search on data divided by powers of two near its spreads.

L-BFGS steps through raw parameters whose scale is the lengthscales' and variances' own, with
a gradient tolerance that is not scale-free: searched in the data's units, inputs measured in
units a thousand times smaller end elsewhere, and 1e10 times smaller stop at the start. So the
inputs are divided per column by :func:`column_unit` and the targets by :func:`target_unit`,
and the hyperparameters are scaled back before the final fit on the data as given. A division
by a power of two is exact: standardised data is searched as given, and data scaled by powers
of two gives the same search bit for bit (and the same predictions to the rounding of the
final solve, which runs in the data's units).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from rfgp._ops import power_of_two_scale

__all__ = ["column_scale", "column_unit", "column_unit_of", "target_unit", "unit_of_rms",
           "check_variances_representable", "NOISE_FLOOR"]

#: The noise is at least this share of the targets' mean square: a floor that keeps the
#: weight-space matrix factorisable without a barrier in the search.
NOISE_FLOOR = 1e-6


def column_scale(x: Tensor) -> Tensor:
    r"""Each input column's standard deviation (1 for a constant column or a single row),
    :math:`s_j = \big(\frac{1}{N-1} \sum_i (x_{ij} - \bar x_j)^2\big)^{1/2}`, computed without
    overflow at any magnitude.

    Args:
        x: ``(N, d)`` finite floating inputs.

    Returns:
        ``(d,)`` positive scales in ``x``'s dtype.

    Example:
        >>> column_scale(torch.tensor([[0.0, 1.0], [2.0, 1.0]], dtype=torch.float64))
        tensor([1.4142, 1.0000], dtype=torch.float64)
    """
    if x.shape[0] == 1:
        return torch.ones_like(x[0])
    # The standard deviation of x / m times m, m a power of two near the column's largest
    # magnitude (exact scalings): squares of inputs beyond about 1e154 overflow otherwise.
    peak = _power_of_two(x.abs().amax(0))
    scale = (x / peak).std(0) * peak
    return torch.where(scale > 0, scale, torch.ones_like(scale))


def column_unit(x: Tensor) -> Tensor:
    r"""The power of two nearest each input column's standard deviation (:func:`column_scale`),
    :math:`u_j = 2^{\operatorname{round}(\log_2 s_j)}`: the unit in which the recipes search.

    Args:
        x: ``(N, d)`` finite floating inputs.

    Returns:
        ``(d,)`` powers of two in ``x``'s dtype.

    Example:
        >>> x = torch.tensor([[0.0, 0.0], [3000.0, 0.002]], dtype=torch.float64)
        >>> column_unit(x)
        tensor([2.0480e+03, 1.9531e-03], dtype=torch.float64)
    """
    return column_unit_of(column_scale(x))


def column_unit_of(scale: Tensor) -> Tensor:
    """:func:`column_unit` from the columns' standard deviations ``(d,)`` (for rows that are
    not all held, whose deviations are streamed).

    Example:
        >>> column_unit_of(torch.tensor([2000.0, 0.002], dtype=torch.float64))
        tensor([2.0480e+03, 1.9531e-03], dtype=torch.float64)
    """
    return _power_of_two(scale)


def target_unit(y: Tensor) -> float:
    """The power of two nearest the root mean square of ``y`` (1 for zero targets), computed
    without squaring ``y`` itself (which overflows beyond about 1e154).

    Example:
        >>> target_unit(torch.tensor([3.0, -3.0], dtype=torch.float64))
        4.0
    """
    peak = power_of_two_scale(y)
    rms = peak * math.sqrt(float((y / peak).square().mean()))
    return 2.0 ** round(math.log2(rms)) if rms > 0 else 1.0


def unit_of_rms(rms: float) -> float:
    """:func:`target_unit` from the targets' root mean square (streamed where the rows are
    not all held): the power of two nearest it.

    Example:
        >>> unit_of_rms(3.0)
        4.0
    """
    return 2.0 ** round(math.log2(rms)) if rms > 0 else 1.0


def check_variances_representable(y_unit: float, dtype: torch.dtype) -> None:
    """The outputscale and the noise are variances in the targets' units, down to the noise
    floor's share of their mean square: a clear error where those are not numbers of
    ``dtype`` (targets beyond about 1e150 or below 1e-150 in float64, 1e19 and 1e-16 in
    float32), instead of an overflow, or a zero noise, deep in the fit."""
    info = torch.finfo(dtype)
    exponent = 2 * math.log2(y_unit)
    if exponent + 4 > math.log2(info.max) or exponent + math.log2(NOISE_FLOOR) < math.log2(
            info.tiny):
        raise ValueError(
            f"y: the targets' root mean square, about {y_unit:.3g}, makes their variance "
            f"(about 2^{exponent:.0f}) or a millionth of it not representable in {dtype}, "
            "the dtype of the outputscale and the noise; rescale the targets (e.g. standardise "
            "them) and scale the predictions back"
        )


def _power_of_two(values: Tensor) -> Tensor:
    """Elementwise the power of two nearest ``values`` in the log (1 where a value is 0 or not
    finite): a unit that divides exactly."""
    usable = (values > 0) & torch.isfinite(values)
    exponent = torch.where(usable, values, torch.ones_like(values)).log2().round()
    return torch.ldexp(torch.ones_like(values), exponent.to(torch.int32))
