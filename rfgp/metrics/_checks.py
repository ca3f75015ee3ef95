"""The metrics' input checks: finite non-empty tensors, equal shapes, a joint scale.

Internal: not part of the public API (see :mod:`rfgp.metrics`).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from rfgp._ops import power_of_two_scale
from rfgp._validation import check_finite, describe

__all__ = ["as_tensor", "joint_scale", "same_shape"]


def as_tensor(value, name: str, allow_complex: bool = False) -> Tensor:
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


def joint_scale(*values: Tensor) -> float:
    """One power of two near the largest ``|entry|`` of all ``values`` (an exact divisor)."""
    return max(power_of_two_scale(v) for v in values)


def same_shape(a: Tensor, b: Tensor, name_a: str, name_b: str) -> None:
    if a.shape != b.shape:
        raise ValueError(
            f"{name_a} and {name_b} must have the same shape, got {tuple(a.shape)} and "
            f"{tuple(b.shape)}"
        )

