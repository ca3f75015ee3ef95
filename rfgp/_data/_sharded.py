r"""Rows spread over ``torch.distributed`` processes: :class:`ShardedSource` (one process's
shard, global row ids in rank order), the checked gather that raises one rank's error on every
rank (:func:`gather_checked`), the all-reduce that also serves NCCL (:func:`all_reduce_sum`),
and :func:`open_source`, the source of ``fit_auto``'s data.

Internal: not part of the public API.
"""

from __future__ import annotations

import copy
import math
from typing import Any, Callable, Iterator, List, Optional, Tuple

import numpy as np
import torch
from torch import Tensor

from rfgp._data._sources import (
    DEFAULT_CHUNK_ROWS,
    DataSource,
    Pair,
    ScaledTargets,
    as_source,
)

__all__ = ["ShardedSource", "all_reduce_sum", "centred_source", "gather_checked", "open_source"]


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
    try:
        for rank, (error, _) in enumerate(parts):
            if error is not None:
                kind, message = error
                if not issubclass(kind, (ValueError, TypeError, RuntimeError)):
                    kind = RuntimeError
                raise kind(f"rank {rank} failed: {message}") from failure
        return [part[1] for part in parts]
    finally:
        # This frame holds the failure, whose traceback holds this frame: a cycle that only
        # the garbage collector frees, with whatever the failed work's frames held. Freed at
        # interpreter exit, after the process group is gone, it aborts the process (gloo).
        failure = None


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


def centred_source(source: DataSource, offset: Any) -> DataSource:
    """``source`` with ``offset`` (a number, or one value per target column) subtracted from
    its targets; a :class:`ShardedSource` stays one (its shard is centred, no collective).

    Example:
        >>> from rfgp._data import ArraySource
        >>> src = centred_source(ArraySource(torch.zeros(2, 1), torch.tensor([1.0, 3.0])), 2.0)
        >>> src.take(torch.tensor([0, 1]))[1]
        tensor([-1.,  1.])
    """
    if isinstance(source, ShardedSource):
        shard = copy.copy(source)
        shard.localsource = ScaledTargets(source.localsource, offset, 1.0)
        return shard
    return ScaledTargets(source, offset, 1.0)


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
