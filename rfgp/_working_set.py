r"""The rows a recipe reads from a :class:`~rfgp._data.DataSource` it does not hold.

:func:`~rfgp.recipes.fit_auto` turns any input other than in-memory tensors (a numpy array or
memory-map, a re-iterable of ``(x, y)`` chunks, or each process's shard) into a data source
(:func:`~rfgp._data.open_source`). Its units and start come from streamed moments
(:func:`moments`) and the median heuristic's rows (:func:`median_rows`); its search stages
read a working set (:func:`working_set`), the longest head (:func:`longest_head`) of one
seeded draw of row ids, the rows an in-memory fit's stages would see, so the model is the
same. Under ``torch.distributed`` every rank reads the same working set and adopts rank 0's
results (:func:`agreed`); an error on any rank is raised on every rank
(:func:`~rfgp._data.gather_checked`).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import Tensor

from rfgp._data import (
    DEFAULT_CHUNK_ROWS,
    DataSource,
    ShardedSource,
    draw_rows,
    gather_checked,
    source_moments,
)

__all__ = ["MEDIAN_ROWS", "agreed", "longest_head", "median_rows", "moments", "working_set"]

#: Rows of the median heuristic's draw (those of :func:`~rfgp._initial.initial_hyperparameters`).
MEDIAN_ROWS = 1000


def longest_head(schedule: Any) -> int:
    """The most rows a search stage reads: the subsample, or the refinement's rows."""
    return max(schedule.subsample, schedule.refine_rows)


def agreed(value: Callable[[], Any], source: DataSource) -> Any:
    """``value()`` as rank 0 computed it (every rank's own where there is one process); an
    error on any rank raises on every rank."""
    if not isinstance(source, ShardedSource):
        return value()
    return gather_checked(value, source.group)[0]


def working_set(source: DataSource, count: int, generator: torch.Generator) -> tuple:
    """``(x, y)`` of the first ``count`` rows of the recipe's one draw of row ids (the rows
    an in-memory fit's stages read, in their order)."""
    return source.take(draw_rows(source.num_rows, count, generator))


def median_rows(source: DataSource, generator: torch.Generator) -> Tensor:
    """The inputs of the median heuristic's rows: all rows up to :data:`MEDIAN_ROWS`, else a
    draw of that many (as the in-memory start draws them)."""
    if source.num_rows <= MEDIAN_ROWS:
        return source.load()[0]
    return source.take(draw_rows(source.num_rows, MEDIAN_ROWS, generator))[0]


def moments(source: DataSource):
    """:func:`~rfgp._data.source_moments` of the source (validating every row)."""
    return source_moments(source, DEFAULT_CHUNK_ROWS,
                          source.group if isinstance(source, ShardedSource) else None)
