"""What a recipe did: :class:`FitReport` (regression) and :class:`ClassifierFitReport`."""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Dict, List, Optional

from torch import Tensor

__all__ = ["ClassifierFitReport", "FitReport"]


@dataclass
class FitReport:
    """What :func:`~rfgp.recipes.fit_auto` did, in the data's units.

    Attributes:
        schedule: the schedule the fit followed (budget,
            rows, feature counts, predicted seconds per stage).
        num_features: ``D`` of the final fit.
        search_features: ``D`` of the evidence search.
        subsample: rows of the first search stage.
        refine_rows: rows of the refinement (0 when there was none).
        seconds: measured seconds per stage (``"search"``, ``"select"``, ``"refine"``,
            ``"local"``, ``"laplace"``, ``"refit"``), to set against ``schedule.predicted``.
        iterations: L-BFGS iterations per search stage.
        converged: per search stage, whether L-BFGS met its tolerances before its limit.
        losses: per search stage, the negative log evidence per datum at each evaluation.
        evidence: per search stage, the evidence it maximised (``"exact"``, ``"blocks"`` or
            ``"features"``).
        initial: the starting hyperparameters (``lengthscale``, ``outputscale``, ``noise``).
        lengthscale_bound: the ``(d,)`` bounds the search kept to (``None``: unbounded).
        cv_scores: the cross-validated held-out log density per target of the
            ``"unbounded"`` and ``"bounded"`` searches (empty when no choice was made).
        lengthscale: ``(d,)`` the lengthscales of the final kernel's centre.
        lengthscale_draws: ``(S, d)`` the lengthscales of the final kernel's Laplace average
            (``None`` without it).
        local_blocks: blocks of the local stage (0 when it did not run).
        local_losses: the local stage's negative log block evidence per datum at the end of
            each start.
        calibration: the final model's evidence per candidate lengthscale vector
            (``"candidates"``: their names, ``"evidence"``: the negative log evidence per
            datum of each at its calibrated scales), the candidate chosen, the
            ``outputscale_factor`` and the noise before and after.
        prior_mean: the constant prior mean the search chose (a number, or ``(T,)`` one per
            target column; ``None`` with ``prior_mean="zero"``).
    """

    schedule: Any = None
    num_features: int = 0
    search_features: int = 0
    subsample: int = 0
    refine_rows: int = 0
    seconds: Dict[str, float] = field(default_factory=dict)
    iterations: Dict[str, int] = field(default_factory=dict)
    converged: Dict[str, bool] = field(default_factory=dict)
    losses: Dict[str, List[float]] = field(default_factory=dict)
    evidence: Dict[str, str] = field(default_factory=dict)
    initial: Dict[str, Tensor] = field(default_factory=dict)
    lengthscale_bound: Optional[Tensor] = None
    cv_scores: Dict[str, float] = field(default_factory=dict)
    lengthscale: Optional[Tensor] = None
    lengthscale_draws: Optional[Tensor] = None
    local_blocks: int = 0
    local_losses: List[float] = field(default_factory=list)
    calibration: Dict[str, Any] = field(default_factory=dict)
    prior_mean: Optional[Tensor] = None

    @classmethod
    def begin(cls, report: Optional[FitReport], schedule: Any) -> FitReport:
        """``report`` (a new one where ``None``) cleared, with ``schedule``'s sizes: a report
        passed again describes the new fit only (the recipe checked its type)."""
        report = report if report is not None else cls()
        report.clear()
        report.schedule, report.num_features = schedule, schedule.num_features
        report.search_features, report.subsample = schedule.search_features, schedule.subsample
        report.refine_rows = schedule.refine_rows
        return report

    def clear(self) -> None:
        """Every field back to its default: a report passed to a new fit keeps nothing of an
        earlier one.

        Example:
            >>> report = FitReport(num_features=64, seconds={"refit": 0.1})
            >>> report.clear()
            >>> report.num_features, report.seconds
            (0, {})
        """
        for item in fields(self):
            default = (item.default_factory() if item.default_factory is not MISSING
                       else item.default)
            setattr(self, item.name, default)

    def timing(self) -> str:
        """One line per stage: predicted and measured seconds.

        Example:
            >>> FitReport(seconds={"refit": 0.5}).timing()
            'refit: predicted -, took 0.50 s'
        """
        predicted = {} if self.schedule is None else self.schedule.predicted
        lines = []
        for stage, took in self.seconds.items():
            guess = predicted.get(stage)
            guess_text = "-" if guess is None else f"{guess:.2f} s"
            lines.append(f"{stage}: predicted {guess_text}, took {took:.2f} s")
        return "\n".join(lines)


@dataclass
class ClassifierFitReport(FitReport):
    """What :func:`~rfgp.recipes.fit_classifier_auto` did: the fields of :class:`FitReport`,
    where ``initial`` holds the starting ``lengthscale`` and ``outputscale`` (the Dirichlet
    transform fixes the noise), ``losses`` are per datum and class, and ``calibration`` holds
    the final model's outputscale: the ``factor`` on the search's, the ``outputscale`` and
    either its ``held_out_nll`` (chosen by the held-out NLL) or the final model's
    ``negative_log_evidence`` per datum and class (chosen by the evidence, without the
    held-out choice).

    Attributes:
        choice: the held-out choice (empty without it): the ladder's ``features``, the
            ``alphas``, ``nll`` ``(rungs, alphas)`` their held-out negative log likelihoods,
            the ``num_features`` and ``alpha_epsilon`` chosen and the ``validation_rows``;
            then the ``outputscale_factor`` chosen at that pair, its ``scaled_nll`` and the
            ``scale_evaluations`` (``{factor: held-out NLL}``).
    """

    choice: Dict[str, Any] = field(default_factory=dict)
