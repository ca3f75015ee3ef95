"""Random-feature kernels (GPyTorch ``Kernel`` subclasses) and the exact kernels they
approximate.

The public names are the ones below; the modules behind them (one per family: Fourier,
spherical, Gaussian-sketch, polynomial-sketch, Maclaurin and vector-field features, the exact
dot-product kernels, composition, the kernel contract and its checkpoints) are internal and
say so by their ``_`` prefix.

* The contract: :class:`RandomFeatureKernel`, :func:`real_form`, :func:`unwrap_scale_kernel`.
* Shift-invariant kernels: :class:`FourierFeatureKernel` (with :data:`MATERN_NU`,
  :func:`sample_frequencies`, :func:`cos_sin_features` and the exact
  :func:`stationary_kernel`), :class:`SphericalFeatureKernel` (:func:`spherical_polynomial`,
  :func:`fit_spherical_mixture`), :class:`GaussianSketchKernel` (:func:`choose_truncation`).
* Dot-product kernels: :class:`PolynomialSketchKernel` (:data:`PROJECTIONS`,
  :func:`sample_sketch`, :func:`apply_sketch`), :class:`MaclaurinKernel` (:data:`TARGETS`,
  :data:`ALLOCATIONS`, the degree allocation :func:`allocation_statistics`,
  :func:`optimize_allocation`, :func:`allocation_objective`, :class:`AllocationStatistics`,
  :class:`AllocationResult`, :func:`maclaurin_coefficients`) and
  the exact :class:`DotProductKernel`.
* Vector fields: :class:`DecomposableFeatureKernel`, :class:`CurlFreeFeatureKernel`,
  :class:`DivFreeFeatureKernel`, :class:`HelmholtzFeatureKernel` (:data:`DIV_FREE_FACTORS`,
  :func:`div_free_factor`, :func:`div_free_factor_rank`, :func:`operator_features`) and the
  exact :class:`CurlFreeKernel`, :class:`DivFreeKernel`, :class:`HelmholtzKernel`.
* Sums and products: :func:`as_feature_kernel`, :class:`ComposedFeatureKernel`,
  :func:`product_variance`.
"""

from rfgp.kernels._base import RandomFeatureKernel, real_form, unwrap_scale_kernel
from rfgp.kernels._composition import ComposedFeatureKernel, as_feature_kernel
from rfgp.kernels._dot_product import DotProductKernel
from rfgp.kernels._fourier import (
    MATERN_NU,
    FourierFeatureKernel,
    cos_sin_features,
    sample_frequencies,
    stationary_kernel,
)
from rfgp.kernels._gaussian_sketch import GaussianSketchKernel, choose_truncation
from rfgp.kernels._maclaurin import (
    ALLOCATIONS,
    TARGETS,
    AllocationResult,
    AllocationStatistics,
    MaclaurinKernel,
    allocation_objective,
    allocation_statistics,
    maclaurin_coefficients,
    optimize_allocation,
)
from rfgp.kernels._product_variance import product_variance
from rfgp.kernels._sketches import (
    PROJECTIONS,
    PolynomialSketchKernel,
    apply_sketch,
    sample_sketch,
)
from rfgp.kernels._spherical import (
    SphericalFeatureKernel,
    fit_spherical_mixture,
    spherical_polynomial,
)
from rfgp.kernels._vector_field import (
    DIV_FREE_FACTORS,
    CurlFreeFeatureKernel,
    CurlFreeKernel,
    DecomposableFeatureKernel,
    DivFreeFeatureKernel,
    DivFreeKernel,
    HelmholtzFeatureKernel,
    HelmholtzKernel,
    div_free_factor,
    div_free_factor_rank,
    operator_features,
)

__all__ = [
    "RandomFeatureKernel",
    "real_form",
    "unwrap_scale_kernel",
    "ComposedFeatureKernel",
    "as_feature_kernel",
    "product_variance",
    "FourierFeatureKernel",
    "MATERN_NU",
    "sample_frequencies",
    "cos_sin_features",
    "stationary_kernel",
    "SphericalFeatureKernel",
    "spherical_polynomial",
    "fit_spherical_mixture",
    "GaussianSketchKernel",
    "choose_truncation",
    "PolynomialSketchKernel",
    "PROJECTIONS",
    "sample_sketch",
    "apply_sketch",
    "MaclaurinKernel",
    "TARGETS",
    "ALLOCATIONS",
    "AllocationStatistics",
    "AllocationResult",
    "allocation_statistics",
    "allocation_objective",
    "optimize_allocation",
    "maclaurin_coefficients",
    "DotProductKernel",
    "DecomposableFeatureKernel",
    "CurlFreeFeatureKernel",
    "DivFreeFeatureKernel",
    "HelmholtzFeatureKernel",
    "DIV_FREE_FACTORS",
    "div_free_factor",
    "div_free_factor_rank",
    "operator_features",
    "CurlFreeKernel",
    "DivFreeKernel",
    "HelmholtzKernel",
]
