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

from __future__ import annotations

import abc
import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, List, Optional, Tuple

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "ArraySource",
    "ChunkSource",
    "DataSource",
    "ScaledTargets",
    "ShardedSource",
    "SourceMoments",
    "all_reduce_sum",
    "as_source",
    "draw_rows",
    "gather_checked",
    "open_source",
    "source_moments",
    "target_moments",
]

#: The dtypes a source may hold (those the recipes compute in).
SOURCE_DTYPES = (torch.float32, torch.float64)
#: Rows per chunk of a pass when the caller names none.
DEFAULT_CHUNK_ROWS = 4096
#: Up to this many rows a draw is a prefix of one random permutation (``8 N`` bytes); beyond
#: it, distinct ids are drawn by rejection in ``O(count)`` memory.
PERMUTATION_ROWS = 1 << 22
#: Significant bits kept of the streamed moments (:func:`source_moments`).
MOMENT_BITS = 32
# Candidates per round of the rejection draw: a constant, so that a longer draw extends a
# shorter one from the same generator state.
_CANDIDATES = 1 << 16

Pair = Tuple[Tensor, Tensor]


def draw_rows(num_rows: int, count: int, generator: Optional[torch.Generator] = None) -> Tensor:
    r"""``min(count, num_rows)`` distinct row ids drawn uniformly from ``[0, num_rows)``, in
    the order drawn: the first ``count`` entries of a random permutation.

    Up to :data:`PERMUTATION_ROWS` rows it is ``torch.randperm(num_rows)[:count]``; beyond,
    ids are drawn with replacement in rounds of a fixed size and each kept at its first
    appearance, which has the same distribution (every ordered draw of distinct ids equally
    likely) in ``O(count)`` memory. Either way the result depends on ``(num_rows, count)`` and
    the generator's state alone, and a longer draw from the same state extends a shorter one.

    Args:
        num_rows: ``N >= 1``; count: ids wanted (``>= 0``).
        generator: the seeded generator (not the global one).

    Returns:
        ``(min(count, N),)`` int64 ids.

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> rows = draw_rows(10, 4, g)
        >>> rows.shape, bool(rows.unique().numel() == 4)
        (torch.Size([4]), True)
    """
    if isinstance(num_rows, bool) or not isinstance(num_rows, int) or num_rows < 1:
        raise ValueError(f"num_rows must be an integer >= 1, got {num_rows!r}")
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise ValueError(f"count must be an integer >= 0, got {count!r}")
    count = min(count, num_rows)
    if num_rows <= PERMUTATION_ROWS or 2 * count > num_rows:
        return torch.randperm(num_rows, generator=generator)[:count]
    candidates = torch.empty(0, dtype=torch.int64)
    while True:
        fresh = torch.randint(num_rows, (_CANDIDATES,), generator=generator)
        candidates = torch.cat([candidates, fresh])
        values, inverse = torch.unique(candidates, return_inverse=True)
        if values.numel() >= count:
            break
    positions = torch.arange(candidates.numel())
    first = torch.full((values.numel(),), candidates.numel(), dtype=torch.int64)
    first = first.scatter_reduce(0, inverse, positions, reduce="amin")
    return candidates[first.sort().values[:count]]


class DataSource(abc.ABC):
    """Rows of regression data, read on demand (module docstring).

    Attributes:
        num_rows: ``N`` (all processes' rows for a :class:`ShardedSource`).
        input_dim: ``d``.
        target_shape: ``()`` for ``y`` of shape ``(N,)``, ``(T,)`` for ``(N, T)``.
        dtype: ``torch.float32`` or ``torch.float64``, of ``x`` and ``y`` alike.
    """

    num_rows: int
    input_dim: int
    target_shape: Tuple[int, ...]
    dtype: torch.dtype

    @abc.abstractmethod
    def take(self, rows: Tensor) -> Pair:
        """``(x[rows], y[rows])`` as tensors, in the order of ``rows`` (int64 ids)."""

    @abc.abstractmethod
    def chunks(self, rows_per_chunk: int = DEFAULT_CHUNK_ROWS) -> Iterator[Pair]:
        """Every row once, in order, as ``(x, y)`` tensors of ``rows_per_chunk`` rows (the
        last may be shorter); for a :class:`ShardedSource`, this process's rows."""

    def load(self) -> Pair:
        """Every row as tensors (for sources small enough to hold)."""
        return self.take(torch.arange(self.num_rows))


