"""Compiled TensorSRHT features on the CPU (used when numba is installed).

The GEMM-based TensorSRHT path in :mod:`rfgp.kernels.sketches` spends 64 multiply-adds per
coefficient on each Hadamard transform (two Kronecker stages with inner dimension 32) and
several memory passes per degree for the permutations and products. This module computes the
same features with a compiled kernel instead: for a tile of ``rows`` input rows stored rows-
innermost (``t[j, r]``, so that every butterfly and every permutation gather moves whole
vectors of rows),

.. math::

    \\phi_l(x) = \\frac{1}{\\sqrt{D}} \\prod_{i=1}^{p}
        \\big(H_{d'} \\operatorname{diag}(s_{i, b(l)})\\, \\tilde x\\big)_{\\pi_i(l)},
    \\qquad b(l) = \\lfloor l / d' \\rfloor,

with ``H_{d'}`` the (unnormalised) Sylvester--Hadamard matrix applied by an in-place radix-4 fast
Walsh--Hadamard transform (``2 log2 d'`` additions per coefficient; the signs are applied in its
first pass), ``s`` the Rademacher (complex: ``{1, -1, i, -i}``) signs of degree ``i`` and block
``b``, ``pi_i`` the per-degree, per-block permutations of :func:`~rfgp.kernels.sample_sketch`, and
``x~ = [x / scale, sqrt(bias), 0, ...]`` the homogenised, zero-padded input, built in the tile
fill. The product over degrees is accumulated in the tile and written transposed into the
``(N, D)`` output. The features are exactly those of Algorithm 1 with the same weights; only
the order of the floating-point additions differs from the GEMM path.

The kernels are serial and release the GIL; :func:`tensorsrht` splits the rows over
``torch.get_num_threads()`` Python threads. Compiled code is cached on disk by numba
(``cache=True``), so only the first use on a machine pays the compilation (a few seconds).
Set the environment variable ``RFGP_DISABLE_NUMBA=1`` to use the GEMM path even where numba is
installed.
"""

from __future__ import annotations

import math
import os
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Optional

import torch
from torch import Tensor

from rfgp.ops import _complex_dtype

__all__ = ["available", "applies", "tensorsrht"]

_state = {"checked": False, "numba": False, "kernels": None, "enabled": True}


def available() -> bool:
    """Whether the compiled path can be used: numba importable and not disabled by
    ``RFGP_DISABLE_NUMBA``."""
    if os.environ.get("RFGP_DISABLE_NUMBA", "").strip() not in ("", "0"):
        return False
    if not _state["enabled"]:
        return False
    if not _state["checked"]:
        try:
            import numba  # noqa: F401

            _state["numba"] = True
        except ImportError:
            _state["numba"] = False
        _state["checked"] = True
    return _state["numba"]


def set_enabled(enabled: bool) -> bool:
    """Switch the compiled path on or off for this process; returns the previous setting."""
    if not isinstance(enabled, bool):
        raise TypeError(f"enabled must be a bool, got {type(enabled).__name__}")
    previous = _state["enabled"]
    _state["enabled"] = enabled
    return previous


def applies(x: Tensor, indices: Tensor, *extra: Optional[Tensor]) -> bool:
    """The compiled path handles CPU float32/float64 inputs, unbatched weights and no autograd."""
    if x.device.type != "cpu" or x.dtype not in (torch.float32, torch.float64):
        return False
    if indices.dim() != 2 or indices.device.type != "cpu":
        return False
    if torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (x, *extra)
    ):
        return False
    return available()


