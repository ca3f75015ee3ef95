"""The scores of ``benchmarks/fourier_frequencies.py`` (imported by path): the Gaussian KL
divergence, the predictive distribution, and the random-feature posterior's convergence to the
exact one."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers import load_benchmark

exact = load_benchmark("_exact_gp")
bench = load_benchmark("fourier_frequencies")


def test_gaussian_kl_matches_the_closed_form():
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(4, 4, generator=gen, dtype=torch.float64)
    b = torch.randn(4, 4, generator=gen, dtype=torch.float64)
    cov_p, cov_q = a @ a.T + torch.eye(4, dtype=torch.float64), b @ b.T + 0.5 * torch.eye(
        4, dtype=torch.float64)
    mean_p = torch.randn(4, generator=gen, dtype=torch.float64)
    mean_q = torch.randn(4, generator=gen, dtype=torch.float64)
    inv_q = torch.linalg.inv(cov_q)
    diff = mean_q - mean_p
    expected = 0.5 * (torch.trace(inv_q @ cov_p) + diff @ inv_q @ diff - 4
                      + torch.logdet(cov_q) - torch.logdet(cov_p))
    assert bench.gaussian_kl(mean_p, cov_p, mean_q, cov_q) == pytest.approx(float(expected),
                                                                             rel=1e-10)
    assert abs(bench.gaussian_kl(mean_p, cov_p, mean_p, cov_p)) < 1e-10


def data():
    gen = torch.Generator().manual_seed(1)
    x = torch.rand(80, 2, generator=gen, dtype=torch.float64) * 4 - 2
    y = torch.sin(2 * x[:, 0]) + 0.1 * torch.randn(80, generator=gen, dtype=torch.float64)
    return x[:60], y[:60], x[60:]


def test_exact_predictive_agrees_with_the_exact_posterior():
    xtr, ytr, xte = data()
    hyper = exact.ExactHyperparameters(np.array([0.8, 1.5]), 1.1, 0.01, 0.05)
    mean, cov = bench.exact_predictive(xtr, ytr, xte, hyper)
    ref_mean, ref_var = exact.ExactPosterior(xtr, ytr, hyper).predict(xte)
    np.testing.assert_allclose(mean.numpy(), ref_mean, rtol=0, atol=1e-10)
    np.testing.assert_allclose(cov.diagonal().numpy(), ref_var + 0.01, rtol=0, atol=1e-10)


@pytest.mark.parametrize("scheme", ["orthogonal", "qmc", "qmc_orthogonal"])
def test_feature_posterior_converges_to_the_exact_one(scheme):
    """KL(exact || features) falls like 1 / D (the kernel error's variance): 64x more
    features must cut it by more than 16x (averaged over 3 seeds)."""
    xtr, ytr, xte = data()
    hyper = exact.ExactHyperparameters(np.array([0.8, 1.5]), 1.1, 0.01, 0.05)
    mean_e, cov_e = bench.exact_predictive(xtr, ytr, xte, hyper)
    kls = []
    for num_features in (64, 4096):
        values = []
        for seed in range(3):
            mean_f, cov_f = bench.feature_predictive(xtr, ytr, xte, hyper, scheme,
                                                     num_features, seed)
            values.append(bench.gaussian_kl(mean_e, cov_e, mean_f, cov_f))
        kls.append(np.mean(values))
    assert kls[1] < kls[0] / 16
