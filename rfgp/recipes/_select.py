r"""Model choice: the evidence maximum, or a bounded alternative chosen by cross-validation.

The evidence maximum often switches an input off (its lengthscale runs to hundreds of the
input's standard deviations). That is right for an input that carries nothing, but where the
search holds every row of few rows it can also switch off an input with a weak effect and
predict worse than a model that keeps it. So where a lengthscale of the maximum exceeds
``max_lengthscale`` standard deviations of its input, the search is continued with every
lengthscale bounded there, and ``cv_folds``-fold cross-validation decides: on each fold both
searches run afresh on the other rows and score the fold's held-out log density. The bounded,
more regularised model is kept unless the unbounded one is better by more than one standard
error of the paired difference (the one-standard-error rule). The choice runs where the search
holds every row and the schedule affords its ``2 cv_folds`` searches.
"""

from __future__ import annotations

import math
from typing import Dict, Tuple

import torch
from torch import Tensor

from rfgp.inference._blocks import kd_blocks
from rfgp.inference._cross_validation import cross_validate
from rfgp.recipes._search import maximize_evidence
from rfgp.recipes._stage import RecipeContext
from rfgp.recipes._start import initial_hyperparameters, search_model
from rfgp.recipes._units import column_scale

__all__ = ["choose_bound", "prefer_unbounded"]

# The folds' searches stop at a ten times looser gradient tolerance than the search itself:
# the choice needs held-out densities to about 1e-2 nats, not hyperparameters to the last digit.
_CV_TOLERANCE_FACTOR = 10.0


def choose_bound(ctx: RecipeContext) -> None:
    """Keep the evidence maximum or continue the search within the bound (module docstring);
    records ``lengthscale_bound`` and ``cv_scores``."""
    opts = ctx.options
    if not ctx.schedule.choose_bound or opts.max_lengthscale is None:
        return
    bound = opts.max_lengthscale * column_scale(ctx.x)
    if not bool((ctx.lengthscale() > bound).any()):
        return
    if opts.cv_folds and ctx.num_rows < 5 * opts.cv_folds:
        return
    with ctx.stage("select"):
        if opts.cv_folds:
            keep_unbounded, ctx.report.cv_scores = prefer_unbounded(_fold_scores(ctx, bound))
            if keep_unbounded:
                return
        ctx.bound = bound
        result = maximize_evidence(ctx.model, ctx.x, ctx.y, opts.max_iterations, opts.tolerance,
                                   ctx.evidence != "features", bound, ctx.blocks)
        ctx.report.losses["search"] = ctx.report.losses.get("search", []) + result.losses
        ctx.report.iterations["search"] = (ctx.report.iterations.get("search", 0)
                                           + result.iterations)
        ctx.report.converged["search"] = result.converged


def _fold_scores(ctx: RecipeContext, bound: Tensor) -> Tensor:
    """``(2, N)`` held-out log densities per target of the unbounded and the bounded search,
    each fold's searches run on the other rows from their own data-driven start."""
    opts = ctx.options
    loose = opts.tolerance * _CV_TOLERANCE_FACTOR
    exact = ctx.evidence != "features"

    def unbounded_then_bounded(xf: Tensor, yf: Tensor):
        start = initial_hyperparameters(xf, yf, generator=torch.Generator().manual_seed(
            opts.seed))
        model = search_model(ctx.schedule.search_features, start, opts.spectral, opts.seed, xf)
        blocks = (kd_blocks(xf, opts.exact_rows)
                  if ctx.evidence == "blocks" and xf.shape[0] > opts.exact_rows else None)
        maximize_evidence(model, xf, yf, opts.max_iterations, loose, exact, None, blocks)
        yield model.kernel, model.noise
        if bool((model.kernel.base_kernel.lengthscale.detach().reshape(-1) > bound).any()):
            maximize_evidence(model, xf, yf, opts.max_iterations, loose, exact, bound, blocks)
        yield model.kernel, model.noise

    scores = cross_validate(unbounded_then_bounded, ctx.x, ctx.y, opts.cv_folds,
                            torch.Generator().manual_seed(opts.seed), exact)
    return scores / (ctx.y.numel() // ctx.y.shape[0])


def prefer_unbounded(scores: Tensor) -> Tuple[bool, Dict[str, float]]:
    r"""The one-standard-error rule between the unbounded (``scores[0]``) and the bounded
    (``scores[1]``) search, from their ``(2, N)`` held-out log densities: the bounded one is
    kept unless the unbounded one's mean is higher by more than the standard error of the
    paired difference, :math:`\bar\Delta > s_\Delta / \sqrt N`.

    Example:
        >>> scores = torch.tensor([[1.0, 1.2, 0.9, 1.1], [1.0, 1.0, 1.0, 1.0]])
        >>> prefer_unbounded(scores)[0]
        False
    """
    diff = scores[0] - scores[1]
    if not bool(torch.isfinite(diff).all()):
        better = bool(scores[0].mean() > scores[1].mean())  # a failed fold decides
        margin = math.nan
    else:
        margin = float(diff.std() / math.sqrt(diff.numel())) if diff.numel() > 1 else 0.0
        better = float(diff.mean()) > margin
    return better, {"unbounded": float(scores[0].mean()), "bounded": float(scores[1].mean()),
                    "standard_error": margin}
