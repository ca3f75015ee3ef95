r"""The polynomial-sketch kernel :math:`(x^\top y / \ell^2 + b)^p`.

The projections are described in :mod:`rfgp.kernels._sketches`.

Internal: the public names are exported by :mod:`rfgp.kernels`.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

import torch
from torch import Tensor

from rfgp._validation import check_int
from rfgp.kernels._base import RandomFeatureKernel
from rfgp.kernels._dot_product import DotProductBias, DotProductKernel, init_unit_lengthscale
from rfgp.kernels._sketches.apply import apply_sketch
from rfgp.kernels._sketches.sampling import check_projection, sample_sketch
from rfgp.kernels._sketches.tensorsrht import apply_tensorsrht

__all__ = ["PolynomialSketchKernel"]


class PolynomialSketchKernel(DotProductBias, RandomFeatureKernel):
    r"""Random sketch of the polynomial kernel :math:`(x^\top y / \ell^2 + b)^p`.

    The bias is handled by homogenisation: with :math:`\tilde x = [x / \ell, \sqrt b]`,
    :math:`(x^\top y/\ell^2 + b)^p = (\tilde x^\top \tilde y)^p`, and a degree-:math:`p` sketch
    (:func:`apply_sketch`) of :math:`\tilde x` gives the features, so that
    :math:`\mathbb{E}[\Phi(x)^\top \overline{\Phi(y)}] = (x^\top y/\ell^2 + b)^p`. With ARD
    lengthscales the inputs are scaled coordinatewise.

    Projections (:data:`~rfgp.kernels.PROJECTIONS`, described on the *Polynomial sketches* API
    page): ``"gaussian"``, ``"rademacher"`` (dense, cost
    :math:`O(p d D)`), ``"tensorsketch"`` (FFT of count sketches, :math:`O(p(d + D \log D))`),
    ``"tensorsrht"`` (structured, :math:`O(p D \log d)`; inputs zero-padded to a power of two
    after the bias coordinate is appended). ``degree = 1`` gives a plain random projection
    (exact for TensorSRHT when ``D`` is a multiple of the padded dimension).

    ``complex=True`` uses complex weights: complex Gaussian :math:`(v + i w)/\sqrt2`, or signs
    uniform on :math:`\{1, -1, i, -i\}`. ``features(x)`` is then complex (``num_features``
    complex columns) and inside GPyTorch the kernel uses the real form
    :math:`[\mathrm{Re}\,\Phi, \mathrm{Im}\,\Phi]` -- the Complex-to-Real (CtR) map -- whose Gram
    matrix is :math:`\mathrm{Re}(\Phi\Phi^H)`. **D complex features give 2D real columns**
    (``num_real_features``), so compare against a real sketch with ``2D`` features, and build a
    CtR kernel of a given real size ``R`` with :meth:`ctr` (``num_features = R / 2``).
    CtR is unbiased with variance ``(V + PV) / 2`` of the complex sketch; it beats the real sketch
    at equal real size always for Gaussian weights (``degree >= 2``), and for Rademacher /
    TensorSRHT when the data are non-negative. Complex TensorSketch is supported but gains
    nothing (its variance equals the complex Rademacher sketch's).

    Conversions: scikit-learn's ``(gamma x^T y + coef0)^degree`` is ``lengthscale =
    gamma^{-1/2}``, ``bias = coef0``; the papers' ``(x^T y / a + nu)^p`` is ``lengthscale =
    sqrt(a)``, ``bias = nu``. Wrap in ``gpytorch.kernels.ScaleKernel`` for an amplitude.

    Args:
        degree: polynomial degree ``p >= 1``.
        num_features: ``D`` (complex features count once).
        bias: initial bias ``b >= 0``. ``bias > 0`` makes it a learnable parameter
            (``raw_bias`` with a ``Positive`` constraint); ``bias = 0`` gives the homogeneous
            kernel :math:`(x^\top y/\ell^2)^p` with no bias parameter and no extra coordinate.
        projection: ``"gaussian"``, ``"rademacher"``, ``"tensorsketch"`` or ``"tensorsrht"``.
        complex: complex weights (see above).
        input_dim: ``d`` (without the bias coordinate); inferred from the first input if None.
        seed: seed of the initial weight draw.
        **kwargs: GPyTorch ``Kernel`` arguments (``ard_num_dims``, ``batch_shape``,
            ``active_dims``, ``lengthscale_prior``, ``lengthscale_constraint``,
            ``bias_prior``, ``bias_constraint``).

    Attributes:
        lengthscale: positive ``(*batch_shape, 1, ard_num_dims or 1)`` parameter (starts at 1
            when its constraint allows).
        bias: positive ``(*batch_shape, 1, 1)`` parameter, or the constant 0.
        is_complex: whether the features are complex.
        num_features: ``D``, columns of ``features(x)`` (complex columns count once).
        num_real_features: columns of the real form, ``2D`` if complex, else ``D``.

    Shapes:
        ``features(x)``: ``(..., N, d) -> (..., N, D)``.

    Example:
        >>> import gpytorch
        >>> k = PolynomialSketchKernel.ctr(3, 64, bias=1.0, projection="tensorsrht", seed=0)
        >>> k.num_features, k.num_real_features, k.is_complex
        (32, 64, True)
        >>> x = torch.randn(10, 5, dtype=torch.float64)
        >>> k.features(x).dtype, k.real_features(x).shape
        (torch.complex128, torch.Size([10, 64]))
        >>> gpytorch.kernels.ScaleKernel(k)(x).shape
        torch.Size([10, 10])

    References:
        Kar & Karnick, AISTATS 2012. Pham & Pagh, KDD 2013. Wacker, Kanagawa & Filippone,
        *Improved Random Features for Dot Product Kernels*, 2022. Wacker, Ohana & Filippone,
        *Complex-to-Real Random Features for Polynomial Kernels*, 2022.
    """

    has_lengthscale = True

    def __init__(
        self,
        degree: int,
        num_features: int,
        bias: float = 0.0,
        projection: str = "rademacher",
        complex: bool = False,
        input_dim: Optional[int] = None,
        seed: Optional[int] = None,
        **kwargs: Any,
    ) -> None:
        degree = check_int("degree", degree)
        num_features = check_int("num_features", num_features)
        projection, is_complex = check_projection(projection, complex)
        bias_prior, bias_constraint = self._pop_bias_kwargs(bias, kwargs)
        super().__init__(num_features=num_features, input_dim=input_dim, seed=seed, **kwargs)
        self.degree = degree
        self.projection = projection
        self.is_complex = is_complex
        init_unit_lengthscale(self)
        self._register_bias(bias, bias_prior, bias_constraint)

    @classmethod
    def ctr(
        cls, degree: int, num_real_features: int, **kwargs: Any
    ) -> PolynomialSketchKernel:
        """Complex-to-Real sketch with ``num_real_features`` real columns.

        Builds ``PolynomialSketchKernel(degree, num_real_features // 2, complex=True,
        **kwargs)``: ``D`` complex features are ``2D`` real columns ``[Re Phi, Im Phi]``.

        Args:
            degree: polynomial degree.
            num_real_features: even number ``>= 2`` of real columns.
            **kwargs: the other constructor arguments (``bias``, ``projection``, ``seed``...).

        Example:
            >>> PolynomialSketchKernel.ctr(2, 10).num_features
            5
        """
        num_real_features = check_int("num_real_features", num_real_features, minimum=None)
        if num_real_features < 2 or num_real_features % 2:
            raise ValueError(
                "num_real_features must be an even integer >= 2 (a real and an imaginary "
                f"column per complex feature), got {num_real_features!r}"
            )
        if kwargs.pop("complex", True) is not True:
            raise ValueError("PolynomialSketchKernel.ctr builds a complex sketch: drop complex=")
        return cls(degree, num_real_features // 2, complex=True, **kwargs)

    # --------------------------------------------------------------- hyperparameters
    @property
    def sketch_dim(self) -> Optional[int]:
        """Dimension the sketch sees: ``d + 1`` with a bias coordinate, else ``d``."""
        if self.input_dim is None:
            return None
        return self.input_dim + int(self.has_bias)

    # --------------------------------------------------------------- features
    def _sample_weights(self, input_dim: int, generator) -> Dict[str, Tensor]:
        return sample_sketch(
            self.degree, self.num_features, input_dim + int(self.has_bias), self.projection,
            self.is_complex, self.batch_shape, generator,
        )

    def _weights(self) -> Dict[str, Tensor]:
        return {name: getattr(self, name) for name in self._random_buffer_names}

    def homogenize(self, x: Tensor) -> Tensor:
        r"""``[x / l, sqrt(b)]`` (``x / l`` when homogeneous): ``(..., N, d) -> (..., N, d')``."""
        scale = self.lengthscale.to(x.dtype)
        if not self.has_bias:
            return x / scale
        root = self.bias.to(x.dtype).sqrt()
        shape = torch.broadcast_shapes(x.shape[:-1], scale.shape[:-1], root.shape[:-1])
        if torch.is_grad_enabled():
            z = x / scale
            return torch.cat([z.expand(*shape, z.shape[-1]), root.expand(*shape, 1)], dim=-1)
        # one pass into the result instead of a quotient and its concatenation with the bias
        z = x.new_empty(*shape, x.shape[-1] + 1)
        torch.div(x.expand(*shape, x.shape[-1]), scale, out=z[..., :-1])
        z[..., -1:] = root.expand(*shape, 1)
        return z

    def _features(self, x: Tensor) -> Tensor:
        weights = self._weights()
        if self.projection == "tensorsrht" and not self.batch_shape:
            # the TensorSRHT kernels (compiled, or the GEMM plan without autograd) homogenise
            # row chunk by row chunk while filling their tiles: no homogenised copy of x; the
            # compiled kernels also differentiate through it
            scale = self.lengthscale.to(x.dtype).reshape(-1, 1)
            root = self.bias.to(x.dtype).sqrt().reshape(()) if self.has_bias else None
            return apply_tensorsrht(x, weights, self.degree, self.is_complex, scale, root)
        return apply_sketch(
            self.homogenize(x), weights, self.degree, self.projection, self.is_complex
        )

    def exact_kernel(self) -> DotProductKernel:
        """The exact :class:`~rfgp.kernels.DotProductKernel` with the current hyperparameters."""
        exact = DotProductKernel(
            kind="polynomial", degree=self.degree, bias=float(self.bias.detach().mean()),
            ard_num_dims=self.ard_num_dims, batch_shape=self.batch_shape,
            active_dims=self.active_dims,
        ).to(self.lengthscale)
        exact.lengthscale = self.lengthscale.detach().clone()
        if self.has_bias:
            exact.bias = self.bias.detach().clone()
        return exact

    def weight_settings(self) -> Dict[str, Any]:
        return {**super().weight_settings(), "degree": self.degree,
                "projection": self.projection, "has_bias": bool(self.has_bias)}

    def extra_repr(self) -> str:
        return (
            f"degree={self.degree}, num_features={self.num_features}, "
            f"projection={self.projection!r}, complex={self.is_complex}, "
            f"input_dim={self.input_dim}"
        )
