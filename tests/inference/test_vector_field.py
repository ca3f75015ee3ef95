"""Vector-valued GPs with operator-valued random features: RandomFeatureGP and GPyTorch paths."""

import math

import gpytorch
import pytest
import torch
from torch.autograd.functional import jacobian

from rfgp import RandomFeatureGP, helmholtz_components
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


def toy_field(x, seed=0):
    """A smooth field R^d -> R^d with both curl and divergence."""
    a = torch.randn(x.shape[-1], x.shape[-1], generator=gen(seed), dtype=DT)
    return torch.sin(x @ a) + 0.3 * x.flip(-1)


def posterior_mean_weights(gp):
    """The posterior mean weights m (mean(x) = features(x) @ m), read through the public API:
    the mean at the unit feature vector e_j is m_j."""
    k = gp.base_kernel
    num, p = k.num_features, gp.outputs_per_input
    basis = torch.zeros(num, p, num, dtype=DT)
    basis[torch.arange(num), 0, torch.arange(num)] = 1.0
    return gp.posterior_from_features(basis).mean[:, 0].detach()


def field_jacobians(kernel, weights, x):
    def field(xx):
        return kernel.features(xx.unsqueeze(0))[0] @ weights
    return torch.stack([jacobian(field, xi) for xi in x]).detach()  # (N, p, d)


# --------------------------------------------------------- exactly curl-/div-free posteriors
@pytest.mark.parametrize("dim", [2, 3, 4])
@pytest.mark.parametrize("num_frequencies", [3, 300])
def test_curl_free_posterior_mean_has_zero_curl(dim, num_frequencies):
    x = rand(40, dim, seed=1)
    y = toy_field(x)
    k = CurlFreeFeatureKernel(2 * num_frequencies, input_dim=dim, seed=dim).to(DT)
    k.lengthscale = 0.8
    gp = RandomFeatureGP(k, noise=0.05).fit(x, y)
    m = posterior_mean_weights(gp)
    xt = rand(6, dim, seed=2)
    torch.testing.assert_close(k.features(xt).detach() @ m, gp.predict(xt))
    jac = field_jacobians(k, m, xt)
    scale = jac.abs().max()
    assert (jac - jac.mT).abs().max() <= 1e-12 * scale
    assert jac.diagonal(dim1=-2, dim2=-1).sum(-1).abs().max() > 1e-3 * scale


@pytest.mark.parametrize("dim,factor", [(2, "auto"), (3, "cross"), (3, "complement"),
                                        (4, "complement")])
@pytest.mark.parametrize("num_frequencies", [3, 200])
def test_div_free_posterior_mean_has_zero_divergence(dim, factor, num_frequencies):
    x = rand(40, dim, seed=3)
    y = toy_field(x, seed=1)
    num_features = 2 * div_free_factor_rank(dim, factor) * num_frequencies
    k = DivFreeFeatureKernel(num_features, input_dim=dim, factor=factor, seed=dim).to(DT)
    k.lengthscale = 0.8
    gp = RandomFeatureGP(k, noise=0.05).fit(x, y)
    m = posterior_mean_weights(gp)
    xt = rand(6, dim, seed=4)
    torch.testing.assert_close(k.features(xt).detach() @ m, gp.predict(xt))
    jac = field_jacobians(k, m, xt)
    scale = jac.abs().max()
    assert jac.diagonal(dim1=-2, dim2=-1).sum(-1).abs().max() <= 1e-12 * scale
    assert (jac - jac.mT).abs().max() > 1e-3 * scale


def test_posterior_samples_are_curl_free():
    x = rand(30, 3, seed=5)
    k = CurlFreeFeatureKernel(64, input_dim=3, seed=0).to(DT)
    gp = RandomFeatureGP(k, noise=0.1).fit(x, toy_field(x))
    f = gp.sample_functions(2, generator=gen(0))
    # a sample is linear in the features: its Jacobian is that of features(x) @ w_s, with w_s
    # read off the sample at unit feature vectors (the features of x enter linearly)
    xt = rand(4, 3, seed=6)
    eps = 1e-6
    for i in range(3):
        e = torch.zeros(3, dtype=DT)
        e[i] = eps
        d_i = (f(xt + e) - f(xt - e)) / (2 * eps)  # (S, N, p): column i of the Jacobian
        if i == 0:
            cols = []
        cols.append(d_i)
    jac = torch.stack(cols, -1)  # (S, N, p, d)
    assert (jac - jac.mT).abs().max() < 1e-6 * jac.abs().max()


