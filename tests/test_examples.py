"""Smoke tests of the demo's examples, rfgp.demo, and of the scripts in examples/ (short
training, or their fast setting, so that they stay fast)."""

from __future__ import annotations

import importlib
import math
from pathlib import Path

import pytest


@pytest.mark.slow
def test_regression_example_rows_and_plot(monkeypatch, tmp_path):
    regression = importlib.import_module("rfgp.demo._regression")
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


def test_classification_example_returns_demo_rows(monkeypatch, tmp_path):
    # The models are stubbed out (the full example takes seconds): only the row format is
    # checked here; the classifier itself is tested in tests/inference/test_dirichlet.py.
    classification = importlib.import_module("rfgp.demo._classification")

    def fake_evaluate(name, results, diagrams):
        results.append({"method": "m", "data": name, "alpha_epsilon": 0.01, "accuracy": 0.9,
                        "mnll": 0.3, "ece": 0.05, "time_s": 0.1})

    monkeypatch.setattr(classification, "evaluate", fake_evaluate)
    monkeypatch.setattr(classification, "plot", lambda diagrams, path: None)
    rows = classification.main(str(tmp_path))
    _check_demo_rows(rows)
    assert rows[0]["metrics"] == {"accuracy": 0.9, "MNLL": 0.3, "ECE": 0.05}


def test_vector_field_example_returns_demo_rows(monkeypatch, tmp_path):
    import torch

    vector_field = importlib.import_module("rfgp.demo._vector_field")

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


def test_demo_table_lists_every_row():
    demo = importlib.import_module("rfgp.demo")
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


def _without(monkeypatch, *missing):
    # As if the named top-level packages were not installed.
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in missing else find_spec(name, *a))


def test_plots_are_skipped_without_matplotlib(monkeypatch, tmp_path, capsys):
    import rfgp.demo

    _without(monkeypatch, "matplotlib")
    monkeypatch.setattr(rfgp.demo, "_said", {})
    classification = importlib.import_module("rfgp.demo._classification")
    classification.plot({}, str(tmp_path / "diagram.png"))
    assert rfgp.demo.pyplot() is None
    assert not (tmp_path / "diagram.png").exists()
    assert capsys.readouterr().out.count('pip install "rfgp[plot]"') == 1  # said once


def test_demo_skips_an_example_whose_extra_is_missing(monkeypatch, tmp_path, capsys):
    import rfgp.demo

    _without(monkeypatch, "sklearn")
    row = {"method": "m", "data": "d", "metrics": {"RMSE": 0.5}, "time_s": 1.0}
    for name in ("regression", "vector_field"):
        module = importlib.import_module(f"rfgp.demo._{name}")
        monkeypatch.setattr(module, "main", lambda output_dir, n=name: [{**row, "data": n}])
    monkeypatch.setenv("RFGP_DEMO_THREADS", str(__import__("torch").get_num_threads()))
    rows = rfgp.demo.main(str(tmp_path))
    assert [r["example"] for r in rows] == ["regression", "vector_field"]
    assert 'skipped: it needs sklearn (pip install "rfgp[sklearn]")' in capsys.readouterr().out


def test_demo_runs_as_a_module():
    import importlib.util

    spec = importlib.util.find_spec("rfgp.demo.__main__")
    assert spec is not None and spec.origin.endswith("__main__.py")


def test_demo_runs_only_the_examples_named(monkeypatch, tmp_path):
    import rfgp.demo

    row = {"method": "m", "data": "d", "metrics": {"RMSE": 0.5}, "time_s": 1.0}
    for name in rfgp.demo.EXAMPLES:
        module = importlib.import_module(f"rfgp.demo._{name}")
        monkeypatch.setattr(module, "main", lambda output_dir, n=name: [{**row, "data": n}])
    monkeypatch.setenv("RFGP_DEMO_THREADS", str(__import__("torch").get_num_threads()))
    rows = rfgp.demo.main(str(tmp_path), ["vector_field", "regression"])
    assert [r["example"] for r in rows] == ["regression", "vector_field"]  # in demo order
    with pytest.raises(ValueError, match="unknown example"):
        rfgp.demo.main(str(tmp_path), ["nonexistent"])


