r"""Predictive variances of the iterative solve from a low-rank form of :math:`B^{-1}`.

The iterative solver's preconditioner :math:`P = I + U\Lambda U^H` under-approximates
:math:`B = \Phi^H S^{-1}\Phi + I` (:math:`P \preceq B`: its :math:`U\Lambda U^H` is a Nyström
approximation of the positive semi-definite :math:`B - I`). So the preconditioned matrix
:math:`M = P^{-1/2} B P^{-1/2} = I + E` has a positive semi-definite excess :math:`E`, with few
eigenvalues far from 0 where preconditioned CG converges quickly. A randomized Nyström
approximation :math:`\hat E = V\,\mathrm{diag}(s)\,V^H \preceq E` of rank :math:`r` (``r``
products with :math:`B`, made once per fit) gives

.. math::
    B^{-1} \approx P^{-1/2}\big(I - V\,\mathrm{diag}\big(\tfrac{s}{1+s}\big)V^H\big)P^{-1/2}
    = P^{-1/2}(I + \hat E)^{-1}P^{-1/2},

and the predictive variance of a query row :math:`\phi_*` (real or complex),
:math:`\sigma^2_* = \|z\|^2 - \|\mathrm{diag}(\sqrt{s/(1+s)})\,V^H z\|^2` with
:math:`z = P^{-1/2}\bar\phi_*`, in :math:`O(W(r_P + r))` per query instead of a CG solve.

**Error.** With :math:`F = E - \hat E \succeq 0` and :math:`\tau \ge \|F\|`,
:math:`I + E \preceq (1 + \tau)(I + \hat E)` as :math:`I + \hat E \succeq I`; hence, for the
approximate covariance :math:`\hat\Sigma` and the exact :math:`\Sigma` of any set of queries,

.. math::
    \Sigma \preceq \hat\Sigma \preceq (1 + \tau)\,\Sigma ,

so every variance is an upper bound, at most :math:`1 + \tau` times the exact one (a standard
deviation at most :math:`\sqrt{1+\tau}` times). At a tolerance :math:`t` a form with
:math:`\tau \le t` serves as it is; one with :math:`t < \tau \le 2t / (1 - t)` serves scaled by
:math:`k = (1 + t) / (1 + \tau)` (:func:`~rfgp.inference._cg_routes.served_factor`), which
keeps every variance within :math:`t` of the exact one, either way (:math:`k(1 + \tau) = 1 + t`
and :math:`k \ge 1 - t`): on keggundirected's 20,480-feature default the form reached
:math:`\tau = 0.019` at its rank cap, and without the scaling every one of the 6,361 test rows
was refined by CG. :math:`\tau` is a probabilistic bound on :math:`\|F\|`: the largest Ritz
value :math:`\theta` of :data:`LANCZOS_RUNS` independent runs of :data:`LANCZOS_STEPS`
Lanczos steps on :math:`F` from random starts, divided by :math:`1 - \epsilon`, where by
Kuczyński and Woźniakowski's bound :math:`P(\theta < (1 - \epsilon)\|F\|) \le
1.648\sqrt{n}\, e^{-\sqrt{\epsilon}(2k - 1)}` for one run of ``k`` steps on an
``n``-dimensional space, :math:`\epsilon` chosen so that the probability that every run falls
short is :data:`FAILURE_PROBABILITY` (:func:`norm_bound`). The rank doubles from
:data:`START_RANK` until :math:`\tau` is below the requested bound (the settings'
``variance_bound``, :math:`2t / (1 - t)`), up to ``W`` (where the sketch is exact) or a cap.
Where the cap leaves :math:`\tau` above the tolerance (a Gram spectrum that decays slowly),
:func:`solved_variances` refines each query by CG preconditioned with the low-rank form: its
condition number is at most :math:`1 + \tau`, so a few iterations reach a certified relative
tolerance.

The dense route (a Cholesky factor of :math:`B` where it costs less) is
:mod:`~rfgp.inference._cg_dense`.

References:
    Frangella, Tropp & Udell, *Randomized Nyström Preconditioning*, 2023 (the sketch).
    Kuczyński & Woźniakowski, *Estimating the Largest Eigenvalue by the Power and Lanczos
    Algorithms with a Random Start*, SIAM J. Matrix Anal. Appl. 13(4), 1992.

Internal: not part of the public API (see :mod:`rfgp.inference`).
"""

from __future__ import annotations

import math
from typing import Callable, List, Optional, Tuple

