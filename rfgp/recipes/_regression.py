r""":func:`fit_auto`: the default regression recipe, a budgeted pipeline of stages.

**What it does.** It fits a GP with an ARD random Fourier feature kernel: the evidence is
maximised cheaply (on a subsample, with few features, or with the exact kernel where the rows
are few), corrected on more rows, and the final ``D``-feature model then chooses its own
outputscale and noise, and among the search's candidate lengthscales, by its own evidence, so
that its intervals are honest about what ``D`` features can fit.

**Its budget.** ``time_budget`` seconds (default :math:`20 + N/400`) are shared among the
stages by a cost model (the schedule): the final fit takes up to 40% and gets
the most features that fit there; the refinement's rows and the local stage's starts take what
is left. ``report.timing()`` sets each stage's predicted seconds against the measured ones.

The stages, each an internal module of :mod:`rfgp.recipes`: units and start, search, model
choice, refinement and the local stage, the Laplace average, calibration and refit.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Optional

import torch

from rfgp._validation import check_evidence_rows
from rfgp.inference._blocks import kd_blocks
from rfgp.inference._feature_gp import RandomFeatureGP
from rfgp.inference._selection import ConvergenceWarning
from rfgp.recipes._laplace import laplace_stage
from rfgp.recipes._options import RegressionOptions
from rfgp.recipes._refine import local_stage, record_search, refine_stage
from rfgp.recipes._refit import refit_stage
from rfgp.recipes._report import FitReport
from rfgp.recipes._schedule import plan_regression
from rfgp.recipes._search import two_path_search
from rfgp.recipes._select import choose_bound
from rfgp.recipes._stage import RecipeContext
from rfgp.recipes._start import initial_hyperparameters, search_model
from rfgp.recipes._units import (
    check_variances_representable,
    column_unit,
    target_unit,
)

__all__ = ["fit_auto"]


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
    ctx = _prepare(x, y, opts, report)
    with ctx.progress(7, "fit_auto"):
        _search_stage(ctx)
        choose_bound(ctx)
        refine_stage(ctx)
        local_stage(ctx)
        laplace_stage(ctx)
        gp = refit_stage(ctx)
    _report_in_data_units(ctx)
    return gp


def _prepare(x: Any, y: Any, opts: RegressionOptions,
             report: Optional[FitReport]) -> RecipeContext:
    """Units, schedule and the search's starting model."""
    x, y = check_evidence_rows(x, y, "fit_auto")
    if report is not None and not isinstance(report, FitReport):
        raise TypeError(f"report must be a FitReport instance or None, got {report!r}")
    x_unit, y_unit = column_unit(x), target_unit(y)
    check_variances_representable(y_unit, x.dtype)
    report = report if report is not None else FitReport()
    report.clear()  # a report passed again describes this fit only
    schedule = plan_regression(x.shape[0], x.shape[1], opts)
    report.schedule, report.num_features = schedule, schedule.num_features
    report.search_features, report.subsample = schedule.search_features, schedule.subsample
    report.refine_rows = schedule.refine_rows
    ctx = RecipeContext(opts, schedule, report, x / x_unit, y / y_unit, x, y, x_unit, y_unit,
                        torch.Generator().manual_seed(opts.seed))
    start = initial_hyperparameters(ctx.x, ctx.y, generator=ctx.generator)
    report.initial = {"lengthscale": start["lengthscale"] * x_unit,
                      "outputscale": start["outputscale"] * y_unit**2,
                      "noise": start["noise"] * y_unit**2}
    ctx.model = search_model(schedule.search_features, start, opts.spectral, opts.seed, ctx.x)
    return ctx


def _search_stage(ctx: RecipeContext) -> None:
    """The evidence search on the subsample, with the schedule's evidence, along the two
    paths of :func:`~rfgp.recipes._search.two_path_search`."""
    opts = ctx.options
    with ctx.stage("search"):
        xs, ys, ctx.rows = ctx.head(ctx.schedule.subsample)
        ctx.evidence = ctx.schedule.search_evidence
        ctx.blocks = kd_blocks(xs, opts.exact_rows) if ctx.evidence == "blocks" else None
        result = two_path_search(ctx.model, xs, ys, opts.max_iterations, opts.tolerance,
                                 ctx.evidence != "features", ctx.blocks)
        record_search(ctx, "search", result, ctx.evidence)
    if not result.converged:
        warnings.warn(
            f"fit_auto: the evidence search did not converge in {opts.max_iterations} L-BFGS "
            "iterations; increase max_iterations",
            ConvergenceWarning,
        )


def _report_in_data_units(ctx: RecipeContext) -> None:
    """The search's records, from its units (inputs over ``x_unit``, targets over ``y_unit``)
    to the data's: bounds times the input units, log densities per datum less
    ``log(y_unit)``."""
    report, shift = ctx.report, math.log(ctx.y_unit)
    if ctx.bound is not None:
        report.lengthscale_bound = ctx.bound * ctx.x_unit
    report.losses = {stage: [loss + shift for loss in losses]
                     for stage, losses in report.losses.items()}
    report.local_losses = [loss + shift for loss in report.local_losses]
    for key in ("unbounded", "bounded"):
        if key in report.cv_scores:
            report.cv_scores[key] -= shift
