r"""The dense route of the iterative solve's predictive variances.

Where the low-rank form of :math:`B^{-1}` (:mod:`~rfgp.inference._cg_variance`) stays above
its tolerance, each query row costs several CG iterations. :class:`DenseInverse` instead forms
:math:`B = LL^H` once (``N W^2`` multiply-adds for the Gram, ``W^3/3`` for the Cholesky,
``W^2`` numbers twice) and answers every query exactly by a triangular solve,
:math:`\sigma^2_* = \|L^{-1}\phi_*^H\|^2`, in ``W^2`` multiply-adds per row. The solver
weighs the two routes on the rows of a prediction: before a form exists against its
forecast (:func:`dense_first`, :func:`forecast_form`), once it exists against the iterations
a refinement of :data:`PROBE_ROWS` rows measured (:func:`dense_pays`).

Internal: not part of the public API (see :mod:`rfgp.inference`).
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
from torch import Tensor

from rfgp.inference._cg_forecast import (
    cg_iterations_on,
    preconditioned_spectrum,
    sketch_residual,
    spectrum_at,
)
from rfgp.inference._cg_variance import LANCZOS_STEPS, START_RANK, _real_gram, _squared_norms
from rfgp.inference._linalg import available_memory, try_cholesky

__all__ = [
    "PROBE_ROWS",
    "DenseInverse",
    "dense_cost",
    "dense_first",
    "dense_fits",
    "dense_pays",
    "forecast_form",
    "refine_cost",
]

#: query rows whose refinement measures the iterations per row before the dense route is
#: weighed against it
PROBE_ROWS = 32


class DenseInverse:
    r""":math:`B^{-1}` by the Cholesky factor :math:`B = LL^H`: the exact variances
    :math:`\|L^{-1}\phi_*^H\|^2` and covariances :math:`\mathrm{Re}\{Z^H Z\}`,
    :math:`Z = L^{-1}\Phi_*^H`, differentiable in the query rows.

    Args:
        factor: ``L`` ``(W, W)``, lower triangular.

    Example:
        >>> b = torch.tensor([[4.0, 1.0], [1.0, 3.0]], dtype=torch.float64)
        >>> inv = DenseInverse(torch.linalg.cholesky(b))
        >>> rows = torch.eye(2, dtype=b.dtype)
        >>> torch.allclose(inv.variances(rows), torch.linalg.inv(b).diag())
        True
    """

    def __init__(self, factor: Tensor) -> None:
        self.factor = factor

    @staticmethod
    def build(operator, column: int) -> Optional[DenseInverse]:
        """Form ``B`` with the noise of target ``column`` of a
        :class:`~rfgp.inference._feature_operator.FeatureOperator` and factorise it; ``None``
        where the Cholesky fails in the operator's precision (the caller keeps to CG)."""
        with torch.no_grad():
            factor = try_cholesky(operator.dense(column))
        return None if factor is None else DenseInverse(factor)

    def roots(self, rows: Tensor) -> Tensor:
        r"""``(M, W)`` the rows of :math:`Z^H`, :math:`Z = L^{-1}\,\mathrm{rows}^H`."""
        factor = self.factor.to(rows.dtype)
        solved = torch.linalg.solve_triangular(factor, rows.transpose(0, 1).conj(), upper=False)
        return solved.transpose(0, 1).conj()

    def predict(self, rows: Tensor, want_root: bool) -> Tuple[Tensor, Optional[Tensor]]:
        """The variances ``(M,)`` and with ``want_root`` the covariance ``(M, M)``."""
        roots = self.roots(rows)
        return _squared_norms(roots), (_real_gram(roots) if want_root else None)

    def variances(self, rows: Tensor) -> Tensor:
        r"""``(M,)`` :math:`\phi_i B^{-1} \phi_i^H` of the query rows ``(M, W)``."""
        return _squared_norms(self.roots(rows))


def dense_fits(width: int, dtype: torch.dtype, device: torch.device) -> bool:
    """Whether ``B`` and its factor (``2 W^2`` numbers of ``dtype``) take at most a quarter of
    ``device``'s memory."""
    item = torch.empty((), dtype=dtype).element_size()
    return 2 * width * width * item <= available_memory(device) // 4


def dense_pays(width: int, rows: int, queries: int, iterations: float,
               preconditioner_rank: int = 0, rank: int = 0) -> bool:
    r"""Whether factorising :math:`B` costs fewer multiply-adds than refining ``queries`` rows
    by CG at ``iterations`` per row:

    .. math::
        N W^2 + \tfrac13 W^3 + M W^2 < M\,k\,\big(2 N W + 2 W (2 r_P + r)\big),

    the Gram, the Cholesky and a triangular solve per row against ``k`` products with
    :math:`B` per row, each with the preconditioner :math:`\hat B^{-1}` (rank ``r_P`` Nyström
    preconditioner and rank ``r`` low-rank form).

    Example:
        >>> dense_pays(8192, 13500, 1000, 6, 512, 2048), dense_pays(8192, 13500, 50, 6)
        (True, False)
    """
    return (dense_cost(width, rows, queries)
            < queries * refine_cost(width, rows, iterations, preconditioner_rank, rank))


