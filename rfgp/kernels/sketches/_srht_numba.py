"""Compiled TensorSRHT features on the CPU, forward and backward (used when numba is installed).

The GEMM-based TensorSRHT path (:mod:`rfgp.kernels.sketches.tensorsrht`) spends 64 multiply-adds
per coefficient on each Hadamard transform (two Kronecker stages with inner dimension 32) and
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

Training needs gradients with respect to the lengthscale and the bias (and sometimes ``x``).
The features are a product of factors each linear in ``x~``, and ``H`` is symmetric, so the
backward pass is the same machinery transposed (:func:`tensorsrht_backward`): per tile and
block, the factors are recomputed, each degree's factor is replaced by the incoming gradient
times the product of the other degrees' factors, scattered back through the permutation and
transformed by ``H`` with the signs applied last. :class:`TensorSRHTFunction` wires forward and
backward into autograd, and :func:`differentiable_tensorsrht` is the entry point the sketches
call.

The kernels are serial and release the GIL; the rows are split over
``torch.get_num_threads()`` Python threads. Compiled code is cached on disk by numba
(``cache=True``), so only the first use on a machine pays the compilation (a few seconds).
Without numba (the ``fast`` extra: ``pip install "rfgp[fast]"``) the sketches warn once and
take the GEMM path. Set the environment variable ``RFGP_DISABLE_NUMBA=1`` to use the GEMM path
(without the warning) even where numba is installed.
"""

from __future__ import annotations

import math
import os
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Optional

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from rfgp.ops import complex_dtype

__all__ = [
    "available",
    "applies",
    "set_enabled",
    "tensorsrht",
    "tensorsrht_backward",
    "TensorSRHTFunction",
    "differentiable_tensorsrht",
]

_state = {"checked": False, "numba": False, "kernels": None, "enabled": True, "warned": False,
          "backward_ready": set()}


def _disabled_by_environment() -> bool:
    return os.environ.get("RFGP_DISABLE_NUMBA", "").strip() not in ("", "0")


def available() -> bool:
    """Whether the compiled path can be used: numba importable and not disabled by
    ``RFGP_DISABLE_NUMBA``."""
    if _disabled_by_environment():
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


def applies(x: Tensor, indices: Tensor) -> bool:
    """The compiled path handles CPU float32/float64 inputs and unbatched weights, with or
    without autograd. Where only numba is missing, says so once (a ``UserWarning`` naming the
    ``fast`` extra)."""
    if x.device.type != "cpu" or x.dtype not in (torch.float32, torch.float64):
        return False
    if indices.dim() != 2 or indices.device.type != "cpu":
        return False
    if available():
        return True
    if (_state["checked"] and not _state["numba"] and not _state["warned"]
            and not _disabled_by_environment()):
        _state["warned"] = True
        warnings.warn(
            "numba is not installed, so TensorSRHT features take the slower GEMM path; "
            "install the compiled kernels with the fast extra (pip install \"rfgp[fast]\"), "
            "or set RFGP_DISABLE_NUMBA=1 to choose the GEMM path without this warning",
            UserWarning,
            stacklevel=4,
        )
    return False


