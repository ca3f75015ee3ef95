r"""The CG path's iterations and Nyström rank, forecast from a smaller model's spectrum.

The cost model of the CG path (:func:`~rfgp.inference._fit_cost.iterative_fit_cost`) counts
its products with :data:`~rfgp.inference._fit_cost.CG_ITERATIONS` iterations per solve and a
sketch of rank :data:`~rfgp.inference._fit_cost.SKETCH_RANK`: the constants of a typical noisy
set. The iterations grow with the signal-to-noise ratio and with how slowly the kernel's
spectrum decays, and on a nearly noiseless set they are several times the constant (on pol,
noise 0.008 in standardised units, 62 to 85 iterations and a sketch of rank 1,024). The
recipe's final fit calibrates a model of :math:`m` features (:math:`m` =
:data:`~rfgp.inference._fit_cost.CHOICE_FEATURES`) in weight space before the large one: the
eigenvalues :math:`\lambda_i` of its Gram matrix :math:`\Phi^\top\Phi` and the calibrated
:math:`c = a / \sigma^2` forecast the large model's iterations.

* **The spectrum at D.** :math:`\mu_i = c\,\lambda_i` are the eigenvalues of :math:`cG` in
  :math:`B = I + cG`. An :math:`m`-feature Gram matrix is rank :math:`m`, so its eigenvalues
  fall short of the kernel matrix's as :math:`i` nears :math:`m`; they are used up to
  :math:`m / 4` (:data:`RELIABLE_SHARE`), and beyond, up to :math:`D`, continued by the power
  law fitted to :math:`\log\mu_i` against :math:`\log i` on :math:`[m/16, m/4]`:
  :math:`\mu_i = \mu_{m/4}\,(4 i / m)^{s}` (``s`` the fitted slope, at most 0).
* **The sketch's residual.** A randomized Nyström sketch of rank :math:`r` leaves an error
  whose typical size is :math:`E_r = \min_{k < r - 1} \big(\mu_{k+1} + \frac{1}{r - k}
  \sum_{j > k} \mu_j\big)`: the first eigenvalue it cannot hold plus the tail's mass spread
  over the oversampling :math:`r - k` (the leading terms of the randomized Nyström error bound
  without its constants). The preconditioned condition number is then
  :math:`\kappa_r = 1 + E_r`, and a solve to the relative residual :math:`\epsilon` takes
  :math:`I_r = \tfrac12\sqrt{\kappa_r}\,\ln(2/\epsilon)` iterations
  (:func:`~rfgp.inference._iterative.cg_iterations_bound`).
* **The rank.** The sketch's own rule doubles its rank while that pays over its solves; the
  forecast takes the rank of :data:`FORECAST_RANKS` (at most :math:`D / 2`) whose whole
  calibrated fit costs least, with its :math:`I_r`.

The forecast is of the cost, not of each of its terms. On pol (13,500 rows, the choice
model's noise 0.017) at 6,144 features it forecasts rank 512 and 161 iterations (condition
282); the sketch itself grew to rank 1,024 and its solves took 62 and 71 iterations, and the
products it counted come to 3,898 ``N D`` multiply-adds against the forecast's 3,814 (the
constants' model: 1,885). On the noisier power-plant, elevators, bike and pumadyn32nm the
forecast is 10 to 14 iterations, fewer than the constant's 40.

Internal: not part of the public API (see :mod:`rfgp.inference`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from rfgp.inference._fit_cost import iterative_fit_cost
from rfgp.inference._iterative import cg_iterations_bound

__all__ = ["CGForecast", "FORECAST_RANKS", "RELIABLE_SHARE", "forecast_cg", "sketch_residual",
           "spectrum_at"]

#: The Nyström ranks the forecast chooses among (the sketch's rule doubles from 32; below
#: 512 it always grows, so 512 is its least rank at the widths the CG path takes).
FORECAST_RANKS = (512, 1024, 2048, 4096)
#: Share of an ``m``-feature Gram matrix's eigenvalues trusted as the kernel matrix's.
RELIABLE_SHARE = 0.25
#: The relative residual the forecast's solves reach (the CG path's float64 tolerance).
FORECAST_TOLERANCE = 1e-8


@dataclass(frozen=True)
class CGForecast:
    """A forecast of the CG path at ``num_features``: its Nyström ``rank``, CG ``iterations``
    per solve, the preconditioned ``condition`` number and the calibrated fit's
    ``multiply_adds`` (:func:`~rfgp.inference._fit_cost.iterative_fit_cost`)."""

    num_features: int
    rank: int
    iterations: float
    condition: float
    multiply_adds: float


def spectrum_at(eigenvalues: Tensor, scale: float, width: int) -> Tensor:
    r"""The forecast eigenvalues :math:`\mu_1 \ge \dots \ge \mu_D` of :math:`cG` for a
    ``width``-feature model (module docstring), from the eigenvalues of an ``m``-feature
    model's Gram matrix and :math:`c` = ``scale``.

    Args:
        eigenvalues: ``(m,)`` eigenvalues of :math:`\Phi^\top\Phi`, any order.
        scale: :math:`c \ge 0`.
        width: :math:`D`.

    Returns:
        ``(D,)`` float64, descending.

    Example:
        >>> lam = 1.0 / torch.arange(1, 2049, dtype=torch.float64) ** 2
        >>> mu = spectrum_at(lam, 1.0, 8192)
        >>> bool(torch.allclose(mu[:512], lam[:512])), round(float(mu[4095] / mu[2047]), 3)
        (True, 0.25)
    """
    mu = (scale * eigenvalues.to(torch.float64)).clamp_min(0.0).sort(descending=True).values
    m = mu.shape[0]
    trusted = max(1, min(int(RELIABLE_SHARE * m), width))
    if width <= trusted:
        return mu[:width]
    low = max(1, trusted // 4)
    head = mu[:trusted]
    index = torch.arange(low, trusted + 1, dtype=torch.float64)
    values = head[low - 1:trusted]
    slope = 0.0
    if bool((values > 0).all()) and trusted > low:
        log_i, log_mu = index.log(), values.log()
        centred = log_i - log_i.mean()
        slope = min(0.0, float((centred * (log_mu - log_mu.mean())).sum() / centred.square().sum()))
    elif not bool((values > 0).all()):
        slope = -math.inf  # the spectrum ends within the trusted part: nothing beyond
    rest = torch.arange(trusted + 1, width + 1, dtype=torch.float64)
    anchor = float(head[-1])
    tail = (anchor * (rest / trusted) ** slope if math.isfinite(slope)
            else torch.zeros_like(rest))
    return torch.cat([head, tail])


def sketch_residual(spectrum: Tensor, rank: int) -> float:
    r""":math:`E_r = \min_{0 \le k \le r - 2} \big(\mu_{k+1} + \frac{1}{r - k}\sum_{j > k}
    \mu_j\big)` of a descending ``spectrum`` for a sketch of rank ``r`` (module docstring);
    0 where the spectrum has at most ``rank - 1`` entries.

    Example:
        >>> mu = torch.tensor([100.0, 10.0, 1.0, 0.0], dtype=torch.float64)
        >>> sketch_residual(mu, 4)  # k = 2: mu_3 + (mu_3 + mu_4) / 2
        1.5
    """
    k = torch.arange(0, min(rank - 1, spectrum.shape[0]), dtype=torch.float64)
    if k.numel() == 0:
        return 0.0
    tails = spectrum.flip(0).cumsum(0).flip(0)[:k.numel()]  # sum_{j > k} mu_j (1-based)
    return float((spectrum[:k.numel()] + tails / (rank - k)).min())


def forecast_cg(eigenvalues: Tensor, scale: float, num_rows: int, num_features: int,
                input_dim: int, candidates: int = 1, streamed: bool = False,
                tolerance: float = FORECAST_TOLERANCE) -> CGForecast:
    r"""The CG path's rank, iterations and cost at ``num_features`` forecast from a smaller
    model's Gram eigenvalues (module docstring).

    Args:
        eigenvalues: ``(m,)`` eigenvalues of the smaller model's :math:`\Phi^\top\Phi`.
        scale: :math:`c = a / \sigma^2` of its calibration (in the same units).
        num_rows, num_features, input_dim: ``N``, ``D``, ``d`` of the large model.
        candidates, streamed: as in :func:`~rfgp.inference._fit_cost.iterative_fit_cost`.
        tolerance: the solves' relative residual.

    Returns:
        The :class:`CGForecast` of least cost over :data:`FORECAST_RANKS`.

    Example:
        >>> fast = 1e3 * torch.exp(-torch.arange(2048.0, dtype=torch.float64) / 20)
        >>> slow = 1e3 / torch.arange(1, 2049, dtype=torch.float64)
        >>> a = forecast_cg(fast, 1.0, 10**4, 8192, 8)
        >>> b = forecast_cg(slow, 1.0, 10**4, 8192, 8)
        >>> a.rank, a.iterations < b.iterations, a.multiply_adds < b.multiply_adds
        (512, True, True)
    """
    spectrum = spectrum_at(eigenvalues, scale, num_features)
    best = None
    for rank in FORECAST_RANKS:
        if rank > max(FORECAST_RANKS[0], num_features // 2):
            break
        condition = 1.0 + sketch_residual(spectrum, rank)
        iterations = cg_iterations_bound(condition, tolerance)
        cost = iterative_fit_cost(num_rows, num_features, input_dim, candidates, streamed,
                                  iterations=iterations, rank=rank)
        if best is None or cost < best.multiply_adds:
            best = CGForecast(num_features, rank, iterations, condition, cost)
    return best
