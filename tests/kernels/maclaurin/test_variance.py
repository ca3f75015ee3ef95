"""Closed-form sketch variances: Monte Carlo agreement, reference values and the theorems."""

import math

import pytest
import torch

from rfgp.kernels._sketches import apply_sketch, sample_sketch
from rfgp.variance import (
    gaussian_sketch_variance,
    rademacher_sketch_variance,
    sketch_variance,
    srht_pair_count,
    tensorsketch_variance,
    tensorsrht_variance,
    tensorsrht_variance_terms,
)

PROJECTIONS = ["gaussian", "rademacher", "tensorsketch", "tensorsrht"]


def _unit(v):
    return v / v.norm(dim=-1, keepdim=True)


def _pairs(d, seed):
    """Two pairs of unit vectors: mixed signs, and non-negative."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(4, d, dtype=torch.float64, generator=g)
    z[2:] = z[2:].abs()
    return _unit(z)


def _draws(x, degree, num_features, projection, complex, draws, seed):
    """k_hat for the pairs (x[0], x[1]) and (x[2], x[3]) over independent draws: (draws, 2)."""
    g = torch.Generator().manual_seed(seed)
    w = sample_sketch(degree, num_features, x.shape[-1], projection, complex,
                      torch.Size([draws]), g)
    phi = apply_sketch(x, w, degree, projection, complex)  # (draws, 4, D)
    return torch.stack(
        [(phi[:, 0] * phi[:, 1].conj()).sum(-1), (phi[:, 2] * phi[:, 3].conj()).sum(-1)], -1
    )


def _check_variance(k, target, closed_form, label):
    """Empirical E|k - target|^2 against the closed form, within 5 standard errors.

    The mean of w = |k - target|^2 is the variance (target is the exact mean); its standard
    error is std(w) / sqrt(R) (the variance-of-variance term m4 - V^2).
    """
    w = (k - target).abs() ** 2
    emp = w.mean(0)
    se = w.std(0) / math.sqrt(w.shape[0])
    assert torch.all((emp - closed_form).abs() <= 5 * se + 1e-12), (
        f"{label}: empirical {emp.tolist()} vs closed form {closed_form.tolist()}, "
        f"se {se.tolist()}"
    )


CASES = [
    (proj, cplx, degree, num_features)
    for proj in PROJECTIONS
    for cplx in (False, True)
    for degree in ((1, 2, 3) if proj == "gaussian" else (1, 2, 3, 4))
    for num_features in (3, 11)
]


@pytest.mark.slow
@pytest.mark.parametrize("projection,complex,degree,num_features", CASES)
def test_variance_matches_monte_carlo(projection, complex, degree, num_features):
    # d = 5 is padded to 8 for TensorSRHT; D = 3 < d' and D = 11 (not a multiple of d').
    x = _pairs(5, seed=degree)
    draws = 20000
    k = _draws(x, degree, num_features, projection, complex, draws, seed=100 + num_features)
    target = torch.stack([(x[0] @ x[1]) ** degree, (x[2] @ x[3]) ** degree])
    v = sketch_variance(x[0::2], x[1::2], degree, num_features, projection, complex)
    _check_variance(k, target, v, f"{projection} complex={complex}")
    if complex:
        v_ctr = sketch_variance(x[0::2], x[1::2], degree, num_features, projection, True, True)
        _check_variance(k.real, target, v_ctr, f"CtR {projection}")


def test_reference_values_from_digest():
    # Values tabulated in the method digest (computed there independently, cross-checked by MC).
    x = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64) / math.sqrt(30)
    y = torch.tensor([4.0, 3.0, 2.0, 1.0], dtype=torch.float64) / math.sqrt(30)
    table = {  # (degree, D): realGauss, compGauss, realRad, compRad, realSRHT, compSRHT
        (1, 1): (1.444444, 1.000000, 1.213333, 0.884444, 1.213333, 0.884444),
        (1, 4): (0.361111, 0.250000, 0.303333, 0.221111, 0.000000, 0.000000),
        (1, 6): (0.240741, 0.166667, 0.202222, 0.147407, 0.044938, 0.032757),
        (2, 4): (0.842593, 0.472222, 0.637674, 0.392104, 0.490726, 0.260747),
        (2, 6): (0.561728, 0.314815, 0.425116, 0.261402, 0.348921, 0.193292),
        (3, 4): (1.662894, 0.731481, 1.117040, 0.564739, 1.051244, 0.501407),
        (3, 6): (1.108596, 0.487654, 0.744693, 0.376492, 0.710577, 0.343654),
    }
    for (p, D), expected in table.items():
        got = [
            gaussian_sketch_variance(x, y, p, D), gaussian_sketch_variance(x, y, p, D, True),
            rademacher_sketch_variance(x, y, p, D), rademacher_sketch_variance(x, y, p, D, True),
            tensorsrht_variance(x, y, p, D), tensorsrht_variance(x, y, p, D, True),
        ]
        for g, e in zip(got, expected):
            assert abs(float(g) - e) < 2e-6, (p, D, float(g), e)


def test_srht_pair_count_brute_force():
    for d in (1, 2, 4, 8):
        for D in range(1, 3 * d + 3):
            block = [l // d for l in range(D)]
            brute = sum(1 for i in range(D) for j in range(D) if i != j and block[i] == block[j])
            assert srht_pair_count(D, d) == brute
            if D % d == 0:
                assert srht_pair_count(D, d) / D**2 == pytest.approx((d - 1) / D)


def test_tensorsrht_degree_one_multiple_of_block_is_exact():
    x = _pairs(6, seed=0)
    for D in (8, 16, 24):
        for cplx in (False, True):
            v = tensorsrht_variance(x[0], x[1], 1, D, complex=cplx)
            assert abs(float(v)) < 1e-14
    v = tensorsrht_variance(x[0], x[1], 1, 8, complex=True, ctr=True)
    assert abs(float(v)) < 1e-14


def test_tensorsrht_terms_recombine():
    x = _pairs(6, seed=9)
    for cplx, ctr in ((False, False), (True, False), (True, True)):
        single, cov = tensorsrht_variance_terms(x[0], x[1], 3, cplx, ctr=ctr)
        for D in (3, 8, 13):
            expected = single / D + srht_pair_count(D, 8) / D**2 * cov
            torch.testing.assert_close(tensorsrht_variance(x[0], x[1], 3, D, cplx, ctr), expected)
    # surrogate facts (App. C): V + (d-1) Cov >= 0 (a variance), and = 0 for degree 1
    single, cov = tensorsrht_variance_terms(x[2], x[3], 1)
    assert abs(float(single + 7 * cov)) < 1e-14


def test_tensorsrht_orthogonality_bounds():
    g = torch.Generator().manual_seed(3)
    x = _unit(torch.randn(200, 7, dtype=torch.float64, generator=g))
    y = _unit(torch.randn(200, 7, dtype=torch.float64, generator=g))
    for cplx in (False, True):
        for p in (1, 3, 5):  # odd p: structured never worse (Cor. 7 / 11)
            for D in (3, 8, 13):
                assert torch.all(
                    tensorsrht_variance(x, y, p, D, cplx)
                    <= rademacher_sketch_variance(x, y, p, D, cplx) * (1 + 1e-12) + 1e-15
                )
    # even p with orthogonal inputs: the within-block covariance is positive (no guarantee)
    e1 = torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=torch.float64)
    e2 = torch.tensor([0.0, 1.0, 0.0, 0.0], dtype=torch.float64)
    assert tensorsrht_variance(e1, e2, 2, 4) > rademacher_sketch_variance(e1, e2, 2, 4)
    single, cov = tensorsrht_variance_terms(e1, e2, 2)
    assert float(cov) == pytest.approx((1 / 3) ** 2)  # (V1/(d-1))^2 with V1 = N - S + a = 1


def test_complex_beats_real_closed_form():
    g = torch.Generator().manual_seed(4)
    x = _unit(torch.randn(300, 6, dtype=torch.float64, generator=g))
    y = _unit(torch.randn(300, 6, dtype=torch.float64, generator=g))
    for p in (2, 3, 6):
        # complex Gaussian: always, both the complex estimator and CtR at equal real size
        assert torch.all(gaussian_sketch_variance(x, y, p, 5, True)
                         <= gaussian_sketch_variance(x, y, p, 5))
        assert torch.all(gaussian_sketch_variance(x, y, p, 5, True, True)
                         <= gaussian_sketch_variance(x, y, p, 10))
        # complex Rademacher: guaranteed on non-negative data
        xa, ya = x.abs(), y.abs()
        assert torch.all(rademacher_sketch_variance(xa, ya, p, 5, True)
                         <= rademacher_sketch_variance(xa, ya, p, 5))
        assert torch.all(rademacher_sketch_variance(xa, ya, p, 5, True, True)
                         <= rademacher_sketch_variance(xa, ya, p, 10))


def test_ctr_theorems_4_1_and_4_2():
    # V_R(2D) - V_CtR(D) equals the explicit sums of Theorems 4.1 / 4.2 (corrected sign).
    g = torch.Generator().manual_seed(5)
    x = torch.randn(50, 7, dtype=torch.float64, generator=g)
    y = torch.randn(50, 7, dtype=torch.float64, generator=g)
    s = (x * y).sum(-1)
    n = (x * x).sum(-1) * (y * y).sum(-1)
    sq = (x * x * y * y).sum(-1)
    a = s * s - sq
    D = 3
    for p in range(1, 8):
        gauss = sum(math.comb(p, k) * (2**k - 1) * s ** (2 * k) * n ** (p - k)
                    for k in range(p)) / (2 * D)
        diff = gaussian_sketch_variance(x, y, p, 2 * D) - gaussian_sketch_variance(
            x, y, p, D, True, True)
        torch.testing.assert_close(diff, gauss, rtol=1e-9, atol=1e-9)
        rad = sum(math.comb(p, k) * math.comb(k, j) * (n**j - sq**j) * a ** (p - j)
                  for k in range(2, p + 1) for j in range(k)) / (2 * D)
        if p == 1:
            rad = torch.zeros_like(s)
        diff = rademacher_sketch_variance(x, y, p, 2 * D) - rademacher_sketch_variance(
            x, y, p, D, True, True)
        torch.testing.assert_close(diff, rad, rtol=1e-9, atol=1e-9)
    # parallel inputs: Gaussian difference (3^p - 2^(p+1) + 1) |x|^2p |y|^2p / (2D)
    u = _unit(x[:1])
    for p in (2, 4):
        diff = gaussian_sketch_variance(u, 2 * u, p, 2 * D) - gaussian_sketch_variance(
            u, 2 * u, p, D, True, True)
        expected = (3**p - 2 ** (p + 1) + 1) * 4**p / (2 * D)
        assert float(diff) == pytest.approx(expected, rel=1e-10)


def test_tensorsketch_limits():
    x = _pairs(5, seed=7)
    for p in (1, 2, 4):
        # one bucket: the real TensorSketch is a real Rademacher sketch with D = 1
        torch.testing.assert_close(tensorsketch_variance(x[0], x[1], p, 1),
                                   rademacher_sketch_variance(x[0], x[1], p, 1))
        # complex signs: the complex Rademacher variance and pseudo-variance
        for D in (1, 4, 7):
            torch.testing.assert_close(tensorsketch_variance(x[0], x[1], p, D, True),
                                       rademacher_sketch_variance(x[0], x[1], p, D, True))
            torch.testing.assert_close(tensorsketch_variance(x[0], x[1], p, D, True, True),
                                       rademacher_sketch_variance(x[0], x[1], p, D, True, True))


def test_zero_variance_in_one_dimension():
    # d = 1: Rademacher-type sketches are exact
    x, y = torch.tensor([0.7], dtype=torch.float64), torch.tensor([-1.3], dtype=torch.float64)
    for proj in ("rademacher", "tensorsrht", "tensorsketch"):
        for cplx in (False, True):
            assert abs(float(sketch_variance(x, y, 5, 3, proj, cplx))) < 1e-12


def test_shapes_dtype_and_gradient():
    x = torch.rand(3, 1, 4, dtype=torch.float32)
    y = torch.rand(5, 4, dtype=torch.float32)
    v = sketch_variance(x, y, 3, 6, "tensorsrht", True, True)
    assert v.shape == (3, 5) and v.dtype == torch.float64
    xg = torch.rand(4, dtype=torch.float64, requires_grad=True)
    sketch_variance(xg, xg.detach().flip(0), 2, 3).backward()
    assert xg.grad is not None and torch.isfinite(xg.grad).all()


def test_bad_inputs():
    x = torch.rand(3, dtype=torch.float64)
    with pytest.raises(ValueError, match="degree"):
        sketch_variance(x, x, 0, 3)
    with pytest.raises(ValueError, match="num_features"):
        sketch_variance(x, x, 2, 0)
    with pytest.raises(ValueError, match="projection"):
        sketch_variance(x, x, 2, 3, projection="countsketch")
    with pytest.raises(ValueError, match="ctr"):
        sketch_variance(x, x, 2, 3, complex=False, ctr=True)
    with pytest.raises(ValueError, match="last dimension"):
        sketch_variance(x, torch.rand(4, dtype=torch.float64), 2, 3)
    with pytest.raises(TypeError, match="x"):
        sketch_variance([1.0, 2.0], x, 2, 3)
