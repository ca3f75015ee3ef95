"""Device-agnostic fits: the same model on each available device gives the CPU float64 answer.

The ``cuda`` cases run only where a GPU is present; the ``cpu`` cases keep the test honest here.
"""

import pytest
import torch

from rfgp import RandomFeatureGP
from rfgp.kernels import FourierFeatureKernel, PolynomialSketchKernel

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
