r"""From data to a solver: validation of batches, chunked statistics, the choice of solver.

:class:`SolverFactory` turns ``(x, y, noise)`` batches into a
:class:`~rfgp.inference._solvers.Solver`: the ``N x N`` function-space solver when it is cheaper
by operation count (``N^2 D + N^3/3 < N D^2 + D^3/3``), else the weight-space solver, whose
statistics :math:`\Phi^H S^{-1}\Phi` are accumulated over row chunks so the ``N x D`` feature
matrix never exists. Every large buffer is checked against the device's memory first. With
``solve="cg"`` (or ``"auto"`` when the ``D x D`` matrices would not fit in memory) it builds the
matrix-free :class:`~rfgp.inference._cg_solver.ConjugateGradientSolver`, which keeps the batches.

Internal: not part of the public API (see :mod:`rfgp.inference`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, List, Optional, Tuple, Union

import torch
from torch import Tensor

from rfgp._data import DataSource, ShardedSource, centred_source
from rfgp._ops import power_of_two_scale
from rfgp.inference._cg_rows import RowsFit
from rfgp.inference._cg_solver import ConjugateGradientSolver
from rfgp.inference._feature_map import FeatureMap
from rfgp.inference._feature_operator import DataBatch, FeatureOperator, SourceRows
from rfgp.inference._iterative import CGSettings
from rfgp.inference._linalg import available_memory, check_memory
from rfgp.inference._noise import (
    NoiseLayout,
    expand_noise,
    model_noise_rows,
    targets_as_rows,
)
from rfgp.inference._nystrom import NystromPreconditioner
from rfgp.inference._prior_mean import add_mean_rows
from rfgp.inference._solvers import FunctionSpaceSolver, Solver, WeightSpaceSolver
from rfgp.inference._statistics import FeatureStatistics

__all__ = ["Prepared", "SolverFactory", "agreed_scale", "check_stream_batch", "unpack_batch"]

# Rows per chunk aim at this many feature entries: large enough for efficient GEMMs, small
# enough that a chunk of features stays a few tens of MB.
CHUNK_ENTRIES = 1 << 22

#: a validated batch: ``x (N, d)``, targets ``(R, T)``, noise ``(R, T)`` or ``None``, ``y.dim()``
Prepared = Tuple[Tensor, Tensor, Optional[Tensor], int]


@dataclass
class SolverFactory:
    """Builds solvers for one model's settings.

    Args:
        feature_map: the kernel adapter.
        solve: ``"auto"``, ``"weight"``, ``"function"`` or ``"cg"``.
        complex_solve: solve with complex features (else their real form).
        jitter: first Cholesky jitter.
        chunk_size: default rows per chunk (``None``: about ``4 * 10^6 / D``).
        statistics_dtype: dtype of the statistics (``None``: that of the features).
        cg: settings of the iterative solve.
        prior_mean: the model's constant prior mean (``None``: zero), subtracted from every
            batch's targets (:func:`~rfgp.inference._prior_mean.mean_rows`).
    """

    feature_map: FeatureMap
    solve: str
    complex_solve: bool
    jitter: Optional[float]
    chunk_size: Optional[int]
    statistics_dtype: Optional[torch.dtype]
    cg: CGSettings = field(default_factory=CGSettings)
    prior_mean: Optional[Tensor] = None

    def default_chunk(self, entries: int = CHUNK_ENTRIES) -> int:
        """The rows of a chunk: the model's ``chunk_size``, else as many as hold ``entries``
        feature values (at least 256)."""
        if self.chunk_size is not None:
            return self.chunk_size
        width = self.feature_map.num_real_features * self.feature_map.outputs_per_input
        return max(256, entries // max(1, width))

    def stats_dtype(self, feature_dtype: torch.dtype) -> torch.dtype:
        return self.statistics_dtype or feature_dtype

    # ------------------------------------------------------------------ batches
    def prepare(self, x: Any, y: Any, noise: Any, model_noise: Tensor) -> Prepared:
        """Validate a batch; a model noise that varies over rows is laid out as row noise."""
        x = self.feature_map.check_input(x, "x")
        if x.shape[0] == 0:
            raise ValueError("x must hold at least one row, got 0")
        p = self.feature_map.outputs_per_input
        rows_y, y_ndim = targets_as_rows(y, x.shape[0], p)
        rows_y = rows_y.to(device=x.device, dtype=x.dtype)
        rows_y = add_mean_rows(rows_y, self.prior_mean, p, sign=-1.0)
        if noise is not None:
            rows_noise = expand_noise(noise, x.shape[0], rows_y.shape[1], p)
        elif NoiseLayout.model_noise_varies_over_rows(model_noise, p):
            rows_noise = model_noise_rows(model_noise, x.shape[0], rows_y.shape[1], p)
        else:
            rows_noise = None
        if rows_noise is not None:
            rows_noise = rows_noise.to(device=x.device, dtype=x.dtype)
            if not bool(torch.isfinite(rows_noise).all()) or bool((rows_noise <= 0).any()):
                raise ValueError(
                    f"noise is not representable in {x.dtype} (it over- or underflows); "
                    "rescale the targets (the noise scales with their square) or use float64"
                )
        return x, rows_y, rows_noise, y_ndim

    def new_layout(self, first: Prepared, fixed: bool, model_noise: Tensor) -> NoiseLayout:
        p = self.feature_map.outputs_per_input
        frozen = None
        if not fixed and NoiseLayout.model_noise_varies_over_rows(model_noise, p):
            frozen = model_noise.detach().clone()
        return NoiseLayout(first[1].shape[1], first[3], p, fixed, frozen)

    # ------------------------------------------------------------------ solvers
    def use_function_space(self, rows: int, like: Tensor) -> bool:
        """Whether the ``N x N`` solve is chosen for ``rows`` rows: ``solve="function"``, or
        ``"auto"`` when it costs fewer operations than the weight-space solve and its memory
        (the training features and ``K + S`` with its factor, on ``like``'s device) fits;
        otherwise ``"auto"`` goes on to the weight-space or iterative solve."""
        if self.solve != "auto":
            return self.solve == "function"
        fm = self.feature_map
        width = fm.num_features if self.complex_solve else fm.num_real_features
        if not rows**2 * width + rows**3 / 3 < rows * width**2 + width**3 / 3:
            return False
        entries = rows * fm.outputs_per_input
        item = torch.empty((), dtype=self.stats_dtype(like.dtype)).element_size()
        needed = (entries * fm.num_real_features + 2 * entries**2) * item
        return like.device.type not in ("cpu", "cuda") or needed <= available_memory(like.device)

    def use_iterative(self, like: Tensor) -> bool:
        """Whether the iterative solve is chosen: ``solve="cg"``, or ``"auto"`` when the
        ``D x D`` Gram, ``B`` and its factor would not fit in the memory of ``like``'s device."""
        if self.solve != "auto":
            return self.solve == "cg"
        width = self.feature_map.num_real_features
        dtype = self.stats_dtype(like.dtype)
        needed = 3 * width * width * torch.empty((), dtype=dtype).element_size()
        return like.device.type in ("cpu", "cuda") and needed > available_memory(like.device)

    def iterative_solver(self, data: Union[List[DataBatch], SourceRows], scale: float,
                         chunk: Optional[int], distributed: bool, process_group: Any,
                         num_rows: Optional[int] = None) -> ConjugateGradientSolver:
        """The matrix-free solver on the kept batches (see :meth:`kept`) or a source's rows
        (``num_rows``: all processes' rows, where known)."""
        dtype = data.dtype if isinstance(data, SourceRows) else data[0][1].dtype
        operator = FeatureOperator(self.feature_map, data, self.complex_solve, dtype,
                                   chunk or self.default_chunk(),
                                   self.cg.cache_bytes, process_group, distributed)
        return ConjugateGradientSolver(operator, self.cg, self.complex_solve, self.jitter, scale,
                                       num_rows)

    def source(self, source: DataSource, like: Tuple[Tensor, Tensor], model_noise: Tensor,
               reuse: Any = None) -> Tuple[Solver, NoiseLayout, Tensor]:
        """The iterative solver on every row of ``source`` (the model noise; the rows are read
        at every product, never held), its noise layout and ``like``'s checked ``x``. ``like``:
        ``(x, y)`` of a row or more as the source holds them, for the layout and any lazily
        drawn weights; ``reuse``: a :class:`NystromPreconditioner` of the fit's ``B``. For a
        :class:`~rfgp._data.ShardedSource` rank 0's random weights are broadcast first and
        the products all-reduced."""
        fm = self.feature_map
        if fm.needs_allocation:
            raise ValueError(
                f"{type(fm.base).__name__} needs a data-dependent allocation, which rows read "
                "from a source do not give; call kernel.allocate(x_sample) on a sample first"
            )
        prepared = self.prepare(like[0][:1], like[1][:1], None, model_noise=model_noise)
        if fm.outputs_per_input != 1 or prepared[2] is not None:
            raise ValueError(
                "a fit on rows from a source needs one output per input and a noise that does "
                f"not vary over rows, got {fm.outputs_per_input} outputs per input"
                + (" and a noise per row" if prepared[2] is not None else "")
            )
        distributed = isinstance(source, ShardedSource)
        group = source.group if distributed else None
        if distributed:
            fm.share_random_weights(prepared[0], group)
        with torch.no_grad():
            fm.real_rows(prepared[0])  # draws any lazily sampled weights before the fingerprint
        if self.prior_mean is not None and bool(self.prior_mean.any()):
            source = centred_source(source, self.prior_mean)  # read less the mean, per pass
        rows = SourceRows(source, self.stats_dtype(prepared[0].dtype))
        scale = agreed_scale(power_of_two_scale(torch.tensor(rows.largest_target())),
                             prepared[0], distributed, group)
        rows.target_scale = scale
        solver = self.iterative_solver(rows, scale, None, distributed, group, source.num_rows)
        if isinstance(reuse, NystromPreconditioner):
            solver.given_preconditioner = reuse
        return solver, self.new_layout(prepared, False, model_noise), prepared[0]

    def kept(self, batch: Prepared, scale: float) -> DataBatch:
        """A batch as the iterative solver keeps it: its own copy of the inputs (every later
        product reads them, so a caller's in-place change must not reach the posterior)."""
        x, rows_y, rows_noise, _ = batch
        dtype = self.stats_dtype(x.dtype)
        noise = None if rows_noise is None else rows_noise.detach().to(dtype).clone()
        return x.detach().clone(), rows_y.detach().to(dtype) / scale, noise

    def new_statistics(self, num_columns: int, weighted: bool, like: Tensor) -> FeatureStatistics:
        return FeatureStatistics(self.feature_map.num_real_features, num_columns, weighted,
                                 self.stats_dtype(like.dtype), like.device)

    def accumulate(self, stats: FeatureStatistics, batch: Prepared, scale: float,
                   chunk: Optional[int] = None) -> None:
        """Add a batch's rows (targets divided by ``scale``) chunk by chunk."""
        x, rows_y, rows_noise, _ = batch
        p = self.feature_map.outputs_per_input
        step = chunk or self.default_chunk()
        check_memory((step * p, self.feature_map.num_real_features), x.dtype, x.device,
                     "a chunk of features", "pass a smaller chunk_size")
        with torch.no_grad():
            for start in range(0, x.shape[0], step):
                stop = min(start + step, x.shape[0])
                z = self.feature_map.real_rows(x[start:stop])
                rows = slice(start * p, stop * p)
                noise = None if rows_noise is None else rows_noise[rows]
                stats.add(z, rows_y[rows] / scale, noise)

    def function_solver(self, prepared: List[Prepared], scale: float) -> FunctionSpaceSolver:
        x = torch.cat([b[0] for b in prepared])
        fm = self.feature_map
        check_memory((x.shape[0] * fm.outputs_per_input, fm.num_real_features), x.dtype,
                     x.device, "the training features of the function-space solve",
                     "use solve='cg' (matrix-free: memory O(N d + chunk D)), or solve='weight' "
                     "(memory O(D^2)) where the D x D matrices fit")
        with torch.no_grad():
            rows = fm.rows(x)
        targets = torch.cat([b[1] for b in prepared]).to(self.stats_dtype(x.dtype)) / scale
        noise = None if prepared[0][2] is None else torch.cat([b[2] for b in prepared])
        return FunctionSpaceSolver(rows, targets, noise, self.complex_solve, self.jitter, scale)

    def weight_solver(self, stats: FeatureStatistics, scale: float) -> WeightSpaceSolver:
        return WeightSpaceSolver(stats, self.complex_solve, self.jitter, scale)

    def given_statistics(self, prepared: List[Prepared], scale: float,
                         products: Tuple[Tensor, Tensor]) -> FeatureStatistics:
        """The statistics of homoscedastic batches from products computed elsewhere:
        ``(Z^T Z, Z^T Y)`` of the real-form features and the targets as given."""
        gram, rhs = products
        width, p = self.feature_map.num_real_features, self.feature_map.outputs_per_input
        targets = torch.cat([b[1] for b in prepared])
        if (p != 1 or prepared[0][2] is not None or gram.shape != (width, width)
                or rhs.shape != (width, targets.shape[1])):
            raise ValueError(
                f"products must be (Z^T Z, Z^T Y) of shapes ({width}, {width}) and "
                f"({width}, {targets.shape[1]}) for one output per input and the model noise, "
                f"got {tuple(gram.shape)} and {tuple(rhs.shape)}"
            )
        # One row's features draw any lazily sampled weights, as a pass over the rows would,
        # before the fit records the kernel's fingerprint.
        with torch.no_grad():
            self.feature_map.real_rows(prepared[0][0][:1])
        stats = self.new_statistics(targets.shape[1], False, prepared[0][0])
        stats.grams[0] = gram.to(device=stats.device, dtype=stats.dtype).clone()
        stats.rhs = (rhs / scale).to(device=stats.device, dtype=stats.dtype)
        stats.yy = (targets.to(stats.dtype) / scale).square().sum(0)
        stats.count = targets.shape[0]
        return stats

    def build(self, prepared: List[Prepared], scale: float, chunk: Optional[int],
              distributed: bool, process_group: Any, reuse: Any = None) -> Solver:
        """The cheaper solver for the batches (always weight space when distributed).

        ``reuse``: what the caller already computed for this fit. A weight-space solver takes
        products ``(Z^T Z, Z^T Y)`` (see :meth:`given_statistics`) instead of a pass over the
        rows; an iterative one takes a :class:`NystromPreconditioner` of its ``B`` as its
        first preconditioner instead of a sketch, or a calibration's rows' Gram matrix
        (:class:`~rfgp.inference._cg_rows.RowsFit`) to solve through instead of by CG."""
        rows = sum(b[1].shape[0] for b in prepared)
        if not distributed and self.use_function_space(rows, prepared[0][0]):
            return self.function_solver(prepared, scale)
        if self.use_iterative(prepared[0][0]):
            data = [self.kept(b, scale) for b in prepared]
            solver = self.iterative_solver(data, scale, chunk, distributed, process_group)
            if isinstance(reuse, NystromPreconditioner):
                solver.given_preconditioner = reuse
            elif isinstance(reuse, RowsFit):
                solver.given_rows = reuse
            return solver
        if isinstance(reuse, tuple) and not distributed:
            return self.weight_solver(self.given_statistics(prepared, scale, reuse), scale)
        stats = self.new_statistics(prepared[0][1].shape[1], prepared[0][2] is not None,
                                    prepared[0][0])
        for batch in prepared:
            self.accumulate(stats, batch, scale, chunk)
        if distributed:
            stats.all_reduce(process_group)
        return self.weight_solver(stats, scale)

    # ------------------------------------------------------------------ whole fits
    def fit(self, batches: List[Tuple[Any, Any, Any]], model_noise: Tensor, chunk: Optional[int],
            distributed: bool, process_group: Any, reallocate: bool = False,
            reuse: Any = None) -> Tuple[Solver, NoiseLayout, Tensor]:
        """A solver for ``(x, y, noise)`` batches (the kernel allocated on all of them first if
        it needs an allocation, or ``reallocate``), its noise layout and the first batch's
        checked ``x``."""
        prepared = [self.prepare(*b, model_noise=model_noise) for b in batches]
        fm = self.feature_map
        if fm.needs_allocation or reallocate:
            if distributed:
                raise RuntimeError(
                    f"{type(fm.base).__name__} needs a data-dependent allocation; call "
                    "kernel.allocate(x) on the same data in every process before a distributed fit"
                )
            fm.allocate(torch.cat([b[0] for b in prepared]))
        if distributed:
            fm.share_random_weights(prepared[0][0], process_group)
        layout = self.new_layout(prepared[0], batches[0][2] is not None, model_noise)
        for index, (_, rows_y, _, ndim) in enumerate(prepared[1:]):
            layout.check_batch(rows_y, ndim, batches[index + 1][2] is not None, "update")
        scale = agreed_scale(power_of_two_scale(torch.cat([b[1] for b in prepared])),
                             prepared[0][1], distributed, process_group)
        solver = self.build(prepared, scale, chunk, distributed, process_group, reuse)
        return solver, layout, prepared[0][0]

    def stream(self, batches: Iterable[Any], model_noise: Tensor, distributed: bool,
               process_group: Any) -> Tuple[Solver, NoiseLayout, Tensor]:
        """A weight-space solver for batches that arrive one by one (see ``fit_stream``); the
        iterative solver keeps the batches instead (it needs them at every product)."""
        stats = first = layout = None
        held: List[DataBatch] = []
        for index, batch in enumerate(batches):
            prepared = self.prepare(*unpack_batch(batch, index), model_noise=model_noise)
            if first is None:
                first = prepared[0]
                layout = self._start_stream(prepared, len(batch) == 3, model_noise, distributed,
                                            process_group)
                scale = agreed_scale(power_of_two_scale(prepared[1]), prepared[1], distributed,
                                     process_group)
                if not self.use_iterative(first):
                    stats = self.new_statistics(layout.num_columns, prepared[2] is not None,
                                                first)
            else:
                check_stream_batch(first, prepared, batch, layout, index)
            if stats is None:
                held.append(self.kept(prepared, scale))
            else:
                self.accumulate(stats, prepared, scale)
        if first is None:
            raise ValueError("batches must yield at least one (x, y) batch, got none")
        if stats is None:
            solver = self.iterative_solver(held, scale, None, distributed, process_group)
            return solver, layout, first
        if distributed:
            stats.all_reduce(process_group)
        return self.weight_solver(stats, scale), layout, first

    def _start_stream(self, prepared: Prepared, fixed: bool, model_noise: Tensor,
                      distributed: bool, process_group: Any) -> NoiseLayout:
        fm = self.feature_map
        if fm.needs_allocation:
            raise ValueError(
                f"fit_stream: {type(fm.base).__name__} needs a data-dependent allocation, which "
                "one batch cannot give as fit would on all the data; call "
                "kernel.allocate(x_sample) on a representative sample first"
            )
        if distributed:
            fm.share_random_weights(prepared[0], process_group)
        return self.new_layout(prepared, fixed, model_noise)

    def extend(self, solver: Solver, prepared: Prepared, distributed: bool,
               process_group: Any) -> Solver:
        """``solver`` conditioned on one more batch (``update``); a function-space solver
        becomes a weight-space one once that is cheaper (or when distributed)."""
        x, rows_y, rows_noise, _ = prepared
        scale = solver.target_scale
        if isinstance(solver, ConjugateGradientSolver):
            # A new solver on all batches: an update fails without touching the fitted one.
            data = solver.operator.data + [self.kept(prepared, scale)]
            grown = self.iterative_solver(data, scale, solver.operator.chunk, distributed,
                                          process_group)
            grown.mean_weights = solver.mean_weights  # the start of its solve
            return grown
        if isinstance(solver, FunctionSpaceSolver) and not distributed:
            with torch.no_grad():
                rows = self.feature_map.rows(x)
            solver.add_rows(rows, rows_y.to(solver.dtype) / scale, rows_noise)
            if self.use_function_space(solver.num_rows, x):
                return solver
            return solver.to_weight_space(self.stats_dtype(x.dtype))
        if isinstance(solver, FunctionSpaceSolver):
            solver = solver.to_weight_space(self.stats_dtype(x.dtype))
        stats = self.new_statistics(rows_y.shape[1], rows_noise is not None, x)
        self.accumulate(stats, prepared, scale)
        if distributed:
            stats.all_reduce(process_group)
        solver.stats.merge(stats)
        return solver


def agreed_scale(scale: float, like: Tensor, distributed: bool, process_group: Any) -> float:
    """The target scale of a fit: the largest of the processes' scales when distributed.

    Each process divides its targets by the scale before its statistics are summed with the
    others', so all must divide by the same power of two (the largest keeps every process's
    squared sums finite)."""
    if not distributed:
        return scale
    import torch.distributed as dist

    value = torch.tensor([scale], dtype=torch.float64, device=like.device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX, group=process_group)
    return float(value)


def unpack_batch(batch: Any, index: int) -> Tuple[Any, Any, Any]:
    """``(x, y, noise)`` of one ``fit_stream`` batch (``noise`` ``None`` for pairs)."""
    if not isinstance(batch, (tuple, list)) or len(batch) not in (2, 3):
        raise ValueError(
            f"batches must yield (x, y) or (x, y, noise) tuples; batch {index} is "
            f"{type(batch).__name__}"
            + (f" of length {len(batch)}" if isinstance(batch, (tuple, list)) else "")
        )
    return batch[0], batch[1], (batch[2] if len(batch) == 3 else None)


def check_stream_batch(first: Tensor, prepared: Prepared, batch, layout: NoiseLayout,
                       index: int) -> None:
    """A later ``fit_stream`` batch must match the first one's dtype, device and layout."""
    x, rows_y, _, y_ndim = prepared
    if x.dtype != first.dtype or x.device != first.device:
        raise ValueError(
            f"fit_stream: batch {index} has dtype {x.dtype} on {x.device} but the first batch "
            f"has {first.dtype} on {first.device}; give all batches one dtype and device"
        )
    layout.check_batch(rows_y, y_ndim, len(batch) == 3, f"fit_stream (batch {index})")
