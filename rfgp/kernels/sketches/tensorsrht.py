r"""Random sketches of the polynomial kernel: Gaussian, Rademacher, TensorSketch, TensorSRHT.

A degree-:math:`p` polynomial sketch is a random map :math:`\Phi: \mathbb{R}^d \to
\mathbb{R}^D` (or :math:`\mathbb{C}^D`) with

.. math::
    \mathbb{E}\big[\Phi(x)^\top \overline{\Phi(y)}\big] = (x^\top y)^p .

Four constructions, each real or complex:

* ``"gaussian"`` / ``"rademacher"`` (unstructured, Kar & Karnick 2012; complex version Wacker
  et al. 2022): :math:`\Phi(x)_l = D^{-1/2} \prod_{i=1}^p w_{i,l}^\top x` with i.i.d. weight
  vectors. Real: entries :math:`N(0, 1)` or uniform on :math:`\{1, -1\}`. Complex: entries
  :math:`(v + i w)/\sqrt2` with :math:`v, w \sim N(0, 1)`, or uniform on :math:`\{1, -1, i, -i\}`.
  Cost :math:`O(p d D)` per input (one GEMM).
* ``"tensorsketch"`` (Pham & Pagh 2013): one CountSketch :math:`C_i x` per degree (hash
  :math:`h_i: [d] \to [D]`, signs :math:`s_i` uniform on :math:`\{1, -1\}`, or on
  :math:`\{1, -1, i, -i\}` for the complex version), combined by circular convolution through
  the FFT: :math:`\Phi(x) = \mathrm{IFFT}(\prod_i \mathrm{FFT}(C_i x))`. Cost
  :math:`O(p (d + D \log D))`. The complex version is supported and unbiased, but its variance
  equals that of the complex Rademacher sketch (see :mod:`rfgp.variance`), so its CtR form brings
  no gain over real TensorSketch at equal output size -- as Wacker, Ohana & Filippone report.
* ``"tensorsrht"`` (Algorithm 1 of Wacker, Kanagawa & Filippone 2022): inputs are zero-padded to
  :math:`d' = 2^k`; for every block :math:`b = 1..\lceil D/d' \rceil` and every degree
  :math:`i`, independent random signs :math:`D_{b,i}` (real :math:`\{\pm 1\}` or complex
  :math:`\{\pm 1, \pm i\}`) and an independent random permutation :math:`\pi_{b,i}` give the
  projections :math:`P_{\pi_{b,i}} H_{d'} D_{b,i} x` (unnormalised Walsh--Hadamard
  :math:`H`); the block's features are their elementwise product over :math:`i`, the blocks
  are concatenated, truncated to :math:`D` and scaled by :math:`D^{-1/2}`. Cost
  :math:`O(p D \log d')`. On the CPU without autograd, with numba installed (the ``fast``
  extra), a compiled fast Walsh--Hadamard kernel computes the features
  (:mod:`rfgp.kernels._srht_numba`; ``RFGP_DISABLE_NUMBA=1`` switches it off); otherwise (and
  for gradients or on a GPU) the transforms are two Kronecker-factored GEMMs per chunk. Both give
  the same features for the same weights. Projections inside one block are
  orthogonal, which lowers the variance (exactly zero for ``degree = 1`` and ``D`` a multiple
  of :math:`d'`).

Complex features and the Complex-to-Real (CtR) map: ``D`` complex features give the ``2D`` real
columns :math:`[\mathrm{Re}\,\Phi, \mathrm{Im}\,\Phi]` whose Gram matrix is exactly
:math:`\mathrm{Re}(\Phi \Phi^H)`, an unbiased estimate with variance
:math:`\tfrac12(\mathbb{V} + \mathrm{PV})` of the complex sketch. At a fixed *real* output
size ``R`` use ``R / 2`` complex features (:meth:`PolynomialSketchKernel.ctr`).

References:
    Kar & Karnick, *Random Feature Maps for Dot Product Kernels*, AISTATS 2012.
    Pham & Pagh, *Fast and Scalable Polynomial Kernels via Explicit Feature Maps*, KDD 2013.
    Ahle et al., *Oblivious Sketching of High-Degree Polynomial Kernels*, SODA 2020.
    Wacker, Kanagawa & Filippone, *Improved Random Features for Dot Product Kernels*, 2022.
    Wacker, Ohana & Filippone, *Complex-to-Real Random Features for Polynomial Kernels*, 2022.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Optional

import torch
from torch import Tensor

from rfgp.kernels import _srht_numba
from rfgp.kernels.base import RandomFeatureKernel
from rfgp.kernels.exact import DotProductBias, DotProductKernel, _init_unit_lengthscale
from rfgp.ops import (
    _complex_dtype,
    _device_of,
    complex_gaussian,
    complex_rademacher,
    fwht,
    gaussian,
    hadamard_matrix,
    next_power_of_two,
    pad_to_power_of_two,
    rademacher,
)

__all__ = ["PROJECTIONS", "PolynomialSketchKernel", "sample_sketch", "apply_sketch"]

#: the supported projections.
PROJECTIONS = ("gaussian", "rademacher", "tensorsketch", "tensorsrht")

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
_DENSE_CHUNK_ELEMENTS = 1 << 23
_NO_BATCH = torch.Size()


# ---------------------------------------------------------------------------------- validation
def _check_positive_int(name: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive integer (>= 1), got {value!r}")


def _check_projection(projection: Any, complex: Any) -> None:
    if projection not in PROJECTIONS:
        raise ValueError(f"projection must be one of {list(PROJECTIONS)}, got {projection!r}")
    if not isinstance(complex, bool):
        raise TypeError(f"complex must be a bool, got {type(complex).__name__}")


def _as_batch_shape(batch_shape: Any) -> torch.Size:
    try:
        shape = torch.Size(batch_shape)
    except TypeError as err:
        raise TypeError(
            f"batch_shape must be a torch.Size or a tuple of ints, got {batch_shape!r}"
        ) from err
    if any(s < 1 for s in shape):
        raise ValueError(f"batch_shape entries must be positive, got {tuple(shape)}")
    return shape


def _num_features_tensor(batch_shape: torch.Size, num_features: int, device) -> Tensor:
    # TensorSketch hashes do not reveal D, so every weight dict carries it explicitly (as a
    # batch-shaped integer tensor, so that batch indexing and .to() treat it like the weights).
    return torch.full(tuple(batch_shape), num_features, dtype=torch.long, device=device)


# ---------------------------------------------------------------------------------- sampling
def sample_sketch(
    degree: int,
    num_features: int,
    input_dim: int,
    projection: str = "rademacher",
    complex: bool = False,
    batch_shape: torch.Size = _NO_BATCH,
    generator: Optional[torch.Generator] = None,
) -> Dict[str, Tensor]:
    r"""Draw the random weights of a degree-``degree`` polynomial sketch.

    All tensors are float64 (or integer) on the generator's device, with leading
    ``batch_shape`` dimensions (independent draws). Complex weights are stored as
    :func:`torch.view_as_real` (a trailing dimension of size 2) so that dtype casts of a module
    holding them cannot drop the imaginary part.

    Layouts (``B = batch_shape``, ``p = degree``, ``D = num_features``, ``d = input_dim``,
    ``d' = next_power_of_two(d)``, ``K = ceil(D / d')``; ``[, 2]`` only for ``complex=True``):

    * ``"gaussian"`` / ``"rademacher"``: ``projections`` ``(*B, d, p, D[, 2])``.
    * ``"tensorsketch"``: ``hashes`` ``(*B, p, d)`` (int64 in ``[0, D)``), ``signs``
      ``(*B, p, d[, 2])``.
    * ``"tensorsrht"``: ``signs`` ``(*B, p, K, d'[, 2])`` and ``indices`` ``(*B, p, D)``
      (int64): feature ``l`` of degree ``i`` reads entry ``indices[i, l]`` of the flattened
      ``(K, d')`` transforms; block ``b`` holds ``b d' + pi_{b,i}``, with an independent
      permutation ``pi_{b,i}`` for every block and degree.
    * every dict also holds ``feature_count`` ``(*B,)`` (int64, filled with ``D``).

    Args:
        degree: polynomial degree ``p >= 1``.
        num_features: number of features ``D >= 1`` (complex features count once).
        input_dim: input dimension ``d >= 1`` (include any appended bias coordinate).
        projection: ``"gaussian"``, ``"rademacher"``, ``"tensorsketch"`` or ``"tensorsrht"``.
        complex: draw the complex version (complex Gaussian ``(v + i w)/sqrt(2)``, signs uniform
            on ``{1, -1, i, -i}``).
        batch_shape: leading shape of independent draws.
        generator: optional ``torch.Generator``; the same state gives the same draw.

    Returns:
        dict of tensors, to be passed to :func:`apply_sketch`.

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> w = sample_sketch(3, 16, 5, projection="tensorsrht", generator=g)
        >>> sorted(w), tuple(w["signs"].shape), tuple(w["indices"].shape)
        (['feature_count', 'indices', 'signs'], (3, 2, 8), (3, 16))

    References:
        Wacker, Kanagawa & Filippone, *Improved Random Features for Dot Product Kernels*, 2022
        (Algorithm 1).
    """
    _check_positive_int("degree", degree)
    _check_positive_int("num_features", num_features)
    _check_positive_int("input_dim", input_dim)
    _check_projection(projection, complex)
    batch_shape = _as_batch_shape(batch_shape)
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(
            f"generator must be a torch.Generator or None, got {type(generator).__name__}"
        )
    device = _device_of(generator)
    b = tuple(batch_shape)

    def signs(shape):
        if complex:
            return torch.view_as_real(complex_rademacher(shape, generator))
        return rademacher(shape, generator)

    weights: Dict[str, Tensor] = {}
    if projection in ("gaussian", "rademacher"):
        shape = (*b, input_dim, degree, num_features)
        if projection == "gaussian":
            w = (
                torch.view_as_real(complex_gaussian(shape, generator))
                if complex
                else gaussian(shape, generator)
            )
        else:
            w = signs(shape)
        weights["projections"] = w.contiguous()
    elif projection == "tensorsketch":
        weights["hashes"] = torch.randint(
            0, num_features, (*b, degree, input_dim), generator=generator, device=device
        )
        weights["signs"] = signs((*b, degree, input_dim)).contiguous()
    else:
        padded = next_power_of_two(input_dim)
        num_blocks = math.ceil(num_features / padded)
        weights["signs"] = signs((*b, degree, num_blocks, padded)).contiguous()
        # argsort of uniforms = independent uniform permutations, all drawn in one call.
        keys = torch.rand(
            (*b, degree, num_blocks, padded), generator=generator, dtype=torch.float64,
            device=device,
        )
        perms = keys.argsort(dim=-1)
        offsets = torch.arange(num_blocks, device=device).unsqueeze(-1) * padded
        flat = (perms + offsets).reshape(*b, degree, num_blocks * padded)
        weights["indices"] = flat[..., :num_features].contiguous()
    weights["feature_count"] = _num_features_tensor(batch_shape, num_features, device)
    return weights


# ---------------------------------------------------------------------------------- applying
def _weight(weights: Dict[str, Tensor], key: str, projection: str) -> Tensor:
    if not isinstance(weights, dict) or key not in weights:
        keys = sorted(weights) if isinstance(weights, dict) else type(weights).__name__
        raise ValueError(
            f"weights must be a dict from sample_sketch(projection={projection!r}) with key "
            f"{key!r}, got {keys}"
        )
    return weights[key]


def _as_complex(w: Tensor, dtype: torch.dtype) -> Tensor:
    return torch.view_as_complex(w.to(dtype).contiguous())


def _check_dim(x: Tensor, expected: int, what: str) -> None:
    if x.shape[-1] != expected:
        raise ValueError(
            f"x must have {expected} columns to match the sketch weights ({what}), "
            f"got shape {tuple(x.shape)}"
        )


def _apply_dense(x: Tensor, weights, degree: int, complex: bool) -> Tensor:
    w = _weight(weights, "projections", "gaussian/rademacher")
    d = w.shape[-4] if complex else w.shape[-3]
    _check_dim(x, d, "projections")
    if (w.shape[-3] if complex else w.shape[-2]) != degree:
        raise ValueError(
            f"degree={degree} does not match the sketch weights (projections of shape "
            f"{tuple(w.shape)})"
        )
    num_features = w.shape[-2] if complex else w.shape[-1]
    w = w.to(x.dtype)
    w = w.reshape(*w.shape[: -3 - complex], d, -1)

    def rows(xs: Tensor, out: Optional[Tensor] = None) -> Tensor:
        # One GEMM for all degrees (and real/imaginary parts): (..., n, d) @ (..., d, p D [2]).
        proj = xs @ w
        if complex:
            proj = torch.view_as_complex(proj.reshape(*proj.shape[:-1], degree, num_features, 2))
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
        dtype = _complex_dtype(x.dtype) if complex else x.dtype
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


def _count_sketch(x: Tensor, signs: Tensor, hashes: Tensor, num_features: int) -> Tensor:
    # x (..., N, d); signs/hashes (*B, p, d) -> (..., N, p, D)
    values = x.unsqueeze(-2) * signs.unsqueeze(-3)
    shape = torch.broadcast_shapes(values.shape, hashes.unsqueeze(-3).shape)
    values = values.expand(shape)
    index = hashes.unsqueeze(-3).expand(shape)
    out = values.new_zeros((*shape[:-1], num_features))
    return out.scatter_add(-1, index, values)


def _apply_tensorsketch(x: Tensor, weights, degree: int, complex: bool) -> Tensor:
    hashes = _weight(weights, "hashes", "tensorsketch")
    signs = _weight(weights, "signs", "tensorsketch")
    num_features = int(_weight(weights, "feature_count", "tensorsketch").reshape(-1)[0])
    _check_dim(x, hashes.shape[-1], "hashes")
    if hashes.shape[-2] != degree:
        raise ValueError(
            f"degree={degree} does not match the sketch weights (hashes of shape "
            f"{tuple(hashes.shape)})"
        )
    if hashes.dim() == 2:
        return _tensorsketch_unbatched(x, signs, hashes, degree, complex, num_features)
    if complex:
        s = signs.to(x.dtype)
        sketch = torch.complex(
            _count_sketch(x, s[..., 0], hashes, num_features),
            _count_sketch(x, s[..., 1], hashes, num_features),
        )
        spectrum = torch.fft.fft(sketch, dim=-1)
    else:
        sketch = _count_sketch(x, signs.to(x.dtype), hashes, num_features)
        spectrum = torch.fft.rfft(sketch, dim=-1)
    prod = spectrum[..., 0, :]
    for i in range(1, degree):
        prod = prod * spectrum[..., i, :]
    if complex:
        return torch.fft.ifft(prod, n=num_features, dim=-1)
    return torch.fft.irfft(prod, n=num_features, dim=-1)


def _tensorsketch_unbatched(
    x: Tensor, signs: Tensor, hashes: Tensor, degree: int, complex: bool, num_features: int
) -> Tensor:
    # One index_add per degree (a sparse d x D count-sketch product) and the spectra multiplied
    # as they come: no (N, p, D) intermediate.
    s = _as_complex(signs, x.dtype) if complex else signs.to(x.dtype)
    zeros_dtype = s.dtype if complex else x.dtype
    spectrum = None
    for i in range(degree):
        values = x * s[i]
        sketch = torch.zeros(
            (*x.shape[:-1], num_features), dtype=zeros_dtype, device=x.device
        ).index_add(-1, hashes[i], values)
        f = torch.fft.fft(sketch, dim=-1) if complex else torch.fft.rfft(sketch, dim=-1)
        spectrum = f if spectrum is None else spectrum * f
    if complex:
        return torch.fft.ifft(spectrum, n=num_features, dim=-1)
    return torch.fft.irfft(spectrum, n=num_features, dim=-1)


def _take(values: Tensor, index: Tensor) -> Tensor:
    # values (..., N, L), index (*B, D): gather along the last dimension.
    if index.dim() == 1:
        return values.index_select(-1, index)
    index = index.unsqueeze(-2)
    shape = torch.broadcast_shapes(values.shape[:-1], index.shape[:-1])
    return torch.gather(
        values.expand(*shape, values.shape[-1]), -1, index.expand(*shape, index.shape[-1])
    )


def _srht_rows(x: Tensor, signs: Tensor, indices: Tensor, degree: int, complex: bool) -> Tensor:
    # x is already zero-padded to d'.
    # (..., N, 1, 1, d') * (*B, 1, p, K, d') -> (..., N, p, K, d'): all degrees and blocks at once.
    xs = x.unsqueeze(-2).unsqueeze(-2)
    if complex:
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


class _SrhtPlan:
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

    def __init__(self, signs: Tensor, indices: Tensor, degree: int, complex: bool, dtype):
        padded = signs.shape[-2] if complex else signs.shape[-1]
        num_blocks = signs.shape[-3] if complex else signs.shape[-2]
        log2 = padded.bit_length() - 1
        a1, a2 = 1 << (log2 // 2), 1 << (log2 - log2 // 2)
        self.a1, self.a2, self.padded, self.degree, self.complex = a1, a2, padded, degree, complex
        self.num_features = num_features = indices.shape[-1]
        self.parts = parts = 2 if complex else 1
        device = signs.device
        # (p, K, parts, a1, a2): real parts / imaginary parts of the signs as separate "parts".
        s = signs.to(dtype)
        s = s.movedim(-1, -2) if complex else s.unsqueeze(-2)
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
        return _complex_dtype(x.dtype) if self.complex else x.dtype

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
            if self.complex:
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
            "c": torch.empty(most if self.complex else 0, dtype=dtype, device=x.device),
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
                    if self.complex:
                        y = y.view(a1, nb, 2, a2 * m)
                        y = torch.complex(y[:, :, 0], y[:, :, 1])
                    g = y.reshape(-1, m).index_select(0, flat[i])
                    acc = g if acc is None else acc * g
                blocks.append(acc)
            pieces.append(torch.cat(blocks, dim=0).T)
        return torch.cat(pieces, dim=0)


def _apply_tensorsrht(
    x: Tensor, weights, degree: int, complex: bool, scale: Optional[Tensor] = None,
    root: Optional[Tensor] = None,
) -> Tensor:
    signs = _weight(weights, "signs", "tensorsrht")
    indices = _weight(weights, "indices", "tensorsrht")
    padded = signs.shape[-2] if complex else signs.shape[-1]
    # with root, the input is [x / scale, root]: one column more than x
    if next_power_of_two(x.shape[-1] + (root is not None)) != padded:
        raise ValueError(
            f"x must have d columns with next_power_of_two(d) == {padded} to match the sketch "
            f"weights (signs of shape {tuple(signs.shape)}), got shape {tuple(x.shape)}"
        )
    if indices.shape[-2] != degree or signs.shape[-3 - complex] != degree:
        raise ValueError(
            f"degree={degree} does not match the sketch weights (indices of shape "
            f"{tuple(indices.shape)})"
        )
    num_features = indices.shape[-1]
    if _srht_numba.applies(x, indices, scale, root):
        # compiled fast Walsh-Hadamard kernel (numba installed, CPU, no autograd)
        out = _srht_numba.tensorsrht(
            x.reshape(-1, x.shape[-1]), signs, indices, complex, scale, root
        )
        if out is not None:  # None: numba could not compile here (warned once)
            return out.reshape(*x.shape[:-1], num_features)
    # _SrhtPlan handles unbatched weights up to d' = _PLAN_MAX_DIM, and scale/root only without
    # autograd (its differentiable variant takes x as it is)
    if indices.dim() == 2 and padded <= _PLAN_MAX_DIM and (
        (scale is None and root is None) or not torch.is_grad_enabled()
    ):
        # the plan folds the 1/sqrt(D) factor into its first GEMM
        plan = _SrhtPlan(signs, indices, degree, complex, x.dtype)
        out = plan(x.reshape(-1, x.shape[-1]), scale, root)
        return out.reshape(*x.shape[:-1], num_features)
    if scale is not None:
        x = x / scale.reshape(-1)
    if root is not None:
        x = torch.cat([x, root.expand(*x.shape[:-1], 1)], dim=-1)
    x = pad_to_power_of_two(x)  # to d', checked above
    rows = x.shape[-2]
    num_blocks = signs.shape[-3] if complex else signs.shape[-2]
    per_row = degree * num_blocks * padded * (2 if complex else 1)
    batch = math.prod(torch.broadcast_shapes(x.shape[:-2], signs.shape[: -3 - complex]))
    chunk = max(1, _SRHT_CHUNK_ELEMENTS // max(1, per_row * batch))
    if rows <= chunk:
        out = _srht_rows(x, signs, indices, degree, complex)
    else:
        out = torch.cat(
            [
                _srht_rows(x[..., start : start + chunk, :], signs, indices, degree, complex)
                for start in range(0, rows, chunk)
            ],
            dim=-2,
        )
    return out / math.sqrt(num_features)


def apply_sketch(
    x: Tensor,
    weights: Dict[str, Tensor],
    degree: int,
    projection: str = "rademacher",
    complex: bool = False,
) -> Tensor:
    r"""Polynomial-sketch features of ``x`` for weights from :func:`sample_sketch`.

    .. math::
        \mathbb{E}\big[\Phi(x)\,\Phi(y)^H\big] = (x^\top y)^{p},

    with the ``1/sqrt(D)`` normalisation included. No lengthscale or bias is applied: scale
    ``x`` and append a bias coordinate before calling (see :class:`PolynomialSketchKernel`).

    Args:
        x: ``(..., N, d)`` real inputs (float32 or float64); leading dimensions broadcast
            against the weights' batch shape.
        weights: dict from :func:`sample_sketch` with the same ``degree``, ``projection`` and
            ``complex``.
        degree: polynomial degree ``p``.
        projection: ``"gaussian"``, ``"rademacher"``, ``"tensorsketch"`` or ``"tensorsrht"``.
        complex: whether the weights are complex.

    Returns:
        ``(..., N, D)`` features, real with the dtype of ``x``, or complex (complex64 for
        float32 input, complex128 for float64).

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> x = torch.randn(4, 3, dtype=torch.float64, generator=g)
        >>> w = sample_sketch(1, 8, 3, projection="tensorsrht", generator=g)
        >>> phi = apply_sketch(x, w, 1, projection="tensorsrht")   # D = 2 d': exact for p = 1
        >>> torch.allclose(phi @ phi.T, x @ x.T)
        True
    """
    _check_positive_int("degree", degree)
    _check_projection(projection, complex)
    if not isinstance(x, Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"x must have a real floating dtype, got {x.dtype}")
    if x.dim() < 2:
        raise ValueError(f"x must have shape (..., N, d), got shape {tuple(x.shape)}")
    if projection in ("gaussian", "rademacher"):
        return _apply_dense(x, weights, degree, complex)
    if projection == "tensorsketch":
        return _apply_tensorsketch(x, weights, degree, complex)
    return _apply_tensorsrht(x, weights, degree, complex)


# ---------------------------------------------------------------------------------- kernel
class PolynomialSketchKernel(DotProductBias, RandomFeatureKernel):
    r"""Random sketch of the polynomial kernel :math:`(x^\top y / \ell^2 + b)^p`.

    The bias is handled by homogenisation: with :math:`\tilde x = [x / \ell, \sqrt b]`,
    :math:`(x^\top y/\ell^2 + b)^p = (\tilde x^\top \tilde y)^p`, and a degree-:math:`p` sketch
    (:func:`apply_sketch`) of :math:`\tilde x` gives the features, so that
    :math:`\mathbb{E}[\Phi(x)^\top \overline{\Phi(y)}] = (x^\top y/\ell^2 + b)^p`. With ARD
    lengthscales the inputs are scaled coordinatewise.

    Projections (see the module documentation): ``"gaussian"``, ``"rademacher"`` (dense, cost
    :math:`O(p d D)`), ``"tensorsketch"`` (FFT of count sketches, :math:`O(p(d + D \log D))`),
    ``"tensorsrht"`` (structured, :math:`O(p D \log d)`; inputs zero-padded to a power of two
    after the bias coordinate is appended). ``degree = 1`` gives a plain random projection
    (exact for TensorSRHT when ``D`` is a multiple of the padded dimension).

    ``complex=True`` uses complex weights: complex Gaussian :math:`(v + i w)/\sqrt2`, or signs
    uniform on :math:`\{1, -1, i, -i\}`. ``features(x)`` is then complex (``num_features``
    complex columns) and inside GPyTorch the kernel uses the real form
    :math:`[\mathrm{Re}\,\Phi, \mathrm{Im}\,\Phi]` -- the Complex-to-Real (CtR) map -- whose Gram
    matrix is :math:`\mathrm{Re}(\Phi\Phi^H)`. **D complex features give 2D real columns**
    (``num_real_features``), so compare against a real sketch with ``2D`` features, and build a
    CtR kernel of a given real size ``R`` with :meth:`ctr` (``num_features = R / 2``).
    CtR is unbiased with variance ``(V + PV) / 2`` of the complex sketch; it beats the real sketch
    at equal real size always for Gaussian weights (``degree >= 2``), and for Rademacher /
    TensorSRHT when the data are non-negative. Complex TensorSketch is supported but gains
    nothing (its variance equals the complex Rademacher sketch's).

    Conversions: scikit-learn's ``(gamma x^T y + coef0)^degree`` is ``lengthscale =
    gamma^{-1/2}``, ``bias = coef0``; the papers' ``(x^T y / a + nu)^p`` is ``lengthscale =
    sqrt(a)``, ``bias = nu``. Wrap in ``gpytorch.kernels.ScaleKernel`` for an amplitude.

    Args:
        degree: polynomial degree ``p >= 1``.
        num_features: ``D`` (complex features count once).
        bias: initial bias ``b >= 0``. ``bias > 0`` makes it a learnable parameter
            (``raw_bias`` with a ``Positive`` constraint); ``bias = 0`` gives the homogeneous
            kernel :math:`(x^\top y/\ell^2)^p` with no bias parameter and no extra coordinate.
        projection: ``"gaussian"``, ``"rademacher"``, ``"tensorsketch"`` or ``"tensorsrht"``.
        complex: complex weights (see above).
        input_dim: ``d`` (without the bias coordinate); inferred from the first input if None.
        seed: seed of the initial weight draw.
        **kwargs: GPyTorch ``Kernel`` arguments (``ard_num_dims``, ``batch_shape``,
            ``active_dims``, ``lengthscale_prior``, ``lengthscale_constraint``,
            ``bias_prior``, ``bias_constraint``).

    Attributes:
        lengthscale: positive ``(*batch_shape, 1, ard_num_dims or 1)`` parameter (starts at 1
            when its constraint allows).
        bias: positive ``(*batch_shape, 1, 1)`` parameter, or the constant 0.
        is_complex: whether the features are complex.
        num_features: ``D``, columns of ``features(x)`` (complex columns count once).
        num_real_features: columns of the real form, ``2D`` if complex, else ``D``.

    Shapes:
        ``features(x)``: ``(..., N, d) -> (..., N, D)``.

    Example:
        >>> import gpytorch
        >>> k = PolynomialSketchKernel.ctr(3, 64, bias=1.0, projection="tensorsrht", seed=0)
        >>> k.num_features, k.num_real_features, k.is_complex
        (32, 64, True)
        >>> x = torch.randn(10, 5, dtype=torch.float64)
        >>> k.features(x).dtype, k.real_features(x).shape
        (torch.complex128, torch.Size([10, 64]))
        >>> gpytorch.kernels.ScaleKernel(k)(x).shape
        torch.Size([10, 10])

    References:
        Kar & Karnick, AISTATS 2012. Pham & Pagh, KDD 2013. Wacker, Kanagawa & Filippone,
        *Improved Random Features for Dot Product Kernels*, 2022. Wacker, Ohana & Filippone,
        *Complex-to-Real Random Features for Polynomial Kernels*, 2022.
    """

    has_lengthscale = True

    def __init__(
        self,
        degree: int,
        num_features: int,
        bias: float = 0.0,
        projection: str = "rademacher",
        complex: bool = False,
        input_dim: Optional[int] = None,
        seed: Optional[int] = None,
        **kwargs: Any,
    ) -> None:
        _check_positive_int("degree", degree)
        _check_positive_int("num_features", num_features)
        _check_projection(projection, complex)
        bias_prior, bias_constraint = self._pop_bias_kwargs(bias, kwargs)
        super().__init__(num_features=num_features, input_dim=input_dim, seed=seed, **kwargs)
        self.degree = degree
        self.projection = projection
        self.is_complex = complex
        _init_unit_lengthscale(self)
        self._register_bias(bias, bias_prior, bias_constraint)

    @classmethod
    def ctr(
        cls, degree: int, num_real_features: int, **kwargs: Any
    ) -> PolynomialSketchKernel:
        """Complex-to-Real sketch with ``num_real_features`` real columns.

        Builds ``PolynomialSketchKernel(degree, num_real_features // 2, complex=True,
        **kwargs)``: ``D`` complex features are ``2D`` real columns ``[Re Phi, Im Phi]``.

        Args:
            degree: polynomial degree.
            num_real_features: even number ``>= 2`` of real columns.
            **kwargs: the other constructor arguments (``bias``, ``projection``, ``seed``...).

        Example:
            >>> PolynomialSketchKernel.ctr(2, 10).num_features
            5
        """
        if (
            not isinstance(num_real_features, int)
            or isinstance(num_real_features, bool)
            or num_real_features < 2
            or num_real_features % 2
        ):
            raise ValueError(
                "num_real_features must be an even integer >= 2 (a real and an imaginary "
                f"column per complex feature), got {num_real_features!r}"
            )
        if kwargs.pop("complex", True) is not True:
            raise ValueError("PolynomialSketchKernel.ctr builds a complex sketch: drop complex=")
        return cls(degree, num_real_features // 2, complex=True, **kwargs)

    # --------------------------------------------------------------- hyperparameters
    @property
    def sketch_dim(self) -> Optional[int]:
        """Dimension the sketch sees: ``d + 1`` with a bias coordinate, else ``d``."""
        if self.input_dim is None:
            return None
        return self.input_dim + int(self.has_bias)

    # --------------------------------------------------------------- features
    def _sample_weights(self, input_dim: int, generator) -> Dict[str, Tensor]:
        return sample_sketch(
            self.degree, self.num_features, input_dim + int(self.has_bias), self.projection,
            self.is_complex, self.batch_shape, generator,
        )

    def _weights(self) -> Dict[str, Tensor]:
        return {name: getattr(self, name) for name in self._random_buffer_names}

    def homogenize(self, x: Tensor) -> Tensor:
        r"""``[x / l, sqrt(b)]`` (``x / l`` when homogeneous): ``(..., N, d) -> (..., N, d')``."""
        scale = self.lengthscale.to(x.dtype)
        if not self.has_bias:
            return x / scale
        root = self.bias.to(x.dtype).sqrt()
        shape = torch.broadcast_shapes(x.shape[:-1], scale.shape[:-1], root.shape[:-1])
        if torch.is_grad_enabled():
            z = x / scale
            return torch.cat([z.expand(*shape, z.shape[-1]), root.expand(*shape, 1)], dim=-1)
        # one pass into the result instead of a quotient and its concatenation with the bias
        z = x.new_empty(*shape, x.shape[-1] + 1)
        torch.div(x.expand(*shape, x.shape[-1]), scale, out=z[..., :-1])
        z[..., -1:] = root.expand(*shape, 1)
        return z

    def _features(self, x: Tensor) -> Tensor:
        weights = self._weights()
        if self.projection == "tensorsrht" and not torch.is_grad_enabled() and not self.batch_shape:
            # the TensorSRHT kernels (compiled or GEMM plan) homogenise row chunk by row chunk
            # while filling their tiles: no homogenised copy of x
            scale = self.lengthscale.to(x.dtype).reshape(-1, 1)
            root = self.bias.to(x.dtype).sqrt().reshape(()) if self.has_bias else None
            return _apply_tensorsrht(x, weights, self.degree, self.is_complex, scale, root)
        return apply_sketch(
            self.homogenize(x), weights, self.degree, self.projection, self.is_complex
        )

    def exact_kernel(self) -> DotProductKernel:
        """The exact :class:`~rfgp.kernels.DotProductKernel` with the current hyperparameters."""
        exact = DotProductKernel(
            kind="polynomial", degree=self.degree, bias=float(self.bias.detach().mean()),
            ard_num_dims=self.ard_num_dims, batch_shape=self.batch_shape,
            active_dims=self.active_dims,
        ).to(self.lengthscale)
        exact.lengthscale = self.lengthscale.detach().clone()
        if self.has_bias:
            exact.bias = self.bias.detach().clone()
        return exact

    def extra_repr(self) -> str:
        return (
            f"degree={self.degree}, num_features={self.num_features}, "
            f"projection={self.projection!r}, complex={self.is_complex}, "
            f"input_dim={self.input_dim}"
        )
