r"""Matrix-free linear algebra of the iterative solve: conjugate gradients and Lanczos quadrature.

The iterative solver (:mod:`~rfgp.inference._cg_solver`) never forms the ``D x D`` matrix
:math:`B = \Phi^H S^{-1}\Phi + I`; it only applies it to blocks of vectors. This module holds
what works on such products alone:

* :func:`conjugate_gradients`: preconditioned conjugate gradients on a block of right-hand sides,
  every column its own Hermitian system (its own step lengths), all sharing one product per
  iteration. It is written here rather than taken from ``linear_operator`` because the latter's
  CG is real-only, and complex features need Hermitian systems with conjugate transposes.
  It records the CG coefficients, from which the Lanczos tridiagonal follows
  (:func:`lanczos_log_quadrature`, :func:`lanczos_condition`).
* :func:`cg_iterations_bound`: the iterations CG needs at a given condition number (the
  Nyström preconditioner of :mod:`~rfgp.inference._nystrom` aims at a small one).

The cost model of an iterative fit (``cg_fit_cost``) is :mod:`~rfgp.inference._fit_cost`'s.

Internal: not part of the public API (see :mod:`rfgp.inference`).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Callable, List, Optional

import torch
from linear_operator.utils.errors import NotPSDError
from torch import Tensor

from rfgp._validation import check_choice, check_int, check_real
from rfgp.inference._selection import ConvergenceWarning

__all__ = [
    "CGResult",
    "CGSettings",
    "cg_iterations_bound",
    "check_resolvable",
    "conjugate_gradients",
    "lanczos_largest",
    "lanczos_condition",
    "lanczos_log_quadrature",
    "standard_normal",
]

#: a product ``V -> A V`` of a Hermitian positive definite operator on ``(W, k)`` blocks
Product = Callable[[Tensor], Tensor]



def _dot(a: Tensor, b: Tensor) -> Tensor:
    """Column-wise Hermitian inner products ``Re sum conj(a) b``, ``(k,)``."""
    if a.is_complex():
        return (a.real * b.real + a.imag * b.imag).sum(0)
    return (a * b).sum(0)


def _column_units(rhs: Tensor) -> Tensor:
    """``(k,)`` powers of two within a factor 2 of each column's largest modulus (1 for a zero
    column): dividing by them is exact and leaves every column's largest entry in [1, 2) (a
    power just below the largest modulus, so that it stays finite up to the dtype's maximum)."""
    largest = rhs.abs().amax(0) if rhs.shape[0] else rhs.real.new_zeros(rhs.shape[1])
    exponent = torch.frexp(largest.to(rhs.real.dtype))[1] - 1
    unit = torch.ldexp(torch.ones_like(largest), exponent)
    return torch.where(largest > 0, unit, torch.ones_like(unit)).to(rhs.real.dtype)


def _check_positive(active: Tensor, rz: Tensor, curvature: Tensor, what: str,
                    dtype: torch.dtype) -> None:
    """Refuse a step where ``r^H P^-1 r`` or ``p^H A p`` of an active column is not positive."""
    broken = active & ~((rz > 0) & (curvature > 0) & torch.isfinite(rz) & torch.isfinite(curvature))
    if bool(broken.any()):
        real = dtype.to_real() if dtype.is_complex else dtype
        raise NotPSDError(
            f"conjugate gradients on {what} broke down: the matrix (or its preconditioner) is "
            f"not positive definite in {real} (the noise is too small against the features' "
            "scale for this precision); increase the noise or use float64"
        )


def _preconditioned(residual: Tensor, precondition: Optional[Product],
                    root: Optional[Product]):
    """``(P^-1 r, r^H P^-1 r)`` per column (see :func:`conjugate_gradients`)."""
    if root is not None:
        half = root(residual)
        return root(half), _dot(half, half)
    applied = residual if precondition is None else precondition(residual)
    return applied, _dot(residual, applied)


