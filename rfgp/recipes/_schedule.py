r"""The schedule: which stages run, on how many rows and features, within a time budget.

Each stage's cost is predicted in multiply-adds from the rows ``N``, the inputs ``d`` and the
feature counts (:mod:`rfgp.inference`'s cost model: the leading terms of its matrix products
and factorisations) and converted to seconds at ``machine_rate``. Each stage declares its own
cost (its ``plans``, see :class:`~rfgp.recipes._stage.Stage`); :func:`plan_stages` books them
in their planning order on one ledger, :class:`Plan`, and the result is the :class:`Schedule`.
For :func:`~rfgp.recipes.fit_auto` that order is: the evidence search on the subsample
(always); the final fit's share, at most :data:`FINAL_SHARE` of the budget, or what the first
search leaves where that is less (its ``D`` the largest on the feature grid,
:func:`~rfgp.inference._fit_cost.feature_grid`, whose calibrated fit fits there, because the
features' error shrinks only as :math:`D^{-1/2}` while the fit grows as :math:`N D^2`); the
refinement's rows (at most :data:`REFINE_SHARE` of the budget), the local stage's starts (at
most :data:`LOCAL_SHARE`: its later starts rarely move the lengthscales, while the final model
stays feature-limited while ``D`` grows, past the rows too) and the Laplace Hessian; then the rest
buys the final ``D``: the largest whose fit, on its cheapest path, the budget less those
stages' bounded shares pays for (beyond the weight-space limit the CG path with the Krylov
calibration, :mod:`~rfgp.inference._krylov_calibration`, costs a few CG fits). Every stage's
share grows with the budget, so more budget never buys fewer features, rows or starts. The
cross-validated choice of the bound takes what is left. The default budget,
:func:`default_budget`, grows linearly with ``N``.

The schedule depends on ``N``, ``d``, the options and the budget alone (not on a clock), so a
fit with ``anytime=False`` is reproducible (by default the final fit re-plans its ``D`` from the
seconds left, :func:`~rfgp.recipes._refit.replan_final`); the report compares each stage's
predicted seconds with its measured ones.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any, Dict, Sequence

__all__ = [
    "FINAL_SHARE",
    "LOCAL_SHARE",
    "MIN_FEATURES",
    "Plan",
    "Schedule",
    "default_budget",
    "plan_stages",
    "refinement_rows",
]

#: Share of the time budget the final fit may take before the other stages are planned (it
#: gets what they leave, too).
FINAL_SHARE = 0.4
#: Share of the budget the refinement may take (its rows are reduced to fit).
REFINE_SHARE = 0.2
#: Share of the budget the local stage's starts may take: beyond it the budget buys features
#: (the local stage's later starts rarely move the lengthscales; the features' error falls
#: as D^{-1/2}, past the rows too).
LOCAL_SHARE = 0.2
#: Fewest features of a final fit chosen by the schedule.
MIN_FEATURES = 512
#: L-BFGS evaluations the cost model expects of a search run to convergence, and per
#: iteration of a capped one (a line search mostly accepts its first step).
SEARCH_EVALUATIONS = 60
EVALUATIONS_PER_ITERATION = 1.25


def default_budget(num_rows: int) -> float:
    r"""The default time budget in seconds, :math:`\max(30, 20 + N / 400)`: linear in the
    rows (about two minutes at :math:`4 \cdot 10^4` rows), so that the search's rows and the
    final feature count grow with the data, and at least the half minute that the
    cross-validated model choice takes on a couple of thousand rows.

    On many rows the search stages read at most ``refine_rows`` rows (their cost stops
    growing) and the final fit costs :math:`a + bN`; from about :math:`10^6` rows the default
    budget holds the final ``D`` at :data:`MAX_WEIGHT_FEATURES`, about 1.9 ms per row at the
    reference rate with 10 inputs. A smaller budget buys fewer features, down to
    :data:`MIN_FEATURES` (about 7 µs per row with 10 inputs); below that the fit warns and
    takes what its final fit needs.

    Example:
        >>> default_budget(1000), default_budget(40000)
        (30.0, 120.0)
    """
    return max(30.0, 20.0 + num_rows / 400.0)


@dataclass
class Schedule:
    """What the recipe will run: which stages, on how many rows and features (the budget's
    rule is in :mod:`rfgp.recipes`).

    Attributes:
        budget: seconds available.
        machine_rate: multiply-adds per second of the cost model.
        subsample: rows of the first search stage.
        search_features: ``D`` of the search stages.
        search_evidence: ``"exact"``, ``"blocks"`` or ``"features"``: the evidence the first
            stage maximises.
        refine_rows: rows of the refinement (0: none).
        local_starts: starts of the local stage (0: none).
        choose_bound: whether the cross-validated choice of the bound may run.
        num_features: ``D`` of the final fit.
        predicted: predicted seconds per stage, in the stages' order.
        final_solve: ``"weight"`` or ``"cg"``, the final fit's path
            (:func:`~rfgp.inference.final_path`).
        settings: what further stages planned (by stage name).
    """

    budget: float
    machine_rate: float
    subsample: int
    search_features: int
    search_evidence: str
    refine_rows: int
    local_starts: int
    choose_bound: bool
    num_features: int
    predicted: Dict[str, float] = field(default_factory=dict)
    final_solve: str = "weight"
    settings: Dict[str, Any] = field(default_factory=dict)


@dataclass
class Plan:
    """The ledger on which the stages book their settings and costs, in planning order
    (:func:`plan_stages`); it then becomes the :class:`Schedule`.

    Attributes:
        num_rows, input_dim, options: what is planned for (checked options).
        total: the budget in multiply-adds.
        spent: multiply-adds booked so far (what is left: :meth:`left`).
        predicted: multiply-adds per stage (the final fit books its own once its ``D`` is
            final).
        evaluation: multiply-adds of one evaluation of the last search stage's evidence (the
            unit of the Laplace Hessian's cost).
        most_evaluation: the most that evaluation can cost at any budget (the last search
            stage at its most rows), the unit of the Hessian's bound.
        candidates: lengthscale candidates the final fit will compare.
        bounds: per stage, a bound on its cost that grows with the budget (its share, or its
            cost at its most rows and starts where less), unlike its cost, which jumps as its
            rows double; a stage without one is bounded by its booked cost
            (:meth:`committed`).
        settings: what stages without a field of their own planned.
        streamed: whether the rows are read from a data source at every pass (a memory-map,
            chunks, process shards): the final fit's CG path then recomputes its features at
            every product (:func:`~rfgp.inference.final_path`).

    The other attributes are the :class:`Schedule`'s.
    """

    num_rows: int
    input_dim: int
    options: Any
    total: float
    spent: float = 0.0
    predicted: Dict[str, float] = field(default_factory=dict)
    subsample: int = 0
    search_features: int = 0
    search_evidence: str = "features"
    evaluation: float = 0.0
    most_evaluation: float = 0.0
    refine_rows: int = 0
    local_starts: int = 0
    choose_bound: bool = False
    num_features: int = 0
    candidates: int = 1
    final_solve: str = "weight"
    bounds: Dict[str, float] = field(default_factory=dict)
    settings: Dict[str, Any] = field(default_factory=dict)
    streamed: bool = False

    def left(self) -> float:
        """Multiply-adds of the budget not yet booked."""
        return self.total - self.spent

    def book(self, stage: str, cost: float) -> None:
        """Book ``cost`` multiply-adds as ``stage``'s prediction and spend them."""
        self.predicted[stage] = cost
        self.spent += cost

    def committed(self, *, leaving: str) -> float:
        """Multiply-adds the stages booked so far, ``leaving`` out, can cost at this budget:
        each stage's bound where it declared one (:attr:`bounds`), else its booked cost. It
        grows with the budget wherever every bound does, so that what is left after it buys
        more (features) as the budget grows."""
        names = [name for name in (*self.predicted, *self.bounds) if name != leaving]
        return sum(self.bounds.get(name, self.predicted.get(name, 0.0))
                   for name in dict.fromkeys(names))


