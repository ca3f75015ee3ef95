r"""Data sources: rows read on demand, a chunk or a few rows at a time.

:class:`DataSource` is the interface (:attr:`~DataSource.num_rows`, :meth:`~DataSource.take`,
:meth:`~DataSource.chunks`); :class:`ArraySource` reads tensors, numpy arrays and memory-maps,
:class:`ChunkSource` re-iterable ``(x, y)`` chunks, :class:`ScaledTargets` standardises
another source's targets. Every chunk is checked as it is read (:func:`check_chunk`).

Internal: not part of the public API.
"""

from __future__ import annotations

import abc
from typing import Any, Callable, Iterable, Iterator, List, Optional, Tuple

import numpy as np
import torch
from torch import Tensor

__all__ = ["DEFAULT_CHUNK_ROWS", "SOURCE_DTYPES", "ArraySource", "ChunkSource", "DataSource",
           "Pair", "ScaledTargets", "as_source", "check_chunk", "on_rank"]

#: The dtypes a source may hold (those the recipes compute in).
SOURCE_DTYPES = (torch.float32, torch.float64)
#: Rows per chunk of a pass when the caller names none.
DEFAULT_CHUNK_ROWS = 4096

Pair = Tuple[Tensor, Tensor]


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


def on_rank(rank: Optional[int]) -> str:
    return "" if rank is None else f" of rank {rank}"


def check_chunk(x: Any, y: Any, first_row: int, rank: Optional[int] = None,
                like: Optional[Tuple[int, Tuple[int, ...], torch.dtype]] = None) -> Tuple[
                    Tensor, Tensor]:
    """One chunk as tensors ``(x (n, d), y (n,) or (n, T))``, finite, float32 or float64;
    ``like`` = ``(d, target_shape, dtype)`` of the chunks before it. Errors name the global
    row ``first_row + i`` (and the rank)."""
    where = on_rank(rank)
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
        where = on_rank(rank)
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
                    f"x{on_rank(rank)}: a one-shot iterator ({type(chunks).__name__}) can be "
                    "read once, but the recipe reads its rows several times; pass a "
                    "re-iterable (a DataLoader, a list) or a callable that returns a fresh "
                    "iterator, e.g. lambda: make_chunks()"
                )
            self._open = lambda: iter(chunks)
        else:
            raise TypeError(
                f"x{on_rank(rank)} must be a tensor, an array, a re-iterable of (x, y) chunks or "
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
            raise ValueError(f"x{on_rank(rank)}: the chunks hold no rows; pass at least one row")
        self.input_dim, self.target_shape, self.dtype = like

    def _raw(self) -> Iterator[Pair]:
        """The source's own chunks, checked, with the running row count."""
        start, like = 0, (self._like() if self.num_rows else None)
        for index, item in enumerate(self._open()):
            if not isinstance(item, (tuple, list)) or len(item) != 2:
                raise ValueError(
                    f"x{on_rank(self.rank)}: chunk {index} must be an (x, y) pair, got "
                    f"{type(item).__name__}"
                )
            x, y = check_chunk(item[0], item[1], start, self.rank, like)
            like = like or (x.shape[1], tuple(y.shape[1:]), x.dtype)
            start += x.shape[0]
            if x.shape[0]:
                yield x, y
        if self.num_rows and start != self.num_rows:
            raise RuntimeError(
                f"x{on_rank(self.rank)}: the chunks held {self.num_rows} rows in the first pass "
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


def as_source(x: Any, y: Any, rank: Optional[int] = None) -> DataSource:
    """The :class:`DataSource` of ``fit_auto``'s ``(x, y)``: arrays and tensors with their
    targets (:class:`ArraySource`), or chunks with ``y=None`` (:class:`ChunkSource`)."""
    if isinstance(x, (np.ndarray, Tensor)):
        if y is None:
            raise ValueError(f"y{on_rank(rank)} must be given with array inputs x, got None")
        return ArraySource(x, y, rank)
    if y is not None:
        raise ValueError(
            f"y{on_rank(rank)} must be None when x is a source of (x, y) chunks (the chunks hold "
            f"the targets), got {type(y).__name__}"
        )
    return ChunkSource(x, rank)


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