def _where(rank: Optional[int]) -> str:
    return "" if rank is None else f" of rank {rank}"


def check_chunk(x: Any, y: Any, first_row: int, rank: Optional[int] = None,
                like: Optional[Tuple[int, Tuple[int, ...], torch.dtype]] = None) -> Tuple[
                    Tensor, Tensor]:
    """One chunk as tensors ``(x (n, d), y (n,) or (n, T))``, finite, float32 or float64;
    ``like`` = ``(d, target_shape, dtype)`` of the chunks before it. Errors name the global
    row ``first_row + i`` (and the rank)."""
    where = _where(rank)
    x, y = _as_tensor("x", x, where), _as_tensor("y", y, where)
    if x.dim() != 2 or x.shape[1] == 0:
        raise ValueError(
            f"x: a chunk{where} starting at row {first_row} must have shape (n, d) with d >= 1, "
            f"got {tuple(x.shape)}"
        )
    if y.dim() not in (1, 2) or y.shape[0] != x.shape[0] or (y.dim() == 2 and y.shape[1] == 0):
        raise ValueError(
            f"y: a chunk{where} starting at row {first_row} must have shape (n,) or (n, T) with "
            f"n = {x.shape[0]} rows of x, got {tuple(y.shape)}"
        )
    if y.dtype != x.dtype:
        raise TypeError(f"y{where} must have the dtype of x ({x.dtype}), got {y.dtype}")
    if like is not None:
        dim, target_shape, dtype = like
        if x.shape[1] != dim or tuple(y.shape[1:]) != target_shape or x.dtype != dtype:
            raise ValueError(
                f"a chunk{where} starting at row {first_row} has x {tuple(x.shape)}, y "
                f"{tuple(y.shape)} in {x.dtype}, but the rows before it have {dim} input "
                f"columns, targets {target_shape or '(N,)'} in {dtype}; give every chunk one "
                "layout"
            )
    for name, values in (("x", x), ("y", y)):
        finite = torch.isfinite(values)
        if not bool(finite.all()):
            bad = int((~finite.reshape(values.shape[0], -1)).any(-1).nonzero()[0, 0])
            raise ValueError(
                f"{name}: row {first_row + bad}{where} holds NaN or inf; remove or impute "
                "non-finite rows before fitting"
            )
    return x, y


def _as_tensor(name: str, value: Any, where: str) -> Tensor:
    if isinstance(value, np.ndarray):
        if value.dtype not in (np.float32, np.float64):
            raise TypeError(
                f"{name}{where} must be float32 or float64, got a numpy array of {value.dtype}; "
                f"convert it (e.g. {name}.astype(np.float32))"
            )
        value = torch.from_numpy(np.array(value))  # a copy of this chunk only
    if not isinstance(value, Tensor):
        raise TypeError(
            f"{name}{where} must be a tensor or a numpy array, got {type(value).__name__}"
        )
    if value.dtype not in SOURCE_DTYPES:
        raise TypeError(f"{name}{where} must be float32 or float64, got {value.dtype}")
    return value.detach()


