r"""K-fold cross-validation of a hyperparameter search by held-out log predictive density.

A *search* maps training rows to a kernel and a noise (it fits the hyperparameters). Its
cross-validated score is the mean log predictive density of the held-out targets, noise
included,

.. math::
    \mathrm{CV} = \frac{1}{N T} \sum_{k=1}^{K} \sum_{i \in F_k} \sum_t
        \log \mathcal N\big(y_{it};\ \mu_{-k}(x_i),\ \sigma^2_{-k}(x_i) + \sigma^2_{n,-k}\big),

where :math:`\mu_{-k}, \sigma^2_{-k}` are the posterior mean and variance of the GP fitted by the
search on every fold but :math:`F_k`. The search runs afresh on each fold's training rows (from
its own starting point), so the score judges the whole procedure and not hyperparameters that
have already seen the held-out rows: the score of hyperparameters fitted on all rows is biased
towards the more flexible search, by about the number of hyperparameters over ``N``.

:func:`kfold_indices` draws the folds; :func:`held_out_log_density` scores one fitted kernel,
through the exact kernel (``exact=True``) or the random-feature GP; :func:`cross_validate`
runs searches over the folds and scores each.
"""

from __future__ import annotations

import math
from typing import Callable, Iterator, List, Optional, Tuple

import torch
from gpytorch.kernels import ScaleKernel
from linear_operator.utils.errors import NotPSDError
from torch import Tensor

from rfgp._validation import check_int, check_rows, check_tensor, select_active_columns
from rfgp.inference._evidence import LOG_2PI
from rfgp.inference._feature_gp import RandomFeatureGP
from rfgp.inference._linalg import try_cholesky
from rfgp.kernels._fourier import FourierFeatureKernel, stationary_kernel

__all__ = ["cross_validate", "held_out_log_density", "kfold_indices"]

#: A search: training rows ``(x, y)`` to fitted kernels and noise variances, yielded in turn.
Search = Callable[[Tensor, Tensor], Iterator[Tuple[ScaleKernel, Tensor]]]


def kfold_indices(num_rows: int, folds: int, generator: Optional[torch.Generator] = None
                  ) -> List[Tensor]:
    r"""A random partition of ``range(num_rows)`` into ``folds`` folds of sizes differing by at
    most one: :math:`\lceil N/K \rceil` or :math:`\lfloor N/K \rfloor` rows each.

    Args:
        num_rows: ``N >= folds``.
        folds: ``K >= 2``.
        generator: the random permutation's generator.

    Returns:
        ``K`` one-dimensional index tensors (int64), together every row once.

    Example:
        >>> parts = kfold_indices(10, 3, torch.Generator().manual_seed(0))
        >>> [p.numel() for p in parts], sorted(torch.cat(parts).tolist()) == list(range(10))
        ([4, 3, 3], True)
    """
    folds = check_int("folds", folds, minimum=2)
    num_rows = check_int("num_rows", num_rows, minimum=folds)
    return list(torch.randperm(num_rows, generator=generator).tensor_split(folds))


def _gaussian_log_density(y: Tensor, mean: Tensor, var: Tensor) -> Tensor:
    """Per row, summed over the target columns."""
    return -0.5 * (LOG_2PI + var.log() + (y - mean).square() / var).sum(-1)