@dataclass
class CGSettings:
    """The settings of an iterative solve (validated).

    Args:
        tolerance: relative residual :math:`\\|b - B w\\| / \\|b\\|` at which a column stops
            (``None``: ``1e-6`` in float64, ``1e-4`` in float32); the mean and posterior draws
            also stop only once their error is provably within ``tolerance`` posterior
            standard deviations (``energy_tolerance`` of :func:`conjugate_gradients`).
        max_iterations: iterations before giving up with a :class:`ConvergenceWarning`.
        preconditioner_rank: rank ``r`` of the Nyström preconditioner; ``None`` chooses it from
            the spectrum (doubling from 32 until the ``r``-th eigenvalue estimate of
            :math:`B - I` is below 4, at most 512, and beyond 512 while a doubling saves more
            products than it costs, :func:`doubling_pays`); ``0`` disables it.
        cache_bytes: bytes of training features kept between products; the rest are recomputed
            from the inputs at every product.
        num_probes: Rademacher probes of the stochastic log-determinant.
        variance: ``"auto"``: as ``"lowrank"``, but where the form's bound exceeds the
            tolerance and a Cholesky factor of :math:`B` costs less than refining the rows
            asked for (and fits in a quarter of the memory, in a precision that resolves
            it), the exact variances from that factor;
            ``"lowrank"``: predictive variances from a low-rank form of :math:`B^{-1}`
            built once per fit, each within ``variance_tolerance`` of the exact one,
            relatively (an upper bound of it wherever the form's certified bound
            :math:`\tau` is at most the tolerance; the form serves up to
            :attr:`variance_bound`, :mod:`~rfgp.inference._cg_variance`; where its bound
            stays above that, refined per query by CG preconditioned with it);
            ``"exact"``: one CG solve per query row.
        variance_tolerance: the relative error the low-rank and refined variances guarantee
            (in ``(0, 1)``).
        variance_rank: the most columns of the low-rank form (per noise group).
    """

    tolerance: Optional[float] = None
    max_iterations: int = 1000
    preconditioner_rank: Optional[int] = None
    cache_bytes: int = 1 << 30
    num_probes: int = 16
    variance: str = "auto"
    variance_tolerance: float = 1e-2
    variance_rank: int = 2048

    def __post_init__(self) -> None:
        if self.tolerance is not None:
            self.tolerance = check_real("cg_tolerance", self.tolerance, low=0.0, high=1.0,
                                        low_inclusive=False, high_inclusive=False)
        self.max_iterations = check_int("max_cg_iterations", self.max_iterations)
        if self.preconditioner_rank is not None:
            self.preconditioner_rank = check_int("preconditioner_rank", self.preconditioner_rank,
                                                 minimum=0)
        self.cache_bytes = check_int("cache_bytes", self.cache_bytes, minimum=0)
        self.num_probes = check_int("num_probes", self.num_probes, minimum=2)
        self.variance = check_choice("cg_variance", self.variance,
                                     ("auto", "lowrank", "exact"))
        self.variance_tolerance = check_real("cg_variance_tolerance", self.variance_tolerance,
                                             low=0.0, high=1.0, low_inclusive=False,
                                             high_inclusive=False)
        self.variance_rank = check_int("cg_variance_rank", self.variance_rank)

    @property
    def variance_bound(self) -> float:
        r"""The largest bound :math:`\tau` of a low-rank form whose variances serve at the
        tolerance :math:`t`, :math:`2t / (1 - t)`. The form's variance :math:`\hat v` of an
        exact one :math:`v` lies in :math:`[v, (1 + \tau) v]`; where :math:`\tau \le t` it is
        returned as it is, and above that :math:`k \hat v` with :math:`k = (1 + t) / (1 +
        \tau)`, within :math:`t` of :math:`v` either way as long as :math:`k \ge 1 - t`, that
        is :math:`\tau \le 2t / (1 - t)` (:func:`~rfgp.inference._cg_routes.served_factor`).

        Example:
            >>> round(CGSettings(variance_tolerance=0.01).variance_bound, 6)
            0.020202
        """
        t = self.variance_tolerance
        return 2.0 * t / (1.0 - t)

    def tolerance_for(self, dtype: torch.dtype) -> float:
        """The relative residual tolerance in ``dtype``."""
        if self.tolerance is not None:
            return self.tolerance
        return 1e-6 if dtype in (torch.float64, torch.complex128) else 1e-4

    def state(self) -> dict:
        return dict(self.__dict__)


