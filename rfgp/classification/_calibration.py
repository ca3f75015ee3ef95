r"""The outputscale of a Dirichlet classifier's feature model, chosen by that model's evidence.

The ``C`` class regressions of the Dirichlet transform share one kernel :math:`a\,k` and
differ in their fixed noise :math:`S_c = \mathrm{diag}(\tilde\sigma^2_{\cdot c})`. With the
``D`` features :math:`Z` of the kernel at the outputscale it holds, :math:`W_c = S_c^{-1}`,
:math:`G_c = Z^\top W_c Z = Q_c \Lambda_c Q_c^\top`, :math:`h_c = Z^\top W_c \tilde y_c` and
:math:`b_c = Q_c^\top h_c`, Woodbury and the determinant lemma give the negative log evidence
of the model with outputscale factor :math:`a`,

.. math::
    -\log p(\tilde Y \mid a) = \tfrac12 \textstyle\sum_c \Big[\tilde y_c^\top W_c \tilde y_c
        - \sum_i \frac{a\, b_{ci}^2}{1 + a \lambda_{ci}} + \sum_i \log(1 + a \lambda_{ci})
        + \sum_n \log \tilde\sigma^2_{nc} + N \log 2\pi\Big],

and its derivative in :math:`t = \log a`,

.. math::
    \frac{\partial}{\partial t} = \tfrac12 \textstyle\sum_{c, i} \Big[
        \frac{a \lambda_{ci}}{1 + a \lambda_{ci}} - \frac{a\, b_{ci}^2}{(1 + a\lambda_{ci})^2}
        \Big],

:math:`O(C D)` per evaluation once each :math:`G_c` is factorised. The ``C`` Gram matrices
share one :math:`Z^\top Z`: a class's weight takes one value on most rows (the other classes'
rows) and another on its own, so :math:`G_c = w_c Z^\top Z + Z_{R_c}^\top (W_c - w_c) Z_{R_c}`
costs a product over its own rows :math:`R_c` only. On fewer rows than features the ``N x N``
matrices :math:`M_c = W_c^{1/2} Z Z^\top W_c^{1/2} = U_c \Lambda_c U_c^\top` (one shared
:math:`Z Z^\top`, scaled per class) have the same non-zero eigenvalues, and
:math:`b_{ci}^2 = \lambda_{ci} (u_{ci}^\top W_c^{1/2} \tilde y_c)^2`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Tuple

import torch
from gpytorch.kernels import ScaleKernel
from torch import Tensor

from rfgp._validation import check_class_targets, check_int
from rfgp.inference._spectrum import spectrum_weights

__all__ = ["ClassScaleEvidence", "dirichlet_scale_evidence", "maximize_outputscale_evidence"]

#: Half-width, in nats of the factor, of the grid the maximisation starts from: factors from
#: ``exp(-12)`` to ``exp(12)`` of the outputscale the kernel holds.
LOG_FACTOR_RANGE = 12.0
_GRID_STEP = 0.5
#: Newton on the derivative stops when a step in ``log a`` is below this.
_STEP_TOLERANCE = 1e-12
_MAX_NEWTON = 100


@dataclass
class ClassScaleEvidence:
    r"""The spectral statistics of the ``C`` class regressions (see the module docstring).

    Attributes:
        eigenvalues: ``(C, D)`` :math:`\lambda_{ci}`, clamped at zero.
        projections: ``(C, D)`` :math:`b_{ci}^2`.
        constant: :math:`\sum_c [\tilde y_c^\top W_c \tilde y_c + \sum_n \log\tilde\sigma^2_{nc}
            + N \log 2\pi]`.
        num_data: ``N``.
    """

    eigenvalues: Tensor
    projections: Tensor
    constant: float
    num_data: int

    def negative_log_evidence(self, log_factor: float) -> float:
        """:math:`-\\log p(\\tilde Y \\mid a)` at :math:`a = e^{\\text{log\\_factor}}`."""
        a_lam = math.exp(log_factor) * self.eigenvalues
        quad = (math.exp(log_factor) * self.projections / (1 + a_lam)).sum()
        return 0.5 * (self.constant - float(quad) + float(torch.log1p(a_lam).sum()))

    def derivatives(self, log_factor: float) -> Tuple[float, float]:
        """First and second derivatives of :meth:`negative_log_evidence` in ``log a``."""
        a = math.exp(log_factor)
        a_lam = a * self.eigenvalues
        one = 1 + a_lam
        first = a_lam / one - a * self.projections / one**2
        second = a_lam / one**2 - a * self.projections * (1 - a_lam) / one**3
        return 0.5 * float(first.sum()), 0.5 * float(second.sum())


def dirichlet_scale_evidence(kernel: ScaleKernel, x: Tensor, targets: Tensor, noise: Tensor,
                             chunk_rows: int = 4096) -> ClassScaleEvidence:
    r"""Factorise each class's weighted Gram matrix of ``kernel``'s features on ``x``.

    Args:
        kernel: a ``ScaleKernel`` around a real random-feature kernel (``D`` features); its
            outputscale is the factor's reference.
        x: ``(N, d)`` inputs.
        targets: ``(N, C)`` (centred) Dirichlet targets.
        noise: ``(N, C)`` their fixed positive noise.
        chunk_rows: rows of features computed at a time (memory :math:`O(\text{chunk} \cdot D
            + C D^2)`).

    Returns:
        The :class:`ClassScaleEvidence`, in float64: one shared :math:`Z^\top Z`, one product
        over each class's own rows, one spectrum with the class's target's weights on it per
        class (:math:`O(2 N D^2 + 2 C D^3)`,
        :func:`~rfgp.inference._spectrum.spectrum_weights`); with fewer rows than features
        one :math:`Z Z^\top` and one ``N x N`` spectrum per class (:math:`O(N^2 D + 2 C
        N^3)`).

    Example:
        >>> from rfgp.kernels import FourierFeatureKernel
        >>> from rfgp.likelihoods import dirichlet_transform
        >>> k = ScaleKernel(FourierFeatureKernel(32, seed=0)).double()
        >>> x = torch.randn(50, 2, dtype=torch.float64)
        >>> y, s = dirichlet_transform(torch.arange(50) % 3, 3)
        >>> ev = dirichlet_scale_evidence(k, x, y - y.mean(0), s)
        >>> tuple(ev.eigenvalues.shape)
        (3, 32)
    """
    x, targets, noise = check_class_targets(x, targets, noise)
    chunk_rows = check_int("chunk_rows", chunk_rows, minimum=1)
    num_data, num_classes = targets.shape
    weights = noise.reciprocal().to(x.dtype)
    # Each class's most frequent weight (the other classes' rows) is shared with Z^T Z.
    shared = torch.mode(weights, dim=0).values  # (C,)
    base, scale = kernel.base_kernel, kernel.outputscale.detach().sqrt()
    quadratic = float((weights * targets.to(weights).square()).sum())
    constant = quadratic + float(noise.log().sum()) + num_data * num_classes * math.log(
        2 * math.pi)
    if num_data < base.num_features:
        return _function_space(base, scale, x, targets, weights, constant)
    gram, corrections, rhs = None, None, None
    with torch.no_grad():
        for start in range(0, num_data, chunk_rows):
            rows = slice(start, start + chunk_rows)
            z = base.features(x[rows]) * scale  # (n, D)
            if z.is_complex():
                raise TypeError("kernel must have real features, got complex ones")
            if gram is None:
                width = z.shape[1]
                gram = z.new_zeros(width, width)
                corrections = z.new_zeros(num_classes, width, width)
                rhs = z.new_zeros(width, num_classes)
            gram.addmm_(z.T, z)
            w = weights[rows]
            rhs.addmm_(z.T, w * targets[rows].to(z))
            for c in range(num_classes):
                own = torch.nonzero(w[:, c] != shared[c]).reshape(-1)
                if own.numel():
                    zc = z[own]
                    corrections[c].addmm_(zc.T, zc * (w[own, c] - shared[c]).unsqueeze(-1))
        grams = corrections + shared.reshape(-1, 1, 1) * gram  # (C, D, D)
        # Each class's spectrum and its target's weights on it.
        eigenvalues, projections = spectrum_weights(grams, rhs.T.unsqueeze(-1))
    return ClassScaleEvidence(eigenvalues.clamp_min(0.0), projections, constant, num_data)


def _function_space(base, scale: Tensor, x: Tensor, targets: Tensor, weights: Tensor,
                    constant: float) -> ClassScaleEvidence:
    """The same statistics from the ``N x N`` matrices (fewer rows than features)."""
    with torch.no_grad():
        z = base.features(x) * scale  # (N, D)
        if z.is_complex():
            raise TypeError("kernel must have real features, got complex ones")
        kernel_matrix = (z @ z.T).to(torch.float64)  # (N, N)
        root = weights.to(torch.float64).sqrt().T  # (C, N)
        scaled = root.unsqueeze(-1) * kernel_matrix * root.unsqueeze(-2)  # (C, N, N)
        whitened = (root * targets.to(torch.float64).T).unsqueeze(-1)  # (C, N, 1)
        eigenvalues, along = spectrum_weights(scaled, whitened)
        eigenvalues = eigenvalues.clamp_min(0.0)
    return ClassScaleEvidence(eigenvalues, eigenvalues * along, constant, x.shape[0])


def maximize_outputscale_evidence(evidence: ClassScaleEvidence) -> Tuple[float, float]:
    r"""The outputscale factor :math:`a` that maximises the summed evidence of the class
    regressions, within :math:`|\log a| \le` :data:`LOG_FACTOR_RANGE`.

    The best point of a grid in :math:`\log a` (step 0.5) is refined by Newton's method on the
    derivative, kept inside the grid cell on either side (bisection where a step leaves it),
    to a step below ``1e-12`` in :math:`\log a`: at an interior maximum the derivative
    is zero to rounding.

    Returns:
        ``(factor, negative_log_evidence)`` at the maximum.

    Example:
        >>> # one class, one eigenvalue 1, b^2 = 4: a / (1 + a) = 4 a / (1 + a)^2 at a = 3
        >>> ev = ClassScaleEvidence(torch.tensor([[1.0]], dtype=torch.float64),
        ...                         torch.tensor([[4.0]], dtype=torch.float64), 0.0, 1)
        >>> factor, _ = maximize_outputscale_evidence(ev)
        >>> round(factor, 6)
        3.0
    """
    grid = torch.arange(-LOG_FACTOR_RANGE, LOG_FACTOR_RANGE + _GRID_STEP / 2, _GRID_STEP,
                        dtype=torch.float64).tolist()
    values = [evidence.negative_log_evidence(t) for t in grid]
    best = min(range(len(grid)), key=values.__getitem__)
    t = grid[best]
    if best in (0, len(grid) - 1):  # the maximum is at the range's edge: keep the edge
        return math.exp(t), values[best]
    low, high = grid[best - 1], grid[best + 1]
    # The bracket holds a sign change of the derivative (a lower value lies between).
    for _ in range(_MAX_NEWTON):
        first, second = evidence.derivatives(t)
        if first > 0:
            high = min(high, t)
        elif first < 0:
            low = max(low, t)
        else:
            break
        step = -first / second if second > 0 else float("inf")
        trial = t + step
        if not low < trial < high:
            trial = 0.5 * (low + high)
        if abs(trial - t) < _STEP_TOLERANCE:
            t = trial
            break
        t = trial
    return math.exp(t), evidence.negative_log_evidence(t)
