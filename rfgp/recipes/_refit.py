r"""The final fit (the stage ``"refit"``, :data:`REFIT`): the hyperparameters belong to the
model that predicts.

The final kernel has the schedule's ``D`` features (the Laplace average of the lengthscales
where there are draws, :func:`~rfgp.recipes._laplace.lengthscale_mixture_kernel`), on the
data as given. Its outputscale and noise maximise the evidence of that ``D``-feature model
itself, and where the search stages left more than one candidate lengthscale vector (the
refinement's end, the local stage's best) the evidence of the same model with at most
:data:`~rfgp.inference.CHOICE_FEATURES` features, each calibrated, chooses among them (always
on the ``"cg"`` path, whose own calibration starts from the chosen scales). This stage keeps
only that choice: the calibration and the fit are :func:`~rfgp.inference.calibrate_scales` and
:func:`~rfgp.inference.fit_calibrated`. The lengthscales are not moved one by one at ``D``: each
evaluation of that evidence's gradient costs :math:`2 N D^2`, more than the whole calibration.

**A common factor on the lengthscales** (:func:`scale_search`). The search's lengthscales
maximise the evidence of a model of ``search_features`` features, which cannot follow a short
lengthscale (a fine variation must be called noise), so they lean long; a model of more
features can afford shorter ones. The chosen candidate's lengthscales are multiplied by
:math:`c = \rho^{k}` (:data:`SCALE_STEP`), walking down from :math:`c = 1` (the bias is
one-sided, so the walk is too) for as long as the same calibrated model's evidence rises by
more than :data:`SCALE_EVIDENCE` nats a step (at most :data:`SCALE_STEPS` steps): a
one-dimensional search that costs a calibration per step at the choice's features, no
gradient, as many as :data:`SCALE_SHARE` of the budget pays for (:func:`plan_scale`; none on
a budget too small for one). Where the final ``D`` is larger than the choice's, its optimum
lies at least as far down on the sets measured (pol: 0.8 at 2,048 features, below 0.64 at
8,192), so the choice's factor is a step in the right direction that stops short. Measured at
2,048 and 8,192 features on five data sets: where the evidence rises as :math:`c` falls (pol,
power-plant, bike), the test log likelihood rises with it, and where it falls (pumadyn32nm)
or stays flat (elevators), so does the test log likelihood.

On either path the choice model also says whether a larger model can matter: where its signal
in noise units, :math:`s = c\,\mathrm{tr}\,G`, makes the Monte Carlo difference between two
feature draws at most a tenth of the noise (:func:`features_cannot_matter`), the final model
is the choice's, in weight space (data without signal: on 41,202 rows the planned 41,202
features cost minutes of feature passes and predicted the same to every digit). Its
spectrum also forecasts the CG iterations at the final ``D``
(:func:`~rfgp.recipes._final_cost.forecast_final`): a ``D`` planned on the CG path is lowered
where they cost more than planned, a ``D`` planned in weight space is raised where CG
converges fast enough that the final fit's share of the budget pays for more features, and
on either path the fit takes the cheapest of the weight space, CG by the features and CG
through the rows at that ``D``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Dict, Optional

import torch
from gpytorch.kernels import Kernel
from torch import Tensor

from rfgp._report import FitReport
from rfgp._units import NOISE_FLOOR
from rfgp.inference import (
    CHOICE_FEATURES,
    FEATURE_STEP,
    MAX_ITERATIVE_FEATURES,
    RandomFeatureGP,
    ScaleCalibration,
    calibrate_scales,
    calibrate_source_scales,
    final_path,
    fit_calibrated,
    fit_calibrated_source,
    largest_features_within,
    row_capped_features,
)
from rfgp.recipes._final_cost import cg_route_costs, forecast_final
from rfgp.recipes._laplace import hessian_cost, lengthscale_mixture_kernel
from rfgp.recipes._local import local_possible
from rfgp.recipes._scale import (
    SCALE_EVIDENCE,
    booked_scale_cost,
    plan_scale,
    scale_search,
)
from rfgp.recipes._schedule import FINAL_SHARE, MIN_FEATURES, Plan
from rfgp.recipes._stage import RecipeData, Searched, Stage
from rfgp.recipes._start import make_ard_kernel, set_hyperparameters

__all__ = ["REFIT", "REPLAN_SHARE", "plan_final_growth", "plan_final_share", "refit",
           "replan_final"]

#: Share of the seconds left when the final fit starts that its re-planned ``D`` may take
#: (:func:`replan_final`): the final fit's cost is predicted less surely than the search's
#: (the CG iterations grow with the signal-to-noise ratio).
REPLAN_SHARE = 0.9


def _final_kernel(data: RecipeData, draws: Optional[Tensor], centre: Tensor,
                  outputscale: Tensor, data_units: bool, features: int = 0) -> Kernel:
    """The final kernel at the search-unit lengthscales ``centre`` and outputscale, in the
    search's units or (``data_units``) the data's, with ``features`` (default the
    schedule's), averaged over the relative Laplace ``draws`` where there are."""
    opts, features = data.options, features or data.schedule.num_features
    if data_units:
        centre, outputscale = centre * data.x_unit, outputscale * data.y_unit**2
    lengthscale = centre
    if draws is not None:
        return lengthscale_mixture_kernel(features, draws * lengthscale, outputscale,
                                          opts.spectral, opts.seed)
    kernel = make_ard_kernel(features, data.input_dim, opts.spectral, seed=opts.seed,
                             dtype=data.x.dtype).to(data.x.device)
    set_hyperparameters(kernel, lengthscale, outputscale)
    return kernel


def refit(data: RecipeData, searched: Searched, report: FitReport) -> RandomFeatureGP:
    """Build, calibrate and fit the final model (module docstring) from ``searched``'s
    scales, its candidate lengthscales (its own where there are none) and its Laplace draws."""
    path = data.schedule.final_solve
    iterative = path == "cg"
    draws = searched.draws
    # The evidence is computed in the search's units: power-of-two units scale every
    # result exactly, and the final kernel is then built in the data's.
    outputscale = searched.model.kernel.outputscale.detach()
    noise = float(searched.model.noise.detach())
    # Without calibration the searched model is kept as it is.
    candidates: Dict[str, Tensor] = (dict(searched.candidates) if data.options.calibrate
                                     else {}) or {"search": searched.lengthscale()}
    best = ("search", searched.lengthscale(), ScaleCalibration(path, 1.0, noise))
    losses = {}
    shift = math.log(data.y_unit)  # a log density per datum in the data's units
    floor = NOISE_FLOOR * data.mean_square()
    # Several candidates (and the scale search's factors) are compared at no more than
    # CHOICE_FEATURES features (the chosen one then calibrates at the final D): on the
    # iterative path always, on the weight path where D is larger.
    features = data.schedule.num_features
    choice = (min(features, CHOICE_FEATURES)
              if iterative or (data.options.calibrate and features > CHOICE_FEATURES) else 0)
    for name, centre in candidates.items():
        if not data.options.calibrate:
            break
        # Only the final D-feature model's Gram matrix serves the fit.
        calibration = _calibrate(
            data, _final_kernel(data, draws, centre, outputscale, False, choice), noise, floor,
            keep=not (iterative or choice))
        losses[name] = calibration.loss / data.num_entries + shift
        if len(losses) == 1 or losses[name] < losses[best[0]]:
            best = (name, centre, calibration)
        del calibration
    name, centre, calibration = best
    factor, factors = 1.0, {}
    if data.options.calibrate:
        def evaluate(scale: float) -> tuple:
            found = _calibrate(data, _final_kernel(data, draws, centre * scale, outputscale,
                                                   False, choice),
                               noise, floor, keep=not (iterative or choice))
            return found.loss / data.num_entries + shift, found

        # Downward only (largest = 1): the search's bias, few features that cannot follow a
        # short lengthscale, is one-sided; where the choice model's evidence asks for longer
        # ones, the final model of more features need not (elevators: 1.56 to 1.95 at 2,048
        # features, a test MNLL 0.005 worse at 14,938). A kept bound holds the more so.
        largest = 1.0
        evaluations = data.schedule.settings.get("refit", {}).get("scale_evaluations", 0)
        factor, calibration, factors = scale_search(
            evaluate, losses[name], calibration, largest, evaluations,
            SCALE_EVIDENCE / data.num_entries)
        centre = centre * factor
    start = calibration
    forecast = None
    signal = None
    if (choice and features > choice and data.options.calibrate
            and data.options.num_features is None and start.spectrum is not None):
        # The choice model's signal in noise units: if more features cannot move the
        # posterior by a tenth of the noise, the final model stays at the choice's D, on
        # either path (on 41,203 rows without signal, 6,144 weight-space features cost
        # 38 s for the 2,048 features' predictions).
        signal = float(start.spectrum.double().sum()) * start.factor / start.noise
        if features_cannot_matter(signal, choice):
            features, iterative, path = choice, False, "weight"
            report.num_features = features
            report.schedule = dataclasses.replace(data.schedule, num_features=features,
                                                  final_solve="weight")
    route = "features" if iterative else "weight"
    weighed = iterative or (choice and features > choice and start.spectrum is not None)
    if weighed and data.options.calibrate:
        # The final D and its cheapest path and route (on the choice model's forecast where
        # there is one): the D x D solve, or CG through the rows' N x N form or the features.
        # A weight-space plan is weighed too: with little signal in much noise, CG converges
        # in a few iterations where the D x D solve costs N D^2 whatever the spectrum.
        # More features than planned only where they can still move the posterior by a
        # tenth of the noise (tamielectric: a signal of 2.55 noise units, 7,168 features
        # planned; raised, 30,720 took 83 s for the same MNLL to four digits).
        grow = signal is None or not features_cannot_matter(signal, features)
        forecast, route = forecast_final(data, start, max(1, len(candidates)), grow)
        weighed_path = "weight" if route == "weight" else "cg"
        if forecast is not None and (forecast.num_features != features
                                     or weighed_path != path):
            features, path = forecast.num_features, weighed_path
            iterative = path == "cg"
            if not iterative:
                forecast = None
            report.num_features = features
            report.schedule = dataclasses.replace(data.schedule, num_features=features,
                                                  final_solve=path)
    rows = route == "rows"
    if choice and data.options.calibrate:
        # The chosen lengthscales' D-feature model calibrates itself: in weight space from
        # the search's scales as every candidate did (the fewer features' outputscale
        # factor can be far from its own), by CG from the fewer features' scales.
        kernel = _final_kernel(data, draws, centre, outputscale, False, features)
        calibration = _calibrate(data, kernel, start.noise if iterative else noise, floor,
                                 path=path, factor=start.factor if iterative else 1.0,
                                 rows=rows)
    kernel = _final_kernel(data, draws, centre, outputscale * calibration.factor, True,
                           features)
    if data.options.calibrate:
        report.calibration = {
            "candidates": list(losses), "evidence": losses, "chosen": name,
            "lengthscale_factor": factor,
            "factor_evidence": factors,
            "signal": signal,
            "choice_features": choice or features,
            "outputscale_factor": calibration.factor,
            "noise_before": noise * data.y_unit**2,
            "noise_after": float(torch.as_tensor(calibration.noise, dtype=data.x.dtype)
                                 * data.y_unit**2),
        }
        if iterative:
            result = calibration.iterative
            report.calibration["iterative"] = {
                "choice_features": choice, "start_factor": start.factor,
                "start_noise": start.noise * data.y_unit**2,
                "log_evidence": result.log_evidence - shift,
                "standard_error": result.standard_error,
                "gradient_standard_error": result.gradient_standard_error,
                "rank": result.rank, "iterations": result.iterations,
                "products": result.products, "route": route,
            }
            if forecast is not None:
                report.calibration["iterative"]["forecast"] = {
                    "planned_features": data.schedule.num_features, "features": features,
                    "rank": forecast.rank, "iterations": forecast.iterations,
                    "condition": forecast.condition}
    # The final features are the evidence's in the data's units (the input units are
    # powers of two: exact); on the CG path, B - I of the fit is c G of the calibration
    # (the units cancel in a / noise), so its preconditioner serves.
    if data.source is not None:
        # Rows behind a source: in weight space from the calibration's sums over them
        # (streamed where it kept none), by CG with a pass over them per iteration.
        gp = fit_calibrated_source(kernel, data.source, calibration,
                                   (data.x_data, data.y_data), data.y_unit)
    else:
        gp = fit_calibrated(kernel, data.x_data, data.y_data, calibration, data.y_unit)
    report.lengthscale = centre * data.x_unit
    report.lengthscale_draws = None if draws is None else draws * centre * data.x_unit
    return gp


#: the largest perturbation of ``c G`` between two feature draws, in noise units, below which
#: more features are not fitted (:func:`features_cannot_matter`)
SIGNAL_TOLERANCE = 0.1


def features_cannot_matter(signal: float, features: int) -> bool:
    r"""Whether a model of more features than ``features`` cannot move the posterior by more
    than :data:`SIGNAL_TOLERANCE` of the noise: :math:`2 s / \sqrt{m} \le 0.1`.

    With :math:`B = I + cG` (:math:`c = a / \sigma^2`), random features estimate the kernel
    matrix with a Monte Carlo error :math:`\|G_m - K\| \lesssim \mathrm{tr} K / \sqrt{m}`,
    so two models of :math:`m` and more features differ by at most about
    :math:`2 s / \sqrt{m}` in :math:`cG`, :math:`s = c\,\mathrm{tr}\,G` the signal in
    noise units (the choice model's, ``signal``). Where that is a tenth, the posterior mean
    moves by less than a tenth of a noise standard deviation and the variances by a tenth of
    the noise: data without signal (the evidence's outputscale near zero) gains nothing from
    a larger model, which would only cost passes over its features.

    Example:
        >>> features_cannot_matter(1e-3, 2048), features_cannot_matter(100.0, 2048)
        (True, False)
    """
    return 2.0 * signal / math.sqrt(max(features, 1)) <= SIGNAL_TOLERANCE


def _calibrate(data: RecipeData, kernel: Kernel, noise: float, floor: float,
               keep: bool = True, path: str = "weight", factor: float = 1.0,
               rows: bool = False) -> ScaleCalibration:
    """The calibration of ``kernel`` on every row by ``path``, from ``(factor, noise)``: in
    memory (on the ``"cg"`` path through the rows' form where ``rows``), or over the chunks
    of the data's source (on the ``"cg"`` path a pass over them per product)."""
    if data.source is not None:
        return calibrate_source_scales(kernel, data.source, noise, x_unit=data.x_unit,
                                       y_unit=data.y_unit, noise_floor=floor, keep=keep,
                                       path=path, factor=factor, seed=data.options.seed)
    return calibrate_scales(kernel, data.x, data.y, noise, path=path, factor=factor,
                            noise_floor=floor, keep=keep, seed=data.options.seed, rows=rows)


def plan_final_share(plan: Plan) -> None:
    """Book the final fit's share first: the most features (on the feature grid, at least
    :data:`~rfgp.recipes._schedule.MIN_FEATURES`) whose calibrated fit, with the candidates it
    may have to choose among (the refinement's end and, where a local stage can run, its
    best), costs at most :data:`~rfgp.recipes._schedule.FINAL_SHARE` of the budget, or what
    the first search and the Laplace Hessian leave where that is less (an exact search on a
    couple of thousand rows can take most of a small budget); a given ``num_features`` as it
    is."""
    d, opts = plan.input_dim, plan.options
    forced = opts.num_features is not None
    if forced:
        features = opts.num_features
    else:
        leaves = plan.total - plan.spent - hessian_cost(opts, d, plan.evaluation)
        candidates = compared(plan)
        features = largest_features_within(
            lambda size: _final_cost(plan, size, candidates),
            min(FINAL_SHARE * plan.total, leaves), max(MIN_FEATURES, opts.search_features),
            MAX_ITERATIVE_FEATURES, FEATURE_STEP, row_capped_features(plan.num_rows))
    plan.num_features = features
    plan.spent += _final_cost(plan, features, 1, forced)


def plan_final_growth(plan: Plan) -> None:
    """Book what the stages before leave to the final fit: the largest ``D`` whose fit, on
    its cheapest path (a CG fit beyond the weight-space limit can cost less than the
    weight-space fit below it), the rest of the budget pays for; then the fit's path and
    cost. The rest is the budget less what the stages booked before can cost at this budget
    (:meth:`~rfgp.recipes._schedule.Plan.committed`: the refinement's, the local stage's and
    the Laplace Hessian's bounds, which grow with the budget, unlike their costs, which jump
    as their rows double; the other stages' costs), so that ``D`` only grows with the budget,
    as every other stage's share does. The calibrations compared are :func:`compared`'s."""
    n, d, opts = plan.num_rows, plan.input_dim, plan.options
    features = plan.num_features
    candidates = compared(plan)
    if opts.num_features is None:
        rest = plan.total - plan.committed(leaving="refit")
        current = _final_cost(plan, features, candidates)
        larger = largest_features_within(lambda size: _final_cost(plan, size, candidates),
                                         max(rest, current), features, MAX_ITERATIVE_FEATURES,
                                         FEATURE_STEP, row_capped_features(n))
        final = _final_cost(plan, larger, candidates)
        plan.spent += final - current
        features = larger
        # What the final fit may cost at this budget (it grows with the budget): the forecast
        # at the fit spends it on the largest D its path then costs
        # (_final_cost.forecast_final), less the scale search's calibrations.
        share = max(rest - booked_scale_cost(plan.settings), final)
        plan.settings.setdefault("refit", {})["share"] = share
    plan.num_features = features
    path, cost = _final_path(n, features, d, opts.solve, candidates,
                             opts.num_features is not None, plan.streamed)
    plan.final_solve, plan.predicted["refit"] = path, cost + booked_scale_cost(plan.settings)


def replan_final(schedule: Any, num_rows: int, input_dim: int, options: Any,
                 seconds_left: float, rate: float, streamed: bool = False) -> Any:
    r"""The schedule with the final ``D`` re-planned from the time actually left when the
    final fit starts (an anytime rule): the largest ``D`` of the feature grid whose fit, on
    its path, costs at most :data:`REPLAN_SHARE` of ``seconds_left`` at ``rate``
    multiply-adds per second (the options' rate, or the lower one of stages that ran slower
    than forecast), and never fewer than the
    schedule's own ``D``:

    .. math::
        D = \max\big(D_{\text{plan}},\ \max\{D' : C(D') \le 0.9\,t_{\text{left}}\,r\}\big).

    Both terms only grow (the plan's with the budget, the other with the time left), so more
    budget or faster stages never give fewer features. On the CG path the fit's cost
    includes its first predictive variances'
    (:func:`~rfgp.recipes._final_cost.variance_cost`). A given
    ``num_features`` (or ``anytime=False``) keeps the schedule as it is; so does a ``D``
    already at its cap.

    Args:
        schedule: the :class:`~rfgp.recipes._schedule.Schedule` planned.
        num_rows, input_dim: ``N`` and ``d``.
        options: the checked options.
        seconds_left: the budget less the seconds spent so far.
        rate: multiply-adds per second.
        streamed: whether the rows are read from a data source at every pass
            (:attr:`~rfgp.recipes._schedule.Plan.streamed`).

    Returns:
        ``schedule`` itself, or a copy with the larger ``num_features``, its ``final_solve``
        and its ``predicted["refit"]`` (seconds at ``rate``).

    Example:
        >>> from rfgp.recipes._options import RegressionOptions
        >>> from rfgp.recipes._regression import plan_regression
        >>> opts = RegressionOptions().checked()
        >>> s = plan_regression(13500, 26, opts)
        >>> replan_final(s, 13500, 26, opts, 0.0, opts.machine_rate) is s
        True
        >>> replan_final(s, 13500, 26, opts, 40.0, opts.machine_rate).num_features > 2048
        True
    """
    if options.num_features is not None or not options.anytime:
        return schedule
    # The candidates the plan counted (plan_final_growth's rule).
    plan = Plan(num_rows, input_dim, options, 0.0, streamed=streamed)
    candidates = compared(plan)

    def cost(size: int) -> float:
        return _final_cost(plan, size, candidates)

    # The scale search's calibrations come out of the same seconds.
    scale = booked_scale_cost(schedule.settings)
    budget = REPLAN_SHARE * max(seconds_left, 0.0) * rate - scale
    larger = largest_features_within(cost, budget, schedule.num_features,
                                     MAX_ITERATIVE_FEATURES, FEATURE_STEP,
                                     row_capped_features(num_rows))
    if larger <= schedule.num_features:
        return schedule
    path, multiply_adds = _final_path(num_rows, larger, input_dim, options.solve, candidates,
                                      False, streamed)
    predicted = dict(schedule.predicted, refit=(multiply_adds + scale) / rate)
    return dataclasses.replace(schedule, num_features=larger, final_solve=path,
                               predicted=predicted)


def compared(plan: Plan) -> int:
    """The candidates the final fit compares, as the cost model counts them: the
    refinement's end, and the local stage's best where a local stage can run (the scale
    search's calibrations are booked apart, :func:`plan_scale`)."""
    return 2 if local_possible(plan) else 1


def _final_cost(plan: Plan, features: int, candidates: int, forced: bool = False) -> float:
    """Multiply-adds of the calibrated final fit at ``features`` on the path it takes
    (:func:`~rfgp.inference.final_path`; on rows read from a source, one pass per product)."""
    return _final_path(plan.num_rows, features, plan.input_dim, plan.options.solve,
                       candidates, forced, plan.streamed)[1]


def _final_path(num_rows: int, features: int, input_dim: int, solve: str, candidates: int,
                forced: bool, streamed: bool) -> tuple:
    """``(path, multiply-adds)`` of the calibrated final fit
    (:func:`~rfgp.inference.final_path`) and its model's first variances
    (:func:`~rfgp.recipes._final_cost.variance_cost`)."""
    path, cost = final_path(num_rows, features, input_dim, solve, candidates, forced,
                            streamed)
    if path == "cg":  # the cheaper of its routes, the features' or the rows'
        return path, min(cg_route_costs(num_rows, features, input_dim, candidates, streamed))
    return path, cost  # a weight-space fit's factor gives its variances (variance_cost)


REFIT = Stage("refit", refit, ((10, plan_final_share), (15, plan_scale),
                              (50, plan_final_growth)))
