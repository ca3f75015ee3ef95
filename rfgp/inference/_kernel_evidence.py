r"""The exact GP's evidence from a dense kernel matrix or from a stationary kernel's inputs,
with closed-form gradients, and the twice-differentiable path their backward passes share.

Each evidence here (and the weight- and function-space evidences of
:mod:`rfgp.inference._evidence`) is a ``torch.autograd.Function`` whose backward pass computes
the gradient in closed form from the forward pass's factors, without autograd's graph: the
speed of a hyperparameter search. A closed-form gradient is not itself differentiable, so
under ``create_graph=True`` (a Hessian by autograd, a gradient penalty) the backward passes
instead differentiate a plain-autograd form of the same value (:func:`differentiable_backward`):
second derivatives are then right, at the cost of autograd's graph.

Internal: not part of the public API (see :mod:`rfgp.inference`).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional, Sequence, Tuple

import torch
from linear_operator.utils.errors import NotPSDError
from torch import Tensor

from rfgp.inference._linalg import try_cholesky

__all__ = [
    "LOG_2PI",
    "differentiable_backward",
    "kernel_negative_log_evidence",
    "stationary_negative_log_evidence",
]

LOG_2PI = math.log(2.0 * math.pi)


def differentiable_backward(
    needs_input_grad: Sequence[bool], grad: Tensor, value: Callable[..., Tensor],
    inputs: Sequence[Any],
) -> Tuple[Optional[Tensor], ...]:
    r"""A custom Function's backward result, ``grad`` times the gradients of ``value(*inputs)``
    by autograd with their own graph, for a backward pass run under ``create_graph=True``.

    ``value`` must compute the Function's forward value from ``inputs`` (the forward's
    arguments, as saved; non-tensor ones as they were) with differentiable operations only;
    the gradients then carry a graph back to the inputs, so that differentiating them again
    gives the true second derivatives instead of those of constants.

    Example:
        >>> class Square(torch.autograd.Function):
        ...     @staticmethod
        ...     def forward(ctx, t):
        ...         ctx.save_for_backward(t)
        ...         return t * t
        ...     @staticmethod
        ...     def backward(ctx, grad):
        ...         (t,) = ctx.saved_tensors
        ...         if torch.is_grad_enabled():   # create_graph=True
        ...             return differentiable_backward(ctx.needs_input_grad, grad,
        ...                                            lambda u: u * u, [t])
        ...         return (2 * t * grad,)
        >>> t = torch.tensor(3.0, requires_grad=True)
        >>> (g,) = torch.autograd.grad(Square.apply(t), t, create_graph=True)
        >>> torch.autograd.grad(g, t)[0].item()
        2.0
    """
    wanted = [i for i, need in enumerate(needs_input_grad) if need]
    out: list = [None] * len(needs_input_grad)
    if not wanted:
        return tuple(out)
    with torch.enable_grad():
        total = value(*inputs)
        grads = torch.autograd.grad(total, [inputs[i] for i in wanted], create_graph=True,
                                    allow_unused=True)
    for i, g in zip(wanted, grads):
        out[i] = None if g is None else grad * g
    return tuple(out)


def dense_gaussian_value(cov: Tensor, y: Tensor) -> Tensor:
    """``-log N(y; 0, cov)`` summed over ``y``'s columns, by plain autograd operations (the
    twice-differentiable form of the evidences' values)."""
    chol = torch.linalg.cholesky(cov)
    return _gaussian_terms(chol, y)[0]


def _gaussian_terms(chol: Tensor, y: Tensor) -> Tuple[Tensor, Tensor]:
    """``(-log N(y; 0, L L^T) summed over columns, a = (L L^T)^{-1} y)`` from a Cholesky factor."""
    n = y.shape[0]
    alpha = torch.cholesky_solve(y, chol)
    quad = (y * alpha).sum(0)
    logdet = 2.0 * chol.diagonal().log().sum()
    return 0.5 * (quad + logdet + n * LOG_2PI).sum(), alpha


def _covariance_gradient(chol: Tensor, alpha: Tensor) -> Tensor:
    """``T C^{-1} - a a^T``: twice the gradient of :func:`_gaussian_terms` in the covariance
    ``C = L L^T`` (symmetric)."""
    # In place on the inverse: each further N x N temporary costs about as much as the
    # arithmetic on it at the sizes of an exact search (a few hundred rows).
    out = torch.cholesky_inverse(chol)
    if alpha.shape[1] != 1:
        out.mul_(alpha.shape[1])
    return out.addmm_(alpha, alpha.T, alpha=-1.0)


