r"""A Laplace approximation over the log-hyperparameters, and lengthscale draws from it.

The evidence maximum :math:`\hat\theta` of :math:`\theta = (\log \ell_1, \dots, \log \ell_d,
\log s, \log \sigma^2)` (lengthscales, outputscale, noise) is one point of a posterior that, on
a few hundred or thousand rows, is far from a point mass. Its Laplace approximation is
:math:`N(\hat\theta, H^{-1})`, with :math:`H` the Hessian of :math:`-\log p(y \mid \theta)` at
:math:`\hat\theta`. :func:`evidence_hessian` computes :math:`H / (N T)` by forward differences
of the closed-form gradient of the exact kernel's evidence or of the random Fourier features'
evidence; :func:`lengthscale_draws` draws lengthscale vectors from the approximation's marginal
over :math:`\log \ell`.

A GP whose kernel is the average of the kernels at such draws,

.. math::
    \bar k(x, x') = \frac{s}{S} \sum_{i=1}^{S} k_{\ell^{(i)}}(x, x'), \qquad
    \log \ell^{(i)} \sim N\big(\log \hat\ell, \Sigma_{\ell\ell}\big),

weighs the lengthscales the data leave uncertain instead of betting on one. With random Fourier
features the average costs nothing extra: ``D / S`` features per draw give ``D`` features in
all (:func:`rfgp.recipes._laplace.lengthscale_mixture_kernel`). With the exact kernel at the
unbounded evidence maximum (``benchmarks/regression_hyperparameters.py``, five splits, two on wine,
32 draws) the average lowered the test MNLL on all five small bundled sets: concrete by 0.012,
boston by 0.024, energy and yacht by 0.008, wine by 0.002.

Flat directions. Where the evidence hardly changes with a hyperparameter (an input the
maximum switched off, lengthscale hundreds of its input's spread), :math:`H` has eigenvalues
near zero, and its inverse would send draws anywhere. The eigenvalues are floored: the
covariance is :math:`V \operatorname{diag}(1 / (\max(\lambda_k, 0) + \tau)) V^\top` with the
precision floor :math:`\tau` (default 1, in nats): at most a factor :math:`e` per standard
deviation along any direction, the curvature a standard normal prior on each
log-hyperparameter's deviation from the maximum would add.
"""

from __future__ import annotations

import math
from typing import List, Optional

import torch
from torch import Tensor

from rfgp._validation import check_int, check_positive, check_rows, check_tensor
from rfgp.inference._evidence import fourier_kernel_negative_log_evidence
from rfgp.kernels._fourier import FourierFeatureKernel

__all__ = ["evidence_hessian", "lengthscale_draws"]

#: Forward-difference step in the log-hyperparameters: the truncation error (relative, about
#: the step) and the rounding error (about 1e-16 / step) both stay far below what matters.
DIFFERENCE_STEP = 1e-4


def _gradient(theta: Tensor, x: Tensor, y: Tensor, exact: bool,
              kernel: FourierFeatureKernel, blocks: Optional[List[Tensor]] = None) -> Tensor:
    d = x.shape[1]
    t = theta.detach().clone().requires_grad_(True)
    value = fourier_kernel_negative_log_evidence(kernel, x, y, t[:d].exp(), t[d].exp(),
                                                 t[d + 1].exp(), exact, blocks)
    (grad,) = torch.autograd.grad(value, t)
    return grad / y.numel()


