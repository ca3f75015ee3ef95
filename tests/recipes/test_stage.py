"""Stages are declarations: a function from typed inputs to a typed output and its cost. A
new budgeted stage is one declaration added to the list; the schedule and the run follow."""

from __future__ import annotations

from dataclasses import FrozenInstanceError, replace

import pytest
import torch

import rfgp.recipes._regression as regression
from rfgp.recipes import FitReport, RegressionOptions, fit_auto
from rfgp.recipes._stage import Searched, Stage
from tests.helpers import DT, gen

SHARE = 0.25


def _plan_polish(plan):
    # Its cost: a quarter of the budget, booked after the local stage and before the
    # Laplace Hessian and the final fit's growth; its setting for the run.
    plan.book("polish", SHARE * plan.total)
    plan.settings["polish"] = 0.9


def _polish(data, searched, report):
    # Reads the data and what the stages before handed on; hands on one more candidate.
    shorter = searched.lengthscale() * data.schedule.settings["polish"]
    return replace(searched, candidates={**searched.candidates, "polish": shorter})


POLISH = Stage("polish", _polish, ((35, _plan_polish),))


def _with_polish():
    names = [stage.name for stage in regression.STAGES]
    at = names.index("laplace")
    return regression.STAGES[:at] + (POLISH,) + regression.STAGES[at:]


def test_the_stages_share_their_names_and_the_progress_counts_them():
    names = [stage.name for stage in regression.STAGES]
    assert names == ["search", "select", "refine", "local", "laplace", "refit"]
    for stage in regression.STAGES:
        assert stage.run.__name__ == stage.name
        assert stage.run.__module__.rsplit("._", 1)[1] == stage.name


def test_an_added_stage_is_booked_at_its_place_and_the_others_plan_around_it(monkeypatch):
    # At 200 s the plain plan's final D on 4 * 10^4 rows is what the budget pays for below
    # its cap, so a stage booked before the final fit's growth takes features from it.
    options = RegressionOptions(time_budget=200.0).checked()
    plain = regression.plan_regression(40000, 8, options)
    monkeypatch.setattr(regression, "STAGES", _with_polish())
    polished = regression.plan_regression(40000, 8, options)
    # Its predicted seconds are its share; the predictions follow the stages' order.
    assert polished.predicted["polish"] == pytest.approx(SHARE * 200.0, rel=1e-12)
    assert list(polished.predicted) == [name for name in
                                        ("search", "select", "refine", "local", "polish",
                                         "laplace", "refit") if name in polished.predicted]
    assert polished.settings["polish"] == 0.9 and set(polished.settings) == {"polish", "refit"}
    # What was booked before it is unchanged; what comes after has less to share.
    assert (polished.subsample, polished.refine_rows, polished.local_starts) == (
        plain.subsample, plain.refine_rows, plain.local_starts)
    assert polished.num_features < plain.num_features
    assert sum(polished.predicted.values()) <= 200.0 * (1 + 1e-12)


def test_an_added_stage_runs_in_its_order_and_hands_on_what_it_returns(monkeypatch):
    monkeypatch.setattr(regression, "STAGES", _with_polish())
    g = gen(3)
    x = torch.rand(600, 2, generator=g, dtype=DT)
    y = torch.sin(4 * x[:, 0]) + 0.1 * torch.randn(600, generator=g, dtype=DT)
    report = FitReport()
    fit_auto(x, y - y.mean(), report=report, num_features=64, search_features=32,
             subsample=200, refine_rows=600, refine_iterations=2, exact_rows=100,
             lengthscale_draws=0, max_lengthscale=None, time_budget=600.0)
    ran = list(report.seconds)
    assert "polish" in ran and ran.index("polish") > ran.index("refine")
    assert ran[-1] == "refit"
    # The final model's evidence chose among the candidates, the added one with them.
    assert "polish" in report.calibration["candidates"]


def test_what_a_stage_hands_on_is_not_changed_behind_its_back():
    searched = Searched(model=None)
    with pytest.raises(FrozenInstanceError):
        searched.candidates = {}
