"""Old import paths and method names keep working, with a DeprecationWarning naming the new."""

import importlib
import warnings

import pytest

import rfgp
from rfgp import kernels

MOVED = [
    ("rfgp.kernels.exact", "DotProductKernel", kernels.DotProductKernel),
    ("rfgp.kernels.exact", "CurlFreeKernel", kernels.CurlFreeKernel),
    ("rfgp.kernels.exact", "DivFreeKernel", kernels.DivFreeKernel),
    ("rfgp.kernels.exact", "HelmholtzKernel", kernels.HelmholtzKernel),
    ("rfgp.kernels.operator", "HelmholtzFeatureKernel", kernels.HelmholtzFeatureKernel),
    ("rfgp.kernels.operator", "DecomposableFeatureKernel", kernels.DecomposableFeatureKernel),
    ("rfgp.kernels.operator", "helmholtz_components", rfgp.helmholtz_components),
    ("rfgp.kernels", "helmholtz_components", rfgp.helmholtz_components),
]


@pytest.mark.parametrize("module, name, obj", MOVED)
def test_moved_names_still_import_with_a_deprecation_warning(module, name, obj):
    mod = importlib.import_module(module)
    with pytest.warns(DeprecationWarning, match=f"{name} is deprecated"):
        assert getattr(mod, name) is obj


def test_moved_allocation_module_still_imports():
    from rfgp.kernels.maclaurin import allocation

    with pytest.warns(DeprecationWarning, match="rfgp.kernels.maclaurin.allocation"):
        from rfgp.allocation import optimize_allocation
    assert optimize_allocation is allocation.optimize_allocation
    with pytest.warns(DeprecationWarning):
        assert rfgp.allocation.AllocationResult is allocation.AllocationResult


def test_unknown_names_raise_attribute_error():
    import rfgp.kernels.exact as exact

    with pytest.raises(AttributeError, match="no_such_name"):
        exact.no_such_name  # noqa: B018
    with pytest.raises(AttributeError):
        rfgp.no_such_module  # noqa: B018


def test_public_paths_import_without_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        from rfgp import variance
        from rfgp.kernels.maclaurin import MaclaurinKernel
        from rfgp.kernels.maclaurin import variance as home
        from rfgp.kernels.sketches import PolynomialSketchKernel, apply_sketch, sample_sketch

    assert variance.sketch_variance is home.sketch_variance
    assert kernels.MaclaurinKernel is MaclaurinKernel
    assert kernels.PolynomialSketchKernel is PolynomialSketchKernel
    assert kernels.apply_sketch is apply_sketch and kernels.sample_sketch is sample_sketch
    assert kernels._srht_numba is importlib.import_module("rfgp.kernels.sketches._srht_numba")


def test_spectral_densities_is_the_matern_nu_table():
    from rfgp.kernels import fourier

    with pytest.warns(DeprecationWarning, match="MATERN_NU"):
        assert fourier.SPECTRAL_DENSITIES is fourier.MATERN_NU
    assert fourier.MATERN_NU["matern32"] == 1.5 and fourier.MATERN_NU["rbf"] is None


def test_renamed_methods_warn_and_agree():
    import torch

    from rfgp.kernels import (
        GaussianSketchKernel,
        HelmholtzKernel,
        MaclaurinKernel,
        SphericalFeatureKernel,
    )

    x = torch.randn(4, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    maclaurin = MaclaurinKernel("exponential", 16, allocation="random", seed=0).double()
    with pytest.warns(DeprecationWarning, match="exact_matrix"):
        old = maclaurin.exact(x, x)
    torch.testing.assert_close(old, maclaurin.exact_matrix(x, x), rtol=0, atol=0)
    with pytest.warns(DeprecationWarning, match="expected_matrix"):
        old = maclaurin.expected_kernel(x, x)
    torch.testing.assert_close(old, maclaurin.expected_matrix(x, x), rtol=0, atol=0)

    sketch = GaussianSketchKernel(8, truncation=2, seed=0).double()
    with pytest.warns(DeprecationWarning, match="expected_matrix"):
        old = sketch.expected_kernel(x, x)
    torch.testing.assert_close(old, sketch.expected_matrix(x, x), rtol=0, atol=0)

    spherical = SphericalFeatureKernel(8, degree=2, seed=0).double()
    with pytest.warns(DeprecationWarning, match="exact_matrix"):
        old = spherical.exact(x, x)
    torch.testing.assert_close(old, spherical.exact_matrix(x, x), rtol=0, atol=0)

    helmholtz = HelmholtzKernel(input_dim=3).double()
    with pytest.warns(DeprecationWarning, match="component_kernel"):
        old = helmholtz.component("curl")(x).to_dense()
    new = helmholtz.component_kernel("curl")(x).to_dense()
    torch.testing.assert_close(old, new, rtol=0, atol=0)


def test_importing_the_package_uses_no_deprecated_rfgp_name():
    # A fresh interpreter: modules already imported by this test session would not re-run.
    import subprocess
    import sys

    code = (
        "import warnings\n"
        "warnings.simplefilter('error', DeprecationWarning)\n"
        "warnings.filterwarnings('ignore', category=DeprecationWarning, module='(?!rfgp)')\n"
        "warnings.filterwarnings('ignore', message='.*torch.jit.*')\n"
        "import rfgp, rfgp.inference, rfgp.kernels, rfgp.classification, rfgp.sklearn\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
