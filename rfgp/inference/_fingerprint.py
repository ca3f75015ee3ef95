r"""What a fit depends on, recorded so that a fitted GP never silently disagrees with its kernel.

A :class:`Fingerprint` holds a copy of every parameter and buffer of a module tree (a
``ScaleKernel`` and the random-feature kernel inside it, allocations, components of composed
kernels: whatever ``named_parameters()`` and ``named_buffers()`` reach). Values are compared, not
version counters: GPyTorch's setters write through ``.data``, which does not move
``Tensor._version``. The tensors of a kernel are small next to a fit (``D x d`` weights against an
``N x D`` feature pass), so the copy and the comparison cost little.

Internal: not part of the public API (see :mod:`rfgp.inference`).
"""

from __future__ import annotations

from typing import Callable, Dict, List, Mapping, Optional

import torch
from torch import Tensor

__all__ = ["Fingerprint"]


def _same(recorded: Tensor, current: Tensor) -> bool:
    if recorded.shape != current.shape or recorded.dtype != current.dtype:
        return False
    if recorded.device != current.device:
        return False
    equal = recorded == current
    if recorded.is_floating_point() or recorded.is_complex():
        equal = equal | (torch.isnan(recorded) & torch.isnan(current))
    return bool(equal.all())


def _describe_change(name: str, recorded: Tensor, current: Tensor) -> str:
    if recorded.dtype != current.dtype:
        return f"{name} (dtype {recorded.dtype} -> {current.dtype})"
    if recorded.device != current.device:
        return f"{name} (device {recorded.device} -> {current.device})"
    if recorded.shape != current.shape:
        return f"{name} (shape {tuple(recorded.shape)} -> {tuple(current.shape)})"
    return f"{name} (values)"


def _named_tensors(
    module: torch.nn.Module, extra: Optional[Mapping[str, Tensor]]
) -> Dict[str, Tensor]:
    named = dict(module.named_parameters())
    named.update(module.named_buffers())
    for name, value in (extra or {}).items():
        named[name] = value
    return named


class Fingerprint:
    """Copies of the named parameters and buffers of a module tree, plus any further named
    tensors a fit depends on (``extra``: a fixed noise, the training inputs).

    Args:
        tensors: the recorded copies by name (use :meth:`of` to build one).

    Example:
        >>> lin = torch.nn.Linear(2, 1)
        >>> fp = Fingerprint.of(lin)
        >>> with torch.no_grad():
        ...     _ = lin.bias.data.fill_(3.0)
        >>> fp.changes(lin)
        ['bias (values)']
        >>> noise = torch.ones(3)
        >>> fp = Fingerprint.of(lin, extra={"noise": noise})
        >>> fp.changes(lin, extra={"noise": 2 * noise})
        ['noise (values)']
    """

    def __init__(self, tensors: Dict[str, Tensor]) -> None:
        self.tensors = tensors

    @classmethod
    def of(
        cls, module: torch.nn.Module, extra: Optional[Mapping[str, Tensor]] = None
    ) -> Fingerprint:
        """Record ``module``'s parameters and buffers and the ``extra`` tensors."""
        named = _named_tensors(module, extra)
        return cls({name: t.detach().clone() for name, t in named.items()})

    def changes(
        self, module: torch.nn.Module, extra: Optional[Mapping[str, Tensor]] = None
    ) -> List[str]:
        """What differs between the recorded values and ``module`` (and ``extra``) now; empty
        when nothing did."""
        named = _named_tensors(module, extra)
        changed = [f"{name} (added)" for name in named if name not in self.tensors]
        changed += [f"{name} (removed)" for name in self.tensors if name not in named]
        for name, recorded in self.tensors.items():
            current = named.get(name)
            if current is not None and not _same(recorded, current.detach()):
                changed.append(_describe_change(name, recorded, current))
        return changed

    def apply(self, fn: Callable[[Tensor], Tensor]) -> None:
        """Move the copies as ``Module._apply`` moves the module (``.to()``, ``.double()``)."""
        self.tensors = {name: fn(t) for name, t in self.tensors.items()}
