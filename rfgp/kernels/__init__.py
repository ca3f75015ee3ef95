"""Random-feature kernels (GPyTorch ``Kernel`` subclasses) and the exact kernels they approximate."""

from rfgp.kernels.base import RandomFeatureKernel, real_form
from rfgp.kernels.exact import CurlFreeKernel, DivFreeKernel, HelmholtzKernel
from rfgp.kernels.fourier import FourierFeatureKernel
from rfgp.kernels.operator import (
    CurlFreeFeatureKernel,
    DecomposableFeatureKernel,
    DivFreeFeatureKernel,
    HelmholtzFeatureKernel,
    helmholtz_components,
)

__all__ = [
    "RandomFeatureKernel",
    "real_form",
    "FourierFeatureKernel",
    "DecomposableFeatureKernel",
    "CurlFreeFeatureKernel",
    "DivFreeFeatureKernel",
    "HelmholtzFeatureKernel",
    "helmholtz_components",
    "CurlFreeKernel",
    "DivFreeKernel",
    "HelmholtzKernel",
]
