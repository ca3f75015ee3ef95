"""Curl-free, divergence-free and Helmholtz random features: Gram layout, unbiasedness,
convergence, exactly curl- / divergence-free fields, plumbing."""

import math

import gpytorch
import pytest
import torch
from torch.autograd.functional import jacobian

from rfgp.kernels import (
    CurlFreeFeatureKernel,
    CurlFreeKernel,
    DecomposableFeatureKernel,
    DivFreeFeatureKernel,
    DivFreeKernel,
    HelmholtzFeatureKernel,
    HelmholtzKernel,
)
from rfgp.kernels._vector_field.factors import div_free_factor_rank
from tests.helpers import DT, gen, rand


def blocks_from_features(phi1, phi2):
    """(N, p, D), (M, p, D) -> (N, M, p, p) blocks Phi(x)^T Phi(z)."""
    return torch.einsum("npd,mqd->nmpq", phi1, phi2)


def feature_kernel(kind, num_features, dim, seed=0, **kw):
    if kind == "curl":
        return CurlFreeFeatureKernel(num_features, input_dim=dim, seed=seed, **kw).to(DT)
    if kind == "div":
        return DivFreeFeatureKernel(num_features, input_dim=dim, seed=seed, **kw).to(DT)
    raise AssertionError(kind)


# ----------------------------------------------------------------- Monte Carlo convergence
def _exact_blocks(k, x, z):
    return k.exact_kernel()._blocks(x, z).detach()


# ----------------------------------------------------------------- exactly curl- / div-free fields
def _jacobian_of_field(k, theta, x):
    def field(xx):
        return k.features(xx.unsqueeze(0))[0] @ theta  # (p,)
    return torch.stack([jacobian(field, xi) for xi in x])  # (N, p, d): J[a, b] = d f_a / d x_b


@pytest.mark.parametrize("make", [
    lambda: CurlFreeFeatureKernel(40, input_dim=3, seed=0),
    lambda: DivFreeFeatureKernel(40, input_dim=3, seed=0),
    lambda: DivFreeFeatureKernel(60, input_dim=3, factor="cross", seed=0),
    lambda: HelmholtzFeatureKernel(60, input_dim=3, seed=0),
    lambda: DecomposableFeatureKernel(40, num_tasks=3, rank=2, diagonal=False, seed=0),
])
def test_feature_gram_symmetric_psd_interleaved(make):
    k = make().to(DT)
    x, z = rand(9, 3, seed=7), rand(4, 3, seed=8) * 2
    phi_x, phi_z = k.features(x).detach(), k.features(z).detach()
    p = phi_x.shape[-2]
    assert phi_x.shape == (9, p, k.num_features)
    # K(x, z) = K(z, x)^T and each block is symmetric (A(omega) is even and symmetric)
    bxz, bzx = blocks_from_features(phi_x, phi_z), blocks_from_features(phi_z, phi_x)
    torch.testing.assert_close(bxz, bzx.transpose(0, 1).mT)
    torch.testing.assert_close(bxz, bxz.mT, atol=1e-12, rtol=0)
    # interleaved layout of the GPyTorch operator: row n p + a
    dense = k(x, z).to_dense().detach()
    torch.testing.assert_close(dense, bxz.transpose(1, 2).reshape(9 * p, 4 * p))
    gram = k(x).to_dense().detach()
    eigs = torch.linalg.eigvalsh(gram)
    assert eigs.min() >= -1e-10 * eigs.max()
    assert torch.linalg.matrix_rank(gram) <= k.num_features
    torch.testing.assert_close(k(x, diag=True).detach(), gram.diagonal())
    # shift invariance (all of these kernels are stationary)
    shift = torch.tensor([0.3, -1.1, 0.4], dtype=DT)
    torch.testing.assert_close(
        blocks_from_features(k.features(x + shift).detach(), k.features(z + shift).detach()),
        bxz, atol=1e-12, rtol=0)


