"""fit_auto on rows it does not hold: numpy memory-maps and re-iterable chunk sources."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rfgp import fit_auto
from rfgp._data import (
    MOMENT_BITS,
    PERMUTATION_ROWS,
    ArraySource,
    ChunkSource,
    draw_rows,
    source_moments,
)
from rfgp._units import column_scale
from rfgp.recipes import FitReport

DT = torch.float64
# Few rows and features, but more rows than the refinement reads: the search stages draw
# their rows from the source and the final fit streams every row.
OPTIONS = dict(subsample=250, refine_rows=500, search_features=64, num_features=256, seed=0,
               time_budget=30, max_iterations=60)


def _data(n=1600, dtype=DT):
    g = torch.Generator().manual_seed(0)
    x = torch.rand(n, 3, generator=g, dtype=dtype) * torch.tensor([1.0, 4.0, 0.5], dtype=dtype)
    y = torch.sin(4 * x[:, 0]) + 0.3 * x[:, 1] + 0.1 * torch.randn(n, generator=g, dtype=dtype)
    return x, y - y.mean()


def _memmap(tmp_path, x, y):
    np.save(tmp_path / "x.npy", x.numpy())
    np.save(tmp_path / "y.npy", y.numpy())
    return (np.load(tmp_path / "x.npy", mmap_mode="r"),
            np.load(tmp_path / "y.npy", mmap_mode="r"))


def test_memmap_chunks_and_memory_give_the_same_model(tmp_path):
    x, y = _data()
    xt = torch.rand(40, 3, generator=torch.Generator().manual_seed(1), dtype=DT)
    in_memory = fit_auto(x, y, **OPTIONS)
    xm, ym = _memmap(tmp_path, x, y)
    report = FitReport()
    mapped = fit_auto(xm, ym, report=report, **OPTIONS)
    # uneven chunks, neither a divisor of the rows nor of the passes' chunk
    chunks = [(x[i:i + 700], y[i:i + 700]) for i in range(0, x.shape[0], 700)]
    chunked = fit_auto(chunks, **OPTIONS)
    assert isinstance(xm, np.memmap)  # the recipe did not need it in memory
    assert report.subsample == 250 and report.refine_rows == 500 < x.shape[0]
    mean, std = in_memory.predict(xt, return_std=True)
    for gp in (mapped, chunked):
        m, s = gp.predict(xt, return_std=True)
        # The same rows, draws and chunk sums: only the final fit's rounding differs (the
        # in-memory fit reuses the calibration's Gram matrix, a stream forms it again), a
        # few units of float64 rounding amplified by B's condition.
        torch.testing.assert_close(m, mean, rtol=1e-9, atol=1e-9 * float(mean.abs().max()))
        torch.testing.assert_close(s, std, rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(gp.noise, in_memory.noise, rtol=1e-10, atol=0)


def test_cg_fit_on_a_memmap_and_chunks_equals_the_in_memory_cg_fit(tmp_path):
    # solve="cg" on rows behind a source: the Krylov calibration's and the fit's products
    # are passes over the chunks, never the N x D features or a D x D matrix
    x, y = _data()
    opts = dict(OPTIONS, solve="cg", num_features=512)
    xt = torch.rand(40, 3, generator=torch.Generator().manual_seed(1), dtype=DT)
    in_memory = fit_auto(x, y, **opts)
    xm, ym = _memmap(tmp_path, x, y)
    report = FitReport()
    mapped = fit_auto(xm, ym, report=report, **opts)
    chunked = fit_auto([(x[i:i + 700], y[i:i + 700]) for i in range(0, x.shape[0], 700)],
                       **opts)
    assert report.schedule.final_solve == "cg" and report.refine_rows < x.shape[0]
    assert "iterative" in report.calibration
    mean, std = in_memory.predict(xt, return_std=True)
    tolerance = in_memory.cg_settings.tolerance_for(DT)
    # k(x, x) of the features, the bound on the variance's CG error below
    prior = in_memory.feature_map.real_rows(xt).square().sum(-1).detach()
    for gp in (mapped, chunked):
        assert gp.solve_used == "cg" and isinstance(gp.noise, torch.Tensor)
        # the same rows, probes and chunks: the calibration's root agrees to rounding
        torch.testing.assert_close(gp.noise, in_memory.noise, rtol=1e-8, atol=0)
        m, s = gp.predict(xt, return_std=True)
        # each mean solve stops within `tolerance` posterior standard deviations of its
        # exact mean at every input (the energy-norm bound), so two fits differ by at most
        # twice that
        assert bool(((m - mean).abs() <= 2 * tolerance * std + 1e-12).all())
        # a variance phi^T u, B u = phi to relative residual tol, is off by at most
        # tol ||phi||^2 (B >= I): twice that between two fits
        assert bool(((s.square() - std.square()).abs() <= 2 * tolerance * prior).all())


def test_uncalibrated_stream_fit_equals_the_in_memory_fit(tmp_path):
    # without calibration no Gram matrix is formed before the fit: the rows are streamed
    x, y = _data(1200)
    opts = dict(OPTIONS, calibrate=False, lengthscale_draws=0, local_search=False)
    xm, ym = _memmap(tmp_path, x, y)
    mean, std = fit_auto(x, y, **opts).predict(x[:30], return_std=True)
    m, s = fit_auto(xm, ym, **opts).predict(x[:30], return_std=True)
    torch.testing.assert_close(m, mean, rtol=1e-9, atol=1e-9 * float(mean.abs().max()))
    torch.testing.assert_close(s, std, rtol=1e-9, atol=1e-12)


def test_float32_memmap_is_fitted_in_float32(tmp_path):
    x, y = _data(2000, torch.float32)
    xm, ym = _memmap(tmp_path, x, y)
    gp = fit_auto(xm, ym, **OPTIONS)
    assert gp.dtype == torch.float32
    mean = gp.predict(x[:200])
    # the signal's variance is about 0.2; the noise's 0.01: the fit explains most of it
    residual = float((mean - y[:200]).square().mean())
    assert residual < 0.03


def test_a_callable_chunk_source_and_a_dataloader(tmp_path):
    x, y = _data(1500)
    opts = dict(OPTIONS, refine_rows=400, subsample=200)

    def chunks():
        for i in range(0, 1500, 256):
            yield x[i:i + 256], y[i:i + 256]

    from torch.utils.data import DataLoader, TensorDataset

    loader = DataLoader(TensorDataset(x, y), batch_size=300, shuffle=False)
    a = fit_auto(chunks, **opts).predict(x[:20])
    b = fit_auto(loader, **opts).predict(x[:20])
    c = fit_auto(x, y, **opts).predict(x[:20])
    torch.testing.assert_close(a, c, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(b, c, rtol=1e-9, atol=1e-9)


def test_bad_chunks_name_the_row():
    x, y = _data(1200)
    x = x.clone()
    x[1033, 1] = float("nan")
    parts = [(x[i:i + 500], y[i:i + 500]) for i in range(0, 1200, 500)]
    with pytest.raises(ValueError, match="row 1033"):
        fit_auto(parts, **OPTIONS)
    with pytest.raises(ValueError, match="row 1033"):
        fit_auto(x.numpy(), y.numpy(), **OPTIONS)
    with pytest.raises(TypeError, match="one-shot iterator"):
        fit_auto(iter(parts), **OPTIONS)
    with pytest.raises(ValueError, match="y must be None"):
        fit_auto(parts, y, **OPTIONS)
    wide = [(torch.zeros(5, 3, dtype=DT), torch.zeros(5, dtype=DT)),
            (torch.zeros(5, 4, dtype=DT), torch.zeros(5, dtype=DT))]
    with pytest.raises(ValueError, match="starting at row 5 .*3 input columns"):
        fit_auto(wide, **OPTIONS)
    with pytest.raises(TypeError, match="float32 or float64"):
        fit_auto(np.zeros((10, 2), dtype=np.int64), np.zeros(10), **OPTIONS)


def test_changing_chunk_source_is_an_error():
    x, y = _data(1200)
    calls = []

    def shrinking():
        calls.append(1)
        rows = 1200 if len(calls) == 1 else 1100
        return iter([(x[:rows], y[:rows])])

    with pytest.raises(RuntimeError, match="1200 rows in the first pass and 1100"):
        fit_auto(shrinking, **OPTIONS)


def test_source_moments_equal_the_in_memory_statistics():
    x, y = _data(3001)
    x = x * 1e200  # squares would overflow: the moments are of x over a power of two
    for source in (ArraySource(x, y), ChunkSource([(x[:1000], y[:1000]), (x[1000:], y[1000:])])):
        found = source_moments(source, rows_per_chunk=700)
        assert found.num_rows == 3001
        # equal to rounding, then rounded to MOMENT_BITS significant bits
        tolerance = 2.0**-MOMENT_BITS
        torch.testing.assert_close(found.column_scale, column_scale(x), rtol=tolerance, atol=0)
        assert found.target_rms == pytest.approx(float(y.square().mean().sqrt()),
                                                 rel=tolerance)
    # the same rows cut into other chunks give the same moments, bit for bit
    other = source_moments(ArraySource(x, y), rows_per_chunk=97)
    assert torch.equal(other.column_scale, found.column_scale)
    assert other.target_rms == found.target_rms
    # each target column's mean (the recipe's prior mean centres the moments by it)
    two = torch.stack([y + 2.5, -3.0 * y], -1)
    found = source_moments(ArraySource(x, two), rows_per_chunk=700)
    torch.testing.assert_close(found.target_mean, two.mean(0), rtol=2.0**-MOMENT_BITS,
                               atol=1e-15)


def test_take_returns_rows_in_the_asked_order():
    x, y = _data(1000)
    rows = torch.tensor([999, 0, 500, 3, 998])
    for source in (ArraySource(x.numpy(), y.numpy()),
                   ChunkSource(lambda: iter([(x[:333], y[:333]), (x[333:], y[333:])]))):
        xs, ys = source.take(rows)
        torch.testing.assert_close(xs, x[rows], rtol=0, atol=0)
        torch.testing.assert_close(ys, y[rows], rtol=0, atol=0)
    sizes = [c[0].shape[0] for c in ChunkSource([(x[:333], y[:333]), (x[333:], y[333:])]).chunks(
        400)]
    assert sizes == [400, 400, 200]


@pytest.mark.parametrize("num_rows", [5000, 10 * PERMUTATION_ROWS])
def test_draw_rows_is_a_uniform_prefix_stable_draw(num_rows):
    short = draw_rows(num_rows, 300, torch.Generator().manual_seed(3))
    long = draw_rows(num_rows, 2000, torch.Generator().manual_seed(3))
    assert torch.equal(long[:300], short)  # a longer draw extends a shorter one
    assert long.unique().numel() == 2000 and 0 <= int(long.min()) and int(long.max()) < num_rows
    if num_rows <= PERMUTATION_ROWS:  # the in-memory recipes' draw, unchanged
        perm = torch.randperm(num_rows, generator=torch.Generator().manual_seed(3))
        assert torch.equal(long, perm[:2000])
    # uniform ids: mean (N - 1) / 2, standard error N / sqrt(12 * 2000); 5 standard errors
    mean = float(long.double().mean())
    assert abs(mean - (num_rows - 1) / 2) < 5 * num_rows / (12 * 2000) ** 0.5


def test_estimator_fits_memmaps_and_chunks_as_arrays(tmp_path):
    from rfgp.sklearn import RandomFeatureGPRegressor

    rng = np.random.default_rng(0)
    X = rng.uniform(0, 1, (600, 2))
    y = np.sin(4 * X[:, 0]) + 3.0 + 0.1 * rng.standard_normal(600)
    xm, ym = _memmap(tmp_path, torch.from_numpy(X), torch.from_numpy(y))
    params = dict(num_features=128, random_state=0, time_budget=20, lengthscale_draws=0,
                  max_lengthscale=None, local_search=False)
    in_memory = RandomFeatureGPRegressor(**params).fit(X, y)
    mapped = RandomFeatureGPRegressor(**params).fit(xm, ym)
    chunked = RandomFeatureGPRegressor(**params).fit(
        lambda: ((X[i:i + 250], y[i:i + 250]) for i in range(0, 600, 250)))
    assert mapped.n_features_in_ == chunked.n_features_in_ == 2
    mean, std = in_memory.predict(X[:40], return_std=True)
    for reg in (mapped, chunked):
        # a memory-mapped query is predicted chunk by chunk
        m, s = reg.predict(xm[:40], return_std=True)
        # the targets are standardised by streamed moments: equal to rounding, which the
        # evidence search carries to about 1e-9 of the predictions
        np.testing.assert_allclose(m, mean, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(s, std, rtol=1e-5, atol=1e-8)
    np.testing.assert_allclose(mapped.predict(X[:40]), chunked.predict(X[:40]), rtol=1e-12)
    with pytest.raises(ValueError, match="optimizer='auto'"):
        RandomFeatureGPRegressor(optimizer="lbfgs").fit([(X, y)])


def test_schedule_at_scale_search_constant_final_fit_linear_in_rows():
    from rfgp.recipes._options import RegressionOptions
    from rfgp.recipes._regression import plan_regression

    # rows behind a memory-map, chunks or shards, planned on the weight path
    opts = RegressionOptions(solve="weight").checked()
    plans = {n: plan_regression(n, 10, opts, streamed=True) for n in (10**7, 10**8, 10**9)}
    # the default budget keeps the final D (its most weight-space features) at every size
    assert {plan.num_features for plan in plans.values()} == {8192}
    for stage in ("search", "refine", "local", "laplace"):
        assert len({plan.predicted[stage] for plan in plans.values()}) == 1
    # the final fit: a + b N (the D^3 eigendecompositions and factor, the features and Gram
    # matrices per row), so its increments over 9 10^7 and 9 10^8 rows differ tenfold
    refit = [plans[n].predicted["refit"] for n in (10**7, 10**8, 10**9)]
    assert (refit[2] - refit[1]) / (refit[1] - refit[0]) == pytest.approx(10.0, rel=1e-9)
    assert refit[0] < refit[1] < refit[2] < 10 * refit[1]
    for plan in plans.values():
        assert sum(plan.predicted.values()) <= plan.budget


def test_schedule_of_rows_behind_a_source_counts_a_pass_per_cg_product():
    from rfgp.inference import final_path
    from rfgp.inference._cg_cost import (
        CALIBRATION_RUNS,
        CG_ITERATIONS,
        PROBE_RUN_SHARE,
        SKETCH_PASSES,
        iterative_fit_cost,
    )
    from rfgp.recipes._options import RegressionOptions
    from rfgp.recipes._regression import plan_regression

    n, m, d = 10**6, 16384, 10
    # the streamed fit recomputes the features N D (d + 4) at every pass where the cached
    # fit computes them once: b, the trace's probes, the sketch's blocks and one pass per CG
    # iteration of the calibration's runs (the targets' run, then the probes' own, a
    # PROBE_RUN_SHARE as long); the fit's I iterations, its b and its sketch
    runs = CALIBRATION_RUNS * CG_ITERATIONS * (1 + PROBE_RUN_SHARE)
    passes = (2 + SKETCH_PASSES + runs - 1) + (CG_ITERATIONS + 1)
    cached = iterative_fit_cost(n, m, d, cache_bytes=float("inf"))  # every feature held
    extra = iterative_fit_cost(n, m, d, streamed=True) - cached
    assert extra == pytest.approx(passes * n * m * (d + 4), rel=1e-12)
    assert final_path(n, m, d, "auto", streamed=True) == (
        "cg", iterative_fit_cost(n, m, d, streamed=True))
    # "auto" on a source takes the CG path beyond the weight-space limit where the budget
    # pays for it, and buys no more features than on rows in memory (cached features; the
    # final model not calibrated, whose scale search runs on rows in memory alone)
    opts = RegressionOptions(time_budget=20000.0, calibrate=False).checked()
    streamed = plan_regression(n, d, opts, streamed=True)
    in_memory = plan_regression(n, d, opts)
    assert streamed.final_solve == "cg" and streamed.num_features > 8192
    assert streamed.num_features <= in_memory.num_features
    # (the final fits compared, without the in-memory fit's lengthscale walk: a source books
    # none)
    held = plan_regression(n, d, opts.replace(num_features=streamed.num_features))
    walk = held.settings.get("refit", {}).get("scale_cost", 0.0) / held.machine_rate
    assert "scale_cost" not in streamed.settings.get("refit", {})
    assert streamed.predicted["refit"] > held.predicted["refit"] - walk


def test_a_budget_below_the_cheapest_plan_warns():
    from rfgp.recipes._options import RegressionOptions
    from rfgp.recipes._regression import _warn_over_budget, plan_regression

    tight = RegressionOptions(time_budget=600.0).checked()
    with pytest.warns(UserWarning, match="predicted to take about"):
        _warn_over_budget(plan_regression(10**8, 10, tight), 10**8, tight)
    import warnings

    default = RegressionOptions().checked()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _warn_over_budget(plan_regression(10**7, 10, default), 10**7, default)
        _warn_over_budget(plan_regression(10**7, 10, tight), 10**7, tight)


def _resident_bytes(path) -> int:
    """Resident bytes of this process's mappings of ``path`` (Linux ``/proc/self/smaps``)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split()
            if head and "-" in head[0] and len(head) >= 5:  # a mapping's first line
                inside = line.rstrip().endswith(str(path))
            elif inside and head and head[0] == "Rss:":
                total += int(head[1]) * 1024
    return total


