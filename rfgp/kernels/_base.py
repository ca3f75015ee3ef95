r"""The contract every random-feature kernel in rfgp follows.

A random-feature kernel is a random map :math:`\Phi: \mathbb{R}^d \to \mathbb{R}^D` (or
:math:`\mathbb{C}^D`) with :math:`\hat k(x, y) = \Phi(x)^\top \overline{\Phi(y)}`. Inside GPyTorch's
real linear algebra the kernel is represented by the real form :math:`[\mathrm{Re}\,\Phi,
\mathrm{Im}\,\Phi]`, whose Gram matrix is exactly :math:`\mathrm{Re}\,\hat K`.
"""

from __future__ import annotations

import inspect
from abc import ABCMeta, abstractmethod
from typing import Any, Dict, Optional

import torch
from gpytorch.kernels import Kernel, ScaleKernel
from linear_operator.operators import (
    LowRankRootLinearOperator,
    MatmulLinearOperator,
    RootLinearOperator,
)
from torch import Tensor

from rfgp._ops import complex_dtype
from rfgp._validation import (
    check_active_dims,
    check_int,
    check_kernel_input,
    check_positive_values,
    describe,
    select_active_columns,
)
from rfgp.kernels._batching import BatchedWeights
from rfgp.kernels._checks import InputCheckedKernel, check_hyperparameters
from rfgp.kernels._prediction import WeightSpacePredictionStrategy
from rfgp.kernels._random_weights import RandomWeights

__all__ = [
    "InputCheckedKernel",
    "RandomFeatureKernel",
    "WeightSpacePredictionStrategy",
    "check_hyperparameters",
    "real_form",
    "unwrap_scale_kernel",
]


#: the keyword arguments gpytorch.kernels.Kernel takes by name (its **kwargs are ignored)
_KERNEL_ARGUMENTS = frozenset(
    name for name, p in inspect.signature(Kernel.__init__).parameters.items()
    if name != "self" and p.kind is not inspect.Parameter.VAR_KEYWORD
)


def real_form(phi: Tensor) -> Tensor:
    r"""The real feature matrix whose Gram matrix is :math:`\mathrm{Re}(\Phi \Phi^H)`.

    Real input is returned as is; complex ``(..., D)`` input becomes ``(..., 2D)``
    ``[Re Phi, Im Phi]`` (the Complex-to-Real map).

    Args:
        phi: ``(..., D)`` real or complex features.

    Returns:
        ``phi`` if real, else the ``(..., 2D)`` real tensor ``[Re phi, Im phi]``.

    Raises:
        TypeError: if ``phi`` is not a ``torch.Tensor``.
        ValueError: if it is 0-d.

    Example:
        >>> phi = torch.tensor([[1 + 2j]])
        >>> real_form(phi)
        tensor([[1., 2.]])
    """
    if not isinstance(phi, Tensor):
        raise TypeError(f"phi must be a torch.Tensor of features, got {describe(phi)}")
    if phi.dim() == 0:
        raise ValueError("phi must have shape (..., D) (at least 1 dimension), got a 0-d tensor")
    if phi.is_complex():
        return torch.cat([phi.real, phi.imag], dim=-1)
    return phi


def unwrap_scale_kernel(kernel: Kernel) -> RandomFeatureKernel:
    """The random-feature kernel inside an optional ``ScaleKernel``.

    Args:
        kernel: a :class:`RandomFeatureKernel`, or a ``gpytorch.kernels.ScaleKernel`` around one.

    Returns:
        the :class:`RandomFeatureKernel` (the outputscale, if any, stays on ``kernel``).

    Raises:
        TypeError: for any other kernel.

    Example:
        >>> from rfgp.kernels import FourierFeatureKernel
        >>> base = FourierFeatureKernel(8)
        >>> unwrap_scale_kernel(gpytorch.kernels.ScaleKernel(base)) is base
        True
    """
    base = kernel.base_kernel if isinstance(kernel, ScaleKernel) else kernel
    if not isinstance(base, RandomFeatureKernel):
        raise TypeError(
            "kernel must be a RandomFeatureKernel (or a ScaleKernel around one), got "
            f"{type(base).__name__}"
        )
    return base