def _kernel_value(k: Tensor, y: Tensor, noise: Tensor) -> Tensor:
    """:class:`_KernelEvidence`'s value by plain autograd operations."""
    return dense_gaussian_value(k + noise * torch.eye(k.shape[0], dtype=k.dtype,
                                                      device=k.device), y)


def _stationary_value(x: Tensor, y: Tensor, lengthscale: Tensor, outputscale: Tensor,
                      noise: Tensor, nu: Optional[float]) -> Tensor:
    """:class:`_StationaryEvidence`'s value by plain autograd operations, twice
    differentiable: distances from differences (``cdist`` has no second derivative) and, for
    the Matérn profiles, a square root kept away from the zero distances (the diagonal), whose
    derivatives there would be infinite times zero."""
    z = x / lengthscale
    r2 = (z.unsqueeze(-2) - z.unsqueeze(-3)).square().sum(-1)
    if nu is None:
        g = torch.exp(-0.5 * r2)
    else:
        apart = r2 > 0
        r = torch.where(apart, torch.where(apart, r2, torch.ones_like(r2)).sqrt(), 0.0)
        if nu == 0.5:
            g = torch.exp(-r)
        elif nu == 1.5:
            g = (1.0 + math.sqrt(3.0) * r) * torch.exp(-math.sqrt(3.0) * r)
        else:
            g = (1.0 + math.sqrt(5.0) * r + 5.0 / 3.0 * r2) * torch.exp(-math.sqrt(5.0) * r)
    cov = outputscale * g + noise * torch.eye(x.shape[0], dtype=x.dtype, device=x.device)
    return dense_gaussian_value(cov, y)


def _kernel_factor(matrix: Tensor) -> Tensor:
    """The Cholesky factor of a kernel matrix plus noise, or ``NotPSDError`` naming the cause.

    No jitter: an optimiser's line search backs off from a point that fails.
    """
    chol = try_cholesky(matrix)
    if chol is not None:
        return chol
    if not bool(torch.isfinite(matrix).all()):
        raise NotPSDError(
            "the kernel matrix plus noise holds NaN or infinite entries; check the inputs, "
            "the kernel's hyperparameters and the noise"
        )
    raise NotPSDError("the kernel matrix plus noise is not positive definite")


class _KernelEvidence(torch.autograd.Function):
    """``-log p(y)`` for ``y ~ N(0, K + noise I)`` with the gradient in closed form."""

    @staticmethod
    def forward(ctx, k: Tensor, y: Tensor, noise: Tensor) -> Tensor:
        n = y.shape[0]
        matrix = k + noise * torch.eye(n, dtype=k.dtype, device=k.device)
        chol = _kernel_factor(matrix)
        value, alpha = _gaussian_terms(chol, y)
        ctx.save_for_backward(chol, alpha, k, y, noise)
        return value

    @staticmethod
    def backward(ctx, grad: Tensor):
        chol, alpha, k, y, noise = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: a gradient that has derivatives
            return differentiable_backward(ctx.needs_input_grad, grad, _kernel_value,
                                           [k, y, noise])
        # d/dK = (T K^-1 - a a^T) / 2, d/dnoise = tr(d/dK), d/dy = a.
        grad_k = 0.5 * _covariance_gradient(chol, alpha)
        return grad * grad_k, grad * alpha, grad * grad_k.diagonal().sum()


def kernel_negative_log_evidence(k: Tensor, y: Tensor, noise: Tensor) -> Tensor:
    r"""``-log p(y)`` for :math:`y_t \sim N(0, K + \sigma^2 I)` (independent columns) from a
    dense kernel matrix, with the gradient in closed form.

    With :math:`L L^\top = K + \sigma^2 I` and :math:`a = (K + \sigma^2 I)^{-1} y`,

    .. math::
        -\log p(y) = \tfrac12 \textstyle\sum_t y_t^\top a_t + T \sum_i \log L_{ii}
            + \tfrac{N T}{2} \log 2\pi,\quad
        \frac{\partial}{\partial K} = \tfrac12 \big(T (K + \sigma^2 I)^{-1} - a a^\top\big),\quad
        \frac{\partial}{\partial \sigma^2} = \mathrm{tr}\,\frac{\partial}{\partial K}.

    One evaluation with its gradient costs a Cholesky factor and its inverse,
    :math:`O(N^3)`: the exact GP's evidence, used by :func:`rfgp.fit_auto` on small data,
    where it costs no more than the random-feature evidence and has no approximation error.

    Args:
        k: ``(N, N)`` symmetric positive semi-definite kernel matrix.
        y: ``(N, T)`` targets.
        noise: 0-d positive tensor :math:`\sigma^2`.

    Returns:
        A 0-d tensor, differentiable in ``k``, ``y`` and ``noise``.

    Raises:
        ValueError: for shapes other than ``(N, N)``, ``(N, T)`` (``N >= 1``) and 0-d.
        NotPSDError: if :math:`K + \sigma^2 I` cannot be factorised or holds NaN or
            infinite entries.

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> z = torch.randn(30, 40, dtype=torch.float64, generator=g)
        >>> y = torch.randn(30, 1, dtype=torch.float64, generator=g)
        >>> noise = torch.tensor(0.5, dtype=torch.float64)
        >>> from rfgp.inference._evidence import negative_log_evidence
        >>> bool(torch.isclose(kernel_negative_log_evidence(z @ z.T, y, noise),
        ...                    negative_log_evidence(z, y, noise)))
        True
    """
    # Shape checks only: this runs at every evaluation of an optimiser's loss.
    if k.dim() != 2 or y.dim() != 2 or k.shape != (y.shape[0], y.shape[0]) or y.shape[0] == 0:
        raise ValueError(
            "kernel_negative_log_evidence: k must have shape (N, N) and y shape (N, T) with "
            f"N >= 1, got k {tuple(k.shape)} and y {tuple(y.shape)}"
        )
    if noise.dim() != 0:
        raise ValueError(f"noise must be a 0-d tensor, got shape {tuple(noise.shape)}")
    return _KernelEvidence.apply(k, y, noise)


