r"""Refinement: the search continued on more rows (the stage ``"refine"``, :data:`REFINE`).

A subsample's evidence maximum is biased (long lengthscales, large noise):
``refine_iterations`` more L-BFGS iterations on the schedule's ``refine_rows`` rows (a superset
of the subsample) at the search's feature count correct it, at :math:`O(n D_s^2)` per
evaluation. The refinement's end is the final fit's first candidate lengthscale vector.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

from rfgp._report import FitReport
from rfgp.inference import feature_evidence_cost
from rfgp.recipes._schedule import (
    EVALUATIONS_PER_ITERATION,
    REFINE_SHARE,
    Plan,
    refinement_rows,
)
from rfgp.recipes._search import maximize_evidence, record_search
from rfgp.recipes._stage import RecipeData, Searched, Stage

__all__ = ["REFINE", "most_refine_rows", "plan_refine", "refine", "refine_bound"]


def plan_refine(plan: Plan) -> None:
    """Book the refinement: as many rows as its share of the budget allows, never fewer
    than the subsample (:func:`~rfgp.recipes._schedule.refinement_rows`); its evidence is
    then the last search stage's. Its bound on the ledger is :func:`refine_bound`."""
    d = plan.input_dim

    def evaluation(rows: int) -> float:
        return feature_evidence_cost(rows, plan.search_features, d)

    rows, cost = refinement_rows(plan.num_rows, plan.subsample, plan.options, evaluation,
                                 plan.total)
    plan.refine_rows = rows
    # At any budget its evaluation costs at most that at its most rows; its cost is bounded
    # by its share (refine_bound).
    plan.most_evaluation = max(plan.most_evaluation, evaluation(most_refine_rows(plan)))
    if rows:
        plan.book("refine", cost)
        plan.bounds["refine"] = refine_bound(plan)
        plan.evaluation = evaluation(rows)


def most_refine_rows(plan: Plan) -> int:
    """The most rows of the last search stage at any budget: the refinement's ``refine_rows``
    (at most ``N``), or the subsample without a refinement."""
    opts = plan.options
    return min(plan.num_rows, opts.refine_rows) if opts.refine_iterations else plan.subsample


def refine_bound(plan: Plan) -> float:
    """A bound on the refinement's cost that grows with the budget (unlike its cost, which
    jumps as its rows double): :data:`~rfgp.recipes._schedule.REFINE_SHARE` of the budget, or
    its cost at its most rows where less; 0 where the plan has no refinement."""
    if not plan.refine_rows:
        return 0.0
    evaluations = plan.options.refine_iterations * EVALUATIONS_PER_ITERATION
    return min(REFINE_SHARE * plan.total, evaluations * feature_evidence_cost(
        most_refine_rows(plan), plan.search_features, plan.input_dim))


def refine(data: RecipeData, searched: Searched, report: FitReport) -> Optional[Searched]:
    """The refinement (module docstring) of ``searched``'s model (in place), where the
    schedule has one (else ``None``)."""
    rows = data.schedule.refine_rows
    if not rows:
        return None
    opts = data.options
    xs, ys, picked = data.head(rows)
    result = maximize_evidence(searched.model, xs, ys, opts.refine_iterations, opts.tolerance)
    record_search(report, "refine", result, "features")
    refined = replace(searched, rows=picked, blocks=None, evidence="features")
    return replace(refined, candidates={"search": refined.lengthscale()})


REFINE = Stage("refine", refine, ((20, plan_refine),))
