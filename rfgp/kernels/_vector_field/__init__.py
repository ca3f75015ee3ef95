r"""Operator-valued random Fourier features (ORFF) for vector-valued GPs.

A shift-invariant matrix-valued kernel :math:`K(x, z) = K_0(x - z) \in \mathbb{R}^{p\times p}`
has the operator-valued Bochner form :math:`K_0(\delta) = \mathbb{E}_{\omega\sim\mu}
[\cos(\omega^\top\delta) A(\omega)]` with :math:`A(\omega) = B(\omega)B(\omega)^\top \succeq 0`
even in :math:`\omega`. With :math:`M` frequencies :math:`\omega_j \sim \mu` the real feature map

.. math::
    \Phi(x) = M^{-1/2}\big[\cos(\omega_j^\top x) B(\omega_j)^\top,\
                           \sin(\omega_j^\top x) B(\omega_j)^\top\big]_{j=1..M}
    \in \mathbb{R}^{2Mp' \times p}

gives :math:`\hat K(x, z) = \Phi(x)^\top\Phi(z) = M^{-1}\sum_j \cos(\omega_j^\top(x - z))
A(\omega_j)`. Here ``features(x)`` returns :math:`\Phi(x)^\top` for each input, shape
``(..., N, p, D)`` with ``D = 2 M p'`` columns; the GPyTorch covariance is ``(N p) x (N p)`` in
the interleaved order (row ``n p + t``).

=================  ===========================  ========================  =====
kernel             :math:`A(\omega)`            :math:`B(\omega)`          p'
=================  ===========================  ========================  =====
decomposable       :math:`A` (learnable)        constant factor of A      rank
curl-free          :math:`\omega\omega^\top`     :math:`\omega`            1
div-free           :math:`\|\omega\|^2 I -      closed forms, see          1, 3,
                   \omega\omega^\top`           :func:`div_free_factor`   d-1, d
=================  ===========================  ========================  =====

Every posterior mean and prior sample built from the curl-free (div-free) features is exactly
curl-free (div-free), whatever the number of features: each column is the gradient of
:math:`\cos/\sin(\omega^\top x)`, or a vector orthogonal to :math:`\omega` times such a function.

References:
    Brault, d'Alché-Buc, Heinonen, *Random Fourier Features for Operator-Valued Kernels*,
    ACML 2016.
"""

from rfgp.kernels._vector_field.decomposable import DecomposableFeatureKernel
from rfgp.kernels._vector_field.exact import CurlFreeKernel, DivFreeKernel, HelmholtzKernel
from rfgp.kernels._vector_field.factors import (
    DIV_FREE_FACTORS,
    div_free_factor,
    div_free_factor_rank,
    operator_features,
)
from rfgp.kernels._vector_field.features import (
    CurlFreeFeatureKernel,
    DivFreeFeatureKernel,
    HelmholtzFeatureKernel,
)

__all__ = [
    "DecomposableFeatureKernel",
    "CurlFreeFeatureKernel",
    "DivFreeFeatureKernel",
    "HelmholtzFeatureKernel",
    "CurlFreeKernel",
    "DivFreeKernel",
    "HelmholtzKernel",
    "DIV_FREE_FACTORS",
    "div_free_factor",
    "div_free_factor_rank",
    "operator_features",
]
