r"""Spherical random features (SRF) for polynomial kernels on the unit sphere.

On unit vectors, :math:`x^\top y = 1 - \|x - y\|^2 / 2`, so the polynomial kernel

.. math::
    k(x, y) = \Big(1 - \frac{2}{a^2} + \frac{2}{a^2} x^\top y\Big)^p
            = \Big(1 - \frac{\|x - y\|^2}{a^2}\Big)^p =: K(\|x - y\|), \qquad a \ge 2,

is a radial function of the distance :math:`z = \|x - y\| \in [0, 2]`. Pennington et al. replace
it by a positive definite radial kernel whose spectral density is a mixture of Gaussians fitted
to :math:`K` on :math:`[0, 2]`, and sample random Fourier features from that density. That
kernel is positive definite on all of :math:`\mathbb{R}^d`, so it takes a GPyTorch lengthscale
(one, or one per input with ``ard_num_dims``) like any stationary kernel: the inputs are
divided by it before the features.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Optional

import numpy as np
import torch
from scipy.optimize import nnls
from torch import Tensor

from rfgp._ops import generator_device
from rfgp._validation import check_choice, check_int, check_real
from rfgp.kernels._base import RandomFeatureKernel
from rfgp.kernels._fourier import cos_sin_features, sample_frequencies

__all__ = ["SphericalFeatureKernel", "spherical_polynomial", "fit_spherical_mixture"]


def spherical_polynomial(x1: Tensor, x2: Tensor, degree: int, a: float = 2.0) -> Tensor:
    r"""The kernel :math:`(1 - \|x - y\|^2 / a^2)^p` (the polynomial kernel on the sphere).

    For unit-norm rows this equals :math:`(x^\top y / \ell^2 + b)^p` with
    :math:`\ell = a / \sqrt{2}` and :math:`b = 1 - 2 / a^2`.

    Args:
        x1: ``(N, d)``; x2: ``(M, d)``.
        degree: ``p``; a: the scale ``a >= 2``.

    Returns:
        ``(N, M)`` kernel matrix.

    Example:
        >>> x = torch.eye(2, dtype=torch.float64)
        >>> spherical_polynomial(x, x, 2, a=2.0)
        tensor([[1.0000, 0.2500],
                [0.2500, 1.0000]], dtype=torch.float64)
    """
    sq = torch.cdist(x1, x2, compute_mode="donot_use_mm_for_euclid_dist").pow(2)
    return (1.0 - sq / a**2).pow(degree)


def fit_spherical_mixture(
    degree: int, a: float = 2.0, num_components: int = 48, num_points: int = 512
) -> tuple[Tensor, Tensor, float]:
    r"""Fit :math:`\sum_i c_i e^{-s_i^2 z^2 / 2} \approx (1 - z^2/a^2)^p` on :math:`z \in [0, 2]`.

    Non-negative least squares over a log-spaced grid of scales :math:`s_i` around the kernel's
    own scale :math:`\sqrt{2p}/a`, with the value at ``z = 0`` weighted 100 times.
    Non-negative weights make the fitted kernel positive definite in every dimension (its
    spectral density is :math:`\sum_i c_i N(0, s_i^2 I)`), which is why
    this module uses them instead of Pennington et al.'s signed fit clipped at zero.

    Args:
        degree: ``p``, the exponent of the target kernel.
        a: the kernel's scale ``a`` (``a > 0``; the target vanishes for ``z >= a``).
        num_components: number ``C`` of candidate Gaussian scales on the log-spaced grid.
        num_points: number of grid points of ``z`` in ``[0, 2]`` (the distances between unit
            vectors).

    Returns:
        ``(scales, weights, max_abs_error)``: ``(C,)`` float64 tensors (components with zero
        weight dropped) and the largest fit error on the grid.

    Example:
        >>> s, c, err = fit_spherical_mixture(7)
        >>> err < 0.05 and abs(float(c.sum()) - 1.0) < 1e-3
        True

    References:
        Pennington, Yu, Kumar, *Spherical Random Features for Polynomial Kernels*, NIPS 2015.
    """
    base = math.sqrt(2.0 * degree) / a
    scales = base * np.logspace(-1.5, 1.5, num_components)
    z = np.linspace(0.0, 2.0, num_points)
    target = np.clip(1.0 - z**2 / a**2, 0.0, None) ** degree
    design = np.exp(-0.5 * (z[:, None] * scales[None, :]) ** 2)
    # A heavily weighted row at z = 0 pins k(x, x) = sum_i c_i to 1: clustered data (all
    # distances small) see almost only that value.
    anchor = 100.0
    weights, _ = nnls(np.vstack([design, anchor * design[:1]]),
                      np.concatenate([target, anchor * target[:1]]))
    keep = weights > 0
    error = float(np.abs(design @ weights - target).max())
    return (torch.from_numpy(scales[keep].copy()), torch.from_numpy(weights[keep].copy()), error)


class SphericalFeatureKernel(RandomFeatureKernel):
    r"""Spherical random features for the polynomial kernel on the unit sphere.

    Approximates :math:`k(x, y) = (1 - \|x - y\|^2 / a^2)^p` (for unit-norm inputs the
    polynomial kernel :math:`(1 - 2/a^2 + (2/a^2) x^\top y)^p`, i.e. :func:`DotProductKernel`
    with lengthscale :math:`a/\sqrt2` and bias :math:`1 - 2/a^2`) by random Fourier features of
    the positive definite kernel :math:`\tilde K(z) = \sum_i c_i e^{-s_i^2 z^2/2}` fitted to it
    (:func:`fit_spherical_mixture`), taken at the inputs divided by the lengthscale
    :math:`\ell` (a scalar, or ``d`` values with ``ard_num_dims=d``):

    .. math::
        \Phi(x) = \sqrt{C / M}\,[\cos(\omega_j^\top (x / \ell)),
            \sin(\omega_j^\top (x / \ell))]_{j=1}^{M},
        \quad \omega_j = s_{i_j} g_j,\ i_j \sim c / C,\ C = \textstyle\sum_i c_i,

    so that :math:`\Phi(x)^\top \Phi(y)` estimates :math:`\tilde K(\|(x - y) / \ell\|)`,
    with :math:`M = D/2`. The lengthscale starts at 1, where the features estimate the kernel
    above; a scalar :math:`\ell` on unit-norm inputs gives the polynomial kernel of scale
    :math:`a \ell` wherever :math:`\|x - y\| / \ell \le 2` (the range the mixture is fitted
    on), so ``a`` fixes the fit and :math:`\ell` is the scale to learn.

    Directions :math:`g_j`: ``"iid"`` standard normal, or
    ``"orthogonal"`` rows of Haar-orthogonal ``d x d`` blocks scaled by independent
    :math:`\chi_d` norms (SRF-Orth with unstructured orthogonal blocks; every row is marginally
    exact). Inputs must be unit-normalised by the caller (as in the paper, optionally after
    centring); on other inputs the features approximate :math:`\tilde K(\|(x - y) / \ell\|)`,
    not the polynomial kernel. The fit is not exact: :attr:`fit_error` is the largest absolute
    error of :math:`\tilde K` on :math:`[0, 2]`, a bias that more features do not remove.

    Args:
        num_features: ``D`` (even).
        degree: ``p``.
        a: scale ``a >= 2`` (the paper's experiments use ``a = 2``).
        sampling: ``"iid"`` or ``"orthogonal"``.
        input_dim, seed, **kwargs: as for every :class:`RandomFeatureKernel` (``ard_num_dims``,
            ``lengthscale_prior``, ``lengthscale_constraint``, ``batch_shape``, ...).

    Attributes:
        lengthscale: ``(*batch_shape, 1, ard_num_dims or 1)`` positive parameter, initially 1.
        mixture_scales, mixture_weights: ``(C,)`` the fitted spectral mixture.
        fit_error (float): sup-norm error of the fit on ``[0, 2]``.

    Example:
        >>> k = SphericalFeatureKernel(512, degree=3, seed=0)
        >>> x = torch.nn.functional.normalize(torch.randn(5, 4, dtype=torch.float64), dim=-1)
        >>> err = (k.features(x) @ k.features(x).T - spherical_polynomial(x, x, 3)).abs().max()
        >>> bool(err < 0.3)
        True

    References:
        Pennington, Yu, Kumar, *Spherical Random Features for Polynomial Kernels*, NIPS 2015.
    """

    has_lengthscale = True

    def __init__(
        self,
        num_features: int,
        degree: int,
        a: float = 2.0,
        sampling: str = "iid",
        input_dim: Optional[int] = None,
        seed: Optional[int] = None,
        **kwargs: Any,
    ) -> None:
        if check_int("num_features", num_features, minimum=None) < 2 or num_features % 2:
            raise ValueError(
                f"num_features must be an even integer >= 2 (cos and sin), got {num_features!r}"
            )
        degree = check_int("degree", degree)
        a = check_real("a", a, low=2.0)
        check_choice("sampling", sampling, ("iid", "orthogonal"))
        super().__init__(num_features=num_features, input_dim=input_dim, seed=seed, **kwargs)
        # 1, not GPyTorch's softplus(0): the unit sphere and a already set the kernel's scale.
        self.lengthscale = 1.0
        self.degree = degree
        self.a = float(a)
        self.sampling = sampling
        scales, weights, error = fit_spherical_mixture(degree, self.a)
        self.register_buffer("mixture_scales", scales)
        self.register_buffer("mixture_weights", weights)
        self.fit_error = error

    @property
    def num_frequencies(self) -> int:
        return self.num_features // 2

    def _sample_weights(self, input_dim: int, generator) -> Dict[str, Tensor]:
        m = self.num_frequencies
        shape = (*self.batch_shape, m)
        # Component of each frequency by inverse-CDF sampling on the generator's device.
        probs = self.mixture_weights.detach().to(torch.float64).cpu()
        cdf = torch.cumsum(probs / probs.sum(), 0)
        u = torch.rand(shape, generator=generator, dtype=torch.float64,
                       device=generator_device(generator)).cpu()
        component = torch.searchsorted(cdf, u.reshape(-1)).clamp(max=cdf.numel() - 1)
        scale = self.mixture_scales.detach().to(torch.float64).cpu()[component].reshape(shape)
        w = sample_frequencies(m, input_dim, "rbf", self.sampling, self.batch_shape, generator)
        return {"frequencies": w * scale.to(w.device).unsqueeze(-1)}

    def _features(self, x: Tensor) -> Tensor:
        x = x / self.lengthscale.to(x.dtype)
        proj = x @ self.frequencies.to(x.dtype).transpose(-1, -2)
        amplitude = math.sqrt(float(self.mixture_weights.sum()) / self.num_frequencies)
        return cos_sin_features(proj, amplitude)

    def fitted_kernel(self, distance: Tensor) -> Tensor:
        r""":math:`\tilde K(z) = \sum_i c_i e^{-s_i^2 z^2/2}`, the kernel the features estimate.

        ``distance`` is :math:`z = \|(x - y) / \ell\|`, the distance after the lengthscale.
        """
        s = self.mixture_scales.to(distance.dtype)
        c = self.mixture_weights.to(distance.dtype)
        return (c * torch.exp(-0.5 * (distance.unsqueeze(-1) * s) ** 2)).sum(-1)

    def exact_matrix(self, x1: Tensor, x2: Tensor) -> Tensor:
        r"""The target kernel matrix :func:`spherical_polynomial` ``(x1 / l, x2 / l, degree, a)``.

        Args:
            x1: ``(N, d)``; x2: ``(M, d)``.

        Returns:
            ``(*batch_shape, N, M)``.
        """
        ls = self.lengthscale.to(x1.dtype)
        return spherical_polynomial(x1 / ls, x2 / ls, self.degree, self.a)

    def weight_settings(self) -> Dict[str, Any]:
        return {**super().weight_settings(), "degree": self.degree, "a": self.a,
                "sampling": self.sampling}

    def extra_repr(self) -> str:
        return (f"num_features={self.num_features}, degree={self.degree}, a={self.a}, "
                f"sampling={self.sampling!r}, input_dim={self.input_dim}")