class ArraySource(DataSource):
    """Rows of arrays that support row slicing: tensors, numpy arrays, numpy memory-maps.

    Args:
        x: ``(N, d)`` inputs; y: ``(N,)`` or ``(N, T)`` targets (the same dtype,
            float32 or float64).
        rank: the process whose shard this is (for error messages only).

    Example:
        >>> src = ArraySource(np.zeros((5, 2)), np.ones(5))
        >>> src.num_rows, src.input_dim, src.take(torch.tensor([4, 0]))[1]
        (5, 2, tensor([1., 1.], dtype=torch.float64))
    """

    def __init__(self, x: Any, y: Any, rank: Optional[int] = None) -> None:
        where = _where(rank)
        for name, value in (("x", x), ("y", y)):
            if not isinstance(value, (np.ndarray, Tensor)):
                raise TypeError(
                    f"{name}{where} must be a tensor or a numpy array (memory-maps included), "
                    f"got {type(value).__name__}"
                )
        if x.ndim != 2 or x.shape[0] == 0 or x.shape[1] == 0:
            raise ValueError(f"x{where} must have shape (N, d) with N, d >= 1, got "
                             f"{tuple(x.shape)}")
        if y.ndim not in (1, 2) or y.shape[0] != x.shape[0]:
            raise ValueError(
                f"y{where} must have shape (N,) or (N, T) with N = {x.shape[0]} rows of x, got "
                f"{tuple(y.shape)}"
            )
        first_x, first_y = check_chunk(x[:1], y[:1], 0, rank)
        self.x, self.y, self.rank = x, y, rank
        self.num_rows, self.input_dim = int(x.shape[0]), int(x.shape[1])
        self.target_shape = tuple(int(s) for s in y.shape[1:])
        self.dtype = first_x.dtype

    def _like(self) -> Tuple[int, Tuple[int, ...], torch.dtype]:
        return self.input_dim, self.target_shape, self.dtype

    def take(self, rows: Tensor) -> Pair:
        rows = torch.as_tensor(rows, dtype=torch.int64).reshape(-1)
        if rows.numel() == 0:
            return (torch.empty(0, self.input_dim, dtype=self.dtype),
                    torch.empty((0,) + self.target_shape, dtype=self.dtype))
        # Sorted reads touch a memory-map's pages once, in order; then back to the draw order.
        ordered, back = rows.sort()
        index = ordered.numpy() if isinstance(self.x, np.ndarray) else ordered
        x, y = check_chunk(self.x[index], self.y[index], int(ordered[0]), self.rank,
                           self._like())
        place = torch.empty_like(back)
        place[back] = torch.arange(back.numel())
        return x[place], y[place]

    def chunks(self, rows_per_chunk: int = DEFAULT_CHUNK_ROWS) -> Iterator[Pair]:
        for start in range(0, self.num_rows, rows_per_chunk):
            stop = min(start + rows_per_chunk, self.num_rows)
            yield check_chunk(self.x[start:stop], self.y[start:stop], start, self.rank,
                              self._like())


