r"""The log marginal likelihood (evidence) of a random-feature GP, from statistics or features.

With real-form features :math:`Z`, a diagonal noise :math:`S`, :math:`B = Z^\top S^{-1} Z + I`
and :math:`h = Z^\top S^{-1} y`, Woodbury and the matrix-determinant lemma give, per output column,

.. math::
    \log p(y) = -\tfrac12\left(y^\top S^{-1} y - h^\top B^{-1} h + \log|B|
                + \textstyle\sum_i \log s_i + N \log 2\pi\right),

and with fewer rows than features the same value from the ``N x N`` matrix
:math:`K + S = Z Z^\top + S`: :math:`-\tfrac12(y^\top (K+S)^{-1} y + \log|K + S| + N\log 2\pi)`.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
from torch import Tensor

from rfgp.inference.linalg import robust_cholesky
from rfgp.inference.noise import equal_noise_columns

__all__ = [
    "check_representable",
    "evidence_total",
    "log_evidence_from_features",
    "weight_evidence_terms",
]

LOG_2PI = math.log(2.0 * math.pi)


def weight_evidence_terms(
    gram: Tensor, rhs: Tensor, yy: Tensor, jitter: Optional[float]
) -> Tuple[Tensor, Tensor]:
    """``y^T S^{-1} y - h^T B^{-1} h`` per column and ``log|B|``, with ``B = G + I``."""
    bmat = gram + torch.eye(gram.shape[0], dtype=gram.dtype, device=gram.device)
    chol = robust_cholesky(0.5 * (bmat + bmat.T), jitter, "weight-space matrix B", 1.0)
    proj = torch.linalg.solve_triangular(chol, rhs, upper=False)
    return yy - proj.square().sum(0), 2.0 * chol.diagonal().log().sum()


def evidence_total(
    quad: Tensor, logdet: Tensor, log_noise_sum: Tensor, num_rows: int, target_scale: float
) -> Tensor:
    r"""``-1/2 sum_t (c^2 quad_t + logdet + sum log s + R log 2 pi)`` for targets stored divided
    by ``c = target_scale``."""
    quad = quad * target_scale * target_scale  # in tensor arithmetic: inf, not OverflowError
    return -0.5 * (quad + logdet + log_noise_sum + num_rows * LOG_2PI).sum()


def check_representable(total: Tensor, target_scale: float) -> Tensor:
    """``total`` if it is finite; a clear error instead of a silent ``-inf`` or NaN."""
    if not bool(torch.isfinite(total)):
        raise ValueError(
            f"the log marginal likelihood is not representable in {total.dtype} (the targets' "
            f"scale {target_scale:.3g} against the prior and noise makes it overflow); "
            "standardise the targets or choose a noise on their scale"
        )
    return total


def log_evidence_from_features(
    z: Tensor,
    rows_y: Tensor,
    rows_noise: Tensor,
    jitter: Optional[float],
    target_scale: float = 1.0,
) -> Tensor:
    """Differentiable evidence from real-form features ``z (R, Dr)``, targets and noise
    ``(R, T)``: the weight-space form when ``R >= Dr``, else the ``R x R`` form. The targets are
    the true ones divided by ``target_scale``."""
    num_rows, width = z.shape
    total = z.new_zeros(())
    for cols in equal_noise_columns(rows_noise.detach()):
        s = rows_noise[:, cols[0]]
        yg = rows_y[:, cols]
        if num_rows >= width:
            zw = z * s.rsqrt().unsqueeze(-1)
            yw = yg * s.rsqrt().unsqueeze(-1)
            quad, logdet = weight_evidence_terms(zw.T @ zw, zw.T @ yw, yw.square().sum(0), jitter)
            logdet = logdet + s.log().sum()
        else:
            kmat = z @ z.T + torch.diag(s)
            prior = float(z.detach().square().sum(-1).mean()) or None
            chol = robust_cholesky(
                0.5 * (kmat + kmat.T), jitter, "function-space matrix K + S", prior
            )
            quad = torch.linalg.solve_triangular(chol, yg, upper=False).square().sum(0)
            logdet = 2.0 * chol.diagonal().log().sum()
        total = total + evidence_total(quad, logdet, 0.0, num_rows, target_scale)
    return total
