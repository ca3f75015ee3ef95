r"""Operator-valued random Fourier features (ORFF) for vector-valued GPs.

A shift-invariant matrix-valued kernel :math:`K(x, z) = K_0(x - z) \in \mathbb{R}^{p\times p}`
has the operator-valued Bochner form :math:`K_0(\delta) = \mathbb{E}_{\omega\sim\mu}
[\cos(\omega^\top\delta) A(\omega)]` with :math:`A(\omega) = B(\omega)B(\omega)^\top \succeq 0`
even in :math:`\omega`. With :math:`M` frequencies :math:`\omega_j \sim \mu` the real feature map

.. math::
    \Phi(x) = M^{-1/2}\big[\cos(\omega_j^\top x) B(\omega_j)^\top,\
                           \sin(\omega_j^\top x) B(\omega_j)^\top\big]_{j=1..M}
    \in \mathbb{R}^{2Mp' \times p}

gives :math:`\hat K(x, z) = \Phi(x)^\top\Phi(z) = M^{-1}\sum_j \cos(\omega_j^\top(x - z))
A(\omega_j)`. Here ``features(x)`` returns :math:`\Phi(x)^\top` for each input, shape
``(..., N, p, D)`` with ``D = 2 M p'`` columns; the GPyTorch covariance is ``(N p) x (N p)`` in
the interleaved order (row ``n p + t``).

=================  ===========================  ========================  =====
kernel             :math:`A(\omega)`            :math:`B(\omega)`          p'
=================  ===========================  ========================  =====
decomposable       :math:`A` (learnable)        constant factor of A      rank
curl-free          :math:`\omega\omega^\top`     :math:`\omega`            1
div-free           :math:`\|\omega\|^2 I -      closed forms, see          1, 3,
                   \omega\omega^\top`           :func:`div_free_factor`   d-1, d
=================  ===========================  ========================  =====

Every posterior mean and prior sample built from the curl-free (div-free) features is exactly
curl-free (div-free), whatever the number of features: each column is the gradient of
:math:`\cos/\sin(\omega^\top x)`, or a vector orthogonal to :math:`\omega` times such a function.

References:
    Brault, d'Alché-Buc, Heinonen, *Random Fourier Features for Operator-Valued Kernels*,
    ACML 2016.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Optional

import torch
from gpytorch.constraints import Positive
from gpytorch.kernels import Kernel, MaternKernel, MultitaskKernel, RBFKernel
from torch import Tensor

from rfgp.kernels.base import RandomFeatureKernel
from rfgp.kernels.exact import (
    CurlFreeKernel,
    DivFreeKernel,
    HelmholtzKernel,
    _HelmholtzParameters,
    register_helmholtz_parameters,
    vector_field_normalizer,
)
from rfgp.kernels.fourier import SPECTRAL_DENSITIES, sample_frequencies

__all__ = [
    "DecomposableFeatureKernel",
    "CurlFreeFeatureKernel",
    "DivFreeFeatureKernel",
    "HelmholtzFeatureKernel",
    "DIV_FREE_FACTORS",
    "div_free_factor",
    "div_free_factor_rank",
    "operator_features",
    "helmholtz_components",
]

OPERATOR_SAMPLINGS = ("iid", "orthogonal")
#: closed-form factors B with B B^T = |w|^2 I - w w^T (``"auto"`` picks one by dimension).
DIV_FREE_FACTORS = ("auto", "rotation", "cross", "complement", "projection")


def _check_choice(name: str, value: Any, choices) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}")


def _check_positive_int(name: str, value: Any, minimum: int = 1) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


# ------------------------------------------------------------------ factors and features
def _resolve_factor(dim: int, factor: str) -> str:
    _check_choice("factor", factor, DIV_FREE_FACTORS)
    if dim < 2:
        raise ValueError(f"div-free features need input dimension d >= 2, got d = {dim}")
    if factor == "auto":
        return "rotation" if dim == 2 else "complement"
    if factor == "rotation" and dim != 2:
        raise ValueError(f"factor='rotation' needs d = 2, got d = {dim}")
    if factor == "cross" and dim != 3:
        raise ValueError(f"factor='cross' needs d = 3, got d = {dim}")
    return factor


def div_free_factor_rank(dim: int, factor: str = "auto") -> int:
    """``p'``, the number of columns of the div-free factor ``B(omega)`` in dimension ``dim``.

    Args:
        dim: input dimension ``d >= 2``.
        factor: ``"rotation"`` (d = 2), ``"cross"`` (d = 3), ``"complement"``,
            ``"projection"`` or ``"auto"``, as in :func:`div_free_factor`.

    Returns:
        ``1``, ``3``, ``d - 1`` or ``d`` for the factors above (``"auto"``: 1 in 2-D, else
        ``d - 1``).

    Raises:
        ValueError: for an unknown ``factor``, ``dim < 2``, or a factor that does not exist in
            dimension ``dim``.

    Example:
        >>> [div_free_factor_rank(2), div_free_factor_rank(3, "cross"), div_free_factor_rank(5)]
        [1, 3, 4]
    """
    factor = _resolve_factor(dim, factor)
    return {"rotation": 1, "cross": 3, "complement": dim - 1, "projection": dim}[factor]


def div_free_factor(omega: Tensor, factor: str = "auto") -> Tensor:
    r"""A closed-form factor :math:`B(\omega)` with :math:`BB^\top = \|\omega\|^2 I -
    \omega\omega^\top` (no Cholesky of this singular matrix).

    * ``"rotation"`` (d = 2, p' = 1): :math:`B = J\omega = (-\omega_2, \omega_1)^\top`.
    * ``"cross"`` (d = 3, p' = 3): :math:`B = [\omega]_\times`, the cross-product matrix.
    * ``"complement"`` (any d, p' = d - 1): :math:`B = \|\omega\| Q`, ``Q`` an orthonormal basis
      of :math:`\omega^\perp` from the Householder reflection that maps :math:`e_1` to
      :math:`\pm\omega/\|\omega\|`.
    * ``"projection"`` (any d, p' = d): :math:`B = \|\omega\| I - \omega\omega^\top/\|\omega\|`,
      the symmetric square root.
    * ``"auto"``: ``"rotation"`` in 2-D, ``"complement"`` otherwise.

    :math:`\omega = 0` gives :math:`B = 0` (never NaN).

    Args:
        omega: ``(..., d)`` frequencies, ``d >= 2``.
        factor: one of :data:`DIV_FREE_FACTORS`.

    Returns:
        ``(..., d, p')``.

    Example:
        >>> w = torch.tensor([[1.0, 2.0, 2.0]], dtype=torch.float64)
        >>> b = div_free_factor(w)
        >>> b.shape
        torch.Size([1, 3, 2])
        >>> torch.allclose(b @ b.mT, 9 * torch.eye(3, dtype=torch.float64) - w.mT @ w)
        True
    """
    dim = omega.shape[-1]
    factor = _resolve_factor(dim, factor)
    if factor == "rotation":
        return torch.stack([-omega[..., 1], omega[..., 0]], dim=-1).unsqueeze(-1)
    if factor == "cross":
        w1, w2, w3 = omega.unbind(-1)
        zero = torch.zeros_like(w1)
        rows = [torch.stack(r, -1) for r in ((zero, -w3, w2), (w3, zero, -w1), (-w2, w1, zero))]
        return torch.stack(rows, dim=-2)
    norm = omega.norm(dim=-1, keepdim=True)
    safe_norm = torch.where(norm > 0, norm, torch.ones_like(norm))
    unit = omega / safe_norm
    eye = torch.eye(dim, dtype=omega.dtype, device=omega.device)
    if factor == "projection":
        proj = norm.unsqueeze(-1) * eye - omega.unsqueeze(-1) * unit.unsqueeze(-2)
        return proj
    # Householder: v = u + s e_1 with s = sign(u_1) keeps |v|^2 = 2 (1 + |u_1|) >= 2; the
    # reflection H = I - 2 v v^T / |v|^2 maps e_1 to -s u, so its other columns span u-perp.
    first = unit[..., :1]
    sign = torch.where(first >= 0, torch.ones_like(first), -torch.ones_like(first))
    v = unit + sign * eye[0]
    householder = eye - 2.0 * v.unsqueeze(-1) * v.unsqueeze(-2) / (v * v).sum(-1)[..., None, None]
    return norm.unsqueeze(-1) * householder[..., 1:]


def operator_features(x: Tensor, omega: Tensor, factor: Tensor, scale: Tensor | float) -> Tensor:
    r"""Real ORFF map :math:`\Phi(x)^\top` for frequencies ``omega`` and factors ``B(omega)``.

    .. math::
        \Phi(x)^\top_{t,\,(c, j, r)} = \mathrm{scale}\cdot
            \mathrm{trig}_c(\omega_j^\top x)\, B(\omega_j)_{t r},
        \qquad \mathrm{trig}_0 = \cos,\ \mathrm{trig}_1 = \sin,

    so :math:`\Phi(x)^\top\Phi(z) = \mathrm{scale}^2 \sum_j \cos(\omega_j^\top(x - z))
    B(\omega_j)B(\omega_j)^\top`. Columns are ordered (cos/sin, frequency, factor column).

    Args:
        x: ``(..., N, d)`` inputs (already scaled; the frequencies carry the lengthscale).
        omega: ``(*batch, M, d)`` frequencies.
        factor: ``(*batch, M, p, p')`` factors ``B(omega_j)``, or ``(*batch, 1, p, p')`` for one
            factor shared by all frequencies (the decomposable kernel).
        scale: a float or a tensor broadcasting against ``(..., N, p, D)``.

    Returns:
        ``(..., N, p, 2 M p')``.

    Example:
        >>> x = torch.randn(5, 2, dtype=torch.float64)
        >>> w = torch.randn(7, 2, dtype=torch.float64)
        >>> operator_features(x, w, w.unsqueeze(-1), 1.0).shape
        torch.Size([5, 2, 14])
    """
    if factor.dim() < 3:
        raise ValueError(
            f"factor must have shape (*batch, M or 1, p, p'), got {tuple(factor.shape)}"
        )
    proj = x @ omega.transpose(-1, -2)  # (..., N, M)
    b = factor.movedim(-3, -2).unsqueeze(-4)  # (*batch, 1, p, M or 1, p')
    cos = torch.cos(proj)[..., :, None, :, None] * b  # (..., N, p, M, p')
    sin = torch.sin(proj)[..., :, None, :, None] * b
    phi = torch.cat([cos.flatten(-2), sin.flatten(-2)], dim=-1)
    return phi * scale


def _feature_scale(coefficient: Tensor, num_frequencies: int) -> Tensor:
    # coefficient (*batch, 1) -> (*batch, 1, 1, 1), broadcasting against (..., N, p, D)
    return (coefficient / num_frequencies).sqrt().unsqueeze(-1).unsqueeze(-1)


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
        _check_positive_int("num_tasks", num_tasks)
        _check_positive_int("rank", rank, minimum=0)
        if not isinstance(diagonal, bool):
            raise TypeError(f"diagonal must be a bool, got {type(diagonal).__name__}")
        if rank == 0 and not diagonal:
            raise ValueError("rank must be >= 1 when diagonal=False (A would be zero), got 0")
        _check_choice("spectral", spectral, SPECTRAL_DENSITIES)
        _check_choice("sampling", sampling, OPERATOR_SAMPLINGS)
        factor_cols = rank + (num_tasks if diagonal else 0)
        _check_positive_int("num_features", num_features)
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
        value = torch.as_tensor(value).to(self.raw_task_diag)
        if (value <= 0).any():
            raise ValueError(f"task_diag must be positive, got {value}")
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
        nu = SPECTRAL_DENSITIES[self.spectral]
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

    def extra_repr(self) -> str:
        return (f"num_features={self.num_features}, num_tasks={self.num_tasks}, "
                f"rank={self.rank}, diagonal={self.diagonal}, spectral={self.spectral!r}, "
                f"sampling={self.sampling!r}, input_dim={self.input_dim}")


# ------------------------------------------------------------------ curl / div free
class _VectorFieldFeatureKernel(RandomFeatureKernel):
    """Shared plumbing: ``p = d`` outputs, Gaussian frequencies, dimension checks."""

    _min_dim = 1
    #: the exact kernel class :meth:`exact_kernel` builds (set by each subclass).
    _exact_class: type

    def __init__(
        self,
        num_features: int,
        input_dim: Optional[int] = None,
        num_outputs: Optional[int] = None,
        sampling: str = "iid",
        normalize: bool = True,
        seed: Optional[int] = None,
        **kwargs: Any,
    ) -> None:
        _check_choice("sampling", sampling, OPERATOR_SAMPLINGS)
        if not isinstance(normalize, bool):
            raise TypeError(f"normalize must be a bool, got {type(normalize).__name__}")
        if num_outputs is not None:
            _check_positive_int("num_outputs", num_outputs)
            if input_dim is not None and input_dim != num_outputs:
                raise ValueError(
                    f"{type(self).__name__} maps R^d to R^d: num_outputs ({num_outputs}) must "
                    f"equal input_dim ({input_dim})"
                )
            input_dim = num_outputs if input_dim is None else input_dim
        ard = kwargs.get("ard_num_dims")
        if ard is not None and input_dim is not None and ard != input_dim:
            raise ValueError(
                f"ard_num_dims must equal the input dimension ({input_dim}) of "
                f"{type(self).__name__}, got {ard}"
            )
        super().__init__(num_features=num_features, input_dim=input_dim, seed=seed, **kwargs)
        self.sampling = sampling
        self.normalize = normalize
        if self.input_dim is not None:
            self._check_dim(self.input_dim)

    def _check_dim(self, dim: int) -> None:
        if dim < self._min_dim:
            raise ValueError(
                f"{type(self).__name__} needs input dimension d >= {self._min_dim}, got d = {dim}"
            )
        rows = self._columns_per_frequency(dim)
        if self.num_features % rows:
            raise ValueError(
                f"num_features must be a multiple of {rows} for {type(self).__name__} in "
                f"d = {dim} (cos and sin times the factor columns), got {self.num_features}"
            )

    def _columns_per_frequency(self, dim: int) -> int:
        raise NotImplementedError

    @property
    def num_frequencies(self) -> int:
        if self.input_dim is None:
            raise RuntimeError("the number of frequencies depends on d, which is unknown yet")
        return self.num_features // self._columns_per_frequency(self.input_dim)

    @property
    def _outputs_per_input(self) -> int:  # type: ignore[override]
        if self.input_dim is None:
            raise RuntimeError(
                f"{type(self).__name__}: the number of outputs equals the input dimension, "
                "which is unknown yet; pass input_dim= or evaluate the kernel once"
            )
        return self.input_dim

    def num_outputs_per_input(self, x1: Optional[Tensor] = None, x2: Optional[Tensor] = None):
        if self.input_dim is None and x1 is not None:
            return x1.shape[-1] if x1.dim() > 1 else 1
        return self._outputs_per_input

    def _check_input(self, x: Tensor, name: str = "x") -> Tensor:
        x = super()._check_input(x, name)
        # Without active_dims (which fixes d at construction) the number of outputs is the
        # input width, which solvers need before any feature is computed.
        if self.input_dim is None and self.active_dims is None:
            self._check_dim(int(x.shape[-1]))
            self.input_dim = int(x.shape[-1])
        return x

    def _ensure_weights(self, x: Tensor) -> None:
        d = x.shape[-1]
        if self.input_dim is None:
            self._check_dim(int(d))
        elif d != self.input_dim:
            raise ValueError(
                f"{type(self).__name__} maps R^d to R^d with d = {self.input_dim} (input "
                f"dimension = output dimension); x has {d} columns"
            )
        super()._ensure_weights(x)

    def _sample_frequencies(self, input_dim: int, generator) -> Tensor:
        m = self.num_features // self._columns_per_frequency(input_dim)
        return sample_frequencies(m, input_dim, "rbf", self.sampling, self.batch_shape,
                                  generator)

    def _sample_weights(self, input_dim: int, generator) -> Dict[str, Tensor]:
        return {"frequencies": self._sample_frequencies(input_dim, generator)}

    def exact_kernel(self) -> Kernel:
        """The exact :class:`~rfgp.kernels.CurlFreeKernel` or :class:`~rfgp.kernels.DivFreeKernel`
        (``_exact_class``) with the current lengthscale (a copy)."""
        exact = self._exact_class(input_dim=self.input_dim, normalize=self.normalize,
                                  ard_num_dims=self.ard_num_dims, batch_shape=self.batch_shape,
                                  active_dims=self.active_dims).to(self.lengthscale)
        exact.lengthscale = self.lengthscale.detach().clone()
        return exact

    def extra_repr(self) -> str:
        return (f"num_features={self.num_features}, input_dim={self.input_dim}, "
                f"sampling={self.sampling!r}, normalize={self.normalize}")


def _vector_field_features(x: Tensor, frequencies: Tensor, lengthscale: Tensor, normalize: bool,
                           kind: str, factor: str = "auto") -> Tensor:
    # kind "curl": B(omega) = omega; "div": the closed-form div-free factor named by ``factor``.
    omega = frequencies.to(x.dtype) / lengthscale
    m = omega.shape[-2]
    if normalize:
        coefficient = vector_field_normalizer(lengthscale, kind, x.shape[-1])
    else:
        coefficient = torch.ones(lengthscale.shape[:-1], dtype=x.dtype, device=x.device)
    b = omega.unsqueeze(-1) if kind == "curl" else div_free_factor(omega, factor)
    return operator_features(x, omega, b, _feature_scale(coefficient, m))


class CurlFreeFeatureKernel(_VectorFieldFeatureKernel):
    r"""Random features for the curl-free Gaussian kernel :math:`-\nabla\nabla^\top k`.

    With :math:`\omega_j \sim N(0, \Lambda)`, :math:`\Lambda = \mathrm{diag}(l^{-2})` and
    :math:`B(\omega) = \omega` (``p' = 1``, ``D = 2M``):

    .. math::
        \Phi(x)^\top = \sqrt{c/M}\,[\cos(\omega_j^\top x)\,\omega_j,\
                                   \sin(\omega_j^\top x)\,\omega_j]_{j},\qquad
        \hat K(x, z) = \frac{c}{M}\sum_j \cos(\omega_j^\top(x - z))\,\omega_j\omega_j^\top,

    an unbiased estimate of :class:`~rfgp.kernels.CurlFreeKernel`. Every column is the gradient
    of a scalar function, so every posterior mean and sample is exactly curl-free. ``c`` as in
    :class:`~rfgp.kernels.CurlFreeKernel` (``normalize=True``: ``K(x, x) = I`` with one
    lengthscale; ``False``: ``c = 1``, ``K(x, x) = I / l^2``).

    Args:
        num_features: ``D = 2 M`` (even).
        input_dim: ``d`` = number of outputs ``p``; inferred from the first input if ``None``.
        num_outputs: optional ``p``; must equal ``input_dim`` (curl needs ``R^d -> R^d``).
        sampling: ``"iid"`` or ``"orthogonal"`` frequencies
            (:func:`~rfgp.kernels.fourier.sample_frequencies`).
        normalize: see above.
        seed: seed of the frequency draw.
        **kwargs: GPyTorch ``Kernel`` arguments (``ard_num_dims``, ``batch_shape``, ...).

    Shapes:
        ``features(x)``: ``(..., N, d) -> (..., N, d, D)``; covariance ``(N d) x (N d)``
        interleaved.

    Example:
        >>> k = CurlFreeFeatureKernel(200, input_dim=2, seed=0).to(torch.float64)
        >>> x = torch.randn(6, 2, dtype=torch.float64)
        >>> k.features(x).shape
        torch.Size([6, 2, 200])
        >>> k(x).shape
        torch.Size([12, 12])

    References:
        Brault, d'Alché-Buc, Heinonen, *Random Fourier Features for Operator-Valued Kernels*,
        ACML 2016.
    """

    has_lengthscale = True
    _exact_class = CurlFreeKernel

    def _columns_per_frequency(self, dim: int) -> int:
        return 2

    def _features(self, x: Tensor) -> Tensor:
        return _vector_field_features(x, self.frequencies, self.lengthscale.to(x.dtype),
                                      self.normalize, "curl")


class DivFreeFeatureKernel(_VectorFieldFeatureKernel):
    r"""Random features for the divergence-free Gaussian kernel
    :math:`(\nabla\nabla^\top - \Delta I)k`.

    :math:`A(\omega) = \|\omega\|^2 I - \omega\omega^\top` is singular, so the factor
    :math:`B(\omega)` is a closed form (:func:`div_free_factor`): a 90-degree rotation of
    :math:`\omega` in 2-D (``p' = 1``), the cross-product matrix in 3-D (``factor="cross"``,
    ``p' = 3``), an orthonormal basis of :math:`\omega^\perp` times :math:`\|\omega\|` in any
    dimension (``"complement"``, ``p' = d - 1``) or the symmetric square root
    (``"projection"``, ``p' = d``). ``D = 2 M p'``. Each column is a vector orthogonal to
    :math:`\omega_j` times a function of :math:`\omega_j^\top x`, so every posterior mean and
    sample has exactly zero divergence. Unbiased for :class:`~rfgp.kernels.DivFreeKernel`
    (``normalize`` as there).

    Args:
        num_features: ``D``, a multiple of ``2 p'``.
        input_dim: ``d >= 2`` = number of outputs; inferred from the first input if ``None``.
        num_outputs: optional ``p``; must equal ``input_dim``.
        factor: one of :data:`DIV_FREE_FACTORS` (``"auto"``: rotation in 2-D, complement
            otherwise).
        sampling: ``"iid"`` or ``"orthogonal"``.
        normalize: ``K(x, x) = I`` (one lengthscale) if ``True``, else ``(d - 1) I / l^2``.
        seed: seed of the frequency draw.
        **kwargs: GPyTorch ``Kernel`` arguments.

    Shapes:
        ``features(x)``: ``(..., N, d) -> (..., N, d, D)``.

    Example:
        >>> k = DivFreeFeatureKernel(120, input_dim=3, factor="cross", seed=0).to(torch.float64)
        >>> k.features(torch.randn(5, 3, dtype=torch.float64)).shape
        torch.Size([5, 3, 120])

    References:
        Brault et al., ACML 2016 (the printed factor :math:`(I - \omega\omega^*)^{1/2}` is
        corrected here to the factor of :math:`\|\omega\|^2 I - \omega\omega^\top`).
    """

    has_lengthscale = True
    _min_dim = 2
    _exact_class = DivFreeKernel

    def __init__(self, num_features: int, input_dim: Optional[int] = None,
                 num_outputs: Optional[int] = None, factor: str = "auto", sampling: str = "iid",
                 normalize: bool = True, seed: Optional[int] = None, **kwargs: Any) -> None:
        _check_choice("factor", factor, DIV_FREE_FACTORS)
        self.factor = factor
        super().__init__(num_features, input_dim=input_dim, num_outputs=num_outputs,
                         sampling=sampling, normalize=normalize, seed=seed, **kwargs)

    def _columns_per_frequency(self, dim: int) -> int:
        if dim < 2:
            raise ValueError(f"{type(self).__name__} needs input dimension d >= 2, got d = {dim}")
        return 2 * div_free_factor_rank(dim, self.factor)

    def _features(self, x: Tensor) -> Tensor:
        return _vector_field_features(x, self.frequencies, self.lengthscale.to(x.dtype),
                                      self.normalize, "div", self.factor)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", factor={self.factor!r}"


HELMHOLTZ_COMPONENTS = ("curl", "div")


class HelmholtzFeatureKernel(_HelmholtzParameters, _VectorFieldFeatureKernel):
    r"""Random features for the Helmholtz kernel :math:`s_c K_{curl}(l_c) + s_d K_{div}(l_d)`.

    The feature matrix is the curl-free block and the div-free block side by side, each with
    its own frequencies, lengthscale and outputscale:

    .. math::
        \Phi(x)^\top = [\sqrt{s_c}\,\Phi_{curl}(x)^\top,\ \sqrt{s_d}\,\Phi_{div}(x)^\top],
        \qquad \hat K = s_c\hat K_{curl} + s_d\hat K_{div}.

    A GP with this kernel has posterior weights over both blocks; the curl-free part of the
    posterior is the same GP seen through :meth:`component_features` ``(x, "curl")`` (the
    div-free block zeroed), and likewise for ``"div"`` (see :func:`helmholtz_components`).
    Both lengthscales and outputscales are parameters, so a marginal-likelihood fit can
    separate the irrotational and solenoidal parts of a field.

    Args:
        num_features: total ``D = 2 M (1 + p')`` (``M`` frequencies per block, ``p'`` the
            div-free factor columns: ``D`` a multiple of 4 in 2-D).
        input_dim: ``d >= 2`` = number of outputs; inferred from the first input if ``None``.
        num_outputs: optional ``p``; must equal ``input_dim``.
        factor: div-free factor (:data:`DIV_FREE_FACTORS`).
        sampling: ``"iid"`` or ``"orthogonal"``.
        normalize: normalise both blocks (``K(x, x) = (s_c + s_d) I`` with one lengthscale
            each).
        ard_num_dims: ARD lengthscales for both blocks if given (must equal ``d``).
        seed: seed of the frequency draws.
        **kwargs: GPyTorch ``Kernel`` arguments (``batch_shape``, ``active_dims``).

    Attributes:
        curl_lengthscale, div_lengthscale: ``(*batch, 1, ard_num_dims or 1)``.
        curl_outputscale, div_outputscale: ``(*batch,)``.
        curl_num_features, div_num_features: columns of the two blocks.

    Shapes:
        ``features(x)``, ``component_features(x, part)``: ``(..., N, d) -> (..., N, d, D)``.

    Example:
        >>> k = HelmholtzFeatureKernel(400, input_dim=2, seed=0).to(torch.float64)
        >>> k.curl_lengthscale = 0.5
        >>> x = torch.randn(5, 2, dtype=torch.float64)
        >>> k.features(x).shape
        torch.Size([5, 2, 400])
        >>> phi_curl = k.component_features(x, "curl")
        >>> bool((phi_curl[..., k.curl_num_features:] == 0).all())
        True

    References:
        Berlinghieri et al., *Gaussian processes at the Helm(holtz)*, ICML 2023.
        Brault et al., ACML 2016.
    """

    _min_dim = 2

    def __init__(self, num_features: int, input_dim: Optional[int] = None,
                 num_outputs: Optional[int] = None, factor: str = "auto", sampling: str = "iid",
                 normalize: bool = True, ard_num_dims: Optional[int] = None,
                 seed: Optional[int] = None, **kwargs: Any) -> None:
        _check_choice("factor", factor, DIV_FREE_FACTORS)
        self.factor = factor
        if ard_num_dims is not None:
            _check_positive_int("ard_num_dims", ard_num_dims)
            if input_dim is None and num_outputs is None:
                input_dim = ard_num_dims
            elif (input_dim or num_outputs) != ard_num_dims:
                raise ValueError(
                    f"ard_num_dims must equal the input dimension ({input_dim or num_outputs}), "
                    f"got {ard_num_dims}"
                )
        super().__init__(num_features, input_dim=input_dim, num_outputs=num_outputs,
                         sampling=sampling, normalize=normalize, seed=seed, **kwargs)
        self.helmholtz_ard_num_dims = ard_num_dims
        register_helmholtz_parameters(self, ard_num_dims)

    def _columns_per_frequency(self, dim: int) -> int:
        if dim < 2:
            raise ValueError(f"{type(self).__name__} needs input dimension d >= 2, got d = {dim}")
        return 2 * (1 + div_free_factor_rank(dim, self.factor))

    @property
    def curl_num_features(self) -> int:
        """Columns of the curl-free block (``2 M``)."""
        return 2 * self.num_frequencies

    @property
    def div_num_features(self) -> int:
        """Columns of the div-free block (``2 M p'``)."""
        return self.num_features - self.curl_num_features

    def _sample_weights(self, input_dim: int, generator) -> Dict[str, Tensor]:
        return {"curl_frequencies": self._sample_frequencies(input_dim, generator),
                "div_frequencies": self._sample_frequencies(input_dim, generator)}

    def _blocks(self, x: Tensor):
        dtype = x.dtype
        curl = _vector_field_features(x, self.curl_frequencies, self.curl_lengthscale.to(dtype),
                                      self.normalize, "curl")
        div = _vector_field_features(x, self.div_frequencies, self.div_lengthscale.to(dtype),
                                     self.normalize, "div", self.factor)
        s_curl = self.curl_outputscale.to(dtype).sqrt()[..., None, None, None]
        s_div = self.div_outputscale.to(dtype).sqrt()[..., None, None, None]
        return curl * s_curl, div * s_div

    def _features(self, x: Tensor) -> Tensor:
        curl, div = self._blocks(x)
        return torch.cat([curl, div], dim=-1)

    def component_features(self, x: Tensor, part: str) -> Tensor:
        r"""Features of one part, in the layout of :meth:`features`, the other block zeroed.

        ``component_features(x, "curl") @ w`` is the curl-free part of the field with weights
        ``w``; with a posterior over ``w`` (``RandomFeatureGP.posterior_from_features``) it is
        the posterior of the curl-free component.

        Args:
            x: ``(..., N, d)`` inputs.
            part: ``"curl"`` or ``"div"``.

        Returns:
            ``(..., N, d, D)``.
        """
        _check_choice("part", part, HELMHOLTZ_COMPONENTS)
        x = self._check_input(x)
        if self.active_dims is not None:
            x = x.index_select(-1, self.active_dims)
        self._ensure_weights(x)
        curl, div = self._blocks(x)
        if part == "curl":
            return torch.cat([curl, torch.zeros_like(div)], dim=-1)
        return torch.cat([torch.zeros_like(curl), div], dim=-1)

    def component_kernel(self, part: str) -> RandomFeatureKernel:
        """A feature kernel for one part alone (same frequencies, lengthscale, outputscale).

        Returns a ``ScaleKernel`` around a :class:`CurlFreeFeatureKernel` or
        :class:`DivFreeFeatureKernel` holding copies of this kernel's weights.
        """
        from gpytorch.kernels import ScaleKernel

        _check_choice("part", part, HELMHOLTZ_COMPONENTS)
        if not self.weights_initialized:
            raise RuntimeError("weights are not drawn yet: call features(x) or resample() first")
        m = self.num_frequencies
        common = dict(input_dim=self.input_dim, sampling=self.sampling,
                      normalize=self.normalize, ard_num_dims=self.helmholtz_ard_num_dims,
                      batch_shape=self.batch_shape, active_dims=self.active_dims)
        if part == "curl":
            base = CurlFreeFeatureKernel(2 * m, **common)
        else:
            base = DivFreeFeatureKernel(self.div_num_features, factor=self.factor, **common)
        base = base.to(self.raw_curl_lengthscale)
        base.lengthscale = getattr(self, f"{part}_lengthscale").detach().clone()
        base._set_weights({"frequencies": getattr(self, f"{part}_frequencies").detach().clone()})
        scaled = ScaleKernel(base, batch_shape=self.batch_shape).to(self.raw_curl_lengthscale)
        scaled.outputscale = getattr(self, f"{part}_outputscale").detach().clone()
        return scaled

    def exact_kernel(self) -> HelmholtzKernel:
        """The exact :class:`~rfgp.kernels.HelmholtzKernel` with the current parameters (copy)."""
        exact = HelmholtzKernel(input_dim=self.input_dim, normalize=self.normalize,
                                ard_num_dims=self.helmholtz_ard_num_dims,
                                batch_shape=self.batch_shape, active_dims=self.active_dims)
        exact = exact.to(self.raw_curl_lengthscale)
        for name in ("curl_lengthscale", "div_lengthscale", "curl_outputscale",
                     "div_outputscale"):
            setattr(exact, name, getattr(self, name).detach().clone())
        return exact

    def extra_repr(self) -> str:
        return super().extra_repr() + f", factor={self.factor!r}"


# ------------------------------------------------------------------ inference helper
def helmholtz_components(gp: Any, x: Tensor) -> Dict[str, Any]:
    r"""Posteriors of the curl-free and the divergence-free parts of a fitted Helmholtz GP.

    The fitted weights ``w`` are shared by the two blocks of the Helmholtz features, so the
    posterior of each part is the posterior of :math:`\Phi_{part}(x)^\top w`, evaluated with
    :meth:`HelmholtzFeatureKernel.component_features` and ``gp.posterior_from_features``. The
    two parts sum to the full latent field (means add exactly; covariances add up to the
    cross-covariance between the parts).

    Args:
        gp: a fitted ``rfgp.RandomFeatureGP`` whose kernel is a :class:`HelmholtzFeatureKernel`
            (optionally inside a ``ScaleKernel``).
        x: ``(N, d)`` inputs.

    Returns:
        ``{"curl": posterior, "div": posterior}``, each a ``MultitaskMultivariateNormal``
        over the ``(N, d)`` field.

    Example:
        >>> from rfgp import RandomFeatureGP
        >>> x = torch.rand(30, 2, dtype=torch.float64)
        >>> y = torch.stack([x[:, 1], -x[:, 0]], -1)            # a rotation: div-free
        >>> k = HelmholtzFeatureKernel(80, input_dim=2, seed=0).double()
        >>> gp = RandomFeatureGP(k, noise=0.01).fit(x, y)
        >>> parts = helmholtz_components(gp, x[:4])
        >>> total = parts["curl"].mean + parts["div"].mean
        >>> parts["div"].mean.shape, torch.allclose(total, gp.predict(x[:4]))
        (torch.Size([4, 2]), True)
    """
    from gpytorch.kernels import ScaleKernel

    kernel = getattr(gp, "kernel", None)
    if isinstance(kernel, ScaleKernel):
        kernel = kernel.base_kernel  # posterior_from_features applies the outputscale
    if not isinstance(kernel, HelmholtzFeatureKernel):
        raise TypeError(
            "gp.kernel must be a HelmholtzFeatureKernel (optionally in a ScaleKernel), got "
            f"{type(kernel).__name__}"
        )
    with torch.no_grad():
        return {part: gp.posterior_from_features(kernel.component_features(x, part))
                for part in HELMHOLTZ_COMPONENTS}
