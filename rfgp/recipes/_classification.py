r""":func:`fit_classifier_auto`: the default recipe of :class:`~rfgp.DirichletGPClassifier`,
built from the regression recipe's stages.

The Dirichlet transform (:class:`~rfgp.likelihoods.DirichletLikelihood`) turns ``C``-class
labels into ``C`` GP regressions with a *fixed* noise per point and class,
:math:`\tilde\sigma^2_{nc} = \log(1/\alpha_{nc} + 1)`, on centred targets :math:`\tilde y_c`.
The recipe learns what the transform leaves free, the shared ARD lengthscales and the
outputscale :math:`s^2` of one kernel for all classes, by maximising the evidence of the ``C``
regressions,

.. math::
    \log p(\tilde Y) = \textstyle\sum_c \log N\big(\tilde y_c;\, 0,\,
        s^2 K + \mathrm{diag}(\tilde\sigma^2_{\cdot c})\big),

with :func:`~rfgp.inference._evidence_search.dirichlet_objective` as the objective (the stages
``search`` and ``refine``; see :func:`fit_classifier_auto`). The stage ``choose`` then picks
the final ``D`` and ``alpha_epsilon`` by the held-out NLL
(:func:`~rfgp.classification._held_out.held_out_nll`; the evidence cannot compare two alphas,
whose transformed targets differ), and then, at that ``D`` and alpha, the factor :math:`a` on
the search's outputscale by the same held-out NLL
(:func:`~rfgp.classification._held_out_scale.held_out_scale`). The final model (``refit``)
has that ``D``, alpha and outputscale on all rows. Without the choice
(``select_alpha=False``) its outputscale is its own: the factor that maximises the final
model's evidence :math:`\log p(\tilde Y \mid a)`, exactly, from one eigendecomposition per
class of its weighted Gram matrix
(:func:`~rfgp.classification._calibration.maximize_outputscale_evidence`).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from dataclasses import dataclass, replace
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from gpytorch.kernels import ScaleKernel
from torch import Tensor

from rfgp._initial import initial_hyperparameters
from rfgp._parameters import PARAMETER_CONSTRAINTS
from rfgp._report import ClassifierFitReport
from rfgp._units import column_unit
from rfgp._validation import EVIDENCE_DTYPES, validate_parameters
from rfgp.classification._calibration import (
    dirichlet_scale_evidence,
    maximize_outputscale_evidence,
)
from rfgp.classification._classifier import DirichletGPClassifier
from rfgp.classification._held_out import held_out_statistics
from rfgp.classification._held_out_class_map import held_out_class_map
from rfgp.classification._held_out_scale import held_out_scale
from rfgp.classification._held_out_temperature import held_out_temperature
from rfgp.classification._inputs import check_inputs, encode_labels
from rfgp.classification._selection import ALPHA_GRID
from rfgp.inference import (
    ConvergenceWarning,
    EvidenceObjective,
    dirichlet_objective,
    search_evidence,
    search_two_paths,
)
from rfgp.likelihoods import DirichletLikelihood
from rfgp.recipes._classifier_plan import (
    feature_ladder,
    plan_choice,
    plan_final_share,
    plan_refine,
    plan_search,
    validation_rows,
)
from rfgp.recipes._options import ClassifierOptions
from rfgp.recipes._schedule import (
    Schedule,
    plan_stages,
)
from rfgp.recipes._search import record_search
from rfgp.recipes._stage import RecipeData, Stage, StageTimer
from rfgp.recipes._start import make_ard_kernel

__all__ = ["feature_ladder", "fit_classifier_auto", "plan_classifier", "validation_rows"]


def plan_classifier(num_rows: int, input_dim: int, num_classes: int,
                    options: ClassifierOptions) -> Schedule:
    """The schedule of :func:`fit_classifier_auto`: its stages' plans
    (:func:`~rfgp.recipes._schedule.plan_stages`) booked on one ledger: the search on the
    subsample (its two paths where they fit :data:`TWO_PATH_SHARE` of the budget), the final
    ``D`` from :data:`~rfgp.recipes._schedule.FINAL_SHARE` of the budget, the refinement's
    rows from its share, and the held-out choice's ladder of feature counts within
    :data:`CHOICE_SHARE` (which caps the final ``D`` at its top rung).

    Example:
        >>> s = plan_classifier(20000, 10, 10, ClassifierOptions(select_alpha=False).checked())
        >>> s.num_features, list(s.predicted)
        (2048, ['search', 'refine', 'refit'])
    """
    opts = dataclasses.replace(options, num_classes=num_classes)
    return plan_stages(num_rows, input_dim, opts, _STAGES)


def fit_classifier_auto(x: Any, labels: Any, *, report: Optional[ClassifierFitReport] = None,
                        **options: Any) -> DirichletGPClassifier:
    r"""Fit a :class:`~rfgp.DirichletGPClassifier` by the default recipe.

    The Dirichlet transform turns ``C``-class labels into ``C`` GP regressions with a fixed
    noise per point and class on centred targets; the recipe learns the shared ARD
    lengthscales and the outputscale by maximising the evidence of the ``C`` regressions, with
    the same units, start and refinement as :func:`~rfgp.recipes.fit_auto` (the search
    along its two paths, L-BFGS and L-BFGS after an Adam warm-up, where the budget affords
    both, the lower loss kept). Then, with ``select_alpha`` (the default), it chooses the
    final feature count ``D`` and ``alpha_epsilon`` together by the **held-out negative log
    likelihood**: a seeded :data:`~rfgp.recipes._classifier_plan.VALIDATION_FRACTION` of
    the rows is held out, and every
    ``(D, alpha)`` of the schedule's ladder of feature counts (:func:`feature_ladder`) times
    :data:`~rfgp.classification.ALPHA_GRID` is fitted on the rest and scored by the mean
    negative log probability of the held-out labels (mean-field probabilities;
    :func:`~rfgp.classification._held_out.held_out_nll`, one pass over the rows per ``D``).
    The evidence cannot make this choice: the transformed targets and their noise change with
    ``alpha``, so evidences at two alphas are densities of different data. The ladder holds
    every rung a smaller budget holds, the split does not depend on the budget, and the search
    stages plan with at most the default budget, so from the default budget up the held-out
    NLL of the choice never rises with the budget (below it, where the search stages ran
    alike).
    At the chosen ``(D, alpha)`` the same held-out NLL then chooses the factor :math:`a` on the
    search's outputscale (golden section in :math:`\log a`, one Cholesky factor per class and
    evaluation on the choice's Gram matrices, stopped where a step gains less than the paired
    standard error of the held-out NLL difference, and the factor nearest 1 kept among those
    within one such error of the lowest;
    :func:`~rfgp.classification._held_out_scale.held_out_scale`): the evidence of the
    transformed targets is the density of their Gaussian stand-ins, not the predictive
    probability of the labels that the classifier is judged by and that chose ``D`` and
    ``alpha``; on MAGIC the evidence's factor was 0.16 and the model it returned was not the
    one the choice had scored. At that ``(D, alpha, a)`` the held-out NLL then chooses the
    probabilities' temperature :math:`T` (:math:`\mathbb{E}[\mathrm{softmax}(f/T)]`, its
    maximum-likelihood value on the validation rows' latent moments, computed once, where
    the rows bracket it;
    :func:`~rfgp.classification._held_out_temperature.held_out_temperature`): the Dirichlet
    transform caps the latent means a fit reaches (on MAGIC the top bin's probabilities stayed
    at 0.957 where its rows were 0.987 of one class), and no outputscale or ``alpha`` removes
    that cap without moving the plateau with it. The cap differs between classes of unequal
    frequency, so a per-class affine map of the latents,
    :math:`\mathbb{E}[\mathrm{softmax}(s \odot f + o)]` (``2C - 1`` numbers, maximum
    likelihood on the validation rows), replaces the temperature where five-fold
    cross-validation on those rows gives it the lower NLL
    (:func:`~rfgp.classification._held_out_class_map.held_out_class_map`; on adult it
    brings the test ECE from 0.022 to 0.017, on 26-class letter it overfits and the
    temperature stays). Last, the classifier is fitted on all rows at the chosen
    ``(D, alpha, a)`` and given ``T`` or map. ``select_alpha=False`` keeps
    ``alpha_epsilon``, the schedule's ``D`` and ``T = 1``, and the outputscale is the final
    model's own evidence's (the factor on the search's outputscale that maximises
    :math:`\sum_c \log N(\tilde y_c; 0, a s^2 K + S_c)`, exactly). The noise is the transform's.

    Args:
        x: ``(N, d)`` float32 or float64 inputs (no scaling needed).
        labels: ``(N,)`` integer class ids (see :func:`~rfgp.classification.encode_labels`).
        report: a :class:`~rfgp.recipes.ClassifierFitReport` to fill in (cleared first).
        **options: any of :class:`~rfgp.recipes.ClassifierOptions` (``spectral``,
            ``num_features``, ``alpha_epsilon``, ``select_alpha``, ``time_budget``, ``seed``,
            ...).

    Returns:
        The fitted classifier; its kernel is a ``ScaleKernel`` around an ARD
        :class:`~rfgp.kernels.FourierFeatureKernel` with orthogonal frequencies (the
        calibrated outputscale in the kernel, ``outputscale=1.0`` in the classifier). The
        report's ``calibration`` holds the ``factor`` on the search's outputscale, the
        ``outputscale`` and, by the choice, its ``held_out_nll``, or, without it, the final
        model's ``negative_log_evidence`` per datum and class; its ``choice`` the held-out
        NLL of every ``(D, alpha)`` and the pair chosen (also the classifier's
        ``selection_``), the ``outputscale_factor``, its ``scaled_nll`` and the
        ``scale_evaluations`` (factor: NLL), the ``temperature``, its ``temperature_nll``
        and the ``temperature_evaluations`` (temperature: NLL), the ``class_map`` (``None``
        or the ``(s, o)`` the classifier carries, with its temperature then 1), its
        ``class_map_nll`` and the cross-validated NLLs ``class_map_cv_nll``
        (``{"temperature": ..., "class_map": ...}``).

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> x = torch.randn(200, 2, generator=g, dtype=torch.float64)
        >>> labels = (x[:, 0] * x[:, 1] > 0).long()
        >>> clf = fit_classifier_auto(x, labels, num_features=256, seed=0)
        >>> bool((clf.predict(x) == labels).double().mean() > 0.9)
        True
    """
    opts = ClassifierOptions().replace(**options).checked()
    validate_parameters(PARAMETER_CONSTRAINTS["fit_classifier_auto"], {"report": report})
    data, searched, report = _prepare(x, labels, opts, report)
    timer = StageTimer(report.seconds)
    with timer.progress(len(_STAGES), "fit_classifier_auto", opts.progress):
        for stage in _STAGES[:-1]:
            searched = timer.run(stage, data, searched, report) or searched
        return timer.run(_STAGES[-1], data, searched, report)


@dataclass(frozen=True)
class _Dirichlet:
    """What the classifier's stages hand on: the kernel they search (changed in place), the
    transform's noise ``(N, C)``, the labels as given, and, after the held-out choice, the
    final feature count, ``alpha_epsilon`` and the factor on the search's outputscale."""

    kernel: ScaleKernel
    noise: Tensor
    labels: Any
    num_features: Optional[int] = None
    alpha_epsilon: Optional[float] = None
    selection: Tuple[Dict[str, Any], ...] = ()
    outputscale_factor: Optional[float] = None
    temperature: Optional[float] = None
    class_map: Optional[Tuple[Tensor, Tensor]] = None


