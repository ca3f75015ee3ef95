r"""The routes of an iterative solve's predictive variances, per noise group.

A variance :math:`\phi_* B^{-1} \phi_*^H` of a ``solve="cg"`` fit takes one of four routes:

* ``"lowrank"``: the low-rank form of :math:`B^{-1}` (:mod:`~rfgp.inference._cg_variance`),
  where its bound :math:`\tau` is at most the settings' ``variance_bound`` (:math:`2t / (1 -
  t)` at the tolerance :math:`t`), its variances scaled by
  :func:`served_factor` where :math:`\tau > t`;
* ``"refined"``: CG per query row, preconditioned by the form, where its bound does not;
* ``"dense"``: the Cholesky factor of :math:`B` (:mod:`~rfgp.inference._cg_dense`), or of the
  rows' :math:`K = I + \Psi\Psi^H` where that is cheaper (more features than rows, every
  feature kept), where forming it costs less than either, for the rows of the prediction;
* ``"exact"``: CG per query row from zero (``cg_variance="exact"``).

:class:`VarianceRoutes` holds what the routes build once per fit (the forms, the dense
factors, the one-pass traces, the iterations a refinement measured) and chooses between them;
:meth:`~VarianceRoutes.forget` drops all of it when the fit, its noise or its dtype change.

Internal: not part of the public API (see :mod:`rfgp.inference`).
"""

from __future__ import annotations

import math
from typing import Callable, Dict, List, Optional, Tuple

import torch
from torch import Tensor

from rfgp.inference._cg_dense import (
    PROBE_ROWS,
    DenseInverse,
    dense_cost,
    dense_first,
    dense_fits,
    dense_pays,
    keep_building,
)
from rfgp.inference._cg_rows import RowDenseInverse, row_precision_holds
from rfgp.inference._cg_variance import (
    START_RANK,
    LowRankInverse,
    excess_trace,
    group_inverses,
    group_trace,
    rounding_shift,
    solved_variances,
    variance_rank_cap,
)

__all__ = ["FLOOR_OPEN_ROWS", "VarianceRoutes", "certified", "floor_bound", "served_factor",
           "serving_bound"]

#: With a noise floor, the query rows (per prediction) that the low-rank form's build may
#: leave uncertified, to be refined by CG: preconditioned by a form of bound tau (condition
#: number at most 1 + tau) a refinement takes a few iterations, one product with B per row
#: each, so this many rows cost about as much as the form's first doubling (START_RANK
#: products), and stopping the build there never costs more than another doubling would.
FLOOR_OPEN_ROWS = START_RANK // 2


