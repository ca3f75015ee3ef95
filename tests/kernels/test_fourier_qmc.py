"""Randomised quasi-Monte Carlo frequencies of FourierFeatureKernel (``"qmc"``,
``"qmc_orthogonal"``).

Each scrambled Sobol point is uniform on the unit cube, so every frequency follows the spectral
density and the kernel estimate is unbiased; the tests check that, the radial law, the
orthogonal blocks, convergence to the exact kernel, and determinism under the kernel's seed.
"""

from __future__ import annotations

import math

import pytest
import torch
from scipy import stats

from rfgp.kernels import FourierFeatureKernel
from rfgp.kernels._fourier import radial_quantile, sample_frequencies, stationary_kernel

QMC = ["qmc", "qmc_orthogonal"]
NU = {"rbf": None, "matern12": 0.5, "matern32": 1.5, "matern52": 2.5}


def batch_kernel(spectral, sampling, input_dim, num_frequencies, num_draws, seed, lengthscale):
    kernel = FourierFeatureKernel(2 * num_frequencies, spectral=spectral, sampling=sampling,
                                  input_dim=input_dim, batch_shape=torch.Size([num_draws])).double()
    kernel.lengthscale = torch.tensor(lengthscale, dtype=torch.float64)
    kernel.resample(torch.Generator().manual_seed(seed))
    return kernel


# ---------------------------------------------------------------- unbiasedness
@pytest.mark.parametrize("sampling", QMC)
@pytest.mark.parametrize("spectral, input_dim, num_frequencies",
                         [("rbf", 4, 8), ("matern32", 5, 8), ("matern12", 3, 6)])
def test_unbiased_against_exact_kernel(sampling, spectral, input_dim, num_frequencies,
                                       points_at_distances, mc_mean):
    num_draws, lengthscale = 2000, 1.3
    gen = torch.Generator().manual_seed(5)
    x, y = points_at_distances([0.3, 0.8, 1.5, 2.5], input_dim, gen, lengthscale)
    kernel = batch_kernel(spectral, sampling, input_dim, num_frequencies, num_draws, 2,
                          lengthscale)
    with torch.no_grad():
        estimates = (kernel.features(x) * kernel.features(y)).sum(-1)  # (T, n)
    mean, stderr = mc_mean(estimates)
    exact = stationary_kernel(x, y, torch.tensor(lengthscale, dtype=torch.float64),
                              NU[spectral]).diagonal()
    assert torch.all((mean - exact).abs() < 5 * stderr), (mean - exact) / stderr


# ---------------------------------------------------------------- marginal law
@pytest.mark.parametrize("sampling", QMC)
@pytest.mark.parametrize("spectral", ["rbf", "matern32"])
def test_radii_follow_the_radial_law(sampling, spectral, generator):
    """RBF: ||w|| ~ chi_d; Matérn-nu: ||w||^2 / d ~ F(d, 2 nu). Kolmogorov–Smirnov at 1e-3.

    Quasi-random radii are more even than a random sample, so the true law passes with room to
    spare; a wrong law (chi_{d-1}, F(d, 2 nu + 2)) must still fail.
    """
    input_dim = 6
    w = sample_frequencies(512 * input_dim, input_dim, spectral, sampling, generator=generator)
    norms = w.norm(dim=-1).numpy()
    if spectral == "rbf":
        result = stats.kstest(norms, stats.chi(df=input_dim).cdf)
        wrong = stats.kstest(norms, stats.chi(df=input_dim - 1).cdf)
    else:
        nu = NU[spectral]
        result = stats.kstest(norms**2 / input_dim, stats.f(input_dim, 2 * nu).cdf)
        wrong = stats.kstest(norms**2 / input_dim, stats.f(input_dim, 2 * nu + 2).cdf)
    assert result.pvalue > 1e-3
    assert wrong.pvalue < 1e-3