def _prepare(x: Any, labels: Any, opts: ClassifierOptions,
             report: Optional[ClassifierFitReport]) -> tuple:
    x = check_inputs(x)
    if not x.is_floating_point() or x.dtype not in EVIDENCE_DTYPES:
        raise TypeError(
            f"fit_classifier_auto: x must be float32 or float64, got {x.dtype}; convert with "
            "x.double()"
        )
    x = x.detach()
    if x.shape[0] == 0:
        raise ValueError("x must have at least one row, got shape (0, d)")
    indices, classes = encode_labels(labels, opts.num_classes)
    if indices.shape[0] != x.shape[0]:
        raise ValueError(
            f"labels must have one entry per row of x ({x.shape[0]}), got {indices.shape[0]}"
        )
    n, d = x.shape
    num_classes = classes.numel()
    schedule = plan_classifier(n, d, num_classes, opts)
    report = ClassifierFitReport.begin(report, schedule)
    # The targets and noise of the C regressions (centred over all rows), as (N, C).
    likelihood = DirichletLikelihood(num_classes, opts.alpha_epsilon, centre=True)
    targets = likelihood.set_train_labels(indices, dtype=x.dtype).transpose(0, 1).to(x.device)
    noise = likelihood.noise.transpose(0, 1).to(x)
    x_unit = column_unit(x)
    generator = torch.Generator().manual_seed(opts.seed)
    start = initial_hyperparameters(x / x_unit, targets, generator=generator)
    # The subsample and the refinement's rows are heads of one random order drawn after the
    # start.
    order = (torch.randperm(n, generator=generator).to(x.device)
             if schedule.subsample < n else None)
    data = RecipeData(opts, schedule, x / x_unit, targets, x, targets, x_unit, 1.0, generator,
                      order)
    # The targets' mean square goes to the outputscale: the noise is the transform's.
    outputscale = targets.square().mean().clamp_min(1e-12) * torch.ones((), dtype=x.dtype)
    report.initial = {"lengthscale": start["lengthscale"] * x_unit, "outputscale": outputscale}
    kernel = make_ard_kernel(schedule.search_features, d, opts.spectral, seed=opts.seed,
                             dtype=x.dtype).to(x.device)
    kernel.base_kernel.lengthscale = start["lengthscale"].reshape(1, -1)
    kernel.outputscale = outputscale.to(x.device)
    return data, _Dirichlet(kernel, noise, labels), report


