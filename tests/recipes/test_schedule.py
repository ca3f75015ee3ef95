"""The schedule: feature counts within the final fit's share of the budget, rows and starts
that grow with the data and the budget, and the default budget linear in the rows."""

from __future__ import annotations

import math

import pytest
import torch

from rfgp.inference._blocks import kd_blocks
from rfgp.inference._cg_cost import row_capped_features
from rfgp.inference._evidence_cost import (
    EXACT_DISTANCE_COST,
    EXACT_ELEMENTWISE_COST,
    exact_evidence_cost,
)
from rfgp.inference._fit_cost import (
    FEATURE_STEP,
    MAX_ITERATIVE_FEATURES,
    MAX_WEIGHT_FEATURES,
    feature_grid,
    final_fit_cost,
)
from rfgp.recipes import RegressionOptions, measure_machine_rate
from rfgp.recipes._regression import plan_regression
from rfgp.recipes._schedule import FINAL_SHARE, MIN_FEATURES, default_budget

ROWS = [50, 300, 1000, 1500, 2000, 5000, 9000, 20000, 40000, 60000, 100000, 400000]


def _plan(n, d=8, **options):
    return plan_regression(n, d, RegressionOptions(**options).checked())


@pytest.mark.parametrize("n", ROWS)
def test_final_features_are_the_largest_grid_size_within_the_final_share(n):
    plan = _plan(n)
    share = FINAL_SHARE * plan.budget * plan.machine_rate
    size = plan.num_features
    # The share pays for the candidates the final model may compare: two where a local
    # stage can run (more rows than the subsample), else one.
    k = 2 if n > plan.subsample else 1
    grid = feature_grid(MIN_FEATURES, MAX_ITERATIVE_FEATURES, FEATURE_STEP,
                        row_capped_features(n))
    assert size in grid and size % 2 == 0
    # The share, or what the first search and the Laplace Hessian leave where that is less.
    leaves = (plan.budget - plan.predicted["search"]
              - plan.predicted.get("laplace", 0.0)) * plan.machine_rate
    within = max([MIN_FEATURES] + [m for m in grid if m <= MAX_WEIGHT_FEATURES
                                   and final_fit_cost(n, m, 8, k) <= min(share, leaves)])
    # At least the largest D within the share; more only from what the other stages leave,
    # and then the whole plan stays within the budget.
    assert size >= within
    if size > within:
        assert sum(plan.predicted.values()) <= plan.budget * (1 + 1e-9)
    # Beyond the weight-space limit in function space on few rows, else by CG.
    assert size <= MAX_WEIGHT_FEATURES or n < size or plan.final_solve == "cg"
    assert plan.final_solve == "weight" or MAX_WEIGHT_FEATURES < size <= MAX_ITERATIVE_FEATURES


def test_the_feature_grid_steps_by_its_multiples_and_holds_the_row_cap():
    grid = feature_grid(512, 65536, 1024, 13500)
    assert grid[:4] == [512, 1024, 2048, 3072] and grid[-1] == 65536
    assert 13500 in grid and grid == sorted(set(grid))
    # Between consecutive sizes at most one step (the budget a doubling would leave unspent).
    assert max(b - a for a, b in zip(grid[1:], grid[2:])) <= 1024
    assert feature_grid(512, 4096) == [512, 1024, 2048, 4096]
    # Sizes that are not powers of two are Fourier features of exactly that many columns
    # (the orthogonal d x d blocks are truncated), for one kernel and for a Laplace mixture.
    from rfgp.recipes._laplace import lengthscale_mixture_kernel
    from rfgp.recipes._start import make_ard_kernel

    x = torch.randn(3, 26, dtype=torch.float64)
    for size in (3072, 13500):
        assert make_ard_kernel(size, 26, seed=0).base_kernel.features(x).shape == (3, size)
        mixture = lengthscale_mixture_kernel(size, torch.ones(3, 26, dtype=torch.float64),
                                             torch.tensor(1.0, dtype=torch.float64))
        assert sum(part.base_kernel.num_features for part in mixture.kernels) == size


