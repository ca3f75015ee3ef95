"""Device-agnostic fits: the same model on each available device gives the CPU float64 answer.

The ``cuda`` cases run only where a GPU is present; the ``cpu`` cases keep the test honest here.
"""

import pytest
import torch

from rfgp import RandomFeatureGP, fit_auto
from rfgp.kernels import FourierFeatureKernel, PolynomialSketchKernel
from rfgp.recipes import calibrated_fit
from rfgp.recipes._start import make_ard_kernel

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                  reason="no CUDA device")),
]


def _data(generator):
    x = torch.randn(300, 4, generator=generator, dtype=torch.float64)
    y = torch.sin(x).sum(-1) + 0.1 * torch.randn(300, generator=generator, dtype=torch.float64)
    return x, y, torch.randn(50, 4, generator=generator, dtype=torch.float64)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("make_kernel", [
    lambda: FourierFeatureKernel(128, sampling="orthogonal", seed=0),
    lambda: PolynomialSketchKernel(3, 64, bias=1.0, projection="tensorsrht", complex=True, seed=0),
])
def test_fit_on_device_matches_cpu_float64(device, make_kernel):
    generator = torch.Generator().manual_seed(0)
    x, y, x_test = _data(generator)
    reference = RandomFeatureGP(make_kernel().double(), noise=0.1).fit(x, y)
    ref_mean, ref_std = reference.predict(x_test, return_std=True)

    # The weights are drawn on the CPU from the seed, then moved with the module.
    kernel = make_kernel().double()
    kernel.features(x[:1])
    kernel = kernel.to(device)
    gp = RandomFeatureGP(kernel, noise=0.1).fit(x.to(device), y.to(device))
    mean, std = gp.predict(x_test.to(device), return_std=True)
    assert mean.device.type == device
    torch.testing.assert_close(mean.cpu(), ref_mean, rtol=1e-8, atol=1e-8)
    torch.testing.assert_close(std.cpu(), ref_std, rtol=1e-8, atol=1e-8)


@pytest.mark.parametrize("device", DEVICES)
def test_float32_fit_on_device_is_close_to_float64(device):
    generator = torch.Generator().manual_seed(1)
    x, y, x_test = _data(generator)
    kernel64 = FourierFeatureKernel(128, seed=3).double()
    mean64 = RandomFeatureGP(kernel64, noise=0.1).fit(x, y).predict(x_test)
    kernel32 = FourierFeatureKernel(128, seed=3).to(device)
    gp32 = RandomFeatureGP(kernel32, noise=0.1).fit(x.float().to(device), y.float().to(device))
    mean32 = gp32.predict(x_test.float().to(device))
    assert mean32.dtype == torch.float32
    # float32 round-off through a D x D Cholesky of a well-conditioned (noise 0.1) system
    assert (mean32.cpu().double() - mean64).abs().max() < 1e-3


def _ard_kernel(x, num_features=128):
    """An ARD Fourier-feature kernel whose weights are drawn on the CPU from its seed."""
    kernel = make_ard_kernel(num_features, x.shape[1], seed=0)
    kernel.base_kernel.lengthscale = torch.tensor([1.0, 1.5, 2.0, 1.0], dtype=torch.float64)
    kernel.base_kernel.features(x[:1])
    return kernel


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("solve", ["weight", "cg"])
def test_calibrated_fit_on_device_matches_cpu(device, solve):
    # The calibration's probes and sketches are drawn on the CPU from its seed, so both
    # devices run the same arithmetic up to round-off.
    x, y, x_test = _data(torch.Generator().manual_seed(2))
    y = y - y.mean()
    reference = calibrated_fit(_ard_kernel(x), x, y, 0.5, solve=solve)
    gp = calibrated_fit(_ard_kernel(x).to(device), x.to(device), y.to(device), 0.5, solve=solve)
    assert gp.solve_used == reference.solve_used == solve
    mean, std = gp.predict(x_test.to(device), return_std=True)
    assert mean.device.type == device
    ref_mean, ref_std = reference.predict(x_test, return_std=True)
    if solve == "weight":  # one eigendecomposition and Cholesky: round-off alone
        noise_tol = prediction_tol = 1e-8
    else:
        # Each device's CG stops at a relative residual of 1e-6. The calibrated noise, a
        # stationary point of the estimated evidence, moves at that order; the weights are
        # determined only to the residual times the condition number of B (about 1.4e4 here,
        # 1e-2 at worst), and a device path that went wrong would be off by O(1).
        noise_tol, prediction_tol = 1e-5, 1e-3
    torch.testing.assert_close(float(gp.noise), float(reference.noise), rtol=noise_tol, atol=0)
    torch.testing.assert_close(mean.cpu(), ref_mean, rtol=prediction_tol, atol=prediction_tol)
    torch.testing.assert_close(std.cpu(), ref_std, rtol=prediction_tol, atol=prediction_tol)


@pytest.mark.parametrize("device", DEVICES)
def test_cg_function_samples_on_device(device):
    # Sample-then-optimise on the device: the sample mean over many draws is the posterior
    # mean, within 4 standard errors of the posterior's own standard deviation.
    x, y, x_test = _data(torch.Generator().manual_seed(3))
    gp = RandomFeatureGP(_ard_kernel(x).to(device), noise=0.1, solve="cg").fit(
        x.to(device), y.to(device))
    paths = gp.sample_functions(400, generator=torch.Generator().manual_seed(0))
    samples = paths(x_test.to(device))
    assert samples.device.type == device and samples.shape == (400, x_test.shape[0])
    mean, std = gp.predict(x_test.to(device), return_std=True)
    error = (samples.mean(0) - mean).abs() / (std / 20.0)
    assert bool(error.max() < 4.5), float(error.max())


@pytest.mark.parametrize("device", DEVICES)
def test_fit_auto_on_device(device):
    # A fixed schedule (features given, no draws, no local stage): the same search on each
    # device reaches the same optimum of the same evidence, up to the optimiser's tolerance.
    x, y, x_test = _data(torch.Generator().manual_seed(4))
    options = dict(num_features=128, search_features=128, lengthscale_draws=0,
                   local_search=False, cv_folds=0, seed=0)
    reference = fit_auto(x, y, **options)
    gp = fit_auto(x.to(device), y.to(device), **options)
    mean = gp.predict(x_test.to(device))
    assert mean.device.type == device and bool(torch.isfinite(mean).all())
    torch.testing.assert_close(float(gp.noise), float(reference.noise), rtol=1e-3, atol=0)
    torch.testing.assert_close(mean.cpu(), reference.predict(x_test), rtol=1e-3, atol=1e-3)
