r"""Random Fourier features for shift-invariant kernels: i.i.d., orthogonal (ORF), structured
(SORF) and randomised quasi-Monte Carlo frequencies.

Bochner's theorem writes a stationary kernel as an expectation over its spectral density,
:math:`k(x - y) = \mathbb{E}_{\omega \sim p}[\cos(\omega^\top (x - y))]`, so with
:math:`M = D/2` frequencies the feature map

.. math::
    \Phi(x) = M^{-1/2} [\cos(\Omega x / \ell), \sin(\Omega x / \ell)] \in \mathbb{R}^{D}

gives :math:`\hat k(x, y) = M^{-1} \sum_i \cos(\omega_i^\top (x - y) / \ell)`.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Optional

import torch
from gpytorch.kernels import Kernel, MaternKernel, RBFKernel
from torch import Tensor

from rfgp._ops import fwht, next_power_of_two, rademacher
from rfgp._validation import check_choice, check_int, check_tensor
from rfgp.kernels._base import RandomFeatureKernel
from rfgp.kernels._frequencies import (
    DENSE_SAMPLINGS,
    MATERN_NU,
    SAMPLINGS,
    haar_orthogonal,
    radial_quantile,
    sample_frequencies,
    student_scale,
)

__all__ = [
    "FourierFeatureKernel",
    "MATERN_NU",
    "SAMPLINGS",
    "sample_frequencies",
    "radial_quantile",
    "haar_orthogonal",
    "cos_sin_features",
    "stationary_kernel",
]



def stationary_kernel(
    x1: Tensor, x2: Tensor, lengthscale: Tensor, nu: Optional[float] = None
) -> Tensor:
    r"""The exact kernel that :class:`FourierFeatureKernel` approximates, differentiable in all
    arguments.

    With :math:`r = \|(x_1 - x_2) / \ell\|` (per-input lengthscales :math:`\ell`):

    .. math::
        k_\infty = e^{-r^2/2},\quad k_{1/2} = e^{-r},\quad
        k_{3/2} = (1 + \sqrt3 r)\,e^{-\sqrt3 r},\quad
        k_{5/2} = (1 + \sqrt5 r + \tfrac53 r^2)\,e^{-\sqrt5 r}.

    Args:
        x1: ``(N, d)`` inputs.
        x2: ``(M, d)`` inputs.
        lengthscale: ``(d,)``, ``(1, d)`` or scalar lengthscales.
        nu: ``None`` (RBF) or a Matérn smoothness in ``MATERN_NU``'s values.

    Returns:
        ``(N, M)`` kernel matrix.

    Raises:
        ValueError: for non-finite inputs, non-positive lengthscales, inputs that are not
            ``(N, d)`` and ``(M, d)``, or a lengthscale that is neither one value nor ``d``.
        TypeError: for non-floating inputs.

    Example:
        >>> x = torch.randn(5, 2, dtype=torch.float64)
        >>> k = stationary_kernel(x, x, torch.tensor([0.5, 2.0], dtype=torch.float64), 2.5)
        >>> bool(torch.allclose(k.diagonal(), torch.ones(5, dtype=torch.float64)))
        True
    """
    x1 = check_tensor("x1", x1, min_dim=2, max_dim=2)
    x2 = check_tensor("x2", x2, min_dim=2, max_dim=2)
    ls = check_tensor("lengthscale", lengthscale).reshape(-1).to(x1.dtype)
    if x1.shape[1] != x2.shape[1] or ls.numel() not in (1, x1.shape[1]):
        raise ValueError(
            f"x1, x2 must have the same d columns and lengthscale 1 or d values, got x1 "
            f"{tuple(x1.shape)}, x2 {tuple(x2.shape)}, lengthscale {tuple(lengthscale.shape)}"
        )
    if not bool((ls > 0).all()):
        smallest = float(ls.detach().min())
        raise ValueError(f"lengthscale must be positive, got minimum {smallest:.3g}")
    # Distances from the differences, not |a|^2 + |b|^2 - 2 a.b: that form overflows to
    # inf - inf at extreme lengthscales and loses accuracy on near-equal points.
    r = torch.cdist(x1 / ls, x2 / ls, compute_mode="donot_use_mm_for_euclid_dist")
    sq = r.square()
    if nu is None:
        return torch.exp(-0.5 * sq)
    if nu == 0.5:
        return torch.exp(-r)
    if nu == 1.5:
        s3 = math.sqrt(3.0) * r
        return (1.0 + s3) * torch.exp(-s3)
    if nu == 2.5:
        s5 = math.sqrt(5.0) * r
        return (1.0 + s5 + 5.0 / 3.0 * sq) * torch.exp(-s5)
    raise ValueError(f"nu must be None, 0.5, 1.5 or 2.5, got {nu!r}")


def cos_sin_features(proj: Tensor, scale: float, out: Optional[Tensor] = None) -> Tensor:
    r"""``scale * [cos(proj), sin(proj)]`` along the last dimension: ``(..., m) -> (..., 2m)``.

    The real form of :math:`e^{i \omega^\top x}` used by every random Fourier feature map.
    Without autograd the result is written into ``out`` (shape ``(..., 2m)``, a strided view
    may do) when one is given, else into a fresh buffer.

    Raises:
        ValueError: for an ``out`` of another shape or dtype than the result's, or an ``out``
            where ``proj`` requires grad.

    Example:
        >>> cos_sin_features(torch.zeros(1, 2), 0.5)
        tensor([[0.5000, 0.5000, 0.0000, 0.0000]])
    """
    m = proj.shape[-1]
    if torch.is_grad_enabled() and proj.requires_grad:
        if out is not None:
            raise ValueError("out is for passes without autograd; proj requires grad")
        # Scaling cat's fresh output in place saves a pass (cat keeps no output for
        # backward, the product with a Python scalar keeps no input).
        return torch.cat([torch.cos(proj), torch.sin(proj)], dim=-1).mul_(scale)
    # Without autograd: cos and sin written straight into the halves of one buffer
    # (measured about 2x faster than cat of two temporaries, N = 1e5, D = 1024).
    if out is None:
        out = proj.new_empty(*proj.shape[:-1], 2 * m)
    elif out.shape != (*proj.shape[:-1], 2 * m) or out.dtype != proj.dtype:
        raise ValueError(
            f"out must have shape {(*proj.shape[:-1], 2 * m)} and dtype {proj.dtype}, got "
            f"{tuple(out.shape)} and {out.dtype}"
        )
    if not out.is_contiguous():
        # A block of a wider buffer (a part of a sum): cos and sin written through short
        # strided rows measured 2-3x slower than into fresh contiguous tensors and a copy.
        torch.mul(torch.cos(proj), scale, out=out[..., :m])
        torch.mul(torch.sin(proj), scale, out=out[..., m:])
        return out
    torch.cos(proj, out=out[..., :m])
    torch.sin(proj, out=out[..., m:])
    return out.mul_(scale)


class FourierFeatureKernel(RandomFeatureKernel):
    r"""Random Fourier features for RBF and Matérn kernels (i.i.d., ORF, SORF or QMC frequencies).

    Approximates GPyTorch's ``RBFKernel`` (``exp(-||x - y||^2 / (2 l^2))``) or
    ``MaternKernel(nu)`` with the same lengthscale ``l``:

    .. math::
        \Phi(x) = \sqrt{1/M}\,[\cos(\omega_1^\top x/\ell), ..., \cos(\omega_M^\top x/\ell),
                             \sin(\omega_1^\top x/\ell), ..., \sin(\omega_M^\top x/\ell)],
        \qquad M = D / 2,

    so :math:`\hat k(x, y) = \frac1M \sum_i \cos(\omega_i^\top (x - y)/\ell)`. The frequencies
    follow the spectral density: :math:`N(0, I)` for RBF, the multivariate Student t with
    :math:`2\nu` degrees of freedom for Matérn-:math:`\nu`.

    Sampling schemes (Yu et al., *Orthogonal Random Features*, 2016):

    * ``"iid"``: Rahimi–Recht, independent rows. Unbiased.
    * ``"orthogonal"`` (ORF): ``W = S Q`` per block of ``d`` rows, ``Q`` Haar-orthogonal,
      ``S`` independent norms of spectral draws; independent blocks when ``M > d``. Unbiased, with
      lower variance than iid (the variance ratio tends to ``3 / (d + 2)`` at small distances).
    * ``"structured"`` (SORF): ``W = sqrt(d') H D_1 H D_2 H D_3`` per block, ``H`` the normalised
      Walsh–Hadamard matrix, ``D_i`` random signs, inputs zero-padded to ``d' = 2^k``;
      ``O(M log d)`` time and ``O(M)`` memory. Rows have the fixed norm ``sqrt(d')``, so for RBF
      it is nearly unbiased (bias ``O(z^4 / d)``, Lemma 5 of the paper); for Matérn each row is
      further multiplied by an independent Student-t scale ``sqrt(2 nu / chi2_{2 nu})``.
    * ``"qmc"``: randomised quasi-Monte Carlo. Frequency ``i`` comes from a scrambled Sobol
      point ``u_i`` in ``(0, 1)^{d+1}``: direction ``z / |z|`` with ``z = Phi^{-1}(u_i[:d])``
      (the Gaussian inverse CDF), radius ``F_R^{-1}(u_i[d])`` with ``F_R`` the law of the norm
      of a spectral sample (``chi_d`` for RBF, ``sqrt(d F(d, 2 nu))`` for Matérn). Each scrambled
      point is uniform, so each row follows the spectral density: unbiased; the points' even
      spread lowers the variance.
    * ``"qmc_orthogonal"``: ORF's Haar-orthogonal directions with radii ``F_R^{-1}(v_i)`` from a
      scrambled one-dimensional Sobol sequence ``v`` (stratified radii). Unbiased.

    The Sobol sequences are seeded by integers drawn from the kernel's generator (``seed`` or the
    generator passed to :meth:`resample`).

    With ARD lengthscales the inputs are scaled (``x / l``), never the orthogonal frequencies.

    Args:
        num_features: ``D``, the number of feature columns (even: cos and sin per frequency).
        spectral: ``"rbf"``, ``"matern12"``, ``"matern32"`` or ``"matern52"``.
        sampling: ``"iid"``, ``"orthogonal"``, ``"structured"``, ``"qmc"`` or
            ``"qmc_orthogonal"``.
        input_dim: ``d``; inferred from the first input when ``None``.
        seed: seed of the initial draw; the same seed gives the same features.
        pad_to: structured sampling only: zero-pad the inputs to at least this dimension
            (rounded up to a power of two). SORF's bias, ``-e^{-z^2/2} z^4 / (4 d')`` to leading
            order, does not shrink with more features, so for the small ``d`` typical of GP
            regression padding to ``d' = 32`` or ``64`` lowers the error a lot (at ``O(log d')``
            cost per frequency).
        **kwargs: GPyTorch ``Kernel`` arguments (``ard_num_dims``, ``batch_shape``,
            ``active_dims``, ``lengthscale_prior``, ``lengthscale_constraint``).

    Attributes:
        lengthscale: ``(*batch_shape, 1, ard_num_dims or 1)`` positive parameter.
        num_frequencies: ``M = D / 2``.

    Shapes:
        ``features(x)``: ``(..., N, d) -> (..., N, D)``.

    Example:
        >>> import gpytorch
        >>> k = FourierFeatureKernel(256, spectral="matern52", sampling="orthogonal", seed=0)
        >>> x = torch.randn(10, 3, dtype=torch.float64)
        >>> k.features(x).shape
        torch.Size([10, 256])
        >>> covar = gpytorch.kernels.ScaleKernel(k)(x)   # a low-rank LinearOperator
        >>> covar.shape
        torch.Size([10, 10])

    References:
        Rahimi & Recht, *Random Features for Large-Scale Kernel Machines*, NIPS 2007.
        Yu, Suresh, Choromanski, Holtmann-Rice, Kumar, *Orthogonal Random Features*, NIPS 2016.
        Owen, *Scrambling Sobol' and Niederreiter-Xing points*, J. Complexity 1998.
    """

    has_lengthscale = True
    #: Structured sampling with input dimension ``d <=`` this value (and more inputs than ``d``)
    #: computes ``x W^T`` as one dense product with ``W^T`` built by the fast transform (faster
    #: for small ``d``, and ``pad_to`` then costs nothing per input); larger ``d`` applies the
    #: three FWHTs to the data (``O(M log d')`` per input). 0 forces the FWHT.
    structured_dense_max_dim: int = 128

    def __init__(
        self,
        num_features: int,
        spectral: str = "rbf",
        sampling: str = "iid",
        input_dim: Optional[int] = None,
        seed: Optional[int] = None,
        pad_to: Optional[int] = None,
        **kwargs: Any,
    ) -> None:
        if check_int("num_features", num_features, minimum=None) < 2 or num_features % 2:
            raise ValueError(
                "num_features must be an even integer >= 2 (a cos and a sin column per "
                f"frequency), got {num_features!r}"
            )
        check_choice("spectral", spectral, MATERN_NU)
        check_choice("sampling", sampling, SAMPLINGS)
        if pad_to is not None:
            pad_to = check_int("pad_to", pad_to)
            if sampling != "structured":
                raise ValueError(
                    f"pad_to applies to sampling='structured' only, got sampling={sampling!r}"
                )
        super().__init__(num_features=num_features, input_dim=input_dim, seed=seed, **kwargs)
        self.spectral = spectral
        self.sampling = sampling
        self.pad_to = pad_to

    @property
    def num_frequencies(self) -> int:
        return self.num_features // 2

    @property
    def nu(self) -> Optional[float]:
        return MATERN_NU[self.spectral]

    def _sample_weights(self, input_dim: int, generator) -> Dict[str, Tensor]:
        m = self.num_frequencies
        if self.sampling in DENSE_SAMPLINGS:
            w = sample_frequencies(m, input_dim, self.spectral, self.sampling, self.batch_shape,
                                   generator)
            return {"frequencies": w}
        padded = next_power_of_two(max(input_dim, self.pad_to or 1))
        num_blocks = math.ceil(m / padded)
        weights = {"signs": rademacher((*self.batch_shape, num_blocks, 3, padded), generator)}
        if self.nu is not None:
            weights["radial_scale"] = student_scale((*self.batch_shape, m), self.nu, generator)
        return weights

    def projections(self, x: Tensor) -> Tensor:
        r"""The projections :math:`x W^\top` (frequencies as rows of ``W``), for inputs already
        divided by the lengthscale; the features are their cos and sin.

        Args:
            x: ``(..., N, d)`` scaled inputs.

        Returns:
            ``(..., N, M)`` with ``M = num_features / 2``.

        Example:
            >>> k = FourierFeatureKernel(8, sampling="structured", input_dim=3, seed=0)
            >>> k.projections(torch.zeros(5, 3)).abs().max().item()
            0.0
        """
        self.ensure_weights(x)
        if self.sampling in DENSE_SAMPLINGS:
            return x @ self.frequencies.to(x.dtype).transpose(-1, -2)
        input_dim = x.shape[-1]
        if input_dim <= self.structured_dense_max_dim and x.shape[-2] > input_dim:
            # Materialise W^T (d x M) through the fast transform (the d rows of the identity
            # cost d / N of the direct route), then one GEMM with d columns: for small d this
            # beats three memory-bound FWHT passes over (N, M), whatever the padding d'.
            eye = torch.eye(input_dim, dtype=x.dtype, device=x.device)
            return x @ self._structured_projections(eye)
        # Row chunks whose (rows, B, d') working set stays cache-sized (~512 KB): the transform's
        # passes then run in cache instead of streaming (N, M) tensors through memory.
        width = self.signs.shape[-3] * self.signs.shape[-1]
        rows = max(1, (1 << 19) // (width * x.element_size()))
        if x.shape[-2] <= 2 * rows:
            return self._structured_projections(x)
        chunks = [self._structured_projections(part) for part in x.split(rows, dim=-2)]
        return torch.cat(chunks, dim=-2)

    def _structured_projections(self, x: Tensor) -> Tensor:
        # Rows of sqrt(d') H D1 H D2 H D3 applied to x: D3 first, H last. The three unnormalised
        # transforms and sqrt(d') combine to 1 / d', folded into D3 (a (B, d') tensor) so that no
        # extra pass over the (N, B, d') data is needed.
        signs = self.signs.to(x.dtype).unsqueeze(-4)  # (*batch, 1, B, 3, d')
        padded = signs.shape[-1]
        y = torch.nn.functional.pad(x, (0, padded - x.shape[-1])).unsqueeze(-2)  # (..., N, 1, d')
        # The sign flips act in place on fwht's fresh output (autograd allows it: the matrix
        # product does not keep its output), which saves an allocation per pass.
        y = fwht(y * (signs[..., 2, :] / padded))
        y = fwht(y.mul_(signs[..., 1, :]))
        y = fwht(y.mul_(signs[..., 0, :]))
        # The flattened width spelled out: -1 is ambiguous for inputs without rows.
        y = y.reshape(*y.shape[:-2], y.shape[-2] * y.shape[-1])[..., : self.num_frequencies]
        if self.nu is not None:
            y = y * self.radial_scale.to(x.dtype).unsqueeze(-2)
        return y

    def scaled_projections(self, x: Tensor) -> Tensor:
        r"""The projections :math:`P_{ij} = \omega_j^\top x_i / \ell`: the arguments of the
        cosines and sines, :math:`\Phi(x) = M^{-1/2} [\cos P, \sin P]`.

        Args:
            x: ``(..., N, d)`` float32 or float64 inputs (checked and prepared as by
                :meth:`features`: ``active_dims``, finite values).

        Returns:
            ``(..., N, M)`` with ``M = num_features / 2``, differentiable in the lengthscale.

        Raises:
            TypeError, ValueError: for the inputs :meth:`features` rejects (NaN or infinite
                values, a 0-d tensor, no columns, a dtype other than float32 / float64).

        Example:
            >>> k = FourierFeatureKernel(8, input_dim=2, seed=0)
            >>> x = torch.randn(5, 2)
            >>> bool(torch.allclose(k.features(x), cos_sin_features(k.scaled_projections(x), 0.5)))
            True
        """
        return self._scaled_projections(self.prepare_input(x))

    def _scaled_projections(self, x: Tensor) -> Tensor:
        return self.projections(x / self.lengthscale.to(x.dtype))

    def _features(self, x: Tensor) -> Tensor:
        return cos_sin_features(self._scaled_projections(x), 1.0 / math.sqrt(self.num_frequencies))

    def _features_into(self, x: Tensor, out: Tensor) -> Tensor:
        if len(self.batch_shape) or torch.is_grad_enabled():
            return self._features(x)
        return cos_sin_features(self._scaled_projections(x),
                                1.0 / math.sqrt(self.num_frequencies), out=out)

    def exact_kernel(self) -> Kernel:
        """The GPyTorch kernel this map approximates, sharing the current lengthscale value."""
        kwargs = dict(ard_num_dims=self.ard_num_dims, batch_shape=self.batch_shape,
                      active_dims=self.active_dims)
        exact = RBFKernel(**kwargs) if self.nu is None else MaternKernel(nu=self.nu, **kwargs)
        exact = exact.to(self.lengthscale)
        exact.lengthscale = self.lengthscale.detach().clone()
        return exact

    def weight_settings(self) -> Dict[str, Any]:
        return {**super().weight_settings(), "spectral": self.spectral,
                "sampling": self.sampling, "pad_to": self.pad_to}

    def extra_repr(self) -> str:
        pad = f", pad_to={self.pad_to}" if self.pad_to is not None else ""
        return (f"num_features={self.num_features}, spectral={self.spectral!r}, "
                f"sampling={self.sampling!r}, input_dim={self.input_dim}{pad}")

