r"""The recipe on rows it does not hold: memory-maps, chunk sources and process shards.

:func:`~rfgp.recipes.fit_auto` turns any input other than in-memory tensors (a numpy array or
memory-map, a re-iterable of ``(x, y)`` chunks, or, with ``distributed=True``, each process's
shard) into a :class:`~rfgp._data.DataSource` (:func:`~rfgp._data.open_source`) and runs the
same stages on it:

* **units and start** from streamed moments (:func:`~rfgp._data.source_moments`: the columns'
  standard deviations and the targets' mean square, two passes), the median heuristic on
  1,000 drawn rows;
* **the search stages** on a working set: the schedule's longest head of one seeded draw of
  row ids (:func:`~rfgp._data.draw_rows`), read with :meth:`~rfgp._data.DataSource.take`:
  the rows an in-memory fit's stages would see, so the model is the same;
* **the final fit** streamed: the calibration's Gram matrix :math:`\Phi^\top \Phi` and
  :math:`\Phi^\top y` are summed over chunks (and all-reduced across processes), and the model
  is fitted from them (:func:`~rfgp.inference.calibrate_source_scales` and
  :func:`~rfgp.inference.fit_calibrated_source`; weight space: its matrices are ``D x D``
  whatever ``N``), or, where no such products were formed (no calibration, fewer rows than
  features), by :meth:`~rfgp.RandomFeatureGP.fit_stream`
  (:func:`~rfgp.inference._calibrated_fit.stream_fit`); on the CG path (beyond the weight
  space's features) every product of the calibration and of the fit is a pass over the chunks
  instead, all-reduced: memory ``O(chunk D + D k)``, a pass per CG iteration.

Where the rows are few enough that a stage holds all of them, they are read into memory and
the in-memory recipe runs. Under ``torch.distributed`` every rank runs the stages on the same
working set; rank 0's schedule and stage results are then adopted by all (so every rank returns
the same model), and every collective is preceded by a check that makes a rank's error
(a bad row, a failing read) an error on every rank (:func:`~rfgp._data.gather_checked`).

Memory: ``O(chunk * D + D^2)`` for the final fit, plus the working set (``refine_rows x d``).

Internal: not part of the public API (see :mod:`rfgp.recipes`).
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

#: Rows of the median heuristic's draw (those of :func:`~rfgp.recipes.initial_hyperparameters`).
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
