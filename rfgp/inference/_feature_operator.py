r"""Products with :math:`B = \Phi^H S^{-1}\Phi + I` by passes over row chunks, never forming
``B`` or the ``N x D`` feature matrix: :class:`FeatureOperator`, what every iterative solve of
the package (the CG fit, the Krylov calibration, the Nyström sketch) multiplies with.

A product with a ``(W, k)`` block is one pass over the rows,
:math:`B V = \sum_c \Phi_c^H (S_c^{-1} (\Phi_c V)) + V`, each chunk's features recomputed from
its inputs (or kept up to ``cache_bytes``), in memory :math:`O(\mathrm{chunk} \cdot D + D k)`.
The rows are training batches held in memory, or :class:`SourceRows`: the rows of a
:class:`~rfgp._data.DataSource` (a memory-map, chunks, a process's shard), read from it at
every pass, so that a fit on rows that do not fit in memory costs one pass over them per
product. Under ``torch.distributed`` each process passes over its own rows and the products
are all-reduced.

Internal: not part of the public API (see :mod:`rfgp.inference`).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from rfgp._data import DEFAULT_CHUNK_ROWS, DataSource, ShardedSource, gather_checked
from rfgp._ops import add_adjoint_product_, adjoint_sum
from rfgp.inference._feature_map import FeatureMap
from rfgp.inference._noise import equal_noise_columns
from rfgp.inference._statistics import accumulate_gram, mirror_upper_
from rfgp.kernels._base import real_form

__all__ = ["Chunk", "DataBatch", "FeatureOperator", "SourceRows", "complex_of"]

#: a batch as the solver keeps it: inputs ``(N, d)``, targets ``(R, T)`` divided by the target
#: scale, fixed row noise ``(R, T)`` or ``None``
DataBatch = Tuple[Tensor, Tensor, Optional[Tensor]]
#: one chunk: features ``(n, W)`` in the solver's form, targets ``(n, T)``, row noise or None
Chunk = Tuple[Tensor, Tensor, Optional[Tensor]]


def complex_of(dtype: torch.dtype) -> torch.dtype:
    return torch.complex128 if dtype == torch.float64 else torch.complex64


class SourceRows:
    r"""The rows of a :class:`~rfgp._data.DataSource` as :class:`FeatureOperator` reads them:
    an iterable of ``(x, targets, None)`` batches, read from the source at every pass, never
    held whole.

    Each batch is a chunk of :data:`~rfgp._data.DEFAULT_CHUNK_ROWS` rows (the chunks an
    in-memory operator cuts the same rows into): inputs ``x / x_unit`` in the source's dtype,
    targets ``y / (y_unit * target_scale)`` as ``(n, T)`` columns in ``dtype``. For a
    :class:`~rfgp._data.ShardedSource` they are this process's rows, and :meth:`run` runs a
    pass so that an error on one process (a failing read) is raised on every process instead
    of leaving the others waiting in the pass's all-reduce.

    Args:
        source: the rows.
        dtype: the targets' dtype (the operator's).
        x_unit: divides the inputs (a power of two per column keeps them exact).
        y_unit, target_scale: divide the targets (powers of two: exact); ``target_scale`` may
            be set once the targets' size is known (:meth:`largest_target`).

    Example:
        >>> from rfgp._data import ArraySource
        >>> rows = SourceRows(ArraySource(torch.zeros(5000, 2), torch.ones(5000)), torch.float64)
        >>> [(tuple(x.shape), tuple(t.shape)) for x, t, _ in rows]
        [((4096, 2), (4096, 1)), ((904, 2), (904, 1))]
    """

    def __init__(self, source: DataSource, dtype: torch.dtype, x_unit: Any = 1.0,
                 y_unit: float = 1.0, target_scale: float = 1.0) -> None:
        self.source = source
        self.dtype = dtype
        self.device = torch.device("cpu")
        self.x_unit, self.y_unit, self.target_scale = x_unit, y_unit, target_scale
        self.num_columns = max(1, math.prod(source.target_shape))
        local = source.localsource if isinstance(source, ShardedSource) else source
        #: this process's rows
        self.num_rows = local.num_rows

    def __iter__(self) -> Iterator[DataBatch]:
        for x, y in self.source.chunks(DEFAULT_CHUNK_ROWS):
            targets = (y / self.y_unit).reshape(x.shape[0], self.num_columns).to(self.dtype)
            yield ((x / self.x_unit).to(self.device),
                   (targets / self.target_scale).to(self.device), None)

    def run(self, work: Callable[[], Any]) -> Any:
        """``work()`` (a pass over the rows), checked on every process for a shard."""
        if isinstance(self.source, ShardedSource):
            return gather_checked(work, self.source.group)[self.source.rank]
        return work()

    def largest_target(self) -> float:
        """The largest ``|y| / y_unit`` over this process's rows (a pass over the targets)."""
        def largest() -> float:
            return max(float((y / self.y_unit).abs().max()) for _, y in self.source.chunks())

        return self.run(largest)

    def to(self, device: torch.device, dtype: torch.dtype) -> None:
        """Read the rows onto ``device``, the targets in ``dtype``, from now on."""
        self.device, self.dtype = device, dtype


