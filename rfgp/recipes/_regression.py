r""":func:`fit_auto`: the default regression recipe, a budgeted pipeline of stages.

The stages (:data:`STAGES`), each an internal module of :mod:`rfgp.recipes` of the stage's
name: ``search``, ``select`` (the bound's cross-validated choice), ``refine``, ``local``,
``laplace`` (the Laplace average) and ``refit`` (calibration and the final fit), after the
units and the start (:func:`_prepare`). What each does, and how the budget is shared among
them, is :mod:`rfgp.recipes`' overview.
"""

from __future__ import annotations

import dataclasses
import math
import time
import warnings
from typing import Any, Optional

import torch

from rfgp._data import ArraySource, DataSource, draw_rows, open_source
from rfgp._initial import start_from_moments
from rfgp._parameters import PARAMETER_CONSTRAINTS
from rfgp._report import FitReport
from rfgp._units import (
    check_variances_representable,
    column_unit_of,
    unit_of_rms,
)
from rfgp._validation import check_evidence_rows, validate_parameters
from rfgp._working_set import (
    MEDIAN_ROWS,
    agreed,
    longest_head,
    median_rows,
    moments,
    working_set,
)
from rfgp.inference import RandomFeatureGP
from rfgp.inference._prior_mean import adopt_prior_mean
from rfgp.recipes._laplace import LAPLACE
from rfgp.recipes._local import LOCAL
from rfgp.recipes._options import RegressionOptions
from rfgp.recipes._refine import REFINE
from rfgp.recipes._refit import REFIT, REPLAN_SHARE, replan_final
from rfgp.recipes._scale import booked_scale_cost
from rfgp.recipes._schedule import Schedule, plan_stages
from rfgp.recipes._search import SEARCH
from rfgp.recipes._select import SELECT
from rfgp.recipes._stage import RecipeData, Searched, StageTimer
from rfgp.recipes._start import search_model

__all__ = ["STAGES", "fit_auto", "plan_regression", "replanned"]

#: The stages of :func:`fit_auto`, in the order they run (each plans its cost at its own
#: place in the schedule): every one but the last hands on a
#: :class:`~rfgp.recipes._stage.Searched`; the last returns the fitted model.
STAGES = (SEARCH, SELECT, REFINE, LOCAL, LAPLACE, REFIT)


def plan_regression(num_rows: int, input_dim: int, options: RegressionOptions, *,
                    streamed: bool = False) -> Schedule:
    """The schedule of :func:`fit_auto` for ``num_rows`` rows of ``input_dim`` inputs under
    checked :class:`~rfgp.recipes.RegressionOptions`: :data:`STAGES`' costs booked in their
    planning order (:func:`~rfgp.recipes._schedule.plan_stages`). ``streamed``: the rows are
    read from a data source (a memory-map, chunks, process shards), so that a CG fit passes
    over them once per product. The plan's ``D`` depends on the machine through its measured
    multiply-add rate and, on the CG path, its memory (features beyond a quarter of it are
    recomputed at every pass, and the dense route of its variances needs room for ``B``).
    On the CG path the final fit books its model's first predictive variances too
    (:func:`~rfgp.recipes._final_cost.variance_cost`), about as costly as the fit itself: 8,192
    features in weight space for the example's default budget on a machine of 23 GB, 15,360
    by CG at twice that budget.

    Example:
        >>> s = plan_regression(40000, 9, RegressionOptions().checked())
        >>> s.subsample, s.search_evidence
        (2000, 'features')
        >>> larger = plan_regression(40000, 9, RegressionOptions(time_budget=480).checked())
        >>> larger.num_features > 8192, larger.final_solve
        (True, 'cg')
        >>> plan_regression(300, 4, RegressionOptions().checked()).search_evidence
        'exact'
    """
    return plan_stages(num_rows, input_dim, options, STAGES, streamed)


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

    The first search chooses a constant prior mean per target column with the other
    hyperparameters (``prior_mean="constant"``, the default; ``report.prior_mean``): the
    model's mean far from the data, where its evidence puts it rather than at the targets'
    average; with ``prior_mean="zero"`` it is zero (centre the targets first). Inputs need no
    scaling: the search runs in units near each column's spread.

    **Rows not in memory.** ``x`` and ``y`` may be numpy arrays or memory-maps
    (``np.load(path, mmap_mode="r")``), or ``x`` a re-iterable source of ``(x, y)`` chunks (a
    ``DataLoader``, a list, a callable returning a fresh iterator) with ``y=None``. The search
    stages then read a seeded draw of rows (the rows an in-memory fit reads, so the model is
    the same) and the final fit streams every row in chunks: memory
    :math:`O(\text{chunk} \cdot D + D^2)` beside the search's rows on the weight-space path,
    :math:`O(\text{chunk} \cdot D + D k)` on the CG path, whose every product (``k``
    columns) is one pass over the rows.
    With ``distributed=True`` under ``torchrun`` each process passes its own shard (any of
    these forms); every process runs the recipe and returns the same model, the one a single
    process fits to the shards concatenated in rank order.

    Args:
        x: ``(N, d)`` float32 or float64 inputs: a tensor, a numpy array or memory-map, or a
            source of ``(x, y)`` chunks.
        y: ``(N,)`` or ``(N, T)`` targets (``None`` for a chunk source).
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
    started = time.perf_counter()
    opts = RegressionOptions().replace(**options).checked()
    validate_parameters(PARAMETER_CONSTRAINTS["fit_auto"], {"report": report})
    source = open_source(x, y, opts.distributed)
    if source is None:
        data, searched, report = _prepare(x, y, opts, report)
    else:
        data, searched, report = _prepare_source(source, opts, report)
    timer = StageTimer(report.seconds)
    with timer.progress(len(STAGES), "fit_auto", opts.progress):
        if opts.distributed:
            searched, data = _agree_on_stages(timer, data, searched, report, started)
        else:
            searched, data = _search_stages(timer, data, searched, report)
            data = replanned(data, report, started)
        gp = timer.run(STAGES[-1], data, searched, report)
    if searched.mean is not None:
        # The final fit was on the targets less the mean: the model that adds it back.
        report.prior_mean = searched.mean * data.y_unit
        adopt_prior_mean(gp, report.prior_mean)
    _report_in_data_units(data, searched, report)
    return gp


