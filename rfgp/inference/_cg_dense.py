r"""The dense route of the iterative solve's predictive variances.

Where the low-rank form of :math:`B^{-1}` (:mod:`~rfgp.inference._cg_variance`) stays above
its tolerance, each query row costs several CG iterations. :class:`DenseInverse` instead forms
:math:`B = LL^H` once (``5 N W^2 / 8`` multiply-adds for the Gram's upper block triangle
(real features; ``N W^2`` complex), ``W^3/3`` for the Cholesky,
``W^2`` numbers twice) and answers every query exactly by a triangular solve,
:math:`\sigma^2_* = \|L^{-1}\phi_*^H\|^2`, in ``W^2`` multiply-adds per row. The solver
weighs the two routes on the rows of a prediction: before a form exists against its
forecast (:func:`dense_first`, :func:`forecast_form`), once it exists against the iterations
a refinement of :data:`PROBE_ROWS` rows measured (:func:`dense_pays`).

Internal: not part of the public API (see :mod:`rfgp.inference`).
"""

from __future__ import annotations

import math
from typing import List, Optional, Tuple

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
    "ITERATIVE_RATE_SHARE",
    "PROBE_ROWS",
    "DenseInverse",
    "dense_cost",
    "dense_first",
    "dense_fits",
    "dense_pays",
    "forecast_form",
    "form_build_cost",
    "keep_building",
    "refine_cost",
    "serving_cost",
]

#: query rows whose refinement measures the iterations per row before the dense route is
#: weighed against it
PROBE_ROWS = 32
#: The share of a large matrix product's multiply-add rate that the low-rank route's passes
#: reach. The dense route is one large product (the Gram) and a Cholesky factorisation, which
#: run at that rate; the form's build runs narrow Lanczos steps over the features (a block of
#: LANCZOS_RUNS columns, bound by memory; each counted as one product here), recomputes
#: the features at every pass and factorises many thin sketches, and a refinement applies
#: both preconditioners at every iteration. Measured on two cores, 15,640 features of
#: 15,641 rows: a build of 1.8e12 counted multiply-adds took 69 s and a refinement of 268
#: rows (one iteration each) 7 s for 1.7e11, where a 2,048-square product runs at
#: 5.9e10 per second, so 0.38 to 0.43 of the rate (measured with single-vector Lanczos steps
#: of 24 per bound, before LANCZOS_RUNS runs of LANCZOS_STEPS = 12).
ITERATIVE_RATE_SHARE = 0.4
#: The low-rank form's rank that :func:`serving_cost` books where no spectrum forecasts it:
#: the forms built on the bundled sets' default fits reached ranks 128 to 2,048 (1,024 on
#: the 51,522 rows of the largest, at 20,480 features).
SERVING_RANK = 1024


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
               preconditioner_rank: int = 0, rank: int = 0, weights: bool = True,
               by_rows: bool = False) -> bool:
    r"""Whether factorising :math:`B` costs less time than refining ``queries`` rows by CG at
    ``iterations`` per row:

    .. math::
        \tfrac58 N W^2 + \tfrac13 W^3 + M W^2 < M\,k\,\big(2 N W + 2 W (2 r_P + r)\big) / s,

    the Gram, the Cholesky and a triangular solve per row against ``k`` products with
    :math:`B` per row, each with the preconditioner :math:`\hat B^{-1}` (rank ``r_P`` Nyström
    preconditioner and rank ``r`` low-rank form), which run at the share
    :math:`s` = :data:`ITERATIVE_RATE_SHARE` of the dense route's rate (the left side
    that of the cheaper open form, :func:`dense_cost` with ``weights`` and ``by_rows``).

    Example:
        >>> dense_pays(8192, 13500, 1000, 6, 512, 2048), dense_pays(8192, 13500, 20, 6)
        (True, False)
    """
    return (dense_cost(width, rows, queries, weights, by_rows)
            < queries * refine_cost(width, rows, iterations, preconditioner_rank, rank)
            / ITERATIVE_RATE_SHARE)


