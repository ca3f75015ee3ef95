r"""Posterior sample paths: functions drawn once, evaluable (and differentiable) anywhere.

A weight-space draw :math:`w = \mu_w + L^{-H} z` (:math:`B = L L^H`) is a whole function
:math:`f(x) = \mathrm{Re}\{\Phi(x)^\top w\}`, with the posterior mean and covariance. A
:class:`SamplePaths` keeps its own copy of the kernel next to the drawn weights, so it stays a
draw of the posterior it came from whatever later happens to the model's kernel, moves with
``.to()`` and is saved with ``torch.save`` (or ``state_dict``).
"""

from __future__ import annotations

import copy
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np
import torch
from gpytorch.kernels import Kernel
from torch import Tensor

from rfgp._data import array_row_chunks
from rfgp._validation import check_int
from rfgp.inference._feature_map import FeatureMap
from rfgp.inference._noise import NoiseLayout
from rfgp.inference._prior_mean import add_mean_rows
from rfgp.kernels._base import real_form

__all__ = ["SamplePaths"]


class SamplePaths(torch.nn.Module):
    r"""``S`` posterior functions :math:`f_s(x) = \mathrm{Re}\{\Phi(x)^\top w_s\}`.

    Made by :meth:`rfgp.RandomFeatureGP.sample_functions`. Calling it evaluates every path at
    ``x``; the values are differentiable with respect to ``x`` (Thompson sampling maximises a
    path by gradient ascent).

    Args:
        kernel: the kernel module (copied: the paths own their features).
        draws: ``(columns, w)`` per group of outputs, ``w`` of shape ``(W, S, Tg)``.
        layout: the outputs' layout (shapes the values).
        complex_solve: whether ``w`` multiplies the complex features (else the real form).
        prior_mean: the model's constant prior mean, added to every path (``None``: zero).

    Example:
        >>> from rfgp import RandomFeatureGP
        >>> from rfgp.kernels import FourierFeatureKernel
        >>> x = torch.rand(50, 2, dtype=torch.float64)
        >>> gp = RandomFeatureGP(FourierFeatureKernel(32, seed=0).double(), noise=0.1)
        >>> paths = gp.fit(x, x.sum(-1)).sample_functions(4)
        >>> paths(x[:3]).shape, paths.num_samples
        (torch.Size([4, 3]), 4)
    """

    def __init__(
        self,
        kernel: Kernel,
        draws: Sequence[Tuple[List[int], Tensor]],
        layout: NoiseLayout,
        complex_solve: bool,
        prior_mean: Optional[Tensor] = None,
    ) -> None:
        super().__init__()
        self.kernel = copy.deepcopy(kernel)
        self.columns = [list(cols) for cols, _ in draws]
        # Complex weights are kept as (..., 2) real tensors: Module.to(dtype) would drop the
        # imaginary part of a complex buffer.
        self.complex_weights = bool(draws[0][1].is_complex())
        for index, (_, w) in enumerate(draws):
            w = w.detach().clone()
            self.register_buffer(f"weights_{index}", torch.view_as_real(w) if w.is_complex() else w)
        self.num_samples = int(draws[0][1].shape[1])
        self.num_columns = layout.num_columns
        self.y_ndim = layout.y_ndim
        self.outputs_per_input = layout.outputs_per_input
        self.complex_solve = complex_solve
        mean = torch.zeros((), dtype=torch.float64) if prior_mean is None else prior_mean
        self.register_buffer("prior_mean", mean.detach().clone())

    def weights(self, index: int) -> Tensor:
        """The drawn weights ``(W, S, Tg)`` of group ``index``."""
        w = getattr(self, f"weights_{index}")
        return torch.view_as_complex(w.contiguous()) if self.complex_weights else w

    def forward(self, x: Any, chunk_size: int = 65536) -> Tensor:
        """Values at ``x (M, d)``: ``(S, M)``, or ``(S, M, T)`` / ``(S, M, p)`` for several
        outputs. A query in another dtype is cast to the paths' dtype; a numpy array or
        memory-map is read ``chunk_size`` rows at a time (memory ``O(chunk * D)`` beside the
        ``S M`` values; a NaN names its row), a tensor is evaluated whole."""
        fmap = FeatureMap(self.kernel)
        dtype = self.weights(0).real.dtype
        if isinstance(x, np.ndarray):
            chunk_size = check_int("chunk_size", chunk_size)
            with torch.no_grad():
                out = torch.cat([self._evaluate(fmap, fmap.check_input(chunk).to(dtype))
                                 for chunk in array_row_chunks(x, chunk_size, "x")], 1)
        else:
            x = fmap.check_input(x).to(dtype=dtype)
            # Gradients flow to x only when asked for (the kernel's parameters need none).
            with torch.set_grad_enabled(torch.is_grad_enabled() and x.requires_grad):
                out = self._evaluate(fmap, x)
        layout = NoiseLayout(self.num_columns, self.y_ndim, self.outputs_per_input, False)
        return layout.shape_output(out)

    def _evaluate(self, fmap: FeatureMap, x: Tensor) -> Tensor:
        """``(S, M, T)`` values at checked inputs."""
        rows = fmap.rows(x)
        feats = rows if self.complex_solve else real_form(rows)
        out = feats.new_zeros(
            self.num_samples, feats.shape[0], self.num_columns, dtype=feats.real.dtype
        )
        for index, cols in enumerate(self.columns):
            w = self.weights(index)
            vals = (feats @ w.to(feats.dtype).reshape(w.shape[0], -1)).real  # (M, S Tg)
            vals = vals.reshape(feats.shape[0], self.num_samples, len(cols)).permute(1, 0, 2)
            out = out.index_copy(2, torch.tensor(cols, device=out.device), vals)
        # (absent from paths pickled before the prior mean existed)
        return add_mean_rows(out, getattr(self, "prior_mean", None), self.outputs_per_input)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # Paths saved before the prior mean existed had none: zero.
        state_dict.setdefault(prefix + "prior_mean", torch.zeros((), dtype=torch.float64))
        saved = state_dict[prefix + "prior_mean"]
        if isinstance(saved, Tensor) and saved.shape != self.prior_mean.shape:
            self._buffers["prior_mean"] = torch.empty_like(saved)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