def evidence_hessian(
    kernel: FourierFeatureKernel,
    x: Tensor,
    y: Tensor,
    lengthscale: Tensor,
    outputscale: Tensor,
    noise: Tensor,
    exact: bool = True,
    step: float = DIFFERENCE_STEP,
    blocks: Optional[List[Tensor]] = None,
) -> Tensor:
    r"""The Hessian of :math:`-\log p(y \mid \theta) / (N T)` in
    :math:`\theta = (\log \ell, \log s, \log \sigma^2)`, by forward differences of the
    closed-form gradient of
    :func:`~rfgp.inference._evidence.fourier_kernel_negative_log_evidence`
    (:math:`d + 3` gradient evaluations).

    .. math::
        H_{:k} = \frac{g(\theta + h e_k) - g(\theta)}{h},
        \qquad H \leftarrow (H + H^\top) / 2,

    accurate to :math:`O(h)` relative (about ``1e-4``): ample for a covariance of draws, at
    half the evaluations of central differences. The gradients are computed in float64
    whatever the inputs' dtype: in float32 their rounding error (a Cholesky factor of a
    kernel matrix loses digits to its condition number) divided by ``h`` swamps the
    differences, and the Hessian would be wrong, not merely less accurate.

    Args:
        kernel: the :class:`~rfgp.kernels.FourierFeatureKernel` whose evidence is meant: its
            spectral density (RBF or Matérn) and, with ``exact=False``, its frequencies.
        x: ``(N, d)`` inputs (the kernel's ``active_dims`` are applied).
        y: ``(N,)`` or ``(N, T)`` targets.
        lengthscale: ``(d,)`` positive lengthscales.
        outputscale: 0-d positive outputscale :math:`s`.
        noise: 0-d positive noise variance :math:`\sigma^2`.
        exact: the exact kernel's evidence (:math:`O(N^3)`), or the random features' (weight
            space, :math:`O(N D^2)`).
        step: the forward-difference step :math:`h` in the log-hyperparameters.
        blocks: with ``exact``, a partition of the rows: the Hessian of the blocks' summed
            exact evidence (see
            :func:`~rfgp.inference._evidence.fourier_kernel_negative_log_evidence`).

    Returns:
        ``(d + 2, d + 2)`` symmetric Hessian per datum, in ``x``'s dtype (computed in
        float64).

    Raises:
        ValueError: for inputs that are not finite float rows ``x (N, d)``, ``y (N,)`` or
            ``(N, T)`` of one dtype, a lengthscale
            that is not ``(d,)`` positive and finite, or a non-positive outputscale or noise.
        TypeError: for a kernel that is not a ``FourierFeatureKernel``, or (without
            ``exact``) a subclass that redefines its features
            (:func:`~rfgp.inference._evidence.fourier_kernel_negative_log_evidence`).

    Example:
        >>> from rfgp.kernels import FourierFeatureKernel
        >>> g = torch.Generator().manual_seed(0)
        >>> x = torch.randn(60, 2, dtype=torch.float64, generator=g)
        >>> y = torch.sin(2 * x[:, 0]) + 0.1 * torch.randn(60, dtype=torch.float64, generator=g)
        >>> one = torch.ones((), dtype=torch.float64)
        >>> h = evidence_hessian(FourierFeatureKernel(64, input_dim=2), x, y,
        ...                      torch.ones(2, dtype=torch.float64), one, 0.01 * one)
        >>> h.shape, bool(torch.allclose(h, h.T))
        (torch.Size([4, 4]), True)
    """
    if not isinstance(kernel, FourierFeatureKernel):
        raise TypeError(f"kernel must be a FourierFeatureKernel, got {type(kernel).__name__}")
    x, y = check_rows(x, y)
    x = kernel.prepare_input(x)  # active_dims, the weights: as the kernel sees its inputs
    dtype = x.dtype
    # float64 whatever the inputs' dtype (see the docstring); the frequencies, drawn in the
    # kernel's dtype, are cast exactly.
    x, y = x.to(torch.float64), y.to(torch.float64)
    d = x.shape[1]
    lengthscale = check_tensor("lengthscale", lengthscale).detach().to(x).reshape(-1)
    if lengthscale.numel() != d or not bool((lengthscale > 0).all()):
        raise ValueError(f"lengthscale must hold {d} positive values, got {lengthscale}")
    values = []
    for name, value in (("outputscale", outputscale), ("noise", noise)):
        value = check_tensor(name, value).detach().to(x).reshape(-1)
        if value.numel() != 1 or not float(value) > 0:
            raise ValueError(f"{name} must be one positive value, got {value}")
        values.append(value)
    step = check_positive("step", step)
    y = y.unsqueeze(-1) if y.dim() == 1 else y
    theta = torch.cat([lengthscale.log(), values[0].log(), values[1].log()])
    hessian = torch.empty(d + 2, d + 2, dtype=x.dtype, device=x.device)
    centre = _gradient(theta, x, y, exact, kernel, blocks)
    for k in range(d + 2):
        shift = torch.zeros_like(theta)
        shift[k] = step
        hessian[:, k] = (_gradient(theta + shift, x, y, exact, kernel, blocks) - centre) / step
    return (0.5 * (hessian + hessian.T)).to(dtype)


