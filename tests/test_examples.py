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
    for name in ("regression", "classification", "vector_field", "demo"):
        sys.modules.pop(name, None)


@pytest.mark.slow
def test_regression_example_rows_and_plot(examples_on_path, monkeypatch, tmp_path):
    regression = importlib.import_module("regression")
    monkeypatch.setattr(regression, "TRAINING_STEPS", 3)
    rows = regression.main(str(tmp_path / "out"))
    assert (tmp_path / "out" / "regression.png").stat().st_size > 0
    assert [row["method"].split(",")[0].split(" (D=")[0] for row in rows] == [
        "rfgp.fit_auto", "exact GP (RBF)", "RFF", "ORF", "SORF (pad_to=64)"]
    # the default recipe runs to convergence whatever TRAINING_STEPS says: near the exact GP
    assert rows[0]["metrics"]["MNLL"] < 0.5
    for row in rows:
        assert set(row) == {"method", "data", "metrics", "time_s"}
        assert row["data"].startswith("concrete")
        assert set(row["metrics"]) == {"RMSE", "MNLL"}
        assert all(math.isfinite(v) for v in row["metrics"].values())
        # Standardised targets: even three Adam steps beat predicting the mean (RMSE ~ 1) a bit.
        assert 0 < row["metrics"]["RMSE"] < 1.2


def _check_demo_rows(rows):
    for row in rows:
        assert {"method", "data", "metrics", "time_s"} <= set(row)
        assert all(isinstance(v, float) for v in row["metrics"].values())


def test_classification_example_returns_demo_rows(examples_on_path, monkeypatch, tmp_path):
    # The models are stubbed out (the full example takes seconds): only the row format is
    # checked here; the classifier itself is tested in tests/inference/test_dirichlet.py.
    classification = importlib.import_module("classification")

    def fake_evaluate(name, results, diagrams):
        results.append({"method": "m", "data": name, "alpha_epsilon": 0.01, "accuracy": 0.9,
                        "mnll": 0.3, "ece": 0.05, "time_s": 0.1})

    monkeypatch.setattr(classification, "evaluate", fake_evaluate)
    monkeypatch.setattr(classification, "plot", lambda diagrams, path: None)
    rows = classification.main(str(tmp_path))
    _check_demo_rows(rows)
    assert rows[0]["metrics"] == {"accuracy": 0.9, "MNLL": 0.3, "ECE": 0.05}


def test_vector_field_example_returns_demo_rows(examples_on_path, monkeypatch, tmp_path):
    import torch

    vector_field = importlib.import_module("vector_field")

    class Kernel:
        curl_lengthscale = div_lengthscale = torch.tensor(1.0)

    scores = {"relative_error": 0.1, "correlation": 0.99}
    monkeypatch.setattr(vector_field, "fit_wind", lambda: {
        "kernel": Kernel(), "rmse": 0.2, "field_std": 5.0, "coverage": 0.95, "fit_time": 1.0,
        "predict_time": 0.1, "curl_scores": scores, "div_scores": scores})
    monkeypatch.setattr(vector_field, "five_gaussian_experiment", lambda: {
        "sizes": [8, 16], "mse": {"curl-free ORFF": [0.4, 0.1]}, "time": 1.0})
    monkeypatch.setattr(vector_field, "plot_wind", lambda result, path: None)
    monkeypatch.setattr(vector_field, "plot_five_gaussians", lambda result, path: None)
    rows = vector_field.main(str(tmp_path))
    _check_demo_rows(rows)
    assert rows[-1]["metrics"] == {"MSE D=8": 0.4, "MSE D=16": 0.1}
    assert (tmp_path / "vector_field.md").read_text().count("\n") == 2 + len(rows)


def test_demo_table_lists_every_row(examples_on_path):
    demo = importlib.import_module("demo")
    assert demo.EXAMPLES == ["regression", "classification", "vector_field"]
    table = demo.format_table([
        {"example": "regression", "method": "m1", "data": "d", "metrics": {"RMSE": 0.5},
         "time_s": 1.0},
        {"example": "regression", "method": "m2", "data": "d",
         "metrics": {"RMSE": 0.25, "MNLL": -1.0}, "time_s": 2.5},
    ])
    lines = table.splitlines()
    assert len(lines) == 4
    assert "RMSE 0.250, MNLL -1.000" in lines[3] and "2.50" in lines[3]
    # Small values (MSEs) keep three significant digits.
    assert "MSE 0.00123" in demo.format_table([
        {"example": "e", "method": "m", "data": "d", "metrics": {"MSE": 0.00123}, "time_s": 1}])
