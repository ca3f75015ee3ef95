r"""Calibration beyond the ``D x D`` path: the outputscale and noise of a large-``D`` model by
its own evidence, from products with its features alone.

The same rule as :mod:`~rfgp.inference._calibration`: the final model's outputscale factor
:math:`a` and noise :math:`\sigma^2` maximise the evidence of that ``D``-feature model. With
:math:`G = \Phi^\top \Phi` (features at the kernel's outputscale), :math:`b_t = \Phi^\top y_t`
and :math:`c = a / \sigma^2`, the noise that maximises the evidence for a fixed :math:`c` is
:math:`\sigma^2(c) = Q(c) / (N T)`, :math:`Q(c) = \sum_t y_t^\top y_t - c\, b_t^\top (I + c
G)^{-1} b_t`, which leaves the profile

.. math::
    -2 \log p(y \mid c) = N T + T \log|I + c G| + N T \log\frac{Q(c)}{N T} + N T \log 2\pi,
    \qquad
    \frac{\partial}{\partial \log c} = T\big(D - \mathrm{tr}(I + c G)^{-1}\big)
        - N T\, \frac{c \sum_t \|u_t\|^2}{Q(c)},\quad u_t = (I + c G)^{-1} b_t .

Where :math:`\sigma^2(c)` falls below the floor :math:`\sigma_0^2`, the constrained maximum
holds the noise at the floor, and the profile's derivative is the same with :math:`Q(c) / (N
T)` replaced by :math:`\sigma_0^2` (the derivative of :math:`Q(c)/\sigma_0^2` in
:math:`\log c` is :math:`-c \sum_t \|u_t\|^2 / \sigma_0^2`): the noise in the slope is
:math:`\max(Q(c)/(N T), \sigma_0^2)`, continuous in :math:`c`.
Its root in :math:`\log c` is found by bracketing (steps that double, from a start kept within
:math:`10^8` of the data's own :math:`c_0 = N / \mathrm{tr}\,G`), bisection and the Illinois
rule. Each evaluation is one
preconditioned CG solve on :math:`I + c G` whose right-hand sides are the :math:`b_t` and
Rademacher probes :math:`P^{1/2} v`: the trace is estimated by Hutchinson's method with the
Nyström preconditioner :math:`P` as a control variate,
:math:`\mathrm{tr}\,M = \mathrm{tr}\,P^{-1} + \mathbb E[v^\top P^{-1/2} M P^{1/2} v - v^\top
P^{-1} v]` (:math:`\mathrm{tr}\,P^{-1}` is exact), and the same CG run gives the
log-determinant by Lanczos quadrature. The probes are drawn once, so the root is that of one
smooth function; its standard error is reported. One Nyström sketch of :math:`G` serves every
:math:`c` (its eigenvalues scale with :math:`c`).

Internal: not part of the public API (see :mod:`rfgp.inference`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import List, Optional

import torch
from gpytorch.kernels import Kernel
from torch import Tensor

from rfgp._validation import check_int, check_positive
from rfgp.inference._calibration import CHUNK_ROWS
from rfgp.inference._cg_solver import FeatureOperator
from rfgp.inference._evidence import LOG_2PI
from rfgp.inference._feature_map import FeatureMap
from rfgp.inference._fit_cost import CALIBRATION_EVALUATIONS
from rfgp.inference._iterative import (
    conjugate_gradients,
    lanczos_condition,
    lanczos_log_quadrature,
)
from rfgp.inference._nystrom import NystromPreconditioner, NystromSketch, rank_memory_cap
from rfgp.kernels._composition import feature_kernel

__all__ = ["IterativeCalibration", "calibrate_by_products"]

# The root in log c is kept to this width (1% in c); at most this many evaluations.
_ROOT_WIDTH = 0.01
_MAX_EVALUATIONS = 14
# The search's range of log c: c from about 1e-304 to 1e304, inside the float range.
_LOG_C_LIMIT = 700.0
# The start of the search in log c is kept this close to the data's own scale N / tr G.
_START_WINDOW = math.log(1e8)


@dataclass
class IterativeCalibration:
    """The outcome of :func:`calibrate_by_products`.

    Attributes:
        factor: the outputscale factor :math:`a` (relative to the kernel's outputscale).
        noise: :math:`\\sigma^2`.
        log_evidence: the estimated log evidence per datum at the root.
        standard_error: the standard error of ``log_evidence``.
        gradient_standard_error: the standard error of the profile's derivative at the root
            (of the trace estimate, times ``T``) relative to its scale ``N T``.
        rank: the Nyström rank.
        iterations: CG iterations per evaluation.
        preconditioner: the Nyström preconditioner of :math:`I + c G` at the root, which is
            the ``B`` of the calibrated model's fit (pass it on so the fit need not sketch).
    """

    factor: float
    noise: float
    log_evidence: float
    standard_error: float
    gradient_standard_error: float
    rank: int
    iterations: List[int] = field(default_factory=list)
    preconditioner: Optional[NystromPreconditioner] = None


def calibrate_by_products(kernel: Kernel, x: Tensor, y: Tensor, noise: float, *,
                          factor: float = 1.0, noise_floor: float = 0.0,
                          condition: float = 0.0, num_probes: int = 8,
                          rank: Optional[int] = None, cache_bytes: int = 1 << 30,
                          tolerance: float = 1e-6,
                          generator: Optional[torch.Generator] = None) -> IterativeCalibration:
    r"""The outputscale factor and noise that maximise the evidence of ``kernel``'s feature
    model on ``(x, y)`` (module docstring), started at ``(factor, noise)``.

    Args:
        kernel: a random-feature kernel (or a ``ScaleKernel`` around one) with its
            hyperparameters set; its outputscale is the reference of ``factor``.
        x: ``(N, d)`` inputs; y: ``(N,)`` or ``(N, T)`` targets.
        noise: the starting noise :math:`\sigma^2` (positive); factor: the starting factor.
        noise_floor: the noise's lower bound :math:`\sigma_0^2`.
        condition: :math:`c\,\lambda_{\max}(G) \le 1 / \mathrm{condition}` (0: unbounded), the
            weight-space calibration's bound on the solve's condition number.
        num_probes: Rademacher probes of the trace and log-determinant.
        rank: the Nyström rank (``None``: chosen from the spectrum at the start, grown
            beyond 512 while that saves more products over the evaluations' solves than it
            costs, and grown again where an evaluation's solve meets a condition number above
            the target, :meth:`~rfgp.inference._nystrom.NystromSketch.refine`).
        cache_bytes: bytes of feature rows kept across the CG products.
        tolerance: the CG's relative residual.
        generator: the probes' and the sketch's random draws.

    Returns:
        An :class:`IterativeCalibration`.

    Example:
        >>> from gpytorch.kernels import ScaleKernel
        >>> from rfgp.kernels import FourierFeatureKernel
        >>> g = torch.Generator().manual_seed(0)
        >>> x = torch.rand(2000, 2, generator=g, dtype=torch.float64)
        >>> y = torch.sin(6 * x[:, 0]) + 0.1 * torch.randn(2000, generator=g, dtype=torch.float64)
        >>> k = ScaleKernel(FourierFeatureKernel(256, sampling="orthogonal", input_dim=2,
        ...                                      ard_num_dims=2, seed=0)).double()
        >>> out = calibrate_by_products(k, x, y - y.mean(), 0.1, generator=g)
        >>> 0.005 < out.noise < 0.02
        True
    """
    noise = check_positive("noise", noise)
    factor = check_positive("factor", factor)
    num_probes = check_int("num_probes", num_probes, minimum=2)
    if not noise_floor >= 0:
        raise ValueError(f"noise_floor must be >= 0, got {noise_floor!r}")
    generator = generator or torch.Generator().manual_seed(0)
    n = x.shape[0]
    columns = y.reshape(n, -1).to(torch.float64)
    t = columns.shape[1]
    op = FeatureOperator(FeatureMap(feature_kernel(kernel)), [(x, columns, None)], False,
                         torch.float64, CHUNK_ROWS, cache_bytes)
    op.column_noise = torch.ones(t, dtype=torch.float64, device=x.device)
    width = op.width
    with torch.no_grad():
        b = op.project(lambda targets, _: targets, t)  # (W, T)
        target_squares = float(columns.square().sum())

        def gram(v: Tensor) -> Tensor:
            return op.gram(v, [0] * v.shape[1])

        # The start, in logs (factor / noise of far apart values over- or underflows), kept
        # within _START_WINDOW of the data's own scale c0 = N / tr G (half the targets'
        # mean square as signal, a tr G = N m / 2, and half as noise): a start in other
        # units than the data's (a noise of 1e300 against a kernel at outputscale 1) would
        # sketch the preconditioner at a c where c G is far below or above the identity.
        # tr G by Hutchinson's estimate on probes of their own (the search's probes and
        # sketch keep their draws from generator).
        trace_probes = (torch.randint(0, 2, (width, 8), dtype=torch.float64,
                                      generator=torch.Generator().manual_seed(0))
                        * 2.0 - 1.0).to(op.device)
        trace = float((trace_probes * gram(trace_probes)).sum(0).mean())
        log_start = math.log(factor) - math.log(noise)
        if trace > 0:
            log_data = math.log(n) - math.log(trace)
            log_start = min(max(log_start, log_data - _START_WINDOW), log_data + _START_WINDOW)
        start = math.exp(min(max(log_start, -_LOG_C_LIMIT), _LOG_C_LIMIT))
        # One sketch serves every evaluation's solves (target and probe columns), so its rank
        # grows while that saves more products than it costs.
        solves = CALIBRATION_EVALUATIONS * (t + num_probes)
        max_rank = rank_memory_cap(width, torch.float64, op.device)
        sketcher = NystromSketch(lambda v: start * gram(v), width, torch.float64, op.device,
                                 generator)
        if rank is not None:
            sketcher.grow(rank)
        else:
            sketcher.adapt(max_rank, solves, n, tolerance)

        def at(c: float) -> NystromPreconditioner:
            """The sketch's preconditioner of I + c G (the sketch is of start * G)."""
            return NystromPreconditioner(sketcher.preconditioner.basis,
                                         (c / start) * sketcher.preconditioner.eigenvalues)

        probes = (torch.randint(0, 2, (width, num_probes), generator=generator,
                                dtype=torch.float64) * 2.0 - 1.0).to(op.device)
        spectrum = sketcher.preconditioner.eigenvalues / start  # estimates of G's eigenvalues
        top = float(spectrum.max()) if spectrum.numel() else 0.0
        log_ceiling = math.log(1.0 / (condition * top)) if condition > 0 and top > 0 else math.inf
        records: dict = {}

        def evaluate(log_c: float) -> float:
            c = math.exp(log_c)
            pre = at(c)
            rhs = torch.cat([b, pre.sqrt(probes)], 1)
            result = conjugate_gradients(lambda v: v + c * gram(v), rhs, pre.inverse,
                                         tolerance, 1000, "the calibration's I + c G")
            u, solved = result.solution[:, :t], result.solution[:, t:]
            quad = target_squares - c * float((b * u).sum())
            # Hutchinson's trace of (I + cG)^-1 with tr P^-1 as the control variate.
            exact = width - pre.rank + float((1.0 / (1.0 + pre.eigenvalues)).sum())
            samples = ((pre.inverse_sqrt(probes) * solved).sum(0)
                       - (probes * pre.inverse(probes)).sum(0))
            trace = exact + float(samples.mean())
            trace_error = float(samples.std()) / math.sqrt(num_probes)
            logdets = pre.logdet() + width * lanczos_log_quadrature(
                result, list(range(t, t + num_probes)))
            # The slope of the profile over the noise held at or above its floor: where the
            # unconstrained noise Q / (N T) falls below the floor, the maximum is over the
            # factor at the floor's noise, and Q / sigma^2's derivative in log c is
            # -c ||u||^2 / sigma^2 with sigma^2 the floor (continuous across the switch).
            noise_at = max(quad / (n * t), noise_floor)
            if not noise_at > 0:
                # Q <= 0 in rounding: the features fit y exactly at this c. A noise far below
                # the targets' mean square (relative, so that every scale of y is alike)
                # makes the slope steeply negative: c moves up, to the condition bound.
                noise_at = target_squares / (n * t) * 1e-30
            slope = t * (width - trace) - c * float(u.square().sum()) / noise_at
            records[log_c] = dict(quad=quad, trace_error=trace_error,
                                  logdet=float(logdets.mean()),
                                  logdet_error=float(logdets.std()) / math.sqrt(num_probes),
                                  iterations=result.iterations)
            # The sketch was made at the start's c; the search moves c by factors of 4, and the
            # estimates behind the sketch's rank fall short on slowly decaying spectra. The
            # condition this solve met tells; the rank grows from it for what follows.
            if rank is None:
                sketcher.refine(lanczos_condition(result), c / start, max_rank, solves, n,
                                tolerance)
            return slope

        log_c = min(math.log(start), log_ceiling)
        root = _find_root(evaluate, log_c, log_ceiling)
    chosen = records[root]
    noise_out = max(chosen["quad"] / (n * t), noise_floor)
    if not noise_out > 0:
        noise_out = target_squares / (n * t) * 1e-30  # as in the slope: Q <= 0 in rounding
    # -2 log p at the root (the profile; at the floor the quadratic term is Q / sigma^2).
    total = (chosen["quad"] / noise_out + t * chosen["logdet"]
             + n * t * (math.log(noise_out) + LOG_2PI))
    return IterativeCalibration(
        factor=math.exp(root) * noise_out, noise=noise_out,
        log_evidence=-0.5 * total / (n * t),
        standard_error=0.5 * t * chosen["logdet_error"] / (n * t),
        gradient_standard_error=t * chosen["trace_error"] / (n * t),
        rank=sketcher.rank,
        iterations=[r["iterations"] for r in records.values()],
        preconditioner=at(math.exp(root)),
    )



def _find_root(slope_at, start: float, ceiling: float) -> float:
    """The root of the increasing-through-zero ``slope_at`` in ``log c`` near ``start``:
    steps of ``log 4``, doubled after the second, bracket it (at most ``ceiling``, and within
    ``|log c| <=`` :data:`_LOG_C_LIMIT`), bisection narrows a bracket wider than ``2 log 4``,
    then the Illinois rule narrows it to :data:`_ROOT_WIDTH`. Returns the evaluated point
    nearest the root.

    A start near the root costs what plain ``log 4`` steps cost; a start in other units
    (a noise of 1e-30 for targets of order one, or targets scaled by 1e150 against the
    kernel's outputscale) is bracketed in a number of evaluations logarithmic in the
    distance, each of which beyond the second adds one to the budget of
    :data:`_MAX_EVALUATIONS`, instead of stopping at the end of a bracket that never closed.
    """
    evaluations = 0
    budget = _MAX_EVALUATIONS
    ceiling = min(ceiling, _LOG_C_LIMIT)
    start = min(max(start, -_LOG_C_LIMIT), ceiling)

    def f(point: float) -> float:
        nonlocal evaluations
        evaluations += 1
        return slope_at(point)

    def next_step(taken: int, step: float) -> float:
        nonlocal budget
        if taken >= 2:
            budget += 1  # a far start's extra step: paid for by the bracket, not the rule
            return 2 * step
        return step

    low, f_low = start, f(start)
    high, f_high = low, f_low
    step, taken = math.log(4.0), 0
    # Bracket: the slope is negative below the maximum and positive above it.
    while f_low > 0 and evaluations < budget and low > -_LOG_C_LIMIT:
        high, f_high = low, f_low
        low = max(low - step, -_LOG_C_LIMIT)
        f_low = f(low)
        taken += 1
        step = next_step(taken, step)
    while f_high < 0 and evaluations < budget:
        if high >= ceiling:
            return high  # the maximum lies beyond the condition bound: stop there
        low, f_low = high, f_high
        high = min(high + step, ceiling)
        f_high = f(high)
        taken += 1
        step = next_step(taken, step)
    if f_low > 0 or f_high < 0:
        return low if abs(f_low) < abs(f_high) else high
    # A bracket that doubled its way over a long distance is halved first: the slope is
    # flat far from the root, where a secant's point falls next to the bracket's end.
    while high - low > 2 * math.log(4.0) and evaluations < budget:
        budget += 1
        point = 0.5 * (low + high)
        value = f(point)
        if value < 0:
            low, f_low = point, value
        else:
            high, f_high = point, value
    side = 0
    while high - low > _ROOT_WIDTH and evaluations < budget:
        point = (low * f_high - high * f_low) / (f_high - f_low)
        point = min(max(point, low + 0.05 * (high - low)), high - 0.05 * (high - low))
        value = f(point)
        if value < 0:
            low, f_low = point, value
            if side == -1:
                f_high /= 2
            side = -1
        else:
            high, f_high = point, value
            if side == 1:
                f_low /= 2
            side = 1
    return low if abs(f_low) < abs(f_high) else high
