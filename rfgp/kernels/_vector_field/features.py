r"""Random features for the curl-free, divergence-free and Helmholtz Gaussian kernels.

Every posterior mean and prior sample built from the curl-free (div-free) features is exactly
curl-free (div-free), whatever the number of features (see :mod:`rfgp.kernels._vector_field`).
"""

from __future__ import annotations

from typing import Any, Dict, Optional

import torch
from gpytorch.kernels import Kernel
from torch import Tensor

from rfgp._validation import check_bool, check_choice, check_int
from rfgp.kernels._base import RandomFeatureKernel
from rfgp.kernels._fourier import sample_frequencies
from rfgp.kernels._vector_field.exact import (
    CurlFreeKernel,
    DivFreeKernel,
    HelmholtzKernel,
    HelmholtzParameters,
    register_helmholtz_parameters,
    vector_field_normalizer,
)
from rfgp.kernels._vector_field.factors import (
    DIV_FREE_FACTORS,
    OPERATOR_SAMPLINGS,
    div_free_factor,
    div_free_factor_rank,
    feature_scale,
    operator_features,
)

__all__ = [
    "CurlFreeFeatureKernel",
    "DivFreeFeatureKernel",
    "HelmholtzFeatureKernel",
    "HELMHOLTZ_COMPONENTS",
]


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
        check_choice("sampling", sampling, OPERATOR_SAMPLINGS)
        check_bool("normalize", normalize)
        if num_outputs is not None:
            check_int("num_outputs", num_outputs)
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

    def check_input(self, x: Tensor, name: str = "x") -> Tensor:
        x = super().check_input(x, name)
        # Without active_dims (which fixes d at construction) the number of outputs is the
        # input width, which solvers need before any feature is computed.
        if self.input_dim is None and self.active_dims is None:
            self._check_dim(int(x.shape[-1]))
            self.input_dim = int(x.shape[-1])
        return x

    def ensure_weights(self, x: Tensor) -> None:
        d = x.shape[-1]
        if self.input_dim is None:
            self._check_dim(int(d))
        elif d != self.input_dim:
            raise ValueError(
                f"{type(self).__name__} maps R^d to R^d with d = {self.input_dim} (input "
                f"dimension = output dimension); x has {d} columns"
            )
        super().ensure_weights(x)

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

    def weight_settings(self) -> Dict[str, Any]:
        return {**super().weight_settings(), "sampling": self.sampling,
                "factor": getattr(self, "factor", None)}

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
    return operator_features(x, omega, b, feature_scale(coefficient, m))


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
            (:func:`~rfgp.kernels.sample_frequencies`).
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
        check_choice("factor", factor, DIV_FREE_FACTORS)
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


class HelmholtzFeatureKernel(HelmholtzParameters, _VectorFieldFeatureKernel):
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
        check_choice("factor", factor, DIV_FREE_FACTORS)
        self.factor = factor
        if ard_num_dims is not None:
            check_int("ard_num_dims", ard_num_dims)
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
        check_choice("part", part, HELMHOLTZ_COMPONENTS)
        curl, div = self._blocks(self.prepare_input(x))
        if part == "curl":
            return torch.cat([curl, torch.zeros_like(div)], dim=-1)
        return torch.cat([torch.zeros_like(curl), div], dim=-1)

    def component_kernel(self, part: str) -> RandomFeatureKernel:
        """A feature kernel for one part alone (same frequencies, lengthscale, outputscale).

        Returns a ``ScaleKernel`` around a :class:`CurlFreeFeatureKernel` or
        :class:`DivFreeFeatureKernel` holding copies of this kernel's weights.
        """
        from gpytorch.kernels import ScaleKernel

        check_choice("part", part, HELMHOLTZ_COMPONENTS)
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