@pytest.mark.parametrize("argv, expected", [
    ([], ("demo_output", None)),
    (["out"], ("out", None)),
    (["out", "--only", "regression", "vector_field"], ("out", ["regression", "vector_field"])),
])
def test_the_command_line_takes_the_output_folder_and_the_examples(monkeypatch, argv,
                                                                    expected):
    # python -m rfgp.demo [output_dir] [--only NAME ...]
    import runpy
    import sys

    import rfgp.demo

    calls = []
    monkeypatch.setattr(rfgp.demo, "main", lambda *args: calls.append(args))
    monkeypatch.setattr(sys, "argv", ["rfgp.demo", *argv])
    runpy.run_module("rfgp.demo", run_name="__main__")
    assert calls == [expected]


@pytest.mark.parametrize("threads", ["abc", "0", "-2", "1.5", ""])
def test_a_bad_thread_count_is_named_before_any_example_runs(monkeypatch, tmp_path, threads):
    import rfgp.demo

    ran = []
    for name in rfgp.demo.EXAMPLES:
        module = importlib.import_module(f"rfgp.demo._{name}")
        monkeypatch.setattr(module, "main", lambda output_dir: ran.append(1) or [])
    monkeypatch.setenv("RFGP_DEMO_THREADS", threads)
    with pytest.raises(ValueError, match="RFGP_DEMO_THREADS must be a positive integer"):
        rfgp.demo.main(str(tmp_path / "out"))
    assert not ran and not (tmp_path / "out").exists()


@pytest.mark.parametrize("examples, match", [
    ("regression", r"examples must be None or a list of names.*pass \['regression'\]"),
    ([3], "examples must be None or a list of names"),
    (b"regression", "examples must be None or a list of names"),
])
def test_examples_must_be_a_list_of_names_not_a_string(tmp_path, examples, match):
    import rfgp.demo

    # A string is a sequence of letters: it used to run nothing, "unknown example(s) ['e', ...]".
    with pytest.raises(TypeError, match=match):
        rfgp.demo.main(str(tmp_path), examples)


def test_the_output_folder_must_be_a_path(tmp_path):
    import rfgp.demo

    with pytest.raises(TypeError, match="output_dir must be a path"):
        rfgp.demo.main(3)
    assert not (tmp_path / "3").exists()


def test_a_path_object_and_a_tuple_of_names_are_taken(monkeypatch, tmp_path):
    import rfgp.demo

    row = {"method": "m", "data": "d", "metrics": {"RMSE": 0.5}, "time_s": 1.0}
    for name in rfgp.demo.EXAMPLES:
        module = importlib.import_module(f"rfgp.demo._{name}")
        monkeypatch.setattr(module, "main", lambda output_dir, n=name: [{**row, "data": n}])
    monkeypatch.setenv("RFGP_DEMO_THREADS", str(__import__("torch").get_num_threads()))
    rows = rfgp.demo.main(tmp_path / "out", ("regression",))
    assert [r["example"] for r in rows] == ["regression"] and (tmp_path / "out").is_dir()


# ------------------------------------------------------------------ examples/ (user scripts)
EXAMPLES_DIR = Path(__file__).resolve().parents[1] / "examples"
EXAMPLE_SCRIPTS = ["regression", "large_data", "classification", "vector_field", "bayesopt",
                   "sklearn_pipeline"]


def _run_example(monkeypatch, tmp_path, name):
    """The script's ``main()`` in its fast setting (RFGP_EXAMPLES_FAST=1), its result returned."""
    import runpy

    monkeypatch.setenv("RFGP_EXAMPLES_FAST", "1")
    monkeypatch.chdir(tmp_path)  # nothing may be written next to the script
    namespace = runpy.run_path(str(EXAMPLES_DIR / f"{name}.py"))
    assert namespace["FAST"] is True
    return namespace, namespace["main"]()