import torch
from torch import Tensor

from rfgp.inference._iterative import conjugate_gradients
from rfgp.inference._lanczos_bound import (
    FAILURE_PROBABILITY,
    LANCZOS_RUNS,
    LANCZOS_STEPS,
    norm_bound,
)
from rfgp.inference._nystrom import NystromPreconditioner, NystromSketch, rank_memory_cap

__all__ = [
    "FAILURE_PROBABILITY",
    "LANCZOS_RUNS",
    "LANCZOS_STEPS",
    "LowRankInverse",
    "START_RANK",
    "group_inverses",
    "group_trace",
    "excess_trace",
    "norm_bound",
    "rounding_shift",
    "variance_rank_cap",
    "solved_variances",
]

#: the rank of the first sketch of the excess E; it doubles from here
START_RANK = 128


class LowRankInverse:
    r""":math:`B^{-1} \approx P^{-1/2}(I - V\,\mathrm{diag}(c)\,V^H)P^{-1/2}`,
    :math:`c = s / (1 + s)` (see the module docstring), with its error bound.

    Args:
        preconditioner: :math:`P` (``U`` ``(W, r_P)``, :math:`\Lambda`).
        basis: ``V`` ``(W, r)``, orthonormal columns.
        eigenvalues: ``s`` ``(r,)``, non-negative.
        bound: :math:`\tau`: :math:`\Sigma \preceq \hat\Sigma \preceq (1 + \tau)\Sigma`.
        products: the columns multiplied by :math:`B` to build it (sketch and bound).

    Example:
        >>> b = torch.diag(torch.tensor([101.0, 11.0, 2.0, 1.0], dtype=torch.float64))
        >>> pre = NystromPreconditioner(torch.eye(4, 1, dtype=b.dtype), torch.tensor([90.0]))
        >>> inv = LowRankInverse.build(lambda v: b @ v, pre, 1e-8, 4)
        >>> rows = torch.eye(4, dtype=b.dtype)
        >>> torch.allclose(inv.variances(rows), 1 / b.diag()), inv.bound < 1e-8
        (True, True)
    """

    def __init__(self, preconditioner: NystromPreconditioner, basis: Tensor, eigenvalues: Tensor,
                 bound: float, products: int = 0) -> None:
        self.preconditioner = preconditioner
        self.basis = basis
        self.eigenvalues = eigenvalues
        self.bound = bound
        self.products = products

    @property
    def rank(self) -> int:
        return int(self.eigenvalues.shape[0])

    # ------------------------------------------------------------------ queries
    def roots(self, rows: Tensor) -> Tuple[Tensor, Tensor]:
        r"""``Z = rows P^{-1/2}`` ``(M, W)`` and ``Y = Z V diag(sqrt(c))`` ``(M, r)``, so that
        :math:`\mathrm{rows}\,\hat B^{-1}\mathrm{rows}^H = Z Z^H - Y Y^H`."""
        pre = self.preconditioner
        u = pre.basis.to(rows.dtype)
        inner = rows @ u  # (M, r_P)
        # rows (I - U U^H) + rows U (1 + Lambda)^-1/2 U^H = rows + rows U ((1 + Lambda)^-1/2
        # - 1) U^H: rows P^-1/2, P^-1/2 Hermitian, in one product with U^H instead of two
        scale = (1.0 + pre.eigenvalues).rsqrt().to(rows.dtype) - 1.0
        whitened = rows + (inner * scale) @ u.transpose(0, 1).conj()  # (M, W)
        weight = (self.eigenvalues / (1.0 + self.eigenvalues)).sqrt().to(rows.dtype)
        return whitened, (whitened @ self.basis.to(rows.dtype)) * weight  # (M, W), (M, r)

    def inverse(self, v: Tensor) -> Tensor:
        r""":math:`\hat B^{-1} V` for ``(W, k)`` columns (a preconditioner :math:`\hat B
        \preceq B`, up to rounding)."""
        pre = self.preconditioner
        whitened = pre.inverse_sqrt(v)
        basis = self.basis.to(v.dtype)
        weight = (self.eigenvalues / (1.0 + self.eigenvalues)).to(v.dtype).unsqueeze(-1)
        return pre.inverse_sqrt(whitened - basis @ (weight * (basis.transpose(0, 1).conj()
                                                              @ whitened)))

    def predict(self, rows: Tensor, want_root: bool) -> Tuple[Tensor, Optional[Tensor]]:
        """:meth:`variances`, and with ``want_root`` :meth:`covariance`, from one projection."""
        whitened, projected = self.roots(rows)
        variances = _squared_norms(whitened) - _squared_norms(projected)
        if not want_root:
            return variances, None
        return variances, _real_gram(whitened) - _real_gram(projected)

    def variances(self, rows: Tensor) -> Tensor:
        r"""``(M,)`` :math:`\phi_i \hat B^{-1} \phi_i^H` of the query rows ``rows`` ``(M, W)``
        (differentiable in ``rows``)."""
        whitened, projected = self.roots(rows)
        return _squared_norms(whitened) - _squared_norms(projected)

    def covariance(self, rows: Tensor) -> Tensor:
        r"""``(M, M)`` :math:`\mathrm{Re}\{\Phi_* \hat B^{-1} \Phi_*^H\}` (differentiable)."""
        whitened, projected = self.roots(rows)
        return _real_gram(whitened) - _real_gram(projected)

    # ------------------------------------------------------------------ construction
    @staticmethod
    def build(apply: Callable[[Tensor], Tensor], preconditioner: NystromPreconditioner,
              tolerance: float, max_rank: int, width: Optional[int] = None,
              generator: Optional[torch.Generator] = None,
              trace: Optional[Tuple[float, float]] = None,
              proceed: Optional[Callable[[List[Tuple[int, float]]], bool]] = None,
              serves: Optional[Callable[[LowRankInverse], float]] = None
              ) -> LowRankInverse:
        r"""Sketch :math:`E` at rank :data:`START_RANK`, doubling until the bound :math:`\tau`
        is at most ``tolerance`` or the rank reaches ``min(max_rank, W)``.

        With ``trace`` :math:`(t, m)` (:meth:`~rfgp.inference._feature_operator.
        FeatureOperator.preconditioned_trace`), :math:`\mathrm{tr}\,E = t +
        \sum_j (1/(1 + \lambda_j) - 1)` bounds the neglected part deterministically: it is
        positive semi-definite, so :math:`\|F\| \le \mathrm{tr}\,F = \mathrm{tr}\,E -
        \sum_i s_i` (plus rounding allowances, :math:`m` the size of the sum). Where that is
        within the tolerance no Lanczos run is needed, and where :math:`\mathrm{tr}\,E` is,
        no sketch (rank 0: nearly no signal in the features).

        Args:
            apply: ``V -> B V`` on ``(W, k)`` blocks (a collective call under
                ``torch.distributed``: every process draws the same test vectors).
            preconditioner: :math:`P \preceq B`.
            tolerance: the wanted :math:`\tau`.
            max_rank: a cap on ``r``.
            width: ``W`` (default: the preconditioner's).
            generator: of the test vectors, on the CPU (a fixed seed without one).
            trace: ``(t, m)`` as above (default: the Lanczos bound alone).
            proceed: called with the ``(rank, bound)`` of every rank so far where the bound
                still exceeds the tolerance below the cap; ``False`` stops the build there
                (the form keeps its bound, above the tolerance). Without it, a rank below
                the cap only needs to know whether its bound meets the tolerance, and its
                Lanczos run stops once it shows that it will not (:func:`norm_bound`'s
                ``above``): that rank's recorded bound is then a value above the tolerance,
                not the full bound, which the rank at the cap always takes. A rank whose
                smallest sketched eigenvalue already exceeds what it must be within runs no
                Lanczos at all: its neglected part is at least the next eigenvalue of the
                excess, which a spectrum without a cliff at exactly that rank keeps about as
                large (a wrong guess costs one doubling's sketch columns, never a bound).
            serves: called with the form of every rank below the cap (its bound not yet
                known) whose trace bound exceeds the tolerance: the largest bound at which
                that form serves what it is built for (the variances of given rows with a
                noise added, :meth:`~rfgp.inference._cg_routes.VarianceRoutes.variances`);
                the build stops at the first rank whose bound is within it (or within the
                tolerance), and a Lanczos run only has to show whether it is.
        """
        pre = preconditioner
        width = pre.basis.shape[0] if width is None else width
        dtype, device = pre.basis.dtype, pre.basis.device
        generator = generator or torch.Generator().manual_seed(1)
        # E can dip below 0 by the rounding of B's products and of P (about eps sqrt(W) ||B||):
        # the sketch is of E + shift I, which stays positive semi-definite, and the shift is
        # taken off its eigenvalues. The neglected part F = E + shift I - sketch then bounds
        # E minus the low-rank form from above, and the form is below E + shift I.
        real = dtype.to_real() if dtype.is_complex else dtype
        shift = rounding_shift(pre, width)

        def excess(v: Tensor) -> Tensor:  # (E + shift I) v
            w = pre.inverse_sqrt(v)
            return pre.inverse_sqrt(apply(w)) - (1.0 - shift) * v

        total = math.inf if trace is None else excess_trace(pre, trace, width)

        def trace_bound(values: Tensor) -> float:
            """tr F, F = E + shift I - sketch >= 0, each sketched eigenvalue rounded up by
            the shift."""
            if trace is None:
                return math.inf
            return max(total - float(values.double().sum()), 0.0) + values.numel() * shift

        empty = trace_bound(torch.zeros(0, dtype=torch.float64))
        if empty <= tolerance:  # the features hold (almost) nothing beyond P: rank 0
            basis = torch.zeros(width, 0, dtype=dtype, device=device)
            return LowRankInverse(pre, basis, torch.zeros(0, dtype=real, device=device), empty,
                                  0)
        # Each rank's Lanczos starts from draws of its own (seeded from the generator's seed,
        # drawing nothing from it), so that the sketch's draws do not depend on which ranks
        # ran a bound (or how far) and a rank's bound on which ran before.
        lanczos_seed = generator.initial_seed() % 2**62
        sketch = NystromSketch(excess, width, dtype, device, generator)
        limit = max(1, min(max_rank, width))
        rank, steps = min(START_RANK, limit), [0]
        history: List[Tuple[int, float]] = []
        while True:
            approx = sketch.grow(rank)
            basis, values = approx.basis, approx.eigenvalues

            def neglected(v: Tensor, basis: Tensor = basis, values: Tensor = values) -> Tensor:
                steps[0] += 1
                return excess(v) - basis @ (values.to(v.dtype).unsqueeze(-1)
                                            * (basis.transpose(0, 1).conj() @ v))

            bound = trace_bound(values)
            accept = tolerance
            if serves is not None and bound > tolerance and rank < limit:
                accept = max(tolerance, serves(LowRankInverse(
                    pre, basis, (values - shift).clamp_min(0), math.inf)))
            kept = float(values.min()) if values.numel() else 0.0
            if bound > accept and proceed is None and rank < limit and kept > accept:
                # The form keeps an eigenvalue above what it must be within: the neglected part
                # is at least E's next eigenvalue (E = form + F, the form of rank r), and on any
                # spectrum without a cliff at exactly this rank that is about the smallest one
                # kept, so the bound would fail. No Lanczos run: double (a wrong guess costs one
                # doubling's sketch columns; every form served still has its own bound).
                history.append((rank, kept))
                rank = min(2 * rank, limit)
                continue
            if bound > accept:
                # Below the cap and without `proceed` (which extrapolates the bounds), only
                # whether the bound meets what the form serves at matters: a Lanczos run stops
                # once it shows that it will not, after a few single-vector passes over the
                # data instead of LANCZOS_STEPS (on a slowly decaying spectrum most ranks fail).
                above = accept if proceed is None and rank < limit else None
                starts = torch.Generator().manual_seed(lanczos_seed + rank)
                bound = min(bound, norm_bound(neglected, width, dtype, device, starts,
                                              above=above))
            history.append((rank, bound))
            if bound <= accept or rank >= limit:
                break
            if proceed is not None and not proceed(history):
                break
            rank = min(2 * rank, limit)
        return LowRankInverse(pre, basis, (values - shift).clamp_min(0), bound,
                              sketch.rank + steps[0])