# ----------------------------------------------------------------- convergence to the exact GP
@pytest.mark.parametrize("kind", ["curl", "div", "helmholtz"])
def test_feature_posterior_approaches_exact_posterior(kind):
    x = rand(25, 2, seed=7)
    y = toy_field(x, seed=2)
    xt = rand(10, 2, seed=8)
    noise = 0.05
    errors = {}
    for num_frequencies in (100, 10000):
        errs = []
        for seed in range(3):
            if kind == "curl":
                k = CurlFreeFeatureKernel(2 * num_frequencies, input_dim=2, seed=seed)
            elif kind == "div":
                k = DivFreeFeatureKernel(2 * num_frequencies, input_dim=2, seed=seed)
            else:
                k = HelmholtzFeatureKernel(4 * num_frequencies, input_dim=2, seed=seed)
            k = k.to(DT)
            if kind == "helmholtz":
                k.curl_lengthscale, k.div_lengthscale = 0.6, 1.1
                k.curl_outputscale, k.div_outputscale = 1.5, 0.5
            else:
                k.lengthscale = 0.7
            gp = RandomFeatureGP(k, noise=noise).fit(x, y)
            exact = k.exact_kernel()
            kxx = exact(x).to_dense().detach()
            ktx = exact(xt, x).to_dense().detach()
            ref = ktx @ torch.linalg.solve(kxx + noise * torch.eye(50, dtype=DT), y.reshape(-1))
            errs.append((gp.predict(xt).reshape(-1) - ref).norm() / ref.norm())
        errors[num_frequencies] = torch.stack(errs).mean()
    # Monte Carlo error ~ D^{-1/2}: 100x the features -> about 10x smaller; allow a factor 3
    assert errors[10000] < errors[100] / 3.0, errors
    assert errors[10000] < 0.05, errors


# ----------------------------------------------------------------- Helmholtz components
def _helmholtz_data(n, seed=0):
    """f = grad(phi) + rot grad(psi) with Gaussian-bump potentials: known components."""
    x = rand(n, 2, seed=seed) * 1.5
    x = x.requires_grad_(True)
    phi = torch.exp(-((x - torch.tensor([0.5, 0.0], dtype=DT)) ** 2).sum(-1) / 0.5)
    psi = 0.8 * torch.exp(-((x + torch.tensor([0.4, 0.3], dtype=DT)) ** 2).sum(-1) / 0.3)
    grad_phi = torch.autograd.grad(phi.sum(), x, create_graph=True)[0]
    grad_psi = torch.autograd.grad(psi.sum(), x)[0]
    curl = grad_phi.detach()
    div = torch.stack([-grad_psi[:, 1], grad_psi[:, 0]], -1)  # J grad psi: divergence-free
    return x.detach(), curl, div


def test_helmholtz_components_recover_the_parts():
    x, curl, div = _helmholtz_data(300, seed=9)
    xt, curl_t, div_t = _helmholtz_data(100, seed=10)
    k = HelmholtzFeatureKernel(2000, input_dim=2, seed=0).to(DT)
    k.curl_lengthscale, k.div_lengthscale = 0.5, 0.4
    k.curl_outputscale = k.div_outputscale = 1.0
    gp = RandomFeatureGP(k, noise=1e-2).fit(x, curl + div)
    parts = helmholtz_components(gp, xt)
    full = gp.posterior(xt)
    torch.testing.assert_close(parts["curl"].mean + parts["div"].mean, full.mean)
    for name, truth in (("curl", curl_t), ("div", div_t)):
        est = parts[name].mean
        rel = (est - truth).norm() / truth.norm()
        assert rel < 0.15, (name, rel)
        var = parts[name].variance
        assert var.shape == (100, 2) and (var >= 0).all()
    # each component's own field is exactly curl-free / div-free
    m = posterior_mean_weights(gp)
    for part, check in (("curl", "curl"), ("div", "div")):
        def field(xx, part=part):
            return k.component_features(xx.unsqueeze(0), part)[0] @ m
        jac = torch.stack([jacobian(field, xi) for xi in xt[:4]]).detach()
        scale = jac.abs().max()
        if check == "curl":
            assert (jac - jac.mT).abs().max() <= 1e-12 * scale
        else:
            assert jac.diagonal(dim1=-2, dim2=-1).sum(-1).abs().max() <= 1e-12 * scale


