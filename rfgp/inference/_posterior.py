r"""The posterior at query points as a GPyTorch distribution with lazy covariances.

The weight-space covariance is :math:`A A^\top` with :math:`A = \mathrm{real\_form}(L^{-1}
\overline{\Phi_*})^\top` (a ``RootLinearOperator``); the function-space one is
:math:`\Phi_*\Phi_*^H - C C^H` with :math:`C = L^{-1} \overline{k_*}`. Outputs sharing a
factorisation share the operator.

Internal: not part of the public API (see :mod:`rfgp.inference`).
"""

from __future__ import annotations

from typing import List, Optional

import torch
from gpytorch.distributions import MultitaskMultivariateNormal, MultivariateNormal
from linear_operator.operators import (
    ConstantMulLinearOperator,
    DenseLinearOperator,
    DiagLinearOperator,
    RootLinearOperator,
    SumLinearOperator,
)
from torch import Tensor

from rfgp.inference._noise import NoiseLayout

__all__ = ["posterior_distribution", "root_covariance"]


def root_covariance(root, variance_correction: Optional[Tensor], mean: Tensor):
    """The lazy covariance ``A A^T`` (weight space) or ``A A^T - C C^T`` (function space), from
    the roots ``(A,)`` or ``(A, C)``; a tensor is the covariance itself (the iterative solve's
    ``Re{Phi_* B^-1 Phi_*^H}``, computed densely for the query block)."""
    if isinstance(root, Tensor):
        cov = DenseLinearOperator(root)
    else:
        cov = RootLinearOperator(root[0])
    if not isinstance(root, Tensor) and len(root) == 2:
        minus = torch.tensor(-1.0, dtype=mean.dtype, device=mean.device)
        cov = SumLinearOperator(cov, ConstantMulLinearOperator(RootLinearOperator(root[1]), minus))
    if variance_correction is not None:
        cov = cov + DiagLinearOperator(variance_correction.to(mean).reshape(-1))
    return cov


def posterior_distribution(mean: Tensor, covs: list, groups: List[List[int]], layout: NoiseLayout):
    """The GPyTorch distribution of the posterior: one covariance per group of outputs."""
    p = layout.outputs_per_input
    column_cov = [None] * layout.num_columns
    for cols, cov in zip(groups, covs):
        for c in cols:
            column_cov[c] = cov
    if p > 1:
        return MultitaskMultivariateNormal(mean.reshape(-1, p), column_cov[0], interleaved=True)
    if layout.num_columns == 1 and layout.y_ndim == 1:
        return MultivariateNormal(mean[:, 0], column_cov[0])
    if layout.num_columns == 1:
        return MultitaskMultivariateNormal(mean, column_cov[0], interleaved=True)
    return MultitaskMultivariateNormal.from_independent_mvns(
        [MultivariateNormal(mean[:, t], column_cov[t]) for t in range(layout.num_columns)]
    )