def plan_stages(num_rows: int, input_dim: int, options: Any, stages: Sequence[Any],
                streamed: bool = False) -> Schedule:
    """The schedule of ``stages`` (:class:`~rfgp.recipes._stage.Stage`) for ``num_rows`` rows
    of ``input_dim`` inputs under checked ``options``: every stage's plans called on one
    :class:`Plan` in their planning order (ties in the stages' order), the predictions
    converted to seconds at ``options.machine_rate``. ``streamed``: :attr:`Plan.streamed`.

    Example:
        >>> from rfgp.recipes._options import RegressionOptions
        >>> from rfgp.recipes._stage import Stage
        >>> def warm_up(plan):
        ...     plan.book("warm_up", 0.5 * plan.total)
        >>> s = plan_stages(1000, 2, RegressionOptions(time_budget=10.0).checked(),
        ...                 [Stage("warm_up", print, ((0, warm_up),))])
        >>> s.predicted
        {'warm_up': 5.0}
    """
    budget = options.time_budget if options.time_budget is not None else default_budget(num_rows)
    rate = options.machine_rate
    # Multiply-adds beyond the float range (a budget of 1e300 s) are an unbounded budget: held
    # at the largest float, so that what the stages leave stays a number (inf - inf is NaN,
    # and NaN compares false with every cost).
    plan = Plan(num_rows, input_dim, options, min(budget * rate, sys.float_info.max),
                streamed=streamed)
    steps = sorted(((order, index, book) for index, stage in enumerate(stages)
                    for order, book in stage.plans), key=lambda step: step[:2])
    for _, _, book in steps:
        book(plan)
    predicted = {stage.name: plan.predicted[stage.name] / rate for stage in stages
                 if stage.name in plan.predicted}
    return Schedule(budget, rate, plan.subsample, plan.search_features, plan.search_evidence,
                    plan.refine_rows, plan.local_starts, plan.choose_bound, plan.num_features,
                    predicted, plan.final_solve, plan.settings)


def refinement_rows(num_rows: int, subsample: int, options, evaluation_cost,
                    total: float) -> tuple:
    """``(rows, multiply-adds)`` of the refinement: up to ``refine_rows`` rows, halved (never
    below the subsample) until its ``refine_iterations`` evaluations of
    ``evaluation_cost(rows)`` fit :data:`REFINE_SHARE` of the ``total`` budget; ``(0, 0)``
    where there is none."""
    if num_rows <= subsample or not options.refine_iterations:
        return 0, 0.0
    evaluations = options.refine_iterations * EVALUATIONS_PER_ITERATION
    rows = min(num_rows, options.refine_rows)
    while rows > subsample and evaluations * evaluation_cost(rows) > REFINE_SHARE * total:
        rows = max(subsample, rows // 2)
    return rows, evaluations * evaluation_cost(rows)
