r"""TensorSRHT features through the compiled kernel, differentiable (prototype location).

The features are :math:`\phi_l = \prod_i a_{i,l}` with
:math:`a_{i,l} = c_i (H \operatorname{diag}(s_{i,b(l)}) \tilde x)_{\pi_i(l)}` of the homogenised
input :math:`\tilde x = [x / \ell, \sqrt b, 0, \dots]`. Each :math:`a_i` is linear in
:math:`\tilde x` and :math:`H` is symmetric, so for an incoming gradient :math:`g`

.. math::
    \bar{\tilde x} = \sum_{i, b} c_i \operatorname{diag}(s_{i,b})\, H\,
        P_{\pi_{i,b}}^\top \big(g \odot \overline{\textstyle\prod_{j \ne i} a_j}\big),

(real part of the signs times the transform of the real part, plus imaginary times imaginary,
for complex signs), and through :math:`\tilde x`:
:math:`\bar x_{nj} = \bar{\tilde x}_{nj} / \ell_j`,
:math:`\bar\ell_j = -\sum_n \bar{\tilde x}_{nj} x_{nj} / \ell_j^2` (summed over ``j`` for one
shared lengthscale), :math:`\overline{\sqrt b} = \sum_n \bar{\tilde x}_{n,d}`.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from rfgp.kernels import _srht_numba, tensorsrht_grad


class CompiledTensorSRHT(torch.autograd.Function):
    """Autograd function: forward and backward both through the compiled kernels."""

    @staticmethod
    def forward(ctx, x: Tensor, scale: Optional[Tensor], root: Optional[Tensor],
                signs: Tensor, indices: Tensor, complex: bool) -> Tensor:
        out = _srht_numba.tensorsrht(x, signs, indices, complex, scale, root)
        if out is None:
            raise RuntimeError("the compiled TensorSRHT kernel is unavailable")
        ctx.complex = complex
        ctx.has_scale = scale is not None
        ctx.has_root = root is not None
        ctx.save_for_backward(x, scale if scale is not None else x.new_empty(0),
                              root if root is not None else x.new_empty(0), signs, indices)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):
        x, scale, root, signs, indices = ctx.saved_tensors
        scale = scale if ctx.has_scale else None
        root = root if ctx.has_root else None
        need_x, need_scale, need_root = ctx.needs_input_grad[:3]
        if not (need_x or need_scale or need_root):
            return None, None, None, None, None, None
        d = x.shape[-1]
        z_bar = tensorsrht_grad.input_gradient(x, signs, indices, ctx.complex, grad, scale, root)
        x_bar = scale_bar = root_bar = None
        zx = z_bar[:, :d]
        if need_x:
            x_bar = zx if scale is None else zx / scale.reshape(-1)
        if need_scale:
            s = scale.reshape(-1)
            per_column = -(zx * x).sum(0) / s.square() if s.numel() == d else None
            if per_column is None:  # one shared lengthscale: x / l
                per_column = -(zx * x).sum().reshape(1) / s.square()
            scale_bar = per_column.reshape(scale.shape)
        if need_root:
            root_bar = z_bar[:, d].sum().reshape(root.shape)
        return x_bar, scale_bar, root_bar, None, None, None


def compiled_tensorsrht(x: Tensor, signs: Tensor, indices: Tensor, complex: bool,
                        scale: Optional[Tensor] = None, root: Optional[Tensor] = None) -> Tensor:
    """Differentiable compiled TensorSRHT features ``(N, D)`` of ``[x / scale, root]``."""
    return CompiledTensorSRHT.apply(x, scale, root, signs, indices, complex)
