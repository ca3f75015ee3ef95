"""Degree allocation (Algorithms 2-3): greedy optimality, objective, the paper's 1-D example."""

import itertools
import math

import pytest
import torch

from rfgp.kernels._maclaurin.allocation import (
    allocation_objective,
    allocation_statistics,
    incremental_allocation,
    maclaurin_coefficients,
    optimize_allocation,
    surrogate_variance,
)


def rademacher_single_variance(x, y, degree, num_features):
    # Eq. 18 of Wacker et al. written out here independently of the package's closed forms.
    c = (x * y).sum(-1)
    norms = (x * x).sum(-1) * (y * y).sum(-1)
    diag = (x * x * y * y).sum(-1)
    return ((norms + 2 * (c * c - diag)) ** degree - c ** (2 * degree)) / num_features


def brute_force(costs, budget):
    best, best_counts = math.inf, None
    p = len(costs)
    for counts in itertools.product(range(1, budget + 1), repeat=p):
        if sum(counts) != budget:
            continue
        value = sum(f(c) for f, c in zip(costs, counts))
        if value < best - 1e-15:
            best, best_counts = value, list(counts)
    return best, best_counts


@pytest.mark.parametrize("seed", range(6))
def test_greedy_equals_brute_force_unstructured(seed):
    gen = torch.Generator().manual_seed(seed)
    weights = torch.rand(4, generator=gen, dtype=torch.float64) * 10
    costs = [lambda n, w=float(w): w / n for w in weights]
    budget = 11
    counts = incremental_allocation(costs, budget)
    best, _ = brute_force(costs, budget)
    assert sum(counts) == budget
    assert sum(f(c) for f, c in zip(costs, counts)) == pytest.approx(best, rel=1e-12)


@pytest.mark.parametrize("seed", range(6))
def test_greedy_equals_brute_force_surrogate(seed):
    # TensorSRHT-like terms: negative covariances (convex surrogate branch) and positive ones.
    gen = torch.Generator().manual_seed(100 + seed)
    block = 4
    costs = []
    for _ in range(3):
        v = float(torch.rand(1, generator=gen, dtype=torch.float64)) * 5 + 0.1
        c = float(torch.rand(1, generator=gen, dtype=torch.float64) * 2 - 1) * v * 0.9
        costs.append(lambda n, v=v, c=c: surrogate_variance(v, c, n, block))
    budget = 12
    counts = incremental_allocation(costs, budget)
    best, _ = brute_force(costs, budget)
    assert sum(f(c) for f, c in zip(costs, counts)) == pytest.approx(best, rel=1e-12)