def test_qmc_directions_are_isotropic(generator):
    """Unit directions u uniform on the sphere: E[u] = 0 and E[u u^T] = I / d.

    Tolerances are 5 Monte Carlo standard errors of i.i.d. directions (per entry of u: 1/sqrt(d n);
    of u_i u_j: at most sqrt(E[u_i^2 u_j^2] / n) <= sqrt(3 / (d (d + 2) n))); quasi-random
    points are at least that even.
    """
    input_dim, count = 5, 4096
    w = sample_frequencies(count, input_dim, "rbf", "qmc", generator=generator)
    u = w / w.norm(dim=-1, keepdim=True)
    mean_tol = 5 / math.sqrt(input_dim * count)
    assert u.mean(0).abs().max() < mean_tol
    second = u.T @ u / count
    second_tol = 5 * math.sqrt(3 / (input_dim * (input_dim + 2) * count))
    eye = torch.eye(input_dim, dtype=torch.float64) / input_dim
    assert (second - eye).abs().max() < second_tol


def test_radial_quantile_inverts_the_cdf():
    u = torch.tensor([0.01, 0.3, 0.5, 0.9, 0.999], dtype=torch.float64)
    torch.testing.assert_close(torch.from_numpy(stats.chi(df=7).cdf(radial_quantile(u, 7))), u)
    r = radial_quantile(u, 7, 2.5).numpy()
    torch.testing.assert_close(torch.from_numpy(stats.f(7, 5).cdf(r**2 / 7)), u)


def test_qmc_orthogonal_rows_orthogonal_within_blocks(generator):
    input_dim, num_frequencies = 4, 10
    w = sample_frequencies(num_frequencies, input_dim, "matern52", "qmc_orthogonal",
                           torch.Size([3]), generator)
    assert w.shape == (3, num_frequencies, input_dim)
    for start in range(0, num_frequencies, input_dim):
        block = w[:, start : start + input_dim]
        gram = block @ block.transpose(-1, -2)
        norms2 = torch.diagonal(gram, dim1=-2, dim2=-1)
        assert (gram - torch.diag_embed(norms2)).abs().max() < 1e-12 * norms2.max()


def test_qmc_orthogonal_radii_are_stratified(generator):
    """With d a power of two each block's d radii fall in the d equal-probability strata of
    the radial law, one in each (a scrambled Sobol run of 2^k points is stratified)."""
    input_dim, num_blocks = 8, 16
    w = sample_frequencies(input_dim * num_blocks, input_dim, "rbf", "qmc_orthogonal",
                           generator=generator)
    prob = torch.from_numpy(stats.chi(df=input_dim).cdf(w.norm(dim=-1).numpy()))
    strata = (prob * input_dim).floor().long().reshape(num_blocks, input_dim)
    expected = torch.arange(input_dim).expand(num_blocks, input_dim)
    assert torch.equal(strata.sort(dim=-1).values, expected)


# ---------------------------------------------------------------- convergence
@pytest.mark.parametrize("sampling", QMC)
def test_gram_converges_to_the_exact_kernel(sampling, generator):
    """||K_hat - K||_F^2 / n^2 shrinks at least as fast as Monte Carlo's 1 / M.

    Each estimate is an average of M terms cos(w^T z) of variance at most 1, so the i.i.d. mean
    squared error is at most 1 / M; at M = 2048 the QMC error is held to that bound and to a
    16th of its own value at M = 32 (1/64 is the Monte Carlo rate, the factor 4 absorbs the spread
    over 4 seeds).
    """
    x = torch.randn(30, 3, generator=generator, dtype=torch.float64)
    k_exact = stationary_kernel(x, x, torch.tensor(1.0, dtype=torch.float64), 1.5)
    errors = []
    for num_frequencies in (32, 2048):
        kernel = batch_kernel("matern32", sampling, 3, num_frequencies, 4, 7, 1.0)
        with torch.no_grad():
            phi = kernel.features(x)
            errors.append((phi @ phi.transpose(-1, -2) - k_exact).pow(2).mean().item())
    assert errors[1] < 1 / 2048
    assert errors[1] < errors[0] / 16


