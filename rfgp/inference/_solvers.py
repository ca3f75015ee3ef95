r"""The two exact solvers of a random-feature GP, behind one :class:`Solver` interface
(:mod:`~rfgp.inference._solver_base`).

Both compute the same posterior (push-through identity); they differ in the matrix they factorise:

* :class:`WeightSpaceSolver` holds the sufficient statistics
  (:class:`~rfgp.inference._statistics.FeatureStatistics`) and factorises, per group of outputs of
  equal noise, the ``D x D`` matrix :math:`B = \Phi^H S^{-1}\Phi + I = L L^H`:
  :math:`\mu(x) = \mathrm{Re}\{\Phi(x)^\top B^{-1}\Phi^H S^{-1}y\}`,
  :math:`\mathrm{var}(x) = \|L^{-1}\overline{\Phi(x)}\|^2`; cost :math:`O(N D^2 + D^3)`.
* :class:`FunctionSpaceSolver` holds the training feature rows and factorises the ``N x N``
  matrix :math:`K + S = \Phi\Phi^H + S = L L^H`:
  :math:`\mu(x) = \mathrm{Re}\{k_x^\top (K + S)^{-1} y\}`,
  :math:`\mathrm{var}(x) = \|\Phi(x)\|^2 - \|L^{-1}\overline{k_x}\|^2`; cost
  :math:`O(N^2 D + N^3)`, cheaper when ``N < D``.

Each solver owns its factorisation, prediction, weight-space sampling and evidence. Targets are
stored divided by a power of two (``target_scale``), so targets of any magnitude stay finite in
the statistics; the division is exact, so results are bit-identical to unscaled ones.

Internal: not part of the public API (see :mod:`rfgp.inference`).
"""

from __future__ import annotations

import math
from typing import List, Optional, Tuple

import torch
from torch import Tensor

from rfgp._validation import check_generator
from rfgp.inference._checkpoint_record import CheckpointRecord
from rfgp.inference._evidence import (
    check_representable,
    evidence_total,
    log_evidence_from_features,
    weight_evidence_terms,
)
from rfgp.inference._linalg import check_memory, hermitian_square_norms, robust_cholesky
from rfgp.inference._noise import equal_noise_columns
from rfgp.inference._solver_base import KernelFactor, Solver, WeightFactor, to_device
from rfgp.inference._statistics import FeatureStatistics
from rfgp.kernels._base import real_form

__all__ = ["FunctionSpaceSolver", "KernelFactor", "Solver", "WeightFactor", "WeightSpaceSolver"]

# (columns, Gram G, right-hand side h, y^T S^-1 y, sum log s) of one group, S^-1-weighted.
Spec = Tuple[List[int], Tensor, Tensor, Tensor, Tensor]




