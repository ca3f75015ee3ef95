r"""The default fitting recipe of :class:`~rfgp.DirichletGPClassifier`.

The Dirichlet transform (:class:`~rfgp.likelihoods.DirichletLikelihood`) turns ``C``-class
labels into ``C`` GP regressions with a *fixed* noise per point and class,
:math:`\tilde\sigma^2_{nc} = \log(1/\alpha_{nc} + 1)`, on centred targets :math:`\tilde y_c`.
:func:`fit_classifier_auto` learns what the transform leaves free, the shared ARD lengthscales
and the outputscale :math:`s^2` of one kernel for all classes, by maximising the evidence of
the ``C`` regressions,

.. math::
    \log p(\tilde Y) = \textstyle\sum_c \log N\big(\tilde y_c;\, 0,\,
        s^2 K + \mathrm{diag}(\tilde\sigma^2_{\cdot c})\big),

in the steps of the regression recipe (:mod:`rfgp.inference.recipe`):

1. **Data-driven start.** Lengthscales from the inputs' spread
   (:func:`~rfgp.inference.recipe.initial_hyperparameters`, median heuristic); outputscale
   from the mean square of the centred targets.
2. **Evidence at low fidelity.** L-BFGS on :math:`-\log p(\tilde Y) / (N C)` with
   ``search_features`` orthogonal random Fourier features on a random subsample of
   ``subsample`` rows, with the gradient in closed form
   (:func:`~rfgp.inference.heteroscedastic_evidence.heteroscedastic_negative_log_evidence`:
   the ``C`` weighted Gram matrices share one :math:`Z^\top Z`).
3. **Refinement on more rows** (when ``N > subsample``): ``refine_iterations`` more L-BFGS
   iterations on ``min(N, refine_rows)`` rows.
4. **High-fidelity refit.** A :class:`~rfgp.DirichletGPClassifier` with ``num_features``
   features (default :func:`choose_classifier_features`) at the found hyperparameters is
   fitted on all rows in closed form.

The search runs on the inputs divided by :func:`~rfgp.inference.recipe.column_unit` (per
column, the power of two nearest its standard deviation; an exact division) and the
lengthscales are scaled back for step 4: L-BFGS on the raw lengthscales is not scale-free, and
inputs 1e10 times larger stopped the search at its start.

The targets are centred per class, as :class:`~rfgp.DirichletGPClassifier` does by default.
A learned constant mean per class instead (maximising the evidence over it too) raised the
log evidence by less than 0.01 nats per datum and class on wine, breast cancer and digits and
moved the test NLL by at most 0.012 (one split each, ``D = 512``), so centring is kept.

The noise is fixed by ``alpha_epsilon`` (default 0.01), which is kept unless
``select_alpha=True``: then ``alpha_epsilon`` is chosen from
:data:`~rfgp.classification.ALPHA_GRID` on a validation split at the found hyperparameters
(:meth:`~rfgp.DirichletGPClassifier.select_alpha`) and the classifier refitted.

Example:
    >>> g = torch.Generator().manual_seed(0)
    >>> x = torch.randn(200, 2, generator=g, dtype=torch.float64)
    >>> labels = (x[:, 0] * x[:, 1] > 0).long()
    >>> clf = fit_classifier_auto(x, labels, num_features=256, seed=0)
    >>> bool((clf.predict(x) == labels).double().mean() > 0.9)
    True
"""

from __future__ import annotations

import time
from typing import Any, Optional

import torch
from gpytorch.kernels import ScaleKernel
from torch import Tensor

from rfgp._validation import (
    check_bool,
    check_choice,
    check_int,
    check_positive,
    check_tensor,
)
from rfgp.classification.classifier import DirichletGPClassifier
from rfgp.classification.inputs import check_inputs, encode_labels
from rfgp.inference.heteroscedastic_evidence import heteroscedastic_negative_log_evidence
from rfgp.inference.recipe import (
    FitReport,
    column_unit,
    initial_hyperparameters,
    make_ard_kernel,
    run_search_stages,
    search_stages,
)
from rfgp.inference.selection import minimize_lbfgs
from rfgp.kernels.fourier import MATERN_NU
from rfgp.likelihoods import DirichletLikelihood

