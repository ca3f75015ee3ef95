r"""What the final fit of :func:`~rfgp.recipes.fit_auto` costs, beyond the fit's own cost model
(:mod:`~rfgp.inference._fit_cost`, :mod:`~rfgp.inference._cg_cost`): its model's first
predictive variances, which the budget books with it (:func:`variance_cost`); the CG path's
two routes, by the features or through the rows' ``N x N`` matrix (:func:`cg_route_costs`);
and the forecast that, once the choice model's spectrum is known, lowers the planned ``D``
and picks its path and route
(:func:`forecast_final`). The stage itself is :mod:`~rfgp.recipes._refit`.

Internal: not part of the public API (see :mod:`rfgp.recipes`).
"""

from __future__ import annotations

import math
from typing import Dict, Optional, Tuple

import torch
from torch import Tensor

from rfgp.inference import (
    CHOICE_FEATURES,
    FEATURE_STEP,
    MAX_ITERATIVE_FEATURES,
    ScaleCalibration,
    final_path,
    largest_features_within,
    row_capped_features,
)
from rfgp.inference._cg_cost import (
    CG_ITERATIONS,
    SKETCH_RANK,
    iterative_fit_cost,
    rows_fit_cost,
    rows_route,
)
from rfgp.inference._cg_dense import dense_fits, serving_cost
from rfgp.inference._cg_forecast import CGForecast, forecast_cg, spectrum_at
from rfgp.inference._cg_rows import row_form_open, row_precision_holds
from rfgp.inference._iterative import CGSettings
from rfgp.recipes._stage import RecipeData

__all__ = ["PREDICTED_ROWS", "cg_route_costs", "forecast_final", "predicted_rows",
           "rows_query_cost", "variance_cost"]

#: The rows of the prediction whose variances the final fit's cost books (on the CG path,
#: :func:`variance_cost`): a held-out tenth of the rows, at most this many (beyond, a
#: prediction's cost per row is its own, like its mean's).
PREDICTED_ROWS = 2048


def predicted_rows(num_rows: int) -> int:
    """The rows whose variances the final fit books: a tenth of ``num_rows``, at most
    :data:`PREDICTED_ROWS`."""
    return max(1, min(PREDICTED_ROWS, math.ceil(num_rows / 10)))


def variance_cost(num_rows: int, features: int, path: Optional[str],
                  spectrum: Optional[Tensor] = None, streamed: bool = False) -> float:
    r"""Multiply-adds of the final model's first predictive variances, booked with its fit.

    A weight-space fit's Cholesky factor gives them at no further cost. A CG fit's
    (``path == "cg"``) build a low-rank form of :math:`B^{-1}` or a dense factor of ``B``
    at the first prediction with ``return_std`` (:func:`~rfgp.inference._cg_dense.
    serving_cost`, for :func:`predicted_rows` rows): on the sets measured it took as long as
    the fit itself, 0.5 to 1.1 times its seconds (pol at 13,500 features: the dense factor,
    63 s after a 63 s fit), so a budget that left it out was overrun twofold. ``spectrum``:
    the forecast eigenvalues of :math:`B - I` at ``features`` (their leading ones, as the
    preconditioner holds them), else the form of the cost model's constants.

    The dense factor is that of ``B`` where it fits in memory, or of the rows' ``K`` where
    that is open (:func:`~rfgp.inference._cg_rows.row_form_open`, the precision judged on
    ``spectrum``'s top eigenvalue where given; without one, as on the sets measured, taken to
    hold, and the final fit's forecast lowers ``D`` where it does not) and cheaper.

    Example:
        >>> variance_cost(13500, 8192, "weight"), variance_cost(13500, 8192, "cg") > 0
        (0.0, True)
    """
    if path != "cg":
        return 0.0
    largest = float(spectrum.max()) if spectrum is not None and spectrum.numel() else None
    by_rows = row_form_open(num_rows, features, largest, streamed, CGSettings.variance_tolerance)
    return serving_cost(features, num_rows, predicted_rows(num_rows), spectrum,
                        dense=dense_fits(features, torch.float64, torch.device("cpu")),
                        by_rows=by_rows)