def test_the_schedule_is_monotone_in_the_rows():
    plans = [_plan(n) for n in ROWS]
    budgets = [p.budget for p in plans]
    assert budgets == sorted(budgets)
    assert [p.subsample for p in plans] == sorted(p.subsample for p in plans)
    assert [p.refine_rows for p in plans] == sorted(p.refine_rows for p in plans)
    # At a fixed budget, more rows never buy more features on one path (the CG path beyond
    # the weight-space limit opens only where the rows are at least the features, so there
    # a larger set may afford more features than a smaller one is allowed), except where
    # the smaller set's plan reached its own rows: D = N already spans every function the
    # rows can tell apart, and the grid's next width above N is another set's.
    fixed = [_plan(n, time_budget=60.0, solve="weight").num_features for n in ROWS]
    for n, smaller, larger in zip(ROWS, fixed, fixed[1:]):
        assert smaller >= larger or smaller >= n, (n, smaller, larger)


def test_the_default_budget_is_linear_in_the_rows_and_covers_the_plan():
    assert default_budget(2 * 40000) - default_budget(40000) == pytest.approx(40000 / 400)
    for n in ROWS:
        plan = _plan(n)
        assert sum(plan.predicted.values()) <= plan.budget * (1 + 1e-12)


def test_the_local_stage_gets_more_starts_from_more_budget_and_at_most_d_plus_one():
    starts = [_plan(40000, d=9, time_budget=t).local_starts for t in (60, 120, 240, 960, 1e5)]
    assert starts == sorted(starts) and starts[-1] == 10
    assert _plan(40000, d=9, local_search=False, time_budget=1e5).local_starts == 0
    # No refinement (all rows in the subsample): no local stage.
    assert _plan(1500, time_budget=1e5).local_starts == 0


def test_a_small_budget_shrinks_the_refinement_and_skips_the_choice():
    tight, ample = _plan(40000, time_budget=10.0), _plan(40000, time_budget=1000.0)
    assert tight.refine_rows < ample.refine_rows and tight.refine_rows >= tight.subsample
    assert not _plan(1000, time_budget=1e-3).choose_bound
    assert _plan(1000, time_budget=100.0).choose_bound


def test_given_feature_counts_and_evidence_kinds():
    assert _plan(40000, num_features=1024).num_features == 1024
    assert _plan(800).search_evidence == "exact"
    assert _plan(1500).search_evidence == "blocks"
    assert _plan(1500, exact_rows=0).search_evidence == "features"
    assert _plan(5000).search_evidence == "features"


def test_the_options_are_checked_by_name():
    with pytest.raises(ValueError, match="time_budget"):
        RegressionOptions(time_budget=-1.0).checked()
    with pytest.raises(TypeError, match="machine_rate"):
        RegressionOptions(machine_rate="fast").checked()
    with pytest.raises(ValueError, match="num_features must be an even integer"):
        RegressionOptions(num_features=63).checked()
    with pytest.raises(TypeError, match="unknown option"):
        RegressionOptions().replace(num_feature=64)


def test_machine_rate_is_a_positive_rate():
    assert measure_machine_rate(64, 1) > 0
    with pytest.raises(TypeError, match="size"):
        measure_machine_rate(64.0)


