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
from torch import Tensor

from rfgp._validation import check_int, check_real
from rfgp.inference._selection import ConvergenceWarning

__all__ = [
    "CGResult",
    "CGSettings",
    "cg_iterations_bound",
    "conjugate_gradients",
    "lanczos_condition",
    "lanczos_log_quadrature",
]

#: a product ``V -> A V`` of a Hermitian positive definite operator on ``(W, k)`` blocks
Product = Callable[[Tensor], Tensor]



def _dot(a: Tensor, b: Tensor) -> Tensor:
    """Column-wise Hermitian inner products ``Re sum conj(a) b``, ``(k,)``."""
    if a.is_complex():
        return (a.real * b.real + a.imag * b.imag).sum(0)
    return (a * b).sum(0)


@dataclass
class CGSettings:
    """The settings of an iterative solve (validated).

    Args:
        tolerance: relative residual :math:`\\|b - B w\\| / \\|b\\|` at which a column stops
            (``None``: ``1e-6`` in float64, ``1e-4`` in float32).
        max_iterations: iterations before giving up with a :class:`ConvergenceWarning`.
        preconditioner_rank: rank ``r`` of the Nyström preconditioner; ``None`` chooses it from
            the spectrum (doubling from 32 until the ``r``-th eigenvalue estimate of
            :math:`B - I` is below 4, at most 512, and beyond 512 while a doubling saves more
            products than it costs, :func:`doubling_pays`); ``0`` disables it.
        cache_bytes: bytes of training features kept between products; the rest are recomputed
            from the inputs at every product.
        num_probes: Rademacher probes of the stochastic log-determinant.
    """

    tolerance: Optional[float] = None
    max_iterations: int = 1000
    preconditioner_rank: Optional[int] = None
    cache_bytes: int = 1 << 30
    num_probes: int = 16

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
    """

    solution: Tensor
    iterations: int
    residual: Tensor
    converged: bool
    steps: List[Tensor]
    ratios: List[Tensor]
    active: List[Tensor]


def conjugate_gradients(
    product: Product,
    rhs: Tensor,
    precondition: Optional[Product] = None,
    tolerance: float = 1e-6,
    max_iterations: int = 1000,
    what: str = "the system B w = b",
    warn: bool = True,
    initial: Optional[Tensor] = None,
) -> CGResult:
    r"""Solve :math:`A w_j = b_j` for every column of ``rhs`` by preconditioned CG.

    Each column runs its own CG (its own :math:`\alpha_j, \beta_j`); the columns share one
    product :math:`A V` per iteration. A column stops once
    :math:`\|b_j - A w_j\| \le \mathrm{tolerance}\, \|b_j\|`. For complex ``rhs`` ``A`` must be
    Hermitian: inner products are :math:`\mathrm{Re}\, u^H v`, which equals :math:`u^H v` for
    the Hermitian forms CG takes.

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

    Returns:
        A :class:`CGResult`.

    Example:
        >>> a = torch.tensor([[4.0, 1.0], [1.0, 3.0]], dtype=torch.float64)
        >>> b = torch.tensor([[1.0], [2.0]], dtype=torch.float64)
        >>> result = conjugate_gradients(lambda v: a @ v, b)
        >>> torch.allclose(a @ result.solution, b), result.iterations
        (True, 2)
    """
    if initial is None:
        solution, residual = torch.zeros_like(rhs), rhs.clone()
    else:
        solution = initial.to(rhs.dtype).clone()
        residual = rhs - product(solution)
    scale = _dot(rhs, rhs).sqrt()
    zero = scale == 0
    scale = torch.where(zero, torch.ones_like(scale), scale)
    applied = residual if precondition is None else precondition(residual)
    direction = applied.clone()
    rz = _dot(residual, applied)
    steps: List[Tensor] = []
    ratios: List[Tensor] = []
    actives: List[Tensor] = []
    relative = _dot(residual, residual).sqrt() / scale
    iterations = 0
    for _ in range(max_iterations):
        active = (relative > tolerance) & ~zero
        if not bool(active.any()):
            break
        iterations += 1
        image = product(direction)
        curvature = _dot(direction, image)
        # Frozen (converged) columns take no step; a zero curvature means an exact solution.
        alpha = torch.where(active & (curvature > 0), rz / curvature.clamp_min(1e-300),
                            torch.zeros_like(rz))
        solution = solution + alpha * direction
        residual = residual - alpha * image
        applied = residual if precondition is None else precondition(residual)
        rz_next = _dot(residual, applied)
        beta = torch.where(active, rz_next / rz.clamp_min(1e-300), torch.zeros_like(rz))
        direction = torch.where(active, applied + beta * direction, direction)
        rz = torch.where(active, rz_next, rz)
        steps.append(alpha)
        ratios.append(beta)
        actives.append(active)
        relative = _dot(residual, residual).sqrt() / scale
    relative = torch.where(zero, torch.zeros_like(relative), relative)
    converged = bool((relative <= tolerance).all())
    if warn and not converged:
        warnings.warn(
            f"conjugate gradients on {what} did not converge in {max_iterations} iterations: "
            f"relative residual {float(relative.max()):.3g} reached, tolerance {tolerance:.3g}; "
            "raise max_cg_iterations, the preconditioner_rank, or the noise",
            ConvergenceWarning,
        )
    return CGResult(solution, iterations, relative, converged, steps, ratios, actives)


def _lanczos_tridiagonals(result: CGResult, columns: Optional[List[int]]) -> List[Tensor]:
    """Per column, the Lanczos tridiagonal of its CG run (``(0, 0)`` where it took no step)."""
    steps = torch.stack(result.steps).double().cpu() if result.steps else torch.zeros(0, 0)
    ratios = torch.stack(result.ratios).double().cpu() if result.ratios else torch.zeros(0, 0)
    active = torch.stack(result.active).cpu() if result.active else torch.zeros(0, 0, dtype=bool)
    columns = list(range(result.solution.shape[1])) if columns is None else columns
    out = []
    for col in columns:
        length = int(active[:, col].sum()) if active.numel() else 0
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


def cg_iterations_bound(condition: float, tolerance: float) -> float:
    r"""CG's iterations to reduce the error by ``tolerance`` on a spectrum of condition number
    :math:`\kappa`: :math:`\tfrac12 \sqrt{\kappa} \ln(2 / \epsilon)`."""
    return 0.5 * math.sqrt(max(condition, 1.0)) * math.log(2.0 / tolerance)