__all__ = [
    "CLASSIFIER_COST_BUDGET",
    "ClassifierFitReport",
    "choose_classifier_features",
    "dirichlet_evidence_search",
    "fit_classifier_auto",
]

_MIN_FEATURES = 512
_MAX_FEATURES = 8192
#: Operation budget of the classifier's final fit in multiply-adds (see
#: :func:`choose_classifier_features`): about ten seconds of one CPU core's double-precision
#: matrix products, a quarter of the regression budget
#: (:data:`rfgp.inference.recipe.DEFAULT_COST_BUDGET`), since the classifier's evidence search
#: and selection fit ``C`` GPs where regression fits one.
CLASSIFIER_COST_BUDGET = 2.0e11


class ClassifierFitReport(FitReport):
    """What :func:`fit_classifier_auto` did: the fields of
    :class:`~rfgp.inference.recipe.FitReport`, where ``initial`` holds the starting
    ``lengthscale`` and ``outputscale`` (the Dirichlet transform fixes the noise), ``losses`` are
    per datum and class, ``exact_stages`` is empty (the search always uses the features),
    ``lengthscale`` is the search's end and ``lengthscale_draws`` is ``None`` (the classifier's
    kernel is the one at that end, without a lengthscale average).

    Example:
        >>> x = torch.randn(120, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
        >>> report = ClassifierFitReport()
        >>> clf = fit_classifier_auto(x, (x[:, 0] > 0).long(), num_features=64, report=report)
        >>> report.num_features, sorted(report.iterations)
        (64, ['subsample'])
    """


def choose_classifier_features(
    num_data: int,
    num_classes: int,
    cost_budget: float = CLASSIFIER_COST_BUDGET,
    minimum: int = _MIN_FEATURES,
    maximum: int = _MAX_FEATURES,
) -> int:
    r"""The largest power of two ``D`` in ``[minimum, maximum]`` whose ``C``-class fit fits the
    budget.

    The ``C`` classes share one feature matrix; the fit's cost is the cheaper of the weight
    space, :math:`2 N D^2 + C D^3 / 3` (the shared Gram matrix, each class's correction on its
    own rows, one Cholesky factor per class), and the function space,
    :math:`N^2 D + C N^3 / 3`, in multiply-adds (see
    :func:`rfgp.inference.recipe.choose_num_features` for the budget's scale). ``minimum`` is
    returned when even that is over budget.

    Example:
        >>> choose_classifier_features(500, 10), choose_classifier_features(20000, 10)
        (8192, 2048)
    """
    num_data = check_int("num_data", num_data)
    num_classes = check_int("num_classes", num_classes, minimum=1)
    cost_budget = check_positive("cost_budget", cost_budget)
    minimum = check_int("minimum", minimum, minimum=2)
    maximum = check_int("maximum", maximum, minimum=minimum)
    best, d = minimum, minimum
    while d <= maximum:
        weight = 2 * num_data * d * d + num_classes * d**3 / 3
        function = num_data * num_data * d + num_classes * num_data**3 / 3
        if min(weight, function) <= cost_budget:
            best = d
        d *= 2
    return best


