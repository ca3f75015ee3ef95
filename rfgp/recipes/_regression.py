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

from rfgp._data import ArraySource, DataSource, draw_rows
from rfgp.inference._blocks import kd_blocks
from rfgp.inference._feature_gp import RandomFeatureGP
from rfgp.inference._selection import ConvergenceWarning
from rfgp.recipes._averaging import laplace_stage
from rfgp.recipes._choice import choose_bound
from rfgp.recipes._context import RecipeContext
from rfgp.recipes._options import RegressionOptions
from rfgp.recipes._refine import local_stage, record_search, refine_stage
from rfgp.recipes._refit import refit_stage
from rfgp.recipes._report import FitReport
from rfgp.recipes._schedule import plan_regression
from rfgp.recipes._search import two_path_search
from rfgp.recipes._start import search_model, start_from_moments
from rfgp.recipes._streaming import (
    MEDIAN_ROWS,
    agree_on_stages,
    agreed,
    longest_head,
    median_rows,
    moments,
    open_source,
    working_set,
)
from rfgp.recipes._units import (
    check_recipe_data,
    check_variances_representable,
    column_unit_of,
    unit_of_rms,
)

__all__ = ["fit_auto"]


def fit_auto(x: Any, y: Any = None, *, report: Optional[FitReport] = None,
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

    **Rows not in memory.** ``x`` and ``y`` may be numpy arrays or memory-maps
    (``np.load(path, mmap_mode="r")``), or ``x`` a re-iterable source of ``(x, y)`` chunks (a
    ``DataLoader``, a list, a callable returning a fresh iterator) with ``y=None``. The search
    stages then read a seeded draw of rows (the rows an in-memory fit reads, so the model is
    the same) and the final fit streams every row in chunks: memory
    :math:`O(\text{chunk} \cdot D + D^2)` beside the search's rows, the weight-space path.
    With ``distributed=True`` under ``torchrun`` each process passes its own shard (any of
    these forms); every process runs the recipe and returns the same model, the one a single
    process fits to the shards concatenated in rank order.

    Args:
        x: ``(N, d)`` float32 or float64 inputs: a tensor, a numpy array or memory-map, or a
            source of ``(x, y)`` chunks.
        y: ``(N,)`` or ``(N, T)`` centred targets (``None`` for a chunk source).
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
    source = open_source(x, y, opts.distributed)
    if source is None:
        ctx = _prepare(x, y, opts, report)
    else:
        ctx = _prepare_source(source, opts, report)
    with ctx.progress(7, "fit_auto"):
        if opts.distributed:
            agree_on_stages(ctx, source, lambda: _stages(ctx))
        else:
            _stages(ctx)
        gp = refit_stage(ctx)
    _report_in_data_units(ctx)
    return gp


def _stages(ctx: RecipeContext) -> None:
    """The stages before the final fit."""
    _search_stage(ctx)
    choose_bound(ctx)
    refine_stage(ctx)
    local_stage(ctx)
    laplace_stage(ctx)


def _prepare(x: Any, y: Any, opts: RegressionOptions,
             report: Optional[FitReport]) -> RecipeContext:
    """Units, schedule and the search's starting model."""
    x, y = check_recipe_data(x, y, "fit_auto")
    schedule = plan_regression(x.shape[0], x.shape[1], opts)
    # The moments are summed over the chunks a memory-map's would be: the same rows give
    # the same start, whichever way they come.
    return _context(ArraySource(x, y), opts, report, schedule, (x, y))


def _prepare_source(source: DataSource, opts: RegressionOptions,
                    report: Optional[FitReport]) -> RecipeContext:
    """:func:`_prepare` for rows behind a source: rank 0's schedule, and the working set (the
    longest head of the random order) in memory; rows few enough for a stage to hold all of
    them are read and fitted as in memory."""
    if opts.solve == "cg":
        raise ValueError(
            "solve='cg' needs the rows in memory (every product reads them); rows from a "
            "memory-map, chunks or process shards are fitted by solve='weight' or 'auto'"
        )
    # Rank 0's options (its seed draws the rows every rank reads) and schedule for all.
    opts, schedule = agreed(lambda: (opts.replace(solve="weight"), plan_regression(
        source.num_rows, source.input_dim, opts.replace(solve="weight"))), source)
    if longest_head(schedule) >= source.num_rows:
        return _prepare(*source.load(), opts, report)
    return _context(source, opts, report, schedule, None)


def _context(source: DataSource, opts: RegressionOptions, report: Optional[FitReport],
             schedule: Any, rows: Optional[tuple]) -> RecipeContext:
    """The context from streamed moments (units, the start), on the in-memory ``rows`` or,
    without them, on the source's working set."""
    if report is not None and not isinstance(report, FitReport):
        raise TypeError(f"report must be a FitReport instance or None, got {report!r}")
    found = moments(source)
    scale = found.column_scale
    x_unit = column_unit_of(scale)
    y_unit = unit_of_rms(found.target_rms)
    check_variances_representable(y_unit, source.dtype)
    _warn_over_budget(schedule, source.num_rows, opts)
    report = report if report is not None else FitReport()
    report.clear()  # a report passed again describes this fit only
    report.schedule, report.num_features = schedule, schedule.num_features
    report.search_features, report.subsample = schedule.search_features, schedule.subsample
    report.refine_rows = schedule.refine_rows
    generator = torch.Generator().manual_seed(opts.seed)
    mean_square = (found.target_rms / y_unit) ** 2
    # The draws in one order whatever holds the rows: the median's rows, then the stages'.
    if rows is None:
        median = median_rows(source, generator) / x_unit
        x, y = working_set(source, longest_head(schedule), generator)
        held = None
    else:
        x, y = rows
        scale, x_unit = scale.to(x.device), x_unit.to(x.device)
        n = x.shape[0]
        rows = x if n <= MEDIAN_ROWS else x[draw_rows(n, MEDIAN_ROWS, generator).to(x.device)]
        median = rows / x_unit
        held = source
    ctx = RecipeContext(opts, schedule, report, x / x_unit, y / y_unit, x, y, x_unit, y_unit,
                        generator, source=None if held else source,
                        target_mean_square=mean_square)
    start = start_from_moments(scale / x_unit, median, mean_square)
    report.initial = {"lengthscale": start["lengthscale"] * x_unit,
                      "outputscale": start["outputscale"] * y_unit**2,
                      "noise": start["noise"] * y_unit**2}
    ctx.model = search_model(schedule.search_features, start, opts.spectral, opts.seed, ctx.x)
    return ctx


def _warn_over_budget(schedule: Any, num_rows: int, opts: RegressionOptions) -> None:
    """Warn where even the schedule's cheapest plan is predicted to overrun the budget: the
    final fit's cost grows linearly with the rows, and at its fewest features it can alone
    exceed a budget given for many rows."""
    predicted = sum(schedule.predicted.values())
    if opts.num_features is None and predicted > 1.1 * schedule.budget:
        warnings.warn(
            f"fit_auto: on {num_rows} rows the cheapest schedule is predicted to take about "
            f"{predicted:.0f} s at machine_rate={opts.machine_rate:.3g}, more than "
            f"time_budget={schedule.budget:.0f} s (its final fit, at "
            f"{schedule.num_features} features, {schedule.predicted.get('refit', 0.0):.0f} s, "
            "grows linearly with the rows); expect that time, or raise time_budget",
            UserWarning,
        )


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
