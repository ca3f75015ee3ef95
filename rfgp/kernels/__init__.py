"""Random-feature kernels (GPyTorch ``Kernel`` subclasses) and the exact kernels they
approximate."""

from rfgp.kernels.base import RandomFeatureKernel, real_form
from rfgp.kernels.composition import ComposedFeatureKernel, as_feature_kernel
from rfgp.kernels.exact import CurlFreeKernel, DivFreeKernel, DotProductKernel, HelmholtzKernel
from rfgp.kernels.fourier import FourierFeatureKernel
from rfgp.kernels.gaussian_sketch import GaussianSketchKernel
from rfgp.kernels.maclaurin import MaclaurinKernel
from rfgp.kernels.operator import (
    CurlFreeFeatureKernel,
    DecomposableFeatureKernel,
    DivFreeFeatureKernel,
    HelmholtzFeatureKernel,
    helmholtz_components,
)
from rfgp.kernels.sketches import PolynomialSketchKernel, apply_sketch, sample_sketch
from rfgp.kernels.spherical import SphericalFeatureKernel

__all__ = [
    "RandomFeatureKernel",
    "real_form",
    "ComposedFeatureKernel",
    "as_feature_kernel",
    "FourierFeatureKernel",
    "PolynomialSketchKernel",
    "sample_sketch",
    "apply_sketch",
    "MaclaurinKernel",
    "SphericalFeatureKernel",
    "GaussianSketchKernel",
    "DecomposableFeatureKernel",
    "CurlFreeFeatureKernel",
    "DivFreeFeatureKernel",
    "HelmholtzFeatureKernel",
    "helmholtz_components",
    "DotProductKernel",
    "CurlFreeKernel",
    "DivFreeKernel",
    "HelmholtzKernel",
]