@dataclass
class CGResult:
    """The outcome of :func:`conjugate_gradients`.

    Attributes:
        solution: ``(W, k)``.
        iterations: iterations run (the most of any column).
        residual: ``(k,)`` relative residuals reached.
        converged: whether every column reached the tolerance.
        steps: per iteration, the step lengths ``alpha`` ``(k,)``.
        ratios: per iteration, ``beta = r_{j+1}^H z_{j+1} / r_j^H z_j`` ``(k,)``.
        active: per iteration, which columns took the step ``(k,)``.
        energy: ``(k,)`` :math:`r^H P^{-1} r` of the final residuals, in the units of the
            right-hand side squared, from CG's recurrence (the quantity its energy tests
            read; ``None`` where not recorded).
    """

    solution: Tensor
    iterations: int
    residual: Tensor
    converged: bool
    steps: List[Tensor]
    ratios: List[Tensor]
    active: List[Tensor]
    energy: Optional[Tensor] = None


def conjugate_gradients(
    product: Product,
    rhs: Tensor,
    precondition: Optional[Product] = None,
    tolerance: float = 1e-6,
    max_iterations: int = 1000,
    what: str = "the system B w = b",
    warn: bool = True,
    initial: Optional[Tensor] = None,
    energy_tolerance: Optional[float] = None,
    precondition_root: Optional[Product] = None,
    relative_energy: Optional[float] = None,
    energy_floor: Optional[Tensor] = None,
) -> CGResult:
    r"""Solve :math:`A w_j = b_j` for every column of ``rhs`` by preconditioned CG.

    Each column runs its own CG (its own :math:`\alpha_j, \beta_j`); the columns share one
    product :math:`A V` per iteration. A column stops once
    :math:`\|b_j - A w_j\| \le \mathrm{tolerance}\, \|b_j\|` and, with ``energy_tolerance``
    :math:`\tau`, once also :math:`\sqrt{r^H P^{-1} r} \le \tau`. Where
    :math:`P \preceq A` (no preconditioner and :math:`A \succeq I`, or a Nyström preconditioner
    of :math:`A = G + I`), :math:`r^H P^{-1} r \ge r^H A^{-1} r = \|w - A^{-1}b\|_A^2`, so for
    any :math:`\phi`, :math:`|\phi^H (w - A^{-1} b)| \le \tau \sqrt{\phi^H A^{-1}\phi}`:
    a posterior mean within :math:`\tau` posterior standard deviations everywhere, which a
    relative residual alone does not bound when :math:`A` is ill-conditioned. With
    ``relative_energy`` :math:`\rho` (from a zero start) a column also stops once
    :math:`r^H P^{-1} r \le \rho\,\mathrm{Re}\, b^H w`: CG from zero keeps
    :math:`b^H w_k = b^H A^{-1} b - r_k^H A^{-1} r_k`, a lower bound that rises to the quadratic
    form, so :math:`b^H w_k + r_k^H P^{-1} r_k` is then within a factor :math:`1 + \rho` above
    :math:`b^H A^{-1} b` (the relative precision of a predictive variance). With
    ``energy_floor`` :math:`f_j` the test is :math:`r^H P^{-1} r \le \rho\,(\mathrm{Re}\,
    b^H w + f_j)`, which keeps :math:`b^H w_k + r_k^H P^{-1} r_k` within
    :math:`\rho\,(b^H A^{-1} b + f_j)` above the quadratic form (the precision of a
    predictive variance to which a noise variance :math:`f_j` is added). For complex
    ``rhs`` ``A`` must be Hermitian: inner products are :math:`\mathrm{Re}\, u^H v`, which
    equals :math:`u^H v` for the Hermitian forms CG takes.

    Args:
        product: ``V -> A V`` for ``(W, k)`` blocks (Hermitian positive definite ``A``).
        rhs: ``(W, k)`` right-hand sides (real or complex).
        precondition: ``R -> P^{-1} R``, ``P`` Hermitian positive definite (default none).
        tolerance: relative residual at which a column stops.
        max_iterations: the most iterations.
        what: the system, for the warning.
        warn: warn with a :class:`ConvergenceWarning` when a column does not converge.
        initial: a starting guess ``(W, k)`` (default zero; costs one more product). The
            recorded coefficients are then those of the Lanczos run started at the residual.
        energy_tolerance: the bound :math:`\tau` on :math:`\sqrt{r^H P^{-1} r}`, in the units
            of ``rhs`` (default none).
        precondition_root: ``R -> P^{-1/2} R``; with it :math:`P^{-1} r` is applied as
            :math:`P^{-1/2}(P^{-1/2} r)` and :math:`r^H P^{-1} r` is
            :math:`\|P^{-1/2} r\|^2`, non-negative by construction where a preconditioner with
            eigenvalues beyond :math:`1/\epsilon` rounds the direct form below zero.
        relative_energy: :math:`\rho`: a column whose relative residual is within
            ``tolerance`` stops once :math:`r^H P^{-1} r \le \rho\,\mathrm{Re}\,b^H w`
            (or ``energy_tolerance``'s bound holds); only from a zero start.
        energy_floor: ``(k,)`` non-negative :math:`f_j` added to :math:`\mathrm{Re}\,b^H w`
            in ``relative_energy``'s test, in the units of :math:`b^H A^{-1} b` (default 0).

    Returns:
        A :class:`CGResult`.

    Example:
        >>> a = torch.tensor([[4.0, 1.0], [1.0, 3.0]], dtype=torch.float64)
        >>> b = torch.tensor([[1.0], [2.0]], dtype=torch.float64)
        >>> result = conjugate_gradients(lambda v: a @ v, b)
        >>> torch.allclose(a @ result.solution, b), result.iterations
        (True, 2)
    """
    if not bool(torch.isfinite(rhs.abs()).all()):
        raise NotPSDError(
            f"conjugate gradients on {what}: the right-hand side holds NaN or infinite entries "
            f"(in {rhs.real.dtype}: a noise or outputscale beyond its range over- or "
            "underflows); check the inputs, the noise and the outputscale, rescale the "
            "targets, or use float64"
        )
    # CG is linear in the right-hand side: each column is divided by a power of two near its
    # largest entry (exact) and the solution multiplied back, so that no inner product
    # overflows or underflows at any scale of the targets or features, and the step lengths
    # and ratios (which the Lanczos quadrature reads) are those of the unscaled run.
    if relative_energy is not None and initial is not None:
        raise ValueError("conjugate_gradients: relative_energy bounds b^H A^-1 b only from a "
                         "zero start; got an initial guess as well")
    if energy_floor is not None and relative_energy is None:
        raise ValueError("conjugate_gradients: energy_floor is a term of relative_energy's "
                         "test; got it without relative_energy")
    unit = _column_units(rhs)  # (k,)
    rhs = rhs / unit
    # The floor in the normalised units of b^H w (b divided by its unit, b^H w by its
    # square); divided twice so that a tiny unit overflows to an infinite floor (the
    # quadratic form is negligible beside it: met at once) rather than squaring to zero.
    floor = 0.0
    if energy_floor is not None:
        given = energy_floor.to(device=unit.device, dtype=unit.dtype)
        floor = torch.where(given > 0, given / unit / unit, torch.zeros_like(given))
    if initial is None:
        solution, residual = torch.zeros_like(rhs), rhs.clone()
    else:
        solution = initial.to(rhs.dtype) / unit
        residual = rhs - product(solution)
    scale = _dot(rhs, rhs).sqrt()
    zero = scale == 0
    scale = torch.where(zero, torch.ones_like(scale), scale)
    applied, rz = _preconditioned(residual, precondition, precondition_root)
    direction = applied.clone()
    steps: List[Tensor] = []
    ratios: List[Tensor] = []
    actives: List[Tensor] = []
    relative = _dot(residual, residual).sqrt() / scale
    # the energy bound in the normalised units, squared (inf: no bound)
    energy = torch.full_like(scale, math.inf) if energy_tolerance is None else (
        (energy_tolerance / unit).square())
    iterations = 0

    def energy_met(rz: Tensor, solution: Tensor) -> Tensor:
        if relative_energy is None:
            return rz <= energy
        # b^H w_k: the rising lower bound of b^H A^-1 b
        met = rz <= relative_energy * (_dot(rhs, solution).clamp_min(0) + floor)
        return met if energy_tolerance is None else met | (rz <= energy)

    for _ in range(max_iterations):
        active = ((relative > tolerance) | ~energy_met(rz, solution)) & ~zero
        if not bool(active.any()):
            break
        iterations += 1
        image = product(direction)
        curvature = _dot(direction, image)
        # On a positive definite matrix (and preconditioner) both forms are positive for a
        # column that has not converged; anything else means the matrix is not positive
        # definite in this precision, where a step would return NaN or nonsense.
        _check_positive(active, rz, curvature, what, rhs.dtype)
        # Frozen (converged) columns take no step.
        alpha = torch.where(active, rz / torch.where(active, curvature, torch.ones_like(rz)),
                            torch.zeros_like(rz))
        solution = solution + alpha * direction
        residual = residual - alpha * image
        applied, rz_next = _preconditioned(residual, precondition, precondition_root)
        beta = torch.where(active, rz_next / torch.where(active, rz, torch.ones_like(rz)),
                           torch.zeros_like(rz))
        direction = torch.where(active, applied + beta * direction, direction)
        rz = torch.where(active, rz_next, rz)
        steps.append(alpha)
        ratios.append(beta)
        actives.append(active)
        relative = _dot(residual, residual).sqrt() / scale
    relative = torch.where(zero, torch.zeros_like(relative), relative)
    within = energy_met(rz, solution) | zero
    solution = solution * unit
    converged = bool((relative <= tolerance).all()) and bool(within.all())
    if warn and not converged:
        reached = (f"relative residual {float(relative.max()):.3g} reached, tolerance "
                   f"{tolerance:.3g}")
        if not bool(within.all()):
            bound = float((rz.clamp_min(0).sqrt() * unit)[~within].max())
            wanted = ([] if energy_tolerance is None else [
                f"energy tolerance {float(torch.as_tensor(energy_tolerance).max()):.3g}"]) + (
                [] if relative_energy is None else [f"relative energy {relative_energy:.3g}"])
            reached += f", error bound sqrt(r^H P^-1 r) {bound:.3g}, " + " or ".join(wanted)
        warnings.warn(
            f"conjugate gradients on {what} did not converge in {max_iterations} iterations: "
            f"{reached}; raise max_cg_iterations, the preconditioner_rank, or the noise",
            ConvergenceWarning,
        )
    return CGResult(solution, iterations, relative, converged, steps, ratios, actives,
                    rz.clamp_min(0) * unit.square())