def dense_cost(width: int, rows: int, queries: int, weights: bool = True,
               by_rows: bool = False) -> float:
    r"""Multiply-adds of the dense route for ``queries`` rows, on the cheaper of its open
    forms: ``B`` (``weights``: the Gram ``5 N W^2 / 8``, its upper block triangle,
    :func:`~rfgp.inference._statistics.accumulate_gram`, the Cholesky ``W^3 / 3`` and a
    triangular solve ``W^2`` per row) and the rows' ``K`` (``by_rows``,
    :class:`~rfgp.inference._cg_rows.RowDenseInverse`:
    ``N^2 W / 2``, ``N^3 / 3`` and ``N W + N^2`` per row); infinite where neither is open.

    Example:
        >>> n, m = 10_000, 1_000
        >>> round(dense_cost(2 * n, n, m, by_rows=True) / dense_cost(2 * n, n, m), 2)
        0.29
        >>> dense_cost(n // 2, n, m, by_rows=True) == dense_cost(n // 2, n, m)
        True
    """
    w, n, m = float(width), float(rows), float(queries)
    costs = [math.inf]
    if weights:
        costs.append(0.625 * n * w * w + w ** 3 / 3 + m * w * w)
    if by_rows:
        costs.append(n * n * w / 2 + n ** 3 / 3 + m * (n * w + n * n))
    return min(costs)


def refine_cost(width: int, rows: int, iterations: float, preconditioner_rank: int = 0,
                rank: int = 0) -> float:
    """Multiply-adds of refining one row by ``iterations`` CG iterations: a product with
    ``B`` (``2 N W``) and the preconditioner :math:`\\hat B^{-1}` (``2 W (2 r_P + r)``) each."""
    w = float(width)
    return iterations * (2.0 * rows * w + 2.0 * w * (2 * preconditioner_rank + rank))


def serving_cost(width: int, rows: int, queries: int, eigenvalues: Optional[Tensor] = None,
                 tolerance: float = 1e-2, max_rank: int = 2048, dense: bool = True,
                 by_rows: bool = False) -> float:
    r"""Multiply-adds, at the rate of the iterative passes (the cost model's), of an iterative
    fit's first predictive variances for ``queries`` rows on the cheaper of their routes.

    The low-rank form: forecast by :func:`forecast_form` from the eigenvalue estimates of
    :math:`B - I` (``eigenvalues``, the preconditioner's or a forecast of them), its build and
    per row its application :math:`2 W (r_P + r)` and, where its forecast bound exceeds the
    tolerance, its refinement (:func:`refine_cost`); without ``eigenvalues``, a form of rank
    :data:`SERVING_RANK` that meets the tolerance, beside a preconditioner of the same rank.
    The dense factor (where ``dense``: ``B`` fits in memory): :func:`dense_cost` at
    :data:`ITERATIVE_RATE_SHARE` of it, as one large product and a Cholesky factor run that
    many times faster than the passes:

    .. math::
        C = \min\big(C_{\text{form}} + M\,c_{\text{row}},\ s\,(\tfrac58 N W^2 + W^3/3 + M W^2)\big).

    Either is what a prediction with ``return_std`` pays once after the fit (the routes
    keep the form or the factor), and on a spectrum that decays slowly (little noise) it is
    as large as the fit: the recipe's final fit books it with the fit's own cost.

    Args:
        width, rows: ``W`` and ``N``.
        queries: ``M``, the rows of the prediction.
        eigenvalues: ``(r_P,)`` estimates of :math:`B - I`'s leading eigenvalues, or ``None``.
        tolerance: the variance tolerance :math:`\rho`.
        max_rank: the form's rank cap.
        dense: whether the dense route's ``B`` is open.
        by_rows: whether its rows' form is open (:class:`~rfgp.inference._cg_rows.
            RowDenseInverse`).

    Returns:
        Multiply-adds (a float).

    Example:
        >>> slow = 1e4 / torch.arange(1, 1025, dtype=torch.float64)
        >>> fast = 1e4 * torch.exp(-torch.arange(1024.0, dtype=torch.float64) / 8)
        >>> w, n, m = 8192, 13500, 1350
        >>> serving_cost(w, n, m, slow) == ITERATIVE_RATE_SHARE * dense_cost(w, n, m)
        True
        >>> quick, dear = serving_cost(w, n, m, fast), serving_cost(w, n, m, slow)
        >>> quick < dear < serving_cost(w, n, m, slow, dense=False)
        True
    """
    w = float(width)
    if eigenvalues is None:
        held = rank = min(SERVING_RANK, max(1, width))
        build, iterations = form_build_cost(width, rows, rank), 0
    else:
        held = int(eigenvalues.shape[0])
        rank, _, build, iterations = forecast_form(eigenvalues, width, rows, tolerance,
                                                   max_rank)
    per_row = refine_cost(width, rows, iterations, held, rank) + 2.0 * w * (held + rank)
    form = build + float(queries) * per_row
    return min(form, ITERATIVE_RATE_SHARE * dense_cost(width, rows, queries, dense, by_rows))


