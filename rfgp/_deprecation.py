"""Old import paths that keep working after a name moved to a new module.

A module whose names moved defines ``__getattr__ = moved_names(__name__, {...})``: reading a
moved name from it returns the object from its new home and emits a ``DeprecationWarning`` that
names the new import path.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any, Callable, Dict

__all__ = ["moved_names"]


def moved_names(old_module: str, new_homes: Dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` that forwards moved names to their new modules with a warning.

    Args:
        old_module: the module the names used to live in (its ``__name__``).
        new_homes: ``{name: new module path}`` for every moved name.

    Returns:
        the function to assign to the old module's ``__getattr__``.

    Example:
        >>> getattr_ = moved_names("old.place", {"sqrt": "math"})
        >>> import warnings
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     f = getattr_("sqrt")
        >>> f(4.0), caught[0].category.__name__
        (2.0, 'DeprecationWarning')
    """

    def __getattr__(name: str) -> Any:
        if name not in new_homes:
            raise AttributeError(f"module {old_module!r} has no attribute {name!r}")
        new_module = new_homes[name]
        warnings.warn(
            f"{old_module}.{name} has moved: import it from {new_module} instead",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(new_module), name)

    return __getattr__
