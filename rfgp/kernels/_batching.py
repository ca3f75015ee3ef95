"""Batch shapes of random weights: ``expand_batch`` and ``kernel[index]`` on the weights a
kernel holds, or queued until it draws them, so that a batch member keeps the function of the
member it came from.

Internal: not part of the public API (see :mod:`rfgp.kernels`).
"""

from __future__ import annotations

import copy
from typing import Dict, Optional

import torch
from torch import Tensor

__all__ = ["BatchedWeights", "apply_batch_op"]


def apply_batch_op(op: tuple, value: Tensor) -> Tensor:
    # ("expand", new_batch_shape, old_batch_ndim) or ("index", index) on a weight tensor with
    # leading batch dimensions.
    if op[0] == "expand":
        _, shape, old_ndim = op
        return value.expand(*shape, *value.shape[old_ndim:]).contiguous()
    return value[op[1]].contiguous()


class BatchedWeights:
    """Mixin of :class:`~rfgp.kernels.RandomFeatureKernel`: batch operations on its random
    weights (it provides ``_sample_weights``, ``_set_weights``, ``weights_initialized``,
    ``_random_buffer_names`` and the batch-shape attributes)."""

    def _sample_replaying_batch_ops(
        self, input_dim: int, generator: Optional[torch.Generator]
    ) -> Dict[str, Tensor]:
        # The weights the kernel would hold had they been drawn before the queued
        # expand_batch / kernel[index] operations: drawn for the original batch shape, then
        # expanded or indexed as those operations did.
        current = self.batch_shape
        if self._pending_batch_ops:
            self._batch_shape = self._draw_batch_shape
        try:
            weights = self._sample_weights(input_dim, generator)
        finally:
            self._batch_shape = current
        for op in self._pending_batch_ops:
            weights = {name: apply_batch_op(op, value) for name, value in weights.items()}
        return weights

    def _draw_initial_weights(self, generator: Optional[torch.Generator]) -> None:
        self._set_weights(self._sample_replaying_batch_ops(self.input_dim, generator))

    def _batch_op(self, op: tuple, old_batch_shape: torch.Size) -> None:
        """Apply a batch expansion or index to the weights, or queue it until they are drawn."""
        if self.weights_initialized:
            for name in self._random_buffer_names:
                self._buffers[name] = apply_batch_op(op, self._buffers[name])
            return
        if not self._pending_batch_ops:
            self._draw_batch_shape = torch.Size(old_batch_shape)
        self._pending_batch_ops.append(op)

    def expand_batch(self, *sizes) -> BatchedWeights:
        """A copy with batch shape ``sizes`` (broadcast from the current one): parameters and
        random weights are expanded, so each new batch member repeats the function of the
        member it is broadcast from. Works before the weights are drawn, too."""
        if len(sizes) == 1 and not isinstance(sizes[0], int):
            new_batch_shape = torch.Size(sizes[0])
        elif all(isinstance(size, int) for size in sizes):
            new_batch_shape = torch.Size(sizes)
        else:
            raise TypeError(f"expand_batch takes a shape or integers, got {sizes!r}")
        old = self.batch_shape
        if new_batch_shape == old:
            return self
        try:
            if torch.broadcast_shapes(new_batch_shape, old) != new_batch_shape:
                raise RuntimeError
        except RuntimeError:
            raise ValueError(
                f"cannot expand a kernel with batch shape {tuple(old)} to {tuple(new_batch_shape)}"
            ) from None
        new_kernel = copy.deepcopy(self)
        new_kernel._batch_shape = new_batch_shape
        for name, param in self.named_parameters(recurse=False):
            shape = (*new_batch_shape, *param.shape[len(old):])
            getattr(new_kernel, name).data = param.data.expand(shape).contiguous()
        new_kernel._batch_op(("expand", tuple(new_batch_shape), len(old)), old)
        for sub_name, sub in self.named_sub_kernels():
            setattr(new_kernel, sub_name, sub.expand_batch(new_batch_shape))
        return new_kernel

    def __getitem__(self, index) -> BatchedWeights:
        if len(self.batch_shape) == 0:
            return self
        new_kernel = copy.deepcopy(self)
        index = index if isinstance(index, tuple) else (index,)
        # GPyTorch's semantics: index the leading batch dimensions of every parameter and
        # random weight; the new batch shape is that of any indexed batch-shaped tensor.
        new_batch_shape = torch.empty(self.batch_shape)[index].shape
        for name, param in self.named_parameters(recurse=False):
            getattr(new_kernel, name).data = param.data[index]
        new_kernel._batch_op(("index", index), self.batch_shape)
        new_kernel._batch_shape = torch.Size(new_batch_shape)
        for sub_name, sub in self.named_sub_kernels():
            setattr(new_kernel, sub_name, sub.__getitem__(index))
        return new_kernel
