"""PolynomialSketchKernel, sample_sketch / apply_sketch and DotProductKernel."""

import math
import pickle

import gpytorch
import pytest
import torch

from rfgp.kernels import DotProductKernel, PolynomialSketchKernel, apply_sketch, sample_sketch
from rfgp.ops import hadamard_matrix

PROJECTIONS = ["gaussian", "rademacher", "tensorsketch", "tensorsrht"]


@pytest.fixture
def gemm_path(monkeypatch):
    """TensorSRHT through the GEMM plan even where the compiled (numba) kernel is installed."""
    from rfgp.kernels.sketches import _srht_numba

    monkeypatch.setitem(_srht_numba._state, "enabled", False)


def _unit(v):
    return v / v.norm(dim=-1, keepdim=True)


def _estimates(x, y, degree, num_features, projection, complex, draws, seed):
    g = torch.Generator().manual_seed(seed)
    w = sample_sketch(degree, num_features, x.shape[-1], projection, complex,
                      torch.Size([draws]), g)
    phi = apply_sketch(torch.stack([x, y]), w, degree, projection, complex)
    return (phi[:, 0] * phi[:, 1].conj()).sum(-1)


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


def test_kernel_unbiased_with_lengthscale_and_bias():
    # A batch of independent kernels: E[k_hat] = (x^T y / l^2 + b)^p
    draws, degree, bias, ls = 3000, 3, 0.7, 1.6
    k = PolynomialSketchKernel(degree, 5, bias=bias, projection="tensorsrht", complex=True,
                               batch_shape=torch.Size([draws]), seed=3).double()
    k.lengthscale = ls
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, dtype=torch.float64, generator=g)
    phi = k.features(x)  # (draws, 2, 5)
    est = (phi[:, 0] * phi[:, 1].conj()).sum(-1).real
    target = (x[0] @ x[1] / ls**2 + bias) ** degree
    est = est.detach()
    assert abs(float(est.mean() - target)) < 5 * float(est.std()) / math.sqrt(draws)
    exact = k.exact_kernel()
    with torch.no_grad():
        value = exact(x[:1], x[1:]).to_dense()[0, 0, 0]
    assert float(value) == pytest.approx(float(target))


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


def test_rademacher_is_exact_in_one_dimension():
    x = torch.tensor([[0.7], [-1.3]], dtype=torch.float64)
    for proj in ("rademacher", "tensorsrht", "tensorsketch"):
        for cplx in (False, True):
            w = sample_sketch(4, 3, 1, proj, cplx, generator=torch.Generator().manual_seed(1))
            phi = apply_sketch(x, w, 4, proj, cplx)
            k = (phi[0] * phi[1].conj()).sum()
            assert abs(complex(k) - (0.7 * -1.3) ** 4) < 1e-12


# ---------------------------------------------------------------------------- complex vs real
def _mse(x, y, degree, num_features, projection, complex, draws, seed, real_part=False):
    k = _estimates(x, y, degree, num_features, projection, complex, draws, seed)
    if real_part:
        k = k.real
    w = (k - (x @ y) ** degree).abs() ** 2
    return w.mean(), w.std() / math.sqrt(draws)


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


@pytest.mark.parametrize("degree", [2, 3, 4])
def test_complex_rademacher_beats_real_on_nonnegative_data(degree):
    g = torch.Generator().manual_seed(degree)
    x, y = _unit(torch.rand(2, 6, dtype=torch.float64, generator=g))
    real, se_r = _mse(x, y, degree, 8, "rademacher", False, 20000, 4)
    cplx, se_c = _mse(x, y, degree, 8, "rademacher", True, 20000, 5)
    assert cplx + 3 * math.hypot(se_r, se_c) < real
    ctr, se_t = _mse(x, y, degree, 4, "rademacher", True, 20000, 6, real_part=True)
    assert ctr + 3 * math.hypot(se_r, se_t) < real