def test_the_iterative_path_takes_over_beyond_the_weight_space_limit():
    from rfgp.inference._cg_cost import final_path, iterative_fit_cost
    from rfgp.inference._fit_cost import MAX_ITERATIVE_FEATURES

    # The default budget at the reference rate stays on the weight-space path while the rows
    # are within its limit, beyond it may take features by CG;
    # on 4 * 10^4 rows of 9 inputs twice the default takes well beyond the weight-space limit
    # by CG (two cores: the Krylov calibration costs a few CG fits, the first variances as
    # much again, and every pass reads all cached features at the memory's speed) ...
    for n in ROWS:
        plan = _plan(n)
        assert plan.final_solve == "weight" or MAX_WEIGHT_FEATURES < plan.num_features
    for factor in (1, 2):
        plan = _plan(40000, d=9, time_budget=factor * default_budget(40000))
        assert sum(plan.predicted.values()) <= plan.budget
    assert plan.final_solve == "cg" and plan.num_features >= 3 * MAX_WEIGHT_FEATURES // 2
    # ... a larger one buys more features by CG, past the rows where it pays for them (the
    # rows' count is no limit to a random-feature model: its Gram matrix approaches the
    # kernel's only as D grows), ...
    for n in (20000, 40000, 100000):
        plan = _plan(n, time_budget=2000.0)
        assert plan.final_solve == "cg"
        assert MAX_WEIGHT_FEATURES < plan.num_features <= MAX_ITERATIVE_FEATURES
        # ... where the weight-space path alone stops at its limit.
        assert _plan(n, time_budget=2000.0, solve="weight").num_features <= MAX_WEIGHT_FEATURES
    assert _plan(20000, time_budget=2000.0).num_features > 20000
    # The iterative cost grows linearly in D (beyond its fixed weight-space choice).
    base = iterative_fit_cost(40000, 8192, 8) - iterative_fit_cost(40000, 4096, 8)
    assert iterative_fit_cost(40000, 16384, 8) - iterative_fit_cost(40000, 8192, 8) == \
        pytest.approx(2 * base)
    # A given D takes the path that solve names.
    assert final_path(1000, 256, 4, "cg", forced=True)[0] == "cg"
    assert final_path(1000, 16384, 4, "weight", forced=True)[0] == "weight"
    assert _plan(3000, num_features=256, solve="cg").final_solve == "cg"


@pytest.mark.parametrize("n", [999, 1000, 1001, 1439, 3000, 7373, 8611, 10000, 16001])
def test_the_block_evidence_cost_counts_the_blocks_that_kd_blocks_cuts(n):
    # The cost of a block evidence is that of the blocks the local stage evaluates: as many
    # as kd_blocks cuts, each of their size (not ceil(N / max_rows) blocks of max_rows).
    blocks = kd_blocks(torch.randn(n, 3, generator=torch.Generator().manual_seed(n)), 1000)
    sizes = sorted({len(b) for b in blocks})
    assert exact_evidence_cost(n, 5, 1000) == len(blocks) * exact_evidence_cost(sizes[-1], 5)
    # Each block's cost: the Cholesky factor and its inverse (n^3) and the n x n passes.
    m = sizes[-1]
    assert exact_evidence_cost(m, 5) == pytest.approx(
        m**3 + (EXACT_ELEMENTWISE_COST + 5 * EXACT_DISTANCE_COST) * m * m)


def test_the_block_evidence_cost_grows_with_the_inputs_and_the_block_size():
    assert exact_evidence_cost(8000, 32, 1000) > exact_evidence_cost(8000, 4, 1000)
    assert exact_evidence_cost(8000, 8, 1000) < exact_evidence_cost(8000, 8, 2000)
    assert exact_evidence_cost(8000, 8, 1000) < exact_evidence_cost(8000, 8)


@pytest.mark.parametrize("args, error", [
    ((float("nan"), 3), TypeError), ((2.5, 3), TypeError), ((0, 3), ValueError),
    ((-5, 2), ValueError), ((100, -1), ValueError), ((100, 2.0), TypeError),
    ((100, 2, -3), ValueError), ((100, 2, True), TypeError),
])
def test_exact_evidence_cost_names_its_bad_arguments(args, error):
    # A negative block size used to halve forever; a NaN row count returned NaN.
    with pytest.raises(error, match="num_rows|input_dim|block_rows"):
        exact_evidence_cost(*args)


BUDGET_FACTORS = (0.125, 0.25, 0.375, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0,
                  16.0, 64.0)


