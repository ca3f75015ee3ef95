r"""Random features for the decomposable kernel :math:`K(x, z) = k(x, z)\,A`."""

from __future__ import annotations

import math
from typing import Any, Dict, Optional

import torch
from gpytorch.constraints import Positive
from gpytorch.kernels import Kernel, MaternKernel, MultitaskKernel, RBFKernel
from torch import Tensor

from rfgp._validation import check_bool, check_choice, check_int, check_positive_values
from rfgp.kernels._base import RandomFeatureKernel
from rfgp.kernels._fourier import MATERN_NU, sample_frequencies
from rfgp.kernels._vector_field.factors import OPERATOR_SAMPLINGS, operator_features

__all__ = ["DecomposableFeatureKernel"]


# ------------------------------------------------------------------ decomposable
class DecomposableFeatureKernel(RandomFeatureKernel):
    r"""Random features for the decomposable kernel :math:`K(x, z) = k(x, z)\,A`.

    :math:`k` is an RBF or Matérn kernel (lengthscale ``l``), :math:`A = BB^\top +
    \mathrm{diag}(v)` a learnable PSD ``num_tasks x num_tasks`` task covariance
    (``B``: ``num_tasks x rank``, ``v > 0`` if ``diagonal``), exactly GPyTorch's
    ``MultitaskKernel(base, num_tasks, rank)`` covariance. With :math:`\hat B = [B,
    \mathrm{diag}(\sqrt v)]` (``p'`` = ``rank`` + ``num_tasks`` columns, or ``rank``) and the
    scalar random Fourier map :math:`\phi` of :class:`~rfgp.kernels.FourierFeatureKernel`,

    .. math::
        \Phi(x)^\top = \hat B \otimes \phi(x)^\top, \qquad
        \hat K(x, z) = \Phi(x)^\top\Phi(z) = \hat k(x, z)\,A .

    Args:
        num_features: ``D``, columns of ``features(x)``; a multiple of ``2 p'``
            (``M = D / (2 p')`` frequencies).
        num_tasks: ``p``, outputs per input.
        rank: columns of ``B`` (0 allowed with ``diagonal=True``: independent outputs).
        diagonal: add the learnable diagonal ``diag(v)`` (makes ``A`` full rank).
        spectral: ``"rbf"``, ``"matern12"``, ``"matern32"``, ``"matern52"``.
        sampling: ``"iid"`` or ``"orthogonal"``.
        input_dim: ``d``; inferred from the first input when ``None``.
        seed: seed of the frequency draw.
        **kwargs: GPyTorch ``Kernel`` arguments (``ard_num_dims``, ``batch_shape``,
            ``active_dims``, lengthscale prior / constraint).

    Attributes:
        task_factor: ``(*batch, num_tasks, rank)`` parameter ``B`` (deterministic initial
            value: scaled cosine columns, so the global RNG is untouched).
        task_diag: ``(*batch, num_tasks)`` positive ``v`` (if ``diagonal``).
        task_covariance: ``A``.

    Shapes:
        ``features(x)``: ``(..., N, d) -> (..., N, num_tasks, D)``.

    Example:
        >>> k = DecomposableFeatureKernel(120, num_tasks=3, rank=1, seed=0).to(torch.float64)
        >>> x = torch.randn(4, 2, dtype=torch.float64)
        >>> k.features(x).shape
        torch.Size([4, 3, 120])
        >>> k(x).shape
        torch.Size([12, 12])

    References:
        Álvarez, Rosasco, Lawrence, *Kernels for vector-valued functions: a review*, 2012.
        Brault et al., ACML 2016 (decomposable ORFF).
    """

    has_lengthscale = True

    def __init__(
        self,
        num_features: int,
        num_tasks: int,
        rank: int = 1,
        diagonal: bool = True,
        spectral: str = "rbf",
        sampling: str = "iid",
        input_dim: Optional[int] = None,
        seed: Optional[int] = None,
        **kwargs: Any,
    ) -> None:
        check_int("num_tasks", num_tasks)
        check_int("rank", rank, minimum=0)
        check_bool("diagonal", diagonal)
        if rank == 0 and not diagonal:
            raise ValueError("rank must be >= 1 when diagonal=False (A would be zero), got 0")
        check_choice("spectral", spectral, MATERN_NU)
        check_choice("sampling", sampling, OPERATOR_SAMPLINGS)
        factor_cols = rank + (num_tasks if diagonal else 0)
        check_int("num_features", num_features)
        if num_features % (2 * factor_cols):
            raise ValueError(
                f"num_features must be a multiple of 2 * p' = {2 * factor_cols} (cos and sin "
                f"times p' = rank{' + num_tasks' if diagonal else ''} factor columns), got "
                f"{num_features}"
            )
        super().__init__(num_features=num_features, input_dim=input_dim, seed=seed, **kwargs)
        self.num_tasks = num_tasks
        self.rank = rank
        self.diagonal = diagonal
        self.spectral = spectral
        self.sampling = sampling
        self._outputs_per_input = num_tasks
        batch = self.batch_shape
        t = torch.arange(num_tasks, dtype=torch.get_default_dtype()).unsqueeze(-1)
        r = torch.arange(rank, dtype=torch.get_default_dtype())
        # Deterministic, non-degenerate start (distinct cosine columns): the global RNG stays
        # untouched and B = 0 would be a saddle point of A = B B^T.
        init = torch.cos(math.pi * (t + 0.5) * (r + 1) / num_tasks) / math.sqrt(max(rank, 1))
        init = init.expand(*batch, num_tasks, rank).clone()
        self.register_parameter("task_factor", torch.nn.Parameter(init))
        if diagonal:
            self.register_parameter("raw_task_diag",
                                    torch.nn.Parameter(torch.zeros(*batch, num_tasks)))
            self.register_constraint("raw_task_diag", Positive())

    @property
    def num_frequencies(self) -> int:
        return self.num_features // (2 * self.factor_columns)

    @property
    def factor_columns(self) -> int:
        """``p'``: columns of the task factor ``[B, diag(sqrt v)]``."""
        return self.rank + (self.num_tasks if self.diagonal else 0)

    @property
    def task_diag(self) -> Optional[Tensor]:
        if not self.diagonal:
            return None
        return self.raw_task_diag_constraint.transform(self.raw_task_diag)

    @task_diag.setter
    def task_diag(self, value) -> None:
        if not self.diagonal:
            raise AttributeError("task_diag is not defined for diagonal=False")
        value = check_positive_values("task_diag", value, self.raw_task_diag)
        self.initialize(raw_task_diag=self.raw_task_diag_constraint.inverse_transform(value))

    def full_task_factor(self) -> Tensor:
        """``[B, diag(sqrt v)]``: ``(*batch, num_tasks, p')``; ``A`` is its Gram matrix."""
        parts = [self.task_factor]
        if self.diagonal:
            parts.append(torch.diag_embed(self.task_diag.sqrt()))
        return torch.cat(parts, dim=-1)

    @property
    def task_covariance(self) -> Tensor:
        """``A = B B^T + diag(v)``: ``(*batch, num_tasks, num_tasks)``."""
        b = self.full_task_factor()
        return b @ b.transpose(-1, -2)

    def _sample_weights(self, input_dim: int, generator) -> Dict[str, Tensor]:
        w = sample_frequencies(self.num_frequencies, input_dim, self.spectral, self.sampling,
                               self.batch_shape, generator)
        return {"frequencies": w}

    def _features(self, x: Tensor) -> Tensor:
        omega = self.frequencies.to(x.dtype) / self.lengthscale.to(x.dtype)
        factor = self.full_task_factor().to(x.dtype).unsqueeze(-3)
        scale = 1.0 / math.sqrt(self.num_frequencies)
        return operator_features(x, omega, factor, scale)

    def exact_kernel(self) -> Kernel:
        """GPyTorch's ``MultitaskKernel`` with the same base lengthscale and ``A`` (a copy)."""
        kwargs = dict(ard_num_dims=self.ard_num_dims, batch_shape=self.batch_shape)
        nu = MATERN_NU[self.spectral]
        base = RBFKernel(**kwargs) if nu is None else MaternKernel(nu=nu, **kwargs)
        exact = MultitaskKernel(base, num_tasks=self.num_tasks, rank=max(self.rank, 1),
                                batch_shape=self.batch_shape, active_dims=self.active_dims)
        exact = exact.to(self.lengthscale)
        with torch.no_grad():
            exact.data_covar_module.lengthscale = self.lengthscale.detach().clone()
            index = exact.task_covar_module
            if self.rank > 0:
                index.covar_factor.copy_(self.task_factor.detach())
            else:
                index.covar_factor.zero_()
            if self.diagonal:
                index.var = self.task_diag.detach().clone()
            else:
                # softplus(-1e4) == 0 exactly: no diagonal term.
                index.raw_var.fill_(-1e4)
        return exact

    def weight_settings(self) -> Dict[str, Any]:
        return {**super().weight_settings(), "spectral": self.spectral,
                "sampling": self.sampling, "num_tasks": self.num_tasks, "rank": self.rank,
                "diagonal": self.diagonal}

    def extra_repr(self) -> str:
        return (f"num_features={self.num_features}, num_tasks={self.num_tasks}, "
                f"rank={self.rank}, diagonal={self.diagonal}, spectral={self.spectral!r}, "
                f"sampling={self.sampling!r}, input_dim={self.input_dim}")
