"""Old names that keep working after a name moved to a new module or was renamed.

A module whose names moved defines ``__getattr__ = moved_names(__name__, {...})``: reading a
moved name from it returns the object from its new home and emits a ``DeprecationWarning`` that
names the new import path. A renamed method keeps its old name as
``old = renamed_method("old", "new")`` in the class body.
"""

from __future__ import annotations

import functools
import importlib
import warnings
from typing import Any, Callable, Dict, Optional

__all__ = ["moved_names", "renamed_method"]


def moved_names(
    old_module: str, new_homes: Dict[str, str], renamed: Optional[Dict[str, str]] = None
) -> Callable[[str], Any]:
    """A module ``__getattr__`` that forwards moved names to their new modules with a warning.

    Args:
        old_module: the module the names used to live in (its ``__name__``).
        new_homes: ``{old name: new module path}`` for every moved name.
        renamed: ``{old name: new name}`` for names that also changed (default: unchanged).

    Returns:
        the function to assign to the old module's ``__getattr__``.

    Example:
        >>> getattr_ = moved_names("old.place", {"root": "math"}, renamed={"root": "sqrt"})
        >>> import warnings
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     f = getattr_("root")
        >>> f(4.0), caught[0].category.__name__, str(caught[0].message)
        (2.0, 'DeprecationWarning', 'old.place.root is deprecated: use math.sqrt instead')
    """
    renamed = dict(renamed or {})

    def __getattr__(name: str) -> Any:
        if name not in new_homes:
            raise AttributeError(f"module {old_module!r} has no attribute {name!r}")
        new_module, new_name = new_homes[name], renamed.get(name, name)
        warnings.warn(
            f"{old_module}.{name} is deprecated: use {new_module}.{new_name} instead",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(new_module), new_name)

    return __getattr__


def renamed_method(old_name: str, new_name: str) -> Callable[..., Any]:
    """A method ``old_name`` that warns and calls the method ``new_name`` of the same object.

    Example:
        >>> class Kernel:
        ...     def exact_matrix(self, x):
        ...         return 2 * x
        ...     exact = renamed_method("exact", "exact_matrix")
        >>> import warnings
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("ignore")
        ...     Kernel().exact(3)
        6
    """

    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        warnings.warn(
            f"{type(self).__name__}.{old_name} is deprecated: use {new_name} instead",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(self, new_name)(*args, **kwargs)

    method.__name__ = old_name
    method.__doc__ = f"Deprecated alias of :meth:`{new_name}`."
    return functools.wraps(method)(method)
