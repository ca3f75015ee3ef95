r"""The :class:`Solver` interface every posterior of a random-feature GP implements.

A solver owns one fit's factorisation, prediction, weight-space sampling, evidence, ``.to()`` and
checkpoint state. The exact solvers (:mod:`~rfgp.inference._solvers`) factorise a ``D x D`` or
``N x N`` matrix; the iterative one (:mod:`~rfgp.inference._cg_solver`) iterates on products.
Their factors of the weight posterior, :class:`WeightFactor` (and the function-space
:class:`KernelFactor`), are the shared currency of sampling and calibration.

Internal: not part of the public API (see :mod:`rfgp.inference`).
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Iterator, List, Optional, Tuple

import torch
from torch import Tensor

from rfgp._validation import check_generator
from rfgp.kernels._base import real_form

__all__ = ["KernelFactor", "Solver", "WeightFactor", "to_device"]


@dataclass
class WeightFactor:
    """``B = L L^H`` and the posterior mean weights ``B^{-1} Phi^H S^{-1} y`` of ``columns``."""

    columns: List[int]
    chol: Tensor  # (W, W), W = D (complex solve) or D_r
    mean_weights: Tensor  # (W, Tg)


@dataclass
class KernelFactor:
    """``K + S = L L^H`` and ``alpha = (K + S)^{-1} y`` of ``columns``."""

    columns: List[int]
    chol: Tensor  # (R, R)
    alpha: Tensor  # (R, Tg)


def to_device(tensor: Tensor, device: torch.device, dtype: torch.dtype) -> Tensor:
    """``tensor`` on ``device`` in ``dtype`` (its complex counterpart if it is complex)."""
    if tensor.is_complex():
        dtype = (torch.ones((), dtype=dtype) * 1j).dtype
    return tensor.to(device=device, dtype=dtype)


class Solver(ABC):
    """The posterior of one fit: factorisation, prediction, sampling and evidence.

    Args:
        complex_solve: solve with the complex features (else with their real form).
        jitter: value added to the diagonal before the first Cholesky.
        target_scale: the stored targets are the true ones divided by this power of two.
    """

    #: the value of ``RandomFeatureGP.solve_used`` for this solver
    name: str = ""
    #: the query rows of the prediction under way (over all its chunks; 0 when unknown): a
    #: solver may weigh a per-fit cost against them (see :meth:`expecting`)
    expected_rows: int = 0
    #: per target column ``(T,)``, the noise variance that the prediction under way adds to
    #: its variances (``observation_noise=True``; ``None``: the latent variances): a solver
    #: whose variances are approximate may hold them to its tolerance of the sum (see
    #: :meth:`observing`); the direct solvers' are exact either way
    variance_floor: Optional[Tensor] = None
    #: feature values of a prediction's chunk with variances (``None``: the model's default
    #: chunk): a solver whose variances cost a pass over the training rows per chunk asks
    #: for fewer, larger chunks
    variance_chunk_entries: Optional[int] = None

    def __init__(self, complex_solve: bool, jitter: Optional[float], target_scale: float) -> None:
        self.complex_solve = complex_solve
        self.jitter = jitter
        self.target_scale = target_scale

    @contextlib.contextmanager
    def expecting(self, rows: int) -> Iterator[None]:
        """Within the block, :attr:`expected_rows` is ``rows`` (a prediction's rows over all
        the chunks it is computed in)."""
        previous, self.expected_rows = self.expected_rows, rows
        try:
            yield
        finally:
            self.expected_rows = previous

    @contextlib.contextmanager
    def observing(self, noise: Optional[Tensor]) -> Iterator[None]:
        """Within the block, :attr:`variance_floor` is ``noise`` (per target column)."""
        previous, self.variance_floor = self.variance_floor, noise
        try:
            yield
        finally:
            self.variance_floor = previous

    def bind(self, feature_map) -> None:
        """Use ``feature_map`` (the model's kernel now) for any features the solver computes;
        the direct solvers compute none."""
        return None

    def solver_form(self, rows: Tensor) -> Tensor:
        """Feature rows as the solver uses them: complex, or their real form."""
        return rows if self.complex_solve else real_form(rows)

    @property
    @abstractmethod
    def num_rows(self) -> int:
        """Rows the posterior is conditioned on (``N p``)."""

    @property
    @abstractmethod
    def dtype(self) -> torch.dtype:
        """The real dtype of the factorisation."""

    @abstractmethod
    def factorise(self, column_noise: Optional[Tensor]) -> None:
        """(Re)factorise with the model noise per column ``(T,)`` (``None``: noise folded in)."""

    @abstractmethod
    def groups(self) -> List[List[int]]:
        """Output columns sharing one factorisation."""

    @abstractmethod
    def predict(self, rows: Tensor, want_root: bool):
        """Mean ``(M, T)``, variance ``(M, T)`` and per-group covariance roots at feature rows."""

    def predict_mean(self, rows: Tensor) -> Tensor:
        """The mean ``(M, T)`` alone (a solver whose variances cost more overrides it)."""
        return self.predict(rows, want_root=False)[0]

    @abstractmethod
    def weight_factors(self, column_noise: Optional[Tensor]) -> List[WeightFactor]:
        """The weight-space factors (the sampling distribution of the weights)."""

    @abstractmethod
    def log_evidence(self, column_noise: Optional[Tensor]) -> Tensor:
        """The log marginal likelihood of the conditioned data, summed over outputs."""

    @abstractmethod
    def to(self, device: torch.device, dtype: torch.dtype) -> None:
        """Move the solver's tensors."""

    @abstractmethod
    def state(self) -> dict:
        """Everything needed to rebuild the solver (tensors and plain values)."""

    def draw_weights(
        self,
        num_samples: int,
        generator: Optional[torch.Generator],
        column_noise: Optional[Tensor],
    ) -> List[Tuple[List[int], Tensor]]:
        r"""Posterior weight draws ``w = mu_w + L^{-H} z`` per group, ``(W, S, Tg)`` each, in the
        true target scale. Complex solves draw :math:`z = a + i b`, :math:`a, b \sim N(0, I)`."""
        check_generator("generator", generator)
        draws = []
        for factor in self.weight_factors(column_noise):
            width, tcols = factor.mean_weights.shape
            real_dtype = factor.chol.real.dtype
            device = generator.device if generator is not None else factor.chol.device
            shape = (width, num_samples * tcols)
            z = torch.randn(shape, generator=generator, dtype=real_dtype, device=device)
            if factor.chol.is_complex():
                imag = torch.randn(shape, generator=generator, dtype=real_dtype, device=device)
                z = torch.complex(z, imag)
            z = z.to(factor.chol.device)
            eps = torch.linalg.solve_triangular(factor.chol.transpose(0, 1).conj(), z, upper=True)
            mean = (factor.mean_weights * self.target_scale).unsqueeze(1)
            draws.append((factor.columns, mean + eps.reshape(width, num_samples, tcols)))
        return draws
