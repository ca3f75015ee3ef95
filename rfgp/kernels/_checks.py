"""Checks of a GPyTorch kernel's inputs and hyperparameters before it is evaluated.

Internal: not part of the public API (see :mod:`rfgp.kernels`).
"""

from __future__ import annotations

from typing import Optional

import torch
from gpytorch.kernels import Kernel
from torch import Tensor

from rfgp._validation import all_finite, check_active_dims, check_kernel_input

__all__ = ["InputCheckedKernel", "check_hyperparameters"]


def check_hyperparameters(kernel: Kernel) -> None:
    """Raise ``ValueError`` naming the hyperparameter if one of ``kernel``'s (constrained)
    parameters is NaN or infinite, or zero where its constraint asks for a positive value.

    A lengthscale of 0, inf or NaN (reachable through the raw parameter, e.g. by an optimiser
    step) would otherwise turn every feature into NaN.

    Example:
        >>> from gpytorch.kernels import RBFKernel
        >>> k = RBFKernel()
        >>> _ = k.raw_lengthscale.data.fill_(float("-inf"))   # lengthscale softplus(-inf) = 0
        >>> check_hyperparameters(k)
        Traceback (most recent call last):
        ...
        ValueError: lengthscale must be finite and positive, got 0.0 (in RBFKernel)
    """
    for name, param, constraint in kernel.named_parameters_and_constraints():
        value = param if constraint is None else constraint.transform(param)
        if not all_finite(value):
            bad = value[~torch.isfinite(value)].reshape(-1)[0].item()
            raise ValueError(
                f"{_hyper_name(name)} must be finite{_positive(constraint)}, got {bad} "
                f"(in {type(kernel).__name__})"
            )
        if constraint is not None and _is_positive(constraint) and bool((value <= 0).any()):
            bad = value[value <= 0].reshape(-1)[0].item()
            raise ValueError(
                f"{_hyper_name(name)} must be finite and positive, got {bad} "
                f"(in {type(kernel).__name__})"
            )


class InputCheckedKernel(Kernel):
    """A GPyTorch kernel whose calls check their inputs and hyperparameters first.

    Inputs must be float32 / float64 tensors with at least one dimension, at least one column
    and finite entries; hyperparameters must be finite (and positive where constrained so).
    Without the checks GPyTorch fails on a 0-d input or one without columns with raw indexing
    errors, and a zero lengthscale gives NaN. The exact kernels of rfgp derive from it.

    Example:
        >>> from rfgp.kernels import DotProductKernel
        >>> DotProductKernel("polynomial", degree=2)(torch.tensor(1.0))
        Traceback (most recent call last):
        ...
        ValueError: x1 must have shape (..., N, d) or (N,) (at least 1 dimension), got a 0-d tensor
    """

    def __call__(self, x1: Tensor, x2: Optional[Tensor] = None, diag: bool = False,
                 last_dim_is_batch: bool = False, **params):
        x1 = check_kernel_input("x1", x1)
        check_active_dims(self.active_dims, x1, "x1")
        if x2 is not None:
            x2 = check_kernel_input("x2", x2)
            check_active_dims(self.active_dims, x2, "x2")
        check_hyperparameters(self)
        return super().__call__(x1, x2, diag=diag, last_dim_is_batch=last_dim_is_batch,
                                **params)


def _hyper_name(name: str) -> str:
    # "raw_lengthscale" -> "lengthscale"; "base_kernel.raw_lengthscale" -> "base_kernel.lengthscale"
    head, _, tail = name.rpartition(".")
    tail = tail[4:] if tail.startswith("raw_") else tail
    return f"{head}.{tail}" if head else tail


def _is_positive(constraint) -> bool:
    lower = getattr(constraint, "lower_bound", None)
    return lower is not None and bool((lower >= 0).all())


def _positive(constraint) -> str:
    return " and positive" if constraint is not None and _is_positive(constraint) else ""
