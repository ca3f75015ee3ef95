"""Large-D calibration from one Krylov space: its scales are the maximum of the evidence that
the weight-space calibration maximises exactly (one eigendecomposition of the Gram matrix)."""

from __future__ import annotations

import math

import pytest
import torch

from rfgp.inference._calibration import feature_model_evidence, maximize_scale_evidence
from rfgp.inference._krylov_calibration import krylov_scale_calibration
from rfgp.inference._krylov_features import calibrate_by_krylov
from rfgp.recipes._start import make_ard_kernel
from tests.helpers import DT, gen

# The standard error is itself estimated from the probes' spread (Student's t with
# _PROBES - 1 degrees of freedom): with 16 probes a deviation beyond 4 estimated standard
# errors has probability below 1e-3.
_PROBES = 16
_SPREAD = 4.0


def _problem(n=2000, d=3, width=512, seed=0, columns=1, noise=0.1):
    g = gen(seed)
    x = torch.rand(n, d, generator=g, dtype=DT)
    f = torch.sin(6 * x[:, 0]) + x[:, 1] ** 2
    y = torch.stack([f * (1 + t) + noise * torch.randn(n, generator=g, dtype=DT)
                     for t in range(columns)], -1)
    y = (y - y.mean(0)).squeeze(-1)
    kernel = make_ard_kernel(width, d, seed=seed)
    kernel.base_kernel.lengthscale = torch.tensor([[0.3, 0.5, 1.0]], dtype=DT)
    return kernel, x, y


def _exact_log_evidence(evidence, factor, noise):
    """The exact log evidence per datum of the feature model at (factor, noise)."""
    loss = evidence.negative_log_evidence(torch.tensor(math.log(factor), dtype=DT),
                                          torch.tensor(noise, dtype=DT))
    return -float(loss) / (evidence.num_data * evidence.num_columns)


@pytest.mark.parametrize("columns", [1, 2])
@pytest.mark.parametrize("noise", [0.1, 0.01])
def test_the_scales_agree_with_the_weight_space_maximum(columns, noise):
    kernel, x, y = _problem(columns=columns, noise=noise)
    exact = feature_model_evidence(kernel, x, y)
    factor, sigma2, loss = maximize_scale_evidence(exact, 0.05)
    out = calibrate_by_krylov(kernel, x, y, 0.05, num_probes=_PROBES, generator=gen(1))
    assert out.noise == pytest.approx(sigma2, rel=0.01)
    assert not out.noise_at_floor and out.standard_error > 0
    # The reported evidence is an estimate at the returned point: within its standard error
    # (times _SPREAD) of the exact evidence there, which is within the curvature's
    # second-order term of the maximum (a percent in the noise costs ~1e-5 per datum at most).
    at_point = _exact_log_evidence(exact, out.factor, out.noise)
    assert out.log_evidence == pytest.approx(at_point, abs=_SPREAD * out.standard_error)
    assert at_point == pytest.approx(-loss / y.numel(), abs=1e-4)


def test_a_full_rank_sketch_makes_every_c_exact():
    # With the sketch's rank equal to the width its test matrix spans the whole space, so the
    # Galerkin projection is A_c itself for every c, and P_c = A_c leaves the probes nothing:
    # the scales and the evidence are the exact maximum, with no spread.
    kernel, x, y = _problem(width=64, noise=0.05, columns=2)
    exact = feature_model_evidence(kernel, x, y)
    factor, sigma2, loss = maximize_scale_evidence(exact, 0.05)
    out = calibrate_by_krylov(kernel, x, y, 0.05, rank=64, generator=gen(0))
    assert out.noise == pytest.approx(sigma2, rel=1e-6)
    assert out.factor == pytest.approx(factor, rel=1e-4)
    assert out.log_evidence == pytest.approx(-loss / y.numel(), abs=1e-9)
    assert out.standard_error < 1e-9


def test_a_binding_noise_floor_holds_the_noise_and_maximises_the_outputscale():
    kernel, x, y = _problem(noise=0.05)
    exact = feature_model_evidence(kernel, x, y)
    _, free_noise, _ = maximize_scale_evidence(exact, 0.05)
    floor = 3.0 * free_noise
    factor, sigma2, loss = maximize_scale_evidence(exact, 0.05, noise_floor=floor)
    assert sigma2 == pytest.approx(floor, rel=1e-3)  # the exact maximum sits at the floor
    out = calibrate_by_krylov(kernel, x, y, 0.05, noise_floor=floor, num_probes=_PROBES,
                              generator=gen(2))
    assert out.noise_at_floor and out.noise == floor
    # With the noise held, the outputscale is the maximiser of a smooth 1-D function.
    assert out.factor == pytest.approx(factor, rel=0.01)
    at_point = _exact_log_evidence(exact, out.factor, out.noise)
    assert out.log_evidence == pytest.approx(at_point, abs=_SPREAD * out.standard_error)
    assert at_point == pytest.approx(-loss / y.numel(), abs=1e-5)