def dirichlet_evidence_search(
    kernel: ScaleKernel,
    x: Tensor,
    targets: Tensor,
    noise: Tensor,
    max_iterations: int = 200,
    tolerance: float = 1e-4,
):
    r"""Maximise :math:`\sum_c \log N(y_c; 0, K + \mathrm{diag}(s_{\cdot c}))` over ``kernel``'s
    trainable parameters, with the noise fixed.

    Minimises :math:`-\log p(Y) / (N C)` by ``torch.optim.LBFGS`` (strong-Wolfe line search)
    until the largest gradient entry is below ``tolerance``, the loss changes by less than
    ``tolerance**2`` or ``max_iterations`` iterations have run; a trial point that cannot be
    factorised is rejected by the line search. The kernel is left at the best point evaluated.

    Args:
        kernel: a ``ScaleKernel`` around a real random-feature kernel with one output per
            input (its parameters are changed in place).
        x: ``(N, d)`` inputs.
        targets: ``(N, C)`` targets (centred Dirichlet targets).
        noise: ``(N, C)`` fixed positive noise variances.
        max_iterations: L-BFGS iterations.
        tolerance: gradient tolerance on the loss per datum and class.

    Returns:
        ``(losses, iterations, converged)``: the loss at every evaluation, the number of L-BFGS
        iterations and whether L-BFGS stopped on its tolerances before ``max_iterations``.
    """
    if not isinstance(kernel, ScaleKernel):
        raise TypeError(f"kernel must be a ScaleKernel, got {type(kernel).__name__}")
    x = check_tensor("x", x, min_dim=2, max_dim=2, non_empty=True)
    targets = check_tensor("targets", targets, min_dim=2, max_dim=2)
    noise = check_tensor("noise", noise, min_dim=2, max_dim=2)
    if targets.shape[0] != x.shape[0] or noise.shape != targets.shape:
        raise ValueError(
            f"targets and noise must have shape (N, C) with N = {x.shape[0]} rows of x, got "
            f"targets {tuple(targets.shape)} and noise {tuple(noise.shape)}"
        )
    if not bool((noise > 0).all()):
        raise ValueError(f"noise must be positive, got minimum {float(noise.min()):.3g}")
    max_iterations = check_int("max_iterations", max_iterations)
    tolerance = check_positive("tolerance", tolerance)
    base = kernel.base_kernel
    params = [p for p in kernel.parameters() if p.requires_grad]
    scale = 1.0 / targets.numel()

    def loss() -> Tensor:
        z = base.features(x) * kernel.outputscale.sqrt()
        return heteroscedastic_negative_log_evidence(z, targets, noise) * scale

    return minimize_lbfgs(params, loss, max_iterations, tolerance)


