r"""The log-determinant of :math:`B` by Rademacher probes and Lanczos quadrature.

With the Nyström preconditioner :math:`P` of a noise group,
:math:`\log|B| = \log|P| + \mathrm{tr}\log(P^{-1/2} B P^{-1/2})`; the trace is the mean of
:math:`v^\top \log(\tilde B) v` over Rademacher probes :math:`v`, each by the Lanczos quadrature
of one preconditioned CG run on :math:`B u = P^{1/2} v`. The probes' pairs :math:`u, r` carry the
gradient of the log-determinant (:mod:`~rfgp.inference._stochastic_evidence`).

Internal: not part of the public API (see :mod:`rfgp.inference`).
"""

from __future__ import annotations

import math
from typing import List, Optional

import torch
from torch import Tensor

from rfgp.inference._iterative import lanczos_log_quadrature
from rfgp.inference._linalg import check_memory
from rfgp.inference._solver_base import Solver

__all__ = ["column_logdets", "logdet_probes", "probe_standard_error"]


def _rademacher(shape, generator: Optional[torch.Generator]) -> Tensor:
    generator = generator or torch.Generator().manual_seed(0)
    return torch.randint(0, 2, shape, generator=generator, dtype=torch.float64) * 2.0 - 1.0


def logdet_probes(solver: Solver, generator: Optional[torch.Generator]):
    """Per noise group: log-determinant estimates ``(P,)``, and the probe pairs ``u, r``.

    ``solver`` is a factorised real-form
    :class:`~rfgp.inference._cg_solver.ConjugateGradientSolver` (its operator, groups and
    preconditioners are used).
    """
    op, probes = solver.operator, solver.settings.num_probes
    groups = solver.groups()
    # Four (W, P G) blocks: the probes, their images, the CG iterate and its residual.
    check_memory((4 * op.width, probes * len(groups)), op.vector_dtype, op.device,
                 f"the log-determinant probes (num_probes={probes})", "use fewer num_probes")
    v = _rademacher((op.width, probes * len(groups)), generator).to(op.device, op.dtype)
    rhs, right, columns = torch.empty_like(v), torch.empty_like(v), []
    for g, (cols, pre) in enumerate(zip(groups, solver.preconditioners)):
        block = slice(g * probes, (g + 1) * probes)
        rhs[:, block] = pre.sqrt(v[:, block])
        right[:, block] = pre.inverse_sqrt(v[:, block])
        columns += [cols[0]] * probes
    result = solver.solve(rhs, columns, "the log-determinant probes B u = P^1/2 v")
    quadrature = lanczos_log_quadrature(result)  # (G P,)
    estimates = [
        pre.logdet() + op.width * quadrature[g * probes : (g + 1) * probes]
        for g, pre in enumerate(solver.preconditioners)
    ]
    return estimates, result.solution, right, columns


def probe_standard_error(estimates: List[Tensor], groups: List[List[int]]) -> float:
    """Of ``-1/2 sum_t log|B_g(t)|``: each group's mean counts once per column."""
    var = sum((len(cols) * float(e.std()) / math.sqrt(e.numel())) ** 2
              for e, cols in zip(estimates, groups))
    return 0.5 * math.sqrt(var)


def column_logdets(estimates: List[Tensor], groups: List[List[int]], num_columns: int,
                    like: Tensor) -> Tensor:
    out = like.new_zeros(num_columns)
    for e, cols in zip(estimates, groups):
        out[cols] = float(e.mean())
    return out
