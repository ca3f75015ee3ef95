"""PolynomialSketchKernel: unbiasedness with lengthscale and bias, CtR, GPyTorch plumbing and
bad input."""

import math
import pickle

import gpytorch
import pytest
import torch

from rfgp.kernels import DotProductKernel, PolynomialSketchKernel, apply_sketch, sample_sketch

PROJECTIONS = ["gaussian", "rademacher", "tensorsketch", "tensorsrht"]


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