def dense_cost(width: int, rows: int, queries: int) -> float:
    """Multiply-adds of the dense route for ``queries`` rows: the Gram ``N W^2``, the
    Cholesky ``W^3 / 3`` and a triangular solve ``W^2`` per row."""
    w = float(width)
    return float(rows) * w * w + w ** 3 / 3 + float(queries) * w * w


def refine_cost(width: int, rows: int, iterations: float, preconditioner_rank: int = 0,
                rank: int = 0) -> float:
    """Multiply-adds of refining one row by ``iterations`` CG iterations: a product with
    ``B`` (``2 N W``) and the preconditioner :math:`\\hat B^{-1}` (``2 W (2 r_P + r)``) each."""
    w = float(width)
    return iterations * (2.0 * rows * w + 2.0 * w * (2 * preconditioner_rank + rank))


def dense_first(eigenvalues: Tensor, width: int, rows: int, queries: int, tolerance: float,
                max_rank: int) -> bool:
    """Whether forming ``B`` now costs less than the low-rank form's forecast
    (:func:`forecast_form`) build plus, for each of ``queries`` rows, the form's application
    (``2 W (r_P + r)``) and, where its forecast bound exceeds the tolerance, its refinement.

    Example:
        >>> slow = 1e4 / torch.arange(1, 513, dtype=torch.float64)
        >>> dense_first(slow, 8192, 13500, 1000, 1e-2, 2048)
        True
        >>> dense_first(slow, 8192, 13500, 10, 1e-2, 2048)
        False
    """
    held = int(eigenvalues.shape[0])
    rank, _, build, iterations = forecast_form(eigenvalues, width, rows, tolerance, max_rank)
    per_row = refine_cost(width, rows, iterations, held, rank) + 2.0 * width * (held + rank)
    return dense_cost(width, rows, queries) < build + queries * per_row


def forecast_form(eigenvalues: Tensor, width: int, rows: int, tolerance: float,
                  max_rank: int) -> Tuple[int, float, float, int]:
    r"""The low-rank form's rank, bound, build cost and refining iterations, forecast before
    it is built from the preconditioner's eigenvalue estimates of :math:`B - I`.

    The preconditioner (rank :math:`r_P`) and a form of rank :math:`r` together hold about
    what a Nyström sketch of rank :math:`r_P + r` of :math:`B - I` holds, so the form's bound
    at rank :math:`r` is forecast as that sketch's residual
    (:func:`~rfgp.inference._cg_forecast.sketch_residual`) on the spectrum continued by its
    power law (:func:`~rfgp.inference._cg_forecast.spectrum_at`); the rank doubles from
    :data:`START_RANK` as :meth:`LowRankInverse.build` does. The build costs the sketch's
    columns and :data:`LANCZOS_STEPS` per doubling, :math:`2 N W` multiply-adds each, and
    :math:`8 W r^2` for each factorisation. Where the forecast bound exceeds the tolerance,
    the iterations of a refined row are those of CG on the modelled preconditioned spectrum
    to a residual :math:`\sqrt{
ho / \kappa}` (:math:`
ho` the tolerance,
    :math:`\kappa` the spectrum's condition number); else 0.

    Args:
        eigenvalues: ``(r_P,)`` the preconditioner's eigenvalue estimates.
        width, rows: ``W`` and ``N``.
        tolerance: the variance tolerance :math:`
ho`.
        max_rank: the form's rank cap.

    Returns:
        ``(rank, bound, multiply_adds, iterations)``.

    Example:
        >>> fast = 1e4 * torch.exp(-torch.arange(512.0, dtype=torch.float64) / 8)
        >>> slow = 1e4 / torch.arange(1, 513, dtype=torch.float64)
        >>> forecast_form(fast, 8192, 10**4, 1e-2, 2048)[0]
        128
        >>> rank, bound, _, iterations = forecast_form(slow, 8192, 10**4, 1e-2, 2048)
        >>> rank, bound > 1e-2, iterations > 0
        (2048, True, True)
    """
    held = int(eigenvalues.shape[0])
    spectrum = spectrum_at(eigenvalues, 1.0, width)
    limit = max(1, min(max_rank, width))
    rank, products, factorisations = min(START_RANK, limit), 0.0, 0.0
    while True:
        bound = sketch_residual(spectrum, held + rank)
        products += LANCZOS_STEPS
        factorisations += 8.0 * width * rank**2
        if bound <= tolerance or rank >= limit:
            break
        rank = min(2 * rank, limit)
    products += rank
    iterations = 0
    if bound > tolerance:
        shaped = preconditioned_spectrum(spectrum, held + rank)
        condition = float(1.0 / shaped.min()) if shaped.numel() else 1.0
        iterations = cg_iterations_on(shaped, math.sqrt(tolerance / condition))
    return rank, bound, products * 2.0 * rows * width + factorisations, iterations
