"""The spectrum and the weights of columns on it (the scale calibration's factorisation),
checked against identities that hold whatever the factorisation's route."""

import math

import pytest
import torch

from rfgp.inference._calibration import maximize_scale_evidence, spectral_statistics
from rfgp.inference._spectrum import TRIDIAGONAL_MIN, spectrum_weights

EPS = torch.finfo(torch.float64).eps


def _gram(n, rows, seed, decay=1.0):
    g = torch.Generator().manual_seed(seed)
    scales = torch.logspace(0, -decay, n, dtype=torch.float64)
    phi = torch.randn(rows, n, dtype=torch.float64, generator=g) * scales
    return phi.T @ phi, torch.randn(n, 3, dtype=torch.float64, generator=g)


@pytest.mark.parametrize("n", [TRIDIAGONAL_MIN - 1, TRIDIAGONAL_MIN + 5])
def test_weights_satisfy_the_resolvent_identities(n):
    gram, b = _gram(n, n + 200, 0, decay=3.0)
    lam, p = spectrum_weights(gram, b)
    assert lam.dtype == torch.float64 and p.shape == (n,)
    assert bool((lam[1:] >= lam[:-1]).all())
    top = float(lam.max())
    # Eigenvalues: a backward-stable reduction moves each by at most a small multiple of
    # n eps ||G||; the trace and the Frobenius norm are sums of them.
    assert abs(float(lam.sum()) - float(gram.trace())) <= 10 * n * EPS * top * math.sqrt(n)
    assert abs(float(lam.square().sum()) - float(gram.square().sum())) <= 1e-11 * top**2 * n
    # Orthogonal eigenvectors: the weights sum to the columns' squared norm.
    total = float(b.square().sum())
    assert abs(float(p.sum()) - total) <= 1e-11 * total
    # sum_i p_i / (lam_i + c) = tr B^T (G + cI)^{-1} B, for shifts from well- to
    # ill-conditioned (relative error bounded by the condition number times eps).
    for c in (top, top * 1e-3, top * 1e-6):
        shifted = gram + c * torch.eye(n, dtype=torch.float64)
        exact = float((b * torch.linalg.solve(shifted, b)).sum())
        cond = (top + c) / c
        assert abs(float((p / (lam + c)).sum()) - exact) <= 100 * n * EPS * cond * exact
    # sum_i lam_i p_i = tr B^T G B.
    quad = float((b * (gram @ b)).sum())
    assert abs(float((lam * p).sum()) - quad) <= 1e-10 * top * total


