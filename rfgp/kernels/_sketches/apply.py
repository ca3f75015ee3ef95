r"""Applying a polynomial sketch: one entry point over the four projections.

Internal: not part of the public API (see :mod:`rfgp.kernels`).
"""

from __future__ import annotations

from typing import Dict

from torch import Tensor

from rfgp._validation import check_int
from rfgp.kernels._sketches.dense import apply_dense
from rfgp.kernels._sketches.sampling import check_projection
from rfgp.kernels._sketches.tensorsketch import apply_tensorsketch
from rfgp.kernels._sketches.tensorsrht import apply_tensorsrht

__all__ = ["apply_sketch"]


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
        >>> from rfgp.kernels import sample_sketch
        >>> g = torch.Generator().manual_seed(0)
        >>> x = torch.randn(4, 3, dtype=torch.float64, generator=g)
        >>> w = sample_sketch(1, 8, 3, projection="tensorsrht", generator=g)
        >>> phi = apply_sketch(x, w, 1, projection="tensorsrht")   # D = 2 d': exact for p = 1
        >>> torch.allclose(phi @ phi.T, x @ x.T)
        True
    """
    check_int("degree", degree)
    projection, is_complex = check_projection(projection, complex)
    if not isinstance(x, Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"x must have a real floating dtype, got {x.dtype}")
    if x.dim() < 2:
        raise ValueError(f"x must have shape (..., N, d), got shape {tuple(x.shape)}")
    if projection in ("gaussian", "rademacher"):
        return apply_dense(x, weights, degree, is_complex)
    if projection == "tensorsketch":
        return apply_tensorsketch(x, weights, degree, is_complex)
    return apply_tensorsrht(x, weights, degree, is_complex)
