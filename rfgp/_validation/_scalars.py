"""Scalar argument checks: integers, reals, bools, choices, dtypes, generators and seeds.

Each check names the argument, says what was expected and shows what was received, and returns
the value in its canonical Python type, so callers write ``num_features = check_int(
"num_features", num_features)`` once, at the boundary, and trust the value afterwards.

Wrong *types* raise ``TypeError``; values of the right type outside the allowed range raise
``ValueError``. Nothing is coerced silently: a ``bool`` is not an integer, a float ``2.0`` is not
an integer, and a NaN is never a valid real.

Example:
    >>> check_int("num_features", 64)
    64
    >>> check_int("num_features", 0)
    Traceback (most recent call last):
    ...
    ValueError: num_features must be an integer >= 1, got 0
    >>> check_choice("sampling", "iid", ("iid", "orthogonal"))
    'iid'
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Collection, Optional

import numpy as np
import torch
from torch import Tensor

__all__ = ["MAX_COUNT", "MAX_SEED", "check_bool", "check_choice", "check_dtype",
           "check_generator", "check_int", "check_positive", "check_real", "check_seed",
           "describe"]

#: The largest seed: a ``torch.Generator`` takes the integers 0 to 2**64 - 1.
MAX_SEED = 2**64 - 1
#: The most of anything counted (features, draws, samples): torch's sizes are int64, and a
#: larger count fails deep inside it ("Overflow when unpacking long long").
MAX_COUNT = 2**62


def describe(value: Any) -> str:
    """A short description of ``value`` for an error message: tensors by shape and dtype,
    everything else by ``repr`` (truncated).

    Example:
        >>> describe(torch.zeros(2, 3))
        'a tensor of shape (2, 3) and dtype torch.float32'
        >>> describe("abc")
        "'abc'"
    """
    if isinstance(value, Tensor):
        return f"a tensor of shape {tuple(value.shape)} and dtype {value.dtype}"
    if isinstance(value, np.ndarray):
        return f"an array of shape {value.shape} and dtype {value.dtype}"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def check_bool(name: str, value: Any) -> bool:
    """Return ``value`` if it is a ``bool`` (numpy's included); raise ``TypeError`` otherwise.

    Example:
        >>> check_bool("complex", True)
        True
        >>> check_bool("complex", 1)
        Traceback (most recent call last):
        ...
        TypeError: complex must be a bool, got int 1
    """
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")


def check_int(
    name: str, value: Any, minimum: Optional[int] = 1, maximum: Optional[int] = None
) -> int:
    """Return ``value`` as an ``int`` if it is an integer (not a bool) in ``[minimum, maximum]``.

    Args:
        name: the argument's name, for the message.
        value: what the caller passed; Python and numpy integers are accepted.
        minimum: smallest allowed value (``None``: no lower bound).
        maximum: largest allowed value (``None``: no upper bound).

    Raises:
        TypeError: if ``value`` is not an integer (floats such as ``2.0`` included).
        ValueError: if it lies outside the bounds.

    Example:
        >>> check_int("degree", 3, minimum=0)
        3
        >>> check_int("degree", 2.0)
        Traceback (most recent call last):
        ...
        TypeError: degree must be an integer, got float 2.0
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r}")
    value = int(value)
    if minimum is not None and value < minimum:
        if maximum is None:
            raise ValueError(f"{name} must be an integer >= {minimum}, got {value}")
        raise ValueError(f"{name} must be an integer in [{minimum}, {maximum}], got {value}")
    if maximum is not None and value > maximum:
        if minimum is None:
            raise ValueError(f"{name} must be an integer <= {maximum}, got {value}")
        raise ValueError(f"{name} must be an integer in [{minimum}, {maximum}], got {value}")
    return value


