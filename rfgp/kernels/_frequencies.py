r"""The frequencies of random Fourier features: draws from a stationary kernel's spectral density.

By Bochner's theorem the RBF kernel's spectral density is Gaussian and a Matérn-:math:`\nu`
kernel's a multivariate t with :math:`2\nu` degrees of freedom. :func:`sample_frequencies` draws
``M`` frequencies from it i.i.d., as orthogonal blocks (ORF: Haar directions, chi norms), or by
randomised quasi-Monte Carlo (scrambled Sobol' points through the radial quantile
:func:`radial_quantile`, with i.i.d. or orthogonal directions). The feature maps
(:mod:`~rfgp.kernels._fourier`, the spherical and vector-field features) take their frequencies
from here.
"""

from __future__ import annotations

import math
from typing import Dict, Optional

import numpy as np
import torch
from scipy import special, stats
from torch import Tensor
from torch.quasirandom import SobolEngine

from rfgp._ops import gaussian, generator_device
from rfgp._validation import check_choice

__all__ = [
    "DENSE_SAMPLINGS",
    "MATERN_NU",
    "SAMPLINGS",
    "haar_orthogonal",
    "radial_quantile",
    "sample_frequencies",
    "student_scale",
]

#: ``spectral`` name -> Matérn smoothness nu of the kernel (``None``: the RBF kernel, nu = inf).
#: Its keys are the accepted values of ``spectral=``.
MATERN_NU: Dict[str, Optional[float]] = {
    "rbf": None,
    "matern12": 0.5,
    "matern32": 1.5,
    "matern52": 2.5,
}
SAMPLINGS = ("iid", "orthogonal", "structured", "qmc", "qmc_orthogonal")
#: The samplings that store the frequencies as a dense ``(M, d)`` matrix.
DENSE_SAMPLINGS = ("iid", "orthogonal", "qmc", "qmc_orthogonal")
_NO_BATCH = torch.Size()


def student_scale(shape, nu: float, generator) -> Tensor:
    # A multivariate t with 2 nu degrees of freedom is N(0, I) * sqrt(2 nu / chi2_{2 nu}).
    # 2 nu is 1, 3 or 5, so chi2 is an exact sum of squared normals.
    dof = int(round(2 * nu))
    chi2 = gaussian((*shape, dof), generator).pow(2).sum(-1)
    return torch.sqrt(2 * nu / chi2)


def radial_quantile(u: Tensor, input_dim: int, nu: Optional[float] = None) -> Tensor:
    r"""Inverse CDF of the norm :math:`\|\omega\|` of a spectral sample (unit lengthscale).

    For the RBF kernel :math:`\omega \sim N(0, I_d)`, so :math:`\|\omega\| \sim \chi_d`. For
    Matérn-:math:`\nu`, :math:`\omega` is multivariate Student t with :math:`2\nu` degrees of
    freedom, so :math:`\|\omega\|^2 / d \sim F(d, 2\nu)` and
    :math:`\|\omega\| = \sqrt{d\, F^{-1}_{d, 2\nu}(u)}`.

    Args:
        u: probabilities in ``(0, 1)``, any shape.
        input_dim: ``d``.
        nu: ``None`` (RBF) or the Matérn smoothness.

    Returns:
        Radii, float64, the shape and device of ``u``.

    Example:
        >>> r = radial_quantile(torch.tensor([0.5]), 1)   # median of |N(0, 1)|
        >>> round(float(r), 4)
        0.6745
    """
    prob = u.detach().to("cpu", torch.float64).numpy()
    if nu is None:
        radius = stats.chi.ppf(prob, input_dim)
    else:
        radius = np.sqrt(input_dim * special.fdtri(input_dim, 2.0 * nu, prob))
    return torch.from_numpy(np.ascontiguousarray(radius)).to(u.device)


def _scrambled_sobol(batch_shape, num_points: int, dim: int, generator) -> Tensor:
    # One independently scrambled Sobol sequence per batch element. SobolEngine takes an integer
    # seed, not a generator: the seeds are drawn from the generator so that the kernel's seed or
    # generator (never the global state, unless the caller passes none) fixes the points.
    if dim > SobolEngine.MAXDIM:
        raise ValueError(
            f"input_dim must be at most {SobolEngine.MAXDIM - 1} for quasi-Monte Carlo sampling "
            f"(a Sobol point has d + 1 coordinates), got {dim - 1}"
        )
    count = math.prod(batch_shape)
    seeds = torch.randint(0, 2**62, (count,), generator=generator,
                          device=generator_device(generator))
    points = [SobolEngine(dim, scramble=True, seed=int(seed)).draw(num_points, dtype=torch.float64)
              for seed in seeds.tolist()]
    u = torch.stack(points).reshape(*batch_shape, num_points, dim)
    # The scrambled points lie on the grid k / 2^30 (0 included); the cell midpoints keep the
    # inverse CDFs finite and are still uniform on the 2^30 cells.
    return (u + 2.0**-31).to(generator_device(generator))


