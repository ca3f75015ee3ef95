r"""Reading a fitted model's checkpoint record with every entry checked and named.

A ``RandomFeatureGP``'s ``state_dict`` carries its fit as a nested dictionary of tensors and
plain values (its ``"_extra_state"`` entry). A hand-edited or truncated one must not fail deep
inside a solver with a ``KeyError`` or a torch error: :class:`CheckpointRecord` reads each
entry by its expected kind and, when it is missing or of another kind, raises naming its full
path (``'_extra_state'['solver']['data'][0][1]``), what it should hold and what it holds.

Example:
    >>> record = CheckpointRecord({"solver": {"chunk": "64"}}, "'_extra_state'")
    >>> record.record("solver").integer("chunk")
    Traceback (most recent call last):
    ...
    TypeError: checkpoint entry '_extra_state'['solver']['chunk'] must be an integer, got str '64'
    >>> try:
    ...     record.record("layout")
    ... except ValueError as err:
    ...     print(str(err)[:60])
    checkpoint entry '_extra_state'['layout'] is missing (a dict

Internal: not part of the public API (see :mod:`rfgp.inference`).
"""

from __future__ import annotations

import math
from typing import Any, Collection, List, Mapping, Optional

import torch
from torch import Tensor

from rfgp._validation import describe

__all__ = ["CheckpointRecord"]

_MISSING = object()


class CheckpointRecord:
    """A checkpoint's (sub-)dictionary, read entry by entry with checks (see the module
    docstring).

    Args:
        values: the dictionary (anything else is refused, naming ``path``).
        path: how the dictionary is named in messages.
    """

    def __init__(self, values: Any, path: str) -> None:
        if not isinstance(values, Mapping):
            raise TypeError(f"checkpoint entry {path} must be a dict, got {_received(values)}")
        self.values = values
        self.path = path

    # ------------------------------------------------------------------ entries
    def entry(self, key: str, expected: str, default: Any = _MISSING) -> Any:
        """The raw value at ``key`` (``default`` where it is absent, else an error)."""
        if key in self.values:
            return self.values[key]
        if default is not _MISSING:
            return default
        raise ValueError(
            f"checkpoint entry {self.name(key)} is missing ({expected} was expected); the "
            "checkpoint was edited or truncated: save it again with state_dict()"
        )

    def name(self, key: Any) -> str:
        return f"{self.path}[{key!r}]"

    def fail(self, key: Any, expected: str, value: Any) -> TypeError:
        return TypeError(f"checkpoint entry {self.name(key)} must be {expected}, got "
                         f"{_received(value)}")

    def record(self, key: str) -> CheckpointRecord:
        return CheckpointRecord(self.entry(key, "a dict"), self.name(key))

    def items(self, key: str, length: Optional[int] = None) -> List[Any]:
        """A list or tuple entry (of ``length`` items, when given)."""
        value = self.entry(key, "a list")
        what = "a list" if length is None else f"a list of {length} items"
        if not isinstance(value, (list, tuple)) or (length is not None and len(value) != length):
            raise self.fail(key, what, value)
        return list(value)

    def sequence(self, key: str) -> CheckpointRecord:
        """A list entry as a record indexed by position (its items read like entries)."""
        values = self.items(key)
        return CheckpointRecord(dict(enumerate(values)), self.name(key))

    def __len__(self) -> int:
        return len(self.values)

    # ------------------------------------------------------------------ typed values
    def tensor(self, key: Any, optional: bool = False, ndim: Optional[int] = None,
               floating: bool = True) -> Optional[Tensor]:
        """A tensor entry (``None`` allowed with ``optional``), of ``ndim`` dimensions."""
        value = self.entry(key, "a tensor")
        if value is None and optional:
            return None
        kind = "a floating tensor" if floating else "a tensor"
        if ndim is not None:
            kind += f" of {ndim} dimensions"
        if optional:
            kind += " or None"
        if not isinstance(value, Tensor) or (
                floating and not (value.is_floating_point() or value.is_complex())):
            raise self.fail(key, kind, value)
        if ndim is not None and value.dim() != ndim:  # the right type, another shape
            raise ValueError(f"checkpoint entry {self.name(key)} must be {kind}, got "
                             f"{_received(value)}")
        return value

    def integer(self, key: Any, minimum: int = 0, optional: bool = False) -> Optional[int]:
        value = self.entry(key, "an integer")
        if value is None and optional:
            return None
        if isinstance(value, Tensor) and value.numel() == 1 and not value.is_floating_point():
            value = int(value)
        if not isinstance(value, int) or isinstance(value, bool):
            raise self.fail(key, "an integer", value)
        if value < minimum:
            raise ValueError(f"checkpoint entry {self.name(key)} must be an integer >= "
                             f"{minimum}, got {value}")
        return value

    def boolean(self, key: str, default: Any = _MISSING) -> bool:
        value = self.entry(key, "a bool", default)
        if not isinstance(value, bool):
            raise self.fail(key, "a bool", value)
        return value

    def positive(self, key: str) -> float:
        value = self.entry(key, "a positive number")
        if isinstance(value, Tensor) and value.numel() == 1:
            value = float(value)
        if (not isinstance(value, (int, float)) or isinstance(value, bool)
                or not math.isfinite(value) or value <= 0):
            raise self.fail(key, "a positive finite number", value)
        return float(value)

    def choice(self, key: str, choices: Collection[str]) -> str:
        value = self.entry(key, f"one of {sorted(choices)}")
        if not isinstance(value, str) or value not in choices:
            raise self.fail(key, f"one of {sorted(choices)}", value)
        return value

    def columns(self, key: Any) -> List[int]:
        """A list of output column indices."""
        value = self.entry(key, "a list of column indices")
        if not isinstance(value, (list, tuple)) or not value or not all(
                isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in value):
            raise self.fail(key, "a non-empty list of column indices (integers >= 0)", value)
        return list(value)

    def dtype(self, key: str) -> torch.dtype:
        value = self.entry(key, "a dtype name")
        dtype = getattr(torch, value, None) if isinstance(value, str) else None
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise self.fail(key, "a floating dtype's name ('float32', 'float64')", value)
        return dtype

    def device(self, key: str) -> torch.device:
        value = self.entry(key, "a device name")
        try:
            return torch.device(value)
        except (RuntimeError, TypeError):
            raise self.fail(key, "a device name ('cpu', 'cuda:0')", value) from None


def _received(value: Any) -> str:
    if isinstance(value, Tensor):
        return describe(value)
    return f"{type(value).__name__} {describe(value)}"