def dense_first(eigenvalues: Tensor, width: int, rows: int, queries: int, tolerance: float,
                max_rank: int, excess: Optional[float] = None, shift: float = 0.0,
                weights: bool = True, by_rows: bool = False) -> bool:
    """Whether forming ``B`` now costs less time than the low-rank form's forecast
    (:func:`forecast_form`, with the measured ``excess`` and the rounding ``shift``) build
    plus, for each of ``queries`` rows, the form's application (``2 W (r_P + r)``) and, where
    its forecast bound exceeds the tolerance, its refinement, at the share
    :data:`ITERATIVE_RATE_SHARE` of the dense route's rate (that of its cheaper open form:
    :func:`dense_cost` with ``weights`` and ``by_rows``).

    Example:
        >>> slow = 1e4 / torch.arange(1, 513, dtype=torch.float64)
        >>> fast = 1e4 * torch.exp(-torch.arange(512.0, dtype=torch.float64) / 8)
        >>> dense_first(slow, 8192, 13500, 1000, 1e-2, 2048)
        True
        >>> dense_first(fast, 8192, 13500, 1000, 1e-2, 2048)  # a form of rank 128 holds
        False
        >>> dense_first(slow, 8192, 13500, 1000, 1e-2, 2048, excess=5e-3)  # rank 0 holds
        False
    """
    held = int(eigenvalues.shape[0])
    rank, _, build, iterations = forecast_form(eigenvalues, width, rows, tolerance, max_rank,
                                               excess, shift)
    per_row = refine_cost(width, rows, iterations, held, rank) + 2.0 * width * (held + rank)
    form = build + queries * per_row
    return dense_cost(width, rows, queries, weights, by_rows) < form / ITERATIVE_RATE_SHARE


def forecast_form(eigenvalues: Tensor, width: int, rows: int, tolerance: float,
                  max_rank: int, excess: Optional[float] = None,
                  shift: float = 0.0) -> Tuple[int, float, float, int]:
    r"""The low-rank form's rank, bound, build cost and refining iterations, forecast before
    it is built from the preconditioner's eigenvalue estimates of :math:`B - I`.

    The preconditioner (rank :math:`r_P`) and a form of rank :math:`r` together hold about
    what a Nyström sketch of rank :math:`r_P + r` of :math:`B - I` holds, so the form's bound
    at rank :math:`r` is forecast as that sketch's residual
    (:func:`~rfgp.inference._cg_forecast.sketch_residual`) on the spectrum continued by its
    power law (:func:`~rfgp.inference._cg_forecast.spectrum_at`). Where the one-pass trace
    :math:`\mathrm{tr}(E + sI)` (``excess``, :func:`~rfgp.inference._cg_variance.
    excess_trace`) was measured, the continued spectrum beyond the preconditioner's
    :math:`r_P` is rescaled to the mass :math:`\mathrm{tr}\,E` it measures (a power law can
    overstate a spectrum that falls faster many times over), and where that trace is within
    the tolerance the form is of rank 0 at no further cost. The form sketches :math:`E + sI`
    (``shift`` :math:`s`, :func:`~rfgp.inference._cg_variance.rounding_shift`), whose
    neglected part's norm is at least ``s``: ``s`` is added to the forecast bound. The
    forecast is a model of a smooth spectrum; a few eigenvalues of :math:`E` above it make
    the form larger than forecast, which the build's own measured bounds show
    (:func:`keep_building`).

    The rank doubles from :data:`START_RANK` as :meth:`LowRankInverse.build` does. The build
    costs the sketch's columns and at most :data:`LANCZOS_STEPS` per doubling (a rank that
    keeps an eigenvalue above the tolerance runs none, one that fails may stop early; the
    forecast counts them all), :math:`2 N W` multiply-adds each, and :math:`8 W r^2` for
    each factorisation. Where the forecast bound
    exceeds the tolerance, the iterations of a refined row are those of CG on the modelled
    preconditioned spectrum to a residual :math:`\sqrt{\rho / \kappa}` (:math:`\rho` the
    tolerance, :math:`\kappa` the spectrum's condition number); else 0.

    Args:
        eigenvalues: ``(r_P,)`` the preconditioner's eigenvalue estimates.
        width, rows: ``W`` and ``N``.
        tolerance: the variance tolerance :math:`\rho`.
        max_rank: the form's rank cap.
        excess: the measured :math:`\mathrm{tr}(E + sI)` (default: not measured).
        shift: :math:`s` (default 0).

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
        >>> forecast_form(slow, 8192, 10**4, 1e-2, 2048, excess=5e-3)
        (0, 0.005, 0.0, 0)
    """
    if excess is not None and excess <= tolerance:
        return 0, float(excess), 0.0, 0
    held = int(eigenvalues.shape[0])
    spectrum = spectrum_at(eigenvalues, 1.0, width)
    if excess is not None and held < width:
        tail = spectrum[held:]
        mass = max(excess - shift * width, 0.0)
        modelled = float(tail.sum())
        spectrum = torch.cat([spectrum[:held], tail * (mass / modelled) if modelled > 0
                              else torch.full_like(tail, mass / tail.numel())])
        spectrum = spectrum.sort(descending=True).values
    limit = max(1, min(max_rank, width))
    rank = min(START_RANK, limit)
    while True:
        bound = sketch_residual(spectrum, held + rank) + shift
        if bound <= tolerance or rank >= limit:
            break
        rank = min(2 * rank, limit)
    iterations = 0
    if bound > tolerance:
        shaped = preconditioned_spectrum(spectrum, held + rank)
        condition = float(1.0 / shaped.min()) if shaped.numel() else 1.0
        iterations = cg_iterations_on(shaped, math.sqrt(tolerance / condition))
    return rank, bound, form_build_cost(width, rows, rank), iterations