def rounding_shift(preconditioner: NystromPreconditioner, width: int) -> float:
    r"""The shift :math:`10\,\epsilon\sqrt{W}\,(1 + \lambda_1)` that keeps the sketched
    excess :math:`E + \mathrm{shift}\,I` positive semi-definite under the rounding of
    :math:`B`'s products (:math:`\lambda_1` the preconditioner's largest eigenvalue,
    :math:`\epsilon` the unit roundoff of its precision). Every eigenvalue of
    :math:`E + \mathrm{shift}\,I` is at least the shift, so a form's bound never falls below
    it.

    Example:
        >>> pre = NystromPreconditioner(torch.zeros(100, 0, dtype=torch.float64),
        ...                             torch.zeros(0, dtype=torch.float64))
        >>> rounding_shift(pre, 100) == 100 * torch.finfo(torch.float64).eps
        True
    """
    dtype = preconditioner.basis.dtype
    real = dtype.to_real() if dtype.is_complex else dtype
    largest = 1.0 + (float(preconditioner.eigenvalues.max()) if preconditioner.rank else 0.0)
    return 10 * torch.finfo(real).eps * math.sqrt(width) * largest


def excess_trace(preconditioner: NystromPreconditioner, trace: Tuple[float, float],
                 width: int) -> float:
    r""":math:`\mathrm{tr}(E + \mathrm{shift}\,I)`, rounded up, from the one-pass ``trace``
    :math:`(t, m)` (:meth:`~rfgp.inference._feature_operator.FeatureOperator.
    preconditioned_trace`): :math:`t - \sum_j \lambda_j / (1 + \lambda_j) +
    \mathrm{shift}\,W` plus :math:`100\,\epsilon\,(m + W)` for the rounding of the sum.

    Example:
        >>> pre = NystromPreconditioner(torch.zeros(4, 0, dtype=torch.float64),
        ...                             torch.zeros(0, dtype=torch.float64))
        >>> round(excess_trace(pre, (2.0, 3.0), 4), 12)
        2.0
    """
    pre = preconditioner
    dtype = pre.basis.dtype
    eps = torch.finfo(dtype.to_real() if dtype.is_complex else dtype).eps
    held = float(pre.eigenvalues.double().div(1.0 + pre.eigenvalues.double()).sum()
                 ) if pre.rank else 0.0
    return (trace[0] - held + rounding_shift(pre, width) * width
            + 100 * eps * (trace[1] + width))