def test_helmholtz_components_covariance_adds_up():
    # Cov(f) = Cov(f_curl) + Cov(f_div) + Cov(f_curl, f_div) + Cov(f_div, f_curl); the cross
    # covariance is read from the posterior of f_curl - f_div: Cov(c+d) + Cov(c-d) = 2 (Cc + Cd)
    x, curl, div = _helmholtz_data(60, seed=11)
    k = HelmholtzFeatureKernel(200, input_dim=2, seed=1).to(DT)
    gp = RandomFeatureGP(k, noise=1e-2).fit(x, curl + div)
    xt = rand(5, 2, seed=12)
    parts = helmholtz_components(gp, xt)
    phi_c, phi_d = k.component_features(xt, "curl"), k.component_features(xt, "div")
    cov_sum = gp.posterior_from_features((phi_c + phi_d).detach()).covariance_matrix
    cov_diff = gp.posterior_from_features((phi_c - phi_d).detach()).covariance_matrix
    torch.testing.assert_close(
        cov_sum + cov_diff,
        2 * (parts["curl"].covariance_matrix + parts["div"].covariance_matrix))
    torch.testing.assert_close(cov_sum, gp.posterior(xt).covariance_matrix)


def test_helmholtz_components_with_scale_kernel_and_errors():
    x, curl, div = _helmholtz_data(50, seed=13)
    k = HelmholtzFeatureKernel(80, input_dim=2, seed=2).to(DT)
    scaled = gpytorch.kernels.ScaleKernel(k).to(DT)
    scaled.outputscale = 2.0
    gp = RandomFeatureGP(scaled, noise=1e-2).fit(x, curl + div)
    parts = helmholtz_components(gp, x[:4])
    torch.testing.assert_close(parts["curl"].mean + parts["div"].mean, gp.predict(x[:4]))
    other = RandomFeatureGP(CurlFreeFeatureKernel(20, input_dim=2), noise=0.1).fit(x, curl)
    with pytest.raises(TypeError, match="HelmholtzFeatureKernel"):
        helmholtz_components(other, x)


def test_target_dimension_must_match():
    x = rand(10, 2)
    gp = RandomFeatureGP(CurlFreeFeatureKernel(20), noise=0.1)
    with pytest.raises(ValueError, match="y must have shape"):
        gp.fit(x, torch.randn(10, 3, dtype=DT))


@pytest.mark.slow
def test_hyperparameters_by_marginal_likelihood_separate_the_parts():
    # the curl-free part varies slowly, the div-free part quickly: the fitted lengthscales
    # must order the same way
    g = gen(14)
    x = torch.rand(250, 2, generator=g, dtype=DT) * 4 - 2
    slow = CurlFreeFeatureKernel(200, input_dim=2, seed=20).to(DT)
    fast = DivFreeFeatureKernel(200, input_dim=2, seed=21).to(DT)
    slow.lengthscale, fast.lengthscale = 1.5, 0.3
    w1 = torch.randn(200, generator=g, dtype=DT)
    w2 = torch.randn(200, generator=g, dtype=DT)
    y = (slow.features(x) @ w1 + fast.features(x) @ w2).detach()
    y = y + 0.05 * torch.randn(y.shape, generator=g, dtype=DT)
    k = HelmholtzFeatureKernel(800, input_dim=2, seed=3).to(DT)
    k.curl_lengthscale = k.div_lengthscale = 0.7
    gp = RandomFeatureGP(k, noise=0.1)
    gp.optimize_hyperparameters(x, y, num_iterations=8)
    assert k.curl_lengthscale.item() > 2 * k.div_lengthscale.item()
    assert 0.5 < k.curl_lengthscale.item() < 4.0 and 0.1 < k.div_lengthscale.item() < 0.9


# ----------------------------------------------------------------- GPyTorch ExactGP path
class MultitaskGP(gpytorch.models.ExactGP):
    def __init__(self, x, y, likelihood, kernel, num_tasks):
        super().__init__(x, y, likelihood)
        self.mean_module = gpytorch.means.MultitaskMean(gpytorch.means.ConstantMean(),
                                                        num_tasks=num_tasks)
        self.covar_module = kernel

    def forward(self, x):
        return gpytorch.distributions.MultitaskMultivariateNormal(self.mean_module(x),
                                                                  self.covar_module(x))


def _exact_reference(kernel, likelihood, model, x, y, xt):
    """K_*X (K + S)^{-1} (y - mu) + mu in the interleaved layout, computed densely."""
    with torch.no_grad():
        mu = torch.stack([m.constant for m in model.mean_module.base_means]).reshape(-1)
        kxx = kernel(x).to_dense()
        ktx = kernel(xt, x).to_dense()
        noise = likelihood._shaped_noise_covar(y.shape).to_dense()
        resid = (y - mu).reshape(-1)
        return (ktx @ torch.linalg.solve(kxx + noise, resid)).reshape(-1, y.shape[1]) + mu


