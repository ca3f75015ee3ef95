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
holds every row and the schedule affords its ``2 cv_folds`` searches (the stage ``"select"``,
:data:`SELECT`, planned last).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Dict, Optional, Tuple

import torch
from torch import Tensor

from rfgp._initial import initial_hyperparameters
from rfgp._report import FitReport
from rfgp._units import column_scale
from rfgp.inference import cross_validate, exact_evidence_cost, feature_evidence_cost, kd_blocks
from rfgp.recipes._schedule import SEARCH_EVALUATIONS, Plan
from rfgp.recipes._search import maximize_evidence
from rfgp.recipes._stage import RecipeData, Searched, Stage
from rfgp.recipes._start import search_model

__all__ = ["SELECT", "plan_select", "prefer_unbounded", "select"]

# The folds' searches stop at a ten times looser gradient tolerance than the search itself:
# the choice needs held-out densities to about 1e-2 nats, not hyperparameters to the last digit.
_CV_TOLERANCE_FACTOR = 10.0


def plan_select(plan: Plan) -> None:
    """Book the choice where the search holds every row and a bound is given, if what the
    other stages leave affords it: per fold an unbounded and a bounded search on the other
    rows at a ten times looser tolerance (about half the evaluations each), then the bounded
    search on every row."""
    n, d, opts = plan.num_rows, plan.input_dim, plan.options
    if plan.subsample != n or opts.max_lengthscale is None:
        return
    rows = n - n // max(opts.cv_folds, 1) if opts.cv_folds else n
    if plan.search_evidence == "features":
        per_search = feature_evidence_cost(rows, plan.search_features, d)
    else:
        per_search = exact_evidence_cost(rows, d, opts.exact_rows)
    choice = per_search * (opts.cv_folds * SEARCH_EVALUATIONS + SEARCH_EVALUATIONS)
    plan.choose_bound = plan.spent + choice <= plan.total
    if plan.choose_bound:
        plan.book("select", choice)


def select(data: RecipeData, searched: Searched, report: FitReport) -> Optional[Searched]:
    """Keep the evidence maximum or continue the search within the bound (module docstring);
    records ``lengthscale_bound`` (in the search's units, as ``searched.bound``) and
    ``cv_scores``. ``None`` where there is nothing to choose."""
    opts, x, y = data.options, data.x, data.y
    if not data.schedule.choose_bound or opts.max_lengthscale is None:
        return None
    bound = opts.max_lengthscale * column_scale(x)
    if not bool((searched.lengthscale() > bound).any()):
        return None
    if opts.cv_folds and data.num_rows < 5 * opts.cv_folds:
        return None
    if opts.cv_folds:
        keep_unbounded, report.cv_scores = prefer_unbounded(_fold_scores(data, searched, bound))
        if keep_unbounded:
            return searched
    result = maximize_evidence(searched.model, x, y, opts.max_iterations, opts.tolerance,
                               searched.evidence != "features", bound, searched.blocks)
    report.losses["search"] = report.losses.get("search", []) + result.losses
    report.iterations["search"] = report.iterations.get("search", 0) + result.iterations
    report.converged["search"] = result.converged
    return replace(searched, bound=bound)


def _fold_scores(data: RecipeData, searched: Searched, bound: Tensor) -> Tensor:
    """``(2, N)`` held-out log densities per target of the unbounded and the bounded search,
    each fold's searches run on the other rows from their own data-driven start."""
    opts = data.options
    loose = opts.tolerance * _CV_TOLERANCE_FACTOR
    exact = searched.evidence != "features"

    def unbounded_then_bounded(xf: Tensor, yf: Tensor):
        start = initial_hyperparameters(xf, yf, generator=torch.Generator().manual_seed(
            opts.seed))
        model = search_model(data.schedule.search_features, start, opts.spectral, opts.seed, xf)
        blocks = (kd_blocks(xf, opts.exact_rows)
                  if searched.evidence == "blocks" and xf.shape[0] > opts.exact_rows else None)
        maximize_evidence(model, xf, yf, opts.max_iterations, loose, exact, None, blocks)
        yield model.kernel, model.noise
        if bool((model.kernel.base_kernel.lengthscale.detach().reshape(-1) > bound).any()):
            maximize_evidence(model, xf, yf, opts.max_iterations, loose, exact, bound, blocks)
        yield model.kernel, model.noise

    scores = cross_validate(unbounded_then_bounded, data.x, data.y, opts.cv_folds,
                            torch.Generator().manual_seed(opts.seed), exact)
    return scores / (data.y.numel() // data.y.shape[0])


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


SELECT = Stage("select", select, ((60, plan_select),))
