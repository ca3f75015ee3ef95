r"""``RandomFeatureGP``: exact GP inference with a random-feature kernel (the public façade).

For features :math:`\Phi(X) \in \mathbb{C}^{N \times D}` (rows :math:`\Phi(x_i)^\top`), real
targets :math:`y` and a diagonal noise :math:`S`, the GP with kernel
:math:`\hat k(x, x') = \Phi(x)^\top \overline{\Phi(x')}` has the posterior (Appendix D of
Wacker, Kanagawa & Filippone, Eqs. 88-90, with the corrected conjugation)

.. math::
    B = \Phi^H S^{-1} \Phi + I_D, \qquad
    \mu(x) = \mathrm{Re}\{\Phi(x)^\top B^{-1} \Phi^H S^{-1} y\}, \qquad
    k_N(x, x') = \mathrm{Re}\{\Phi(x)^\top B^{-1} \overline{\Phi(x')}\}.

The work is done by the solvers (:mod:`~rfgp.inference._solvers`, the iterative
:mod:`~rfgp.inference._cg_solver`), the chunked statistics and the noise layouts.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, List, Optional, Sequence, Tuple, Union

import torch
from gpytorch.kernels import Kernel
from torch import Tensor

from rfgp._data import DataSource
from rfgp._validation import (
    check_bool,
    check_choice,
    check_int,
    check_real,
)
from rfgp.inference._feature_map import FeatureMap
from rfgp.inference._fit_state import Batch, FitState, StaleFitError
from rfgp.inference._fitting import SolverFactory
from rfgp.inference._iterative import CGSettings
from rfgp.inference._linalg import robust_cholesky
from rfgp.inference._model_selection import ModelSelection
from rfgp.inference._noise import (
    NoiseLayout,
    check_model_noise,
    check_noise_usable,
    column_noise,
)
from rfgp.inference._prediction import Prediction
from rfgp.inference._prior_mean import check_prior_mean
from rfgp.inference._selection import ConvergenceWarning
from rfgp.inference._solvers import Solver
from rfgp.kernels._base import RandomFeatureKernel
from rfgp.kernels._composition import feature_kernel

__all__ = ["ConvergenceWarning", "RandomFeatureGP", "StaleFitError", "robust_cholesky"]

_SOLVES = ("auto", "weight", "function", "cg")
_STATISTICS_DTYPES = (None, torch.float32, torch.float64)


class RandomFeatureGP(ModelSelection, Prediction, torch.nn.Module):
    r"""Gaussian-process regression with a random-feature kernel, solved in weight space.

    The model is :math:`y_{it} = m_t + f_t(x_i) + \varepsilon_{it}`, :math:`\varepsilon_{it}
    \sim N(0, \sigma_{it}^2)`, with independent outputs :math:`f_t \sim GP(0, \hat k)` and a
    known constant prior mean :math:`m_t` (``prior_mean``, zero by default): the fit conditions
    on :math:`y - m`, and every mean, posterior and sample path adds :math:`m` back. With
    :math:`B = \Phi^H S^{-1} \Phi + I`:
    :math:`\mu(x) = m + \mathrm{Re}\{\Phi(x)^\top B^{-1} \Phi^H S^{-1} (y - m)\}`,
    :math:`\mathrm{Cov}(x, x') = \mathrm{Re}\{\Phi(x)^\top B^{-1} \overline{\Phi(x')}\}`.

    Complex features use this complex posterior; ``complex_posterior=False`` uses the real GP
    with kernel :math:`\mathrm{Re}\,\hat k` (features :math:`[\mathrm{Re}\,\Phi,
    \mathrm{Im}\,\Phi]`, what GPyTorch computes). ``fit`` accumulates :math:`\Phi^H S^{-1}\Phi`
    over row chunks (memory ``O(D^2 + chunk D)``), or with ``solve="auto"`` uses the ``N x N``
    solve when cheaper. Outputs of equal noise share one factorisation. ``y`` is ``(N,)``,
    ``(N, T)`` or ``(N, p)`` (``p`` outputs per input, interleaved rows); a noise given to
    ``fit`` is fixed, else the model noise :attr:`noise` is used and may change after fitting.

    **Never stale**: a fit records every parameter and buffer of the kernel's module tree, the
    noise, the dtype and the device; every use checks them. With the training data held (after
    ``fit``) a change triggers a refit on first use; otherwise (``fit_stream``, a loaded
    checkpoint) :class:`StaleFitError` names what changed. A new model noise only refactorises.
    **Dtypes**: the fit follows ``x``'s dtype, queries are cast to it, ``.to()`` moves the
    fitted posterior; ``statistics_dtype=torch.float64`` accumulates and factorises in float64
    while features stay in the kernel's dtype. **Checkpoints**: ``state_dict()`` holds the
    fitted posterior (``O(D^2)``, not the data; ``solve="cg"``: weights and data, ``O(N d)``).

    Args:
        kernel: a :class:`~rfgp.kernels.RandomFeatureKernel`, a ``ScaleKernel`` around one, or
            a sum / product tree of them (``+``, ``*``, ``ScaleKernel``), which
            :func:`~rfgp.kernels.as_feature_kernel` turns into one feature map sharing the
            tree's parameters (:attr:`kernel` is then that
            :class:`~rfgp.kernels.ComposedFeatureKernel`).
        noise: model noise variance: a positive scalar or one value per output.
        complex_posterior: complex posterior (default) or the real form, for complex features.
        solve: ``"auto"``, ``"weight"`` (``D x D``), ``"function"`` (``N x N``) or ``"cg"``
            (matrix-free conjugate gradients; ``"auto"``
            takes it when the ``D x D`` matrices would not fit in memory).
        jitter: value added to the diagonal before the first Cholesky (default none).
        correct_variance: add ``kernel.variance_correction(x)`` (times the outputscale) to the
            predictive variance, when the kernel defines it.
        chunk_size: rows per chunk (default: about ``4 * 10^6 / D`` rows).
        statistics_dtype: dtype of the statistics and factorisations (default: the data's).
        cg_tolerance, max_cg_iterations, preconditioner_rank, cache_bytes: the iterative solve's
            settings (relative residual, default ``1e-6``
            in float64, and the bound on the mean's error in posterior standard deviations;
            iterations; Nyström rank, ``None`` automatic; bytes of cached features).
        cg_variance, cg_variance_tolerance, cg_variance_rank: the iterative solve's predictive
            variances: ``"lowrank"`` from a low-rank form of :math:`B^{-1}` built at
            the first variance after a fit, each variance within ``cg_variance_tolerance``
            of the exact one, relatively (rank doubled up to ``cg_variance_rank`` until a
            probabilistic bound says so: the form's variances are upper bounds within the
            bound, served as they are where it meets the tolerance and scaled into it where
            it is at most about twice the tolerance; beyond that, each query refined by CG
            preconditioned with the form); ``"auto"`` (default) the same, except that
            where refining the rows asked for would cost more than forming and factorising
            :math:`B` (and ``B`` fits in a quarter of the memory), the exact variances from
            its Cholesky factor, kept for later queries; or ``"exact"`` (one CG solve per
            query row).

    Attributes:
        noise (Tensor): the model noise variance (a buffer; assignable).
        num_data (int): number of rows the posterior is conditioned on.
        solve_used (str): ``"weight"``, ``"function"`` or ``"cg"`` after fitting.

    Example:
        >>> from rfgp.kernels import FourierFeatureKernel
        >>> g = torch.Generator().manual_seed(0)
        >>> x = torch.rand(200, 2, generator=g, dtype=torch.float64)
        >>> y = torch.sin(6 * x[:, 0]) + 0.1 * torch.randn(200, generator=g, dtype=torch.float64)
        >>> gp = RandomFeatureGP(FourierFeatureKernel(256, seed=0), noise=0.01).fit(x, y)
        >>> mean, std = gp.predict(x[:5], return_std=True)
        >>> bool((mean - y[:5]).abs().max() < 0.5), mean.shape, std.shape
        (True, torch.Size([5]), torch.Size([5]))

    References:
        Wacker, Kanagawa, Filippone, *Improved Random Features for Dot Product Kernels*,
        Appendix D, 2022. Rasmussen & Williams, *Gaussian Processes for Machine Learning*,
        Sec. 2.1, 2006.
    """

    def __init__(
        self,
        kernel: Kernel,
        noise: Union[float, Tensor] = 1.0,
        complex_posterior: bool = True,
        solve: str = "auto",
        jitter: Optional[float] = None,
        correct_variance: bool = False,
        chunk_size: Optional[int] = None,
        statistics_dtype: Optional[torch.dtype] = None,
        *, cg_tolerance: Optional[float] = None, max_cg_iterations: int = 1000,
        preconditioner_rank: Optional[int] = None, cache_bytes: int = 1 << 30,
        cg_variance: str = "auto", cg_variance_tolerance: float = 1e-2,
        cg_variance_rank: int = 2048, prior_mean: Union[float, Tensor] = 0.0,
    ) -> None:
        super().__init__()
        # Sums and products of feature kernels become one feature map here, once, so that the
        # fit, its fingerprint and the sample paths all hold the same composed kernel.
        kernel = feature_kernel(kernel)
        FeatureMap(kernel)  # validates the kernel before anything is registered
        self.solve = check_choice("solve", solve, _SOLVES)
        self.complex_posterior = check_bool("complex_posterior", complex_posterior)
        self.jitter = None if jitter is None else check_real("jitter", jitter, low=0.0)
        self.correct_variance = bool(correct_variance)
        self.chunk_size = None if chunk_size is None else check_int("chunk_size", chunk_size)
        self.statistics_dtype = check_choice("statistics_dtype", statistics_dtype,
                                             _STATISTICS_DTYPES)
        self.cg_settings = CGSettings(cg_tolerance, max_cg_iterations, preconditioner_rank,
                                      cache_bytes, variance=cg_variance,
                                      variance_tolerance=cg_variance_tolerance,
                                      variance_rank=cg_variance_rank)
        self.kernel = kernel
        self.register_buffer("noise", check_model_noise(noise))
        self.register_buffer("prior_mean", check_prior_mean(prior_mean))
        self._state: Optional[FitState] = None

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "noise" and "_buffers" in self.__dict__ and "noise" in self._buffers:
            value = check_model_noise(value)
        if name == "prior_mean" and "_buffers" in self.__dict__ and "prior_mean" in self._buffers:
            value = check_prior_mean(value).to(self._buffers["prior_mean"].device)
        if name == "kernel" and isinstance(value, Kernel):
            value = feature_kernel(value)  # a reassigned kernel tree, as at construction
        super().__setattr__(name, value)

    # ================================================================== properties
    @property
    def feature_map(self) -> FeatureMap:
        """The kernel as the solvers see it (built from :attr:`kernel` at every use, so a
        reassigned kernel is seen too)."""
        return FeatureMap(self.kernel)

    @property
    def base_kernel(self) -> RandomFeatureKernel:
        """The :class:`RandomFeatureKernel` (inside the ``ScaleKernel``, if any)."""
        return self.feature_map.base

    @property
    def outputs_per_input(self) -> int:
        """``p``: outputs per input of the kernel (1 for scalar kernels)."""
        return self.feature_map.outputs_per_input

    @property
    def is_fitted(self) -> bool:
        return self._state is not None

    @property
    def dtype(self) -> Optional[torch.dtype]:
        """The dtype of the fitted features; queries are cast to it (``None`` before a fit)."""
        return None if self._state is None else self._state.feature_dtype

    @property
    def solve_used(self) -> Optional[str]:
        return None if self._state is None else self._state.solver.name

    @property
    def cg_info(self) -> Optional[dict]:
        """Of a ``solve="cg"`` fit: ``{"iterations": ..., "preconditioner_ranks": [...],
        "variance_ranks": [...], "variance_bounds": [...], "variance_routes": [...]}``, the CG
        iterations of the last solve for the mean weights, the Nyström rank of each noise
        group's preconditioner, the rank and relative excess bound :math:`\tau` of each
        group's low-rank variances (``None`` until the first variance, and for a group whose
        variances went to the dense factor without a form), and the route each
        group's last variances took: ``"lowrank"`` (the form alone, :math:`\tau` within the
        tolerance: every variance within ``[exact, (1 + tau) exact]``), ``"refined"`` (CG per
        row to ``[exact, (1 + tolerance) exact]``), ``"dense"`` (a Cholesky factor of ``B``,
        formed where it costs less than refining the rows asked for), ``"exact"`` (one CG
        per row) or ``None``; ``None`` for the other solves or before a fit.

        Example:
            >>> from rfgp.kernels import FourierFeatureKernel
            >>> x = torch.rand(100, 1, dtype=torch.float64)
            >>> gp = RandomFeatureGP(FourierFeatureKernel(64, seed=0).double(), noise=0.1,
            ...                      solve="cg").fit(x, torch.sin(6 * x[:, 0]))
            >>> sorted(gp.cg_info)  # doctest: +NORMALIZE_WHITESPACE
            ['iterations', 'preconditioner_ranks', 'variance_bounds', 'variance_ranks',
             'variance_routes']
        """
        if self._state is None or self._state.solver.name != "cg":
            return None
        solver = self._state.solver
        low_rank, groups = solver.routes.low_rank, range(len(solver.preconditioners))
        return {"iterations": solver.iterations,
                "preconditioner_ranks": [p.rank for p in solver.preconditioners],
                "variance_ranks": [low_rank[g].rank if g in low_rank else None for g in groups]
                if low_rank else None,
                "variance_bounds": [low_rank[g].bound if g in low_rank else None
                                    for g in groups] if low_rank else None,
                "variance_routes": [solver.variance_routes.get(g)
                                    for g in range(len(solver.preconditioners))]}

    @property
    def num_data(self) -> int:
        return 0 if self._state is None else self._state.solver.num_rows // self.outputs_per_input

    @property
    def holds_training_data(self) -> bool:
        """Whether the model keeps (references to) its training data, so it can refit itself
        when the kernel changes (after :meth:`fit`; not after :meth:`fit_stream` or loading)."""
        return self._state is not None and self._state.held is not None

    @property
    def factorization_groups(self) -> List[List[int]]:
        """Output columns sharing one factorisation (equal noise), after fitting."""
        return self._current("factorization_groups").solver.groups()

    # ================================================================== data layout
    @staticmethod
    def _check_chunk_size(chunk_size: Optional[int]) -> Optional[int]:
        return None if chunk_size is None else check_int("chunk_size", chunk_size)

    @property
    def _complex_solve(self) -> bool:
        return self.feature_map.is_complex and self.complex_posterior

    @property
    def _factory(self) -> SolverFactory:
        return SolverFactory(self.feature_map, self.solve, self._complex_solve, self.jitter,
                             self.chunk_size, self.statistics_dtype, self.cg_settings,
                             self.prior_mean)

    def _query(self, x: Any, name: str = "x") -> Tensor:
        """A query cast to the dtype of the fit (on its device)."""
        x = self.feature_map.check_input(x, name)
        state = self._state
        if x.device != state.device:
            raise ValueError(
                f"{name} is on {x.device} but the fitted model is on {state.device}; move x or "
                "the model (gp.to(device))"
            )
        return x.to(state.feature_dtype)

    def _column_noise(self, layout: NoiseLayout) -> Optional[Tensor]:
        return column_noise(self.noise, layout.num_columns) if layout.uses_model_noise else None

    # ================================================================== fitting
    def _fit_batches(self, batches: List[Batch], chunk: Optional[int], distributed: bool = False,
                     process_group: Any = None, reallocate: bool = False,
                     allocated: bool = False, reuse: Any = None) -> RandomFeatureGP:
        """Fit on batches (``fit``, a refit on held data): nothing changes if it fails.
        ``reallocate``: allocate the kernel on these rows again; ``allocated``: an earlier fit
        allocated it on them; ``reuse``: what the caller already computed for this fit (see
        ``SolverFactory.build``)."""
        allocated = allocated or reallocate or self.feature_map.needs_allocation
        solver, layout, x0 = self._factory.fit(batches, self.noise, chunk, distributed,
                                               process_group, reallocate, reuse)
        self._install(solver, layout, x0, None if distributed else list(batches), chunk,
                      allocated)
        return self

    def _fit_sums(self, x: Tensor, y: Tensor, gram: Tensor, rhs: Tensor, squares: Tensor,
                  count: int) -> RandomFeatureGP:
        r"""Fit (weight space, model noise) from sums over rows that are not passed:
        :math:`Z^\top Z`, :math:`Z^\top Y`, each target column's :math:`y_t^\top y_t` and the
        row count. ``(x, y)``: a row (or more) as a fit would read them, for the layout, the
        dtype and any lazily drawn weights (they are not added). Nothing is held for a
        refit."""
        factory = self._factory
        prepared = factory.prepare(x, y, None, model_noise=self.noise)
        layout = factory.new_layout(prepared, False, self.noise)
        with torch.no_grad():
            factory.feature_map.real_rows(prepared[0])
        largest = float(squares.max().sqrt())
        # A power of two near the targets' size: dividing by it is exact, and keeps the
        # solve's sums of squares finite.
        scale = 2.0 ** math.floor(math.log2(largest)) if largest > 0 else 1.0
        stats = factory.new_statistics(rhs.shape[1], False, prepared[0])
        stats.grams[0] = gram.to(device=stats.device, dtype=stats.dtype)
        stats.rhs = (rhs / scale).to(device=stats.device, dtype=stats.dtype)
        stats.yy = (squares / scale**2).to(device=stats.device, dtype=stats.dtype)
        stats.count = count
        self._install(factory.weight_solver(stats, scale), layout, prepared[0], None, None)
        return self

    def _fit_source(self, source: DataSource, like: Tuple[Tensor, Tensor],
                    reuse: Any = None) -> RandomFeatureGP:
        """Fit by CG (the model noise) on every row of a data source, read at every product
        (``SolverFactory.source``): memory ``O(chunk D + D (r + T))``, one pass over the rows
        per CG iteration, summed over the processes of a ``ShardedSource``. Nothing is held
        for a refit."""
        solver, layout, x0 = self._factory.source(source, like, self.noise, reuse)
        self._install(solver, layout, x0, None, None)
        return self

    def _install(self, solver: Solver, layout: NoiseLayout, x: Tensor, held: Optional[List[Batch]],
                 chunk: Optional[int], allocated_by_fit: bool = False) -> None:
        """Factorise and make ``solver`` the fit (only once everything has succeeded)."""
        check_noise_usable(self.noise, solver.dtype)
        solver.factorise(self._column_noise(layout))
        self._state = FitState(
            solver=solver, layout=layout, fingerprint=self.feature_map.fingerprint(),
            factor_noise=self.noise.detach().clone(), feature_dtype=x.dtype, device=x.device,
            held=held, chunk=chunk, allocated_by_fit=allocated_by_fit,
            prior_mean=self.prior_mean.detach().clone(),
        )

    def fit(self, x: Tensor, y: Tensor, noise: Optional[Union[float, Tensor]] = None, *,
            chunk_size: Optional[int] = None, distributed: bool = False,
            process_group: Any = None) -> RandomFeatureGP:
        r"""Condition on data: accumulate the statistics and factorise.

        The model keeps references to ``x``, ``y`` and ``noise`` (not copies), so that it can
        refit itself when the kernel changes (see the class docstring).

        Args:
            x: ``(N, d)`` inputs (1-D means ``d = 1``).
            y: ``(N,)`` or ``(N, T)`` targets; ``(N, p)`` for ``p`` outputs per input.
            noise: fixed noise variances; ``None`` uses the model noise :attr:`noise`.
            chunk_size: rows per chunk (default: the constructor's).
            distributed: data-parallel fit over ``torch.distributed``: every process passes its
                shard, the statistics are all-reduced, rank 0's random weights are broadcast
                first. The weight-space (or CG) solve; the data is not held for a refit.
            process_group: a ``torch.distributed`` process group (implies ``distributed``).

        Returns:
            ``self``.
        """
        chunk = self._check_chunk_size(chunk_size)
        distributed = distributed or process_group is not None
        return self._fit_batches([(x, y, noise)], chunk, distributed, process_group)

    def fit_stream(self, batches: Iterable[Sequence[Tensor]], progress: bool = False, *,
                   distributed: bool = False, process_group: Any = None,
                   total: Optional[int] = None) -> RandomFeatureGP:
        r"""Fit on data that arrive in chunks, in ``O(D^2)`` memory (weight-space solve; with
        ``solve="cg"`` the batches are kept instead, ``O(N d)``, as every product needs them).

        Each batch is ``(x, y)`` or ``(x, y, noise)`` (all batches alike, one dtype), with the
        shapes of :meth:`fit`. The statistics are summed over batches; the result equals
        ``fit`` on the concatenated data. A kernel with a data-dependent allocation
        (``needs_allocation``) must be allocated first: ``kernel.allocate(x_sample)``. The data
        is not held: after a kernel change, call ``fit_stream`` again. If it fails, an earlier
        fit stays in place.

        Args:
            batches: an iterable of ``(x, y[, noise])`` tuples (a generator, a DataLoader...).
            progress: show a ``tqdm`` progress bar.
            distributed, process_group: as in :meth:`fit` (each process streams its shard).
            total: number of batches, for the progress bar.

        Returns:
            ``self``.
        """
        if self.solve == "function":
            raise ValueError("fit_stream needs the weight-space solve; got solve='function'")
        distributed = distributed or process_group is not None
        iterator = iter(batches)
        if progress:
            from tqdm.auto import tqdm

            iterator = iter(tqdm(iterator, total=total, desc="fit_stream", unit="batch"))
        solver, layout, first = self._factory.stream(iterator, self.noise, distributed,
                                                     process_group)
        self._install(solver, layout, first, None, None)
        return self

    def update(self, x: Tensor, y: Tensor, noise: Optional[Union[float, Tensor]] = None, *,
               distributed: bool = False, process_group: Any = None) -> RandomFeatureGP:
        """Condition the fitted model on more data (equals refitting on all data).

        A kernel whose allocation the fit chose from its rows (optimised Maclaurin features not
        allocated beforehand) is allocated again on all rows and refitted, as ``fit`` on them
        would: that needs the data held (else a ``ValueError``: after ``fit_stream``, a
        distributed fit or update, or a loaded checkpoint).

        Args:
            x, y, noise: as in :meth:`fit`; the layout (outputs, noise given or not) must match.
            distributed, process_group: all-reduce the new statistics across processes.

        Returns:
            ``self``.
        """
        state = self._current("update")
        distributed = distributed or process_group is not None
        if state.must_reallocate(type(self.base_kernel).__name__, distributed):
            return self._fit_batches(state.held + [(x, y, noise)], state.chunk, reallocate=True)
        prepared = self._factory.prepare(self._query(x), y, noise, model_noise=self.noise)
        state.layout.check_batch(prepared[1], prepared[3], noise is not None, "update")
        solver = self._factory.extend(state.solver, prepared, distributed, process_group)
        held = None if state.held is None or distributed else state.held + [(x, y, noise)]
        self._install(solver, state.layout, prepared[0], held, state.chunk)
        return self

    # ================================================================== staleness
    def _current(self, what: str) -> FitState:
        """The fit, checked against the kernel and noise now: refit (data held), refactorise
        (model noise changed) or raise :class:`StaleFitError`."""
        state = self._state
        if state is None:
            raise RuntimeError(
                f"RandomFeatureGP.{what}: the model is not fitted; call fit(x, y) first"
            )
        state.solver.bind(self.feature_map)
        changes = state.changes(self.kernel, self.noise, self.prior_mean)
        if changes and state.held is not None:
            self._fit_batches(state.held, state.chunk, allocated=state.allocated_by_fit)
            return self._state
        if changes:
            raise StaleFitError(
                f"RandomFeatureGP.{what}: {'; '.join(changes)}: the kernel or noise changed "
                "since the fit, which no longer matches it, and the training data is not held "
                "(fit_stream or a loaded checkpoint); call fit (or fit_stream) again"
            )
        state.follow_model_noise(self.noise, self._column_noise(state.layout))
        return state

    def _apply(self, fn, recurse: bool = True):
        # .to(), .double(), .cuda() ...: the fitted posterior moves with the model.
        super()._apply(fn, recurse)
        state = getattr(self, "_state", None)
        if state is not None:
            probe = fn(torch.zeros((), dtype=state.feature_dtype, device=state.device))
            state.move(fn, probe.device, probe.dtype, self._factory.stats_dtype(probe.dtype))
        return self

    # ================================================================== checkpoints
    def get_extra_state(self) -> dict:
        """The fitted posterior for ``state_dict()`` (statistics, factors, layout, fingerprint;
        never the training data)."""
        return {"fitted": False} if self._state is None else self._state.to_dict()

    def set_extra_state(self, state: dict) -> None:
        self._state = FitState.from_dict(state, self._complex_solve, self.jitter)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # The model noise takes the checkpoint's shape (scalar or one value per output), so a
        # freshly built model loads any checkpoint; its values are checked at use.
        saved = state_dict.get(prefix + "noise")
        if isinstance(saved, Tensor) and saved.shape != self.noise.shape:
            self._buffers["noise"] = torch.empty_like(saved)
        mean = state_dict.get(prefix + "prior_mean")
        if mean is None:  # a checkpoint of a model without a prior mean: zero
            state_dict[prefix + "prior_mean"] = torch.zeros_like(self.prior_mean)
        elif isinstance(mean, Tensor) and mean.shape != self.prior_mean.shape:
            self._buffers["prior_mean"] = torch.empty_like(mean)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