def _squared_norms(rows: Tensor) -> Tensor:
    """``(M,)`` squared row norms, in real arithmetic (the gradient stays unconjugated)."""
    if rows.is_complex():
        return rows.real.square().sum(-1) + rows.imag.square().sum(-1)
    return rows.square().sum(-1)


def _real_gram(rows: Tensor) -> Tensor:
    """``(M, M)`` :math:`\\mathrm{Re}\\{R R^H\\}` in real arithmetic, symmetric to the bit (a
    BLAS product need not be: its two triangles may sum in different orders)."""
    if rows.is_complex():
        gram = rows.real @ rows.real.transpose(0, 1) + rows.imag @ rows.imag.transpose(0, 1)
    else:
        gram = rows @ rows.transpose(0, 1)
    return 0.5 * (gram + gram.transpose(0, 1))


def group_inverses(operator, groups: List[List[int]], preconditioners: List[NystromPreconditioner],
                   settings, traces: Optional[List[Optional[Tuple[float, float]]]] = None,
                   proceed: Optional[Callable[[List[Tuple[int, float]]], bool]] = None,
                   serves: Optional[Callable[[LowRankInverse], float]] = None
                   ) -> List[LowRankInverse]:
    """One :class:`LowRankInverse` per noise group of an iterative solver's ``operator``
    (:class:`~rfgp.inference._feature_operator.FeatureOperator`), at the ``settings``'
    ``variance_bound`` and ``variance_rank`` (within a tenth of the device's memory),
    with the trace bound of one pass over the rows (:func:`group_trace`; a group's entry of
    ``traces`` where one was taken already), and ``proceed`` and ``serves`` as in
    :meth:`LowRankInverse.build`."""
    cap = variance_rank_cap(operator, settings)
    traces = traces or [None] * len(groups)
    out = []
    with torch.no_grad():
        for cols, pre, trace in zip(groups, preconditioners, traces):
            trace = trace or group_trace(operator, cols[0], pre)
            out.append(LowRankInverse.build(
                lambda v, col=cols[0]: operator.apply(v, [col] * v.shape[1]), pre,
                settings.variance_bound, cap, operator.width, trace=trace,
                proceed=proceed, serves=serves))
    return out