# ---------------------------------------------------------------- randomness and state
@pytest.mark.parametrize("sampling", QMC)
def test_seed_and_generator_fix_the_frequencies(sampling):
    x = torch.randn(6, 3, dtype=torch.float64)
    a = FourierFeatureKernel(16, sampling=sampling, seed=3).double()
    b = FourierFeatureKernel(16, sampling=sampling, seed=3).double()
    c = FourierFeatureKernel(16, sampling=sampling, seed=4).double()
    torch.testing.assert_close(a.features(x), b.features(x), rtol=0, atol=0)
    assert not torch.allclose(a.features(x), c.features(x))
    before = a.frequencies.clone()
    torch.manual_seed(0)
    a.resample(torch.Generator().manual_seed(9))
    after = a.frequencies.clone()
    assert not torch.equal(before, after)
    # The generator fixes the draw, whatever the global RNG's state.
    torch.manual_seed(1)
    a.resample(torch.Generator().manual_seed(9))
    torch.testing.assert_close(a.frequencies, after, rtol=0, atol=0)


@pytest.mark.parametrize("sampling", QMC)
def test_qmc_does_not_touch_the_global_rng(sampling):
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    FourierFeatureKernel(16, sampling=sampling, seed=1).features(torch.randn(2, 3).zero_())
    torch.manual_seed(0)
    kernel = FourierFeatureKernel(16, sampling=sampling, input_dim=3)
    kernel.resample(torch.Generator().manual_seed(2))
    torch.testing.assert_close(torch.rand(3), expected, rtol=0, atol=0)


@pytest.mark.parametrize("sampling", QMC)
def test_batch_elements_are_independent_draws(sampling):
    kernel = batch_kernel("rbf", sampling, 3, 8, 2, 0, 1.0)
    assert not torch.allclose(kernel.frequencies[0], kernel.frequencies[1])


@pytest.mark.parametrize("sampling", QMC)
def test_state_dict_round_trips(sampling):
    x = torch.randn(5, 2, dtype=torch.float64)
    source = FourierFeatureKernel(12, spectral="matern52", sampling=sampling, seed=0).double()
    expected = source.features(x)
    target = FourierFeatureKernel(12, spectral="matern52", sampling=sampling, seed=1).double()
    target.features(x)
    target.load_state_dict(source.state_dict())
    torch.testing.assert_close(target.features(x), expected, rtol=0, atol=0)
    other = FourierFeatureKernel(12, spectral="matern52", sampling="iid", seed=0).double()
    other.features(x)
    with pytest.raises((RuntimeError, ValueError), match="sampling"):
        other.load_state_dict(source.state_dict())


@pytest.mark.parametrize("sampling", QMC)
def test_float32_matches_float64(sampling):
    x = torch.randn(7, 3, dtype=torch.float64)
    k64 = FourierFeatureKernel(64, spectral="matern32", sampling=sampling, seed=2).double()
    k32 = FourierFeatureKernel(64, spectral="matern32", sampling=sampling, seed=2)
    phi32 = k32.features(x.float())
    assert phi32.dtype == torch.float32 and k32.frequencies.dtype == torch.float32
    torch.testing.assert_close(phi32.double(), k64.features(x), rtol=0, atol=1e-4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("sampling", QMC)
def test_cuda_generator_and_module(sampling):
    kernel = FourierFeatureKernel(16, sampling=sampling, input_dim=3).double().cuda()
    kernel.resample(torch.Generator(device="cuda").manual_seed(0))
    assert kernel.frequencies.device.type == "cuda"
    assert kernel.features(torch.randn(4, 3, dtype=torch.float64, device="cuda")).is_cuda


# ---------------------------------------------------------------- bad input
def test_unknown_sampling_names_the_choices():
    with pytest.raises(ValueError, match=r"sampling must be one of .*'qmc'.*'qmc_orthogonal'.*"
                                         r"got 'sobol'"):
        FourierFeatureKernel(8, sampling="sobol")
    with pytest.raises(ValueError, match=r"sampling must be one of .*got 'structured'"):
        sample_frequencies(4, 2, sampling="structured")


def test_qmc_input_dimension_beyond_sobol_is_rejected():
    with pytest.raises(ValueError, match=r"input_dim must be at most 21200 .*got 21201"):
        sample_frequencies(2, 21201, sampling="qmc")
