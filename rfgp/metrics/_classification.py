r"""Classification scores: accuracy, the MNLL of class probabilities, and calibration.

Internal: not part of the public API (see :mod:`rfgp.metrics`).
"""

from __future__ import annotations

from typing import Optional, Tuple

import numpy as np
import torch
from torch import Tensor

from rfgp._validation import check_int, check_long_tensor
from rfgp.metrics._checks import as_tensor

__all__ = ["accuracy", "expected_calibration_error", "mnll_classification", "reliability_diagram"]


def _row_sum_tolerance(dtype: torch.dtype) -> float:
    # Probabilities computed in float64 sum to one within a few ulps; float32 ones within ~1e-6
    # per class; 1e-6 and 1e-3 leave room for either and still refuse rows summing to 0.9.
    return 1e-6 if dtype == torch.float64 else 1e-3


def _check_proba_labels(probs, labels) -> Tuple[Tensor, Tensor]:
    """``(probs, labels)`` as tensors: probabilities ``(N, C)`` whose rows lie in ``[0, 1]`` and
    sum to one, and labels ``(N,)`` in ``[0, C)``."""
    probs = as_tensor(probs, "probs")
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
        predictions = as_tensor(predictions, "predictions")
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
