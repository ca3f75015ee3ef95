r"""The held-out negative log likelihood of a Dirichlet random-feature classifier at several
``alpha_epsilon``, from one pass over the training rows.

The transform's noise and targets take two values per class: on the class's own rows
:math:`R_c` (concentration :math:`1 + \alpha`) and on the others (:math:`\alpha`). With the
kernel's ``D`` features :math:`Z` (outputscale included), the class weights
:math:`w_1(\alpha) = 1/\tilde\sigma^2_{\text{own}}`, :math:`w_0(\alpha) = 1/\tilde\sigma^2_{
\text{other}}` and the centred targets :math:`\tilde y_c(\alpha)`, the weight-space
posterior of class ``c`` needs

.. math::
    B_c(\alpha) = I + w_0 Z^\top Z + (w_1 - w_0) Z_{R_c}^\top Z_{R_c}, \qquad
    h_c(\alpha) = Z^\top W_c \tilde y_c
        = v_0 Z^\top 1 + (v_1 - v_0) Z_{R_c}^\top 1,

(:math:`v_j = w_j \tilde y_j`, the targets' two values times their weights): the Gram matrices
:math:`Z^\top Z` and :math:`Z_{R_c}^\top Z_{R_c}` do not depend on :math:`\alpha`, so every
candidate costs one Cholesky factor per class, not a new pass over the rows. At a validation
point with features :math:`z`, :math:`f_c \sim N(z^\top B_c^{-1} h_c + m_c,\;
\|L_c^{-1} z\|^2)` (:math:`L_c L_c^\top = B_c`, :math:`m_c` the centring offset), and the
probabilities are the deterministic mean-field :math:`\mathbb{E}[\mathrm{softmax}(f)]`
(:func:`~rfgp.classification.softmax_expectation`).

On fewer training rows than features the same posterior comes from the ``N_t x N_t`` kernel
matrix :math:`K = Z Z^\top`: :math:`f_c \sim N(k^\top (K + S_c)^{-1} \tilde y_c + m_c,\;
z^\top z - \|L_c^{-1} k\|^2)` with :math:`L_c L_c^\top = K + S_c` and :math:`k = Z z`.
"""

from __future__ import annotations

import math
from typing import Sequence, Tuple

import torch
from gpytorch.kernels import ScaleKernel
from torch import Tensor

from rfgp._softmax import softmax_expectation
from rfgp.likelihoods import dirichlet_transform

__all__ = ["HeldOutStatistics", "held_out_cost", "held_out_nll", "held_out_statistics"]


def held_out_cost(train_rows: int, validation_rows: int, num_features: int, num_classes: int,
                  num_alphas: int) -> float:
    r"""Multiply-adds of :func:`held_out_nll`: in weight space the Gram matrices,
    :math:`2 N_t D^2` (the shared one and each class's on its own rows), then per
    ``alpha_epsilon`` and class a Cholesky factor, :math:`D^3 / 3`, and the validation
    variances, :math:`N_v D^2` (one triangular solve); on fewer training rows than features
    the same with the kernel matrices (:math:`N_t^2 D + N_v N_t D`) and ``N_t`` in place of
    ``D``.

    Example:
        >>> held_out_cost(1000, 100, 64, 3, 2) == 2 * 1000 * 64**2 + 6 * (64**3 / 3 + 100 * 64**2)
        True
    """
    n, v, m = float(train_rows), float(validation_rows), float(num_features)
    if n < m:
        return n * (n + v) * m + num_alphas * num_classes * (n**3 / 3 + v * n * n)
    return 2 * n * m * m + num_alphas * num_classes * (m**3 / 3 + v * m * m)


def held_out_nll(kernel: ScaleKernel, x_train: Tensor, labels_train: Tensor, x_valid: Tensor,
                 labels_valid: Tensor, num_classes: int, alphas: Sequence[float],
                 chunk_rows: int = 4096) -> Tensor:
    r"""The validation mean negative log probability of the true class, per ``alpha``, of the
    Dirichlet classifier with ``kernel`` fitted on the training rows (centred targets; see
    the module docstring).

    Args:
        kernel: a ``ScaleKernel`` around a real random-feature kernel (``D`` features).
        x_train, labels_train: ``(N_t, d)`` inputs and ``(N_t,)`` class indices in
            ``[0, num_classes)``.
        x_valid, labels_valid: ``(N_v, d)`` and ``(N_v,)`` likewise.
        num_classes: ``C``.
        alphas: the candidate ``alpha_epsilon`` values.
        chunk_rows: rows of features computed at a time.

    Returns:
        ``(len(alphas),)`` float64: the held-out NLL of each, what
        ``DirichletGPClassifier(kernel, alpha, outputscale=1.0)`` fitted on the training rows
        gives with ``predict_log_proba(x_valid, method="mean_field")``.

    Example:
        >>> from rfgp.kernels import FourierFeatureKernel
        >>> k = ScaleKernel(FourierFeatureKernel(32, seed=0)).double()
        >>> x = torch.randn(60, 2, dtype=torch.float64)
        >>> labels = (x[:, 0] > 0).long()
        >>> held_out_nll(k, x[:40], labels[:40], x[40:], labels[40:], 2, (0.01, 0.1)).shape
        torch.Size([2])
    """
    statistics = held_out_statistics(kernel, x_train, labels_train, x_valid, labels_valid,
                                     num_classes, chunk_rows)
    return torch.stack([statistics.nll(alpha) for alpha in alphas])