# ====================================================================== weight space
class WeightSpaceSolver(Solver):
    """The ``D x D`` solve from sufficient statistics (see the module docstring).

    Args:
        stats: the accumulated statistics (targets divided by ``target_scale``).
        complex_solve, jitter, target_scale: as in :class:`Solver`.
    """

    name = "weight"

    def __init__(
        self,
        stats: FeatureStatistics,
        complex_solve: bool,
        jitter: Optional[float],
        target_scale: float,
    ) -> None:
        super().__init__(complex_solve, jitter, target_scale)
        self.stats = stats
        self.factors: List[WeightFactor] = []

    @property
    def num_rows(self) -> int:
        return self.stats.count

    @property
    def dtype(self) -> torch.dtype:
        return self.stats.dtype

    def groups(self) -> List[List[int]]:
        return [list(f.columns) for f in self.factors]

    def specs(self, column_noise: Optional[Tensor]) -> List[Spec]:
        """``(columns, G, h, yy, sum log s)`` per factorisation, all ``S^{-1}``-weighted."""
        stats = self.stats
        if stats.weighted:
            return [
                (cols, stats.gram(g), stats.rhs[:, cols], stats.yy[cols], stats.log_noise_sum[cols])
                for g, cols in enumerate(stats.column_groups())
            ]
        noise = column_noise.to(device=stats.device, dtype=stats.dtype)
        gram = stats.gram(0)
        specs = []
        for cols in equal_noise_columns(noise.unsqueeze(0)):
            value = noise[cols[0]]
            log_sum = torch.full(
                (len(cols),), stats.count * math.log(value.item()), dtype=stats.dtype,
                device=stats.device,
            )
            specs.append(
                (cols, gram / value, stats.rhs[:, cols] / value, stats.yy[cols] / value, log_sum)
            )
        return specs

    def factor(self, cols: List[int], gram: Tensor, rhs: Tensor) -> WeightFactor:
        """Factor ``B = G + I``; ``gram`` (a fresh matrix from :meth:`specs`) is overwritten."""
        width = gram.shape[0]
        if self.complex_solve:
            half = width // 2
            cross = gram[:half, half:]
            bmat = torch.complex(
                gram[:half, :half] + gram[half:, half:], cross - cross.transpose(0, 1)
            )
            rhs = torch.complex(rhs[:half], -rhs[half:])
        else:
            bmat = gram
        # The statistics' Gram is exactly symmetric and the Cholesky reads one triangle only.
        bmat.diagonal().add_(1.0)
        chol = robust_cholesky(bmat, self.jitter, "weight-space matrix B", prior_scale=1.0)
        return WeightFactor(cols, chol, torch.cholesky_solve(rhs.to(chol.dtype), chol))

    def factorise(self, column_noise: Optional[Tensor]) -> None:
        width = self.stats.num_real_features
        check_memory(
            (2 * width, width), self.stats.dtype, self.stats.device,
            "the weight-space matrix B and its Cholesky factor",
            "use solve='cg' (matrix-free: no D x D matrix), fewer features (num_features), or "
            "solve='function' for few rows",
        )
        with torch.no_grad():
            self.factors = [self.factor(c, g, h) for c, g, h, _, _ in self.specs(column_noise)]

    def predict(self, rows: Tensor, want_root: bool):
        out_dtype = rows.real.dtype
        feats = to_device(self.solver_form(rows), self.stats.device, self.dtype)
        num_columns = sum(len(f.columns) for f in self.factors)
        mean = feats.new_zeros(feats.shape[0], num_columns, dtype=feats.real.dtype)
        var = torch.zeros_like(mean)
        roots = []
        for factor in self.factors:
            mean[:, factor.columns] = (feats @ factor.mean_weights.to(feats.dtype)).real
            chol = factor.chol.to(feats.dtype)
            v = torch.linalg.solve_triangular(chol, feats.transpose(0, 1).conj(), upper=False)
            var[:, factor.columns] = hermitian_square_norms(v).clamp_min(0).unsqueeze(-1)
            roots.append((real_form(v.transpose(0, 1)).to(out_dtype),) if want_root else None)
        return (mean * self.target_scale).to(out_dtype), var.to(out_dtype), roots

    def weight_factors(self, column_noise: Optional[Tensor]) -> List[WeightFactor]:
        return self.factors

    def log_evidence(self, column_noise: Optional[Tensor]) -> Tensor:
        total = torch.zeros((), dtype=self.dtype, device=self.stats.device)
        for _, gram, rhs, yy, log_noise_sum in self.specs(column_noise):
            quad, logdet = weight_evidence_terms(gram, rhs, yy, self.jitter)
            total = total + evidence_total(
                quad, logdet, log_noise_sum, self.stats.count, self.target_scale
            )
        return check_representable(total, self.target_scale)

    def to(self, device: torch.device, dtype: torch.dtype) -> None:
        self.stats.to(device, dtype)
        for f in self.factors:
            f.chol = to_device(f.chol, device, dtype)
            f.mean_weights = to_device(f.mean_weights, device, dtype)

    def state(self) -> dict:
        return {
            "solver": self.name,
            "statistics": self.stats.state(),
            "factors": [(f.columns, f.chol, f.mean_weights) for f in self.factors],
        }

    @classmethod
    def from_state(cls, state: CheckpointRecord, complex_solve: bool, jitter,
                   target_scale) -> Solver:
        solver = cls(FeatureStatistics.from_state(state.record("statistics")), complex_solve,
                     jitter, target_scale)
        solver.factors = [WeightFactor(*_factor(state.sequence("factors"), i))
                          for i in range(len(state.items("factors")))]
        return solver


