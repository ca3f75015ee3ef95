r"""Dense linear algebra of the GP solvers: the jittered Cholesky and the memory guard.

Both solvers (and the Dirichlet classifier's exact solver) factorise a Hermitian positive definite
matrix :math:`A = L L^H`. Round-off can make a mathematically positive definite matrix fail to
factorise; :func:`robust_cholesky` then retries with a diagonal jitter that is relative to the
*prior* part of the matrix (the identity of :math:`B = \Phi^H S^{-1}\Phi + I`, the prior
variances on the diagonal of :math:`K`), so that a tiny noise never lets the jitter swamp the
prior.

Internal: not part of the public API (see :mod:`rfgp.inference`).
"""

from __future__ import annotations

import math
import os
import warnings
from typing import Optional, Sequence

import torch
from linear_operator.utils.errors import NotPSDError
from linear_operator.utils.warnings import NumericalWarning
from torch import Tensor

__all__ = [
    "available_memory",
    "check_memory",
    "hermitian_square_norms",
    "robust_cholesky",
    "try_cholesky",
]

MAX_JITTER_TRIES = 8


def try_cholesky(matrix: Tensor) -> Optional[Tensor]:
    """The lower Cholesky factor of ``matrix`` as it is (no jitter), or ``None`` if the
    factorisation failed or is not finite.

    Example:
        >>> try_cholesky(-torch.eye(2, dtype=torch.float64)) is None
        True
    """
    chol, info = torch.linalg.cholesky_ex(matrix)
    # NaN anywhere in the input reaches the diagonal of the factor, so checking it suffices.
    if int(info) == 0 and bool(torch.isfinite(chol.diagonal()).all()):
        return chol
    return None


def robust_cholesky(
    matrix: Tensor,
    jitter: Optional[float] = None,
    what: str = "matrix",
    prior_scale: Optional[float] = None,
) -> Tensor:
    r"""Lower Cholesky factor of a Hermitian positive definite matrix, retrying with jitter.

    The first attempt adds ``jitter`` (``None``: nothing) to the diagonal. If the factorisation
    fails, it is retried with a jitter :math:`\epsilon\, s\, 10^k`, :math:`k = 0, 1, \dots, 7`,
    where :math:`\epsilon` is ``1e-10`` (float64) or ``1e-6`` (float32) and :math:`s` is
    ``prior_scale`` (default: the mean absolute diagonal), with a ``NumericalWarning`` naming the
    jitter finally used. Pass the scale of the prior part of the matrix as ``prior_scale`` (1 for
    :math:`B = G + I`): a jitter relative to the whole diagonal would, for a tiny noise, be far
    larger than the prior and erase it.

    Args:
        matrix: ``(n, n)`` real symmetric or complex Hermitian matrix.
        jitter: absolute value added to the diagonal before the first attempt.
        what: name of the matrix for messages.
        prior_scale: the scale the retry jitter is relative to.

    Returns:
        ``L`` lower triangular with ``L L^H = matrix + jitter I``.

    Raises:
        NotPSDError: if the matrix is not positive definite even with the largest jitter.

    Example:
        >>> a = torch.tensor([[4.0, 2.0], [2.0, 3.0]], dtype=torch.float64)
        >>> l = robust_cholesky(a)
        >>> torch.allclose(l @ l.T, a)
        True
    """
    base = matrix
    if jitter:
        base = matrix.clone()
        base.diagonal().add_(jitter)
    chol = try_cholesky(base)
    if chol is not None:
        return chol
    if not bool(torch.isfinite(matrix).all()):
        raise NotPSDError(f"the {what} holds NaN or infinite entries; check the inputs and noise")
    eye = torch.eye(matrix.shape[-1], dtype=matrix.dtype, device=matrix.device)
    scale = prior_scale if prior_scale else (matrix.diagonal().abs().mean().item() or 1.0)
    rel = 1e-10 if matrix.real.dtype == torch.float64 else 1e-6
    for attempt in range(MAX_JITTER_TRIES):
        added = scale * rel * 10.0**attempt
        chol = try_cholesky(base + added * eye)
        if chol is not None:
            warnings.warn(
                f"Cholesky of the {what} failed; succeeded after adding {added:.3g} to the "
                "diagonal (the noise may be too small for this precision)",
                NumericalWarning,
            )
            return chol
    raise NotPSDError(
        f"Cholesky of the {what} failed even with {added:.3g} added to the diagonal; "
        "increase the noise, use float64, or (with fewer rows than features) solve='function'"
    )


def hermitian_square_norms(v: Tensor, dim: int = 0) -> Tensor:
    """``sum |v|^2`` along ``dim`` for real or complex ``v`` (real result)."""
    if v.is_complex():
        return v.real.square().sum(dim) + v.imag.square().sum(dim)
    return v.square().sum(dim)


def _address_space_limit() -> Optional[int]:
    """The process's address-space limit (``ulimit -v``) in bytes, ``None`` when unlimited or
    unknown (no ``resource`` module off POSIX)."""
    try:
        import resource
    except ImportError:
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    return None if soft == resource.RLIM_INFINITY or soft < 0 else int(soft)


def available_memory(device: torch.device) -> int:
    """Bytes of memory the device has in total: for the CPU the smaller of the physical
    memory and the process's address-space limit (``ulimit -v``), which an allocation hits
    first when it is lower."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[1])
    try:
        physical = int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):  # not a POSIX system: no physical bound
        physical = 1 << 62
    limit = _address_space_limit()
    return physical if limit is None else min(physical, limit)


def check_memory(
    shape: Sequence[int], dtype: torch.dtype, device: torch.device, what: str, way_out: str
) -> None:
    """Raise ``MemoryError`` before allocating a buffer larger than the device's memory.

    Args:
        shape: the buffer's shape.
        dtype, device: its dtype and device.
        what: what the buffer is, for the message.
        way_out: how to make it smaller, for the message.

    Example:
        >>> try:
        ...     check_memory((10**6, 10**6), torch.float64, torch.device("cpu"), "A", "")
        ... except MemoryError as err:
        ...     print(str(err)[:51])
        A of shape (1000000, 1000000) (float64) needs 8e+12
    """
    if device.type not in ("cpu", "cuda"):
        return
    size = math.prod(int(s) for s in shape) * torch.empty((), dtype=dtype).element_size()
    limit = available_memory(device)
    if size > limit:
        raise MemoryError(
            f"{what} of shape {tuple(int(s) for s in shape)} ({str(dtype).replace('torch.', '')}) "
            f"needs {size:.3g} bytes, more than the {limit:.3g} bytes of {device.type} memory "
            "(or address space) available; "
            + way_out
        )
