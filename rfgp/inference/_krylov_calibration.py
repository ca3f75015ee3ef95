r"""Large-``D`` calibration from one Krylov space: the outputscale and noise of a feature model
by its own evidence, for every candidate scale at once.

With :math:`G = \Phi^\top \Phi` (``W x W``, the features at the kernel's outputscale),
:math:`b_t = \Phi^\top y_t` and :math:`c = a / \sigma^2` (outputscale factor over noise), the
evidence of the feature model with noise :math:`\sigma^2` is

.. math::
    -2 \log p(y) = \frac{Q(c)}{\sigma^2} + T \log|A_c| + N T \log(2 \pi \sigma^2),
    \qquad A_c = I + c G, \quad Q(c) = \sum_t y_t^\top y_t - c\, b_t^\top A_c^{-1} b_t .

For fixed :math:`c` it is maximised by :math:`\sigma^2(c) = \max(Q(c) / (N T), \sigma_0^2)`
(the floor :math:`\sigma_0^2` binds where the profile's noise falls below it: the outputscale
is then maximised with the noise held at the floor), and :math:`g(c) = -2 \log p` at
:math:`(c, \sigma^2(c))` has the derivative

.. math::
    \frac{d g}{d \log c} = T\big(W - \mathrm{tr}\,A_c^{-1}\big)
        - \frac{c \sum_t \|A_c^{-1} b_t\|^2}{\sigma^2(c)}

(:math:`dQ / dc = -\sum_t \|A_c^{-1} b_t\|^2`; at the kink the noise's own derivative
vanishes). Every :math:`A_c` is a shift of :math:`G`, so one subspace :math:`\mathcal Z`
with known images :math:`G \mathcal Z` serves every :math:`c`: with
:math:`M = Z^\top Z = S^{-\top} S^{-1}` (truncated to its well-conditioned part) and the Ritz
decomposition :math:`S^\top Z^\top G Z S = R\,\Theta R^\top`, the Galerkin approximation of a
bilinear form is

.. math::
    w^\top A_c^{-1} z \approx \sum_k \frac{\hat w_k \hat z_k}{1 + c\,\theta_k},
    \qquad \hat z = R^\top S^\top Z^\top z,

:math:`O(s)` per form and per :math:`c` once the ``s``-dimensional subspace is built
(exact where :math:`\mathcal Z` holds :math:`A_c^{-1} z`, and for symmetric forms a lower
bound that grows with :math:`\mathcal Z`).

The subspace is built by preconditioned conjugate gradients on :math:`A_{c_0}` (the Nyström
preconditioner :math:`P_c = I + c\,U \Lambda U^\top` of one sketch of :math:`G` serves every
:math:`c`, its eigenvalues scaled), first over the right-hand sides :math:`b_t` to the
solve's tolerance (where its Lanczos condition shows the sketch short, the sketch grows), then
over the probes :math:`z_j = P_{c_0}^{1/2} v_j` (Rademacher :math:`v_j`, the grown sketch's
:math:`P_{c_0}`) to the looser :data:`PROBE_TOLERANCE`: every search direction and its image
join :math:`\mathcal Z`, and so does the sketch's test matrix :math:`\Omega`, whose image
:math:`G \Omega` the sketch holds. A preconditioner breaks the shift invariance of the
Krylov space itself, not that of a Galerkin projection: the projection is exact at
:math:`c_0` to the solve's tolerance and degrades slowly away from it, so the root search
runs on the projection, and where the root lies farther than :data:`ACCEPT_RADIUS` (in
:math:`\log c`) from every solved point, one more run there adds its directions (the
targets, then the anchor's probes at their tolerance, each warm-started from the projection,
within :data:`COLD_RADIUS` of the anchor below; beyond it a cold run is the new anchor). The
products beyond the sketch are thus a target solve and the probes' shorter runs per run (on
pol at 8,192 features 336 in three runs, four and a half target solves).

The trace is Hutchinson's with the preconditioner as control variate,

.. math::
    \mathrm{tr}\,A_c^{-1} = \mathrm{tr}\,P_c^{-1}
        + \mathbb E\big[w_j^\top A_c^{-1} z_j - v_j^\top P_c^{-1} v_j\big],
    \qquad w_j = P_{c_0}^{-1/2} v_j,

(:math:`\mathrm{tr}\,P_c^{-1}` and :math:`v^\top P_c^{-1} v` are exact; :math:`P_{c_0}`
is the preconditioner of the anchor, the latest cold run, whose probes are
:math:`z_j`), and the log-determinant is Lanczos quadrature at the anchor's :math:`c_0`
(its CG coefficients:
:math:`\log|A_{c_0}| = \log|P_{c_0}| + \mathbb E[v^\top \log(P_{c_0}^{-1/2} A_{c_0}
P_{c_0}^{-1/2}) v]`), carried to any :math:`c` by

.. math::
    \log|A_c| = \log|A_{c_0}| + \int_{\log c_0}^{\log c} \big(W - \mathrm{tr}\,A_s^{-1}\big)
        \, d \log s,

probe by probe, so that the reported standard error of the log evidence is the sample
spread of the per-probe estimates.

Internal: not part of the public API (see :mod:`rfgp.inference`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

import torch
from torch import Tensor

from rfgp.inference._evidence import LOG_2PI
from rfgp.inference._iterative import lanczos_condition, lanczos_log_quadrature
from rfgp.inference._krylov_subspace import (
    GalerkinSubspace,
    ScaleProfile,
    integrated_slope,
    last_step_change,
    profile_minimiser,
    profile_noise,
    recorded_cg,
)
from rfgp.inference._nystrom import NystromPreconditioner, NystromSketch, rank_memory_cap

__all__ = ["ACCEPT_RADIUS", "KrylovCalibration", "krylov_scale_calibration"]

#: A root farther than this from every solved point (in log c) gets a run of its own: the
#: projection's forms away from a run's c are first-order accurate only (on pol at 8,192
#: features a root placed within a factor 1.5 of the run was off by a factor 1.4, the noise
#: by 8%).
ACCEPT_RADIUS = math.log(1.1)
#: The root is searched within this distance (in log c) of the solved points.
SEARCH_RADIUS = math.log(1e3)
#: The log-determinant is carried from the latest cold run (the anchor); a run farther than
#: this from the anchor is cold itself (its own Lanczos quadrature), nearer ones are
#: warm-started from the projection.
COLD_RADIUS = math.log(2.0)
#: Column solves the sketch's rank is sized for (per right-hand side): a first run and a
#: warm-started one (a later warm run starts nearer its solution and is shorter).
SKETCH_SOLVES = 2
#: The probe columns' relative CG residual: the Lanczos quadrature of their log-determinant
#: converges about twice as fast as the residual, and their forms' error stays far below the
#: Hutchinson spread they carry (on pol at 2,048 features, 1e-2 moved the log evidence by
#: 1% of its standard error).
PROBE_TOLERANCE = 1e-2
# The range of log c: c from about 1e-304 to 1e304, inside the float range.
_LOG_C_LIMIT = 700.0
# The first run's log c is kept this close to the data's own scale N / tr G: a start in other
# units than the data's (a noise of 1e300 against a kernel at outputscale 1) would sketch and
# run at a c where c G is far below or above the identity, beyond the runs' reach.
_START_WINDOW = math.log(1e8)


@dataclass
class KrylovCalibration:
    """The outcome of :func:`krylov_scale_calibration`.

    Attributes:
        factor: the outputscale factor :math:`a = c\\,\\sigma^2`.
        noise: :math:`\\sigma^2`.
        log_evidence: the estimated log evidence per datum (per row and column) at the root.
        standard_error: the standard error of ``log_evidence``: the probes' spread, and in
            quadrature the anchor quadrature's truncation error at the probe tolerance.
        gradient_standard_error: the standard error of :math:`dg / d\\log c` at the root over
            its scale :math:`N T`.
        noise_at_floor: whether the noise floor binds.
        rank: the Nyström rank.
        iterations: CG iterations of each run over the targets.
        probe_iterations: CG iterations of each run over the probes (one per cold run).
        run_scales: the :math:`c` of each run.
        products: column products with :math:`G` (one pass over :math:`\\Phi` and one over
            :math:`\\Phi^\\top` each), by purpose: ``"trace"`` (8, the estimate of
            :math:`\\mathrm{tr}\\,G` that places the start), ``"sketch"``, ``"runs"``.
        preconditioner: the Nyström preconditioner of :math:`A_c` at the root (the ``B`` of
            the calibrated model's CG fit).
    """

    factor: float
    noise: float
    log_evidence: float
    standard_error: float
    gradient_standard_error: float
    noise_at_floor: bool
    rank: int
    iterations: List[int] = field(default_factory=list)
    probe_iterations: List[int] = field(default_factory=list)
    run_scales: List[float] = field(default_factory=list)
    products: Dict[str, int] = field(default_factory=dict)
    preconditioner: Optional[NystromPreconditioner] = None


def krylov_scale_calibration(gram: Callable[[Tensor], Tensor], rhs: Tensor,
                             target_squares: float, num_rows: int, noise: float, *,
                             factor: float = 1.0, noise_floor: float = 0.0,
                             condition: float = 0.0, num_probes: int = 8,
                             rank: Optional[int] = None, tolerance: float = 1e-8,
                             probe_tolerance: float = PROBE_TOLERANCE,
                             max_runs: int = 4, max_iterations: int = 1000,
                             max_rank: Optional[int] = None,
                             generator: Optional[torch.Generator] = None,
                             function_space: bool = False) -> KrylovCalibration:
    r"""The outputscale factor and noise that maximise a feature model's evidence, from
    products with its Gram matrix :math:`G` alone (module docstring).

    Args:
        gram: ``V -> G V`` for ``(W, k)`` float64 blocks, :math:`G = \Phi^\top \Phi`
            positive semi-definite.
        rhs: ``(W,)`` or ``(W, T)`` :math:`\Phi^\top y`.
        target_squares: :math:`\sum_t y_t^\top y_t` (positive).
        num_rows: ``N``.
        noise: the starting noise :math:`\sigma^2` (positive); factor: the starting
            outputscale factor (positive). The first run is at :math:`c_0 =`
            ``factor / noise``, kept within a factor :math:`10^8` of the data's own scale
            :math:`N / \mathrm{tr}\,G` (a start in other units than the data's is beyond
            the runs' reach) and within :math:`e^{\pm 700}`.
        noise_floor: :math:`\sigma_0^2 \ge 0`.
        condition: the largest :math:`c` is ``1 / (condition * lambda_max(G))`` (0:
            unbounded), the weight-space calibration's bound on the solve's condition number.
        num_probes: Rademacher probes (at least 2).
        rank: a fixed Nyström rank (``None``: the sketch's automatic rule, sized for the
            runs' column solves, and grown where a run meets a worse condition).
        tolerance: the CG runs' relative residual on the target columns.
        probe_tolerance: the relative residual on the probe columns (at least
            ``tolerance``).
        max_runs: the most CG runs (at least 1).
        max_iterations: CG iterations per run.
        max_rank: a cap on the automatic rank (default: the memory cap).
        generator: the probes' and the sketch's draws.
        function_space: the rows' form: ``gram`` is ``V -> G V`` with the ``N x N``
            :math:`G = \Phi\Phi^\top` and ``rhs`` the targets ``(N,)`` or ``(N, T)``
            themselves (:meth:`~rfgp.inference._krylov_subspace.ScaleProfile.terms`): the
            same evidence, from products that cost ``N^2`` instead of ``2 N W`` where
            :math:`\Phi\Phi^\top` is formed.

    Returns:
        A :class:`KrylovCalibration`.

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> phi = torch.randn(2000, 64, dtype=torch.float64, generator=g)
        >>> y = phi @ torch.randn(64, dtype=torch.float64, generator=g) * 0.3
        >>> y = y + 0.5 * torch.randn(2000, dtype=torch.float64, generator=g)
        >>> out = krylov_scale_calibration(lambda v: phi.T @ (phi @ v), phi.T @ y,
        ...                                float(y @ y), 2000, 1.0, generator=g)
        >>> abs(out.noise - 0.25) < 0.03, out.noise_at_floor
        (True, False)
    """
    n = num_rows
    generator = generator or torch.Generator().manual_seed(0)
    b = rhs.reshape(rhs.shape[0], -1).to(torch.float64)
    width, t = b.shape
    device = b.device
    counts = {"trace": 0, "sketch": 0, "runs": 0}
    phase = ["sketch"]

    def counted(v: Tensor) -> Tensor:
        counts[phase[0]] += int(v.shape[1])
        return gram(v)

    solves = SKETCH_SOLVES * (t + num_probes)
    if max_rank is None:
        max_rank = rank_memory_cap(width, torch.float64, device)
    with torch.no_grad():
        # The start, in logs (factor / noise of far apart values over- or underflows), kept
        # within _START_WINDOW of the data's own scale c_d = N / tr G (half the targets'
        # mean square as signal, a tr G = N m / 2, and half as noise); tr G by Hutchinson's
        # estimate on probes of their own (the runs' probes and the sketch keep their draws
        # from generator).
        phase[0] = "trace"
        trace_probes = (torch.randint(0, 2, (width, 8), dtype=torch.float64,
                                      generator=torch.Generator().manual_seed(0))
                        * 2.0 - 1.0).to(device)
        trace = float((trace_probes * counted(trace_probes)).sum(0).mean())
        phase[0] = "sketch"
        log_start = math.log(factor) - math.log(noise)
        if trace > 0:
            log_data = math.log(n) - math.log(trace)
            log_start = min(max(log_start, log_data - _START_WINDOW), log_data + _START_WINDOW)
        start = math.exp(min(max(log_start, -_LOG_C_LIMIT), _LOG_C_LIMIT))
        sketcher = NystromSketch(lambda v: start * counted(v), width, torch.float64, device,
                                 generator)
        if rank is not None:
            sketcher.grow(rank)
        else:
            sketcher.adapt(max_rank, solves, n, tolerance)

        def preconditioner(c: float) -> NystromPreconditioner:
            """The sketch's preconditioner of I + c G (the sketch is of start * G)."""
            pre = sketcher.preconditioner
            return NystromPreconditioner(pre.basis, (c / start) * pre.eigenvalues)

        spectrum = sketcher.preconditioner.eigenvalues / start
        top = float(spectrum.max()) if spectrum.numel() else 0.0
        ceiling = min(math.log(1.0 / (condition * top)) if condition > 0 and top > 0
                      else math.inf, _LOG_C_LIMIT)
        log_c = min(math.log(start), ceiling)
        probes = (torch.randint(0, 2, (width, num_probes), generator=generator,
                                dtype=torch.float64) * 2.0 - 1.0).to(device)
        subspace = GalerkinSubspace()
        # The targets' quadratic forms enter Q(c), whose relative error the CG residual bounds;
        # the probes' forms carry the Hutchinson spread, far above a looser solve's error.
        tolerances = torch.full((t + num_probes,), tolerance, dtype=torch.float64,
                                device=device)
        tolerances[t:] = max(tolerance, probe_tolerance)
        phase[0] = "runs"
        runs: List[float] = []
        iterations: List[int] = []
        probe_iterations: List[int] = []
        # The anchor: the latest cold run's log c, its per-probe log|A_c| by Lanczos
        # quadrature, its forms [b, P^{1/2} v, P^{-1/2} v] (the quadrature is of the probes
        # P^{1/2} v of that run's preconditioner P) and P's sketch (basis, eigenvalues of G),
        # the control variate of the probes' trace samples.
        anchor, anchor_logdets, anchor_sketch, forms = math.nan, None, None, b
        truncation = 0.0
        profile: Optional[ScaleProfile] = None
        basis_map = None
        kept_tests = 0
        for _ in range(max_runs):
            c = math.exp(log_c)
            if rank is None:
                # A sketch made at another c promises the condition 1 + c lambda_r here: the
                # rank grows before the run where that is above the target.
                phase[0] = "sketch"
                smallest = float(sketcher.preconditioner.eigenvalues.min()) / start
                sketcher.refine(1.0 + c * smallest, c / start, max_rank, solves, n, tolerance)
                phase[0] = "runs"
            pre = preconditioner(c)
            # A cold run (a new anchor) only where the anchor is far: a sketch grown since
            # leaves the anchor's quadrature and control variate valid (both are of the
            # anchor's own preconditioner), so it needs no run of its own.
            cold = profile is None or abs(log_c - anchor) > COLD_RADIUS
            initial = None
            if not cold:
                # Warm start from the projection: the anchor's quadrature serves, so this
                # run only refines the subspace near its c (the targets' and the anchor's
                # probes' forms there), each column from its projected solution.
                inverse = 1.0 / (1.0 + c * profile.theta)
                coefficients = torch.cat([profile.b_hat, profile.z_hat], 1) * inverse[:, None]
                initial = subspace.solution(basis_map, coefficients)
            # The targets first, to the solve's tolerance (their forms enter Q(c)): their
            # run's Lanczos condition grows the sketch where it falls short, and a cold run's
            # probes then run on the grown one, whose remainder has the smaller spread.
            result, directions, images = recorded_cg(
                counted, c, b, pre.inverse, tolerances[:t], max_iterations,
                None if initial is None else initial[:, :t])
            if initial is not None:
                counts["runs"] += t  # the starting residual's product
            runs.append(log_c)
            iterations.append(result.iterations)
            if rank is None:
                phase[0] = "sketch"
                sketcher.refine(lanczos_condition(result), c / start, max_rank,
                                solves, n, tolerance)
                phase[0] = "runs"
            for block, image in zip(directions, images):
                subspace.add(block, image)
            # The probes at the looser probe tolerance (the log-determinant's Gauss
            # quadrature converges about twice as fast as the solve's residual): a cold run's
            # on the grown sketch's preconditioner, the new anchor; a warm run's are the
            # anchor's probes, from their projected solutions.
            if cold:
                pre = preconditioner(c)
                forms = torch.cat([b, pre.sqrt(probes), pre.inverse_sqrt(probes)], 1)
            probe_run, directions, images = recorded_cg(
                counted, c, forms[:, t:t + num_probes], pre.inverse, tolerances[t:],
                max_iterations, None if initial is None else initial[:, t:])
            if initial is not None:
                counts["runs"] += num_probes
            probe_iterations.append(probe_run.iterations)
            if cold:
                anchor, anchor_sketch = log_c, (pre.basis, pre.eigenvalues / c)
                anchor_logdets = pre.logdet() + width * lanczos_log_quadrature(probe_run)
                # The quadrature's truncation error at the probe tolerance: the mean of the
                # last Lanczos step's change (times the start vectors' squared norm, W).
                truncation = width * float(last_step_change(probe_run).mean())
            for block, image in zip(directions, images):
                subspace.add(block, image)
            # The sketch's test vectors come with their images: the columns not yet kept.
            subspace.add(sketcher.test[:, kept_tests:], sketcher.image[:, kept_tests:] / start)
            kept_tests = sketcher.rank
            theta, projected, basis_map = subspace.ritz(forms)
            profile = ScaleProfile(theta, projected, t, num_probes, *anchor_sketch, probes,
                                   function_space)
            low = max(min(runs) - SEARCH_RADIUS, -_LOG_C_LIMIT)
            high = min(max(runs) + SEARCH_RADIUS, ceiling)
            log_c, interior = profile_minimiser(profile, low, high, target_squares, n, t,
                                                noise_floor, ceiling)
            near = min(abs(log_c - r) for r in runs)
            if interior and near <= ACCEPT_RADIUS:
                break
        c = math.exp(log_c)
        q_value, curvature, traces = profile.terms(c, target_squares)
        noise_out = profile_noise(q_value, target_squares, n * t, noise_floor)
        at_floor = noise_floor > 0 and q_value / (n * t) <= noise_floor
        # log|A_c| per probe: the anchor's quadrature carried along log c.
        per_probe = anchor_logdets + integrated_slope(profile, anchor, log_c)
        logdet = float(per_probe.mean())
        total = q_value / noise_out + t * logdet + n * t * (math.log(noise_out) + LOG_2PI)
        slope_samples = t * (width - traces) - curvature / noise_out
    return KrylovCalibration(
        factor=c * noise_out, noise=noise_out,
        log_evidence=-0.5 * total / (n * t),
        standard_error=0.5 * t * math.hypot(float(per_probe.std()) / math.sqrt(num_probes),
                                            truncation) / (n * t),
        gradient_standard_error=float(slope_samples.std()) / math.sqrt(num_probes) / (n * t),
        noise_at_floor=at_floor, rank=sketcher.rank, iterations=iterations,
        probe_iterations=probe_iterations,
        run_scales=[math.exp(r) for r in runs], products=dict(counts),
        preconditioner=preconditioner(c),
    )
