r"""The numba kernels of the compiled TensorSRHT path (:mod:`rfgp.kernels._sketches._srht_numba`).

:func:`build` compiles them (or loads them from numba's on-disk cache) on first use:
``sketch_rows`` computes the features of a range of input rows and ``backward_rows`` the
gradient with respect to the homogenised input, tile by tile of rows stored rows-innermost
(``t[j, r]``). Both run the signed fast Walsh--Hadamard transform :math:`H_{d'}
\operatorname{diag}(s)` (``signed_fwht``) or its transpose (``fwht_signed_add``) with radix-4
passes through one butterfly, :math:`H_4`, and a radix-2 pass where :math:`\log_2 d'` is odd.
The formulas are documented in :mod:`rfgp.kernels._sketches._srht_numba`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = ["Kernels", "build"]


class Kernels(NamedTuple):
    """The compiled functions: the two row-range kernels and the transform pair they share."""

    sketch_rows: Any
    backward_rows: Any
    signed_fwht: Any  # (t, xt, s, c): t = c H diag(s) xt, for (d', rows) arrays
    fwht_signed_add: Any  # (acc, t, s, c): acc += c diag(s) H t, t overwritten


def build() -> Kernels:
    """Compile the kernels (numba is imported here).

    Example:
        The Sylvester--Hadamard transform of ``[0, 1, 2, 3]`` (unit signs), where numba is
        installed:

        >>> import importlib.util
        >>> import numpy as np
        >>> t, xt = np.empty((4, 1)), np.arange(4.0).reshape(4, 1)
        >>> if importlib.util.find_spec("numba"):
        ...     build().signed_fwht(t, xt, np.ones(4), 1.0)
        ...     ok = t.ravel().tolist() == [6.0, -2.0, -4.0, 0.0]
        ... else:
        ...     ok = True
        >>> ok
        True
    """
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

    # ------------------------------------------------------------------ the transform
    @numba.njit(nogil=True, cache=True)
    def radix4(a0, a1, a2, a3):
        # the butterfly, H_4 [a0, a1, a2, a3] in eight additions: every radix-4 pass of the
        # transform and of its transpose goes through it
        b0 = a0 + a1
        b1 = a0 - a1
        b2 = a2 + a3
        b3 = a2 - a3
        return b0 + b2, b1 + b3, b0 - b2, b1 - b3

    @numba.njit(nogil=True, cache=True)
    def butterflies(t, h, last):
        # in-place radix-4 passes of strides h, 4 h, ... up to last
        dp, rows = t.shape
        while h <= last:
            for i0 in range(0, dp, 4 * h):
                for j in range(i0, i0 + h):
                    for r in range(rows):
                        c0, c1, c2, c3 = radix4(t[j, r], t[j + h, r], t[j + 2 * h, r],
                                                t[j + 3 * h, r])
                        t[j, r] = c0
                        t[j + h, r] = c1
                        t[j + 2 * h, r] = c2
                        t[j + 3 * h, r] = c3
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
            return
        for j in range(0, dp, 4):
            s0 = s[j] * c
            s1 = s[j + 1] * c
            s2 = s[j + 2] * c
            s3 = s[j + 3] * c
            for r in range(rows):
                c0, c1, c2, c3 = radix4(xt[j, r] * s0, xt[j + 1, r] * s1, xt[j + 2, r] * s2,
                                        xt[j + 3, r] * s3)
                t[j, r] = c0
                t[j + 1, r] = c1
                t[j + 2, r] = c2
                t[j + 3, r] = c3
        butterflies(t, 4, dp // 4)

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
                c0, c1, c2, c3 = radix4(t[j, r], t[j + h, r], t[j + 2 * h, r], t[j + 3 * h, r])
                acc[j, r] += c0 * s0
                acc[j + h, r] += c1 * s1
                acc[j + 2 * h, r] += c2 * s2
                acc[j + 3 * h, r] += c3 * s3

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

    return Kernels(sketch_rows, backward_rows, signed_fwht, fwht_signed_add)
