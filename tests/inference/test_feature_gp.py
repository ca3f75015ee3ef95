"""Tests of RandomFeatureGP: exact identities against dense oracles, convergence to the exact GP,
streaming and incremental updates, the marginal likelihood, hooks and input validation."""

from __future__ import annotations

import math
import warnings

import gpytorch
import pytest
import torch
from gpytorch.distributions import MultitaskMultivariateNormal, MultivariateNormal
from linear_operator.utils.warnings import NumericalWarning

from rfgp import RandomFeatureGP, metrics
from rfgp._ops import gaussian
from rfgp.inference._linalg import robust_cholesky
from rfgp.inference._selection import ConvergenceWarning
from rfgp.kernels import FourierFeatureKernel, RandomFeatureKernel
from tests.helpers import ComplexFourierKernel

DT = torch.float64


# ----------------------------------------------------------------------------- test kernels
class AsComplexKernel(RandomFeatureKernel):
    """Real features of an inner kernel returned as complex with zero imaginary part."""

    def __init__(self, inner):
        super().__init__(num_features=inner.num_features)
        self.inner = inner
        self.is_complex = True

    def _sample_weights(self, input_dim, generator):
        return {}

    def ensure_weights(self, x):
        self.input_dim = x.shape[-1]

    def _features(self, x):
        phi = self.inner.features(x)
        return torch.complex(phi, torch.zeros_like(phi))


