r"""The log marginal likelihood (evidence) of a random-feature GP, from statistics or features.

With real-form features :math:`Z`, a diagonal noise :math:`S`, :math:`B = Z^\top S^{-1} Z + I`
and :math:`h = Z^\top S^{-1} y`, Woodbury and the matrix-determinant lemma give, per output column,

.. math::
    \log p(y) = -\tfrac12\left(y^\top S^{-1} y - h^\top B^{-1} h + \log|B|
                + \textstyle\sum_i \log s_i + N \log 2\pi\right),

and with fewer rows than features the same value from the ``N x N`` matrix
:math:`K + S = Z Z^\top + S`: :math:`-\tfrac12(y^\top (K+S)^{-1} y + \log|K + S| + N\log 2\pi)`.

Two differentiable forms of this one quantity live here. :func:`log_evidence_from_features`
(used by :meth:`~rfgp.RandomFeatureGP.log_marginal_likelihood` and its hyperparameter search)
takes any noise layout (per row, per output column, in groups), targets stored divided by a
scale and the model's jitter, and is differentiated by autograd. :func:`negative_log_evidence`
(used by the default recipe :func:`rfgp.fit_auto`) covers the common case of one scalar noise
and carries its gradient in closed form, which saves the Cholesky backward pass and several
``N x D`` temporaries per evaluation; a per-row noise has no such cheap closed form, so the
general form stays. :func:`fourier_negative_log_evidence` goes one step further for random
Fourier features in weight space: it builds the features from their projections itself and
carries the gradient through the cosine and sine in closed form too.

Under ``create_graph=True`` (a Hessian by autograd) every closed-form backward pass
differentiates a plain-autograd form of its value instead
(:func:`~rfgp.inference._kernel_evidence.differentiable_backward`), so second derivatives are
right. The exact GP's evidences (:func:`kernel_negative_log_evidence`,
:func:`stationary_negative_log_evidence`) live in :mod:`rfgp.inference._kernel_evidence` and
are importable from here too.
"""

from __future__ import annotations

import math
from typing import List, Optional, Tuple

import torch
from linear_operator.utils.errors import NotPSDError
from torch import Tensor

from rfgp.inference._blocks import check_blocks
from rfgp.inference._kernel_evidence import (
    LOG_2PI,
    _covariance_gradient,
    _gaussian_terms,
    dense_gaussian_value,
    differentiable_backward,
    kernel_negative_log_evidence,
    stationary_negative_log_evidence,
)
from rfgp.inference._linalg import robust_cholesky
from rfgp.inference._noise import equal_noise_columns
from rfgp.kernels._fourier import FourierFeatureKernel, cos_sin_features

__all__ = [
    "check_representable",
    "evidence_total",
    "fourier_kernel_negative_log_evidence",
    "fourier_negative_log_evidence",
    "kernel_negative_log_evidence",
    "log_evidence_from_features",
    "negative_log_evidence",
    "stationary_negative_log_evidence",
    "weight_evidence_terms",
]



def weight_evidence_terms(
    gram: Tensor, rhs: Tensor, yy: Tensor, jitter: Optional[float]
) -> Tuple[Tensor, Tensor]:
    """``y^T S^{-1} y - h^T B^{-1} h`` per column and ``log|B|``, with ``B = G + I``."""
    bmat = gram + torch.eye(gram.shape[0], dtype=gram.dtype, device=gram.device)
    chol = robust_cholesky(0.5 * (bmat + bmat.T), jitter, "weight-space matrix B", 1.0)
    proj = torch.linalg.solve_triangular(chol, rhs, upper=False)
    return yy - proj.square().sum(0), 2.0 * chol.diagonal().log().sum()


def evidence_total(
    quad: Tensor, logdet: Tensor, log_noise_sum: Tensor, num_rows: int, target_scale: float
) -> Tensor:
    r"""``-1/2 sum_t (c^2 quad_t + logdet + sum log s + R log 2 pi)`` for targets stored divided
    by ``c = target_scale``."""
    quad = quad * target_scale * target_scale  # in tensor arithmetic: inf, not OverflowError
    return -0.5 * (quad + logdet + log_noise_sum + num_rows * LOG_2PI).sum()


def check_representable(total: Tensor, target_scale: float) -> Tensor:
    """``total`` if it is finite; a clear error instead of a silent ``-inf`` or NaN."""
    if not bool(torch.isfinite(total)):
        raise ValueError(
            f"the log marginal likelihood is not representable in {total.dtype} (the targets' "
            f"scale {target_scale:.3g} against the prior and noise makes it overflow); "
            "standardise the targets or choose a noise on their scale"
        )
    return total


