"""Smoke tests of the runnable examples (short training so that they stay fast)."""

from __future__ import annotations

import importlib
import math
import sys
from pathlib import Path

import pytest

EXAMPLES_DIR = Path(__file__).resolve().parents[1] / "examples"


@pytest.fixture
def examples_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES_DIR))
    yield
    for name in ("regression", "demo"):
        sys.modules.pop(name, None)


def test_regression_example_rows_and_plot(examples_on_path, monkeypatch, tmp_path):
    regression = importlib.import_module("regression")
    monkeypatch.setattr(regression, "TRAINING_STEPS", 3)
    rows = regression.main(str(tmp_path / "out"))
    assert (tmp_path / "out" / "regression.png").stat().st_size > 0
    assert [row["method"].split(",")[0] for row in rows] == [
        "exact GP (RBF)", "RFF", "ORF", "SORF (pad_to=64)"]
    for row in rows:
        assert set(row) == {"method", "data", "metrics", "time_s"}
        assert row["data"].startswith("concrete")
        assert set(row["metrics"]) == {"RMSE", "MNLL"}
        assert all(math.isfinite(v) for v in row["metrics"].values())
        # Standardised targets: even three Adam steps beat predicting the mean (RMSE ~ 1) a bit.
        assert 0 < row["metrics"]["RMSE"] < 1.2


def test_demo_table_lists_every_row(examples_on_path):
    demo = importlib.import_module("demo")
    assert demo.EXAMPLES[0] == "regression"
    table = demo.format_table([
        {"example": "regression", "method": "m1", "data": "d", "metrics": {"RMSE": 0.5},
         "time_s": 1.0},
        {"example": "regression", "method": "m2", "data": "d",
         "metrics": {"RMSE": 0.25, "MNLL": -1.0}, "time_s": 2.5},
    ])
    lines = table.splitlines()
    assert len(lines) == 4
    assert "RMSE 0.250, MNLL -1.000" in lines[3] and "2.50" in lines[3]
