r"""TensorSRHT (Algorithm 1 of Wacker, Kanagawa & Filippone 2022).

Inputs are zero-padded to :math:`d' = 2^k`; every block and degree has its own random signs
and permutation of the Walsh--Hadamard transform; the block's features are the product over
degrees. Three implementations give the same features for the same weights: a compiled
numba kernel (CPU, forward and backward; :mod:`rfgp.kernels._sketches._srht_numba`),
Kronecker-factored GEMMs (:class:`SrhtPlan`, unbatched weights) and a generic batched path.
"""

from __future__ import annotations

import math
from typing import Dict, Optional

import torch
from torch import Tensor

from rfgp._ops import complex_dtype, fwht, hadamard_matrix, next_power_of_two, pad_to_power_of_two
from rfgp.kernels._sketches import _srht_numba
from rfgp.kernels._sketches.sampling import sketch_weight

__all__ = ["SrhtPlan", "apply_tensorsrht"]

# Rows of the TensorSRHT work tensor (rows x degree x blocks x d') processed at once: large enough
# for efficient GEMMs in the Hadamard transform, small enough to stay cache-friendly.
_SRHT_CHUNK_ELEMENTS = 1 << 21
# The GEMM-based TensorSRHT path (_SrhtPlan): values of the stage-1 output of one row chunk and
# block group (sized to stay in the L2 cache; measured best at d' = 1024, p = 7), the fewest and
# most rows per chunk (more rows lengthen the gathers' contiguous runs; beyond that, whole
# blocks are grouped), and the largest d' it handles (its folded stage-1 matrix has
# d' * combinations * sqrt(d') entries).
_PLAN_CHUNK_ELEMENTS = 1 << 19
_PLAN_MIN_ROWS = 8
_PLAN_MAX_ROWS = 128
_PLAN_MAX_DIM = 1 << 12


def _take(values: Tensor, index: Tensor) -> Tensor:
    # values (..., N, L), index (*B, D): gather along the last dimension.
    if index.dim() == 1:
        return values.index_select(-1, index)
    index = index.unsqueeze(-2)
    shape = torch.broadcast_shapes(values.shape[:-1], index.shape[:-1])
    return torch.gather(
        values.expand(*shape, values.shape[-1]), -1, index.expand(*shape, index.shape[-1])
    )


def _srht_rows(x: Tensor, signs: Tensor, indices: Tensor, degree: int, is_complex: bool) -> Tensor:
    # x is already zero-padded to d'.
    # (..., N, 1, 1, d') * (*B, 1, p, K, d') -> (..., N, p, K, d'): all degrees and blocks at once.
    xs = x.unsqueeze(-2).unsqueeze(-2)
    if is_complex:
        s = signs.to(x.dtype).unsqueeze(-5)
        # Stack real and imaginary parts so that one real transform handles both.
        u = torch.stack(torch.broadcast_tensors(xs * s[..., 0], xs * s[..., 1]), dim=-3)
        t = fwht(u)  # (..., N, p, 2, K, d')
        t = torch.complex(t[..., 0, :, :], t[..., 1, :, :])
    else:
        t = fwht(xs * signs.to(x.dtype).unsqueeze(-4))
    t = t.reshape(*t.shape[:-2], -1)  # (..., N, p, K d')
    out = _take(t[..., 0, :], indices[..., 0, :])
    for i in range(1, degree):
        out = out * _take(t[..., i, :], indices[..., i, :])
    return out


