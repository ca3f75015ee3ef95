r"""Factors :math:`B(\omega)` of operator-valued spectral densities and the ORFF map built on them.

:math:`A(\omega) = B(\omega) B(\omega)^\top`; :func:`operator_features` turns frequencies and
their factors into the real feature map :math:`\Phi(x)^\top` (see
:mod:`rfgp.kernels._vector_field`).

Internal: not part of the public API (see :mod:`rfgp.kernels`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from rfgp._validation import check_choice

__all__ = [
    "OPERATOR_SAMPLINGS",
    "DIV_FREE_FACTORS",
    "resolve_div_free_factor",
    "div_free_factor_rank",
    "div_free_factor",
    "operator_features",
    "feature_scale",
]

#: frequency samplings of the operator-valued features.
OPERATOR_SAMPLINGS = ("iid", "orthogonal")
#: closed-form factors B with B B^T = |w|^2 I - w w^T (``"auto"`` picks one by dimension).
DIV_FREE_FACTORS = ("auto", "rotation", "cross", "complement", "projection")


# ------------------------------------------------------------------ factors and features
def resolve_div_free_factor(dim: int, factor: str) -> str:
    check_choice("factor", factor, DIV_FREE_FACTORS)
    if dim < 2:
        raise ValueError(f"div-free features need input dimension d >= 2, got d = {dim}")
    if factor == "auto":
        return "rotation" if dim == 2 else "complement"
    if factor == "rotation" and dim != 2:
        raise ValueError(f"factor='rotation' needs d = 2, got d = {dim}")
    if factor == "cross" and dim != 3:
        raise ValueError(f"factor='cross' needs d = 3, got d = {dim}")
    return factor


def div_free_factor_rank(dim: int, factor: str = "auto") -> int:
    """``p'``, the number of columns of the div-free factor ``B(omega)`` in dimension ``dim``.

    Args:
        dim: input dimension ``d >= 2``.
        factor: ``"rotation"`` (d = 2), ``"cross"`` (d = 3), ``"complement"``,
            ``"projection"`` or ``"auto"``, as in :func:`div_free_factor`.

    Returns:
        ``1``, ``3``, ``d - 1`` or ``d`` for the factors above (``"auto"``: 1 in 2-D, else
        ``d - 1``).

    Raises:
        ValueError: for an unknown ``factor``, ``dim < 2``, or a factor that does not exist in
            dimension ``dim``.

    Example:
        >>> [div_free_factor_rank(2), div_free_factor_rank(3, "cross"), div_free_factor_rank(5)]
        [1, 3, 4]
    """
    factor = resolve_div_free_factor(dim, factor)
    return {"rotation": 1, "cross": 3, "complement": dim - 1, "projection": dim}[factor]


def div_free_factor(omega: Tensor, factor: str = "auto") -> Tensor:
    r"""A closed-form factor :math:`B(\omega)` with :math:`BB^\top = \|\omega\|^2 I -
    \omega\omega^\top` (no Cholesky of this singular matrix).

    * ``"rotation"`` (d = 2, p' = 1): :math:`B = J\omega = (-\omega_2, \omega_1)^\top`.
    * ``"cross"`` (d = 3, p' = 3): :math:`B = [\omega]_\times`, the cross-product matrix.
    * ``"complement"`` (any d, p' = d - 1): :math:`B = \|\omega\| Q`, ``Q`` an orthonormal basis
      of :math:`\omega^\perp` from the Householder reflection that maps :math:`e_1` to
      :math:`\pm\omega/\|\omega\|`.
    * ``"projection"`` (any d, p' = d): :math:`B = \|\omega\| I - \omega\omega^\top/\|\omega\|`,
      the symmetric square root.
    * ``"auto"``: ``"rotation"`` in 2-D, ``"complement"`` otherwise.

    :math:`\omega = 0` gives :math:`B = 0` (never NaN).

    Args:
        omega: ``(..., d)`` frequencies, ``d >= 2``.
        factor: one of :data:`DIV_FREE_FACTORS`.

    Returns:
        ``(..., d, p')``.

    Example:
        >>> w = torch.tensor([[1.0, 2.0, 2.0]], dtype=torch.float64)
        >>> b = div_free_factor(w)
        >>> b.shape
        torch.Size([1, 3, 2])
        >>> torch.allclose(b @ b.mT, 9 * torch.eye(3, dtype=torch.float64) - w.mT @ w)
        True
    """
    dim = omega.shape[-1]
    factor = resolve_div_free_factor(dim, factor)
    if factor == "rotation":
        return torch.stack([-omega[..., 1], omega[..., 0]], dim=-1).unsqueeze(-1)
    if factor == "cross":
        w1, w2, w3 = omega.unbind(-1)
        zero = torch.zeros_like(w1)
        rows = [torch.stack(r, -1) for r in ((zero, -w3, w2), (w3, zero, -w1), (-w2, w1, zero))]
        return torch.stack(rows, dim=-2)
    norm = omega.norm(dim=-1, keepdim=True)
    safe_norm = torch.where(norm > 0, norm, torch.ones_like(norm))
    unit = omega / safe_norm
    eye = torch.eye(dim, dtype=omega.dtype, device=omega.device)
    if factor == "projection":
        proj = norm.unsqueeze(-1) * eye - omega.unsqueeze(-1) * unit.unsqueeze(-2)
        return proj
    # Householder: v = u + s e_1 with s = sign(u_1) keeps |v|^2 = 2 (1 + |u_1|) >= 2; the
    # reflection H = I - 2 v v^T / |v|^2 maps e_1 to -s u, so its other columns span u-perp.
    first = unit[..., :1]
    sign = torch.where(first >= 0, torch.ones_like(first), -torch.ones_like(first))
    v = unit + sign * eye[0]
    householder = eye - 2.0 * v.unsqueeze(-1) * v.unsqueeze(-2) / (v * v).sum(-1)[..., None, None]
    return norm.unsqueeze(-1) * householder[..., 1:]


def operator_features(x: Tensor, omega: Tensor, factor: Tensor, scale: Tensor | float) -> Tensor:
    r"""Real ORFF map :math:`\Phi(x)^\top` for frequencies ``omega`` and factors ``B(omega)``.

    .. math::
        \Phi(x)^\top_{t,\,(c, j, r)} = \mathrm{scale}\cdot
            \mathrm{trig}_c(\omega_j^\top x)\, B(\omega_j)_{t r},
        \qquad \mathrm{trig}_0 = \cos,\ \mathrm{trig}_1 = \sin,

    so :math:`\Phi(x)^\top\Phi(z) = \mathrm{scale}^2 \sum_j \cos(\omega_j^\top(x - z))
    B(\omega_j)B(\omega_j)^\top`. Columns are ordered (cos/sin, frequency, factor column).

    Args:
        x: ``(..., N, d)`` inputs (already scaled; the frequencies carry the lengthscale).
        omega: ``(*batch, M, d)`` frequencies.
        factor: ``(*batch, M, p, p')`` factors ``B(omega_j)``, or ``(*batch, 1, p, p')`` for one
            factor shared by all frequencies (the decomposable kernel).
        scale: a float or a tensor broadcasting against ``(..., N, p, D)``.

    Returns:
        ``(..., N, p, 2 M p')``.

    Example:
        >>> x = torch.randn(5, 2, dtype=torch.float64)
        >>> w = torch.randn(7, 2, dtype=torch.float64)
        >>> operator_features(x, w, w.unsqueeze(-1), 1.0).shape
        torch.Size([5, 2, 14])
    """
    if factor.dim() < 3:
        raise ValueError(
            f"factor must have shape (*batch, M or 1, p, p'), got {tuple(factor.shape)}"
        )
    proj = x @ omega.transpose(-1, -2)  # (..., N, M)
    b = factor.movedim(-3, -2).unsqueeze(-4)  # (*batch, 1, p, M or 1, p')
    cos = torch.cos(proj)[..., :, None, :, None] * b  # (..., N, p, M, p')
    sin = torch.sin(proj)[..., :, None, :, None] * b
    phi = torch.cat([cos.flatten(-2), sin.flatten(-2)], dim=-1)
    return phi * scale


def feature_scale(coefficient: Tensor, num_frequencies: int) -> Tensor:
    # coefficient (*batch, 1) -> (*batch, 1, 1, 1), broadcasting against (..., N, p, D)
    return (coefficient / num_frequencies).sqrt().unsqueeze(-1).unsqueeze(-1)