class ChunkSource(DataSource):
    """Rows that arrive as ``(x, y)`` chunks from a re-iterable source.

    A first pass counts the rows and checks every chunk; every later pass iterates the
    source afresh and must see the same rows (else a ``RuntimeError``).

    Args:
        chunks: an iterable that can be iterated more than once (a ``DataLoader``, a list of
            pairs) or a callable that returns a fresh iterator of pairs. A generator or
            another one-shot iterator is refused: wrap it, ``lambda: make_chunks()``.
        rank: the process whose shard this is (for error messages only).

    Example:
        >>> parts = [(torch.zeros(3, 2), torch.ones(3)), (torch.zeros(2, 2), torch.ones(2))]
        >>> src = ChunkSource(parts)
        >>> src.num_rows, [x.shape[0] for x, _ in src.chunks(4)]
        (5, [4, 1])
    """

    def __init__(self, chunks: Any, rank: Optional[int] = None) -> None:
        self.rank = rank
        if callable(chunks) and not hasattr(chunks, "__iter__"):
            self._open: Callable[[], Iterator[Any]] = lambda: iter(chunks())
        elif isinstance(chunks, Iterable) and not isinstance(chunks, (Tensor, np.ndarray)):
            if iter(chunks) is chunks:
                raise TypeError(
                    f"x{_where(rank)}: a one-shot iterator ({type(chunks).__name__}) can be "
                    "read once, but the recipe reads its rows several times; pass a "
                    "re-iterable (a DataLoader, a list) or a callable that returns a fresh "
                    "iterator, e.g. lambda: make_chunks()"
                )
            self._open = lambda: iter(chunks)
        else:
            raise TypeError(
                f"x{_where(rank)} must be a tensor, an array, a re-iterable of (x, y) chunks or "
                f"a callable returning an iterator of them, got {type(chunks).__name__}"
            )
        self.num_rows = 0
        self.input_dim, self.target_shape, self.dtype = 0, (), torch.float64
        like = None
        for x, y in self._raw():
            if like is None:
                like = (x.shape[1], tuple(y.shape[1:]), x.dtype)
            self.num_rows += x.shape[0]
        if like is None:
            raise ValueError(f"x{_where(rank)}: the chunks hold no rows; pass at least one row")
        self.input_dim, self.target_shape, self.dtype = like

    def _raw(self) -> Iterator[Pair]:
        """The source's own chunks, checked, with the running row count."""
        start, like = 0, (self._like() if self.num_rows else None)
        for index, item in enumerate(self._open()):
            if not isinstance(item, (tuple, list)) or len(item) != 2:
                raise ValueError(
                    f"x{_where(self.rank)}: chunk {index} must be an (x, y) pair, got "
                    f"{type(item).__name__}"
                )
            x, y = check_chunk(item[0], item[1], start, self.rank, like)
            like = like or (x.shape[1], tuple(y.shape[1:]), x.dtype)
            start += x.shape[0]
            if x.shape[0]:
                yield x, y
        if self.num_rows and start != self.num_rows:
            raise RuntimeError(
                f"x{_where(self.rank)}: the chunks held {self.num_rows} rows in the first pass "
                f"and {start} now; a source must give the same rows every time it is iterated"
            )

    def _like(self) -> Tuple[int, Tuple[int, ...], torch.dtype]:
        return self.input_dim, self.target_shape, self.dtype

    def take(self, rows: Tensor) -> Pair:
        rows = torch.as_tensor(rows, dtype=torch.int64).reshape(-1)
        ordered, back = rows.sort()
        xs, ys, start, at = [], [], 0, 0
        for x, y in self._raw():
            stop = start + x.shape[0]
            end = int(torch.searchsorted(ordered, stop))
            if end > at:
                local = ordered[at:end] - start
                xs.append(x[local])
                ys.append(y[local])
                at = end
            start = stop
            if at == ordered.numel():
                break
        x = torch.cat(xs) if xs else torch.empty(0, self.input_dim, dtype=self.dtype)
        y = torch.cat(ys) if ys else torch.empty((0,) + self.target_shape, dtype=self.dtype)
        place = torch.empty_like(back)
        place[back] = torch.arange(back.numel())
        return x[place], y[place]

    def chunks(self, rows_per_chunk: int = DEFAULT_CHUNK_ROWS) -> Iterator[Pair]:
        # Re-cut to rows_per_chunk rows, so that a pass sums over the same chunks as one over
        # the same rows held in an array (and its sums round alike).
        held_x: List[Tensor] = []
        held_y: List[Tensor] = []
        count = 0
        for x, y in self._raw():
            held_x.append(x)
            held_y.append(y)
            count += x.shape[0]
            while count >= rows_per_chunk:
                x_all, y_all = torch.cat(held_x), torch.cat(held_y)
                yield x_all[:rows_per_chunk], y_all[:rows_per_chunk]
                held_x, held_y = [x_all[rows_per_chunk:]], [y_all[rows_per_chunk:]]
                count -= rows_per_chunk
        if count:
            yield torch.cat(held_x), torch.cat(held_y)


def gather_checked(work: Callable[[], Any], process_group: Any = None) -> List[Any]:
    """``work()`` on every process of the group, its results gathered in rank order; where it
    raised on any process, every process raises (the error of the lowest failing rank, its
    message prefixed with the rank) instead of leaving the others waiting in a collective.

    Collective: every process must call it, in the same order as its other collectives.
    """
    import torch.distributed as dist

    failure: Optional[BaseException] = None
    try:
        payload: Tuple[Any, Any] = (None, work())
    except Exception as error:  # reported to every rank below
        failure = error
        payload = ((type(error), str(error)), None)
    parts: List[Any] = [None] * dist.get_world_size(process_group)
    dist.all_gather_object(parts, payload, group=process_group)
    for rank, (error, _) in enumerate(parts):
        if error is not None:
            kind, message = error
            if not issubclass(kind, (ValueError, TypeError, RuntimeError)):
                kind = RuntimeError
            raise kind(f"rank {rank} failed: {message}") from failure
    return [part[1] for part in parts]