@pytest.mark.parametrize("solve", ["auto", "cg", "weight"])
@pytest.mark.parametrize("d", [4, 9, 26])
def test_more_budget_never_buys_less(solve, d):
    # The plan is a function of the budget in which every stage's share only grows: the
    # final D, the refinement's rows and the local stage's starts.
    for n in ROWS:
        plans = [_plan(n, d=d, solve=solve, time_budget=factor * default_budget(n))
                 for factor in BUDGET_FACTORS]
        for field in ("num_features", "refine_rows", "local_starts", "subsample"):
            values = [getattr(p, field) for p in plans]
            assert values == sorted(values), (n, field, values)
        walks = [p.settings.get("refit", {}).get("scale_evaluations", 0) for p in plans]
        assert walks == sorted(walks), (n, walks)
        # The final fit's share, which the forecast at the fit spends on its D, grows too
        # and covers the planned D's fit (less the scale search's calibrations).
        shares = [p.settings["refit"]["share"] for p in plans]
        assert shares == sorted(shares), (n, shares)
        for p in plans:
            fit = p.predicted["refit"] * p.machine_rate - p.settings["refit"]["scale_cost"]
            assert p.settings["refit"]["share"] >= fit * (1 - 1e-12), (n, p.budget)


@pytest.mark.parametrize("solve", ["auto", "weight"])
@pytest.mark.parametrize("d", [9, 26])
def test_the_anytime_replan_never_buys_less(solve, d):
    # The final fit re-plans D from the seconds left when it starts: never below the plan's
    # D, never fewer for more seconds left or more budget, and always a size its path fits.
    from rfgp.recipes._refit import REPLAN_SHARE, replan_final

    for n in (5000, 13500, 40000):
        previous = [0] * 7
        for factor in BUDGET_FACTORS:
            opts = RegressionOptions(solve=solve,
                                     time_budget=factor * default_budget(n)).checked()
            plan = plan_regression(n, d, opts)
            sizes = []
            for fraction in (0.0, 0.1, 0.25, 0.5, 0.75, 1.0, 2.0):
                again = replan_final(plan, n, d, opts, fraction * plan.budget,
                                     opts.machine_rate)
                sizes.append(again.num_features)
                assert again.num_features >= plan.num_features
                assert again.final_solve in ("weight", "cg")
                assert again.final_solve == "weight" or again.num_features <= \
                    MAX_ITERATIVE_FEATURES
                if again is not plan:  # what it bought, it pays for from what was left
                    assert again.predicted["refit"] <= REPLAN_SHARE * fraction * plan.budget
            assert sizes == sorted(sizes), (n, factor, sizes)
            assert all(a >= b for a, b in zip(sizes, previous)), (n, factor, sizes, previous)
            previous = sizes


def test_the_replan_of_rows_behind_a_source_counts_a_pass_per_cg_product():
    # Rows read from a source at every pass cost the CG path more: the re-plan buys no more
    # features for them than for the rows in memory, and pays for what it buys streamed.
    from rfgp.recipes._refit import REPLAN_SHARE, replan_final

    n, d = 200000, 9
    opts = RegressionOptions(solve="cg").checked()
    plan = plan_regression(n, d, opts, streamed=True)
    seconds = 4 * plan.budget
    held = replan_final(plan, n, d, opts, seconds, opts.machine_rate)
    again = replan_final(plan, n, d, opts, seconds, opts.machine_rate, streamed=True)
    assert plan.num_features < again.num_features < held.num_features
    for replanned in (held, again):
        assert replanned.predicted["refit"] <= REPLAN_SHARE * seconds


def test_the_replan_keeps_a_given_feature_count_and_anytime_false():
    from rfgp.recipes._refit import replan_final

    for options in (dict(num_features=1024), dict(anytime=False)):
        opts = RegressionOptions(**options).checked()
        plan = plan_regression(13500, 26, opts)
        assert replan_final(plan, 13500, 26, opts, 1e6, opts.machine_rate) is plan


def test_the_cg_path_books_its_first_predictive_variances():
    # A CG fit's variances (a low-rank form or a dense factor of B, built at the first
    # prediction) cost about as much as the fit: the plan books them, so a budget buys fewer
    # features than it would for the fit alone, and the weight path books none.
    from rfgp.inference._cg_cost import final_path
    from rfgp.recipes._final_cost import variance_cost
    from rfgp.recipes._refit import compared
    from rfgp.recipes._schedule import Plan

    n, d = 40000, 9
    assert variance_cost(n, 8192, "weight") == 0.0 and variance_cost(n, 8192, None) == 0.0
    for factor in (2.0, 4.0):
        opts = RegressionOptions(time_budget=factor * default_budget(n)).checked()
        plan = plan_regression(n, d, opts)
        assert plan.final_solve == "cg"
        fit = final_path(n, plan.num_features, d, "auto",
                         compared(Plan(n, d, opts, 0.0)))[1]
        variances = variance_cost(n, plan.num_features, "cg")
        assert variances > 0.1 * fit  # not a rounding term
        assert plan.predicted["refit"] * plan.machine_rate >= fit + variances
        assert sum(plan.predicted.values()) <= plan.budget * (1 + 1e-12)


