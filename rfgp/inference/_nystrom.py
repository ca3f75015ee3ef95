r"""The randomized Nyström preconditioner of the iterative solve, and the rule for its rank.

* :class:`NystromPreconditioner`: :math:`P = U \Lambda U^H + I \approx B`, from the randomized
  Nyström approximation of :math:`B - I` (one product with a ``D x r`` test matrix), inverted in
  closed form.
* :class:`NystromSketch`: the sketch behind it, kept so that its rank can grow by blocks (each
  block one product) when a solve shows the preconditioned matrix is worse conditioned than the
  sketch's own eigenvalue estimates said.
* :func:`doubling_pays`: whether doubling the rank saves more products than it costs.

Internal: not part of the public API (see :mod:`rfgp.inference`).
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from linear_operator.utils.errors import NotPSDError
from torch import Tensor

from rfgp.inference._iterative import Product, cg_iterations_bound
from rfgp.inference._linalg import available_memory

__all__ = [
    "MAX_AUTO_RANK",
    "RANK_STOP_EIGENVALUE",
    "NystromPreconditioner",
    "NystromSketch",
    "doubling_pays",
    "rank_memory_cap",
]

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

    @classmethod
    def identity(cls, width: int, dtype: torch.dtype,
                 device: torch.device) -> NystromPreconditioner:
        """The preconditioner of rank 0, :math:`P = I`, for a ``W = width`` operator."""
        empty = torch.zeros(width, 0, dtype=dtype, device=device)
        return cls(empty, empty.real.new_zeros(0))

    def __init__(self, basis: Tensor, eigenvalues: Tensor) -> None:
        self.basis = basis
        self.eigenvalues = eigenvalues

    @property
    def rank(self) -> int:
        return int(self.eigenvalues.shape[0])

    def _power(self, v: Tensor, exponent: float) -> Tensor:
        # (I - U U^H) v + U (1 + Lambda)^a U^H v, not v + U ((1 + Lambda)^a - 1) U^H v: where
        # lambda is beyond 1 / eps, (1 + lambda)^-1 - 1 rounds to -1 and P^-1 turns singular.
        basis = self.basis.to(v.dtype)
        coeff = (1.0 + self.eigenvalues).pow(exponent)  # (r,)
        inner = basis.transpose(0, 1).conj() @ v  # (r, k)
        return v - basis @ inner + basis @ (coeff.to(v.dtype).unsqueeze(-1) * inner)

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
        ``None``, the rank :meth:`NystromSketch.adapt` chooses (the arguments are its own).

        The test matrix is drawn on the CPU from ``generator`` (seed 0 without one), so that
        every process of a distributed fit draws the same one.
        """
        sketch = NystromSketch(gram_product, width, dtype, device, generator)
        if rank is not None:
            return sketch.grow(rank)
        return sketch.adapt(max_rank, solves, rows, tolerance)


