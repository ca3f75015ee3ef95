"""Features are finite wherever the kernel value is finite; settings that cannot give finite
features or ``num_features`` columns are refused with a clear error."""

from __future__ import annotations

import math

import pytest
import torch

from rfgp.kernels import (
    GaussianSketchKernel,
    MaclaurinKernel,
    PolynomialSketchKernel,
    RandomFeatureKernel,
)
from tests.kernels.kernel_registry import (
    ALL_KERNELS,
    FEATURE_KERNELS,
    build,
    construct,
    data,
)

#: kernels whose value at inputs x 10^4 is itself infinite (exp(x^T y / l^2) = exp(~10^8)):
#: there the features cannot be finite and are not asked to be.
INFINITE_AT_LARGE_INPUTS = {"dot-product-exponential"}


@pytest.mark.parametrize("name", [n for n in ALL_KERNELS if n not in INFINITE_AT_LARGE_INPUTS])
def test_finite_at_large_float32_inputs(name):
    kernel = build(name)
    x = data(8) * 1e4
    if isinstance(kernel, RandomFeatureKernel):
        phi = kernel.features(x)
        assert phi.dtype in (torch.float32, torch.complex64)
        assert bool(torch.isfinite(phi).all()), name
    with torch.no_grad():
        assert bool(torch.isfinite(kernel(x).to_dense()).all()), name


@pytest.mark.parametrize("kernel", [
    GaussianSketchKernel(64, truncation=10, seed=0),
    GaussianSketchKernel(64, truncation=10, variant="degree", seed=0),
    MaclaurinKernel("gaussian", 64, allocation="random", seed=0),
    MaclaurinKernel("gaussian", 64, allocation="random", projection="tensorsrht", complex=True,
                    seed=0),
], ids=["gaussian-sketch-coordinate-s10", "gaussian-sketch-degree-s10", "maclaurin-gaussian",
        "maclaurin-gaussian-tensorsrht-complex"])
def test_high_degree_gaussian_features_finite_at_large_float32_inputs(kernel):
    # Degrees up to 9 / 10: the powers z^n of inputs 10^4 lengthscales out overflow float32
    # unless the Gaussian envelope is folded into them.
    phi = kernel.features(data(8) * 1e4)
    assert bool(torch.isfinite(phi).all())
    assert phi.abs().max() < 1e-30  # the kernel value there is e^{-10^8} = 0


@pytest.mark.parametrize("name", ["maclaurin-random-gaussian-complex",
                                  "maclaurin-optimized-gaussian", "gaussian-sketch-coordinate",
                                  "gaussian-sketch-degree"])
def test_gaussian_features_vanish_far_away(name):
    # The Gaussian kernel is ~0 between a far point and itself scaled; its features decay to 0
    # (not NaN) and the diagonal k(x, x) = 1 is only approached near the origin.
    kernel = build(name)
    far = torch.full((2, 3), 1e4)
    phi = kernel.features(far)
    assert bool(torch.isfinite(phi).all())
    assert phi.abs().max() < 1e-30


@pytest.mark.parametrize("scale", [10.0, 30.0])
@pytest.mark.parametrize("variant", ["coordinate", "degree"])
def test_gaussian_sketch_large_truncation_in_float32_agrees_with_float64(scale, variant):
    # truncation 10 at 10 and 30 lengthscales: the float32 features stay finite and equal the
    # float64 ones (same weights) up to float32 round-off relative to the largest feature, or
    # float32's underflow (features of e^{-900} are 0 in float32).
    kernel = GaussianSketchKernel(64, truncation=10, variant=variant, seed=0)
    x = data(5, seed=1) * scale
    single = kernel.features(x)
    double = kernel.double().features(x.double())
    assert bool(torch.isfinite(single).all())
    scale_of = double.abs().max().item()
    torch.testing.assert_close(single.double(), double, rtol=1e-4,
                               atol=1e-5 * scale_of + 1e-35)


def test_gaussian_maclaurin_high_degrees_match_float64():
    kernel = MaclaurinKernel("gaussian", 64, allocation="random", max_degree=10, seed=0)
    x = data(6, seed=2) * 3.0
    single = kernel.features(x)
    double = kernel.double().features(x.double())
    assert bool(torch.isfinite(single).all())
    torch.testing.assert_close(single.double(), double, atol=1e-5, rtol=1e-3)


# ------------------------------------------------------------------ refused settings
#: the Helmholtz kernels have two lengthscales: the curl-free one is tried.
LENGTHSCALES = {name: "raw_curl_lengthscale" if name.startswith("helmholtz") else
                "raw_lengthscale" for name in ALL_KERNELS}


@pytest.mark.parametrize("name", list(LENGTHSCALES))
@pytest.mark.parametrize("value", [0.0, math.inf, math.nan])
def test_degenerate_lengthscale_is_refused_at_first_use(name, value):
    # First use: the call that draws the weights (or allocates them); exact kernels check at
    # every call. (Later calls of a feature kernel do not check: an optimiser that overshoots
    # sees the non-finite loss and steps back.)
    kernel = construct(name)
    with torch.no_grad():
        # the raw value whose transformed lengthscale is 0, inf or NaN
        getattr(kernel, LENGTHSCALES[name]).fill_(-math.inf if value == 0 else value)
    with pytest.raises(ValueError, match="lengthscale"):
        if getattr(kernel, "needs_allocation", False):
            kernel.allocate(data(20))
        elif isinstance(kernel, RandomFeatureKernel):
            kernel.features(data())
        else:
            kernel(data()).to_dense()


@pytest.mark.parametrize("value", [0.0, math.inf, math.nan])
def test_degenerate_lengthscale_in_a_checkpoint_is_refused(value):
    kernel = build("fourier-iid-rbf")
    kernel.features(data())
    state = kernel.state_dict()
    state["raw_lengthscale"] = torch.full_like(state["raw_lengthscale"],
                                               -math.inf if value == 0 else value)
    with pytest.raises(RuntimeError, match="lengthscale"):
        ALL_KERNELS["fourier-iid-rbf"]().load_state_dict(state)


def test_setting_a_degenerate_lengthscale_is_refused():
    kernel = build("fourier-iid-rbf")
    for value in (0.0, math.inf, math.nan, -1.0):
        with pytest.raises(ValueError, match="lengthscale"):
            kernel.lengthscale = value


@pytest.mark.parametrize("bias", [math.inf, math.nan, -1.0])
def test_maclaurin_bias_must_be_finite_and_non_negative(bias):
    with pytest.raises(ValueError, match="bias"):
        MaclaurinKernel("polynomial", 16, degree=2, bias=bias)
    with pytest.raises(ValueError, match="bias"):
        PolynomialSketchKernel(2, 16, bias=bias)


def test_infinite_learnable_bias_is_refused_at_first_use():
    kernel = PolynomialSketchKernel(2, 16, bias=1.0, seed=0)
    with torch.no_grad():
        kernel.raw_bias.fill_(math.inf)
    with pytest.raises(ValueError, match="bias"):
        kernel.features(data())


def test_gaussian_sketch_refuses_settings_without_num_features_columns():
    with pytest.raises(ValueError, match="num_features"):
        GaussianSketchKernel(16, truncation=1, variant="degree")
    assert GaussianSketchKernel(1, truncation=1, variant="degree").features(data()).shape == (6, 1)


@pytest.mark.parametrize("name", list(FEATURE_KERNELS))
def test_every_kernel_gives_num_features_columns(name):
    kernel = build(name)
    assert kernel.features(data()).shape[-1] == kernel.num_features