def test_the_booked_variances_take_the_rows_form_past_the_rows_where_it_is_open():
    # More features than rows, in memory: the dense route's K = I + Psi Psi^H (N^2 W / 2 +
    # N^3 / 3) is booked where it costs less than B (N W^2 + W^3 / 3); rows on a source (every
    # pass reads them, no feature is kept) and a spectrum too large for the difference's
    # precision book B's.
    from rfgp.inference._cg_dense import dense_fits, serving_cost
    from rfgp.recipes._final_cost import predicted_rows, variance_cost

    n, w = 3000, 6144  # B, K and the features within a quarter of any test machine's memory
    assert dense_fits(w, torch.float64, torch.device("cpu"))
    m = predicted_rows(n)
    slow = 1e4 / torch.arange(1, 513, dtype=torch.float64)  # no form serves: dense
    rows = variance_cost(n, w, "cg", slow)
    assert rows == serving_cost(w, n, m, slow, by_rows=True)
    assert rows < 0.5 * serving_cost(w, n, m, slow)
    assert variance_cost(n, w, "cg", slow, streamed=True) == serving_cost(w, n, m, slow)
    large = slow * 1e3  # lambda_max 1e7: (1 + lambda)^2 eps above a tenth of 1%
    assert variance_cost(n, w, "cg", large) == serving_cost(w, n, m, large)
    # fewer features than rows: B is the smaller matrix, the booking as before
    assert variance_cost(n, n // 2, "cg", slow) == serving_cost(n // 2, n, m, slow)


def test_more_budget_goes_to_features_while_they_are_below_the_rows():
    # Past the first local starts the budget buys features, not more starts: at 2x the
    # default the final model on 4 * 10^4 rows has more features than at 1x, and the local
    # stage takes at most its share.
    from rfgp.recipes._schedule import LOCAL_SHARE

    one, two = _plan(40000, d=9), _plan(40000, d=9, time_budget=2 * default_budget(40000))
    assert two.num_features > one.num_features
    for plan in (one, two):
        assert plan.predicted.get("local", 0.0) <= LOCAL_SHARE * plan.budget


@pytest.mark.slow
def test_a_larger_budget_fits_more_features_and_no_worse_evidence():
    # On 400 rows the plan buys 512 features at half a second and at least 16,384 (function
    # space) at one; the searches are the same, so the two final models differ in D alone. The
    # larger one's evidence is not worse beyond the spread of the 512-feature model's evidence
    # over feature draws (three standard deviations of five draws).
    from rfgp.inference._calibration import feature_model_evidence, maximize_scale_evidence
    from rfgp.recipes import FitReport, fit_auto
    from rfgp.recipes._start import make_ard_kernel, set_hyperparameters

    g = torch.Generator().manual_seed(0)
    x = torch.rand(400, 2, generator=g, dtype=torch.float64)
    y = torch.sin(6 * x[:, 0]) * torch.cos(3 * x[:, 1])
    y = y + 0.1 * torch.randn(400, generator=g, dtype=torch.float64)
    options = dict(seed=0, local_search=False, lengthscale_draws=0, cv_folds=0)
    reports = []
    for budget in (0.5, 1.0):
        report = FitReport()
        fit_auto(x, y, time_budget=budget, report=report, **options)
        reports.append(report)
    small, large = reports
    assert small.num_features == 512 and large.num_features >= 16384
    assert torch.allclose(small.lengthscale, large.lengthscale)

    def evidence(report):
        return -report.calibration["evidence"][report.calibration["chosen"]]

    draws = []
    centred = y - y.mean()
    for seed in range(5):
        kernel = make_ard_kernel(512, 2, seed=seed)
        set_hyperparameters(kernel, small.lengthscale, torch.tensor(1.0, dtype=torch.float64))
        _, _, loss = maximize_scale_evidence(feature_model_evidence(kernel, x, centred), 0.1)
        draws.append(-loss / 400)
    spread = float(torch.tensor(draws).std())
    assert evidence(large) >= evidence(small) - 3 * spread, (evidence(large), evidence(small),
                                                             spread)


@pytest.mark.parametrize("n", [60, 5000, 100000])
@pytest.mark.parametrize("solve", ["auto", "weight", "cg"])
def test_a_budget_beyond_the_float_range_is_planned_within_the_caps(n, solve):
    from rfgp.inference import MAX_ITERATIVE_FEATURES, final_path
    from rfgp.inference._fit_cost import MAX_FUNCTION_FEATURES

    # time_budget x machine_rate overflows to inf at 1e300 s: the plan is that of an
    # unbounded budget, every stage's prediction a number, the final fit on a path that
    # exists, at a feature count that path allows.
    caps = {"weight": MAX_FUNCTION_FEATURES if n < MAX_FUNCTION_FEATURES else MAX_WEIGHT_FEATURES,
            "cg": MAX_ITERATIVE_FEATURES}
    for budget in (1e300, 1.7e308):
        plan = _plan(n, 3, time_budget=budget, solve=solve)
        assert plan.final_solve in ("weight", "cg")
        assert plan.num_features <= caps[plan.final_solve]
        assert final_path(n, plan.num_features, 3, solve)[0] == plan.final_solve
        assert all(math.isfinite(seconds) for seconds in plan.predicted.values())
        # More budget never buys fewer features than a large finite one.
        assert plan.num_features >= _plan(n, 3, time_budget=1e6, solve=solve).num_features
    if solve == "auto":
        # On rows few enough for the N x N solve "auto" never solves by CG past them.
        assert n > 60 or plan.final_solve == "weight"


def test_huge_counts_cost_infinitely_many_multiply_adds():
    # Beyond the float range the count is inf (more than any budget), not an OverflowError.
    assert exact_evidence_cost(10**200, 4) == math.inf
    assert exact_evidence_cost(10**400, 4) == math.inf
    assert exact_evidence_cost(10**400, 4, 1000) == math.inf
    assert exact_evidence_cost(10**100, 10**400) == math.inf
    # Blocks of a huge row count are finitely many blocks of finite cost: n / 2^k blocks of
    # the same cost each (the blocks' rows in integer arithmetic).
    from rfgp.inference._blocks import kd_levels

    blocks = 2 ** kd_levels(10**100, 1000)
    per_block = exact_evidence_cost(-(-10**100 // blocks), 4)
    assert exact_evidence_cost(10**100, 4, 1000) == pytest.approx(blocks * per_block, rel=1e-12)


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, torch.complex64, "abc", None, 3])
def test_machine_rate_refuses_a_dtype_it_cannot_multiply_in(dtype):
    with pytest.raises(TypeError, match="dtype must be a floating torch dtype"):
        measure_machine_rate(64, 1, dtype=dtype)


def test_machine_rate_takes_a_dtype_by_name():
    assert measure_machine_rate(32, 1, dtype="float32") > 0


def test_the_machine_rate_is_the_reference_rate_scaled_by_the_product_speed(monkeypatch):
    # The cost model's unit is the reference machine's mixed work, not a bare product: a
    # machine whose products run as fast as the reference's gets the reference rate (its
    # product rate would budget three times the work its seconds hold), one twice as fast
    # twice it; the size and dtype reach the product's measurement.
    import rfgp.inference._machine_rate as rates

    asked = []

    def product(speed):
        def rate(size, repeats, dtype):
            asked.append((size, repeats, dtype))
            return speed * rates.REFERENCE_PRODUCT_RATE
        return rate

    monkeypatch.setattr(rates, "product_rate", product(1.0))
    assert measure_machine_rate() == pytest.approx(RegressionOptions().machine_rate, rel=1e-12)
    monkeypatch.setattr(rates, "product_rate", product(2.0))
    assert measure_machine_rate(256, 2, "float32") == pytest.approx(
        2 * rates.REFERENCE_RATE, rel=1e-12)
    assert asked == [(1024, 3, torch.float64), (256, 2, "float32")]
    assert rates.REFERENCE_PRODUCT_RATE > rates.REFERENCE_RATE


def test_stages_faster_than_forecast_leave_the_rate_and_slower_ones_lower_it():
    # A stage that ended early did less work (its L-BFGS converged), and the seconds it saved
    # are left over already: the re-plan at a quarter of the forecast equals the one at the
    # forecast (the same seconds left), while a stage eight times slower than forecast
    # lowers the rate and with it the final D.
    import time

    from rfgp.recipes import FitReport
    from rfgp.recipes._regression import replanned
    from rfgp.recipes._stage import RecipeData

    x, y = torch.zeros(40000, 9, dtype=torch.float64), torch.zeros(40000, dtype=torch.float64)
    opts = RegressionOptions().checked()
    plan = plan_regression(40000, 9, opts)
    data = RecipeData(opts, plan, x, y, x, y, torch.ones(9, dtype=torch.float64), 1.0,
                      torch.Generator())

    def replan(share):
        report = FitReport.begin(None, plan)
        report.seconds["search"] = plan.predicted["search"] * share
        return replanned(data, report, time.perf_counter()).schedule.num_features

    as_forecast = replan(1.0)
    assert replan(0.25) == as_forecast
    assert replan(8.0) < as_forecast


def test_the_final_fit_replans_at_the_rate_the_stages_before_achieved():
    # Stages that ran four times faster than predicted leave the budget to the features: the
    # final D grows (on 4 * 10^4 rows of 9 inputs, by CG), the report shows the new
    # schedule, and anytime=False keeps the planned one.
    import time

    from rfgp.recipes import FitReport
    from rfgp.recipes._regression import replanned
    from rfgp.recipes._stage import RecipeData

    x, y = torch.zeros(40000, 9, dtype=torch.float64), torch.zeros(40000, dtype=torch.float64)
    for anytime in (True, False):
        opts = RegressionOptions(anytime=anytime).checked()
        plan = plan_regression(40000, 9, opts)
        data = RecipeData(opts, plan, x, y, x, y, torch.ones(9, dtype=torch.float64), 1.0,
                          torch.Generator())
        report = FitReport.begin(None, plan)
        report.seconds["search"] = plan.predicted["search"] / 4
        again = replanned(data, report, time.perf_counter())
        if anytime:
            assert again.schedule.num_features > plan.num_features
            assert again.schedule.num_features <= 40000 and again.schedule.final_solve == "cg"
            assert report.num_features == again.schedule.num_features
        else:
            assert again is data and report.num_features == plan.num_features


@pytest.mark.parametrize("d", [4, 9, 26])
def test_the_lengthscale_walk_is_booked_before_the_stages_it_must_not_wait_for(d):
    # The final fit's lengthscale walk is booked from what the search and the final fit's
    # share leave: the refinement, the local stage and the Laplace average (whose shares do
    # not depend on what is left) cannot crowd it out, nor can the final fit's growth. A
    # schedule of the search and the final fit alone books the same walk.
    from rfgp.recipes._options import RegressionOptions as Options
    from rfgp.recipes._refit import REFIT
    from rfgp.recipes._regression import STAGES
    from rfgp.recipes._scale import SCALE_EVALUATIONS
    from rfgp.recipes._schedule import plan_stages
    from rfgp.recipes._search import SEARCH

    booked = 0
    for n in (5000, 9000, 20000, 40000):
        for factor in BUDGET_FACTORS[:10]:
            opts = Options(time_budget=factor * default_budget(n)).checked()
            full = plan_stages(n, d, opts, STAGES).settings["refit"]
            alone = plan_stages(n, d, opts, (SEARCH, REFIT)).settings["refit"]
            assert full["scale_evaluations"] == alone["scale_evaluations"], (n, factor)
            assert full["scale_evaluations"] <= SCALE_EVALUATIONS
            booked += full["scale_evaluations"] > 0
    assert booked  # the default budgets afford a walk