def test_every_example_is_short_documented_and_tested():
    import ast

    scripts = sorted(path.stem for path in EXAMPLES_DIR.glob("*.py"))
    assert scripts == sorted(EXAMPLE_SCRIPTS)
    for name in scripts:
        source = (EXAMPLES_DIR / f"{name}.py").read_text()
        assert len(source.splitlines()) < 80, name
        docstring = ast.get_docstring(ast.parse(source))
        assert docstring and "Run: ``python examples/" in docstring, name
        assert "RFGP_EXAMPLES_FAST" in docstring, name


def test_regression_example_beats_the_prior(monkeypatch, tmp_path):
    _, scores = _run_example(monkeypatch, tmp_path, "regression")
    # On standardised targets, predicting N(0, 1) everywhere scores MNLL log(2 pi e) / 2.
    assert scores["MNLL"] < 0.5 * math.log(2 * math.pi * math.e)
    assert 0.0 <= scores["coverage"] <= 1.0 and math.isfinite(scores["RMSE"])


def test_large_data_example_streams_every_row(monkeypatch, tmp_path, capsys):
    namespace, error = _run_example(monkeypatch, tmp_path, "large_data")
    assert f"conditioned on {namespace['ROWS']} rows" in capsys.readouterr().out
    # Better than the best constant: the noise-free function's spread over the same box.
    import numpy as np

    x = np.random.default_rng(3).uniform(-2, 2, size=(4000, 4))
    assert error < 0.5 * namespace["truth"](x).std()
    assert list(tmp_path.iterdir()) == []  # the memory-mapped file went with its folder


def test_classification_example_beats_uniform_probabilities(monkeypatch, tmp_path):
    pytest.importorskip("sklearn")
    _, scores = _run_example(monkeypatch, tmp_path, "classification")
    # Two classes: probabilities (1/2, 1/2) score MNLL log 2; the majority class is 63% of rows.
    assert scores["MNLL"] < math.log(2)
    assert scores["accuracy"] > 0.63
    assert 0.0 <= scores["ECE"] <= 1.0


def test_vector_field_example_beats_the_mean_field(monkeypatch, tmp_path, capsys):
    _, scores = _run_example(monkeypatch, tmp_path, "vector_field")
    spread = float(capsys.readouterr().out.split("test points: ")[1].split(" m/s")[0])
    assert scores["RMSE (m/s)"] < spread
    assert all(-1.0 <= scores[key] <= 1.0 for key in scores if key.startswith(("curl", "div")))


def test_bayesopt_example_finds_no_value_below_the_optimum(monkeypatch, tmp_path):
    pytest.importorskip("botorch")
    import torch

    namespace, best = _run_example(monkeypatch, tmp_path, "bayesopt")
    branin, low, high = namespace["branin"], namespace["LOW"], namespace["HIGH"]
    minimisers = torch.tensor([[-math.pi, 12.275], [math.pi, 2.275], [9.42478, 2.475]])
    optimum = branin((minimisers - low) / (high - low))
    assert torch.allclose(optimum, torch.full((3,), 0.397887), atol=1e-5)
    assert 0.397887 - 1e-6 <= best < math.inf


def test_sklearn_pipeline_example_fits_better_than_the_mean(monkeypatch, tmp_path):
    pytest.importorskip("sklearn")
    _, scores = _run_example(monkeypatch, tmp_path, "sklearn_pipeline")
    assert scores["test R^2"] > 0.0  # the mean of the training targets scores about 0
    assert 0.0 <= scores["coverage"] <= 1.0


@pytest.mark.parametrize("name, missing", [
    ("classification", "sklearn"), ("bayesopt", "botorch"), ("sklearn_pipeline", "sklearn")])
def test_an_example_whose_extra_is_missing_says_so(monkeypatch, tmp_path, capsys, name,
                                                   missing):
    _without(monkeypatch, missing)
    _run_example(monkeypatch, tmp_path, name)
    assert f'pip install "rfgp[{missing}]"' in capsys.readouterr().out
