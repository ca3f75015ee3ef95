r"""The data-driven first guess of a GP's hyperparameters: the median heuristic per input
column for the lengthscales, the targets' mean square for the outputscale and the noise.

It reads only statistics of the data (the columns' standard deviations, a draw of rows, the
targets' mean square), so that rows not held in memory, whose statistics are streamed
(:mod:`rfgp._working_set`), start where the same rows in memory would.
"""

from __future__ import annotations

import math
from typing import Dict, Optional

import torch
from torch import Tensor

from rfgp._data import draw_rows
from rfgp._ops import power_of_two_scale
from rfgp._units import column_scale

__all__ = ["initial_hyperparameters", "start_from_moments"]


def initial_hyperparameters(
    x: Tensor,
    y: Tensor,
    max_rows: int = 1000,
    signal_fraction: float = 0.9,
    generator: Optional[torch.Generator] = None,
) -> Dict[str, Tensor]:
    r"""A data-driven starting point for the evidence search.

    With :math:`s_j` the standard deviation of input column :math:`j` (1 for a constant column)
    and :math:`m` the median of :math:`\|(x_a - x_b) / s\|` over pairs of distinct rows (at most
    ``max_rows`` rows, drawn at random; 1 without such pairs), the lengthscales are

    .. math::
        \ell_j = s_j \, m / \sqrt 2,

    so that :math:`\|(x_a - x_b)/\ell\|^2 / 2` is one at the median pair: the RBF kernel of the
    median pair is :math:`e^{-1}` whatever the scale of each column (for standardised Gaussian
    inputs :math:`\ell_j \approx \sqrt d`). With :math:`v` the mean square of the (centred)
    targets, the outputscale is ``signal_fraction`` :math:`\cdot v` and the noise the rest.

    Args:
        x: ``(N, d)`` inputs.
        y: ``(N,)`` or ``(N, T)`` targets, centred (the GP's prior mean is zero).
        max_rows: rows used for the median.
        signal_fraction: share of the targets' mean square given to the outputscale, in
            ``(0, 1)``.
        generator: random rows for the median when ``N > max_rows``.

    Returns:
        ``{"lengthscale": (d,), "outputscale": (), "noise": ()}`` tensors in ``x``'s dtype.

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> x = torch.randn(500, 2, dtype=torch.float64, generator=g) * torch.tensor([1.0, 10.0])
        >>> init = initial_hyperparameters(x, torch.randn(500, dtype=torch.float64))
        >>> ratio = init["lengthscale"][1] / init["lengthscale"][0]
        >>> bool(9 < ratio < 11)
        True
    """
    n = x.shape[0]
    rows = x if n <= max_rows else x[draw_rows(n, max_rows, generator).to(x.device)]
    # The mean square of y / m times m^2, m a power of two near the largest target: squares
    # of targets beyond about 1e154 overflow otherwise (the result itself may still not be a
    # number of the dtype: then the variances cannot be represented, and that is an error).
    peak = power_of_two_scale(y)
    second_moment = float((y / peak).square().mean()) * peak * peak
    return start_from_moments(column_scale(x), rows, second_moment, signal_fraction)


def start_from_moments(scale: Tensor, rows: Tensor, second_moment: float,
                       signal_fraction: float = 0.9) -> Dict[str, Tensor]:
    r""":func:`initial_hyperparameters` from what it reads of the data: the columns'
    standard deviations ``scale`` ``(d,)``, the rows ``(m, d)`` of the median heuristic and
    the targets' mean square (for rows that are not all held: a memory-map, a stream).

    Example:
        >>> x = torch.randn(200, 2, dtype=torch.float64)
        >>> y = torch.randn(200, dtype=torch.float64)
        >>> a = initial_hyperparameters(x, y)
        >>> b = start_from_moments(column_scale(x), x, float(y.square().mean()))
        >>> bool(torch.allclose(a["lengthscale"], b["lengthscale"]))
        True
    """
    dist = torch.pdist(rows / scale)
    positive = dist[dist > 0]
    median = float(positive.median()) if positive.numel() else 1.0
    lengthscale = scale * (median / math.sqrt(2.0))
    if not math.isfinite(second_moment):
        raise ValueError(
            f"y: the targets' mean square (about {second_moment:.3g}) is not a finite number; "
            "rescale the targets (e.g. standardise them)"
        )
    second_moment = second_moment if second_moment > 0 else 1.0
    like = torch.ones((), dtype=rows.dtype, device=rows.device)
    return {
        "lengthscale": lengthscale,
        "outputscale": like * signal_fraction * second_moment,
        "noise": like * (1.0 - signal_fraction) * second_moment,
    }
