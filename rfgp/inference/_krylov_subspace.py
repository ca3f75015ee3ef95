r"""The pieces of the Krylov calibration (:mod:`~rfgp.inference._krylov_calibration`): a
conjugate-gradient run that records its directions, the Galerkin projection of every
:math:`A_c = I + c G` onto their span, and the evidence's profile in :math:`c` on it.

With kept vectors :math:`Z` and their images :math:`G Z`, :math:`M = Z^\top Z = S^{-\top}
S^{-1}` (truncated to its well-conditioned part) and the Ritz decomposition
:math:`S^\top Z^\top G Z S = R\,\Theta R^\top`, a bilinear form is

.. math::
    w^\top A_c^{-1} z \approx \sum_k \frac{\hat w_k \hat z_k}{1 + c\,\theta_k},
    \qquad \hat z = R^\top S^\top Z^\top z,

:math:`O(s)` per form and per :math:`c`. The profile of :math:`g(c) = -2 \log p` at the
noise :math:`\sigma^2(c) = \max(Q(c) / (N T), \sigma_0^2)` has the slope

.. math::
    \frac{d g}{d \log c} = T\big(W - \mathrm{tr}\,A_c^{-1}\big)
        - \frac{c \sum_t \|A_c^{-1} b_t\|^2}{\sigma^2(c)},

its root is the calibrated :math:`c`, and the integral of :math:`W - \mathrm{tr}\,A_s^{-1}`
over :math:`\log s` carries a log-determinant from one :math:`c` to another.

In the rows' (function-space) form, :math:`G = \Phi\Phi^\top` is ``N x N`` and the forms
are of the targets themselves (:math:`b_t = y_t`): then :math:`Q(c) = \sum_t y_t^\top
A_c^{-1} y_t` and :math:`c\,y^\top A_c^{-1} G A_c^{-1} y = y^\top A_c^{-1} y -
\|A_c^{-1} y\|^2` (as :math:`A_c^{-1} c G A_c^{-1} = A_c^{-1} - A_c^{-2}`), while the
log-determinant and :math:`W - \mathrm{tr}\,A_c^{-1}` (``N`` in place of ``W``) are
unchanged: the nonzero eigenvalues of :math:`\Phi\Phi^\top` and :math:`\Phi^\top\Phi`
are the same (:meth:`ScaleProfile.terms`).

Internal: not part of the public API (see :mod:`rfgp.inference`).
"""

from __future__ import annotations

import math
from typing import Callable, List, Optional, Tuple

import torch
from torch import Tensor

from rfgp.inference._iterative import CGResult, lanczos_log_quadrature

__all__ = ["EXACT_FIT_NOISE", "GalerkinSubspace", "ScaleProfile", "gauss_legendre",
           "integrated_slope", "last_step_change", "profile_minimiser", "profile_noise",
           "profile_slope", "recorded_cg"]

#: Where Q(c) <= 0 in rounding (the features fit y exactly at c), the profile's noise is this
#: fraction of the targets' mean square (relative, so that every scale of y is alike): the
#: slope is then steeply negative and c moves up, to the condition bound.
EXACT_FIT_NOISE = 1e-30
# Subspace directions whose Gram eigenvalue falls below this fraction of the largest (after
# the columns are normalised) are dropped: they repeat others to working precision.
_DEPENDENCE = 1e-11
# Gauss-Legendre nodes of the log-determinant's integral over log c.
_QUADRATURE_NODES = 24
_BISECTIONS = 60


def recorded_cg(gram: Callable[[Tensor], Tensor], scale: float, rhs: Tensor,
                precondition: Callable[[Tensor], Tensor], tolerance: Tensor,
                max_iterations: int, initial: Optional[Tensor] = None
                ) -> Tuple[CGResult, List[Tensor], List[Tensor]]:
    """Preconditioned CG on :math:`(I + c G) X = R` (``c = scale``), every column its own
    system stopped at its own relative residual (``tolerance``, ``(k,)``), keeping each
    iteration's search directions and their images under ``G``.

    Returns ``(result, directions, images)``: the :class:`CGResult` (its coefficients give
    the Lanczos tridiagonals of a cold start) and per iteration the ``(W, k')`` directions
    of the columns still active and their images ``G P``.
    """
    if initial is None:
        solution, residual = torch.zeros_like(rhs), rhs.clone()
    else:
        solution = initial.clone()
        residual = rhs - solution - scale * gram(solution)
    norm = rhs.square().sum(0).sqrt()
    zero = norm == 0
    norm = torch.where(zero, torch.ones_like(norm), norm)
    applied = precondition(residual)
    direction = applied.clone()
    rz = (residual * applied).sum(0)
    steps, ratios, actives, directions, images = [], [], [], [], []
    relative = residual.square().sum(0).sqrt() / norm
    iterations = 0
    for _ in range(max_iterations):
        active = (relative > tolerance) & ~zero
        if not bool(active.any()):
            break
        iterations += 1
        # Only the active columns are multiplied: a converged column costs nothing more.
        moving = direction[:, active]
        image = torch.zeros_like(direction)  # (W, k)
        image[:, active] = gram(moving)
        directions.append(moving)
        images.append(image[:, active])
        full = direction + scale * image
        curvature = (direction * full).sum(0)
        alpha = torch.where(active & (curvature > 0), rz / curvature.clamp_min(1e-300),
                            torch.zeros_like(rz))
        solution = solution + alpha * direction
        residual = residual - alpha * full
        applied = precondition(residual)
        rz_next = (residual * applied).sum(0)
        beta = torch.where(active, rz_next / rz.clamp_min(1e-300), torch.zeros_like(rz))
        direction = torch.where(active, applied + beta * direction, direction)
        rz = torch.where(active, rz_next, rz)
        steps.append(alpha)
        ratios.append(beta)
        actives.append(active)
        relative = residual.square().sum(0).sqrt() / norm
    relative = torch.where(zero, torch.zeros_like(relative), relative)
    result = CGResult(solution, iterations, relative, bool((relative <= tolerance).all()),
                      steps, ratios, actives)
    return result, directions, images