def test_surrogate_matches_structured_variance_at_block_points():
    # V(D) = V/D + c(D, d)/D^2 Cov, c(D, d) = floor(D/d) d (d-1) + r (r-1), r = D mod d.
    v, cov, d = 2.0, -0.5, 4

    def exact(num):
        r = num % d
        pairs = (num // d) * d * (d - 1) + r * (r - 1)
        return v / num + pairs / num**2 * cov

    for num in [1, 2, 3, 4, 8, 12]:
        assert surrogate_variance(v, cov, num, d) == pytest.approx(exact(num), rel=1e-12)
    # Convex on the integers (second differences >= 0) when Cov <= 0.
    values = [surrogate_variance(v, cov, n, d) for n in range(1, 20)]
    assert all(values[i - 1] - 2 * values[i] + values[i + 1] >= -1e-12
               for i in range(1, len(values) - 1))


def _stats(z, coefficients, gaussian=False):
    if gaussian:
        def exact(a, b):
            return torch.exp(-0.5 * torch.cdist(a, b) ** 2)
        row_scale = torch.exp(-0.5 * (z * z).sum(-1))
    else:
        def exact(a, b):
            return torch.exp(a @ b.T)
        row_scale = None
    return allocation_statistics(z, coefficients, exact, rademacher_single_variance, row_scale)


def test_paper_one_dimensional_example():
    # Sec. 5.6: d = 1, D = 10 (constant included): every Rademacher sketch is exact in 1-D, so
    # only the bias matters and the largest feasible truncation wins: p* = 9, D_1..D_9 = 1.
    gen = torch.Generator().manual_seed(0)
    z = torch.randn(60, 1, generator=gen, dtype=torch.float64)
    stats = _stats(z, maclaurin_coefficients("gaussian", 10), gaussian=True)
    result = optimize_allocation(stats, budget=10, max_degree=10)
    assert result.truncation_degree == 9
    assert result.degree_counts.tolist() == [1] * 10 + [0]


def test_optimized_objective_below_random_allocations():
    gen = torch.Generator().manual_seed(1)
    z = torch.randn(50, 5, generator=gen, dtype=torch.float64)
    z = z / z.norm(dim=-1, keepdim=True)
    coefficients = maclaurin_coefficients("exponential", 8)
    stats = _stats(z, coefficients)
    budget = 40
    result = optimize_allocation(stats, budget)
    assert int(result.degree_counts.sum()) == budget
    # Kar & Karnick allocations: degrees from mu(n) = 2^-n on 1..8, the constant kept exact.
    probs = torch.tensor([2.0 ** -n for n in range(1, 9)], dtype=torch.float64)
    for _ in range(20):
        draws = torch.multinomial(probs, budget - 1, replacement=True, generator=gen) + 1
        counts = torch.bincount(draws, minlength=9)
        counts[0] = 1
        assert result.objective <= allocation_objective(stats, counts.tolist()) + 1e-15
    # And below every allocation in a brute-force search at the chosen truncation.
    degrees = list(range(1, result.truncation_degree + 1))
    for counts in itertools.product(range(1, 8), repeat=min(3, len(degrees))):
        if len(degrees) > 3:
            break
        full = [1] + list(counts) + [0] * (8 - len(counts))
        if sum(full) == budget:
            assert result.objective <= allocation_objective(stats, full) + 1e-15


def test_extended_algorithm_equals_brute_force_small():
    gen = torch.Generator().manual_seed(2)
    z = torch.randn(30, 3, generator=gen, dtype=torch.float64) * 0.7
    coefficients = maclaurin_coefficients("exponential", 4)
    stats = _stats(z, coefficients)
    budget = 8
    result = optimize_allocation(stats, budget)
    best = math.inf
    for p in range(1, 5):
        for counts in itertools.product(range(1, budget), repeat=p):
            if sum(counts) + 1 != budget:
                continue
            full = [1, *counts] + [0] * (4 - p)
            best = min(best, allocation_objective(stats, full))
    assert result.objective == pytest.approx(best, rel=1e-12)


def test_bias_quadratic_form_matches_direct_truncation():
    gen = torch.Generator().manual_seed(3)
    z = torch.randn(20, 2, generator=gen, dtype=torch.float64) * 0.5
    stats = _stats(z, maclaurin_coefficients("exponential", 5))
    # Skipping degree 2 must be charged its missing term: compare with a direct computation.
    counts = [1, 3, 0, 2, 0, 0]
    direct = 0.0
    c = z @ z.T
    k = torch.exp(c)
    approx = 1 + c + c**3 / 6
    off = ~torch.eye(20, dtype=torch.bool)
    direct = float(((k - approx)[off] ** 2).sum())
    v = stats.variance_sums
    variance = float(v[1] / 3 + v[3] / 36 / 2)
    expected = (variance + direct) / stats.num_pairs
    assert allocation_objective(stats, counts) == pytest.approx(expected, rel=1e-9)


def test_polynomial_without_bias_spends_everything_on_its_degree():
    gen = torch.Generator().manual_seed(4)
    z = torch.randn(10, 3, generator=gen, dtype=torch.float64)
    coefficients = maclaurin_coefficients("polynomial", 10, degree=3, bias=0.0)

    def exact(a, b):
        return (a @ b.T) ** 3

    stats = allocation_statistics(z, coefficients, exact, rademacher_single_variance)
    result = optimize_allocation(stats, budget=7)
    assert result.degree_counts.tolist() == [0, 0, 0, 7]
    assert result.truncation_degree == 3


def test_bad_input():
    with pytest.raises(ValueError, match="budget"):
        incremental_allocation([lambda n: 1.0 / n] * 3, 2)
    with pytest.raises(ValueError, match="degree"):
        maclaurin_coefficients("polynomial", 10)
    with pytest.raises(ValueError, match="target"):
        maclaurin_coefficients("cosine", 10)
    z = torch.randn(5, 2, dtype=torch.float64)
    stats = _stats(z, maclaurin_coefficients("exponential", 3))
    with pytest.raises(ValueError, match="budget"):
        optimize_allocation(stats, budget=2, min_degree=3)
    with pytest.raises(ValueError, match="min_degree"):
        optimize_allocation(stats, budget=10, min_degree=0)
    with pytest.raises(ValueError, match="z must"):
        allocation_statistics(z[:1], stats.coefficients, lambda a, b: a @ b.T,
                              rademacher_single_variance)
