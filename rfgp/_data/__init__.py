r"""Data sources: rows that the recipes read without holding them all in memory.

A :class:`DataSource` is ``N`` rows of inputs ``x`` ``(N, d)`` and targets ``y`` ``(N,)`` or
``(N, T)`` behind a small interface: :attr:`~DataSource.num_rows`, :attr:`~DataSource.input_dim`,
:attr:`~DataSource.dtype`, :meth:`~DataSource.take` (given rows, as tensors) and
:meth:`~DataSource.chunks` (every row once, in order, a chunk at a time). Three kinds:

* :class:`ArraySource`: tensors, numpy arrays and numpy memory-maps (``np.load(path,
  mmap_mode="r")``); a chunk or a taken row is read from the array when it is asked for,
  so a memory-map is never loaded whole;
* :class:`ChunkSource`: any re-iterable source of ``(x, y)`` chunks (a
  ``torch.utils.data.DataLoader``, a list, or a callable that returns a fresh iterator);
  its rows are counted and checked in a first pass;
* :class:`ShardedSource`: one ``torch.distributed`` process's shard of a source whose rows are
  the shards' rows in rank order: global row ``i`` of rank ``r`` is ``offset_r + i``, with
  ``offset_r`` the rows of the ranks before it. :meth:`~ShardedSource.take` returns the same
  global rows on every rank (each rank reads its own, an all-reduce of zero-padded buffers
  gathers them: adding zeros is exact), so a draw of global row ids from one seed gives the
  same rows whatever the number of processes.

Every chunk is checked as it is read (shape, dtype, finite values), and an error names the
row (and the rank). :func:`draw_rows` is the recipes' one seeded draw of distinct row ids.
:func:`source_moments` streams the per-column statistics the recipes' units need.

Memory: a pass holds one chunk (``O(chunk * d)``) and a draw ``O(count)`` row ids; no pass
converts the whole of a memory-map to a tensor or copies it in float64.

Internal: not part of the public API.
"""

from rfgp._data._draws import PERMUTATION_ROWS, draw_rows
from rfgp._data._moments import MOMENT_BITS, SourceMoments, source_moments, target_moments
from rfgp._data._queries import array_row_chunks
from rfgp._data._sharded import (
    ShardedSource,
    all_reduce_sum,
    centred_source,
    gather_checked,
    open_source,
)
from rfgp._data._sources import (
    DEFAULT_CHUNK_ROWS,
    SOURCE_DTYPES,
    ArraySource,
    ChunkSource,
    DataSource,
    ScaledTargets,
    as_source,
    check_chunk,
)

__all__ = [
    "DEFAULT_CHUNK_ROWS",
    "MOMENT_BITS",
    "PERMUTATION_ROWS",
    "SOURCE_DTYPES",
    "ArraySource",
    "ChunkSource",
    "DataSource",
    "ScaledTargets",
    "ShardedSource",
    "SourceMoments",
    "all_reduce_sum",
    "array_row_chunks",
    "as_source",
    "centred_source",
    "check_chunk",
    "draw_rows",
    "gather_checked",
    "open_source",
    "source_moments",
    "target_moments",
]