def held_out_log_density(
    kernel: ScaleKernel,
    noise: Tensor,
    x_train: Tensor,
    y_train: Tensor,
    x_test: Tensor,
    y_test: Tensor,
    exact: bool = False,
) -> Tensor:
    r"""Per test row :math:`i`, the log predictive density :math:`\sum_t \log \mathcal N(y_{it};
    \mu_t(x_i), \sigma^2(x_i) + \sigma_n^2)` under the GP conditioned on the training rows.

    With ``exact=True`` the GP is the exact one of the kernel the features approximate
    (:func:`~rfgp.kernels.stationary_kernel`, :math:`O(n^3)`): with
    :math:`L L^\top = K + \sigma_n^2 I`, :math:`\mu = K_*^\top L^{-\top} L^{-1} y` and
    :math:`\sigma^2 = s - \|L^{-1} K_*\|^2`. Otherwise it is the random-feature GP
    (:class:`~rfgp.RandomFeatureGP`).

    Args:
        kernel: a ``ScaleKernel``; around a :class:`~rfgp.kernels.FourierFeatureKernel` when
            ``exact``.
        noise: 0-d noise variance :math:`\sigma_n^2`.
        x_train, y_train: ``(n, d)`` and ``(n,)`` or ``(n, T)`` training rows.
        x_test, y_test: ``(m, d)`` and ``(m,)`` or ``(m, T)`` test rows.
        exact: use the exact kernel.

    Returns:
        ``(m,)`` log densities, each summed over the target columns (``-inf`` everywhere when
        the training kernel matrix plus noise cannot be factorised, a noise <= 0 included: a
        search's failed candidate scores the worst, it does not stop the cross-validation).

    Raises:
        TypeError, ValueError: for rows that are not finite floating tensors of one dtype with
            matching shapes, or a noise that is not a finite 0-d tensor.

    Example:
        >>> from rfgp.recipes._start import make_ard_kernel
        >>> g = torch.Generator().manual_seed(0)
        >>> x = torch.randn(40, 2, dtype=torch.float64, generator=g)
        >>> y = torch.sin(x[:, 0])
        >>> k = make_ard_kernel(2048, 2, seed=0)
        >>> noise = torch.tensor(0.01, dtype=torch.float64)
        >>> exact = held_out_log_density(k, noise, x[:30], y[:30], x[30:], y[30:], exact=True)
        >>> approx = held_out_log_density(k, noise, x[:30], y[:30], x[30:], y[30:])
        >>> exact.shape, bool((exact - approx).abs().sum() < 2.0)
        (torch.Size([10]), True)
    """
    x_train, y_train = check_rows(x_train, y_train, "x_train", "y_train")
    x_test, y_test = check_rows(x_test, y_test, "x_test", "y_test", num_inputs=x_train.shape[1])
    if y_test.dim() != y_train.dim() or y_test.shape[1:] != y_train.shape[1:]:
        raise ValueError(
            f"y_test must have the columns of y_train {tuple(y_train.shape)}, got "
            f"{tuple(y_test.shape)}"
        )
    noise = check_tensor("noise", noise, max_dim=0)
    y_train = y_train.unsqueeze(-1) if y_train.dim() == 1 else y_train
    y_test = y_test.unsqueeze(-1) if y_test.dim() == 1 else y_test
    noise = noise.detach().to(x_train)
    with torch.no_grad():
        if exact:
            base = kernel.base_kernel
            if not isinstance(base, FourierFeatureKernel):
                raise TypeError(
                    "held_out_log_density(exact=True) needs a ScaleKernel around a "
                    f"FourierFeatureKernel, got {type(base).__name__}"
                )
            # the columns the kernel sees, as the random-feature path's features select them
            x_train = select_active_columns(x_train, base.active_dims, "x_train")
            x_test = select_active_columns(x_test, base.active_dims, "x_test")
            scale = kernel.outputscale.detach()
            k = stationary_kernel(x_train, x_train, base.lengthscale, base.nu) * scale
            k.diagonal().add_(noise)
            chol = try_cholesky(k)
            if chol is None:
                return torch.full((x_test.shape[0],), -math.inf, dtype=x_test.dtype)
            cross = stationary_kernel(x_train, x_test, base.lengthscale, base.nu) * scale
            mean = cross.T @ torch.cholesky_solve(y_train, chol)
            root = torch.linalg.solve_triangular(chol, cross, upper=False)
            var = (scale - root.square().sum(0)).clamp_min(0.0) + noise
        elif not bool(noise > 0):
            return torch.full((x_test.shape[0],), -math.inf, dtype=x_test.dtype)
        else:
            try:
                gp = RandomFeatureGP(kernel, noise=noise).fit(x_train, y_train)
                mean, std = gp.predict(x_test, return_std=True)
            except NotPSDError:
                return torch.full((x_test.shape[0],), -math.inf, dtype=x_test.dtype)
            mean = mean.reshape(y_test.shape)
            var = std.reshape(y_test.shape[0], -1)[:, 0].square() + noise
        return _gaussian_log_density(y_test, mean, var.unsqueeze(-1))


