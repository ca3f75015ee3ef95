r"""The recipe on rows it does not hold: memory-maps, chunk sources and process shards.

:func:`~rfgp.recipes.fit_auto` turns any input other than in-memory tensors (a numpy array or
memory-map, a re-iterable of ``(x, y)`` chunks, or, with ``distributed=True``, each process's
shard) into a :class:`~rfgp._data.DataSource` and runs the same stages on it:

* **units and start** from streamed moments (:func:`~rfgp._data.source_moments`: the columns'
  standard deviations and the targets' mean square, two passes), the median heuristic on
  1,000 drawn rows;
* **the search stages** on a working set: the schedule's longest head of one seeded draw of
  row ids (:func:`~rfgp._data.draw_rows`), read with :meth:`~rfgp._data.DataSource.take`:
  the rows an in-memory fit's stages would see, so the model is the same;
* **the final fit** streamed: the calibration's Gram matrix :math:`\Phi^\top \Phi` and
  :math:`\Phi^\top y` are summed over chunks (and all-reduced across processes), and the model
  is fitted from them (:func:`fit_from_products`; weight space: its matrices are ``D x D``
  whatever ``N``), or, where no such products were formed (no calibration, fewer rows than
  features), by :meth:`~rfgp.RandomFeatureGP.fit_stream`.

Where the rows are few enough that a stage holds all of them, they are read into memory and
the in-memory recipe runs. Under ``torch.distributed`` every rank runs the stages on the same
working set; rank 0's schedule and stage results are then adopted by all (so every rank returns
the same model), and every collective is preceded by a check that makes a rank's error
(a bad row, a failing read) an error on every rank (:func:`~rfgp._data.gather_checked`).

Memory: ``O(chunk * D + D^2)`` for the final fit, plus the working set (``refine_rows x d``).

Internal: not part of the public API (see :mod:`rfgp.recipes`).
"""

from __future__ import annotations

import itertools
import math
from typing import Any, Callable, Iterator, List, Optional

import numpy as np
import torch
from torch import Tensor

from rfgp._data import (
    DEFAULT_CHUNK_ROWS,
    DataSource,
    ShardedSource,
    all_reduce_sum,
    as_source,
    draw_rows,
    gather_checked,
    source_moments,
)
from rfgp.inference._feature_gp import RandomFeatureGP
from rfgp.inference._feature_map import FeatureMap
from rfgp.inference._statistics import accumulate_gram, symmetrize_upper
from rfgp.kernels._composition import feature_kernel
from rfgp.recipes._calibration import ScaleEvidence, spectral_statistics
from rfgp.recipes._context import RecipeContext

__all__ = ["agree_on_stages", "agreed", "fit_from_products", "longest_head", "open_source",
           "source_evidence", "stream_fit", "working_set"]

#: Rows of the median heuristic's draw (those of :func:`~rfgp.recipes.initial_hyperparameters`).
MEDIAN_ROWS = 1000


def open_source(x: Any, y: Any, distributed: bool) -> Optional[DataSource]:
    """The source of ``fit_auto``'s data, or ``None`` for in-memory tensors in one process.

    With ``distributed`` each process's ``(x, y)`` is its shard (a :class:`ShardedSource`);
    ``torch.distributed`` must be initialised."""
    if isinstance(x, DataSource):  # built by the estimators
        if y is not None or distributed != isinstance(x, ShardedSource):
            raise ValueError("a DataSource x takes y=None, and is a ShardedSource exactly when "
                             "distributed=True")
        return x
    if not distributed:
        if isinstance(x, Tensor) and not isinstance(y, np.ndarray):
            return None
        return as_source(x, y)
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError(
            "distributed=True needs an initialised torch.distributed process group (run under "
            "torchrun and call torch.distributed.init_process_group first), got none"
        )
    rank = dist.get_rank()
    return ShardedSource(lambda: as_source(x, y, rank))


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


