r"""Blocks of neighbouring rows: the partition behind the recipe's local stage.

:func:`kd_blocks` cuts the rows into blocks of at most ``max_rows`` rows, each a cell of input
space, so that an evidence summed over the blocks (the kernel matrix without its cross-block
entries, :func:`rfgp.inference._evidence_search.maximize_evidence` with ``blocks``) sees every
block's rows at the data's full density, at :math:`O(\sum_b n_b^3)` per evaluation.
"""

from __future__ import annotations

from typing import List

import torch
from torch import Tensor

from rfgp._validation import check_int, check_tensor

__all__ = ["check_blocks", "kd_blocks", "kd_levels", "widest_column"]


def kd_levels(num_rows: int, max_rows: int) -> int:
    """The halvings :func:`kd_blocks` makes of ``num_rows`` rows: the smallest ``k`` with
    ``ceil(num_rows / 2^k) <= max_rows`` (``2^k`` blocks).

    Example:
        >>> kd_levels(10000, 1000), kd_levels(1000, 1000)
        (4, 0)
    """
    num_rows = check_int("num_rows", num_rows)
    max_rows = check_int("max_rows", max_rows)  # at least 1: the halving then ends
    levels = 0
    while -(-num_rows // 2**levels) > max_rows:  # ceil(n / 2^levels)
        levels += 1
    return levels


def kd_blocks(x: Tensor, max_rows: int) -> List[Tensor]:
    r"""A partition of the rows into blocks of at most ``max_rows`` neighbouring rows: halve
    the rows at the median of their widest column (largest standard deviation,
    :func:`widest_column`), and each half again, all blocks the same number of times, until
    every block is small enough (the leaves of a balanced k-d tree). A block of one row is
    kept whole, so no block is empty.

    The blocks of :func:`maximize_evidence`'s ``blocks``: each block keeps every row of its
    region of input space, so its exact evidence sees the data at their full density, at
    :math:`O(n_b^3)` per block.

    Args:
        x: ``(N, d)`` finite inputs.
        max_rows: the largest block (at least 1).

    Returns:
        Row-index tensors (``int64``, on ``x``'s device) that partition ``range(N)``, each of
        ``ceil`` or ``floor`` of :math:`N / 2^k` rows for the smallest :math:`k` that fits
        (one row where that floor is 0).

    Example:
        >>> x = torch.arange(10.0).reshape(10, 1)
        >>> [b.tolist() for b in kd_blocks(x, 3)]
        [[0, 1], [2, 3, 4], [5, 6], [7, 8, 9]]
    """
    x = check_tensor("x", x, min_dim=2, max_dim=2, non_empty=True)
    max_rows = check_int("max_rows", max_rows, minimum=1)
    n = x.shape[0]
    levels = kd_levels(n, max_rows)
    blocks = [torch.arange(n, device=x.device)]
    for _ in range(levels):
        halves = []
        for rows in blocks:
            if rows.numel() < 2:  # fewer rows than 2^levels: a single row is not halved
                halves.append(rows)
                continue
            part = x[rows]
            order = rows[torch.argsort(part[:, widest_column(part)], stable=True)]
            halves += [order[:rows.numel() // 2], order[rows.numel() // 2:]]
        blocks = halves
    # A stable, readable order: by each block's first row.
    return sorted(blocks, key=lambda rows: int(rows.min()))


def widest_column(x: Tensor) -> int:
    r"""The column of ``x (n, d)`` with the largest standard deviation, at any scale.

    Each column is divided by its largest magnitude :math:`m_j` before the deviation is taken,
    and the columns are compared by :math:`\log m_j + \log \mathrm{sd}(x_j / m_j)`: the plain
    deviation's squares overflow to ``inf`` for entries near ``1e+160`` and underflow to 0
    near ``1e-160``, which would pick the first column instead of the widest.

    Example:
        >>> x = torch.tensor([[1e200, 0.0], [2e200, 3e200]], dtype=torch.float64)
        >>> widest_column(x), widest_column(x * 1e-300)
        (1, 1)
    """
    magnitude = x.abs().amax(0)
    safe = torch.where(magnitude > 0, magnitude, torch.ones_like(magnitude))
    # a constant column: sd 0, log -inf, never the widest unless all are constant (column 0)
    spread = (x / safe).std(0, correction=0).log() + safe.log()
    return int(spread.argmax())


def check_blocks(blocks: List[Tensor], num_rows: int, device: torch.device) -> List[Tensor]:
    r"""``blocks`` as flat ``int64`` index tensors on ``device``, checked to partition
    ``range(num_rows)``: a non-empty list of non-empty tensors, each row in exactly one
    (:math:`\bigcup_b B_b = \{0, \dots, N - 1\}`, :math:`B_a \cap B_b = \emptyset`).

    Args:
        blocks: a list of row-index tensors, each ``(n_b,)`` (or a 0-d single index).
        num_rows: ``N``, the rows to partition.
        device: where the returned tensors live.

    Returns:
        The blocks, each a flat ``int64`` tensor on ``device``, in the order given.

    Raises:
        ValueError: for a tensor or an empty list instead of a non-empty list, an empty
            block, or blocks that miss or repeat a row.
        TypeError: for indices that are not ``int64``.

    Example:
        >>> [b.tolist() for b in check_blocks([torch.tensor([2, 0]), torch.tensor([1])], 3,
        ...                                   torch.device("cpu"))]
        [[2, 0], [1]]
    """
    if isinstance(blocks, Tensor) or not len(blocks):
        raise ValueError("blocks must be a non-empty list of row-index tensors")
    blocks = [check_tensor(f"blocks[{i}]", b, floating=False, finite=False, max_dim=1,
                           non_empty=True) for i, b in enumerate(blocks)]
    for i, b in enumerate(blocks):
        if b.dtype != torch.int64:
            raise TypeError(f"blocks[{i}] must hold int64 row indices, got {b.dtype}")
    blocks = [b.to(device).reshape(-1) for b in blocks]
    seen = torch.cat(blocks).sort().values
    if seen.numel() != num_rows or not bool((seen == torch.arange(num_rows,
                                                                     device=device)).all()):
        raise ValueError(f"blocks must partition the {num_rows} rows: each row in exactly one "
                         "block")
    return blocks
