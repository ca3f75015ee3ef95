r"""The default fitting recipe of :class:`~rfgp.RandomFeatureGP`: fast and accurate out of the box.

:func:`fit_auto` fits a GP with an ARD random Fourier feature kernel in up to seven steps:

1. **Data-driven start.** :func:`initial_hyperparameters`: per-input lengthscales from the
   inputs' spread (median heuristic), outputscale and noise from the targets' mean square.
2. **Evidence at low fidelity.** The log marginal likelihood is maximised by L-BFGS
   (:func:`maximize_evidence`, run until its own tolerances are met, not for a fixed handful of
   iterations) with ``search_features`` features on a random subsample of ``subsample`` rows.
   One evaluation costs :math:`O(n D_s^2 + D_s^3)` instead of :math:`O(N D^2 + D^3)`, with
   the gradient in closed form through the features' cosine and sine as well
   (:func:`~rfgp.inference.evidence.fourier_negative_log_evidence`).
   On at most ``exact_rows`` rows (default 1000) the search maximises the evidence of the
   exact kernel instead (:math:`O(n^3)`, no dearer there, and free of the features' error):
   on the bundled concrete, energy and boston sets this lowered the test MNLL on most splits.
   Where the search holds every row (``N <= subsample``) and there are more than
   ``exact_rows``, it maximises the sum of the exact evidences of blocks of at most
   ``exact_rows`` neighbouring rows (:func:`~rfgp.inference.blocks.kd_blocks`; the kernel
   matrix with its cross-block entries dropped, as in step 4b), and so do the folds of step 3
   and the Hessian of step 5. On the bundled wine set (1439 rows, two blocks) an evaluation
   cost 57 ms against 74 ms with 512 features, and the answer no longer hangs on the
   features' draw: the mean test MNLL of five splits went from 1.143 to 1.128, and over three
   seeds it ranged from 1.128 to 1.130, where four seeds of the 512-feature search ranged
   from 1.122 to 1.147.
3. **A bounded alternative, chosen by cross-validation.** The evidence maximum often switches
   an input off (its lengthscale runs to hundreds of the input's standard deviations). That is
   right for an input that carries nothing, but on inputs with a weak effect it can predict
   worse than a model that keeps them (on the bundled boston and energy sets, by 0.05 to 0.1
   nats per test point). So where a lengthscale of the maximum exceeds ``max_lengthscale``
   (default 4) standard deviations of its input (:func:`column_scale`), the search is
   continued with every lengthscale bounded there (:func:`bounded_lengthscale`), and
   ``cv_folds``-fold cross-validation decides: on each fold both searches run afresh on the
   other rows (the unbounded one from that part's own data-driven start, the bounded one from
   where it ends) and score the fold's held-out log predictive density
   (:mod:`~rfgp.inference.cross_validation`). The bounded, more regularised search is kept
   unless the unbounded one is better by more than one standard error of the paired
   difference (the one-standard-error rule). An input that truly carries nothing is then
   still switched off: a bound on it adds a spurious slow variation that the held-out rows
   show. This step runs when the search sees every row (``N <= subsample``): the regime of few
   rows per hyperparameter, where the evidence maximum overfits; on a subsample of more rows
   the maximum's lengthscales run long for another reason (the subsample), which step 4
   corrects. It costs about ``cv_folds`` more searches, and only where the bound binds;
   ``max_lengthscale=None`` skips it.
4. **Refinement on more rows** (when ``N > subsample``). ``refine_iterations`` (default 30)
   more L-BFGS iterations on ``min(N, refine_rows)`` rows (default 10000; a superset of the
   subsample) at ``search_features`` features correct the subsample's bias (long
   lengthscales, large noise), at :math:`O(n D_s^2)` per evaluation. On power-plant
   (N = 8611, two splits) 30 iterations on all rows gave a test MNLL of -0.092 and -0.044
   where 10 gave -0.051 and -0.009.

   **4b. The exact evidence on neighbouring rows, from several starts** (after a
   refinement; ``local_search``). The :math:`D_s`-feature evidence cannot follow a short
   lengthscale: with few features a fine variation along one input must be called noise, so
   it favours longer lengthscales and more noise than the exact kernel's evidence, and its
   landscape hides the maxima out there. The refinement's rows are therefore cut into
   blocks of at most ``exact_rows`` neighbouring rows
   (:func:`~rfgp.inference.blocks.kd_blocks`: halved at the median of the widest input until
   small enough), and the sum of the blocks' exact evidences (the
   kernel matrix with its cross-block entries dropped, :math:`O(\sum_b n_b^3)` per
   evaluation) is maximised from ``d + 1`` starts: the refinement's end, and that point with
   one lengthscale at a tenth (:data:`LOCAL_SHORT_START`), one start per input. The highest
   block evidence is kept. Each block holds its region's rows at the data's full density,
   which a subsample does not. On power-plant (N = 8611, two splits) the refinement ended
   with the exhaust-vacuum lengthscale at 0.21 to 0.25 (test MNLL -0.106 and -0.044 with
   8192 features); the stage found a maximum at 0.022 with half the noise (from the
   refinement's end on the first split, from the start with that lengthscale shortened on
   the second), and the test MNLL became -0.276 and -0.154, for 30 to 47 s more. The exact
   evidence of all 8611 rows (first split) agrees: its negative log per datum is -0.139
   there against -0.051 at the refinement's end.
5. **A Laplace average over the lengthscales.** The maximum is one point of a posterior that,
   on a few hundred or thousand rows, is broad. The Hessian of the last stage's evidence at
   the maximum (:func:`~rfgp.inference.laplace.evidence_hessian`, :math:`d + 3` gradient
   evaluations, scaled to all rows) gives the Laplace approximation, from which
   ``lengthscale_draws`` (default 32) lengthscale vectors are drawn
   (:func:`~rfgp.inference.laplace.lengthscale_draws`; lengthscales on the bound stay there).
   The final kernel is their average, :math:`\bar k = \frac{s}{S} \sum_i k_{\ell^{(i)}}`
   (:func:`lengthscale_mixture_kernel`): with random Fourier features it costs nothing
   extra, since each draw gets ``D / S`` of the ``D`` features. With the exact kernel
   (``benchmarks/regression_hyperparameters.py``, five splits, two on wine) it lowered the
   test MNLL on all five small bundled sets (concrete by 0.012, boston by 0.024, energy and yacht by
   0.008, wine by 0.002); with the features in the UCI benchmark, concrete by 0.010 and wine
   by 0.006, the others within the noise of a new feature draw.
6. **High-fidelity refit.** The (averaged) kernel gets ``num_features`` features (default
   :func:`choose_num_features`: as many as an operation budget allows for ``N`` rows, up to
   8192, and up to 32768 on rows few enough for the function-space solve) and the posterior
   is computed once, in closed form. On a few hundred rows the features' own error is then
   small: on the bundled yacht set the test MNLL of 8192 features was 0.07 nats above the
   exact kernel's at the same hyperparameters, that of 32768 0.008.

**Units.** Steps 1 to 5 run on the inputs divided by :func:`column_unit` (per column, the
power of two nearest its standard deviation) and the targets divided by the power of two
nearest their root mean square; the hyperparameters are scaled back before step 6, which fits
the data as given. L-BFGS is not scale-free (its steps and gradient tolerance act on raw
parameters of the lengthscales' and variances' own scale): in the data's units, inputs in
units a thousand times smaller ended at another point, and 1e10 times smaller stopped at the
start. The divisions are exact, so standardised data is searched as given, and data scaled by
powers of two gives the same fit bit for bit. Targets whose variance (or a millionth of it) is
not a number of their dtype raise a ``ValueError``.

The random frequencies are fixed by ``seed``; with ``lengthscale_draws=0``,
``num_features == search_features``, ``subsample >= N`` and data in units of one (standardised)
the refit is the direct fit at the optimised hyperparameters.

Example:
    >>> from rfgp.inference.recipe import fit_auto
    >>> g = torch.Generator().manual_seed(0)
    >>> x = torch.rand(300, 2, generator=g, dtype=torch.float64)
    >>> y = torch.sin(6 * x[:, 0]) + 0.1 * torch.randn(300, generator=g, dtype=torch.float64)
    >>> gp = fit_auto(x, y - y.mean(), num_features=256, seed=0)
    >>> mean, std = gp.predict(x[:3], return_std=True)
    >>> bool(gp.noise < 0.05), mean.shape
    (True, torch.Size([3]))
"""

