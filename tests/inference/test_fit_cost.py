"""The cost model of a fit: one rule for the largest feature count within a budget, and the
calibrated CG fit's cost built on the iterative fit's own model."""

from __future__ import annotations

import math

import pytest
import torch

import rfgp.inference._cg_cost as cg_cost
from rfgp.inference._cg_cost import cg_fit_cost, cg_num_features, final_path, iterative_fit_cost
from rfgp.inference._fit_cost import (
    MAX_ITERATIVE_FEATURES,
    MAX_WEIGHT_FEATURES,
    largest_features_within,
)


@pytest.mark.parametrize("seed", range(5))
def test_the_largest_power_of_two_within_a_budget_is_the_best_of_every_size(seed):
    # A cost that need not grow with D (a path that changes): the rule tries every size.
    g = torch.Generator().manual_seed(seed)
    sizes = [256 * 2**k for k in range(9)]
    costs = dict(zip(sizes, torch.rand(len(sizes), generator=g, dtype=torch.float64).tolist()))
    budget = float(torch.rand((), generator=g, dtype=torch.float64))
    within = [size for size in sizes if costs[size] <= budget]
    expected = max(within) if within else 256
    assert largest_features_within(costs.__getitem__, budget, 256, sizes[-1]) == expected
    # The range bounds the answer.
    assert largest_features_within(costs.__getitem__, math.inf, 256, 1024) == 1024


def test_the_iterative_fit_size_follows_the_same_rule():
    rate, n, d = 1e10, 10**5, 8
    for seconds in (1.0, 30.0, 600.0):
        expected = largest_features_within(
            lambda m: cg_fit_cost(n, m, d, iterations=50) / rate, seconds, 1024, 1 << 16)
        assert cg_num_features(n, d, seconds, multiply_adds_per_second=rate,
                               iterations=50) == expected


def test_the_calibrated_cg_fit_counts_its_fit_by_the_cg_fit_cost(monkeypatch):
    # The CG path's cost contains the plain CG fit's cost model exactly once: changing that
    # model changes the calibrated fit's cost by the same amount, at every D.
    n, d = 40000, 8
    before = {m: iterative_fit_cost(n, m, d) for m in (4096, 16384, 65536)}
    original = cg_cost.cg_fit_cost
    monkeypatch.setattr(cg_cost, "cg_fit_cost",
                        lambda *args, **kwargs: original(*args, **kwargs) + 1e6)
    for m, cost in before.items():
        assert iterative_fit_cost(n, m, d) == pytest.approx(cost + 1e6, rel=1e-15, abs=1e-3)


def test_the_path_changes_where_the_weight_space_matrices_stop_fitting():
    # D x D up to MAX_WEIGHT_FEATURES; beyond, CG up to MAX_ITERATIVE_FEATURES, more
    # features than rows too on rows too many for the N x N solve, and no path beyond.
    assert final_path(10**5, MAX_WEIGHT_FEATURES, 8, "auto")[0] == "weight"
    assert final_path(10**5, 2 * MAX_WEIGHT_FEATURES, 8, "auto")[0] == "cg"
    assert final_path(20000, MAX_ITERATIVE_FEATURES, 8, "auto")[0] == "cg"
    assert final_path(20000, MAX_ITERATIVE_FEATURES + 2, 8, "auto") == (None, math.inf)
    # On few rows the N x N solve holds D > N in weight space, and no CG takes over past it.
    assert final_path(2000, 4 * MAX_WEIGHT_FEATURES, 8, "auto")[0] == "weight"
    assert final_path(60, MAX_ITERATIVE_FEATURES, 8, "auto") == (None, math.inf)


def test_features_beyond_the_cache_cost_a_pass_each_like_streamed_rows():
    n, m, d = 41202, 41202, 3
    whole = 8.0 * n * m
    # Nothing cached: every pass recomputes the features, as for rows read from a source.
    assert iterative_fit_cost(n, m, d, cache_bytes=0) == iterative_fit_cost(n, m, d,
                                                                            streamed=True)
    # All cached: the features are computed once, whatever the cache's room beyond them.
    assert iterative_fit_cost(n, m, d, cache_bytes=whole) == iterative_fit_cost(
        n, m, d, cache_bytes=10 * whole)
    # In between, linear in the share held.
    half = iterative_fit_cost(n, m, d, cache_bytes=whole / 2)
    ends = iterative_fit_cost(n, m, d, cache_bytes=0), iterative_fit_cost(n, m, d,
                                                                           cache_bytes=whole)
    assert half == pytest.approx(sum(ends) / 2, rel=1e-12)
    assert cg_fit_cost(n, m, d, iterations=10, cached=0.5) == pytest.approx(
        (cg_fit_cost(n, m, d, iterations=10, cached=True)
         + cg_fit_cost(n, m, d, iterations=10, cached=False)) / 2, rel=1e-12)


def test_every_pass_counts_its_memory_traffic_beside_its_multiply_adds():
    # With cached features one more CG iteration is one product pair per target column
    # (2 N D T) and one pass's traffic (PASS_TRAFFIC N D), so a single-column iteration costs
    # 2 + PASS_TRAFFIC per entry, not the 2 of its multiply-adds: with few columns a pass runs
    # at the memory's speed.
    from rfgp.inference._cg_cost import PASS_TRAFFIC

    n, m, d = 13500, 30720, 26
    for columns in (1, 8):
        step = (cg_fit_cost(n, m, d, iterations=51, num_columns=columns, cached=True)
                - cg_fit_cost(n, m, d, iterations=50, num_columns=columns, cached=True))
        assert step == pytest.approx((2 * columns + PASS_TRAFFIC) * n * m, rel=1e-12)
    # The calibration's passes read the cached features too: its cost grows by the traffic
    # of its runs' iterations (the targets' run and the probes' shorter one) with I.
    from rfgp.inference._cg_cost import CALIBRATION_PROBES, CALIBRATION_RUNS, PROBE_RUN_SHARE

    whole = float("inf")
    step = (iterative_fit_cost(n, m, d, iterations=41, cache_bytes=whole)
            - iterative_fit_cost(n, m, d, iterations=40, cache_bytes=whole))
    runs = CALIBRATION_RUNS * (1 + PROBE_RUN_SHARE)
    columns = 1 + CALIBRATION_PROBES * PROBE_RUN_SHARE
    fit = 2 + PASS_TRAFFIC
    products = 2 * CALIBRATION_RUNS * columns + PASS_TRAFFIC * runs + fit
    # The Galerkin projection's 2 s^2 grows with I too; bound it out by the difference.
    assert step >= products * n * m * (1 - 1e-12)
    assert step - products * n * m < 0.05 * products * n * m