def _lanczos_tridiagonals(result: CGResult, columns: Optional[List[int]]) -> List[Tensor]:
    """Per column, the Lanczos tridiagonal of its CG run (``(0, 0)`` where it took no step)."""
    columns = list(range(result.solution.shape[1])) if columns is None else columns
    if not result.steps:  # no column took a step (zero right-hand sides)
        return [torch.zeros(0, 0, dtype=torch.float64) for _ in columns]
    steps = torch.stack(result.steps).double().cpu()
    ratios = torch.stack(result.ratios).double().cpu()
    active = torch.stack(result.active).cpu()
    out = []
    for col in columns:
        length = int(active[:, col].sum())
        alpha, beta = steps[:length, col], ratios[:length, col]
        diag = 1.0 / alpha
        diag[1:] += beta[:-1] / alpha[:-1]
        off = beta[:-1].sqrt() / alpha[:-1]
        out.append(torch.diag(diag) + torch.diag(off, 1) + torch.diag(off, -1))
    return out


def lanczos_log_quadrature(result: CGResult, columns: Optional[List[int]] = None) -> Tensor:
    r"""Gauss quadrature of :math:`e_1^\top \log(T) e_1` from a CG run, per column.

    The CG coefficients of a column define the Lanczos tridiagonal :math:`T` of the
    (preconditioned) matrix started at its first (preconditioned) residual:
    :math:`T_{00} = 1/\alpha_0`, :math:`T_{jj} = 1/\alpha_j + \beta_{j-1}/\alpha_{j-1}`,
    :math:`T_{j,j+1} = \sqrt{\beta_j}/\alpha_j`. With :math:`T = Q \Theta Q^\top`,
    :math:`e_1^\top \log(T) e_1 = \sum_k Q_{0k}^2 \log\theta_k`; times the squared norm of the
    start vector this is the quadrature of :math:`v^\top \log(A) v` (stochastic Lanczos
    quadrature).

    Args:
        result: a :class:`CGResult` (its coefficients).
        columns: the columns to evaluate (default all).

    Returns:
        ``(len(columns),)`` quadratures, float64 on the CPU.
    """
    values = []
    for tri in _lanczos_tridiagonals(result, columns):
        if tri.numel() == 0:
            values.append(0.0)
            continue
        theta, vectors = torch.linalg.eigh(tri)
        values.append(float((vectors[0].square() * theta.clamp_min(1e-300).log()).sum()))
    return torch.tensor(values, dtype=torch.float64)