def log_evidence_from_features(
    z: Tensor,
    rows_y: Tensor,
    rows_noise: Tensor,
    jitter: Optional[float],
    target_scale: float = 1.0,
) -> Tensor:
    """Differentiable evidence from real-form features ``z (R, Dr)``, targets and noise
    ``(R, T)``: the weight-space form when ``R >= Dr``, else the ``R x R`` form. The targets are
    the true ones divided by ``target_scale``."""
    num_rows, width = z.shape
    total = z.new_zeros(())
    for cols in equal_noise_columns(rows_noise.detach()):
        s = rows_noise[:, cols[0]]
        yg = rows_y[:, cols]
        if num_rows >= width:
            zw = z * s.rsqrt().unsqueeze(-1)
            yw = yg * s.rsqrt().unsqueeze(-1)
            quad, logdet = weight_evidence_terms(zw.T @ zw, zw.T @ yw, yw.square().sum(0), jitter)
            logdet = logdet + s.log().sum()
        else:
            kmat = z @ z.T + torch.diag(s)
            prior = float(z.detach().square().sum(-1).mean()) or None
            chol = robust_cholesky(
                0.5 * (kmat + kmat.T), jitter, "function-space matrix K + S", prior
            )
            quad = torch.linalg.solve_triangular(chol, yg, upper=False).square().sum(0)
            logdet = 2.0 * chol.diagonal().log().sum()
        total = total + evidence_total(quad, logdet, 0.0, num_rows, target_scale)
    return total


def _weight_space_terms(z: Tensor, y: Tensor, s: Tensor) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(-log p(y), chol of B, alpha, resid)`` of ``y ~ N(0, Z Z^T + s I)`` in weight space."""
    n, width = z.shape
    bmat = torch.addmm(torch.eye(width, dtype=z.dtype, device=z.device), z.T, z, alpha=1 / s)
    chol = robust_cholesky(bmat, None, "weight-space matrix B")
    h = (z.T @ y) / s
    alpha = torch.cholesky_solve(h, chol)
    resid = y - z @ alpha
    quad = (y * resid).sum(0) / s  # y^T (Z Z^T + s I)^{-1} y, per output
    logdet = 2.0 * chol.diagonal().log().sum() + n * torch.log(s)
    return 0.5 * (quad + logdet + n * LOG_2PI).sum(), chol, alpha, resid


def _weight_space_gradients(
    z: Tensor, chol: Tensor, alpha: Tensor, resid: Tensor, s: Tensor
) -> Tuple[Tensor, Tensor, Tensor]:
    """``(d/dZ, d/ds, B^{-1})`` of :func:`_weight_space_terms`' value."""
    n, width = z.shape
    outputs = resid.shape[1]
    binv = torch.cholesky_inverse(chol)
    # (T Z B^-1 - r alpha^T) / s: the rank-T term and the scaling in the one pass of addmm_.
    grad_z = torch.mm(z, binv).addmm_(resid, alpha.T, beta=outputs / s, alpha=-1 / s)
    grad_s = 0.5 * (
        -resid.square().sum() / s**2 + outputs * (n - width + binv.diagonal().sum()) / s
    )
    return grad_z, grad_s, binv


class _WeightSpaceEvidence(torch.autograd.Function):
    """``-log p(y)`` of ``y ~ N(0, Z Z^T + s I)`` with its gradient in closed form."""

    @staticmethod
    def forward(ctx, z: Tensor, y: Tensor, noise: Tensor) -> Tensor:
        value, chol, alpha, resid = _weight_space_terms(z, y, noise)
        ctx.save_for_backward(z, chol, alpha, resid, noise, y)
        return value

    @staticmethod
    def backward(ctx, grad: Tensor):
        z, chol, alpha, resid, s, y = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: a gradient that has derivatives
            return differentiable_backward(ctx.needs_input_grad, grad,
                                           _weight_space_value, [z, y, s])
        grad_z, grad_s, _ = _weight_space_gradients(z, chol, alpha, resid, s)
        # d/dy = (Z Z^T + s I)^{-1} y = r / s (the residual of the weight-space solve).
        grad_y = grad * resid / s if ctx.needs_input_grad[1] else None
        return grad_z * grad, grad_y, grad * grad_s


