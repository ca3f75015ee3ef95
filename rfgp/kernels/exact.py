r"""Exact reference kernels that the random-feature kernels approximate."""

from __future__ import annotations

import math
from typing import Any, Optional

import torch
from gpytorch.constraints import Positive
from gpytorch.kernels import Kernel
from torch import Tensor

__all__ = ["DotProductKernel"]


_KINDS = ("polynomial", "exponential")


def _init_unit_lengthscale(kernel: Kernel) -> None:
    """Start at lengthscale 1 (the plain ``x^T y``) when the constraint allows it.

    GPyTorch's default raw value 0 gives ``softplus(0) = 0.69``, an arbitrary rescaling of a
    dot-product kernel.
    """
    constraint = kernel.raw_lengthscale_constraint
    if bool((constraint.lower_bound < 1.0).all()) and bool((constraint.upper_bound > 1.0).all()):
        kernel.lengthscale = 1.0


class DotProductKernel(Kernel):
    r"""Exact dot-product kernel :math:`f(x^\top y / \ell^2 + b)`.

    .. math::
        k_{\text{polynomial}}(x, y) = (x^\top y / \ell^2 + b)^p, \qquad
        k_{\text{exponential}}(x, y) = \exp(x^\top y / \ell^2 + b)
                                     = e^{b} \sum_{n \ge 0} \frac{(x^\top y)^n}{n!\,\ell^{2n}} .

    With ARD lengthscales the inputs are scaled coordinatewise (``x / l``). These are the targets
    of :class:`~rfgp.kernels.PolynomialSketchKernel` (polynomial) and the Maclaurin features
    (both kinds). The matrices are dense: use them as references on moderate ``N``.

    Conversions: scikit-learn's ``polynomial_kernel(gamma, coef0, degree)`` is
    ``lengthscale = gamma^{-1/2}``, ``bias = coef0``.

    The lengthscale starts at 1 (when its constraint allows).

    Args:
        kind: ``"polynomial"`` or ``"exponential"``.
        degree: ``p >= 1`` for ``"polynomial"``; must be ``None`` for ``"exponential"``.
        bias: ``b >= 0``. ``b > 0`` makes it a learnable parameter (``Positive`` constraint);
            ``b = 0`` fixes it at 0 (no parameter).
        **kwargs: GPyTorch ``Kernel`` arguments (``ard_num_dims``, ``batch_shape``,
            ``active_dims``, ``lengthscale_prior``, ``lengthscale_constraint``).

    Example:
        >>> k = DotProductKernel("polynomial", degree=2, bias=1.0).double()
        >>> x = torch.tensor([[1.0, 2.0]], dtype=torch.float64)
        >>> round(float(k(x, x).to_dense()), 4)   # (1 * 1 + 2 * 2 + 1)^2
        36.0
    """

    has_lengthscale = True

    def __init__(
        self,
        kind: str = "polynomial",
        degree: Optional[int] = None,
        bias: float = 0.0,
        **kwargs: Any,
    ) -> None:
        if kind not in _KINDS:
            raise ValueError(f"kind must be one of {list(_KINDS)}, got {kind!r}")
        if kind == "polynomial":
            if not isinstance(degree, int) or isinstance(degree, bool) or degree < 1:
                raise ValueError(
                    f"degree must be a positive integer for kind='polynomial', got {degree!r}"
                )
        elif degree is not None:
            raise ValueError(f"degree must be None for kind='exponential', got {degree!r}")
        if isinstance(bias, bool) or not isinstance(bias, (int, float)):
            raise TypeError(f"bias must be a non-negative float, got {type(bias).__name__}")
        if not math.isfinite(bias) or bias < 0:
            raise ValueError(f"bias must be a finite non-negative float, got {bias!r}")
        super().__init__(**kwargs)
        self.kind = kind
        self.degree = degree
        _init_unit_lengthscale(self)
        self.has_bias = bias > 0
        if self.has_bias:
            self.register_parameter(
                "raw_bias", torch.nn.Parameter(torch.zeros(*self.batch_shape, 1, 1))
            )
            self.register_constraint("raw_bias", Positive())
            self.bias = float(bias)

    @property
    def bias(self) -> Tensor:
        if not self.has_bias:
            return torch.zeros(*self.batch_shape, 1, 1, dtype=self.lengthscale.dtype,
                               device=self.lengthscale.device)
        return self.raw_bias_constraint.transform(self.raw_bias)

    @bias.setter
    def bias(self, value) -> None:
        if not self.has_bias:
            raise AttributeError("this kernel was built with bias=0 and has no bias parameter")
        if not torch.is_tensor(value):
            value = torch.as_tensor(value).to(self.raw_bias)
        if (value < 0).any():
            raise ValueError(f"bias must be non-negative, got {value}")
        self.initialize(raw_bias=self.raw_bias_constraint.inverse_transform(value))

    def _link(self, inner: Tensor) -> Tensor:
        if self.kind == "polynomial":
            return inner.pow(self.degree)
        return inner.exp()

    def forward(
        self, x1: Tensor, x2: Tensor, diag: bool = False, last_dim_is_batch: bool = False, **params
    ) -> Tensor:
        if last_dim_is_batch:
            raise NotImplementedError("DotProductKernel does not support last_dim_is_batch=True")
        lengthscale = self.lengthscale.to(x1.dtype)
        z1 = x1 / lengthscale
        z2 = x2 / lengthscale
        bias = self.bias.to(x1.dtype)
        if diag:
            inner = (z1 * z2).sum(-1) + bias[..., 0]
        else:
            inner = z1 @ z2.transpose(-1, -2) + bias
        return self._link(inner)

    def extra_repr(self) -> str:
        return f"kind={self.kind!r}, degree={self.degree}"