def test_rotation_div_features_are_rotated_curl_features():
    curl = CurlFreeFeatureKernel(30, input_dim=2, seed=3).to(DT)
    div = DivFreeFeatureKernel(30, input_dim=2, seed=3).to(DT)  # same seed -> same frequencies
    curl.lengthscale = div.lengthscale = 0.7
    x = rand(6, 2)
    j = torch.tensor([[0.0, -1.0], [1.0, 0.0]], dtype=DT)
    torch.testing.assert_close(div.features(x), j @ curl.features(x))


@pytest.mark.parametrize("kind,dim,kw", [
    ("curl", 2, {}), ("curl", 4, {"sampling": "orthogonal"}),
    ("div", 2, {}), ("div", 3, {"factor": "cross"}), ("div", 4, {"sampling": "orthogonal"}),
])
def test_unbiased_over_independent_draws(kind, dim, kw):
    # batch_shape=(R,) holds R independent draws of the frequencies.
    reps = 400
    columns = 2 * div_free_factor_rank(dim, kw.get("factor", "auto")) if kind == "div" else 2
    num_features = 16 * columns
    k = feature_kernel(kind, num_features, dim, seed=11, batch_shape=torch.Size([reps]), **kw)
    k.lengthscale = 0.9
    x, z = rand(3, dim, seed=12), rand(3, dim, seed=13)
    est = torch.einsum("rnpd,rnqd->rnpq", k.features(x), k.features(z)).detach()
    single = feature_kernel(kind, num_features, dim, seed=0, **kw)
    single.lengthscale = 0.9
    exact = torch.stack([_exact_blocks(single, x[i:i + 1], z[i:i + 1])[0, 0] for i in range(3)])
    mean, stderr = est.mean(0), est.std(0) / math.sqrt(reps)
    assert ((mean - exact).abs() <= 5 * stderr + 1e-12).all()


def test_helmholtz_unbiased_and_sum_of_parts():
    reps = 300
    k = HelmholtzFeatureKernel(16, input_dim=2, seed=5, batch_shape=torch.Size([reps])).to(DT)
    k.curl_lengthscale, k.div_lengthscale = 0.5, 1.2
    k.curl_outputscale, k.div_outputscale = 1.7, 0.4
    x, z = rand(2, 2, seed=1), rand(2, 2, seed=2)
    phi_x, phi_z = k.features(x).detach(), k.features(z).detach()
    est = torch.einsum("rnpd,rnqd->rnpq", phi_x, phi_z)
    exact = HelmholtzKernel(input_dim=2).to(DT)
    exact.curl_lengthscale, exact.div_lengthscale = 0.5, 1.2
    exact.curl_outputscale, exact.div_outputscale = 1.7, 0.4
    target = torch.stack([exact._blocks(x[i:i + 1], z[i:i + 1])[0, 0] for i in range(2)]).detach()
    mean, stderr = est.mean(0), est.std(0) / math.sqrt(reps)
    assert ((mean - target).abs() <= 5 * stderr + 1e-12).all()
    # the components partition the features
    parts = k.component_features(x, "curl") + k.component_features(x, "div")
    torch.testing.assert_close(parts, k.features(x))
    assert (k.component_features(x, "curl")[..., k.curl_num_features:] == 0).all()


@pytest.mark.parametrize("kind", ["curl", "div"])
def test_error_decays_like_inverse_sqrt_d(kind):
    # Fig. 1 of the ORFF paper: spectral-norm error of K_hat vs D, slope about -1/2 (log-log).
    dim, seeds = 4, 8
    x, z = rand(10, dim, seed=21), rand(10, dim, seed=22)
    sizes = [96, 384, 1536, 6144]
    errors = []
    for num_features in sizes:
        per_seed = []
        for s in range(seeds):
            k = feature_kernel(kind, num_features, dim, seed=100 + s)
            k.lengthscale = 0.7
            approx = blocks_from_features(k.features(x), k.features(z)).detach()
            exact = _exact_blocks(k, x, z)
            per_seed.append((torch.linalg.matrix_norm(approx - exact, 2)
                             / torch.linalg.matrix_norm(exact, 2).max()).max())
        errors.append(torch.stack(per_seed).mean())
    slope = torch.linalg.lstsq(
        torch.stack([torch.log(torch.tensor(sizes, dtype=DT)), torch.ones(4, dtype=DT)], -1),
        torch.log(torch.stack(errors)).unsqueeze(-1)).solution[0, 0]
    assert -0.65 < slope < -0.35, (slope, errors)