def test_a_start_at_the_root_needs_one_run():
    # Started at the maximum the first run's projection puts the root within the accepted
    # radius: one CG run over the targets and probes (its products at most its iterations
    # plus one per column) and the sketch are the whole cost.
    kernel, x, y = _problem(noise=0.05)
    exact = feature_model_evidence(kernel, x, y)
    factor, sigma2, _ = maximize_scale_evidence(exact, 0.05)
    out = calibrate_by_krylov(kernel, x, y, sigma2, factor=factor, num_probes=8,
                              generator=gen(3))
    assert len(out.iterations) == 1
    assert out.products["runs"] <= 9 * out.iterations[0]
    assert out.products["sketch"] == out.rank
    assert out.noise == pytest.approx(sigma2, rel=0.01)


def test_dense_gram_products():
    g = gen(4)
    phi = torch.randn(600, 40, dtype=DT, generator=g)
    y = phi @ torch.randn(40, dtype=DT, generator=g) * 0.2 + 0.3 * torch.randn(600, dtype=DT,
                                                                              generator=g)
    from rfgp.inference._calibration import spectral_statistics

    exact = spectral_statistics(phi.T @ phi, phi.T @ y, float(y @ y), 600)
    factor, sigma2, _ = maximize_scale_evidence(exact, 1.0)
    out = krylov_scale_calibration(lambda v: phi.T @ (phi @ v), phi.T @ y, float(y @ y), 600,
                                   1.0, generator=g)
    assert out.noise == pytest.approx(sigma2, rel=0.01)


@pytest.mark.slow
@pytest.mark.parametrize("columns", [1, 2])
def test_the_scales_agree_at_a_larger_width(columns):
    kernel, x, y = _problem(n=8000, width=4096, columns=columns, noise=0.02, seed=5)
    exact = feature_model_evidence(kernel, x, y)
    factor, sigma2, loss = maximize_scale_evidence(exact, 0.05)
    out = calibrate_by_krylov(kernel, x, y, 0.05, num_probes=_PROBES, generator=gen(6))
    assert out.noise == pytest.approx(sigma2, rel=0.01)
    at_point = _exact_log_evidence(exact, out.factor, out.noise)
    assert out.log_evidence == pytest.approx(at_point, abs=_SPREAD * out.standard_error)


def test_the_condition_bound_caps_the_ratio():
    # A target the features fit exactly drives the noise down without bound; the bound
    # holds c lambda_max(G) at 1 / condition (with the sketch's top eigenvalue, at most the
    # true one).
    kernel, x, _ = _problem()
    with torch.no_grad():
        y = kernel.base_kernel.features(x) @ torch.randn(512, generator=gen(4), dtype=DT)
    y = y - y.mean()
    top = float(feature_model_evidence(kernel, x, y).eigenvalues.max())
    out = calibrate_by_krylov(kernel, x, y, 1.0, condition=1e-8, generator=gen(5))
    assert out.factor / out.noise <= 1.0 / (1e-8 * top) * 1.05
    assert math.isfinite(out.log_evidence) and out.noise > 0


@pytest.mark.parametrize("columns", [1, 2])
def test_the_probes_loose_tolerance_stays_within_the_reported_error(columns):
    # The same probes and sketch (one generator seed) solved to the targets' tolerance and to
    # the looser probe tolerance: the looser run's standard error holds its quadrature's
    # truncation error (the last Lanczos step's change), so the two estimates agree within
    # two of it (the tight run's own error is far smaller here); the first anchor's probes
    # stop sooner, and the runs beyond the sketch cost at most five solves of the targets.
    kernel, x, y = _problem(columns=columns, noise=0.01, width=1024)
    tight = calibrate_by_krylov(kernel, x, y, 0.05, probe_tolerance=1e-8, generator=gen(2))
    loose = calibrate_by_krylov(kernel, x, y, 0.05, generator=gen(2))
    assert loose.standard_error >= tight.standard_error * 0.5
    assert loose.log_evidence == pytest.approx(tight.log_evidence,
                                               abs=2 * loose.standard_error)
    assert loose.noise == pytest.approx(tight.noise, rel=1e-3)
    assert loose.probe_iterations[0] <= tight.probe_iterations[0]
    assert loose.products["runs"] <= 5 * columns * sum(loose.iterations)
