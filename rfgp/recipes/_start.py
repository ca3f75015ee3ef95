r"""The search's kernel and model: an ARD random Fourier feature kernel with orthogonal
frequencies, which lower the kernel's approximation error at no extra cost, at the start
(:func:`rfgp._initial.initial_hyperparameters`, from the data).
"""

from __future__ import annotations

from typing import Dict, Optional

import torch
from gpytorch.kernels import ScaleKernel
from torch import Tensor

from rfgp.inference import RandomFeatureGP
from rfgp.kernels._fourier import FourierFeatureKernel

__all__ = ["make_ard_kernel", "search_model", "set_hyperparameters"]


def make_ard_kernel(
    num_features: int,
    input_dim: int,
    spectral: str = "rbf",
    seed: Optional[int] = None,
    dtype: torch.dtype = torch.float64,
) -> ScaleKernel:
    """``ScaleKernel(FourierFeatureKernel(..., sampling="orthogonal", ard_num_dims=input_dim))``.

    Orthogonal frequencies (ORF) lower the kernel's approximation error at no extra cost.

    Example:
        >>> k = make_ard_kernel(64, 3, "matern52", seed=0)
        >>> tuple(k.base_kernel.lengthscale.shape), k.base_kernel.spectral
        ((1, 3), 'matern52')
    """
    base = FourierFeatureKernel(
        num_features, spectral=spectral, sampling="orthogonal", input_dim=input_dim,
        ard_num_dims=input_dim, seed=seed,
    )
    return ScaleKernel(base).to(dtype)


def set_hyperparameters(kernel: ScaleKernel, lengthscale: Tensor, outputscale: Tensor) -> None:
    """Set a ``ScaleKernel``'s ARD lengthscales ``(d,)`` and outputscale (0-d), detached."""
    kernel.base_kernel.lengthscale = lengthscale.detach().reshape(1, -1)
    kernel.outputscale = outputscale.detach()


def search_model(num_features: int, start: Dict[str, Tensor], spectral: str, seed: int,
                 like: Tensor) -> RandomFeatureGP:
    """A :class:`~rfgp.RandomFeatureGP` with the search's kernel (:func:`make_ard_kernel`,
    ``num_features`` features from ``seed``) at the hyperparameters ``start``
    (``lengthscale``, ``outputscale``, ``noise``), in ``like``'s dtype and device."""
    kernel = make_ard_kernel(num_features, start["lengthscale"].numel(), spectral, seed=seed,
                             dtype=like.dtype).to(like.device)
    set_hyperparameters(kernel, start["lengthscale"], start["outputscale"])
    return RandomFeatureGP(kernel, noise=start["noise"])
