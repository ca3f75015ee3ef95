r"""Per-column statistics of every row of a source, streamed: :func:`source_moments` (the
inputs' standard deviations, the targets' root mean square: the recipes' units) and
:func:`target_moments` (each target column's mean and standard deviation), merged over chunks
and processes by Chan's rule.

Internal: not part of the public API.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional, Tuple

import numpy as np
import torch
from torch import Tensor

from rfgp._data._sharded import ShardedSource, gather_checked
from rfgp._data._sources import DEFAULT_CHUNK_ROWS, DataSource

__all__ = ["MOMENT_BITS", "SourceMoments", "source_moments", "target_moments"]

#: Significant bits kept of the streamed moments (:func:`source_moments`).
MOMENT_BITS = 32


@dataclass
class SourceMoments:
    """What the recipes' units need of every row, from :func:`source_moments`.

    Attributes:
        num_rows: ``N``.
        column_scale: ``(d,)`` each input column's standard deviation (1 for a constant
            column or one row), in the source's dtype, on the CPU.
        target_rms: the root mean square of ``y`` over every entry (float64, computed without
            squaring ``y`` itself, so at any magnitude a float64 holds).
        target_mean: ``(T,)`` the mean of each target column over every row (float64; one
            entry for ``(N,)`` targets).
    """

    num_rows: int
    column_scale: Tensor
    target_rms: float
    target_mean: Optional[Tensor] = None


def _power_of_two(values: Tensor) -> Tensor:
    usable = (values > 0) & torch.isfinite(values)
    exponent = torch.where(usable, values, torch.ones_like(values)).log2().round()
    return torch.ldexp(torch.ones_like(values), exponent.to(torch.int32))


def source_moments(source: DataSource, rows_per_chunk: int = DEFAULT_CHUNK_ROWS,
                   process_group: Any = None) -> SourceMoments:
    r"""The inputs' column standard deviations and the targets' root mean square, streamed.

    Two passes: the columns' largest magnitudes (all-reduced for a :class:`ShardedSource`),
    then, on ``x`` divided by a power of two near them (exact), each chunk's count, mean and
    sum of squared deviations in float64, merged over chunks (and ranks, in rank order) by
    Chan's rule :math:`M_{2} = M_{2,a} + M_{2,b} + \delta^2 n_a n_b / (n_a + n_b)`; so no
    square overflows at any magnitude, and the result is the two-pass standard deviation to
    rounding. Both are rounded to :data:`MOMENT_BITS` significant bits, so that the same rows
    give the same moments however they are cut into chunks and shards.

    Example:
        >>> from rfgp._data import ArraySource
        >>> src = ArraySource(torch.tensor([[0.0, 1.0], [2.0, 1.0]], dtype=torch.float64),
        ...                   torch.tensor([1.0, -1.0], dtype=torch.float64))
        >>> m = source_moments(src)
        >>> m.column_scale, m.target_rms
        (tensor([1.4142, 1.0000], dtype=torch.float64), 1.0)
    """
    sharded = isinstance(source, ShardedSource)
    d = source.input_dim

    def peaks() -> Tuple[Tensor, float]:
        peak_x = torch.zeros(d, dtype=torch.float64)
        peak_y = 0.0
        for x, y in source.chunks(rows_per_chunk):
            peak_x = torch.maximum(peak_x, x.abs().amax(0).to(torch.float64).cpu())
            peak_y = max(peak_y, float(y.abs().max()))
        return peak_x, peak_y

    # A shard's error (a NaN row, a failing read) reaches every rank at these gathers.
    found = gather_checked(peaks, source.group) if sharded else [peaks()]
    peak_x = torch.stack([p[0] for p in found]).amax(0)
    largest = max(p[1] for p in found)
    unit_x = _power_of_two(peak_x)
    unit_y = 2.0 ** math.floor(math.log2(largest)) if largest > 0 else 1.0

    columns = max(1, math.prod(source.target_shape))

    def moments() -> Tuple[int, Tensor, Tensor, float, Tensor]:
        count, mean, m2 = 0, torch.zeros(d, dtype=torch.float64), torch.zeros(
            d, dtype=torch.float64)
        squares, sums = 0.0, torch.zeros(columns, dtype=torch.float64)
        for x, y in source.chunks(rows_per_chunk):
            z = x.to(torch.float64) / unit_x.to(x.device)
            centre = z.mean(0)
            count, mean, m2 = _merge(count, mean, m2, z.shape[0], centre.cpu(),
                                     (z - centre).square().sum(0).cpu())
            scaled = y.to(torch.float64) / unit_y
            squares += float(scaled.square().sum())
            sums += scaled.reshape(scaled.shape[0], columns).sum(0).cpu()
        return count, mean, m2, squares, sums

    parts = gather_checked(moments, source.group) if sharded else [moments()]
    count, mean, m2 = 0, torch.zeros(d, dtype=torch.float64), torch.zeros(d, dtype=torch.float64)
    for n_r, mean_r, m2_r, _, _ in parts:
        count, mean, m2 = _merge(count, mean, m2, n_r, mean_r, m2_r)
    squares = sum(part[3] for part in parts)
    if count > 1:
        scale = (m2 / (count - 1)).sqrt() * unit_x
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    else:
        scale = torch.ones(d, dtype=torch.float64)
    entries = count * columns
    rms = unit_y * math.sqrt(squares / entries)
    target_mean = unit_y * sum(part[4] for part in parts) / max(count, 1)
    # Rounded to MOMENT_BITS significant bits: the association of the sums (the chunks, the
    # processes) changes their last bits, and the search's start, on which the path of its
    # optimiser depends, must not change with it.
    return SourceMoments(count, _round_bits(scale).to(source.dtype),
                         float(_round_bits(torch.tensor(rms, dtype=torch.float64))),
                         _round_bits(target_mean))


def _round_bits(values: Tensor) -> Tensor:
    """``values`` (float64) rounded to :data:`MOMENT_BITS` significant bits."""
    mantissa, exponent = torch.frexp(values)
    return torch.ldexp((mantissa * 2.0**MOMENT_BITS).round() / 2.0**MOMENT_BITS, exponent)


def _merge(n_a: int, mean_a: Tensor, m2_a: Tensor, n_b: int, mean_b: Tensor,
           m2_b: Tensor) -> Tuple[int, Tensor, Tensor]:
    """Chan's pairwise merge of two (count, mean, sum of squared deviations) summaries."""
    if n_b == 0:
        return n_a, mean_a, m2_a
    if n_a == 0:
        return n_b, mean_b.clone(), m2_b.clone()
    n = n_a + n_b
    delta = mean_b - mean_a
    return n, mean_a + delta * (n_b / n), m2_a + m2_b + delta.square() * (n_a * n_b / n)