class GalerkinSubspace:
    """The Galerkin projection of every :math:`A_c = I + c G` onto the span of kept vectors
    ``Z`` with known images ``G Z`` (module docstring)."""

    def __init__(self) -> None:
        self.blocks: List[Tensor] = []
        self.images: List[Tensor] = []

    def add(self, vectors: Tensor, images: Tensor) -> None:
        if vectors.shape[1]:
            scale = vectors.square().sum(0).sqrt().clamp_min(1e-300)
            self.blocks.append(vectors / scale)
            self.images.append(images / scale)

    def ritz(self, forms: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        """``(theta, projected, basis_map)``: the Ritz values of ``G`` on the span, ``forms``
        ``(W, m)`` projected onto the Ritz vectors (``(s, m)``), and the ``(s_Z, s)`` map
        ``S R`` from the kept vectors' coefficients to the Ritz coordinates."""
        z = torch.cat(self.blocks, 1)  # (W, s_Z)
        gz = torch.cat(self.images, 1)
        gram = z.transpose(0, 1) @ z
        gram = 0.5 * (gram + gram.transpose(0, 1))
        mu, vectors = torch.linalg.eigh(gram)
        keep = mu > _DEPENDENCE * float(mu.max())
        transform = vectors[:, keep] / mu[keep].sqrt()  # (s_Z, s): S with S^T M S = I
        inner = transform.transpose(0, 1) @ (z.transpose(0, 1) @ gz) @ transform
        theta, rotation = torch.linalg.eigh(0.5 * (inner + inner.transpose(0, 1)))
        basis_map = transform @ rotation
        projected = basis_map.transpose(0, 1) @ (z.transpose(0, 1) @ forms)
        return theta.clamp_min(0.0), projected, basis_map

    def solution(self, basis_map: Tensor, coefficients: Tensor) -> Tensor:
        """``Z S R coefficients``: Ritz coordinates back to vectors."""
        return torch.cat(self.blocks, 1) @ (basis_map @ coefficients)


class ScaleProfile:
    """The Galerkin estimates of the profile's pieces at any ``c`` (module docstring)."""

    def __init__(self, theta: Tensor, projected: Tensor, num_columns: int, num_probes: int,
                 sketch_basis: Tensor, sketch_eigenvalues: Tensor, probes: Tensor,
                 function_space: bool = False) -> None:
        t, p = num_columns, num_probes
        self.function_space = function_space
        self.theta = theta
        self.b_hat = projected[:, :t]
        self.z_hat = projected[:, t:t + p]
        self.w_hat = projected[:, t + p:]
        self.eigenvalues = sketch_eigenvalues  # of G, the sketch's
        self.probe_weights = (sketch_basis.transpose(0, 1) @ probes).square()  # (r, p)
        self.probe_norms = probes.square().sum(0)  # (p,)
        self.width = probes.shape[0]

    def pieces(self, c: float) -> Tuple[float, float, Tensor]:
        """``(b^T A^-1 b summed, ||A^-1 b||^2 summed, per-probe trace samples (p,))``."""
        inverse = 1.0 / (1.0 + c * self.theta)  # (s,)
        quad = float((self.b_hat.square() * inverse.unsqueeze(1)).sum())
        norm = float((self.b_hat.square() * inverse.square().unsqueeze(1)).sum())
        bilinear = (self.w_hat * self.z_hat * inverse.unsqueeze(1)).sum(0)
        damp = c * self.eigenvalues / (1.0 + c * self.eigenvalues)  # (r,)
        exact = self.width - float(damp.sum())  # tr P_c^-1
        control = self.probe_norms - (self.probe_weights * damp.unsqueeze(1)).sum(0)
        return quad, norm, exact + bilinear - control

    def terms(self, c: float, target_squares: float) -> Tuple[float, float, Tensor]:
        r"""``(Q(c), c y^T A^-1 G A^-1 y summed, per-probe trace samples (p,))``: in weight
        space :math:`Q = \sum_t y_t^\top y_t - c\,b^\top A^{-1} b` and the second
        :math:`c\|A^{-1} b\|^2`; in the rows' form :math:`Q = y^\top A^{-1} y` and
        :math:`y^\top A^{-1} y - \|A^{-1} y\|^2` (module docstring)."""
        quad, norm, traces = self.pieces(c)
        if self.function_space:
            return quad, quad - norm, traces
        return target_squares - c * quad, c * norm, traces


def profile_slope(profile: ScaleProfile, log_c: float, target_squares: float,
                  num_rows: int, num_columns: int, noise_floor: float) -> float:
    """:math:`dg / d\\log c` of the Galerkin profile (module docstring)."""
    q_value, curvature, traces = profile.terms(math.exp(log_c), target_squares)
    noise = profile_noise(q_value, target_squares, num_rows * num_columns, noise_floor)
    return num_columns * (profile.width - float(traces.mean())) - curvature / noise


def profile_noise(quad: float, target_squares: float, count: int, noise_floor: float) -> float:
    r""":math:`\sigma^2(c) = \max(Q(c) / (N T), \sigma_0^2)`, or where that is not positive
    (:math:`Q \le 0` in rounding) :data:`EXACT_FIT_NOISE` times the targets' mean square."""
    noise = max(quad / count, noise_floor)
    return noise if noise > 0 else target_squares / count * EXACT_FIT_NOISE


def profile_minimiser(profile: ScaleProfile, low: float, high: float,
                      target_squares: float, num_rows: int, num_columns: int,
                      noise_floor: float, ceiling: float) -> Tuple[float, bool]:
    """``(log c, interior)``: the first point in ``[low, high]`` where the slope turns from
    negative to positive (the profile's minimum), found on a grid and then by bisection;
    ``interior`` is False where it lies at an end of the interval (beyond it), except at
    the ``ceiling``, which bounds the answer itself."""
    def slope(point: float) -> float:
        return profile_slope(profile, point, target_squares, num_rows, num_columns, noise_floor)

    grid = torch.linspace(low, high, 33, dtype=torch.float64).tolist()
    values = [slope(point) for point in grid]
    if values[0] >= 0:
        return low, False
    for left, right, f_left, f_right in zip(grid, grid[1:], values, values[1:]):
        if f_left < 0 <= f_right:
            for _ in range(_BISECTIONS):
                middle = 0.5 * (left + right)
                if slope(middle) < 0:
                    left = middle
                else:
                    right = middle
            return 0.5 * (left + right), True
    return high, high >= ceiling


def integrated_slope(profile: ScaleProfile, start: float, stop: float) -> Tensor:
    """Per probe, :math:`\\int_{start}^{stop} (W - \\mathrm{tr}\\,A_s^{-1})\\, d\\log s`
    by Gauss-Legendre quadrature ((p,))."""
    if stop == start:
        return torch.zeros(profile.z_hat.shape[1], dtype=torch.float64)
    nodes, weights = gauss_legendre(_QUADRATURE_NODES)
    middle, half = 0.5 * (start + stop), 0.5 * (stop - start)
    total = torch.zeros(profile.z_hat.shape[1], dtype=torch.float64)
    for node, weight in zip(nodes, weights):
        traces = profile.pieces(math.exp(middle + half * node))[2]
        total = total + weight * half * (profile.width - traces.cpu())
    return total


def gauss_legendre(count: int) -> Tuple[List[float], List[float]]:
    """Nodes and weights on [-1, 1] (Golub-Welsch)."""
    k = torch.arange(1, count, dtype=torch.float64)
    off = k / torch.sqrt(4 * k * k - 1)
    jacobi = torch.diag(off, 1) + torch.diag(off, -1)
    nodes, vectors = torch.linalg.eigh(jacobi)
    return nodes.tolist(), (2 * vectors[0].square()).tolist()


def last_step_change(result: CGResult) -> Tensor:
    r"""Per column of a CG run, the change its last Lanczos step made to the Gauss quadrature
    of :math:`e_1^\top \log(T) e_1` (:func:`~rfgp.inference._iterative.lanczos_log_quadrature`),
    ``(k,)``: where the quadrature converges geometrically at a rate of at most a half per
    step, the error left after the last step is at most this change, an estimate of the
    truncation error of a run stopped at a loose tolerance.

    Example:
        >>> from rfgp.inference._iterative import conjugate_gradients
        >>> a = torch.diag(torch.linspace(1.0, 2.0, 50, dtype=torch.float64))
        >>> v = torch.ones(50, 1, dtype=torch.float64)
        >>> out = conjugate_gradients(lambda x: a @ x, v, tolerance=1e-12)
        >>> bool(last_step_change(out)[0] < 1e-10)
        True
    """
    full = lanczos_log_quadrature(result)
    if not result.active:
        return torch.zeros_like(full)
    active = torch.stack(result.active).cpu().clone()
    lengths = active.sum(0)
    for column, length in enumerate(lengths.tolist()):
        if length:
            active[length - 1, column] = False
    shorter = CGResult(result.solution, result.iterations, result.residual, result.converged,
                       result.steps, result.ratios, list(active))
    return (full - lanczos_log_quadrature(shorter)).abs()