def _weight_space_value(z: Tensor, y: Tensor, s: Tensor) -> Tensor:
    """:func:`_weight_space_terms`' value by plain autograd operations (``addmm`` takes its
    scaling ``1 / s`` as a number, so it cannot carry a gradient in ``s``)."""
    n, width = z.shape
    bmat = torch.eye(width, dtype=z.dtype, device=z.device) + z.T @ z / s
    chol = torch.linalg.cholesky(bmat)
    alpha = torch.cholesky_solve(z.T @ y / s, chol)
    quad = (y * (y - z @ alpha)).sum(0) / s
    logdet = 2.0 * chol.diagonal().log().sum() + n * torch.log(s)
    return 0.5 * (quad + logdet + n * LOG_2PI).sum()


def _fourier_value(proj: Tensor, y: Tensor, outputscale: Tensor, noise: Tensor) -> Tensor:
    """:class:`_FourierEvidence`'s value by plain autograd operations."""
    z = torch.cat([proj.cos(), proj.sin()], -1) * (outputscale / proj.shape[1]).sqrt()
    return _weight_space_value(z, y, noise)


class _FourierEvidence(torch.autograd.Function):
    """``-log p(y)`` of ``y ~ N(0, Z Z^T + s I)``, ``Z = sqrt(a / M) [cos P, sin P]``, with the
    gradient in closed form in the projections ``P``, the outputscale ``a`` and ``s``."""

    @staticmethod
    def forward(ctx, proj: Tensor, y: Tensor, outputscale: Tensor, noise: Tensor) -> Tensor:
        # Autograd is off inside forward: cos_sin_features writes one buffer, nothing kept.
        z = cos_sin_features(proj, (outputscale / proj.shape[1]).sqrt())
        value, chol, alpha, resid = _weight_space_terms(z, y, noise)
        ctx.save_for_backward(z, chol, alpha, resid, noise, outputscale, proj, y)
        return value

    @staticmethod
    def backward(ctx, grad: Tensor):
        z, chol, alpha, resid, s, a, proj, y = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: a gradient that has derivatives
            return differentiable_backward(ctx.needs_input_grad, grad, _fourier_value,
                                           [proj, y, a, s])
        m = z.shape[1] // 2
        grad_z, grad_s, binv = _weight_space_gradients(z, chol, alpha, resid, s)
        # d cos P = -sin P dP and d sin P = cos P dP, with Z's halves holding the scaled cos
        # and sin: dL/dP = Z_cos * G_sin - Z_sin * G_cos.
        grad_proj = z[:, :m] * grad_z[:, m:]
        grad_proj.addcmul_(z[:, m:], grad_z[:, :m], value=-1.0)
        # sum(G * Z) / (2a) without a pass over Z: Z^T r / s = alpha and Z^T Z / s = B - I give
        # tr(Z^T G) = T (D - tr B^-1) - ||alpha||^2.
        outputs = resid.shape[1]
        grad_a = 0.5 * (outputs * (2 * m - binv.diagonal().sum()) - alpha.square().sum()) / a
        grad_y = grad * resid / s if ctx.needs_input_grad[1] else None  # (Z Z^T + s I)^-1 y
        return grad * grad_proj, grad_y, grad * grad_a, grad * grad_s


class _FunctionSpaceEvidence(torch.autograd.Function):
    """The same ``-log p(y)`` through the ``N x N`` matrix ``K = Z Z^T + s I`` (for ``N < D``)."""

    @staticmethod
    def forward(ctx, z: Tensor, y: Tensor, noise: Tensor) -> Tensor:
        n = z.shape[0]
        kmat = torch.addmm(torch.diag_embed(noise.expand(n)), z, z.T)
        chol = robust_cholesky(kmat, None, "kernel matrix K")
        value, alpha = _gaussian_terms(chol, y)
        ctx.save_for_backward(z, chol, alpha, y, noise)
        return value

    @staticmethod
    def backward(ctx, grad: Tensor):
        z, chol, alpha, y, noise = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: a gradient that has derivatives
            return differentiable_backward(
                ctx.needs_input_grad, grad,
                lambda z_, y_, s_: dense_gaussian_value(torch.addmm(
                    torch.diag_embed(s_.expand(z_.shape[0])), z_, z_.T), y_), [z, y, noise])
        gram_grad = _covariance_gradient(chol, alpha)
        grad_s = 0.5 * gram_grad.diagonal().sum()
        grad_y = grad * alpha if ctx.needs_input_grad[1] else None  # K^{-1} y
        return gram_grad @ z * grad, grad_y, grad * grad_s


