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

with :func:`~rfgp.recipes._search.dirichlet_objective` as the objective (the stages
``search``, ``refine`` and ``refit``; see :func:`fit_classifier_auto`). The final model has the
schedule's ``D`` features on all rows, and its outputscale is its own: the factor :math:`a` on
the search's outputscale that maximises the final model's evidence
:math:`\log p(\tilde Y \mid a)`, exactly, from one eigendecomposition per class of its
weighted Gram matrix
(:func:`~rfgp.classification._calibration.maximize_outputscale_evidence`).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Callable, Optional

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
from rfgp.classification._inputs import check_inputs, encode_labels
from rfgp.inference import (
    MAX_WEIGHT_FEATURES,
    ConvergenceWarning,
    classifier_fit_cost,
    feature_evidence_cost,
    largest_features_within,
)
from rfgp.likelihoods import DirichletLikelihood
from rfgp.recipes._options import ClassifierOptions
from rfgp.recipes._schedule import (
    FINAL_SHARE,
    MIN_FEATURES,
    SEARCH_EVALUATIONS,
    Schedule,
    default_budget,
    refinement_rows,
)
from rfgp.recipes._search import dirichlet_objective, record_search, search_evidence
from rfgp.recipes._stage import RecipeData, Stage, StageTimer
from rfgp.recipes._start import make_ard_kernel

__all__ = ["fit_classifier_auto", "plan_classifier"]


def plan_classifier(num_rows: int, input_dim: int, num_classes: int,
                    options: ClassifierOptions) -> Schedule:
    """The schedule of :func:`fit_classifier_auto` (see :mod:`~rfgp.recipes._schedule`): the
    final ``D`` from :data:`~rfgp.recipes._schedule.FINAL_SHARE` of the budget, the search on
    the subsample, the refinement's rows from its share.

    Example:
        >>> plan_classifier(20000, 10, 10, ClassifierOptions().checked()).num_features
        1024
    """
    opts, n = options, num_rows
    budget = opts.time_budget if opts.time_budget is not None else default_budget(n)
    total = budget * opts.machine_rate
    features = opts.num_features
    if features is None:
        features = largest_features_within(
            lambda size: classifier_fit_cost(n, size, num_classes), FINAL_SHARE * total,
            MIN_FEATURES, MAX_WEIGHT_FEATURES)
    search_features = min(opts.search_features, features)
    subsample = min(n, opts.subsample)
    # C weighted Gram corrections per evaluation on top of the regression's cost.
    per_row = num_classes / 4 + 1

    def search_cost(rows: int) -> float:
        return feature_evidence_cost(rows, search_features, input_dim) * per_row

    predicted = {"search": SEARCH_EVALUATIONS * search_cost(subsample) / opts.machine_rate}
    refine_rows, refine = refinement_rows(n, subsample, opts, search_cost, total)
    if refine_rows:
        predicted["refine"] = refine / opts.machine_rate
    predicted["refit"] = classifier_fit_cost(n, features, num_classes) / opts.machine_rate
    return Schedule(budget, opts.machine_rate, subsample, search_features, "features",
                    refine_rows, 0, False, features, predicted)


def fit_classifier_auto(x: Any, labels: Any, *, report: Optional[ClassifierFitReport] = None,
                        **options: Any) -> DirichletGPClassifier:
    r"""Fit a :class:`~rfgp.DirichletGPClassifier` by the default recipe.

    The Dirichlet transform turns ``C``-class labels into ``C`` GP regressions with a fixed
    noise per point and class on centred targets; the recipe learns the shared ARD
    lengthscales and the outputscale by maximising the evidence of the ``C`` regressions, with
    the same units, start, search and refinement as :func:`~rfgp.recipes.fit_auto`, and fits
    the classifier with the schedule's ``D`` features on all rows, its outputscale chosen by
    that ``D``-feature model's own evidence (the factor on the search's outputscale that
    maximises :math:`\sum_c \log N(\tilde y_c; 0, a s^2 K + S_c)`, exactly). The noise is the
    transform's. ``alpha_epsilon`` is kept unless ``select_alpha=True``: then it is chosen
    on a validation split at the found hyperparameters
    (:meth:`~rfgp.DirichletGPClassifier.select_alpha`) before the outputscale is calibrated.

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
        ``outputscale`` and the final model's ``negative_log_evidence`` per datum and class.

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
            timer.run(stage, data, searched, report)
        return timer.run(_STAGES[-1], data, searched, report)


@dataclass(frozen=True)
class _Dirichlet:
    """What the classifier's stages hand on: the kernel they search (changed in place), the
    transform's noise ``(N, C)``, and the labels as given."""

    kernel: ScaleKernel
    noise: Tensor
    labels: Any


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
    order (none where that is 0), ``iterations(options)`` L-BFGS iterations."""

    def run(data: RecipeData, state: _Dirichlet, report: ClassifierFitReport) -> Any:
        count = rows(data.schedule)
        if not count:
            return None
        xs, targets, picked = data.head(count)
        noise = state.noise if picked is None else state.noise[picked]
        objective = dirichlet_objective(state.kernel, xs, targets, noise)
        result = search_evidence(objective, iterations(data.options), data.options.tolerance)
        record_search(report, name, result, "features")
        if name == "search" and not result.converged:
            warnings.warn(
                f"fit_classifier_auto: the evidence search did not converge in "
                f"{iterations(data.options)} L-BFGS iterations; increase max_iterations",
                ConvergenceWarning,
            )
        return state

    return run


def _refit(data: RecipeData, state: _Dirichlet,
           report: ClassifierFitReport) -> DirichletGPClassifier:
    opts, kernel = data.options, state.kernel
    lengthscale = kernel.base_kernel.lengthscale.detach().reshape(-1) * data.x_unit
    report.lengthscale = lengthscale
    # The same frequencies as the search's kernel when num_features == search_features.
    final = make_ard_kernel(data.schedule.num_features, data.input_dim, opts.spectral,
                            seed=opts.seed, dtype=data.x.dtype).to(data.x.device)
    final.base_kernel.lengthscale = lengthscale.reshape(1, -1)
    final.outputscale = kernel.outputscale.detach().clone()
    model = DirichletGPClassifier(
        final, alpha_epsilon=opts.alpha_epsilon, num_classes=opts.num_classes,
        centre=True, outputscale=1.0, num_samples=opts.num_samples, seed=opts.seed,
    )
    with torch.no_grad():
        if opts.select_alpha:
            model.select_alpha(data.x_data, state.labels, seed=opts.seed, refit=False)
        _calibrate_outputscale(data, model, state.labels, report)
        model.fit(data.x_data, state.labels)
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


#: The classifier's stages, in the order they run (their costs are
#: :func:`plan_classifier`'s).
_STAGES = (
    Stage("search", _dirichlet_search("search", lambda s: s.subsample,
                                      lambda o: o.max_iterations)),
    Stage("refine", _dirichlet_search("refine", lambda s: s.refine_rows,
                                      lambda o: o.refine_iterations)),
    Stage("refit", _refit),
)
