r"""Matrix-free linear algebra of the iterative solve: conjugate gradients, Nyström, cost model.

The iterative solver (:mod:`~rfgp.inference._cg_solver`) never forms the ``D x D`` matrix
:math:`B = \Phi^H S^{-1}\Phi + I`; it only applies it to blocks of vectors. This module holds
what works on such products alone:

* :func:`conjugate_gradients`: preconditioned conjugate gradients on a block of right-hand sides,
  every column its own Hermitian system (its own step lengths), all sharing one product per
  iteration. It is written here rather than taken from ``linear_operator`` because the latter's
  CG is real-only, and complex features need Hermitian systems with conjugate transposes.
  It records the CG coefficients, from which the Lanczos tridiagonal follows
  (:func:`lanczos_log_quadrature`).
* :class:`NystromPreconditioner`: :math:`P = U \Lambda U^H + I \approx B`, from the randomized
  Nyström approximation of :math:`B - I` (one product with a ``D x r`` test matrix), inverted in
  closed form.
* :func:`cg_fit_cost` / :func:`cg_fit_seconds`: the cost model of an iterative fit, and
  :func:`cg_num_features`, the largest ``D`` within a time budget.

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
from rfgp.inference._linalg import available_memory
from rfgp.inference._selection import ConvergenceWarning

__all__ = [
    "CGResult",
    "CGSettings",
    "NystromPreconditioner",
    "cg_fit_cost",
    "cg_iterations_bound",
    "doubling_pays",
    "rank_memory_cap",
    "cg_fit_seconds",
    "cg_num_features",
    "conjugate_gradients",
    "lanczos_log_quadrature",
]

#: a product ``V -> A V`` of a Hermitian positive definite operator on ``(W, k)`` blocks
Product = Callable[[Tensor], Tensor]

# The automatic rank stops growing once the r-th eigenvalue estimate of B - I falls below this:
# the preconditioned matrix then has condition number about 1 + that value.
RANK_STOP_EIGENVALUE = 4.0
# The automatic rank starts here and doubles up to MAX_AUTO_RANK (a D x r basis per noise group).
START_RANK = 32
MAX_AUTO_RANK = 512
# Beyond MAX_AUTO_RANK the rank doubles only while that costs fewer products than it saves
# over the solves the preconditioner serves (NystromPreconditioner.sketch's ``solves``), up to
# this rank.
MAX_PAYING_RANK = 4096
# Multiply-adds of the Nyström factorisation (QR of the new block, Cholesky, SVD) per W r^2.
_NYSTROM_FACTOR_COST = 8.0


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
    steps = torch.stack(result.steps).double().cpu() if result.steps else torch.zeros(0, 0)
    ratios = torch.stack(result.ratios).double().cpu() if result.ratios else torch.zeros(0, 0)
    active = torch.stack(result.active).cpu() if result.active else torch.zeros(0, 0, dtype=bool)
    columns = list(range(result.solution.shape[1])) if columns is None else columns
    values = []
    for col in columns:
        length = int(active[:, col].sum()) if active.numel() else 0
        if length == 0:
            values.append(0.0)
            continue
        alpha, beta = steps[:length, col], ratios[:length, col]
        diag = 1.0 / alpha
        diag[1:] += beta[:-1] / alpha[:-1]
        off = beta[:-1].sqrt() / alpha[:-1]
        tri = torch.diag(diag) + torch.diag(off, 1) + torch.diag(off, -1)
        theta, vectors = torch.linalg.eigh(tri)
        values.append(float((vectors[0].square() * theta.clamp_min(1e-300).log()).sum()))
    return torch.tensor(values, dtype=torch.float64)


class NystromPreconditioner:
    r"""The randomized Nyström preconditioner :math:`P = U \Lambda U^H + I \approx B`.

    For a positive semi-definite :math:`A = B - I = \Phi^H S^{-1}\Phi` and an orthonormal test
    matrix :math:`\Omega` (``W x r``), :math:`A \approx (A\Omega)(\Omega^H A \Omega)^{-1}
    (A\Omega)^H = U \Lambda U^H` (computed stably with a small shift :math:`\nu`, removed from
    :math:`\Lambda`). Since :math:`U` has orthonormal columns, Woodbury gives

    .. math::
        P^{-1} = I + U\,\mathrm{diag}\!\left(\tfrac{1}{1 + \lambda_i} - 1\right) U^H, \qquad
        P^{\pm 1/2} = I + U\,\mathrm{diag}\!\left((1 + \lambda_i)^{\pm 1/2} - 1\right) U^H,
        \qquad \log|P| = \textstyle\sum_i \log(1 + \lambda_i).

    The eigenvalues of :math:`P^{-1} B` lie in :math:`[1, 1 + \lambda_{r+1}]` for an exact
    rank-``r`` capture, so CG needs about :math:`\sqrt{1 + \lambda_{r+1}}` times fewer iterations
    than on a spectrum reaching :math:`1 + \lambda_1`.

    Args:
        basis: ``U`` ``(W, r)`` with orthonormal columns.
        eigenvalues: :math:`\Lambda` ``(r,)``, non-negative.

    Example:
        >>> a = torch.diag(torch.tensor([100.0, 10.0, 0.0], dtype=torch.float64))
        >>> p = NystromPreconditioner.sketch(lambda v: a @ v, 3, a.dtype, a.device, 2,
        ...                                  torch.Generator().manual_seed(0))
        >>> torch.allclose(p.inverse(a + torch.eye(3, dtype=a.dtype)), torch.eye(3, dtype=a.dtype))
        True
    """

    def __init__(self, basis: Tensor, eigenvalues: Tensor) -> None:
        self.basis = basis
        self.eigenvalues = eigenvalues

    @property
    def rank(self) -> int:
        return int(self.eigenvalues.shape[0])

    def _power(self, v: Tensor, exponent: float) -> Tensor:
        coeff = (1.0 + self.eigenvalues).pow(exponent) - 1.0  # (r,)
        basis = self.basis.to(v.dtype)
        return v + basis @ (coeff.to(v.dtype).unsqueeze(-1) * (basis.transpose(0, 1).conj() @ v))

    def inverse(self, v: Tensor) -> Tensor:
        """:math:`P^{-1} V`."""
        return self._power(v, -1.0)

    def sqrt(self, v: Tensor) -> Tensor:
        """:math:`P^{1/2} V`."""
        return self._power(v, 0.5)

    def inverse_sqrt(self, v: Tensor) -> Tensor:
        """:math:`P^{-1/2} V`."""
        return self._power(v, -0.5)

    def logdet(self) -> float:
        """:math:`\\log|P|`."""
        return float(torch.log1p(self.eigenvalues.double()).sum())

    @staticmethod
    def sketch(gram_product: Product, width: int, dtype: torch.dtype, device: torch.device,
               rank: Optional[int], generator: Optional[torch.Generator] = None,
               max_rank: int = MAX_AUTO_RANK, solves: float = 0.0,
               rows: Optional[int] = None,
               tolerance: float = 1e-6) -> NystromPreconditioner:
        r"""Build from ``gram_product`` (``V -> (B - I) V``), with a fixed ``rank`` or, for
        ``None``, a rank doubled from :data:`START_RANK` until the smallest eigenvalue estimate
        is below :data:`RANK_STOP_EIGENVALUE`, up to :data:`MAX_AUTO_RANK`; beyond it, while
        doubling pays for itself over ``solves`` column solves (:func:`doubling_pays`), up to
        :data:`MAX_PAYING_RANK`; never beyond ``min(width, max_rank)``. Each new block of
        test vectors costs one product; earlier blocks are kept.

        The test matrix is drawn on the CPU from ``generator`` (seed 0 without one), so that
        every process of a distributed fit draws the same one.

        Args:
            solves: how many column solves (right-hand sides times systems) the
                preconditioner will serve; 0 stops at :data:`MAX_AUTO_RANK`.
            rows: ``N``, the rows behind one product (weighs the preconditioner's own
                :math:`O(W r)` cost against a product's :math:`O(N W)`); ``None``: ignored.
            tolerance: the solves' relative residual.
        """
        generator = generator or torch.Generator().manual_seed(0)
        paying = max(MAX_AUTO_RANK, MAX_PAYING_RANK) if solves > 0 else MAX_AUTO_RANK
        limit = min(width, rank if rank is not None else min(max_rank, paying))
        target = limit if rank is not None else min(START_RANK, limit)
        basis = torch.zeros(width, 0, dtype=dtype, device=device)
        image = torch.zeros_like(basis)
        while True:
            block = _gaussian((width, target - basis.shape[1]), dtype, generator).to(device)
            for _ in range(2):  # twice: orthogonal to the kept block to working precision
                block = block - basis @ (basis.transpose(0, 1).conj() @ block)
            block = torch.linalg.qr(block)[0]
            basis = torch.cat([basis, block], 1)
            image = torch.cat([image, gram_product(block)], 1)
            result = _nystrom(basis, image)
            smallest = float(result.eigenvalues.min()) if result.rank else 0.0
            if rank is not None or target >= limit or smallest < RANK_STOP_EIGENVALUE:
                return result
            if target >= MAX_AUTO_RANK and not doubling_pays(
                    result.eigenvalues, solves, width, rows, tolerance):
                return result
            target = min(2 * target, limit)


def rank_memory_cap(width: int, dtype: torch.dtype, device: torch.device) -> int:
    """The largest automatic Nyström rank whose basis and image (``2 W r`` entries of
    ``dtype``) take at most a tenth of ``device``'s memory (at least 1)."""
    item = torch.empty((), dtype=dtype).element_size()
    return max(1, available_memory(device) // (20 * width * item))


def cg_iterations_bound(condition: float, tolerance: float) -> float:
    r"""CG's iterations to reduce the error by ``tolerance`` on a spectrum of condition number
    :math:`\kappa`: :math:`\tfrac12 \sqrt{\kappa} \ln(2 / \epsilon)`."""
    return 0.5 * math.sqrt(max(condition, 1.0)) * math.log(2.0 / tolerance)


def doubling_pays(eigenvalues: Tensor, solves: float, width: int, rows: Optional[int],
                  tolerance: float) -> bool:
    r"""Whether doubling a Nyström rank :math:`r` costs fewer products with one vector than it
    saves over ``solves`` column solves.

    With the eigenvalue estimates :math:`\lambda_1 \ge \dots \ge \lambda_r` of
    :math:`B - I`, the preconditioned condition number is about :math:`1 + \lambda_r` now and
    :math:`1 + \hat\lambda_{2r}` after, :math:`\hat\lambda_{2r} = \lambda_r^2 /
    \lambda_{r/2}` (the decay over the last doubling, continued). A column solve takes
    :math:`I(\kappa)` iterations (:func:`cg_iterations_bound`), each a product plus the
    preconditioner's :math:`4 W r` multiply-adds (:math:`2 r / N` products). Doubling costs
    :math:`r` products for the new test vectors and the factorisation's
    :math:`8 W (2r)^2` multiply-adds; it pays where

    .. math::
        r + \frac{16 r^2}{N} + s\, I(1 + \hat\lambda_{2r}) \Big(1 + \frac{4r}{N}\Big)
        < s\, I(1 + \lambda_r) \Big(1 + \frac{2r}{N}\Big).

    Example:
        >>> slow = 1e4 * 0.999 ** torch.arange(512.0)  # a flat spectrum: CG is slow
        >>> doubling_pays(slow, 100, 8192, 10**4, 1e-6), doubling_pays(slow, 1, 8192, 10**4, 1e-6)
        (True, False)
    """
    r = int(eigenvalues.shape[0])
    if r < 2 or solves <= 0:
        return False
    ordered = eigenvalues.sort(descending=True).values
    last, half = float(ordered[-1]), float(ordered[r // 2 - 1])
    predicted = last * min(1.0, last / half) if half > 0 else 0.0
    per_product = 0.0 if not rows else 2.0 * r / rows
    cost = r + (_NYSTROM_FACTOR_COST * 2 * r * r / rows if rows else 0.0)
    now = solves * cg_iterations_bound(1 + last, tolerance) * (1 + per_product)
    after = solves * cg_iterations_bound(1 + predicted, tolerance) * (1 + 2 * per_product)
    return cost + after < now


def _gaussian(shape, dtype: torch.dtype, generator: torch.Generator) -> Tensor:
    if dtype.is_complex:
        real = torch.randn(*shape, 2, generator=generator, dtype=torch.float64)
        return torch.view_as_complex(real).to(dtype)
    return torch.randn(*shape, generator=generator, dtype=torch.float64).to(dtype)


def _nystrom(basis: Tensor, image: Tensor) -> NystromPreconditioner:
    """The Nyström approximation from an orthonormal ``basis`` and ``image = A basis``."""
    if basis.shape[1] == 0:
        return NystromPreconditioner(basis, basis.new_zeros(0).real)
    eps = torch.finfo(image.real.dtype).eps
    # The shift keeps the small core matrix numerically positive definite; it is removed below.
    shift = eps * math.sqrt(basis.shape[0]) * float(torch.linalg.matrix_norm(image, 2))
    shifted = image + shift * basis
    core = basis.transpose(0, 1).conj() @ shifted
    core = 0.5 * (core + core.transpose(0, 1).conj())
    chol = torch.linalg.cholesky(core)
    factor = torch.linalg.solve_triangular(chol, shifted.transpose(0, 1).conj(), upper=False)
    vectors, singular, _ = torch.linalg.svd(factor.transpose(0, 1).conj(), full_matrices=False)
    eigenvalues = (singular.square() - shift).clamp_min(0)
    return NystromPreconditioner(vectors, eigenvalues)


# ====================================================================== cost model
def cg_fit_cost(num_rows: int, num_features: int, input_dim: int, iterations: int = 100,
                rank: int = 0, num_columns: int = 1, feature_cost: float = 4.0,
                cached: bool = False) -> float:
    r"""Multiply-adds of an iterative (``solve="cg"``) fit, a model for choosing ``D``.

    With :math:`N` rows, :math:`D` features, :math:`d` input dimensions, :math:`T` target
    columns, :math:`I` iterations and a Nyström rank :math:`r`, every product
    :math:`B V = \Phi^H(S^{-1}(\Phi V)) + V` with :math:`k` columns costs :math:`2 N D k`
    multiply-adds, plus :math:`N D (d + c)` to recompute the features (projection and
    :math:`c` per entry for the nonlinearity) unless they are cached:

    .. math::
        C = \underbrace{(I + 2) \cdot F}_{\text{features}}
            + \underbrace{2 N D (T (I + 1) + r)}_{\text{products}}
            + \underbrace{2 D r^2}_{\text{Nyström}}, \qquad F = N D (d + c)

    (the right-hand side, the sketch and :math:`I` iterations each pass over the data; cached
    features are computed once, :math:`F` instead of :math:`(I + 2) F`). The weight-space
    solve costs :math:`N D^2 + D^3/3` by comparison. Divide by a measured multiply-add rate
    (:func:`cg_fit_seconds`) for seconds.

    Args:
        num_rows: ``N`` (rows times outputs per input for multi-output kernels).
        num_features: ``D`` (real-form columns for complex features: ``2 D``).
        input_dim: ``d``.
        iterations: CG iterations ``I`` (preconditioned fits typically need tens).
        rank: Nyström rank ``r`` (0: no preconditioner).
        num_columns: target columns ``T`` solved together.
        feature_cost: multiply-adds per feature entry beyond the projection (``c``).
        cached: whether the features are cached across products (``cache_bytes``).

    Returns:
        Multiply-adds (a float).

    Example:
        >>> n, d = 10**5, 2**15  # against the weight-space solve's N D^2 + D^3 / 3
        >>> cg_fit_cost(n, d, 8, iterations=50, rank=256) < (n * d**2 + d**3 / 3) / 20
        True
    """
    rows = check_int("num_rows", num_rows)
    width = check_int("num_features", num_features)
    dim = check_int("input_dim", input_dim)
    iterations = check_int("iterations", iterations, minimum=0)
    rank = check_int("rank", rank, minimum=0)
    columns = check_int("num_columns", num_columns)
    per_entry = check_real("feature_cost", feature_cost, low=0.0)
    features = float(rows) * width * (dim + per_entry)
    passes = 1 if cached else iterations + 2
    products = 2.0 * rows * width * (columns * (iterations + 1) + rank)
    return passes * features + products + 2.0 * width * rank**2


def cg_fit_seconds(num_rows: int, num_features: int, input_dim: int, *,
                   multiply_adds_per_second: float, **options) -> float:
    r"""Predicted seconds of an iterative fit: :func:`cg_fit_cost` divided by a rate.

    Args:
        num_rows, num_features, input_dim: as in :func:`cg_fit_cost`.
        multiply_adds_per_second: the machine's measured rate (e.g. of a large matrix product).
        **options: ``iterations``, ``rank``, ``num_columns``, ``feature_cost``, ``cached``.

    Returns:
        Seconds.

    Example:
        >>> cg_fit_seconds(1000, 1024, 4, iterations=10, multiply_adds_per_second=1e9) < 1.0
        True
    """
    rate = check_real("multiply_adds_per_second", multiply_adds_per_second, low=0.0,
                      low_inclusive=False)
    return cg_fit_cost(num_rows, num_features, input_dim, **options) / rate


def cg_num_features(num_rows: int, input_dim: int, seconds: float, *,
                    multiply_adds_per_second: float, smallest: int = 1024,
                    largest: int = 1 << 16, **options) -> int:
    r"""The largest power-of-two ``D`` whose iterative fit fits a time budget.

    Doubles ``D`` from ``smallest`` while :func:`cg_fit_seconds` stays within ``seconds``
    (at most ``largest``); returns ``smallest`` when even that exceeds the budget.

    Args:
        num_rows, input_dim: as in :func:`cg_fit_cost`.
        seconds: the time budget of the fit.
        multiply_adds_per_second: the machine's measured rate.
        smallest, largest: the range of ``D``.
        **options: ``iterations``, ``rank``, ``num_columns``, ``feature_cost``, ``cached``.

    Returns:
        ``D``.

    Example:
        >>> cg_num_features(10**5, 8, 60.0, multiply_adds_per_second=1e10, iterations=50)
        8192
    """
    budget = check_real("seconds", seconds, low=0.0, low_inclusive=False)
    smallest = check_int("smallest", smallest)
    largest = check_int("largest", largest, minimum=smallest)
    width = smallest
    while 2 * width <= largest and cg_fit_seconds(
        num_rows, 2 * width, input_dim, multiply_adds_per_second=multiply_adds_per_second,
        **options,
    ) <= budget:
        width *= 2
    return width