def _dirichlet_search(name: str, rows: Callable[[Schedule], int],
                      iterations: Callable[[Any], int]) -> Callable[..., Any]:
    """A search stage of the ``C`` regressions on the first ``rows(schedule)`` rows of the
    order (none where that is 0), ``iterations(options)`` L-BFGS iterations along the
    schedule's ``search_paths`` (:func:`~rfgp.inference._evidence_search.search_two_paths`; the
    refinement continues along one)."""

    def run(data: RecipeData, state: _Dirichlet, report: ClassifierFitReport) -> Any:
        count = rows(data.schedule)
        if not count:
            return None
        xs, targets, picked = data.head(count)
        noise = state.noise if picked is None else state.noise[picked]
        limit, tolerance = iterations(data.options), data.options.tolerance

        def objective() -> EvidenceObjective:
            return dirichlet_objective(state.kernel, xs, targets, noise)

        if name == "search" and data.schedule.settings.get("search_paths", 1) == 2:
            params = list(state.kernel.parameters())
            result = search_two_paths(objective, lambda: [p.detach().clone() for p in params],
                                      lambda saved: _put(params, saved), limit, tolerance)
        else:
            result = search_evidence(objective(), limit, tolerance)
        record_search(report, name, result, "features")
        if name == "search" and not result.converged:
            warnings.warn(
                f"fit_classifier_auto: the evidence search did not converge in "
                f"{limit} L-BFGS iterations; increase max_iterations",
                ConvergenceWarning,
            )
        return state

    return run