def _build():
    import numba
    import numpy as np

    # ------------------------------------------------------------------ shared tile steps
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
    def butterflies(t, h, last):
        # in-place radix-4 passes of strides h, 4 h, ... up to last
        dp, rows = t.shape
        while h <= last:
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
    def log2(dp):
        levels = 0
        while dp > 1:
            dp >>= 1
            levels += 1
        return levels

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
        if log2(dp) % 2 == 1:
            for j in range(0, dp, 2):
                sa = s[j] * c
                sb = s[j + 1] * c
                for r in range(rows):
                    a = xt[j, r] * sa
                    b = xt[j + 1, r] * sb
                    t[j, r] = a + b
                    t[j + 1, r] = a - b
            butterflies(t, 2, dp // 4)
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
            butterflies(t, 4, dp // 4)

    # ------------------------------------------------------------------ forward
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

    # ------------------------------------------------------------------ backward
    @numba.njit(nogil=True, cache=True)
    def fwht_signed_add(acc, t, s, c):
        # acc += diag(c s) H t, t overwritten: the transpose of signed_fwht (H is symmetric).
        # In-place butterflies; the last pass adds its signed results into acc.
        dp, rows = t.shape
        if dp == 1:
            sa = s[0] * c
            for r in range(rows):
                acc[0, r] += t[0, r] * sa
            return
        if log2(dp) % 2 == 1:
            butterflies(t, 1, dp // 8)
            half = dp // 2  # the remaining radix-2 pass
            for j in range(half):
                sa = s[j] * c
                sb = s[j + half] * c
                for r in range(rows):
                    a = t[j, r]
                    b = t[j + half, r]
                    acc[j, r] += (a + b) * sa
                    acc[j + half, r] += (a - b) * sb
            return
        butterflies(t, 1, dp // 16)
        h = dp // 4
        for j in range(h):
            s0 = s[j] * c
            s1 = s[j + h] * c
            s2 = s[j + 2 * h] * c
            s3 = s[j + 3 * h] * c
            for r in range(rows):
                a0 = t[j, r]
                a1 = t[j + h, r]
                a2 = t[j + 2 * h, r]
                a3 = t[j + 3 * h, r]
                b0 = a0 + a1
                b1 = a0 - a1
                b2 = a2 + a3
                b3 = a2 - a3
                acc[j, r] += (b0 + b2) * s0
                acc[j + h, r] += (b1 + b3) * s1
                acc[j + 2 * h, r] += (b0 - b2) * s2
                acc[j + 3 * h, r] += (b1 - b3) * s3

    @numba.njit(nogil=True, cache=True)
    def gather(a, t, coeff):
        # a[l] = t[coeff[l]]
        rows = t.shape[1]
        for l in range(coeff.shape[0]):
            k = coeff[l]
            for r in range(rows):
                a[l, r] = t[k, r]

    @numba.njit(nogil=True, cache=True)
    def scatter(t, a, coeff, full):
        # t[coeff[l]] = a[l], the transposed gather; coefficients no feature reads (a
        # truncated last block) are zero
        rows = t.shape[1]
        if not full:
            t[:, :] = 0.0
        for l in range(coeff.shape[0]):
            k = coeff[l]
            for r in range(rows):
                t[k, r] = a[l, r]

    @numba.njit(nogil=True, cache=True)
    def load(gt, g, r0, m, lo, nb):
        # gt[l, r] = g[r0 + r, lo + l] (the transposed store); tile rows past m are zero
        rows = gt.shape[1]
        for l0 in range(0, nb, 16):
            l1 = min(nb, l0 + 16)
            for r in range(m):
                for l in range(l0, l1):
                    gt[l, r] = g[r0 + r, lo + l]
        for l in range(nb):
            for r in range(m, rows):
                gt[l, r] = 0.0

    @numba.njit(nogil=True, cache=True)
    def leave_one_out(a, g, q, run, nb):
        # a[i, l] <- g[l] prod_{j != i} a[j, l]: suffix products into q, then a running
        # prefix (no division, so zero factors are exact)
        p, _, rows = a.shape
        for l in range(nb):
            for r in range(rows):
                run[r] = 1.0
            for i in range(p - 1, -1, -1):
                for r in range(rows):
                    q[i, r] = run[r]
                    run[r] *= a[i, l, r]
            for r in range(rows):
                run[r] = g[l, r]
            for i in range(p):
                for r in range(rows):
                    v = a[i, l, r]
                    a[i, l, r] = run[r] * q[i, r]
                    run[r] *= v

    @numba.njit(nogil=True, cache=True)
    def leave_one_out_complex(ar, ai, gr, gi, qr, qi, run_r, run_i, nb):
        # (ar + i ai)[i, l] <- g[l] conj(prod_{j != i} a[j, l]): autograd's gradient of a
        # complex product with respect to one factor
        p, _, rows = ar.shape
        for l in range(nb):
            for r in range(rows):
                run_r[r] = 1.0
                run_i[r] = 0.0
            for i in range(p - 1, -1, -1):
                for r in range(rows):
                    u = run_r[r]
                    v = run_i[r]
                    qr[i, r] = u
                    qi[i, r] = v
                    xr = ar[i, l, r]
                    xi = ai[i, l, r]
                    run_r[r] = u * xr - v * xi
                    run_i[r] = u * xi + v * xr
            for r in range(rows):
                run_r[r] = gr[l, r]
                run_i[r] = gi[l, r]
            for i in range(p):
                for r in range(rows):
                    u = run_r[r]
                    v = run_i[r]
                    wr = qr[i, r]
                    wi = qi[i, r]
                    xr = ar[i, l, r]
                    xi = ai[i, l, r]
                    ar[i, l, r] = u * wr + v * wi
                    ai[i, l, r] = v * wr - u * wi
                    run_r[r] = u * xr + v * xi
                    run_i[r] = v * xr - u * xi

    @numba.njit(nogil=True, cache=True)
    def store_input(out, acc, r0, m, width):
        for r in range(m):
            for j in range(width):
                out[r0 + r, j] = acc[j, r]

    @numba.njit(nogil=True, cache=True)
    def backward_rows(x, scale, root, has_root, sre, sim, coeff, scales, g_re, g_im, out,
                      start, stop, rows, is_complex, stages):
        # Rows start..stop of the gradient with respect to [x / scale, root]. stages < 3 stops
        # each block early (after the recomputed transforms and gathers, or after the
        # products as well): only for timing the stages separately.
        p, num_blocks, dp = sre.shape
        num_features = g_re.shape[1]
        width = x.shape[1] + has_root
        dt = x.dtype
        xt = np.zeros((dp, rows), dt)
        acc = np.empty((dp, rows), dt)
        tr = np.empty((dp, rows), dt)
        ar = np.empty((p, dp, rows), dt)  # every degree's factors of the block, then gradients
        gtr = np.empty((dp, rows), dt)
        q = np.empty((p, rows), dt)
        run = np.empty(rows, dt)
        extra = dp if is_complex else 1
        ti = np.empty((extra, rows), dt)
        ai = np.empty((p, extra, rows), dt)
        gti = np.empty((extra, rows), dt)
        qi = np.empty((p, rows), dt)
        run_i = np.empty(rows, dt)
        for r0 in range(start, stop, rows):
            m = min(rows, stop - r0)
            fill(xt, x, scale, root, has_root, r0, m)
            acc[:, :] = 0.0
            for b in range(num_blocks):
                lo = b * dp
                nb = min(num_features, lo + dp) - lo
                for i in range(p):
                    signed_fwht(tr, xt, sre[i, b], scales[i])
                    gather(ar[i], tr, coeff[i, lo : lo + nb])
                    if is_complex:
                        signed_fwht(ti, xt, sim[i, b], scales[i])
                        gather(ai[i], ti, coeff[i, lo : lo + nb])
                if stages < 2:
                    continue
                load(gtr, g_re, r0, m, lo, nb)
                if is_complex:
                    load(gti, g_im, r0, m, lo, nb)
                    leave_one_out_complex(ar, ai, gtr, gti, q, qi, run, run_i, nb)
                else:
                    leave_one_out(ar, gtr, q, run, nb)
                if stages < 3:
                    continue
                for i in range(p):
                    scatter(tr, ar[i], coeff[i, lo : lo + nb], nb == dp)
                    fwht_signed_add(acc, tr, sre[i, b], scales[i])
                    if is_complex:
                        scatter(ti, ai[i], coeff[i, lo : lo + nb], nb == dp)
                        fwht_signed_add(acc, ti, sim[i, b], scales[i])
            store_input(out, acc, r0, m, width)

    return sketch_rows, backward_rows


def _kernels():
    if _state["kernels"] is None:
        _state["kernels"] = _build()
    return _state["kernels"]


def _tile_rows(padded: int) -> int:
    # A tile (d' x rows values, three to five of them) should sit in the L2 cache: 64 rows
    # (measured best at d' = 1024) down to 16 at d' = 4096, multiples of 16 so that the row loops
    # vectorise without remainder; past that, fewer rows keep the tiles at 2^16 values. The
    # backward kernel keeps p such tiles of factors per block and is still fastest at 64 rows
    # (measured at d' = 1024, p = 7: 16 rows are twice as slow).
    return max(1, min(64, (1 << 16) // padded))


def _operands(x: Tensor, signs: Tensor, indices: Tensor, complex: bool,
              scale: Optional[Tensor], root: Optional[Tensor]):
    """The kernels' arguments shared by forward and backward: ``(x, scale, root, has_root,
    real signs, imaginary signs, per-block coefficient indices, per-degree factors)``, numpy
    views or copies in ``x``'s dtype."""
    import numpy as np

    d = x.shape[1]
    dtype = x.dtype
    num_features = indices.shape[1]
    padded = signs.shape[-2] if complex else signs.shape[-1]
    xs = x.detach().contiguous().numpy()
    if scale is None:
        sc = np.ones(d, dtype=xs.dtype)
    else:
        sc = scale.detach().to(dtype).reshape(-1)
        sc = sc.expand(d).contiguous().numpy()  # one shared lengthscale or one per column
    has_root = root is not None
    rt = float(root.detach()) if has_root else 0.0
    block = torch.arange(num_features, device=indices.device) // padded
    coeff = (indices - block * padded).contiguous().numpy()
    scales = np.ones(indices.shape[0], dtype=xs.dtype)
    scales[0] = 1.0 / math.sqrt(num_features)  # 1 / sqrt(D), folded into degree 0's signs
    s = signs.detach().to(dtype)
    if complex:
        sre, sim = s[..., 0].contiguous().numpy(), s[..., 1].contiguous().numpy()
    else:
        sre = sim = s.contiguous().numpy()  # the imaginary slot is unused
    return xs, sc, rt, has_root, sre, sim, coeff, scales


def _over_rows(work, n: int, rows: int) -> None:
    """``work(start, stop)`` over contiguous ranges of whole tiles, one per thread (the
    kernels release the GIL)."""
    tiles = -(-n // rows)
    threads = max(1, min(torch.get_num_threads(), tiles))
    if threads == 1:
        work(0, n)
        return
    bounds = [min(n, (tiles * k // threads) * rows) for k in range(threads + 1)]
    with ThreadPoolExecutor(max_workers=threads) as pool:
        jobs = [pool.submit(work, a, b) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
        for job in jobs:
            job.result()


def _give_up(err: Exception) -> None:
    # The kernels raise nothing data-dependent (no bounds checks, no error paths), so an
    # exception from them is numba failing to compile or cache them on this platform.
    _state["enabled"] = False
    warnings.warn(
        f"the compiled TensorSRHT kernel is unavailable ({type(err).__name__}: {err}); "
        "using the GEMM path from now on",
        RuntimeWarning,
        stacklevel=4,
    )


def tensorsrht(
    x: Tensor,
    signs: Tensor,
    indices: Tensor,
    complex: bool,
    scale: Optional[Tensor] = None,
    root: Optional[Tensor] = None,
) -> Optional[Tensor]:
    """TensorSRHT features ``(N, D)`` of ``x`` ``(N, d)`` for unbatched weights (no autograd).

    Args:
        x: ``(N, d)`` CPU float32/float64 input, ``d (+1 with root) <= d'``.
        signs: ``(p, K, d')`` (real) or ``(p, K, d', 2)`` (complex: real and imaginary parts).
        indices: ``(p, D)`` flat coefficient indices (feature ``l`` of block ``l // d'``).
        complex: whether the signs are complex; the output is then complex.
        scale: optional ``(d, 1)`` or ``(d,)`` divisor of the columns of ``x`` (or one value).
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
    n = x.shape[0]
    num_features = indices.shape[1]
    padded = signs.shape[-2] if complex else signs.shape[-1]
    operands = _operands(x, signs, indices, complex, scale, root)
    if complex:
        out = torch.empty(n, num_features, dtype=complex_dtype(x.dtype))
        parts = torch.view_as_real(out).numpy()
        outputs = (parts[..., 0], parts[..., 1])  # the real and imaginary views of the output
    else:
        out = torch.empty(n, num_features, dtype=x.dtype)
        outputs = (out.numpy(), out.numpy())  # the imaginary slot is unused
    if n == 0:
        return out
    rows = _tile_rows(padded)
    try:
        kernel = _kernels()[0]  # compiled (or loaded from numba's cache) on first use
        _over_rows(lambda a, b: kernel(*operands, *outputs, a, b, rows, complex), n, rows)
    except Exception as err:  # noqa: BLE001
        _give_up(err)
        return None
    return out


def tensorsrht_backward(
    x: Tensor,
    signs: Tensor,
    indices: Tensor,
    complex: bool,
    grad: Tensor,
    scale: Optional[Tensor] = None,
    root: Optional[Tensor] = None,
    stages: int = 3,
) -> Tensor:
    r"""Gradient with respect to the homogenised input ``[x / scale, root]`` of the features.

    For the features :math:`\phi_l = \prod_i a_{i,l}` with :math:`a_{i,l} = c_i (H
    \operatorname{diag}(s_{i,b(l)}) \tilde x)_{\pi_i(l)}` (``c_0 = 1/sqrt(D)``, else 1) and
    an incoming gradient :math:`g = \partial L / \partial \phi` (for complex features
    autograd's :math:`\partial L/\partial \mathrm{Re}\,\phi + i\,\partial L/\partial
    \mathrm{Im}\,\phi`),

    .. math::
        \bar{\tilde x} = \sum_{i, b} c_i\, \mathrm{Re}\Big[\operatorname{diag}(\bar s_{i,b})
            \, H\, P_{\pi_{i,b}}^\top \big(g \odot \overline{\textstyle\prod_{j \ne i}
            a_j}\big)\Big]

    (the transform is linear and :math:`H` symmetric: the backward pass is the transposed
    transform, the gather's transpose a scatter). The factors are recomputed tile by tile,
    not stored.

    Args:
        x, signs, indices, complex, scale, root: as for :func:`tensorsrht`.
        grad: ``(N, D)`` incoming gradient, real, or complex for complex signs.
        stages: 3 (the gradient); 1 or 2 stop each block after the recomputed transforms or
            after the products, for timing the stages (the result is then zero).

    Returns:
        ``(N, d)``, or ``(N, d + 1)`` with ``root``: the gradient with respect to ``x / scale``
        (and the root column).

    Example:
        Every feature is homogeneous of degree ``p`` in :math:`\tilde x`, so (Euler)
        :math:`\tilde x^\top \bar{\tilde x} = p\, g^\top \phi` row by row:

        >>> from rfgp.kernels import sample_sketch
        >>> w = sample_sketch(3, 64, 8, projection="tensorsrht",
        ...                   generator=torch.Generator().manual_seed(0))
        >>> x = torch.randn(10, 7, dtype=torch.float64)
        >>> root = torch.tensor(0.5, dtype=torch.float64)
        >>> if available():
        ...     phi = tensorsrht(x, w["signs"], w["indices"], False, root=root)
        ...     g = torch.randn_like(phi)
        ...     z = tensorsrht_backward(x, w["signs"], w["indices"], False, g, root=root)
        ...     x_tilde = torch.cat([x, root.expand(10, 1)], -1)
        ...     ok = z.shape == (10, 8) and torch.allclose((x_tilde * z).sum(-1),
        ...                                                3 * (g * phi).sum(-1))
        ... else:
        ...     ok = True
        >>> ok
        True
    """
    n, d = x.shape
    padded = signs.shape[-2] if complex else signs.shape[-1]
    operands = _operands(x, signs, indices, complex, scale, root)
    out = torch.empty(n, d + (root is not None), dtype=x.dtype)
    grad = grad.detach()
    if complex:
        parts = torch.view_as_real(grad.to(complex_dtype(x.dtype)).contiguous()).numpy()
        grads = (parts[..., 0], parts[..., 1])
    else:
        g = grad.to(x.dtype).contiguous().numpy()
        grads = (g, g)
    if n == 0:
        return out
    rows = _tile_rows(padded)
    kernel = _kernels()[1]
    result = out.numpy()
    _over_rows(lambda a, b: kernel(*operands, *grads, result, a, b, rows, complex, stages),
               n, rows)
    return out


class TensorSRHTFunction(torch.autograd.Function):
    r"""Compiled TensorSRHT features of ``[x / scale, root]``, differentiable in ``x``,
    ``scale`` and ``root``: forward :func:`tensorsrht`, backward :func:`tensorsrht_backward`
    and the chain rule through the homogenisation,

    .. math::
        \bar x_{nj} = \bar{\tilde x}_{nj} / \ell_j, \qquad
        \bar\ell_j = -\sum_n \bar{\tilde x}_{nj}\, x_{nj} / \ell_j^2 \ \ (\text{summed over }
        j \text{ for one shared } \ell), \qquad
        \overline{\sqrt b} = \sum_n \bar{\tilde x}_{n, d}.

    Only the inputs are saved for the backward pass. Not twice differentiable.

    ``TensorSRHTFunction.apply(x, scale, root, signs, indices, complex)`` takes the arguments of
    :func:`tensorsrht` (``x (N, d)``, ``scale`` ``(d,)``, ``(1,)`` or ``None``, ``root`` 0-d or
    ``None``) and returns its ``(N, D)`` features; it raises an internal exception where numba
    cannot compile, so call it through :func:`differentiable_tensorsrht`, which falls back.

    Example:
        >>> from rfgp.kernels import sample_sketch
        >>> w = sample_sketch(2, 16, 4, projection="tensorsrht",
        ...                   generator=torch.Generator().manual_seed(0))
        >>> x = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
        >>> if available():
        ...     phi = TensorSRHTFunction.apply(x, None, None, w["signs"], w["indices"], False)
        ...     phi.sum().backward()
        ...     ok = phi.shape == (5, 16) and x.grad.shape == (5, 3)
        ... else:
        ...     ok = True
        >>> ok
        True
    """

    @staticmethod
    def forward(ctx, x: Tensor, scale: Optional[Tensor], root: Optional[Tensor],
                signs: Tensor, indices: Tensor, complex: bool) -> Tensor:
        out = tensorsrht(x, signs, indices, complex, scale, root)
        if out is None:
            raise _Unavailable
        ctx.complex = complex
        ctx.has_scale, ctx.has_root = scale is not None, root is not None
        empty = x.new_empty(0)
        ctx.save_for_backward(x, empty if scale is None else scale,
                              empty if root is None else root, signs, indices)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):
        x, scale, root, signs, indices = ctx.saved_tensors
        scale = scale if ctx.has_scale else None
        root = root if ctx.has_root else None
        need_x, need_scale, need_root = ctx.needs_input_grad[:3]
        x_bar = scale_bar = root_bar = None
        if need_x or need_scale or need_root:
            d = x.shape[1]
            z_bar = tensorsrht_backward(x, signs, indices, ctx.complex, grad, scale, root)
            zx = z_bar[:, :d]  # (N, d): the gradient with respect to x / scale
            if need_x:
                x_bar = zx if scale is None else zx / scale.reshape(-1)
            if need_scale:
                s = scale.reshape(-1)
                if s.numel() == d:
                    scale_bar = -(zx * x).sum(0) / s.square()
                else:  # one shared value: x / l in every column
                    scale_bar = -(zx * x).sum().reshape(1) / s.square()
                scale_bar = scale_bar.reshape(scale.shape)
            if need_root:
                root_bar = z_bar[:, d].sum().reshape(root.shape)
        return x_bar, scale_bar, root_bar, None, None, None


class _Unavailable(Exception):
    """Raised inside the autograd function when the compiled kernel cannot run here."""


def differentiable_tensorsrht(
    x: Tensor,
    signs: Tensor,
    indices: Tensor,
    complex: bool,
    scale: Optional[Tensor] = None,
    root: Optional[Tensor] = None,
) -> Optional[Tensor]:
    """:func:`tensorsrht`, differentiable in ``x``, ``scale`` and ``root`` when autograd
    records (:class:`TensorSRHTFunction`).

    Returns ``None`` (warned once) when numba cannot compile the kernels here; the caller then
    takes the GEMM path.

    Example:
        >>> from rfgp.kernels import sample_sketch
        >>> w = sample_sketch(2, 16, 4, projection="tensorsrht",
        ...                   generator=torch.Generator().manual_seed(0))
        >>> x = torch.randn(5, 3, dtype=torch.float64)
        >>> scale = torch.ones(3, dtype=torch.float64, requires_grad=True)
        >>> root = torch.tensor(1.0, dtype=torch.float64, requires_grad=True)
        >>> phi = differentiable_tensorsrht(x, w["signs"], w["indices"], False, scale, root)
        >>> if phi is not None:
        ...     phi.sum().backward()
        >>> phi is None or (scale.grad.shape, root.grad.shape) == ((3,), ())
        True
    """
    inputs = (x, scale, root)
    if not (torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in inputs)):
        return tensorsrht(x, signs, indices, complex, scale, root)
    if not _backward_ready(x.dtype):
        return None
    try:
        return TensorSRHTFunction.apply(x, scale, root, signs, indices, complex)
    except _Unavailable:
        return None


def _backward_ready(dtype: torch.dtype) -> bool:
    # numba compiles on first call, per dtype: a one-row call here, before autograd records,
    # so that a platform where the backward kernel cannot compile falls back to the GEMM path
    # now rather than failing in the middle of a backward pass
    ready = _state["backward_ready"]
    if dtype not in ready:
        try:
            x = torch.zeros(1, 1, dtype=dtype)
            signs = torch.ones(1, 1, 1, dtype=torch.float64)
            indices = torch.zeros(1, 1, dtype=torch.long)
            tensorsrht_backward(x, signs, indices, False, torch.zeros(1, 1, dtype=dtype))
        except Exception as err:  # noqa: BLE001
            _give_up(err)
            return False
        ready.add(dtype)
    return True
