"""The classifier recipe's plan: what each stage of :func:`~rfgp.recipes.fit_classifier_auto`
books from the budget (the search's paths and rows, the held-out choice's ladder of feature
counts, the final fit's features), in multiply-adds of the cost model.

Internal: not part of the public API (see :mod:`rfgp.recipes`).
"""

from __future__ import annotations

from typing import Tuple

from rfgp.classification._held_out import held_out_cost
from rfgp.classification._held_out_scale import held_out_scale_cost
from rfgp.classification._selection import ALPHA_GRID
from rfgp.inference import (
    MAX_WEIGHT_FEATURES,
    WARM_UP_STEPS,
    classifier_fit_cost,
    feature_evidence_cost,
    largest_features_within,
)
from rfgp.recipes._schedule import (
    FINAL_SHARE,
    MIN_FEATURES,
    SEARCH_EVALUATIONS,
    Plan,
    default_budget,
    refinement_rows,
)

__all__ = ["CHOICE_SHARE", "MAX_VALIDATION_ROWS", "TWO_PATH_SHARE", "VALIDATION_FRACTION",
           "evaluation_cost", "feature_ladder", "plan_choice", "plan_final_share",
           "plan_refine", "plan_search", "search_total", "validation_rows"]

#: Share of the budget the held-out choice of ``D`` and ``alpha_epsilon`` may take (its
#: ladder of feature counts is cut from the top until it fits).
CHOICE_SHARE = 0.3
#: Share of the budget the search's two paths may take together; where they do not fit, the
#: search takes the direct path alone.
TWO_PATH_SHARE = 0.2
#: Share of the rows held out for the choice, and the most rows held out.
VALIDATION_FRACTION = 0.1
MAX_VALIDATION_ROWS = 5000



def evaluation_cost(plan: Plan, rows: int) -> float:
    """Multiply-adds of one evaluation of the ``C`` regressions' evidence and its gradient on
    ``rows`` rows: the regression's, plus ``C`` weighted Gram corrections."""
    per_row = plan.options.num_classes / 4 + 1
    return feature_evidence_cost(rows, plan.search_features, plan.input_dim) * per_row


def search_total(plan: Plan) -> float:
    """The budget the search stages plan with, in multiply-adds: the budget, at most the
    default's (:func:`~rfgp.recipes._schedule.default_budget`). Beyond it more budget buys
    only the choice's rungs and the final ``D``: the lengthscales, and with them the
    candidates the choice compares, are the default budget's."""
    default = default_budget(plan.num_rows) * plan.options.machine_rate
    return min(plan.total, default)


def plan_search(plan: Plan) -> None:
    opts = plan.options
    plan.subsample = min(plan.num_rows, opts.subsample)
    plan.search_features = min(opts.search_features, opts.num_features or opts.search_features)
    plan.evaluation = evaluation_cost(plan, plan.subsample)
    two = (2 * SEARCH_EVALUATIONS + WARM_UP_STEPS) * plan.evaluation
    affordable = two <= TWO_PATH_SHARE * search_total(plan)
    paths = opts.two_paths if opts.two_paths is not None else affordable
    plan.settings["search_paths"] = 2 if paths else 1
    plan.book("search", two if paths else SEARCH_EVALUATIONS * plan.evaluation)


def plan_final_share(plan: Plan) -> None:
    opts, n, c = plan.options, plan.num_rows, plan.options.num_classes
    features = opts.num_features
    if features is None:
        features = largest_features_within(
            lambda size: classifier_fit_cost(n, size, c), FINAL_SHARE * plan.total,
            MIN_FEATURES, MAX_WEIGHT_FEATURES)
    plan.num_features = features
    plan.book("refit", classifier_fit_cost(n, features, c))


def plan_refine(plan: Plan) -> None:
    rows, cost = refinement_rows(plan.num_rows, plan.subsample, plan.options,
                                 lambda count: evaluation_cost(plan, count),
                                 search_total(plan))
    plan.refine_rows = rows
    if rows:
        plan.book("refine", cost)


def validation_rows(num_rows: int) -> int:
    """Rows the choice holds out: :data:`VALIDATION_FRACTION` of them, at least one, at most
    :data:`MAX_VALIDATION_ROWS` (and one fewer than all)."""
    held = max(1, min(round(VALIDATION_FRACTION * num_rows), MAX_VALIDATION_ROWS))
    return min(held, num_rows - 1)


def feature_ladder(top: int, bottom: int) -> Tuple[int, ...]:
    """The choice's feature counts: ``top`` halved while at least ``min(bottom, top)``,
    ascending.

    Example:
        >>> feature_ladder(4096, 512)
        (512, 1024, 2048, 4096)
    """
    rungs = [top]
    while rungs[-1] % 2 == 0 and rungs[-1] // 2 >= bottom:
        rungs.append(rungs[-1] // 2)
    return tuple(reversed(rungs))


def plan_choice(plan: Plan) -> None:
    """The held-out choice: the largest ladder (top at most the final ``D``) whose
    :func:`~rfgp.classification._held_out.held_out_cost` fits :data:`CHOICE_SHARE`; the
    final ``D`` becomes its top. More budget never removes a rung. The choice of the
    outputscale factor at the top rung
    (:func:`~rfgp.classification._held_out_scale.held_out_scale_cost`) is booked beside the
    ladder, outside its share: it replaces the final fit's evidence calibration, which the
    final share paid for and the refit no longer books."""
    opts = plan.options
    if not opts.select_alpha:
        return
    held = validation_rows(plan.num_rows)
    bottom = min(plan.search_features, plan.num_features)

    def cost(top: int) -> float:
        return sum(held_out_cost(plan.num_rows - held, held, size, opts.num_classes,
                                 len(ALPHA_GRID)) for size in feature_ladder(top, bottom))

    top = plan.num_features
    if opts.num_features is None:
        top = min(top, largest_features_within(cost, CHOICE_SHARE * plan.total, MIN_FEATURES,
                                               MAX_WEIGHT_FEATURES))
    plan.settings["choice_features"] = feature_ladder(top, bottom)
    plan.settings["validation_rows"] = held
    plan.book("choose", cost(top) + held_out_scale_cost(plan.num_rows - held, held, top,
                                                        opts.num_classes))
    # The final fit is at most the top rung, and takes the chosen outputscale as it is.
    plan.spent -= plan.predicted["refit"]
    plan.num_features = top
    plan.book("refit", classifier_fit_cost(plan.num_rows, top, opts.num_classes,
                                           calibrated=False))