@pytest.mark.parametrize("make", [
    lambda: CurlFreeKernel(input_dim=2),
    lambda: DivFreeKernel(input_dim=2),
    lambda: HelmholtzKernel(input_dim=2),
    lambda: CurlFreeFeatureKernel(100, input_dim=2, seed=0),
    lambda: DivFreeFeatureKernel(100, input_dim=2, seed=0),
    lambda: HelmholtzFeatureKernel(200, input_dim=2, seed=0),
    lambda: DecomposableFeatureKernel(120, num_tasks=2, rank=1, seed=0),
    lambda: gpytorch.kernels.ScaleKernel(CurlFreeFeatureKernel(100, input_dim=2, seed=0)),
])
def test_exact_gp_path(make):
    x = rand(30, 2, seed=15)
    y = toy_field(x, seed=3) + 0.5
    kernel = make().to(DT)
    likelihood = gpytorch.likelihoods.MultitaskGaussianLikelihood(num_tasks=2).to(DT)
    model = MultitaskGP(x, y, likelihood, kernel, 2).to(DT)
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
    model.train()
    likelihood.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    for _ in range(3):
        optimizer.zero_grad()
        loss = -mll(model(x), y)
        loss.backward()
        optimizer.step()
    assert torch.isfinite(loss)
    model.eval()
    likelihood.eval()
    xt = rand(7, 2, seed=16)
    with gpytorch.settings.fast_computations(False, False, False):
        pred = model(xt)
    assert pred.mean.shape == (7, 2) and pred.covariance_matrix.shape == (14, 14)
    ref = _exact_reference(kernel, likelihood, model, x, y, xt)
    torch.testing.assert_close(pred.mean.detach(), ref, atol=1e-8, rtol=1e-8)
    assert (pred.variance.detach() >= 0).all()


def test_exact_gp_posterior_mean_is_curl_free():
    x = rand(30, 3, seed=17)
    y = toy_field(x, seed=4)
    likelihood = gpytorch.likelihoods.MultitaskGaussianLikelihood(
        num_tasks=3, has_task_noise=False).to(DT)
    likelihood.noise = 0.01
    model = MultitaskGP(x, y, likelihood, CurlFreeKernel(input_dim=3), 3).to(DT)
    model.eval()

    def field(xx):
        return model(xx.unsqueeze(0)).mean[0]

    for xi in rand(3, 3, seed=18):
        jac = jacobian(field, xi).detach()
        assert (jac - jac.T).abs().max() <= 1e-12 * jac.abs().max()
        assert jac.trace().abs() > 1e-3 * jac.abs().max()


def test_feature_gp_matches_gpytorch_feature_path():
    # same kernel, same noise, zero mean: RandomFeatureGP == ExactGP with the feature kernel
    x = rand(40, 2, seed=19)
    y = toy_field(x, seed=5)
    kernel = HelmholtzFeatureKernel(120, input_dim=2, seed=4).to(DT)
    gp = RandomFeatureGP(kernel, noise=0.02).fit(x, y)
    likelihood = gpytorch.likelihoods.MultitaskGaussianLikelihood(
        num_tasks=2, has_task_noise=False).to(DT)
    likelihood.noise = 0.02
    model = MultitaskGP(x, y, likelihood, kernel, 2).to(DT)
    for m in model.mean_module.base_means:
        m.constant.data.zero_()
    model.eval()
    xt = rand(9, 2, seed=20)
    with torch.no_grad():
        pred = model(xt)
    ours = gp.posterior(xt)
    torch.testing.assert_close(pred.mean, ours.mean)
    torch.testing.assert_close(pred.covariance_matrix, ours.covariance_matrix)
    # and the evidence: GPyTorch's mll is log p(y) / (N p)
    model.train()
    likelihood.train()
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
    with torch.no_grad():
        theirs = mll(model(x), y) * y.numel()
    torch.testing.assert_close(theirs, gp.log_marginal_likelihood(), rtol=1e-8, atol=1e-8)


@pytest.mark.slow
def test_decomposable_fit_learns_correlated_outputs():
    # two outputs that are the same function: the learned A is close to rank one
    g = gen(21)
    x = torch.rand(200, 1, generator=g, dtype=DT) * 4
    f = torch.sin(2 * x[:, 0])
    y = torch.stack([f, 2 * f], -1) + 0.05 * torch.randn(200, 2, generator=g, dtype=DT)
    k = DecomposableFeatureKernel(2 * 50 * 3, num_tasks=2, rank=1, seed=0).to(DT)
    gp = RandomFeatureGP(k, noise=0.1)
    gp.optimize_hyperparameters(x, y, num_iterations=8)
    a = k.task_covariance.detach()
    corr = a[0, 1] / math.sqrt(a[0, 0] * a[1, 1])
    assert corr > 0.9
    assert 1.5 < (a[1, 1] / a[0, 0]).sqrt() < 2.5