def _check_evidence_arguments(caller: str, features: Tensor, y: Tensor, **scalars: Tensor) -> None:
    """Per-evaluation checks of the closed-form evidences, cheap against their ``N D^2`` work:
    finite targets of the features' dtype, and positive finite scalars. A non-positive or
    non-finite scalar raises ``NotPSDError`` (the covariance is then not a positive definite
    one), so that an optimiser's line search backs off from such a trial point as from any
    other it cannot factorise."""
    if y.dtype != features.dtype:
        raise TypeError(f"{caller}: y must have the dtype of the features ({features.dtype}), "
                        f"got {y.dtype}")
    if not bool(torch.isfinite(y).all()):
        raise ValueError(f"{caller}: y holds NaN or infinite values")
    for name, value in scalars.items():
        if value.dim() != 0:
            raise ValueError(f"{name} must be a 0-d tensor, got shape {tuple(value.shape)}")
        if not bool(value > 0) or not bool(torch.isfinite(value)):
            raise NotPSDError(f"{caller}: {name} must be positive and finite, got {float(value)}")


def negative_log_evidence(z: Tensor, y: Tensor, noise: Tensor) -> Tensor:
    r"""``-log p(y)`` for :math:`y_t \sim N(0, Z Z^\top + \sigma^2 I)` (independent columns),
    computed in weight space, with the gradient in closed form.

    With :math:`B = I + Z^\top Z / \sigma^2`, :math:`\alpha = B^{-1} Z^\top y / \sigma^2` and
    :math:`r = y - Z \alpha = \sigma^2 (Z Z^\top + \sigma^2 I)^{-1} y`,

    .. math::
        -\log p(y) = \tfrac12 \textstyle\sum_t \big(y_t^\top r_t / \sigma^2 + \log|B|
            + N \log \sigma^2 + N \log 2\pi\big),\quad
        \frac{\partial}{\partial Z} = \frac{T Z B^{-1} - r \alpha^\top}{\sigma^2},\quad
        \frac{\partial}{\partial \sigma^2} = \tfrac12 \Big(-\frac{\|r\|^2}{\sigma^4}
            + T\,\frac{N - D + \mathrm{tr} B^{-1}}{\sigma^2}\Big).

    One evaluation with its gradient costs two :math:`N D^2` products (:math:`Z^\top Z` and
    :math:`Z B^{-1}`), a Cholesky factor and its inverse: the floor of the weight-space
    evidence, where automatic differentiation of the same formula adds a Cholesky backward pass
    and several ``N x D`` temporaries. With fewer rows than features (``N < D``) the same value
    is computed through :math:`K = Z Z^\top + \sigma^2 I` at :math:`O(N^2 D + N^3)`:
    :math:`\partial/\partial Z = (T K^{-1} - a a^\top) Z`,
    :math:`\partial/\partial \sigma^2 = \tfrac12 (T\,\mathrm{tr} K^{-1} - \|a\|^2)`,
    :math:`a = K^{-1} y`.

    Args:
        z: ``(N, D)`` real features (times the square root of the outputscale).
        y: ``(N, T)`` targets.
        noise: 0-d positive tensor :math:`\sigma^2`.

    Returns:
        A 0-d tensor, differentiable in ``z`` and ``noise``.

    Raises:
        ValueError: for shapes other than ``(N, D)``, ``(N, T)`` (``N >= 1``) and 0-d, or NaN
            or infinite targets.
        TypeError: for targets of another dtype than ``z``.
        NotPSDError: for a non-positive or non-finite ``noise``, or features that make the
            covariance unfactorisable (NaN or infinite).

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> z = torch.randn(50, 4, dtype=torch.float64, generator=g)
        >>> y = torch.randn(50, 1, dtype=torch.float64, generator=g)
        >>> cov = z @ z.T + 0.5 * torch.eye(50, dtype=torch.float64)
        >>> exact = -torch.distributions.MultivariateNormal(torch.zeros(50, dtype=torch.float64),
        ...                                                 cov).log_prob(y[:, 0])
        >>> bool(torch.isclose(negative_log_evidence(z, y, torch.tensor(0.5, dtype=torch.float64)),
        ...                    exact))
        True
    """
    # Shape checks only: this runs at every evaluation of an optimiser's loss.
    if z.dim() != 2 or y.dim() != 2 or y.shape[0] != z.shape[0] or z.shape[0] == 0:
        raise ValueError(
            "negative_log_evidence: z must have shape (N, D) and y shape (N, T) with N >= 1, "
            f"got z {tuple(z.shape)} and y {tuple(y.shape)}"
        )
    _check_evidence_arguments("negative_log_evidence", z, y, noise=noise)
    if z.shape[0] < z.shape[1]:
        return _FunctionSpaceEvidence.apply(z, y, noise)
    return _WeightSpaceEvidence.apply(z, y, noise)


