"""Predictions at query rows held in numpy arrays and memory-maps: read in row chunks, equal to
the predictions at the same rows as one tensor."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rfgp import RandomFeatureGP
from rfgp.kernels import FourierFeatureKernel

DT = torch.float64


def _fitted(solve):
    g = torch.Generator().manual_seed(0)
    x = torch.rand(300, 2, generator=g, dtype=DT)
    y = torch.stack([torch.sin(5 * x[:, 0]), x[:, 1]], 1)
    y = y + 0.1 * torch.randn(300, 2, generator=g, dtype=DT)
    kernel = FourierFeatureKernel(64, seed=0).double()
    kernel.lengthscale = 0.3
    return RandomFeatureGP(kernel, noise=0.01, solve=solve, cg_tolerance=1e-10).fit(x, y)


def _mapped(tmp_path, array):
    np.save(tmp_path / "q.npy", array)
    return np.load(tmp_path / "q.npy", mmap_mode="r")


@pytest.mark.parametrize("solve", ["weight", "cg"])
def test_memmap_queries_give_the_tensor_predictions(tmp_path, solve):
    gp = _fitted(solve)
    queries = np.random.default_rng(1).random((53, 2))
    mapped = _mapped(tmp_path, queries)
    mean, std = gp.predict(torch.from_numpy(queries), return_std=True)
    # chunks of 7 rows, not a divisor of 53: each row's mean and variance are computed by the
    # same arithmetic as in one call on all rows (the CG variances solve per chunk: equal to
    # the CG tolerance relative to the variance, 1e-10 here)
    m, s = gp.predict(mapped, return_std=True, chunk_size=7)
    assert isinstance(mapped, np.memmap) and m.shape == (53, 2) and s.shape == (53, 2)
    torch.testing.assert_close(m, mean, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(s, std, rtol=1e-8 if solve == "cg" else 1e-12, atol=1e-14)
    torch.testing.assert_close(gp.predict(mapped, chunk_size=7), mean, rtol=1e-12, atol=1e-14)
    # float32 arrays are cast to the fit's dtype, as float32 tensors are
    single = queries.astype(np.float32)
    torch.testing.assert_close(gp.predict(single), gp.predict(torch.from_numpy(single)),
                               rtol=1e-12, atol=1e-14)
    assert gp.predict(np.zeros((0, 2))).shape == (0, 2)


def test_memmap_queries_of_sample_paths(tmp_path):
    gp = _fitted("weight")
    paths = gp.sample_functions(3, torch.Generator().manual_seed(0))
    queries = np.random.default_rng(2).random((40, 2))
    values = paths(_mapped(tmp_path, queries), chunk_size=6)
    torch.testing.assert_close(values, paths(torch.from_numpy(queries)), rtol=1e-12, atol=1e-14)


def test_bad_array_queries_are_named_by_argument_and_row(tmp_path):
    gp = _fitted("weight")
    queries = np.random.default_rng(1).random((30, 2))
    queries[17, 1] = np.nan
    with pytest.raises(ValueError, match="x must be finite, but row 17"):
        gp.predict(_mapped(tmp_path, queries), chunk_size=8)
    with pytest.raises(TypeError, match="x must be a float32 or float64 array, got .*int64"):
        gp.predict(np.zeros((4, 2), dtype=np.int64))
    with pytest.raises(ValueError, match=r"x must have shape \(M, d\)"):
        gp.predict(np.zeros((2, 2, 2)))


def test_estimator_predicts_a_memmap_by_the_model(tmp_path):
    from rfgp.sklearn import RandomFeatureGPRegressor

    rng = np.random.default_rng(0)
    X = rng.uniform(0, 1, (200, 2))
    y = np.sin(4 * X[:, 0]) + 0.1 * rng.standard_normal(200)
    reg = RandomFeatureGPRegressor(num_features=64, optimizer=None, random_state=0).fit(X, y)
    queries = rng.uniform(0, 1, (25, 2))
    mapped = _mapped(tmp_path, queries)
    mean, std = reg.predict(queries, return_std=True)
    m, s = reg.predict(mapped, return_std=True)
    np.testing.assert_allclose(m, mean, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(s, std, rtol=1e-12, atol=1e-14)
    with pytest.raises(ValueError, match="expecting 2 features"):
        reg.predict(_mapped(tmp_path, rng.uniform(0, 1, (5, 3))))