@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/smaps"),
                    reason="needs /proc/self/smaps (Linux)")
def test_a_pass_over_a_memmap_leaves_its_pages_unmapped(tmp_path):
    # 2^20 rows x 4 float32 = 16 MiB: after a pass (and after a draw of rows), the file's
    # resident pages are at most a chunk's, not the file's, so a pass over a file larger than
    # memory does not grow the process; prediction over a memory-map reads it the same way.
    from rfgp._data import array_row_chunks

    path = tmp_path / "x.npy"
    rows = 1 << 20
    data = np.random.default_rng(0).random((rows, 4), dtype=np.float32)
    np.save(path, data)
    np.save(tmp_path / "y.npy", np.zeros(rows, dtype=np.float32))
    x = np.load(path, mmap_mode="r")
    source = ArraySource(x, np.load(tmp_path / "y.npy", mmap_mode="r"))
    total = sum(float(cx.sum()) for cx, _ in source.chunks(4096))
    assert total == pytest.approx(float(data.astype(np.float64).sum()), rel=1e-6)
    assert _resident_bytes(path) <= 4096 * 4 * 4 + 2 * 4096 * 2  # (one chunk, a page each side)
    source.take(torch.arange(0, rows, 97))
    assert _resident_bytes(path) <= 4096 * 4 * 4 + 2 * 4096 * 2
    assert sum(c.shape[0] for c in array_row_chunks(x, 8192)) == rows
    assert _resident_bytes(path) <= 4096 * 4 * 4 + 2 * 4096 * 2
    # a copy-on-write map is never released (that would drop the caller's changes)
    writable = np.load(path, mmap_mode="c")
    writable[0, 0] = -1.0
    list(ArraySource(writable, np.zeros(rows, dtype=np.float32)).chunks(1 << 18))
    assert writable[0, 0] == -1.0