def _build():
    import numba
    import numpy as np

    @numba.njit(nogil=True, cache=True)
    def fill(xt, x, scale, root, has_root, r0, m):
        # xt[j, r] = [x / scale, root, 0...][r0 + r, j]; tile rows past m are zero
        d = x.shape[1]
        rows = xt.shape[1]
        for r in range(m):
            for j in range(d):
                xt[j, r] = x[r0 + r, j] / scale[j]
            if has_root:
                xt[d, r] = root
        for j in range(d + has_root):
            for r in range(m, rows):
                xt[j, r] = 0.0

    @numba.njit(nogil=True, cache=True)
    def signed_fwht(t, xt, s, c):
        # t = H (diag(c s) xt), column by column of rows; radix-4 passes, the signs applied in
        # the first pass (radix 2 when log2 d' is odd, so that radix-4 passes finish the rest)
        dp, rows = t.shape
        if dp == 1:
            sa = s[0] * c
            for r in range(rows):
                t[0, r] = xt[0, r] * sa
            return
        levels = 0
        v = dp
        while v > 1:
            v >>= 1
            levels += 1
        h = 1
        if levels % 2 == 1:
            for j in range(0, dp, 2):
                sa = s[j] * c
                sb = s[j + 1] * c
                for r in range(rows):
                    a = xt[j, r] * sa
                    b = xt[j + 1, r] * sb
                    t[j, r] = a + b
                    t[j + 1, r] = a - b
            h = 2
        else:
            for j in range(0, dp, 4):
                s0 = s[j] * c
                s1 = s[j + 1] * c
                s2 = s[j + 2] * c
                s3 = s[j + 3] * c
                for r in range(rows):
                    a0 = xt[j, r] * s0
                    a1 = xt[j + 1, r] * s1
                    a2 = xt[j + 2, r] * s2
                    a3 = xt[j + 3, r] * s3
                    b0 = a0 + a1
                    b1 = a0 - a1
                    b2 = a2 + a3
                    b3 = a2 - a3
                    t[j, r] = b0 + b2
                    t[j + 1, r] = b1 + b3
                    t[j + 2, r] = b0 - b2
                    t[j + 3, r] = b1 - b3
            h = 4
        while h < dp:
            for i0 in range(0, dp, 4 * h):
                for j in range(i0, i0 + h):
                    for r in range(rows):
                        a0 = t[j, r]
                        a1 = t[j + h, r]
                        a2 = t[j + 2 * h, r]
                        a3 = t[j + 3 * h, r]
                        b0 = a0 + a1
                        b1 = a0 - a1
                        b2 = a2 + a3
                        b3 = a2 - a3
                        t[j, r] = b0 + b2
                        t[j + h, r] = b1 + b3
                        t[j + 2 * h, r] = b0 - b2
                        t[j + 3 * h, r] = b1 - b3
            h *= 4

    @numba.njit(nogil=True, cache=True)
    def store(out, acc, r0, m, lo, nb):
        # out[r0 + r, lo + l] = acc[l, r], 16 features at a time so that the tile lines read
        # for one output row stay in the L1 cache for the next
        for l0 in range(0, nb, 16):
            l1 = min(nb, l0 + 16)
            for r in range(m):
                for l in range(l0, l1):
                    out[r0 + r, lo + l] = acc[l, r]

    @numba.njit(nogil=True, cache=True)
    def accumulate(acc, t, coeff, first):
        # acc[l] (*)= t[coeff[l]]: the permutation gather and the product over degrees
        rows = t.shape[1]
        if first:
            for l in range(coeff.shape[0]):
                k = coeff[l]
                for r in range(rows):
                    acc[l, r] = t[k, r]
        else:
            for l in range(coeff.shape[0]):
                k = coeff[l]
                for r in range(rows):
                    acc[l, r] *= t[k, r]

    @numba.njit(nogil=True, cache=True)
    def accumulate_complex(ar, ai, tr, ti, coeff, first):
        # (ar + i ai)[l] (*)= (tr + i ti)[coeff[l]]
        rows = tr.shape[1]
        if first:
            accumulate(ar, tr, coeff, True)
            accumulate(ai, ti, coeff, True)
        else:
            for l in range(coeff.shape[0]):
                k = coeff[l]
                for r in range(rows):
                    u = ar[l, r]
                    v = ai[l, r]
                    gr = tr[k, r]
                    gi = ti[k, r]
                    ar[l, r] = u * gr - v * gi
                    ai[l, r] = u * gi + v * gr

    @numba.njit(nogil=True, cache=True)
    def sketch_rows(x, scale, root, has_root, sre, sim, coeff, scales, out_re, out_im,
                    start, stop, rows, is_complex):
        # Rows start..stop of the features. Complex signs sre + i sim: the transform of
        # (sre + i sim) * x is H(sre * x) + i H(sim * x); real: sim and out_im are unused.
        p, num_blocks, dp = sre.shape
        num_features = out_re.shape[1]
        xt = np.zeros((dp, rows), x.dtype)
        tr = np.empty((dp, rows), x.dtype)
        ar = np.empty((dp, rows), x.dtype)
        extra = dp if is_complex else 1
        ti = np.empty((extra, rows), x.dtype)
        ai = np.empty((extra, rows), x.dtype)
        for r0 in range(start, stop, rows):
            m = min(rows, stop - r0)
            fill(xt, x, scale, root, has_root, r0, m)
            for b in range(num_blocks):
                lo = b * dp
                nb = min(num_features, lo + dp) - lo
                for i in range(p):
                    signed_fwht(tr, xt, sre[i, b], scales[i])
                    if is_complex:
                        signed_fwht(ti, xt, sim[i, b], scales[i])
                        accumulate_complex(ar, ai, tr, ti, coeff[i, lo : lo + nb], i == 0)
                    else:
                        accumulate(ar, tr, coeff[i, lo : lo + nb], i == 0)
                store(out_re, ar, r0, m, lo, nb)
                if is_complex:
                    store(out_im, ai, r0, m, lo, nb)

    return sketch_rows


