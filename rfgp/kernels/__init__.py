"""Random-feature kernels (GPyTorch ``Kernel`` subclasses) and the exact kernels they
approximate.

One family per module or subpackage: :mod:`~rfgp.kernels.fourier`,
:mod:`~rfgp.kernels.spherical`, :mod:`~rfgp.kernels.gaussian_sketch`,
:mod:`~rfgp.kernels.sketches` (polynomial sketches), :mod:`~rfgp.kernels.maclaurin`,
:mod:`~rfgp.kernels.vector_field`, and the exact :mod:`~rfgp.kernels.dot_product` kernels;
:mod:`~rfgp.kernels.composition` turns sums and products of them into one feature map.
"""

from rfgp.kernels.base import RandomFeatureKernel, real_form, unwrap_scale_kernel
from rfgp.kernels.composition import ComposedFeatureKernel, as_feature_kernel
from rfgp.kernels.dot_product import DotProductKernel
from rfgp.kernels.fourier import FourierFeatureKernel
from rfgp.kernels.gaussian_sketch import GaussianSketchKernel
from rfgp.kernels.maclaurin import MaclaurinKernel
from rfgp.kernels.sketches import (
    PolynomialSketchKernel,
    apply_sketch,
    sample_sketch,
)
from rfgp.kernels.spherical import SphericalFeatureKernel
from rfgp.kernels.vector_field import (
    CurlFreeFeatureKernel,
    CurlFreeKernel,
    DecomposableFeatureKernel,
    DivFreeFeatureKernel,
    DivFreeKernel,
    HelmholtzFeatureKernel,
    HelmholtzKernel,
)

__all__ = [
    "RandomFeatureKernel",
    "real_form",
    "unwrap_scale_kernel",
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
    "DotProductKernel",
    "CurlFreeKernel",
    "DivFreeKernel",
    "HelmholtzKernel",
]