def _search_stages(timer: StageTimer, data: RecipeData, searched: Searched,
                   report: FitReport) -> tuple:
    """The stages before the final fit, each handing on the next :class:`Searched`; a stage
    that chose a prior mean hands the data centred by it to the stages after it:
    ``(searched, data)``."""
    for stage in STAGES[:-1]:
        centred = searched.mean is not None
        searched = timer.run(stage, data, searched, report) or searched
        if not centred and searched.mean is not None:  # the first search chose it
            data = data.centred(searched.mean)
    return searched, data


def replanned(data: RecipeData, report: FitReport, started: float) -> RecipeData:
    """``data`` with its schedule's final ``D`` re-planned from the seconds left since
    ``started`` (:func:`~rfgp.recipes._refit.replan_final`), at the options' rate, or the
    lower rate the timed stages achieved where they ran slower than forecast (the options'
    rate times their predicted over their measured seconds).

    A stage that ran faster than forecast is no evidence of a faster machine: its L-BFGS runs
    stop when they converge, so it did less work, and the seconds it saved are among those
    left already. Taking its ratio as a rate counted them twice (a 38 s budget on 7,373 rows
    of 32 inputs ran 58 s: stages done in half their forecast doubled the rate, and the
    final fit's 43 s were forecast at 20 s). A faster machine is told by ``machine_rate``
    (:func:`~rfgp.inference.measure_machine_rate`)."""
    schedule = data.schedule
    timed = [name for name in report.seconds if name in schedule.predicted]
    measured = sum(report.seconds[name] for name in timed)
    predicted = sum(schedule.predicted[name] for name in timed)
    rate = data.options.machine_rate
    if measured > 0 and predicted > 0:
        rate *= min(1.0, predicted / measured)
    left = schedule.budget - (time.perf_counter() - started)
    # Rows behind a source (none in memory) are read again at every pass of the CG path.
    again = replan_final(schedule, data.num_rows, data.input_dim, data.options, left, rate,
                         streamed=data.source is not None)
    if data.options.anytime and data.options.num_features is None:
        # What the time left pays for, in the cost model's multiply-adds: the CG path's
        # forecast (_final_cost.forecast_final) may spend it where its iterations are many.
        # (the scale search's calibrations come out of the same seconds, before it)
        allowance = max(REPLAN_SHARE * max(left, 0.0) * rate
                        - booked_scale_cost(again.settings), 0.0)
        refit = dict(again.settings.get("refit", {}), allowance=allowance)
        again = dataclasses.replace(again, settings=dict(again.settings, refit=refit))
    if again is schedule:
        return data
    report.schedule, report.num_features = again, again.num_features
    return dataclasses.replace(data, schedule=again)


