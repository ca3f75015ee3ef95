r"""The one place where the solvers reach into a kernel: :class:`FeatureMap`.

A :class:`FeatureMap` wraps the kernel module a user passed (a
:class:`~rfgp.kernels.RandomFeatureKernel`, or a ``gpytorch.kernels.ScaleKernel`` around one)
and gives the solvers what they need of it: checked inputs, feature rows (outputscale applied,
``p`` outputs per input flattened to interleaved rows), the data-dependent allocation, the
variance correction, the random weights shared across processes, and a
:class:`~rfgp.inference._fingerprint.Fingerprint` of every parameter and buffer.

Kernels know nothing about solvers; solvers know kernels only through this adapter.

Internal: not part of the public API (see :mod:`rfgp.inference`).
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

import torch
from gpytorch.kernels import Kernel, ScaleKernel
from torch import Tensor

from rfgp._validation import check_tensor
from rfgp.inference._fingerprint import Fingerprint
from rfgp.kernels._base import RandomFeatureKernel, real_form, unwrap_scale_kernel

__all__ = ["FeatureMap", "resolve_feature_kernel"]


def resolve_feature_kernel(kernel: Kernel) -> Tuple[RandomFeatureKernel, Optional[ScaleKernel]]:
    """The random-feature kernel inside ``kernel`` and the ``ScaleKernel`` around it (if any).

    Raises:
        TypeError: if ``kernel`` is neither a random-feature kernel nor a ``ScaleKernel`` around
            one.
    """
    if not isinstance(kernel, Kernel):
        raise TypeError(f"kernel must be a gpytorch Kernel, got {type(kernel).__name__}")
    scale = kernel if isinstance(kernel, ScaleKernel) else None
    # Composed kernels (sums and products of random-feature kernels) arrive here already turned
    # into one ComposedFeatureKernel: RandomFeatureGP calls as_feature_kernel once, at
    # construction, so that the composition's random permutations are drawn once, belong to the
    # kernel module the fit fingerprints, and travel with the sample paths' copy of it.
    base = unwrap_scale_kernel(kernel)
    return base, scale


class FeatureMap:
    """The kernel as the solvers see it.

    Args:
        kernel: the module the user passed (kept as is: its whole module tree is fingerprinted).

    Example:
        >>> from rfgp.kernels import FourierFeatureKernel
        >>> fmap = FeatureMap(FourierFeatureKernel(16, seed=0))
        >>> fmap.rows(torch.zeros(3, 2)).shape
        torch.Size([3, 16])
    """

    def __init__(self, kernel: Kernel) -> None:
        self.module = kernel
        self.base, self.scale = resolve_feature_kernel(kernel)
        if len(self.base.batch_shape) or len(kernel.batch_shape):
            raise ValueError(
                f"kernel must have an empty batch_shape, got {tuple(kernel.batch_shape)}"
            )

    # ------------------------------------------------------------------ layout
    @property
    def num_features(self) -> int:
        """``D``: columns of the features (a complex column counts once)."""
        return int(self.base.num_features)

    @property
    def num_real_features(self) -> int:
        """Columns of the real form ``[Re Phi, Im Phi]``."""
        return int(self.base.num_real_features)

    @property
    def is_complex(self) -> bool:
        return bool(self.base.is_complex)

    @property
    def outputs_per_input(self) -> int:
        """``p``: outputs per input (1 for scalar kernels)."""
        return int(self.base.num_outputs_per_input())

    # ------------------------------------------------------------------ inputs and features
    def check_input(self, x: Any, name: str = "x") -> Tensor:
        """``x`` as a finite floating ``(N, d)`` tensor (1-D means ``d = 1``)."""
        x = self.base.check_input(x, name)
        if x.dim() != 2:
            raise ValueError(f"{name} must have shape (N, d), got {tuple(x.shape)}")
        return x

    def rows(self, x: Tensor) -> Tensor:
        """Feature rows at ``x``: ``(N p, D)``, interleaved, times ``sqrt(outputscale)``."""
        return self.scale_rows(self.base.features(x))

    def rows_into(self, x: Tensor, out: Tensor) -> Tensor:
        """:meth:`rows` without autograd, written into ``out`` where the kernel can.

        For passes that drop each chunk's features before the next: one buffer kept over the
        pass instead of a fresh ``N x D`` allocation per chunk. Complex and multi-output
        features take :meth:`rows`.

        Args:
            x: ``(N, d)`` inputs.
            out: real ``(N, D)`` buffer in the kernel's dtype, on ``x``'s device.

        Returns:
            ``(N, D)`` feature rows: ``out``, or a tensor of their own where the kernel has no
            way to write into a buffer.
        """
        if self.is_complex or self.outputs_per_input != 1 or x.shape[0] == 0:
            return self.rows(x)
        with torch.no_grad():
            phi = self.base._features_into(self.base.prepare_input(x), out)
            if self.scale is not None:
                scale = self.scale.outputscale.sqrt().to(phi.dtype)
                phi = phi.mul_(scale) if self.base._written_into(phi, out) else phi * scale
        return phi

    def scale_rows(self, phi: Tensor) -> Tensor:
        """Flatten ``(M, p, D)`` to interleaved rows and apply ``sqrt(outputscale)``."""
        if phi.dim() == 3:
            phi = phi.reshape(phi.shape[0] * phi.shape[1], phi.shape[2])
        if self.scale is not None:
            phi = phi * self.scale.outputscale.sqrt().to(phi.real.dtype)
        return phi

    def checked_rows(self, phi: Any,
                     correction: Optional[Any] = None) -> Tuple[Tensor, Optional[Tensor]]:
        """Features ``phi`` a caller computed, ``(M, D)`` (``(M, p, D)`` with ``p`` outputs per
        input) in the base kernel's layout, checked (a tensor of the kernel's kind, finite:
        a NaN row would give a NaN mean) and passed through :meth:`scale_rows`; and the
        optional variance ``correction``, checked to be finite with one value per row
        (``(M,)`` or ``(M p,)``), flattened."""
        phi = check_tensor("phi", phi, allow_complex=True)
        p, width = self.outputs_per_input, self.num_features
        ok_shape = (phi.dim() == 2 and p == 1) or (phi.dim() == 3 and phi.shape[1] == p)
        if not ok_shape or phi.shape[-1] != width:
            layout = f"(M, {p}, {width})" if p > 1 else f"(M, {width})"
            raise ValueError(f"phi must have shape {layout}, got {tuple(phi.shape)}")
        if phi.is_complex() != self.is_complex:
            raise TypeError(f"phi must be {'complex' if self.is_complex else 'real'} like the "
                            f"kernel's features, got {phi.dtype}")
        rows = self.scale_rows(phi)
        if correction is not None:
            correction = check_tensor("variance_correction", correction)
            if correction.numel() != rows.shape[0]:
                raise ValueError(
                    f"variance_correction must hold one value per row of phi ({rows.shape[0]}), "
                    f"got shape {tuple(correction.shape)}"
                )
            correction = correction.reshape(-1)
        return rows, correction

    def real_rows(self, x: Tensor) -> Tensor:
        """``real_form`` of :meth:`rows`."""
        return real_form(self.rows(x))

    def variance_correction(self, x: Tensor) -> Optional[Tensor]:
        """The kernel's variance correction at ``x`` times the outputscale, ``(N p,)``, or
        ``None`` for kernels without one."""
        if not self.base.has_variance_correction:
            return None
        corr = self.base.variance_correction(x)
        if self.scale is not None:
            corr = corr * self.scale.outputscale.to(corr.dtype)
        return corr.reshape(-1)

    # ------------------------------------------------------------------ allocation, weights
    @property
    def needs_allocation(self) -> bool:
        """Whether the kernel still needs a data-dependent allocation."""
        return bool(self.base.needs_allocation)

    def allocate(self, x: Tensor) -> None:
        self.base.allocate(x)

    def share_random_weights(self, x: Tensor, process_group: Any) -> None:
        """Give every process rank 0's random weights (they must define the same features)."""
        import torch.distributed as dist

        self.base.prepare_input(x[:1])  # draws the weights if they are not drawn yet
        src = 0 if process_group is None else dist.get_global_rank(process_group, 0)
        for name in self.base.random_weight_names:
            dist.broadcast(getattr(self.base, name), src=src, group=process_group)

    # ------------------------------------------------------------------ state
    def fingerprint(self) -> Fingerprint:
        """Values of every parameter and buffer of the kernel's module tree."""
        return Fingerprint.of(self.module)

    def reference(self) -> Tensor:
        """A floating tensor of the kernel: its dtype and device are the kernel's."""
        for tensor in list(self.module.parameters()) + list(self.module.buffers()):
            if tensor.is_floating_point():
                return tensor
        return torch.empty(0)