def test_a_weight_space_plan_fitted_by_cg_on_a_memmap_equals_the_in_memory_fit(tmp_path,
                                                                              monkeypatch):
    # The final fit's forecast may put a weight-space plan on the CG path (where CG
    # converges in a few iterations); on rows behind a source that fit streams its passes
    # and gives the in-memory model, as a CG plan does.
    import rfgp.recipes._refit as refit
    from rfgp.inference._cg_forecast import CGForecast

    switched = []

    def by_cg(data, choice, candidates, grow=True):
        switched.append(data.schedule.final_solve)
        return CGForecast(data.schedule.num_features, 256, 10.0, 2.0, 1.0), "features"

    monkeypatch.setattr(refit, "forecast_final", by_cg)
    x, y = _data(2500)
    opts = dict(seed=0, local_search=False, lengthscale_draws=0, cv_folds=0, subsample=1000,
                time_budget=12.0, anytime=False, max_iterations=60)
    xt = torch.rand(40, 3, generator=torch.Generator().manual_seed(1), dtype=DT)
    in_memory = fit_auto(x, y, **opts)
    xm, ym = _memmap(tmp_path, x, y)
    report = FitReport()
    mapped = fit_auto(xm, ym, report=report, **opts)
    assert switched == ["weight", "weight"] and report.num_features > 2048
    assert report.schedule.final_solve == "cg" and mapped.solve_used == "cg"
    torch.testing.assert_close(mapped.noise, in_memory.noise, rtol=1e-8, atol=0)
    mean, std = in_memory.predict(xt, return_std=True)
    m, s = mapped.predict(xt, return_std=True)
    tolerance = in_memory.cg_settings.tolerance_for(DT)
    assert bool(((m - mean).abs() <= 2 * tolerance * std + 1e-12).all())
