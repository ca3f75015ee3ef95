r"""The recipes' options and their defaults.

:class:`RegressionOptions` and :class:`ClassifierOptions` hold every option of
:func:`~rfgp.recipes.fit_auto` and :func:`~rfgp.recipes.fit_classifier_auto` with its default;
:meth:`~RecipeOptions.checked` validates them all against the declared constraints of
:data:`rfgp._parameters.PARAMETER_CONSTRAINTS` (a ``ValueError`` or ``TypeError`` that names
the option, what was expected and what was received). The scikit-learn estimators build the
same objects from their parameters, so a recipe run through an estimator is the recipe.

Example:
    >>> RegressionOptions(num_features=256, seed=3).checked().num_features
    256
    >>> RegressionOptions(cv_folds=1).checked()
    Traceback (most recent call last):
    ...
    ValueError: cv_folds must be 0 (no cross-validation) or an integer >= 2, got 1
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional

from rfgp._parameters import PARAMETER_CONSTRAINTS
from rfgp._validation import validate_parameters
from rfgp.inference._machine_rate import REFERENCE_RATE

__all__ = ["ClassifierOptions", "RecipeOptions", "RegressionOptions", "REFERENCE_RATE"]


@dataclass(frozen=True)
class RecipeOptions:
    """What both recipes share.

    Attributes:
        spectral: ``"rbf"`` or a Matérn kernel (``"matern12"``, ``"matern32"``, ``"matern52"``).
        num_features: ``D`` of the final fit (even); ``None``: the schedule's choice from the
            time budget.
        search_features: ``D`` of the evidence search (even; at most the final ``D``).
        subsample: rows of the first search stage (all rows when there are no more).
        refine_rows: rows of the refinement (a random superset of the subsample); the
            schedule may take fewer to stay within the budget.
        refine_iterations: L-BFGS iterations of the refinement (0: none).
        max_iterations: L-BFGS iterations of the first search stage.
        tolerance: L-BFGS gradient tolerance on the loss per datum, in ``(0, 1]``.
        time_budget: seconds the whole fit may take at ``machine_rate``; ``None``: the default,
            ``max(30, 20 + N / 400)`` seconds, which grows linearly with the rows.
        machine_rate: multiply-adds per second the schedule's cost model assumes
            (:data:`REFERENCE_RATE`; :func:`~rfgp.recipes.measure_machine_rate`
            measures this machine's).
        progress: show the stages as they run (tqdm).
        seed: seed of the random frequencies, the subsample and every other draw.
    """

    spectral: str = "rbf"
    num_features: Optional[int] = None
    search_features: int = 512
    subsample: int = 2000
    refine_rows: int = 10000
    refine_iterations: int = 30
    max_iterations: int = 200
    tolerance: float = 1e-4
    time_budget: Optional[float] = None
    machine_rate: float = REFERENCE_RATE
    progress: bool = False
    seed: int = 0

    def checked(self) -> RecipeOptions:
        """The options with every value validated and normalised (``int``, ``float``,
        ``bool``); raises on the first bad one."""
        values = {item.name: getattr(self, item.name) for item in dataclasses.fields(self)}
        table = PARAMETER_CONSTRAINTS[type(self).__name__]
        return dataclasses.replace(self, **validate_parameters(table, values))

    def replace(self, **changes: Any) -> RecipeOptions:
        """A copy with ``changes``; unknown names raise a ``TypeError`` that lists the
        options."""
        names = {item.name for item in dataclasses.fields(self)}
        unknown = sorted(set(changes) - names)
        if unknown:
            raise TypeError(
                f"unknown option(s) {unknown} of {type(self).__name__}; the options are "
                f"{sorted(names)}"
            )
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class RegressionOptions(RecipeOptions):
    """The options of :func:`~rfgp.recipes.fit_auto` (those of :class:`RecipeOptions` and):

    Attributes:
        exact_rows: a search on at most this many rows maximises the exact kernel's evidence
            (:math:`O(n^3)`, free of the features' error); a search that holds every row of
            more rows, the exact evidences of blocks of at most this many neighbouring rows;
            also the block size of the local stage (0: never).
        max_lengthscale: the candidate bound on every lengthscale, in units of its input
            column's standard deviation (``None``: never bounded).
        cv_folds: folds of the cross-validation that chooses between the unbounded and the
            bounded search (0: the bounded one whenever the bound binds).
        lengthscale_draws: lengthscale draws of the final kernel's Laplace average (0: the
            kernel at the maximum).
        local_search: after a refinement, maximise the exact block evidence from further
            starts, as many as the budget allows.
        calibrate: choose the final model's outputscale and noise by its own evidence (and
            its lengthscales among the stages' candidates); ``False`` keeps the search's.
        solve: the final fit's path: ``"weight"`` (its ``D x D`` matrix factorised),
            ``"cg"`` (conjugate gradients, no ``D x D`` matrix) or ``"auto"``, the weight
            space up to 8192 features and CG beyond (past the rows too). On rows
            not held in memory (a memory-map, chunks, process shards) every CG product is a
            pass over them, which the schedule counts.
        distributed: each ``torch.distributed`` process passes its own shard of the rows;
            every process runs the same recipe and returns the same model (statistics
            all-reduced, rank 0's schedule and stage results adopted by all).
        anytime: when the final fit starts, re-plan its ``D`` from the seconds actually left
            at ``machine_rate``, or the lower rate of stages that ran slower than forecast
            (never fewer features than planned), so that stages that finish early leave
            their time to the features; ``False`` keeps
            the schedule, a function of the rows, inputs and budget alone (a fit then
            reproduces on every machine).
        prior_mean: ``"constant"``: the first search also chooses a constant prior mean
            per target column, with the prior :math:`N(0, v)` (:math:`v` the targets' mean
            square), which every later stage and the final model keep
            (:attr:`~rfgp.RandomFeatureGP.prior_mean`; ``report.prior_mean``); ``"zero"``:
            the prior mean is zero (centre the targets first).
    """

    exact_rows: int = 1000
    max_lengthscale: Optional[float] = 4.0
    cv_folds: int = 5
    lengthscale_draws: int = 32
    local_search: bool = True
    calibrate: bool = True
    solve: str = "auto"
    distributed: bool = False
    anytime: bool = True
    prior_mean: str = "constant"


@dataclass(frozen=True)
class ClassifierOptions(RecipeOptions):
    """The options of :func:`~rfgp.recipes.fit_classifier_auto` (those of
    :class:`RecipeOptions`, with 10 refinement iterations on up to 20000 rows, and):

    Attributes:
        num_classes: ``C``; ``None`` takes the distinct labels.
        alpha_epsilon: Dirichlet concentration (positive; fixes the transform's noise); with
            ``select_alpha`` the value the choice replaces.
        select_alpha: choose ``alpha_epsilon`` and the final ``D`` together by the held-out
            NLL on a validation split of the rows (a stage of the schedule, with its cost);
            ``False`` keeps ``alpha_epsilon`` and the schedule's ``D``.
        two_paths: search along two paths (L-BFGS, and L-BFGS after an Adam warm-up; the
            lower loss kept); ``None``: where the budget affords both.
        num_samples: Monte Carlo samples of the classifier's ``predict_proba``.
    """

    refine_rows: int = 20000
    refine_iterations: int = 10
    num_classes: Optional[int] = None
    alpha_epsilon: float = 0.01
    select_alpha: bool = True
    two_paths: Optional[bool] = None
    num_samples: int = 1000
