r"""The log evidence of a random-feature GP with a fixed noise per point and output column.

For output columns :math:`y_t \sim N(0, Z Z^\top + S_t)`, :math:`S_t = \mathrm{diag}(s_{\cdot t})`
a fixed (not learned) noise, with :math:`W_t = S_t^{-1}`, :math:`B_t = I + Z^\top W_t Z`,
:math:`\alpha_t = B_t^{-1} Z^\top W_t y_t` and :math:`r_t = y_t - Z\alpha_t` (so that
:math:`(Z Z^\top + S_t)^{-1} y_t = W_t r_t`), Woodbury and the matrix-determinant lemma give

.. math::
    -\log p(Y) = \tfrac12 \textstyle\sum_t \big(y_t^\top W_t r_t + \log|B_t|
        + \sum_n \log s_{nt} + N \log 2\pi\big),

with the gradients in closed form

.. math::
    \frac{\partial}{\partial Z} = \textstyle\sum_t W_t Z B_t^{-1} - (W \circ R) A^\top, \qquad
    \frac{\partial}{\partial y_t} = W_t r_t,

:math:`A = [\alpha_t]`, :math:`R = [r_t]`. This is the evidence of the Dirichlet transform of
class labels (:class:`rfgp.likelihoods.DirichletLikelihood`), where column ``t`` takes one noise
value on the rows of class ``t`` and another on all other rows. Each column's weighted Gram
matrix is written as a shared part plus a correction on the rows where its weight differs from
its most frequent value: :math:`Z^\top W_t Z = w_t Z^\top Z + Z_{R_t}^\top (W_t - w_t)
Z_{R_t}`, so the ``C`` Gram matrices of ``C`` classes cost :math:`2 N D^2` instead of
:math:`C N D^2`, and a whole evaluation with its gradient :math:`O(4 N D^2 + 2 C D^3)`.
With fewer rows than features the ``N x N`` matrices :math:`Z Z^\top + S_t` are used instead:
:math:`\partial/\partial Z = \sum_t ((Z Z^\top + S_t)^{-1} - a_t a_t^\top) Z`,
:math:`a_t = (Z Z^\top + S_t)^{-1} y_t`, at :math:`O(2 N^2 D + C N^3)`.
"""

from __future__ import annotations

import math
from typing import List, Tuple

import torch
from torch import Tensor

from rfgp.inference._linalg import robust_cholesky

__all__ = ["heteroscedastic_negative_log_evidence", "shared_weight_split"]

LOG_2PI = math.log(2.0 * math.pi)


def shared_weight_split(weights: Tensor) -> Tuple[Tensor, List[Tensor]]:
    r"""Per column, a shared weight and the rows whose weight differs from it.

    ``weights`` is ``(N, T)``. Column ``t``'s shared weight :math:`w_t` is its most frequent
    value, and its rows :math:`R_t` those with another value, so that
    :math:`\mathrm{diag}(W_{\cdot t}) = w_t I + \text{(a correction on } R_t)`. When fewer than
    half the rows share a value, :math:`w_t = 0` and :math:`R_t` holds every row (nothing is
    gained from sharing).

    Returns:
        ``(shared (T,), rows)``: the shared weights and, per column, a ``long`` tensor of rows.

    Example:
        >>> w = torch.tensor([[1.0, 5.0], [2.0, 5.0], [2.0, 3.0]])
        >>> shared, rows = shared_weight_split(w)
        >>> shared.tolist(), [r.tolist() for r in rows]
        ([2.0, 5.0], [[0], [2]])
    """
    n, num_columns = weights.shape
    shared = weights.new_zeros(num_columns)
    rows = []
    for t in range(num_columns):
        value = torch.mode(weights[:, t]).values
        other = torch.nonzero(weights[:, t] != value).reshape(-1)
        if 2 * other.numel() > n:
            rows.append(torch.arange(n, device=weights.device))
        else:
            shared[t] = value
            rows.append(other)
    return shared, rows


def _weighted_grams(z: Tensor, weights: Tensor, shared: Tensor, rows: List[Tensor]) -> Tensor:
    """``Z^T diag(W_t) Z`` for every column ``t``, ``(T, D, D)``."""
    gram = z.T @ z if bool((shared != 0).any()) else None
    out = []
    for t, r in enumerate(rows):
        zr = z[r]
        extra = zr.T @ (zr * (weights[r, t] - shared[t]).unsqueeze(-1))
        out.append(extra if gram is None or shared[t] == 0 else extra + shared[t] * gram)
    return torch.stack(out)


