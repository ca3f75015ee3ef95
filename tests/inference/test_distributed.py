"""Data-parallel fitting over torch.distributed (two processes, gloo, localhost)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from rfgp import RandomFeatureGP
from rfgp.kernels import FourierFeatureKernel
from tests import ranks

DT = torch.float64
WORLD = 2


def _data():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(301, 3, generator=g, dtype=DT)
    y = torch.stack([torch.sin(5 * x[:, 0]), torch.cos(3 * x[:, 1])], -1)
    y = y + 0.1 * torch.randn(301, 2, generator=g, dtype=DT)
    noise = 0.05 + 0.1 * torch.rand(301, 2, generator=g, dtype=DT)
    noise[:150, 1] = noise[:150, 0]  # the columns' noise agrees on rank 0's shard only
    xt = torch.rand(25, 3, generator=g, dtype=DT)
    return x, y, noise, xt


def _kernel(seed):
    k = FourierFeatureKernel(48, seed=seed).double()
    k.lengthscale = 0.4
    return k


def _shard(rank, n):
    # uneven shards: 150 and 151 rows
    return slice(0, 150) if rank == 0 else slice(150, n)


def _worker(rank, store_path, out_path):
    ranks.join(rank, store_path, WORLD)
    try:
        x, y, noise, xt = _data()
        s = _shard(rank, x.shape[0])
        # a different seed per process: the fit must broadcast rank 0's weights
        gp = RandomFeatureGP(_kernel(seed=rank), solve="weight")
        gp.fit(x[s], y[s], noise[s], distributed=True, chunk_size=40)
        mean, std = gp.predict(xt, return_std=True)
        stream = RandomFeatureGP(_kernel(seed=10 + rank), noise=0.1)
        stream.fit_stream([(x[s][:70], y[s][:70]), (x[s][70:], y[s][70:])], distributed=True)
        upd = RandomFeatureGP(_kernel(seed=0), noise=0.1).fit(x[:10], y[:10])
        upd.update(x[10:][s], y[10:][s], distributed=True)
        ranks.leave(
            {
                "mean": mean,
                "std": std,
                "lml": gp.log_marginal_likelihood(),
                "groups": gp.factorization_groups,
                "stream": stream.predict(xt),
                "update": upd.predict(xt),
            },
            out_path,
            rank,
        )
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")
def test_two_process_fit_equals_single_process_fit(tmp_path):
    results = ranks.run(_worker, tmp_path, (), WORLD)
    x, y, noise, xt = _data()
    single = RandomFeatureGP(_kernel(seed=0), solve="weight").fit(x, y, noise)
    mean, std = single.predict(xt, return_std=True)
    stream = RandomFeatureGP(_kernel(seed=10), noise=0.1).fit(x, y).predict(xt)
    update = RandomFeatureGP(_kernel(seed=0), noise=0.1).fit(x, y).predict(xt)
    for res in results:
        assert res["groups"] == single.factorization_groups == [[0], [1]]
        torch.testing.assert_close(res["mean"], mean, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(res["std"], std, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(
            res["lml"], single.log_marginal_likelihood(), rtol=1e-10, atol=1e-10
        )
        torch.testing.assert_close(res["stream"], stream, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(res["update"], update, rtol=1e-10, atol=1e-10)
