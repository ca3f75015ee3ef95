r"""The variance of a product of independent random-feature estimates: what an elementwise
(Hadamard) product of equal-width parts pays against the full tensor product (see
:mod:`rfgp.kernels._composition`).
"""

from __future__ import annotations

import math
from typing import Sequence

from torch import Tensor

from rfgp._validation import check_choice, check_int, check_tensor
from rfgp.kernels._composition import PRODUCT_MODES

__all__ = ["product_variance"]


def product_variance(
    values: Sequence[Tensor],
    variances: Sequence[Tensor],
    num_features: int,
    product: str = "elementwise",
) -> Tensor:
    r"""Variance of a product estimate from its independent parts with i.i.d. columns.

    With the parts' kernel values :math:`k_i` and the variances :math:`v_i` of their estimates
    (each part at width ``num_features`` for the elementwise product, at its own width for the
    tensor product):

    .. math::
        \text{elementwise: } \frac1D\Big(\prod_i (k_i^2 + D v_i) - \prod_i k_i^2\Big),
        \qquad \text{tensor: } \prod_i (k_i^2 + v_i) - \prod_i k_i^2.

    The tensor product formula holds for any independent parts; the elementwise one for parts
    whose columns are i.i.d. (so the product's columns are i.i.d.).

    Args:
        values: the parts' exact kernel values :math:`k_i(x, y)`, broadcastable tensors.
        variances: :math:`v_i = \mathbb{V}[\hat k_i(x, y)]`, same shapes.
        num_features: ``D``, the common width (elementwise; ignored for the tensor product).
        product: ``"elementwise"`` or ``"tensor"``.

    Returns:
        The variance, broadcast over the inputs.

    Example:
        >>> k, v = torch.tensor([0.5]), torch.tensor([0.01])
        >>> product_variance([k, k], [v, v], 100)   # k^2 v + k^2 v + D v^2
        tensor([0.0150])
    """
    product = check_choice("product", product, PRODUCT_MODES)
    num_features = check_int("num_features", num_features)
    if len(values) != len(variances) or len(values) < 1:
        raise ValueError(
            "values and variances must be non-empty sequences of equal length, got "
            f"{len(values)} and {len(variances)}"
        )
    for i, (k, v) in enumerate(zip(values, variances)):
        check_tensor(f"values[{i}]", k)
        check_tensor(f"variances[{i}]", v)
        if (v < 0).any():
            raise ValueError(
                f"variances[{i}] must be non-negative, got minimum {v.min().item():.3g}"
            )
    scale = float(num_features) if product == "elementwise" else 1.0
    second = math.prod(k.square() + scale * v for k, v in zip(values, variances))
    mean_square = math.prod(k.square() for k in values)
    return (second - mean_square) / scale