from __future__ import annotations

import math
import time
import warnings
from contextlib import contextmanager
from dataclasses import MISSING, dataclass, field, fields
from typing import Dict, Iterator, List, Optional, Tuple

import torch
from gpytorch.constraints import Interval
from gpytorch.kernels import AdditiveKernel, ScaleKernel
from linear_operator.utils.errors import NotPSDError
from torch import Tensor

from rfgp._validation import (
    all_finite,
    check_bool,
    check_choice,
    check_int,
    check_positive,
    check_rows,
    check_tensor,
)
from rfgp.inference.blocks import kd_blocks
from rfgp.inference.cross_validation import cross_validate
from rfgp.inference.evidence import fourier_kernel_negative_log_evidence, negative_log_evidence
from rfgp.inference.feature_gp import RandomFeatureGP
from rfgp.inference.fit_state import power_of_two_scale
from rfgp.inference.laplace import evidence_hessian, lengthscale_draws
from rfgp.inference.selection import ConvergenceWarning, minimize_lbfgs
from rfgp.kernels.fourier import MATERN_NU, FourierFeatureKernel

__all__ = [
    "DEFAULT_COST_BUDGET",
    "DEFAULT_MAX_LENGTHSCALE",
    "bounded_lengthscale",
    "column_scale",
    "column_unit",
    "FitReport",
    "choose_num_features",
    "fit_auto",
    "DEFAULT_LENGTHSCALE_DRAWS",
    "initial_hyperparameters",
    "LOCAL_SHORT_START",
    "lengthscale_mixture_kernel",
    "make_ard_kernel",
    "maximize_evidence",
    "run_search_stages",
    "search_stages",
]

#: Operation budget of the final fit, :math:`\min(N D^2 + D^3/3, N^2 D + N^3/3)` multiply-adds:
#: about forty seconds of one CPU core's double-precision matrix products, a small share of the
#: time the evidence search and a sparse GP's training take on the sets where it binds.
DEFAULT_COST_BUDGET = 8.0e11
#: The candidate bound of :func:`fit_auto` on each lengthscale, in units of its input column's
#: standard deviation: far enough out that an input with a bounded lengthscale still varies
#: slowly over its range, short of the evidence maximum's "switched off" inputs.
DEFAULT_MAX_LENGTHSCALE = 4.0
#: Lengthscale draws of the final kernel's Laplace average (:func:`lengthscale_mixture_kernel`):
#: with the exact kernel, 32 and 256 draws gave the same mean test MNLL within 0.004 on each of
#: the bundled concrete, boston, energy, yacht and wine sets.
DEFAULT_LENGTHSCALE_DRAWS = 32
#: The local stage's extra starts: the refinement's end with one lengthscale at this share.
LOCAL_SHORT_START = 0.1
# A bounded lengthscale this close to its bound is held there by the Laplace draws: the
# maximum lies on the bound, where the evidence's curvature says nothing about the spread.
_AT_BOUND = 0.99
# The folds' searches stop at a ten times looser gradient tolerance than the search itself:
# the choice needs held-out densities to about 1e-2 nats, not hyperparameters to the last digit.
_CV_TOLERANCE_FACTOR = 10.0
_MAX_FEATURES = 8192
# Beyond _MAX_FEATURES only in function space (few rows): see choose_num_features.
_MAX_FUNCTION_FEATURES = 32768
_MIN_FEATURES = 512
# The noise is exp(log_noise) + this share of the targets' mean square: a floor that keeps the
# weight-space matrix factorisable without a barrier in the search.
_NOISE_FLOOR = 1e-6


@dataclass
class FitReport:
    """What :func:`fit_auto` did.

    Attributes:
        num_features: ``D`` of the final fit.
        search_features: ``D`` of the evidence search.
        subsample: rows of the first search stage.
        refine_rows: rows of the refinement stage (0 when there is none).
        iterations: L-BFGS iterations per stage (``"subsample"``, ``"refine"``).
        converged: per stage, whether L-BFGS met its tolerances before its iteration limit.
        seconds: wall time per stage (``"subsample"``, ``"select"``, ``"refine"``, ``"local"``,
            ``"laplace"``, ``"refit"``).
        initial: the starting hyperparameters (``lengthscale``, ``outputscale``, ``noise``).
        losses: per stage, the negative log evidence per datum at each evaluation.
        exact_stages: the stages that maximised the exact kernel's evidence.
        lengthscale_bound: the ``(d,)`` bounds the search kept to (``None``: unbounded).
        cv_scores: the cross-validated held-out log density per target of the
            ``"unbounded"`` and ``"bounded"`` searches (empty when no choice was needed).
        lengthscale: ``(d,)`` the lengthscales the search reached (the evidence maximum, or
            the bounded one).
        lengthscale_draws: ``(S, d)`` the lengthscales of the final kernel's Laplace average
            (``None`` without it).
        local_blocks: blocks of the local stage (0 when it did not run).
        local_losses: the local stage's negative log block evidence per datum at the end of
            each start (the refinement's end first, then one per shortened lengthscale).

    Example:
        >>> x = torch.rand(200, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
        >>> report = FitReport()
        >>> gp = fit_auto(x, torch.sin(5 * x[:, 0]) - 0.2, num_features=64, report=report)
        >>> report.num_features, report.subsample, report.exact_stages
        (64, 200, ['subsample'])
    """

    num_features: int = 0
    search_features: int = 0
    subsample: int = 0
    refine_rows: int = 0
    iterations: Dict[str, int] = field(default_factory=dict)
    converged: Dict[str, bool] = field(default_factory=dict)
    seconds: Dict[str, float] = field(default_factory=dict)
    initial: Dict[str, Tensor] = field(default_factory=dict)
    losses: Dict[str, List[float]] = field(default_factory=dict)
    exact_stages: List[str] = field(default_factory=list)
    lengthscale_bound: Optional[Tensor] = None
    cv_scores: Dict[str, float] = field(default_factory=dict)
    lengthscale: Optional[Tensor] = None
    lengthscale_draws: Optional[Tensor] = None
    local_blocks: int = 0
    local_losses: List[float] = field(default_factory=list)

    def clear(self) -> None:
        """Every field back to its default: a report passed to a new fit keeps nothing of an
        earlier one.

        Example:
            >>> report = FitReport(num_features=64, seconds={"refit": 0.1})
            >>> report.clear()
            >>> report.num_features, report.seconds
            (0, {})
        """
        for item in fields(self):
            default = (item.default_factory() if item.default_factory is not MISSING
                       else item.default)
            setattr(self, item.name, default)


