r"""The exact dot-product kernels: the targets of the polynomial sketches and Maclaurin features.

:math:`k(x, y) = f(x^\top y / \ell^2 + b)` with :math:`f(t) = t^p` (polynomial) or
:math:`f(t) = e^t` (exponential).
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import torch
from gpytorch.constraints import Positive
from gpytorch.kernels import Kernel
from torch import Tensor

from rfgp._validation import check_choice, check_int, check_real
from rfgp.kernels._base import InputCheckedKernel

__all__ = ["DotProductKernel", "DotProductBias", "DOT_PRODUCT_KINDS"]

#: the link functions f of f(x^T y / l^2 + b).
DOT_PRODUCT_KINDS = ("polynomial", "exponential")


def init_unit_lengthscale(kernel: Kernel) -> None:
    """Start at lengthscale 1 (the plain ``x^T y``) when the constraint allows it.

    GPyTorch's default raw value 0 gives ``softplus(0) = 0.69``, an arbitrary rescaling of a
    dot-product kernel.
    """
    constraint = kernel.raw_lengthscale_constraint
    if bool((constraint.lower_bound < 1.0).all()) and bool((constraint.upper_bound > 1.0).all()):
        kernel.lengthscale = 1.0


class DotProductBias:
    """The bias ``b >= 0`` of a dot-product kernel ``f(x^T y / l^2 + b)``, shared by the exact
    kernel and its sketches: a learnable ``Positive``-constrained parameter ``raw_bias`` of shape
    ``(*batch_shape, 1, 1)`` when built with ``b > 0``, the constant 0 (no parameter) otherwise.
    """

    @staticmethod
    def _pop_bias_kwargs(bias: Any, kwargs: Dict[str, Any]) -> Tuple[Any, Any]:
        # validate the constructor's bias; take bias_prior / bias_constraint out of kwargs
        check_real("bias", bias, low=0.0)
        return kwargs.pop("bias_prior", None), kwargs.pop("bias_constraint", None)

    def _register_bias(self, bias: float, prior=None, constraint=None) -> None:
        self.has_bias = bias > 0
        if not self.has_bias:
            if prior is not None or constraint is not None:
                raise ValueError(
                    "bias_prior / bias_constraint need a learnable bias: pass bias > 0"
                )
            return
        self.register_parameter(
            "raw_bias", torch.nn.Parameter(torch.zeros(*self.batch_shape, 1, 1))
        )
        self.register_constraint("raw_bias", constraint if constraint is not None else Positive())
        if prior is not None:
            self.register_prior("bias_prior", prior, lambda m: m.bias, lambda m, v: m._set_bias(v))
        self._set_bias(float(bias))

    @property
    def bias(self) -> Tensor:
        """``(*batch_shape, 1, 1)`` bias (zeros for a homogeneous kernel)."""
        if not self.has_bias:
            return torch.zeros(*self.batch_shape, 1, 1, dtype=self.lengthscale.dtype,
                               device=self.lengthscale.device)
        return self.raw_bias_constraint.transform(self.raw_bias)

    @bias.setter
    def bias(self, value) -> None:
        self._set_bias(value)

    def _set_bias(self, value) -> None:
        if not self.has_bias:
            raise AttributeError(
                "this kernel was built with bias=0 (homogeneous) and has no bias parameter; "
                "build it with bias > 0 to learn the bias"
            )
        if not torch.is_tensor(value):
            # straight to the parameter's dtype: a float32 detour would round a float64 model
            value = torch.as_tensor(value, dtype=self.raw_bias.dtype, device=self.raw_bias.device)
        if (value < 0).any():
            raise ValueError(f"bias must be non-negative, got {value}")
        self.initialize(raw_bias=self.raw_bias_constraint.inverse_transform(value))


class DotProductKernel(DotProductBias, InputCheckedKernel):
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
            ``active_dims``, ``lengthscale_prior``, ``lengthscale_constraint``, ``bias_prior``,
            ``bias_constraint``).

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
        check_choice("kind", kind, DOT_PRODUCT_KINDS)
        if kind == "polynomial":
            if degree is None:
                raise ValueError("degree (a positive integer) is required for kind='polynomial'")
            degree = check_int("degree", degree)
        elif degree is not None:
            raise ValueError(f"degree must be None for kind='exponential', got {degree!r}")
        bias_prior, bias_constraint = self._pop_bias_kwargs(bias, kwargs)
        super().__init__(**kwargs)
        self.kind = kind
        self.degree = degree
        init_unit_lengthscale(self)
        self._register_bias(bias, bias_prior, bias_constraint)

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
