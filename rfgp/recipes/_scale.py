r"""The final fit's walk along a common factor on its lengthscales (used by
:mod:`~rfgp.recipes._refit`): the search's lengthscales maximise the evidence of a model of
``search_features`` features, which cannot follow a short lengthscale, so they lean long for a
model of more features. The chosen lengthscales are multiplied by :math:`c = \rho^k`
(:data:`SCALE_STEP`), walking down from 1 while the calibrated model's evidence rises by more
than :data:`SCALE_EVIDENCE` nats a step (:func:`scale_search`), with as many calibrations as
:data:`SCALE_SHARE` of the budget pays for (:func:`plan_scale`).
"""

from __future__ import annotations

import math
from typing import Any, Dict

from rfgp.inference import CHOICE_FEATURES, final_fit_cost
from rfgp.recipes._schedule import Plan

__all__ = ["SCALE_EVALUATIONS", "SCALE_EVIDENCE", "SCALE_SHARE", "SCALE_STEP", "SCALE_STEPS",
           "booked_scale_cost", "plan_scale", "scale_evaluation_cost", "scale_search"]

#: The ratio between the lengthscale factors the scale search tries (:func:`scale_search`).
SCALE_STEP = 0.8
#: The most steps the scale search walks in one direction (``0.8**6 = 0.26``).
SCALE_STEPS = 6
#: The most calibrations the schedule books for the scale search (down to 0.41, or to 0.51
#: and the step that confirms it).
SCALE_EVALUATIONS = 4
#: Share of the budget the scale search's calibrations may take (:func:`plan_scale`): at
#: most :data:`SCALE_EVALUATIONS` of them, each counted at the choice's features.
SCALE_SHARE = 0.1
#: Nats of log evidence by which a factor must beat the last one to be taken (a Bayes factor
#: of e): on data the features cannot explain the evidence is flat in the factor, and a
#: walk on rounding-level gains would only move the lengthscales.
SCALE_EVIDENCE = 1.0


def scale_search(evaluate: Any, loss: float, calibration: Any, largest: float = math.inf,
                 evaluations: int = 2 * SCALE_STEPS, margin: float = 0.0) -> tuple:
    r"""The common factor :math:`c` on the lengthscales whose calibrated model has the
    smallest ``evaluate(c)[0]`` (the negative log evidence per datum) along the walk of the
    module docstring: from :math:`c = 1` (``loss``, ``calibration``) by factors of
    :data:`SCALE_STEP`, then, where the first step down does not improve, by factors of its
    inverse, each walk for as long as each step improves by more than ``margin`` (at most
    :data:`SCALE_STEPS` steps), :math:`c` stays at most ``largest`` and ``evaluations`` are
    left.

    Args:
        evaluate: ``c -> (loss, calibration)``.
        loss, calibration: at :math:`c = 1`.
        largest: the largest factor allowed (a bound on the lengthscales).
        evaluations: the most calls of ``evaluate`` (the schedule's, :func:`plan_scale`).
        margin: the least decrease of the loss a step must bring.

    Returns:
        ``(c, calibration at c, {c: loss})`` over every factor evaluated.

    Example:
        >>> walk = lambda c: ((c - 0.6) ** 2, f"model at {c:.3f}")
        >>> c, model, losses = scale_search(walk, walk(1.0)[0], "model at 1")
        >>> round(c, 3), model, len(losses)
        (0.64, 'model at 0.640', 4)
    """
    best = (1.0, loss, calibration)
    losses = {1.0: loss}
    for step in (SCALE_STEP, 1.0 / SCALE_STEP):
        for _ in range(SCALE_STEPS):
            factor = best[0] * step
            if factor > largest or len(losses) > evaluations:
                break
            tried, found = evaluate(factor)
            losses[factor] = tried
            if not tried < best[1] - margin:  # a NaN loss never improves
                break
            best = (factor, tried, found)
        if best[0] != 1.0:
            break
    return best[0], best[2], losses


def scale_evaluation_cost(plan: Plan) -> float:
    """Multiply-adds of one calibration of the scale search at its most: at
    :data:`~rfgp.inference.CHOICE_FEATURES` features on every row."""
    return final_fit_cost(plan.num_rows, CHOICE_FEATURES, plan.input_dim, 1)


def plan_scale(plan: Plan) -> None:
    """Book the scale search (:func:`scale_search`) where the final model calibrates itself:
    as many calibrations as :data:`SCALE_SHARE` of the budget (or what the stages booked so
    far leave, where less) pays for, at most
    :data:`SCALE_EVALUATIONS`, each counted at its most (:func:`scale_evaluation_cost`), so
    that more budget never buys fewer; its bound, that share or those calibrations where
    less, grows with the budget. The count is ``settings["refit"]["scale_evaluations"]``
    (none at a budget too small for one: a walk there would cost the final model
    features), and none for rows read from a source (a memory-map, chunks, process shards),
    where every step would be a pass over every row.

    It is booked right after the final fit's share (:func:`~rfgp.recipes._refit.
    plan_final_share`) and before the other stages, whose own shares do not depend on what
    is left: the walk is part of the final fit, and booked after them it got only what their
    shares left, nothing once a cheaper final fit bought more features in the same share
    (power-plant at the default budget: no walk and 9,216 features, MNLL -0.180; with the
    walk, lengthscales 0.64 times the search's and 7,168 features, -0.253)."""
    if not plan.options.calibrate or plan.streamed:
        return
    per = scale_evaluation_cost(plan)
    # Its share, or what the stages booked so far leave where that is less (an exact search
    # on a couple of thousand rows can take most of a small budget).
    afford = min(SCALE_SHARE * plan.total, max(plan.left(), 0.0))
    evaluations = int(min(SCALE_EVALUATIONS, afford // per))
    plan.settings.setdefault("refit", {}).update(scale_evaluations=evaluations,
                                                 scale_cost=evaluations * per)
    plan.bounds["scale"] = min(SCALE_SHARE * plan.total, SCALE_EVALUATIONS * per)
    plan.spent += evaluations * per


def booked_scale_cost(settings: Dict[str, Any]) -> float:
    """Multiply-adds a schedule's ``settings`` booked for the scale search (0 where none)."""
    return settings.get("refit", {}).get("scale_cost", 0.0)
