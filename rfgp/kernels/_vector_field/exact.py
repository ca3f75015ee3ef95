r"""Exact operator-valued (vector-field) kernels: curl-free, divergence-free, Helmholtz.

These are the kernels that the features of :mod:`rfgp.kernels._vector_field.features`
approximate.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from gpytorch.constraints import Positive
from gpytorch.kernels import Kernel
from torch import Tensor

from rfgp._validation import check_bool, check_int, check_positive_values
from rfgp.kernels._base import InputCheckedKernel

__all__ = [
    "CurlFreeKernel",
    "DivFreeKernel",
    "HelmholtzKernel",
    "curl_free_gaussian",
    "div_free_gaussian",
    "vector_field_normalizer",
    "register_helmholtz_parameters",
    "HelmholtzParameters",
]


# All are built from the Gaussian kernel k(x, z) = exp(-sum_a (x_a - z_a)^2 / (2 l_a^2)),
# delta = x - z, Lambda = diag(1 / l^2):
#   K_curl = -Hess k           = (Lambda - Lambda delta delta^T Lambda) k
#   K_div  = Hess k - tr(Hess k) I
#          = (Lambda delta delta^T Lambda - Lambda + (tr Lambda - |Lambda delta|^2) I) k
# Matrices are (N p) x (M p) in GPyTorch's interleaved order (row n * p + a).

_VECTOR_FIELD_KINDS = ("curl", "div")


def vector_field_normalizer(lengthscale: Tensor, kind: str, dim: int) -> Tensor:
    r"""The constant ``c`` of a normalised curl-free or div-free Gaussian kernel.

    At ``delta = 0``, ``-Hess k`` is :math:`\Lambda = \mathrm{diag}(l^{-2})` and the div-free
    kernel is :math:`\mathrm{tr}(\Lambda) I - \Lambda`. The normalised kernels are ``c * K``
    with :math:`c = d / \mathrm{tr}\Lambda` (curl) and :math:`c = d / ((d-1)\mathrm{tr}\Lambda)`
    (div), so ``tr K(0) = d`` and, with one lengthscale, ``K(0) = I``. ``c`` is a scalar, so
    curl-free fields stay curl-free and div-free fields stay div-free under ARD lengthscales.

    Args:
        lengthscale: ``(*batch, 1, d_l)`` positive tensor (``d_l`` is 1 or ``d``).
        kind: ``"curl"`` or ``"div"``.
        dim: ``d``.

    Returns:
        ``lengthscale.shape[:-1]`` tensor.

    Example:
        >>> vector_field_normalizer(torch.tensor([[2.0]]), "div", 3)
        tensor([2.])
    """
    if kind not in _VECTOR_FIELD_KINDS:
        raise ValueError(f"kind must be one of {_VECTOR_FIELD_KINDS}, got {kind!r}")
    c = 1.0 / lengthscale.pow(-2).mean(-1)
    if kind == "div":
        c = c / (dim - 1)
    return c


def _gaussian_parts(x1: Tensor, x2: Tensor, lengthscale: Tensor, diag: bool):
    """``k``, ``Lambda delta`` and ``diag Lambda`` for all pairs of rows of x1 and x2 (for the
    pairs ``(x1_n, x2_n)`` if ``diag``)."""
    dim = x1.shape[-1]
    inv_sq = lengthscale.pow(-2).expand(*lengthscale.shape[:-1], dim)  # (*batch, 1, d)
    if diag:
        diff = x1 - x2  # (..., N, d): the pair dimension is the lengthscale's row dimension
    else:
        diff = x1.unsqueeze(-2) - x2.unsqueeze(-3)  # (..., N, M, d)
        inv_sq = inv_sq.unsqueeze(-2)  # (*batch, 1, 1, d)
    scaled = diff * inv_sq
    k = torch.exp(-0.5 * (diff * scaled).sum(-1))
    return k, scaled, inv_sq



def curl_free_gaussian(
    x1: Tensor, x2: Tensor, lengthscale: Tensor, normalize: bool = True, diag: bool = False
) -> Tensor:
    r"""Blocks of the curl-free Gaussian kernel :math:`K(x, z) = -\nabla\nabla^\top k(x - z)`.

    .. math::
        K(x, z) = c\,(\Lambda - \Lambda\delta\delta^\top\Lambda)\,k(x, z), \quad
        \delta = x - z,\ \Lambda = \mathrm{diag}(l^{-2}),

    with ``c = d / tr(Lambda)`` if ``normalize`` (so ``K(x, x) = I`` for one lengthscale)
    and ``c = 1`` otherwise.

    Args:
        x1: ``(..., N, d)``; x2: ``(..., M, d)``.
        lengthscale: ``(*batch, 1, d_l)`` with ``d_l`` in ``{1, d}``.
        normalize: scale as above.
        diag: only the blocks ``K(x1_n, x2_n)`` (``M = N``).

    Returns:
        ``(..., N, M, d, d)`` blocks ``K(x1_n, x2_m)`` (``(..., N, d, d)`` if ``diag``).

    Example:
        >>> x = torch.zeros(1, 2, dtype=torch.float64)
        >>> curl_free_gaussian(x, x, torch.tensor([[0.5]], dtype=torch.float64))[0, 0]
        tensor([[1., 0.],
                [0., 1.]], dtype=torch.float64)
    """
    k, scaled, inv_sq = _gaussian_parts(x1, x2, lengthscale, diag)
    lam = torch.diag_embed(inv_sq)  # (*batch, 1, [1,] d, d)
    blocks = (lam - scaled.unsqueeze(-1) * scaled.unsqueeze(-2)) * k[..., None, None]
    if normalize:
        c = vector_field_normalizer(lengthscale, "curl", x1.shape[-1])  # (*batch, 1)
        blocks = blocks * c[(...,) + (None,) * (2 if diag else 3)]
    return blocks


def div_free_gaussian(
    x1: Tensor, x2: Tensor, lengthscale: Tensor, normalize: bool = True, diag: bool = False
) -> Tensor:
    r"""Blocks of the divergence-free Gaussian kernel :math:`(\nabla\nabla^\top - \Delta I)k`.

    .. math::
        K(x, z) = c\,\big(\Lambda\delta\delta^\top\Lambda - \Lambda
                  + (\mathrm{tr}\Lambda - \|\Lambda\delta\|^2) I\big)\,k(x, z),

    with ``c = d / ((d - 1) tr(Lambda))`` if ``normalize`` (``K(x, x) = I`` for one lengthscale)
    and ``c = 1`` otherwise. With one lengthscale ``l`` and ``c = 1`` this is the form
    :math:`l^{-2}(\delta\delta^\top/l^2 + (d - 1 - \|\delta\|^2/l^2) I)\,k`.

    Args:
        x1: ``(..., N, d)``; x2: ``(..., M, d)``, ``d >= 2``.
        lengthscale: ``(*batch, 1, d_l)`` with ``d_l`` in ``{1, d}``.
        normalize: scale as above.
        diag: only the blocks ``K(x1_n, x2_n)`` (``M = N``).

    Returns:
        ``(..., N, M, d, d)`` blocks (``(..., N, d, d)`` if ``diag``).

    Example:
        >>> x = torch.zeros(1, 3, dtype=torch.float64)
        >>> div_free_gaussian(x, x, torch.tensor([[2.0]], dtype=torch.float64),
        ...                   normalize=False)[0, 0].diagonal()
        tensor([0.5000, 0.5000, 0.5000], dtype=torch.float64)
    """
    dim = x1.shape[-1]
    if dim < 2:
        raise ValueError(f"div-free kernels need input dimension d >= 2, got x with d = {dim}")
    k, scaled, inv_sq = _gaussian_parts(x1, x2, lengthscale, diag)
    lam = torch.diag_embed(inv_sq)
    eye = torch.eye(dim, dtype=x1.dtype, device=x1.device)
    trace_term = inv_sq.sum(-1) - scaled.pow(2).sum(-1)  # (..., N, [M])
    blocks = scaled.unsqueeze(-1) * scaled.unsqueeze(-2) - lam + trace_term[..., None, None] * eye
    blocks = blocks * k[..., None, None]
    if normalize:
        c = vector_field_normalizer(lengthscale, "div", dim)  # (*batch, 1)
        blocks = blocks * c[(...,) + (None,) * (2 if diag else 3)]
    return blocks


def _interleave(blocks: Tensor) -> Tensor:
    """``(..., N, M, p, q)`` blocks -> ``(..., N p, M q)`` with row ``n * p + a``."""
    n, m, p, q = blocks.shape[-4:]
    return blocks.transpose(-3, -2).reshape(*blocks.shape[:-4], n * p, m * q)


class _VectorFieldKernel(InputCheckedKernel):
    """Common plumbing of the exact operator-valued kernels (``p = d`` outputs per input)."""

    def __init__(self, input_dim: Optional[int] = None, normalize: bool = True, **kwargs: Any):
        if input_dim is not None:
            input_dim = check_int("input_dim", input_dim)
        check_bool("normalize", normalize)
        super().__init__(**kwargs)
        if input_dim is None:
            if self.active_dims is not None:
                input_dim = int(self.active_dims.numel())
            elif self.ard_num_dims is not None:
                input_dim = int(self.ard_num_dims)
        elif self.ard_num_dims is not None and self.ard_num_dims != input_dim:
            raise ValueError(
                f"ard_num_dims must equal input_dim ({input_dim}) for a vector-field kernel, "
                f"got {self.ard_num_dims}"
            )
        self.input_dim = input_dim
        self.normalize = normalize

    def num_outputs_per_input(self, x1: Optional[Tensor] = None, x2: Optional[Tensor] = None):
        if self.input_dim is not None:
            return self.input_dim
        if x1 is not None:
            return x1.shape[-1] if x1.dim() > 1 else 1
        raise RuntimeError(
            f"{type(self).__name__}: the number of outputs equals the input dimension, which is "
            "unknown yet; pass input_dim= to the constructor"
        )

    def _check_dim(self, x1: Tensor) -> None:
        d = x1.shape[-1]
        if self.input_dim is None:
            self.input_dim = int(d)
        elif d != self.input_dim:
            raise ValueError(
                f"{type(self).__name__} maps R^d to R^d with d = {self.input_dim} (input "
                f"dimension = output dimension); x has {d} columns"
            )

    def _blocks(self, x1: Tensor, x2: Tensor, diag: bool = False) -> Tensor:
        raise NotImplementedError

    def forward(self, x1: Tensor, x2: Tensor, diag: bool = False,
                last_dim_is_batch: bool = False, **params) -> Tensor:
        if last_dim_is_batch:
            raise NotImplementedError(f"{type(self).__name__} does not support last_dim_is_batch")
        self._check_dim(x1)
        self._check_dim(x2)
        if diag:
            blocks = self._blocks(x1, x2, diag=True)  # (..., N, p, p)
            return blocks.diagonal(dim1=-2, dim2=-1).reshape(*blocks.shape[:-3], -1)
        return _interleave(self._blocks(x1, x2))


class CurlFreeKernel(_VectorFieldKernel):
    r"""Exact curl-free Gaussian kernel :math:`K(x, z) = -\nabla\nabla^\top k(x - z)`.

    The kernel of the gradient field of a GP with Gaussian (RBF) covariance
    :math:`k(x, z) = \exp(-\tfrac12\sum_a (x_a - z_a)^2 / l_a^2)`:

    .. math::
        K(x, z) = c\,(\Lambda - \Lambda\delta\delta^\top\Lambda)\,k(x, z), \qquad
        \delta = x - z,\ \Lambda = \mathrm{diag}(l^{-2}).

    ``normalize=True`` (default) sets ``c = d / tr(Lambda)`` so that ``K(x, x) = I`` with one
    lengthscale (the kernel written in ``x / l``, DESIGN's convention); ``normalize=False``
    gives ``c = 1``, the plain ``-Hess k`` (``K(x, x) = I / l^2``). The paper's ``sigma`` is
    the lengthscale. Samples and posterior means are gradient fields: zero curl.

    Covariance matrices are ``(N d) x (M d)`` in GPyTorch's interleaved order (row ``n d + a``),
    for use with ``MultitaskMultivariateNormal`` and ``MultitaskGaussianLikelihood(num_tasks=d)``.

    Args:
        input_dim: ``d`` (= the number of outputs); inferred from the first input if ``None``.
        normalize: see above.
        **kwargs: GPyTorch ``Kernel`` arguments (``ard_num_dims``, ``batch_shape``,
            ``active_dims``, ``lengthscale_prior``, ``lengthscale_constraint``).

    Example:
        >>> k = CurlFreeKernel()
        >>> x = torch.randn(5, 2, dtype=torch.float64)
        >>> k.to(torch.float64)(x).to_dense().shape
        torch.Size([10, 10])

    References:
        Fuselier, *Refined error estimates for matrix-valued radial basis functions*, 2006.
        Brault, d'Alché-Buc, Heinonen, *Random Fourier Features for Operator-Valued Kernels*,
        ACML 2016.
    """

    has_lengthscale = True

    def _blocks(self, x1: Tensor, x2: Tensor, diag: bool = False) -> Tensor:
        return curl_free_gaussian(x1, x2, self.lengthscale.to(x1.dtype), self.normalize, diag)


class DivFreeKernel(_VectorFieldKernel):
    r"""Exact divergence-free Gaussian kernel :math:`K = (\nabla\nabla^\top - \Delta I)\,k`.

    .. math::
        K(x, z) = c\,\big(\Lambda\delta\delta^\top\Lambda - \Lambda
                  + (\mathrm{tr}\Lambda - \|\Lambda\delta\|^2) I\big)\,k(x, z).

    ``normalize=True`` (default) sets ``c = d / ((d - 1) tr Lambda)`` (``K(x, x) = I`` with one
    lengthscale); ``normalize=False`` gives ``c = 1`` (``K(x, x) = (d - 1) I / l^2``). Samples
    and posterior means have zero divergence. In 2-D it is ``J K_curl J^T`` with ``J`` the
    90-degree rotation. Needs ``d >= 2``. Layout as :class:`CurlFreeKernel`.

    Args:
        input_dim: ``d >= 2`` (= the number of outputs); inferred from the first input if
            ``None``.
        normalize: see above.
        **kwargs: GPyTorch ``Kernel`` arguments.

    Example:
        >>> k = DivFreeKernel(input_dim=3).to(torch.float64)
        >>> x = torch.randn(4, 3, dtype=torch.float64)
        >>> k(x, diag=True).detach()
        tensor([1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1.], dtype=torch.float64)

    References:
        Narcowich & Ward, *Generalized Hermite interpolation via matrix-valued conditionally
        positive definite functions*, 1994. Brault et al., ACML 2016.
    """

    has_lengthscale = True

    def __init__(self, input_dim: Optional[int] = None, normalize: bool = True, **kwargs: Any):
        super().__init__(input_dim=input_dim, normalize=normalize, **kwargs)
        if self.input_dim is not None and self.input_dim < 2:
            raise ValueError(f"input_dim must be >= 2 for a div-free kernel, got {self.input_dim}")

    def _blocks(self, x1: Tensor, x2: Tensor, diag: bool = False) -> Tensor:
        return div_free_gaussian(x1, x2, self.lengthscale.to(x1.dtype), self.normalize, diag)


def register_helmholtz_parameters(module: Kernel, ard_num_dims: Optional[int]) -> None:
    """Register the four positive hyperparameters of a Helmholtz kernel on ``module``.

    ``curl_lengthscale`` / ``div_lengthscale``: ``(*batch, 1, ard_num_dims or 1)``;
    ``curl_outputscale`` / ``div_outputscale``: ``(*batch,)``. Shared by the exact and the
    random-feature Helmholtz kernels so that their parameters can be copied one to one.

    Args:
        module: the kernel to register ``raw_{curl,div}_{lengthscale,outputscale}`` (with
            ``Positive`` constraints) on; its ``batch_shape`` sets the leading dimensions.
        ard_num_dims: number of lengthscales per part (``None``: one shared lengthscale).

    Returns:
        ``None``; ``module`` is changed in place.

    Example:
        >>> module = gpytorch.kernels.Kernel()
        >>> register_helmholtz_parameters(module, ard_num_dims=2)
        >>> module.raw_curl_lengthscale.shape, module.raw_div_outputscale.shape
        (torch.Size([1, 2]), torch.Size([]))
    """
    batch = module.batch_shape
    width = 1 if ard_num_dims is None else ard_num_dims
    for part in ("curl", "div"):
        module.register_parameter(
            f"raw_{part}_lengthscale", torch.nn.Parameter(torch.zeros(*batch, 1, width))
        )
        module.register_constraint(f"raw_{part}_lengthscale", Positive())
        module.register_parameter(
            f"raw_{part}_outputscale", torch.nn.Parameter(torch.zeros(torch.Size(batch)))
        )
        module.register_constraint(f"raw_{part}_outputscale", Positive())


class HelmholtzParameters:
    """Properties (getters and setters) of the four Helmholtz hyperparameters."""

    def _get(self, name: str) -> Tensor:
        raw = getattr(self, f"raw_{name}")
        return getattr(self, f"raw_{name}_constraint").transform(raw)

    def _set(self, name: str, value) -> None:
        value = check_positive_values(name, value, getattr(self, f"raw_{name}"))
        constraint = getattr(self, f"raw_{name}_constraint")
        self.initialize(**{f"raw_{name}": constraint.inverse_transform(value)})

    curl_lengthscale = property(lambda self: self._get("curl_lengthscale"),
                                lambda self, value: self._set("curl_lengthscale", value))
    div_lengthscale = property(lambda self: self._get("div_lengthscale"),
                               lambda self, value: self._set("div_lengthscale", value))
    curl_outputscale = property(lambda self: self._get("curl_outputscale"),
                                lambda self, value: self._set("curl_outputscale", value))
    div_outputscale = property(lambda self: self._get("div_outputscale"),
                               lambda self, value: self._set("div_outputscale", value))


class HelmholtzKernel(HelmholtzParameters, _VectorFieldKernel):
    r"""Exact Helmholtz kernel: a curl-free plus a divergence-free Gaussian kernel.

    .. math::
        K(x, z) = s_{curl} K_{curl}(x, z; l_{curl}) + s_{div} K_{div}(x, z; l_{div})

    with the (by default normalised) kernels of :class:`CurlFreeKernel` and
    :class:`DivFreeKernel`, each with its own lengthscale and outputscale, so that a fit
    separates a field into its curl-free (irrotational) and divergence-free (solenoidal) parts.
    Any smooth field on a bounded domain has such a decomposition; the sum is universal where
    the two parts alone are not.

    Args:
        input_dim: ``d >= 2`` (= the number of outputs); inferred from the first input if
            ``None``.
        normalize: normalise both parts so that ``K(x, x) = (s_curl + s_div) I`` (one
            lengthscale each).
        ard_num_dims: ARD lengthscales (``d`` of them per part) if given.
        **kwargs: GPyTorch ``Kernel`` arguments (``batch_shape``, ``active_dims``).

    Attributes:
        curl_lengthscale, div_lengthscale: ``(*batch, 1, ard_num_dims or 1)``.
        curl_outputscale, div_outputscale: ``(*batch,)``.

    Example:
        >>> k = HelmholtzKernel(input_dim=2).to(torch.float64)
        >>> k.curl_outputscale, k.div_outputscale = 2.0, 0.5
        >>> x = torch.randn(3, 2, dtype=torch.float64)
        >>> k(x, diag=True).detach()
        tensor([2.5000, 2.5000, 2.5000, 2.5000, 2.5000, 2.5000], dtype=torch.float64)

    References:
        Berlinghieri, Trippe, Burt, Giordano, Srinivasan, Özgür, Muehlebach, Broderick,
        *Gaussian processes at the Helm(holtz)*, ICML 2023. Brault et al., ACML 2016.
    """

    def __init__(self, input_dim: Optional[int] = None, normalize: bool = True,
                 ard_num_dims: Optional[int] = None, **kwargs: Any):
        super().__init__(input_dim=input_dim, normalize=normalize, **kwargs)
        if self.input_dim is None and ard_num_dims is not None:
            self.input_dim = ard_num_dims
        if ard_num_dims is not None and ard_num_dims != self.input_dim:
            raise ValueError(
                f"ard_num_dims must equal input_dim ({self.input_dim}), got {ard_num_dims}"
            )
        if self.input_dim is not None and self.input_dim < 2:
            raise ValueError(f"input_dim must be >= 2 for a Helmholtz kernel, got "
                             f"{self.input_dim}")
        self.helmholtz_ard_num_dims = ard_num_dims
        register_helmholtz_parameters(self, ard_num_dims)

    def _blocks(self, x1: Tensor, x2: Tensor, diag: bool = False) -> Tensor:
        dtype = x1.dtype
        curl = curl_free_gaussian(x1, x2, self.curl_lengthscale.to(dtype), self.normalize, diag)
        div = div_free_gaussian(x1, x2, self.div_lengthscale.to(dtype), self.normalize, diag)
        # (*batch,) outputscales against the (..., N, [M,] p, p) blocks
        trailing = (None,) * (3 if diag else 4)
        s_curl = self.curl_outputscale.to(dtype)[(...,) + trailing]
        s_div = self.div_outputscale.to(dtype)[(...,) + trailing]
        return s_curl * curl + s_div * div

    def component_kernel(self, part: str) -> Kernel:
        """The exact kernel of one part (``"curl"`` or ``"div"``) times its outputscale."""
        from gpytorch.kernels import ScaleKernel

        if part not in _VECTOR_FIELD_KINDS:
            raise ValueError(f"part must be 'curl' or 'div', got {part!r}")
        cls = CurlFreeKernel if part == "curl" else DivFreeKernel
        base = cls(input_dim=self.input_dim, normalize=self.normalize,
                   ard_num_dims=self.helmholtz_ard_num_dims, batch_shape=self.batch_shape,
                   active_dims=self.active_dims)
        base = base.to(self.raw_curl_lengthscale)
        base.lengthscale = getattr(self, f"{part}_lengthscale").detach().clone()
        scaled = ScaleKernel(base, batch_shape=self.batch_shape).to(self.raw_curl_lengthscale)
        scaled.outputscale = getattr(self, f"{part}_outputscale").detach().clone()
        return scaled