class NystromSketch:
    r"""A randomized Nyström sketch of :math:`A = B - I` whose rank grows by blocks.

    It keeps the orthonormal test matrix :math:`\Omega` (``W x r``) and its image
    :math:`A\Omega`. Growing to a larger rank draws a block orthogonal to :math:`\Omega`,
    applies ``gram_product`` to that block alone (one product) and recomputes the approximation
    from every block, so no product is repeated. A sketch of :math:`s A` serves any
    :math:`c A` by scaling its eigenvalues by :math:`c / s`.

    The sketch's eigenvalue estimates fall short of the true ones where the spectrum decays
    slowly, and a sketch made at one scale may serve another: the condition number a solve
    then meets can be far above the :math:`1 + \lambda_r` the estimates promise.
    :meth:`refine` takes the condition number a solve measured (the extreme Ritz values of its
    CG run, :func:`~rfgp.inference._iterative.lanczos_condition`) and grows the rank from it.

    Args:
        gram_product: ``V -> A V`` on ``(W, k)`` blocks (``A`` positive semi-definite).
        width: ``W``.
        dtype, device: of the test matrix and the products.
        generator: the test blocks' draws, made on the CPU (seed 0 without one).

    Example:
        >>> a = torch.diag(10.0 ** -torch.arange(64.0, dtype=torch.float64) * 1e6)
        >>> sketch = NystromSketch(lambda v: a @ v, 64, torch.float64, a.device)
        >>> sketch.adapt(64, 0.0, None, 1e-6).rank  # the first 32 vectors hold every lambda > 4
        32
        >>> sketch.grow(48).rank  # 16 more vectors: one product with them alone
        48
    """

    def __init__(self, gram_product: Product, width: int, dtype: torch.dtype,
                 device: torch.device, generator: Optional[torch.Generator] = None) -> None:
        self.gram_product = gram_product
        self.generator = generator or torch.Generator().manual_seed(0)
        self.test = torch.zeros(width, 0, dtype=dtype, device=device)
        self.image = torch.zeros_like(self.test)
        self.preconditioner = _nystrom(self.test, self.image)

    @property
    def rank(self) -> int:
        return int(self.test.shape[1])

    def grow(self, rank: int) -> NystromPreconditioner:
        """The preconditioner at rank ``min(rank, W)`` (at least the current rank)."""
        width = self.test.shape[0]
        rank = min(rank, width)
        if rank > self.rank:
            block = _gaussian((width, rank - self.rank), self.test.dtype,
                              self.generator).to(self.test.device)
            for _ in range(2):  # twice: orthogonal to the kept blocks to working precision
                block = block - self.test @ (self.test.transpose(0, 1).conj() @ block)
            block = torch.linalg.qr(block)[0]
            self.test = torch.cat([self.test, block], 1)
            self.image = torch.cat([self.image, self.gram_product(block)], 1)
            self.preconditioner = _nystrom(self.test, self.image)
        return self.preconditioner

    def limit(self, max_rank: int, solves: float) -> int:
        """The most an automatic rank may reach: :data:`MAX_AUTO_RANK`, or
        :data:`MAX_PAYING_RANK` where solves are to be served, within ``W`` and ``max_rank``."""
        paying = max(MAX_AUTO_RANK, MAX_PAYING_RANK) if solves > 0 else MAX_AUTO_RANK
        return min(self.test.shape[0], max_rank, paying)

    def adapt(self, max_rank: int, solves: float, rows: Optional[int],
              tolerance: float) -> NystromPreconditioner:
        r"""Double the rank from :data:`START_RANK` until the smallest eigenvalue estimate is
        below :data:`RANK_STOP_EIGENVALUE`, up to :data:`MAX_AUTO_RANK`; beyond it, while
        doubling pays for itself over ``solves`` column solves (:func:`doubling_pays`), up to
        :data:`MAX_PAYING_RANK`; never beyond ``min(W, max_rank)``.

        Args:
            max_rank: a cap (memory: :func:`rank_memory_cap`).
            solves: how many column solves (right-hand sides times systems) the
                preconditioner will serve; 0 stops at :data:`MAX_AUTO_RANK`.
            rows: ``N``, the rows behind one product (weighs the preconditioner's own
                :math:`O(W r)` cost against a product's :math:`O(N W)`); ``None``: ignored.
            tolerance: the solves' relative residual.
        """
        limit = self.limit(max_rank, solves)
        target = max(self.rank, min(START_RANK, limit))
        while True:
            result = self.grow(target)
            smallest = float(result.eigenvalues.min()) if result.rank else 0.0
            if target >= limit or smallest < RANK_STOP_EIGENVALUE:
                return result
            if target >= MAX_AUTO_RANK and not doubling_pays(
                    result.eigenvalues, solves, self.test.shape[0], rows, tolerance):
                return result
            target = min(2 * target, limit)

    def refine(self, condition: float, scale: float, max_rank: int, solves: float,
               rows: Optional[int], tolerance: float) -> bool:
        r"""Grow the rank after a solve with the preconditioner of ``scale`` times the sketched
        matrix met the condition number ``condition``; whether it grew.

        Nothing happens while ``condition`` is within twice the target
        :math:`1 + 2\,` :data:`RANK_STOP_EIGENVALUE`. Otherwise the rank doubles (below
        :data:`MAX_AUTO_RANK` always, beyond it where :func:`doubling_pays` with the measured
        condition), and goes on doubling while the condition predicted for the new rank,
        :math:`1 + (\kappa - 1)\,\hat\lambda_{2r} / \hat\lambda_r` (the measured excess
        shrunk as the estimates shrank), is still above :math:`1 +` :data:`RANK_STOP_EIGENVALUE`.

        Args:
            condition: the measured condition number of the preconditioned matrix.
            scale: the factor on the sketched matrix that the solve used.
            max_rank, solves, rows, tolerance: as for :meth:`adapt` (``solves``: the solves
                still to be served).
        """
        limit = self.limit(max_rank, solves)
        if condition <= 1.0 + 2.0 * RANK_STOP_EIGENVALUE or self.rank >= limit:
            return False
        grew = False
        while self.rank < limit and condition > 1.0 + RANK_STOP_EIGENVALUE:
            before = scale * self.preconditioner.eigenvalues
            if self.rank >= MAX_AUTO_RANK and not doubling_pays(
                    before, solves, self.test.shape[0], rows, tolerance, condition):
                break
            after = scale * self.grow(min(2 * self.rank, limit)).eigenvalues
            grew = True
            last_before = float(before.min()) if before.numel() else 0.0
            shrink = float(after.min()) / last_before if last_before > 0 else 0.0
            condition = 1.0 + (condition - 1.0) * min(1.0, shrink)
        return grew


