r"""The spectrum of a symmetric matrix and the weights of given vectors on it, without its
eigenvectors.

The scale calibration (:mod:`rfgp.inference._calibration`) needs, of a Gram matrix
:math:`G = V \Lambda V^\top` (``n x n``) and targets' projections :math:`B` (``n x T``), only
the eigenvalues :math:`\lambda_i` and the weights :math:`p_i = \sum_t (v_i^\top b_t)^2`. With
Householder's tridiagonal form :math:`G = Q J Q^\top` (``J`` tridiagonal, :math:`Q` a product
of ``n - 1`` reflectors) and :math:`J = U \Lambda U^\top`, the eigenvectors are :math:`V = Q U`,
so

.. math::
    p_i = \sum_t \big(u_i^\top (Q^\top b_t)\big)^2 :

the reflectors are applied to the ``T`` columns (:math:`O(n^2 T)`) instead of to the ``n``
eigenvectors (the back-transformation, :math:`2 n^3`), and the tridiagonal eigenvectors
:math:`U` come from the relatively robust representations in :math:`O(n^2)`. On a two-core
CPU the whole costs the time of 2.1 to 3.3 products of two ``n x n`` matrices from ``n = 1024``
to 8,192, where a dense eigendecomposition with eigenvectors costs that of 4.1 to 7.6 (at
8,192: 29 s against 70 s); on a GPU, and below :data:`TRIDIAGONAL_MIN` rows, the dense one is
used.

Internal: not part of the public API (see :mod:`rfgp.inference`).
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch
from scipy.linalg import eigh_tridiagonal, lapack
from torch import Tensor

__all__ = ["TRIDIAGONAL_MIN", "spectrum_weights"]

#: Size from which a CPU matrix's spectrum is taken through its tridiagonal form (on a two-core
#: machine both ways cost the same at 512; at 1,024 the tridiagonal one 0.7 of the dense one,
#: from 3,072 on half or less).
TRIDIAGONAL_MIN = 1024


def spectrum_weights(matrix: Tensor, columns: Tensor) -> tuple[Tensor, Tensor]:
    r"""Eigenvalues :math:`\lambda` (ascending) of a symmetric ``matrix`` and the weights
    :math:`p_i = \sum_t (v_i^\top b_t)^2` of its ``columns`` on the eigenvectors, in float64.

    .. math::
        \sum_i p_i = \|B\|_F^2, \qquad
        \sum_i \frac{p_i}{\lambda_i + c} = \mathrm{tr}\, B^\top (G + c I)^{-1} B .

    Args:
        matrix: ``(n, n)`` real symmetric (only its lower triangle is read on the tridiagonal
            path; callers pass exactly symmetric matrices), or ``(C, n, n)``: ``C`` of them.
        columns: ``(n, T)`` real, or ``(C, n, T)``: each matrix's own.

    Returns:
        ``(eigenvalues, weights)``, both ``(n,)`` (or ``(C, n)``) float64 on ``matrix``'s
        device.

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> a = torch.randn(30, 30, dtype=torch.float64, generator=g)
        >>> b = torch.randn(30, 2, dtype=torch.float64, generator=g)
        >>> lam, p = spectrum_weights(a @ a.T, b)
        >>> bool(torch.isclose(p.sum(), b.square().sum()))
        True
    """
    matrix = matrix.to(torch.float64)
    columns = columns.to(torch.float64)
    n = matrix.shape[-1]
    if matrix.device.type != "cpu" or n < TRIDIAGONAL_MIN:
        eigenvalues, vectors = torch.linalg.eigh(matrix)
        return eigenvalues, (vectors.transpose(-1, -2) @ columns).square().sum(-1)
    if matrix.dim() == 3:  # one reduction per matrix
        parts = [spectrum_weights(one, own) for one, own in zip(matrix, columns)]
        return torch.stack([p[0] for p in parts]), torch.stack([p[1] for p in parts])
    with _blas_threads(torch.get_num_threads()):
        # A C-ordered symmetric matrix is its own transpose: its buffer read in Fortran
        # order is the same matrix, which LAPACK copies (the caller's Gram is kept).
        packed, diagonal, offdiagonal, tau, info = lapack.dsytrd(
            matrix.detach().contiguous().numpy().T, lower=1,
            lwork=int(lapack.dsytrd_lwork(n, lower=1)[0]))
        if info != 0:
            raise RuntimeError(f"the tridiagonal reduction failed (LAPACK info {info})")
        rotated = _apply_reflectors(packed, tau, columns.detach().numpy().copy())
        eigenvalues, tridiagonal_vectors = eigh_tridiagonal(diagonal, offdiagonal)
        weights = np.square(tridiagonal_vectors.T @ rotated).sum(-1)
    return torch.from_numpy(eigenvalues), torch.from_numpy(weights)


def _apply_reflectors(packed: np.ndarray, tau: np.ndarray, columns: np.ndarray) -> np.ndarray:
    r""":math:`Q^\top B = H_{n-1} \cdots H_1 B`, :math:`H_k = I - \tau_k v_k v_k^\top` with
    :math:`v_k` zero above row :math:`k + 1`, one there and LAPACK's packed column below."""
    for k in range(packed.shape[0] - 1):
        v = packed[k + 1:, k].copy()
        v[0] = 1.0
        block = columns[k + 1:]
        block -= tau[k] * np.outer(v, v @ block)
    return columns


def _blas_threads(count: int):
    """SciPy's BLAS held to ``count`` threads (torch's own setting, so that processes sharing a
    machine under ``torchrun`` do not oversubscribe it), where threadpoolctl is installed."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return contextlib.nullcontext()
    return threadpool_limits(limits=count, user_api="blas")