def _put(params: List[Tensor], values: List[Tensor]) -> None:
    with torch.no_grad():
        for param, value in zip(params, values):
            param.copy_(value)


def _final_kernel(data: RecipeData, state: _Dirichlet, num_features: int) -> ScaleKernel:
    """The search's hyperparameters (in the data's units) on ``num_features`` features of the
    recipe's seed (the same frequencies as the search's kernel at its ``D``)."""
    kernel = make_ard_kernel(num_features, data.input_dim, data.options.spectral,
                             seed=data.options.seed, dtype=data.x.dtype).to(data.x.device)
    lengthscale = state.kernel.base_kernel.lengthscale.detach().reshape(-1) * data.x_unit
    kernel.base_kernel.lengthscale = lengthscale.reshape(1, -1)
    kernel.outputscale = state.kernel.outputscale.detach().clone()
    return kernel


def _choose(data: RecipeData, state: _Dirichlet, report: ClassifierFitReport) -> Any:
    """The held-out choice of ``(D, alpha_epsilon)`` (see :func:`fit_classifier_auto`): the
    lowest held-out NLL over the ladder times the alpha grid, the first on ties (ascending
    ``D``, then grid order)."""
    opts, schedule = data.options, data.schedule
    if not opts.select_alpha:
        return None
    indices, classes = encode_labels(state.labels, opts.num_classes)
    indices = indices.to(data.x.device)
    # A split of its own seed, drawn before nothing else: the same at every budget.
    order = torch.randperm(data.num_rows, generator=torch.Generator().manual_seed(opts.seed))
    held = schedule.settings["validation_rows"]
    valid, train = order[:held].to(data.x.device), order[held:].to(data.x.device)
    rungs, table, kept = schedule.settings["choice_features"], [], None
    with torch.no_grad():
        for size in rungs:
            statistics = held_out_statistics(
                _final_kernel(data, state, size), data.x_data[train], indices[train],
                data.x_data[valid], indices[valid], classes.numel())
            per_row = [statistics.row_nll(alpha) for alpha in ALPHA_GRID]  # (N_v,) each
            table.append(torch.stack([rows.mean() for rows in per_row]))
            row = torch.nan_to_num(table[-1], nan=math.inf)
            # Only the best rung's Gram matrices (and per-row NLLs) are kept, for the
            # outputscale's choice.
            if kept is None or float(row.min()) < kept[0]:
                kept = (float(row.min()), statistics, per_row)
    table = torch.stack(table)  # (rungs, alphas)
    scores = torch.where(torch.isfinite(table), table, torch.full_like(table, math.inf))
    best = int(torch.argmin(scores.reshape(-1)))  # the first of equal minima
    size, alpha = rungs[best // len(ALPHA_GRID)], ALPHA_GRID[best % len(ALPHA_GRID)]
    scale = held_out_scale(kept[1], alpha, at_one=kept[2][best % len(ALPHA_GRID)])
    with torch.no_grad():
        means, variances = kept[1].moments(alpha, scale.factor)
    temperature = held_out_temperature(means, variances, kept[1].labels_valid)
    class_map = held_out_class_map(means, variances, kept[1].labels_valid, temperature)
    chosen_map = None if class_map.scales is None else (class_map.scales, class_map.offsets)
    rows = tuple({"num_features": rung, "alpha_epsilon": grid_alpha,
                  "mnll": float(table[i, j]), "selected": i * len(ALPHA_GRID) + j == best}
                 for i, rung in enumerate(rungs) for j, grid_alpha in enumerate(ALPHA_GRID))
    report.choice = {"features": rungs, "alphas": ALPHA_GRID, "nll": table,
                     "num_features": size, "alpha_epsilon": alpha,
                     "validation_rows": held, "outputscale_factor": scale.factor,
                     "scaled_nll": scale.nll, "scale_evaluations": scale.evaluations,
                     "temperature": temperature.temperature,
                     "temperature_nll": temperature.nll,
                     "temperature_evaluations": temperature.evaluations,
                     "class_map": chosen_map, "class_map_nll": class_map.nll,
                     "class_map_cv_nll": class_map.cv_nll}
    report.num_features = size
    return replace(state, num_features=size, alpha_epsilon=alpha, selection=rows,
                   outputscale_factor=scale.factor, temperature=temperature.temperature,
                   class_map=chosen_map)


def _refit(data: RecipeData, state: _Dirichlet,
           report: ClassifierFitReport) -> DirichletGPClassifier:
    opts = data.options
    size = state.num_features or data.schedule.num_features
    alpha = state.alpha_epsilon if state.alpha_epsilon is not None else opts.alpha_epsilon
    final = _final_kernel(data, state, size)
    report.lengthscale = final.base_kernel.lengthscale.detach().reshape(-1).clone()
    model = DirichletGPClassifier(
        final, alpha_epsilon=alpha, num_classes=opts.num_classes,
        centre=True, outputscale=1.0, num_samples=opts.num_samples, seed=opts.seed,
    )
    model.selection_ = [dict(row) for row in state.selection]
    with torch.no_grad():
        if state.outputscale_factor is None:
            _calibrate_outputscale(data, model, state.labels, report)
        else:  # chosen with D and alpha by the held-out NLL
            model.kernel.outputscale = model.kernel.outputscale * state.outputscale_factor
            report.calibration = {"factor": state.outputscale_factor,
                                  "outputscale": model.kernel.outputscale.detach().clone(),
                                  "held_out_nll": report.choice["scaled_nll"]}
        model.fit(data.x_data, state.labels)
    if state.class_map is not None:  # it holds the scale: the temperature is its start
        model.class_map = state.class_map
    elif state.temperature is not None:  # chosen last by the held-out NLL
        model.temperature = state.temperature
    return model


def _calibrate_outputscale(data: RecipeData, model: DirichletGPClassifier, labels: Any,
                           report: ClassifierFitReport) -> None:
    """The final model's outputscale by its own evidence, at the model's ``alpha_epsilon``.

    The search's outputscale is the best for its own features on its subsample; with ``D``
    features on all rows the evidence has its maximum elsewhere (more features represent more
    of the kernel, so less of the targets is left to the noise)."""
    indices, classes = encode_labels(labels, data.options.num_classes)
    likelihood = DirichletLikelihood(classes.numel(), model.alpha_epsilon, centre=True)
    targets = likelihood.set_train_labels(indices, dtype=data.x.dtype).transpose(0, 1)
    noise = likelihood.noise.transpose(0, 1).to(data.x)
    evidence = dirichlet_scale_evidence(model.kernel, data.x_data, targets.to(data.x), noise)
    factor, value = maximize_outputscale_evidence(evidence)
    model.kernel.outputscale = model.kernel.outputscale * factor
    report.calibration = {
        "factor": factor,
        "outputscale": model.kernel.outputscale.detach().clone(),
        "negative_log_evidence": value / targets.numel(),
    }


#: The classifier's stages, in the order they run, with their plans (:func:`plan_classifier`).
_STAGES = (
    Stage("search", _dirichlet_search("search", lambda s: s.subsample,
                                      lambda o: o.max_iterations), ((0, plan_search),)),
    Stage("refine", _dirichlet_search("refine", lambda s: s.refine_rows,
                                      lambda o: o.refine_iterations), ((20, plan_refine),)),
    Stage("choose", _choose, ((30, plan_choice),)),
    Stage("refit", _refit, ((10, plan_final_share),)),
)