def initial_hyperparameters(
    x: Tensor,
    y: Tensor,
    max_rows: int = 1000,
    signal_fraction: float = 0.9,
    generator: Optional[torch.Generator] = None,
) -> Dict[str, Tensor]:
    r"""A data-driven starting point for the evidence search.

    With :math:`s_j` the standard deviation of input column :math:`j` (1 for a constant column)
    and :math:`m` the median of :math:`\|(x_a - x_b) / s\|` over pairs of distinct rows (at most
    ``max_rows`` rows, drawn at random; 1 without such pairs), the lengthscales are

    .. math::
        \ell_j = s_j \, m / \sqrt 2,

    so that :math:`\|(x_a - x_b)/\ell\|^2 / 2` is one at the median pair: the RBF kernel of the
    median pair is :math:`e^{-1}` whatever the scale of each column (for standardised Gaussian
    inputs :math:`\ell_j \approx \sqrt d`). With :math:`v` the mean square of the (centred)
    targets, the outputscale is ``signal_fraction`` :math:`\cdot v` and the noise the rest.

    Args:
        x: ``(N, d)`` inputs.
        y: ``(N,)`` or ``(N, T)`` targets, centred (the GP's prior mean is zero).
        max_rows: rows used for the median.
        signal_fraction: share of the targets' mean square given to the outputscale, in
            ``(0, 1)``.
        generator: random rows for the median when ``N > max_rows``.

    Returns:
        ``{"lengthscale": (d,), "outputscale": (), "noise": ()}`` tensors in ``x``'s dtype.

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> x = torch.randn(500, 2, dtype=torch.float64, generator=g) * torch.tensor([1.0, 10.0])
        >>> init = initial_hyperparameters(x, torch.randn(500, dtype=torch.float64))
        >>> ratio = init["lengthscale"][1] / init["lengthscale"][0]
        >>> bool(9 < ratio < 11)
        True
    """
    x, y = check_rows(x, y)
    max_rows = check_int("max_rows", max_rows, minimum=2)
    signal_fraction = check_positive("signal_fraction", signal_fraction)
    if signal_fraction >= 1.0:
        raise ValueError(f"signal_fraction must be in (0, 1), got {signal_fraction!r}")
    n = x.shape[0]
    scale = column_scale(x)
    rows = x if n <= max_rows else x[torch.randperm(n, generator=generator)[:max_rows]]
    dist = torch.pdist(rows / scale)
    positive = dist[dist > 0]
    median = float(positive.median()) if positive.numel() else 1.0
    lengthscale = scale * (median / math.sqrt(2.0))
    second_moment = float(y.square().mean())
    second_moment = second_moment if second_moment > 0 else 1.0
    like = torch.ones((), dtype=x.dtype, device=x.device)
    return {
        "lengthscale": lengthscale,
        "outputscale": like * signal_fraction * second_moment,
        "noise": like * (1.0 - signal_fraction) * second_moment,
    }


def choose_num_features(
    num_data: int,
    cost_budget: float = DEFAULT_COST_BUDGET,
    minimum: int = _MIN_FEATURES,
    maximum: int = _MAX_FEATURES,
    function_maximum: int = _MAX_FUNCTION_FEATURES,
) -> int:
    r"""The largest power of two ``D`` in ``[minimum, function_maximum]`` whose fit fits the budget.

    The fit's cost is :math:`\min(N D^2 + D^3/3,\; N^2 D + N^3/3)` multiply-adds: the cheaper
    of the weight space (the ``D x D`` Gram matrix and its Cholesky factor) and the function
    space (the ``N x N`` kernel matrix and its factor); ``minimum`` is returned when even that
    is over budget. Up to ``maximum`` features that is the only limit. Beyond it, ``D`` grows
    (up to ``function_maximum``) only where the fit is in function space and its ``N x D``
    feature rows hold no more numbers than a ``maximum x maximum`` weight-space matrix: on a
    few hundred rows the features' kernel error, which shrinks as :math:`D^{-1/2}`, is then
    bought down at a cost linear in ``D``. The rule depends on ``N`` alone, so a fit is
    reproducible; scale ``cost_budget`` with the machine's speed (about
    :math:`2 \cdot 10^{10}` multiply-adds per second per CPU core in double precision).

    Example:
        >>> choose_num_features(500), choose_num_features(3000), choose_num_features(9000)
        (32768, 16384, 8192)
        >>> choose_num_features(10**5), choose_num_features(500, function_maximum=8192)
        (2048, 8192)
    """
    num_data = check_int("num_data", num_data)
    cost_budget = check_positive("cost_budget", cost_budget)
    minimum = check_int("minimum", minimum, minimum=2)
    maximum = check_int("maximum", maximum, minimum=minimum)
    function_maximum = check_int("function_maximum", function_maximum, minimum=maximum)
    best = minimum
    d = minimum
    while d <= function_maximum:
        weight = num_data * d * d + d**3 / 3
        function = num_data * num_data * d + num_data**3 / 3
        fits = d <= maximum or (function < weight and num_data * d <= maximum * maximum)
        if fits and min(weight, function) <= cost_budget:
            best = d
        d *= 2
    return best


def make_ard_kernel(
    num_features: int,
    input_dim: int,
    spectral: str = "rbf",
    seed: Optional[int] = None,
    dtype: torch.dtype = torch.float64,
) -> ScaleKernel:
    """``ScaleKernel(FourierFeatureKernel(..., sampling="orthogonal", ard_num_dims=input_dim))``.

    Orthogonal frequencies (ORF) lower the kernel's approximation error at no extra cost.

    Example:
        >>> k = make_ard_kernel(64, 3, "matern52", seed=0)
        >>> tuple(k.base_kernel.lengthscale.shape), k.base_kernel.spectral
        ((1, 3), 'matern52')
    """
    num_features = check_int("num_features", num_features, minimum=2)
    input_dim = check_int("input_dim", input_dim)
    check_choice("spectral", spectral, tuple(MATERN_NU))
    base = FourierFeatureKernel(
        num_features, spectral=spectral, sampling="orthogonal", input_dim=input_dim,
        ard_num_dims=input_dim, seed=seed,
    )
    return ScaleKernel(base).to(dtype)


def _set_hyperparameters(kernel: ScaleKernel, lengthscale: Tensor, outputscale: Tensor) -> None:
    kernel.base_kernel.lengthscale = lengthscale.detach().reshape(1, -1)
    kernel.outputscale = outputscale.detach()


