r"""The default fitting recipes: :func:`fit_auto` (regression) and :func:`fit_classifier_auto`.

Each recipe is a short pipeline of stages, one internal module each (module, function and
report key share the stage's name), each a function of the data and of what the stages before
handed on, with its own declared cost; one options table (:class:`RegressionOptions`,
:class:`ClassifierOptions`) is shared with the scikit-learn estimators, and a time budget
schedules the stages from their costs.

**The stages of** :func:`fit_auto`:

* *Units and start.* The search works in power-of-two units near each input column's spread
  and the targets' (every result then scales exactly back); the start comes from the data.
* *Search.* The evidence of an ARD random Fourier feature model is maximised on a
  subsample: the exact kernel's evidence on at most ``exact_rows`` rows, else the evidence of
  ``search_features`` features, along two paths (L-BFGS, and L-BFGS after an Adam warm-up),
  the higher kept.
* *Model choice* (``"select"``). Where the search held every row, cross-validation chooses
  between the unbounded lengthscales and lengthscales bounded by ``max_lengthscale`` column
  spreads.
* *Refinement and the local stage.* A few L-BFGS iterations on more rows; then the exact
  evidences of k-d blocks of neighbouring rows from further starts, each shortening one
  lengthscale, as many as the budget allows.
* *Laplace average.* The final kernel averages ``lengthscale_draws`` lengthscale vectors
  drawn from the Laplace approximation of the last stage's evidence.
* *Calibration and refit.* The final ``D``-feature model's outputscale and noise maximise its
  own evidence, and that evidence chooses among the stages' candidate lengthscales: exactly
  (one spectrum of its Gram matrix) on the weight-space path, from feature
  products alone on the conjugate-gradient path beyond 8192 features. The fit then reuses
  what the calibration computed (the chosen candidate's Gram matrix, or the Nyström
  preconditioner at the root) instead of another pass over the rows. The calibration and the
  fit belong to the inference layer; the stage keeps the choice among the candidates.
  :func:`calibrated_fit` (re-exported from :mod:`rfgp.inference`) applies the rule to
  lengthscales found elsewhere.

**The budget.** A cost model converts ``time_budget`` seconds at ``machine_rate``
multiply-adds a second into a schedule (:attr:`FitReport.schedule`): the final fit gets the
most features that fit 40% of the budget (weight space up to 8192 features, conjugate
gradients beyond, more features than rows too), the refinement's rows and the local stage's starts
what is left (the local stage also gives the final model a second candidate to compare, at
up to 2048 features), and what they leave grows ``D`` (in multiples of 1024, on conjugate
gradients up to 65,536). When the final fit starts it re-plans ``D`` from the seconds
actually left, at ``machine_rate`` or the lower rate of stages that ran slower than forecast
(``anytime``; never fewer features than planned). The default budget,
:math:`\max(30, 20 + N/400)` seconds, is linear in the rows; :func:`measure_machine_rate`
measures this machine's rate.
"""

from rfgp._report import ClassifierFitReport, FitReport
from rfgp.inference import calibrated_fit, measure_machine_rate
from rfgp.recipes._classification import fit_classifier_auto
from rfgp.recipes._options import ClassifierOptions, RegressionOptions
from rfgp.recipes._regression import fit_auto

__all__ = [
    "ClassifierFitReport",
    "ClassifierOptions",
    "FitReport",
    "calibrated_fit",
    "RegressionOptions",
    "fit_auto",
    "fit_classifier_auto",
    "measure_machine_rate",
]