def held_out_statistics(kernel: ScaleKernel, x_train: Tensor, labels_train: Tensor,
                        x_valid: Tensor, labels_valid: Tensor, num_classes: int,
                        chunk_rows: int = 4096) -> HeldOutStatistics:
    r"""What the held-out NLL of ``kernel``'s features needs at every ``alpha_epsilon`` and
    outputscale factor, from one pass over the training rows: in weight space the Gram
    matrices :math:`Z^\top Z` and :math:`Z_{R_c}^\top Z_{R_c}` (``C + 1`` matrices of
    ``D x D``), the sums :math:`Z_{R_c}^\top 1` and the validation features; on fewer
    training rows than features the kernel matrices :math:`Z Z^\top` and :math:`Z Z_v^\top`.
    Arguments as :func:`held_out_nll`.

    Example:
        >>> from rfgp.kernels import FourierFeatureKernel
        >>> k = ScaleKernel(FourierFeatureKernel(32, seed=0)).double()
        >>> x = torch.randn(60, 2, dtype=torch.float64)
        >>> labels = (x[:, 0] > 0).long()
        >>> k.outputscale = 1.0
        >>> s = held_out_statistics(k, x[:40], labels[:40], x[40:], labels[40:], 2)
        >>> k.outputscale = 2.0  # the factor 2 is the outputscale 2
        >>> at_two = held_out_nll(k, x[:40], labels[:40], x[40:], labels[40:], 2, (0.01,))
        >>> bool(torch.isclose(s.nll(0.01, 2.0), at_two[0], rtol=1e-8))
        True
    """
    base, scale = kernel.base_kernel, kernel.outputscale.detach().sqrt()
    dtype = torch.float64
    with torch.no_grad():
        z_valid = (base.features(x_valid) * scale).to(dtype)  # (N_v, D)
        if x_train.shape[0] < base.num_features:
            z = (base.features(x_train) * scale).to(dtype)  # (N_t, D)
            return HeldOutStatistics(labels_valid, num_classes, labels_train=labels_train,
                                     kernel_matrix=z @ z.T, cross=z @ z_valid.T,
                                     prior=z_valid.square().sum(-1))
        gram, sums = None, None
        for start in range(0, x_train.shape[0], chunk_rows):
            z = (base.features(x_train[start:start + chunk_rows]) * scale).to(dtype)  # (n, D)
            one_hot = torch.nn.functional.one_hot(
                labels_train[start:start + chunk_rows], num_classes).to(dtype)  # (n, C)
            if gram is None:
                gram = z.new_zeros(z.shape[1], z.shape[1])
                sums = z.new_zeros(z.shape[1], num_classes)
            gram.addmm_(z.T, z)
            sums.addmm_(z.T, one_hot)  # Z_{R_c}^T 1 per class
        own = torch.stack([_own_gram(base, scale, x_train[labels_train == c], chunk_rows, gram)
                           for c in range(num_classes)])  # (C, D, D)
        counts = torch.bincount(labels_train, minlength=num_classes).to(dtype)
    return HeldOutStatistics(labels_valid, num_classes, gram=gram, own=own, sums=sums,
                             counts=counts, z_valid=z_valid)


