"""Error metrics for random-feature GPs."""

from __future__ import annotations

from typing import Any, Dict

import torch
from torch import Tensor

# ---------------------------------------------------------------------------------------------
# Classification metrics: accuracy, MNLL of class probabilities, calibration.
# ---------------------------------------------------------------------------------------------


def _check_proba_labels(probs: Tensor, labels: Tensor) -> None:
    if not isinstance(probs, Tensor) or not probs.is_floating_point():
        raise TypeError(
            f"probs must be a floating torch.Tensor of shape (N, C), got {type(probs).__name__}"
            + (f" of dtype {probs.dtype}" if isinstance(probs, Tensor) else "")
        )
    if probs.dim() != 2 or probs.shape[1] < 2:
        raise ValueError(f"probs must have shape (N, C) with C >= 2, got {tuple(probs.shape)}")
    _check_labels(labels, probs.shape[0], probs.shape[1])
    if not torch.isfinite(probs).all() or (probs < 0).any() or (probs > 1).any():
        raise ValueError("probs must be finite and lie in [0, 1]")


def _check_labels(labels: Tensor, n: int, num_classes: int = None) -> None:
    if not isinstance(labels, Tensor):
        raise TypeError(f"labels must be a torch.Tensor of shape (N,), got {type(labels).__name__}")
    if labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:
        raise TypeError(f"labels must hold integer class indices, got dtype {labels.dtype}")
    if labels.shape != (n,):
        raise ValueError(f"labels must have shape ({n},), got {tuple(labels.shape)}")
    if n == 0:
        raise ValueError("labels must not be empty")
    if (labels < 0).any() or (num_classes is not None and (labels >= num_classes).any()):
        raise ValueError(
            f"labels must lie in [0, {num_classes}), got range "
            f"[{int(labels.min())}, {int(labels.max())}]"
        )


def accuracy(predictions: Tensor, labels: Tensor) -> Tensor:
    """Fraction of correctly classified points.

    Args:
        predictions: ``(N,)`` predicted labels, or ``(N, C)`` class probabilities/scores (their
            ``argmax`` is the prediction).
        labels: ``(N,)`` true integer labels.

    Returns:
        Scalar tensor in ``[0, 1]`` (the classification error is ``1 - accuracy``).

    Example:
        >>> accuracy(torch.tensor([[0.9, 0.1], [0.2, 0.8]]), torch.tensor([0, 0]))
        tensor(0.5000)
    """
    if not isinstance(predictions, Tensor):
        raise TypeError(f"predictions must be a torch.Tensor, got {type(predictions).__name__}")
    if predictions.dim() == 2:
        predictions = predictions.argmax(dim=-1)
    elif predictions.dim() != 1 or predictions.is_floating_point():
        raise ValueError(
            "predictions must be (N,) integer labels or (N, C) probabilities, got shape "
            f"{tuple(predictions.shape)} and dtype {predictions.dtype}"
        )
    _check_labels(labels, predictions.shape[0])
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
    _check_proba_labels(probs, labels)
    p_true = probs.gather(1, labels.long().unsqueeze(-1)).squeeze(-1)
    return -torch.log(p_true.clamp_min(torch.finfo(probs.dtype).tiny)).mean()


def reliability_diagram(probs: Tensor, labels: Tensor, num_bins: int = 15) -> Dict[str, Any]:
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
    """
    _check_proba_labels(probs, labels)
    if not isinstance(num_bins, int) or isinstance(num_bins, bool) or num_bins < 1:
        raise ValueError(f"num_bins must be a positive integer, got {num_bins!r}")
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
