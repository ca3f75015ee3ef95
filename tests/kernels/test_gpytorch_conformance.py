"""Every public kernel run through GPyTorch's own kernel test suite.

GPyTorch tests its kernels with :class:`gpytorch.test.base_kernel_test_case.BaseKernelTestCase`:
batch kernels against batched and unbatched data, ``kernel[i]`` and ``kernel[idx1, idx2]`` batch
indexing (with broadcast index tensors, after ``expand_batch``), ``active_dims``, ARD,
pickling and dtype casts. One subclass below per kernel and mode. Random-feature kernels are
seeded: two kernels built with the same seed hold the same weights, so every comparison in the
suite is between two evaluations of the same random function (the suite's tolerances then only
absorb float32 round-off).

Where a test of the suite cannot apply as written, the subclass overrides it with an equivalent
check and says why.
"""

from __future__ import annotations

import unittest
from typing import Any, Callable, Dict

import torch
from gpytorch.kernels import Kernel
from gpytorch.test.base_kernel_test_case import BaseKernelTestCase

from rfgp.kernels import (
    CurlFreeFeatureKernel,
    CurlFreeKernel,
    DecomposableFeatureKernel,
    DivFreeFeatureKernel,
    DivFreeKernel,
    DotProductKernel,
    FourierFeatureKernel,
    GaussianSketchKernel,
    HelmholtzFeatureKernel,
    HelmholtzKernel,
    MaclaurinKernel,
    PolynomialSketchKernel,
    SphericalFeatureKernel,
)

Factory = Callable[..., Kernel]


class _Conformance(BaseKernelTestCase):
    """GPyTorch's suite with the kernel built by ``factory(**kwargs)``."""

    seed = 0
    factory: Factory

    def create_kernel_no_ard(self, **kwargs: Any) -> Kernel:
        return type(self).factory(**kwargs)

    def create_kernel_ard(self, num_dims: int, **kwargs: Any) -> Kernel:
        return type(self).factory(ard_num_dims=num_dims, **kwargs)


# ---------------------------------------------------------------------------- scalar kernels
_SCALAR: Dict[str, Factory] = {}

for _sampling in ("iid", "orthogonal", "structured"):
    for _spectral in ("rbf", "matern32"):
        _SCALAR[f"Fourier_{_sampling}_{_spectral}"] = (
            lambda sampling=_sampling, spectral=_spectral, **kw: FourierFeatureKernel(
                128, spectral=spectral, sampling=sampling, seed=0, **kw
            )
        )

for _projection in ("gaussian", "rademacher", "tensorsketch", "tensorsrht"):
    _SCALAR[f"PolynomialSketch_{_projection}_real"] = (
        lambda projection=_projection, **kw: PolynomialSketchKernel(
            3, 128, bias=1.0, projection=projection, seed=0, **kw
        )
    )
    # CtR: complex weights, and GPyTorch sees the real form [Re Phi, Im Phi] of 128 columns
    _SCALAR[f"PolynomialSketch_{_projection}_ctr"] = (
        lambda projection=_projection, **kw: PolynomialSketchKernel.ctr(
            2, 128, bias=0.5, projection=projection, seed=0, **kw
        )
    )
_SCALAR["PolynomialSketch_gaussian_complex"] = lambda **kw: PolynomialSketchKernel(
    3, 64, bias=1.0, projection="gaussian", complex=True, seed=0, **kw
)
_SCALAR["PolynomialSketch_rademacher_homogeneous"] = lambda **kw: PolynomialSketchKernel(
    2, 64, projection="rademacher", seed=0, **kw
)

_SCALAR["MaclaurinRandom_polynomial_rademacher"] = lambda **kw: MaclaurinKernel(
    "polynomial", 96, degree=3, bias=1.0, allocation="random", seed=0, **kw
)
_SCALAR["MaclaurinRandom_gaussian_tensorsrht"] = lambda **kw: MaclaurinKernel(
    "gaussian", 96, projection="tensorsrht", allocation="random", seed=0, **kw
)
_SCALAR["MaclaurinRandom_exponential_ctr"] = lambda **kw: MaclaurinKernel(
    "exponential", 64, projection="gaussian", complex=True, allocation="random", seed=0, **kw
)
_SCALAR["GaussianSketch_coordinate"] = lambda **kw: GaussianSketchKernel(
    128, truncation=6, variant="coordinate", seed=0, **kw
)
_SCALAR["GaussianSketch_degree"] = lambda **kw: GaussianSketchKernel(
    128, truncation=6, variant="degree", seed=0, **kw
)
for _sampling in ("iid", "orthogonal"):
    _SCALAR[f"SphericalFeature_{_sampling}"] = (
        lambda sampling=_sampling, **kw: SphericalFeatureKernel(
            128, degree=3, sampling=sampling, seed=0, **kw
        )
    )
