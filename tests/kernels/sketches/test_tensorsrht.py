"""TensorSRHT: exactness at degree one, block structure, and agreement of its three
implementations."""


import pytest
import torch

from rfgp._ops import hadamard_matrix
from rfgp.kernels import PolynomialSketchKernel, apply_sketch, sample_sketch


@pytest.fixture
def gemm_path(monkeypatch):
    """TensorSRHT through the GEMM plan even where the compiled (numba) kernel is installed."""
    from rfgp.kernels._sketches import _srht_numba

    monkeypatch.setitem(_srht_numba._state, "enabled", False)


# ---------------------------------------------------------------------------- exactness
@pytest.mark.parametrize("complex", [False, True])
@pytest.mark.parametrize("blocks", [1, 2, 3])
def test_tensorsrht_degree_one_is_exact(complex, blocks):
    g = torch.Generator().manual_seed(blocks)
    x = torch.randn(7, 6, dtype=torch.float64, generator=g)  # padded to d' = 8
    w = sample_sketch(1, 8 * blocks, 6, "tensorsrht", complex, generator=g)
    phi = apply_sketch(x, w, 1, "tensorsrht", complex)
    gram = phi @ phi.conj().transpose(-1, -2)
    torch.testing.assert_close(gram.real if complex else gram, x @ x.T, rtol=1e-12, atol=1e-12)
    if complex:
        assert gram.imag.abs().max() < 1e-12


def test_tensorsrht_structure():
    # Per degree and block: columns of D H P are orthogonal, signs and permutations independent.
    g = torch.Generator().manual_seed(0)
    w = sample_sketch(3, 20, 8, "tensorsrht", generator=g)
    signs, idx = w["signs"], w["indices"]
    assert signs.shape == (3, 3, 8) and idx.shape == (3, 20)
    for i in range(3):
        blocks = idx[i].div(8, rounding_mode="floor")
        for b in range(3):
            local = idx[i][blocks == b] - 8 * b
            assert len(set(local.tolist())) == local.numel()  # no repeats inside a block
    assert not torch.equal(idx[0], idx[1]) and not torch.equal(signs[:, 0], signs[:, 1])
    # materialise one degree/block: rows s_l = w * h_pi(l), orthogonal with |s_l|^2 = d
    h = hadamard_matrix(8)
    rows = signs[0, 0] * h[idx[0, :8]]
    torch.testing.assert_close(rows @ rows.T, 8 * torch.eye(8, dtype=torch.float64))


@pytest.mark.parametrize("complex", [False, True])
@pytest.mark.parametrize("d,num_features,degree", [(5, 20, 3), (1, 3, 2), (33, 100, 2)])
def test_tensorsrht_fast_path_matches_generic(monkeypatch, gemm_path, complex, d, num_features,
                                             degree):
    # Unbatched weights use the two-GEMM plan (row-chunked); batched ones the generic path.
    import rfgp.kernels._sketches.tensorsrht as sk

    g = torch.Generator().manual_seed(d)
    x = torch.randn(2, 25, d, dtype=torch.float64, generator=g)
    w = sample_sketch(degree, num_features, d, "tensorsrht", complex, generator=g)
    fast = apply_sketch(x, w, degree, "tensorsrht", complex)
    monkeypatch.setattr(sk, "_PLAN_CHUNK_ELEMENTS", 64)
    torch.testing.assert_close(apply_sketch(x, w, degree, "tensorsrht", complex), fast)
    monkeypatch.setattr(sk, "_PLAN_MAX_DIM", 0)
    monkeypatch.setattr(sk, "_SRHT_CHUNK_ELEMENTS", 64)
    torch.testing.assert_close(apply_sketch(x, w, degree, "tensorsrht", complex), fast)
    batched = {k: v.unsqueeze(0) for k, v in w.items()}
    torch.testing.assert_close(apply_sketch(x, batched, degree, "tensorsrht", complex), fast)


@pytest.mark.parametrize("complex", [False, True])
@pytest.mark.parametrize("chunk_elements", [1 << 6, 1 << 12, 1 << 17, 1 << 18])
def test_tensorsrht_plan_chunks_groups_and_gradients(monkeypatch, gemm_path, complex,
                                                     chunk_elements):
    # Several blocks (the last one truncated), partial row chunks, groups of several blocks
    # and the autograd variant of the plan all give the generic path's features and gradients.
    import rfgp.kernels._sketches.tensorsrht as sk

    g = torch.Generator().manual_seed(11)
    x = torch.randn(37, 100, dtype=torch.float64, generator=g)
    w = sample_sketch(3, 300, 100, "tensorsrht", complex, generator=g)
    batched = {k: v.unsqueeze(0) for k, v in w.items()}
    reference = apply_sketch(x, batched, 3, "tensorsrht", complex)[0]
    monkeypatch.setattr(sk, "_PLAN_CHUNK_ELEMENTS", chunk_elements)
    torch.testing.assert_close(apply_sketch(x, w, 3, "tensorsrht", complex), reference)
    weight = torch.randn(reference.shape, dtype=reference.dtype, generator=g)
    grads = []
    for weights in (w, batched):
        xg = x.clone().requires_grad_(True)
        phi = apply_sketch(xg, weights, 3, "tensorsrht", complex)
        torch.testing.assert_close(phi.detach().reshape(reference.shape), reference)
        (phi.reshape(reference.shape) * weight).real.sum().backward()
        grads.append(xg.grad)
    torch.testing.assert_close(grads[0], grads[1])


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("complex", [False, True])
@pytest.mark.parametrize("d,bias,ard", [(7, 0.5, True), (7, 0.0, False), (12, 2.0, False)])
def test_tensorsrht_kernel_fused_homogenisation(monkeypatch, compiled, complex, d, bias, ard):
    # Without autograd the kernel lets the plan (or the compiled kernel) scale, append the bias
    # coordinate and pad chunk by chunk; it must equal the sketch of the explicitly homogenised
    # input.
    import rfgp.kernels._sketches.tensorsrht as sk
    from rfgp.kernels._sketches import _srht_numba

    if compiled and not _srht_numba.available():
        pytest.skip("numba is not installed")
    monkeypatch.setitem(_srht_numba._state, "enabled", compiled)
    monkeypatch.setattr(sk, "_PLAN_CHUNK_ELEMENTS", 1 << 8)  # several (partial) row chunks
    g = torch.Generator().manual_seed(d)
    x = torch.randn(2, 29, d, dtype=torch.float64, generator=g)
    k = PolynomialSketchKernel(3, 40, bias=bias, projection="tensorsrht", complex=complex,
                               ard_num_dims=d if ard else None, seed=3).double()
    k.lengthscale = torch.rand(1, d if ard else 1, dtype=torch.float64, generator=g) + 0.5
    with torch.no_grad():
        fused = k.features(x)
        expected = apply_sketch(k.homogenize(x), k._weights(), 3, "tensorsrht", complex)
    torch.testing.assert_close(fused, expected)
    torch.testing.assert_close(k.features(x).detach(), expected)  # autograd path
