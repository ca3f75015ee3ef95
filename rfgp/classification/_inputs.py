"""The classifier's input checks, shared by :class:`~rfgp.classification.DirichletGPClassifier`
and :func:`~rfgp.classification.select_alpha`: integer labels to class indices, inputs to
``(N, d)`` tensors, and the kernel inside its ``ScaleKernel`` wrappers.

Internal: not part of the public API (see :mod:`rfgp.classification`).
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

import numpy as np
import torch
from gpytorch.kernels import Kernel, ScaleKernel
from torch import Tensor

from rfgp._validation import check_integer_tensor, check_tensor, describe
from rfgp.likelihoods import validate_labels

__all__ = ["base_kernel", "check_inputs", "encode_labels"]

_ENCODE_HINT = (
    "encode other labels as integers first, e.g. with sklearn.preprocessing.LabelEncoder, "
    "np.unique(labels, return_inverse=True) or rfgp.sklearn.RandomFeatureGPClassifier"
)


def encode_labels(labels: Any, num_classes: Optional[int] = None) -> Tuple[Tensor, Tensor]:
    """Map integer class ids to class indices as scikit-learn does.

    Without ``num_classes`` the classes are the sorted distinct ids (``classes = unique(labels)``,
    index ``i`` stands for ``classes[i]``), so ids ``{3, 10**6}`` make two classes, never a
    dense range up to the largest id. With ``num_classes`` the labels must already be indices in
    ``[0, num_classes)`` and ``classes = arange(num_classes)`` (classes absent from the labels
    are kept).

    Args:
        labels: ``(N,)`` integer ids (a tensor or NumPy array of an integer dtype).
        num_classes: ``C``, or ``None`` to take the distinct ids.

    Returns:
        ``(indices, classes)``: ``(N,)`` long indices into ``classes`` and ``(C,)`` ids in the
        dtype of ``labels`` (``arange(C)``, long, with ``num_classes``).

    Raises:
        TypeError: labels that are not integers (strings, floats, booleans): encode them first.
        ValueError: empty, not 1-D, fewer than two classes, or out of ``[0, num_classes)``.

    Example:
        >>> encode_labels(torch.tensor([1000000, 3, 3]))
        (tensor([1, 0, 0]), tensor([      3, 1000000]))
        >>> encode_labels(np.array([2**64 - 1, 7], dtype=np.uint64))[1]
        tensor([                   7, 18446744073709551615], dtype=torch.uint64)
    """
    labels = check_integer_tensor("labels", labels, "integer class ids", "; " + _ENCODE_HINT)
    if num_classes is not None:
        indices, num_classes = validate_labels(labels, num_classes)
        return indices, torch.arange(num_classes, device=indices.device)
    if labels.dim() != 1:
        raise ValueError(f"labels must be a 1-D tensor of shape (N,), got {describe(labels)}")
    if labels.numel() == 0:
        raise ValueError("labels must not be empty")
    # np.unique on the original values: every integer dtype keeps its ids (PyTorch cannot sort
    # or compare unsigned 64-bit tensors, and a cast to int64 would wrap ids of 2**63 and more).
    classes, inverse = np.unique(labels.detach().cpu().numpy(), return_inverse=True)
    if classes.size < 2:
        raise ValueError(
            f"labels must contain at least two distinct classes, got only class {classes[0]}"
        )
    indices = torch.from_numpy(inverse.reshape(-1).astype(np.int64)).to(labels.device)
    classes = torch.from_numpy(classes).to(labels.device)
    return indices, classes


def base_kernel(kernel: Kernel) -> Kernel:
    """The kernel inside any number of ``ScaleKernel`` wrappers."""
    while isinstance(kernel, ScaleKernel):
        kernel = kernel.base_kernel
    return kernel


def check_inputs(x: Any, name: str = "x") -> Tensor:
    """``x`` as an ``(N, d)`` finite floating tensor (NumPy accepted; 1-D means ``d = 1``)."""
    if isinstance(x, np.ndarray):
        x = torch.as_tensor(x)
    x = check_tensor(name, x)
    if x.dim() == 1:
        x = x.unsqueeze(-1)
    if x.dim() != 2:
        raise ValueError(f"{name} must have shape (N, d), got {describe(x)}")
    return x
