"""apply_sketch over every projection, real and complex: unbiasedness, exactness where it
holds, and the lower variance of the complex sketches."""

import math

import pytest
import torch

from rfgp.kernels import apply_sketch, sample_sketch

PROJECTIONS = ["gaussian", "rademacher", "tensorsketch", "tensorsrht"]


def _unit(v):
    return v / v.norm(dim=-1, keepdim=True)


def _estimates(x, y, degree, num_features, projection, complex, draws, seed):
    g = torch.Generator().manual_seed(seed)
    w = sample_sketch(degree, num_features, x.shape[-1], projection, complex,
                      torch.Size([draws]), g)
    phi = apply_sketch(torch.stack([x, y]), w, degree, projection, complex)
    return (phi[:, 0] * phi[:, 1].conj()).sum(-1)


# ---------------------------------------------------------------------------- complex vs real
def _mse(x, y, degree, num_features, projection, complex, draws, seed, real_part=False):
    k = _estimates(x, y, degree, num_features, projection, complex, draws, seed)
    if real_part:
        k = k.real
    w = (k - (x @ y) ** degree).abs() ** 2
    return w.mean(), w.std() / math.sqrt(draws)


# ---------------------------------------------------------------------------- unbiasedness
@pytest.mark.parametrize("projection", PROJECTIONS)
@pytest.mark.parametrize("complex", [False, True])
@pytest.mark.parametrize("degree", range(1, 8))
def test_unbiased(projection, complex, degree):
    g = torch.Generator().manual_seed(degree)
    x, y = _unit(torch.randn(2, 5, dtype=torch.float64, generator=g))
    y = _unit(x + 0.5 * y)  # correlated, so (x^T y)^p stays well away from 0
    k = _estimates(x, y, degree, 6, projection, complex, 4000, seed=10 * degree + complex)
    target = (x @ y) ** degree
    se = k.real.std() / math.sqrt(k.shape[0])
    assert abs(float(k.real.mean() - target)) < 5 * float(se) + 1e-12
    if complex:
        se_im = k.imag.std() / math.sqrt(k.shape[0])
        assert abs(float(k.imag.mean())) < 5 * float(se_im) + 1e-12


def test_rademacher_is_exact_in_one_dimension():
    x = torch.tensor([[0.7], [-1.3]], dtype=torch.float64)
    for proj in ("rademacher", "tensorsrht", "tensorsketch"):
        for cplx in (False, True):
            w = sample_sketch(4, 3, 1, proj, cplx, generator=torch.Generator().manual_seed(1))
            phi = apply_sketch(x, w, 4, proj, cplx)
            k = (phi[0] * phi[1].conj()).sum()
            assert abs(complex(k) - (0.7 * -1.3) ** 4) < 1e-12


@pytest.mark.slow
@pytest.mark.parametrize("degree", [2, 3, 5])
def test_complex_gaussian_beats_real(degree):
    g = torch.Generator().manual_seed(degree)
    x, y = _unit(torch.randn(2, 6, dtype=torch.float64, generator=g))
    y = _unit(x + y)  # the gain grows with |x^T y| (it vanishes for orthogonal inputs)
    real, se_r = _mse(x, y, degree, 8, "gaussian", False, 20000, 1)
    cplx, se_c = _mse(x, y, degree, 8, "gaussian", True, 20000, 2)
    assert cplx + 3 * math.hypot(se_r, se_c) < real
    # CtR with 4 complex samples against 8 real samples: the same real output size
    ctr, se_t = _mse(x, y, degree, 4, "gaussian", True, 20000, 3, real_part=True)
    assert ctr + 3 * math.hypot(se_r, se_t) < real


@pytest.mark.slow
@pytest.mark.parametrize("degree", [2, 3, 4])
def test_complex_rademacher_beats_real_on_nonnegative_data(degree):
    g = torch.Generator().manual_seed(degree)
    x, y = _unit(torch.rand(2, 6, dtype=torch.float64, generator=g))
    real, se_r = _mse(x, y, degree, 8, "rademacher", False, 20000, 4)
    cplx, se_c = _mse(x, y, degree, 8, "rademacher", True, 20000, 5)
    assert cplx + 3 * math.hypot(se_r, se_c) < real
    ctr, se_t = _mse(x, y, degree, 4, "rademacher", True, 20000, 6, real_part=True)
    assert ctr + 3 * math.hypot(se_r, se_t) < real


@pytest.mark.parametrize("projection", ["gaussian", "rademacher", "tensorsketch"])
@pytest.mark.parametrize("complex", [False, True])
def test_unbatched_paths_match_batched(monkeypatch, projection, complex):
    # Unbatched weights take specialised paths (row-chunked GEMM, index_add count sketches).
    import rfgp.kernels._sketches.dense as sk

    g = torch.Generator().manual_seed(5)
    x = torch.randn(300, 4, dtype=torch.float64, generator=g)
    w = sample_sketch(3, 7, 4, projection, complex, generator=g)
    monkeypatch.setattr(sk, "_DENSE_CHUNK_ELEMENTS", 1)  # 256-row chunks
    out = apply_sketch(x, w, 3, projection, complex)
    batched = {k: v.unsqueeze(0) for k, v in w.items()}
    monkeypatch.setattr(sk, "_DENSE_CHUNK_ELEMENTS", 1 << 30)
    torch.testing.assert_close(apply_sketch(x, batched, 3, projection, complex)[0], out)
    # with autograd the dense sketch concatenates chunks instead of filling one result
    monkeypatch.setattr(sk, "_DENSE_CHUNK_ELEMENTS", 1)
    xg = x.clone().requires_grad_(True)
    torch.testing.assert_close(apply_sketch(xg, w, 3, projection, complex).detach(), out)
