"""The default fitting recipes: :func:`fit_auto` (regression) and :func:`fit_classifier_auto`.

Each recipe is a short pipeline of stages, one module each, over one
:class:`~rfgp.recipes.context.RecipeContext` and one options table
(:class:`RegressionOptions`, :class:`ClassifierOptions`) that the scikit-learn estimators
share; a time budget schedules the stages (:mod:`~rfgp.recipes.schedule`).

* :mod:`~rfgp.recipes.units`: the units the search works in.
* :mod:`~rfgp.recipes.start`: the data-driven start and the search's kernel.
* :mod:`~rfgp.recipes.search`: the evidence search over one objective interface.
* :mod:`~rfgp.recipes.choice`: the bounded alternative, chosen by cross-validation.
* :mod:`~rfgp.recipes.refine`: the refinement on more rows and the local stage.
* :mod:`~rfgp.recipes.averaging`: the Laplace average over the lengthscales.
* :mod:`~rfgp.recipes.calibration` and :mod:`~rfgp.recipes.refit`: the final model's own
  evidence chooses its outputscale, noise and lengthscale candidate
  (:func:`calibrated_fit` applies the rule to any lengthscales);
  :mod:`~rfgp.recipes.iterative_calibration` does so beyond the ``D x D`` path.
* :mod:`~rfgp.recipes.schedule`: the cost model and the budget.
"""

from rfgp.recipes.averaging import lengthscale_mixture_kernel
from rfgp.recipes.calibration import maximize_scale_evidence
from rfgp.recipes.classification import fit_classifier_auto
from rfgp.recipes.options import ClassifierOptions, RegressionOptions
from rfgp.recipes.refit import calibrated_fit
from rfgp.recipes.regression import fit_auto
from rfgp.recipes.report import ClassifierFitReport, FitReport
from rfgp.recipes.schedule import Schedule, default_budget, measure_machine_rate
from rfgp.recipes.search import maximize_evidence
from rfgp.recipes.start import initial_hyperparameters, make_ard_kernel
from rfgp.recipes.units import column_scale, column_unit

__all__ = [
    "ClassifierFitReport",
    "ClassifierOptions",
    "FitReport",
    "calibrated_fit",
    "RegressionOptions",
    "Schedule",
    "column_scale",
    "column_unit",
    "default_budget",
    "fit_auto",
    "fit_classifier_auto",
    "initial_hyperparameters",
    "lengthscale_mixture_kernel",
    "make_ard_kernel",
    "maximize_evidence",
    "maximize_scale_evidence",
    "measure_machine_rate",
]
