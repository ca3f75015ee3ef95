r"""TensorSketch (Pham & Pagh 2013): count sketches combined by FFT circular convolution.

:math:`\Phi(x) = \mathrm{IFFT}(\prod_i \mathrm{FFT}(C_i x))` with one CountSketch
:math:`C_i` (hash :math:`h_i: [d] \to [D]`, signs :math:`s_i`) per degree.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rfgp.kernels._sketches.sampling import (
    as_complex_weight,
    check_weight_columns,
    sketch_weight,
)

__all__ = ["count_sketch", "apply_tensorsketch"]


def count_sketch(x: Tensor, hashes: Tensor, signs: Tensor, num_features: int) -> Tensor:
    r"""CountSketch of the rows of ``x``: :math:`(Cx)_j = \sum_{t:\,h(t) = j} s_t x_t`.

    Args:
        x: ``(..., N, d)`` values (real or complex).
        hashes: ``(d,)`` int64 buckets in ``[0, num_features)``, or ``(*B, k, d)`` for ``k``
            count sketches at once (``*B`` broadcasts against the leading dimensions of ``x``).
        signs: real signs of the shape of ``hashes``.
        num_features: number of buckets ``D``.

    Returns:
        ``(..., N, D)`` for one-dimensional ``hashes``, else ``(..., N, k, D)``.

    Example:
        >>> x = torch.tensor([[1.0, 2.0, 3.0]])
        >>> count_sketch(x, torch.tensor([0, 1, 0]), torch.tensor([1.0, -1.0, 1.0]), 2)
        tensor([[ 4., -2.]])
    """
    if hashes.dim() == 1:
        # one sparse d x D product: no (N, d, D) intermediate
        out = torch.zeros(*x.shape[:-1], num_features, dtype=x.dtype, device=x.device)
        return out.index_add(-1, hashes, x * signs.to(x.dtype))
    values = x.unsqueeze(-2) * signs.to(x.dtype).unsqueeze(-3)  # (..., N, k, d)
    shape = torch.broadcast_shapes(values.shape, hashes.unsqueeze(-3).shape)
    values = values.expand(shape)
    index = hashes.unsqueeze(-3).expand(shape)
    out = values.new_zeros((*shape[:-1], num_features))
    return out.scatter_add(-1, index, values)


def apply_tensorsketch(x: Tensor, weights, degree: int, is_complex: bool) -> Tensor:
    hashes = sketch_weight(weights, "hashes", "tensorsketch")
    signs = sketch_weight(weights, "signs", "tensorsketch")
    num_features = int(sketch_weight(weights, "feature_count", "tensorsketch").reshape(-1)[0])
    check_weight_columns(x, hashes.shape[-1], "hashes")
    if hashes.shape[-2] != degree:
        raise ValueError(
            f"degree={degree} does not match the sketch weights (hashes of shape "
            f"{tuple(hashes.shape)})"
        )
    if hashes.dim() == 2:
        return _tensorsketch_unbatched(x, signs, hashes, degree, is_complex, num_features)
    if is_complex:
        s = signs.to(x.dtype)
        sketch = torch.complex(
            count_sketch(x, hashes, s[..., 0], num_features),
            count_sketch(x, hashes, s[..., 1], num_features),
        )
        spectrum = torch.fft.fft(sketch, dim=-1)
    else:
        sketch = count_sketch(x, hashes, signs.to(x.dtype), num_features)
        spectrum = torch.fft.rfft(sketch, dim=-1)
    prod = spectrum[..., 0, :]
    for i in range(1, degree):
        prod = prod * spectrum[..., i, :]
    if is_complex:
        return torch.fft.ifft(prod, n=num_features, dim=-1)
    return torch.fft.irfft(prod, n=num_features, dim=-1)


def _tensorsketch_unbatched(
    x: Tensor, signs: Tensor, hashes: Tensor, degree: int, is_complex: bool, num_features: int
) -> Tensor:
    # One index_add per degree (a sparse d x D count-sketch product) and the spectra multiplied
    # as they come: no (N, p, D) intermediate.
    s = as_complex_weight(signs, x.dtype) if is_complex else signs.to(x.dtype)
    zeros_dtype = s.dtype if is_complex else x.dtype
    spectrum = None
    for i in range(degree):
        values = x * s[i]
        sketch = torch.zeros(
            (*x.shape[:-1], num_features), dtype=zeros_dtype, device=x.device
        ).index_add(-1, hashes[i], values)
        f = torch.fft.fft(sketch, dim=-1) if is_complex else torch.fft.rfft(sketch, dim=-1)
        spectrum = f if spectrum is None else spectrum * f
    if is_complex:
        return torch.fft.ifft(spectrum, n=num_features, dim=-1)
    return torch.fft.irfft(spectrum, n=num_features, dim=-1)
