r"""Declared parameter constraints, checked by one function at the public edge.

An entry point declares what each of its arguments may be, as scikit-learn's
``_parameter_constraints`` does: a table ``{argument name: [constraint, ...]}`` whose
constraints are an :class:`Interval` of integers or reals, a set of :class:`Options`, an
:class:`InstanceOf` one or more types, :data:`BOOLEAN`, or ``None``. A value is valid if it
satisfies any one of its argument's constraints; :func:`validate_parameters` checks every
argument against the table and returns the values in their canonical Python types (``int``,
``float``, ``bool``), or raises for the first one that satisfies none:

* ``TypeError`` where the value is of no type any constraint takes (``2.0`` for an integer,
  ``"4"`` for a real number, ``1`` for a bool),
* ``ValueError`` where its type is right and its value is not (``0`` for a positive integer,
  NaN for a real, ``"srht"`` for one of the options),

with one message: ``"<name> must be <every constraint, in the table's order>, got <value>"``
(``"(<type>)"`` appended for a ``TypeError``). The helpers behind an entry point trust the
values it hands them.

Example:
    >>> table = {"num_features": [Interval(Integral, 1, None), None],
    ...          "solve": [Options(("weight", "cg"))]}
    >>> validate_parameters(table, {"num_features": 64, "solve": "cg"})
    {'num_features': 64, 'solve': 'cg'}
    >>> validate_parameters(table, {"num_features": 2.0, "solve": "cg"})
    Traceback (most recent call last):
    ...
    TypeError: num_features must be a positive integer or None, got 2.0 (float)
    >>> validate_parameters(table, {"num_features": 64, "solve": "lu"})
    Traceback (most recent call last):
    ...
    ValueError: solve must be one of ['weight', 'cg'], got 'lu'
"""

from __future__ import annotations

import math
from numbers import Integral, Real
from typing import Any, Collection, Dict, Mapping, Optional, Sequence, Tuple, Type, Union

import numpy as np
from torch import Tensor

from rfgp._validation._scalars import MAX_COUNT, MAX_SEED, describe

__all__ = ["BOOLEAN", "Boolean", "Constraint", "InstanceOf", "Integral", "Interval", "Options",
           "Real", "describe_constraints", "validate_parameters"]

# Bounds written as the powers they are, not as 19- and 20-digit numbers.
_BOUND_NAMES = {MAX_COUNT: "2**62", MAX_SEED: "2**64 - 1"}


class Constraint:
    """One thing an argument may be: :meth:`takes_type` says whether the value is of a type it
    takes (else a ``TypeError``), :meth:`takes` whether it satisfies it, :meth:`canonical`
    turns a satisfying value into its Python type, and ``str()`` describes it for the message."""

    def takes_type(self, value: Any) -> bool:
        raise NotImplementedError

    def takes(self, value: Any) -> bool:
        return self.takes_type(value)

    def canonical(self, value: Any) -> Any:
        return value


class _NoneConstraint(Constraint):
    def takes_type(self, value: Any) -> bool:
        return value is None

    def __str__(self) -> str:
        return "None"


class Boolean(Constraint):
    """A ``bool`` (numpy's included): no other value is taken as a truth value."""

    def takes_type(self, value: Any) -> bool:
        return isinstance(value, (bool, np.bool_))

    def canonical(self, value: Any) -> bool:
        return bool(value)

    def __str__(self) -> str:
        return "a bool"


#: The constraint of a flag.
BOOLEAN = Boolean()


