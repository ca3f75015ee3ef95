"""The recipe's local stage: k-d blocks, the block evidence and the multi-start search on it."""

from __future__ import annotations

import math

import pytest
import torch

from rfgp.inference._blocks import kd_blocks
from rfgp.inference._evidence_search import maximize_evidence
from rfgp.inference._feature_gp import RandomFeatureGP
from rfgp.inference._laplace import evidence_hessian
from rfgp.kernels._fourier import stationary_kernel
from rfgp.recipes import FitReport, fit_auto
from rfgp.recipes._local import LOCAL_SHORT_START
from rfgp.recipes._start import make_ard_kernel
from tests.helpers import DT, gen


def _data(n, d=2, seed=0, noise=0.05):
    g = gen(seed)
    x = torch.randn(n, d, generator=g, dtype=DT)
    y = torch.sin(2 * x[:, 0]) + 0.3 * x[:, -1] + math.sqrt(noise) * torch.randn(
        n, generator=g, dtype=DT)
    return x, y - y.mean()


def _gp(d, lengthscale, outputscale=1.0, noise=0.1):
    kernel = make_ard_kernel(64, d, seed=0)
    kernel.base_kernel.lengthscale = torch.as_tensor(lengthscale, dtype=DT).reshape(1, -1)
    kernel.outputscale = torch.tensor(outputscale, dtype=DT)
    return RandomFeatureGP(kernel, noise=torch.tensor(noise, dtype=DT))


def _block_loss(x, y, blocks, lengthscale, outputscale, noise):
    """sum_b -log N(y_b; 0, s K_b + noise I) / N from dense Gaussians."""
    total = 0.0
    for rows in blocks:
        k = stationary_kernel(x[rows], x[rows], lengthscale.reshape(1, -1), None) * outputscale
        cov = k + noise * torch.eye(rows.numel(), dtype=DT)
        dist = torch.distributions.MultivariateNormal(torch.zeros(rows.numel(), dtype=DT), cov)
        total -= float(dist.log_prob(y[rows]))
    return total / y.numel()


def _block_evidence_gradient(gp, x, y, blocks):
    """The gradient of sum_b -log N(y_b; 0, s K_b + noise I) / N in the log-hyperparameters
    (lengthscales, outputscale, noise) at the GP's, by autograd through dense Gaussians."""
    d = x.shape[1]
    theta = torch.cat([gp.kernel.base_kernel.lengthscale.detach().reshape(-1).log(),
                       gp.kernel.outputscale.detach().log().reshape(1),
                       gp.noise.detach().log().reshape(1)]).requires_grad_(True)
    total = 0
    for rows in blocks:
        k = stationary_kernel(x[rows], x[rows], theta[:d].exp().reshape(1, -1), None)
        cov = theta[d].exp() * k + theta[d + 1].exp() * torch.eye(rows.numel(), dtype=DT)
        total = total - torch.distributions.MultivariateNormal(
            torch.zeros(rows.numel(), dtype=DT), cov).log_prob(y[rows])
    (grad,) = torch.autograd.grad(total / y.numel(), theta)
    return grad


