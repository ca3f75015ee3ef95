"""Compiled TensorSRHT features on the CPU, forward and backward (used when numba is installed).

The GEMM-based TensorSRHT path (:mod:`rfgp.kernels._sketches.tensorsrht`) spends 64 multiply-adds
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

from rfgp._ops import complex_dtype
from rfgp.kernels._sketches._srht_kernels import build

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


def _kernels():
    if _state["kernels"] is None:
        _state["kernels"] = build()
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
    # numpy() refuses tensors with a pending negation (a view such as z.conj().imag)
    xs = x.detach().resolve_neg().contiguous().numpy()
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
        kernel = _kernels().sketch_rows  # compiled (or loaded from numba's cache) on first use
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
    # Autograd may hand over a lazily conjugated (or negated) view, for instance when the loss
    # takes features.conj(): view_as_real and numpy() need the values materialised.
    grad = grad.detach().resolve_conj().resolve_neg()
    if complex:
        parts = torch.view_as_real(grad.to(complex_dtype(x.dtype)).contiguous()).numpy()
        grads = (parts[..., 0], parts[..., 1])
    else:
        g = grad.to(x.dtype).contiguous().numpy()
        grads = (g, g)
    if n == 0:
        return out
    rows = _tile_rows(padded)
    kernel = _kernels().backward_rows
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