class VarianceRoutes:
    """The variance routes of one :class:`~rfgp.inference._cg_solver.ConjugateGradientSolver`
    (its ``operator``, ``settings``, ``preconditioners``, noise groups and rows).

    Args:
        solver: the fitted iterative solver whose variances are asked for.

    Example:
        >>> from rfgp import RandomFeatureGP
        >>> from rfgp.kernels import FourierFeatureKernel
        >>> x = torch.rand(200, 2, dtype=torch.float64)
        >>> gp = RandomFeatureGP(FourierFeatureKernel(128, seed=0).double(), noise=0.01,
        ...                      solve="cg").fit(x, torch.sin(6 * x[:, 0]))
        >>> _ = gp.predict(x[:5], return_std=True)
        >>> gp._state.solver.routes.taken[0] in ("lowrank", "refined", "dense")
        True
    """

    def __init__(self, solver) -> None:
        self.solver = solver
        self.forget()

    def forget(self) -> None:
        """Drop the low-rank forms, dense factors, traces and measured iterations (a new fit,
        noise or dtype)."""
        #: per noise group: the low-rank form of B^-1, built at the first variance
        self.low_rank: Dict[int, LowRankInverse] = {}
        #: per noise group: a DenseInverse once the dense route paid, False where it cannot
        #: (memory, precision, a failed factorisation)
        self.dense: Dict[int, object] = {}
        #: per noise group: the CG iterations per row a refinement measured
        self.refine_iterations: Dict[int, int] = {}
        #: per noise group: the one-pass trace (t, m) the forecast took, kept for the form
        self.traces: Dict[int, Tuple[float, float]] = {}
        #: per noise group: the route of the last variances
        self.taken: Dict[int, str] = {}
        #: per noise group: whether the form's build stopped where it certified the rows of
        #: new observations (above the latent tolerance)
        self.stopped: Dict[int, bool] = {}

    def variances(self, g: int, column: int, feats: Tensor, want_root: bool,
                  floor: float = 0.0) -> Tuple[Tensor, Optional[Tensor]]:
        r"""Noise group ``g``'s variances (and covariance) of the query features ``(M, W)``.

        With ``variance="auto"`` and room for ``B``, before any low-rank form exists, the
        dense factor is formed at once where it costs less than the form's forecast build and
        refinement for the rows asked for (:meth:`dense_first`). Otherwise: the low-rank form
        where its bound meets the tolerance; else (``"auto"``) the dense factor where it pays
        for these rows (weighed on the iterations a refinement of
        :data:`~rfgp.inference._cg_dense.PROBE_ROWS` rows measured); else CG per row
        preconditioned by the form.

        With a noise variance ``floor`` :math:`s > 0` (the variances of new observations,
        without the covariance) each variance :math:`\sigma^2` is wanted within the tolerance
        :math:`t` of :math:`\sigma^2 + s`, not of :math:`\sigma^2`: a form of bound
        :math:`\tau` serves a row as it is where its :math:`\hat\sigma^2` certifies that
        (:func:`certified`), the form's build stops at the first rank that leaves at most
        :data:`FLOOR_OPEN_ROWS` rows (in proportion to the prediction's rows) uncertified
        instead of at the latent tolerance, and only the uncertified rows go on to the dense
        factor or to a refinement, whose CG stops at :math:`t\,(\phi^H u + s)`. The dense
        factor is then weighed before the form against the form's forecast at the bound that
        certifies a typical row (:func:`floor_bound` of the mean :math:`v_i / s_i` over the
        training rows), not at the latent tolerance, which overstates the form's cost by far
        where the noise dominates."""
        solver, settings = self.solver, self.solver.settings
        if settings.variance == "exact":
            self.taken[g] = "exact"
            return solved_variances(solver, column, feats, want_root)
        floor = 0.0 if want_root else float(floor)
        tolerance = settings.variance_tolerance
        serves = settings.variance_bound  # the largest bound a (scaled) form serves at
        rows = max(feats.shape[0], solver.expected_rows)
        auto = settings.variance == "auto"
        dense = self.dense.get(g)
        # the dense route's open forms, once per call (a collective all-reduce when distributed)
        forms = self.dense_forms() if dense is None and auto else (False, False)
        if (any(forms) and g not in self.low_rank
                and self.dense_first(g, rows, floor, forms)):
            dense = self.dense[g] = self.build_dense(column, rows, forms) or False
        served, open_rows = None, None
        if not dense:
            possible = any(forms)
            serving = None
            if floor > 0.0:
                allowed = int(FLOOR_OPEN_ROWS * feats.shape[0] / rows)
                queries = feats.detach()

                def serving(form: LowRankInverse) -> float:
                    with torch.no_grad():
                        values = form.variances(queries)
                    return serving_bound(values, tolerance, floor, allowed)

            low = self.low_rank_inverse(g, rows if possible else None, serving, forms)
            if low.bound <= serves:
                self.taken[g] = "lowrank"
                variances, covariance = low.predict(feats, want_root)
                k = served_factor(low.bound, tolerance)
                if k == 1.0:
                    return variances, covariance
                return variances * k, (None if covariance is None else covariance * k)
            if floor > 0.0:
                served, _ = low.predict(feats, False)
                open_rows = ~certified(served.detach(), low.bound, tolerance, floor)
                if not bool(open_rows.any()):
                    self.taken[g] = "lowrank"
                    return served, None
                rows = math.ceil(rows * int(open_rows.sum()) / feats.shape[0])
                feats = feats[open_rows]
            if possible:
                iterations = self.refine_iterations.get(g)
                if iterations is None and rows > PROBE_ROWS:
                    record: dict = {}
                    solved_variances(solver, column, feats[:PROBE_ROWS].detach(), False, low,
                                     tolerance, record, floor)
                    iterations = self.refine_iterations[g] = record["iterations"]
                pre = solver.preconditioners[g]
                if iterations is not None and dense_pays(solver.operator.width,
                                                         solver.num_rows, rows, iterations,
                                                         pre.rank, low.rank, *forms):
                    dense = self.dense[g] = self.build_dense(column, rows, forms) or False
        if dense:
            self.taken[g] = "dense"
            out = dense.predict(feats, want_root)
        else:
            self.taken[g] = "refined"
            record = {}
            out = solved_variances(solver, column, feats, want_root, self.low_rank[g],
                                   tolerance, record, floor)
            self.refine_iterations.setdefault(g, record["iterations"])
        if open_rows is None:
            return out
        # the certified rows from the form, the others from the route they took
        variances = served.clone()
        variances[open_rows] = out[0].to(variances.dtype)
        return variances, None

    def dense_first(self, g: int, rows: int, floor: float = 0.0,
                    forms: Optional[Tuple[bool, bool]] = None) -> bool:
        r"""Whether forming ``B`` now costs less than group ``g``'s low-rank form as forecast
        for ``rows`` rows (:func:`~rfgp.inference._cg_dense.dense_first`), on the
        preconditioner's eigenvalues and the one-pass trace of the excess (kept: the form
        needs it anyway).

        With a noise ``floor`` (the variances of new observations) the form need only reach
        the bound that certifies a row of the typical ratio :math:`\rho = v / s`
        (:func:`floor_bound`): over the training rows the mean of :math:`v_i / s_i` is
        :math:`\mathrm{tr}(B^{-1}(B - I)) / N`, the effective degrees of freedom per row, at
        most the trace's :math:`t / N` (the held eigenvalues enter it as
        :math:`\lambda / (1 + \lambda)`, the rest whole). A row whose variance exceeds the
        typical one still gets its own certificate from whichever route is taken.
        ``forms``: :meth:`dense_forms`, where the caller has them."""
        solver = self.solver
        pre = solver.preconditioners[g]
        forms = self.dense_forms() if forms is None else forms
        if not pre.rank or not any(forms):
            return False
        op = solver.operator
        cap = variance_rank_cap(op, solver.settings)
        trace = self.traces[g] = group_trace(op, solver.groups()[g][0], pre)
        bound = solver.settings.variance_bound
        if floor > 0.0:
            ratio = trace[0] / max(solver.num_rows, 1)
            bound = max(bound, floor_bound(ratio, solver.settings.variance_tolerance))
            if not math.isfinite(bound):  # the trace certifies every row: no form to build
                return False
        return dense_first(pre.eigenvalues, op.width, solver.num_rows, rows, bound, cap,
                           excess_trace(pre, trace, op.width), rounding_shift(pre, op.width),
                           *forms)

    def dense_forms(self) -> Tuple[bool, bool]:
        r"""``(weights, rows)``: whether ``B`` may be formed, and whether the rows' ``K``
        may (:class:`~rfgp.inference._cg_dense.RowDenseInverse`).

        ``B``: it fits in a quarter of the memory, and its Cholesky factor's relative error
        (about :math:`\kappa(B)\,\epsilon`, :math:`\kappa(B)` from the preconditioners' top
        eigenvalues) is a tenth of the variance tolerance. ``K``: fewer rows than features,
        every feature kept in memory (never rows on a source or sharded over processes), ``K``
        fits in a quarter of the memory, and the difference it answers by keeps a tenth of
        the tolerance (:func:`~rfgp.inference._cg_dense.row_precision_holds`)."""
        solver = self.solver
        op = solver.operator
        largest = max((float(p.eigenvalues.max()) for p in solver.preconditioners if p.rank),
                      default=0.0)
        tolerance = solver.settings.variance_tolerance
        eps = torch.finfo(op.dtype).eps
        weights = (dense_fits(op.width, op.vector_dtype, op.device)
                   and (1.0 + largest) * eps <= 0.1 * tolerance)
        if op.distributed:  # a collective decision: forming B all-reduces it
            refusals = op.reduce(torch.tensor([0.0 if weights else 1.0], dtype=torch.float64,
                                              device=op.device))
            return float(refusals) == 0.0, False
        rows = (solver.num_rows < op.width and op.holds_all()
                and dense_fits(solver.num_rows, op.vector_dtype, op.device)
                and row_precision_holds(largest, op.dtype, tolerance))
        return weights, rows

    def build_dense(self, column: int, queries: int, forms: Tuple[bool, bool]):
        """The dense factor for target ``column``: of the rows' ``K`` where that form is open
        and costs less for ``queries`` rows (:func:`~rfgp.inference._cg_dense.dense_cost`),
        else of ``B`` where open (``forms``: :meth:`dense_forms`); ``None`` where the
        factorisation failed and no other form is open."""
        op, n = self.solver.operator, self.solver.num_rows
        weights, rows = forms
        if rows and (not weights or dense_cost(op.width, n, queries, False, True)
                     < dense_cost(op.width, n, queries)):
            built = RowDenseInverse.build(op, column)
            if built is not None or not weights:
                return built
        return DenseInverse.build(op, column) if weights else None

    def low_rank_inverse(self, g: int, queries: Optional[int] = None,
                         serves: Optional[Callable[[LowRankInverse], float]] = None,
                         forms: Optional[Tuple[bool, bool]] = None) -> LowRankInverse:
        """Noise group ``g``'s low-rank :math:`B^{-1}` of the variances, built at its first
        use after a fit (a collective call under ``torch.distributed``). With ``queries``
        (the rows asked for, where the dense route is open), the build stops at the rank
        where its measured bounds show it will not pay (:func:`~rfgp.inference._cg_dense.
        keep_building`, weighed against the dense route's open ``forms``, :meth:`dense_forms`
        where not given); with ``serves`` at the first rank whose bound is within what it
        says that rank serves at (:meth:`LowRankInverse.build`). A form stopped there serves
        the rows of new observations it was built for, not the latent tolerance: a call
        without ``serves`` builds the form again."""
        if g in self.low_rank and serves is None and self.stopped.get(g):
            del self.low_rank[g]
        if g not in self.low_rank:
            solver = self.solver
            pre, op = solver.preconditioners[g], solver.operator
            latent = solver.settings.variance_bound
            # the bound the last rank would serve at (its rows' floor), else the latent one's
            accepts = [latent]

            def accept(form: LowRankInverse) -> float:
                accepts.append(max(latent, serves(form)))
                return accepts[-1]

            proceed = None
            cap = variance_rank_cap(op, solver.settings)
            if queries is not None:
                shift = rounding_shift(pre, op.width)
                forms = self.dense_forms() if forms is None else forms

                def proceed(history, cap=cap, shift=shift, forms=forms) -> bool:
                    # extrapolated towards what the last rank serves at: with a floor, the
                    # rows' bound, not the latent tolerance
                    return keep_building(history, accepts[-1], shift, cap, op.width,
                                         solver.num_rows, queries, *forms)

            (self.low_rank[g],) = group_inverses(op, [solver.groups()[g]], [pre],
                                                 solver.settings, [self.traces.get(g)],
                                                 proceed, None if serves is None else accept)
            form = self.low_rank[g]
            # stopped below the cap at a bound its rows' floor accepts, not the latent one
            self.stopped[g] = (latent < form.bound <= accepts[-1]
                               and form.rank < min(cap, op.width))
        return self.low_rank[g]

    def low_rank_inverses(self) -> List[LowRankInverse]:
        """Per noise group, the low-rank :math:`B^{-1}` (built where missing)."""
        return [self.low_rank_inverse(g) for g in range(len(self.solver.preconditioners))]


