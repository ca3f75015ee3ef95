"""Snapshots of the tensors a fit depends on, so that a fitted object never silently disagrees
with its parameters.

A fit records :class:`StateSnapshot` of its kernel's parameters and buffers (and of any other
tensor it used, such as fixed noise); every later use compares the live values with the
snapshot and refuses to answer from a fit whose inputs have changed since.
"""

from __future__ import annotations

from typing import Dict, Mapping, Optional

import torch
from torch import Tensor

__all__ = ["StateSnapshot"]


class StateSnapshot:
    """Copies of a module's parameters and buffers (plus named extra tensors) at one moment.

    Args:
        module: the module whose ``state_dict`` is copied (parameters and buffers).
        extra: further named tensors the fit depends on.

    Example:
        >>> import gpytorch
        >>> kernel = gpytorch.kernels.RBFKernel()
        >>> snap = StateSnapshot(kernel)
        >>> snap.changed(kernel)
        []
        >>> kernel.lengthscale = 2.0
        >>> snap.changed(kernel)
        ['raw_lengthscale']
    """

    def __init__(self, module: torch.nn.Module, extra: Optional[Mapping[str, Tensor]] = None):
        self._values = self._collect(module, extra)

    @staticmethod
    def _collect(module: torch.nn.Module, extra: Optional[Mapping[str, Tensor]]
                 ) -> Dict[str, Tensor]:
        values = {name: value.detach().clone() for name, value in module.state_dict().items()
                  if isinstance(value, Tensor)}
        for name, value in (extra or {}).items():
            values[name] = value.detach().clone()
        return values

    def changed(self, module: torch.nn.Module, extra: Optional[Mapping[str, Tensor]] = None
                ) -> list:
        """Names of the tensors that differ from the snapshot (added, removed or changed)."""
        live = {name: value for name, value in module.state_dict().items()
                if isinstance(value, Tensor)}
        live.update(extra or {})
        names = sorted(set(live) | set(self._values))
        return [
            name for name in names
            if name not in live or name not in self._values
            or live[name].shape != self._values[name].shape
            or live[name].dtype != self._values[name].dtype
            or not torch.equal(live[name].detach().to(self._values[name].device),
                               self._values[name])
        ]