def all_reduce_sum(tensor: Tensor, process_group: Any = None) -> Tensor:
    """The sum of ``tensor`` over the group's processes, on ``tensor``'s device: reduced on
    this process's GPU where the backend is NCCL (which reduces CUDA tensors only)."""
    import torch.distributed as dist

    if dist.get_backend(process_group) == "nccl" and tensor.device.type != "cuda":
        moved = tensor.to(torch.device("cuda", torch.cuda.current_device()))
        dist.all_reduce(moved, group=process_group)
        return moved.to(tensor.device)
    dist.all_reduce(tensor, group=process_group)
    return tensor


class ShardedSource(DataSource):
    """This process's shard of rows spread over ``torch.distributed`` processes.

    Global row ids follow rank order: rank ``r``'s local row ``i`` is ``offset_r + i``. The
    shards' row counts, input columns, target shapes and dtypes are all-gathered and must
    agree (an empty shard, a column count or dtype that differs: a ``ValueError`` on every
    rank that names the ranks).

    Args:
        local: a callable that returns this process's rows (any other :class:`DataSource`);
            called inside a check, so that an error building one shard is raised on every
            rank.
        process_group: the ``torch.distributed`` group (``None``: the default group).

    Collective: every process of the group must construct it, and call :meth:`take` with
    the same rows, together.
    """

    def __init__(self, local: Callable[[], DataSource], process_group: Any = None) -> None:
        import torch.distributed as dist

        self.group = process_group
        self.rank = dist.get_rank(process_group)
        self.world = dist.get_world_size(process_group)
        built: List[DataSource] = []

        def layout() -> tuple:
            built.append(local())
            shard = built[0]
            return shard.num_rows, shard.input_dim, shard.target_shape, str(shard.dtype)

        layouts = gather_checked(layout, process_group)
        self.localsource = built[0]
        rows = [layout[0] for layout in layouts]
        empty = [r for r, n in enumerate(rows) if n == 0]
        if empty:
            raise ValueError(f"x: the shard of rank {empty[0]} holds no rows; every process "
                             "must hold at least one row")
        first = layouts[0][1:]
        for r, layout in enumerate(layouts):
            if layout[1:] != first:
                raise ValueError(
                    f"x: rank {r} holds {layout[1]} input columns and targets "
                    f"{layout[2] or '(N,)'} in {layout[3]}, but rank 0 holds {first[0]} and "
                    f"{first[1] or '(N,)'} in {first[2]}; every shard must have one layout"
                )
        self.offsets = [sum(rows[:r]) for r in range(self.world + 1)]
        self.num_rows, self.input_dim = self.offsets[-1], self.localsource.input_dim
        self.target_shape, self.dtype = self.localsource.target_shape, self.localsource.dtype

    def take(self, rows: Tensor) -> Pair:

        rows = torch.as_tensor(rows, dtype=torch.int64).reshape(-1)
        start, stop = self.offsets[self.rank], self.offsets[self.rank + 1]
        mine = ((rows >= start) & (rows < stop)).nonzero().reshape(-1)
        width = self.input_dim + math.prod(self.target_shape)
        buffer = torch.zeros(rows.numel(), width, dtype=self.dtype)

        def read() -> None:
            if mine.numel():
                x, y = self.localsource.take(rows[mine] - start)
                buffer[mine] = torch.cat([x, y.reshape(mine.numel(), -1)], 1)

        gather_checked(read, self.group)
        # Each row is non-zero on one rank only: the sum is that rank's row, exactly.
        buffer = all_reduce_sum(buffer, self.group)
        x, y = buffer[:, :self.input_dim], buffer[:, self.input_dim:]
        return x.contiguous(), y.reshape((rows.numel(),) + self.target_shape).contiguous()

    def chunks(self, rows_per_chunk: int = DEFAULT_CHUNK_ROWS) -> Iterator[Pair]:
        return self.localsource.chunks(rows_per_chunk)