def variance_rank_cap(operator, settings) -> int:
    """The low-rank form's rank cap: the ``settings``' ``variance_rank``, within a tenth of
    the ``operator``'s device memory (:func:`~rfgp.inference._nystrom.rank_memory_cap`)."""
    return min(settings.variance_rank,
               rank_memory_cap(operator.width, operator.vector_dtype, operator.device))


def group_trace(operator, column: int, preconditioner: NystromPreconditioner
                ) -> Tuple[float, float]:
    """The one-pass trace ``(t, m)`` of :meth:`~rfgp.inference._feature_operator.
    FeatureOperator.preconditioned_trace` for the noise of target ``column`` (a collective
    call under ``torch.distributed``)."""
    pre = preconditioner
    with torch.no_grad():
        weights = pre.eigenvalues / (1.0 + pre.eigenvalues)
        return operator.preconditioned_trace(column, pre.basis, weights)


def solved_variances(solver, column: int, rows: Tensor, want_root: bool,
                     inverse: Optional[LowRankInverse] = None,
                     tolerance: float = 0.0,
                     record: Optional[dict] = None,
                     floor: float = 0.0) -> Tuple[Tensor, Optional[Tensor]]:
    r"""The variances ``(M,)`` of the query rows ``(M, W)`` by one CG solve
    :math:`B U = \Phi_*^H` of an iterative ``solver`` (with the noise of target ``column``),
    and with ``want_root`` the covariance ``(M, M)``
    :math:`\mathrm{Re}\{\Phi_* U\}`; differentiable in ``rows``.

    Without ``inverse`` the solve runs to the solver's tolerance. With a
    :class:`LowRankInverse` :math:`\hat B \preceq B` it preconditions the solve and each
    column stops once :math:`r^H \hat B^{-1} r \le \mathrm{tolerance}\;\phi^H u_k`. CG from
    zero gives :math:`\phi^H u_k = \sigma^2 - r^H B^{-1} r \le \sigma^2` (a lower bound that
    rises with the iterations) and :math:`r^H B^{-1} r \le r^H \hat B^{-1} r`, so the returned
    :math:`\phi^H u_k + r^H \hat B^{-1} r` lies in
    :math:`[\sigma^2, (1 + \mathrm{tolerance})\,\sigma^2]`. (The running lower bound
    replaces :math:`\hat\sigma^2 / (1 + \tau)`, which the low-rank form's bound
    :math:`\tau` makes up to :math:`1 + \tau` times smaller than :math:`\sigma^2`.)
    With a noise variance ``floor`` :math:`s` the test is :math:`r^H \hat B^{-1} r \le
    \mathrm{tolerance}\,(\phi^H u_k + s)` and the result lies in :math:`[\sigma^2,
    \sigma^2 + \mathrm{tolerance}\,(\sigma^2 + s)]`: the variance of a new observation,
    :math:`\sigma^2 + s`, within the tolerance. ``record`` (a dict) receives the solve's
    ``"iterations"``.
    """
    what = "the predictive variances B u = phi*"
    rhs = rows.detach().transpose(0, 1).conj()  # (W, M)
    columns = [column] * rows.shape[0]
    excess = 0.0
    with torch.no_grad():
        if inverse is None:
            result = solver.solve(rhs, columns, what)
            solved = result.solution  # (W, M)
        else:
            result = conjugate_gradients(
                lambda v: solver.operator.apply(v, [column] * v.shape[1]), rhs,
                inverse.inverse, 1.0, solver.settings.max_iterations, what,
                relative_energy=tolerance,
                energy_floor=(rhs.real.new_full((rhs.shape[1],), floor) if floor > 0
                              else None))
            solved = result.solution
            # r^H B^-1 r <= r^H Bhat^-1 r of the final residual, from CG's recurrence (the
            # value its stopping test read): a refinement runs a few iterations, where the
            # recurrence holds the residual to rounding, and an explicit residual would cost
            # one more product with B for every row, as much as an iteration.
            excess = result.energy.to(solved.real.dtype)
    if record is not None:
        record["iterations"] = result.iterations
    # Value phi^T B^-1 conj(phi); the gradient of a Hermitian form is twice its linear
    # part in phi (B^-1 conj(phi) held fixed): 2 x - x.detach() carries both.
    quad = _real_product(rows, solved.transpose(0, 1)).sum(-1)
    variances = 2 * quad - quad.detach() + excess
    if not want_root:
        return variances, None
    cross = _real_product(rows.unsqueeze(1), solved.transpose(0, 1)).sum(-1)
    # Symmetric in value (CG leaves Re{Phi* U} symmetric only to its tolerance); the
    # gradient of Phi* B^-1 Phi*^H is the linear part plus its transpose.
    both = cross + cross.transpose(0, 1)
    return variances, 0.5 * both.detach() + both - both.detach()


def _real_product(a: Tensor, b: Tensor) -> Tensor:
    """``Re(a * b)`` elementwise, spelled in real arithmetic: the backward pass then hands the
    feature map real-and-imaginary gradients, never a lazily conjugated tensor."""
    if a.is_complex():
        return a.real * b.real - a.imag * b.imag
    return a * b
