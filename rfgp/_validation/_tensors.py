"""Tensor argument checks: finiteness, shapes of rows and kernel inputs, integer tensors,
positive values, active columns, and the rows an evidence is computed on.

As the scalar checks, each names the argument, says what was expected and shows what was
received: a wrong type or dtype raises ``TypeError``, a wrong shape or value ``ValueError``.
These are the checks of data *content*, made where the data first enters.

Example:
    >>> check_rows(torch.zeros(3, 2), torch.zeros(3))[1].shape
    torch.Size([3])
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import torch
from torch import Tensor

from rfgp._validation._scalars import describe

__all__ = ["EVIDENCE_DTYPES", "KERNEL_INPUT_DTYPES", "all_finite", "check_active_dims",
           "check_class_targets", "check_evidence_rows", "check_finite", "check_integer_tensor",
           "check_kernel_input", "check_long_tensor", "check_positive_values", "check_real_values",
           "check_rows", "check_tensor", "select_active_columns"]


def all_finite(value: Tensor) -> bool:
    """Whether every entry of ``value`` is finite, in one reduction pass.

    A NaN or infinity makes the sum non-finite, so a finite sum proves every entry finite
    without materialising an ``isfinite`` mask; only a non-finite sum (which finite entries can
    also produce, by overflow) is checked entry by entry.

    Example:
        >>> all_finite(torch.tensor([1.0, 2.0])), all_finite(torch.tensor([1.0, float("inf")]))
        (True, False)
        >>> all_finite(torch.tensor([3e38, 3e38]))  # the sum overflows, the entries are finite
        True
    """
    if value.numel() == 0:
        return True
    if not (value.is_floating_point() or value.is_complex()):
        return True
    if bool(torch.isfinite(value.sum())):
        return True
    return bool(torch.isfinite(value).all())


def check_finite(name: str, value: Tensor) -> None:
    """Raise ``ValueError`` naming ``name`` if ``value`` holds NaN or infinite entries.

    Example:
        >>> check_finite("x", torch.ones(2))
        >>> check_finite("x", torch.tensor([1.0, float("nan")]))
        Traceback (most recent call last):
        ...
        ValueError: x must be finite, but 1 entries are NaN or infinite
    """
    if not all_finite(value):
        bad = (~torch.isfinite(value)).sum().item()
        raise ValueError(f"{name} must be finite, but {bad} entries are NaN or infinite")


def check_tensor(
    name: str,
    value: Any,
    *,
    floating: bool = True,
    allow_complex: bool = False,
    finite: bool = True,
    min_dim: Optional[int] = None,
    max_dim: Optional[int] = None,
    non_empty: bool = False,
) -> Tensor:
    """Return ``value`` if it is a tensor of the requested kind; raise a clear error otherwise.

    Args:
        name: the argument's name, for the message.
        value: what the caller passed (must already be a ``torch.Tensor``).
        floating: require a floating (or, with ``allow_complex``, complex) dtype.
        allow_complex: accept complex dtypes.
        finite: reject NaN and infinite entries.
        min_dim, max_dim: bounds on ``value.dim()``.
        non_empty: reject tensors with no entries.

    Example:
        >>> check_tensor("x", torch.zeros(3, 2), min_dim=1, max_dim=2).shape
        torch.Size([3, 2])
        >>> check_tensor("x", torch.zeros(()), min_dim=1)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: x must have at least 1 dimension(s), got a tensor of shape () ...
    """
    if not isinstance(value, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if value.is_complex() and not allow_complex:
        raise TypeError(f"{name} must be real, got dtype {value.dtype}")
    if floating and not (value.is_floating_point() or value.is_complex()):
        raise TypeError(f"{name} must have a floating dtype, got {value.dtype}")
    if min_dim is not None and value.dim() < min_dim:
        raise ValueError(
            f"{name} must have at least {min_dim} dimension(s), got {describe(value)}"
        )
    if max_dim is not None and value.dim() > max_dim:
        raise ValueError(f"{name} must have at most {max_dim} dimension(s), got {describe(value)}")
    if non_empty and value.numel() == 0:
        raise ValueError(f"{name} must not be empty, got {describe(value)}")
    if finite:
        check_finite(name, value)
    return value


def check_rows(x: Any, y: Any, x_name: str = "x", y_name: str = "y",
               num_inputs: Optional[int] = None) -> tuple:
    """Return regression rows ``x (N, d)`` and ``y (N,)`` or ``(N, T)``, or raise a clear error.

    Both must be finite floating tensors of one dtype, ``x`` with at least one row and one
    column (``num_inputs`` of them when given) and ``y`` with as many rows as ``x`` and at
    least one column.

    Example:
        >>> x, y = check_rows(torch.zeros(3, 2), torch.zeros(3))
        >>> check_rows(torch.zeros(3, 2), torch.zeros(4))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: y must have shape (N,) or (N, T) with N = 3 rows of x, got (4,)
    """
    x = check_tensor(x_name, x, min_dim=2, max_dim=2, non_empty=True)
    y = check_tensor(y_name, y, min_dim=1, max_dim=2)
    if y.shape[0] != x.shape[0]:
        raise ValueError(
            f"{y_name} must have shape (N,) or (N, T) with N = {x.shape[0]} rows of {x_name}, "
            f"got {tuple(y.shape)}"
        )
    if y.dim() == 2 and y.shape[1] == 0:
        raise ValueError(
            f"{y_name} must have at least one target column, got shape {tuple(y.shape)}"
        )
    if num_inputs is not None and x.shape[1] != num_inputs:
        raise ValueError(
            f"{x_name} must have {num_inputs} columns, got shape {tuple(x.shape)}"
        )
    if y.dtype != x.dtype:
        raise TypeError(f"{y_name} must have the dtype of {x_name} ({x.dtype}), got {y.dtype}")
    return x, y


#: the input dtypes every kernel computes in.
KERNEL_INPUT_DTYPES = (torch.float32, torch.float64)


def check_kernel_input(name: str, value: Any, finite: bool = True) -> Tensor:
    """Return kernel inputs ``value`` as an ``(..., N, d)`` tensor, or raise a clear error.

    A 1-D tensor means ``d = 1`` (GPyTorch's convention) and gains a trailing dimension. The
    dtype must be float32 or float64 (half precision has no Cholesky or FFT support on the
    CPU, and its 3 significant digits cannot hold a kernel matrix); ``N = 0`` is allowed.

    Args:
        name: the argument's name, for the message.
        value: what the caller passed.
        finite: reject NaN and infinite entries (one reduction pass over ``value``).

    Raises:
        TypeError: for a non-tensor or another dtype.
        ValueError: for a 0-d tensor, no columns (``d = 0``) or non-finite entries.

    Example:
        >>> check_kernel_input("x", torch.zeros(3)).shape
        torch.Size([3, 1])
        >>> check_kernel_input("x", torch.zeros(3, 2, dtype=torch.float16))
        Traceback (most recent call last):
        ...
        TypeError: x must have a floating dtype, torch.float32 or torch.float64, got torch.float16
    """
    if not isinstance(value, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if value.dtype not in KERNEL_INPUT_DTYPES:
        raise TypeError(
            f"{name} must have a floating dtype, torch.float32 or torch.float64, got "
            f"{value.dtype}"
        )
    if value.dim() == 0:
        raise ValueError(
            f"{name} must have shape (..., N, d) or (N,) (at least 1 dimension), got a 0-d "
            f"tensor"
        )
    if value.dim() == 1:
        value = value.unsqueeze(-1)
    if value.shape[-1] == 0:
        raise ValueError(
            f"{name} must have at least one input column (d >= 1), got {describe(value)}"
        )
    if finite and not all_finite(value):
        raise ValueError(f"{name} must be finite, but it holds NaN or infinite entries")
    return value


def _real_tensor(name: str, value: Any, like: Tensor, what: str) -> Tensor:
    """``value`` as a real tensor in ``like``'s dtype and device, or a ``TypeError`` naming
    ``name`` and ``what`` it must be (bool, str and complex refused)."""
    if isinstance(value, (bool, np.bool_, str)):
        raise TypeError(f"{name} must be {what}, got {describe(value)}")
    if not torch.is_tensor(value):
        try:
            value = torch.as_tensor(value)
        except (TypeError, ValueError, RuntimeError):
            raise TypeError(f"{name} must be {what}, got {describe(value)}") from None
    if value.is_complex() or value.dtype == torch.bool:
        raise TypeError(f"{name} must be real, got dtype {value.dtype}")
    return value.to(like)


def check_real_values(name: str, value: Any, like: Tensor) -> Tensor:
    """``value`` (a tensor or anything ``torch.as_tensor`` reads) in ``like``'s dtype and
    device, if it is real (not complex, bool or a string) and every entry is finite.

    Example:
        >>> check_real_values("offsets", [0.5, -2], torch.zeros(2))
        tensor([ 0.5000, -2.0000])
        >>> check_real_values("offsets", [float("inf")], torch.zeros(1))
        Traceback (most recent call last):
        ...
        ValueError: offsets must be finite, got tensor([inf])
    """
    value = _real_tensor(name, value, like, "a real number or tensor")
    if not all_finite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    return value


def check_positive_values(name: str, value: Any, like: Tensor) -> Tensor:
    """``value`` (a tensor or anything ``torch.as_tensor`` reads) in ``like``'s dtype and
    device, if every entry is finite and positive: the check of a positive hyperparameter's
    setter, before a NaN reaches the constraint's inverse transform.

    Example:
        >>> check_positive_values("task_diag", [0.5, 2.0], torch.zeros(2))
        tensor([0.5000, 2.0000])
        >>> check_positive_values("task_diag", [float("nan")], torch.zeros(1))
        Traceback (most recent call last):
        ...
        ValueError: task_diag must be finite and positive, got tensor([nan])
    """
    value = _real_tensor(name, value, like, "a positive real number or tensor")
    if not all_finite(value) or bool((value <= 0).any()):
        raise ValueError(f"{name} must be finite and positive, got {value}")
    return value


def check_active_dims(active_dims: Optional[Tensor], x: Tensor, name: str = "x") -> None:
    """Raise a ``ValueError`` naming ``active_dims`` unless every index is one of the ``d``
    columns of kernel inputs ``x (..., N, d)`` (``None``: nothing to check), instead of the
    raw indexing error ``index_select`` would give.

    Example:
        >>> check_active_dims(torch.tensor([5]), torch.zeros(4, 3))
        Traceback (most recent call last):
        ...
        ValueError: active_dims must index the 3 columns of x (0 to 2), got the largest index 5
    """
    if active_dims is None or not active_dims.numel():
        return
    low, high = int(active_dims.min()), int(active_dims.max())
    d = x.shape[-1]
    if high >= d or low < 0:
        bad = f"the largest index {high}" if high >= d else f"the index {low}"
        raise ValueError(
            f"active_dims must index the {d} columns of {name} (0 to {d - 1}), got {bad}"
        )


def select_active_columns(x: Tensor, active_dims: Optional[Tensor], name: str = "x") -> Tensor:
    """The columns ``active_dims`` of kernel inputs ``x (..., N, d)`` (all of them for
    ``None``), checked by :func:`check_active_dims`.

    Example:
        >>> select_active_columns(torch.zeros(4, 3), torch.tensor([0, 2])).shape
        torch.Size([4, 2])
    """
    if active_dims is None:
        return x
    check_active_dims(active_dims, x, name)
    return x.index_select(-1, active_dims.to(x.device))


def check_integer_tensor(name: str, value: Any, what: str = "integers", hint: str = "") -> Tensor:
    """Return ``value`` as a torch tensor of an integer dtype, or raise a ``TypeError``.

    A NumPy array of an integer dtype is converted; floating, complex and boolean values are
    refused, never rounded. Shape and range are the caller's to check.

    Args:
        name: the argument's name, for the message.
        value: a ``torch.Tensor`` or NumPy array.
        what: what the entries stand for, for the message (e.g. ``"integer class indices"``).
        hint: text appended to every message (e.g. ``"; encode them first"``).

    Example:
        >>> check_integer_tensor("labels", np.array([0, 2]))
        tensor([0, 2])
        >>> check_integer_tensor("labels", torch.tensor([0.5]), "integer class indices")
        Traceback (most recent call last):
        ...
        TypeError: labels must hold integer class indices, got dtype torch.float32
    """
    if isinstance(value, np.ndarray):
        # np.bool_ is not an np.integer subtype, so booleans are refused here too.
        if not np.issubdtype(value.dtype, np.integer):
            raise TypeError(
                f"{name} must hold {what}, got a NumPy array of dtype {value.dtype}{hint}"
            )
        value = torch.from_numpy(np.ascontiguousarray(value))
    if not isinstance(value, Tensor):
        raise TypeError(
            f"{name} must be a torch.Tensor or NumPy array of {what}, got "
            f"{type(value).__name__}{hint}"
        )
    if value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
        raise TypeError(f"{name} must hold {what}, got dtype {value.dtype}{hint}")
    return value


def check_long_tensor(name: str, value: Any, what: str = "integers", hint: str = "") -> Tensor:
    """Return integer ``value`` (tensor or NumPy array) as an int64 tensor with the same values.

    :func:`check_integer_tensor` first; unsigned 64-bit values of ``2**63`` and more have no
    int64 equal (a cast would wrap them to negative numbers), so they raise instead. The range
    is read in NumPy, which compares unsigned integers that PyTorch cannot.

    Raises:
        TypeError: as :func:`check_integer_tensor`.
        ValueError: an entry above ``2**63 - 1``.

    Example:
        >>> check_long_tensor("labels", np.array([3, 1], dtype=np.uint32))
        tensor([3, 1])
        >>> check_long_tensor("labels", np.array([2**64 - 1], np.uint64))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: labels must hold integers below 2**63 (int64), got 18446744073709551615 ...
    """
    value = check_integer_tensor(name, value, what, hint)
    if value.dtype == torch.int64:
        return value
    if value.dtype == torch.uint64 and value.numel():
        largest = int(value.detach().cpu().numpy().max())
        if largest > torch.iinfo(torch.int64).max:
            raise ValueError(
                f"{name} must hold {what} below 2**63 (int64), got {largest} in dtype "
                f"{value.dtype}{hint}"
            )
    # Every other integer dtype, and uint64 below 2**63, is exact in int64.
    return value.long()


#: The dtypes an evidence is computed in: its Cholesky factors, eigendecompositions and the
#: Laplace Hessian need at least single precision's range and digits.
EVIDENCE_DTYPES = (torch.float32, torch.float64)


def check_evidence_rows(x: Any, y: Any, caller: str) -> tuple:
    """``x`` ``(N, d)`` and ``y`` ``(N,)`` or ``(N, T)`` as :func:`check_rows` takes them, in
    one of :data:`EVIDENCE_DTYPES` and detached from any autograd graph (whoever maximises an
    evidence differentiates its own parameters only), and ``y`` not zero in every entry (the
    evidence of the outputscale and the noise has no maximum there); ``caller`` names the
    entry point.

    Example:
        >>> x, y = check_evidence_rows(torch.zeros(3, 2), torch.ones(3), "fit")
        >>> check_evidence_rows(x.half(), y, "fit")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        TypeError: fit: x must be float32 or float64 ... got torch.float16; convert with x.double()
        >>> check_evidence_rows(x, torch.zeros(3), "fit")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: fit: y must not be zero in every entry, got 3 rows of zeros ...
    """
    for name, value in (("x", x), ("y", y)):
        if isinstance(value, Tensor) and value.is_floating_point() and (
                value.dtype not in EVIDENCE_DTYPES):
            raise TypeError(
                f"{caller}: {name} must be float32 or float64 (the evidence's factorisations "
                f"need their range and digits), got {value.dtype}; convert with "
                f"{name}.double()"
            )
    x, y = check_rows(x, y)
    if y.numel() and not bool((y != 0).any()):
        # Targets without variation carry no signal and no noise to measure: the evidence
        # grows without bound as the outputscale and the noise shrink to zero together, so
        # the scales chosen by it do not exist.
        raise ValueError(
            f"{caller}: y must not be zero in every entry, got {y.shape[0]} "
            f"row{'s' * (y.shape[0] != 1)} of zeros "
            "(centred constant targets): the evidence that chooses the outputscale and the "
            "noise has no maximum (it grows without bound as both shrink to zero); a constant "
            "target's model is its mean, with nothing left to fit"
        )
    return x.detach(), y.detach()



def check_class_targets(x: Any, targets: Any, noise: Any) -> tuple:
    """The inputs ``x`` ``(N, d)`` (non-empty) of a Dirichlet classifier's ``C`` regressions,
    their targets ``(N, C)`` and their positive noise variances ``(N, C)``.

    Example:
        >>> x, t, s = check_class_targets(torch.zeros(4, 2), torch.zeros(4, 3), torch.ones(4, 3))
        >>> check_class_targets(x, t, torch.ones(4, 2))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: targets and noise must have shape (N, C) with N = 4 rows of x, got ...
    """
    x = check_tensor("x", x, min_dim=2, max_dim=2, non_empty=True)
    targets = check_tensor("targets", targets, min_dim=2, max_dim=2)
    noise = check_tensor("noise", noise, min_dim=2, max_dim=2)
    if targets.shape[0] != x.shape[0] or noise.shape != targets.shape:
        raise ValueError(
            f"targets and noise must have shape (N, C) with N = {x.shape[0]} rows of x, got "
            f"targets {tuple(targets.shape)} and noise {tuple(noise.shape)}"
        )
    if not bool((noise > 0).all()):
        raise ValueError(f"noise must be positive, got minimum {float(noise.min()):.3g}")
    return x, targets, noise