def _profile_and_slope(r: Tensor, nu: Optional[float]) -> Tuple[Tensor, Tensor]:
    """``g(r)`` of the stationary kernel and ``-g'(r) / r`` (0 where ``r = 0`` for
    Matérn-1/2, whose slope there is singular but multiplies a zero distance)."""
    if nu is None:
        g = r.square_().mul_(-0.5).exp_()  # r is not needed again: reuse its memory
        return g, g
    if nu == 0.5:
        g = torch.exp(-r)
        return g, torch.where(r > 0, g / r.clamp_min(torch.finfo(r.dtype).tiny), 0.0)
    if nu == 1.5:
        s3 = math.sqrt(3.0) * r
        e = torch.exp(-s3)
        return (1.0 + s3) * e, 3.0 * e
    if nu == 2.5:
        s5 = math.sqrt(5.0) * r
        e = torch.exp(-s5)
        return (1.0 + s5 + 5.0 / 3.0 * r.square()) * e, 5.0 / 3.0 * (1.0 + s5) * e
    raise ValueError(f"nu must be None, 0.5, 1.5 or 2.5, got {nu!r}")


class _StationaryEvidence(torch.autograd.Function):
    """``-log p(y)`` of the exact stationary GP, differentiable in the lengthscales, the
    outputscale and the noise, with the gradient in closed form."""

    @staticmethod
    def forward(ctx, x: Tensor, y: Tensor, lengthscale: Tensor, outputscale: Tensor,
                noise: Tensor, nu: Optional[float]) -> Tensor:
        z = x / lengthscale
        r = torch.cdist(z, z, compute_mode="donot_use_mm_for_euclid_dist")
        g, slope = _profile_and_slope(r, nu)
        matrix = outputscale * g
        matrix.diagonal().add_(noise)
        chol = _kernel_factor(matrix)
        value, alpha = _gaussian_terms(chol, y)
        ctx.nu = nu
        ctx.save_for_backward(z, g, slope, chol, alpha, lengthscale, outputscale, x, y, noise)
        return value

    @staticmethod
    def backward(ctx, grad: Tensor):
        z, g, slope, chol, alpha, lengthscale, outputscale, x, y, noise = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: a gradient that has derivatives
            return differentiable_backward(ctx.needs_input_grad, grad, _stationary_value,
                                           [x, y, lengthscale, outputscale, noise, ctx.nu])
        # G = d/dC = (T C^-1 - a a^T) / 2. With M = G * s * (-g'(r)/r) (symmetric) and
        # u = (x_a - x_b) / l: d/dl_j = sum_ab M_ab u_abj^2 / l_j, and
        # sum_ab M_ab (z_aj - z_bj)^2 = 2 sum_a z_aj^2 (M 1)_a - 2 z_j^T M z_j, one M Z product
        # instead of an (N, N, d) tensor of differences.
        # gmat is twice G; the factors 1/2 and s are applied to the d + 2 sums, not the matrix.
        gmat = _covariance_gradient(chol, alpha)
        grad_noise = 0.5 * gmat.diagonal().sum()
        grad_outputscale = 0.5 * torch.dot(gmat.reshape(-1), g.reshape(-1))
        weights = gmat.mul_(slope)  # in place: gmat is not needed again
        zc = z - z.mean(0)  # shift invariance: centred columns keep the identity well-conditioned
        row_sums = weights.sum(1)
        spread = (zc.square() * row_sums.unsqueeze(-1)).sum(0) - (zc * (weights @ zc)).sum(0)
        grad_lengthscale = spread * outputscale / lengthscale
        return (None, grad * alpha, grad * grad_lengthscale, grad * grad_outputscale,
                grad * grad_noise, None)