def fourier_negative_log_evidence(
    proj: Tensor, y: Tensor, outputscale: Tensor, noise: Tensor
) -> Tensor:
    r""":func:`negative_log_evidence` of the random Fourier features of projections ``P``,
    :math:`Z = \sqrt{a / M}\,[\cos P, \sin P]`, built inside and differentiated in closed form.

    With :math:`G = \partial/\partial Z` of :func:`negative_log_evidence` (weight space,
    :math:`N \ge 2M`),

    .. math::
        \frac{\partial}{\partial P} = Z_{\cos} \circ G_{\sin} - Z_{\sin} \circ G_{\cos},\quad
        \frac{\partial}{\partial a} = \frac{T (2M - \mathrm{tr} B^{-1}) - \|\alpha\|^2}{2a}.

    The second form needs no pass over the ``N x 2M`` features (:math:`Z^\top r / \sigma^2 =
    \alpha`). Against building the features with autograd and scaling them by
    :math:`\sqrt a`, this saves the backward passes of the cosine, the sine, their
    concatenation and both scalings: the evaluation that :func:`rfgp.fit_auto`'s search
    repeats, at the cost floor of its two :math:`N (2M)^2` products plus one pass for the
    features and two for their gradient.

    Args:
        proj: ``(N, M)`` projections :math:`\omega_j^\top x_i / \ell` (a
            :class:`~rfgp.kernels.FourierFeatureKernel`'s ``projections`` of the scaled
            inputs), with ``N >= 2M``.
        y: ``(N, T)`` targets.
        outputscale: 0-d positive tensor :math:`a`.
        noise: 0-d positive tensor :math:`\sigma^2`.

    Returns:
        A 0-d tensor, differentiable in ``proj``, ``outputscale`` and ``noise``.

    Raises:
        ValueError: for shapes other than ``(N, M)`` with ``N >= 2M``, ``(N, T)`` and 0-d, or
            NaN or infinite targets.
        TypeError: for targets of another dtype than ``proj``.
        NotPSDError: for a non-positive or non-finite ``outputscale`` or ``noise``, or
            projections that make the weight-space matrix unfactorisable (NaN or infinite).

    Example:
        >>> from rfgp.kernels import FourierFeatureKernel, cos_sin_features
        >>> g = torch.Generator().manual_seed(0)
        >>> proj = torch.randn(40, 5, dtype=torch.float64, generator=g)
        >>> y = torch.randn(40, 1, dtype=torch.float64, generator=g)
        >>> a, s = torch.tensor(2.0, dtype=torch.float64), torch.tensor(0.3, dtype=torch.float64)
        >>> z = cos_sin_features(proj, (a / 5).sqrt().item())
        >>> bool(torch.isclose(fourier_negative_log_evidence(proj, y, a, s),
        ...                    negative_log_evidence(z, y, s)))
        True
    """
    n = proj.shape[0] if proj.dim() == 2 else 0
    if proj.dim() != 2 or y.dim() != 2 or y.shape[0] != n or n < 2 * proj.shape[1]:
        raise ValueError(
            "fourier_negative_log_evidence: proj must have shape (N, M) with N >= 2M and y "
            f"shape (N, T), got proj {tuple(proj.shape)} and y {tuple(y.shape)}"
        )
    _check_evidence_arguments("fourier_negative_log_evidence", proj, y,
                              outputscale=outputscale, noise=noise)
    return _FourierEvidence.apply(proj, y, outputscale, noise)