def served_factor(bound: float, tolerance: float) -> float:
    r"""The factor :math:`k = \min(1, (1 + t) / (1 + \tau))` on a low-rank form's variances
    (bound :math:`\tau`, tolerance :math:`t`) that keeps each within :math:`t` of the exact
    one: the form's :math:`\hat v \in [v, (1 + \tau) v]` gives :math:`k \hat v \in [k v,
    (1 + t) v]`, and :math:`k \ge 1 - t` wherever :math:`\tau \le 2t / (1 - t)`. The form
    is left as it is (an upper bound of every variance) where :math:`\tau \le t`: there its
    own bracket already meets the tolerance, and its typical error, well below its worst
    case, is not traded for a smaller worst case.

    Example:
        >>> served_factor(0.005, 0.01), round(served_factor(0.019, 0.01), 6)
        (1.0, 0.991168)
    """
    return min(1.0, (1.0 + tolerance) / (1.0 + bound))


def certified(variances: Tensor, bound: float, tolerance: float, floor: float) -> Tensor:
    r"""``(M,)``: whether a form's variance :math:`\hat v` (bound :math:`\tau`) is, as it
    is, within the tolerance :math:`t` of :math:`v + s` (the variance of a new observation,
    noise :math:`s`). The form gives :math:`v \le \hat v \le (1 + \tau) v`, so its error
    :math:`\hat v - v \le \hat v\,\tau / (1 + \tau)` and :math:`v + s \ge \hat v / (1 +
    \tau) + s`; the first is at most :math:`t` times the second where :math:`\hat v\,(\tau -
    t) \le t\,s\,(1 + \tau)`, for every row where :math:`\tau \le t`.

    Example:
        >>> v = torch.tensor([0.001, 0.01, 0.1], dtype=torch.float64)
        >>> certified(v, 0.1, 0.01, 0.05).tolist()  # rows up to 0.0061 at noise 0.05
        [True, False, False]
        >>> certified(v, 0.005, 0.01, 0.0).all().item()
        True
        >>> certified(v, float("inf"), 0.01, 0.5).tolist()  # rows up to t s = 0.005
        [True, False, False]
    """
    if bound <= tolerance:
        return torch.ones_like(variances, dtype=torch.bool)
    # v_hat <= t s (1 + tau) / (tau - t), which falls to t s as tau grows: without a finite
    # bound the form is an upper bound alone, and error <= v_hat <= t s <= t (v + s) still
    ratio = (1.0 + bound) / (bound - tolerance) if math.isfinite(bound) else 1.0
    return variances <= tolerance * floor * ratio


