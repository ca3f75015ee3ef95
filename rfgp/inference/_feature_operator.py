r"""Products with :math:`B = \Phi^H S^{-1}\Phi + I` over row chunks, the matrix never formed.

:class:`FeatureOperator` holds the training batches of a matrix-free fit and applies
:math:`B V = \sum_c \Phi_c^H (S_c^{-1} (\Phi_c V)) + V` chunk by chunk, each chunk's features
recomputed from its inputs or kept up to ``cache_bytes``; under ``torch.distributed`` the sums are
all-reduced over the processes' shards. The iterative solver
(:mod:`~rfgp.inference._cg_solver`) and the Krylov calibration iterate on it.

Internal: not part of the public API (see :mod:`rfgp.inference`).
"""

from __future__ import annotations

from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from rfgp.inference._feature_map import FeatureMap
from rfgp.inference._noise import equal_noise_columns
from rfgp.kernels._base import real_form

__all__ = ["Chunk", "DataBatch", "FeatureOperator", "complex_of"]

#: a batch as the solver keeps it: inputs ``(N, d)``, targets ``(R, T)`` divided by the target
#: scale, fixed row noise ``(R, T)`` or ``None``
DataBatch = Tuple[Tensor, Tensor, Optional[Tensor]]
#: one chunk: features ``(n, W)`` in the solver's form, targets ``(n, T)``, row noise or None
Chunk = Tuple[Tensor, Tensor, Optional[Tensor]]


def complex_of(dtype: torch.dtype) -> torch.dtype:
    return torch.complex128 if dtype == torch.float64 else torch.complex64