def haar_orthogonal(shape, d: int, generator) -> Tensor:
    """Haar-distributed ``d x d`` orthogonal matrices, batch ``shape`` (float64).

    QR of a Gaussian matrix with the signs of ``diag(R)`` moved into ``Q``; without the sign
    correction LAPACK's convention makes ``Q`` non-uniform.
    """
    g = gaussian((*shape, d, d), generator)
    q, r = torch.linalg.qr(g)
    signs = torch.sign(torch.diagonal(r, dim1=-2, dim2=-1))
    signs = torch.where(signs == 0, torch.ones_like(signs), signs)
    return q * signs.unsqueeze(-2)


def sample_frequencies(
    num_frequencies: int,
    input_dim: int,
    spectral: str = "rbf",
    sampling: str = "iid",
    batch_shape: torch.Size = _NO_BATCH,
    generator: Optional[torch.Generator] = None,
) -> Tensor:
    r"""Frequencies :math:`\omega_i` (rows) for unit lengthscale, float64.

    ``"iid"``: rows drawn independently from the spectral density. ``"orthogonal"``: rows of
    independent Haar-orthogonal ``d x d`` blocks, each row rescaled by an independent draw of the
    norm of a spectral sample (chi_d for the RBF kernel, chi_d times the Student-t scale for
    Matérn), so every row is marginally exact. ``"qmc"``: row ``i`` from the scrambled Sobol
    point :math:`u_i \in (0, 1)^{d+1}`, direction :math:`z / \|z\|` with
    :math:`z = \Phi^{-1}(u_{i,1:d})` and radius :math:`F_R^{-1}(u_{i,d+1})`, the inverse CDF of
    the spectral norm (:func:`radial_quantile`). ``"qmc_orthogonal"``: the directions of
    ``"orthogonal"`` with the radii :math:`F_R^{-1}(v_i)` of a scrambled one-dimensional Sobol
    sequence :math:`v` (stratified radii). Every scrambled point is uniform, so in all four
    schemes every row follows the spectral density and the kernel estimate is unbiased.
    Structured sampling is not a dense matrix; see :class:`FourierFeatureKernel`.

    Returns:
        ``(*batch_shape, num_frequencies, input_dim)`` tensor.

    Example:
        >>> w = sample_frequencies(4, 4, sampling="orthogonal",
        ...                        generator=torch.Generator().manual_seed(0))
        >>> gram = w @ w.T
        >>> bool((gram - torch.diag(torch.diagonal(gram))).abs().max() < 1e-10)
        True
    """
    check_choice("spectral", spectral, MATERN_NU)
    check_choice("sampling", sampling, DENSE_SAMPLINGS)
    nu = MATERN_NU[spectral]
    shape = (*batch_shape, num_frequencies)
    if sampling == "qmc":
        u = _scrambled_sobol(batch_shape, num_frequencies, input_dim + 1, generator)
        z = torch.special.ndtri(u[..., :input_dim])  # (*batch, M, d)
        radius = radial_quantile(u[..., input_dim], input_dim, nu)  # (*batch, M)
        return z * (radius / z.norm(dim=-1)).unsqueeze(-1)
    if sampling == "qmc_orthogonal":
        num_blocks = math.ceil(num_frequencies / input_dim)
        q = haar_orthogonal((*batch_shape, num_blocks), input_dim, generator)
        q = q.reshape(*batch_shape, num_blocks * input_dim, input_dim)[..., :num_frequencies, :]
        # Consecutive runs of 2^k Sobol points are stratified, so with d a power of two every
        # block's radii and all radii together cover the radial law evenly.
        v = _scrambled_sobol(batch_shape, num_frequencies, 1, generator)[..., 0]
        return q * radial_quantile(v, input_dim, nu).unsqueeze(-1)
    if sampling == "iid":
        w = gaussian((*shape, input_dim), generator)
    else:
        num_blocks = math.ceil(num_frequencies / input_dim)
        q = haar_orthogonal((*batch_shape, num_blocks), input_dim, generator)
        norms = gaussian((*batch_shape, num_blocks, input_dim, input_dim), generator).norm(dim=-1)
        w = (q * norms.unsqueeze(-1)).reshape(*batch_shape, num_blocks * input_dim, input_dim)
        w = w[..., :num_frequencies, :]
    if nu is not None:
        w = w * student_scale(shape, nu, generator).unsqueeze(-1)
    return w
