r"""Inference for vector fields: the curl-free and divergence-free parts of a Helmholtz GP."""

from __future__ import annotations

from typing import Any, Dict

import torch
from gpytorch.kernels import ScaleKernel
from torch import Tensor

from rfgp.kernels._vector_field.features import HELMHOLTZ_COMPONENTS, HelmholtzFeatureKernel

__all__ = ["helmholtz_components"]


def helmholtz_components(gp: Any, x: Tensor) -> Dict[str, Any]:
    r"""Posteriors of the curl-free and the divergence-free parts of a fitted Helmholtz GP.

    The fitted weights ``w`` are shared by the two blocks of the Helmholtz features, so the
    posterior of each part is the posterior of :math:`\Phi_{part}(x)^\top w`, evaluated with
    :meth:`~rfgp.kernels.HelmholtzFeatureKernel.component_features` and
    ``gp.posterior_from_features``. The two parts sum to the full latent field (means add
    exactly; covariances add up to the cross-covariance between the parts).

    Args:
        gp: a fitted ``rfgp.RandomFeatureGP`` whose kernel is a
            :class:`~rfgp.kernels.HelmholtzFeatureKernel` (optionally inside a ``ScaleKernel``).
        x: ``(N, d)`` inputs.

    Returns:
        ``{"curl": posterior, "div": posterior}``, each a ``MultitaskMultivariateNormal``
        over the ``(N, d)`` field.

    Example:
        >>> from rfgp import RandomFeatureGP
        >>> x = torch.rand(30, 2, dtype=torch.float64)
        >>> y = torch.stack([x[:, 1], -x[:, 0]], -1)            # a rotation: div-free
        >>> k = HelmholtzFeatureKernel(80, input_dim=2, seed=0).double()
        >>> gp = RandomFeatureGP(k, noise=0.01).fit(x, y)
        >>> parts = helmholtz_components(gp, x[:4])
        >>> total = parts["curl"].mean + parts["div"].mean
        >>> parts["div"].mean.shape, torch.allclose(total, gp.predict(x[:4]))
        (torch.Size([4, 2]), True)
    """
    kernel = getattr(gp, "kernel", None)
    if isinstance(kernel, ScaleKernel):
        kernel = kernel.base_kernel  # posterior_from_features applies the outputscale
    if not isinstance(kernel, HelmholtzFeatureKernel):
        raise TypeError(
            "gp.kernel must be a HelmholtzFeatureKernel (optionally in a ScaleKernel), got "
            f"{type(kernel).__name__}"
        )
    with torch.no_grad():
        return {part: gp.posterior_from_features(kernel.component_features(x, part))
                for part in HELMHOLTZ_COMPONENTS}