class FeatureOperator:
    r"""Products with :math:`B = \Phi^H S^{-1}\Phi + I` over row chunks of the training data.

    Args:
        feature_map: the kernel adapter (features recomputed from the inputs).
        data: the training batches, or :class:`SourceRows` (read at every pass, never
            cached: ``cache_bytes`` is then 0).
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

    def __init__(self, feature_map: Optional[FeatureMap], data: Union[List[DataBatch], SourceRows],
                 complex_solve: bool, dtype: torch.dtype, chunk: int, cache_bytes: int,
                 process_group=None, distributed: bool = False) -> None:
        self.feature_map = feature_map
        self.data = data
        self.complex_solve = complex_solve
        self.dtype = dtype
        self.chunk = chunk
        self.cache_bytes = 0 if isinstance(data, SourceRows) else cache_bytes
        self.process_group = process_group
        self.distributed = distributed
        #: set on a distributed or source fit loaded from a checkpoint: not all rows are here
        self.detached = False
        #: the model noise per target column ``(T,)``; ``None`` when the noise is fixed per row
        self.column_noise: Optional[Tensor] = None
        self._cache: Dict[Tuple[int, int], Tensor] = {}
        self._cached = 0
        # One feature buffer for the chunks of a pass that are not cached (see _features).
        self._workspace: Optional[Tensor] = None

    # ------------------------------------------------------------------ layout
    @property
    def vector_dtype(self) -> torch.dtype:
        return complex_of(self.dtype) if self.complex_solve else self.dtype

    @property
    def width(self) -> int:
        fm = self.feature_map
        return fm.num_features if self.complex_solve else fm.num_real_features

    @property
    def streamed(self) -> bool:
        """Whether the rows are read from a data source at every pass (:class:`SourceRows`)."""
        return isinstance(self.data, SourceRows)

    @property
    def device(self) -> torch.device:
        return self.data.device if self.streamed else self.data[0][1].device

    @property
    def num_columns(self) -> int:
        return self.data.num_columns if self.streamed else self.data[0][1].shape[1]

    @property
    def num_rows(self) -> int:
        """Rows of targets (this process's, when distributed)."""
        if self.streamed:
            return self.data.num_rows
        return sum(int(targets.shape[0]) for _, targets, _ in self.data)

    @property
    def fixed_noise(self) -> bool:
        return not self.streamed and self.data[0][2] is not None

    def real_view(self) -> FeatureOperator:
        """The same data with real-form features (the evidence's matrix)."""
        view = FeatureOperator(self.feature_map, self.data, False, self.dtype, self.chunk,
                               self.cache_bytes, self.process_group, self.distributed)
        view.column_noise, view.detached = self.column_noise, self.detached
        return view

    def clear_cache(self) -> None:
        self._cache, self._cached = {}, 0

    # ------------------------------------------------------------------ passes
    def chunks(self, fresh: bool = False) -> Iterator[Chunk]:
        """The training chunks with their features (computed or cached). A chunk's features
        that are not cached are computed into one buffer shared by the pass, valid until the
        next chunk's; with ``fresh`` into storage of their own, which a caller may hold."""
        if self.detached:
            raise RuntimeError(
                "this solve='cg' fit was loaded from a checkpoint without its training rows (a "
                "fit distributed over processes keeps one process's rows, a fit on a data "
                "source none), so variances, samples and the evidence (which need products "
                "with all rows) are unavailable; predict means, or fit again"
            )
        p = self.feature_map.outputs_per_input
        feature_dtype = self.feature_map.reference().dtype
        for index, (x, targets, noise) in enumerate(self.data):
            for start in range(0, x.shape[0], self.chunk):
                stop = min(start + self.chunk, x.shape[0])
                rows = slice(start * p, stop * p)
                feats = self._features(index, start, x[start:stop].to(feature_dtype), fresh)
                yield feats, targets[rows], None if noise is None else noise[rows]

    def _features(self, index: int, start: int, x: Tensor, fresh: bool = False) -> Tensor:
        cached = self._cache.get((index, start))
        if cached is not None:
            return cached.to(self.vector_dtype)
        fm = self.feature_map
        size = x.shape[0] * fm.outputs_per_input * fm.num_real_features * x.element_size()
        keep = self._cached + size <= self.cache_bytes
        with torch.no_grad():
            if keep or fresh or fm.is_complex or fm.outputs_per_input != 1:
                rows = fm.rows(x)
            else:
                # A chunk dropped after use is written into the pass's buffer: a fresh N x D
                # block per chunk is handed back to the operating system at every free and
                # faulted in again page by page, which cost as much as the features.
                rows = fm.rows_into(x, self._buffer(x))
        features = rows if self.complex_solve else real_form(rows)
        if keep:
            self._cache[(index, start)] = features
            self._cached += size
        return features.to(self.vector_dtype)

    def _buffer(self, x: Tensor) -> Tensor:
        """The pass's ``(n, D)`` feature buffer for ``x``'s ``n`` rows (kept until the pass ends:
        :meth:`run`)."""
        width = self.feature_map.num_real_features
        held = self._workspace
        if (held is None or held.shape[0] < x.shape[0] or held.dtype != x.dtype
                or held.device != x.device):
            held = self._workspace = x.new_empty(max(self.chunk, x.shape[0]), width)
        return held[:x.shape[0]]

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
        # (k, W): the adjoint of the sum, in the product's fast form (rfgp._ops)
        acc = torch.zeros(k, self.width, dtype=self.vector_dtype, device=self.device)

        def local_pass() -> None:
            for feats, targets, noise in self.chunks():
                add_adjoint_product_(acc, feats, values(targets, noise).to(acc.dtype))

        self.run(local_pass)
        return self.reduce(adjoint_sum(acc))

    def gram(self, v: Tensor, columns: Sequence[int]) -> Tensor:
        r""":math:`(B - I) V = \Phi^H S^{-1} \Phi V`, column ``j`` with the noise of target
        column ``columns[j]``."""
        index = torch.as_tensor(list(columns), dtype=torch.long, device=self.device)
        # Both halves in the row-major form a CPU's BLAS streams (rfgp._ops: 1.1 to 2 times
        # faster for Phi V, 2 to 7 times for Phi^H W, with a few columns): (Phi V)^T as
        # V^T Phi^T, and the adjoint of the sum, W^H Phi, accumulated as (k, W).
        vt = v.transpose(0, 1).contiguous()
        acc = torch.zeros_like(vt)

        def local_pass() -> None:
            for feats, _, noise in self.chunks():
                inverse = self.inverse_noise(noise, index, feats.shape[0]).transpose(0, 1)
                weighted = (vt @ feats.transpose(0, 1)) * inverse  # (k, n): (S^-1 Phi V)^T
                add_adjoint_product_(acc, feats, weighted.transpose(0, 1))

        self.run(local_pass)
        return self.reduce(adjoint_sum(acc))

    def dense(self, column: int) -> Tensor:
        r"""``(W, W)`` :math:`B = \Phi^H S^{-1} \Phi + I` with the noise of target ``column``,
        formed in one pass (reduced over processes): ``W^2`` numbers, which the caller has
        checked against the memory."""
        index = torch.tensor([column], dtype=torch.long, device=self.device)
        out = torch.zeros(self.width, self.width, dtype=self.vector_dtype, device=self.device)
        # Real features: the upper block triangle alone, 5/8 of the multiply-adds, mirrored
        # once after the sum (the matrix's own storage, no second W x W copy).
        upper = not out.is_complex()

        def local_pass() -> None:
            for feats, _, noise in self.chunks():
                inverse = self.inverse_noise(noise, index, feats.shape[0])
                if upper:
                    accumulate_gram(out, feats, inverse[:, 0])
                else:
                    out.addmm_(feats.transpose(0, 1).conj(), feats * inverse)

        self.run(local_pass)
        out = self.reduce(out)
        if upper:
            mirror_upper_(out)
        out.diagonal().add_(1.0)
        return out

    def holds_all(self) -> bool:
        """Whether every chunk's features are kept (:attr:`cache_bytes`), so that a pass
        recomputes none: the rows' own form of ``B`` (:meth:`row_matrix`) pairs every chunk
        with every other, which is only cheap over kept features. Never on a data source, a
        detached fit or rows sharded over processes."""
        if self.streamed or self.detached or self.distributed:
            return False
        chunks = sum(math.ceil(x.shape[0] / self.chunk) for x, _, _ in self.data)
        return chunks > 0 and len(self._cache) == chunks

    def _row_weights(self, column: int, fresh: bool = False) -> Iterator[Tuple[Tensor, Tensor]]:
        """Per chunk, lazily: its features and :math:`s_i^{-1/2}` ``(n,)`` for target
        ``column`` (``fresh``: as in :meth:`chunks`)."""
        index = torch.tensor([column], dtype=torch.long, device=self.device)
        for feats, _, noise in self.chunks(fresh):
            yield feats, self.inverse_noise(noise, index, feats.shape[0])[:, 0].sqrt()

    def row_matrix(self, column: int) -> Tensor:
        r"""``(N, N)`` :math:`K = I + \Psi\Psi^H`, :math:`\Psi = S^{-1/2}\Phi` with the noise
        of target ``column``: the rows' form of :math:`B = I + \Psi^H\Psi` (the same
        eigenvalues but for the ones). Formed block by block (the caller has checked its
        ``N^2`` numbers against the memory), in :math:`N^2 W / 2` multiply-adds: a block
        below the diagonal is mirrored. Features that are not kept are computed again for
        each block row, about ``C / 2`` times for ``C`` chunks (a fraction
        :math:`C (d + 4) / N` of the products), so that at most two chunks' are held beside
        the kept ones.

        Example:
            >>> from rfgp.kernels import FourierFeatureKernel
            >>> fm = FeatureMap(FourierFeatureKernel(8, seed=0).double())
            >>> x = torch.rand(10, 2, dtype=torch.float64)
            >>> noise = torch.full((10, 1), 0.5, dtype=torch.float64)
            >>> op = FeatureOperator(fm, [(x, torch.zeros(10, 1, dtype=torch.float64), noise)],
            ...                      False, torch.float64, chunk=4, cache_bytes=1 << 20)
            >>> phi = fm.rows(x)
            >>> _ = op.dense(0)  # a pass keeps the features
            >>> k = torch.eye(10, dtype=torch.float64) + phi @ phi.T / 0.5
            >>> op.holds_all(), torch.allclose(op.row_matrix(0), k)
            (True, True)
        """
        n = self.num_rows
        out = torch.empty(n, n, dtype=self.vector_dtype, device=self.device)
        top = 0
        for fi, wi in self._row_weights(column, fresh=True):
            rows_i = slice(top, top + fi.shape[0])
            left = 0
            for fj, wj in self._row_weights(column):
                if left > top:
                    break
                rows_j = slice(left, left + fj.shape[0])
                block = (fi @ fj.transpose(0, 1).conj()) * wi.unsqueeze(1) * wj.unsqueeze(0)
                out[rows_i, rows_j] = block
                if left < top:
                    out[rows_j, rows_i] = block.transpose(0, 1).conj()
                left += fj.shape[0]
            top += fi.shape[0]
        out.diagonal().add_(1.0)
        return out

    def row_products(self, rows: Tensor, column: int) -> Tensor:
        r"""``(N, M)`` :math:`\Psi Q^H` for query rows ``Q`` ``(M, W)`` (differentiable in
        them), :math:`\Psi` as in :meth:`row_matrix`, in ``rows``' dtype."""
        q = rows.transpose(0, 1).conj()
        # each chunk's product before the next chunk's features (a shared buffer where not kept)
        return torch.cat([(feats.to(rows.dtype) @ q) * w.to(q.real.dtype).unsqueeze(1)
                          for feats, w in self._row_weights(column)])

    def preconditioned_trace(self, column: int, basis: Tensor,
                             weights: Tensor) -> Tuple[float, float]:
        r"""``(t, m)``: :math:`t = \sum_i s_i^{-1} \phi_i (I - U\,\mathrm{diag}(w)\,U^H)
        \phi_i^H` and :math:`m = \sum_i s_i^{-1} \|\phi_i\|^2` over every row (reduced over
        processes), with the noise :math:`s_i` of target ``column``: for a Nyström
        preconditioner :math:`P = I + U \Lambda U^H` and :math:`w = \Lambda / (1 + \Lambda)`,
        :math:`t = \mathrm{tr}(P^{-1}(B - I))`, in one pass."""
        index = torch.tensor([column], dtype=torch.long, device=self.device)
        out = torch.zeros(2, dtype=torch.float64, device=self.device)
        u = basis.to(self.vector_dtype)
        w = weights.to(device=self.device, dtype=self.dtype)

        def local_pass() -> None:
            for feats, _, noise in self.chunks():
                inverse = self.inverse_noise(noise, index, feats.shape[0])[:, 0]
                norms = feats.abs().square().sum(-1) if feats.is_complex() else (
                    feats.square().sum(-1))
                held = (feats @ u).abs().square() @ w if u.shape[1] else torch.zeros_like(norms)
                out[0] += ((norms - held) * inverse).sum().to(out.dtype)
                out[1] += (norms * inverse).sum().to(out.dtype)

        self.run(local_pass)
        out = self.reduce(out)
        return float(out[0]), float(out[1])

    def run(self, local_pass: Callable[[], None]) -> None:
        """One pass over this process's rows (over a shard of a source, checked on every
        process: see :meth:`SourceRows.run`)."""
        try:
            if self.streamed and self.distributed:
                self.data.run(local_pass)
            else:
                local_pass()
        finally:
            self._workspace = None

    def apply(self, v: Tensor, columns: Sequence[int]) -> Tensor:
        """:math:`B V` (see :meth:`gram`)."""
        return self.gram(v, columns) + v

    def total(self, tensor: Tensor) -> Tensor:
        """A row sum over all processes."""
        return self.reduce(tensor.clone())

    def target_squares(self) -> Tensor:
        """``(T,)`` each target column's sum of squares over every row (of every process)."""
        out = torch.zeros(self.num_columns, dtype=self.dtype, device=self.device)

        def local_pass() -> None:
            for _, targets, _ in self.data:
                out.add_(targets.to(self.dtype).square().sum(0))

        self.run(local_pass)
        return self.reduce(out)

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