def check_real(
    name: str,
    value: Any,
    *,
    low: Optional[float] = None,
    high: Optional[float] = None,
    low_inclusive: bool = True,
    high_inclusive: bool = True,
    allow_inf: bool = False,
) -> float:
    """Return ``value`` as a ``float`` if it is a real number (not a bool) within the bounds.

    A 0-d real tensor or numpy scalar is accepted. NaN is always rejected; infinities unless
    ``allow_inf``.

    Args:
        name: the argument's name, for the message.
        value: what the caller passed.
        low, high: bounds (``None``: unbounded on that side).
        low_inclusive, high_inclusive: whether each bound itself is allowed.
        allow_inf: whether ``±inf`` passes (subject to the bounds).

    Example:
        >>> check_real("jitter", 1e-6, low=0.0)
        1e-06
        >>> check_real("jitter", float("nan"), low=0.0)
        Traceback (most recent call last):
        ...
        ValueError: jitter must be a finite real number >= 0.0, got nan
    """
    if isinstance(value, Tensor) and value.dim() == 0 and not value.is_complex():
        value = value.item()
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}")
    value = float(value)
    bounds = []
    if low is not None:
        bounds.append(f"{'>=' if low_inclusive else '>'} {low}")
    if high is not None:
        bounds.append(f"{'<=' if high_inclusive else '<'} {high}")
    expected = ("a finite real number" if not allow_inf else "a real number") + (
        " " + " and ".join(bounds) if bounds else ""
    )
    bad = math.isnan(value) or (math.isinf(value) and not allow_inf)
    if low is not None:
        bad = bad or value < low or (value == low and not low_inclusive)
    if high is not None:
        bad = bad or value > high or (value == high and not high_inclusive)
    if bad:
        raise ValueError(f"{name} must be {expected}, got {value!r}")
    return value


def check_positive(name: str, value: Any) -> float:
    """Return ``value`` as a ``float`` if it is a finite real number ``> 0``.

    Example:
        >>> check_positive("lengthscale", 0.5)
        0.5
        >>> check_positive("lengthscale", 0)
        Traceback (most recent call last):
        ...
        ValueError: lengthscale must be a finite real number > 0.0, got 0.0
    """
    return check_real(name, value, low=0.0, low_inclusive=False)


def check_choice(name: str, value: Any, choices: Collection[Any]) -> Any:
    """Return ``value`` if it is one of ``choices``; raise ``ValueError`` listing them otherwise.

    Example:
        >>> check_choice("projection", "rademacher", ("gaussian", "rademacher"))
        'rademacher'
        >>> check_choice("projection", "srht", ("gaussian", "rademacher"))
        Traceback (most recent call last):
        ...
        ValueError: projection must be one of ['gaussian', 'rademacher'], got 'srht'
    """
    try:
        ok = value in choices
    except TypeError:  # an unhashable value against a set or dict
        ok = False
    if not ok:
        raise ValueError(f"{name} must be one of {list(choices)}, got {describe(value)}")
    return value


def check_dtype(name: str, value: Any) -> torch.dtype:
    """Return a floating ``torch.dtype`` given as a dtype or its name (``"float32"``,
    ``"torch.float64"``); raise ``TypeError`` for anything else.

    Example:
        >>> check_dtype("dtype", "float32")
        torch.float32
        >>> check_dtype("dtype", torch.long)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        TypeError: dtype must be a floating torch dtype ... got torch.int64
    """
    dtype = value
    if isinstance(value, str):
        dtype = getattr(torch, value[len("torch."):] if value.startswith("torch.") else value,
                        None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(
            f"{name} must be a floating torch dtype (e.g. torch.float64 or 'float64'), "
            f"got {describe(value)}"
        )
    return dtype


def check_generator(name: str, value: Any) -> Optional[torch.Generator]:
    """Return ``value`` if it is ``None`` or a ``torch.Generator``; raise ``TypeError`` otherwise.

    An integer seed is refused too: a function that takes a generator draws from the caller's
    stream, and a seed would silently start a new one.

    Example:
        >>> check_generator("generator", None) is None
        True
        >>> check_generator("generator", "x")
        Traceback (most recent call last):
        ...
        TypeError: generator must be a torch.Generator or None, got str 'x'
    """
    if value is None or isinstance(value, torch.Generator):
        return value
    raise TypeError(
        f"{name} must be a torch.Generator or None, got {type(value).__name__} {describe(value)}"
    )


def check_seed(name: str, value: Any) -> int:
    """Return the seed ``value`` as an ``int``: the one rule of every seed the recipes, the
    calibrated fit and the estimators take, an integer (not a bool) in ``[0, 2**64 - 1]``,
    the seeds of a ``torch.Generator``.

    Raises:
        TypeError: for anything but an integer.
        ValueError: for an integer outside the range.

    Example:
        >>> check_seed("seed", 2**40)
        1099511627776
        >>> check_seed("seed", -1)
        Traceback (most recent call last):
        ...
        ValueError: seed must be an integer in [0, 2**64 - 1] (a torch.Generator's seeds), got -1
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(
            f"{name} must be an integer in [0, 2**64 - 1] (a torch.Generator's seeds), got "
            f"{type(value).__name__} {describe(value)}"
        )
    value = int(value)
    if not 0 <= value <= MAX_SEED:
        raise ValueError(
            f"{name} must be an integer in [0, 2**64 - 1] (a torch.Generator's seeds), got "
            f"{value}"
        )
    return value