class _WeightSpace(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z: Tensor, y: Tensor, noise: Tensor) -> Tensor:
        n, width = z.shape
        weights = noise.reciprocal()
        shared, rows = shared_weight_split(weights)
        bmat = _weighted_grams(z, weights, shared, rows)
        bmat.diagonal(dim1=-2, dim2=-1).add_(1.0)
        chol = torch.stack([robust_cholesky(b, None, "weight-space matrix B") for b in bmat])
        h = z.T @ (weights * y)  # (D, T)
        alpha = torch.cholesky_solve(h.T.unsqueeze(-1), chol).squeeze(-1).T  # (D, T)
        resid = y - z @ alpha
        wr = weights * resid  # (Z Z^T + S_t)^{-1} y_t per column
        quad = (y * wr).sum(0)
        logdet = 2.0 * chol.diagonal(dim1=-2, dim2=-1).log().sum(-1) + noise.log().sum(0)
        ctx.save_for_backward(z, weights, shared, chol, alpha, wr)
        ctx.rows = rows
        return 0.5 * (quad + logdet + n * LOG_2PI).sum()

    @staticmethod
    def backward(ctx, grad: Tensor):
        z, weights, shared, chol, alpha, wr = ctx.saved_tensors
        binv = torch.cholesky_inverse(chol)  # (T, D, D)
        grad_z = z @ (shared.reshape(-1, 1, 1) * binv).sum(0) - wr @ alpha.T
        for t, r in enumerate(ctx.rows):
            corr = (weights[r, t] - shared[t]).unsqueeze(-1) * (z[r] @ binv[t])
            grad_z.index_add_(0, r, corr)
        return grad * grad_z, grad * wr, None


class _FunctionSpace(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z: Tensor, y: Tensor, noise: Tensor) -> Tensor:
        n = z.shape[0]
        kmat = (z @ z.T).unsqueeze(0) + torch.diag_embed(noise.T)  # (T, N, N)
        prior = float(z.detach().square().sum(-1).mean()) or None
        chol = torch.stack([robust_cholesky(k, None, "kernel matrix K + S", prior) for k in kmat])
        a = torch.cholesky_solve(y.T.unsqueeze(-1), chol).squeeze(-1).T  # (N, T)
        quad = (y * a).sum(0)
        logdet = 2.0 * chol.diagonal(dim1=-2, dim2=-1).log().sum(-1)
        ctx.save_for_backward(z, chol, a)
        return 0.5 * (quad + logdet + n * LOG_2PI).sum()

    @staticmethod
    def backward(ctx, grad: Tensor):
        z, chol, a = ctx.saved_tensors
        kinv = torch.cholesky_inverse(chol).sum(0)
        grad_z = (kinv - a @ a.T) @ z
        return grad * grad_z, grad * a, None


def heteroscedastic_negative_log_evidence(z: Tensor, y: Tensor, noise: Tensor) -> Tensor:
    r"""``-log p(Y)`` for independent columns :math:`y_t \sim N(0, Z Z^\top + S_t)`,
    :math:`S_t = \mathrm{diag}(s_{\cdot t})` a fixed noise per point and column,
    differentiable in ``z`` and ``y`` with the gradients in closed form.

    With :math:`W_t = S_t^{-1}`, :math:`B_t = I + Z^\top W_t Z` and
    :math:`r_t = y_t - Z B_t^{-1} Z^\top W_t y_t`,

    .. math::
        -\log p(Y) = \tfrac12 \textstyle\sum_t \big(y_t^\top W_t r_t + \log|B_t|
            + \sum_n \log s_{nt} + N \log 2\pi\big).

    The weight-space form (``D x D`` matrices) is used when ``N >= D``, the function-space form
    (``N x N``) otherwise. Columns with a shared noise value on most rows (as the Dirichlet
    transform's) share one :math:`Z^\top Z`.

    Args:
        z: ``(N, D)`` real features (times the square root of the outputscale).
        y: ``(N, T)`` targets.
        noise: ``(N, T)`` positive noise variances (not differentiated).

    Returns:
        A 0-d tensor.

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> z = torch.randn(30, 4, dtype=torch.float64, generator=g)
        >>> y = torch.randn(30, 2, dtype=torch.float64, generator=g)
        >>> s = torch.rand(30, 2, dtype=torch.float64, generator=g) + 0.1
        >>> exact = sum(-torch.distributions.MultivariateNormal(
        ...     torch.zeros(30, dtype=torch.float64), z @ z.T + torch.diag(s[:, t])
        ... ).log_prob(y[:, t]) for t in range(2))
        >>> bool(torch.isclose(heteroscedastic_negative_log_evidence(z, y, s), exact))
        True
    """
    # Shape checks only: this runs at every evaluation of an optimiser's loss.
    if (z.dim() != 2 or y.dim() != 2 or y.shape[0] != z.shape[0] or z.shape[0] == 0
            or noise.shape != y.shape):
        raise ValueError(
            "heteroscedastic_negative_log_evidence: z must have shape (N, D), y and noise shape "
            f"(N, T) with N >= 1, got z {tuple(z.shape)}, y {tuple(y.shape)}, noise "
            f"{tuple(noise.shape)}"
        )
    noise = noise.detach().to(z)
    if z.shape[0] < z.shape[1]:
        return _FunctionSpace.apply(z, y, noise)
    return _WeightSpace.apply(z, y, noise)
