r"""The contract every random-feature kernel in rfgp follows.

A random-feature kernel is a random map :math:`\Phi: \mathbb{R}^d \to \mathbb{R}^D` (or
:math:`\mathbb{C}^D`) with :math:`\hat k(x, y) = \Phi(x)^\top \overline{\Phi(y)}`. Inside GPyTorch's
real linear algebra the kernel is represented by the real form :math:`[\mathrm{Re}\,\Phi,
\mathrm{Im}\,\Phi]`, whose Gram matrix is exactly :math:`\mathrm{Re}\,\hat K`.
"""

from __future__ import annotations

import copy
from abc import ABCMeta, abstractmethod
from typing import Any, Dict, Optional, Tuple

import torch
from gpytorch.distributions import MultivariateNormal
from gpytorch.kernels import Kernel, ScaleKernel
from gpytorch.models import exact_prediction_strategies
from linear_operator.operators import (
    LowRankRootLinearOperator,
    MatmulLinearOperator,
    RootLinearOperator,
)
from torch import Tensor

from rfgp._validation import check_int
from rfgp.ops import all_finite, make_generator

__all__ = [
    "RandomFeatureKernel",
    "WeightSpacePredictionStrategy",
    "real_form",
    "unwrap_scale_kernel",
]


def real_form(phi: Tensor) -> Tensor:
    r"""The real feature matrix whose Gram matrix is :math:`\mathrm{Re}(\Phi \Phi^H)`.

    Real input is returned as is; complex ``(..., D)`` input becomes ``(..., 2D)``
    ``[Re Phi, Im Phi]`` (the Complex-to-Real map).

    Args:
        phi: ``(..., D)`` real or complex features.

    Returns:
        ``phi`` if real, else the ``(..., 2D)`` real tensor ``[Re phi, Im phi]``.

    Example:
        >>> phi = torch.tensor([[1 + 2j]])
        >>> real_form(phi)
        tensor([[1., 2.]])
    """
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


class WeightSpacePredictionStrategy(exact_prediction_strategies.LinearPredictionStrategy):
    r"""GPyTorch's weight-space ``LinearPredictionStrategy``, also for ``p > 1`` outputs per input.

    With a multitask prior GPyTorch flattens the ``(N, p)`` training labels to the interleaved
    ``(N p)`` vector, but the weight-space cache would subtract the unflattened ``(N, p)`` prior
    mean; here the cache sees the flat (interleaved) prior mean instead. For single-output
    kernels it is exactly ``LinearPredictionStrategy``: with the training features
    :math:`\Phi` and noise :math:`S`, it caches :math:`L L^\top = I + \Phi^\top S^{-1}\Phi` and
    :math:`(I + \Phi^\top S^{-1}\Phi)^{-1}\Phi^\top S^{-1}(y - \mu)`, so a prediction at ``M``
    test points costs ``O(M D^2)``.

    Example:
        >>> from rfgp.kernels import FourierFeatureKernel
        >>> kernel = FourierFeatureKernel(16, seed=0)
        >>> class GP(gpytorch.models.ExactGP):
        ...     def forward(self, x):
        ...         mean = torch.zeros(x.shape[:-1])
        ...         return gpytorch.distributions.MultivariateNormal(mean, kernel(x))
        >>> model = GP(torch.randn(20, 2), torch.randn(20),
        ...            gpytorch.likelihoods.GaussianLikelihood()).eval()
        >>> _ = model(torch.randn(3, 2))
        >>> type(model.prediction_strategy).__name__
        'WeightSpacePredictionStrategy'
    """

    def __init__(self, train_inputs, train_prior_dist, train_labels, likelihood):
        super().__init__(train_inputs, train_prior_dist, train_labels, likelihood)
        prior = self.train_prior_dist
        if prior.loc.shape != prior.mean.shape:
            self.train_prior_dist = MultivariateNormal(prior.loc, prior.lazy_covariance_matrix)