def cg_route_costs(num_rows: int, features: int, input_dim: int, candidates: int,
                   streamed: bool = False, forecast: Optional[CGForecast] = None,
                   eigenvalues: Optional[Tensor] = None, scale: float = 1.0) -> tuple:
    r"""``(features, rows)``: multiply-adds of the calibrated CG fit and its first variances
    by its two routes. By the features: the Krylov calibration and CG fit on products with
    :math:`\Phi` (:func:`~rfgp.inference._cg_cost.iterative_fit_cost`) and the variances'
    cheaper form (:func:`variance_cost`). Through the rows, where their route is open
    (:func:`~rfgp.inference._cg_cost.rows_route` and the variances' precision on the
    forecast's top eigenvalue, :func:`~rfgp.inference._cg_rows.row_precision_holds`; else
    ``inf``): the calibration on products with :math:`G = \Phi\Phi^\top` and one Cholesky
    factor for the fit (:func:`~rfgp.inference._cg_cost.rows_fit_cost`), which then serves
    the variances' query rows (:func:`rows_query_cost`). The rows' route costs
    ``N^2 D / 2`` to form :math:`G`, the features' route two passes over ``N D`` entries per
    product: with many CG iterations (little noise) the rows' is cheaper, with few the
    features' is.

    ``forecast``: the CG forecast at ``features`` from ``eigenvalues`` of a smaller model's
    :math:`G` at ``scale`` (:func:`~rfgp.inference._cg_forecast.forecast_cg`), whose
    iterations and rank both routes then take (the same spectrum: :math:`\Phi\Phi^\top`
    and :math:`\Phi^\top\Phi` share their nonzero eigenvalues); without one the cost
    model's constants.

    Example:
        >>> by_features, by_rows = cg_route_costs(12150, 32768, 26, 1)
        >>> math.isfinite(by_rows), cg_route_costs(12150, 8192, 26, 1)[1]
        (True, inf)
    """
    n = num_rows
    if forecast is None:
        held = None
        by_features = (iterative_fit_cost(n, features, input_dim, candidates, streamed)
                       + variance_cost(n, features, "cg", streamed=streamed))
        iterations, rank = CG_ITERATIONS, SKETCH_RANK
    else:
        # the variances' form on the same spectrum, beside a preconditioner of its rank
        held = spectrum_at(eigenvalues, scale, features)[:forecast.rank]
        by_features = forecast.multiply_adds + variance_cost(n, features, "cg", held, streamed)
        iterations, rank = forecast.iterations, forecast.rank
    largest = float(held.max()) if held is not None and held.numel() else 0.0
    if not (rows_route(n, features, streamed)
            and row_precision_holds(largest, torch.float64, CGSettings.variance_tolerance)):
        return by_features, math.inf
    by_rows = (rows_fit_cost(n, features, input_dim, candidates, iterations, rank)
               + rows_query_cost(n, features))
    return by_features, by_rows


def rows_query_cost(num_rows: int, features: int) -> float:
    r"""Multiply-adds of the first variances of a fit through the rows' factor
    (:func:`~rfgp.inference._cg_rows.fit_by_rows`) for :func:`predicted_rows` rows: per row
    a product with the kept features and a triangular solve, :math:`N D + N^2`.

    Example:
        >>> rows_query_cost(13500, 32768) == 1350 * (13500 * 32768 + 13500**2)
        True
    """
    return predicted_rows(num_rows) * (float(num_rows) * features + float(num_rows) ** 2)


