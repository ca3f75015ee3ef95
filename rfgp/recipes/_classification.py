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

with the same units, start, search and refinement as :func:`~rfgp.recipes.fit_auto`
(:func:`~rfgp.recipes._search.dirichlet_objective` as the objective). The search's model has
``search_features`` features on a subsample; the final model has the schedule's ``D`` features
on all rows, and its outputscale is its own: the factor :math:`a` on the search's
outputscale maximises the final model's evidence :math:`\log p(\tilde Y \mid a)`, exactly, from
one eigendecomposition per class of its weighted Gram matrix
(:func:`~rfgp.classification._calibration.maximize_outputscale_evidence`). The noise is the
transform's. ``alpha_epsilon`` is kept unless ``select_alpha=True``: then it is chosen on a
validation split at the found hyperparameters
(:meth:`~rfgp.DirichletGPClassifier.select_alpha`), and the outputscale is calibrated at the
chosen value.

Example:
    >>> g = torch.Generator().manual_seed(0)
    >>> x = torch.randn(200, 2, generator=g, dtype=torch.float64)
    >>> labels = (x[:, 0] * x[:, 1] > 0).long()
    >>> clf = fit_classifier_auto(x, labels, num_features=256, seed=0)
    >>> bool((clf.predict(x) == labels).double().mean() > 0.9)
    True
"""

from __future__ import annotations

import warnings
from typing import Any, Optional

import torch

from rfgp._validation import check_int
from rfgp.classification._calibration import (
    dirichlet_scale_evidence,
    maximize_outputscale_evidence,
)
from rfgp.classification._classifier import DirichletGPClassifier
from rfgp.classification._inputs import check_inputs, encode_labels
from rfgp.inference._selection import ConvergenceWarning
from rfgp.likelihoods import DirichletLikelihood
from rfgp.recipes._context import RecipeContext
from rfgp.recipes._options import ClassifierOptions
from rfgp.recipes._refine import record_search
from rfgp.recipes._report import ClassifierFitReport
from rfgp.recipes._schedule import (
    FINAL_SHARE,
    MAX_WEIGHT_FEATURES,
    MIN_FEATURES,
    SEARCH_EVALUATIONS,
    Schedule,
    default_budget,
    feature_evidence_cost,
    refinement_rows,
)
from rfgp.recipes._search import dirichlet_objective, search_evidence
from rfgp.recipes._start import initial_hyperparameters, make_ard_kernel
from rfgp.recipes._units import SUPPORTED_DTYPES, column_unit

__all__ = ["classifier_fit_cost", "fit_classifier_auto", "plan_classifier"]


def classifier_fit_cost(num_rows: int, num_features: int, num_classes: int) -> float:
    r"""Multiply-adds of the ``C``-class final fit with its calibration. The calibration
    costs the Gram matrices, :math:`2 N D^2` (the shared one and each class's correction on
    its own rows), and one eigendecomposition per class, :math:`4 C D^3`, or on fewer rows
    than features the kernel matrix :math:`N^2 D` and :math:`4 C N^3`; the fit the cheaper of
    the weight space, :math:`2 N D^2 + C D^3 / 3` (the Gram matrices again, one Cholesky
    factor per class), and the function space, :math:`N^2 D + C N^3 / 3`.

    Example:
        >>> n, d, c = 1000, 64, 3
        >>> weight = 2 * n * d**2 + 4 * c * d**3 + 2 * n * d**2 + c * d**3 / 3
        >>> classifier_fit_cost(n, d, c) == weight
        True
    """
    n, m, c = float(num_rows), float(num_features), num_classes
    if n < m:
        return n * n * m + 4 * c * n**3 + min(2 * n * m * m + c * m**3 / 3,
                                              n * n * m + c * n**3 / 3)
    return 2 * n * m * m + 4 * c * m**3 + min(2 * n * m * m + c * m**3 / 3,
                                              n * n * m + c * n**3 / 3)


def plan_classifier(num_rows: int, input_dim: int, num_classes: int,
                    options: ClassifierOptions) -> Schedule:
    """The schedule of :func:`fit_classifier_auto` (see :mod:`~rfgp.recipes._schedule`): the
    final ``D`` from :data:`~rfgp.recipes._schedule.FINAL_SHARE` of the budget, the search on
    the subsample, the refinement's rows from its share.

    Example:
        >>> plan_classifier(20000, 10, 10, ClassifierOptions().checked()).num_features
        1024
    """
    num_classes = check_int("num_classes", num_classes, minimum=1)
    opts, n = options, num_rows
    budget = opts.time_budget if opts.time_budget is not None else default_budget(n)
    total = budget * opts.machine_rate
    features = opts.num_features
    if features is None:
        features, size = MIN_FEATURES, MIN_FEATURES
        while size <= MAX_WEIGHT_FEATURES:
            if classifier_fit_cost(n, size, num_classes) <= FINAL_SHARE * total:
                features = size
            size *= 2
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
    """
    opts = ClassifierOptions().replace(**options).checked()
    ctx = _prepare(x, labels, opts, report)
    with ctx.progress(3, "fit_classifier_auto"):
        _dirichlet_search(ctx, "search", ctx.schedule.subsample, opts.max_iterations)
        if ctx.schedule.refine_rows:
            _dirichlet_search(ctx, "refine", ctx.schedule.refine_rows, opts.refine_iterations)
        return _refit(ctx, labels)