def fit_classifier_auto(
    x: Any,
    labels: Any,
    spectral: str = "rbf",
    num_features: Optional[int] = None,
    num_classes: Optional[int] = None,
    alpha_epsilon: float = 0.01,
    select_alpha: bool = False,
    search_features: int = 512,
    subsample: int = 2000,
    refine_iterations: int = 10,
    refine_rows: int = 20000,
    max_iterations: int = 200,
    tolerance: float = 1e-4,
    cost_budget: float = CLASSIFIER_COST_BUDGET,
    num_samples: int = 1000,
    seed: int = 0,
    report: Optional[ClassifierFitReport] = None,
) -> DirichletGPClassifier:
    r"""Fit a :class:`~rfgp.DirichletGPClassifier` by the default recipe (module docstring).

    Args:
        x: ``(N, d)`` floating inputs (the fit is computed in their dtype; standardising them
            is not needed, the lengthscales start from each column's spread).
        labels: ``(N,)`` integer class ids (see :func:`~rfgp.classification.encode_labels`).
        spectral: ``"rbf"`` or a Matérn kernel (``"matern12"``, ``"matern32"``,
            ``"matern52"``).
        num_features: ``D`` of the final fit; default :func:`choose_classifier_features`
            ``(N, C, cost_budget)``.
        num_classes: ``C``; ``None`` takes the distinct labels.
        alpha_epsilon: Dirichlet concentration (fixes the noise of the transform).
        select_alpha: choose ``alpha_epsilon`` on a validation split after the search.
        search_features: ``D`` of the evidence search (at most ``num_features``).
        subsample: rows of the first search stage (all rows when ``N`` is not larger).
        refine_iterations: L-BFGS iterations on ``min(N, refine_rows)`` rows after the
            subsample stage (0: none; skipped when the subsample holds all rows).
        refine_rows: rows of the refinement.
        max_iterations: L-BFGS iterations of the subsample stage.
        tolerance: L-BFGS gradient tolerance (per datum and class).
        cost_budget: operation budget of the final fit.
        num_samples: Monte Carlo samples of the classifier's ``predict_proba``.
        seed: seed of the random frequencies, the subsample and the classifier's draws.
        report: a :class:`ClassifierFitReport` to fill in.

    Returns:
        The fitted classifier; its kernel is a ``ScaleKernel`` around an ARD
        :class:`~rfgp.kernels.FourierFeatureKernel` with orthogonal frequencies (the outputscale
        in the kernel, ``outputscale=1.0`` in the classifier).
    """
    x = check_inputs(x)
    if not x.is_floating_point():
        raise TypeError(f"x must have a floating dtype, got {x.dtype}")
    if x.shape[0] == 0:
        raise ValueError("x must have at least one row, got shape (0, d)")
    indices, classes = encode_labels(labels, num_classes)
    if indices.shape[0] != x.shape[0]:
        raise ValueError(
            f"labels must have one entry per row of x ({x.shape[0]}), got {indices.shape[0]}"
        )
    check_choice("spectral", spectral, tuple(MATERN_NU))
    alpha_epsilon = check_positive("alpha_epsilon", alpha_epsilon)
    select_alpha = check_bool("select_alpha", select_alpha)
    search_features = check_int("search_features", search_features, minimum=2)
    subsample = check_int("subsample", subsample, minimum=2)
    refine_iterations = check_int("refine_iterations", refine_iterations, minimum=0)
    refine_rows = check_int("refine_rows", refine_rows, minimum=2)
    max_iterations = check_int("max_iterations", max_iterations)
    tolerance = check_positive("tolerance", tolerance)
    seed = check_int("seed", seed, minimum=0)
    n, d = x.shape
    c = classes.numel()
    if num_features is None:
        num_features = choose_classifier_features(n, c, cost_budget)
    num_features = check_int("num_features", num_features, minimum=2)
    search_features = min(search_features, num_features)
    info = report if report is not None else ClassifierFitReport()
    info.clear()  # a report passed again describes this fit only
    info.num_features, info.search_features = num_features, search_features

    # The targets and offsets of the final fit (centred over all rows), as (N, C).
    likelihood = DirichletLikelihood(c, alpha_epsilon, centre=True)
    targets = likelihood.set_train_labels(indices, dtype=x.dtype).transpose(0, 1).to(x.device)
    noise = likelihood.noise.transpose(0, 1).to(x)
    generator = torch.Generator().manual_seed(seed)
    # The search runs on inputs over powers of two near their spreads (exact divisions), the
    # lengthscales are scaled back: see column_unit.
    x_unit = column_unit(x)
    x_search = x / x_unit
    init = initial_hyperparameters(x_search, targets, generator=generator)
    # The targets' mean square goes to the outputscale: the noise is the transform's.
    outputscale = targets.square().mean().clamp_min(1e-12) * torch.ones((), dtype=x.dtype)
    info.initial = {"lengthscale": init["lengthscale"] * x_unit, "outputscale": outputscale}

    kernel = make_ard_kernel(search_features, d, spectral, seed=seed, dtype=x.dtype).to(x.device)
    kernel.base_kernel.lengthscale = init["lengthscale"].reshape(1, -1)
    kernel.outputscale = outputscale.to(x.device)
    stages = search_stages(n, subsample, refine_iterations, refine_rows, max_iterations,
                           generator, x.device)

    def search(name: str, rows: Optional[Tensor], iterations: int):
        xs, ys, ss = ((x_search, targets, noise) if rows is None
                      else (x_search[rows], targets[rows], noise[rows]))
        return dirichlet_evidence_search(kernel, xs, ys, ss, iterations, tolerance)

    run_search_stages(stages, search, info, "fit_classifier_auto", n)
    info.lengthscale = kernel.base_kernel.lengthscale.detach().reshape(-1) * x_unit

    started = time.perf_counter()
    # The same frequencies as the search's kernel when num_features == search_features.
    final = make_ard_kernel(num_features, d, spectral, seed=seed, dtype=x.dtype).to(x.device)
    final.base_kernel.lengthscale = info.lengthscale.reshape(1, -1)
    final.outputscale = kernel.outputscale.detach().clone()
    model = DirichletGPClassifier(
        final, alpha_epsilon=alpha_epsilon, num_classes=num_classes, centre=True,
        outputscale=1.0, num_samples=num_samples, seed=seed,
    )
    with torch.no_grad():
        if select_alpha:
            model.select_alpha(x, labels, seed=seed)
        else:
            model.fit(x, labels)
    info.seconds["refit"] = time.perf_counter() - started
    return model