def source_evidence(kernel: Any, ctx: RecipeContext,
                    products: Optional[list] = None) -> ScaleEvidence:
    r"""The spectral statistics of ``kernel``'s feature model on every row of ``ctx.source``
    in the search's units: :math:`\Phi^\top\Phi` and :math:`\Phi^\top y` summed over chunks of
    :data:`~rfgp._data.DEFAULT_CHUNK_ROWS` rows in float64 (the in-memory chunks, so the sums
    round alike) and all-reduced across processes. A ``products`` list receives
    ``(Z^T Z, Z^T Y)``, and ``ctx.extra["column_squares"]`` each target column's
    :math:`y_t^\top y_t`, for :func:`fit_from_products`."""
    source = ctx.source
    feature_map = FeatureMap(feature_kernel(kernel))
    width = feature_map.num_real_features
    if source.num_rows < width:  # the N x N form: few rows, read them
        from rfgp.recipes._refit import feature_model_evidence

        x, y = source.load()
        return feature_model_evidence(kernel, x / ctx.x_unit, y / ctx.y_unit)
    columns = max(1, int(np.prod(source.target_shape)))
    gram = torch.zeros(width, width, dtype=torch.float64)
    rhs = torch.zeros(width, columns, dtype=torch.float64)
    squares = torch.zeros(columns, dtype=torch.float64)

    def accumulate() -> None:
        with torch.no_grad():
            for x, y in source.chunks(DEFAULT_CHUNK_ROWS):
                z = feature_map.real_rows(x / ctx.x_unit).to(torch.float64)
                targets = (y / ctx.y_unit).reshape(x.shape[0], -1).to(torch.float64)
                accumulate_gram(gram, z)
                rhs.add_(z.transpose(0, 1) @ targets)
                squares.add_(targets.square().sum(0))

    if isinstance(source, ShardedSource):
        gather_checked(accumulate, source.group)
        gram, rhs, squares = (all_reduce_sum(total, source.group)
                              for total in (gram, rhs, squares))
    else:
        accumulate()
    gram = symmetrize_upper(gram)
    if products is not None:
        products.append((gram, rhs))
        ctx.extra["column_squares"] = squares
    return spectral_statistics(gram, rhs, float(squares.sum()), source.num_rows)


def fit_from_products(gp: RandomFeatureGP, ctx: RecipeContext, products: tuple) -> None:
    r"""Fit ``gp`` (weight space, model noise) from the calibration's products of its own
    features, ``(Z^T Z, Z^T Y)`` in the data's units, without another pass over the rows:
    the statistics are the products, each target column's :math:`y_t^\top y_t` and ``N``.
    What a fit on the rows would sum, so the model is that fit's (to rounding)."""
    gram, rhs = products
    squares = ctx.extra["column_squares"] * ctx.y_unit**2
    # The solver's inner pieces: the rows are not passed (they are not held). One working
    # row gives the layout, the dtype and any lazily drawn weights.
    factory = gp._factory
    prepared = factory.prepare(ctx.x_data[:1], ctx.y_data[:1], None, model_noise=gp.noise)
    layout = factory.new_layout(prepared, False, gp.noise)
    with torch.no_grad():
        factory.feature_map.real_rows(prepared[0])
    largest = float(squares.max().sqrt())
    # A power of two near the targets' size: dividing by it is exact, and keeps the solve's
    # sums of squares finite.
    scale = 2.0 ** math.floor(math.log2(largest)) if largest > 0 else 1.0
    stats = factory.new_statistics(rhs.shape[1], False, prepared[0])
    stats.grams[0] = gram.to(device=stats.device, dtype=stats.dtype)
    stats.rhs = (rhs / scale).to(device=stats.device, dtype=stats.dtype)
    stats.yy = (squares / scale**2).to(device=stats.device, dtype=stats.dtype)
    stats.count = ctx.num_rows
    gp._install(factory.weight_solver(stats, scale), layout, prepared[0], None, None)


def stream_fit(gp: RandomFeatureGP, source: DataSource) -> RandomFeatureGP:
    """``gp.fit_stream`` over every row of ``source`` (the data's units), all-reduced across
    processes for a :class:`ShardedSource`. A read that fails on one rank stops that rank's
    stream; every rank then raises after the fit's collectives, instead of waiting."""
    if not isinstance(source, ShardedSource):
        return gp.fit_stream(source.chunks(DEFAULT_CHUNK_ROWS))
    chunks = source.chunks(DEFAULT_CHUNK_ROWS)
    first: List[Any] = []
    # The first chunk is read before the fit's first collective (its weights' broadcast).
    gather_checked(lambda: first.append(next(chunks)), source.group)
    failures: List[BaseException] = []

    def guarded() -> Iterator[Any]:
        try:
            yield from chunks
        except Exception as error:  # raised on every rank once the fit's collectives are done
            failures.append(error)

    gp.fit_stream(itertools.chain(first, guarded()), distributed=True,
                  process_group=source.group)

    def check() -> None:
        if failures:
            raise failures[0]

    gather_checked(check, source.group)
    return gp


def agree_on_stages(ctx: RecipeContext, source: DataSource, stages: Callable[[], None]) -> None:
    """Run the search stages on every rank, then adopt rank 0's results (its model,
    candidates, Laplace draws, bound and report), so that every rank fits the same model."""
    def run() -> dict:
        stages()
        return {"model": ctx.model, "candidates": ctx.candidates, "draws": ctx.draws,
                "bound": ctx.bound, "report": ctx.report, "evidence": ctx.evidence}

    state = agreed(run, source)
    report = ctx.report
    report.__dict__.update(state["report"].__dict__)
    ctx.model, ctx.candidates, ctx.draws = state["model"], state["candidates"], state["draws"]
    ctx.bound, ctx.evidence = state["bound"], state["evidence"]