def as_source(x: Any, y: Any, rank: Optional[int] = None) -> DataSource:
    """The :class:`DataSource` of ``fit_auto``'s ``(x, y)``: arrays and tensors with their
    targets (:class:`ArraySource`), or chunks with ``y=None`` (:class:`ChunkSource`)."""
    if isinstance(x, (np.ndarray, Tensor)):
        if y is None:
            raise ValueError(f"y{_where(rank)} must be given with array inputs x, got None")
        return ArraySource(x, y, rank)
    if y is not None:
        raise ValueError(
            f"y{_where(rank)} must be None when x is a source of (x, y) chunks (the chunks hold "
            f"the targets), got {type(y).__name__}"
        )
    return ChunkSource(x, rank)


@dataclass
class SourceMoments:
    """What the recipes' units need of every row, from :func:`source_moments`.

    Attributes:
        num_rows: ``N``.
        column_scale: ``(d,)`` each input column's standard deviation (1 for a constant
            column or one row), in the source's dtype, on the CPU.
        target_rms: the root mean square of ``y`` over every entry (float64, computed without
            squaring ``y`` itself, so at any magnitude a float64 holds).
    """

    num_rows: int
    column_scale: Tensor
    target_rms: float


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

    def moments() -> Tuple[int, Tensor, Tensor, float]:
        count, mean, m2 = 0, torch.zeros(d, dtype=torch.float64), torch.zeros(
            d, dtype=torch.float64)
        squares = 0.0
        for x, y in source.chunks(rows_per_chunk):
            z = x.to(torch.float64) / unit_x.to(x.device)
            centre = z.mean(0)
            count, mean, m2 = _merge(count, mean, m2, z.shape[0], centre.cpu(),
                                     (z - centre).square().sum(0).cpu())
            squares += float((y.to(torch.float64) / unit_y).square().sum())
        return count, mean, m2, squares

    parts = gather_checked(moments, source.group) if sharded else [moments()]
    count, mean, m2 = 0, torch.zeros(d, dtype=torch.float64), torch.zeros(d, dtype=torch.float64)
    for n_r, mean_r, m2_r, _ in parts:
        count, mean, m2 = _merge(count, mean, m2, n_r, mean_r, m2_r)
    squares = sum(part[3] for part in parts)
    if count > 1:
        scale = (m2 / (count - 1)).sqrt() * unit_x
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    else:
        scale = torch.ones(d, dtype=torch.float64)
    entries = count * max(1, math.prod(source.target_shape))
    rms = unit_y * math.sqrt(squares / entries)
    # Rounded to MOMENT_BITS significant bits: the association of the sums (the chunks, the
    # processes) changes their last bits, and the search's start, on which the path of its
    # optimiser depends, must not change with it.
    return SourceMoments(count, _round_bits(scale).to(source.dtype),
                         float(_round_bits(torch.tensor(rms, dtype=torch.float64))))


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


class ScaledTargets(DataSource):
    """A source whose targets are ``(y - offset) / scale`` (per column) of another's.

    Example:
        >>> src = ScaledTargets(ArraySource(np.zeros((2, 1)), np.array([1.0, 3.0])), 2.0, 1.0)
        >>> src.take(torch.tensor([1, 0]))[1]
        tensor([ 1., -1.], dtype=torch.float64)
    """

    def __init__(self, inner: DataSource, offset: Any, scale: Any) -> None:
        self.inner = inner
        self.num_rows, self.input_dim = inner.num_rows, inner.input_dim
        self.target_shape, self.dtype = inner.target_shape, inner.dtype
        self.offset = torch.as_tensor(offset, dtype=torch.float64)
        self.scale = torch.as_tensor(scale, dtype=torch.float64)

    def _scaled(self, pair: Pair) -> Pair:
        x, y = pair
        return x, ((y.to(torch.float64) - self.offset) / self.scale).to(y.dtype)

    def take(self, rows: Tensor) -> Pair:
        return self._scaled(self.inner.take(rows))

    def chunks(self, rows_per_chunk: int = DEFAULT_CHUNK_ROWS) -> Iterator[Pair]:
        return (self._scaled(pair) for pair in self.inner.chunks(rows_per_chunk))


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
