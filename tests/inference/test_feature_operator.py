"""The products of the CG solver over rows read from a data source (a memory-map, chunks): equal
to the dense products, never cached, and the CG fit on them equal to the in-memory CG fit."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rfgp import RandomFeatureGP
from rfgp._data import ArraySource, ChunkSource
from rfgp.inference import stochastic_log_evidence
from rfgp.inference._feature_map import FeatureMap
from rfgp.inference._feature_operator import FeatureOperator, SourceRows
from rfgp.kernels import FourierFeatureKernel

DT = torch.float64


def _data(n=5000):
    g = torch.Generator().manual_seed(0)
    x = torch.rand(n, 2, generator=g, dtype=DT)
    y = torch.stack([torch.sin(6 * x[:, 0]), x[:, 1] ** 2], 1)
    return x, y + 0.05 * torch.randn(n, 2, generator=g, dtype=DT)


def _kernel():
    kernel = FourierFeatureKernel(128, seed=0).double()
    kernel.lengthscale = 0.2
    return kernel


def _sources(tmp_path, x, y):
    np.save(tmp_path / "x.npy", x.numpy())
    np.save(tmp_path / "y.npy", y.numpy())
    mapped = ArraySource(np.load(tmp_path / "x.npy", mmap_mode="r"),
                         np.load(tmp_path / "y.npy", mmap_mode="r"))
    chunks = ChunkSource([(x[i:i + 1300], y[i:i + 1300]) for i in range(0, x.shape[0], 1300)])
    return mapped, chunks


def test_products_over_source_rows_equal_the_dense_products(tmp_path):
    x, y = _data()
    fm = FeatureMap(_kernel())
    phi = fm.real_rows(x / 2.0).detach()  # (N, W), the inputs over x_unit = 2
    v = torch.randn(phi.shape[1], 3, generator=torch.Generator().manual_seed(1), dtype=DT)
    for source in _sources(tmp_path, x, y):
        rows = SourceRows(source, DT, x_unit=2.0, y_unit=4.0)
        op = FeatureOperator(fm, rows, False, DT, chunk=700, cache_bytes=1 << 30)
        op.column_noise = torch.full((2,), 0.5, dtype=DT)
        assert op.streamed and op.num_rows == 5000 and op.num_columns == 2
        # B V = Phi^T S^-1 Phi V + V with S = 0.5 I; sums of 5000 float64 terms
        expected = phi.T @ (phi @ v) / 0.5 + v
        torch.testing.assert_close(op.apply(v, [0, 1, 0]), expected, rtol=1e-12, atol=1e-10)
        torch.testing.assert_close(op.project(lambda t, _: t, 2), phi.T @ (y / 4.0),
                                   rtol=1e-12, atol=1e-10)
        torch.testing.assert_close(op.target_squares(), (y / 4.0).square().sum(0),
                                   rtol=1e-13, atol=0)
        # rows read from a source are never cached: memory O(chunk D), whatever cache_bytes
        assert op.cache_bytes == 0 and op._cached == 0


def test_cg_fit_on_source_rows_equals_the_in_memory_cg_fit(tmp_path):
    x, y = _data()
    xt = torch.rand(25, 2, generator=torch.Generator().manual_seed(2), dtype=DT)
    settings = dict(noise=0.01, solve="cg", cg_tolerance=1e-8)
    in_memory = RandomFeatureGP(_kernel(), **settings).fit(x, y)
    mean, std = in_memory.predict(xt, return_std=True)
    prior = in_memory.feature_map.real_rows(xt).square().sum(-1).detach().unsqueeze(-1)
    expected_value, expected_error = stochastic_log_evidence(in_memory)
    for source in _sources(tmp_path, x, y):
        gp = RandomFeatureGP(_kernel(), cache_bytes=0, **settings)
        with torch.no_grad():
            gp._fit_source(source, (x[:1], y[:1]))
        assert gp.solve_used == "cg" and gp.num_data == 5000 and not gp.holds_training_data
        m, s = gp.predict(xt, return_std=True)
        # each mean within cg_tolerance posterior standard deviations of the exact one; each
        # variance within cg_tolerance ||phi||^2 (B >= I): twice that between the two fits
        assert bool(((m - mean).abs() <= 2e-8 * std + 1e-13).all())
        assert bool(((s.square() - std.square()).abs() <= 2e-8 * prior).all())
        # the stochastic evidence passes over the source too: the same probes, so the two
        # estimates differ by far less than their standard error
        value, error = stochastic_log_evidence(gp)
        assert abs(float(value) - float(expected_value)) < 0.01 * expected_error


def test_checkpoint_of_a_source_fit_predicts_means(tmp_path):
    x, y = _data(1500)
    source = _sources(tmp_path, x, y)[0]
    gp = RandomFeatureGP(_kernel(), noise=0.01, solve="cg", cache_bytes=0)
    with torch.no_grad():
        gp._fit_source(source, (x[:1], y[:1]))
    state = gp.state_dict()
    # one row keeps the layout: the rows behind the source are not copied into it
    assert state["_extra_state"]["solver"]["data"][0][0].shape == (1, 2)
    loaded = RandomFeatureGP(_kernel(), noise=0.01, solve="cg")
    loaded.load_state_dict(state)
    torch.testing.assert_close(loaded.predict(x[:10]), gp.predict(x[:10]), rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="without its training rows"):
        loaded.predict(x[:10], return_std=True)


@pytest.mark.parametrize("tree", ["scaled", "sum"])
def test_chunks_written_into_the_pass_buffer_give_the_dense_products(tree):
    # Chunks that are not cached are written into one buffer kept over a pass. Products with
    # no cache, with a cache holding some chunks (which must not share the buffer) and with
    # every chunk cached agree with Phi^T S^-1 Phi V from the features computed at once, over
    # two passes, a last chunk shorter than the others included; the buffer is let go at the
    # end of each pass.
    from gpytorch.kernels import ScaleKernel

    from rfgp.kernels import as_feature_kernel

    x, y = _data(1000)
    if tree == "scaled":
        kernel = ScaleKernel(_kernel()).double()
        kernel.outputscale = 1.7
    else:
        parts = [ScaleKernel(FourierFeatureKernel(64, seed=s)).double() for s in range(3)]
        kernel = as_feature_kernel(parts[0] + parts[1] + parts[2])
    fm = FeatureMap(kernel)
    with torch.no_grad():
        phi = fm.real_rows(x)
    v = torch.randn(phi.shape[1], 2, generator=torch.Generator().manual_seed(1), dtype=DT)
    expected = phi.T @ (phi @ v) / 0.5
    chunk_bytes = 300 * phi.shape[1] * 8
    for cache, cached_rows in ((0, 0), (2 * chunk_bytes, 600), (1 << 30, 1000)):
        op = FeatureOperator(fm, [(x, y, None)], False, DT, chunk=300, cache_bytes=cache)
        op.column_noise = torch.full((2,), 0.5, dtype=DT)
        for _ in range(2):
            torch.testing.assert_close(op.gram(v, [0, 1]), expected, rtol=1e-12, atol=1e-10)
            assert op._workspace is None
        assert op._cached == cached_rows * phi.shape[1] * 8


@pytest.mark.parametrize("complex_solve", [False, True])
def test_products_and_dense_matrix_with_row_noise_equal_the_dense_algebra(complex_solve):
    # The passes take Phi V and Phi^H W in their transposed, row-major forms and the dense B
    # (real features) from its upper block triangle; the numbers are those of the plain
    # algebra: B V column j with the row noise of target columns[j], Phi^H S^-1 y, and B.
    from rfgp.kernels import PolynomialSketchKernel

    g = torch.Generator().manual_seed(4)
    x = torch.rand(1100, 3, generator=g, dtype=DT)
    if complex_solve:
        kernel = PolynomialSketchKernel(2, 1200, bias=1.0, projection="gaussian", complex=True,
                                        seed=0).double()
    else:
        kernel = FourierFeatureKernel(1200, seed=0).double()
        kernel.lengthscale = 0.3
    fm = FeatureMap(kernel)
    noise = 0.1 + torch.rand(1100, 2, generator=g, dtype=DT)
    y = torch.randn(1100, 2, generator=g, dtype=DT)
    op = FeatureOperator(fm, [(x, y, noise)], complex_solve, DT, chunk=256, cache_bytes=1 << 30)
    with torch.no_grad():
        phi = fm.rows(x) if complex_solve else fm.real_rows(x)
    assert phi.is_complex() == complex_solve and op.width == phi.shape[1] > 1024  # four panels
    columns = [0, 1, 1, 0, 1]
    v = torch.randn(op.width, len(columns), generator=g, dtype=DT).to(phi.dtype)
    inverse = noise.reciprocal().to(phi.dtype)[:, columns]
    expected = phi.mH @ ((phi @ v) * inverse) + v
    # sums of 1,100 float64 terms of size about 1: relative error well below 1e-12
    torch.testing.assert_close(op.apply(v, columns), expected, rtol=1e-12, atol=1e-11)
    torch.testing.assert_close(op.project(lambda t, s: t / s, 2),
                               phi.mH @ (y / noise).to(phi.dtype), rtol=1e-12, atol=1e-11)
    for column in (0, 1):
        full = phi.mH @ (phi * noise[:, column:column + 1].reciprocal()) + torch.eye(
            op.width, dtype=phi.dtype)
        dense = op.dense(column)
        if complex_solve:  # formed in full: Hermitian to rounding
            torch.testing.assert_close(dense, dense.mH, rtol=0, atol=1e-13)
        else:  # the upper triangle mirrored
            assert torch.equal(dense, dense.mT)
        torch.testing.assert_close(dense, full, rtol=1e-12, atol=1e-11)
