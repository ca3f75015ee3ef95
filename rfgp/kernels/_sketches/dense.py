r"""Dense polynomial sketches: Gaussian and Rademacher projections (Kar & Karnick 2012).

:math:`\Phi(x)_l = D^{-1/2} \prod_{i=1}^p w_{i,l}^\top x`, all degrees in one GEMM.

Internal: not part of the public API (see :mod:`rfgp.kernels`).
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor

from rfgp._ops import complex_dtype
from rfgp.kernels._sketches.sampling import check_weight_columns, sketch_weight

__all__ = ["apply_dense"]

_DENSE_CHUNK_ELEMENTS = 1 << 23


def apply_dense(x: Tensor, weights, degree: int, is_complex: bool) -> Tensor:
    w = sketch_weight(weights, "projections", "gaussian/rademacher")
    d = w.shape[-4] if is_complex else w.shape[-3]
    check_weight_columns(x, d, "projections")
    if (w.shape[-3] if is_complex else w.shape[-2]) != degree:
        raise ValueError(
            f"degree={degree} does not match the sketch weights (projections of shape "
            f"{tuple(w.shape)})"
        )
    num_features = w.shape[-2] if is_complex else w.shape[-1]
    w = w.to(x.dtype)
    w = w.reshape(*w.shape[: -3 - is_complex], d, -1)

    def rows(xs: Tensor, out: Optional[Tensor] = None) -> Tensor:
        # One GEMM for all degrees (and real/imaginary parts): (..., n, d) @ (..., d, p D [2]).
        proj = xs @ w
        if is_complex:
            proj = proj.reshape(*proj.shape[:-1], degree, num_features, 2)
            proj = torch.view_as_complex(proj)
        else:
            proj = proj.reshape(*proj.shape[:-1], degree, num_features)
        return proj.prod(dim=-2) if out is None else torch.prod(proj, dim=-2, out=out)

    # Row chunks bound the (rows x p D) intermediate; GEMMs of >= 256 rows lose no speed.
    batch_shape = torch.broadcast_shapes(x.shape[:-2], w.shape[:-2])
    chunk = max(256, _DENSE_CHUNK_ELEMENTS // max(1, w.shape[-1] * math.prod(batch_shape)))
    if not (torch.is_grad_enabled() and (x.requires_grad or w.requires_grad)):
        # No autograd: each chunk's product goes straight into one result and is scaled there
        # (no concatenation and no separate scaling pass over the N x D features).
        n = x.shape[-2]
        dtype = complex_dtype(x.dtype) if is_complex else x.dtype
        out = torch.empty(*batch_shape, n, num_features, dtype=dtype, device=x.device)
        for s in range(0, n, chunk):
            part = out[..., s : s + chunk, :]
            rows(x[..., s : s + chunk, :], out=part)
            part.mul_(1.0 / math.sqrt(num_features))
        return out
    if x.shape[-2] <= chunk:
        out = rows(x)
    else:
        out = torch.cat(
            [rows(x[..., s : s + chunk, :]) for s in range(0, x.shape[-2], chunk)], dim=-2
        )
    return out / math.sqrt(num_features)
