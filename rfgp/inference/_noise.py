r"""The layout of targets and noise: rows and output columns, and how the noise is laid over them.

The solvers see targets as a ``(R, T)`` matrix: ``R`` rows (``N`` points, or ``N p`` interleaved
rows, row ``n p + t``, for a kernel with ``p`` outputs per input) and ``T`` output columns. The
noise variance is one of

* the **model noise** (``RandomFeatureGP.noise``): a scalar or one value per output column. It is
  applied when the posterior is factorised, so it can change after fitting without a refit;
* a **fixed noise** given to ``fit``: a scalar, one value per row, per output, or per row and
  output, folded into the statistics :math:`\Phi^H S^{-1}\Phi` at fit time.

With ``p`` outputs per input a per-output model noise varies over the rows of the single column,
so it too is folded in at fit time (the layout remembers it as *frozen*). Columns whose noise is
equal on every row share one factorisation (:func:`equal_noise_columns`).

Internal: not part of the public API (see :mod:`rfgp.inference`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional, Tuple

import torch
from torch import Tensor

from rfgp._validation import check_tensor, describe
from rfgp.inference._prior_mean import add_mean_rows

__all__ = [
    "NoiseLayout",
    "check_model_noise",
    "check_noise_usable",
    "column_noise",
    "equal_noise_columns",
    "evidence_rows",
    "expand_noise",
    "model_noise_rows",
    "targets_as_rows",
]


def _as_noise_tensor(noise: Any, name: str) -> Tensor:
    if isinstance(noise, bool) or not isinstance(noise, (int, float, Tensor)):
        raise TypeError(f"{name} must be a positive float or a tensor, got {describe(noise)}")
    if not isinstance(noise, Tensor):
        noise = torch.as_tensor(noise, dtype=torch.float64)
    return check_tensor(name, noise)


def check_model_noise(noise: Any) -> Tensor:
    """The model noise as a tensor: a positive, finite scalar or 1-D tensor (one per output).

    Example:
        >>> check_model_noise(0.1)
        tensor(0.1000, dtype=torch.float64)
    """
    value = _as_noise_tensor(noise, "noise")
    if value.dim() > 1:
        raise ValueError(
            "noise (the model noise) must be a scalar or a 1-D tensor with one value per "
            f"output, got shape {tuple(value.shape)}; pass per-point noise to fit(noise=...)"
        )
    if bool((value <= 0).any()):
        raise ValueError(f"noise must be positive, got minimum {value.min().item():.3g}")
    return value


def check_noise_usable(noise: Tensor, dtype: torch.dtype) -> None:
    """At use: the model noise (possibly loaded from a state dict) is positive and finite in
    ``dtype``, the dtype of the fit."""
    if not bool(torch.isfinite(noise).all()) or bool((noise <= 0).any()):
        raise ValueError(
            f"noise (the model noise) must be positive and finite, got {noise.tolist()}; "
            "it was set through a state dict or in place; assign a valid value to gp.noise"
        )
    cast = noise.to(dtype)
    if not bool(torch.isfinite(cast).all()) or bool((cast <= 0).any()):
        raise ValueError(
            f"noise (the model noise) {noise.tolist()} is not representable in {dtype}; "
            "rescale the targets (noise scales with their square) or fit in float64"
        )


def targets_as_rows(y: Any, n: int, p: int, name: str = "y") -> Tuple[Tensor, int]:
    """``y`` as ``(R, T)`` rows by columns, and ``y.dim()``."""
    y = check_tensor(name, y)
    if p > 1:
        if y.shape != (n, p):
            raise ValueError(
                f"{name} must have shape (N, p) = ({n}, {p}) for a kernel with {p} outputs "
                f"per input, got {tuple(y.shape)}"
            )
        return y.reshape(n * p, 1), 2
    if y.dim() == 1 and y.shape[0] == n:
        return y.unsqueeze(-1), 1
    if y.dim() == 2 and y.shape[0] == n:
        if y.shape[1] == 0:
            raise ValueError(
                f"{name} must have at least one target column, got shape {tuple(y.shape)}"
            )
        return y, 2
    raise ValueError(f"{name} must have shape ({n},) or ({n}, T) to match x, got {tuple(y.shape)}")


def expand_noise(noise: Any, n: int, num_columns: int, p: int, name: str = "noise") -> Tensor:
    """A fixed noise as a ``(R, T)`` tensor (validated positive and finite)."""
    value = original = _as_noise_tensor(noise, name)
    target = (n, p) if p > 1 else (n, num_columns)
    if p == 1 and value.dim() == 1:
        if value.shape[0] != n:
            raise ValueError(
                f"{name} as a 1-D tensor must have one entry per point, shape ({n},), got "
                f"{tuple(value.shape)} (use shape (1, T) for one noise per output)"
            )
        value = value.unsqueeze(-1)
    if value.dim() > 2:
        raise ValueError(f"{name} must have at most 2 dimensions, got shape {tuple(value.shape)}")
    try:
        value = value.expand(*target) if value.dim() else value.reshape(1, 1).expand(*target)
    except RuntimeError:
        raise ValueError(
            f"{name} must be a scalar or broadcastable to {target}"
            + (f" (or of shape ({n},))" if p == 1 else f" (or of shape ({p},))")
            + f", got shape {tuple(original.shape)}"
        ) from None
    if bool((value <= 0).any()):
        raise ValueError(f"{name} must be positive, got minimum {value.min().item():.3g}")
    return value.reshape(n * p, 1) if p > 1 else value


def model_noise_rows(model_noise: Tensor, n: int, num_columns: int, p: int) -> Tensor:
    """The model noise laid over ``n`` points as a ``(R, T)`` tensor."""
    noise = model_noise
    if noise.dim() == 1:
        expected = p if p > 1 else num_columns
        if noise.shape[0] not in (1, expected):
            raise ValueError(
                f"noise (the model noise) has {noise.shape[0]} values but there are "
                f"{expected} outputs"
            )
        noise = noise.unsqueeze(0)
    return expand_noise(noise, n, num_columns, p)


def evidence_rows(feature_map: Any, model_noise: Tensor, x: Any, y: Any,
                  noise: Any, prior_mean: Optional[Tensor] = None) -> Tuple[Tensor, Tensor, Tensor]:
    """Checked ``x (N, d)``, targets ``(R, T)`` less the prior mean, and noise ``(R, T)``
    (``None``: the model noise) of a log marginal likelihood recomputed from data."""
    x = feature_map.check_input(x, "x")
    if x.shape[0] == 0:
        raise ValueError("x must hold at least one row for the log marginal likelihood, got 0")
    p = feature_map.outputs_per_input
    rows_y = targets_as_rows(y, x.shape[0], p)[0].to(x)
    rows_y = add_mean_rows(rows_y, prior_mean, p, sign=-1.0)
    if noise is None:
        return x, rows_y, model_noise_rows(model_noise, x.shape[0], rows_y.shape[1], p)
    return x, rows_y, expand_noise(noise, x.shape[0], rows_y.shape[1], p)


def column_noise(model_noise: Tensor, num_columns: int) -> Tensor:
    """The model noise per output column, ``(T,)``."""
    noise = model_noise.reshape(-1)
    if noise.numel() not in (1, num_columns):
        raise ValueError(
            f"noise (the model noise) has {noise.numel()} values but the model has "
            f"{num_columns} outputs"
        )
    return noise.expand(num_columns) if noise.numel() == 1 else noise


def equal_noise_columns(noise: Tensor) -> List[List[int]]:
    """Columns of ``noise (R, T)`` equal on every row, grouped in the sorted order of the distinct
    noise columns (that of ``torch.unique``).

    Example:
        >>> equal_noise_columns(torch.tensor([[1.0, 2.0, 1.0]]))
        [[0, 2], [1]]
    """
    ids = torch.unique(noise.transpose(0, 1), dim=0, return_inverse=True)[1]
    return [[int(c) for c in torch.nonzero(ids == gid).reshape(-1)] for gid in torch.unique(ids)]


@dataclass
class NoiseLayout:
    """How the noise of one fit is laid out.

    Attributes:
        num_columns: ``T``, output columns.
        y_ndim: ``y.dim()`` of the fitted targets (shapes the outputs).
        outputs_per_input: ``p``.
        fixed: a noise was given to ``fit`` (folded into the statistics).
        frozen: the model noise, when it was folded into the statistics because it varies over
            the rows of a column (``p > 1`` outputs with one noise each); else ``None``.
    """

    num_columns: int
    y_ndim: int
    outputs_per_input: int
    fixed: bool
    frozen: Optional[Tensor] = None

    @staticmethod
    def model_noise_varies_over_rows(model_noise: Tensor, p: int) -> bool:
        """Whether the model noise differs between the rows of one column."""
        return p > 1 and model_noise.numel() > 1

    @property
    def uses_model_noise(self) -> bool:
        """Whether the factorisation reads the current model noise (not folded in)."""
        return not self.fixed and self.frozen is None

    def frozen_noise_changed(self, model_noise: Tensor) -> bool:
        """Whether the model noise differs from the values folded into the statistics."""
        if self.frozen is None:
            return False
        return not torch.equal(self.frozen, model_noise.to(self.frozen))

    def check_batch(self, rows_y: Tensor, y_ndim: int, has_noise: bool, name: str) -> None:
        """A later batch (``update``, ``fit_stream``) must have the layout of the fit."""
        if rows_y.shape[1] != self.num_columns or y_ndim != self.y_ndim:
            raise ValueError(
                f"{name}: y must have the layout of the fitted targets ({self.num_columns} "
                f"output columns, {self.y_ndim}-D), got {rows_y.shape[1]} columns, {y_ndim}-D"
            )
        if has_noise != self.fixed:
            raise ValueError(
                f"{name}: noise must be "
                + (
                    "given (the model was fitted with a fixed noise)"
                    if self.fixed
                    else "None (the model was fitted with the model noise)"
                )
            )

    def shape_output(self, values: Tensor) -> Tensor:
        """``(..., R, T)`` -> ``(..., M)``, ``(..., M, T)`` or ``(..., M, p)``."""
        p = self.outputs_per_input
        if p > 1:
            return values.reshape(*values.shape[:-2], -1, p)
        return values.squeeze(-1) if self.y_ndim == 1 else values

    def state(self) -> dict:
        return {
            "num_columns": self.num_columns,
            "y_ndim": self.y_ndim,
            "outputs_per_input": self.outputs_per_input,
            "fixed": self.fixed,
            "frozen": self.frozen,
        }
