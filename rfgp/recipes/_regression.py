r""":func:`fit_auto`: the default regression recipe, a budgeted pipeline of stages.

The stages (:data:`STAGES`), each an internal module of :mod:`rfgp.recipes` of the stage's
name: ``search``, ``select`` (the bound's cross-validated choice), ``refine``, ``local``,
``laplace`` (the Laplace average) and ``refit`` (calibration and the final fit), after the
units and the start (:func:`_prepare`). What each does, and how the budget is shared among
them, is :mod:`rfgp.recipes`' overview.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch

from rfgp._validation import check_evidence_rows
from rfgp.inference import RandomFeatureGP
from rfgp.recipes._laplace import LAPLACE
from rfgp.recipes._local import LOCAL
from rfgp.recipes._options import RegressionOptions
from rfgp.recipes._refine import REFINE
from rfgp.recipes._refit import REFIT
from rfgp.recipes._report import FitReport
from rfgp.recipes._schedule import Schedule, plan_stages
from rfgp.recipes._search import SEARCH
from rfgp.recipes._select import SELECT
from rfgp.recipes._stage import RecipeData, Searched, StageTimer
from rfgp.recipes._start import initial_hyperparameters, search_model
from rfgp.recipes._units import (
    check_variances_representable,
    column_unit,
    target_unit,
)

__all__ = ["STAGES", "fit_auto", "plan_regression"]

#: The stages of :func:`fit_auto`, in the order they run (each plans its cost at its own
#: place in the schedule): every one but the last hands on a
#: :class:`~rfgp.recipes._stage.Searched`; the last returns the fitted model.
STAGES = (SEARCH, SELECT, REFINE, LOCAL, LAPLACE, REFIT)


def plan_regression(num_rows: int, input_dim: int, options: RegressionOptions) -> Schedule:
    """The schedule of :func:`fit_auto` for ``num_rows`` rows of ``input_dim`` inputs under
    checked :class:`~rfgp.recipes.RegressionOptions`: :data:`STAGES`' costs booked in their
    planning order (:func:`~rfgp.recipes._schedule.plan_stages`).

    Example:
        >>> s = plan_regression(40000, 9, RegressionOptions().checked())
        >>> s.num_features, s.subsample, s.search_evidence, s.refine_rows > 0
        (4096, 2000, 'features', True)
        >>> plan_regression(300, 4, RegressionOptions().checked()).search_evidence
        'exact'
    """
    return plan_stages(num_rows, input_dim, options, STAGES)


def fit_auto(x: Any, y: Any, *, report: Optional[FitReport] = None,
             **options: Any) -> RandomFeatureGP:
    r"""Fit a :class:`~rfgp.RandomFeatureGP` by the default recipe.

    It fits a GP with an ARD random Fourier feature kernel: the evidence is maximised cheaply
    (on a subsample, with few features, or with the exact kernel where the rows are few),
    corrected on more rows, and the final ``D``-feature model then chooses its own outputscale
    and noise, and among the search's candidate lengthscales, by its own evidence, so that its
    intervals are honest about what ``D`` features can fit. ``time_budget`` seconds (default
    :math:`\max(30, 20 + N/400)`) are shared among the stages by a cost model (see
    :mod:`rfgp.recipes`); ``report.timing()`` sets each stage's predicted seconds against the
    measured ones.

    The prior mean is zero: centre (or standardise) ``y`` first and add the mean back to the
    predictions. Inputs need no scaling: the search runs in units near each column's spread.

    Args:
        x: ``(N, d)`` float32 or float64 inputs.
        y: ``(N,)`` or ``(N, T)`` centred targets.
        report: a :class:`~rfgp.recipes.FitReport` to fill in (cleared first).
        **options: any of :class:`~rfgp.recipes.RegressionOptions` (``spectral``,
            ``num_features``, ``time_budget``, ``seed``, ``progress``, ...).

    Returns:
        The fitted model, ``D`` features, conditioned on all rows.

    Raises:
        ValueError: for ``y`` zero in every entry (centred constant targets: the evidence
            then has no maximum), for data or an option out of range, naming it; TypeError
            for one of the wrong type (``seed`` is an integer in ``[0, 2**64 - 1]``).

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> x = torch.rand(300, 2, generator=g, dtype=torch.float64)
        >>> y = torch.sin(6 * x[:, 0]) + 0.1 * torch.randn(300, generator=g, dtype=torch.float64)
        >>> gp = fit_auto(x, y - y.mean(), num_features=256, seed=0)
        >>> mean, std = gp.predict(x[:3], return_std=True)
        >>> bool(gp.noise < 0.05), mean.shape
        (True, torch.Size([3]))
    """
    opts = RegressionOptions().replace(**options).checked()
    data, searched, report = _prepare(x, y, opts, report)
    timer = StageTimer(report.seconds)
    with timer.progress(len(STAGES), "fit_auto", opts.progress):
        for stage in STAGES[:-1]:
            searched = timer.run(stage, data, searched, report) or searched
        gp = timer.run(STAGES[-1], data, searched, report)
    _report_in_data_units(data, searched, report)
    return gp


def _prepare(x: Any, y: Any, opts: RegressionOptions,
             report: Optional[FitReport]) -> tuple:
    """Units, schedule and the search's starting model: ``(data, start, report)``."""
    x, y = check_evidence_rows(x, y, "fit_auto")
    x_unit, y_unit = column_unit(x), target_unit(y)
    check_variances_representable(y_unit, x.dtype)
    schedule = plan_regression(x.shape[0], x.shape[1], opts)
    report = FitReport.begin(report, schedule)
    xs, ys = x / x_unit, y / y_unit
    generator = torch.Generator().manual_seed(opts.seed)
    start = initial_hyperparameters(xs, ys, generator=generator)
    # The subsample and the refinement's rows are heads of one random order, drawn after the
    # start (the start's draws come first from the generator).
    order = (torch.randperm(x.shape[0], generator=generator).to(x.device)
             if schedule.subsample < x.shape[0] else None)
    data = RecipeData(opts, schedule, xs, ys, x, y, x_unit, y_unit, generator, order)
    report.initial = {"lengthscale": start["lengthscale"] * x_unit,
                      "outputscale": start["outputscale"] * y_unit**2,
                      "noise": start["noise"] * y_unit**2}
    model = search_model(schedule.search_features, start, opts.spectral, opts.seed, xs)
    return data, Searched(model), report


def _report_in_data_units(data: RecipeData, searched: Searched, report: FitReport) -> None:
    """The search's records, from its units (inputs over ``x_unit``, targets over ``y_unit``)
    to the data's: bounds times the input units, log densities per datum less
    ``log(y_unit)``."""
    shift = math.log(data.y_unit)
    if searched.bound is not None:
        report.lengthscale_bound = searched.bound * data.x_unit
    report.losses = {stage: [loss + shift for loss in losses]
                     for stage, losses in report.losses.items()}
    report.local_losses = [loss + shift for loss in report.local_losses]
    for key in ("unbounded", "bounded"):
        if key in report.cv_scores:
            report.cv_scores[key] -= shift