# ====================================================================== function space
class FunctionSpaceSolver(Solver):
    """The ``N x N`` solve from stored feature rows (see the module docstring).

    Args:
        rows: ``(R, D)`` training feature rows (complex or real, outputscale applied).
        targets: ``(R, T)`` targets divided by ``target_scale``.
        row_noise: ``(R, T)`` fixed (folded-in) noise, or ``None`` to use the model noise.
        complex_solve, jitter, target_scale: as in :class:`Solver`.
    """

    name = "function"

    def __init__(
        self,
        rows: Tensor,
        targets: Tensor,
        row_noise: Optional[Tensor],
        complex_solve: bool,
        jitter: Optional[float],
        target_scale: float,
    ) -> None:
        super().__init__(complex_solve, jitter, target_scale)
        self.rows, self.targets, self.row_noise = rows, targets, row_noise
        self.factors: List[KernelFactor] = []
        self._weight_cache: Optional[List[WeightFactor]] = None

    @property
    def num_rows(self) -> int:
        return self.rows.shape[0]

    @property
    def dtype(self) -> torch.dtype:
        return self.targets.dtype

    def groups(self) -> List[List[int]]:
        return [list(f.columns) for f in self.factors]

    def noise_groups(self, column_noise: Optional[Tensor]) -> List[Tuple[List[int], Tensor]]:
        """``(columns, noise (R,))`` per factorisation."""
        if self.row_noise is None:
            noise = column_noise.to(self.targets)
            return [
                (cols, noise[cols[0]].expand(self.num_rows))
                for cols in equal_noise_columns(noise.unsqueeze(0))
            ]
        groups = [(c, self.row_noise[:, c[0]]) for c in equal_noise_columns(self.row_noise)]
        return sorted(groups, key=lambda g: g[0][0])

    def kernel_matrix(self) -> Tensor:
        """``K = Phi Phi^H`` (``R x R``), shared by every group."""
        check_memory(
            (2 * self.num_rows, self.num_rows), self.rows.dtype, self.rows.device,
            "the function-space matrix K + S and its Cholesky factor",
            "use solve='cg' (matrix-free: memory O(N d + chunk D)), or solve='weight' "
            "(memory O(D^2)) or fit_stream where the D x D matrices fit",
        )
        rows = to_device(self.solver_form(self.rows), self.rows.device, self.dtype)
        return rows @ rows.transpose(0, 1).conj()

    def factorise(self, column_noise: Optional[Tensor]) -> None:
        self._weight_cache = None
        with torch.no_grad():
            kmat = self.kernel_matrix()
            prior = float(kmat.diagonal().real.mean()) or None
            self.factors = []
            for cols, noise in self.noise_groups(column_noise):
                matrix = kmat + torch.diag(noise.to(kmat.dtype))
                matrix = 0.5 * (matrix + matrix.transpose(0, 1).conj())
                chol = robust_cholesky(matrix, self.jitter, "function-space matrix K + S", prior)
                alpha = torch.cholesky_solve(self.targets[:, cols].to(chol.dtype), chol)
                self.factors.append(KernelFactor(cols, chol, alpha))

    def predict(self, rows: Tensor, want_root: bool):
        out_dtype = rows.real.dtype
        feats = to_device(self.solver_form(rows), self.rows.device, self.dtype)
        train = to_device(self.solver_form(self.rows), self.rows.device, self.dtype)
        cross = feats @ train.transpose(0, 1).conj()  # k_hat(x, x_i), (M, R)
        prior = hermitian_square_norms(feats, -1)
        num_columns = sum(len(f.columns) for f in self.factors)
        mean = feats.new_zeros(feats.shape[0], num_columns, dtype=feats.real.dtype)
        var = torch.zeros_like(mean)
        roots = []
        for factor in self.factors:
            mean[:, factor.columns] = (cross @ factor.alpha.to(cross.dtype)).real
            chol = factor.chol.to(cross.dtype)
            v = torch.linalg.solve_triangular(chol, cross.transpose(0, 1).conj(), upper=False)
            fvar = (prior - hermitian_square_norms(v)).clamp_min(0)
            var[:, factor.columns] = fvar.unsqueeze(-1)
            roots.append((real_form(feats), real_form(v.transpose(0, 1))) if want_root else None)
        return (mean * self.target_scale).to(out_dtype), var.to(out_dtype), roots

    def statistics(self, dtype: Optional[torch.dtype] = None) -> FeatureStatistics:
        """The weight-space statistics of the stored rows."""
        z = real_form(self.rows)
        stats = FeatureStatistics(
            z.shape[1], self.targets.shape[1], self.row_noise is not None,
            dtype or self.dtype, z.device,
        )
        stats.add(z, self.targets, self.row_noise)
        return stats

    def to_weight_space(self, dtype: Optional[torch.dtype] = None) -> WeightSpaceSolver:
        """The equivalent weight-space solver (not yet factorised)."""
        return WeightSpaceSolver(
            self.statistics(dtype), self.complex_solve, self.jitter, self.target_scale
        )

    def draw_weights(
        self,
        num_samples: int,
        generator: Optional[torch.Generator],
        column_noise: Optional[Tensor],
    ) -> List[Tuple[List[int], Tensor]]:
        r"""Posterior weight draws by pathwise conditioning, without a ``D x D`` matrix.

        With a prior draw :math:`w_0 \sim N(0, I)` and noise :math:`\epsilon \sim N(0, S)`,
        :math:`w = w_0 + \Phi^\top (K + S)^{-1}(y - \Phi w_0 - \epsilon)` has mean
        :math:`\Phi^\top (K + S)^{-1} y = \mu_w` and covariance
        :math:`I - \Phi^\top (K + S)^{-1}\Phi = (I + \Phi^\top S^{-1}\Phi)^{-1}` (Woodbury):
        exactly the weight posterior, at :math:`O(N D)` memory and :math:`O(N D + N^2)` work
        per draw, where the weight-space factor needs :math:`O(D^2)` memory and
        :math:`O(N D^2 + D^3)` work. Complex solves use the weight-space factor.
        """
        check_generator("generator", generator)
        if self.complex_solve:
            return super().draw_weights(num_samples, generator, column_noise)
        train = to_device(self.solver_form(self.rows), self.rows.device, self.dtype)  # (R, W)
        device = generator.device if generator is not None else train.device
        noise_of = {tuple(cols): noise for cols, noise in self.noise_groups(column_noise)}
        draws = []
        for factor in self.factors:
            tcols = len(factor.columns)
            shape = (train.shape[1], num_samples * tcols)
            w0 = torch.randn(shape, generator=generator, dtype=self.dtype, device=device)
            eps = torch.randn((self.num_rows, num_samples * tcols), generator=generator,
                              dtype=self.dtype, device=device)
            w0, eps = w0.to(train.device), eps.to(train.device)
            noise = noise_of[tuple(factor.columns)].to(self.dtype)
            residual = train @ w0 + eps * noise.sqrt().unsqueeze(-1)
            correction = train.transpose(0, 1) @ torch.cholesky_solve(residual, factor.chol)
            mean = (train.transpose(0, 1) @ factor.alpha) * self.target_scale  # (W, Tg)
            sample = (w0 - correction).reshape(train.shape[1], num_samples, tcols)
            draws.append((factor.columns, mean.unsqueeze(1) + sample))
        return draws

    def weight_factors(self, column_noise: Optional[Tensor]) -> List[WeightFactor]:
        if self._weight_cache is None:
            solver = self.to_weight_space()
            solver.factorise(column_noise)
            self._weight_cache = solver.factors
        return self._weight_cache

    def add_rows(self, rows: Tensor, targets: Tensor, row_noise: Optional[Tensor]) -> None:
        self.rows = torch.cat([self.rows, rows])
        self.targets = torch.cat([self.targets, targets])
        if row_noise is not None:
            self.row_noise = torch.cat([self.row_noise, row_noise])

    def log_evidence(self, column_noise: Optional[Tensor]) -> Tensor:
        # The evidence of the real form (kernel Re k_hat), also for a complex solve.
        if self.row_noise is None:
            noise = column_noise.to(self.targets).unsqueeze(0).expand_as(self.targets)
        else:
            noise = self.row_noise
        z = real_form(self.rows).to(self.dtype)
        total = log_evidence_from_features(z, self.targets, noise, self.jitter, self.target_scale)
        return check_representable(total, self.target_scale)

    def to(self, device: torch.device, dtype: torch.dtype) -> None:
        self.rows = to_device(self.rows, device, dtype)
        self.targets = to_device(self.targets, device, dtype)
        if self.row_noise is not None:
            self.row_noise = to_device(self.row_noise, device, dtype)
        for f in self.factors:
            f.chol, f.alpha = to_device(f.chol, device, dtype), to_device(f.alpha, device, dtype)
        self._weight_cache = None

    def state(self) -> dict:
        return {
            "solver": self.name,
            "rows": self.rows,
            "targets": self.targets,
            "row_noise": self.row_noise,
            "factors": [(f.columns, f.chol, f.alpha) for f in self.factors],
        }

    @classmethod
    def from_state(cls, state: CheckpointRecord, complex_solve: bool, jitter,
                   target_scale) -> Solver:
        rows, targets = state.tensor("rows", ndim=2), state.tensor("targets", ndim=2)
        row_noise = state.tensor("row_noise", optional=True, ndim=2)
        if rows.shape[0] != targets.shape[0] or (row_noise is not None
                                                 and row_noise.shape != targets.shape):
            raise ValueError(
                f"checkpoint entries {state.name('rows')}, {state.name('targets')} and "
                f"{state.name('row_noise')} must have as many rows (and the noise the targets' "
                f"shape), got {tuple(rows.shape)}, {tuple(targets.shape)} and "
                f"{None if row_noise is None else tuple(row_noise.shape)}"
            )
        solver = cls(rows, targets, row_noise, complex_solve, jitter, target_scale)
        solver.factors = [KernelFactor(*_factor(state.sequence("factors"), i))
                          for i in range(len(state.items("factors")))]
        for index, factor in enumerate(solver.factors):
            if factor.chol.shape[0] != rows.shape[0]:
                raise ValueError(
                    f"checkpoint entry {state.sequence('factors').name(index)} must hold a "
                    f"factor of K + S for the {rows.shape[0]} rows, got "
                    f"{tuple(factor.chol.shape)}"
                )
        return solver


def _factor(factors: CheckpointRecord, index: int) -> Tuple[List[int], Tensor, Tensor]:
    """``(columns, Cholesky factor, solved right-hand sides)`` of a saved factor."""
    factors.items(index, 3)
    factor = factors.sequence(index)
    columns, chol, solved = factor.columns(0), factor.tensor(1, ndim=2), factor.tensor(2, ndim=2)
    if chol.shape[0] != chol.shape[1] or solved.shape != (chol.shape[0], len(columns)):
        raise ValueError(
            f"checkpoint entry {factors.name(index)} must hold a square factor (n, n) and "
            f"(n, {len(columns)}) solved targets for its {len(columns)} columns, got "
            f"{tuple(chol.shape)} and {tuple(solved.shape)}"
        )
    return columns, chol, solved
