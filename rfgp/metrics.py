r"""Error metrics for kernel approximations and GP predictions.

* :func:`relative_frobenius_error`: :math:`\|\hat K - K\|_F / \|K\|_F`.
* :func:`gaussian_kl`: KL divergence between factorised Gaussian posteriors (the corrected
  Eq. 93 of Wacker et al.).
* :func:`mnll`, :func:`nmse`, :func:`rmse`: predictive scores.
* :func:`kernel_distance`: the kernel distance (MMD) between two point sets, exact or sketched.
* :func:`accuracy`, :func:`mnll_classification`, :func:`reliability_diagram`,
  :func:`expected_calibration_error`: classification scores.

All functions take tensors (or NumPy arrays) and return 0-d tensors (differentiable where the
inputs are). Inputs must be non-empty and finite, and paired inputs must have the same shape;
anything else raises a ``ValueError`` or ``TypeError`` that names the argument, never a NaN.
Values of any magnitude are divided by a power of two near their largest entry before they are
squared (an exact division, no rounding), so targets of ``1e200`` or ``1e-200`` neither
overflow nor underflow: the scores scale exactly as the formulas say.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import numpy as np
import torch
from torch import Tensor

from rfgp._ops import power_of_two_scale
from rfgp._validation import check_finite, check_int, check_long_tensor, check_real, describe

__all__ = [
    "relative_frobenius_error",
    "gaussian_kl",
    "mnll",
    "nmse",
    "rmse",
    "kernel_distance",
    "accuracy",
    "mnll_classification",
    "reliability_diagram",
    "expected_calibration_error",
]


def _as_tensor(value, name: str, allow_complex: bool = False) -> Tensor:
    """``value`` as a non-empty, finite floating tensor (a NumPy array is converted)."""
    if isinstance(value, np.ndarray):
        value = torch.from_numpy(np.ascontiguousarray(value))
    if not isinstance(value, Tensor):
        raise TypeError(
            f"{name} must be a torch.Tensor or NumPy array, got {type(value).__name__}"
        )
    if value.is_complex() and not allow_complex:
        raise TypeError(f"{name} must be real, got dtype {value.dtype}")
    if not (value.is_floating_point() or value.is_complex()):
        kinds = "a floating or complex" if allow_complex else "a floating"
        raise TypeError(f"{name} must have {kinds} dtype, got {value.dtype}")
    if value.numel() == 0:
        raise ValueError(f"{name} must not be empty, got {describe(value)}")
    check_finite(name, value)
    return value


def _joint_scale(*values: Tensor) -> float:
    """One power of two near the largest ``|entry|`` of all ``values`` (an exact divisor)."""
    return max(power_of_two_scale(v) for v in values)


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
    approx = _as_tensor(approx, "approx", allow_complex=True)
    exact = _as_tensor(exact, "exact", allow_complex=True)
    _same_shape(approx, exact, "approx", "exact")
    if approx.is_complex() and real_part:
        approx = approx.real
    # The ratio is scale-free: both norms of the values over one power of two.
    scale = _joint_scale(approx, exact)
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
    tensors = {name: _as_tensor(value, name) for name, value in tensors.items()}
    mean_approx, var_approx = tensors["mean_approx"], tensors["var_approx"]
    mean_exact, var_exact = tensors["mean_exact"], tensors["var_exact"]
    for name, value in tensors.items():
        _same_shape(mean_approx, value, "mean_approx", name)
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
    scale = _joint_scale(mean_exact, mean_approx)
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
    y, mean, var = _as_tensor(y, "y"), _as_tensor(mean, "mean"), _as_tensor(var, "var")
    _same_shape(y, mean, "y", "mean")
    _same_shape(y, var, "y", "var")
    if (var <= 0).any():
        raise ValueError(f"var must be positive, got minimum {var.min().item():.3g}")
    # The standardised residual (y - mu) / sigma from the residual over a power of two and
    # sigma over the same: neither (y - mu)^2 nor sigma^2 is formed, so no scale overflows.
    scale = _joint_scale(y, mean)
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
    y, mean = _as_tensor(y, "y"), _as_tensor(mean, "mean")
    _same_shape(y, mean, "y", "mean")
    if y.dim() not in (1, 2):
        raise ValueError(f"y must have shape (n,) or (n, T), got {describe(y)}")
    # Numerator and denominator over the square of one power of two: a ratio free of overflow
    # and underflow at any scale of y.
    scale = _joint_scale(y, mean)
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
        ref = _as_tensor(reference_variance, "reference_variance")
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
    y, mean = _as_tensor(y, "y"), _as_tensor(mean, "mean")
    _same_shape(y, mean, "y", "mean")
    scale = _joint_scale(y, mean)
    return (y / scale - mean / scale).square().mean().sqrt() * scale


# ---------------------------------------------------------------------------------------------
# Kernel distance (MMD) between point sets, exact and sketched
# ---------------------------------------------------------------------------------------------
__all__ += ["kernel_distance"]


def _random_feature_map(kernel):
    """``(features(x) -> Tensor)`` for a RandomFeatureKernel or a ScaleKernel around one."""
    from gpytorch.kernels import ScaleKernel

    from rfgp.kernels._base import RandomFeatureKernel

    if isinstance(kernel, RandomFeatureKernel):
        return kernel.features
    if isinstance(kernel, ScaleKernel) and isinstance(kernel.base_kernel, RandomFeatureKernel):
        base = kernel.base_kernel

        def scaled(x: Tensor) -> Tensor:
            amplitude = kernel.outputscale.sqrt()
            phi = base.features(x)
            return phi * amplitude.to(phi.real.dtype).reshape(*amplitude.shape, 1, 1)

        return scaled
    return None


def _mean_block_sum(kernel_fn, a: Tensor, b: Tensor, block: int) -> Tensor:
    total = torch.zeros((), dtype=torch.float64, device=a.device)
    for i in range(0, a.shape[0], block):
        for j in range(0, b.shape[0], block):
            total = total + kernel_fn(a[i:i + block], b[j:j + block]).to(torch.float64).sum()
    return total / (a.shape[0] * b.shape[0])


def kernel_distance(
    x: Tensor,
    y: Tensor,
    kernel=None,
    lengthscale: float = 1.0,
    squared: bool = True,
    block_size: int = 2048,
) -> Tensor:
    r"""Kernel distance (MMD) between the point sets ``x`` and ``y``, exact or sketched.

    .. math::
        D_K^2(X, Y) = \frac{1}{N^2}\sum_{i,i'} k(x_i, x_{i'}) + \frac{1}{M^2}\sum_{j,j'} k(y_j,
        y_{j'}) - \frac{2}{NM}\sum_{i,j} k(x_i, y_j)
        = \Big\|\frac1N \sum_i \phi(x_i) - \frac1M \sum_j \phi(y_j)\Big\|^2

    (the biased V-statistic MMD^2: diagonal terms included).

    * ``kernel=None``: exact, with the Gaussian kernel ``exp(-||x - y||^2 / (2 l^2))`` of
      lengthscale ``lengthscale`` (GPyTorch's ``RBFKernel`` convention), ``O(N M d)`` in blocks.
    * an exact GPyTorch kernel (any ``gpytorch.kernels.Kernel`` that is not a random-feature
      kernel): exact, with that kernel.
    * a random-feature kernel (or a ``ScaleKernel`` around one): the sketched estimate
      :math:`\|\bar\Phi(X) - \bar\Phi(Y)\|^2` from feature means, ``O((N + M) D)``; for
      complex features this is the squared complex norm, i.e. the distance under
      :math:`\mathrm{Re}\,\hat k`. With :class:`~rfgp.kernels.GaussianSketchKernel` the estimate
      satisfies :math:`|\hat D^2 - D^2| \le \epsilon D^2 + \alpha` with probability 9/10 for the
      truncation and dimension described there.

    The difference of means is formed before squaring, so a small distance is never the
    cancellation of three large terms.

    Args:
        x: ``(N, d)``; y: ``(M, d)``.
        kernel: ``None``, an exact GPyTorch kernel, or a random-feature kernel.
        lengthscale: for ``kernel=None`` only.
        squared: return :math:`D_K^2` (default) or :math:`D_K`.
        block_size: rows per block of the exact computation.

    Returns:
        Scalar tensor (float64 for the exact computation).

    Example:
        >>> x = torch.zeros(1, 2, dtype=torch.float64)
        >>> y = torch.ones(1, 2, dtype=torch.float64)
        >>> round(float(kernel_distance(x, y)), 6)   # 2 - 2 exp(-1)
        1.264241

    References:
        Phillips & Tai, *The GaussianSketch for Almost Relative Error Kernel Distance*, 2020.
        Gretton et al., *A Kernel Two-Sample Test*, JMLR 2012.
    """
    x, y = _as_tensor(x, "x"), _as_tensor(y, "y")
    if x.dim() == 1:
        x = x.unsqueeze(-1)
    if y.dim() == 1:
        y = y.unsqueeze(-1)
    if x.dim() != 2 or y.dim() != 2 or x.shape[-1] != y.shape[-1]:
        raise ValueError(
            f"x and y must have shapes (N, d) and (M, d) with the same d, got {tuple(x.shape)} "
            f"and {tuple(y.shape)}"
        )
    if x.shape[0] == 0 or y.shape[0] == 0:
        raise ValueError(f"x and y must be non-empty, got {x.shape[0]} and {y.shape[0]} rows")
    block_size = check_int("block_size", block_size)
    feature_map = _random_feature_map(kernel) if kernel is not None else None
    if feature_map is not None:
        diff = feature_map(x).mean(-2) - feature_map(y).mean(-2)
        value = (diff.abs() ** 2).sum(-1) if diff.is_complex() else (diff * diff).sum(-1)
    else:
        if kernel is None:
            lengthscale = check_real("lengthscale", lengthscale, low=0.0, low_inclusive=False)
            inv = 1.0 / (2.0 * lengthscale**2)

            def kernel_fn(a: Tensor, b: Tensor) -> Tensor:
                # The matmul form of cdist loses ~1e-8 absolute accuracy on near-equal points.
                sq = torch.cdist(a, b, compute_mode="donot_use_mm_for_euclid_dist").pow(2)
                return torch.exp(-sq * inv)
        else:
            from gpytorch.kernels import Kernel

            if not isinstance(kernel, Kernel):
                raise TypeError(
                    "kernel must be None, a gpytorch Kernel or a random-feature kernel, got "
                    f"{type(kernel).__name__}"
                )

            def kernel_fn(a: Tensor, b: Tensor) -> Tensor:
                return kernel(a, b).to_dense()

        xd, yd = x.to(torch.float64), y.to(torch.float64)
        import contextlib

        needs_grad = x.requires_grad or y.requires_grad
        with contextlib.nullcontext() if needs_grad else torch.no_grad():
            value = (_mean_block_sum(kernel_fn, xd, xd, block_size)
                     + _mean_block_sum(kernel_fn, yd, yd, block_size)
                     - 2.0 * _mean_block_sum(kernel_fn, xd, yd, block_size))
        value = value.clamp_min(0.0)
    return value if squared else value.clamp_min(0.0).sqrt()


# ---------------------------------------------------------------------------------------------
# Classification metrics: accuracy, MNLL of class probabilities, calibration.
# ---------------------------------------------------------------------------------------------

__all__ += [
    "accuracy",
    "mnll_classification",
    "reliability_diagram",
    "expected_calibration_error",
]


def _row_sum_tolerance(dtype: torch.dtype) -> float:
    # Probabilities computed in float64 sum to one within a few ulps; float32 ones within ~1e-6
    # per class; 1e-6 and 1e-3 leave room for either and still refuse rows summing to 0.9.
    return 1e-6 if dtype == torch.float64 else 1e-3


def _check_proba_labels(probs, labels) -> Tuple[Tensor, Tensor]:
    """``(probs, labels)`` as tensors: probabilities ``(N, C)`` whose rows lie in ``[0, 1]`` and
    sum to one, and labels ``(N,)`` in ``[0, C)``."""
    probs = _as_tensor(probs, "probs")
    if probs.dim() != 2 or probs.shape[1] < 2:
        raise ValueError(f"probs must have shape (N, C) with C >= 2, got {tuple(probs.shape)}")
    labels = _check_labels(labels, probs.shape[0], probs.shape[1])
    if (probs < 0).any() or (probs > 1).any():
        raise ValueError(
            f"probs must be finite and lie in [0, 1], got range [{probs.min().item():.3g}, "
            f"{probs.max().item():.3g}]"
        )
    error = (probs.sum(-1) - 1).abs().max().item()
    if error > _row_sum_tolerance(probs.dtype):
        raise ValueError(
            "probs must be probabilities whose rows sum to 1, got a row sum off by "
            f"{error:.3g}"
        )
    return probs, labels


def _check_labels(labels, n: int, num_classes: Optional[int] = None) -> Tensor:
    """``labels`` as an ``(n,)`` integer tensor of class indices in ``[0, num_classes)``."""
    labels = check_long_tensor("labels", labels, "integer class indices")
    if labels.shape != (n,):
        raise ValueError(f"labels must have shape ({n},), got {tuple(labels.shape)}")
    if n == 0:
        raise ValueError("labels must not be empty")
    if (labels < 0).any() or (num_classes is not None and (labels >= num_classes).any()):
        upper = num_classes if num_classes is not None else "C"
        raise ValueError(
            f"labels must lie in [0, {upper}), got range "
            f"[{int(labels.min())}, {int(labels.max())}]"
        )
    return labels


def accuracy(predictions, labels) -> Tensor:
    """Fraction of correctly classified points.

    Args:
        predictions: ``(N,)`` predicted labels, or ``(N, C)`` class probabilities/scores (their
            ``argmax`` is the prediction; finite); a tensor or NumPy array.
        labels: ``(N,)`` true integer labels (in ``[0, C)`` with scores).

    Returns:
        float64 scalar tensor in ``[0, 1]`` (the classification error is ``1 - accuracy``).

    Example:
        >>> float(accuracy(torch.tensor([[0.9, 0.1], [0.2, 0.8]]), torch.tensor([0, 0])))
        0.5
    """
    if isinstance(predictions, np.ndarray):
        predictions = torch.from_numpy(np.ascontiguousarray(predictions))
    if not isinstance(predictions, Tensor):
        raise TypeError(
            f"predictions must be a torch.Tensor or NumPy array, got {type(predictions).__name__}"
        )
    num_classes = None
    if predictions.dim() == 2:
        predictions = _as_tensor(predictions, "predictions")
        num_classes = predictions.shape[1]
        predictions = predictions.argmax(dim=-1)
    elif (predictions.dim() != 1 or predictions.is_floating_point() or predictions.is_complex()
          or predictions.dtype == torch.bool):
        raise ValueError(
            "predictions must be (N,) integer labels or (N, C) probabilities, got shape "
            f"{tuple(predictions.shape)} and dtype {predictions.dtype}"
        )
    else:
        predictions = check_long_tensor("predictions", predictions, "integer labels")
    labels = _check_labels(labels, predictions.shape[0], num_classes)
    return (predictions == labels).double().mean()


def mnll_classification(probs: Tensor, labels: Tensor) -> Tensor:
    r"""Mean negative log-likelihood of the true classes under predicted class probabilities.

    .. math::
        \mathrm{MNLL} = -\frac{1}{N} \sum_{n} \log \max(p_{n, y_n}, t)

    where ``t`` is the smallest positive normal number of the dtype (a zero probability counts
    as about 708 nats in float64 instead of infinity; it is never rewarded).

    Args:
        probs: ``(N, C)`` predicted probabilities (rows summing to one).
        labels: ``(N,)`` true labels in ``[0, C)``.

    Returns:
        Scalar tensor (lower is better; ``log C`` for the uniform prediction).

    Example:
        >>> mnll_classification(torch.full((4, 2), 0.5), torch.tensor([0, 1, 0, 1]))
        tensor(0.6931)
    """
    probs, labels = _check_proba_labels(probs, labels)
    p_true = probs.gather(1, labels.long().unsqueeze(-1)).squeeze(-1)
    return -torch.log(p_true.clamp_min(torch.finfo(probs.dtype).tiny)).mean()


def reliability_diagram(probs: Tensor, labels: Tensor, num_bins: int = 15) -> dict:
    r"""Data of a reliability diagram: accuracy against confidence in equal-width bins.

    The confidence of a point is its largest class probability; bin ``b`` holds the points with
    confidence in ``(b / B, (b + 1) / B]`` (the first bin also holds 0).

    Args:
        probs: ``(N, C)`` predicted probabilities.
        labels: ``(N,)`` true labels.
        num_bins: number of bins ``B``.

    Returns:
        dict with ``bin_edges`` ``(B + 1,)``, ``confidence`` ``(B,)`` (mean confidence per bin,
        NaN for an empty bin), ``accuracy`` ``(B,)`` (NaN for an empty bin) and ``count``
        ``(B,)``.

    Example:
        >>> probs = torch.tensor([[0.9, 0.1], [0.7, 0.3], [0.35, 0.65], [0.45, 0.55]])
        >>> diagram = reliability_diagram(probs, torch.tensor([0, 1, 1, 1]), num_bins=4)
        >>> diagram["count"], diagram["accuracy"][2:]   # bins (0.5, 0.75] and (0.75, 1]
        (tensor([0, 0, 3, 1]), tensor([0.6667, 1.0000]))
    """
    probs, labels = _check_proba_labels(probs, labels)
    num_bins = check_int("num_bins", num_bins)
    confidence, predicted = probs.max(dim=-1)
    correct = (predicted == labels).to(probs.dtype)
    edges = torch.linspace(0, 1, num_bins + 1, dtype=probs.dtype)
    index = (torch.ceil(confidence * num_bins).long() - 1).clamp(0, num_bins - 1)
    count = torch.bincount(index, minlength=num_bins)
    conf_sum = torch.zeros(num_bins, dtype=probs.dtype).index_add_(0, index, confidence)
    acc_sum = torch.zeros(num_bins, dtype=probs.dtype).index_add_(0, index, correct)
    safe = count.clamp_min(1).to(probs.dtype)
    empty = count == 0
    conf_mean = torch.where(empty, torch.nan, conf_sum / safe)
    acc_mean = torch.where(empty, torch.nan, acc_sum / safe)
    return {"bin_edges": edges, "confidence": conf_mean, "accuracy": acc_mean, "count": count}


def expected_calibration_error(probs: Tensor, labels: Tensor, num_bins: int = 15) -> Tensor:
    r"""Expected calibration error of the top-class confidence.

    .. math::
        \mathrm{ECE} = \sum_{b} \frac{n_b}{N} \, |\mathrm{acc}_b - \mathrm{conf}_b|

    over the equal-width bins of :func:`reliability_diagram`.

    Args:
        probs: ``(N, C)`` predicted probabilities.
        labels: ``(N,)`` true labels.
        num_bins: number of bins.

    Returns:
        Scalar tensor in ``[0, 1]`` (0: perfectly calibrated).

    Example:
        >>> probs = torch.tensor([[0.75, 0.25]] * 4)
        >>> expected_calibration_error(probs, torch.tensor([0, 0, 0, 1]))
        tensor(0.)

    References:
        M. P. Naeini, G. Cooper, M. Hauskrecht. Obtaining well calibrated probabilities using
        Bayesian binning. AAAI 2015.
    """
    diagram = reliability_diagram(probs, labels, num_bins)
    count = diagram["count"]
    nonempty = count > 0
    gaps = (diagram["accuracy"][nonempty] - diagram["confidence"][nonempty]).abs()
    return (gaps * count[nonempty].to(gaps.dtype)).sum() / count.sum()