def lengthscale_draws(
    lengthscale: Tensor,
    hessian: Tensor,
    num_draws: int,
    generator: Optional[torch.Generator] = None,
    fixed: Optional[Tensor] = None,
    upper: Optional[Tensor] = None,
    precision_floor: float = 1.0,
) -> Tensor:
    r"""Lengthscale vectors drawn from the Laplace approximation's marginal over
    :math:`\log \ell`.

    With :math:`H` the ``(d + 2, d + 2)`` Hessian in total nats (:func:`evidence_hessian`
    times the number of targets) restricted to the free coordinates, eigenvalues
    :math:`\lambda_k` and eigenvectors :math:`V`, the covariance is
    :math:`\Sigma = V \operatorname{diag}(1 / (\max(\lambda_k, 0) + \tau)) V^\top` (``tau``
    the ``precision_floor``), and

    .. math::
        \ell^{(i)} = \hat\ell \circ \exp(L z_i), \qquad L L^\top = \Sigma_{\ell\ell},
        \quad z_i \sim N(0, I),

    over the free lengthscales; the ``fixed`` ones stay at :math:`\hat\ell`, and every draw
    is clipped at ``upper``. The outputscale and noise coordinates enter :math:`H` (their
    correlation with the lengthscales widens the marginal) but are not drawn.

    Args:
        lengthscale: ``(d,)`` the maximum :math:`\hat\ell`.
        hessian: ``(d + 2, d + 2)`` symmetric Hessian of :math:`-\log p(y)` in
            :math:`(\log \ell, \log s, \log \sigma^2)`, in total nats.
        num_draws: ``S``.
        generator: random draws.
        fixed: ``(d,)`` booleans, the lengthscales held at :math:`\hat\ell` (e.g. those at
            a bound); ``None``: none.
        upper: ``(d,)`` upper bounds on the draws; ``None``: none.
        precision_floor: :math:`\tau > 0`, in nats.

    Returns:
        ``(S, d)`` positive lengthscales in ``lengthscale``'s dtype.

    Example:
        >>> ell = torch.tensor([1.0, 2.0], dtype=torch.float64)
        >>> h = torch.diag(torch.tensor([400.0, 0.0, 100.0, 100.0], dtype=torch.float64))
        >>> draws = lengthscale_draws(ell, h, 4000, torch.Generator().manual_seed(0))
        >>> sd = draws.log().std(0)   # 1 / sqrt(401) and 1 / sqrt(0 + 1)
        >>> bool(abs(sd[0] - 0.0499) < 0.005), bool(abs(sd[1] - 1.0) < 0.05)
        (True, True)
    """
    lengthscale = check_tensor("lengthscale", lengthscale, min_dim=1, max_dim=1,
                               non_empty=True).detach()
    d = lengthscale.numel()
    if not bool((lengthscale > 0).all()):
        raise ValueError(f"lengthscale must be positive, got {lengthscale}")
    hessian = check_tensor("hessian", hessian, min_dim=2, max_dim=2).detach().to(lengthscale)
    if hessian.shape != (d + 2, d + 2):
        raise ValueError(
            f"hessian must have shape ({d + 2}, {d + 2}) for {d} lengthscales, got "
            f"{tuple(hessian.shape)}"
        )
    num_draws = check_int("num_draws", num_draws)
    precision_floor = check_positive("precision_floor", precision_floor)
    if fixed is None:
        fixed = torch.zeros(d, dtype=torch.bool, device=lengthscale.device)
    fixed = check_tensor("fixed", fixed, floating=False, finite=False, min_dim=1, max_dim=1)
    if fixed.dtype != torch.bool:
        raise TypeError(f"fixed must be a boolean tensor, got dtype {fixed.dtype}")
    if fixed.numel() != d:
        raise ValueError(f"fixed must hold {d} booleans, got shape {tuple(fixed.shape)}")
    free = torch.cat([~fixed, fixed.new_ones(2)])
    index = free.nonzero().reshape(-1)
    sub = hessian[index][:, index]
    sub = 0.5 * (sub + sub.T)
    eigenvalues, vectors = torch.linalg.eigh(sub)
    covariance = (vectors / (eigenvalues.clamp_min(0) + precision_floor)) @ vectors.T
    free_lengthscales = int((~fixed).sum())
    marginal = covariance[:free_lengthscales, :free_lengthscales]
    log_draws = lengthscale.log().expand(num_draws, d).clone()
    if free_lengthscales:
        factor = torch.linalg.cholesky(
            0.5 * (marginal + marginal.T)
            + 1e-12 * torch.eye(free_lengthscales, dtype=marginal.dtype, device=marginal.device))
        z = torch.randn(num_draws, free_lengthscales, generator=generator,
                        dtype=lengthscale.dtype).to(lengthscale.device)
        log_draws[:, ~fixed] += z @ factor.T
    draws = log_draws.exp()
    if upper is not None:
        upper = check_tensor("upper", upper).detach().to(lengthscale).reshape(-1)
        if upper.numel() != d or not bool((upper > 0).all()) or not math.isfinite(
                float(upper.max())):
            raise ValueError(f"upper must hold {d} positive finite bounds, got {upper}")
        draws = torch.minimum(draws, upper)
    return draws
