"""fit_auto(..., distributed=True) over two gloo processes on localhost."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.distributed as dist

from rfgp import fit_auto
from rfgp._data import ArraySource, ShardedSource, draw_rows
from rfgp.sklearn import RandomFeatureGPRegressor
from tests import ranks

DT = torch.float64
WORLD = 2
ROWS, SPLIT = 1500, 640  # uneven shards
OPTIONS = dict(subsample=250, refine_rows=500, search_features=64, num_features=256, seed=0,
               time_budget=30, max_iterations=60, lengthscale_draws=8)
CG_OPTIONS = dict(OPTIONS, solve="cg", num_features=512)
ESTIMATOR = dict(num_features=128, random_state=0, time_budget=20, lengthscale_draws=0,
                 max_lengthscale=None, local_search=False)


def _data():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(ROWS, 3, generator=g, dtype=DT) * torch.tensor([1.0, 4.0, 0.5], dtype=DT)
    y = torch.sin(4 * x[:, 0]) + 0.3 * x[:, 1] + 0.1 * torch.randn(ROWS, generator=g, dtype=DT)
    xt = torch.rand(30, 3, generator=g, dtype=DT)
    return x, y - y.mean(), xt


def _shard(rank):
    return slice(0, SPLIT) if rank == 0 else slice(SPLIT, ROWS)


def _error(work):
    try:
        work()
    except Exception as error:  # the test checks its kind and message
        return type(error).__name__, str(error)
    return None


def _failing(xs, ys, rank, fail_at):
    """A chunk source whose reads on rank 1 fail, from its ``fail_at``-th pass on, at its
    third chunk; ``opens`` counts the passes."""
    opens = []

    def chunks():
        opens.append(1)
        for i in range(0, xs.shape[0], 200):
            if rank == 1 and len(opens) >= fail_at and i >= 400:
                raise OSError("the disk went away")
            yield xs[i:i + 200], ys[i:i + 200]

    return chunks, opens


def _worker(rank, store_path, out_path, scenario):
    ranks.join(rank, store_path, WORLD)
    try:
        x, y, xt = _data()
        xs, ys = x[_shard(rank)], y[_shard(rank)]
        results = {}
        if scenario == "errors":
            # the sharded source returns the global rows of one draw
            source = ShardedSource(lambda: ArraySource(xs, ys))
            results["rows"] = source.take(draw_rows(ROWS, 300, torch.Generator().manual_seed(5)))
            # a NaN target in row 7 of rank 1's shard
            bad = ys.clone()
            if rank == 1:
                bad[7] = float("nan")
            results["nan"] = _error(lambda: fit_auto(xs, bad, distributed=True, **OPTIONS))
            # one more input column on rank 1
            wide = torch.cat([xs, xs[:, :1]], 1) if rank == 1 else xs
            results["columns"] = _error(lambda: fit_auto(wide, ys, distributed=True, **OPTIONS))
            # an empty shard on rank 0
            empty = [] if rank == 0 else [(xs, ys)]
            results["empty"] = _error(lambda: fit_auto(empty, distributed=True, **OPTIONS))
            # rank 1's reads fail in its second pass (the moments'), after rank 0 has read
            chunks, _ = _failing(xs, ys, rank, 2)
            results["read"] = _error(lambda: fit_auto(chunks, distributed=True, **OPTIONS))
        elif scenario == "cg":
            # solve="cg": every product of the calibration and the fit a pass over each
            # rank's rows, all-reduced
            shard = ([(xs[i:i + 200], ys[i:i + 200]) for i in range(0, xs.shape[0], 200)], None)
            gp = fit_auto(*(shard if rank == 1 else (xs, ys)), distributed=True, **CG_OPTIONS)
            results["mean"], results["std"] = gp.predict(xt, return_std=True)
            results["noise"] = gp.noise.detach()
            results["solve"] = gp.solve_used
            # rank 1's reads fail in the last but one pass, one of the fit's CG products
            chunks, opens = _failing(xs, ys, rank, 10**9)
            fit_auto(chunks, distributed=True, **CG_OPTIONS)
            passes = len(opens)
            chunks, _ = _failing(xs, ys, rank, passes - 1)
            results["read"] = _error(lambda: fit_auto(chunks, distributed=True, **CG_OPTIONS))
        else:
            # a shard of chunks, one of tensors: either form on either rank
            shard = ([(xs[i:i + 200], ys[i:i + 200]) for i in range(0, xs.shape[0], 200)], None)
            gp = fit_auto(*(shard if rank == 1 else (xs, ys)), distributed=True, **OPTIONS)
            results["mean"], results["std"] = gp.predict(xt, return_std=True)
            results["noise"] = gp.noise.detach()
            # the estimator: targets standardised by every shard's moments
            reg = RandomFeatureGPRegressor(distributed=True, **ESTIMATOR).fit(
                xs.numpy(), ys.numpy() + 3.0)
            results["estimator"] = torch.from_numpy(reg.predict(xt.numpy()))
            # rank 1's reads fail in the final fit's stream (without calibration the fit
            # streams the rows once more), its last pass
            chunks, opens = _failing(xs, ys, rank, 10**9)
            fit_auto(chunks, distributed=True, calibrate=False, **OPTIONS)
            passes = len(opens)
            chunks, _ = _failing(xs, ys, rank, passes)
            results["read"] = _error(lambda: fit_auto(chunks, distributed=True, calibrate=False,
                                                      **OPTIONS))
        ranks.leave(results, out_path, rank)
    finally:
        dist.destroy_process_group()


def _run(tmp_path, scenario):
    """The worker on two processes (:func:`tests.ranks.run`)."""
    return ranks.run(_worker, tmp_path, (scenario,), WORLD)


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")
def test_bad_shards_and_failing_reads_raise_on_every_rank(tmp_path):
    results = _run(tmp_path, "errors")
    x, y, _ = _data()
    rows = draw_rows(ROWS, 300, torch.Generator().manual_seed(5))
    for res in results:
        # the subsample does not depend on the number of ranks: global rows in rank order
        torch.testing.assert_close(res["rows"][0], x[rows], rtol=0, atol=0)
        torch.testing.assert_close(res["rows"][1], y[rows], rtol=0, atol=0)
        kind, message = res["nan"]
        assert kind == "ValueError" and "row 7 of rank 1" in message
        kind, message = res["columns"]
        assert kind == "ValueError" and "rank 1 holds 4 input columns" in message
        kind, message = res["empty"]
        assert kind == "ValueError" and "rank 0" in message and "no rows" in message
        kind, message = res["read"]
        assert kind == "RuntimeError" and "rank 1" in message and "disk went away" in message


@pytest.mark.slow
@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")
def test_two_processes_fit_the_one_process_model(tmp_path):
    results = _run(tmp_path, "fit")
    x, y, xt = _data()
    single = fit_auto(x, y, **OPTIONS)
    mean, std = single.predict(xt, return_std=True)
    scale = float(mean.abs().max())
    for res in results:
        # the same model as one process: only the sums' association differs
        torch.testing.assert_close(res["mean"], mean, rtol=1e-8, atol=1e-8 * scale)
        torch.testing.assert_close(res["std"], std, rtol=1e-8, atol=1e-10)
        # (the noise is an optimum of those sums: their last bits move it by about 1e-9)
        torch.testing.assert_close(res["noise"], single.noise.detach(), rtol=1e-8, atol=0)
        # a read failing in the final fit's stream, after its first collectives
        kind, message = res["read"]
        assert kind == "RuntimeError" and "rank 1" in message and "disk went away" in message
    torch.testing.assert_close(results[0]["mean"], results[1]["mean"], rtol=0, atol=0)
    reg = RandomFeatureGPRegressor(**ESTIMATOR).fit(x.numpy(), y.numpy() + 3.0)
    expected = reg.predict(xt.numpy())
    for res in results:
        # the standardisation's moments are merged over shards: equal to rounding, which the
        # evidence search carries to about 1e-9 of the predictions
        np.testing.assert_allclose(res["estimator"].numpy(), expected, rtol=1e-6)


@pytest.mark.slow
@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")
def test_two_processes_fit_the_one_process_model_by_cg(tmp_path):
    results = _run(tmp_path, "cg")
    x, y, xt = _data()
    single = fit_auto(x, y, **CG_OPTIONS)
    mean, std = single.predict(xt, return_std=True)
    tolerance = single.cg_settings.tolerance_for(DT)
    prior = single.feature_map.real_rows(xt).square().sum(-1).detach()
    for res in results:
        assert res["solve"] == "cg"
        # the calibration's products differ from one process's by their sums' association
        torch.testing.assert_close(res["noise"], single.noise.detach(), rtol=1e-8, atol=0)
        # each mean within `tolerance` posterior standard deviations of its exact mean, each
        # variance within tolerance ||phi||^2 (B >= I): twice that between two fits
        assert bool(((res["mean"] - mean).abs() <= 2 * tolerance * std + 1e-12).all())
        assert bool(((res["std"].square() - std.square()).abs() <= 2 * tolerance * prior).all())
        # a read failing inside the fit's CG products is raised on every rank
        kind, message = res["read"]
        assert kind == "RuntimeError" and "rank 1" in message and "disk went away" in message
    # the ranks ran the same iterations on the same all-reduced products
    torch.testing.assert_close(results[0]["mean"], results[1]["mean"], rtol=0, atol=0)


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")
def test_a_failure_raised_on_every_rank_holds_no_reference_cycle(tmp_path):
    # What the failed work's frames held is freed with the error, by reference counting: a
    # cycle through the failure's traceback would keep it (and the collectives' tensors) to
    # a later garbage collection, at worst to the interpreter's exit after the process group
    # is gone, where gloo aborts the process.
    import gc
    import weakref

    from rfgp._data._sharded import gather_checked

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    held = []

    def work():
        rows = torch.zeros(100)
        held.append(weakref.ref(rows))
        raise OSError("the disk went away")

    gc.disable()
    try:
        message = ""
        try:
            gather_checked(work)
        except RuntimeError as error:
            message = str(error)
        assert message == "rank 0 failed: the disk went away"
        assert held[0]() is None
    finally:
        gc.enable()
        dist.destroy_process_group()