def target_moments(source: DataSource, process_group: Any = None) -> Tuple[np.ndarray, np.ndarray]:
    r"""Each target column's mean and standard deviation (divisor ``N``; 1 where it is 0) over
    every row of ``source`` (all processes' for a :class:`ShardedSource`), streamed in float64
    and merged by Chan's rule: ``(mean, std)`` of shape ``target_shape``.

    Example:
        >>> from rfgp._data import ArraySource
        >>> src = ArraySource(np.zeros((4, 1)), np.array([1.0, 3.0, 1.0, 3.0]))
        >>> target_moments(src)
        (array(2.), array(1.))
    """
    width = max(1, math.prod(source.target_shape))

    def local() -> Tuple[int, Tensor, Tensor]:
        count = 0
        mean = torch.zeros(width, dtype=torch.float64)
        m2 = torch.zeros(width, dtype=torch.float64)
        for _, y in source.chunks(DEFAULT_CHUNK_ROWS):
            z = y.reshape(y.shape[0], -1).to(torch.float64).cpu()
            centre = z.mean(0)
            count, mean, m2 = _merge(count, mean, m2, z.shape[0], centre,
                                     (z - centre).square().sum(0))
        return count, mean, m2

    if isinstance(source, ShardedSource):
        parts = gather_checked(local, source.group)
    else:
        parts = [local()]
    count, mean, m2 = 0, torch.zeros(width, dtype=torch.float64), torch.zeros(
        width, dtype=torch.float64)
    for part in parts:
        count, mean, m2 = _merge(count, mean, m2, *part)
    std = (m2 / count).sqrt()
    std = torch.where(std > 0, std, torch.ones_like(std))
    return (mean.numpy().reshape(source.target_shape),
            std.numpy().reshape(source.target_shape))