class FeatureOperator:
    r"""Products with :math:`B = \Phi^H S^{-1}\Phi + I` over row chunks of the training data.

    Args:
        feature_map: the kernel adapter (features recomputed from the inputs).
        data: the training batches.
        complex_solve: complex features (else their real form ``[Re, Im]``).
        dtype: real dtype of the products (features are cast to it chunk by chunk).
        chunk: points per chunk.
        cache_bytes: bytes of feature chunks kept across products.
        process_group: all-reduce products over this group (``distributed``).
        distributed: whether the rows are sharded over processes.

    Example:
        >>> from rfgp.kernels import FourierFeatureKernel
        >>> fm = FeatureMap(FourierFeatureKernel(8, seed=0).double())
        >>> x = torch.rand(10, 2, dtype=torch.float64)
        >>> noise = torch.full((10, 1), 0.5, dtype=torch.float64)
        >>> op = FeatureOperator(fm, [(x, torch.zeros(10, 1, dtype=torch.float64), noise)],
        ...                      False, torch.float64, chunk=4, cache_bytes=0)
        >>> phi = fm.rows(x)
        >>> b = phi.T @ phi / 0.5 + torch.eye(8, dtype=torch.float64)  # the matrix never formed
        >>> v = torch.rand(8, 3, dtype=torch.float64)
        >>> torch.allclose(op.apply(v, [0, 0, 0]), b @ v)
        True
    """

    def __init__(self, feature_map: Optional[FeatureMap], data: List[DataBatch],
                 complex_solve: bool, dtype: torch.dtype, chunk: int, cache_bytes: int,
                 process_group=None, distributed: bool = False) -> None:
        self.feature_map = feature_map
        self.data = data
        self.complex_solve = complex_solve
        self.dtype = dtype
        self.chunk = chunk
        self.cache_bytes = cache_bytes
        self.process_group = process_group
        self.distributed = distributed
        #: set on a distributed fit loaded from a checkpoint: only this process's rows are here
        self.detached = False
        #: the model noise per target column ``(T,)``; ``None`` when the noise is fixed per row
        self.column_noise: Optional[Tensor] = None
        self._cache: Dict[Tuple[int, int], Tensor] = {}
        self._cached = 0

    # ------------------------------------------------------------------ layout
    @property
    def vector_dtype(self) -> torch.dtype:
        return complex_of(self.dtype) if self.complex_solve else self.dtype

    @property
    def width(self) -> int:
        fm = self.feature_map
        return fm.num_features if self.complex_solve else fm.num_real_features

    @property
    def device(self) -> torch.device:
        return self.data[0][1].device

    @property
    def num_columns(self) -> int:
        return self.data[0][1].shape[1]

    @property
    def num_rows(self) -> int:
        """Rows of targets held (this process's, when distributed)."""
        return sum(int(targets.shape[0]) for _, targets, _ in self.data)

    @property
    def fixed_noise(self) -> bool:
        return self.data[0][2] is not None

    def real_view(self) -> FeatureOperator:
        """The same data with real-form features (the evidence's matrix)."""
        view = FeatureOperator(self.feature_map, self.data, False, self.dtype, self.chunk,
                               self.cache_bytes, self.process_group, self.distributed)
        view.column_noise, view.detached = self.column_noise, self.detached
        return view

    def clear_cache(self) -> None:
        self._cache, self._cached = {}, 0

    # ------------------------------------------------------------------ passes
    def chunks(self) -> Iterator[Chunk]:
        """The training chunks with their features (computed or cached)."""
        if self.detached:
            raise RuntimeError(
                "this solve='cg' fit was distributed over processes and loaded from a checkpoint: "
                "it holds one process's rows only, so variances, samples and the evidence (which "
                "need products with all rows) are unavailable; predict means, or fit again"
            )
        p = self.feature_map.outputs_per_input
        feature_dtype = self.feature_map.reference().dtype
        for index, (x, targets, noise) in enumerate(self.data):
            for start in range(0, x.shape[0], self.chunk):
                stop = min(start + self.chunk, x.shape[0])
                rows = slice(start * p, stop * p)
                feats = self._features(index, start, x[start:stop].to(feature_dtype))
                yield feats, targets[rows], None if noise is None else noise[rows]

    def _features(self, index: int, start: int, x: Tensor) -> Tensor:
        cached = self._cache.get((index, start))
        if cached is None:
            with torch.no_grad():
                rows = self.feature_map.rows(x)
            cached = rows if self.complex_solve else real_form(rows)
            size = cached.numel() * cached.element_size()
            if self._cached + size <= self.cache_bytes:
                self._cache[(index, start)] = cached
                self._cached += size
        return cached.to(self.vector_dtype)

    def inverse_noise(self, noise: Optional[Tensor], columns: Tensor, num_rows: int) -> Tensor:
        """``(n, k)``: the inverse noise of target column ``columns[j]`` on the chunk's rows."""
        if noise is not None:
            return noise.to(self.dtype)[:, columns].reciprocal()
        inverse = self.column_noise.to(device=self.device, dtype=self.dtype)[columns].reciprocal()
        return inverse.unsqueeze(0).expand(num_rows, -1)

    def reduce(self, tensor: Tensor) -> Tensor:
        """Sum ``tensor`` over the processes (in place; a no-op unless distributed)."""
        if self.distributed:
            import torch.distributed as dist

            view = torch.view_as_real(tensor) if tensor.is_complex() else tensor
            dist.all_reduce(view, op=dist.ReduceOp.SUM, group=self.process_group)
        return tensor

    def project(self, values: Callable[[Tensor, Optional[Tensor]], Tensor], k: int) -> Tensor:
        r""":math:`\sum_c \Phi_c^H \mathrm{values}_c` for per-chunk ``(n, k)`` values computed
        from the chunk's targets and noise (reduced over processes)."""
        out = torch.zeros(self.width, k, dtype=self.vector_dtype, device=self.device)
        for feats, targets, noise in self.chunks():
            out.addmm_(feats.transpose(0, 1).conj(), values(targets, noise).to(out.dtype))
        return self.reduce(out)

    def gram(self, v: Tensor, columns: Sequence[int]) -> Tensor:
        r""":math:`(B - I) V = \Phi^H S^{-1} \Phi V`, column ``j`` with the noise of target
        column ``columns[j]``."""
        index = torch.as_tensor(list(columns), dtype=torch.long, device=self.device)
        out = torch.zeros_like(v)
        for feats, _, noise in self.chunks():
            weighted = (feats @ v) * self.inverse_noise(noise, index, feats.shape[0])
            out.addmm_(feats.transpose(0, 1).conj(), weighted)
        return self.reduce(out)

    def apply(self, v: Tensor, columns: Sequence[int]) -> Tensor:
        """:math:`B V` (see :meth:`gram`)."""
        return self.gram(v, columns) + v

    def total(self, tensor: Tensor) -> Tensor:
        """A row sum over all processes."""
        return self.reduce(tensor.clone())

    # ------------------------------------------------------------------ noise groups
    def noise_groups(self) -> List[List[int]]:
        """Target columns whose noise is equal on every row (of every process)."""
        if not self.fixed_noise:
            return equal_noise_columns(self.column_noise.reshape(1, -1))
        t = self.num_columns
        differ = torch.zeros(t, t, dtype=torch.float64, device=self.device)
        for _, _, noise in self.data:
            ids = torch.unique(noise.transpose(0, 1), dim=0, return_inverse=True)[1]
            differ += (ids.unsqueeze(0) != ids.unsqueeze(1)).to(differ.dtype)
        differ = self.reduce(differ).cpu() > 0
        groups, seen = [], set()
        for i in range(t):
            if i not in seen:
                members = [j for j in range(i, t) if not differ[i, j]]
                seen.update(members)
                groups.append(members)
        return groups
