"""rfgp.metrics.kernel_distance: exact forms and the guarantee of the sketched distance."""


import gpytorch
import pytest
import torch
from scipy.stats import binom

from rfgp.kernels import GaussianSketchKernel
from rfgp.kernels._gaussian_sketch import choose_truncation
from rfgp.metrics import kernel_distance


def points(n, d, seed, scale=0.5):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g, dtype=torch.float64) * scale


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["coordinate", "degree"])
def test_sketched_kernel_distance_relative_plus_additive_error(variant):
    # |D_hat^2 - D^2| <= eps D^2 + alpha with probability >= 9/10 per draw; over 20 draws the
    # number of failures is Binomial(20, <= 0.1): more than binom.ppf(0.999) would reject.
    eps, alpha = 0.5, 1e-4
    x = points(40, 3, 6)
    y = x + 0.2 * points(40, 3, 7, 1.0)
    s = choose_truncation(torch.cat([x, y]), alpha, variant=variant)
    num = 3 * 16 * 4 if variant == "coordinate" else 3 * s * s // 1
    k = GaussianSketchKernel(int(num), truncation=s, variant=variant, input_dim=3).double()
    k.lengthscale = 1.0
    exact = float(kernel_distance(x, y))
    g = torch.Generator().manual_seed(8)
    failures = 0
    for _ in range(20):
        k.resample(g)
        estimate = float(kernel_distance(x, y, k))
        failures += abs(estimate - exact) > eps * exact + alpha
    assert failures <= binom.ppf(0.999, 20, 0.1)


def test_kernel_distance_exact_forms():
    x, y = points(7, 2, 9), points(5, 2, 10)
    rbf = gpytorch.kernels.RBFKernel().double()
    rbf.lengthscale = 0.7
    kxx, kyy, kxy = (rbf(a, b).to_dense() for a, b in ((x, x), (y, y), (x, y)))
    expected = kxx.mean() + kyy.mean() - 2 * kxy.mean()
    torch.testing.assert_close(kernel_distance(x, y, rbf), expected)
    torch.testing.assert_close(kernel_distance(x, y, lengthscale=0.7), expected)
    torch.testing.assert_close(kernel_distance(x, y, lengthscale=0.7, squared=False),
                               expected.sqrt())
    torch.testing.assert_close(kernel_distance(x, y, rbf, block_size=2), expected)
    assert float(kernel_distance(x, x)) == pytest.approx(0.0, abs=1e-12)
    # Sketched estimate = the exact distance under the feature kernel k_hat = Phi Phi^T.
    k = GaussianSketchKernel(32, truncation=6, seed=0).double()
    z = torch.cat([x, y])
    phi = k.features(z)
    beta = torch.cat([torch.full((7,), 1 / 7, dtype=torch.float64),
                      torch.full((5,), -1 / 5, dtype=torch.float64)])
    torch.testing.assert_close(kernel_distance(x, y, k), beta @ (phi @ phi.T) @ beta)
    scaled = gpytorch.kernels.ScaleKernel(k).double()
    scaled.outputscale = 2.0
    torch.testing.assert_close(kernel_distance(x, y, scaled), 2 * kernel_distance(x, y, k))


def test_bad_input():
    with pytest.raises(ValueError, match="x and y"):
        kernel_distance(torch.zeros(3, 2), torch.zeros(3, 3))
    with pytest.raises(TypeError, match="kernel"):
        kernel_distance(torch.zeros(3, 2), torch.zeros(3, 2), kernel="rbf")
