r"""The recipes' one seeded draw of distinct row ids, :func:`draw_rows`.

Internal: not part of the public API.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

__all__ = ["PERMUTATION_ROWS", "draw_rows"]

#: Up to this many rows a draw is a prefix of one random permutation (``8 N`` bytes); beyond
#: it, distinct ids are drawn by rejection in ``O(count)`` memory.
PERMUTATION_ROWS = 1 << 22
# Candidates per round of the rejection draw: a constant, so that a longer draw extends a
# shorter one from the same generator state.
_CANDIDATES = 1 << 16


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