def floor_bound(ratio: float, tolerance: float) -> float:
    r"""The largest bound :math:`\tau` at which a form certifies (:func:`certified`) a row
    whose variance is ``ratio`` :math:`\rho = v / s` times the noise floor :math:`s`, at the
    tolerance :math:`t`: :math:`\tau = t\,(\rho + 1) / (\rho - t)` where :math:`\rho > t`,
    else any (infinite). A variance far above the noise needs the latent tolerance
    (:math:`\tau \to t`), one at the noise's level about twice it, one far below none.

    Example:
        >>> round(floor_bound(1e6, 0.01), 6), round(floor_bound(1.0, 0.01), 4)
        (0.01, 0.0202)
        >>> floor_bound(0.005, 0.01)
        inf
    """
    if ratio <= tolerance:
        return math.inf
    return tolerance * (ratio + 1.0) / (ratio - tolerance)


def serving_bound(variances: Tensor, tolerance: float, floor: float, allowed: int) -> float:
    r"""The largest bound :math:`\tau` at which a form with these ``variances`` leaves at most
    ``allowed`` rows uncertified (:func:`certified`): a row is certified up to
    :math:`\tau_i = t\,(\hat v_i + s) / (\hat v_i - t s)` (any :math:`\tau` where
    :math:`\hat v_i \le t s`), and the answer is the ``allowed + 1``-th smallest
    :math:`\tau_i` (infinite where there are at most ``allowed`` rows).

    Example:
        >>> v = torch.tensor([0.001, 0.01, 0.1], dtype=torch.float64)
        >>> round(serving_bound(v, 0.01, 0.05, 0), 4), round(serving_bound(v, 0.01, 0.05, 1), 4)
        (0.0151, 0.0632)
    """
    if allowed >= variances.numel():
        return math.inf
    excess = variances.double() - tolerance * floor
    each = torch.where(excess > 0, tolerance * (variances.double() + floor)
                       / excess.clamp_min(torch.finfo(torch.float64).tiny),
                       torch.full_like(excess, math.inf))
    return float(torch.sort(each).values[allowed])
