r"""The iterative solver: the posterior by conjugate gradients, without a ``D x D`` matrix.

:class:`ConjugateGradientSolver` (``solve="cg"``) keeps the training inputs, targets and noise
and applies :math:`B = \Phi^H S^{-1}\Phi + I` to blocks of vectors by a pass over row chunks
(:class:`FeatureOperator`): :math:`B V = \sum_c \Phi_c^H (S_c^{-1} (\Phi_c V)) + V`, the chunk's
features recomputed from its inputs, or kept up to ``cache_bytes``. Memory is
:math:`O(N d + \mathrm{chunk}\cdot D + D (r + T))` against the weight-space solve's
:math:`O(D^2)`; every quantity is exact up to the CG tolerance:

* mean weights :math:`w = B^{-1}\Phi^H S^{-1} y` (one CG over the ``T`` target columns);
* latent variances :math:`\phi_*^\top B^{-1} \overline{\phi_*}` and covariances
  :math:`\mathrm{Re}\{\Phi_* B^{-1}\Phi_*^H\}`: by default from a low-rank form of
  :math:`B^{-1}` built once per fit, an upper bound within a stated factor
  (:mod:`~rfgp.inference._cg_variance`), refined per row by CG where that factor exceeds the
  tolerance, or from the Cholesky factor of :math:`B` where forming it costs less
  (:mod:`~rfgp.inference._cg_routes` chooses); with ``variance="exact"``, one CG over the
  query rows;
* posterior weight draws by sample-then-optimise,
  :math:`w = B^{-1}(\Phi^H S^{-1}(y + \epsilon) + \xi)`, :math:`\epsilon \sim N(0, S)`,
  :math:`\xi \sim N(0, I)`: Gaussian with mean :math:`B^{-1}\Phi^H S^{-1}y` and covariance
  :math:`B^{-1}(\Phi^H S^{-1}\Phi + I)B^{-1} = B^{-1}`, one CG column per draw;
* the evidence by stochastic Lanczos quadrature (:mod:`~rfgp.inference._stochastic_evidence`).

Each noise group (outputs of equal noise) has a Nyström preconditioner
(:class:`~rfgp.inference._nystrom.NystromPreconditioner`). Under ``torch.distributed`` each
process holds its shard; products are all-reduced, so every process runs the same iterations
and the quantities that need products (variances, draws, evidence) are collective calls.

Internal: not part of the public API (see :mod:`rfgp.inference`).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from rfgp.inference._cg_routes import VarianceRoutes
from rfgp.inference._cg_rows import RowsFit, fit_by_rows
from rfgp.inference._cg_variance import LowRankInverse
from rfgp.inference._checkpoint_record import CheckpointRecord
from rfgp.inference._evidence import LOG_2PI, check_representable
from rfgp.inference._feature_map import FeatureMap
from rfgp.inference._feature_operator import FeatureOperator
from rfgp.inference._iterative import (
    CGResult,
    CGSettings,
    check_resolvable,
    conjugate_gradients,
    lanczos_largest,
    standard_normal,
)
from rfgp.inference._logdet_probes import column_logdets, logdet_probes, probe_standard_error
from rfgp.inference._nystrom import NystromPreconditioner, rank_memory_cap
from rfgp.inference._solver_base import Solver, WeightFactor, to_device

__all__ = [
    "ConjugateGradientSolver",
    "FeatureOperator",
    "fitted_log_evidence",
    "real_form_solver",
]


class ConjugateGradientSolver(Solver):
    """The matrix-free posterior of one fit (see the module docstring).

    Args:
        operator: the products with ``B`` over the kept training data.
        settings: tolerance, iterations, preconditioner rank, cache.
        complex_solve, jitter, target_scale: as in :class:`~rfgp.inference._solvers.Solver`
            (``jitter`` is not used: nothing is factorised).
        num_rows: rows over all processes (default: the operator's rows).

    Example:
        >>> from rfgp import RandomFeatureGP
        >>> from rfgp.kernels import FourierFeatureKernel
        >>> x = torch.rand(200, 2, dtype=torch.float64)
        >>> y = torch.sin(6 * x[:, 0])
        >>> exact = RandomFeatureGP(FourierFeatureKernel(256, seed=0).double(), noise=0.01,
        ...                         solve="weight").fit(x, y)
        >>> gp = RandomFeatureGP(FourierFeatureKernel(256, seed=0).double(), noise=0.01,
        ...                      solve="cg", cg_tolerance=1e-10).fit(x, y)
        >>> gp.solve_used, torch.allclose(gp.predict(x[:5]), exact.predict(x[:5]))
        ('cg', True)
    """

    name = "cg"
    #: A refined variance costs a pass over the training rows per CG iteration and chunk
    #: (the features recomputed at each: on 57,247 rows and 21,504 features, 6.0 s a pass
    #: for one column, 5.4 s of it the features), so a prediction's chunks with variances
    #: hold 2^26 feature values (512 MB in float64; about 3,100 rows at 21,504 features)
    #: rather than the default 2^22 (195 rows there, raised to 256).
    variance_chunk_entries = 1 << 26

    def __init__(self, operator: FeatureOperator, settings: CGSettings, complex_solve: bool,
                 jitter: Optional[float], target_scale: float,
                 num_rows: Optional[int] = None) -> None:
        super().__init__(complex_solve, jitter, target_scale)
        self.operator = operator
        self.settings = settings
        if num_rows is None:
            local = operator.num_rows
            count = torch.tensor([float(local)], dtype=torch.float64, device=operator.device)
            num_rows = int(round(float(operator.reduce(count))))
        self._num_rows = num_rows
        self.mean_weights: Optional[Tensor] = None
        self.preconditioners: List[NystromPreconditioner] = []
        #: a preconditioner of B computed by the caller (one noise group): the first
        #: factorisation takes it instead of a sketch
        self.given_preconditioner: Optional[NystromPreconditioner] = None
        #: a calibration's rows' Gram matrix (:class:`~rfgp.inference._cg_rows.RowsFit`): the
        #: first factorisation solves through the rows' factor instead of by CG
        self.given_rows: Optional[RowsFit] = None
        #: whether the preconditioners are still to be sketched: a fit through the rows' factor
        #: needs none, so the sketch waits for the first CG solve (samples, a refinement)
        self.sketch_pending = False
        self._groups: List[List[int]] = []
        #: CG iterations of the last solve for the mean weights
        self.iterations = 0
        #: the standard error of the last stochastic log evidence
        self.evidence_standard_error: Optional[float] = None
        #: ``(log evidence, standard error)`` of this fit estimated by whoever calibrated it
        #: (the Krylov calibration, :func:`~rfgp.inference.fit_calibrated`), served by
        #: :meth:`log_evidence` instead of a new estimate; dropped by a new factorisation
        self.known_evidence: Optional[Tuple[float, float]] = None
        #: per noise group, the variances' routes and what they built
        self.routes = VarianceRoutes(self)

    @property
    def num_rows(self) -> int:
        return self._num_rows

    @property
    def dtype(self) -> torch.dtype:
        return self.operator.dtype

    def bind(self, feature_map: FeatureMap) -> None:
        self.operator.feature_map = feature_map

    def groups(self) -> List[List[int]]:
        return [list(cols) for cols in self._groups]

    def _group_of(self) -> Dict[int, int]:
        return {c: g for g, cols in enumerate(self._groups) for c in cols}

    # ------------------------------------------------------------------ solves
    def tolerance(self) -> float:
        return self.settings.tolerance_for(self.dtype)

    def precondition(self, residual: Tensor, columns: Sequence[int],
                     root: bool = False) -> Tensor:
        """Each column through its noise group's :math:`P^{-1}` (``root``: :math:`P^{-1/2}`)."""
        group_of = self._group_of()
        out = residual.clone()
        for g, pre in enumerate(self.preconditioners):
            idx = [j for j, c in enumerate(columns) if group_of[c] == g]
            if idx and pre.rank:
                apply = pre.inverse_sqrt if root else pre.inverse
                out[:, idx] = apply(residual[:, idx])
        return out

    def solve(self, rhs: Tensor, columns: Sequence[int], what: str,
              initial: Optional[Tensor] = None,
              energy_tolerance: Optional[float] = None) -> CGResult:
        """CG on :math:`B W = \\mathrm{rhs}`, column ``j`` with the noise of ``columns[j]``
        (``energy_tolerance``: see :func:`~rfgp.inference._iterative.conjugate_gradients`)."""
        columns = list(columns)
        if self.sketch_pending:
            self.sketch_pending = False
            with torch.no_grad():
                self.preconditioners = self.build_preconditioners(self.operator)
        return conjugate_gradients(
            lambda v: self.operator.apply(v, columns), rhs,
            lambda r: self.precondition(r, columns), self.tolerance(),
            self.settings.max_iterations, what, initial=initial,
            energy_tolerance=energy_tolerance,
            precondition_root=lambda r: self.precondition(r, columns, root=True),
        )

    def build_preconditioners(self, operator: FeatureOperator) -> List[NystromPreconditioner]:
        """One Nyström preconditioner per noise group of ``operator``'s matrix."""
        rank = self.settings.preconditioner_rank
        given, self.given_preconditioner = self.given_preconditioner, None
        if (given is not None and rank is None and len(self._groups) == 1
                and given.basis.shape[0] == operator.width
                and given.basis.dtype == operator.vector_dtype
                and given.basis.device == operator.device):
            return [given]
        max_rank = rank_memory_cap(operator.width, operator.vector_dtype, operator.device)
        out = []
        for cols in self._groups:
            def gram(v: Tensor, col: int = cols[0]) -> Tensor:
                return operator.gram(v, [col] * v.shape[1])

            if rank == 0:
                out.append(NystromPreconditioner.identity(operator.width,
                                                          operator.vector_dtype, operator.device))
            else:
                # The sketch serves this group's columns' mean solves.
                out.append(NystromPreconditioner.sketch(
                    gram, operator.width, operator.vector_dtype, operator.device, rank,
                    max_rank=max_rank, solves=len(cols), rows=operator.num_rows,
                    tolerance=self.tolerance()))
        return out

    def factorise(self, column_noise: Optional[Tensor]) -> None:
        """Build the preconditioners and solve for the mean weights (no factorisation)."""
        op = self.operator
        op.column_noise = None if op.fixed_noise else column_noise.detach()
        t = op.num_columns
        self.forget_variances()
        self.known_evidence = None
        given_rows, self.given_rows = self.given_rows, None
        self.sketch_pending = False
        with torch.no_grad():
            self._groups = op.noise_groups()
            fitted = None if given_rows is None else fit_by_rows(op, given_rows, self._groups)
            if fitted is not None:
                # The rows' factor gives the mean and serves the variances: no CG, no sketch.
                self.mean_weights, self.routes.dense[0] = fitted
                self.iterations = 0
                self.preconditioners = [
                    NystromPreconditioner.identity(op.width, op.vector_dtype, op.device)]
                self.sketch_pending = True
                return
            self.preconditioners = self.build_preconditioners(op)
            index = torch.arange(t, device=op.device)
            rhs = op.project(lambda y, s: y.to(op.dtype) * op.inverse_noise(s, index, y.shape[0]),
                             t)
            # A refit after an update or a new noise starts from the previous weights.
            start = self.mean_weights
            if start is not None and start.shape != rhs.shape:
                start = None
            # A preconditioner's top eigenvalue estimates B's before any iteration; without
            # one the run's Ritz values do (B >= I, so its largest eigenvalue bounds kappa).
            largest = max((float(p.eigenvalues.max()) for p in self.preconditioners if p.rank),
                          default=0.0)
            check_resolvable(1.0 + largest, self.dtype)
            # The mean within `tolerance` posterior standard deviations at every input, not
            # only a relative residual (which allows many where B is ill-conditioned); the
            # targets are stored divided by target_scale, and so is the bound.
            result = self.solve(rhs, range(t), "the mean weights B w = Phi^H S^-1 y", start,
                                self.tolerance() / self.target_scale)
            check_resolvable(lanczos_largest(result), self.dtype)
        self.mean_weights, self.iterations = result.solution, result.iterations

    # ------------------------------------------------------------------ posterior
    def predict_mean(self, rows: Tensor) -> Tensor:
        """The mean alone: one product with the mean weights, no CG (a variance costs one)."""
        feats = to_device(self.solver_form(rows), self.operator.device, self.dtype)  # (M, W)
        mean = (feats @ self.mean_weights.to(feats.dtype)).real * self.target_scale
        return mean.to(rows.real.dtype)

    def predict(self, rows: Tensor, want_root: bool):
        feats = to_device(self.solver_form(rows), self.operator.device, self.dtype)  # (M, W)
        mean = (feats @ self.mean_weights.to(feats.dtype)).real * self.target_scale  # (M, T)
        var, roots = torch.zeros_like(mean), []
        floors = self.variance_floor
        for g, cols in enumerate(self._groups):
            floor = 0.0 if floors is None else float(floors[cols[0]])
            quad, root = self.routes.variances(g, cols[0], feats, want_root, floor)
            var[:, cols] = quad.clamp_min(0).unsqueeze(-1)
            roots.append(None if root is None else root.to(rows.real.dtype))
        return mean.to(rows.real.dtype), var.to(rows.real.dtype), roots

    @property
    def variance_routes(self) -> Dict[int, str]:
        """Per noise group, the route of the last variances (``"lowrank"``, ``"refined"``,
        ``"dense"`` or ``"exact"``; :mod:`~rfgp.inference._cg_routes`)."""
        return self.routes.taken

    def forget_variances(self) -> None:
        """Drop what the variance routes built (a new fit, noise or dtype)."""
        self.routes.forget()

    def low_rank_inverse(self, g: int) -> LowRankInverse:
        """Noise group ``g``'s low-rank :math:`B^{-1}` of the variances, built at its first
        use after a fit (a collective call under ``torch.distributed``)."""
        return self.routes.low_rank_inverse(g)

    def low_rank_inverses(self) -> List[LowRankInverse]:
        """Per noise group, the low-rank :math:`B^{-1}` of the variances (built where
        missing)."""
        return self.routes.low_rank_inverses()

    def weight_factors(self, column_noise: Optional[Tensor]) -> List[WeightFactor]:
        raise NotImplementedError(
            "solve='cg' holds no Cholesky factor of B; its draws come from draw_weights"
        )

    def draw_weights(self, num_samples: int, generator: Optional[torch.Generator],
                     column_noise: Optional[Tensor]) -> List[Tuple[List[int], Tensor]]:
        r"""Posterior weight draws by sample-then-optimise (see the module docstring), one CG
        column per draw, in the true target scale. Complex solves draw
        :math:`\epsilon = S^{1/2}(a + i b)`, :math:`\xi = a' + i b'`, like the weight-space
        solver's :math:`L^{-H}(a + i b)`; under ``torch.distributed``, :math:`\xi` is rank 0's."""
        op = self.operator
        device = generator.device if generator is not None else op.device
        draws = []
        with torch.no_grad():
            for cols in self._groups:
                k = num_samples * len(cols)
                index = torch.full((k,), cols[0], dtype=torch.long, device=op.device)

                def noise_draw(y: Tensor, s: Optional[Tensor], k: int = k,
                               index: Tensor = index) -> Tensor:
                    eps = standard_normal((y.shape[0], k), op.vector_dtype, generator, device)
                    return eps.to(op.device) * op.inverse_noise(s, index, y.shape[0]).sqrt()

                rhs = op.project(noise_draw, k)
                xi = standard_normal((op.width, k), op.vector_dtype, generator, device)
                xi = xi.to(op.device)
                if op.distributed:
                    import torch.distributed as dist

                    view = torch.view_as_real(xi) if xi.is_complex() else xi
                    dist.broadcast(view, src=0, group=op.process_group)
                sample = self.solve(rhs + xi, [cols[0]] * k, "the posterior draws",
                                    energy_tolerance=self.tolerance()).solution
                mean = (self.mean_weights[:, cols] * self.target_scale).unsqueeze(1)
                draws.append((cols, mean + sample.reshape(op.width, num_samples, len(cols))))
        return draws

    def log_evidence(self, column_noise: Optional[Tensor]) -> Tensor:
        if self.known_evidence is not None:
            # The calibration's estimate of this very fit (its probes and Krylov space at the
            # root it fitted): a new one would cost a Lanczos run per probe.
            value, error = self.known_evidence
            self.evidence_standard_error = error
            return torch.tensor(value, dtype=self.operator.dtype, device=self.operator.device)
        value, error = fitted_log_evidence(self)
        self.evidence_standard_error = error
        return value

    # ------------------------------------------------------------------ state
    def to(self, device: torch.device, dtype: torch.dtype) -> None:
        op = self.operator
        # Inputs keep their dtype (they are cast to the kernel's at use); the rest follows dtype.
        if op.streamed:
            op.data.to(device, dtype)
        else:
            op.data = [(x.to(device), to_device(t, device, dtype),
                        None if s is None else to_device(s, device, dtype)) for x, t, s in op.data]
        if op.column_noise is not None:
            op.column_noise = op.column_noise.to(device)
        op.dtype = dtype
        op.clear_cache()
        self.forget_variances()
        if self.mean_weights is not None:
            self.mean_weights = to_device(self.mean_weights, device, dtype)
        for pre in self.preconditioners:
            pre.basis = to_device(pre.basis, device, dtype)
            pre.eigenvalues = pre.eigenvalues.to(device=device, dtype=dtype)

    def state(self) -> dict:
        op = self.operator
        if op.streamed:
            # Rows read from a data source are not copied into a checkpoint: one row keeps
            # the layout, and the loaded fit predicts means (as a distributed fit's shard).
            x, targets, _ = next(iter(op.data))
            data = [(x[:1].clone(), targets[:1].clone(), None)]
        else:
            data = [tuple(batch) for batch in op.data]
        return {
            "solver": self.name,
            "data": data,
            "column_noise": op.column_noise,
            "chunk": op.chunk,
            "distributed": op.distributed,
            "streamed": op.streamed,
            "num_rows": self._num_rows,
            "settings": self.settings.state(),
            "groups": self.groups(),
            "mean_weights": self.mean_weights,
            "preconditioners": [(p.basis, p.eigenvalues) for p in self.preconditioners],
            "iterations": self.iterations,
            "sketch_pending": self.sketch_pending,
        }

    @classmethod
    def from_state(cls, state: CheckpointRecord, complex_solve: bool, jitter,
                   target_scale) -> Solver:
        batches = state.sequence("data")
        if not len(batches):
            raise ValueError(f"checkpoint entry {state.name('data')} must hold the training "
                             "batches of the solve='cg' fit, got an empty list")
        data = []
        for index in range(len(batches)):
            batches.items(index, 3)
            batch = batches.sequence(index)
            data.append((batch.tensor(0, ndim=2), batch.tensor(1, ndim=2),
                         batch.tensor(2, optional=True, ndim=2)))
            x, targets, noise = data[-1]
            if (targets.shape[1] != data[0][1].shape[1] or (noise is None) != (data[0][2] is None)
                    or (noise is not None and noise.shape != targets.shape)):
                raise ValueError(
                    f"checkpoint entry {batches.name(index)} must hold targets (R, T) with the "
                    "first batch's T columns and a noise of their shape (or None in every "
                    f"batch), got {tuple(targets.shape)} and "
                    f"{None if noise is None else tuple(noise.shape)}"
                )
        settings_record = state.record("settings")
        known = set(CGSettings.__dataclass_fields__)
        unknown = sorted(set(settings_record.values) - known)
        if unknown:
            raise ValueError(f"checkpoint entry {state.name('settings')} holds unknown settings "
                             f"{unknown}; expected some of {sorted(known)}")
        try:
            settings = CGSettings(**settings_record.values)
        except (TypeError, ValueError) as err:
            raise type(err)(f"checkpoint entry {state.name('settings')}: {err}") from None
        # The feature map is bound by the model before any use (its kernel is loaded after).
        op = FeatureOperator(None, data, complex_solve, data[0][1].dtype,
                             state.integer("chunk", 1), settings.cache_bytes, None,
                             state.boolean("distributed"))
        op.detached = op.distributed or state.boolean("streamed", default=False)
        op.distributed = False
        op.column_noise = state.tensor("column_noise", optional=op.fixed_noise, ndim=1)
        solver = cls(op, settings, complex_solve, jitter, target_scale,
                     state.integer("num_rows", 1))
        groups = state.sequence("groups")
        solver._groups = [groups.columns(i) for i in range(len(groups))]
        solver.mean_weights = state.tensor("mean_weights", ndim=2)
        num_columns = data[0][1].shape[1]
        if solver.mean_weights.shape[1] != num_columns or (
                op.column_noise is not None and op.column_noise.shape != (num_columns,)):
            raise ValueError(
                f"checkpoint entries {state.name('mean_weights')} and "
                f"{state.name('column_noise')} must have the targets' {num_columns} columns, "
                f"got {tuple(solver.mean_weights.shape)} and "
                f"{None if op.column_noise is None else tuple(op.column_noise.shape)}"
            )
        preconditioners = state.sequence("preconditioners")
        solver.preconditioners = []
        for index in range(len(preconditioners)):
            preconditioners.items(index, 2)
            pair = preconditioners.sequence(index)
            basis, eigenvalues = pair.tensor(0, ndim=2), pair.tensor(1, ndim=1)
            width = solver.mean_weights.shape[0]
            if basis.shape[0] != width or basis.shape[1] != eigenvalues.shape[0]:
                raise ValueError(
                    f"checkpoint entry {preconditioners.name(index)} must hold a (W, r) basis "
                    f"with the mean weights' W = {width} rows and r eigenvalues, got "
                    f"{tuple(basis.shape)} and {tuple(eigenvalues.shape)}")
            solver.preconditioners.append(NystromPreconditioner(basis, eigenvalues))
        if len(solver.preconditioners) != len(solver._groups):
            raise ValueError(
                f"checkpoint entry {state.name('preconditioners')} must hold one preconditioner "
                f"per noise group ({len(solver._groups)}), got {len(solver.preconditioners)}")
        solver.iterations = state.integer("iterations")
        solver.sketch_pending = state.boolean("sketch_pending", default=False)
        return solver


# ====================================================================== the fitted evidence
def real_form_solver(solver: ConjugateGradientSolver) -> ConjugateGradientSolver:
    """The solver of the real-form matrix (the evidence is the real GP's), factorised."""
    if not solver.complex_solve:
        return solver
    op = solver.operator.real_view()
    real = ConjugateGradientSolver(op, solver.settings, False, None, solver.target_scale,
                                   solver.num_rows)
    real.factorise(op.column_noise)
    return real


def fitted_log_evidence(solver: ConjugateGradientSolver,
                        generator: Optional[torch.Generator] = None) -> Tuple[Tensor, float]:
    """The stochastic log evidence of a fitted iterative solver and its standard error."""
    with torch.no_grad():
        real = real_form_solver(solver)
        op = real.operator
        t = op.num_columns
        index = torch.arange(t, device=op.device)
        h = op.project(lambda y, s: y.to(op.dtype) * op.inverse_noise(s, index, y.shape[0]), t)
        yy = torch.zeros(t, dtype=op.dtype, device=op.device)
        log_noise = torch.zeros_like(yy)

        def local_pass() -> None:
            for _, targets, noise in op.data:
                inverse = op.inverse_noise(noise, index, targets.shape[0])
                yy.add_((targets.to(op.dtype).square() * inverse).sum(0))
                log_noise.sub_(inverse.log().sum(0))

        op.run(local_pass)  # rows read from a source: a read failing on one rank fails all
        yy, log_noise = op.total(yy), op.total(log_noise)
        quad = (yy - (h * real.mean_weights).sum(0)) * real.target_scale**2
        estimates = logdet_probes(real, generator)[0]
        groups = real.groups()
        logdet = column_logdets(estimates, groups, t, quad)
        total = -0.5 * (quad + logdet + log_noise + solver.num_rows * LOG_2PI).sum()
    return check_representable(total, real.target_scale), probe_standard_error(estimates, groups)
