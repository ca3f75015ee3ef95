r"""``RandomFeatureGP``: exact GP inference with a random-feature kernel, in weight space.

For features :math:`\Phi(X) \in \mathbb{C}^{N \times D}` (rows :math:`\Phi(x_i)^\top`), real
targets :math:`y` and a diagonal noise :math:`S = \mathrm{diag}(\sigma_1^2, \dots, \sigma_N^2)`,
the GP with kernel :math:`\hat k(x, x') = \Phi(x)^\top \overline{\Phi(x')}` has the posterior
(Appendix D of Wacker, Kanagawa & Filippone, Eqs. 88-90, with the corrected conjugation)

.. math::
    B = \Phi^H S^{-1} \Phi + I_D, \qquad
    \mu(x) = \mathrm{Re}\{\Phi(x)^\top B^{-1} \Phi^H S^{-1} y\}, \qquad
    k_N(x, x') = \mathrm{Re}\{\Phi(x)^\top B^{-1} \overline{\Phi(x')}\},

at cost :math:`O(N D^2 + D^3)`, or equivalently (push-through identity) in function space with
the :math:`N \times N` matrix :math:`\Phi \Phi^H + S` at cost :math:`O(N^2 D + N^3)`. Real
features are the special case :math:`\mathrm{Im}\,\Phi = 0`.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterable, List, Optional, Sequence, Tuple, Union

import torch
from gpytorch.distributions import MultitaskMultivariateNormal, MultivariateNormal
from gpytorch.kernels import ScaleKernel
from linear_operator.operators import (
    ConstantMulLinearOperator,
    DiagLinearOperator,
    RootLinearOperator,
    SumLinearOperator,
)
from linear_operator.utils.errors import NotPSDError
from linear_operator.utils.warnings import NumericalWarning
from torch import Tensor

from rfgp.inference.statistics import FeatureStatistics
from rfgp.kernels.base import RandomFeatureKernel, real_form
from rfgp.kernels.composition import as_feature_kernel, is_composition
from rfgp.ops import check_finite

__all__ = ["ConvergenceWarning", "RandomFeatureGP", "robust_cholesky"]

_SOLVES = ("auto", "weight", "function")
_LOG_2PI = math.log(2.0 * math.pi)
# Rows per chunk aim at this many feature entries: large enough for efficient GEMMs, small
# enough that a chunk of features stays a few tens of MB.
_CHUNK_ENTRIES = 1 << 22
_MAX_JITTER_TRIES = 8
# optimize_hyperparameters: the log-noise stays within this distance of the log of the targets'
# mean square; the gradient max-norm of the per-datum loss below which it has converged.
_LOG_NOISE_RANGE = 25.0
_GRAD_TOLERANCE = 1e-4


class ConvergenceWarning(UserWarning):
    """An iterative optimisation stopped before it converged."""


def robust_cholesky(matrix: Tensor, jitter: Optional[float] = None, what: str = "matrix") -> Tensor:
    r"""Lower Cholesky factor of a Hermitian positive definite matrix, retrying with jitter.

    The first attempt adds ``jitter`` (``None``: nothing) to the diagonal. If the
    factorisation fails, it is retried with a jitter that starts at ``1e-10`` (float64) or
    ``1e-6`` (float32) times the mean absolute diagonal and grows tenfold per try, with a
    ``NumericalWarning`` naming the jitter finally used.

    Args:
        matrix: ``(n, n)`` real symmetric or complex Hermitian matrix.
        jitter: absolute value added to the diagonal before the first attempt.
        what: name of the matrix for messages.

    Returns:
        ``L`` lower triangular with ``L L^H = matrix + jitter I``.

    Raises:
        NotPSDError: if the matrix is not positive definite even with the largest jitter.

    Example:
        >>> a = torch.tensor([[4.0, 2.0], [2.0, 3.0]], dtype=torch.float64)
        >>> l = robust_cholesky(a)
        >>> torch.allclose(l @ l.T, a)
        True
    """
    base = matrix
    if jitter:
        base = matrix.clone()
        base.diagonal().add_(jitter)
    # NaN anywhere in the input reaches the diagonal of the factor, so checking it suffices.
    chol, info = torch.linalg.cholesky_ex(base)
    if int(info) == 0 and torch.isfinite(chol.diagonal()).all():
        return chol
    if not torch.isfinite(matrix).all():
        raise NotPSDError(f"the {what} holds NaN or infinite entries; check the inputs and noise")
    eye = torch.eye(matrix.shape[-1], dtype=matrix.dtype, device=matrix.device)
    scale = matrix.diagonal().abs().mean().item() or 1.0
    rel = 1e-10 if matrix.real.dtype == torch.float64 else 1e-6
    for attempt in range(_MAX_JITTER_TRIES):
        added = scale * rel * 10.0**attempt
        chol, info = torch.linalg.cholesky_ex(base + added * eye)
        if int(info) == 0 and torch.isfinite(chol.diagonal()).all():
            warnings.warn(
                f"Cholesky of the {what} failed; succeeded after adding {added:.3g} to the "
                "diagonal (the noise may be too small for this precision)",
                NumericalWarning,
            )
            return chol
    raise NotPSDError(
        f"Cholesky of the {what} failed even with {added:.3g} added to the diagonal; "
        "increase the noise or use float64"
    )


@dataclass
class _Factor:
    """One factorisation shared by the output columns ``columns``."""

    columns: List[int]
    chol: Tensor  # weight space: B = L L^H (D x D); function space: K + S = L L^H (R x R)
    weights: Tensor  # weight space: B^{-1} Phi^H S^{-1} y (D x Tg); function: (K + S)^{-1} y


def _check_tensor(value: Any, name: str) -> Tensor:
    if not isinstance(value, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if value.is_complex():
        raise TypeError(
            f"{name} must be real (regression targets and noise are real), got {value.dtype}"
        )
    if not value.is_floating_point():
        raise TypeError(f"{name} must have a floating dtype, got {value.dtype}")
    check_finite(name, value)
    return value


def _equal_noise_columns(noise: Tensor) -> List[List[int]]:
    """Columns of ``noise (R, T)`` equal on every row, grouped in the sorted order of the
    distinct noise columns (that of ``torch.unique``)."""
    ids = torch.unique(noise.transpose(0, 1), dim=0, return_inverse=True)[1]
    return [[int(c) for c in torch.nonzero(ids == gid).reshape(-1)] for gid in torch.unique(ids)]


class RandomFeatureGP(torch.nn.Module):
    r"""Gaussian-process regression with a random-feature kernel, solved in weight space.

    The model is :math:`y_{it} = f_t(x_i) + \varepsilon_{it}`, :math:`\varepsilon_{it} \sim
    N(0, \sigma_{it}^2)`, with independent outputs :math:`f_t \sim GP(0, \hat k)` and
    :math:`\hat k(x, x') = \Phi(x)^\top \overline{\Phi(x')}`. The prior mean is **zero**: centre
    the targets (and add the mean back) when they are not centred. With
    :math:`B = \Phi^H S^{-1} \Phi + I` the posterior is

    .. math::
        \mu(x) = \mathrm{Re}\{\Phi(x)^\top B^{-1} \Phi^H S^{-1} y\}, \qquad
        \mathrm{Cov}(x, x') = \mathrm{Re}\{\Phi(x)^\top B^{-1} \overline{\Phi(x')}\}.

    Complex features use this complex posterior (Hermitian ``B``, complex Cholesky, real parts
    of mean and covariance), as in the paper; ``complex_posterior=False`` instead uses the real
    GP with kernel :math:`\mathrm{Re}\,\hat k`, i.e. the real features
    :math:`[\mathrm{Re}\,\Phi, \mathrm{Im}\,\Phi]` (what GPyTorch computes with the same
    kernel). The two differ unless :math:`\mathrm{Im}\,\hat K = 0`.

    ``fit`` accumulates :math:`\Phi^H S^{-1}\Phi` over row chunks, so the ``N x D`` feature
    matrix never exists and the memory is ``O(D^2 + chunk D)``; with ``solve="auto"`` the
    ``N x N`` function-space solve is used instead when it is cheaper (``N`` below about ``D``).
    Outputs whose noise is equal share one factorisation; outputs with different noise get one
    each. The statistics add up over chunks (:meth:`fit_stream`, :meth:`update`) and over
    processes (``fit(..., distributed=True)``).

    Targets and noise:

    * ``y`` of shape ``(N,)`` or ``(N, T)`` (``T`` independent outputs). For a kernel with
      ``p`` outputs per input (``features(x)`` of shape ``(N, p, D)``), ``y`` is ``(N, p)`` and
      the rows are taken in GPyTorch's interleaved order (row ``n p + t``).
    * The noise passed to ``fit`` is fixed (heteroscedastic allowed): a scalar, ``(N,)`` (one
      variance per point, shared by all outputs), or anything broadcastable to ``(N, T)`` with
      two dimensions (e.g. ``(1, T)`` per output, ``(N, T)`` per point and output). For ``p``
      outputs per input: a scalar, ``(p,)`` per output, or broadcastable to ``(N, p)``.
    * Without a ``noise`` argument the model noise :attr:`noise` is used (a positive scalar,
      or one value per output). Then the statistics are stored unweighted and :attr:`noise` can
      be changed after fitting (:meth:`select_noise`, :meth:`optimize_hyperparameters`).

    Args:
        kernel: a :class:`~rfgp.kernels.RandomFeatureKernel`, a
            ``gpytorch.kernels.ScaleKernel`` around one (features times
            ``sqrt(outputscale)``), or a sum / product tree of them (built with ``+``, ``*``,
            ``ScaleKernel``), which :func:`~rfgp.kernels.as_feature_kernel` turns into one
            feature map sharing the tree's parameters (then :attr:`kernel` is that
            :class:`~rfgp.kernels.ComposedFeatureKernel`). Kernels with a ``batch_shape`` are
            not supported.
        noise: model noise variance, a positive scalar or a 1-D tensor with one value per
            output (``T`` or ``p``).
        complex_posterior: for complex features, use the complex posterior (default) or the
            real form ``[Re, Im]``. Ignored for real features.
        solve: ``"auto"`` (cheaper of the two by operation count), ``"weight"`` (``D x D``) or
            ``"function"`` (``N x N``).
        jitter: value added to the diagonal before the first Cholesky (default none); failed
            factorisations always retry with growing jitter and warn.
        correct_variance: add ``kernel.variance_correction(x)`` (times the outputscale) to the
            predictive variance, when the kernel defines it.
        chunk_size: rows per chunk when accumulating and predicting (default: about
            ``4 * 10^6 / D`` rows).

    Attributes:
        noise (Tensor): the model noise variance (a buffer; assignable).
        num_data (int): number of rows the posterior is conditioned on.
        solve_used (str): ``"weight"`` or ``"function"`` after fitting.

    Example:
        >>> from rfgp.kernels import FourierFeatureKernel
        >>> g = torch.Generator().manual_seed(0)
        >>> x = torch.rand(200, 2, generator=g, dtype=torch.float64)
        >>> y = torch.sin(6 * x[:, 0]) + 0.1 * torch.randn(200, generator=g, dtype=torch.float64)
        >>> gp = RandomFeatureGP(FourierFeatureKernel(256, seed=0), noise=0.01).fit(x, y)
        >>> mean, std = gp.predict(x[:5], return_std=True)
        >>> bool((mean - y[:5]).abs().max() < 0.5), mean.shape, std.shape
        (True, torch.Size([5]), torch.Size([5]))

    References:
        Wacker, Kanagawa, Filippone, *Improved Random Features for Dot Product Kernels*,
        Appendix D (GPs with complex random features), 2022.
        Rasmussen & Williams, *Gaussian Processes for Machine Learning*, Sec. 2.1 (weight-space
        view), 2006.
    """

    def __init__(
        self,
        kernel: Union[RandomFeatureKernel, ScaleKernel],
        noise: Union[float, Tensor] = 1.0,
        complex_posterior: bool = True,
        solve: str = "auto",
        jitter: Optional[float] = None,
        correct_variance: bool = False,
        chunk_size: Optional[int] = None,
    ) -> None:
        super().__init__()
        # Sums and products of feature kernels: one feature map sharing the tree's parameters.
        kernel = as_feature_kernel(kernel) if is_composition(kernel) else kernel
        if isinstance(kernel, ScaleKernel):
            base = kernel.base_kernel
        else:
            base = kernel
        if not isinstance(base, RandomFeatureKernel):
            raise TypeError(
                "kernel must be a RandomFeatureKernel or a gpytorch ScaleKernel around one, got "
                f"{type(kernel).__name__}"
                + (f"({type(base).__name__})" if isinstance(kernel, ScaleKernel) else "")
            )
        if len(base.batch_shape) or len(kernel.batch_shape):
            raise ValueError(
                f"kernel must have an empty batch_shape, got {tuple(kernel.batch_shape)}"
            )
        if solve not in _SOLVES:
            raise ValueError(f"solve must be one of {_SOLVES}, got {solve!r}")
        if not isinstance(complex_posterior, bool):
            raise TypeError(
                f"complex_posterior must be a bool, got {type(complex_posterior).__name__}"
            )
        if jitter is not None and (not isinstance(jitter, (int, float)) or jitter < 0):
            raise ValueError(f"jitter must be None or a non-negative float, got {jitter!r}")
        self._check_chunk_size(chunk_size)
        self.kernel = kernel
        self.complex_posterior = complex_posterior
        self.solve = solve
        self.jitter = jitter
        self.correct_variance = bool(correct_variance)
        self.chunk_size = chunk_size
        self.register_buffer("noise", self._check_model_noise(noise))
        self._reset()

    # ================================================================== helpers: validation
    @staticmethod
    def _check_chunk_size(chunk_size: Optional[int]) -> None:
        if chunk_size is not None and (
            not isinstance(chunk_size, int) or isinstance(chunk_size, bool) or chunk_size < 1
        ):
            raise ValueError(f"chunk_size must be None or a positive integer, got {chunk_size!r}")

    @staticmethod
    def _check_model_noise(noise: Union[float, Tensor]) -> Tensor:
        if isinstance(noise, bool) or not isinstance(noise, (int, float, Tensor)):
            raise TypeError(
                f"noise must be a positive float or a tensor, got {type(noise).__name__}"
            )
        value = (
            torch.as_tensor(noise, dtype=torch.float64) if not isinstance(noise, Tensor) else noise
        )
        _check_tensor(value, "noise")
        if value.dim() > 1:
            raise ValueError(
                "noise (the model noise) must be a scalar or a 1-D tensor with one value per "
                f"output, got shape {tuple(value.shape)}; pass per-point noise to fit(noise=...)"
            )
        if (value <= 0).any():
            raise ValueError(f"noise must be positive, got minimum {value.min().item():.3g}")
        return value

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "noise" and "_buffers" in self.__dict__ and "noise" in self._buffers:
            value = self._check_model_noise(value)
        super().__setattr__(name, value)

    # ================================================================== helpers: kernel
    @property
    def base_kernel(self) -> RandomFeatureKernel:
        """The :class:`RandomFeatureKernel` (inside the ``ScaleKernel``, if any)."""
        return self.kernel.base_kernel if isinstance(self.kernel, ScaleKernel) else self.kernel

    @property
    def outputs_per_input(self) -> int:
        """``p``: outputs per input of the kernel (1 for scalar kernels)."""
        return int(self.base_kernel.num_outputs_per_input())

    @property
    def _complex_solve(self) -> bool:
        return bool(self.base_kernel.is_complex) and self.complex_posterior

    def _scale_features(self, phi: Tensor) -> Tensor:
        """Flatten ``(M, p, D)`` to interleaved rows and apply ``sqrt(outputscale)``."""
        if phi.dim() == 3:
            phi = phi.reshape(phi.shape[0] * phi.shape[1], phi.shape[2])
        if isinstance(self.kernel, ScaleKernel):
            scale = self.kernel.outputscale.sqrt().to(phi.real.dtype)
            phi = phi * scale
        return phi

    def _row_features(self, x: Tensor) -> Tensor:
        """Rows of the features at ``x`` (complex or real, outputscale applied)."""
        return self._scale_features(self.base_kernel.features(x))

    def _solver_form(self, rows: Tensor) -> Tensor:
        return rows if self._complex_solve else real_form(rows)

    def _default_chunk(self, width: int) -> int:
        if self.chunk_size is not None:
            return self.chunk_size
        return max(256, _CHUNK_ENTRIES // max(1, width))

    def _variance_correction(self, x: Tensor) -> Optional[Tensor]:
        if not self.correct_variance:
            return None
        hook = getattr(self.base_kernel, "variance_correction", None)
        if hook is None:
            return None
        corr = hook(x)
        if isinstance(self.kernel, ScaleKernel):
            corr = corr * self.kernel.outputscale.to(corr.dtype)
        return corr.reshape(-1)

    # ================================================================== helpers: targets
    def _reset(self) -> None:
        self._mode: Optional[str] = None  # "weight" | "function"
        self._stats: Optional[FeatureStatistics] = None
        self._train_rows: Optional[Tensor] = None
        self._train_y: Optional[Tensor] = None
        self._train_noise: Optional[Tensor] = None
        self._factors: Optional[List[_Factor]] = None
        self._weight_factor_cache: Optional[List[_Factor]] = None
        self._num_columns = 0
        self._y_ndim = 1
        self._fixed_noise = False  # noise given to fit (weights frozen into the statistics)
        self._frozen_model_noise: Optional[Tensor] = None
        self._factor_noise: Optional[Tensor] = None

    @property
    def is_fitted(self) -> bool:
        return self._mode is not None

    @property
    def solve_used(self) -> Optional[str]:
        return self._mode

    @property
    def num_data(self) -> int:
        if self._mode == "weight":
            return self._stats.count // self.outputs_per_input
        if self._mode == "function":
            return self._train_rows.shape[0] // self.outputs_per_input
        return 0

    @property
    def factorization_groups(self) -> List[List[int]]:
        """Output columns sharing one factorisation (equal noise), after fitting."""
        return [list(f.columns) for f in self._current_factors()]

    def _require_fit(self, what: str) -> None:
        if not self.is_fitted:
            raise RuntimeError(
                f"RandomFeatureGP.{what}: the model is not fitted; call fit(x, y) first"
            )

    def _targets(self, x: Tensor, y: Any, name: str = "y") -> Tuple[Tensor, int]:
        """``y`` as ``(rows, T)`` rows-by-columns; returns it and ``y.dim()``."""
        y = _check_tensor(y, name)
        n = x.shape[0]
        p = self.outputs_per_input
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
            return y, 2
        raise ValueError(
            f"{name} must have shape ({n},) or ({n}, T) to match x, got {tuple(y.shape)}"
        )

    def _expand_noise(self, noise: Any, n: int, num_columns: int, name: str = "noise") -> Tensor:
        """Noise as a ``(rows, T)`` tensor (validated positive and finite)."""
        if isinstance(noise, bool) or not isinstance(noise, (int, float, Tensor)):
            raise TypeError(f"{name} must be a float or a tensor, got {type(noise).__name__}")
        noise = (
            torch.as_tensor(noise, dtype=torch.float64) if not isinstance(noise, Tensor) else noise
        )
        _check_tensor(noise, name)
        p = self.outputs_per_input
        target = (n, p) if p > 1 else (n, num_columns)
        value = noise
        if p == 1 and value.dim() == 1:
            if value.shape[0] != n:
                raise ValueError(
                    f"{name} as a 1-D tensor must have one entry per point, shape ({n},), got "
                    f"{tuple(value.shape)} (use shape (1, T) for one noise per output)"
                )
            value = value.unsqueeze(-1)
        if value.dim() > 2:
            raise ValueError(
                f"{name} must have at most 2 dimensions, got shape {tuple(value.shape)}"
            )
        try:
            value = value.expand(*target) if value.dim() else value.reshape(1, 1).expand(*target)
        except RuntimeError:
            raise ValueError(
                f"{name} must be a scalar or broadcastable to {target}"
                + (f" (or of shape ({n},))" if p == 1 else f" (or of shape ({p},))")
                + f", got shape {tuple(noise.shape)}"
            ) from None
        if (value <= 0).any():
            raise ValueError(f"{name} must be positive, got minimum {value.min().item():.3g}")
        return value.reshape(n * p, 1) if p > 1 else value

    def _model_noise_rows(self, n: int, num_columns: int) -> Tensor:
        noise = self.noise
        p = self.outputs_per_input
        if noise.dim() == 1:
            expected = p if p > 1 else num_columns
            if noise.shape[0] not in (1, expected):
                raise ValueError(
                    f"noise (the model noise) has {noise.shape[0]} values but there are "
                    f"{expected} outputs"
                )
            noise = noise.unsqueeze(0)
        return self._expand_noise(noise, n, num_columns)

    def _model_noise_uniform(self) -> bool:
        """Whether the model noise is constant over rows within each column."""
        return self.outputs_per_input == 1 or self.noise.numel() == 1

    def _column_noise(self) -> Tensor:
        """The model noise per output column ``(T,)`` (for unweighted statistics)."""
        noise = self.noise.reshape(-1)
        if noise.numel() not in (1, self._num_columns):
            raise ValueError(
                f"noise (the model noise) has {noise.numel()} values but the model has "
                f"{self._num_columns} outputs"
            )
        return noise.expand(self._num_columns) if noise.numel() == 1 else noise

    # ================================================================== fitting
    def _prepare(
        self, x: Tensor, y: Any, noise: Any
    ) -> Tuple[Tensor, Tensor, Optional[Tensor], int]:
        """Validate a batch: ``x``, ``Y (rows, T)``, noise ``(rows, T)`` or None, ``y.dim()``."""
        x = self.base_kernel._check_input(x, "x")
        if x.dim() != 2:
            raise ValueError(f"x must have shape (N, d), got {tuple(x.shape)}")
        if x.shape[0] == 0:
            raise ValueError("x must hold at least one row, got 0")
        rows_y, y_ndim = self._targets(x, y)
        rows_y = rows_y.to(device=x.device, dtype=x.dtype)
        num_columns = rows_y.shape[1]
        if noise is not None:
            rows_noise = self._expand_noise(noise, x.shape[0], num_columns)
        elif not self._model_noise_uniform():
            rows_noise = self._model_noise_rows(x.shape[0], num_columns)
        else:
            rows_noise = None
        if rows_noise is not None:
            rows_noise = rows_noise.to(device=x.device, dtype=x.dtype)
        return x, rows_y, rows_noise, y_ndim

    def _maybe_allocate(self, x: Tensor, distributed: bool) -> None:
        base = self.base_kernel
        if getattr(base, "needs_allocation", False):
            if distributed:
                raise RuntimeError(
                    f"{type(base).__name__} needs a data-dependent allocation; call "
                    "kernel.allocate(x) on the same data in every process before a distributed fit"
                )
            base.allocate(x)

    def _sync_kernel_weights(self, x: Tensor, process_group) -> None:
        """Give every process rank 0's random weights (they must define the same features)."""
        import torch.distributed as dist

        base = self.base_kernel
        base._ensure_weights(
            x[:1] if base.active_dims is None else x[:1].index_select(-1, base.active_dims)
        )
        src = 0 if process_group is None else dist.get_global_rank(process_group, 0)
        for name in base._random_buffer_names:
            dist.broadcast(getattr(base, name), src=src, group=process_group)

    def _new_stats(self, num_columns: int, weighted: bool, like: Tensor) -> FeatureStatistics:
        return FeatureStatistics(
            self.base_kernel.num_real_features, num_columns, weighted, like.dtype, like.device
        )

    def _accumulate(
        self,
        stats: FeatureStatistics,
        x: Tensor,
        rows_y: Tensor,
        rows_noise: Optional[Tensor],
        chunk: Optional[int],
    ) -> None:
        p = self.outputs_per_input
        step = chunk or self._default_chunk(self.base_kernel.num_real_features * p)
        with torch.no_grad():
            for start in range(0, x.shape[0], step):
                stop = min(start + step, x.shape[0])
                z = real_form(self._row_features(x[start:stop]))
                sl = slice(start * p, stop * p)
                stats.add(z, rows_y[sl], None if rows_noise is None else rows_noise[sl])

    def _choose_solve(self, rows: int) -> str:
        if self.solve != "auto":
            return self.solve
        width = (
            self.base_kernel.num_features
            if self._complex_solve
            else self.base_kernel.num_real_features
        )
        weight_cost = rows * width**2 + width**3 / 3
        function_cost = rows**2 * width + rows**3 / 3
        return "function" if function_cost < weight_cost else "weight"

    def fit(
        self,
        x: Tensor,
        y: Tensor,
        noise: Optional[Union[float, Tensor]] = None,
        *,
        chunk_size: Optional[int] = None,
        distributed: bool = False,
        process_group: Any = None,
    ) -> RandomFeatureGP:
        r"""Condition on data: accumulate the statistics and factorise.

        Args:
            x: ``(N, d)`` inputs (1-D means ``d = 1``).
            y: ``(N,)`` or ``(N, T)`` targets; ``(N, p)`` for ``p`` outputs per input.
            noise: fixed noise variances (see the class docstring for shapes); ``None`` uses
                the model noise :attr:`noise`.
            chunk_size: rows per chunk (default: the constructor's, or about
                ``4 * 10^6 / D`` rows).
            distributed: data-parallel fit over ``torch.distributed``: every process passes its
                own shard, the statistics are all-reduced and every process ends with the same
                posterior. The kernel's random weights are broadcast from rank 0 first.
                Always uses the weight-space solve.
            process_group: a ``torch.distributed`` process group (implies ``distributed``).

        Returns:
            ``self``.
        """
        self._check_chunk_size(chunk_size)
        distributed = distributed or process_group is not None
        x, rows_y, rows_noise, y_ndim = self._prepare(x, y, noise)
        self._begin(x, rows_y, y_ndim, noise is not None, distributed, process_group)
        mode = "weight" if distributed else self._choose_solve(rows_y.shape[0])
        if mode == "function":
            with torch.no_grad():
                self._train_rows = self._row_features(x)
            self._train_y = rows_y
            self._train_noise = rows_noise
            self._mode = "function"
        else:
            stats = self._new_stats(rows_y.shape[1], rows_noise is not None, x)
            self._accumulate(stats, x, rows_y, rows_noise, chunk_size)
            if distributed:
                stats.all_reduce(process_group)
            self._stats = stats
            self._mode = "weight"
        self._factorize()
        return self

    def _begin(
        self,
        x: Tensor,
        rows_y: Tensor,
        y_ndim: int,
        fixed_noise: bool,
        distributed: bool,
        process_group: Any,
    ) -> None:
        """Start a fit (``fit``, ``fit_stream``) on its first, prepared batch: allocate and
        share the kernel's weights, drop the previous fit and record the data layout."""
        self._maybe_allocate(x, distributed)
        if distributed:
            self._sync_kernel_weights(x, process_group)
        self._reset()
        self._num_columns = rows_y.shape[1]
        self._y_ndim = y_ndim
        self._fixed_noise = fixed_noise
        if not fixed_noise and not self._model_noise_uniform():
            self._frozen_model_noise = self.noise.detach().clone()

    def _check_batch_layout(self, rows_y: Tensor, y_ndim: int, noise: Any, name: str) -> None:
        if rows_y.shape[1] != self._num_columns or y_ndim != self._y_ndim:
            raise ValueError(
                f"{name}: y must have the layout of the fitted targets "
                f"({self._num_columns} output columns, {self._y_ndim}-D), got {rows_y.shape[1]} "
                f"columns, {y_ndim}-D"
            )
        if (noise is not None) != self._fixed_noise:
            raise ValueError(
                f"{name}: noise must be "
                + (
                    "given (the model was fitted with a fixed noise)"
                    if self._fixed_noise
                    else "None (the model was fitted with the model noise)"
                )
            )

    def fit_stream(
        self,
        batches: Iterable[Sequence[Tensor]],
        progress: bool = False,
        *,
        distributed: bool = False,
        process_group: Any = None,
        total: Optional[int] = None,
    ) -> RandomFeatureGP:
        r"""Fit on data that arrive in chunks, in ``O(D^2)`` memory.

        Each batch is ``(x, y)`` or ``(x, y, noise)`` (all batches alike), with the shapes of
        :meth:`fit`. The statistics :math:`\Phi^H S^{-1}\Phi`, :math:`\Phi^H S^{-1} y`,
        :math:`y^\top S^{-1} y` and ``N`` are summed over batches; the result equals ``fit`` on
        the concatenated data (weight-space solve).

        Args:
            batches: an iterable of ``(x, y[, noise])`` tuples (a generator, a DataLoader...).
            progress: show a ``tqdm`` progress bar (``tqdm`` is imported only then).
            distributed, process_group: as in :meth:`fit` (each process streams its shard).
            total: number of batches, for the progress bar.

        Returns:
            ``self``.
        """
        if self.solve == "function":
            raise ValueError("fit_stream needs the weight-space solve; got solve='function'")
        distributed = distributed or process_group is not None
        iterator = iter(batches)
        if progress:
            from tqdm.auto import tqdm

            iterator = iter(tqdm(iterator, total=total, desc="fit_stream", unit="batch"))
        stats = None
        for index, batch in enumerate(iterator):
            x, y, noise = self._unpack_batch(batch, index)
            x, rows_y, rows_noise, y_ndim = self._prepare(x, y, noise)
            if stats is None:
                self._begin(x, rows_y, y_ndim, noise is not None, distributed, process_group)
                stats = self._new_stats(rows_y.shape[1], rows_noise is not None, x)
            else:
                self._check_batch_layout(rows_y, y_ndim, noise, f"fit_stream (batch {index})")
            self._accumulate(stats, x, rows_y, rows_noise, None)
        if stats is None:
            raise ValueError("batches must yield at least one (x, y) batch, got none")
        if distributed:
            stats.all_reduce(process_group)
        self._stats = stats
        self._mode = "weight"
        self._factorize()
        return self

    @staticmethod
    def _unpack_batch(batch: Any, index: int) -> Tuple[Tensor, Tensor, Any]:
        if not isinstance(batch, (tuple, list)) or len(batch) not in (2, 3):
            raise ValueError(
                f"batches must yield (x, y) or (x, y, noise) tuples; batch {index} is "
                f"{type(batch).__name__}"
                + (f" of length {len(batch)}" if isinstance(batch, (tuple, list)) else "")
            )
        return batch[0], batch[1], (batch[2] if len(batch) == 3 else None)

    def update(
        self,
        x: Tensor,
        y: Tensor,
        noise: Optional[Union[float, Tensor]] = None,
        *,
        distributed: bool = False,
        process_group: Any = None,
    ) -> RandomFeatureGP:
        """Condition the fitted model on more data (equals refitting on all data).

        Args:
            x, y, noise: as in :meth:`fit`; the layout (outputs, noise given or not) must match
                the fit.
            distributed, process_group: all-reduce the new statistics across processes.

        Returns:
            ``self``.
        """
        self._require_fit("update")
        distributed = distributed or process_group is not None
        x, rows_y, rows_noise, y_ndim = self._prepare(x, y, noise)
        self._check_batch_layout(rows_y, y_ndim, noise, "update")
        if self._mode == "function" and not distributed:
            with torch.no_grad():
                rows = self._row_features(x)
            self._train_rows = torch.cat([self._train_rows, rows])
            self._train_y = torch.cat([self._train_y, rows_y])
            if rows_noise is not None:
                self._train_noise = torch.cat([self._train_noise, rows_noise])
            if self._choose_solve(self._train_y.shape[0]) == "weight":
                self._function_to_weight()
        else:
            if self._mode == "function":
                self._function_to_weight()
            stats = self._new_stats(self._num_columns, rows_noise is not None, x)
            self._accumulate(stats, x, rows_y, rows_noise, None)
            if distributed:
                stats.all_reduce(process_group)
            self._stats.merge(stats)
        self._factorize()
        return self

    def _stats_from_rows(self) -> FeatureStatistics:
        """The weight-space statistics of the rows stored by a function-space fit."""
        z = real_form(self._train_rows)
        stats = self._new_stats(self._num_columns, self._train_noise is not None, z)
        stats.add(z, self._train_y, self._train_noise)
        return stats

    def _function_to_weight(self) -> None:
        self._stats = self._stats_from_rows()
        self._train_rows = self._train_y = self._train_noise = None
        self._mode = "weight"

    # ================================================================== factorisation
    def _weight_specs(self, stats: FeatureStatistics):
        """(columns, G, h, yy, sum log noise) per factorisation, all ``S^{-1}``-weighted."""
        specs = []
        if stats.weighted:
            for g, cols in enumerate(stats.column_groups()):
                specs.append(
                    (
                        cols,
                        stats.gram(g),
                        stats.rhs[:, cols],
                        stats.yy[cols],
                        stats.log_noise_sum[cols],
                    )
                )
            return specs
        col_noise = self._column_noise().to(device=stats.device, dtype=stats.dtype)
        gram = stats.gram(0)
        for cols in _equal_noise_columns(col_noise.unsqueeze(0)):
            value = col_noise[cols[0]]
            specs.append(
                (
                    cols,
                    gram / value,
                    stats.rhs[:, cols] / value,
                    stats.yy[cols] / value,
                    torch.full(
                        (len(cols),),
                        stats.count * math.log(value.item()),
                        dtype=stats.dtype,
                        device=stats.device,
                    ),
                )
            )
        return specs

    def _weight_factor(self, cols: List[int], gram: Tensor, rhs: Tensor) -> _Factor:
        """Factor ``B = G + I``; ``gram`` (``G``, a fresh matrix from ``_weight_specs``) may be
        overwritten."""
        width = gram.shape[0]
        if self._complex_solve:
            half = width // 2
            real = gram[:half, :half] + gram[half:, half:]
            cross = gram[:half, half:]
            bmat = torch.complex(real, cross - cross.transpose(0, 1))
            rhs = torch.complex(rhs[:half], -rhs[half:])
            width = half
        else:
            bmat = gram  # no copy: every caller passes a matrix of its own (stats.gram, G / s)
        # The statistics' Gram is exactly symmetric (symmetrize_upper) and the Cholesky reads
        # one triangle only, so no symmetrisation pass is needed: just B = G + I in place.
        bmat.diagonal().add_(1.0)
        chol = robust_cholesky(bmat, self.jitter, "weight-space matrix B")
        weights = torch.cholesky_solve(rhs.to(chol.dtype), chol)
        return _Factor(cols, chol, weights)

    def _function_groups(self) -> List[Tuple[List[int], Tensor]]:
        """(columns, noise (R,)) per factorisation of the function-space solve."""
        if self._train_noise is None:
            col_noise = self._column_noise().to(self._train_y)
            return [
                (cols, col_noise[cols[0]].expand(self._train_y.shape[0]))
                for cols in _equal_noise_columns(col_noise.unsqueeze(0))
            ]
        groups = [
            (cols, self._train_noise[:, cols[0]])
            for cols in _equal_noise_columns(self._train_noise)
        ]
        return sorted(groups, key=lambda g: g[0][0])

    def _function_factor(self, cols: List[int], noise: Tensor, kmat: Tensor) -> _Factor:
        """Factor ``K + S`` for the columns ``cols`` of noise ``(R,)``, ``kmat = Phi Phi^H``."""
        kmat = kmat + torch.diag(noise.to(kmat.dtype))
        kmat = 0.5 * (kmat + kmat.transpose(0, 1).conj())
        chol = robust_cholesky(kmat, self.jitter, "function-space matrix K + S")
        alpha = torch.cholesky_solve(self._train_y[:, cols].to(chol.dtype), chol)
        return _Factor(cols, chol, alpha)

    def _check_frozen_noise(self) -> None:
        # Per-output model noise that varies over the rows of one output column was expanded
        # into row noise at fit time (in the weight statistics or the stored function-space
        # rows): a later change of the model noise cannot reach it.
        if self._frozen_model_noise is not None and not torch.equal(
            self._frozen_model_noise, self.noise.to(self._frozen_model_noise)
        ):
            raise RuntimeError(
                "the model noise changed since fit, but its per-output values were folded "
                "into the statistics; call fit again"
            )

    def _factorize(self) -> None:
        self._check_frozen_noise()
        self._weight_factor_cache = None
        with torch.no_grad():
            if self._mode == "weight":
                self._factors = [
                    self._weight_factor(cols, g, h)
                    for cols, g, h, _, _ in self._weight_specs(self._stats)
                ]
            else:
                groups = self._function_groups()
                # K = Phi Phi^H is shared by all groups; only the noise diagonal differs.
                rows = self._solver_form(self._train_rows)
                kmat = rows @ rows.transpose(0, 1).conj()
                self._factors = [self._function_factor(cols, s, kmat) for cols, s in groups]
        self._factor_noise = self.noise.detach().clone()

    def _current_factors(self) -> List[_Factor]:
        self._require_fit("posterior")
        if not self._fixed_noise and not torch.equal(self._factor_noise, self.noise):
            self._factorize()  # the model noise was reassigned since the last factorisation
        return self._factors

    def _weight_factors(self) -> List[_Factor]:
        """Weight-space factors (computed from the stored rows after a function-space fit)."""
        factors = self._current_factors()
        if self._mode == "weight":
            return factors
        if self._weight_factor_cache is None:
            stats = self._stats_from_rows()
            with torch.no_grad():
                self._weight_factor_cache = [
                    self._weight_factor(cols, g, h)
                    for cols, g, h, _, _ in self._weight_specs(stats)
                ]
        return self._weight_factor_cache

    # ================================================================== prediction
    def _predict_rows(self, rows: Tensor, want_root: bool):
        """Mean ``(M, T)``, variance ``(M, T)`` and per-factor covariance roots for feature rows."""
        factors = self._current_factors()
        feats = self._solver_form(rows)
        dtype = feats.real.dtype
        mean = feats.new_zeros(feats.shape[0], self._num_columns, dtype=dtype)
        var = feats.new_zeros(feats.shape[0], self._num_columns, dtype=dtype)
        roots = []
        if self._mode == "function":
            # Shared by all factors: only the Cholesky factor and weights differ per group.
            train = self._solver_form(self._train_rows)
            cross = feats @ train.transpose(0, 1).conj()  # k_hat(x, x_i), (M, R)
            prior = feats.real.square().sum(-1) + (
                feats.imag.square().sum(-1) if feats.is_complex() else 0
            )
        for factor in factors:
            chol = factor.chol.to(feats.dtype) if feats.is_complex() else factor.chol
            if self._mode == "weight":
                mean[:, factor.columns] = (feats @ factor.weights.to(feats.dtype)).real
                v = torch.linalg.solve_triangular(chol, feats.transpose(0, 1).conj(), upper=False)
                fvar = v.real.square().sum(0) + (v.imag.square().sum(0) if v.is_complex() else 0)
                root = (real_form(v.transpose(0, 1)),) if want_root else None
            else:
                mean[:, factor.columns] = (cross @ factor.weights.to(cross.dtype)).real
                v = torch.linalg.solve_triangular(chol, cross.transpose(0, 1).conj(), upper=False)
                fvar = prior - (
                    v.real.square().sum(0) + (v.imag.square().sum(0) if v.is_complex() else 0)
                )
                root = (real_form(feats), real_form(v.transpose(0, 1))) if want_root else None
            var[:, factor.columns] = fvar.clamp_min(0).unsqueeze(-1)
            roots.append(root)
        return mean, var, roots

    def _shape_output(self, values: Tensor) -> Tensor:
        """``(rows, T)`` -> ``(M,)``, ``(M, T)`` or ``(M, p)``."""
        p = self.outputs_per_input
        if p > 1:
            return values.reshape(-1, p)
        return values.squeeze(-1) if self._y_ndim == 1 else values

    def posterior_from_features(self, phi: Tensor, variance_correction: Optional[Tensor] = None):
        r"""The posterior at points whose features are ``phi``.

        Args:
            phi: ``(M, D)`` (or ``(M, p, D)``) features in the layout and scale of the base
                kernel's ``features(x)`` (the ``ScaleKernel`` outputscale is applied here).
                Useful for a component of a feature map, e.g. a Helmholtz block with the other
                block zeroed.
            variance_correction: optional ``(M,)`` (or ``(M p,)``) added to the variance.

        Returns:
            ``MultivariateNormal`` over ``M`` points, or a ``MultitaskMultivariateNormal`` with
            mean ``(M, T)`` / ``(M, p)`` for several outputs (interleaved rows). The covariance
            is a lazy low-rank operator: :math:`\mathrm{Re}\{\Phi_* B^{-1} \Phi_*^H\}`.
        """
        if not isinstance(phi, Tensor):
            raise TypeError(f"phi must be a torch.Tensor, got {type(phi).__name__}")
        self._require_fit("posterior_from_features")
        expected = self.base_kernel.num_features
        p = self.outputs_per_input
        ok_shape = (phi.dim() == 2 and p == 1) or (phi.dim() == 3 and phi.shape[1] == p)
        if not ok_shape or phi.shape[-1] != expected:
            layout = f"(M, {p}, {expected})" if p > 1 else f"(M, {expected})"
            raise ValueError(f"phi must have shape {layout}, got {tuple(phi.shape)}")
        if phi.is_complex() != bool(self.base_kernel.is_complex):
            raise TypeError(
                f"phi must be {'complex' if self.base_kernel.is_complex else 'real'} like the "
                f"kernel's features, got {phi.dtype}"
            )
        # Differentiable in the query only when asked (phi requires grad).
        with torch.set_grad_enabled(torch.is_grad_enabled() and phi.requires_grad):
            rows = self._scale_features(phi)
            mean, _, roots = self._predict_rows(rows, want_root=True)
        covs = []
        for root in roots:
            cov = RootLinearOperator(root[0])
            if len(root) == 2:
                cov = SumLinearOperator(
                    cov,
                    ConstantMulLinearOperator(
                        RootLinearOperator(root[1]),
                        torch.tensor(-1.0, dtype=mean.dtype, device=mean.device),
                    ),
                )
            if variance_correction is not None:
                cov = cov + DiagLinearOperator(variance_correction.to(mean).reshape(-1))
            covs.append(cov)
        column_cov = [None] * self._num_columns
        for factor, cov in zip(self._factors, covs):
            for c in factor.columns:
                column_cov[c] = cov
        if p > 1:
            return MultitaskMultivariateNormal(mean.reshape(-1, p), column_cov[0], interleaved=True)
        if self._num_columns == 1 and self._y_ndim == 1:
            return MultivariateNormal(mean[:, 0], column_cov[0])
        if self._num_columns == 1:
            return MultitaskMultivariateNormal(mean, column_cov[0], interleaved=True)
        return MultitaskMultivariateNormal.from_independent_mvns(
            [MultivariateNormal(mean[:, t], column_cov[t]) for t in range(self._num_columns)]
        )

    def posterior(self, x: Tensor):
        """The latent posterior (without noise) at ``x``; see :meth:`posterior_from_features`.

        Args:
            x: ``(M, d)`` test inputs.

        Returns:
            ``gpytorch.distributions.MultivariateNormal`` (mean ``(M,)``) or
            ``MultitaskMultivariateNormal`` (mean ``(M, T)`` or ``(M, p)``).
        """
        self._require_fit("posterior")
        with torch.set_grad_enabled(torch.is_grad_enabled() and x.requires_grad):
            phi = self.base_kernel.features(x)
            corr = self._variance_correction(x)
        return self.posterior_from_features(phi, corr)

    def predict(self, x: Tensor, return_std: bool = False, chunk_size: Optional[int] = None):
        """Posterior mean (and latent standard deviation) at ``x``, computed in row chunks.

        Args:
            x: ``(M, d)`` test inputs.
            return_std: also return the latent posterior standard deviation (add the noise
                variance yourself for the predictive distribution of ``y``).
            chunk_size: rows per chunk.

        Returns:
            ``mean`` of shape ``(M,)``, ``(M, T)`` or ``(M, p)``; with ``return_std`` also
            ``std`` of the same shape.
        """
        self._require_fit("predict")
        self._check_chunk_size(chunk_size)
        x = self.base_kernel._check_input(x, "x")
        step = chunk_size or self._default_chunk(
            self.base_kernel.num_real_features * self.outputs_per_input
        )
        means, variances = [], []
        with torch.no_grad():
            for start in range(0, x.shape[0], step):
                xs = x[start : start + step]
                mean, var, _ = self._predict_rows(self._row_features(xs), want_root=False)
                corr = self._variance_correction(xs)
                if corr is not None:
                    var = var + corr.to(var).unsqueeze(-1)
                means.append(mean)
                variances.append(var)
        mean = self._shape_output(torch.cat(means))
        if not return_std:
            return mean
        return mean, self._shape_output(torch.cat(variances)).sqrt()

    def sample_functions(
        self, num_samples: int, generator: Optional[torch.Generator] = None
    ) -> Callable[[Tensor], Tensor]:
        r"""Posterior function draws in weight space, evaluable at any inputs.

        The weights are drawn once: :math:`w = \mu_w + L^{-H} z` with :math:`B = L L^H`, so
        :math:`f(x) = \mathrm{Re}\{\Phi(x)^\top w\}` has mean :math:`\mu(x)` and covariance
        :math:`\mathrm{Re}\,k_N(x, x')`. For complex features :math:`z = a + i b` with
        :math:`a, b \sim N(0, I)` (so the real part has the full covariance
        :math:`\mathrm{Re}\,k_N`, as the posterior of :meth:`posterior`).

        Args:
            num_samples: number of functions ``S``.
            generator: ``torch.Generator`` for reproducible draws.

        Returns:
            A callable ``f(x) -> (S, M)`` (``(S, M, T)`` or ``(S, M, p)`` for several
            outputs).
        """
        if not isinstance(num_samples, int) or isinstance(num_samples, bool) or num_samples < 1:
            raise ValueError(f"num_samples must be a positive integer, got {num_samples!r}")
        factors = self._weight_factors()
        draws = []
        for factor in factors:
            width, tcols = factor.weights.shape
            real_dtype = factor.chol.real.dtype
            dev = generator.device if generator is not None else factor.chol.device
            shape = (width, num_samples * tcols)
            z = torch.randn(shape, generator=generator, dtype=real_dtype, device=dev)
            if factor.chol.is_complex():
                z = torch.complex(
                    z, torch.randn(shape, generator=generator, dtype=real_dtype, device=dev)
                )
            z = z.to(factor.chol.device)
            eps = torch.linalg.solve_triangular(factor.chol.transpose(0, 1).conj(), z, upper=True)
            w = factor.weights.unsqueeze(1) + eps.reshape(width, num_samples, tcols)
            draws.append((factor.columns, w))
        num_columns = self._num_columns

        def evaluate(x: Tensor) -> Tensor:
            # Differentiable in x when x requires grad (Thompson sampling ascends the paths).
            with torch.set_grad_enabled(torch.is_grad_enabled() and x.requires_grad):
                feats = self._solver_form(self._row_features(x))
                out = feats.new_zeros(
                    num_samples, feats.shape[0], num_columns, dtype=feats.real.dtype
                )
                for cols, w in draws:
                    vals = (feats @ w.to(feats.dtype).reshape(w.shape[0], -1)).real
                    out[:, :, cols] = vals.reshape(feats.shape[0], num_samples, len(cols)).permute(
                        1, 0, 2
                    )
            p = self.outputs_per_input
            if p > 1:
                return out.reshape(num_samples, -1, p)
            return out.squeeze(-1) if self._y_ndim == 1 else out

        return evaluate

    # ================================================================== marginal likelihood
    def log_marginal_likelihood(
        self,
        x: Optional[Tensor] = None,
        y: Optional[Tensor] = None,
        noise: Optional[Union[float, Tensor]] = None,
    ) -> Tensor:
        r"""Log evidence :math:`\log p(y)`, summed over outputs, computed in feature space.

        With :math:`Z` the real-form features, :math:`B = Z^\top S^{-1} Z + I` and
        :math:`h = Z^\top S^{-1} y`, Woodbury and the matrix-determinant lemma give

        .. math::
            \log p(y) = -\tfrac12\left(y^\top S^{-1} y - h^\top B^{-1} h + \log|B|
                        + \textstyle\sum_i \log s_i + N \log 2\pi\right),

        the evidence of the real GP with kernel :math:`Z(x) Z(x')^\top =
        \mathrm{Re}\,\hat k(x, x')` (what GPyTorch's ``ExactMarginalLogLikelihood`` computes with
        the same kernel and noise, times ``N``). For complex features this is the evidence of the
        real form, also when ``complex_posterior=True``.

        Args:
            x, y, noise: without ``x`` and ``y``, the fitted data's evidence from the stored
                statistics (not differentiable). With them, it is recomputed from ``x`` and
                ``y`` and is differentiable in the kernel hyperparameters and in ``noise`` (a
                tensor with ``requires_grad``; ``None`` uses the model noise). Features of all
                rows are held in memory for the backward pass.

        Returns:
            A scalar tensor.
        """
        if (x is None) != (y is None):
            raise ValueError("x and y must be given together (or both omitted)")
        if x is None:
            if noise is not None:
                raise ValueError("noise needs x and y; without them the fitted noise is used")
            self._require_fit("log_marginal_likelihood")
            self._check_frozen_noise()
            with torch.no_grad():
                if self._mode == "weight":
                    return self._lml_from_specs(self._weight_specs(self._stats), self._stats.count)
                return self._lml_dense(
                    real_form(self._train_rows), self._train_y, self._train_noise_or_model()
                )
        x_checked = self.base_kernel._check_input(x, "x")
        rows_y, _ = self._targets(x_checked, y)
        rows_y = rows_y.to(device=x_checked.device, dtype=x_checked.dtype)
        if noise is None:
            rows_noise = self._model_noise_rows(x_checked.shape[0], rows_y.shape[1])
        else:
            rows_noise = self._expand_noise(noise, x_checked.shape[0], rows_y.shape[1])
        z = real_form(self._row_features(x_checked))
        return self._lml_dense(z, rows_y, rows_noise.to(rows_y))

    def _train_noise_or_model(self) -> Tensor:
        if self._train_noise is not None:
            return self._train_noise
        return self._column_noise().to(self._train_y).unsqueeze(0).expand_as(self._train_y)

    def _weight_evidence_terms(
        self, gram: Tensor, rhs: Tensor, yy: Tensor
    ) -> Tuple[Tensor, Tensor]:
        """``y^T S^{-1} y - h^T B^{-1} h`` per column and ``log|B|``, ``B = G + I``."""
        bmat = gram + torch.eye(gram.shape[0], dtype=gram.dtype, device=gram.device)
        chol = robust_cholesky(0.5 * (bmat + bmat.T), self.jitter, "weight-space matrix B")
        proj = torch.linalg.solve_triangular(chol, rhs, upper=False)
        return yy - proj.square().sum(0), 2.0 * chol.diagonal().log().sum()

    def _lml_from_specs(self, specs, count: int) -> Tensor:
        total = 0.0
        for _, gram, rhs, yy, log_noise_sum in specs:
            quad, logdet = self._weight_evidence_terms(gram, rhs, yy)
            total = total - 0.5 * (quad + logdet + log_noise_sum + count * _LOG_2PI).sum()
        return total

    def _lml_dense(self, z: Tensor, rows_y: Tensor, rows_noise: Tensor) -> Tensor:
        """Differentiable evidence from real-form features ``z (R, Dr)`` and noise ``(R, T)``."""
        num_rows, width = z.shape
        total = z.new_zeros(())
        for cols in _equal_noise_columns(rows_noise.detach()):
            s = rows_noise[:, cols[0]]
            yg = rows_y[:, cols]
            if num_rows >= width:
                zw = z * s.rsqrt().unsqueeze(-1)
                yw = yg * s.rsqrt().unsqueeze(-1)
                quad, logdet = self._weight_evidence_terms(zw.T @ zw, zw.T @ yw, yw.square().sum(0))
                logdet = logdet + s.log().sum()
            else:
                kmat = z @ z.T + torch.diag(s)
                chol = robust_cholesky(
                    0.5 * (kmat + kmat.T), self.jitter, "function-space matrix K + S"
                )
                proj = torch.linalg.solve_triangular(chol, yg, upper=False)
                quad = proj.square().sum(0)
                logdet = 2.0 * chol.diagonal().log().sum()
            total = total - 0.5 * (quad + logdet + num_rows * _LOG_2PI).sum()
        return total

    # ================================================================== hyperparameters
    def optimize_hyperparameters(
        self,
        x: Tensor,
        y: Tensor,
        noise: Optional[Union[float, Tensor]] = None,
        method: str = "lbfgs",
        num_iterations: int = 50,
        lr: Optional[float] = None,
        optimize_noise: bool = True,
        progress: bool = False,
    ) -> List[float]:
        r"""Maximise the log marginal likelihood over the kernel hyperparameters (and the noise).

        Minimises :math:`-\log p(y) / (N T)` over the kernel's parameters (lengthscale,
        outputscale, ...) and, when ``noise`` is ``None`` and ``optimize_noise``, the log of the
        model noise; then refits on ``(x, y)``. The random weights stay fixed.

        The log-noise is kept within :math:`\log m \pm 25` (:math:`m` the mean square of the
        targets: a noise from :math:`10^{-11} m` to :math:`10^{11} m`). A trial point outside
        that range, with non-finite parameters, a non-finite loss or a matrix that cannot be
        factorised gets a large finite loss, so the L-BFGS line search backs off instead of
        failing (Adam projects the log-noise back into the range and stops at a non-finite
        loss). The parameters finally kept are the best ones evaluated; a
        :class:`ConvergenceWarning` says when the optimisation did not converge (gradient
        max-norm above ``1e-4`` and the loss still changing).

        Args:
            x, y: training data (as in :meth:`fit`).
            noise: fixed noise (not optimised); ``None`` uses and optimises the model noise.
            method: ``"lbfgs"`` (``torch.optim.LBFGS`` with strong-Wolfe line search) or
                ``"adam"``.
            num_iterations: optimiser steps (L-BFGS: outer iterations of up to 20 evaluations;
                it stops early once the loss no longer changes).
            lr: learning rate (default 1.0 for L-BFGS, 0.05 for Adam).
            optimize_noise: also optimise the model noise.
            progress: show a ``tqdm`` progress bar.

        Returns:
            The loss after each iteration.
        """
        if method not in ("lbfgs", "adam"):
            raise ValueError(f"method must be 'lbfgs' or 'adam', got {method!r}")
        if not isinstance(num_iterations, int) or num_iterations < 1:
            raise ValueError(f"num_iterations must be a positive integer, got {num_iterations!r}")
        x, rows_y, _, _ = self._prepare(x, y, noise)
        self._maybe_allocate(x, False)
        params = [p for p in self.kernel.parameters() if p.requires_grad]
        log_noise = None
        if noise is None and optimize_noise:
            log_noise = self.noise.detach().to(x).log().clone().requires_grad_(True)
            params.append(log_noise)
        if not params:
            raise ValueError(
                "there is nothing to optimise: the kernel has no trainable parameters "
                "and the noise is fixed"
            )
        scale = 1.0 / rows_y.numel()
        centre = math.log(float(rows_y.detach().square().mean()) or 1.0)
        low, high = centre - _LOG_NOISE_RANGE, centre + _LOG_NOISE_RANGE
        if log_noise is not None:
            with torch.no_grad():
                log_noise.clamp_(low, high)
        best: dict = {"loss": math.inf, "state": None, "grad": math.inf}

        def in_range() -> bool:
            finite = all(bool(torch.isfinite(p).all()) for p in params)
            if not finite or log_noise is None:
                return finite
            return bool(((log_noise >= low) & (log_noise <= high)).all())

        def evaluate() -> Optional[Tensor]:
            """Loss and gradients at the current parameters; ``None`` if not finite there."""
            for p in params:
                p.grad = None
            if not in_range():
                return None
            s = noise if log_noise is None else log_noise.exp()
            try:
                loss = -self.log_marginal_likelihood(x, y, s) * scale
            except NotPSDError:
                return None  # a noise or kernel value the data cannot be factorised with
            if not torch.isfinite(loss):
                return None
            loss.backward()
            grads = [p.grad for p in params if p.grad is not None]
            if not all(bool(torch.isfinite(g).all()) for g in grads):
                return None
            value = float(loss.detach())
            if value < best["loss"]:
                best["loss"] = value
                best["state"] = [p.detach().clone() for p in params]
                best["grad"] = max((float(g.abs().max()) for g in grads), default=0.0)
            return loss.detach()

        barrier = None

        def closure() -> Tensor:
            nonlocal barrier
            loss = evaluate()
            if loss is not None:
                return loss
            if barrier is None:
                raise ValueError(
                    "the log marginal likelihood is not finite at the initial hyperparameters "
                    "and noise; start from other values"
                )
            for p in params:
                p.grad = torch.zeros_like(p)
            return torch.tensor(barrier, dtype=x.dtype, device=x.device)

        first = closure()
        # A finite loss far above any reached: the line search rejects the trial point.
        barrier = abs(float(first)) * 10.0 + 1e3
        if method == "lbfgs":
            opt = torch.optim.LBFGS(
                params, lr=lr or 1.0, max_iter=20, line_search_fn="strong_wolfe"
            )
        else:
            opt = torch.optim.Adam(params, lr=lr or 0.05)
        steps = range(num_iterations)
        if progress:
            from tqdm.auto import tqdm

            steps = tqdm(steps, desc=f"optimize ({method})")
        losses: List[float] = []
        stopped_by_failure = False
        for _ in steps:
            if method == "lbfgs":
                opt.step(closure)
                # LBFGS returns the loss before its step; the loss after it is the best seen.
                current = best["loss"]
            else:
                loss = evaluate()
                if loss is None:
                    stopped_by_failure = True
                    break
                opt.step()
                if log_noise is not None:
                    with torch.no_grad():
                        log_noise.clamp_(low, high)
                current = float(loss)
            losses.append(current)
            if progress:
                steps.set_postfix(loss=current)
            if method == "lbfgs" and len(losses) > 1 and losses[-1] == losses[-2]:
                break  # LBFGS met its own tolerances: further steps would not move
        if method == "adam" and not stopped_by_failure:
            evaluate()  # the point after the last step
        with torch.no_grad():
            for p, value in zip(params, best["state"]):
                p.copy_(value)
        changing = len(losses) < 2 or abs(losses[-1] - losses[-2]) > 1e-9 * max(
            1.0, abs(losses[-1])
        )
        if stopped_by_failure or (best["grad"] > _GRAD_TOLERANCE and changing):
            warnings.warn(
                f"optimize_hyperparameters ({method}) did not converge in {len(losses)} "
                f"iterations (gradient max-norm {best['grad']:.3g}"
                + (", stopped at a non-finite loss" if stopped_by_failure else "")
                + "); the best parameters evaluated are kept. Increase num_iterations or "
                "change lr.",
                ConvergenceWarning,
            )
        if log_noise is not None:
            self.noise = log_noise.detach().exp().to(self.noise.dtype).reshape(self.noise.shape)
        self.fit(x, y, noise)
        return losses

    def select_noise(
        self,
        x_train: Tensor,
        y_train: Tensor,
        x_val: Tensor,
        y_val: Tensor,
        grid: Optional[Sequence[float]] = None,
    ) -> float:
        r"""Choose the model noise from a grid by the validation MNLL, and refit.

        For every noise :math:`\sigma^2` in ``grid`` (default :math:`2^{-15}, 2^{-14}, \dots,
        2^{15}`) the model is conditioned on the training data and scored by the mean negative
        log likelihood of ``y_val`` under :math:`N(\mu(x), \mathrm{var}(x) + \sigma^2)`. The
        statistics are accumulated once; each grid value costs one ``D x D`` factorisation.
        The smallest score wins (the first grid value on ties). Afterwards :attr:`noise` is the
        winner and the model is fitted on the training data with it.

        Args:
            x_train, y_train: training data.
            x_val, y_val: validation data (same output layout).
            grid: candidate noise variances (positive).

        Returns:
            The selected noise. ``self.noise_scores_`` holds ``(grid, scores)``.
        """
        from rfgp.metrics import mnll

        values = [2.0**k for k in range(-15, 16)] if grid is None else list(grid)
        if not values or any(not isinstance(v, (int, float)) or not v > 0 for v in values):
            raise ValueError(f"grid must be a non-empty sequence of positive floats, got {grid!r}")
        self.noise = torch.tensor(float(values[0]), dtype=torch.float64)
        self.fit(x_train, y_train)
        x_val = self.base_kernel._check_input(x_val, "x_val")
        rows_val, _ = self._targets(x_val, y_val, "y_val")
        with torch.no_grad():
            phi_val = self._row_features(x_val)
            corr = self._variance_correction(x_val)
        scores = []
        for value in values:
            self.noise = torch.tensor(float(value), dtype=torch.float64)
            try:
                mean, var, _ = self._predict_rows(phi_val, want_root=False)
            except NotPSDError:
                # A noise too small for this precision cannot be factorised: it cannot win.
                scores.append(math.inf)
                continue
            if corr is not None:
                var = var + corr.to(var).unsqueeze(-1)
            scores.append(float(mnll(rows_val.to(mean), mean, var + value)))
        if all(math.isinf(score) for score in scores):
            raise NotPSDError("select_noise: no noise value in the grid could be factorised")
        best = min(range(len(values)), key=lambda i: (scores[i], i))
        self.noise = torch.tensor(float(values[best]), dtype=torch.float64)
        self._factorize()
        self.noise_scores_ = (values, scores)
        return float(values[best])