def lanczos_condition(result: CGResult, columns: Optional[List[int]] = None) -> float:
    r"""The condition number of the (preconditioned) matrix a CG run met: the largest Ritz
    value of the columns' Lanczos tridiagonals over the smallest.

    The extreme Ritz values converge first, from inside the spectrum, so this is a lower bound
    that is close once a run has taken more than a few iterations; 1.0 where no column took a
    step.

    Example:
        >>> a = torch.diag(torch.linspace(1.0, 100.0, 50, dtype=torch.float64))
        >>> run = conjugate_gradients(lambda v: a @ v, torch.ones(50, 1, dtype=torch.float64),
        ...                           None, 1e-10)
        >>> 90.0 < lanczos_condition(run) <= 100.0
        True
    """
    largest, smallest = 0.0, math.inf
    for tri in _lanczos_tridiagonals(result, columns):
        if tri.numel():
            theta = torch.linalg.eigvalsh(tri)
            largest, smallest = max(largest, float(theta[-1])), min(smallest, float(theta[0]))
    return largest / smallest if largest > 0 and smallest > 0 else 1.0


def lanczos_largest(result: CGResult) -> float:
    """The largest Ritz value of a CG run's Lanczos tridiagonals (a lower bound on the
    preconditioned matrix's largest eigenvalue); 1.0 where no column took a step."""
    tris = [tri for tri in _lanczos_tridiagonals(result, None) if tri.numel()]
    return max((float(torch.linalg.eigvalsh(tri)[-1]) for tri in tris), default=1.0)