def rank_memory_cap(width: int, dtype: torch.dtype, device: torch.device) -> int:
    """The largest automatic Nyström rank whose basis and image (``2 W r`` entries of
    ``dtype``) take at most a tenth of ``device``'s memory (at least 1)."""
    item = torch.empty((), dtype=dtype).element_size()
    return max(1, available_memory(device) // (20 * width * item))


def doubling_pays(eigenvalues: Tensor, solves: float, width: int, rows: Optional[int],
                  tolerance: float, condition: Optional[float] = None) -> bool:
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

    Where a solve measured the preconditioned condition number :math:`\kappa` (``condition``),
    it replaces the estimate: :math:`1 + \lambda_r` now becomes :math:`\kappa`, and
    :math:`1 + \hat\lambda_{2r}` becomes :math:`1 + (\kappa - 1)\,\hat\lambda_{2r} /
    \lambda_r`.

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
    now_condition, after_condition = 1 + last, 1 + predicted
    if condition is not None:
        now_condition = condition
        after_condition = 1 + (condition - 1) * (predicted / last if last > 0 else 1.0)
    now = solves * cg_iterations_bound(now_condition, tolerance) * (1 + per_product)
    after = solves * cg_iterations_bound(after_condition, tolerance) * (1 + 2 * per_product)
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
    if not bool(torch.isfinite(image.abs()).all()):
        raise NotPSDError(
            f"the Nystrom preconditioner's products with Phi^H S^-1 Phi hold NaN or infinite "
            f"entries (in {image.real.dtype}: a noise or outputscale beyond its range over- or "
            "underflows); check the inputs, the noise and the outputscale, rescale the "
            "targets, or use float64"
        )
    norm = float(torch.linalg.matrix_norm(image, 2))
    if norm == 0:
        # A zero Gram (all-zero features, outputscale 0): B = I, so P = I (zero eigenvalues).
        return NystromPreconditioner(basis, basis.real.new_zeros(basis.shape[1]))
    # The shift keeps the small core matrix numerically positive definite; it is removed below.
    shift = eps * math.sqrt(basis.shape[0]) * norm
    shifted = image + shift * basis
    core = basis.transpose(0, 1).conj() @ shifted
    core = 0.5 * (core + core.transpose(0, 1).conj())
    chol = torch.linalg.cholesky(core)
    factor = torch.linalg.solve_triangular(chol, shifted.transpose(0, 1).conj(), upper=False)
    vectors, singular, _ = torch.linalg.svd(factor.transpose(0, 1).conj(), full_matrices=False)
    eigenvalues = (singular.square() - shift).clamp_min(0)
    return NystromPreconditioner(vectors, eigenvalues)