class Interval(Constraint):
    r"""An integer or a finite real number within bounds.

    Args:
        kind: :class:`numbers.Integral` (integers, not bools; ``2.0`` is not one) or
            :class:`numbers.Real` (finite reals, not bools; a 0-d real tensor counts).
        low, high: the bounds (``None``: unbounded on that side).
        closed: which bounds belong to the interval: ``"both"``, ``"left"``, ``"right"`` or
            ``"neither"``.
        exclude: values inside the bounds that are still refused.
        multiple_of: integers only: the values must be multiples of it.
        text: the description in messages, where the default does not say enough.

    Example:
        >>> str(Interval(Real, 0, None, closed="neither"))
        'a finite real number > 0'
        >>> Interval(Integral, 0, 10).takes(11)
        False
    """

    def __init__(self, kind: Type, low: Optional[float], high: Optional[float], *,
                 closed: str = "both", exclude: Collection[Any] = (), multiple_of: int = 1,
                 text: Optional[str] = None) -> None:
        if kind not in (Integral, Real):
            raise TypeError(f"kind must be numbers.Integral or numbers.Real, got {kind!r}")
        if closed not in ("both", "left", "right", "neither"):
            raise ValueError(
                f"closed must be 'both', 'left', 'right' or 'neither', got {closed!r}")
        self.kind, self.low, self.high, self.closed = kind, low, high, closed
        self.exclude, self.multiple_of, self.text = tuple(exclude), multiple_of, text

    def takes_type(self, value: Any) -> bool:
        if isinstance(value, Tensor) and value.dim() == 0 and not value.is_complex():
            value = value.item()
        return isinstance(value, self.kind) and not isinstance(value, (bool, np.bool_))

    def canonical(self, value: Any) -> Union[int, float]:
        if isinstance(value, Tensor):
            value = value.item()
        return int(value) if self.kind is Integral else float(value)

    def takes(self, value: Any) -> bool:
        if not self.takes_type(value):
            return False
        value = self.canonical(value)
        if isinstance(value, float) and not math.isfinite(value):
            return False
        left = self.closed in ("both", "left")
        right = self.closed in ("both", "right")
        if self.low is not None and (value < self.low or (value == self.low and not left)):
            return False
        if self.high is not None and (value > self.high or (value == self.high and not right)):
            return False
        if self.kind is Integral and value % self.multiple_of:
            return False
        return value not in self.exclude

    def __str__(self) -> str:
        if self.text is not None:
            return self.text
        low, high = (_BOUND_NAMES.get(bound, bound) for bound in (self.low, self.high))
        if self.kind is Integral:
            if self.low == 1 and self.high is None:
                return "a positive integer"
            if self.low == 1:
                return f"a positive integer of at most {high}"
            if self.high is None:
                return f"an integer >= {low}"
            return f"an integer in [{low}, {high}]"
        left = ">=" if self.closed in ("both", "left") else ">"
        right = "<=" if self.closed in ("both", "right") else "<"
        bounds = ([f"{left} {low}"] if self.low is not None else []) + (
            [f"{right} {high}"] if self.high is not None else [])
        return " ".join(["a finite real number"] + [" and ".join(bounds)] * bool(bounds))


class Options(Constraint):
    """One of a few values (compared by ``==``; ``None`` may be one of them).

    Example:
        >>> str(Options(("auto", "weight", "cg")))
        "one of ['auto', 'weight', 'cg']"
    """

    def __init__(self, values: Sequence[Any]) -> None:
        self.values = tuple(values)

    def takes_type(self, value: Any) -> bool:
        return True  # a value that is none of them is a wrong value, whatever its type

    def takes(self, value: Any) -> bool:
        if isinstance(value, (bool, np.bool_)):  # a bool equals 0 or 1 but is not a number
            return any(value is option for option in self.values)
        try:
            return any(value is option or bool(value == option) for option in self.values)
        except (TypeError, ValueError, RuntimeError):  # an array compared entry by entry
            return False

    def __str__(self) -> str:
        return f"one of {list(self.values)}"


class InstanceOf(Constraint):
    """An instance of ``types`` (a class or a tuple of classes).

    Example:
        >>> str(InstanceOf(dict))
        'a dict instance'
    """

    def __init__(self, types: Union[Type, Tuple[Type, ...]], text: Optional[str] = None) -> None:
        self.types = types
        names = [t.__name__ for t in (types if isinstance(types, tuple) else (types,))]
        self.text = text or f"a {' or '.join(names)} instance"

    def takes_type(self, value: Any) -> bool:
        return isinstance(value, self.types)

    def __str__(self) -> str:
        return self.text


_NONE = _NoneConstraint()


def _constraint(item: Any) -> Constraint:
    return _NONE if item is None else item


def describe_constraints(constraints: Sequence[Any]) -> str:
    """The constraints of one argument in words, in their order: ``"a, b or c"``.

    Example:
        >>> describe_constraints([Interval(Integral, 1, None), None])
        'a positive integer or None'
    """
    words = [str(_constraint(item)) for item in constraints]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]


def validate_parameters(table: Mapping[str, Sequence[Any]], values: Mapping[str, Any],
                        error: Optional[Type[Exception]] = None) -> Dict[str, Any]:
    """``values`` checked against ``table`` and returned in their canonical types.

    Args:
        table: argument name -> its constraints (any one of them is enough).
        values: argument name -> the value received; every name must be in ``table``.
        error: the exception class to raise instead of ``TypeError`` and ``ValueError`` (one
            that is both, such as the estimators' ``InvalidParameterError``).

    Returns:
        ``{name: value}``, each value as its satisfied constraint's Python type.

    Raises:
        TypeError: for a value of a type no constraint takes (module docstring).
        ValueError: for a value of a right type that satisfies no constraint.
        KeyError: for a name the table does not declare (a missing declaration, not bad
            input).
    """
    checked = {}
    for name, value in values.items():
        constraints = [_constraint(item) for item in table[name]]
        satisfied = next((c for c in constraints if c.takes(value)), None)
        if satisfied is not None:
            checked[name] = satisfied.canonical(value)
            continue
        expected = describe_constraints(table[name])
        if any(c.takes_type(value) for c in constraints):
            raise (error or ValueError)(f"{name} must be {expected}, got {describe(value)}")
        raise (error or TypeError)(
            f"{name} must be {expected}, got {describe(value)} ({type(value).__name__})")
    return checked
