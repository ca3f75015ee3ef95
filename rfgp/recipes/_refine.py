r"""Refinement: the search continued on more rows (the stage ``"refine"``, :data:`REFINE`).

A subsample's evidence maximum is biased (long lengthscales, large noise):
``refine_iterations`` more L-BFGS iterations on the schedule's ``refine_rows`` rows (a superset
of the subsample) at the search's feature count correct it, at :math:`O(n D_s^2)` per
evaluation. The refinement's end is the final fit's first candidate lengthscale vector.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

from rfgp.inference import feature_evidence_cost
from rfgp.recipes._report import FitReport
from rfgp.recipes._schedule import Plan, refinement_rows
from rfgp.recipes._search import maximize_evidence, record_search
from rfgp.recipes._stage import RecipeData, Searched, Stage

__all__ = ["REFINE", "plan_refine", "refine"]


def plan_refine(plan: Plan) -> None:
    """Book the refinement: as many rows as its share of the budget allows, never fewer
    than the subsample (:func:`~rfgp.recipes._schedule.refinement_rows`); its evidence is
    then the last search stage's."""
    d = plan.input_dim

    def evaluation(rows: int) -> float:
        return feature_evidence_cost(rows, plan.search_features, d)

    rows, cost = refinement_rows(plan.num_rows, plan.subsample, plan.options, evaluation,
                                 plan.total)
    plan.refine_rows = rows
    if rows:
        plan.book("refine", cost)
        plan.evaluation = evaluation(rows)


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