# ---------------------------------------------------------------------------- CtR
@pytest.mark.parametrize("projection", PROJECTIONS)
def test_ctr_features_are_real_and_exact(projection):
    k = PolynomialSketchKernel.ctr(3, 24, bias=0.5, projection=projection, seed=2).double()
    x = torch.randn(9, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    phi = k.features(x)
    real = k.real_features(x)
    assert k.is_complex and phi.dtype == torch.complex128 and phi.shape == (9, 12)
    assert not real.is_complex() and real.shape == (9, 24) and k.num_real_features == 24
    expected = (phi @ phi.conj().T).real
    torch.testing.assert_close(real @ real.T, expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(k(x).to_dense(), expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(k(x, x[:3]).to_dense(), expected[:, :3], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(k(x, diag=True), torch.diagonal(expected), rtol=1e-12,
                               atol=1e-12)


def test_float32_gives_complex64():
    k = PolynomialSketchKernel(2, 16, projection="tensorsrht", complex=True, seed=0)
    x = torch.randn(5, 3)
    assert k.features(x).dtype == torch.complex64
    assert k(x).to_dense().dtype == torch.float32


# ---------------------------------------------------------------------------- GPyTorch contract
def test_seed_resample_state_dict_and_pickle():
    x = torch.randn(6, 3, dtype=torch.float64)
    make = lambda: PolynomialSketchKernel(3, 10, bias=1.0, projection="tensorsrht",  # noqa: E731
                                          complex=True, seed=7).double()
    k1, k2 = make(), make()
    torch.testing.assert_close(k1.features(x), k2.features(x))
    k3 = PolynomialSketchKernel(3, 10, bias=1.0, projection="tensorsrht", complex=True).double()
    k3.load_state_dict(k1.state_dict())
    torch.testing.assert_close(k3.features(x), k1.features(x))
    k4 = pickle.loads(pickle.dumps(k1))
    torch.testing.assert_close(k4.features(x), k1.features(x))
    before = k1.features(x)
    k1.resample(torch.Generator().manual_seed(99))
    assert not torch.allclose(k1.features(x), before)
    assert not any(b.is_complex() for b in k1.buffers())


@pytest.mark.parametrize("projection", PROJECTIONS)
def test_gradients_reach_lengthscale_and_bias(projection):
    k = PolynomialSketchKernel(3, 12, bias=1.0, projection=projection, complex=True,
                               ard_num_dims=3, seed=1).double()
    x = torch.randn(5, 3, dtype=torch.float64)
    gpytorch.kernels.ScaleKernel(k)(x).to_dense().sum().backward()
    assert k.raw_lengthscale.grad is not None and k.raw_lengthscale.grad.abs().sum() > 0
    assert k.raw_bias.grad is not None and k.raw_bias.grad.abs().sum() > 0


def test_batch_indexing_and_exact_gp_training():
    k = PolynomialSketchKernel(2, 32, bias=1.0, projection="tensorsrht",
                               batch_shape=torch.Size([2]), seed=0).double()
    x = torch.randn(4, 3, dtype=torch.float64)
    phi = k.features(x)
    torch.testing.assert_close(k[1].features(x), phi[1])

    class GP(gpytorch.models.ExactGP):
        def __init__(self, x, y, lik):
            super().__init__(x, y, lik)
            self.mean = gpytorch.means.ZeroMean()
            self.covar = gpytorch.kernels.ScaleKernel(
                PolynomialSketchKernel(2, 16, bias=1.0, projection="tensorsrht", complex=True,
                                       seed=0))

        def forward(self, x):
            return gpytorch.distributions.MultivariateNormal(self.mean(x), self.covar(x))

    xt = torch.randn(30, 2, dtype=torch.float64)
    yt = xt[:, 0] * xt[:, 1]
    lik = gpytorch.likelihoods.GaussianLikelihood().double()
    model = GP(xt, yt, lik).double()
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(lik, model)
    loss = -mll(model(xt), yt)
    loss.backward()
    assert torch.isfinite(loss)
    model.eval()
    with torch.no_grad():
        pred = lik(model(xt[:5]))
    assert pred.mean.shape == (5,) and torch.isfinite(pred.variance).all()


def test_degree_one_sketch_is_random_projection():
    k = PolynomialSketchKernel(1, 8, projection="tensorsrht", seed=0).double()
    k.lengthscale = 1.0  # the float32 initial value is only 1 to float32 precision
    x = torch.randn(5, 8, dtype=torch.float64)
    torch.testing.assert_close(k(x).to_dense(), x @ x.T, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("complex", [False, True])
@pytest.mark.parametrize("d,num_features,degree", [(5, 20, 3), (1, 3, 2), (33, 100, 2)])
def test_tensorsrht_fast_path_matches_generic(monkeypatch, gemm_path, complex, d, num_features,
                                             degree):
    # Unbatched weights use the two-GEMM plan (row-chunked); batched ones the generic path.
    import rfgp.kernels.sketches.tensorsrht as sk

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
    import rfgp.kernels.sketches.tensorsrht as sk

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
    import rfgp.kernels.sketches.tensorsrht as sk
    from rfgp.kernels.sketches import _srht_numba

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


@pytest.mark.parametrize("projection", ["gaussian", "rademacher", "tensorsketch"])
@pytest.mark.parametrize("complex", [False, True])
def test_unbatched_paths_match_batched(monkeypatch, projection, complex):
    # Unbatched weights take specialised paths (row-chunked GEMM, index_add count sketches).
    import rfgp.kernels.sketches.dense as sk

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


# ---------------------------------------------------------------------------- exact kernel
def test_dot_product_kernel():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 3, dtype=torch.float64, generator=g)
    y = torch.randn(5, 3, dtype=torch.float64, generator=g)
    k = DotProductKernel("polynomial", degree=3, bias=0.5, ard_num_dims=3).double()
    ls = torch.tensor([[0.5, 1.0, 2.0]], dtype=torch.float64)
    k.lengthscale = ls
    torch.testing.assert_close(k(x, y).to_dense(), ((x / ls) @ (y / ls).T + 0.5) ** 3)
    torch.testing.assert_close(k(x, diag=True), (((x / ls) ** 2).sum(-1) + 0.5) ** 3)
    e = DotProductKernel("exponential").double()
    e.lengthscale = 2.0
    torch.testing.assert_close(e(x, y).to_dense(), torch.exp(x @ y.T / 4))
    # scikit-learn convention: gamma = 1 / l^2, coef0 = bias
    from sklearn.metrics.pairwise import polynomial_kernel

    p = DotProductKernel("polynomial", degree=2, bias=1.5).double()
    p.lengthscale = 1 / math.sqrt(0.3)
    ref = polynomial_kernel(x.numpy(), y.numpy(), degree=2, gamma=0.3, coef0=1.5)
    torch.testing.assert_close(p(x, y).to_dense(), torch.from_numpy(ref))


# ---------------------------------------------------------------------------- bad input
def test_bad_inputs():
    with pytest.raises(ValueError, match="degree"):
        PolynomialSketchKernel(0, 8)
    with pytest.raises(ValueError, match="num_features"):
        PolynomialSketchKernel(2, 0)
    with pytest.raises(ValueError, match="bias"):
        PolynomialSketchKernel(2, 8, bias=-1.0)
    with pytest.raises(ValueError, match="projection"):
        PolynomialSketchKernel(2, 8, projection="countsketch")
    with pytest.raises(TypeError, match="complex"):
        PolynomialSketchKernel(2, 8, complex="yes")
    with pytest.raises(ValueError, match="num_real_features"):
        PolynomialSketchKernel.ctr(2, 7)
    with pytest.raises(ValueError, match="complex"):
        PolynomialSketchKernel.ctr(2, 8, complex=False)
    with pytest.raises(ValueError, match="projection"):
        sample_sketch(2, 4, 3, projection="srht")
    with pytest.raises(TypeError, match="batch_shape"):
        sample_sketch(2, 4, 3, batch_shape=3)
    with pytest.raises(ValueError, match="degree"):
        sample_sketch(0, 4, 3)
    with pytest.raises(ValueError, match="input_dim"):
        sample_sketch(2, 4, 0)
    w = sample_sketch(2, 4, 3, "rademacher")
    with pytest.raises(ValueError, match="columns"):
        apply_sketch(torch.randn(5, 4, dtype=torch.float64), w, 2)
    with pytest.raises(ValueError, match="degree"):
        apply_sketch(torch.randn(5, 3, dtype=torch.float64), w, 3)
    with pytest.raises(ValueError, match="weights"):
        apply_sketch(torch.randn(5, 3, dtype=torch.float64), w, 2, projection="tensorsrht")
    k = PolynomialSketchKernel(2, 8)
    with pytest.raises(AttributeError, match="bias"):
        k.bias = 1.0
    with pytest.raises(ValueError, match="degree"):
        DotProductKernel("polynomial")
    with pytest.raises(ValueError, match="degree"):
        DotProductKernel("exponential", degree=3)
    with pytest.raises(ValueError, match="kind"):
        DotProductKernel("gaussian", degree=3)
    with pytest.raises(ValueError, match="bias"):
        DotProductKernel("polynomial", degree=2, bias=-0.1)


@pytest.mark.parametrize("make", [
    lambda **kw: DotProductKernel("polynomial", degree=2, **kw),
    lambda **kw: PolynomialSketchKernel(2, 8, **kw),
])
def test_bias_parameter_contract(make):
    learnable = make(bias=0.7).double()
    # set in float32 at construction: float32 round-off
    assert abs(float(learnable.bias) - 0.7) < 1e-6
    learnable.bias = 0.2
    assert abs(float(learnable.bias) - 0.2) < 1e-12
    with pytest.raises(ValueError, match="bias must be non-negative"):
        learnable.bias = -1.0
    homogeneous = make(bias=0.0)
    assert float(homogeneous.bias) == 0.0
    assert not any("bias" in name for name, _ in homogeneous.named_parameters())
    with pytest.raises(AttributeError, match="bias=0"):
        homogeneous.bias = 1.0
    with pytest.raises(ValueError, match="bias_prior / bias_constraint"):
        make(bias=0.0, bias_constraint=gpytorch.constraints.Positive())
    prior = make(bias=0.5, bias_prior=gpytorch.priors.GammaPrior(2.0, 2.0))
    assert any(name == "bias_prior" for name, *_ in prior.named_priors())
