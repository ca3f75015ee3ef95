r"""Error metrics for kernel approximations and GP predictions.

* :func:`relative_frobenius_error`: :math:`\|\hat K - K\|_F / \|K\|_F`.
* :func:`gaussian_kl`: KL divergence between factorised Gaussian posteriors (the corrected
  Eq. 93 of Wacker et al.).
* :func:`mnll`, :func:`nmse`, :func:`rmse`: predictive scores.

All functions take tensors and return 0-d tensors (differentiable where the inputs are).
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor

__all__ = ["relative_frobenius_error", "gaussian_kl", "mnll", "nmse", "rmse"]


def _as_tensor(value, name: str) -> Tensor:
    if not isinstance(value, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if not (value.is_floating_point() or value.is_complex()):
        raise TypeError(f"{name} must have a floating or complex dtype, got {value.dtype}")
    return value


def _same_shape(a: Tensor, b: Tensor, name_a: str, name_b: str) -> None:
    if a.shape != b.shape:
        raise ValueError(
            f"{name_a} and {name_b} must have the same shape, got {tuple(a.shape)} and "
            f"{tuple(b.shape)}"
        )


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
    approx = _as_tensor(approx, "approx")
    exact = _as_tensor(exact, "exact")
    _same_shape(approx, exact, "approx", "exact")
    if approx.is_complex() and real_part:
        approx = approx.real
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
    for name, value in tensors.items():
        _as_tensor(value, name)
        _same_shape(mean_approx, value, "mean_approx", name)
        if value.is_complex():
            raise TypeError(f"{name} must be real, got {value.dtype}")
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
    terms = ratio - torch.log(ratio) - 1 + (mean_exact - mean_approx).square() / var_e
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
    for name, value in (("y", y), ("mean", mean), ("var", var)):
        _as_tensor(value, name)
        _same_shape(y, value, "y", name)
    if (var <= 0).any():
        raise ValueError(f"var must be positive, got minimum {var.min().item():.3g}")
    return (0.5 * torch.log(2 * math.pi * var) + (y - mean).square() / (2 * var)).mean()


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
    _as_tensor(y, "y")
    _as_tensor(mean, "mean")
    _same_shape(y, mean, "y", "mean")
    mse = (y - mean).square().mean(0)
    ref = y.var(0, unbiased=False) if reference_variance is None else reference_variance
    if (torch.as_tensor(ref) <= 0).any():
        raise ValueError("the variance of y (or reference_variance) must be positive")
    return (mse / ref).mean()


def rmse(y: Tensor, mean: Tensor) -> Tensor:
    r"""Root mean squared error :math:`\sqrt{\frac1n \sum_i (y_i - \mu_i)^2}` over all entries.

    Example:
        >>> float(rmse(torch.tensor([0.0, 2.0]), torch.tensor([1.0, 1.0])))
        1.0
    """
    _as_tensor(y, "y")
    _as_tensor(mean, "mean")
    _same_shape(y, mean, "y", "mean")
    return (y - mean).square().mean().sqrt()
