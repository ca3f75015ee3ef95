r"""The constant prior mean of :class:`~rfgp.inference.RandomFeatureGP`.

The model :math:`y_{it} = m_t + f_t(x_i) + \varepsilon_{it}` with a known constant :math:`m_t`
per target column (per output, for ``p`` outputs per input) is the zero-mean model on
:math:`y - m`: the fit conditions on the targets less the mean, and every prediction (means,
posteriors, sample paths) adds it back; the variances and the evidence of :math:`y - m` are
those of the zero-mean model. Here: the check of a mean, its rows in the solvers' layout
(``(R, T)``, ``p`` outputs per input interleaved), and :func:`adopt_prior_mean`, which gives a
model fitted on centred targets the mean it was centred by.

Internal: not part of the public API (see :mod:`rfgp.inference`).
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor

from rfgp._validation import check_tensor

__all__ = ["add_mean_rows", "adopt_prior_mean", "check_prior_mean", "mean_rows",
           "shifted_targets"]


def check_prior_mean(value: Any, name: str = "prior_mean") -> Tensor:
    """A prior mean as a float64 tensor: a finite number (0-d), or a 1-D tensor with one finite
    value per target column (or per output).

    Example:
        >>> check_prior_mean(0.5)
        tensor(0.5000, dtype=torch.float64)
        >>> check_prior_mean(float("nan"))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: prior_mean must be finite...
    """
    if isinstance(value, bool):
        raise TypeError(f"{name} must be a number or a 1-D tensor, got a bool")
    if isinstance(value, (int, float)):
        value = torch.tensor(float(value), dtype=torch.float64)
    tensor = check_tensor(name, value)  # (a real floating dtype)
    if tensor.dim() > 1 or (tensor.dim() == 1 and tensor.numel() == 0):
        raise ValueError(
            f"{name} must be a number or a non-empty 1-D tensor (one value per target column), "
            f"got shape {tuple(tensor.shape)}"
        )
    if not bool(torch.isfinite(tensor).all()):
        raise ValueError(f"{name} must be finite, got {tensor}")
    return tensor.detach().to(torch.float64).clone()


def mean_rows(mean: Tensor, num_rows: int, num_columns: int, outputs_per_input: int,
              like: Tensor) -> Tensor:
    r"""The mean in the solvers' ``(R, T)`` layout, broadcastable against ``num_rows`` rows of
    ``num_columns`` columns: a number as it is, one value per column as ``(1, T)``, one value
    per output (``p > 1``, one column of interleaved rows) tiled over the inputs.

    Raises:
        ValueError: where a 1-D mean has neither one value per column nor per output, or
            overflows ``like``'s dtype.

    Example:
        >>> m = torch.tensor([1.0, 2.0], dtype=torch.float64)
        >>> mean_rows(m, 6, 1, 2, torch.zeros(())).reshape(-1).tolist()  # 3 inputs, 2 outputs
        [1.0, 2.0, 1.0, 2.0, 1.0, 2.0]
    """
    cast = mean.to(device=like.device, dtype=like.real.dtype)
    if not bool(torch.isfinite(cast).all()):
        raise ValueError(
            f"prior_mean {mean.tolist()} is not representable in {cast.dtype} (the dtype of "
            "the fit); rescale the targets or fit in float64"
        )
    mean = cast
    if mean.dim() == 0:
        return mean
    if outputs_per_input > 1:
        if mean.numel() != outputs_per_input:
            raise ValueError(
                f"prior_mean must hold one value per output ({outputs_per_input}), got "
                f"{mean.numel()}"
            )
        return mean.repeat(num_rows // outputs_per_input).unsqueeze(-1)
    if mean.numel() != num_columns:
        raise ValueError(
            f"prior_mean must hold one value per target column ({num_columns}), got "
            f"{mean.numel()}"
        )
    return mean.unsqueeze(0)


def add_mean_rows(rows: Tensor, mean: Optional[Tensor], outputs_per_input: int,
                  sign: float = 1.0) -> Tensor:
    """``rows + sign * m`` for values in the solvers' ``(..., R, T)`` layout (a fit's targets
    less the mean with ``sign=-1``; means and sample paths plus it); ``rows`` itself where
    the mean is ``None`` or the number zero (a vector is laid out, so its length is checked).

    Example:
        >>> rows = torch.zeros(4, 1, dtype=torch.float64)  # 2 inputs, 2 outputs, interleaved
        >>> add_mean_rows(rows, torch.tensor([1.0, 2.0]), 2, sign=-1.0).reshape(-1).tolist()
        [-1.0, -2.0, -1.0, -2.0]
    """
    if mean is None or (mean.dim() == 0 and not bool(mean)):
        return rows
    return rows + sign * mean_rows(mean, rows.shape[-2], rows.shape[-1], outputs_per_input,
                                   rows)


def shifted_targets(y: Any, mean: Tensor) -> Any:
    """``y + mean`` in ``y``'s own shape (``(N,)``, ``(N, T)`` or ``(N, p)``; a 1-D mean runs
    along the last dimension), or ``y`` itself where the mean is zero."""
    if not bool(mean.any()):
        return y
    y = check_tensor("y", y)
    return y + mean.to(device=y.device, dtype=y.dtype)


def adopt_prior_mean(gp: Any, mean: Tensor) -> None:
    r"""Give ``gp``, fitted with a zero prior mean on targets less ``mean``, that prior mean:
    the posterior of :math:`f` given :math:`y - m` under the zero-mean model is the posterior
    given :math:`y` under the mean :math:`m`, so nothing is refitted; the held training
    targets (if any) become the uncentred ones, so that a refit centres them again.

    Args:
        gp: a fitted :class:`~rfgp.inference.RandomFeatureGP` whose prior mean is zero.
        mean: the mean, checked by the caller (:func:`check_prior_mean`, one value per
            target column); assigning it to ``gp.prior_mean`` checks it as any assignment.

    Example:
        >>> from rfgp import RandomFeatureGP
        >>> from rfgp.kernels import FourierFeatureKernel
        >>> x = torch.linspace(0, 1, 40, dtype=torch.float64).unsqueeze(-1)
        >>> y = torch.sin(6 * x[:, 0]) + 3.0
        >>> a = RandomFeatureGP(FourierFeatureKernel(32, seed=0).double(), noise=0.01)
        >>> adopt_prior_mean(a.fit(x, y - 3.0), torch.tensor(3.0, dtype=torch.float64))
        >>> b = RandomFeatureGP(FourierFeatureKernel(32, seed=0).double(), noise=0.01,
        ...                     prior_mean=3.0).fit(x, y)
        >>> torch.allclose(a.predict(x), b.predict(x), rtol=0, atol=1e-12)
        True
    """
    state = gp._current("adopt_prior_mean")
    if bool(gp.prior_mean.any()):
        raise ValueError("adopt_prior_mean: the model's prior mean must be zero before, got "
                         f"{gp.prior_mean}")
    gp.prior_mean = mean
    state.prior_mean = gp.prior_mean.detach().clone()
    if state.held is not None:
        state.held = [(x, shifted_targets(y, mean), noise) for x, y, noise in state.held]