def test_both_routes_give_one_spectrum():
    n = TRIDIAGONAL_MIN + 64
    gram, b = _gram(n, n // 2, 1)  # rank-deficient: half the eigenvalues are (near) zero
    lam, p = spectrum_weights(gram, b[:, :1])
    dense_lam, vectors = torch.linalg.eigh(gram)
    dense_p = (vectors.T @ b[:, :1]).square().sum(-1)
    top = float(dense_lam.max())
    assert float((lam - dense_lam).abs().max()) <= 100 * n * EPS * top
    # Weights on a cluster of equal eigenvalues are defined only as the cluster's sum: the
    # null space's weight agrees, and above it (distinct eigenvalues, gaps of about
    # ||G|| / n, so each eigenvector within about n^2 eps of the other route's) the
    # cumulative weights.
    null = dense_lam < 1e-8 * top
    total = float(b[:, 0] @ b[:, 0])
    assert float((p[null].sum() - dense_p[null].sum()).abs()) <= 1e-9 * total
    above = (p[~null].cumsum(0) - dense_p[~null].cumsum(0)).abs().max()
    assert float(above) <= 1e-8 * total


def test_repeated_eigenvalues_and_diagonal_matrices():
    n = TRIDIAGONAL_MIN + 3
    values = torch.repeat_interleave(torch.tensor([1.0, 2.0, 5.0], dtype=torch.float64),
                                     torch.tensor([n - 10, 7, 3]))
    b = torch.randn(n, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    lam, p = spectrum_weights(torch.diag(values), b)
    assert torch.allclose(lam, values, rtol=0, atol=1e-13)
    # The weight on each eigenspace is the columns' squared norm on its coordinates.
    for value in (1.0, 2.0, 5.0):
        chosen = values == value
        assert math.isclose(float(p[lam.sub(value).abs() < 1e-9].sum()),
                            float(b[chosen].square().sum()), rel_tol=1e-12)


def test_the_input_is_left_unchanged():
    gram, b = _gram(TRIDIAGONAL_MIN + 1, TRIDIAGONAL_MIN + 50, 3)
    before, before_b = gram.clone(), b.clone()
    spectrum_weights(gram, b)
    assert torch.equal(gram, before) and torch.equal(b, before_b)


def test_calibration_on_the_tridiagonal_route_reaches_the_known_scales():
    # A feature model whose truth the evidence recovers: y = Phi w + e, w ~ N(0, a I),
    # e ~ N(0, s^2); the maximiser on many rows is near (a, s^2) within its own spread
    # (each weight is measured to a variance s^2 / rows, far below a).
    n, rows = TRIDIAGONAL_MIN + 16, 60000
    g = torch.Generator().manual_seed(4)
    w = torch.randn(n, dtype=torch.float64, generator=g) * 0.1
    gram = torch.zeros(n, n, dtype=torch.float64)
    rhs = torch.zeros(n, dtype=torch.float64)
    squares = 0.0
    for _ in range(rows // 6000):
        phi = torch.randn(6000, n, dtype=torch.float64, generator=g)
        y = phi @ w + 0.5 * torch.randn(6000, dtype=torch.float64, generator=g)
        gram += phi.T @ phi
        rhs += phi.T @ y
        squares += float(y @ y)
    gram = 0.5 * (gram + gram.T)
    factor, noise, _ = maximize_scale_evidence(spectral_statistics(gram, rhs, squares, rows), 1.0)
    # The noise estimate's relative spread is about sqrt(2 / (rows - n)): 0.6%.
    assert abs(noise / 0.25 - 1) < 6 * math.sqrt(2 / (rows - n))
    # The factor's spread is about sqrt(2 / n) (n weights): 3%.
    assert abs(factor / 0.01 - 1) < 6 * math.sqrt(2 / n)


@pytest.mark.parametrize("n", [40, TRIDIAGONAL_MIN + 2])
def test_a_stack_of_matrices_is_each_matrix_on_its_own(n):
    # (C, n, n) with (C, n, T): the answers of the C matrices one at a time, on either route.
    grams, columns = zip(*(_gram(n, n + 30, seed) for seed in (5, 6)))
    lam, p = spectrum_weights(torch.stack(grams), torch.stack(columns))
    assert lam.shape == (2, n) and p.shape == (2, n)
    for c in range(2):
        one_lam, one_p = spectrum_weights(grams[c], columns[c])
        torch.testing.assert_close(lam[c], one_lam, rtol=0, atol=1e-12 * float(one_lam.max()))
        total = float(columns[c].square().sum())
        assert float((p[c].cumsum(0) - one_p.cumsum(0)).abs().max()) <= 1e-9 * total


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_the_calibration_refuses_a_non_finite_gram_before_the_reduction(bad):
    # The check stays at the calibration's edge: a NaN or inf entry never reaches LAPACK,
    # whose reduction would return garbage rather than fail.
    from rfgp.inference._calibration import kernel_spectral_statistics

    gram, b = _gram(TRIDIAGONAL_MIN + 1, TRIDIAGONAL_MIN + 40, 7)
    gram[3, 5] = gram[5, 3] = bad
    with pytest.raises(ValueError, match="gram must be finite"):
        spectral_statistics(gram, b[:, 0], 1.0, 10)
    with pytest.raises(ValueError, match="kernel_matrix must be finite"):
        kernel_spectral_statistics(gram, b[:, 0])