def forecast_final(data: RecipeData, choice: ScaleCalibration, candidates: int,
                   grow: bool = True) -> Tuple[Optional[CGForecast], str]:
    r"""``(forecast, route)`` of a final fit compared at fewer features: the CG forecast at its
    ``D`` (``None`` where the choice model has no spectrum or the ``D`` was given) and the
    cheapest way to fit that ``D``: ``"weight"`` (the ``D x D`` solve, where ``solve``
    allows it, :func:`~rfgp.inference.final_path`), ``"rows"`` or ``"features"`` (the CG
    routes, :func:`cg_route_costs`, where ``solve`` is not ``"weight"``).

    A plan in weight space keeps at least its ``D`` (paid for on that path, on which every
    smaller ``D`` costs less) and is weighed at it: where the forecast shows CG converging in
    a few iterations (little signal in much noise) a CG route costs a fraction of the
    ``N D^2`` solve (on 41,203 rows of 3 inputs, 7,168 features: 15 s by CG against 55 s in
    weight space, the same model), and the seconds it saves buy features (where ``grow``, the
    caller's test that more features than planned can still move the posterior,
    :func:`~rfgp.recipes._refit.features_cannot_matter` at the plan's ``D``): the ``D`` becomes
    the largest of the feature grid whose cheapest path on the forecast costs at most the
    larger of the plan's own cost, the final fit's share of the budget
    (``schedule.settings["refit"]["share"]``, which grows with the budget) and the allowance
    below (elevators at the default budget: 9,216 features where 6,144 were planned, within
    the budget). A plan on the CG path keeps its ``D``, lowered where the
    iterations forecast from the choice model's spectrum
    (:func:`~rfgp.inference._cg_forecast.forecast_cg`) make it cost more than the fit may: the
    largest ``D`` of the feature grid, at most the plan's, whose cheapest path on the
    forecast costs at most the larger of the booked cost (the features' route at the plan's
    ``D`` and the cost model's constants) and the allowance of the seconds left when the final
    fit started (``schedule.settings["refit"]["allowance"]``,
    :data:`~rfgp.recipes._refit.REPLAN_SHARE` of them at the re-plan's rate, under
    ``anytime``), so that more budget never lowers it further. Never raised on the CG path:
    spent to its last second there, the forecast's costs ran past the budget (power-plant at
    twice the default: 58,368 features through the rows, 118 s of its 83). Without a
    forecast the route is weighed on the constants.

    Why: on a nearly noiseless set the CG solves take several times the constant iterations
    (pol: 62 to 85, against 40), and the final fit ran 2.5 times its prediction, beyond the
    budget; the spectrum of the :data:`~rfgp.inference.CHOICE_FEATURES`-feature model, already
    factorised for the choice, shows it before the large model is built. Each size costs its
    cheapest path, so where the forecast shows both CG routes dear the ``D`` is lowered to the
    largest on either path (on 20,000 rows of 8 inputs with a slowly decaying spectrum and
    little noise, 8,192 features cost 2.1e12 multiply-adds by CG on the forecast and 1.6e12 in
    weight space).
    """
    planned, solve = data.schedule.num_features, data.options.solve
    n, d, streamed = data.num_rows, data.input_dim, data.source is not None
    weight_plan = data.schedule.final_solve == "weight"
    if choice.spectrum is None or data.options.num_features is not None:
        if weight_plan:
            return None, "weight"
        by_features, by_rows = cg_route_costs(n, planned, d, candidates, streamed)
        return None, "rows" if by_rows < by_features else "features"
    scale = choice.factor / choice.noise
    forecasts: Dict[int, CGForecast] = {}
    routes: Dict[int, str] = {}

    def cost(size: int) -> float:
        forecasts[size] = forecast = forecast_cg(choice.spectrum, scale, n, size, d,
                                                 candidates, streamed)
        by_features, by_rows = cg_route_costs(n, size, d, candidates, streamed, forecast,
                                              choice.spectrum, scale)
        path, by_weight = final_path(n, size, d, solve, candidates, False, streamed)
        # CG wherever the options allow it ("weight" never takes it)
        options = {} if solve == "weight" else {"features": by_features, "rows": by_rows}
        if path == "weight":
            options["weight"] = by_weight
        if not options:  # solve="weight" beyond the D x D solve's sizes: no path
            return math.inf
        # the weight space first where it ties: the exact solve, and no CG at all
        routes[size] = min(sorted(options, key=lambda r: r != "weight"), key=options.get)
        return options[routes[size]]

    settings = data.schedule.settings.get("refit", {})
    if weight_plan:
        # Its D was paid for in weight space (every smaller D costs less there): never fewer.
        # Where the forecast shows CG cheaper, the final fit's share of the budget and the
        # seconds left (under anytime) buy the largest D whose cheapest path costs them.
        booked = max(cost(planned), settings.get("share", 0.0),
                     settings.get("allowance", 0.0))
        smallest = planned
        largest, cap = ((MAX_ITERATIVE_FEATURES, row_capped_features(n)) if grow
                        else (planned, planned))
    else:
        # What the plan booked for its D on the CG path, at the cost model's constants; never
        # raised (a forecast of more features on the CG path ran past the budget: power-plant
        # at twice the default, 58,368 features through the rows in 118 s of its 83).
        booked = max(cg_route_costs(n, planned, d, candidates, streamed)[0],
                     settings.get("allowance", 0.0))
        smallest, largest, cap = min(planned, CHOICE_FEATURES), planned, planned
    features = largest_features_within(cost, booked, smallest, largest, FEATURE_STEP, cap)
    # Every size of the grid was forecast on the way (largest_features_within tries them
    # all, the smallest included).
    return forecasts[features], routes[features]