def _prepare(x: Any, labels: Any, opts: ClassifierOptions,
             report: Optional[ClassifierFitReport]) -> RecipeContext:
    x = check_inputs(x)
    if not x.is_floating_point() or x.dtype not in SUPPORTED_DTYPES:
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
    if report is not None and not isinstance(report, ClassifierFitReport):
        raise TypeError(f"report must be a ClassifierFitReport instance or None, got {report!r}")
    report = report if report is not None else ClassifierFitReport()
    report.clear()
    n, d = x.shape
    num_classes = classes.numel()
    schedule = plan_classifier(n, d, num_classes, opts)
    report.schedule, report.num_features = schedule, schedule.num_features
    report.search_features, report.subsample = schedule.search_features, schedule.subsample
    report.refine_rows = schedule.refine_rows
    # The targets and noise of the C regressions (centred over all rows), as (N, C).
    likelihood = DirichletLikelihood(num_classes, opts.alpha_epsilon, centre=True)
    targets = likelihood.set_train_labels(indices, dtype=x.dtype).transpose(0, 1).to(x.device)
    noise = likelihood.noise.transpose(0, 1).to(x)
    x_unit = column_unit(x)
    ctx = RecipeContext(opts, schedule, report, x / x_unit, targets, x, targets, x_unit, 1.0,
                        torch.Generator().manual_seed(opts.seed))
    ctx.extra["noise"] = noise
    start = initial_hyperparameters(ctx.x, targets, generator=ctx.generator)
    # The targets' mean square goes to the outputscale: the noise is the transform's.
    outputscale = targets.square().mean().clamp_min(1e-12) * torch.ones((), dtype=x.dtype)
    report.initial = {"lengthscale": start["lengthscale"] * x_unit, "outputscale": outputscale}
    kernel = make_ard_kernel(schedule.search_features, d, opts.spectral, seed=opts.seed,
                             dtype=x.dtype).to(x.device)
    kernel.base_kernel.lengthscale = start["lengthscale"].reshape(1, -1)
    kernel.outputscale = outputscale.to(x.device)
    ctx.extra["kernel"] = kernel
    return ctx


def _dirichlet_search(ctx: RecipeContext, name: str, rows: int, iterations: int) -> None:
    """One search stage of the ``C`` regressions on the first ``rows`` rows of the order."""
    with ctx.stage(name):
        xs, targets, picked = ctx.head(rows)
        noise = ctx.extra["noise"] if picked is None else ctx.extra["noise"][picked]
        objective = dirichlet_objective(ctx.extra["kernel"], xs, targets, noise)
        result = search_evidence(objective, iterations, ctx.options.tolerance)
        record_search(ctx, name, result, "features")
    if name == "search" and not result.converged:
        warnings.warn(
            f"fit_classifier_auto: the evidence search did not converge in {iterations} "
            "L-BFGS iterations; increase max_iterations",
            ConvergenceWarning,
        )


def _refit(ctx: RecipeContext, labels: Any) -> DirichletGPClassifier:
    opts, kernel = ctx.options, ctx.extra["kernel"]
    lengthscale = kernel.base_kernel.lengthscale.detach().reshape(-1) * ctx.x_unit
    ctx.report.lengthscale = lengthscale
    with ctx.stage("refit"):
        # The same frequencies as the search's kernel when num_features == search_features.
        final = make_ard_kernel(ctx.schedule.num_features, ctx.input_dim, opts.spectral,
                                seed=opts.seed, dtype=ctx.x.dtype).to(ctx.x.device)
        final.base_kernel.lengthscale = lengthscale.reshape(1, -1)
        final.outputscale = kernel.outputscale.detach().clone()
        model = DirichletGPClassifier(
            final, alpha_epsilon=opts.alpha_epsilon, num_classes=opts.num_classes,
            centre=True, outputscale=1.0, num_samples=opts.num_samples, seed=opts.seed,
        )
        with torch.no_grad():
            if opts.select_alpha:
                model.select_alpha(ctx.x_data, labels, seed=opts.seed, refit=False)
            _calibrate_outputscale(ctx, model, labels)
            model.fit(ctx.x_data, labels)
    return model


def _calibrate_outputscale(ctx: RecipeContext, model: DirichletGPClassifier,
                           labels: Any) -> None:
    """The final model's outputscale by its own evidence, at the model's ``alpha_epsilon``.

    The search's outputscale is the best for its own features on its subsample; with ``D``
    features on all rows the evidence has its maximum elsewhere (more features represent more
    of the kernel, so less of the targets is left to the noise)."""
    indices, classes = encode_labels(labels, ctx.options.num_classes)
    likelihood = DirichletLikelihood(classes.numel(), model.alpha_epsilon, centre=True)
    targets = likelihood.set_train_labels(indices, dtype=ctx.x.dtype).transpose(0, 1)
    noise = likelihood.noise.transpose(0, 1).to(ctx.x)
    evidence = dirichlet_scale_evidence(model.kernel, ctx.x_data, targets.to(ctx.x), noise)
    factor, value = maximize_outputscale_evidence(evidence)
    model.kernel.outputscale = model.kernel.outputscale * factor
    ctx.report.calibration = {
        "factor": factor,
        "outputscale": model.kernel.outputscale.detach().clone(),
        "negative_log_evidence": value / targets.numel(),
    }