@pytest.mark.parametrize("dim", [2, 3, 4])
@pytest.mark.parametrize("num_features", [8, 512])
def test_curl_free_feature_fields_have_zero_curl(dim, num_features):
    k = feature_kernel("curl", num_features, dim, seed=dim)
    k.lengthscale = 0.5
    theta = torch.randn(num_features, generator=gen(1), dtype=DT)
    jac = _jacobian_of_field(k, theta, rand(5, dim, seed=3)).detach()
    scale = jac.abs().max()
    assert (jac - jac.mT).abs().max() <= 1e-12 * scale  # zero curl: symmetric Jacobian
    assert jac.diagonal(dim1=-2, dim2=-1).sum(-1).abs().max() > 1e-3 * scale  # non-trivial


@pytest.mark.parametrize("dim,factor", [(2, "auto"), (3, "cross"), (3, "complement"),
                                        (4, "complement"), (4, "projection")])
@pytest.mark.parametrize("frequencies", [4, 256])
def test_div_free_feature_fields_have_zero_divergence(dim, factor, frequencies):
    num_features = 2 * div_free_factor_rank(dim, factor) * frequencies
    k = feature_kernel("div", num_features, dim, seed=dim, factor=factor)
    k.lengthscale = 0.5
    theta = torch.randn(num_features, generator=gen(2), dtype=DT)
    jac = _jacobian_of_field(k, theta, rand(5, dim, seed=4)).detach()
    scale = jac.abs().max()
    assert jac.diagonal(dim1=-2, dim2=-1).sum(-1).abs().max() <= 1e-12 * scale
    assert (jac - jac.mT).abs().max() > 1e-3 * scale  # the curl is not zero


# ----------------------------------------------------------------- errors and plumbing
def test_dimension_mismatch_errors():
    with pytest.raises(ValueError, match="num_outputs"):
        CurlFreeFeatureKernel(20, input_dim=2, num_outputs=3)
    with pytest.raises(ValueError, match="num_outputs"):
        DivFreeFeatureKernel(20, input_dim=3, num_outputs=2)
    k = CurlFreeFeatureKernel(20, num_outputs=2)
    with pytest.raises(ValueError, match="input dimension = output dimension"):
        k.features(torch.randn(4, 3))
    with pytest.raises(ValueError, match="input dimension = output dimension"):
        CurlFreeKernel(input_dim=2)(torch.randn(4, 3)).to_dense()
    with pytest.raises(ValueError, match="d >= 2"):
        DivFreeFeatureKernel(20, input_dim=1)
    with pytest.raises(ValueError, match="d >= 2"):
        DivFreeFeatureKernel(20).features(torch.randn(4, 1))
    with pytest.raises(ValueError, match="input_dim must be >= 2"):
        DivFreeKernel(input_dim=1)
    with pytest.raises(ValueError, match="ard_num_dims"):
        CurlFreeFeatureKernel(20, input_dim=2, ard_num_dims=3)
    with pytest.raises(ValueError, match="ard_num_dims"):
        HelmholtzFeatureKernel(20, input_dim=2, ard_num_dims=3)