def fourier_kernel_negative_log_evidence(
    kernel: FourierFeatureKernel,
    x: Tensor,
    y: Tensor,
    lengthscale: Tensor,
    outputscale: Tensor,
    noise: Tensor,
    exact: bool = False,
    blocks: Optional[List[Tensor]] = None,
) -> Tensor:
    r"""``-log p(y)`` for :math:`y_t \sim N(0, s\,K + \sigma^2 I)`, ``K`` the kernel of a
    :class:`~rfgp.kernels.FourierFeatureKernel` at the lengthscales ``lengthscale``: its exact
    kernel (``exact=True``, :func:`stationary_negative_log_evidence`) or its random features
    :math:`\Phi = M^{-1/2} [\cos P, \sin P]`, :math:`P = \omega^\top x / \ell` with the kernel's
    own frequencies (:func:`fourier_negative_log_evidence` in weight space, ``N >= D``;
    :func:`negative_log_evidence` of :math:`\sqrt s\,\Phi` in function space). The gradient is
    in closed form in every case, and the hyperparameters are explicit tensors, so a caller
    can differentiate in whatever parametrisation it needs. Both depend on ``x`` only through
    differences, so ``x`` is centred first (exact in exact arithmetic; in floating point it
    keeps the digits that a large common offset would take).

    Args:
        kernel: the kernel: its spectral density and, without ``exact``, its frequencies. A
            subclass that redefines the features is rejected: its evidence is not that of
            these projections.
        x: ``(N, d)`` inputs as the kernel sees them (:meth:`prepare_input`'s result: its
            ``active_dims`` applied, weights drawn).
        y: ``(N, T)`` targets.
        lengthscale: ``(d,)`` positive lengthscales.
        outputscale: 0-d :math:`s > 0`.
        noise: 0-d :math:`\sigma^2 > 0`.
        exact: the exact kernel's evidence instead of the features'.
        blocks: with ``exact``, row-index tensors that partition the rows
            (:func:`~rfgp.inference._blocks.kd_blocks`): the sum of the blocks' exact
            evidences, that of ``K`` with its cross-block entries set to zero,
            :math:`O(\sum_b n_b^3)` instead of :math:`O(N^3)`.

    Returns:
        A 0-d tensor, differentiable in ``lengthscale``, ``outputscale`` and ``noise``.

    Raises:
        TypeError: for a subclass with features of its own (without ``exact``), and as the
            evidences it calls.
        ValueError, NotPSDError: as the evidences it calls.

    Example:
        >>> from rfgp.kernels import FourierFeatureKernel
        >>> g = torch.Generator().manual_seed(0)
        >>> k = FourierFeatureKernel(16, input_dim=2, seed=0)
        >>> x = k.prepare_input(torch.randn(30, 2, dtype=torch.float64, generator=g))
        >>> y = torch.randn(30, 1, dtype=torch.float64, generator=g)
        >>> ell = k.lengthscale.detach().reshape(-1).double()   # the kernel's own lengthscale
        >>> one = torch.ones((), dtype=torch.float64)
        >>> z = k.features(x)
        >>> bool(torch.isclose(fourier_kernel_negative_log_evidence(k, x, y, ell, one, 0.1 * one),
        ...                    negative_log_evidence(z, y, 0.1 * one)))
        True
    """
    if x.shape[0]:
        # Both evidences depend on x only through differences (a stationary kernel; cos/sin
        # pairs, cos(a - b) = cos a cos b + sin a sin b): centred, an offset such as a
        # timestamp's no longer costs the digits of the projections omega^T x / l, of their
        # derivatives in l (x / l times the frequency) and of the expanded squared distances.
        x = x - x.detach().mean(0)
    if blocks is not None:
        if not exact:
            raise ValueError("fourier_kernel_negative_log_evidence(blocks=...) needs exact=True")
        blocks = check_blocks(blocks, x.shape[0], x.device)
        return sum(stationary_negative_log_evidence(x[rows], y[rows], lengthscale, outputscale,
                                                    noise, kernel.nu) for rows in blocks)
    if exact:
        return stationary_negative_log_evidence(x, y, lengthscale, outputscale, noise, kernel.nu)
    if type(kernel)._features is not FourierFeatureKernel._features:
        raise TypeError(
            f"fourier_kernel_negative_log_evidence: {type(kernel).__name__} redefines the "
            "features, so its evidence is not that of the Fourier projections; use "
            "negative_log_evidence of its features"
        )
    proj = kernel.projections(x / lengthscale.to(x.dtype))
    if x.shape[0] >= kernel.num_features:
        # The features built inside, their closed-form gradient skipping their autograd
        # graph (21% of an evaluation at N = 8611, D = 512; 33% at N = 20000).
        return fourier_negative_log_evidence(proj, y, outputscale, noise)
    z = cos_sin_features(proj, 1.0 / math.sqrt(kernel.num_frequencies)) * outputscale.sqrt()
    return negative_log_evidence(z, y, noise)
