r"""Random and optimised Maclaurin features for dot-product kernels and the Gaussian kernel.

The feature map and its allocations are documented on :class:`MaclaurinKernel`.

Internal: the public names are exported by :mod:`rfgp.kernels`.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Optional

import torch
from gpytorch.kernels import Kernel
from torch import Tensor

from rfgp._ops import generator_device, make_generator, next_power_of_two
from rfgp._validation import check_choice, check_int, check_real
from rfgp.kernels._base import RandomFeatureKernel
from rfgp.kernels._maclaurin.allocation import (
    AllocationResult,
    allocation_statistics,
    maclaurin_coefficients,
    optimize_allocation,
)
from rfgp.kernels._maclaurin.variance import sketch_variance
from rfgp.kernels._sketches.apply import apply_sketch
from rfgp.kernels._sketches.sampling import check_projection, sample_sketch

__all__ = ["MaclaurinKernel", "TARGETS", "ALLOCATIONS"]

#: the kernels a :class:`MaclaurinKernel` approximates (its ``target=``).
TARGETS = ("polynomial", "exponential", "gaussian")
#: the degree allocations of a :class:`MaclaurinKernel` (its ``allocation=``).
ALLOCATIONS = ("optimized", "random")


class MaclaurinKernel(RandomFeatureKernel):
    r"""Maclaurin random features for polynomial, exponential and Gaussian kernels.

    Targets (all in terms of :math:`z = x / \ell`):

    * ``"polynomial"``: :math:`(x^\top y/\ell^2 + b)^p`, :math:`a_n = \binom{p}{n} b^{p-n}`
      (exact counterpart: ``DotProductKernel("polynomial", degree, bias)``);
    * ``"exponential"``: :math:`\exp(x^\top y/\ell^2)`, :math:`a_n = 1/n!`
      (``DotProductKernel("exponential")``);
    * ``"gaussian"``: :math:`\exp(-\|x-y\|^2/(2\ell^2)) = e^{-\|z_x\|^2/2} e^{-\|z_y\|^2/2}
      e^{z_x^\top z_y}` (GPyTorch's ``RBFKernel``).

    A dot-product kernel with non-negative Maclaurin coefficients,
    :math:`k(x, y) = \sum_{n \ge 0} a_n (z_x^\top z_y)^n` with :math:`z = x / \ell`, is approximated
    by stacking independent degree-``n`` polynomial sketches :math:`\Phi_n`
    (:func:`rfgp.kernels.apply_sketch`, any projection, real or complex):

    .. math::
        \Phi(x) = r(x)\,\big[\sqrt{a_0},\ w_1 \Phi_1(z_x),\ \dots,\ w_p \Phi_p(z_x)\big],

    with :math:`r(x) = e^{-\|z_x\|^2/2}` for the Gaussian kernel (1 otherwise). The degree counts
    :math:`D_n` (columns of :math:`\Phi_n`) and the weights :math:`w_n` come from the allocation:

    * ``"optimized"`` (Wacker et al., Algorithms 2-3): truncation degree ``p*`` and counts minimise
      the closed-form variance plus squared truncation bias on a subsample of the training inputs
      (:func:`rfgp.kernels.optimize_allocation`); :math:`w_n = \sqrt{a_n}`; biased (degrees above
      ``p*`` dropped), unbiased for the truncated series.
    * ``"random"`` (Kar & Karnick): the non-constant columns draw their degrees i.i.d. from
      :math:`\mu(n) \propto 2^{-n}` on the degrees ``1..L`` with :math:`a_n > 0`;
      :math:`w_n = \sqrt{a_n D_n / (R\,\mu(n))}` with ``R`` the number of non-constant columns.
      Unbiased for the series truncated at ``L`` (exact for a polynomial kernel, ``L = p``).

    **Budget.** ``num_features`` is the total number of columns of ``features(x)``. When
    :math:`a_0 > 0` one of them is the exact constant :math:`\sqrt{a_0}` (times ``r(x)``) and the
    other ``num_features - 1`` are spread over the degrees; when :math:`a_0 = 0` (a polynomial
    kernel with ``bias = 0``) all columns are random. A complex column counts once.

    **Allocation.** With ``allocation="optimized"`` call :meth:`allocate` with the training
    inputs before computing features (``RandomFeatureGP.fit`` does it when
    :attr:`needs_allocation` is true). Requesting features before that raises a
    ``RuntimeError``: allocating lazily on whatever input comes first (perhaps test points)
    would make the model depend silently on them. The allocation depends on the lengthscale and
    bias: after learning them, call :meth:`allocate` again. The counts live in the integer
    buffer ``degree_counts`` and the sketch weights in one buffer set per degree
    (``degree{n}_*``), so ``state_dict`` round-trips a fitted kernel into a fresh one.

    Args:
        target: ``"polynomial"``, ``"exponential"`` or ``"gaussian"``.
        num_features: ``D``, total columns (see *Budget*).
        degree: ``p`` for the polynomial target (required there, ignored otherwise).
        bias: ``b >= 0`` for the polynomial target (a fixed float).
        projection: sketch of every degree: ``"rademacher"``, ``"gaussian"``, ``"tensorsrht"``
            or ``"tensorsketch"`` (see :class:`PolynomialSketchKernel`).
        complex: complex sketches (features complex; GPyTorch sees ``[Re, Im]``).
        allocation: ``"optimized"`` or ``"random"``.
        max_degree: largest degree ``L`` considered for the exponential / Gaussian targets
            (the polynomial target uses ``L = p``).
        min_degree: smallest truncation degree tried by the optimiser (the paper's
            experiments use 2; default 1).
        num_samples: subsample size ``m`` for the optimiser's U-statistics (``O(L m^2 d)``).
        input_dim, seed, **kwargs: as for every :class:`RandomFeatureKernel`.

    Attributes:
        degree_counts: ``(L+1,)`` int64 buffer, columns per degree (entry 0: the constant).
        truncation_degree: largest degree with columns (``None`` before allocation).
        needs_allocation: true for an optimised kernel that has not been allocated.
        allocation_result: the
            :class:`~rfgp.kernels.AllocationResult` of the last
            :meth:`allocate` (objective per truncation degree), or ``None``.

    Example:
        >>> x = torch.randn(50, 3, dtype=torch.float64)
        >>> k = MaclaurinKernel("gaussian", 40, seed=0)
        >>> k.needs_allocation
        True
        >>> k = k.allocate(x)
        >>> int(k.degree_counts.sum()), k.features(x).shape
        (40, torch.Size([50, 40]))

    References:
        Kar & Karnick, *Random Feature Maps for Dot Product Kernels*, AISTATS 2012.
        Wacker, Kanagawa, Filippone, *Improved Random Features for Dot Product Kernels*,
        JMLR 2024 (Sections 5.2-5.6, Algorithms 2-4).
    """

    has_lengthscale = True
    has_variance_correction = True

    def __init__(
        self,
        target: str,
        num_features: int,
        degree: Optional[int] = None,
        bias: float = 0.0,
        projection: str = "rademacher",
        complex: bool = False,
        allocation: str = "optimized",
        max_degree: int = 10,
        min_degree: int = 1,
        num_samples: int = 1000,
        input_dim: Optional[int] = None,
        seed: Optional[int] = None,
        **kwargs: Any,
    ) -> None:
        check_choice("target", target, TARGETS)
        check_choice("allocation", allocation, ALLOCATIONS)
        projection, is_complex = check_projection(projection, complex)
        if target == "polynomial":
            if degree is None:
                raise ValueError("degree (a positive integer) is required for target='polynomial'")
            degree = check_int("degree", degree)
        bias = check_real("bias", bias, low=0.0)
        max_degree = check_int("max_degree", max_degree)
        min_degree = check_int("min_degree", min_degree)
        num_samples = check_int("num_samples", num_samples)
        super().__init__(num_features=num_features, input_dim=input_dim, seed=seed, **kwargs)
        self.target = target
        self.degree = degree if target == "polynomial" else None
        self.bias = float(bias)
        self.projection = projection
        self.is_complex = is_complex
        self.allocation = allocation
        self.max_degree = degree if target == "polynomial" else max_degree
        if min_degree > self.max_degree:
            raise ValueError(
                f"min_degree must be <= {self.max_degree} (the largest degree), got {min_degree}"
            )
        self.min_degree = min_degree
        self.num_samples = num_samples
        self._coefficients = maclaurin_coefficients(target, self.max_degree, degree, self.bias)
        needed = int(self.has_constant) + 1
        if num_features < needed:
            raise ValueError(
                f"num_features must be >= {needed} (the constant column plus one random "
                f"column), got {num_features}"
            )
        self.register_buffer("degree_counts", torch.zeros(self.max_degree + 1, dtype=torch.long))
        self.allocation_result: Optional[AllocationResult] = None

    # ------------------------------------------------------------------ allocation state
    @property
    def coefficients(self) -> Tensor:
        """``(L+1,)`` float64 Maclaurin coefficients ``a_n`` on length-scaled inputs."""
        return self._coefficients.clone()

    @property
    def has_constant(self) -> bool:
        return float(self._coefficients[0]) > 0

    @property
    def is_allocated(self) -> bool:
        return int(self.degree_counts.sum()) > 0

    @property
    def needs_allocation(self) -> bool:
        """Whether :meth:`allocate` must run before features can be computed."""
        return self.allocation == "optimized" and not self.is_allocated

    @property
    def truncation_degree(self) -> Optional[int]:
        """Largest degree with at least one column (``None`` before allocation)."""
        if not self.is_allocated:
            return None
        return int(torch.nonzero(self.degree_counts).max())

    def _degree_measure(self) -> Tensor:
        # Kar & Karnick's mu(n) ∝ 2^-(n+1), restricted to the degrees 1..L with a_n > 0.
        n = torch.arange(self.max_degree + 1, dtype=torch.float64)
        mu = torch.pow(2.0, -(n + 1)) * (self._coefficients > 0)
        mu[0] = 0.0
        return mu / mu.sum()

    def _scaled(self, x: Tensor) -> Tensor:
        return x / self.lengthscale.to(x.dtype)

    def _row_scale_sq(self, z: Tensor) -> Tensor:
        return (z * z).sum(-1)

    def allocate(self, x: Tensor, generator: Optional[torch.Generator] = None) -> MaclaurinKernel:
        r"""Choose the truncation degree and columns per degree on training inputs ``x``.

        Runs Algorithm 3 on a subsample of ``min(num_samples, N)`` rows (drawn with
        ``generator``, or the kernel's seed), using the closed-form variances of
        :func:`rfgp.variance.sketch_variance` (convex surrogates for
        TensorSRHT), then draws fresh sketch weights for the new counts. A no-op returning
        ``self`` for ``allocation="random"``.

        Args:
            x: ``(N, d)`` training inputs (``active_dims`` is applied).
            generator: for the subsample and the new weights.

        Returns:
            ``self``.
        """
        if self.allocation == "random":
            return self
        x = self.check_input(x)
        if x.dim() != 2:
            raise ValueError(f"x must have shape (N, d), got {tuple(x.shape)}")
        if self.active_dims is not None:
            x = x.index_select(-1, self.active_dims)
        if self.input_dim is None:
            self.input_dim = int(x.shape[-1])
        elif x.shape[-1] != self.input_dim:
            raise ValueError(
                f"x must have {self.input_dim} input columns (after active_dims), got "
                f"{x.shape[-1]}"
            )
        if x.shape[0] < 2:
            raise ValueError(f"x must hold at least 2 rows to allocate, got {x.shape[0]}")
        if generator is None:
            generator = make_generator(self.seed)
        with torch.no_grad():
            lengthscale = self.lengthscale.detach().to(torch.float64)
            if lengthscale.dim() > 2:
                # One allocation shared by all batch members: use the first member's scale.
                lengthscale = lengthscale.reshape(-1, *lengthscale.shape[-2:])[0]
            z = x.detach().to(torch.float64) / lengthscale.to(x.device).squeeze(0)
            if z.shape[0] > self.num_samples:
                perm = torch.randperm(z.shape[0], generator=generator,
                                      device=generator_device(generator))
                z = z[perm[: self.num_samples].to(z.device)]
            stats = self._statistics(z)
            result = optimize_allocation(stats, self.num_features, self.min_degree,
                                         self.max_degree)
        self.degree_counts = result.degree_counts.to(self.degree_counts.device)
        self.allocation_result = result
        self._set_weights(self._sample_weights(self.input_dim, generator))
        return self

    def _statistics(self, z: Tensor):
        projection, complex_ = self.projection, self.is_complex

        def variance_fn(x, y, n, num):
            return sketch_variance(x, y, n, num, projection=projection, complex=complex_)

        row_scale = torch.exp(-0.5 * self._row_scale_sq(z)) if self.target == "gaussian" else None
        structure = {"tensorsrht": "tensorsrht", "tensorsketch": "tensorsketch"}.get(
            projection, "none")
        if structure == "tensorsketch" and complex_:
            structure = "none"  # complex TensorSketch: V = A / D exactly
        block = next_power_of_two(z.shape[-1]) if structure == "tensorsrht" else None
        return allocation_statistics(z, self._coefficients, self._exact_scaled, variance_fn,
                                     row_scale=row_scale, block_dim=block, structure=structure)

    # ------------------------------------------------------------------ weights and features
    def _set_weights(self, weights: Dict[str, Tensor]) -> None:
        # A new allocation may drop degrees: remove their buffers before registering the rest.
        for name in list(self._random_buffer_names):
            if name not in weights:
                del self._buffers[name]
                self._random_buffer_names.remove(name)
        super()._set_weights(weights)

    def _sample_weights(self, input_dim: int, generator) -> Dict[str, Tensor]:
        if self.allocation == "optimized" and not self.is_allocated:
            raise RuntimeError(
                "MaclaurinKernel with allocation='optimized' needs kernel.allocate(x_train) "
                "before features are computed (RandomFeatureGP.fit calls it); features were "
                "requested before any allocation"
            )
        if self.allocation == "random":
            self.degree_counts = self._random_counts(generator).to(self.degree_counts.device)
        weights: Dict[str, Tensor] = {}
        for n, count in enumerate(self.degree_counts.tolist()):
            if n == 0 or count == 0:
                continue
            sketch = sample_sketch(n, count, input_dim, self.projection, self.is_complex,
                                   self.batch_shape, generator)
            weights.update({f"degree{n}_{key}": value for key, value in sketch.items()})
        return weights

    def _random_counts(self, generator) -> Tensor:
        random_columns = self.num_features - int(self.has_constant)
        cdf = torch.cumsum(self._degree_measure(), 0)
        u = torch.rand(random_columns, generator=generator, dtype=torch.float64,
                       device=generator_device(generator))
        degrees = torch.searchsorted(cdf, u.cpu(), right=True).clamp(max=self.max_degree)
        counts = torch.bincount(degrees, minlength=self.max_degree + 1)
        counts[0] = int(self.has_constant)
        return counts

    def _degree_weights(self, n: int) -> Dict[str, Tensor]:
        prefix = f"degree{n}_"
        return {name[len(prefix):]: getattr(self, name)
                for name in self._random_buffer_names if name.startswith(prefix)}

    def _block_scale(self, n: int, count: int) -> float:
        a_n = float(self._coefficients[n])
        if self.allocation == "optimized":
            return math.sqrt(a_n)
        random_columns = self.num_features - int(self.has_constant)
        return math.sqrt(a_n * count / (random_columns * float(self._degree_measure()[n])))

    def _features(self, x: Tensor) -> Tensor:
        z = self._scaled(x)
        gaussian = self.target == "gaussian"
        if gaussian:
            half_sq = 0.5 * self._row_scale_sq(z).unsqueeze(-1)  # (..., N, 1)
        blocks = []
        for n, count in enumerate(self.degree_counts.tolist()):
            if n == 0 or count == 0:
                continue
            # The Gaussian envelope e^{-||z||^2 / 2} enters a degree-n sketch (homogeneous of
            # degree n in its input) as the factor e^{-||z||^2 / (2n)} on z: no z^n overflows
            # where the envelope underflows (which gave inf * 0 = NaN far from the origin).
            zn = z * torch.exp(-half_sq / n) if gaussian else z
            phi = apply_sketch(zn, self._degree_weights(n), n, self.projection, self.is_complex)
            blocks.append(phi * self._block_scale(n, count))
        phi = torch.cat(blocks, dim=-1)
        if self.has_constant:
            const = math.sqrt(float(self._coefficients[0]))
            ones = torch.full((*phi.shape[:-1], 1), const, dtype=phi.dtype, device=phi.device)
            if gaussian:
                ones = ones * torch.exp(-half_sq).to(phi.dtype)
            phi = torch.cat([ones, phi], dim=-1)
        return phi

    def weight_settings(self) -> Dict[str, Any]:
        return {**super().weight_settings(), "target": self.target,
                "allocation": self.allocation, "projection": self.projection,
                "degree": self.degree, "max_degree": self.max_degree}

    def _expected_weight_shapes(self, input_dim: int) -> Dict[str, torch.Size]:
        # The layout follows the (loaded) degree counts; a throwaway draw per degree, which
        # leaves the counts as they are (a random allocation would redraw them).
        generator = torch.Generator().manual_seed(0)
        shapes: Dict[str, torch.Size] = {}
        for n, count in enumerate(self.degree_counts.tolist()):
            if n == 0 or count == 0:
                continue
            sketch = sample_sketch(n, count, input_dim, self.projection, self.is_complex,
                                   self.batch_shape, generator)
            shapes.update({f"degree{n}_{key}": value.shape for key, value in sketch.items()})
        return shapes

    # ------------------------------------------------------------------ exact values
    def _exact_scaled(self, z1: Tensor, z2: Tensor) -> Tensor:
        inner = z1 @ z2.transpose(-1, -2)
        if self.target == "polynomial":
            return (inner + self.bias) ** self.degree
        if self.target == "exponential":
            return torch.exp(inner)
        sq1 = self._row_scale_sq(z1).unsqueeze(-1)
        sq2 = self._row_scale_sq(z2).unsqueeze(-2)
        return torch.exp(inner - 0.5 * sq1 - 0.5 * sq2)

    def exact_matrix(self, x1: Tensor, x2: Tensor) -> Tensor:
        """The target kernel matrix ``k(x1, x2)`` with the current lengthscale, ``(N, M)``."""
        x1, x2 = self.check_input(x1, "x1"), self.check_input(x2, "x2")
        return self._exact_scaled(self._scaled(x1), self._scaled(x2))

    def expected_matrix(self, x1: Tensor, x2: Tensor) -> Tensor:
        r""":math:`\mathbb{E}[\hat k(x_1, x_2)]` for the current allocation, ``(N, M)``.

        The series over the degrees with columns (optimised) or over all degrees ``<= L`` with
        :math:`a_n > 0` (random allocation, unbiased), times ``r(x_1) r(x_2)`` (Gaussian).
        """
        z1 = self._scaled(self.check_input(x1, "x1"))
        z2 = self._scaled(self.check_input(x2, "x2"))
        inner = z1 @ z2.transpose(-1, -2)
        present = self._present_degrees()
        value = sum(float(self._coefficients[n]) * inner**n for n in present)
        if self.target == "gaussian":
            sq1 = self._row_scale_sq(z1).unsqueeze(-1)
            sq2 = self._row_scale_sq(z2).unsqueeze(-2)
            value = value * torch.exp(-0.5 * sq1 - 0.5 * sq2)
        return value

    def _present_degrees(self):
        if self.allocation == "random":
            return [n for n in range(self.max_degree + 1) if float(self._coefficients[n]) > 0]
        if not self.is_allocated:
            raise RuntimeError(
                "MaclaurinKernel with allocation='optimized' has not been allocated; call "
                "kernel.allocate(x_train) first"
            )
        return [n for n, c in enumerate(self.degree_counts.tolist()) if c > 0]

    def variance_correction(self, x: Tensor) -> Tensor:
        r""":math:`k(x, x) - \mathbb{E}[\hat k(x, x)] \ge 0`, shape ``(..., N)``.

        The truncation bias on the diagonal; added to the predictive variance it undoes the
        collapse of the approximate posterior variance far from the origin (Sec. 5.6 of
        Wacker et al.), e.g. with ``RandomFeatureGP(..., correct_variance=True)``.
        """
        x = self._checked_active_input(x)
        sq = self._row_scale_sq(self._scaled(x))
        present = self._present_degrees()
        truncated = sum(float(self._coefficients[n]) * sq**n for n in present)
        if self.target == "polynomial":
            full = (sq + self.bias) ** self.degree
        elif self.target == "exponential":
            full = torch.exp(sq)
        else:
            full = torch.ones_like(sq)
            truncated = truncated * torch.exp(-sq)
        return (full - truncated).clamp_min(0.0)

    def exact_kernel(self) -> Kernel:
        """The exact GPyTorch kernel: ``RBFKernel`` (Gaussian) or ``DotProductKernel``."""
        kwargs = dict(ard_num_dims=self.ard_num_dims, batch_shape=self.batch_shape,
                      active_dims=self.active_dims)
        if self.target == "gaussian":
            from gpytorch.kernels import RBFKernel

            exact = RBFKernel(**kwargs)
        else:
            from rfgp.kernels._dot_product import DotProductKernel

            exact = DotProductKernel(self.target, degree=self.degree, bias=self.bias, **kwargs)
        exact = exact.to(self.lengthscale)
        exact.lengthscale = self.lengthscale.detach().clone()
        return exact

    def extra_repr(self) -> str:
        return (f"target={self.target!r}, num_features={self.num_features}, "
                f"allocation={self.allocation!r}, projection={self.projection!r}, "
                f"complex={self.is_complex}, max_degree={self.max_degree}, "
                f"input_dim={self.input_dim}")
