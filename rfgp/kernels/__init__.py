"""Random-feature kernels (GPyTorch ``Kernel`` subclasses) and the exact kernels they approximate."""

from rfgp.kernels.base import RandomFeatureKernel, real_form
from rfgp.kernels.exact import DotProductKernel
from rfgp.kernels.fourier import FourierFeatureKernel
from rfgp.kernels.sketches import PolynomialSketchKernel, apply_sketch, sample_sketch

__all__ = [
    "RandomFeatureKernel",
    "real_form",
    "FourierFeatureKernel",
    "PolynomialSketchKernel",
    "sample_sketch",
    "apply_sketch",
    "DotProductKernel",
]