def cross_validate(
    search: Search,
    x: Tensor,
    y: Tensor,
    folds: int,
    generator: Optional[torch.Generator] = None,
    exact: bool = False,
) -> Tensor:
    r"""Held-out log predictive densities of one or more searches over ``folds`` folds.

    For each fold, ``search(x_rest, y_rest)`` runs on the other rows and yields fitted
    ``(kernel, noise)`` pairs in turn, always the same number; each is scored on the fold's
    rows by :func:`held_out_log_density` as soon as it is yielded, so a later candidate may
    continue from the state of an earlier one (a bounded search that starts where the
    unbounded one ended, say). A candidate whose search cannot factorise its data scores
    ``-inf`` on that fold.

    Args:
        search: ``(x, y) -> iterator of (kernel, noise)``, fitting the hyperparameters afresh
            (from a start that depends on ``(x, y)`` alone).
        x, y: ``(N, d)`` and ``(N,)`` or ``(N, T)`` rows.
        folds: ``K >= 2``.
        generator: the random partition (:func:`kfold_indices`).
        exact: score through the exact kernel.

    Returns:
        ``(C, N)``: for each of the ``C`` candidates, in the order yielded, the log density of
        each row (summed over target columns) while its fold was held out. Its mean over rows,
        divided by ``T``, is the cross-validated log predictive density (higher is better).

    Example:
        >>> from rfgp.recipes._start import make_ard_kernel
        >>> g = torch.Generator().manual_seed(0)
        >>> x = torch.randn(60, 1, dtype=torch.float64, generator=g)
        >>> y = torch.sin(2 * x[:, 0]) + 0.1 * torch.randn(60, dtype=torch.float64, generator=g)
        >>> def two_lengthscales(x, y):
        ...     k = make_ard_kernel(64, 1, seed=0)
        ...     noise = torch.tensor(0.01, dtype=torch.float64)
        ...     for lengthscale in (0.5, 20.0):
        ...         k.base_kernel.lengthscale = torch.tensor([[lengthscale]], dtype=torch.float64)
        ...         yield k, noise
        >>> scores = cross_validate(two_lengthscales, x, y, 5, torch.Generator().manual_seed(0),
        ...                         exact=True)
        >>> scores.shape, bool(scores[0].mean() > scores[1].mean())
        (torch.Size([2, 60]), True)
    """
    x, y = check_rows(x, y)
    parts = kfold_indices(x.shape[0], folds, generator)
    rows: List[List[Tensor]] = []
    for k, held in enumerate(parts):
        rest = torch.cat([p for j, p in enumerate(parts) if j != k]).to(x.device)
        held = held.to(x.device)
        scores: List[Tensor] = []
        try:
            for kernel, noise in search(x[rest], y[rest]):
                scores.append(held_out_log_density(
                    kernel, noise, x[rest], y[rest], x[held], y[held], exact))
        except NotPSDError:
            pass
        count = max(len(scores), len(rows))
        failed = torch.full((held.numel(),), -math.inf, dtype=x.dtype, device=x.device)
        scores += [failed] * (count - len(scores))
        rows += [[failed.new_full((p.numel(),), -math.inf) for p in parts[:k]]
                 for _ in range(count - len(rows))]
        for candidate, score in zip(rows, scores):
            candidate.append(score)
    order = torch.cat(parts).to(x.device)
    result = torch.empty(len(rows), x.shape[0], dtype=x.dtype, device=x.device)
    for c, candidate in enumerate(rows):
        result[c, order] = torch.cat(candidate).to(x.dtype)
    return result