class HeldOutStatistics:
    r"""The held-out NLL of one feature map's Dirichlet classifier as a function of
    ``alpha_epsilon`` and of a factor :math:`a` on the outputscale (built by
    :func:`held_out_statistics`). The factor scales the features by :math:`\sqrt a`: in
    weight space :math:`B_c = I + a (w_0 Z^\top Z + (w_1 - w_0) Z_{R_c}^\top Z_{R_c})`, the
    latent mean :math:`a\, z^\top B_c^{-1} h_c + m_c` and variance
    :math:`a \|L_c^{-1} z\|^2`; in function space :math:`a K + S_c`, :math:`a k` and
    :math:`a z^\top z`. Each :meth:`nll` costs one Cholesky factor per class."""

    def __init__(self, labels_valid: Tensor, num_classes: int, **parts: Tensor) -> None:
        self.labels_valid, self.num_classes, self.parts = labels_valid, num_classes, parts

    def nll(self, alpha: float, factor: float = 1.0) -> Tensor:
        """The held-out mean negative log probability of the true class at ``alpha`` and
        outputscale factor ``factor`` (a float64 scalar): the mean of :meth:`row_nll`."""
        return self.row_nll(alpha, factor).mean()

    def moments(self, alpha: float, factor: float = 1.0) -> Tuple[Tensor, Tensor]:
        """The latent means and variances ``(N_v, C)`` on the validation rows at ``alpha``
        and outputscale factor ``factor`` (one Cholesky factor per class)."""
        with torch.no_grad():
            if "kernel_matrix" in self.parts:
                return self._function_space(alpha, factor)
            return self._weight_space(alpha, factor)

    def row_nll(self, alpha: float, factor: float = 1.0) -> Tensor:
        r"""The negative log probability of the true class on each validation row,
        :math:`-\log p(y_n \mid x_n)`, at ``alpha`` and outputscale factor ``factor``:
        ``(N_v,)`` float64. Two factors' vectors, row by row, give the paired standard error
        of their NLL difference
        (:func:`~rfgp.classification._held_out_scale.paired_standard_error`).

        Example:
            >>> from rfgp.kernels import FourierFeatureKernel
            >>> k = ScaleKernel(FourierFeatureKernel(32, seed=0)).double()
            >>> x = torch.randn(60, 2, dtype=torch.float64)
            >>> labels = (x[:, 0] > 0).long()
            >>> s = held_out_statistics(k, x[:40], labels[:40], x[40:], labels[40:], 2)
            >>> rows = s.row_nll(0.01, 2.0)
            >>> rows.shape, bool(rows.mean() == s.nll(0.01, 2.0))
            (torch.Size([20]), True)
        """
        means, variances = self.moments(alpha, factor)
        log_proba = softmax_expectation(means, variances, method="mean_field", log=True)
        return -log_proba.gather(1, self.labels_valid.reshape(-1, 1)).squeeze(1)

    def _weight_space(self, alpha: float, factor: float) -> tuple:
        p = self.parts
        gram, own, sums, z_valid = p["gram"], p["own"], p["sums"], p["z_valid"]
        n = float(p["counts"].sum())
        total = sums.sum(-1)  # Z^T 1
        means = z_valid.new_zeros(z_valid.shape[0], self.num_classes)
        variances = torch.zeros_like(means)
        eye = torch.eye(gram.shape[0], dtype=gram.dtype, device=gram.device)
        for c in range(self.num_classes):
            (w0, w1), (v0, v1), offset = _class_values(alpha, p["counts"][c] / n)
            # I + (a PSD matrix): positive definite, its eigenvalues at least 1.
            chol = torch.linalg.cholesky(eye + factor * (w0 * gram + (w1 - w0) * own[c]))
            rhs = v0 * total + (v1 - v0) * sums[:, c]
            weights = torch.cholesky_solve(rhs.unsqueeze(-1), chol).squeeze(-1)
            means[:, c] = factor * (z_valid @ weights) + offset
            solved = torch.linalg.solve_triangular(chol, z_valid.T, upper=False)
            variances[:, c] = factor * solved.square().sum(0)
        return means, variances

    def _function_space(self, alpha: float, factor: float) -> tuple:
        p = self.parts
        kernel_matrix, cross = factor * p["kernel_matrix"], factor * p["cross"]
        targets, noise = dirichlet_transform(p["labels_train"], self.num_classes, alpha)
        targets, noise = targets.to(kernel_matrix), noise.to(kernel_matrix)
        offsets = targets.mean(0)
        means = cross.new_zeros(cross.shape[1], self.num_classes)
        variances = torch.zeros_like(means)
        for c in range(self.num_classes):
            # a K + S_c: a kernel matrix plus positive noise, positive definite.
            chol = torch.linalg.cholesky(kernel_matrix + torch.diag(noise[:, c]))
            solved = torch.linalg.solve_triangular(
                chol, torch.cat([(targets[:, c] - offsets[c]).unsqueeze(-1), cross], -1),
                upper=False)  # (N_t, 1 + N_v)
            means[:, c] = solved[:, 1:].T @ solved[:, 0] + offsets[c]
            # Rounding may leave a variance a hair below zero where the data pin f.
            variances[:, c] = (factor * p["prior"] - solved[:, 1:].square().sum(0)).clamp_min(0.0)
        return means, variances


def _own_gram(base, scale: Tensor, x_own: Tensor, chunk_rows: int, like: Tensor) -> Tensor:
    """``Z_R^T Z_R`` over a class's own rows."""
    own = torch.zeros_like(like)
    for start in range(0, x_own.shape[0], chunk_rows):
        z = (base.features(x_own[start:start + chunk_rows]) * scale).to(like.dtype)
        own.addmm_(z.T, z)
    return own


def _class_values(alpha: float, share: Tensor) -> tuple:
    """A class's two weights ``(w0, w1)``, its two weighted centred targets ``(v0, v1)``
    (other rows, own rows) and its centring offset, where ``share`` of the rows are its
    own."""
    targets, noise = dirichlet_transform(torch.tensor([0, 1]), 2, alpha)
    own, other = float(targets[0, 0]), float(targets[0, 1])
    own_noise, other_noise = float(noise[0, 0]), float(noise[0, 1])
    offset = float(share) * own + (1 - float(share)) * other
    w0, w1 = 1 / other_noise, 1 / own_noise
    v0, v1 = w0 * (other - offset), w1 * (own - offset)
    if not (math.isfinite(w0) and math.isfinite(w1)):
        raise ValueError(f"alpha_epsilon {alpha} gives a non-finite Dirichlet noise")
    return (w0, w1), (v0, v1), offset