def check_resolvable(largest: float, dtype: torch.dtype) -> None:
    r"""Refuse a matrix :math:`B = \Phi^H S^{-1}\Phi + I` whose largest eigenvalue (so its
    condition number, as :math:`B \succeq I`) reaches :math:`1/\epsilon` of ``dtype``.

    There :math:`B` is singular in working precision: its Cholesky factor does not exist (the
    weight-space solve refuses it) and CG's residual recurrence drifts from the true residual
    by about :math:`\epsilon\kappa`, so a "converged" solve can be off by more than the
    posterior's own spread.

    Example:
        >>> check_resolvable(1e9, torch.float64)
        >>> try:
        ...     check_resolvable(1e9, torch.float32)
        ... except NotPSDError as err:
        ...     print("float32" in str(err))
        True
    """
    real = dtype.to_real() if dtype.is_complex else dtype
    eps = torch.finfo(real).eps
    if not largest * eps < 1.0:
        raise NotPSDError(
            f"the matrix B = Phi^H S^-1 Phi + I of the iterative solve has a condition number "
            f"of about {largest:.3g}, beyond what {real} resolves (1/eps = {1 / eps:.3g}): "
            "the noise is too small against the features' scale for this precision; increase "
            "the noise or use float64"
        )


def cg_iterations_bound(condition: float, tolerance: float) -> float:
    r"""CG's iterations to reduce the error by ``tolerance`` on a spectrum of condition number
    :math:`\kappa`: :math:`\tfrac12 \sqrt{\kappa} \ln(2 / \epsilon)`."""
    return 0.5 * math.sqrt(max(condition, 1.0)) * math.log(2.0 / tolerance)


def standard_normal(shape, dtype: torch.dtype, generator: Optional[torch.Generator],
                    device: torch.device) -> Tensor:
    """Standard normal draws of ``shape``; complex ones ``a + i b`` with ``a, b ~ N(0, 1)``
    (the probes and sample draws of a Hermitian solve)."""
    real = dtype.to_real() if dtype.is_complex else dtype
    draw = torch.randn(*shape, generator=generator, dtype=real, device=device)
    if dtype.is_complex:
        draw = torch.complex(draw, torch.randn(*shape, generator=generator, dtype=real,
                                               device=device))
    return draw
