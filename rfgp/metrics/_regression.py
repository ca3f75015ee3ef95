r"""Scores of kernel approximations (:func:`relative_frobenius_error`, :func:`gaussian_kl`)
and of regression predictions (:func:`mnll`, :func:`nmse`, :func:`rmse`).

Internal: not part of the public API (see :mod:`rfgp.metrics`).
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor

from rfgp._validation import check_real, describe
from rfgp.metrics._checks import as_tensor, joint_scale, same_shape

__all__ = ["gaussian_kl", "mnll", "nmse", "relative_frobenius_error", "rmse"]


def relative_frobenius_error(approx: Tensor, exact: Tensor, real_part: bool = True) -> Tensor:
    r"""Relative Frobenius error of a Gram matrix approximation.

    .. math::
        \frac{\|\hat K - K\|_F}{\|K\|_F}

    Args:
        approx: ``(..., n, m)`` approximate Gram matrix (real, or complex :math:`\hat K`).
        exact: ``(..., n, m)`` exact Gram matrix.
        real_part: for complex ``approx`` use :math:`\mathrm{Re}\,\hat K` (the paper's metric);
            ``False`` includes the imaginary part in the error.

    Returns:
        0-d tensor (the norms are taken over all entries, batch included).

    Example:
        >>> k = torch.eye(3, dtype=torch.float64)
        >>> round(float(relative_frobenius_error(1.1 * k, k)), 6)
        0.1

    References:
        Wacker, Kanagawa, Filippone, *Improved Random Features for Dot Product Kernels*, Eq. 58.
    """
    approx = as_tensor(approx, "approx", allow_complex=True)
    exact = as_tensor(exact, "exact", allow_complex=True)
    same_shape(approx, exact, "approx", "exact")
    if approx.is_complex() and real_part:
        approx = approx.real
    # The ratio is scale-free: both norms of the values over one power of two.
    scale = joint_scale(approx, exact)
    approx, exact = approx / scale, exact / scale
    norm = torch.linalg.vector_norm(exact)
    if norm == 0:
        raise ValueError("exact must not be all zeros (its Frobenius norm is the denominator)")
    return torch.linalg.vector_norm(approx - exact) / norm


def gaussian_kl(
    mean_approx: Tensor,
    var_approx: Tensor,
    mean_exact: Tensor,
    var_exact: Tensor,
    min_variance: float = 1e-12,
) -> Tensor:
    r"""KL divergence between factorised Gaussians, summed over points, averaged over outputs.

    .. math::
        \mathrm{KL}\big[N(\mu_a, \mathrm{diag}\,s_a^2) \,\|\, N(\mu_e, \mathrm{diag}\,s_e^2)\big]
        = \frac12 \sum_{i=1}^{m} \Big( \frac{s_{a,i}^2}{s_{e,i}^2}
          + \log\frac{s_{e,i}^2}{s_{a,i}^2} - 1 + \frac{(\mu_{e,i} - \mu_{a,i})^2}{s_{e,i}^2}
          \Big)

    This is the corrected Eq. 93 of Wacker et al. (the printed equation swaps
    :math:`s_a` and :math:`s_e` in the ratio and the mean term, and can be negative). For
    several outputs (a trailing dimension ``T``), the sum over points is averaged over outputs.

    Args:
        mean_approx, var_approx: ``(m,)`` or ``(m, T)`` approximate posterior mean and variance.
        mean_exact, var_exact: exact posterior mean and variance, same shape.
        min_variance: variances below it (round-off) are raised to it; negative variances below
            ``-1e-8`` relative to the largest raise an error.

    Returns:
        0-d tensor :math:`\ge 0`.

    Example:
        >>> m = torch.zeros(3, dtype=torch.float64); v = torch.ones(3, dtype=torch.float64)
        >>> float(gaussian_kl(m, v, m, v))
        0.0

    References:
        Wacker, Kanagawa, Filippone, *Improved Random Features for Dot Product Kernels*,
        Appendix D.5 (Eq. 93).
    """
    tensors = {
        "mean_approx": mean_approx,
        "var_approx": var_approx,
        "mean_exact": mean_exact,
        "var_exact": var_exact,
    }
    tensors = {name: as_tensor(value, name) for name, value in tensors.items()}
    mean_approx, var_approx = tensors["mean_approx"], tensors["var_approx"]
    mean_exact, var_exact = tensors["mean_exact"], tensors["var_exact"]
    for name, value in tensors.items():
        same_shape(mean_approx, value, "mean_approx", name)
    min_variance = check_real("min_variance", min_variance, low=0.0, low_inclusive=False)
    if mean_approx.dim() not in (1, 2):
        raise ValueError(
            f"mean_approx must have shape (m,) or (m, T), got {tuple(mean_approx.shape)}"
        )
    for name in ("var_approx", "var_exact"):
        v = tensors[name]
        tol = 1e-8 * float(v.detach().abs().max()) if v.numel() else 0.0
        if (v < -tol).any():
            raise ValueError(f"{name} must be non-negative, got minimum {v.min().item():.3g}")
    var_a = var_approx.clamp_min(min_variance)
    var_e = var_exact.clamp_min(min_variance)
    ratio = var_a / var_e
    # The mean term as a standardised difference, so that (mu_e - mu_a)^2 is never formed.
    scale = joint_scale(mean_exact, mean_approx)
    gap = (mean_exact / scale - mean_approx / scale) / (var_e.sqrt() / scale)
    terms = ratio - torch.log(ratio) - 1 + gap.square()
    total = 0.5 * terms.sum(0)
    return total.mean() if total.dim() else total


def mnll(y: Tensor, mean: Tensor, var: Tensor) -> Tensor:
    r"""Mean negative log likelihood of ``y`` under independent Gaussians.

    .. math::
        \frac1n \sum_{i=1}^n \Big( \tfrac12 \log(2\pi\sigma_i^2)
        + \frac{(y_i - \mu_i)^2}{2\sigma_i^2} \Big)

    averaged over all entries (points and outputs). ``var`` is the *predictive* variance of
    ``y`` (latent variance plus noise).

    Args:
        y, mean, var: same shape; ``var > 0``.

    Returns:
        0-d tensor.

    Example:
        >>> z = torch.zeros(2, dtype=torch.float64)
        >>> round(float(mnll(z, z, torch.ones(2, dtype=torch.float64))), 6)
        0.918939
    """
    y, mean, var = as_tensor(y, "y"), as_tensor(mean, "mean"), as_tensor(var, "var")
    same_shape(y, mean, "y", "mean")
    same_shape(y, var, "y", "var")
    if (var <= 0).any():
        raise ValueError(f"var must be positive, got minimum {var.min().item():.3g}")
    # The standardised residual (y - mu) / sigma from the residual over a power of two and
    # sigma over the same: neither (y - mu)^2 nor sigma^2 is formed, so no scale overflows.
    scale = joint_scale(y, mean)
    residual = (y / scale - mean / scale) / (var.sqrt() / scale)
    return (0.5 * (math.log(2 * math.pi) + torch.log(var)) + 0.5 * residual.square()).mean()


def nmse(y: Tensor, mean: Tensor, reference_variance: Optional[Tensor] = None) -> Tensor:
    r"""Normalised mean squared error.

    .. math::
        \frac{\frac1n \sum_i (y_i - \mu_i)^2}{\mathrm{Var}(y)}

    with :math:`\mathrm{Var}(y)` the (population) variance of ``y`` over points, per output,
    unless ``reference_variance`` is given (e.g. the training-target variance); averaged over
    outputs. Predicting the mean of ``y`` scores 1.

    Args:
        y, mean: ``(n,)`` or ``(n, T)``.
        reference_variance: scalar or ``(T,)`` normaliser.

    Returns:
        0-d tensor.

    Example:
        >>> y = torch.tensor([0.0, 2.0]); float(nmse(y, torch.ones(2)))
        1.0
    """
    y, mean = as_tensor(y, "y"), as_tensor(mean, "mean")
    same_shape(y, mean, "y", "mean")
    if y.dim() not in (1, 2):
        raise ValueError(f"y must have shape (n,) or (n, T), got {describe(y)}")
    # Numerator and denominator over the square of one power of two: a ratio free of overflow
    # and underflow at any scale of y.
    scale = joint_scale(y, mean)
    mse = (y / scale - mean / scale).square().mean(0)
    if reference_variance is None:
        ref = (y / scale).var(0, unbiased=False)
        # Constant by equality: three 0.1 have a rounded variance of 2e-34, not 0.
        if (ref <= 0).any() or bool((y == y[:1]).all(0).any()):
            raise ValueError("the variance of y must be positive (y is constant over points)")
    else:
        if isinstance(reference_variance, (int, float)) and not isinstance(
            reference_variance, bool
        ):
            reference_variance = torch.tensor(float(reference_variance), dtype=y.dtype)
        ref = as_tensor(reference_variance, "reference_variance")
        allowed = ((), tuple(y.shape[1:]))
        if tuple(ref.shape) not in allowed:
            raise ValueError(
                f"reference_variance must be a scalar or have shape {tuple(y.shape[1:])} (one "
                f"value per output), got {describe(ref)}"
            )
        if (ref <= 0).any():
            raise ValueError(
                f"reference_variance must be positive, got minimum {ref.min().item():.3g}"
            )
        ref = ref / scale / scale
    # A perfect prediction scores 0 even where a tiny reference variance underflowed above.
    return torch.where(mse == 0, torch.zeros_like(mse), mse / ref).mean()


def rmse(y: Tensor, mean: Tensor) -> Tensor:
    r"""Root mean squared error :math:`\sqrt{\frac1n \sum_i (y_i - \mu_i)^2}` over all entries.

    Args:
        y: targets, any shape.
        mean: predictions, the shape of ``y``.

    Returns:
        A scalar tensor.

    Example:
        >>> float(rmse(torch.tensor([0.0, 2.0]), torch.tensor([1.0, 1.0])))
        1.0
    """
    y, mean = as_tensor(y, "y"), as_tensor(mean, "mean")
    same_shape(y, mean, "y", "mean")
    scale = joint_scale(y, mean)
    return (y / scale - mean / scale).square().mean().sqrt() * scale