def _kernels():
    if _state["kernels"] is None:
        _state["kernels"] = _build()
    return _state["kernels"]


def _tile_rows(padded: int) -> int:
    # A tile (d' x rows values, three to five of them) should sit in the L2 cache: 64 rows
    # (measured best at d' = 1024) down to 16 at d' = 4096, multiples of 16 so that the row loops
    # vectorise without remainder; past that, fewer rows keep the tiles at 2^16 values.
    return max(1, min(64, (1 << 16) // padded))


def tensorsrht(
    x: Tensor,
    signs: Tensor,
    indices: Tensor,
    complex: bool,
    scale: Optional[Tensor] = None,
    root: Optional[Tensor] = None,
) -> Tensor:
    """TensorSRHT features ``(N, D)`` of ``x`` ``(N, d)`` for unbatched weights.

    Args:
        x: ``(N, d)`` CPU float32/float64 input, ``d (+1 with root) <= d'``.
        signs: ``(p, K, d')`` (real) or ``(p, K, d', 2)`` (complex: real and imaginary parts).
        indices: ``(p, D)`` flat coefficient indices (feature ``l`` of block ``l // d'``).
        complex: whether the signs are complex; the output is then complex.
        scale: optional ``(d, 1)`` or ``(d,)`` divisor of the columns of ``x``.
        root: optional 0-dimensional value appended as column ``d`` (``sqrt(bias)``).

    Returns:
        ``(N, D)`` features, of ``x.dtype`` (real) or the matching complex dtype; ``None`` (with
        a ``RuntimeWarning``, and the compiled path switched off) if numba cannot compile the
        kernels here.

    Example:
        >>> from rfgp.kernels import sample_sketch
        >>> w = sample_sketch(3, 64, 20, projection="tensorsrht",
        ...                   generator=torch.Generator().manual_seed(0))
        >>> x = torch.randn(100, 20, dtype=torch.float64)
        >>> phi = tensorsrht(x, w["signs"], w["indices"], complex=False) if available() else None
        >>> phi is None or tuple(phi.shape) == (100, 64)
        True
    """
    import numpy as np

    n, d = x.shape
    dtype = x.dtype
    padded = signs.shape[-2] if complex else signs.shape[-1]
    degree, num_features = indices.shape
    x = x.detach().contiguous()
    xs = x.numpy()
    if scale is None:
        sc = np.ones(d, dtype=xs.dtype)
    else:
        sc = scale.detach().to(dtype).reshape(-1)
        sc = sc.expand(d).contiguous().numpy()  # one shared lengthscale or one per column
    has_root = root is not None
    rt = float(root.detach()) if has_root else 0.0
    block = torch.arange(num_features, device=indices.device) // padded
    coeff = (indices - block * padded).contiguous().numpy()
    scales = np.ones(degree, dtype=xs.dtype)
    scales[0] = 1.0 / math.sqrt(num_features)
    rows = _tile_rows(padded)
    if complex:
        out = torch.empty(n, num_features, dtype=_complex_dtype(dtype))
        parts = torch.view_as_real(out).numpy()
        s = signs.detach().to(dtype)
        # signs sre + i sim into the real and imaginary views of the output
        arrays = (s[..., 0].contiguous().numpy(), s[..., 1].contiguous().numpy(), coeff, scales,
                  parts[..., 0], parts[..., 1])
    else:
        out = torch.empty(n, num_features, dtype=dtype)
        s = signs.detach().to(dtype).contiguous().numpy()
        res = out.numpy()
        arrays = (s, s, coeff, scales, res, res)  # the imaginary slots are unused

    if n == 0:
        return out
    tiles = -(-n // rows)
    threads = max(1, min(torch.get_num_threads(), tiles))
    try:
        kernel = _kernels()  # compiled (or loaded from numba's cache) on first use

        def work(start: int, stop: int) -> None:
            kernel(xs, sc, rt, has_root, *arrays, start, stop, rows, complex)

        if threads == 1:
            work(0, n)
        else:
            # contiguous ranges of whole tiles, one per thread (the kernels release the GIL)
            bounds = [min(n, (tiles * k // threads) * rows) for k in range(threads + 1)]
            with ThreadPoolExecutor(max_workers=threads) as pool:
                jobs = [pool.submit(work, a, b) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
                for job in jobs:
                    job.result()
    except Exception as err:  # noqa: BLE001
        # The kernels raise nothing data-dependent (no bounds checks, no error paths), so an
        # exception here is numba failing to compile or cache them on this platform.
        _state["enabled"] = False
        warnings.warn(
            f"the compiled TensorSRHT kernel is unavailable ({type(err).__name__}: {err}); "
            "using the GEMM path from now on",
            RuntimeWarning,
            stacklevel=3,
        )
        return None
    return out
