r"""The local stage: the exact evidence on blocks of neighbouring rows from further starts
(the stage ``"local"``, :data:`LOCAL`).

The :math:`D_s`-feature evidence cannot follow a short lengthscale: a fine variation along one
input must be called noise, so its landscape hides maxima out there. The refinement's rows are
cut into blocks of at most ``exact_rows`` neighbouring rows (k-d blocks), and the sum of the
blocks' exact evidences is maximised from the refinement's end and from starts that each
shorten one lengthscale to a tenth, the most relevant inputs (shortest lengthscale per unit of
spread) first, as many starts as the schedule affords. The highest block evidence is kept as a
*candidate*: the final model's own evidence decides between it and the refinement's end
(:mod:`~rfgp.recipes._refit`), since a lengthscale the exact kernel can follow may be one the
final ``D`` features cannot.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Optional

from rfgp._report import FitReport
from rfgp._units import column_scale
from rfgp.inference import (
    CHOICE_FEATURES,
    exact_evidence_cost,
    final_fit_cost,
    final_path,
    kd_blocks,
    maximize_evidence,
)
from rfgp.recipes._laplace import hessian_cost
from rfgp.recipes._refine import most_refine_rows
from rfgp.recipes._schedule import EVALUATIONS_PER_ITERATION, LOCAL_SHARE, Plan
from rfgp.recipes._stage import RecipeData, Searched, Stage
from rfgp.recipes._start import search_model

__all__ = ["LOCAL", "LOCAL_ITERATIONS", "LOCAL_SHORT_START", "local", "local_bound",
           "local_possible", "plan_local"]

#: The local stage's extra starts: the refinement's end with one lengthscale at this share.
LOCAL_SHORT_START = 0.1
#: L-BFGS iterations of each start of the local stage.
LOCAL_ITERATIONS = 40


def local_possible(plan: Plan) -> bool:
    """Whether a local stage can run at all: after a refinement, with blocks of two rows or
    more (the final fit's share counts its second candidate from here)."""
    opts = plan.options
    return (plan.num_rows > min(plan.num_rows, opts.subsample) and opts.refine_iterations > 0
            and opts.local_search and opts.exact_rows >= 2)


def plan_local(plan: Plan) -> None:
    """Book the local stage: its starts (the refinement's end, then one per shortened
    lengthscale, at most ``d + 1``) as :data:`~rfgp.recipes._schedule.LOCAL_SHARE` of the
    budget allows, after the Hessian of its block evidence (the last search stage's evidence
    from here) and the final model's second candidate (its calibration counted at
    :data:`~rfgp.inference.CHOICE_FEATURES`, its most), each start and the Hessian counted
    on the refinement's most rows: a share of the budget, not what the stages before leave,
    and a cost that does not jump with the rows, so that more budget never buys fewer
    starts."""
    n, d, opts = plan.num_rows, plan.input_dim, plan.options
    if not (plan.refine_rows and opts.local_search and opts.exact_rows >= 2):
        return
    # Whether or not it affords a start, its bound stays on the ledger (local_bound), and
    # its block evidence at the refinement's most rows bounds the Hessian's evaluation.
    most_rows = most_refine_rows(plan)
    plan.bounds["local"] = local_bound(plan, most_rows)
    plan.most_evaluation = max(plan.most_evaluation,
                               exact_evidence_cost(most_rows, d, opts.exact_rows))
    blocks = exact_evidence_cost(plan.refine_rows, d, opts.exact_rows)
    per_start = LOCAL_ITERATIONS * EVALUATIONS_PER_ITERATION * blocks
    forced = opts.num_features is not None
    second = (final_path(n, plan.num_features, d, opts.solve, 2, forced, plan.streamed)[1]
              - final_path(n, plan.num_features, d, opts.solve, 1, forced, plan.streamed)[1])
    # The starts are counted at the refinement's most rows (a start and the Hessian at its
    # rows cost at most that): counted at its rows, a start's cost jumps as they double, and
    # a larger budget could afford fewer starts.
    most_blocks = exact_evidence_cost(most_rows, d, opts.exact_rows)
    most_start = LOCAL_ITERATIONS * EVALUATIONS_PER_ITERATION * most_blocks
    starts = int(max(0.0, LOCAL_SHARE * plan.total - hessian_cost(opts, d, most_blocks)
                     - _choice_second(n, d)) // most_start)
    plan.local_starts = min(starts, d + 1)
    if plan.local_starts:
        plan.predicted["local"] = plan.local_starts * per_start
        plan.spent += plan.local_starts * per_start + second
        plan.evaluation, plan.candidates = blocks, 2


def _choice_second(num_rows: int, input_dim: int) -> float:
    """Multiply-adds of the final model's second candidate at the choice's features."""
    return (final_fit_cost(num_rows, CHOICE_FEATURES, input_dim, 2)
            - final_fit_cost(num_rows, CHOICE_FEATURES, input_dim, 1))


def local_bound(plan: Plan, most_rows: int) -> float:
    """A bound on the local stage's cost that grows with the budget (unlike its cost, which
    jumps as the refinement's rows double): :data:`~rfgp.recipes._schedule.LOCAL_SHARE` of
    the budget, or where less its ``d + 1`` starts on blocks of ``most_rows`` rows and the
    second candidate's calibration at the choice's features; 0 where no local stage can
    run."""
    if not local_possible(plan):
        return 0.0
    n, d, opts = plan.num_rows, plan.input_dim, plan.options
    blocks = exact_evidence_cost(most_rows, d, opts.exact_rows)
    most = ((d + 1) * LOCAL_ITERATIONS * EVALUATIONS_PER_ITERATION * blocks
            + _choice_second(n, d))
    return min(LOCAL_SHARE * plan.total, most)


def local(data: RecipeData, searched: Searched, report: FitReport) -> Optional[Searched]:
    """The local stage (module docstring) from ``searched``'s model, with the schedule's
    number of starts (``None`` where it has none); hands on the best start's model and adds
    its lengthscales to the candidates as ``"local"``."""
    starts = data.schedule.local_starts
    if not starts:
        return None
    opts = data.options
    xs, ys = searched.data(data)
    blocks = kd_blocks(xs, opts.exact_rows)
    centre = searched.lengthscale()
    start = {"outputscale": searched.model.kernel.outputscale.detach(),
             "noise": searched.model.noise.detach()}
    relevance = (centre / column_scale(xs)).argsort().tolist()
    candidates = [centre]
    for j in relevance[:starts - 1]:
        shorter = centre.clone()
        shorter[j] = shorter[j] * LOCAL_SHORT_START
        candidates.append(shorter)
    best, best_loss, iterations = None, math.inf, 0
    for lengthscale in candidates:
        model = search_model(data.schedule.search_features,
                             {**start, "lengthscale": lengthscale}, opts.spectral, opts.seed, xs)
        result = maximize_evidence(model, xs, ys, LOCAL_ITERATIONS, opts.tolerance,
                                   exact=True, blocks=blocks)
        iterations += result.iterations
        # L-BFGS restores the best point it evaluated: its loss is the smallest.
        loss = min(result.losses) if result.losses else math.inf
        report.local_losses.append(loss)
        if loss < best_loss:
            best, best_loss = model, loss
            report.converged["local"] = result.converged
            report.losses["local"] = result.losses
    report.iterations["local"] = iterations
    report.local_blocks = len(blocks)
    report.evidence["local"] = "blocks"
    if best is None:  # no start could be evaluated: keep the refinement's end
        return searched
    found = replace(searched, model=best, blocks=blocks, evidence="blocks")
    return replace(found, candidates={**searched.candidates, "local": found.lengthscale()})


LOCAL = Stage("local", local, ((30, plan_local),))