def form_build_cost(width: int, rows: int, rank: int) -> float:
    """Multiply-adds of a low-rank form's build up to ``rank``, its rank doubling from
    :data:`START_RANK` (:meth:`LowRankInverse.build`): :data:`LANCZOS_STEPS` products per
    rank tried and ``rank`` sketch columns, ``2 N W`` each, and ``8 W r^2`` per
    factorisation.

    Example:
        >>> form_build_cost(1000, 100, 256) == (2 * 12 + 256) * 2 * 100 * 1000 + 8 * 1000 * (
        ...     128**2 + 256**2)
        True
    """
    w = float(width)
    size = min(START_RANK, rank)
    tried, factorisations = 1, 8.0 * w * size**2
    while size < rank:
        size = min(2 * size, rank)
        tried += 1
        factorisations += 8.0 * w * size**2
    return (tried * LANCZOS_STEPS + rank) * 2.0 * rows * w + factorisations


def keep_building(history: List[Tuple[int, float]], tolerance: float, shift: float,
                  max_rank: int, width: int, rows: int, queries: int, weights: bool = True,
                  by_rows: bool = False) -> bool:
    r"""Whether a low-rank form's build should go on doubling, from the bounds it measured.

    After two ranks, the bound's excess over the ``shift`` (which no rank removes) is taken
    to fall by the last doubling's measured factor :math:`q` at every further doubling: the
    tolerance is reached after :math:`\lceil \log((\rho - s) / (b - s)) / \log q \rceil`
    more. The build stops where that rank exceeds ``max_rank`` (or :math:`q \ge 1`, or
    :math:`\rho \le s`), or where the rest of the build (the new sketch columns and
    :data:`LANCZOS_STEPS` per doubling, ``2 N W`` each, and ``8 W r^2`` per factorisation)
    costs more time, at :data:`ITERATIVE_RATE_SHARE` of the rate, than forming ``B`` for the
    ``queries`` rows (:func:`dense_cost`). The form it stopped at still preconditions a
    refinement, and the dense route is weighed against that (:func:`dense_pays`).

    Args:
        history: ``(rank, bound)`` of every rank built so far, all above the tolerance.
        tolerance: :math:`\rho`.
        shift: :math:`s` (:func:`~rfgp.inference._cg_variance.rounding_shift`).
        max_rank: the form's rank cap.
        width, rows, queries: ``W``, ``N`` and the rows asked for.
        weights, by_rows: the dense route's open forms (:func:`dense_cost`).

    Example:
        >>> slow = [(128, 0.027), (256, 0.0256)]  # 5% a doubling: 1e-2 is out of reach
        >>> keep_building(slow, 1e-2, 2.8e-3, 2048, 15640, 15641, 1738)
        False
        >>> fast = [(128, 0.08), (256, 0.04)]  # halves: 1e-2 at 1024
        >>> keep_building(fast, 1e-2, 2.8e-3, 2048, 15640, 15641, 1738)
        True
    """
    if len(history) < 2:
        return True
    (_, before), (rank, bound) = history[-2], history[-1]
    if tolerance <= shift or bound <= shift or before <= shift:
        return False
    factor = (bound - shift) / (before - shift)
    if factor >= 1.0:
        return False
    doublings = math.ceil(math.log((tolerance - shift) / (bound - shift)) / math.log(factor))
    limit = max(1, min(max_rank, width))
    if doublings > math.log2(limit / rank):
        return False
    w, remaining = float(width), 0.0
    for _ in range(doublings):
        rank *= 2
        remaining += (rank / 2 + LANCZOS_STEPS) * 2.0 * rows * w + 8.0 * w * rank**2
    return remaining / ITERATIVE_RATE_SHARE < dense_cost(width, rows, queries, weights,
                                                          by_rows)