_SCALAR["DotProduct_polynomial"] = lambda **kw: DotProductKernel("polynomial", degree=3, bias=1.0,
                                                                 **kw)
_SCALAR["DotProduct_exponential"] = lambda **kw: DotProductKernel("exponential", **kw)

# ---------------------------------------------------------------------------- multi-output
# The suite's inputs have d = 2 (batched data), 10 (unbatched), 4 and 6 (active_dims). The
# vector-field kernels map R^d to R^d, so D must be a multiple of the columns per frequency
# in each of these d: 2 (curl), 2 p' with p' = 1, d - 1 (div), 2 (1 + p') (Helmholtz); 360 is.
_VECTOR: Dict[str, Factory] = {
    "DecomposableFeature": lambda **kw: DecomposableFeatureKernel(
        120, num_tasks=3, rank=1, seed=0, **kw
    ),
    "CurlFreeFeature_iid": lambda **kw: CurlFreeFeatureKernel(360, seed=0, **kw),
    "CurlFreeFeature_orthogonal": lambda **kw: CurlFreeFeatureKernel(
        360, sampling="orthogonal", seed=0, **kw
    ),
    "DivFreeFeature": lambda **kw: DivFreeFeatureKernel(360, seed=0, **kw),
    "DivFreeFeature_projection": lambda **kw: DivFreeFeatureKernel(
        360, factor="projection", sampling="orthogonal", seed=0, **kw
    ),
    "HelmholtzFeature": lambda **kw: HelmholtzFeatureKernel(360, seed=0, **kw),
    "CurlFree": lambda **kw: CurlFreeKernel(**kw),
    "DivFree": lambda **kw: DivFreeKernel(**kw),
    "Helmholtz": lambda **kw: HelmholtzKernel(**kw),
}


def _register(name: str, factory: Factory, *bases: type) -> None:
    cls_name = "Test" + "".join(part[:1].upper() + part[1:] for part in name.split("_"))
    cls = type(cls_name, (*bases, _Conformance, unittest.TestCase),
               {"factory": staticmethod(factory), "__module__": __name__})
    globals()[cls_name] = cls


for _name, _factory in {**_SCALAR, **_VECTOR}.items():
    _register(_name, _factory)


# ---------------------------------------------------------------------------- overrides
class _AllocatedOnFirstData:
    """Optimised Maclaurin kernels are allocated on training inputs before any feature.

    The suite builds a kernel and calls it on data whose dimension the kernel cannot know in
    advance. Here the kernel is allocated on a fixed sample of the suite's batched input
    dimension (2; ``len(active_dims)`` with ``active_dims``); the active-dims tests, whose
    unbatched data have other dimensions, allocate both kernels on the test's own data instead
    (the same inputs after ``active_dims``, the same generator, hence the same allocation).
    """

    def create_kernel_no_ard(self, **kwargs: Any) -> Kernel:
        kernel = type(self).factory(**kwargs)
        dims = kwargs.get("active_dims")
        d = 2 if dims is None else len(dims)
        x = torch.randn(40, d, generator=torch.Generator().manual_seed(1))
        if dims is not None:
            x = torch.zeros(40, max(dims) + 1).index_copy(-1, torch.as_tensor(dims), x)
        return kernel.allocate(x, generator=torch.Generator().manual_seed(2))

    def create_kernel_ard(self, num_dims: int, **kwargs: Any) -> Kernel:
        return self.create_kernel_no_ard(ard_num_dims=num_dims, **kwargs)

    def _check_active_dims(self, active_dims) -> None:
        x = self.create_data_no_batch()
        kernel = type(self).factory(active_dims=active_dims)
        kernel.allocate(x, generator=torch.Generator().manual_seed(2))
        basic = type(self).factory()
        basic.allocate(x[:, active_dims], generator=torch.Generator().manual_seed(2))
        self.assertEqual(kernel.degree_counts, basic.degree_counts)
        self.assertAllClose(kernel(x).to_dense(), basic(x[:, active_dims]).to_dense(),
                            rtol=1e-3, atol=1e-5)

    def test_active_dims_list(self):
        self._check_active_dims([0, 2, 4, 6])

    def test_active_dims_range(self):
        self._check_active_dims(list(range(3, 9)))


_register(
    "MaclaurinOptimized_polynomial_gaussian",
    lambda **kw: MaclaurinKernel("polynomial", 96, degree=3, bias=1.0, projection="gaussian",
                                 seed=0, num_samples=40, **kw),
    _AllocatedOnFirstData,
)
_register(
    "MaclaurinOptimized_gaussian_rademacher",
    lambda **kw: MaclaurinKernel("gaussian", 96, projection="rademacher", seed=0,
                                 num_samples=40, **kw),
    _AllocatedOnFirstData,
)