class RandomFeatureKernel(RandomWeights, BatchedWeights, Kernel, metaclass=ABCMeta):
    r"""Base class of all random-feature kernels (a ``gpytorch.kernels.Kernel``).

    **Subclasses implement** (abstract methods):

    * ``_sample_weights(input_dim, generator) -> dict`` returning the random tensors (real
      tensors; complex weights are stored with :func:`torch.view_as_real` so that
      ``module.to(dtype)`` cannot drop an imaginary part), with leading ``batch_shape``
      dimensions;
    * ``_features(x) -> Tensor``: the feature map on inputs that :meth:`prepare_input` has
      already checked, restricted to ``active_dims`` and drawn the weights for, shape
      ``(..., N, D)`` (or ``(..., N, p, D)`` for ``p`` outputs).

    **Optional hooks** (override where they apply; the defaults say "not needed"):

    * :attr:`needs_allocation` (``False``) and :meth:`allocate` (no-op): a data-dependent
      choice of the random features, run by a solver before its fit;
    * :attr:`has_variance_correction` (``False``) and :meth:`variance_correction` (zeros):
      :math:`k(x, x) - \mathbb{E}[\hat k(x, x)]`, for biased (truncated) approximations;
    * :meth:`exact_kernel` (raises ``NotImplementedError``): the exact GPyTorch kernel being
      approximated; :meth:`exact_matrix` evaluates it.

    * :meth:`weight_settings`: the constructor settings the random weights were drawn for
      (``num_features``, degree, sampling, allocation, ...), saved with ``state_dict``.

    **Provided**, for callers such as solvers: :meth:`features`, :meth:`prepare_input`,
    :meth:`check_input`, :meth:`ensure_weights`, :attr:`random_weight_names`, ``forward``
    (GPyTorch semantics on the real form), :meth:`resample`, lazy weight initialisation at the
    first call, batch indexing and ``expand_batch`` (also before the first call: the first
    draw then replays them), ``state_dict`` loading into a fresh kernel and a weight-space
    ``LinearPredictionStrategy``.

    **Loading a checkpoint** follows ``torch.nn.Module.load_state_dict``, for the
    ``OrderedDict`` of ``state_dict()`` and a plain ``dict`` of it alike (the record of the
    random weights is its ``"_extra_state"`` entry; see the feature-map guide): with
    ``strict=True`` a random weight the checkpoint's kernel held but the state dict lacks is a
    missing key and a stray key is unexpected (never registered as a weight); weights of
    another kind of kernel, drawn for other :meth:`weight_settings`, another input dimension or
    of another shape are refused whatever ``strict`` says, as torch refuses a size mismatch.

    **Inputs** are float32 or float64 (half precision is refused with a ``TypeError``), at
    least 1-D with at least one column; ``N = 0`` rows give empty features. A NaN, infinite or
    zero lengthscale (any constrained hyperparameter) is refused when the weights are drawn.

    Args:
        num_features: number of columns ``D`` of ``features(x)`` (a complex column counts once).
        input_dim: input dimension ``d`` after ``active_dims``; if ``None`` it is taken from the
            first input seen (or from ``ard_num_dims`` / ``active_dims``).
        seed: seed for the initial draw of the random weights (``None``: the global RNG).
        **kwargs: passed to ``gpytorch.kernels.Kernel`` (``batch_shape``, ``active_dims``,
            ``ard_num_dims``, ``lengthscale_prior``, ``lengthscale_constraint``, ...).

    Attributes:
        num_features (int): ``D``.
        is_complex (bool): whether ``features`` returns complex values.
        input_dim (int or None): ``d``, once known.
        num_outputs_per_input(): ``p`` (1 for scalar kernels), as GPyTorch's method.

    Example:
        A linear kernel :math:`\hat k(x, y) = x^\top W^\top W y / D` from a Gaussian ``W``
        (unbiased for :math:`x^\top y`):

        >>> class RandomProjection(RandomFeatureKernel):
        ...     def _sample_weights(self, input_dim, generator):
        ...         shape = (*self.batch_shape, self.num_features, input_dim)
        ...         return {"weight": torch.randn(shape, generator=generator,
        ...                                       dtype=torch.float64)}
        ...     def _features(self, x):
        ...         return x @ self.weight.to(x).transpose(-1, -2) / self.num_features**0.5
        >>> k = RandomProjection(num_features=8, seed=0).double()
        >>> x = torch.randn(5, 3, dtype=torch.float64)
        >>> k.features(x).shape, k(x).shape
        (torch.Size([5, 8]), torch.Size([5, 5]))
    """

    is_complex: bool = False

    def __init__(
        self,
        num_features: int,
        input_dim: Optional[int] = None,
        seed: Optional[int] = None,
        **kwargs: Any,
    ) -> None:
        num_features = check_int("num_features", num_features)
        if seed is not None:
            seed = check_int("seed", seed, minimum=None)
        unknown = sorted(set(kwargs) - _KERNEL_ARGUMENTS)
        if unknown:  # GPyTorch's Kernel would swallow them silently (e.g. nu=1.5)
            raise TypeError(
                f"{type(self).__name__} got unexpected keyword argument(s) {unknown}; the "
                f"GPyTorch Kernel arguments are {sorted(_KERNEL_ARGUMENTS)}"
            )
        super().__init__(**kwargs)
        self.num_features = num_features
        self.seed = seed
        self._random_buffer_names: list[str] = []
        # expand_batch / kernel[index] before the weights are drawn: the lazy first draw uses
        # the batch shape the kernel was built with and then replays these operations, so the
        # weights are those the original kernel draws (expanded or indexed), not a fresh draw.
        self._draw_batch_shape: Optional[torch.Size] = None
        self._pending_batch_ops: list[tuple] = []
        # Follows .to()/.double() even for kernels without parameters, so weights drawn later
        # get the module's dtype and device. Not part of the state_dict.
        self.register_buffer("_dtype_anchor", torch.empty(0), persistent=False)
        if input_dim is None:
            if self.active_dims is not None:
                input_dim = int(self.active_dims.numel())
            elif self.ard_num_dims is not None:
                input_dim = int(self.ard_num_dims)
        if input_dim is not None:
            input_dim = check_int("input_dim", input_dim)
        self.input_dim = input_dim

    # ------------------------------------------------------------------ what subclasses implement
    @abstractmethod
    def _sample_weights(
        self, input_dim: int, generator: Optional[torch.Generator]
    ) -> Dict[str, Tensor]:
        """Draw the random weights for inputs of dimension ``input_dim``.

        Returns:
            ``{buffer name: tensor}``, each with leading ``batch_shape`` dimensions; real
            (complex values stored with :func:`torch.view_as_real`) or integer.
        """

    @abstractmethod
    def _features(self, x: Tensor) -> Tensor:
        """The feature map on prepared inputs (see :meth:`prepare_input`).

        Returns:
            ``(..., N, D)`` (``(..., N, p, D)`` with ``p`` outputs per input), complex iff
            :attr:`is_complex`.
        """

    # ------------------------------------------------------------------ optional hooks
    @staticmethod
    def _written_into(phi: Tensor, out: Tensor) -> bool:
        """Whether :meth:`_features_into` returned ``out`` itself (its memory, shape and
        strides) rather than a tensor of its own."""
        return (phi.data_ptr() == out.data_ptr() and phi.shape == out.shape
                and phi.stride() == out.stride())

    def _features_into(self, x: Tensor, out: Tensor) -> Tensor:
        """:meth:`_features` on prepared inputs, written into ``out`` where the map can.

        Called without autograd, by passes that compute the features of many row chunks and
        drop each chunk's before the next: a buffer kept across chunks saves what a fresh
        ``N x D`` allocation costs every chunk (the operating system hands large blocks back
        at every free, and faults them in again page by page at the next first write).

        Args:
            x: ``(N, d)`` prepared inputs.
            out: real ``(N, D)`` buffer of ``x``'s dtype and device (a strided view may do).

        Returns:
            The features: ``out`` where they were written there, else a tensor of their own
            (this default computes :meth:`_features`; a caller copies or uses the result).
        """
        return self._features(x)

    @property
    def needs_allocation(self) -> bool:
        """Whether :meth:`allocate` must run on training inputs before features exist."""
        return False

    def allocate(self, x: Tensor, generator: Optional[torch.Generator] = None) -> Any:
        """Choose data-dependent random features from inputs ``x``; returns ``self``.

        A no-op here: only kernels with a data-dependent allocation (e.g. optimised Maclaurin
        features) override it.
        """
        return self

    #: whether :meth:`variance_correction` can be non-zero (a biased approximation).
    has_variance_correction: bool = False

    def variance_correction(self, x: Tensor) -> Tensor:
        r""":math:`k(x, x) - \mathbb{E}[\hat k(x, x)]`, added to predictive variances.

        Zero for unbiased features (this default): shape ``(..., N)``, or ``(..., N p)`` with
        ``p`` outputs per input.
        """
        x = self.check_input(x)
        return x.new_zeros(*x.shape[:-2], x.shape[-2] * self.num_outputs_per_input())

    def exact_kernel(self) -> Kernel:
        """The exact GPyTorch kernel this approximates, with the current hyperparameters."""
        raise NotImplementedError(
            f"{type(self).__name__} has no exact GPyTorch kernel counterpart"
        )

    def exact_matrix(self, x1: Tensor, x2: Tensor) -> Tensor:
        """The exact kernel matrix ``k(x1, x2)`` (dense), from :meth:`exact_kernel`."""
        return self.exact_kernel()(x1, x2).to_dense()

    # ------------------------------------------------------------------ features
    def check_input(self, x: Tensor, name: str = "x") -> Tensor:
        """Validate an input tensor: float32 or float64, at least 1-D with at least one column,
        finite; 1-D ``x`` becomes one column.

        Returns:
            ``x`` as ``(..., N, d)`` (``active_dims`` not yet applied).
        """
        return check_kernel_input(name, x)

    def check_hyperparameters(self) -> None:
        """Raise ``ValueError`` if a hyperparameter is NaN, infinite or (when constrained
        positive) zero: features computed from it would be NaN or infinite."""
        check_hyperparameters(self)

    def _empty_features(self, x: Tensor) -> Tensor:
        batch = torch.broadcast_shapes(x.shape[:-2], self.batch_shape)
        p = self.num_outputs_per_input()
        tail = (p, self.num_features) if p > 1 else (self.num_features,)
        dtype = complex_dtype(x.dtype) if self.is_complex else x.dtype
        return x.new_zeros((*batch, 0, *tail), dtype=dtype)

    def features(self, x: Tensor) -> Tensor:
        r"""The random feature matrix :math:`\Phi(x)`.

        Applies ``active_dims``, the lengthscale and any other hyperparameters; differentiable
        with respect to them.

        Args:
            x: ``(..., N, d)`` float32 or float64 inputs (1-D ``x`` means ``d = 1``).

        Returns:
            ``(..., N, D)`` features (``(..., N, p, D)`` for a kernel with ``p`` outputs per
            input); complex iff ``is_complex``; dtype follows ``x``. ``N = 0`` gives an empty
            result of that shape.

        Raises:
            TypeError: for a non-tensor or a dtype other than float32 / float64.
            ValueError: for a 0-d input, inputs without columns, NaN or infinite inputs, or (at
                the first call, which draws the weights) a NaN, infinite or zero hyperparameter.
        """
        return self._features_or_empty(self.prepare_input(x))

    def _features_or_empty(self, x: Tensor) -> Tensor:
        # No rows: the (..., 0, [p,] D) result, without running a feature map on nothing.
        return self._empty_features(x) if x.shape[-2] == 0 else self._features(x)

    def prepare_input(self, x: Tensor, name: str = "x") -> Tensor:
        """What :meth:`_features` expects: :meth:`check_input`, then ``active_dims``, then
        :meth:`ensure_weights`.

        Returns:
            ``(..., N, input_dim)``.
        """
        x = self._checked_active_input(x, name)
        self.ensure_weights(x)
        return x

    def _checked_active_input(self, x: Tensor, name: str = "x") -> Tensor:
        # check_input, then the active_dims columns (for subclass methods that need the
        # restricted inputs but no weights, e.g. a variance correction or an allocation).
        return select_active_columns(self.check_input(x, name), self.active_dims, name)

    def real_features(self, x: Tensor) -> Tensor:
        """``real_form(features(x))``: ``(..., N, D)`` or ``(..., N, 2D)`` real features."""
        return real_form(self.features(x))

    @property
    def num_real_features(self) -> int:
        """Columns of the real form: ``2 D`` for complex features, ``D`` otherwise."""
        return 2 * self.num_features if self.is_complex else self.num_features

    def _root(self, x: Tensor) -> Tensor:
        # active_dims has been applied by Kernel.__call__ before forward.
        x = self.check_input(x)
        self.ensure_weights(x)
        phi = real_form(self._features_or_empty(x))
        p = self.num_outputs_per_input()
        if p > 1:
            # (..., N, p, D) -> (..., N p, D): GPyTorch's interleaved order, row n * p + t.
            phi = phi.reshape(*phi.shape[:-3], phi.shape[-3] * p, phi.shape[-1])
        return phi

    def forward(
        self, x1: Tensor, x2: Tensor, diag: bool = False, last_dim_is_batch: bool = False, **params
    ):
        if last_dim_is_batch:
            raise NotImplementedError(
                f"{type(self).__name__} does not support last_dim_is_batch=True"
            )
        x1_eq_x2 = x1 is x2 or (x1.shape == x2.shape and torch.equal(x1, x2))
        z1 = self._root(x1)
        z2 = z1 if x1_eq_x2 else self._root(x2)
        if diag:
            return (z1 * z2).sum(-1)
        if x1_eq_x2:
            if z1.shape[-1] < z1.shape[-2]:
                return LowRankRootLinearOperator(z1)
            return RootLinearOperator(z1)
        return MatmulLinearOperator(z1, z2.transpose(-1, -2))

    def prediction_strategy(self, train_inputs, train_prior_dist, train_labels, likelihood):
        # Weight-space prediction: O(N D^2) to build the caches, O(D^2) per test point.
        return WeightSpacePredictionStrategy(
            train_inputs, train_prior_dist, train_labels, likelihood
        )

    # ------------------------------------------------------------------ GPyTorch plumbing
    #: outputs per input ``p``; multi-output subclasses set it (features ``(..., N, p, D)``).
    _outputs_per_input: int = 1

    def num_outputs_per_input(
        self, x1: Optional[Tensor] = None, x2: Optional[Tensor] = None
    ) -> int:
        """``p``: rows of the GPyTorch covariance per input (GPyTorch calls it with x1, x2)."""
        return self._outputs_per_input

    def __call__(self, x1: Tensor, x2: Optional[Tensor] = None, diag: bool = False,
                 last_dim_is_batch: bool = False, **params):
        # Structural checks before GPyTorch's own handling, which fails on a 0-d input or
        # one without columns with raw indexing errors (finiteness is checked on the
        # features' path).
        x1 = check_kernel_input("x1", x1, finite=False)
        check_active_dims(self.active_dims, x1, "x1")
        if x2 is not None:
            x2 = check_kernel_input("x2", x2, finite=False)
            check_active_dims(self.active_dims, x2, "x2")
        return super().__call__(x1, x2, diag=diag, last_dim_is_batch=last_dim_is_batch,
                                **params)

    @property
    def dtype(self) -> torch.dtype:
        """The floating dtype of the kernel's parameters (of its buffers if it has none)."""
        if self.has_lengthscale:
            return self.lengthscale.dtype
        # the anchor buffer follows .to(dtype) like the parameters do
        dtypes = {p.dtype for p in self.parameters()} | {self._dtype_anchor.dtype}
        if len(dtypes) > 1:
            raise RuntimeError(f"The kernel's parameters have multiple dtypes: {dtypes}.")
        return dtypes.pop()

    @property
    def device(self) -> torch.device:
        """The device of the kernel's parameters (of its buffers if it has none)."""
        for param in self.parameters():
            return param.device
        return self._dtype_anchor.device

    def _set_lengthscale(self, value) -> None:
        # in the parameter's dtype, as GPyTorch does, so that equal settings of an rfgp kernel
        # and a GPyTorch kernel give equal lengthscales
        super()._set_lengthscale(check_positive_values("lengthscale", value,
                                                       self.raw_lengthscale))

    def extra_repr(self) -> str:
        return f"num_features={self.num_features}, input_dim={self.input_dim}"
