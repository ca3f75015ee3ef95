"""Every public kernel in a few modes, for the contract and finite-feature suites."""

from __future__ import annotations

from typing import Any, Callable, Dict

import torch
from gpytorch.kernels import Kernel

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
    RandomFeatureKernel,
    SphericalFeatureKernel,
)

Factory = Callable[..., Kernel]

#: one factory per kernel and mode; ``seed`` is passed to the random-feature kernels.
FEATURE_KERNELS: Dict[str, Factory] = {
    "fourier-iid-rbf": lambda **kw: FourierFeatureKernel(32, **kw),
    "fourier-orthogonal-matern52": lambda **kw: FourierFeatureKernel(
        32, spectral="matern52", sampling="orthogonal", **kw),
    "fourier-structured-matern12": lambda **kw: FourierFeatureKernel(
        32, spectral="matern12", sampling="structured", **kw),
    "fourier-qmc-matern32": lambda **kw: FourierFeatureKernel(
        32, spectral="matern32", sampling="qmc", **kw),
    "sketch-gaussian-real": lambda **kw: PolynomialSketchKernel(
        3, 16, bias=1.0, projection="gaussian", **kw),
    "sketch-rademacher-real": lambda **kw: PolynomialSketchKernel(2, 16, **kw),
    "sketch-tensorsketch-real": lambda **kw: PolynomialSketchKernel(
        2, 16, bias=0.5, projection="tensorsketch", **kw),
    "sketch-tensorsrht-real": lambda **kw: PolynomialSketchKernel(
        3, 16, bias=1.0, projection="tensorsrht", **kw),
    "sketch-gaussian-ctr": lambda **kw: PolynomialSketchKernel.ctr(
        2, 16, bias=1.0, projection="gaussian", **kw),
    "sketch-tensorsketch-complex": lambda **kw: PolynomialSketchKernel(
        2, 8, projection="tensorsketch", complex=True, **kw),
    "sketch-tensorsrht-ctr": lambda **kw: PolynomialSketchKernel.ctr(
        3, 16, bias=1.0, projection="tensorsrht", **kw),
    "maclaurin-random-polynomial": lambda **kw: MaclaurinKernel(
        "polynomial", 16, degree=3, bias=1.0, allocation="random", **kw),
    "maclaurin-random-gaussian-complex": lambda **kw: MaclaurinKernel(
        "gaussian", 16, allocation="random", complex=True, projection="tensorsrht", **kw),
    "maclaurin-optimized-gaussian": lambda **kw: MaclaurinKernel(
        "gaussian", 16, num_samples=20, **kw),
    "maclaurin-optimized-polynomial": lambda **kw: MaclaurinKernel(
        "polynomial", 16, degree=2, bias=1.0, projection="tensorsketch", num_samples=20, **kw),
    "gaussian-sketch-coordinate": lambda **kw: GaussianSketchKernel(16, truncation=4, **kw),
    "gaussian-sketch-degree": lambda **kw: GaussianSketchKernel(
        16, truncation=4, variant="degree", **kw),
    "spherical": lambda **kw: SphericalFeatureKernel(16, degree=2, **kw),
    "decomposable": lambda **kw: DecomposableFeatureKernel(24, num_tasks=2, rank=1, **kw),
    "curl-free-features": lambda **kw: CurlFreeFeatureKernel(24, **kw),
    "div-free-features": lambda **kw: DivFreeFeatureKernel(24, **kw),
    "helmholtz-features": lambda **kw: HelmholtzFeatureKernel(24, **kw),
}

#: exact kernels (no random weights): the parts of the contract that apply to any kernel.
EXACT_KERNELS: Dict[str, Factory] = {
    "dot-product-polynomial": lambda **kw: DotProductKernel("polynomial", degree=2, bias=1.0,
                                                            **kw),
    "dot-product-exponential": lambda **kw: DotProductKernel("exponential", **kw),
    "curl-free": lambda **kw: CurlFreeKernel(**kw),
    "div-free": lambda **kw: DivFreeKernel(**kw),
    "helmholtz": lambda **kw: HelmholtzKernel(**kw),
}

ALL_KERNELS = {**FEATURE_KERNELS, **EXACT_KERNELS}
D = 3  # input dimension of the tests' data (the vector-field kernels need d >= 2)


def data(n: int = 6, dtype: torch.dtype = torch.float32, seed: int = 0, *batch: int):
    return torch.randn(*batch, n, D, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def construct(name: str, seed: int = 0) -> Kernel:
    """The kernel ``name`` straight from its factory (``seed`` for a random-feature kernel), not
    allocated: a fresh module to load another kernel's state into."""
    return ALL_KERNELS[name](**({} if name in EXACT_KERNELS else {"seed": seed}))


def build(name: str, seed: int = 0, **kwargs: Any) -> Kernel:
    """The kernel ``name``, ready to use on ``data()``-like inputs (allocated if needed)."""
    if name in EXACT_KERNELS:
        return EXACT_KERNELS[name](**kwargs)
    kernel = FEATURE_KERNELS[name](seed=seed, **kwargs)
    if getattr(kernel, "needs_allocation", False):
        kernel.allocate(data(20, seed=99), generator=torch.Generator().manual_seed(seed))
    return kernel


def outputs(kernel: Kernel) -> int:
    return kernel.num_outputs_per_input(data(), data())


def evaluate(kernel: Kernel, x: torch.Tensor) -> torch.Tensor:
    """Features for a random-feature kernel, the dense kernel matrix for an exact one."""
    if isinstance(kernel, RandomFeatureKernel):
        return kernel.features(x)
    with torch.no_grad():
        return kernel(x).to_dense()