class RandomFeatureKernel(Kernel, metaclass=ABCMeta):
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

    **Provided**, for callers such as solvers: :meth:`features`, :meth:`prepare_input`,
    :meth:`check_input`, :meth:`ensure_weights`, :attr:`random_weight_names`, ``forward``
    (GPyTorch semantics on the real form), :meth:`resample`, lazy weight initialisation at the
    first call, batch indexing, ``state_dict`` loading into a fresh kernel and a weight-space
    ``LinearPredictionStrategy``.

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

        >>> from rfgp.ops import gaussian
        >>> class RandomProjection(RandomFeatureKernel):
        ...     def _sample_weights(self, input_dim, generator):
        ...         shape = (*self.batch_shape, self.num_features, input_dim)
        ...         return {"weight": gaussian(shape, generator)}
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
        super().__init__(**kwargs)
        self.num_features = num_features
        self.seed = seed
        self._random_buffer_names: list[str] = []
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

    # ------------------------------------------------------------------ random weights
    @property
    def weights_initialized(self) -> bool:
        """Whether the random weights have been drawn (they are drawn at the first call)."""
        return bool(self._random_buffer_names)

    @property
    def random_weight_names(self) -> Tuple[str, ...]:
        """Names of the buffers holding the random weights (empty before they are drawn)."""
        return tuple(self._random_buffer_names)

    def resample(self, generator: Optional[torch.Generator] = None) -> RandomFeatureKernel:
        """Draw fresh random weights in place and return ``self``.

        Args:
            generator: a ``torch.Generator``; the same generator state gives the same weights.
                ``None`` uses the global RNG.

        Raises:
            RuntimeError: if the input dimension is not known yet (pass ``input_dim`` or call
                the kernel once).
        """
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(
                f"generator must be a torch.Generator or None, got {type(generator).__name__}"
            )
        if self.input_dim is None:
            raise RuntimeError(
                f"{type(self).__name__}.resample: the input dimension is unknown; pass "
                "input_dim= to the constructor or evaluate the kernel once first"
            )
        self._set_weights(self._sample_weights(self.input_dim, generator))
        return self

    def _set_weights(self, weights: Dict[str, Tensor]) -> None:
        ref = self._reference_tensor()
        for name, value in weights.items():
            if value.is_floating_point():
                value = value.to(device=ref.device, dtype=ref.dtype)
            else:
                value = value.to(device=ref.device)
            if name in self._buffers:
                self._buffers[name] = value
            else:
                self.register_buffer(name, value)
                self._random_buffer_names.append(name)

    def _reference_tensor(self) -> Tensor:
        for p in self.parameters():
            return p
        return self._dtype_anchor

    def ensure_weights(self, x: Tensor) -> None:
        """Fix the input dimension from ``x`` (inputs after ``active_dims``) and draw the
        random weights if they are not drawn yet (with the constructor's ``seed``).

        Raises:
            ValueError: if ``x`` has a different number of columns than the kernel's
                ``input_dim``.
        """
        d = x.shape[-1]
        if self.input_dim is None:
            self.input_dim = int(d)
        elif d != self.input_dim:
            raise ValueError(
                f"{type(self).__name__}: x must have {self.input_dim} input columns "
                f"(after active_dims), got {d}"
            )
        if not self.weights_initialized:
            self._set_weights(self._sample_weights(self.input_dim, make_generator(self.seed)))

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, *args, **kwargs):
        # A fresh kernel has no weights yet (they are drawn lazily): create them from the
        # checkpoint so that loading a trained model needs no dummy forward pass.
        names = local_metadata.get("rfgp_random_buffers", None)
        if names is None:
            names = [
                k[len(prefix):]
                for k in state_dict
                if k.startswith(prefix)
                and "." not in k[len(prefix):]
                and k[len(prefix):] not in self._parameters
                and k[len(prefix):] not in self._buffers
            ]
        for name in names:
            key = prefix + name
            if key in state_dict and name not in self._buffers:
                self.register_buffer(name, torch.empty_like(state_dict[key]))
                self._random_buffer_names.append(name)
        if "rfgp_input_dim" in local_metadata and local_metadata["rfgp_input_dim"] is not None:
            self.input_dim = local_metadata["rfgp_input_dim"]
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, *args, **kwargs)

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        meta = getattr(destination, "_metadata", None)
        if meta is not None:
            entry = meta.setdefault(prefix[:-1], {})
            entry["rfgp_random_buffers"] = list(self._random_buffer_names)
            entry["rfgp_input_dim"] = self.input_dim

    # ------------------------------------------------------------------ features
    def check_input(self, x: Tensor, name: str = "x") -> Tensor:
        """Validate an input tensor: floating, finite; 1-D ``x`` becomes one column.

        Returns:
            ``x`` as ``(..., N, d)`` (``active_dims`` not yet applied).
        """
        if not isinstance(x, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if not (x.is_floating_point()):
            raise TypeError(f"{name} must have a floating dtype, got {x.dtype}")
        if x.dim() == 1:
            x = x.unsqueeze(-1)
        if not all_finite(x):
            raise ValueError(f"{name} must be finite, but it holds NaN or infinite entries")
        return x

    def features(self, x: Tensor) -> Tensor:
        r"""The random feature matrix :math:`\Phi(x)`.

        Applies ``active_dims``, the lengthscale and any other hyperparameters; differentiable
        with respect to them.

        Args:
            x: ``(..., N, d)`` inputs (1-D ``x`` means ``d = 1``).

        Returns:
            ``(..., N, D)`` features (``(..., N, p, D)`` for a kernel with ``p`` outputs per
            input); complex iff ``is_complex``; dtype follows ``x``.
        """
        return self._features(self.prepare_input(x))

    def prepare_input(self, x: Tensor, name: str = "x") -> Tensor:
        """What :meth:`_features` expects: :meth:`check_input`, then ``active_dims``, then
        :meth:`ensure_weights`.

        Returns:
            ``(..., N, input_dim)``.
        """
        x = self.check_input(x, name)
        if self.active_dims is not None:
            x = x.index_select(-1, self.active_dims)
        self.ensure_weights(x)
        return x

    # The names under which callers knew these before they were declared public.
    def _check_input(self, x: Tensor, name: str = "x") -> Tensor:
        return self.check_input(x, name)

    def _ensure_weights(self, x: Tensor) -> None:
        self.ensure_weights(x)

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
        phi = real_form(self._features(x))
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

    def __getitem__(self, index) -> RandomFeatureKernel:
        if len(self.batch_shape) == 0:
            return self
        new_kernel = copy.deepcopy(self)
        index = index if isinstance(index, tuple) else (index,)
        batch_ndim = len(self.batch_shape)
        new_batch_shape = None
        for name, param in self.named_parameters(recurse=False):
            new_param = getattr(new_kernel, name)
            new_param.data = new_param.data.__getitem__(index)
            removed = param.dim() - new_param.dim()
            new_batch_shape = new_param.shape[: batch_ndim - removed]
        for name in self._random_buffer_names:
            buf = getattr(new_kernel, name)
            new_kernel._buffers[name] = buf.__getitem__(index)
            removed = buf.dim() - new_kernel._buffers[name].dim()
            new_batch_shape = new_kernel._buffers[name].shape[: batch_ndim - removed]
        if new_batch_shape is None:
            new_batch_shape = torch.empty(self.batch_shape)[index].shape
        new_kernel.batch_shape = torch.Size(new_batch_shape)
        for sub_name, sub in self.named_sub_kernels():
            setattr(new_kernel, sub_name, sub.__getitem__(index))
        return new_kernel

    def extra_repr(self) -> str:
        return f"num_features={self.num_features}, input_dim={self.input_dim}"
