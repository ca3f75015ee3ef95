r"""Query rows held in numpy arrays (memory-maps included), read a chunk at a time.

A prediction at ``M`` query rows needs their features, ``(M, D)``: for a memory-map of
millions of rows neither the features nor the rows themselves fit in memory at once.
:func:`array_row_chunks` reads ``rows_per_chunk`` rows at a time, each copied into a tensor
and checked (dtype, shape, finite values) as it is read, so that a prediction over them holds
``O(chunk * (d + D))`` numbers whatever ``M``, and a bad value is named by its row.

Internal: not part of the public API.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np
import torch
from torch import Tensor

__all__ = ["array_row_chunks"]


def array_row_chunks(x: np.ndarray, rows_per_chunk: int, name: str = "x") -> Iterator[Tensor]:
    """The rows of ``x`` (``(M, d)``, or ``(M,)`` for ``d = 1``) as tensors of at most
    ``rows_per_chunk`` rows, in order (one empty chunk for ``M = 0``).

    Args:
        x: a float32 or float64 numpy array or memory-map.
        rows_per_chunk: rows per chunk (positive).
        name: the argument's name, for the messages.

    Raises:
        TypeError: for another dtype (``x`` is not converted: an integer memory-map copied to
            floats would double in memory and hide the caller's mistake).
        ValueError: for a 0-d or 3-d array, or (when its chunk is read) a NaN or infinite
            entry, naming its row.

    Example:
        >>> x = np.arange(10.0).reshape(5, 2)
        >>> [tuple(c.shape) for c in array_row_chunks(x, 2)]
        [(2, 2), (2, 2), (1, 2)]
        >>> bad = x.copy(); bad[3, 1] = np.nan
        >>> list(array_row_chunks(bad, 2))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: x must be finite, but row 3 holds a NaN or infinite value ...
    """
    if x.dtype not in (np.float32, np.float64):
        raise TypeError(
            f"{name} must be a float32 or float64 array, got a numpy array of {x.dtype}; "
            f"convert it (e.g. {name}.astype(np.float64))"
        )
    if x.ndim not in (1, 2):
        raise ValueError(f"{name} must have shape (M, d) or (M,), got {x.shape}")
    num_rows = x.shape[0]
    for start in range(0, max(num_rows, 1), rows_per_chunk):
        chunk = torch.from_numpy(np.array(x[start:start + rows_per_chunk]))  # this chunk only
        finite = torch.isfinite(chunk if chunk.dim() == 2 else chunk.unsqueeze(-1)).all(1)
        if not bool(finite.all()):
            row = start + int((~finite).nonzero()[0, 0])
            raise ValueError(
                f"{name} must be finite, but row {row} holds a NaN or infinite value "
                f"({num_rows} rows read in chunks of {rows_per_chunk})"
            )
        yield chunk