class SrhtPlan:
    """TensorSRHT by Kronecker-factored GEMMs, fused per block group, for unbatched weights.

    With ``d' = a1 a2`` the Sylvester matrix is ``H_{a1} (x) H_{a2}`` (coefficient
    ``k = k1 a2 + k2``), so the transform of ``x`` viewed as an ``(a1, a2)`` matrix with the
    signs ``s`` of one degree/block is ``H_{a1} (X * S) H_{a2}``. The signs (and ``1/sqrt(D)``,
    on degree 0) are folded into the first factor: ``G[t1] = [diag(s[t1, :]) H_{a2}]`` stacked
    over degrees and blocks, so stage 1 is one batched GEMM over ``t1`` per group of blocks.
    Stage 2 is one GEMM with ``H_{a1}`` per degree (its operand a strided view of the stage-1
    output, no copy), followed by the permutation gather of that degree and the running
    product over degrees, all on a row chunk whose intermediates stay in cache; the rows of a
    chunk are innermost, so that every gather moves contiguous runs of ``rows`` values. Without
    autograd the intermediates live in buffers reused across chunks (fresh allocations of these
    sizes cost more than the arithmetic) and the last product is written straight into the
    output. The features and their distribution are exactly those of Algorithm 1 (same signs,
    same per-degree/per-block permutations); only the order of the floating-point operations
    differs from the generic path.
    """

    def __init__(self, signs: Tensor, indices: Tensor, degree: int, is_complex: bool, dtype):
        padded = signs.shape[-2] if is_complex else signs.shape[-1]
        num_blocks = signs.shape[-3] if is_complex else signs.shape[-2]
        log2 = padded.bit_length() - 1
        a1, a2 = 1 << (log2 // 2), 1 << (log2 - log2 // 2)
        self.a1, self.a2, self.padded, self.degree = a1, a2, padded, degree
        self.is_complex = is_complex
        self.num_features = num_features = indices.shape[-1]
        self.parts = parts = 2 if is_complex else 1
        device = signs.device
        # (p, K, parts, a1, a2): real parts / imaginary parts of the signs as separate "parts".
        s = signs.to(dtype)
        s = s.movedim(-1, -2) if is_complex else s.unsqueeze(-2)
        s = s.reshape(degree, num_blocks, parts, a1, a2).clone()
        s[0] /= math.sqrt(num_features)
        h2 = hadamard_matrix(a2, dtype=dtype, device=device)
        self.h1 = hadamard_matrix(a1, dtype=dtype, device=device)
        # Blocks per group and rows per chunk: the stage-1 output of a group (a1 x p x blocks x
        # parts x a2 x rows) should hold about _PLAN_CHUNK_ELEMENTS values; rows first (long
        # contiguous runs for the gathers), then whole blocks for small d'.
        per_block = degree * parts * padded
        rows = min(_PLAN_MAX_ROWS, _PLAN_CHUNK_ELEMENTS // per_block)
        # a multiple of 16 rows: the GEMMs' column count, odd sizes leave vector lanes idle
        self.rows_per_chunk = max(_PLAN_MIN_ROWS, rows - rows % 16 if rows >= 16 else rows)
        rows = per_block * self.rows_per_chunk
        self.group = max(1, min(num_blocks, _PLAN_CHUNK_ELEMENTS // rows))
        self.groups = []  # (first feature, last feature, blocks, stage-1 matrix, flat indices)
        for b0 in range(0, num_blocks, self.group):
            nb = min(self.group, num_blocks - b0)
            lo, hi = b0 * padded, min(num_features, (b0 + nb) * padded)
            if lo >= hi:
                break
            # stage1[t1, (i, b, r, k2), t2] = s[i, b, r, t1, t2] H[t2, k2]
            sg = s[:, b0 : b0 + nb].permute(3, 0, 1, 2, 4)  # (a1, p, nb, parts, a2)
            stage1 = sg.unsqueeze(-2) * h2.T.reshape(1, 1, 1, 1, a2, a2)
            stage1 = stage1.reshape(a1, degree * nb * parts * a2, a2).contiguous()
            # feature l of degree i reads coefficient k = indices[i, l] - b d' of block b, i.e.
            # row k1 (nb a2) + (b - b0) a2 + k2 of that degree's stage-2 output (complex: of the
            # complex combination of its real and imaginary parts).
            feat = torch.arange(lo, hi, device=device)
            block = feat // padded
            coeff = indices[:, lo:hi] - block * padded
            flat = (coeff // a2) * (nb * a2) + (block - b0) * a2 + coeff % a2
            self.groups.append((lo, hi, nb, stage1, tuple(flat.contiguous())))

    def _out_dtype(self, x: Tensor) -> torch.dtype:
        return complex_dtype(x.dtype) if self.is_complex else x.dtype

    def _transposed_rows(self, x: Tensor, start: int, m: int) -> Tensor:
        rows = pad_to_power_of_two(x[start : start + m])  # d' = next_power_of_two(d)
        return rows.reshape(m, self.a1, self.a2).permute(1, 2, 0)  # (a1, a2, m)

    def _workspace(self, m: int, bufs: Dict[str, Tensor]):
        # Views of the buffers for an m-row chunk, built once per chunk size: the per-call
        # overhead of slicing and viewing is comparable to the small GEMMs' run time.
        a1, a2, p, parts = self.a1, self.a2, self.degree, self.parts

        def take(name: str, *shape: int) -> Tensor:
            return bufs[name][: math.prod(shape)].view(shape)

        acc_all = take("acc", self.num_features, m)
        groups = []
        for lo, hi, nb, stage1, flat in self.groups:
            size = nb * parts * a2
            z = take("z", a1, stage1.shape[1], m)
            # degree i's stage-1 output as a strided (a1, size m) matrix: no copy
            zs = [z[:, i * size : (i + 1) * size].reshape(a1, size * m) for i in range(p)]
            y = take("y", a1, size * m)
            if self.is_complex:
                parts_view = y.view(a1, nb, 2, a2 * m)
                combined = take("c", a1, nb, a2 * m)
                pair = (parts_view[:, :, 0], parts_view[:, :, 1], combined)
                source = combined.view(-1, m)
            else:
                pair, source = None, y.view(-1, m)
            gathered = take("g", hi - lo, m)
            groups.append((stage1, z, zs, y, pair, source, gathered, acc_all[lo:hi], flat))
        return take("x", a1, a2, m), acc_all, groups

    def _fill_rows(self, xt: Tensor, x: Tensor, start: int, m: int, scale, root) -> None:
        # xt (a1, a2, m) <- [x / scale, root, 0]^T of the chunk: the homogenisation and the
        # zero padding happen in the one transposing copy the chunk needs anyway.
        rows = xt.view(self.padded, m)
        d = x.shape[-1]
        chunk = x[start : start + m].T
        if scale is None:
            rows[:d].copy_(chunk)
        else:
            torch.div(chunk, scale, out=rows[:d])
        if root is not None:
            rows[d].fill_(root)
            d += 1
        rows[d:].zero_()

    def __call__(self, x: Tensor, scale: Optional[Tensor] = None,
                 root: Optional[Tensor] = None) -> Tensor:
        """Features ``(n, D)`` of ``x`` ``(n, d)`` (``d <= d'``, zero-padded here).

        Optionally of the homogenised ``[x / scale, root]`` (``scale`` of shape ``(d, 1)``,
        ``root`` 0-dimensional), built chunk by chunk; only without autograd.
        """
        if torch.is_grad_enabled() and x.requires_grad:
            return self._differentiable(x)
        n = x.shape[0]
        dtype = self._out_dtype(x)
        chunk = min(n, self.rows_per_chunk)
        most = self.group * self.padded * chunk
        out = torch.empty(n, self.num_features, dtype=dtype, device=x.device)
        bufs = {
            "x": x.new_empty(self.padded * chunk),
            "z": x.new_empty(self.degree * self.parts * most),
            "y": x.new_empty(self.parts * most),
            "c": torch.empty(most if self.is_complex else 0, dtype=dtype, device=x.device),
            "g": torch.empty(most, dtype=dtype, device=x.device),
            "acc": torch.empty(self.num_features * chunk, dtype=dtype, device=x.device),
        }
        full = self._workspace(chunk, bufs)
        for start in range(0, n, chunk):
            m = min(chunk, n - start)
            xt, acc_all, groups = full if m == chunk else self._workspace(m, bufs)
            self._fill_rows(xt, x, start, m, scale, root)
            for stage1, z, zs, y, pair, source, gathered, acc, flat in groups:
                torch.bmm(stage1, xt, out=z)
                for i in range(self.degree):
                    torch.mm(self.h1, zs[i], out=y)
                    if pair is not None:
                        torch.complex(pair[0], pair[1], out=pair[2])
                    if i == 0:
                        torch.index_select(source, 0, flat[0], out=acc)
                    else:
                        acc.mul_(torch.index_select(source, 0, flat[i], out=gathered))
            # blocked transpose of the chunk's (D, m) features into rows of the output
            out[start : start + m].copy_(acc_all.T)
        return out

    def _differentiable(self, x: Tensor) -> Tensor:
        # The same steps with allocating (autograd-tracked) operations.
        a1, a2, p, parts = self.a1, self.a2, self.degree, self.parts
        pieces = []
        for start in range(0, x.shape[0], self.rows_per_chunk):
            m = min(self.rows_per_chunk, x.shape[0] - start)
            xt = self._transposed_rows(x, start, m).contiguous()
            blocks = []
            for _, _, nb, stage1, flat in self.groups:
                size = nb * parts * a2
                z = torch.bmm(stage1, xt)
                acc = None
                for i in range(p):
                    y = self.h1 @ z[:, i * size : (i + 1) * size].reshape(a1, size * m)
                    if self.is_complex:
                        y = y.view(a1, nb, 2, a2 * m)
                        y = torch.complex(y[:, :, 0], y[:, :, 1])
                    g = y.reshape(-1, m).index_select(0, flat[i])
                    acc = g if acc is None else acc * g
                blocks.append(acc)
            pieces.append(torch.cat(blocks, dim=0).T)
        return torch.cat(pieces, dim=0)


def apply_tensorsrht(
    x: Tensor, weights, degree: int, is_complex: bool, scale: Optional[Tensor] = None,
    root: Optional[Tensor] = None,
) -> Tensor:
    signs = sketch_weight(weights, "signs", "tensorsrht")
    indices = sketch_weight(weights, "indices", "tensorsrht")
    padded = signs.shape[-2] if is_complex else signs.shape[-1]
    # with root, the input is [x / scale, root]: one column more than x
    if next_power_of_two(x.shape[-1] + (root is not None)) != padded:
        raise ValueError(
            f"x must have d columns with next_power_of_two(d) == {padded} to match the sketch "
            f"weights (signs of shape {tuple(signs.shape)}), got shape {tuple(x.shape)}"
        )
    if indices.shape[-2] != degree or signs.shape[-3 - is_complex] != degree:
        raise ValueError(
            f"degree={degree} does not match the sketch weights (indices of shape "
            f"{tuple(indices.shape)})"
        )
    num_features = indices.shape[-1]
    if _srht_numba.applies(x, indices):
        # compiled fast Walsh-Hadamard kernels (numba installed, CPU), forward and, when
        # autograd records, backward
        out = _srht_numba.differentiable_tensorsrht(
            x.reshape(-1, x.shape[-1]), signs, indices, is_complex,
            None if scale is None else scale.reshape(-1), root,
        )
        if out is not None:  # None: numba could not compile here (warned once)
            return out.reshape(*x.shape[:-1], num_features)
    differentiable = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (x, scale, root)
    )
    if differentiable and (scale is not None or root is not None):
        # SrhtPlan's differentiable variant takes x as it is: homogenise here
        if scale is not None:
            x = x / scale.reshape(-1)
        if root is not None:
            x = torch.cat([x, root.expand(*x.shape[:-1], 1)], dim=-1)
        scale = root = None
    # SrhtPlan handles unbatched weights up to d' = _PLAN_MAX_DIM
    if indices.dim() == 2 and padded <= _PLAN_MAX_DIM:
        # the plan folds the 1/sqrt(D) factor into its first GEMM
        plan = SrhtPlan(signs, indices, degree, is_complex, x.dtype)
        out = plan(x.reshape(-1, x.shape[-1]), scale, root)
        return out.reshape(*x.shape[:-1], num_features)
    if scale is not None:
        x = x / scale.reshape(-1)
    if root is not None:
        x = torch.cat([x, root.expand(*x.shape[:-1], 1)], dim=-1)
    x = pad_to_power_of_two(x)  # to d', checked above
    rows = x.shape[-2]
    num_blocks = signs.shape[-3] if is_complex else signs.shape[-2]
    per_row = degree * num_blocks * padded * (2 if is_complex else 1)
    batch = math.prod(torch.broadcast_shapes(x.shape[:-2], signs.shape[: -3 - is_complex]))
    chunk = max(1, _SRHT_CHUNK_ELEMENTS // max(1, per_row * batch))
    if rows <= chunk:
        out = _srht_rows(x, signs, indices, degree, is_complex)
    else:
        out = torch.cat(
            [
                _srht_rows(x[..., start : start + chunk, :], signs, indices, degree, is_complex)
                for start in range(0, rows, chunk)
            ],
            dim=-2,
        )
    return out / math.sqrt(num_features)
