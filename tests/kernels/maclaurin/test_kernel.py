"""MaclaurinKernel: allocation, unbiasedness, convergence to the exact kernels, state, bad input."""


import gpytorch
import pytest
import torch

from rfgp.kernels import MaclaurinKernel
from rfgp.kernels._maclaurin.allocation import allocation_objective
from tests.helpers import assert_resampled_gram_is_unbiased


def unit_rows(n, d, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    return x / x.norm(dim=-1, keepdim=True)


def test_paper_one_dimensional_example_through_the_kernel():
    g = torch.Generator().manual_seed(0)
    x = torch.linspace(-3, 3, 80, dtype=torch.float64).unsqueeze(-1)
    k = MaclaurinKernel("gaussian", 10, projection="rademacher", seed=0)
    k.lengthscale = 1.0
    k.allocate(x, generator=g)
    assert k.truncation_degree == 9
    assert k.degree_counts.tolist() == [1] * 10 + [0]
    # d = 1 Rademacher sketches are exact: the features give the truncated series exactly.
    phi = k.features(x)
    assert phi.shape == (80, 10)
    torch.testing.assert_close(phi @ phi.T, k.expected_matrix(x, x), rtol=1e-10, atol=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("projection,complex_", [("rademacher", False), ("tensorsrht", True),
                                                 ("gaussian", False)])
def test_optimized_is_unbiased_for_the_truncated_kernel(projection, complex_):
    x = unit_rows(3, 4, 1)
    k = MaclaurinKernel("exponential", 12, projection=projection, complex=complex_, seed=0)
    k.allocate(unit_rows(40, 4, 2))
    target = k.expected_matrix(x, x)
    g = torch.Generator().manual_seed(3)
    assert_resampled_gram_is_unbiased(k, x, target, g, 3000)


@pytest.mark.slow
def test_random_allocation_is_unbiased_for_the_polynomial_kernel():
    x = unit_rows(3, 3, 4)
    k = MaclaurinKernel("polynomial", 8, degree=3, bias=1.0, allocation="random", input_dim=3)
    assert not k.needs_allocation
    exact = k.exact_matrix(x, x)
    g = torch.Generator().manual_seed(5)
    assert_resampled_gram_is_unbiased(k, x, exact, g, 4000, atol=0.0)
    # The constant column is exact and counts in the budget.
    assert int(k.degree_counts.sum()) == 8 and int(k.degree_counts[0]) == 1


def test_gaussian_target_converges_to_gpytorch_rbf():
    x = unit_rows(30, 3, 6) * 0.8
    rbf = gpytorch.kernels.RBFKernel().double()
    rbf.lengthscale = 1.2
    exact = rbf(x).to_dense()
    errors = []
    for num in [16, 256, 4096]:
        k = MaclaurinKernel("gaussian", num, projection="rademacher", seed=0).double()
        k.lengthscale = 1.2
        k.allocate(x)
        errors.append(float((k(x).to_dense() - exact).norm() / exact.norm()))
    assert errors[2] < errors[1] < errors[0]
    assert errors[2] < 0.02
    torch.testing.assert_close(k.exact_kernel()(x).to_dense(), exact)


def test_optimized_objective_below_random_allocation():
    x = unit_rows(60, 8, 7)
    k = MaclaurinKernel("polynomial", 40, degree=4, bias=1.0, seed=0)
    k.allocate(x)
    stats = k._statistics(x / k.lengthscale.detach())
    optimum = allocation_objective(stats, k.degree_counts.tolist())
    g = torch.Generator().manual_seed(8)
    kk = MaclaurinKernel("polynomial", 40, degree=4, bias=1.0, allocation="random")
    for _ in range(20):
        counts = kk._random_counts(g)
        assert optimum <= allocation_objective(stats, counts.tolist()) + 1e-15


def test_budget_is_the_declared_num_features():
    x = unit_rows(50, 5, 9)
    for target, kwargs in [("polynomial", dict(degree=3, bias=0.0)),
                           ("polynomial", dict(degree=3, bias=0.5)), ("gaussian", {})]:
        k = MaclaurinKernel(target, 17, seed=1, **kwargs)
        k.allocate(x)
        assert k.features(x).shape == (50, 17)
        assert int(k.degree_counts.sum()) == 17 == k.num_features
    # Homogeneous polynomial: no constant column, every column to degree 3.
    k = MaclaurinKernel("polynomial", 17, degree=3, seed=1).allocate(x)
    assert k.degree_counts.tolist() == [0, 0, 0, 17]


def test_variance_correction_restores_the_prior_diagonal():
    x = torch.tensor([[0.1], [2.0], [5.0]], dtype=torch.float64)
    k = MaclaurinKernel("gaussian", 10, seed=0)
    k.lengthscale = 1.0
    k.allocate(torch.linspace(-1, 1, 20, dtype=torch.float64).unsqueeze(-1))
    phi = k.features(x)
    corrected = (phi * phi).sum(-1) + k.variance_correction(x)
    # d = 1: the features are exact for the truncated kernel, so the sum is exactly k(x, x) = 1.
    torch.testing.assert_close(corrected, torch.ones(3, dtype=torch.float64))
    assert float(k.variance_correction(x)[-1]) > 0.5  # the collapse far from the origin


def test_state_dict_round_trip_and_reallocation():
    x = unit_rows(40, 4, 10)
    k = MaclaurinKernel("exponential", 20, projection="tensorsrht", seed=0).allocate(x)
    fresh = MaclaurinKernel("exponential", 20, projection="tensorsrht")
    fresh.load_state_dict(k.state_dict())
    assert not fresh.needs_allocation
    torch.testing.assert_close(fresh.features(x), k.features(x))
    # A new allocation with another lengthscale drops stale degree buffers.
    k.lengthscale = 0.3
    k.allocate(x * 3)
    names = {n for n in k._random_buffer_names}
    present = {int(n.split("_")[0][6:]) for n in names}
    assert present == {n for n, c in enumerate(k.degree_counts.tolist()) if c > 0 and n > 0}
    assert k.features(x).shape == (40, 20)


def test_gpytorch_integration_float32_and_complex():
    x = unit_rows(25, 3, 11)
    k = MaclaurinKernel("gaussian", 12, complex=True, seed=0).allocate(x)
    covar = gpytorch.kernels.ScaleKernel(k)(x)
    assert covar.shape == (25, 25)
    phi = k.features(x.float())
    assert phi.dtype == torch.complex64


def test_bad_input():
    with pytest.raises(ValueError, match="target"):
        MaclaurinKernel("laplace", 10)
    with pytest.raises(ValueError, match="degree"):
        MaclaurinKernel("polynomial", 10)
    with pytest.raises(ValueError, match="allocation"):
        MaclaurinKernel("gaussian", 10, allocation="greedy")
    with pytest.raises(ValueError, match="projection"):
        MaclaurinKernel("gaussian", 10, projection="fourier")
    with pytest.raises(ValueError, match="num_features"):
        MaclaurinKernel("gaussian", 1)
    with pytest.raises(ValueError, match="bias"):
        MaclaurinKernel("polynomial", 10, degree=2, bias=-1.0)
    k = MaclaurinKernel("gaussian", 10)
    assert k.needs_allocation
    with pytest.raises(RuntimeError, match="allocate"):
        k.features(torch.randn(4, 2, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="allocate"):
        k.variance_correction(torch.randn(4, 2, dtype=torch.float64))
    with pytest.raises(ValueError, match="x must"):
        MaclaurinKernel("gaussian", 10, input_dim=2).allocate(torch.randn(4, 3))


def test_exact_counterparts_agree_with_the_target():
    x = unit_rows(10, 3, 12) * 0.7
    for target, kwargs in [("polynomial", dict(degree=3, bias=1.0)), ("exponential", {}),
                           ("gaussian", {})]:
        k = MaclaurinKernel(target, 20, **kwargs).double()
        k.lengthscale = 1.3
        exact = k.exact_kernel()(x).to_dense()
        torch.testing.assert_close(exact, k.exact_matrix(x, x).detach(), rtol=1e-6, atol=1e-8)
