"""The random weights of a random-feature kernel: their draw, the lazy first draw with the
constructor's ``seed``, ``resample``, and their record in the ``state_dict``, refused when it was
saved for other settings.

Internal: not part of the public API (see :mod:`rfgp.kernels`).
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple, TypeVar

import torch
from torch import Tensor

from rfgp._ops import make_generator
from rfgp.kernels._checkpoint import checkpoint_state, load_checkpoint

__all__ = ["RandomWeights"]

#: the kernel itself (``resample`` returns it)
K = TypeVar("K", bound="RandomWeights")


class RandomWeights:
    """Mixin of :class:`~rfgp.kernels.RandomFeatureKernel`: the lifecycle of its random weights
    (it provides ``_sample_weights``, ``input_dim``, ``seed``, ``num_features``, ``is_complex``
    and ``check_hyperparameters``)."""

    # ------------------------------------------------------------------ random weights
    @property
    def weights_initialized(self) -> bool:
        """Whether the random weights have been drawn (they are drawn at the first call)."""
        return bool(self._random_buffer_names)

    @property
    def random_weight_names(self) -> Tuple[str, ...]:
        """Names of the buffers holding the random weights (empty before they are drawn)."""
        return tuple(self._random_buffer_names)

    def resample(self: K, generator: Optional[torch.Generator] = None) -> K:
        """Draw fresh random weights in place and return ``self``.

        Args:
            generator: a ``torch.Generator``; the same generator state gives the same weights.
                ``None`` uses the global RNG.

        Raises:
            RuntimeError: if the input dimension is not known yet (pass ``input_dim`` or call
                the kernel once).
        """
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(
                f"generator must be a torch.Generator or None, got {type(generator).__name__}"
            )
        if self.input_dim is None:
            raise RuntimeError(
                f"{type(self).__name__}.resample: the input dimension is unknown; pass "
                "input_dim= to the constructor or evaluate the kernel once first"
            )
        self._set_weights(self._sample_weights(self.input_dim, generator))
        return self

    def weight_settings(self) -> Dict[str, Any]:
        """The settings that fix the meaning and layout of the random weights.

        Saved with ``state_dict`` (in its ``"_extra_state"`` entry) and compared when a
        checkpoint is loaded: weights drawn for other settings (another ``num_features``,
        degree, allocation, ...) are refused instead of being silently reinterpreted.
        Subclasses add their settings.
        """
        return {"kernel": type(self).__name__, "num_features": self.num_features,
                "is_complex": bool(self.is_complex)}

    def _set_weights(self, weights: Dict[str, Tensor]) -> None:
        # Every draw (the first use, resample, a new allocation) checks the hyperparameters:
        # features from a zero, infinite or NaN lengthscale would be NaN. Later calls do not
        # (an optimiser that overshoots sees the non-finite loss and steps back).
        self.check_hyperparameters()
        self._draw_batch_shape, self._pending_batch_ops = None, []
        self._incomplete_weights: list[str] = []
        ref = self._reference_tensor()
        for name, value in weights.items():
            if value.is_floating_point():
                value = value.to(device=ref.device, dtype=ref.dtype)
            else:
                value = value.to(device=ref.device)
            if name in self._buffers:
                self._buffers[name] = value
            else:
                self.register_buffer(name, value)
                self._random_buffer_names.append(name)

    def _reference_tensor(self) -> Tensor:
        for p in self.parameters():
            return p
        return self._dtype_anchor

    def ensure_weights(self, x: Tensor) -> None:
        """Fix the input dimension from ``x`` (inputs after ``active_dims``) and draw the
        random weights if they are not drawn yet (with the constructor's ``seed``).

        Raises:
            ValueError: if ``x`` has a different number of columns than the kernel's
                ``input_dim``.
        """
        d = x.shape[-1]
        if self.input_dim is None:
            self.input_dim = int(d)
        elif d != self.input_dim:
            raise ValueError(
                f"{type(self).__name__}: x must have {self.input_dim} input columns "
                f"(after active_dims), got {d}"
            )
        if not self.weights_initialized:
            self._draw_initial_weights(make_generator(self.seed))
        elif getattr(self, "_incomplete_weights", None):
            raise RuntimeError(
                f"{type(self).__name__}: the random weights {self._incomplete_weights} were "
                "missing from the state_dict loaded with strict=False, so the loaded ones "
                "cannot be used; load a complete checkpoint or call resample()"
            )

    def _expected_weight_shapes(self, input_dim: int) -> Dict[str, torch.Size]:
        """Names and shapes of the random weights for input dimension ``input_dim``.

        By default from a throwaway draw (cheap: the weights are small); subclasses whose
        layout depends on state (the Maclaurin degree counts) override it.
        """
        weights = self._sample_replaying_batch_ops(input_dim, torch.Generator().manual_seed(0))
        return {name: value.shape for name, value in weights.items()}

    # ------------------------------------------------------------------ checkpoints
    def get_extra_state(self) -> Dict[str, Any]:
        """The record of the random weights saved with ``state_dict`` (names, input
        dimension, :meth:`weight_settings`)."""
        return checkpoint_state(self)

    def set_extra_state(self, state: Any) -> None:
        # Read by _load_from_state_dict before the tensors load (the weights' buffers must
        # exist first); torch calls this afterwards, with nothing left to do.
        pass

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        load_checkpoint(self, state_dict, prefix, local_metadata, strict, missing_keys,
                        unexpected_keys, error_msgs, super()._load_from_state_dict)