# ----------------------------------------------------------------------------- kd_blocks
@pytest.mark.parametrize("n,max_rows", [(1, 1), (10, 3), (257, 64), (1000, 1000), (1001, 1000)])
def test_kd_blocks_partition_the_rows_into_balanced_blocks(n, max_rows):
    x = torch.randn(n, 3, generator=gen(n), dtype=DT)
    blocks = kd_blocks(x, max_rows)
    rows = torch.cat(blocks).sort().values
    assert torch.equal(rows, torch.arange(n))
    # Halving until every block fits: the fewest levels k with ceil(n / 2^k) <= max_rows.
    levels = next(k for k in range(64) if math.ceil(n / 2**k) <= max_rows)
    assert len(blocks) == 2**levels
    sizes = {b.numel() for b in blocks}
    assert sizes <= {n // 2**levels, math.ceil(n / 2**levels)}
    assert all(b.dtype == torch.int64 for b in blocks)


def test_kd_blocks_are_cells_of_input_space():
    # One input: the blocks are contiguous ranges of its sorted values.
    x = torch.randn(500, 1, generator=gen(1), dtype=DT)
    blocks = sorted(kd_blocks(x, 60), key=lambda b: float(x[b].min()))
    for a, b in zip(blocks, blocks[1:]):
        assert float(x[a].max()) <= float(x[b].min())
    # Two inputs, one with 100 times the spread: the first cut is along the wide one.
    x2 = torch.randn(400, 2, generator=gen(2), dtype=DT) * torch.tensor([1.0, 100.0], dtype=DT)
    left, right = sorted(kd_blocks(x2, 200), key=lambda b: float(x2[b, 1].min()))
    assert float(x2[left, 1].max()) <= float(x2[right, 1].min())


@pytest.mark.parametrize("scale", [1e-300, 1e300])
def test_kd_blocks_at_extreme_scales(scale):
    # Column 0 spans `scale`, column 1 unit scale: still a partition, first cut along the
    # wider column (at 1e300 its standard deviation overflows to inf, still the largest).
    x = torch.randn(100, 2, generator=gen(16), dtype=DT) * torch.tensor([scale, 1.0], dtype=DT)
    blocks = kd_blocks(x, 50)
    assert sorted(torch.cat(blocks).tolist()) == list(range(100))
    wide = 0 if scale > 1 else 1
    low, high = sorted(blocks, key=lambda b: float(x[b, wide].min()))
    assert float(x[low, wide].max()) <= float(x[high, wide].min())


@pytest.mark.parametrize("scale", [1e-300, 1e-200, 1e-160, 1e160, 1e200, 1e300])
def test_kd_blocks_cut_the_widest_column_when_every_column_is_extreme(scale):
    # Both columns at `scale`, column 1 ten times wider: the plain standard deviation's squares
    # overflow (or underflow) in both, so only a scale-safe spread finds column 1.
    x = torch.randn(100, 2, generator=gen(17), dtype=DT) * torch.tensor([0.1, 1.0], dtype=DT)
    x = x * scale
    low, high = sorted(kd_blocks(x, 50), key=lambda b: float(x[b, 1].min()))
    assert float(x[low, 1].max()) <= float(x[high, 1].min())


@pytest.mark.parametrize("n,max_rows", [(3, 1), (5, 1), (7, 2), (3, 2)])
def test_kd_blocks_with_fewer_rows_than_cells_are_single_rows_never_empty(n, max_rows):
    # ceil(n / 2^k) <= max_rows needs 2^k >= n for max_rows = 1: some cells would hold no row.
    x = torch.randn(n, 2, generator=gen(n), dtype=DT)
    blocks = kd_blocks(x, max_rows)
    assert sorted(torch.cat(blocks).tolist()) == list(range(n))
    assert all(1 <= b.numel() <= max_rows for b in blocks)


@pytest.mark.parametrize("bad,error,match", [
    (torch.zeros(0, 2, dtype=DT), ValueError, "x"),
    (torch.zeros(4, dtype=DT), ValueError, "x"),
    (torch.tensor([[0.0], [math.nan]], dtype=DT), ValueError, "finite"),
    (torch.tensor([[0.0], [math.inf]], dtype=DT), ValueError, "finite"),
    (torch.zeros(4, 2, dtype=torch.int64), TypeError, "x"),
])
def test_kd_blocks_rejects_bad_inputs(bad, error, match):
    with pytest.raises(error, match=match):
        kd_blocks(bad, 2)


@pytest.mark.parametrize("max_rows", [0, -1, 2.5, True])
def test_kd_blocks_rejects_bad_block_sizes(max_rows):
    with pytest.raises((TypeError, ValueError), match="max_rows"):
        kd_blocks(torch.zeros(4, 1, dtype=DT), max_rows)


# ----------------------------------------------------------------------------- block evidence
def test_block_evidence_is_the_sum_of_the_blocks_gaussian_densities():
    x, y = _data(120, seed=3)
    blocks = kd_blocks(x, 40)
    ell = torch.tensor([0.7, 1.3], dtype=DT)
    gp = _gp(2, ell, outputscale=0.8, noise=0.2)
    losses, _, _ = maximize_evidence(gp, x, y, max_iterations=1, tolerance=1e-12, exact=True,
                                     blocks=blocks)
    # The first evaluation is at the start: the block-diagonal Gaussian's density.
    expected = _block_loss(x, y, blocks, ell, 0.8, 0.2)
    assert losses[0] == pytest.approx(expected, rel=1e-10, abs=1e-12)


def test_one_block_is_the_exact_search():
    x, y = _data(150, seed=4)
    a, b = _gp(2, [1.0, 1.0]), _gp(2, [1.0, 1.0])
    la = maximize_evidence(a, x, y, 50, 1e-6, exact=True)[0]
    lb = maximize_evidence(b, x, y, 50, 1e-6, exact=True, blocks=[torch.arange(150)])[0]
    assert la == pytest.approx(lb, rel=1e-12)
    torch.testing.assert_close(a.kernel.base_kernel.lengthscale,
                               b.kernel.base_kernel.lengthscale, rtol=1e-10, atol=0)


def test_block_search_reaches_a_stationary_point_of_the_block_evidence():
    x, y = _data(200, seed=5)
    blocks = kd_blocks(x, 50)
    gp = _gp(2, [1.0, 1.0])
    maximize_evidence(gp, x, y, 200, 1e-7, exact=True, blocks=blocks)
    grad = _block_evidence_gradient(gp, x, y, blocks)
    # The noise floor (1e-6 of the mean square) shifts the noise's gradient by at most that.
    assert float(grad.abs().max()) < 1e-5


@pytest.mark.parametrize("blocks,error,match", [
    ([torch.arange(50), torch.arange(50, 99)], ValueError, "partition"),
    ([torch.arange(60), torch.arange(50, 100)], ValueError, "partition"),
    ([torch.arange(100.0)], TypeError, "int64"),
    ([torch.arange(100, dtype=torch.int32)], TypeError, "int64"),
    ([], ValueError, "non-empty"),
    (torch.arange(100), ValueError, "list"),
    ([torch.arange(100), torch.zeros(0, dtype=torch.int64)], ValueError, "blocks"),
])
def test_block_search_rejects_bad_blocks(blocks, error, match):
    x, y = _data(100, seed=6)
    with pytest.raises(error, match=match):
        maximize_evidence(_gp(2, [1.0, 1.0]), x, y, 5, 1e-6, exact=True, blocks=blocks)


def test_block_search_needs_the_exact_evidence():
    x, y = _data(100, seed=6)
    with pytest.raises(ValueError, match="exact=True"):
        maximize_evidence(_gp(2, [1.0, 1.0]), x, y, 5, 1e-6, blocks=[torch.arange(100)])


# ----------------------------------------------------------------------------- the stage
def test_local_stage_keeps_the_best_of_its_starts():
    x, y = _data(700, d=3, seed=7)
    report = FitReport()
    gp = fit_auto(x, y, calibrate=False, num_features=256, search_features=64, subsample=300,
                  refine_iterations=5, exact_rows=200, lengthscale_draws=0, report=report)
    blocks = kd_blocks(x, 200)
    assert report.local_blocks == len(blocks) == 4
    assert len(report.local_losses) == 3 + 1 and "local" in report.seconds
    assert report.evidence["local"] == "blocks" and report.iterations["local"] >= 4
    # The model kept has the lowest of the starts' block losses, at its hyperparameters.
    base = gp.kernel.base_kernel
    # (the block evidence of the targets less the prior mean the first search chose)
    loss = _block_loss(x, y - gp.prior_mean, blocks, base.lengthscale.detach().reshape(-1),
                       float(gp.kernel.outputscale), float(gp.noise))
    assert loss == pytest.approx(min(report.local_losses), rel=1e-9, abs=1e-12)
    torch.testing.assert_close(report.lengthscale, base.lengthscale.detach().reshape(-1),
                               rtol=1e-12, atol=0)
    # and no worse than the refinement's end, the first start.
    assert min(report.local_losses) <= report.local_losses[0]


def test_local_stage_starts_from_shortened_lengthscales(monkeypatch):
    import rfgp.recipes._local as recipe

    seen = []
    original = recipe.maximize_evidence

    def spy(gp, x, y, *args, **kwargs):
        if kwargs.get("blocks") is not None:
            seen.append(gp.kernel.base_kernel.lengthscale.detach().reshape(-1).clone())
        return original(gp, x, y, *args, **kwargs)

    monkeypatch.setattr(recipe, "maximize_evidence", spy)
    x, y = _data(500, d=2, seed=8)
    report = FitReport()
    fit_auto(x, y, num_features=128, search_features=64, subsample=200, refine_iterations=2,
             exact_rows=250, lengthscale_draws=0, report=report)
    assert len(seen) == 3 == report.schedule.local_starts
    first = seen[0]
    # The most relevant input (shortest lengthscale per unit of its spread) is shortened first.
    order = (first / x.std(0)).argsort().tolist()
    for j, start in zip(order, seen[1:]):
        expected = first.clone()
        expected[j] = expected[j] * LOCAL_SHORT_START
        torch.testing.assert_close(start, expected, rtol=1e-12, atol=0)
    # The first start is where the recipe without the stage ends: the stage comes after the
    # refinement and changes nothing before it.
    off = FitReport()
    fit_auto(x, y, num_features=128, search_features=64, subsample=200, refine_iterations=2,
             exact_rows=250, lengthscale_draws=0, report=off, local_search=False)
    # (the final model's lengthscales are the refinement's end times the scale search's factor)
    factor = off.calibration["lengthscale_factor"]
    torch.testing.assert_close(off.lengthscale / factor, first, rtol=1e-12, atol=0)


def test_local_stage_uses_the_refinement_rows_only():
    # 700 rows cut at 100 would give 8 blocks; the refinement's 400 rows give 4 of 100.
    x, y = _data(700, d=2, seed=11)
    assert len(kd_blocks(x, 100)) == 8
    report = FitReport()
    fit_auto(x, y, num_features=128, search_features=64, subsample=200, refine_rows=400,
             refine_iterations=2, exact_rows=100, lengthscale_draws=0, report=report)
    assert report.refine_rows == 400
    assert report.local_blocks == 4 and len(report.local_losses) == 3


def test_local_stage_runs_only_after_a_refinement():
    x, y = _data(400, seed=9)
    options = dict(num_features=128, search_features=64, lengthscale_draws=0)
    cases = {
        "all rows in the subsample": dict(subsample=400),
        "no refinement": dict(subsample=200, refine_iterations=0),
        "switched off": dict(subsample=200, local_search=False),
        "no exact evidence": dict(subsample=200, exact_rows=0),
    }
    for name, extra in cases.items():
        report = FitReport()
        fit_auto(x, y, report=report, **options, **extra)
        assert report.local_blocks == 0 and not report.local_losses, name
        assert "local" not in report.seconds, name


def test_local_stage_checks_its_switch():
    x, y = _data(100, seed=10)
    for bad in (1, None, "yes"):
        with pytest.raises(TypeError, match="local_search"):
            fit_auto(x, y, num_features=64, local_search=bad)


def test_laplace_hessian_over_blocks_adds_the_blocks_hessians():
    # One block of all rows is the exact evidence's Hessian; two blocks, the sum of the
    # blocks' Hessians weighted by their rows.
    x, y = _data(150, seed=12)
    gp = _gp(2, [0.9, 1.4], outputscale=0.7, noise=0.1)
    maximize_evidence(gp, x, y, 100, 1e-7, exact=True)
    base = gp.kernel.base_kernel
    args = (base.lengthscale.detach().reshape(-1), gp.kernel.outputscale.detach(),
            gp.noise.detach())
    one = evidence_hessian(base, x, y, *args, exact=True, blocks=[torch.arange(150)])
    whole = evidence_hessian(base, x, y, *args, exact=True)
    torch.testing.assert_close(one, whole, rtol=1e-9, atol=0)
    blocks = kd_blocks(x, 75)
    two = evidence_hessian(base, x, y, *args, exact=True, blocks=blocks)
    parts = sum(evidence_hessian(base, x[b], y[b], *args, exact=True) * b.numel()
                for b in blocks) / 150
    torch.testing.assert_close(two, parts, rtol=1e-6, atol=1e-9)


def test_local_stage_with_several_target_columns():
    # Two columns share the hyperparameters: the block evidence adds both columns' densities.
    x, y = _data(500, seed=13)
    y2 = torch.stack([y, 0.5 * y + 0.1 * torch.randn(500, generator=gen(14), dtype=DT)], -1)
    report = FitReport()
    gp = fit_auto(x, y2, calibrate=False, num_features=128, search_features=64, subsample=200,
                  refine_iterations=2, exact_rows=250, lengthscale_draws=0, report=report)
    assert report.local_blocks == 2 and len(report.local_losses) == 3
    blocks = kd_blocks(x, 250)
    ell = report.lengthscale
    both = sum(_block_loss(x, y2[:, t] - gp.prior_mean[t], blocks, ell,
                           float(gp.kernel.outputscale), float(gp.noise)) for t in range(2)) / 2
    assert both == pytest.approx(min(report.local_losses), rel=1e-8)
    mean = gp.predict(x[:5])
    assert mean.shape == (5, 2) and bool(torch.isfinite(mean).all())


def test_fourier_kernel_evidence_over_blocks_checks_them():
    from rfgp.inference._evidence import fourier_kernel_negative_log_evidence as evidence

    x, y = _data(60, seed=15)
    base = make_ard_kernel(16, 2, seed=0).base_kernel
    one = torch.ones((), dtype=DT)
    args = (base, x, y[:, None], torch.ones(2, dtype=DT), one, 0.1 * one)
    halves = [torch.arange(30), torch.arange(30, 60)]
    expected = _block_loss(x, y, halves, torch.ones(2, dtype=DT), 1.0, 0.1) * 60
    assert float(evidence(*args, exact=True, blocks=halves)) == pytest.approx(expected, rel=1e-10)
    with pytest.raises(ValueError, match="exact=True"):
        evidence(*args, blocks=halves)
    with pytest.raises(ValueError, match="partition"):
        evidence(*args, exact=True, blocks=[torch.arange(30)])


# ----------------------------------------------------------------------------- whole-set blocks
def test_search_of_every_row_beyond_exact_rows_maximises_the_block_evidence():
    # 300 rows, all in the search (subsample 1000), more than exact_rows = 100: the search
    # maximises the exact evidences of the k-d blocks of at most 100 rows. Standard normal
    # inputs and centred targets of root mean square near one: the search's working units
    # are one, so its blocks are those of x.
    x, y = _data(300, seed=21)
    report = FitReport()
    gp = fit_auto(x, y, calibrate=False, num_features=64, search_features=64, subsample=1000,
                  exact_rows=100,
                  tolerance=1e-7, lengthscale_draws=0, max_lengthscale=None, report=report)
    assert report.evidence == {"search": "blocks"} and "refine" not in report.iterations
    grad = _block_evidence_gradient(gp, x, y - gp.prior_mean, kd_blocks(x, 100))
    assert float(grad.abs().max()) < 1e-5
    # The block evidence is not the 64 features' evidence: their maximum is elsewhere.
    features = FitReport()
    fit_auto(x, y, num_features=64, search_features=64, subsample=1000, exact_rows=0,
             tolerance=1e-7, lengthscale_draws=0, max_lengthscale=None, report=features)
    assert features.evidence == {"search": "features"}
    assert not torch.allclose(features.lengthscale, report.lengthscale, rtol=1e-3)


def test_folds_and_hessian_of_a_whole_set_search_use_blocks(monkeypatch):
    # Every evidence search of the fit on more than exact_rows rows (the search, both searches
    # of each fold, the bounded search) runs on k-d blocks of at most exact_rows rows that
    # partition its rows; the Laplace Hessian gets the search's blocks.
    import rfgp.inference._evidence_search as search
    import rfgp.recipes._laplace as averaging
    import rfgp.recipes._select as choice

    calls, hessian_blocks = [], []
    original, original_hessian = search.maximize_evidence, averaging.evidence_hessian

    def recording(gp, x, y, max_iterations=100, tolerance=1e-6, exact=False,
                  max_lengthscale=None, blocks=None, mean=False):
        calls.append((x.shape[0], exact, blocks))
        return original(gp, x, y, max_iterations, tolerance, exact, max_lengthscale, blocks,
                        mean)

    def hessian(*args, blocks=None, **kwargs):
        hessian_blocks.append(blocks)
        return original_hessian(*args, blocks=blocks, **kwargs)

    monkeypatch.setattr(search, "maximize_evidence", recording)
    monkeypatch.setattr(choice, "maximize_evidence", recording)
    monkeypatch.setattr(averaging, "evidence_hessian", hessian)
    g = gen(22)
    x = torch.randn(250, 2, generator=g, dtype=DT)
    y = torch.sin(2 * x[:, 0]) + 0.1 * torch.randn(250, generator=g, dtype=DT)  # x1 idle
    report = FitReport()
    fit_auto(x, y - y.mean(), num_features=64, subsample=1000, exact_rows=60, report=report,
             lengthscale_draws=4)
    assert report.cv_scores, "the bound was not weighed"
    assert len(calls) >= 1 + 5  # the search and at least one search per fold
    for rows, exact, blocks in calls:
        assert exact and blocks is not None
        assert all(b.numel() <= 60 for b in blocks)
        assert torch.equal(torch.cat(blocks).sort().values, torch.arange(rows))
    assert hessian_blocks and hessian_blocks[0] is not None
    assert sum(b.numel() for b in hessian_blocks[0]) == 250
