r"""A probabilistic bound on the largest eigenvalue of a positive semi-definite operator from
a few Lanczos runs with random starts (the bound :math:`\tau` of the iterative solve's
low-rank variances, :mod:`~rfgp.inference._cg_variance`).

Reference:
    Kuczyński & Woźniakowski, *Estimating the Largest Eigenvalue by the Power and Lanczos
    Algorithms with a Random Start*, SIAM J. Matrix Anal. Appl. 13(4), 1992.

Internal: not part of the public API (see :mod:`rfgp.inference`).
"""

from __future__ import annotations

import math
from typing import Callable, List, Optional

import torch
from torch import Tensor

__all__ = ["FAILURE_PROBABILITY", "LANCZOS_RUNS", "LANCZOS_STEPS", "norm_bound"]

#: Lanczos steps of the bound
LANCZOS_STEPS = 12
#: independent Lanczos runs of the bound, advanced together (one pass over the data a step)
LANCZOS_RUNS = 8
#: the probability that the bound falls short
FAILURE_PROBABILITY = 1e-4


def norm_bound(product: Callable[[Tensor], Tensor], width: int, dtype: torch.dtype,
               device: torch.device, generator: torch.Generator,
               steps: int = LANCZOS_STEPS,
               failure_probability: float = FAILURE_PROBABILITY,
               above: Optional[float] = None,
               runs: int = LANCZOS_RUNS) -> float:
    r"""A bound on the largest eigenvalue of a positive semi-definite ``product``, exceeded
    with probability at most ``failure_probability``: the largest Ritz value of ``runs``
    independent Lanczos runs of ``steps`` steps (full reorthogonalisation) from Gaussian
    starts, over :math:`1 - \epsilon`. By Kuczyński and Woźniakowski's bound one run's Ritz
    value falls below :math:`(1 - \epsilon)\lambda_1` with probability at most
    :math:`p = 1.648\sqrt{n}\, e^{-\sqrt{\epsilon}(2k - 1)}` (``n = W``, or ``2W`` for
    complex vectors); independent runs all do with probability :math:`p^b`, so
    :math:`\epsilon = (\ln(1.648\sqrt{n}/\delta^{1/b}) / (2k - 1))^2`. The runs advance
    together, one product with a ``(W, b)`` block per step: where a product is a pass over
    the data that recomputes its features, ``b`` columns cost about what one does, and
    eight runs of 12 steps give a smaller :math:`\epsilon` (0.083 at ``n`` = 21,504) than
    one run of 24 (0.098) in half the passes. An invariant Krylov space (a breakdown) gives
    the largest eigenvalue, with no factor (a Gaussian start touches every eigenvector).

    With ``above``, the question is only whether the bound exceeds ``above``: the largest
    Ritz value never falls as the steps go on, so once the Ritz value :math:`\theta_j` of
    step ``j`` exceeds :math:`(1 - \epsilon)\,` ``above``, the ``steps``-step bound is
    certain to exceed it, and :math:`\theta_j / (1 - \epsilon)` is returned after ``j``
    products instead of ``steps`` (a value above ``above`` that the full bound may exceed;
    each product is a pass over the data, so a bound far above ``above`` costs a few).

    Example:
        >>> a = torch.diag(torch.linspace(0.0, 2.0, 300, dtype=torch.float64))
        >>> bound = norm_bound(lambda v: a @ v, 300, a.dtype, a.device,
        ...                    torch.Generator().manual_seed(0))
        >>> 2.0 <= bound < 2.6
        True
        >>> calls = []
        >>> early = norm_bound(lambda v: calls.append(1) or a @ v, 300, a.dtype, a.device,
        ...                    torch.Generator().manual_seed(0), above=0.01)
        >>> early > 0.01, len(calls) < 5
        (True, True)
    """
    real = dtype.to_real() if dtype.is_complex else dtype
    n = 2 * width if dtype.is_complex else width
    full = min(steps, width)
    per_run = failure_probability ** (1.0 / runs)
    epsilon = ((math.log(1.648 * math.sqrt(n) / per_run) / (2 * full - 1)) ** 2
               if full < width else 0.0)
    if dtype.is_complex:
        start = torch.randn(width, runs, 2, generator=generator, dtype=torch.float64)
        start = torch.view_as_complex(start.contiguous())
    else:
        start = torch.randn(width, runs, generator=generator, dtype=torch.float64)
    start = start.to(device=device, dtype=dtype)
    vectors = [start / start.norm(dim=0)]  # each (W, b): one column per run
    diagonal: List[List[float]] = [[] for _ in range(runs)]
    off: List[List[float]] = [[] for _ in range(runs)]
    broke = -1
    for step in range(full):
        image = product(vectors[-1])  # (W, b)
        alphas = (vectors[-1].conj() * image).sum(0).real.tolist()
        for run in range(runs):
            diagonal[run].append(float(alphas[run]))
        if above is not None and epsilon < 1.0 and step < full - 1:
            ritz = max(_largest_ritz(d, o) for d, o in zip(diagonal, off))
            if ritz > (1.0 - epsilon) * above:  # the full bound will exceed `above`
                return ritz / (1.0 - epsilon)
        basis = torch.stack(vectors, 1)  # (W, j, b)
        for _ in range(2):  # full reorthogonalisation within each run, twice
            image = image - torch.einsum("wjb,jb->wb", basis,
                                         torch.einsum("wjb,wb->jb", basis.conj(), image))
        sizes = image.norm(dim=0)  # (b,)
        if step == full - 1:
            break
        small = [float(sizes[run]) <= 1e3 * torch.finfo(real).eps
                 * max(abs(d) for d in diagonal[run]) for run in range(runs)]
        if any(small):
            broke = small.index(True)
            break
        for run in range(runs):
            off[run].append(float(sizes[run]))
        vectors.append(image / sizes)
    if broke >= 0:
        return _largest_ritz(diagonal[broke], off[broke])
    largest = max(_largest_ritz(d, o) for d, o in zip(diagonal, off))
    if len(diagonal[0]) >= width:
        return largest
    return largest / (1.0 - epsilon) if epsilon < 1.0 else math.inf


def _largest_ritz(diagonal: List[float], off: List[float]) -> float:
    """The largest eigenvalue (at least 0) of the Lanczos tridiagonal with ``diagonal`` and
    the ``len(diagonal) - 1`` entries ``off`` beside it."""
    tri = torch.diag(torch.tensor(diagonal, dtype=torch.float64))
    if off:
        band = torch.tensor(off, dtype=torch.float64)
        tri = tri + torch.diag(band, 1) + torch.diag(band, -1)
    return max(float(torch.linalg.eigvalsh(tri)[-1]), 0.0)