def stationary_negative_log_evidence(
    x: Tensor, y: Tensor, lengthscale: Tensor, outputscale: Tensor, noise: Tensor,
    nu: Optional[float] = None,
) -> Tensor:
    r"""``-log p(y)`` for :math:`y_t \sim N(0, s\,K_\nu + \sigma^2 I)` with the exact RBF or
    Matérn kernel :math:`K_\nu` of :func:`~rfgp.kernels.stationary_kernel`, with its
    gradient in the lengthscales, outputscale and noise in closed form.

    With :math:`C = s\,g(R) + \sigma^2 I` (:math:`R` the scaled distances),
    :math:`G = \tfrac12 (T C^{-1} - a a^\top)`, :math:`a = C^{-1} y` and
    :math:`u_{ab} = (x_a - x_b) / \ell`,

    .. math::
        \frac{\partial}{\partial \ell_j} = \frac{1}{\ell_j} \sum_{ab} M_{ab}\, u_{abj}^2,\quad
        M = -s\, G \circ \frac{g'(R)}{R},\qquad
        \frac{\partial}{\partial s} = \sum_{ab} G_{ab}\, g(R_{ab}),\qquad
        \frac{\partial}{\partial \sigma^2} = \mathrm{tr}\, G,

    and :math:`\sum_{ab} M_{ab} u_{abj}^2` comes from one :math:`M U` product, so an evaluation
    costs a Cholesky factor, its inverse and :math:`O(N^2 d)`, without the ``(N, N, d)``
    differences that automatic differentiation of the distances keeps.

    Args:
        x: ``(N, d)`` inputs.
        y: ``(N, T)`` targets.
        lengthscale: ``(d,)`` positive lengthscales.
        outputscale: 0-d :math:`s > 0`.
        noise: 0-d :math:`\sigma^2 > 0`.
        nu: ``None`` (RBF) or a Matérn smoothness (0.5, 1.5, 2.5).

    Returns:
        A 0-d tensor, differentiable in ``y``, ``lengthscale``, ``outputscale`` and ``noise``.

    Raises:
        ValueError: for shapes other than ``(N, d)``, ``(N, T)``, ``(d,)`` and 0-d.
        TypeError: unless all five tensors share one floating dtype.
        NotPSDError: if :math:`C` cannot be factorised or holds NaN or infinite entries.

    Example:
        >>> from rfgp.kernels import stationary_kernel
        >>> g = torch.Generator().manual_seed(0)
        >>> x = torch.randn(30, 2, dtype=torch.float64, generator=g)
        >>> y = torch.randn(30, 1, dtype=torch.float64, generator=g)
        >>> ls = torch.tensor([0.7, 1.5], dtype=torch.float64)
        >>> s, n = torch.tensor(2.0, dtype=torch.float64), torch.tensor(0.1, dtype=torch.float64)
        >>> k = stationary_kernel(x, x, ls, 2.5) * s
        >>> bool(torch.isclose(stationary_negative_log_evidence(x, y, ls, s, n, 2.5),
        ...                    kernel_negative_log_evidence(k, y, n)))
        True
    """
    # Shape checks only: this runs at every evaluation of an optimiser's loss.
    if (x.dim() != 2 or y.dim() != 2 or y.shape[0] != x.shape[0] or x.shape[0] == 0
            or lengthscale.shape != (x.shape[1],)):
        raise ValueError(
            "stationary_negative_log_evidence: x must have shape (N, d), y (N, T) with N >= 1 "
            f"and lengthscale (d,), got x {tuple(x.shape)}, y {tuple(y.shape)} and lengthscale "
            f"{tuple(lengthscale.shape)}"
        )
    if outputscale.dim() != 0 or noise.dim() != 0:
        raise ValueError(
            "outputscale and noise must be 0-d tensors, got shapes "
            f"{tuple(outputscale.shape)} and {tuple(noise.shape)}"
        )
    dtypes = {t.dtype for t in (x, y, lengthscale, outputscale, noise)}
    if len(dtypes) != 1 or not x.is_floating_point():
        raise TypeError(
            "stationary_negative_log_evidence: x, y, lengthscale, outputscale and noise must "
            f"share one floating dtype, got {x.dtype}, {y.dtype}, {lengthscale.dtype}, "
            f"{outputscale.dtype} and {noise.dtype}"
        )
    return _StationaryEvidence.apply(x, y, lengthscale, outputscale, noise, nu)