def lengthscale_mixture_kernel(
    num_features: int,
    lengthscales: Tensor,
    outputscale: Tensor,
    spectral: str = "rbf",
    seed: int = 0,
) -> AdditiveKernel:
    r"""The average of ``S`` ARD kernels at the lengthscales ``lengthscales[i]``, as random
    Fourier features: ``num_features`` columns in all, about ``num_features / S`` per kernel.

    .. math::
        \bar k(x, x') = \frac{s}{S} \sum_{i=1}^{S} k_{\ell^{(i)}}(x, x'),

    an ``AdditiveKernel`` of ``S`` parts ``ScaleKernel(FourierFeatureKernel(D_i))`` (orthogonal
    frequencies, independent per part) with outputscale :math:`s / S` each. Its features are
    the parts' side by side, so the fit costs what one kernel of ``num_features`` features
    costs, and their kernel estimate is unbiased for :math:`\bar k`. With more draws than
    frequencies (``S > num_features / 2``) the first ``num_features / 2`` draws are used.

    Args:
        num_features: ``D`` in all (even).
        lengthscales: ``(S, d)`` positive lengthscales, one row per part (see
            :func:`~rfgp.inference.laplace.lengthscale_draws`).
        outputscale: 0-d positive :math:`s`.
        spectral: ``"rbf"`` or a Matérn kernel.
        seed: seed of the parts' frequencies.

    Returns:
        The kernel, in ``lengthscales``' dtype and device.

    Example:
        >>> ells = torch.tensor([[1.0, 2.0], [1.5, 2.5]], dtype=torch.float64)
        >>> k = lengthscale_mixture_kernel(64, ells, torch.tensor(2.0, dtype=torch.float64))
        >>> [part.base_kernel.num_features for part in k.kernels]
        [32, 32]
        >>> float(k.kernels[0].outputscale.detach())
        1.0
    """
    num_features = check_int("num_features", num_features, minimum=2)
    if num_features % 2:
        raise ValueError(f"num_features must be even (cos and sin columns), got {num_features}")
    lengthscales = check_tensor("lengthscales", lengthscales, min_dim=2, max_dim=2,
                                non_empty=True).detach()
    if not bool((lengthscales > 0).all()):
        raise ValueError("lengthscales must be positive")
    outputscale = check_tensor("outputscale", outputscale).detach().to(lengthscales).reshape(())
    if not float(outputscale) > 0:
        raise ValueError(f"outputscale must be positive, got {float(outputscale)}")
    seed = check_int("seed", seed, minimum=0)
    frequencies = num_features // 2
    parts = min(lengthscales.shape[0], frequencies)
    sizes = [frequencies // parts + (i < frequencies % parts) for i in range(parts)]
    seeds = torch.randint(2**62, (parts,), generator=torch.Generator().manual_seed(seed))
    kernels = []
    for i, size in enumerate(sizes):
        part = make_ard_kernel(2 * size, lengthscales.shape[1], spectral, seed=int(seeds[i]),
                               dtype=lengthscales.dtype).to(lengthscales.device)
        _set_hyperparameters(part, lengthscales[i], outputscale / parts)
        kernels.append(part)
    return AdditiveKernel(*kernels)


@contextmanager
def bounded_lengthscale(kernel: ScaleKernel, upper: Optional[Tensor]) -> Iterator[None]:
    r"""Within the block, the base kernel's lengthscales are :math:`u \cdot \mathrm{sigmoid}(r)`
    in its raw parameter :math:`r`: an optimiser of the kernel's parameters keeps every
    lengthscale in :math:`(0, u)`. The kernel's own constraint and the lengthscale reached
    are restored afterwards. A lengthscale at or above its bound starts at 0.9 times it.

    Args:
        kernel: a ``ScaleKernel`` around a kernel with ARD lengthscales.
        upper: ``(d,)`` positive bounds, or ``None`` for no change.

    Example:
        >>> k = make_ard_kernel(16, 2, seed=0)
        >>> k.base_kernel.lengthscale = torch.tensor([[1.0, 9.0]], dtype=torch.float64)
        >>> with bounded_lengthscale(k, torch.tensor([4.0, 4.0], dtype=torch.float64)):
        ...     _ = k.base_kernel.raw_lengthscale.data.fill_(50.0)  # any raw value
        ...     inside = bool((k.base_kernel.lengthscale <= 4.0).all())
        >>> inside, type(k.base_kernel.raw_lengthscale_constraint).__name__
        (True, 'Positive')
    """
    if upper is None:
        yield
        return
    base = kernel.base_kernel
    num_inputs = base.raw_lengthscale.shape[-1]
    if upper.numel() != num_inputs:
        raise ValueError(
            f"lengthscale bounds must have one entry per lengthscale ({num_inputs}), got shape "
            f"{tuple(upper.shape)}"
        )
    upper = upper.detach().to(base.raw_lengthscale).reshape(num_inputs)
    if not bool((upper > 0).all()) or not all_finite(upper):
        raise ValueError(f"lengthscale bounds must be finite and positive, got {upper}")
    original = base.raw_lengthscale_constraint
    start = base.lengthscale.detach()
    start = torch.where(start < upper, start, 0.9 * upper)
    # Interval casts its bounds to torch's default dtype (float32): bounds beyond its range
    # (inputs at scales below about 1e-38 or above 1e38) would become 0 or inf. Its buffers
    # take the bounds in their own dtype instead.
    interval = Interval(0.0, 1.0)
    interval.lower_bound = torch.zeros_like(upper)
    interval.upper_bound = upper.clone()
    base.register_constraint("raw_lengthscale", interval)
    try:
        base.lengthscale = start
        yield
    finally:
        reached = base.lengthscale.detach().clone()
        base.register_constraint("raw_lengthscale", original)
        base.lengthscale = reached


def maximize_evidence(
    gp: RandomFeatureGP,
    x: Tensor,
    y: Tensor,
    max_iterations: int = 100,
    tolerance: float = 1e-6,
    exact: bool = False,
    max_lengthscale: Optional[Tensor] = None,
    blocks: Optional[List[Tensor]] = None,
) -> Tuple[List[float], int, bool]:
    r"""Maximise :math:`\log p(y)` over the kernel's hyperparameters and the model noise.

    Minimises :math:`-\log p(y) / (N T)` with ``torch.optim.LBFGS`` (strong-Wolfe line search)
    over the kernel's trainable parameters and :math:`\log(\sigma^2 - \sigma^2_0)`, where the
    floor :math:`\sigma^2_0 = 10^{-6}` times the targets' mean square keeps the weight-space
    matrix factorisable. L-BFGS runs until the largest gradient entry is below ``tolerance``,
    the loss changes by less than ``tolerance**2``, or ``max_iterations`` iterations; a trial
    point that cannot be factorised gets a loss above all others, so the line search backs off.
    The model noise is set to the optimum; the GP is not refitted. With ``max_lengthscale``
    the lengthscales stay below those bounds (:func:`bounded_lengthscale`).

    Args:
        gp: the model (its kernel's parameters and :attr:`~RandomFeatureGP.noise` are changed).
        x, y: training data.
        max_iterations: L-BFGS iterations (each one line search, a few evaluations).
        tolerance: gradient tolerance on the loss per datum.
        exact: maximise the evidence of the exact kernel the features approximate
            (:func:`~rfgp.kernels.fourier.stationary_kernel`, :math:`O(N^3)` per evaluation)
            instead of the random-feature evidence; needs a ``ScaleKernel`` around a
            :class:`~rfgp.kernels.FourierFeatureKernel`.
        max_lengthscale: ``(d,)`` upper bounds on the lengthscales (``None``: unbounded);
            needs a ``ScaleKernel`` around a kernel with ARD lengthscales.
        blocks: with ``exact``, row-index tensors that partition the rows
            (:func:`~rfgp.inference.blocks.kd_blocks`): the evidence is then the sum of the
            blocks' exact evidences, that of the kernel matrix with its cross-block entries
            set to zero, :math:`O(\sum_b n_b^3)` per evaluation instead of :math:`O(N^3)`.

    Returns:
        ``(losses, iterations, converged)``: the loss at every evaluation, the number of L-BFGS
        iterations, and whether L-BFGS stopped on its tolerances before ``max_iterations``.
    """
    if max_lengthscale is not None:
        if not isinstance(gp.kernel, ScaleKernel):
            raise TypeError(
                "maximize_evidence(max_lengthscale=...) needs a ScaleKernel around a kernel "
                f"with lengthscales, got {type(gp.kernel).__name__}"
            )
        with bounded_lengthscale(gp.kernel, max_lengthscale):
            return maximize_evidence(gp, x, y, max_iterations, tolerance, exact, None, blocks)
    x, y = check_rows(x, y)
    if blocks is not None and not exact:
        raise ValueError("maximize_evidence(blocks=...) needs exact=True")
    max_iterations = check_int("max_iterations", max_iterations)
    tolerance = check_positive("tolerance", tolerance)
    floor = _NOISE_FLOOR * max(float(y.square().mean()), 1e-300)
    start = (gp.noise.detach().to(x) - floor).clamp_min(floor)
    log_noise = start.log().clone().requires_grad_(True)
    params = [p for p in gp.kernel.parameters() if p.requires_grad] + [log_noise]
    scale = 1.0 / y.numel()
    # Real features of a ScaleKernel: the closed-form gradient (in weight space, or in function
    # space when N < D); other kernels go through the model's autograd evidence.
    base = gp.kernel.base_kernel if isinstance(gp.kernel, ScaleKernel) else None
    closed_form = (
        base is not None and not getattr(base, "is_complex", False)
        and base.num_outputs_per_input(x, x) == 1
    )
    y_cols = y.unsqueeze(-1) if y.dim() == 1 else y
    # Random Fourier features (or their exact kernel): the evidence of the kernel's own
    # projections, with the gradient in closed form through them. A subclass that redefines
    # the features keeps the closed form of its own features below.
    fourier = isinstance(base, FourierFeatureKernel) and (
        exact or (closed_form and type(base)._features is FourierFeatureKernel._features))
    if exact and not isinstance(base, FourierFeatureKernel):
        raise TypeError(
            "maximize_evidence(exact=True) needs a ScaleKernel around a FourierFeatureKernel, "
            f"got {type(gp.kernel).__name__}"
        )
    # The inputs as the kernel sees them, prepared once (checks, active_dims), not per step.
    prepared = base.prepare_input(x) if fourier else x

    def loss() -> Tensor:
        if fourier:
            return fourier_kernel_negative_log_evidence(
                base, prepared, y_cols, base.lengthscale.reshape(-1), gp.kernel.outputscale,
                log_noise.exp() + floor, exact, blocks)
        if closed_form:
            z = base.features(x) * gp.kernel.outputscale.sqrt()
            return negative_log_evidence(z, y_cols, log_noise.exp() + floor)
        return -gp.log_marginal_likelihood(x, y, log_noise.exp() + floor)

    # A lengthscale that underflowed to 0 is outside the exact kernel's domain: the line
    # search backs off from it as from a non-finite loss.
    feasible = (lambda: bool((base.lengthscale > 0).all())) if exact else (lambda: True)
    result = minimize_lbfgs(params, lambda: loss() * scale, max_iterations, tolerance, feasible)
    gp.noise = (log_noise.detach().exp() + floor).to(gp.noise.dtype).reshape(gp.noise.shape)
    return result


def search_stages(
    num_rows: int,
    subsample: int,
    refine_iterations: int,
    refine_rows: int,
    max_iterations: int,
    generator: torch.Generator,
    device: Optional[torch.device] = None,
) -> List[Tuple[str, Optional[Tensor], int]]:
    """The stages of a recipe's evidence search: ``(name, rows, L-BFGS iterations)``.

    With more than ``subsample`` rows: ``"subsample"`` on a random ``subsample`` rows, then
    (if ``refine_iterations``) ``"refine"`` on ``min(N, refine_rows)`` rows, a random superset
    of them; otherwise one ``"subsample"`` stage on all rows. ``rows`` is a tensor of row
    indices, or ``None`` for all rows in their order.

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> [(name, None if rows is None else rows.numel(), iters)
        ...  for name, rows, iters in search_stages(5000, 2000, 30, 20000, 200, g)]
        [('subsample', 2000, 200), ('refine', None, 30)]
    """
    if num_rows <= subsample:
        return [("subsample", None, max_iterations)]
    order = torch.randperm(num_rows, generator=generator).to(device)
    stages: List[Tuple[str, Optional[Tensor], int]] = [
        ("subsample", order[:subsample], max_iterations)
    ]
    if refine_iterations:
        rows = order[:max(refine_rows, subsample)] if num_rows > refine_rows else None
        stages.append(("refine", rows, refine_iterations))
    return stages


def run_search_stages(stages, search, info: FitReport, caller: str, num_rows: int) -> None:
    """Run ``search(name, rows, iterations) -> (losses, iterations, converged)`` per stage of
    :func:`search_stages` over ``num_rows`` rows, recording the stages' rows
    (``info.subsample``, ``info.refine_rows``), iterations, convergence, losses and times in
    ``info``; warn with a :class:`~rfgp.inference.selection.ConvergenceWarning` when the first
    stage did not converge."""
    sizes = [num_rows if rows is None else rows.numel() for _, rows, _ in stages]
    info.subsample, info.refine_rows = sizes[0], (sizes[1] if len(sizes) > 1 else 0)
    for name, rows, iterations in stages:
        started = time.perf_counter()
        losses, done, converged = search(name, rows, iterations)
        info.seconds[name] = time.perf_counter() - started
        info.iterations[name], info.converged[name], info.losses[name] = done, converged, losses
    if not info.converged["subsample"]:
        warnings.warn(
            f"{caller}: the evidence search did not converge in {stages[0][2]} L-BFGS "
            "iterations; increase max_iterations",
            ConvergenceWarning,
        )


def _prefer_unbounded(scores: Tensor) -> Tuple[bool, Dict[str, float]]:
    r"""The one-standard-error rule between the unbounded (``scores[0]``) and the bounded
    (``scores[1]``) search, from their ``(2, N)`` held-out log densities: the bounded, more
    regularised search is kept unless the unbounded one's mean is higher by more than the
    standard error of the paired difference, :math:`\bar\Delta > s_\Delta / \sqrt N`."""
    diff = scores[0] - scores[1]
    if not bool(torch.isfinite(diff).all()):
        better = bool(scores[0].mean() > scores[1].mean())  # a failed fold decides
        margin = math.nan
    else:
        margin = float(diff.std() / math.sqrt(diff.numel())) if diff.numel() > 1 else 0.0
        better = float(diff.mean()) > margin
    return better, {"unbounded": float(scores[0].mean()), "bounded": float(scores[1].mean()),
                    "standard_error": margin}


def _exceeds(gp: RandomFeatureGP, bound: Tensor) -> bool:
    return bool((gp.kernel.base_kernel.lengthscale.detach().reshape(-1) > bound).any())


def column_scale(x: Tensor) -> Tensor:
    r"""Each input column's standard deviation (1 for a constant column or a single row): the
    unit of :func:`initial_hyperparameters`' lengthscales and of ``fit_auto``'s bound,
    :math:`s_j = \big(\frac{1}{N-1} \sum_i (x_{ij} - \bar x_j)^2\big)^{1/2}`.

    Args:
        x: ``(N, d)`` finite floating inputs.

    Returns:
        ``(d,)`` positive scales in ``x``'s dtype.

    Example:
        >>> column_scale(torch.tensor([[0.0, 1.0], [2.0, 1.0]], dtype=torch.float64))
        tensor([1.4142, 1.0000], dtype=torch.float64)
    """
    x = check_tensor("x", x, min_dim=2, max_dim=2, non_empty=True)
    if x.shape[0] == 1:
        return torch.ones_like(x[0])
    # The standard deviation of x / m times m, m a power of two near the column's largest
    # magnitude (exact scalings): the squares of inputs beyond about 1e154 (or below 1e-162)
    # overflow (underflow) in float64 otherwise.
    peak = _power_of_two(x.abs().amax(0))
    scale = (x / peak).std(0) * peak
    return torch.where(scale > 0, scale, torch.ones_like(scale))


def column_unit(x: Tensor) -> Tensor:
    r"""The power of two nearest each input column's standard deviation (:func:`column_scale`),
    :math:`u_j = 2^{\operatorname{round}(\log_2 s_j)}`: the unit in which the recipes search.

    L-BFGS steps through raw parameters whose scale is the lengthscale's own, with a gradient
    tolerance that is not scale-free: searched in the data's units, inputs measured in units a
    thousand times smaller end elsewhere, and 1e10 times smaller stop at the start. Divided by
    :math:`u` the inputs have spreads in :math:`[1/\sqrt 2, \sqrt 2]`; the division is exact, so
    inputs already near unit scale (standardised ones: :math:`u = 1`) are searched as given and
    data scaled by powers of two gives the same search, bit for bit.

    Args:
        x: ``(N, d)`` finite floating inputs.

    Returns:
        ``(d,)`` powers of two in ``x``'s dtype.

    Example:
        >>> x = torch.tensor([[0.0, 0.0], [3000.0, 0.002]], dtype=torch.float64)
        >>> column_unit(x)
        tensor([2.0480e+03, 1.9531e-03], dtype=torch.float64)
    """
    return _power_of_two(column_scale(x))


def _power_of_two(values: Tensor) -> Tensor:
    """Elementwise the power of two nearest ``values`` in the log (1 where a value is 0 or not
    finite): a unit that divides exactly."""
    usable = (values > 0) & torch.isfinite(values)
    exponent = torch.where(usable, values, torch.ones_like(values)).log2().round()
    return torch.ldexp(torch.ones_like(values), exponent.to(torch.int32))


def _target_unit(y: Tensor) -> float:
    """The power of two nearest the root mean square of ``y`` (1 for zero targets), computed
    without squaring ``y`` itself (which overflows beyond about 1e154)."""
    peak = power_of_two_scale(y)
    rms = peak * math.sqrt(float((y / peak).square().mean()))
    return 2.0 ** round(math.log2(rms)) if rms > 0 else 1.0


def _laplace_lengthscales(gp: RandomFeatureGP, xs: Tensor, ys: Tensor, total: int,
                          exact: bool, bound: Optional[Tensor], num_draws: int,
                          generator: torch.Generator,
                          blocks: Optional[List[Tensor]] = None) -> Optional[Tensor]:
    """Draws of step 5: the Hessian of the last search stage's evidence on its rows ``xs``,
    ``ys`` (exact or random-feature, or the sum over the local stage's ``blocks`` of those
    rows), scaled to the ``total`` targets of all rows; lengthscales at the bound are held
    there.

    ``None`` (the kernel at the maximum is kept) where the outputscale reached zero (the
    kernel is then zero at any lengthscale) or, with a warning, where the evidence cannot be
    factorised next to the maximum."""
    base = gp.kernel.base_kernel
    lengthscale = base.lengthscale.detach().reshape(-1)
    outputscale = gp.kernel.outputscale.detach()
    if not float(outputscale) > 0:
        return None
    try:
        hessian = evidence_hessian(base, xs, ys, lengthscale, outputscale,
                                   gp.noise.detach().to(xs), exact=exact or blocks is not None,
                                   blocks=blocks)
    except NotPSDError:
        hessian = None
    if hessian is None or not all_finite(hessian):
        warnings.warn(
            "fit_auto: the evidence could not be evaluated next to its maximum, so the "
            "lengthscales are not averaged (the kernel at the maximum is used)",
            RuntimeWarning,
        )
        return None
    fixed = None if bound is None else lengthscale >= _AT_BOUND * bound
    return lengthscale_draws(lengthscale, hessian * total, num_draws, generator, fixed, bound)


def _local_stage(gp: RandomFeatureGP, fresh_gp, x: Tensor, y: Tensor, blocks: List[Tensor],
                 max_iterations: int, tolerance: float, info: FitReport) -> RandomFeatureGP:
    """Step 4b: the block evidence maximised from the refinement's end and from ``d`` starts
    that each shorten one of its lengthscales to :data:`LOCAL_SHORT_START` of it; the model
    of the highest block evidence (lowest loss) is returned, and the stage recorded in
    ``info``."""
    lengthscale = gp.kernel.base_kernel.lengthscale.detach().reshape(-1)
    start = {"outputscale": gp.kernel.outputscale.detach(), "noise": gp.noise.detach()}
    candidates = [lengthscale]
    for j in range(lengthscale.numel()):
        shorter = lengthscale.clone()
        shorter[j] = shorter[j] * LOCAL_SHORT_START
        candidates.append(shorter)
    best, best_loss, iterations = None, math.inf, 0
    for candidate in candidates:
        model = fresh_gp({**start, "lengthscale": candidate})
        losses, done, converged = maximize_evidence(model, x, y, max_iterations, tolerance,
                                                    exact=True, blocks=blocks)
        iterations += done
        # L-BFGS restores the best point it evaluated: its loss is the smallest.
        loss = min(losses) if losses else math.inf
        info.local_losses.append(loss)
        if loss < best_loss:
            best, best_loss = model, loss
            info.converged["local"], info.losses["local"] = converged, losses
    info.local_blocks, info.iterations["local"] = len(blocks), iterations
    info.exact_stages.append("local")
    if best is None:  # no start could be evaluated: keep the refinement's end
        return gp
    return best


def fit_auto(
    x: Tensor,
    y: Tensor,
    spectral: str = "rbf",
    num_features: Optional[int] = None,
    search_features: int = 512,
    subsample: int = 2000,
    refine_iterations: int = 30,
    refine_rows: int = 10000,
    max_iterations: int = 200,
    tolerance: float = 1e-4,
    cost_budget: float = DEFAULT_COST_BUDGET,
    seed: int = 0,
    report: Optional[FitReport] = None,
    exact_rows: int = 1000,
    max_lengthscale: Optional[float] = DEFAULT_MAX_LENGTHSCALE,
    cv_folds: int = 5,
    lengthscale_draws: int = DEFAULT_LENGTHSCALE_DRAWS,
    local_search: bool = True,
) -> RandomFeatureGP:
    r"""Fit a :class:`~rfgp.RandomFeatureGP` by the default recipe (see the module docstring).

    The prior mean is zero: centre (or standardise) ``y`` first and add the mean back to the
    predictions. Standardised inputs are not needed: the search runs in units near each
    column's spread and the targets' root mean square (module docstring, **Units**), and the
    bound is in units of the spread.

    Args:
        x: ``(N, d)`` inputs.
        y: ``(N,)`` or ``(N, T)`` centred targets.
        spectral: ``"rbf"`` or a Matérn kernel (``"matern12"``, ``"matern32"``,
            ``"matern52"``).
        num_features: ``D`` of the final fit; default :func:`choose_num_features` ``(N,
            cost_budget)``.
        search_features: ``D`` of the evidence search (at most ``num_features``).
        subsample: rows of the first search stage (all rows when ``N`` is not larger).
        refine_iterations: L-BFGS iterations (default 30) on ``min(N, refine_rows)`` rows after the
            subsample stage (0: none; skipped when the subsample holds all rows).
        refine_rows: rows of the refinement and of the local stage (a random superset of the
            subsample; all rows when ``N`` is not larger). The default, 10000, holds every row
            of power-plant; on the 94723-row power-plant x 11 set (first split, two threads)
            it took the fit 65 s to a test MNLL of -0.096 (95% coverage 0.94) where 20000
            rows took 156 s to -0.059 (0.87), the local stage most of both.
        max_iterations: L-BFGS iterations of the subsample stage.
        tolerance: L-BFGS gradient tolerance (per datum); ``1e-4`` stops the search where
            the test MNLL of the bundled UCI sets no longer changes in the third decimal.
        cost_budget: operation budget of the final fit (see :func:`choose_num_features`).
        seed: seed of the random frequencies, the subsample and the folds.
        report: a :class:`FitReport` to fill in (iterations, convergence, times, the choice
            of the bound and its cross-validation scores).
        exact_rows: a search stage on at most this many rows maximises the exact kernel's
            evidence (``O(n^3)``, no more than the ``search_features`` evidence's
            :math:`O(n D_s^2)` at these sizes) instead of the random-feature one; a search
            on every row, ``exact_rows < N <= subsample``, the exact evidences of blocks of
            at most this many neighbouring rows (0: never).
        max_lengthscale: the candidate bound on every lengthscale, in units of its input
            column's standard deviation (:func:`column_scale`); ``None``: the evidence
            maximum, unbounded, always.
        cv_folds: folds of the cross-validation that chooses between the unbounded and the
            bounded search when the unbounded maximum exceeds the bound (each fold repeats the
            search from its own start); ``0``: the bounded search whenever the bound binds,
            without cross-validation. The choice is made only when ``N <= subsample`` and,
            with ``cv_folds``, ``N >= 5 * cv_folds``; otherwise the unbounded maximum is kept.
        lengthscale_draws: ``S``, the lengthscale draws of the final kernel's Laplace average
            (step 5, :func:`lengthscale_mixture_kernel`); ``0``: the kernel at the maximum.
        local_search: after a refinement (``N > subsample``), step 4b: the exact kernel's
            evidence on blocks of at most ``exact_rows`` neighbouring rows
            (:func:`~rfgp.inference.blocks.kd_blocks`) of the refinement's rows, maximised
            from ``d + 1`` starts, the highest kept (needs ``exact_rows >= 2``).

    Returns:
        The fitted model, ``num_features`` features, conditioned on all rows.
    """
    x, y = check_rows(x, y)
    check_choice("spectral", spectral, tuple(MATERN_NU))
    search_features = check_int("search_features", search_features, minimum=2)
    subsample = check_int("subsample", subsample, minimum=2)
    refine_iterations = check_int("refine_iterations", refine_iterations, minimum=0)
    refine_rows = check_int("refine_rows", refine_rows, minimum=2)
    seed = check_int("seed", seed, minimum=0)
    exact_rows = check_int("exact_rows", exact_rows, minimum=0)
    if max_lengthscale is not None:
        max_lengthscale = check_positive("max_lengthscale", max_lengthscale)
    cv_folds = check_int("cv_folds", cv_folds, minimum=0)
    lengthscale_draws = check_int("lengthscale_draws", lengthscale_draws, minimum=0)
    local_search = check_bool("local_search", local_search)
    if cv_folds == 1:
        raise ValueError("cv_folds must be 0 (no cross-validation) or at least 2, got 1")
    # The search runs on inputs and targets divided by powers of two near their columns'
    # spreads and the targets' root mean square, and the result is scaled back: L-BFGS works
    # on raw parameters whose steps and gradient tolerance are not scale-free (inputs in units
    # 1000 times larger stopped the search elsewhere, 1e10 times larger at its start).
    # Division by a power of two is exact: data already near unit scale is searched as given.
    x_data, y_data = x, y
    x_unit, y_unit = column_unit(x), _target_unit(y)
    _check_variances_representable(y_unit, x.dtype)
    x, y = x / x_unit, y / y_unit
    n, d = x.shape
    if num_features is None:
        num_features = choose_num_features(n, cost_budget)
    num_features = check_int("num_features", num_features, minimum=2)
    search_features = min(search_features, num_features)
    generator = torch.Generator().manual_seed(seed)
    info = report if report is not None else FitReport()
    info.clear()  # a report passed again describes this fit only
    info.num_features, info.search_features = num_features, search_features
    init = initial_hyperparameters(x, y, generator=generator)
    info.initial = init
    bound = None if max_lengthscale is None else max_lengthscale * column_scale(x)

    def fresh_gp(start: Dict[str, Tensor]) -> RandomFeatureGP:
        kernel = make_ard_kernel(search_features, d, spectral, seed=seed, dtype=x.dtype)
        kernel = kernel.to(x.device)
        _set_hyperparameters(kernel, start["lengthscale"], start["outputscale"])
        return RandomFeatureGP(kernel, noise=start["noise"])

    gp = fresh_gp(init)
    stages = search_stages(n, subsample, refine_iterations, refine_rows, max_iterations,
                           generator, x.device)

    def evidence_of(xs: Tensor, whole: bool) -> Tuple[bool, Optional[List[Tensor]]]:
        # The exact evidence on at most exact_rows rows. Where the search holds every row and
        # there are more, the exact evidence on blocks of neighbouring rows: on wine (1439
        # rows) it cost 57 ms per evaluation against 74 ms for 512 features, and the answer no
        # longer depends on the features' draw (see the module docstring, step 2).
        if xs.shape[0] <= exact_rows:
            return True, None
        if whole and exact_rows >= 2:
            return True, kd_blocks(xs, exact_rows)
        return False, None

    def search(name: str, rows: Optional[Tensor], iterations: int):
        nonlocal gp
        xs, ys = (x, y) if rows is None else (x[rows], y[rows])
        exact, blocks = evidence_of(xs, name == "subsample" and rows is None)
        if exact:
            info.exact_stages.append(name)
        result = maximize_evidence(gp, xs, ys, iterations, tolerance, exact, None, blocks)
        # The bound is weighed only where the search sees every row: on a subsample the
        # maximum's lengthscales run long (the refinement corrects that), and a bound kept
        # from there left 30 refinement iterations short of the unbounded optimum
        # (power-plant: test MNLL -0.105 against -0.127). It is not weighed either where the
        # unbounded maximum lies inside it, or with too few rows for the folds.
        if (name != "subsample" or rows is not None or bound is None
                or not _exceeds(gp, bound) or (cv_folds and xs.shape[0] < 5 * cv_folds)):
            return result
        started = time.perf_counter()
        keep_unbounded = False
        if cv_folds:
            loose = tolerance * _CV_TOLERANCE_FACTOR

            def unbounded_then_bounded(xf: Tensor, yf: Tensor):
                # The same two procedures as on all rows: the unbounded search from the
                # data-driven start of these rows, then the bounded one from where it ended.
                model = fresh_gp(initial_hyperparameters(
                    xf, yf, generator=torch.Generator().manual_seed(seed)))
                exact_f, blocks_f = evidence_of(xf, True)
                maximize_evidence(model, xf, yf, iterations, loose, exact_f, None, blocks_f)
                yield model.kernel, model.noise
                if _exceeds(model, bound):
                    maximize_evidence(model, xf, yf, iterations, loose, exact_f, bound,
                                      blocks_f)
                yield model.kernel, model.noise

            scores = cross_validate(
                unbounded_then_bounded, xs, ys, cv_folds, torch.Generator().manual_seed(seed),
                exact) / (ys.numel() // ys.shape[0])
            keep_unbounded, info.cv_scores = _prefer_unbounded(scores)
        info.seconds["select"] = time.perf_counter() - started
        if keep_unbounded:
            return result
        info.lengthscale_bound = bound
        bounded = maximize_evidence(gp, xs, ys, iterations, tolerance, exact, bound, blocks)
        # One record of the stage: the unbounded search's evaluations, then the bounded ones.
        return result[0] + bounded[0], result[1] + bounded[1], bounded[2]

    run_search_stages(stages, search, info, "fit_auto", n)
    # The last stage's rows: the local stage's and the Laplace Hessian's.
    last, rows, _ = stages[-1]
    xs, ys = (x, y) if rows is None else (x[rows], y[rows])
    _, blocks = evidence_of(xs, last == "subsample" and rows is None)
    if local_search and last == "refine" and exact_rows >= 2:
        started = time.perf_counter()
        blocks = kd_blocks(xs, exact_rows)
        gp = _local_stage(gp, fresh_gp, xs, ys, blocks, max_iterations, tolerance, info)
        info.seconds["local"] = time.perf_counter() - started
    lengthscale = gp.kernel.base_kernel.lengthscale.detach().reshape(-1)
    started = time.perf_counter()
    draws = None
    if lengthscale_draws:
        draws = _laplace_lengthscales(gp, xs, ys, y.numel(), last in info.exact_stages,
                                      info.lengthscale_bound, lengthscale_draws, generator,
                                      blocks)
        info.seconds["laplace"] = time.perf_counter() - started
        started = time.perf_counter()
    # Back to the data's units: lengthscales times the input units, the outputscale and the
    # noise times the squared target unit, log densities per datum less log(y_unit).
    outputscale = gp.kernel.outputscale.detach() * y_unit**2
    noise = gp.noise.detach() * y_unit**2
    _report_in_data_units(info, x_unit, y_unit, lengthscale, draws)
    if draws is not None:
        final = lengthscale_mixture_kernel(num_features, draws * x_unit, outputscale, spectral,
                                           seed)
    else:
        final = make_ard_kernel(num_features, d, spectral, seed=seed, dtype=x.dtype).to(x.device)
        _set_hyperparameters(final, lengthscale * x_unit, outputscale)
    gp = RandomFeatureGP(final, noise=noise)
    with torch.no_grad():
        gp.fit(x_data, y_data)
    info.seconds["refit"] = time.perf_counter() - started
    return gp


def _check_variances_representable(y_unit: float, dtype: torch.dtype) -> None:
    """The outputscale and the noise are variances in the targets' units, down to the noise
    floor's share of their mean square: a clear error where those are not numbers of
    ``dtype`` (targets beyond about 1e150 or below 1e-150 in float64, 1e19 and 1e-16 in
    float32), instead of an overflow, or a zero noise, deep in the fit."""
    info = torch.finfo(dtype)
    exponent = 2 * math.log2(y_unit)
    if exponent + 4 > math.log2(info.max) or exponent + math.log2(_NOISE_FLOOR) < math.log2(
            info.tiny):
        raise ValueError(
            f"y: the targets' root mean square, about {y_unit:.3g}, makes their variance "
            f"(about 2^{exponent:.0f}) or a millionth of it not representable in {dtype}, "
            "the dtype of the outputscale and the noise; rescale the targets (e.g. standardise "
            "them) and scale the predictions back"
        )


def _report_in_data_units(info: FitReport, x_unit: Tensor, y_unit: float, lengthscale: Tensor,
                          draws: Optional[Tensor]) -> None:
    """The report's hyperparameters and log densities, from the working units of
    :func:`fit_auto`'s search (inputs over ``x_unit``, targets over ``y_unit``) to the data's."""
    shift = math.log(y_unit)
    info.lengthscale = lengthscale * x_unit
    info.lengthscale_draws = None if draws is None else draws * x_unit
    if info.lengthscale_bound is not None:
        info.lengthscale_bound = info.lengthscale_bound * x_unit
    info.initial = {"lengthscale": info.initial["lengthscale"] * x_unit,
                    "outputscale": info.initial["outputscale"] * y_unit**2,
                    "noise": info.initial["noise"] * y_unit**2}
    info.losses = {stage: [loss + shift for loss in losses]
                   for stage, losses in info.losses.items()}
    info.local_losses = [loss + shift for loss in info.local_losses]
    for key in ("unbounded", "bounded"):
        if key in info.cv_scores:
            info.cv_scores[key] -= shift