def _agree_on_stages(timer: StageTimer, data: RecipeData, searched: Searched,
                     report: FitReport, started: float) -> tuple:
    """The stages before the final fit on every rank, then rank 0's results (its
    :class:`Searched`, report and re-planned schedule) adopted by all, so that every rank
    fits the same model: ``(searched, data)``."""
    def run() -> tuple:
        found = _search_stages(timer, data, searched, report)[0]
        return found, report, replanned(data, report, started).schedule

    adopted, record, schedule = agreed(run, data.source)
    if adopted.mean is not None:  # every rank centres its own rows by rank 0's mean
        data = data.centred(adopted.mean)
    seconds = report.seconds  # the timer's: the final fit's time joins rank 0's
    report.__dict__.update({key: value for key, value in record.__dict__.items()
                            if key != "seconds"})
    if record is not report:
        seconds.clear()
        seconds.update(record.seconds)
    if schedule is not data.schedule:
        data = dataclasses.replace(data, schedule=schedule)
    return adopted, data


def _prepare(x: Any, y: Any, opts: RegressionOptions,
             report: Optional[FitReport]) -> tuple:
    """Units, schedule and the search's starting model: ``(data, start, report)``."""
    x, y = check_evidence_rows(x, y, "fit_auto")
    schedule = plan_regression(x.shape[0], x.shape[1], opts)
    # The moments are summed over the chunks a memory-map's would be: the same rows give
    # the same start, whichever way they come.
    return _begin(ArraySource(x, y), opts, report, schedule, (x, y))


def _prepare_source(source: DataSource, opts: RegressionOptions,
                    report: Optional[FitReport]) -> tuple:
    """:func:`_prepare` for rows behind a source: rank 0's schedule, and the working set (the
    longest head of the random order) in memory; rows few enough for a stage to hold all of
    them are read and fitted as in memory."""
    # Rank 0's options (its seed draws the rows every rank reads) and schedule for all; the
    # CG path's every product is a pass over the rows, read again (streamed).
    opts, schedule = agreed(lambda: (opts, plan_regression(
        source.num_rows, source.input_dim, opts, streamed=True)), source)
    if longest_head(schedule) >= source.num_rows:
        return _prepare(*source.load(), opts, report)
    return _begin(source, opts, report, schedule, None)


def _begin(source: DataSource, opts: RegressionOptions, report: Optional[FitReport],
           schedule: Any, rows: Optional[tuple]) -> tuple:
    """Units and start from streamed moments, the report begun and the data, on the
    in-memory ``rows`` or, without them, on the source's working set: ``(data, start,
    report)``."""
    report = FitReport.begin(report, schedule)
    found = moments(source)
    scale = found.column_scale
    x_unit = column_unit_of(scale)
    y_unit = unit_of_rms(found.target_rms)
    check_variances_representable(y_unit, source.dtype)
    _warn_over_budget(schedule, source.num_rows, opts)
    generator = torch.Generator().manual_seed(opts.seed)
    mean_square = (found.target_rms / y_unit) ** 2
    # The draws in one order whatever holds the rows: the median's rows, then the stages'
    # (the subsample and the refinement's rows are heads of one random order).
    if rows is None:
        median = median_rows(source, generator) / x_unit
        x, y = working_set(source, longest_head(schedule), generator)
        order, held = None, source
    else:
        x, y = rows
        scale, x_unit = scale.to(x.device), x_unit.to(x.device)
        n = x.shape[0]
        picked = x if n <= MEDIAN_ROWS else x[draw_rows(n, MEDIAN_ROWS, generator).to(x.device)]
        median = picked / x_unit
        order = (draw_rows(n, longest_head(schedule), generator).to(x.device)
                 if schedule.subsample < n else None)
        held = None
    xs, ys = x / x_unit, y / y_unit
    data = RecipeData(opts, schedule, xs, ys, x, y, x_unit, y_unit, generator, order,
                      source=held, target_mean_square=mean_square,
                      target_mean=found.target_mean / y_unit)
    start = start_from_moments(scale / x_unit, median, mean_square)
    report.initial = {"lengthscale": start["lengthscale"] * x_unit,
                      "outputscale": start["outputscale"] * y_unit**2,
                      "noise": start["noise"] * y_unit**2}
    model = search_model(schedule.search_features, start, opts.spectral, opts.seed, xs)
    return data, Searched(model), report


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