class TwoOutputKernel(RandomFeatureKernel):
    """p = 2 outputs per input: ``Phi(x) = [phi(x) a_1; phi(x) a_2]`` rows (test only)."""

    _outputs_per_input = 2

    def __init__(self, num_features, **kwargs):
        super().__init__(num_features=num_features, **kwargs)
        self.inner = FourierFeatureKernel(num_features, seed=kwargs.get("seed"))

    def _sample_weights(self, input_dim, generator):
        return {"mix": gaussian((2,), generator)}

    def _features(self, x):
        phi = self.inner.features(x)  # (N, D)
        mix = torch.stack([torch.ones_like(self.mix[0]), self.mix[0]]).to(x.dtype)
        # output 0: phi, output 1: phi * mix + a sign flip of half the columns (not a multiple)
        flip = torch.ones(phi.shape[-1], dtype=x.dtype)
        flip[: phi.shape[-1] // 2] = -1
        return torch.stack([phi * mix[0], phi * flip * mix[1]], dim=-2)


def dense_posterior(phi_train, y, noise, phi_test):
    """Textbook N x N posterior with kernel Phi Phi^H (literal Eqs. 84-85 with the correct row).

    phi_*: (R, D) complex or real rows; y (R,); noise (R,). Returns Re mean, Re cov.
    """
    k = phi_train @ phi_train.conj().T + torch.diag(noise.to(phi_train.dtype))
    kx = phi_test @ phi_train.conj().T  # k_hat(x_*, x_i)
    kinv_y = torch.linalg.solve(k, y.to(k.dtype))
    mean = (kx @ kinv_y).real
    cov = phi_test @ phi_test.conj().T - kx @ torch.linalg.solve(k, kx.conj().T)
    return mean, cov.real


def block_oracle(phi_train, y, noise, phi_test):
    """The complex posterior through the real 2D x 2D block system (no complex algebra)."""
    r, j = phi_train.real, phi_train.imag
    rw, jw = r / noise.unsqueeze(-1), j / noise.unsqueeze(-1)
    re_b = r.T @ rw + j.T @ jw + torch.eye(r.shape[1], dtype=r.dtype)
    im_b = r.T @ jw - j.T @ rw
    big = torch.cat([torch.cat([re_b, -im_b], 1), torch.cat([im_b, re_b], 1)], 0)
    b_re, b_im = rw.T @ y, -(jw.T @ y)  # Phi^H S^-1 y
    w = torch.linalg.solve(big, torch.cat([b_re, b_im]))
    d = r.shape[1]
    ts_r, ts_i = phi_test.real, phi_test.imag
    mean = ts_r @ w[:d] - ts_i @ w[d:]
    # Cov = Re(Phi_* B^{-1} Phi_*^H); B^{-1} v via the block system, v = conj(Phi_*)^T columns.
    rhs = torch.cat([ts_r.T, -ts_i.T])
    sol = torch.linalg.solve(big, rhs)
    cov = ts_r @ sol[:d] - ts_i @ sol[d:]
    return mean, cov


# ----------------------------------------------------------------------------- data
def make_data(n=80, m=20, d=2, seed=0, outputs=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, d, generator=g, dtype=DT)
    xt = torch.rand(m, d, generator=g, dtype=DT)
    f = torch.sin(6 * x[:, 0]) + torch.cos(4 * x[:, 1])
    ys = [f * (t + 1) + 0.1 * torch.randn(n, generator=g, dtype=DT) for t in range(outputs)]
    y = ys[0] if outputs == 1 else torch.stack(ys, -1)
    return x, y, xt, g


def fourier(d=40, seed=0, lengthscale=0.3):
    k = FourierFeatureKernel(d, seed=seed).double()
    k.lengthscale = lengthscale
    return k


def complex_fourier(d=30, seed=0, lengthscale=0.3):
    k = ComplexFourierKernel(d, seed=seed).double()
    k.lengthscale = lengthscale
    return k


# ============================================================================= exact identities
@pytest.mark.parametrize("make_kernel", [fourier, complex_fourier])
@pytest.mark.parametrize("n", [80, 15])  # N > D and N < D
def test_weight_and_function_space_agree(make_kernel, n):
    x, y, xt, g = make_data(n=n, outputs=2)
    k = make_kernel()
    noise = torch.stack(
        [0.05 + 0.1 * torch.rand(n, generator=g, dtype=DT), torch.full((n,), 0.2, dtype=DT)], -1
    )
    gw = RandomFeatureGP(k, solve="weight").fit(x, y, noise)
    gf = RandomFeatureGP(k, solve="function").fit(x, y, noise)
    assert gw.solve_used == "weight" and gf.solve_used == "function"
    pw, pf = gw.posterior(xt), gf.posterior(xt)
    assert isinstance(pw, MultitaskMultivariateNormal) and pw.mean.shape == (20, 2)
    torch.testing.assert_close(pw.mean, pf.mean, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(pw.covariance_matrix, pf.covariance_matrix, rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(
        gw.log_marginal_likelihood(), gf.log_marginal_likelihood(), rtol=1e-10, atol=1e-10
    )
    # both equal the textbook N x N posterior, column by column
    for t in range(2):
        mean, cov = dense_posterior(k.features(x), y[:, t], noise[:, t], k.features(xt))
        torch.testing.assert_close(pw.mean[:, t], mean, rtol=1e-9, atol=1e-10)
        std = gw.predict(xt, return_std=True)[1][:, t]
        torch.testing.assert_close(std.square(), cov.diagonal(), rtol=1e-9, atol=1e-10)


def test_auto_solve_picks_the_cheaper_side():
    x, y, _, _ = make_data(n=80)
    assert RandomFeatureGP(fourier(40)).fit(x, y).solve_used == "weight"
    assert RandomFeatureGP(fourier(400)).fit(x, y).solve_used == "function"


@pytest.mark.parametrize("solve", ["weight", "function"])
def test_complex_posterior_matches_real_block_oracle(solve):
    x, y, xt, g = make_data(n=60)
    k = complex_fourier(24)
    noise = 0.02 + 0.1 * torch.rand(60, generator=g, dtype=DT)
    gp = RandomFeatureGP(k, solve=solve).fit(x, y, noise)
    mean, cov = block_oracle(k.features(x), y, noise, k.features(xt))
    post = gp.posterior(xt)
    torch.testing.assert_close(post.mean, mean, rtol=1e-10, atol=1e-11)
    torch.testing.assert_close(post.covariance_matrix, cov, rtol=1e-9, atol=1e-11)


def test_complex_mean_uses_the_unconjugated_row():
    # Convention guard: Re(Phi_* B^-1 Phi^H S^-1 y) is not the mean with conj(k(x)).
    x, y, xt, _ = make_data(n=60)
    k = complex_fourier(24, lengthscale=0.15)
    gp = RandomFeatureGP(k, noise=0.05).fit(x, y)
    phi, phit = k.features(x), k.features(xt)
    b = phi.conj().T @ phi / 0.05 + torch.eye(24, dtype=DT)
    w = torch.linalg.solve(b, phi.conj().T @ (y / 0.05).to(phi.dtype))
    torch.testing.assert_close(gp.predict(xt), (phit @ w).real, rtol=1e-10, atol=1e-11)
    kx_conj = (phit @ phi.conj().T).conj()
    wrong = (
        kx_conj @ torch.linalg.solve(phi @ phi.conj().T + 0.05 * torch.eye(60), y.to(phi.dtype))
    ).real
    assert (gp.predict(xt) - wrong).abs().max() > 1e-3


def test_real_features_as_complex_give_the_real_result():
    x, y, xt, g = make_data(n=70)
    real = fourier(40)
    as_complex = AsComplexKernel(real)
    noise = 0.05 + 0.1 * torch.rand(70, generator=g, dtype=DT)
    for solve in ("weight", "function"):
        gr = RandomFeatureGP(real, solve=solve).fit(x, y, noise)
        gc = RandomFeatureGP(as_complex, solve=solve).fit(x, y, noise)
        mr, sr = gr.predict(xt, return_std=True)
        mc, sc = gc.predict(xt, return_std=True)
        torch.testing.assert_close(mc, mr, rtol=0, atol=1e-12)
        torch.testing.assert_close(sc, sr, rtol=0, atol=1e-12)
        torch.testing.assert_close(gc.log_marginal_likelihood(), gr.log_marginal_likelihood())


def test_real_form_mode_is_the_real_gp_with_kernel_re_k_hat():
    x, y, xt, _ = make_data(n=60)
    k = complex_fourier(24, lengthscale=0.15)
    gp = RandomFeatureGP(k, noise=0.05, complex_posterior=False).fit(x, y)
    z, zt = k.real_features(x), k.real_features(xt)
    mean, cov = dense_posterior(z, y, torch.full((60,), 0.05, dtype=DT), zt)
    post = gp.posterior(xt)
    torch.testing.assert_close(post.mean, mean, rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(post.covariance_matrix, cov, rtol=1e-9, atol=1e-10)
    complex_mean = RandomFeatureGP(k, noise=0.05).fit(x, y).predict(xt)
    assert (complex_mean - mean).abs().max() > 1e-3  # different estimators when Im K != 0


def test_heteroscedastic_noise_matches_dense_oracle_and_groups_share_factors():
    x, y, xt, g = make_data(n=50, outputs=4)
    k = fourier(30)
    per_point = 0.02 + 0.2 * torch.rand(50, generator=g, dtype=DT)
    other = 0.02 + 0.2 * torch.rand(50, generator=g, dtype=DT)
    noise = torch.stack([per_point, other, per_point, other], -1)
    gp = RandomFeatureGP(k, solve="weight").fit(x, y, noise)
    assert gp.factorization_groups == [[0, 2], [1, 3]]
    mean, std = gp.predict(xt, return_std=True)
    for t in range(4):
        m, c = dense_posterior(k.features(x), y[:, t], noise[:, t], k.features(xt))
        torch.testing.assert_close(mean[:, t], m, rtol=1e-9, atol=1e-10)
        torch.testing.assert_close(std[:, t].square(), c.diagonal(), rtol=1e-9, atol=1e-10)
    # one noise per point shared by all outputs: one factorisation
    gp1 = RandomFeatureGP(k).fit(x, y, per_point)
    assert gp1.factorization_groups == [[0, 1, 2, 3]]
    torch.testing.assert_close(gp1.predict(xt)[:, 2], mean[:, 2], rtol=1e-10, atol=1e-11)
    # per-output model noise: equal values share
    gp2 = RandomFeatureGP(k, noise=torch.tensor([0.1, 0.3, 0.1, 0.1], dtype=DT)).fit(x, y)
    assert gp2.factorization_groups == [[0, 2, 3], [1]]
    m, _ = dense_posterior(k.features(x), y[:, 1], torch.full((50,), 0.3, dtype=DT), k.features(xt))
    torch.testing.assert_close(gp2.predict(xt)[:, 1], m, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("solve", ["weight", "function"])
def test_multi_output_kernel_interleaved_rows(solve):
    x, y, xt, _ = make_data(n=40, outputs=2)
    k = TwoOutputKernel(30, seed=1).double()
    noise = torch.tensor([0.05, 0.2], dtype=DT)
    gp = RandomFeatureGP(k, noise=noise, solve=solve).fit(x, y)
    rows = k.features(x).reshape(80, 30)
    mean, cov = dense_posterior(
        rows, y.reshape(-1), noise.repeat(40), k.features(xt).reshape(40, 30)
    )
    post = gp.posterior(xt)
    assert isinstance(post, MultitaskMultivariateNormal) and post.mean.shape == (20, 2)
    torch.testing.assert_close(post.mean.reshape(-1), mean, rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(post.covariance_matrix, cov, rtol=1e-9, atol=1e-10)
    m, s = gp.predict(xt, return_std=True)
    assert m.shape == s.shape == (20, 2)
    # the same with the noise given to fit as (p,) and as (N, p)
    gp2 = RandomFeatureGP(k, solve=solve).fit(x, y, noise.expand(40, 2))
    torch.testing.assert_close(gp2.predict(xt), m, rtol=1e-10, atol=1e-11)
    gp3 = RandomFeatureGP(k, solve=solve).fit(x, y, noise)
    torch.testing.assert_close(gp3.predict(xt), m, rtol=1e-10, atol=1e-11)


def test_scale_kernel_multiplies_features_by_sqrt_outputscale():
    x, y, xt, _ = make_data(n=60)
    base = fourier(30)
    k = gpytorch.kernels.ScaleKernel(base).double()
    k.outputscale = 2.5
    gp = RandomFeatureGP(k, noise=0.1).fit(x, y)
    scale = math.sqrt(2.5)
    mean, cov = dense_posterior(
        base.features(x) * scale, y, torch.full((60,), 0.1, dtype=DT), base.features(xt) * scale
    )
    post = gp.posterior(xt)
    torch.testing.assert_close(post.mean, mean, rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(post.covariance_matrix, cov, rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(
        gp.posterior_from_features(base.features(xt)).mean, mean, rtol=1e-10, atol=1e-11
    )


def test_posterior_types_and_single_column_layout():
    x, y, xt, _ = make_data(n=40)
    gp = RandomFeatureGP(fourier(20), noise=0.1).fit(x, y)
    post = gp.posterior(xt)
    assert type(post) is MultivariateNormal and post.mean.shape == (20,)
    gp2 = RandomFeatureGP(fourier(20), noise=0.1).fit(x, y.unsqueeze(-1))
    post2 = gp2.posterior(xt)
    assert isinstance(post2, MultitaskMultivariateNormal) and post2.mean.shape == (20, 1)
    torch.testing.assert_close(post2.mean[:, 0], post.mean)
    assert gp2.predict(xt).shape == (20, 1)


# ============================================================================= convergence
def exact_rbf_posterior(x, y, xt, lengthscale, noise):
    def k(a, b):
        return torch.exp(-torch.cdist(a, b).square() / (2 * lengthscale**2))

    kxx = k(x, x) + noise * torch.eye(x.shape[0], dtype=DT)
    kxt = k(x, xt)
    mean = kxt.T @ torch.linalg.solve(kxx, y)
    var = 1.0 - (kxt * torch.linalg.solve(kxx, kxt)).sum(0)
    return mean, var


@pytest.mark.parametrize("make_kernel", [fourier, complex_fourier])
def test_posterior_converges_to_exact_gp_as_d_grows(make_kernel):
    x, y, xt, _ = make_data(n=100, m=40)
    mean_e, var_e = exact_rbf_posterior(x, y, xt, 0.3, 0.01)
    sizes = [64, 512, 4096]
    kl, mean_err, var_err = [], [], []
    for num in sizes:
        kls, merr, verr = [], [], []
        for seed in range(4):
            gp = RandomFeatureGP(make_kernel(num, seed=seed), noise=0.01).fit(x, y)
            mean, std = gp.predict(xt, return_std=True)
            kls.append(float(metrics.gaussian_kl(mean, std.square(), mean_e, var_e)))
            merr.append(float((mean - mean_e).abs().max()))
            verr.append(float((std.square() - var_e).abs().max()))
        kl.append(sum(kls) / 4)
        mean_err.append(sum(merr) / 4)
        var_err.append(sum(verr) / 4)
    # Monte Carlo errors shrink like D^-1/2 (KL like D^-1): a factor 64 in D gives ~8 (~64),
    # past the rows too (100 rows: 512 and 4096 features both exceed them), as the prior
    # Phi Phi^T approaches the kernel's only as D grows.
    assert kl[0] > kl[1] > kl[2] and kl[0] / kl[2] > 10
    assert mean_err[0] > mean_err[1] > mean_err[2] and mean_err[0] / mean_err[2] > 3
    assert var_err[0] > var_err[2] and var_err[0] / var_err[2] > 3
    assert mean_err[2] < 0.1 * float(y.std())


# ============================================================================= streaming, update
def test_fit_stream_equals_fit_with_groups_splitting_mid_stream():
    x, y, xt, g = make_data(n=90, outputs=3)
    k = complex_fourier(20)
    a = 0.05 + 0.1 * torch.rand(90, generator=g, dtype=DT)
    b = 0.05 + 0.1 * torch.rand(90, generator=g, dtype=DT)
    c = 0.05 + 0.1 * torch.rand(90, generator=g, dtype=DT)
    noise = torch.stack([a, a.clone(), b], -1)
    noise[60:, 1] = c[60:]  # columns 0 and 1 agree on the first 60 rows only
    chunks = [(x[i : i + 30], y[i : i + 30], noise[i : i + 30]) for i in range(0, 90, 30)]
    streamed = RandomFeatureGP(k).fit_stream(chunks)
    full = RandomFeatureGP(k, solve="weight").fit(x, y, noise)
    assert streamed.factorization_groups == full.factorization_groups == [[0], [1], [2]]
    ps, pf = streamed.posterior(xt), full.posterior(xt)
    torch.testing.assert_close(ps.mean, pf.mean, rtol=1e-10, atol=1e-11)
    torch.testing.assert_close(ps.covariance_matrix, pf.covariance_matrix, rtol=1e-10, atol=1e-11)
    torch.testing.assert_close(streamed.log_marginal_likelihood(), full.log_marginal_likelihood())
    for t in range(3):
        m, _ = dense_posterior(k.features(x), y[:, t], noise[:, t], k.features(xt))
        torch.testing.assert_close(ps.mean[:, t], m, rtol=1e-9, atol=1e-10)


def test_fit_stream_with_model_noise_and_progress_bar():
    pytest.importorskip("tqdm")
    x, y, xt, _ = make_data(n=100)
    k = fourier(30)
    streamed = RandomFeatureGP(k, noise=0.1).fit_stream(
        ((x[i : i + 7], y[i : i + 7]) for i in range(0, 100, 7)), progress=True
    )
    full = RandomFeatureGP(k, noise=0.1).fit(x, y, chunk_size=13)
    torch.testing.assert_close(streamed.predict(xt), full.predict(xt), rtol=1e-10, atol=1e-11)
    assert streamed.num_data == full.num_data == 100


@pytest.mark.parametrize("fixed_noise", [False, True])
def test_update_equals_refit(fixed_noise):
    x, y, xt, g = make_data(n=120, outputs=2)
    k = fourier(30)
    noise = (0.05 + 0.1 * torch.rand(120, 2, generator=g, dtype=DT)) if fixed_noise else None
    part = (lambda s: noise[s]) if fixed_noise else (lambda s: None)
    gp = RandomFeatureGP(k, noise=0.1).fit(x[:20], y[:20], part(slice(0, 20)))
    assert gp.solve_used == "function"  # 20 < 30 rows
    gp.update(x[20:50], y[20:50], part(slice(20, 50)))  # switches to weight space
    gp.update(x[50:], y[50:], part(slice(50, None)))
    assert gp.solve_used == "weight"
    ref = RandomFeatureGP(k, noise=0.1).fit(x, y, noise)
    torch.testing.assert_close(gp.predict(xt), ref.predict(xt), rtol=1e-10, atol=1e-11)
    torch.testing.assert_close(gp.log_marginal_likelihood(), ref.log_marginal_likelihood())


def test_changing_model_noise_refactorises_without_refit():
    x, y, xt, _ = make_data(n=60)
    k = fourier(30)
    gp = RandomFeatureGP(k, noise=0.1).fit(x, y)
    gp.noise = 0.3
    ref = RandomFeatureGP(k, noise=0.3).fit(x, y)
    torch.testing.assert_close(gp.predict(xt), ref.predict(xt), rtol=1e-10, atol=1e-11)


@pytest.mark.parametrize("solve", ["weight", "function"])
def test_changed_per_output_noise_of_vector_outputs_needs_a_refit(solve):
    # With p outputs per input and one model noise per output, the noise is expanded into row
    # noise at fit time: neither solver may reuse it after the model noise changed. With the
    # training data held the model refits (equal to a fresh fit); without it, it raises.
    from rfgp.kernels import CurlFreeFeatureKernel

    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 2, dtype=torch.float64, generator=g)
    y = torch.randn(40, 2, dtype=torch.float64, generator=g)
    kernel = CurlFreeFeatureKernel(32, seed=0).double()
    gp = RandomFeatureGP(kernel, noise=torch.tensor([0.1, 0.2], dtype=DT), solve=solve)
    gp.fit(x, y)
    gp.noise = torch.tensor([1.0, 2.0], dtype=torch.float64)
    fresh = RandomFeatureGP(kernel, noise=torch.tensor([1.0, 2.0], dtype=DT), solve=solve)
    torch.testing.assert_close(gp.predict(x[:3]), fresh.fit(x, y).predict(x[:3]))
    torch.testing.assert_close(gp.log_marginal_likelihood(), fresh.log_marginal_likelihood())
    if solve == "weight":
        streamed = RandomFeatureGP(kernel, noise=torch.tensor([0.1, 0.2], dtype=DT))
        streamed.fit_stream([(x, y)])
        streamed.noise = torch.tensor([1.0, 2.0], dtype=torch.float64)
        with pytest.raises(RuntimeError, match="model noise changed since fit.*call fit"):
            streamed.predict(x[:3])
        with pytest.raises(RuntimeError, match="model noise changed since fit"):
            streamed.log_marginal_likelihood()


# ============================================================================= marginal likelihood
def test_log_marginal_likelihood_matches_gpytorch_exact_mll():
    x, y, _, _ = make_data(n=100)
    k = gpytorch.kernels.ScaleKernel(fourier(32)).double()
    k.outputscale = 1.7

    class Model(gpytorch.models.ExactGP):
        def __init__(self, likelihood):
            super().__init__(x, y, likelihood)
            self.mean_module = gpytorch.means.ZeroMean()
            self.covar_module = k

        def forward(self, inp):
            return MultivariateNormal(self.mean_module(inp), self.covar_module(inp))

    likelihood = gpytorch.likelihoods.GaussianLikelihood().double()
    likelihood.noise = 0.07
    model = Model(likelihood).double()
    model.train()
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
    with gpytorch.settings.max_cholesky_size(10_000):
        expected = mll(model(x), y) * 100
    noise = likelihood.noise.detach().item()
    for solve in ("weight", "function"):
        gp = RandomFeatureGP(k, noise=noise, solve=solve).fit(x, y)
        torch.testing.assert_close(
            gp.log_marginal_likelihood(), expected.detach(), rtol=1e-9, atol=1e-8
        )
    torch.testing.assert_close(
        gp.log_marginal_likelihood(x, y), expected.detach(), rtol=1e-9, atol=1e-8
    )


@pytest.mark.parametrize("n", [100, 20])  # weight-space and function-space forms
def test_log_marginal_likelihood_gradients_match_finite_differences(n):
    x, y, _, _ = make_data(n=n)
    base = fourier(32)
    k = gpytorch.kernels.ScaleKernel(base).double()
    gp = RandomFeatureGP(k)
    raw_ls = base.raw_lengthscale
    raw_os = k.raw_outputscale
    log_noise = torch.tensor(math.log(0.1), dtype=DT, requires_grad=True)
    lml = gp.log_marginal_likelihood(x, y, log_noise.exp())
    grads = torch.autograd.grad(lml, [raw_ls, raw_os, log_noise])
    h = 1e-6
    for param, grad in zip([raw_ls, raw_os, log_noise], grads):
        with torch.no_grad():
            param += h
            up = gp.log_marginal_likelihood(x, y, log_noise.exp())
            param -= 2 * h
            down = gp.log_marginal_likelihood(x, y, log_noise.exp())
            param += h
        fd = (up - down) / (2 * h)
        torch.testing.assert_close(grad.sum(), fd, rtol=1e-5, atol=1e-6)


def test_log_marginal_likelihood_heteroscedastic_matches_dense_gaussian():
    x, y, _, g = make_data(n=50, outputs=2)
    k = fourier(20)
    noise = 0.05 + 0.2 * torch.rand(50, 2, generator=g, dtype=DT)
    gp = RandomFeatureGP(k).fit(x, y, noise)
    phi = k.features(x)
    expected = sum(
        torch.distributions.MultivariateNormal(
            torch.zeros(50, dtype=DT), phi @ phi.T + torch.diag(noise[:, t])
        ).log_prob(y[:, t])
        for t in range(2)
    )
    torch.testing.assert_close(gp.log_marginal_likelihood(), expected, rtol=1e-10, atol=1e-9)
    torch.testing.assert_close(
        gp.log_marginal_likelihood(x, y, noise).detach(), expected, rtol=1e-10, atol=1e-9
    )


@pytest.mark.filterwarnings("ignore::rfgp.inference._feature_gp.ConvergenceWarning")
def test_optimize_hyperparameters_improves_the_evidence():
    x, y, xt, _ = make_data(n=150)
    for method in ("lbfgs", "adam"):
        k = gpytorch.kernels.ScaleKernel(fourier(40, lengthscale=1.5)).double()
        gp = RandomFeatureGP(k, noise=1.0)
        before = gp.log_marginal_likelihood(x, y).item()
        losses = gp.optimize_hyperparameters(
            x, y, method=method, num_iterations=5 if method == "lbfgs" else 60
        )
        after = float(gp.log_marginal_likelihood())
        assert after > before + 50 and losses[-1] < losses[0]
        assert gp.is_fitted and float(gp.noise) < 0.5  # the true noise variance is 0.01


def _optimize(method, lr, num_iterations):
    x, y, _, _ = make_data(n=150)
    k = gpytorch.kernels.ScaleKernel(fourier(40, lengthscale=1.5)).double()
    gp = RandomFeatureGP(k, noise=1.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        losses = gp.optimize_hyperparameters(
            x, y, method=method, lr=lr, num_iterations=num_iterations
        )
    return gp, k, losses, [w for w in caught if not issubclass(w.category, NumericalWarning)]


def test_lbfgs_line_search_backs_off_from_an_overshooting_step():
    # With lr = 1000 the first L-BFGS trial step sends the log-noise and the raw lengthscale
    # thousands of units away (the noise underflowed to 0 and the fit stopped with "noise must
    # be positive"); out-of-range trial points get a large loss, so the line search backs off
    # and reaches the optimum of the well-scaled run.
    gp, k, losses, caught = _optimize("lbfgs", 1000.0, 20)
    reference, _, ref_losses, _ = _optimize("lbfgs", 1.0, 20)
    assert caught == []
    assert all(math.isfinite(v) for v in losses)
    assert torch.isfinite(gp.noise).all() and torch.isfinite(k.base_kernel.lengthscale).all()
    assert losses[-1] == pytest.approx(ref_losses[-1], abs=1e-6)
    assert float(gp.noise) == pytest.approx(float(reference.noise), rel=1e-3)
    n = 150
    assert float(gp.log_marginal_likelihood()) == pytest.approx(-losses[-1] * n, rel=1e-9)


def test_adam_overshoot_keeps_the_best_finite_parameters_and_warns():
    gp, k, losses, caught = _optimize("adam", 1000.0, 5)
    assert any(issubclass(w.category, ConvergenceWarning) for w in caught)
    assert torch.isfinite(gp.noise).all() and torch.isfinite(k.base_kernel.lengthscale).all()
    # The parameters kept are the best evaluated: the evidence is that of the smallest loss.
    assert float(gp.log_marginal_likelihood()) == pytest.approx(-min(losses) * 150, rel=1e-9)


def test_optimize_warns_when_not_converged_and_converts_no_grad_tensor():
    _, _, _, caught = _optimize("adam", None, 3)
    assert [w.category for w in caught] == [ConvergenceWarning]
    _, _, losses, caught = _optimize("lbfgs", None, 30)
    assert caught == []  # converged, and no "requires_grad ... to a scalar" UserWarning
    assert len(losses) < 30  # stopped once the loss no longer changed


def test_select_noise_scores_equal_refits_and_pick_the_minimum():
    x, y, xv, g = make_data(n=300, m=1)
    xv = torch.rand(200, 2, generator=g, dtype=DT)
    yv = (
        torch.sin(6 * xv[:, 0])
        + torch.cos(4 * xv[:, 1])
        + 0.1 * torch.randn(200, generator=g, dtype=DT)
    )
    k = fourier(60)
    grid = [2.0**e for e in range(-10, 3)]
    gp = RandomFeatureGP(k)
    best = gp.select_noise(x, y, xv, yv, grid=grid)
    values, scores = gp.noise_scores_
    for value, score in zip(values[::4], scores[::4]):
        ref = RandomFeatureGP(k, noise=value).fit(x, y)
        mean, std = ref.predict(xv, return_std=True)
        expected = metrics.mnll(yv, mean, std.square() + value)
        assert abs(score - float(expected)) < 1e-10
    assert best == values[min(range(len(scores)), key=scores.__getitem__)]
    assert 2.0**-9 <= best <= 2.0**-4  # true noise variance 0.01 ~ 2^-6.6
    assert float(gp.noise) == best and gp.is_fitted
    default = RandomFeatureGP(k)
    default.select_noise(x, y, xv, yv)
    assert default.noise_scores_[0] == [2.0**e for e in range(-15, 16)]


# ============================================================================= sampling
@pytest.mark.parametrize("make_kernel", [fourier, complex_fourier])
def test_sample_functions_have_the_posterior_moments(make_kernel):
    x, y, xt, _ = make_data(n=60)
    gp = RandomFeatureGP(make_kernel(), noise=0.05).fit(x, y)
    post = gp.posterior(xt)
    num = 4000
    draws = gp.sample_functions(num, generator=torch.Generator().manual_seed(3))(xt)
    assert draws.shape == (num, 20)
    std = post.variance.sqrt()
    assert ((draws.mean(0) - post.mean).abs() / std).max() < 5 / math.sqrt(num)
    emp_cov = torch.cov(draws.T)
    rel = (emp_cov.diagonal() / post.variance - 1).abs().max()
    assert rel < 5 * math.sqrt(2 / num)
    # the draws are smooth functions: the sample covariance matches off the diagonal too
    corr_err = (emp_cov - post.covariance_matrix).abs() / (std[:, None] * std[None, :])
    assert corr_err.max() < 6 / math.sqrt(num)
    again = gp.sample_functions(num, generator=torch.Generator().manual_seed(3))(xt)
    torch.testing.assert_close(again, draws)


def test_function_space_draws_have_the_posterior_moments_with_grouped_noise():
    # Pathwise draws of a function-space fit: per-row noise, two groups of outputs with
    # different noise, the draws' moments against the posterior of each output.
    x, y, xt, g = make_data(n=30, outputs=3)
    per_point = 0.02 + 0.2 * torch.rand(30, generator=g, dtype=DT)
    other = 0.05 + 0.1 * torch.rand(30, generator=g, dtype=DT)
    noise = torch.stack([per_point, other, per_point], -1)
    gp = RandomFeatureGP(fourier(40), solve="function").fit(x, y, noise)
    assert gp.solve_used == "function" and gp.factorization_groups == [[0, 2], [1]]
    num = 4000
    draws = gp.sample_functions(num, generator=torch.Generator().manual_seed(5))(xt)
    assert draws.shape == (num, 20, 3)
    for t in range(3):
        m, c = dense_posterior(fourier(40).features(x), y[:, t], noise[:, t],
                               fourier(40).features(xt))
        std = c.diagonal().sqrt()
        assert ((draws[:, :, t].mean(0) - m).abs() / std).max() < 5 / math.sqrt(num)
        emp = torch.cov(draws[:, :, t].T)
        assert ((emp - c).abs() / (std[:, None] * std[None, :])).max() < 6 / math.sqrt(num)
    # the outputs of one group are independent draws, not copies of one
    a, b = draws[:, :, 0], draws[:, :, 2]
    corr = ((a - a.mean(0)) * (b - b.mean(0))).mean(0) / (a.std(0) * b.std(0))
    assert corr.abs().max() < 5 / math.sqrt(num)


def test_function_space_draws_need_no_weight_space_matrix():
    # 25 000 frequencies, 50 000 real features: a D x D factor would take 20 GB; the pathwise
    # draw needs the N x D feature rows.
    x, y, xt, _ = make_data(n=25)
    gp = RandomFeatureGP(fourier(25_000), noise=0.05).fit(x, y)
    assert gp.solve_used == "function"
    # 500 draws: the paths hold D x S weights (200 MB here), whichever way they are drawn.
    num = 500
    draws = gp.sample_functions(num, generator=torch.Generator().manual_seed(0))(xt)
    post = gp.posterior(xt)
    std = post.variance.sqrt()
    assert ((draws.mean(0) - post.mean).abs() / std).max() < 5 / math.sqrt(num)
    rel = (draws.var(0) / post.variance - 1).abs().max()
    assert rel < 6 * math.sqrt(2 / num)


def test_function_space_draws_after_update_follow_the_updated_posterior():
    x, y, xt, _ = make_data(n=30)
    gp = RandomFeatureGP(fourier(30), noise=0.05).fit(x[:20], y[:20])
    assert gp.solve_used == "function"
    gp.update(x[20:], y[20:])
    post = RandomFeatureGP(fourier(30), noise=0.05).fit(x, y).posterior(xt)
    num = 4000
    draws = gp.sample_functions(num, generator=torch.Generator().manual_seed(1))(xt)
    std = post.variance.sqrt()
    assert ((draws.mean(0) - post.mean).abs() / std).max() < 5 / math.sqrt(num)
    assert (draws.var(0) / post.variance - 1).abs().max() < 6 * math.sqrt(2 / num)


def test_sample_functions_multi_output_shapes():
    x, y, xt, _ = make_data(n=40, outputs=3)
    gp = RandomFeatureGP(fourier(20), noise=0.1).fit(x, y)
    assert gp.sample_functions(5)(xt).shape == (5, 20, 3)
    k = TwoOutputKernel(20, seed=0).double()
    gp2 = RandomFeatureGP(k, noise=0.1).fit(x, y[:, :2])
    assert gp2.sample_functions(4)(xt).shape == (4, 20, 2)


# ============================================================================= hooks, dtypes
class AllocatingKernel(FourierFeatureKernel):
    needs_allocation = True
    has_variance_correction = True

    def allocate(self, x):
        self.allocated_on = x.shape[0]
        self.needs_allocation = False

    def variance_correction(self, x):
        return torch.full((x.shape[0],), 0.25, dtype=x.dtype)


def test_allocation_and_variance_correction_hooks():
    x, y, xt, _ = make_data(n=50)
    k = AllocatingKernel(20, seed=0).double()
    scaled = gpytorch.kernels.ScaleKernel(k).double()
    scaled.outputscale = 2.0
    gp = RandomFeatureGP(scaled, noise=0.1, correct_variance=True).fit(x, y)
    assert k.allocated_on == 50
    plain = RandomFeatureGP(scaled, noise=0.1).fit(x, y)
    _, s1 = gp.predict(xt, return_std=True)
    _, s0 = plain.predict(xt, return_std=True)
    torch.testing.assert_close(s1.square() - s0.square(), torch.full((20,), 0.5, dtype=DT))
    torch.testing.assert_close(
        gp.posterior(xt).variance - plain.posterior(xt).variance, torch.full((20,), 0.5, dtype=DT)
    )
    # fit_stream cannot allocate on all the data as fit does: it asks for an allocation first.
    k2 = AllocatingKernel(20, seed=0).double()
    with pytest.raises(ValueError, match=r"kernel\.allocate\(x_sample\)"):
        RandomFeatureGP(k2, noise=0.1).fit_stream([(x[:10], y[:10]), (x[10:], y[10:])])
    k2.allocate(x)
    RandomFeatureGP(k2, noise=0.1).fit_stream([(x[:10], y[:10]), (x[10:], y[10:])])
    assert k2.allocated_on == 50


@pytest.mark.parametrize("make_kernel", [fourier, complex_fourier])
def test_float32_agrees_with_float64(make_kernel):
    x, y, xt, _ = make_data(n=200)
    k = make_kernel(40)
    ref_mean, ref_std = RandomFeatureGP(k, noise=0.05).fit(x, y).predict(xt, return_std=True)
    k32 = make_kernel(40).float()
    gp = RandomFeatureGP(k32, noise=0.05).fit(x.float(), y.float())
    mean, std = gp.predict(xt.float(), return_std=True)
    assert mean.dtype == torch.float32
    torch.testing.assert_close(mean.double(), ref_mean, rtol=0, atol=2e-3)
    torch.testing.assert_close(std.double(), ref_std, rtol=0, atol=2e-3)


def test_robust_cholesky_retries_with_jitter_and_warns():
    v = torch.randn(6, 3, dtype=DT, generator=torch.Generator().manual_seed(0))
    singular = v @ v.T  # rank 3
    with pytest.warns(NumericalWarning, match="adding"):
        chol = robust_cholesky(singular)
    assert torch.isfinite(chol).all()
    assert (chol @ chol.T - singular).abs().max() < 1e-6
    with pytest.raises(Exception, match="NaN"):
        robust_cholesky(torch.full((2, 2), float("nan"), dtype=DT))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        robust_cholesky(torch.eye(3, dtype=DT))  # no warning when it works


def test_try_cholesky_never_adds_jitter():
    from rfgp.inference._linalg import try_cholesky

    v = torch.randn(6, 3, dtype=DT, generator=torch.Generator().manual_seed(0))
    a = v @ v.T + 0.5 * torch.eye(6, dtype=DT)
    chol = try_cholesky(a)
    torch.testing.assert_close(chol @ chol.T, a)  # the factor of the matrix as given
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no jitter, so no NumericalWarning either
        assert try_cholesky(v @ v.T - 1e-3 * torch.eye(6, dtype=DT)) is None  # indefinite
        for bad in (float("nan"), float("inf")):
            assert try_cholesky(torch.full((2, 2), bad, dtype=DT)) is None
        assert try_cholesky(torch.zeros(0, 0, dtype=DT)).shape == (0, 0)


def test_tiny_noise_function_space_still_factorises():
    x, y, xt, _ = make_data(n=30)
    gp = RandomFeatureGP(fourier(10), noise=1e-30, solve="function")
    with pytest.warns(NumericalWarning):
        gp.fit(x, y)  # K = Phi Phi^T has rank 10 < 30 and the noise is below round-off
    assert torch.isfinite(gp.predict(xt)).all()


# ============================================================================= errors
def test_errors():
    x, y, xt, _ = make_data(n=30)
    k = fourier(20)
    with pytest.raises(RuntimeError, match="fit"):
        RandomFeatureGP(k).posterior(xt)
    with pytest.raises(RuntimeError, match="fit"):
        RandomFeatureGP(k).predict(xt)
    with pytest.raises(RuntimeError, match="fit"):
        RandomFeatureGP(k).sample_functions(3)
    with pytest.raises(TypeError, match="kernel"):
        RandomFeatureGP(gpytorch.kernels.RBFKernel())
    with pytest.raises(TypeError, match="kernel"):
        RandomFeatureGP(gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()))
    with pytest.raises(ValueError, match="solve"):
        RandomFeatureGP(k, solve="dense")
    with pytest.raises(ValueError, match="noise"):
        RandomFeatureGP(k, noise=0.0)
    with pytest.raises(ValueError, match="noise"):
        RandomFeatureGP(k, noise=torch.ones(2, 2))
    gp = RandomFeatureGP(k)
    with pytest.raises(ValueError, match="noise"):
        gp.noise = -1.0
    with pytest.raises(ValueError, match="y must have shape"):
        gp.fit(x, y[:-1])
    with pytest.raises(ValueError, match="y must be finite"):
        gp.fit(x, torch.where(torch.arange(30) == 3, float("nan"), y))
    with pytest.raises(ValueError, match="x must be finite"):
        gp.fit(torch.where(torch.arange(30)[:, None] == 3, float("inf"), x), y)
    with pytest.raises(TypeError, match="y must be real"):
        gp.fit(x, y.to(torch.complex128))
    with pytest.raises(ValueError, match="noise must be positive"):
        gp.fit(x, y, torch.zeros(30, dtype=DT))
    with pytest.raises(ValueError, match="noise must be positive"):
        gp.fit(x, y, -0.1)
    with pytest.raises(ValueError, match="noise must be finite"):
        gp.fit(x, y, torch.full((30,), float("nan"), dtype=DT))
    with pytest.raises(ValueError, match="noise as a 1-D tensor"):
        gp.fit(x, y, torch.ones(29, dtype=DT))
    with pytest.raises(ValueError, match="noise must be a scalar or broadcastable"):
        gp.fit(x, torch.stack([y, y], -1), torch.ones(30, 3, dtype=DT))
    with pytest.raises(ValueError, match="x must hold at least one row"):
        gp.fit(x[:0], y[:0])
    with pytest.raises(ValueError, match="y must have shape \\(N, p\\)"):
        RandomFeatureGP(TwoOutputKernel(20, seed=0).double()).fit(x, y)
    with pytest.raises(ValueError, match="batches must yield at least one"):
        gp.fit_stream([])
    with pytest.raises(ValueError, match="batches must yield"):
        gp.fit_stream([x])
    with pytest.raises(ValueError, match="chunk_size"):
        gp.fit(x, y, chunk_size=0)
    gp.fit(x, y)
    with pytest.raises(ValueError, match="noise must be None"):
        gp.update(x, y, 0.1)
    with pytest.raises(ValueError, match="y must have the layout"):
        gp.update(x, torch.stack([y, y], -1))
    with pytest.raises(ValueError, match="phi must have shape"):
        gp.posterior_from_features(torch.ones(3, 7, dtype=DT))
    with pytest.raises(ValueError, match="x and y must be given together"):
        gp.log_marginal_likelihood(x)
    with pytest.raises(ValueError, match="method"):
        gp.optimize_hyperparameters(x, y, method="sgd")
    with pytest.raises(ValueError, match="grid"):
        gp.select_noise(x, y, x, y, grid=[0.1, -1.0])
    with pytest.raises(ValueError, match="num_samples"):
        gp.sample_functions(0)
    with pytest.raises(ValueError, match="solve='function'"):
        RandomFeatureGP(k, solve="function").fit_stream([(x, y)])
    fixed = RandomFeatureGP(k).fit(x, y, 0.1)
    with pytest.raises(ValueError, match="noise must be given"):
        fixed.update(x, y)


# ---------------------------------------------------------------- audit: data-dependent update
def _optimised_maclaurin():
    from rfgp.kernels import MaclaurinKernel

    return MaclaurinKernel("exponential", 64, seed=0, num_samples=20).double()


def _audit_rows(n=60):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(n, 3, generator=g, dtype=DT)
    y = torch.sin(2 * x).sum(-1)
    return x, y - y.mean()


def test_update_after_a_fit_that_chose_the_allocation_equals_a_fit_on_all_rows():
    # The optimised allocation depends on the rows: an update reallocates on all of them.
    x, y = _audit_rows()
    updated = RandomFeatureGP(_optimised_maclaurin(), noise=0.1).fit(x[:30], y[:30])
    updated.update(x[30:], y[30:])
    whole = RandomFeatureGP(_optimised_maclaurin(), noise=0.1).fit(x, y)
    assert torch.equal(updated.base_kernel.degree_counts, whole.base_kernel.degree_counts)
    torch.testing.assert_close(updated.predict(x), whole.predict(x), rtol=1e-9, atol=1e-10)


def test_update_keeps_an_allocation_made_before_the_fit():
    x, y = _audit_rows()
    kernels = [_optimised_maclaurin(), _optimised_maclaurin()]
    for k in kernels:
        k.allocate(x[:30])
    updated = RandomFeatureGP(kernels[0], noise=0.1).fit(x[:30], y[:30])
    updated.update(x[30:], y[30:])
    whole = RandomFeatureGP(kernels[1], noise=0.1).fit(x, y)
    torch.testing.assert_close(updated.predict(x), whole.predict(x), rtol=1e-9, atol=1e-10)


def test_update_refuses_to_reallocate_without_the_training_data():
    x, y = _audit_rows()
    fitted = RandomFeatureGP(_optimised_maclaurin(), noise=0.1).fit(x[:30], y[:30])
    loaded = RandomFeatureGP(_optimised_maclaurin(), noise=0.1)
    loaded.load_state_dict(fitted.state_dict())
    before = loaded.predict(x)
    with pytest.raises(ValueError, match="update: the fit chose MaclaurinKernel's "
                                         "data-dependent allocation .* not held"):
        loaded.update(x[30:], y[30:])
    torch.testing.assert_close(loaded.predict(x), before, rtol=0, atol=0)


# ---------------------------------------------------------------- audit: features given
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_features_given_must_be_finite(bad):
    x, y = _audit_rows()
    gp = RandomFeatureGP(FourierFeatureKernel(16, seed=0).double(), noise=0.1).fit(x, y)
    phi = gp.base_kernel.features(x[:3]).detach().clone()
    phi[1, 0] = bad
    with pytest.raises(ValueError, match="phi must be finite, but 1 entries are NaN or infinite"):
        gp.posterior_from_features(phi)
    with pytest.raises(ValueError, match="phi must be finite"):
        gp.predict_from_features(phi)
    with pytest.raises(TypeError, match="phi must be a torch.Tensor"):
        gp.predict_from_features(phi.numpy())


def test_variance_correction_given_must_be_finite_with_one_value_per_row():
    x, y = _audit_rows()
    gp = RandomFeatureGP(FourierFeatureKernel(16, seed=0).double(), noise=0.1).fit(x, y)
    phi = gp.base_kernel.features(x[:3]).detach()
    plain = gp.posterior_from_features(phi).variance
    shifted = gp.posterior_from_features(phi, torch.tensor([0.5, 0.0, 1.0], dtype=DT)).variance
    torch.testing.assert_close(shifted - plain, torch.tensor([0.5, 0.0, 1.0], dtype=DT))
    for call in (gp.posterior_from_features, gp.predict_from_features):
        with pytest.raises(ValueError, match="variance_correction must be finite"):
            call(phi, torch.tensor([0.0, math.nan, 0.0], dtype=DT))
        with pytest.raises(ValueError, match=r"variance_correction must hold one value per row "
                                             r"of phi \(3\), got shape \(2,\)"):
            call(phi, torch.zeros(2, dtype=DT))
