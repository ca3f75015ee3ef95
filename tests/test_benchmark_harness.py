"""The benchmarks' shared run loop and records (benchmarks/_harness.py): a rerun does only
what the records lack, a record is written as soon as its run ends, and the UCI regression
benchmark's loop over sets, splits and methods follows that rule."""

import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture
def harness(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import _harness

    return _harness


def test_records_round_trip_and_keys(harness, tmp_path):
    records = harness.Records(tmp_path / "runs.jsonl")
    assert records.rows() == [] and records.done("set") == set() and not records.exists()
    records.append({"set": "a", "split": 0, "rmse": np.float64(0.25), "info": {"D": 64}})
    records.append({"set": "a", "split": 1, "rmse": 0.5, "info": {}})
    assert records.rows() == [{"set": "a", "split": 0, "rmse": 0.25, "info": {"D": 64}},
                              {"set": "a", "split": 1, "rmse": 0.5, "info": {}}]
    assert records.done("set", "split") == {("a", 0), ("a", 1)}
    assert len((tmp_path / "runs.jsonl").read_text().splitlines()) == 2  # one line per run


def test_run_missing_resumes_where_a_run_stopped(harness, tmp_path):
    records = harness.Records(tmp_path / "runs.jsonl")
    tasks = [{"set": s, "split": k} for s in ("a", "b") for k in range(2)]
    calls = []

    def run(task):
        calls.append((task["set"], task["split"]))
        if len(calls) == 3:
            raise KeyboardInterrupt  # cut short during the third run
        records.append(dict(task))

    with pytest.raises(KeyboardInterrupt):
        harness.run_missing(records, tasks, ("set", "split"), run)
    assert records.done("set", "split") == {("a", 0), ("a", 1)}
    calls.clear()
    harness.run_missing(records, tasks, ("set", "split"), run)
    assert calls == [("b", 0), ("b", 1)]  # only what was missing, in order
    harness.run_missing(records, tasks, ("set", "split"), run)
    assert calls == [("b", 0), ("b", 1)] and len(records.rows()) == 4


def test_grouped_and_cells(harness):
    rows = [{"m": "x", "v": 1.0}, {"m": "y", "v": 5.0}, {"m": "x", "v": 2.0}]
    assert harness.grouped(rows, "m") == {("x",): [rows[0], rows[2]], ("y",): [rows[1]]}
    values = [1.0, 2.0, 4.0]
    mean, sd = np.mean(values), np.std(values)
    assert harness.mean_spread(values, 2) == f"{mean:.2f} ± {sd:.2f}"
    assert harness.mean_spread([0.1234]) == "0.123"


def test_uci_benchmark_runs_each_missing_fit_once(harness, tmp_path, monkeypatch):
    regression_uci = pytest.importorskip("regression_uci")
    fitted = []

    def fake_method(method, xtr, ytr, xte):
        fitted.append(method)
        n = xte.shape[0]
        return np.zeros(n), np.ones(n), {}

    monkeypatch.setattr(regression_uci, "run_method", fake_method)
    # run() sets the benchmark's thread count: not this test session's.
    monkeypatch.setattr(regression_uci.torch, "set_num_threads", lambda threads: None)
    monkeypatch.setattr(regression_uci, "EXACT_MAX", 500)  # concrete's 927 rows: no exact GP
    args = SimpleNamespace(sets=["concrete", "yacht"], splits=2, big_splits=1,
                           methods=["SGPR 512", "exact GP"], threads=1)
    records = harness.Records(tmp_path / "regression_uci.jsonl")
    regression_uci.run(args, records)
    keys = [(r["set"], r["split"], r["method"]) for r in records.rows()]
    assert keys == [("concrete", 0, "SGPR 512"), ("concrete", 1, "SGPR 512"),
                    ("yacht", 0, "SGPR 512"), ("yacht", 0, "exact GP"),
                    ("yacht", 1, "SGPR 512"), ("yacht", 1, "exact GP")]
    # A zero prediction of test targets standardised with the training statistics: RMSE near
    # 1 (103 test rows: a standard error near 1 / sqrt(2 * 103) = 0.07; 0.2 is about 3 of them).
    first = records.rows()[0]
    assert first["n_train"] == 927 and 0.8 < first["rmse"] < 1.2
    fitted.clear()
    regression_uci.run(args, records)  # nothing is missing
    assert fitted == [] and len(records.rows()) == 6
    assert sys.modules["_harness"] is harness


def test_bo_loop_trace_counts_evaluations_and_keeps_the_best(harness):
    pytest.importorskip("botorch")
    import _bo_methods

    trace = _bo_methods.run_one("hartmann6", "random", seed=0, q=4, iterations=3,
                                num_features=64, pool=50)
    assert [step["evaluations"] for step in trace] == [4, 8, 12, 16]
    best = [step["best"] for step in trace]
    assert best == sorted(best)  # the best value so far never falls
    optimum = float(_bo_methods.make_problem("hartmann6").optimal_value)
    assert optimum == pytest.approx(3.32237, abs=1e-5) and best[-1] <= optimum
    assert all(step["seconds"] >= 0 for step in trace)


@pytest.mark.parametrize("script", ["regression_uci", "bayesopt", "polynomial_sketches",
                                    "scaling"])
def test_ported_scripts_are_short_and_find_their_parts(harness, script):
    # Each states its question, methods and table in at most 400 lines; the shared parts it
    # imports (records, methods, report pieces) resolve.
    assert len((BENCHMARKS / f"{script}.py").read_text().splitlines()) <= 400
    module = __import__(script)
    assert callable(module.main)


def test_sgpr_stops_when_its_forecast_exceeds_its_limit(harness):
    pytest.importorskip("gpytorch")
    import torch
    from _regression_methods import Unfinished, sgpr

    g = torch.Generator().manual_seed(0)
    x = torch.rand(60, 2, generator=g, dtype=torch.float64)
    y = torch.sin(4 * x[:, 0])
    with pytest.raises(Unfinished) as stop:  # any step takes more than no time at all
        sgpr(x, y, x[:5], 8, steps=10, time_limit=0.0)
    assert stop.value.steps == 2 and stop.value.forecast > 0
    mean, var, info = sgpr(x, y, x[:5], 8, steps=3, time_limit=3600.0)
    assert mean.shape == var.shape == (5,) and info == {"M": 8}
    assert bool(torch.isfinite(torch.as_tensor(mean)).all()) and float(min(var)) > 0


def test_curves_page_lists_an_unfinished_run_outside_its_table(harness, tmp_path, monkeypatch):
    curves = pytest.importorskip("regression_curves")
    monkeypatch.setattr(curves, "plot", lambda rows, name, path: None)
    point = {"set": "s", "split": 0, "n_train": 100, "d": 2, "threads": 2, "rmse": 0.5,
             "mnll": 0.1, "cov95": 0.95, "info": {"M": 256}}
    rows = [{**point, "method": "SGPR 256", "time": 10.0},
            {"set": "s", "split": 0, "method": "SGPR 2048", "unfinished": True,
             "forecast": 7200.0, "steps": 2, "threads": 2}]
    curves.write_markdown(rows, tmp_path)
    page = (tmp_path / "regression_curves.md").read_text()
    assert "| SGPR 256 |" in page and "| SGPR 2048 |" not in page
    assert "SGPR 2048: unfinished, its training forecast at 7200 s after 2 steps" in page


def test_curves_records_carry_the_date_and_commit_of_their_run(harness):
    import datetime
    import re

    curves = pytest.importorskip("regression_curves")
    stamp = curves.run_stamp()
    assert datetime.date.fromisoformat(stamp["date"]) <= datetime.datetime.now(
        datetime.timezone.utc).date()
    assert stamp["commit"] is None or re.fullmatch(r"[0-9a-f]{4,40}", stamp["commit"])


def test_classification_benchmark_runs_adults_seeds_on_one_load(harness, tmp_path, monkeypatch):
    cls = pytest.importorskip("classification_uci")
    loads, fitted = [], []

    def fake_load(name, split, quick):
        loads.append((name, split))
        import torch

        return (torch.zeros(4, 2), torch.tensor([0, 1, 0, 1]), torch.zeros(3, 2),
                torch.tensor([0, 1, 1]))

    def fake_method(method, xtr, ytr, xte, num_classes, seed, quick, exact_rows):
        fitted.append(seed)
        return np.full((xte.shape[0], num_classes), 1.0 / num_classes), {}

    monkeypatch.setattr(cls, "load_split", fake_load)
    monkeypatch.setattr(cls, "run_method", fake_method)
    monkeypatch.setattr(cls.torch, "set_num_threads", lambda threads: None)
    monkeypatch.setattr(cls, "scores", lambda probs, labels: {
        "accuracy": 0.5, "nll": 0.7, "ece": 0.0, "brier": 0.5})
    args = SimpleNamespace(sets=["adult"], methods=["HistGB"], splits=3, adult_seeds=3,
                           quick=False, threads=1, exact_rows=100)
    records = harness.Records(tmp_path / "classification_uci.jsonl")
    cls.run(args, records)
    assert [r["split"] for r in records.rows()] == [0, 1, 2] and fitted == [0, 1, 2]
    assert loads == [("adult", 0)]  # one given split: loaded once for the three seeds
