"""Backward kernels of the compiled TensorSRHT: gradient of the homogenised input."""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from typing import Optional

import torch
from torch import Tensor

_state = {"kernels": None}


def _build():
    import numba
    import numpy as np

    @numba.njit(nogil=True, cache=True)
    def fill(xt, x, scale, root, has_root, r0, m):
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
    def butterflies(t, h):
        # radix-4 passes from stride h on, in place
        dp, rows = t.shape
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
    def signed_fwht(t, xt, s, c):
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
        if levels % 2 == 1:
            for j in range(0, dp, 2):
                sa = s[j] * c
                sb = s[j + 1] * c
                for r in range(rows):
                    a = xt[j, r] * sa
                    b = xt[j + 1, r] * sb
                    t[j, r] = a + b
                    t[j + 1, r] = a - b
            butterflies(t, 2)
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
            butterflies(t, 4)

    @numba.njit(nogil=True, cache=True)
    def butterflies_to(t, h, last):
        # radix-4 passes of strides h, 4h, ..., last (inclusive), in place
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
    def fwht_signed_add(acc, t, s, c):
        # acc += diag(c s) H t, t overwritten: the transpose of signed_fwht. The butterflies run
        # in place; the last pass adds its signed results into acc instead of storing them.
        dp, rows = t.shape
        if dp == 1:
            sa = s[0] * c
            for r in range(rows):
                acc[0, r] += t[0, r] * sa
            return
        levels = 0
        v = dp
        while v > 1:
            v >>= 1
            levels += 1
        if levels % 2 == 1:
            h = 2
            if dp > 2:
                butterflies_to(t, 1, dp // 8)
            # remaining radix-2 pass of stride dp / 2 fused with the signed accumulation
            half = dp // 2
            for j in range(half):
                sa = s[j] * c
                sb = s[j + half] * c
                for r in range(rows):
                    a = t[j, r]
                    b = t[j + half, r]
                    acc[j, r] += (a + b) * sa
                    acc[j + half, r] += (a - b) * sb
            return
        h = 1
        if dp > 4:
            butterflies_to(t, 1, dp // 16)
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
        rows = t.shape[1]
        for l in range(coeff.shape[0]):
            k = coeff[l]
            for r in range(rows):
                a[l, r] = t[k, r]

    @numba.njit(nogil=True, cache=True)
    def scatter(t, a, coeff, full):
        # t[coeff[l]] = a[l]; coefficients no feature reads are zero
        rows = t.shape[1]
        if not full:
            t[:, :] = 0.0
        for l in range(coeff.shape[0]):
            k = coeff[l]
            for r in range(rows):
                t[k, r] = a[l, r]

    @numba.njit(nogil=True, cache=True)
    def load(gt, g, r0, m, lo, nb):
        # gt[l, r] = g[r0 + r, lo + l]; tile rows past m are zero
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
        # a[i, l] <- g[l] prod_{j != i} a[j, l]: suffix products into q, then a running prefix
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
        # (ar + i ai)[i, l] <- g[l] conj(prod_{j != i} a[j, l]): the autograd convention's
        # gradient of a product with respect to one complex factor
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
        # stages < 3 stops each block early (after the recomputed transforms and gathers, or
        # after the products as well): only for timing the stages separately
        p, num_blocks, dp = sre.shape
        num_features = g_re.shape[1]
        width = x.shape[1] + has_root
        dt = x.dtype
        xt = np.zeros((dp, rows), dt)
        acc = np.empty((dp, rows), dt)
        tr = np.empty((dp, rows), dt)
        ar = np.empty((p, dp, rows), dt)
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
                if is_complex:
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

    return backward_rows


def _kernels():
    if _state["kernels"] is None:
        _state["kernels"] = _build()
    return _state["kernels"]


def backward_tile_rows(padded: int) -> int:
    return max(1, min(64, (1 << 16) // padded))


def input_gradient(
    x: Tensor, signs: Tensor, indices: Tensor, complex: bool, grad: Tensor,
    scale: Optional[Tensor] = None, root: Optional[Tensor] = None, rows: Optional[int] = None,
    stages: int = 3,
) -> Tensor:
    """Gradient ``(N, d + [root])`` with respect to the homogenised input ``[x / scale, root]``."""
    import numpy as np

    n, d = x.shape
    dtype = x.dtype
    padded = signs.shape[-2] if complex else signs.shape[-1]
    degree, num_features = indices.shape
    xs = x.detach().contiguous().numpy()
    if scale is None:
        sc = np.ones(d, dtype=xs.dtype)
    else:
        sc = scale.detach().to(dtype).reshape(-1).expand(d).contiguous().numpy()
    has_root = root is not None
    rt = float(root.detach()) if has_root else 0.0
    block = torch.arange(num_features) // padded
    coeff = (indices - block * padded).contiguous().numpy()
    scales = np.ones(degree, dtype=xs.dtype)
    scales[0] = 1.0 / math.sqrt(num_features)
    rows = rows or backward_tile_rows(padded)
    out = torch.empty(n, d + has_root, dtype=dtype)
    res = out.numpy()
    grad = grad.detach().contiguous()
    if complex:
        parts = torch.view_as_real(grad.to(
            torch.complex128 if dtype == torch.float64 else torch.complex64)).numpy()
        s = signs.detach().to(dtype)
        arrays = (s[..., 0].contiguous().numpy(), s[..., 1].contiguous().numpy(), coeff, scales,
                  parts[..., 0], parts[..., 1], res)
    else:
        s = signs.detach().to(dtype).contiguous().numpy()
        g = grad.to(dtype).numpy()
        arrays = (s, s, coeff, scales, g, g, res)
    if n == 0:
        return out
    tiles = -(-n // rows)
    threads = max(1, min(torch.get_num_threads(), tiles))
    kernel = _kernels()

    def work(start: int, stop: int) -> None:
        kernel(xs, sc, rt, has_root, *arrays, start, stop, rows, complex, stages)

    if threads == 1:
        work(0, n)
    else:
        bounds = [min(n, (tiles * k // threads) * rows) for k in range(threads + 1)]
        with ThreadPoolExecutor(max_workers=threads) as pool:
            jobs = [pool.submit(work, a, b) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
            for job in jobs:
                job.result()
    return out
