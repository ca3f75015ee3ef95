"""Random-feature kernels (GPyTorch ``Kernel`` subclasses) and the exact kernels they
approximate."""

from rfgp.kernels.base import RandomFeatureKernel, real_form
from rfgp.kernels.fourier import FourierFeatureKernel

__all__ = [
    "RandomFeatureKernel",
    "real_form",
    "FourierFeatureKernel",
]
