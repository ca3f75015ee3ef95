"""The package's names live in one place each: no old path or method name resolves, and the
public paths import without a warning."""

import importlib
import pkgutil
import subprocess
import sys

import pytest

import rfgp
from rfgp import kernels

REMOVED_MODULES = [
    "rfgp.allocation",
    "rfgp.kernels.exact",
    "rfgp.kernels.operator",
    "rfgp.inference.dirichlet",
]


@pytest.mark.parametrize("module", REMOVED_MODULES)
def test_removed_modules_are_not_in_the_package(module):
    # Listed from the package's own folders (an import could be answered by another checkout's
    # editable-install finder).
    parent, _, name = module.rpartition(".")
    present = {info.name for info in pkgutil.iter_modules(importlib.import_module(parent).__path__)}
    assert name not in present


REMOVED_NAMES = [
    (rfgp, "allocation"),
    (rfgp, "ops"),
    (kernels, "helmholtz_components"),
    (kernels, "_srht_numba"),
    (kernels._fourier, "SPECTRAL_DENSITIES"),
    *[(rfgp.inference, name) for name in (
        "ALPHA_GRID", "DirichletExactGP", "DirichletGPClassifier", "softmax_expectation",
        "DirichletLikelihood", "dirichlet_transform", "validate_labels",
    )],
]


@pytest.mark.parametrize("module, name", REMOVED_NAMES,
                         ids=[f"{m.__name__}.{n}" for m, n in REMOVED_NAMES])
def test_removed_names_raise_attribute_error(module, name):
    with pytest.raises(AttributeError, match=name):
        getattr(module, name)


@pytest.mark.parametrize("cls, old", [
    (kernels.MaclaurinKernel, "exact"),
    (kernels.MaclaurinKernel, "expected_kernel"),
    (kernels.GaussianSketchKernel, "expected_kernel"),
    (kernels.SphericalFeatureKernel, "exact"),
    (kernels.HelmholtzKernel, "component"),
])
def test_renamed_methods_have_one_name(cls, old):
    assert not hasattr(cls, old)


def test_current_homes():
    from rfgp.classification import DirichletGPClassifier, softmax_expectation
    from rfgp.inference import helmholtz_components
    from rfgp.kernels import MATERN_NU, optimize_allocation
    from rfgp.likelihoods import DirichletLikelihood

    assert rfgp.DirichletGPClassifier is DirichletGPClassifier
    assert rfgp.helmholtz_components is helmholtz_components
    assert callable(softmax_expectation) and callable(optimize_allocation)
    assert MATERN_NU["matern32"] == 1.5 and MATERN_NU["rbf"] is None
    assert issubclass(DirichletLikelihood, object)


def test_importing_the_package_emits_no_rfgp_warning():
    # A fresh interpreter: modules already imported by this test session would not re-run.
    code = (
        "import warnings\n"
        "warnings.simplefilter('error')\n"
        "warnings.filterwarnings('ignore', module='(?!rfgp)')\n"
        "warnings.filterwarnings('ignore', message='.*torch.jit.*')\n"
        "import rfgp, rfgp.inference, rfgp.kernels, rfgp.classification, rfgp.sklearn\n"
        "import rfgp.botorch, rfgp.bayesopt, rfgp.variance, rfgp.metrics, rfgp.likelihoods\n"
        "import rfgp.datasets, rfgp.recipes, rfgp.demo\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
