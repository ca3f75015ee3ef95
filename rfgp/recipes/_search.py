r"""The stage ``"search"`` of :func:`~rfgp.recipes.fit_auto` (:data:`SEARCH`): the evidence
of the schedule's kind (the exact kernel's on at most ``exact_rows`` rows, the blocks' where
the subsample is every row, else the features') maximised on the subsample along both paths
of :func:`~rfgp.inference._evidence_search.two_path_search`, with the constant prior mean
where ``prior_mean="constant"`` (handed on as :attr:`Searched.mean`). The search itself (objectives,
L-BFGS, the two paths) is :mod:`rfgp.inference._evidence_search`'s.
"""

from __future__ import annotations

import warnings
from dataclasses import replace

import torch

from rfgp._report import FitReport
from rfgp.inference import (
    WARM_UP_STEPS,
    ConvergenceWarning,
    SearchResult,
    exact_evidence_cost,
    feature_evidence_cost,
    kd_blocks,
    two_path_search,
)
from rfgp.recipes._schedule import SEARCH_EVALUATIONS, Plan
from rfgp.recipes._stage import RecipeData, Searched, Stage

__all__ = ["SEARCH", "plan_search", "record_search", "search", "search_evaluation"]


def record_search(report: FitReport, name: str, result: SearchResult, evidence: str) -> None:
    """Record a search stage's losses, iterations and convergence in the report."""
    report.losses[name], report.iterations[name] = result.losses, result.iterations
    report.converged[name], report.evidence[name] = result.converged, evidence


# ====================================================================== the stage
def plan_search(plan: Plan) -> None:
    """Book the first search: the subsample, the search's features (never more than a
    given final ``D``), its evidence, and its two paths' evaluations (:func:`two_path_search`:
    two runs to convergence and the warm-up's steps)."""
    opts = plan.options
    plan.subsample = min(plan.num_rows, opts.subsample)
    plan.search_features = min(opts.search_features, opts.num_features or opts.search_features)
    plan.search_evidence, plan.evaluation = search_evaluation(plan)
    plan.most_evaluation = plan.evaluation
    plan.book("search", (2 * SEARCH_EVALUATIONS + WARM_UP_STEPS) * plan.evaluation)


def search_evaluation(plan: Plan) -> tuple:
    """``(evidence, multiply-adds)`` of one evaluation of the first search's evidence on the
    plan's subsample and search features (booked by :func:`plan_search`)."""
    n, d, opts, subsample = plan.num_rows, plan.input_dim, plan.options, plan.subsample
    if subsample <= opts.exact_rows:
        return "exact", exact_evidence_cost(subsample, d)
    if subsample == n and opts.exact_rows >= 2:
        return "blocks", exact_evidence_cost(subsample, d, opts.exact_rows)
    return "features", feature_evidence_cost(subsample, plan.search_features, d)


def search(data: RecipeData, start: Searched, report: FitReport) -> Searched:
    """The evidence search on the subsample from ``start``'s model (changed in place), with
    the schedule's evidence, along the two paths of :func:`two_path_search`; warns where it
    did not converge."""
    opts = data.options
    xs, ys, rows = data.head(data.schedule.subsample)
    evidence = data.schedule.search_evidence
    blocks = kd_blocks(xs, opts.exact_rows) if evidence == "blocks" else None
    searches_mean = opts.prior_mean == "constant"
    result = two_path_search(start.model, xs, ys, opts.max_iterations, opts.tolerance,
                             evidence != "features", blocks, searches_mean)
    record_search(report, "search", result, evidence)
    mean = None
    if searches_mean:  # handed on: the later stages read the data centred by it
        mean = start.model.prior_mean.detach().cpu().clone()
        start.model.prior_mean = torch.zeros_like(mean)
    if not result.converged:
        warnings.warn(
            f"fit_auto: the evidence search did not converge in {opts.max_iterations} L-BFGS "
            "iterations; increase max_iterations",
            ConvergenceWarning,
        )
    return replace(start, rows=rows, evidence=evidence, blocks=blocks, mean=mean)


SEARCH = Stage("search", search, ((0, plan_search),))
