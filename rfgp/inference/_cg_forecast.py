r"""The CG path's iterations and Nyström rank, forecast from a smaller model's spectrum.

The cost model of the CG path (:func:`~rfgp.inference._cg_cost.iterative_fit_cost`) counts
its products with :data:`~rfgp.inference._cg_cost.CG_ITERATIONS` iterations per solve and a
sketch of rank :data:`~rfgp.inference._cg_cost.SKETCH_RANK`: the constants of a typical noisy
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
* **The sketch's residual.** A randomized Nyström sketch of rank :math:`r` holds the leading
  eigenvalues and leaves an error whose typical size is :math:`E_r = \min_{k < r - 1}
  \big(\mu_{k+1} + \frac{1}{r - k} \sum_{j > k} \mu_j\big)`: the first eigenvalue it cannot
  hold plus the tail's mass spread over the oversampling :math:`r - k` (the leading terms of
  the randomized Nyström error bound without its constants), at the minimising :math:`k`.
* **The preconditioned spectrum and its iterations.** The sketch's preconditioner maps the
  :math:`k` held eigenvalues to about 1 and the others to :math:`(1 + \mu_i) / (1 + E_r)`
  (at most 1). CG is run on that diagonal spectrum (clustered into
  :data:`SPECTRUM_CLUSTERS` log-spaced groups, each weighted by its count: a right-hand side
  of equal weight on every eigenvector) until its residual falls by
  :math:`\epsilon / \sqrt{1 + \mu_1}` (the solves test the residual of :math:`B` itself, which
  the preconditioner's spread :math:`1 + \mu_1` can make larger than the preconditioned one).
  The worst-case bound :math:`\tfrac12\sqrt{\kappa}\ln(2/\epsilon)` would ignore the
  spectrum's shape: on pol it forecasts 91 iterations where the solves took 62 to 85. Beyond
  a condition number of about :math:`10^3` finite-precision CG on a whole spread spectrum
  takes up to a third more iterations than on its clusters, so the forecast errs low there.
* **The rank.** The sketch's own rule: from 512, the rank doubles while the condition
  number :math:`1 + E_r` is beyond twice the sketch's target (``1 + 2 * 4``) and doubling pays
  over the solves it serves (:func:`~rfgp.inference._nystrom.doubling_pays`), up to 4,096
  and :math:`D / 2`.

On pol (13,500 rows, the choice model's noise 0.017) the forecast at 13,500 features is rank
1,024 and 62 iterations, and the calibrated fit's multiply-adds 0.97 of those its products
counted (the sketch grew to rank 1,024 itself; its solves took 62 iterations in the
calibration's cold run, 85 in the fit); at 6,144 features 51 iterations and 0.96 of them.
The cost model's constants give 0.52 and 0.58 of them. On the noisier power-plant, elevators
and bike the forecast is 5 to 12 iterations at rank 512, fewer than the constant's 40.

Internal: not part of the public API (see :mod:`rfgp.inference`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from rfgp.inference._cg_cost import CALIBRATION_PROBES, iterative_fit_cost
from rfgp.inference._krylov_calibration import SKETCH_SOLVES
from rfgp.inference._nystrom import MAX_PAYING_RANK, RANK_STOP_EIGENVALUE, doubling_pays

__all__ = ["CGForecast", "FORECAST_RANKS", "RELIABLE_SHARE", "cg_iterations_on", "forecast_cg",
           "preconditioned_spectrum", "sketch_residual", "spectrum_at"]

#: The Nyström ranks the forecast's rule runs through (the sketch's rule doubles from 32;
#: below 512 it grows wherever the condition is large, so 512 is where the forecast starts).
FORECAST_RANKS = (512, 1024, 2048, 4096)
#: Share of an ``m``-feature Gram matrix's eigenvalues trusted as the kernel matrix's.
RELIABLE_SHARE = 0.25
#: The relative residual the forecast's solves reach (the CG path's float64 tolerance).
FORECAST_TOLERANCE = 1e-8
#: Log-spaced groups of the preconditioned spectrum that CG is run on.
SPECTRUM_CLUSTERS = 256


@dataclass(frozen=True)
class CGForecast:
    """A forecast of the CG path at ``num_features``: its Nyström ``rank``, CG ``iterations``
    per solve, the preconditioned ``condition`` number and the calibrated fit's
    ``multiply_adds`` (:func:`~rfgp.inference._cg_cost.iterative_fit_cost`)."""

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
    residuals = _residuals(spectrum, rank)
    return float(residuals.min()) if residuals.numel() else 0.0


def _residuals(spectrum: Tensor, rank: int) -> Tensor:
    r"""``(min(r - 1, D),)``: :math:`\mu_{k+1} + \frac{1}{r - k}\sum_{j > k} \mu_j` for every
    :math:`k` a sketch of rank :math:`r` may hold (:func:`sketch_residual` is their least)."""
    count = min(rank - 1, spectrum.shape[0])
    if count <= 0:
        return spectrum.new_zeros(0)
    k = torch.arange(0, count, dtype=torch.float64)
    tails = spectrum.flip(0).cumsum(0).flip(0)[:count]  # sum_{j > k} mu_j (1-based)
    return spectrum[:count] + tails / (rank - k)


def preconditioned_spectrum(spectrum: Tensor, rank: int) -> Tensor:
    r"""The model of the preconditioned spectrum for a sketch of rank ``rank`` (module
    docstring): 1 for the :math:`k` held eigenvalues, :math:`\min(1, (1 + \mu_i) / (1 +
    E_r))` for the others, :math:`k` the minimiser of :func:`sketch_residual`.

    Example:
        >>> mu = torch.tensor([100.0, 10.0, 1.0, 0.0], dtype=torch.float64)
        >>> preconditioned_spectrum(mu, 4).tolist()  # k = 2, E = 1.5
        [1.0, 1.0, 0.8, 0.4]
    """
    residuals = _residuals(spectrum, rank)
    if residuals.numel() == 0:
        return torch.ones_like(spectrum)
    held = int(residuals.argmin())
    rest = ((1.0 + spectrum[held:]) / (1.0 + float(residuals[held]))).clamp(max=1.0)
    return torch.cat([torch.ones(held, dtype=torch.float64), rest])


def cg_iterations_on(spectrum: Tensor, tolerance: float, max_iterations: int = 10000) -> int:
    r"""CG's iterations on ``diag(spectrum)`` (positive entries) with a right-hand side of
    equal weight on every eigenvector until the residual falls by ``tolerance``; the entries
    are first clustered into :data:`SPECTRUM_CLUSTERS` log-spaced groups (mean value, weight
    the count), which CG resolves like the whole spectrum at a fraction of the cost.

    Example:
        >>> cg_iterations_on(torch.ones(1000, dtype=torch.float64), 1e-8)  # one value
        1
        >>> spread = torch.logspace(-3, 0, 1000, dtype=torch.float64)
        >>> cg_iterations_on(spread, 1e-8) > cg_iterations_on(spread.clamp(min=0.1), 1e-8)
        True
    """
    values = spectrum[spectrum > 0].to(torch.float64)
    low, high = float(values.min()), float(values.max())
    if high <= low * (1 + 1e-12):
        centres = values[:1]
        weights = torch.tensor([float(values.numel())], dtype=torch.float64)
    else:
        edges = torch.logspace(math.log10(low), math.log10(high), SPECTRUM_CLUSTERS + 1,
                               dtype=torch.float64)
        group = torch.bucketize(values, edges[1:-1])
        weights = torch.bincount(group, minlength=SPECTRUM_CLUSTERS).to(torch.float64)
        sums = torch.bincount(group, weights=values, minlength=SPECTRUM_CLUSTERS)
        keep = weights > 0
        centres, weights = sums[keep] / weights[keep], weights[keep]
    residual = weights.sqrt()
    direction = residual.clone()
    squared = float(residual @ residual)
    stop = tolerance**2 * squared
    for iteration in range(1, max_iterations + 1):
        image = centres * direction
        step = squared / float(direction @ image)
        residual = residual - step * image
        new = float(residual @ residual)
        if new <= stop:
            return iteration
        direction = residual + (new / squared) * direction
        squared = new
    return max_iterations


def forecast_cg(eigenvalues: Tensor, scale: float, num_rows: int, num_features: int,
                input_dim: int, candidates: int = 1, streamed: bool = False,
                tolerance: float = FORECAST_TOLERANCE) -> CGForecast:
    r"""The CG path's rank, iterations and cost at ``num_features`` forecast from a smaller
    model's Gram eigenvalues (module docstring).

    Args:
        eigenvalues: ``(m,)`` eigenvalues of the smaller model's :math:`\Phi^\top\Phi`.
        scale: :math:`c = a / \sigma^2` of its calibration (in the same units).
        num_rows, num_features, input_dim: ``N``, ``D``, ``d`` of the large model.
        candidates, streamed: as in :func:`~rfgp.inference._cg_cost.iterative_fit_cost`.
        tolerance: the solves' relative residual.

    Returns:
        The :class:`CGForecast` at the rank the sketch's rule reaches.

    Example:
        >>> fast = 1e3 * torch.exp(-torch.arange(2048.0, dtype=torch.float64) / 20)
        >>> slow = 1e3 / torch.arange(1, 2049, dtype=torch.float64)
        >>> a = forecast_cg(fast, 1.0, 10**4, 8192, 8)
        >>> b = forecast_cg(slow, 1.0, 10**4, 8192, 8)
        >>> a.rank, a.iterations < b.iterations, a.multiply_adds < b.multiply_adds
        (512, True, True)
    """
    spectrum = spectrum_at(eigenvalues, scale, num_features)
    # The solves test B's residual; the preconditioned one can be smaller by sqrt(1 + mu_1).
    target = tolerance / math.sqrt(1.0 + float(spectrum[0]) if spectrum.numel() else 1.0)
    rank = FORECAST_RANKS[0]
    solves = SKETCH_SOLVES * (1 + CALIBRATION_PROBES)
    while rank < min(MAX_PAYING_RANK, num_features // 2):
        # The sketch's rule (NystromSketch.refine): it grows where a solve met a condition
        # beyond twice its target, while doubling pays over the solves it serves.
        condition = 1.0 + sketch_residual(spectrum, rank)
        if condition <= 1.0 + 2 * RANK_STOP_EIGENVALUE or not doubling_pays(
                spectrum[:rank], solves, num_features, num_rows, tolerance, condition):
            break
        rank *= 2
    shaped = preconditioned_spectrum(spectrum, rank)
    iterations = cg_iterations_on(shaped, target)
    condition = float(1.0 / shaped.min()) if shaped.numel() else 1.0
    cost = iterative_fit_cost(num_rows, num_features, input_dim, candidates, streamed,
                              iterations=iterations, rank=rank)
    return CGForecast(num_features, rank, iterations, condition, cost)