def test_bad_arguments():
    with pytest.raises(ValueError, match="num_features must be a multiple of 2"):
        CurlFreeFeatureKernel(21, input_dim=2)
    with pytest.raises(ValueError, match="num_features must be a multiple of 4"):
        DivFreeFeatureKernel(18, input_dim=3)
    with pytest.raises(ValueError, match="num_features must be a multiple of 4"):
        HelmholtzFeatureKernel(18, input_dim=2)
    with pytest.raises(ValueError, match="num_features must be a multiple"):
        DecomposableFeatureKernel(30, num_tasks=3, rank=1)
    with pytest.raises(ValueError, match="sampling"):
        CurlFreeFeatureKernel(20, sampling="structured")
    with pytest.raises(ValueError, match="factor"):
        DivFreeFeatureKernel(20, factor="cholesky")
    with pytest.raises(ValueError, match="rank"):
        DecomposableFeatureKernel(20, num_tasks=2, rank=0, diagonal=False)
    with pytest.raises(ValueError, match="num_tasks"):
        DecomposableFeatureKernel(20, num_tasks=0)
    with pytest.raises(TypeError, match="normalize"):
        CurlFreeFeatureKernel(20, normalize="yes")
    k = HelmholtzFeatureKernel(20, input_dim=2)
    with pytest.raises(ValueError, match="part"):
        k.component_features(torch.randn(3, 2), "grad")
    with pytest.raises(ValueError, match="curl_outputscale must be finite and positive"):
        k.curl_outputscale = -1.0


def test_state_dict_dtype_and_batch():
    k = HelmholtzFeatureKernel(40, input_dim=2, seed=4)
    k.curl_lengthscale = 0.3
    x = torch.randn(5, 2)
    phi32 = k.features(x)
    assert phi32.dtype == torch.float32
    fresh = HelmholtzFeatureKernel(40, input_dim=2)
    fresh.load_state_dict(k.state_dict())
    torch.testing.assert_close(fresh.features(x), phi32)
    kb = CurlFreeFeatureKernel(20, input_dim=3, seed=0, batch_shape=torch.Size([4]))
    assert kb.features(torch.randn(4, 6, 3)).shape == (4, 6, 3, 20)
    assert kb(torch.randn(4, 6, 3)).shape == (4, 18, 18)
    assert kb[1].features(torch.randn(6, 3)).shape == (6, 3, 20)


def test_num_outputs_inferred_from_input():
    k = CurlFreeFeatureKernel(20)  # d unknown until the first call
    x = torch.randn(5, 3)
    assert k(x).shape == (15, 15)
    assert k(x).to_dense().shape == (15, 15)
    assert k.num_outputs_per_input() == 3
    assert gpytorch.kernels.ScaleKernel(DivFreeKernel())(x).shape == (15, 15)


def test_lengthscale_gradient_flows():
    k = HelmholtzFeatureKernel(40, input_dim=2, seed=0).to(DT)
    x = rand(6, 2)
    k(x).to_dense().sum().backward()
    for name in ("raw_curl_lengthscale", "raw_div_lengthscale", "raw_curl_outputscale",
                 "raw_div_outputscale"):
        assert getattr(k, name).grad is not None and getattr(k, name).grad.abs().sum() > 0


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, 0.0])
@pytest.mark.parametrize("name", ["curl_lengthscale", "div_lengthscale", "curl_outputscale",
                                  "div_outputscale"])
def test_helmholtz_parameters_refuse_non_finite_values_by_name(name, bad):
    for kernel in (HelmholtzFeatureKernel(24, input_dim=3, seed=0), HelmholtzKernel()):
        before = getattr(kernel, name).clone()
        with pytest.raises(ValueError, match=f"{name} must be finite and positive, got"):
            setattr(kernel, name, torch.tensor(bad))
        assert torch.equal(getattr(kernel, name), before)  # nothing written
    with pytest.raises(TypeError, match=f"{name} must be a positive real number or tensor"):
        setattr(HelmholtzKernel(), name, "0.5")


@pytest.mark.parametrize("bad", [math.nan, math.inf, 0.0])
def test_decomposable_task_diag_refuses_non_finite_values_by_name(bad):
    kernel = DecomposableFeatureKernel(24, num_tasks=2, input_dim=3, diagonal=True)
    with pytest.raises(ValueError, match="task_diag must be finite and positive, got"):
        kernel.task_diag = torch.tensor([bad, 1.0])
