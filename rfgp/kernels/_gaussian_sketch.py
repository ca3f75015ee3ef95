r"""The GaussianSketch of Phillips & Tai: truncated Taylor features of the Gaussian kernel,
compressed by a recursive tensor sketch.

With :math:`\tilde x = x / (\sqrt2\,\ell)` the Gaussian kernel is
:math:`k(x, y) = \exp(-\|x - y\|^2 / (2\ell^2)) = \exp(-\|\tilde x - \tilde y\|^2)`, and

.. math::
    k(x, y) = e^{-\|\tilde x\|^2} e^{-\|\tilde y\|^2} \prod_{j=1}^d e^{2 \tilde x_j \tilde y_j}
            = e^{-\|\tilde x\|^2} e^{-\|\tilde y\|^2} \sum_{a \ge 0}
              \frac{2^a}{a!} \langle \tilde x, \tilde y\rangle^a .

Variant ``"coordinate"`` (the paper's GaussianSketch, for small ``d``) truncates each factor of
the product after ``s`` terms, giving one ``s``-vector per coordinate,
:math:`y^{(j)}_a = e^{-\tilde x_j^2} \sqrt{2^a / a!}\, \tilde x_j^a` (``a = 0..s-1``), and
sketches the ``d``-fold tensor product :math:`y^{(1)} \otimes \dots \otimes y^{(d)}` with one
recursive tensor sketch. Variant ``"degree"`` (GaussianSketchHD, for large ``d``) truncates
the second sum at total degree ``s - 1`` and sketches every degree-``a`` term
:math:`\tilde x^{\otimes a}` with its own recursive tensor sketch of ``m_a \propto a`` columns.

The recursive tensor sketch (Ahle et al.) of ``k`` factors pads the factor list to
``q = 2^{\lceil \log_2 k \rceil}`` with :math:`e_1`, maps every factor to ``R^m`` (exactly, by
zero-padding, when it is shorter than ``m``; otherwise by a CountSketch), and combines pairs level
by level with independent degree-2 TensorSketch nodes
:math:`(a, b) \mapsto \mathrm{IFFT}(\mathrm{FFT}(C_1 a) \odot \mathrm{FFT}(C_2 b))` (``C_i``
CountSketches), the CountSketch of :math:`a \otimes b` with a combined hash. Every node is
unbiased for inner products, so :math:`\mathbb{E}[\hat k] = k_s`, the truncated kernel, and its
variance is bounded relative to the squared norms for *any* tensor, not only rank-one ones, which
is what the relative kernel-distance guarantee needs. (TensorSRHT nodes with sampled rows were
tried and gave about 100 times the variance on sums of rank-one tensors.)
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Tuple, Union

import torch
from scipy.stats import poisson
from torch import Tensor

from rfgp._ops import generator_device, next_power_of_two, rademacher
from rfgp._validation import check_choice, check_int
from rfgp.kernels._base import RandomFeatureKernel
from rfgp.kernels._sketches.tensorsketch import count_sketch

__all__ = ["GaussianSketchKernel", "choose_truncation", "VARIANTS"]

VARIANTS = ("coordinate", "degree")


# ---------------------------------------------------------------------- recursive tensor sketch
def _sample_tree(
    num_factors: int,
    factor_dim: int,
    num_features: int,
    generator: Optional[torch.Generator],
    batch_shape: Tuple[int, ...] = (),
) -> Dict[str, Tensor]:
    """Random hashes and signs of one recursive tensor sketch (int64 / float64), with leading
    ``batch_shape`` dimensions (independent sketches)."""
    leaves = next_power_of_two(num_factors)
    device = generator_device(generator)
    b = tuple(batch_shape)
    weights: Dict[str, Tensor] = {}
    if factor_dim > num_features:
        weights["leaf_hash"] = torch.randint(0, num_features, (*b, leaves, factor_dim),
                                             generator=generator, device=device)
        weights["leaf_signs"] = rademacher((*b, leaves, factor_dim), generator)
    if leaves > 1:
        weights["node_hash"] = torch.randint(0, num_features, (*b, leaves - 1, 2, num_features),
                                             generator=generator, device=device)
        weights["node_signs"] = rademacher((*b, leaves - 1, 2, num_features), generator)
    return weights


def _sketch(u: Tensor, hashes: Tensor, signs: Tensor, num_features: int) -> Tensor:
    # One CountSketch, (..., N, n) -> (..., N, m); batched hashes (*B, n) broadcast against the
    # leading dimensions of u.
    if hashes.dim() == 1:
        return count_sketch(u, hashes, signs, num_features)
    return count_sketch(u, hashes.unsqueeze(-2), signs.unsqueeze(-2), num_features).squeeze(-2)


def _apply_tree(factors: List[Tensor], weights: Dict[str, Tensor], num_features: int) -> Tensor:
    """Sketch ``factors[0] ⊗ ... ⊗ factors[k-1]`` (each ``(..., N, n)``) to ``(..., N, m)``."""
    leaves = next_power_of_two(len(factors))
    n = factors[0].shape[-1]
    m = num_features
    level = []
    for i in range(leaves):
        if i < len(factors):
            u = factors[i]
        else:  # padding factors e_1: the tensor product with them leaves the others unchanged
            u = torch.zeros_like(factors[0])
            u[..., 0] = 1.0
        if "leaf_hash" in weights:
            u = _sketch(u, weights["leaf_hash"][..., i, :], weights["leaf_signs"][..., i, :], m)
        level.append(u)
    if leaves == 1 and level[0].shape[-1] < m:
        # no tree node to sketch into m columns: zero-pad the single factor
        return torch.nn.functional.pad(level[0], (0, m - n))
    node = 0
    while len(level) > 1:
        nxt = []
        for left, right in zip(level[0::2], level[1::2]):
            # TensorSketch: the CountSketch of left ⊗ right with hash (h1 + h2) mod m and sign
            # s1 s2, computed as a circular convolution. Leaves narrower than m (no leaf
            # sketch) use the first columns of the node's hashes: their zero padding would add
            # nothing.
            hashes = weights["node_hash"][..., node, :, :]
            signs = weights["node_signs"][..., node, :, :]
            nl, nr = left.shape[-1], right.shape[-1]
            a = _sketch(left, hashes[..., 0, :nl], signs[..., 0, :nl], m)
            b = _sketch(right, hashes[..., 1, :nr], signs[..., 1, :nr], m)
            nxt.append(torch.fft.irfft(torch.fft.rfft(a) * torch.fft.rfft(b), n=m))
            node += 1
        level = nxt
    return level[0]


# ---------------------------------------------------------------------- truncation
def choose_truncation(
    x: Union[Tensor, float],
    alpha: float,
    variant: str = "coordinate",
    lengthscale: float = 1.0,
    input_dim: Optional[int] = None,
    xi: float = 4.0,
    max_truncation: int = 500,
) -> int:
    r"""Smallest truncation ``s`` whose worst-case kernel-distance bias is at most ``alpha``.

    For signed weights :math:`\beta` with :math:`(\sum|\beta_i|)^2 \le \xi` (``xi = 4`` for a
    kernel distance between two point sets) the truncation error satisfies
    :math:`0 \le \beta^\top (K - K_s) \beta \le \xi \max_i (1 - K_s(x_i, x_i))`, and
    :math:`K_s(x, x) = P[\mathrm{Poisson}(2\|\tilde x\|^2) \le s-1]` (``"degree"``) or
    :math:`\prod_j P[\mathrm{Poisson}(2\tilde x_j^2) \le s-1]` (``"coordinate"``), with
    :math:`\tilde x = x / (\sqrt2 \ell)`. This Poisson-tail form of the paper's Lemmas 2.9 / 2.11
    is tighter than their closed forms; ``s`` grows like the squared data radius in
    lengthscales.

    Args:
        x: ``(N, d)`` data (the bound uses every point), or a radius: the largest
            :math:`\|x\|_2` (``"degree"``) or :math:`\|x\|_\infty` (``"coordinate"``, then
            ``input_dim`` is needed), in the units of ``x``.
        alpha: wanted additive error, ``> 0``.
        variant: ``"coordinate"`` or ``"degree"``.
        lengthscale: ``ell`` of the kernel (a positive float).
        input_dim: ``d``, only for a radius with the ``"coordinate"`` variant.
        xi: bound on :math:`(\sum|\beta_i|)^2`.
        max_truncation: search limit.

    Returns:
        ``s``: number of Taylor terms (degrees ``0..s-1``).

    Example:
        >>> choose_truncation(1.0 * math.sqrt(2), 1e-4, variant="degree")  # R = 1 scaled
        11
    """
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {list(VARIANTS)}, got {variant!r}")
    if not alpha > 0:
        raise ValueError(f"alpha must be > 0, got {alpha!r}")
    if not lengthscale > 0:
        raise ValueError(f"lengthscale must be > 0, got {lengthscale!r}")
    scale = 1.0 / (2.0 * lengthscale**2)  # ||x~||^2 = ||x||^2 / (2 l^2)
    if isinstance(x, Tensor):
        if x.dim() == 1:
            x = x.unsqueeze(-1)
        sq = (x.detach().to(torch.float64) ** 2 * scale).cpu().numpy()
        if variant == "degree":
            rates = 2.0 * sq.sum(-1)
            groups = [(rates.max(), 1)]
        else:
            rates = 2.0 * sq  # (N, d)
            groups = None
    else:
        if not float(x) >= 0:
            raise ValueError(f"x must be a tensor or a non-negative radius, got {x!r}")
        rate = 2.0 * float(x) ** 2 * scale
        if variant == "degree":
            groups = [(rate, 1)]
        else:
            if input_dim is None:
                raise ValueError("input_dim must be given with a radius for variant='coordinate'")
            groups = [(rate, int(input_dim))]
        rates = None
    for s in range(1, max_truncation + 1):
        if groups is not None:
            missing = max(1.0 - poisson.cdf(s - 1, r) ** k for r, k in groups)
        else:
            missing = float((1.0 - poisson.cdf(s - 1, rates).prod(-1)).max())
        if xi * missing <= alpha:
            return s
    raise ValueError(
        f"no truncation up to max_truncation={max_truncation} reaches alpha={alpha}; the data "
        "radius is too large in lengthscales (centre the data or increase max_truncation)"
    )


# ---------------------------------------------------------------------- the kernel
class GaussianSketchKernel(RandomFeatureKernel):
    r"""GaussianSketch features (Phillips & Tai) for GPyTorch's RBF kernel.

    Approximates :math:`k(x, y) = \exp(-\|x - y\|^2 / (2\ell^2))` (``gpytorch.kernels.RBFKernel``
    with the same lengthscale) by a linear sketch of its truncated Taylor features, in one of two
    variants (below). The estimate is unbiased for the truncated kernel
    :meth:`expected_matrix`:

    * ``"coordinate"``: :math:`k_s(x, y) = \prod_j e^{-\tilde x_j^2 - \tilde y_j^2}
      \sum_{a<s} (2\tilde x_j\tilde y_j)^a / a!`, ``D`` columns from one sketch of ``d`` factors;
    * ``"degree"``: :math:`k_s(x, y) = e^{-\|\tilde x\|^2 - \|\tilde y\|^2}
      \sum_{a<s} (2\langle\tilde x, \tilde y\rangle)^a / a!`; one exact column for degree 0
      and ``D - 1`` columns split over degrees ``1..s-1`` proportionally to the degree
      (the paper's :math:`m_a = O(a/\epsilon^2)`).

    For point sets ``P, Q`` and a fixed draw, the sketched kernel distance
    (:func:`rfgp.metrics.kernel_distance`) satisfies, with probability at least 9/10,
    :math:`|\hat D^2 - D^2| \le \epsilon D^2 + \alpha` when ``truncation`` comes from
    :func:`choose_truncation` with ``alpha`` (the truncation bias is in ``[0, alpha]``) and the
    sketch dimension is ``D = C d / eps^2`` (coordinate) or ``C s^2 / eps^2`` (degree); the
    paper leaves the constant ``C`` open (``C`` around 1 to 4 is what the tests use).

    Args:
        num_features: ``D`` (``"degree"``: at least ``truncation``, and 1 when
            ``truncation = 1``).
        truncation: ``s``, number of Taylor terms (degrees ``0..s-1``); see
            :func:`choose_truncation`.
        variant: ``"coordinate"`` (small ``d``) or ``"degree"`` (large ``d``).
        input_dim, seed, **kwargs: as for every :class:`RandomFeatureKernel` (a
            ``batch_shape`` gives independent sketches per batch member).

    Attributes:
        degree_features: for ``"degree"``, the columns of each degree ``0..s-1``.

    Example:
        >>> k = GaussianSketchKernel(256, truncation=8, seed=0)
        >>> x = torch.randn(4, 2, dtype=torch.float64) * 0.5
        >>> k.features(x).shape
        torch.Size([4, 256])

    References:
        Phillips & Tai, *The GaussianSketch for Almost Relative Error Kernel Distance*,
        APPROX/RANDOM 2020. Ahle, Kapralov, Knudsen, Pagh, Velingker, Woodruff, Zandieh,
        *Oblivious Sketching of High-Degree Polynomial Kernels*, SODA 2020.
    """

    has_lengthscale = True
    has_variance_correction = True

    def __init__(
        self,
        num_features: int,
        truncation: int = 10,
        variant: str = "coordinate",
        input_dim: Optional[int] = None,
        seed: Optional[int] = None,
        **kwargs: Any,
    ) -> None:
        check_choice("variant", variant, VARIANTS)
        truncation = check_int("truncation", truncation)
        super().__init__(num_features=num_features, input_dim=input_dim, seed=seed, **kwargs)
        if variant == "degree" and num_features < truncation:
            raise ValueError(
                f"num_features must be >= truncation ({truncation}) for variant='degree' (one "
                f"column per degree at least), got {num_features}"
            )
        if variant == "degree" and truncation == 1 and num_features != 1:
            raise ValueError(
                "num_features must be 1 for variant='degree' with truncation=1 (the only term "
                f"is the exact degree-0 column), got {num_features}"
            )
        self.truncation = truncation
        self.variant = variant

    @property
    def degree_features(self) -> List[int]:
        """Columns per degree ``0..s-1`` (``"degree"`` variant): 1, then ``∝ a``, sum ``D``."""
        s, budget = self.truncation, self.num_features - 1
        if s == 1:
            return [self.num_features]
        total = sum(range(1, s))
        counts = [max(1, (a * budget) // total) for a in range(1, s)]
        # Hand out (or take back) the rounding remainder from the highest degrees down.
        a = len(counts) - 1
        while sum(counts) != budget:
            step = 1 if sum(counts) < budget else -1
            if step > 0 or counts[a] > 1:
                counts[a] += step
            a = a - 1 if a > 0 else len(counts) - 1
        return [1, *counts]

    def _sample_weights(self, input_dim: int, generator) -> Dict[str, Tensor]:
        weights: Dict[str, Tensor] = {}
        if self.variant == "coordinate":
            tree = _sample_tree(input_dim, self.truncation, self.num_features, generator,
                                self.batch_shape)
            weights.update({f"tree_{k}": v for k, v in tree.items()})
        else:
            for a, m in enumerate(self.degree_features):
                if a == 0:
                    continue
                tree = _sample_tree(a, input_dim, m, generator, self.batch_shape)
                weights.update({f"degree{a}_{k}": v for k, v in tree.items()})
        return weights

    def _scaled(self, x: Tensor) -> Tensor:
        return x / (math.sqrt(2.0) * self.lengthscale.to(x.dtype))

    def _taylor_vectors(self, z: Tensor) -> Tensor:
        # (..., N, d) -> (..., N, d, s): e^{-z^2} sqrt(2^a / a!) z^a. Formed as
        # (z e^{-z^2 / a})^a for a >= 1: the base is bounded by sqrt(a / 2) e^{-1/2}, so no
        # power overflows where the envelope underflows (which gave inf * 0 = NaN far out).
        sq = (z * z).unsqueeze(-1)
        a = torch.arange(1, self.truncation, dtype=z.dtype, device=z.device)
        coef = torch.exp(0.5 * (a * math.log(2.0) - torch.lgamma(a + 1)))
        powers = (z.unsqueeze(-1) * torch.exp(-sq / a)) ** a
        return torch.cat([torch.exp(-sq), coef * powers], dim=-1)

    def _weights_with_prefix(self, prefix: str) -> Dict[str, Tensor]:
        return {name[len(prefix):]: getattr(self, name)
                for name in self._random_buffer_names if name.startswith(prefix)}

    def _features(self, x: Tensor) -> Tensor:
        z = self._scaled(x)
        rows = (*torch.broadcast_shapes(z.shape[:-2], self.batch_shape), z.shape[-2])
        if self.variant == "coordinate":
            vectors = self._taylor_vectors(z)
            factors = list(vectors.unbind(-2))
            phi = _apply_tree(factors, self._weights_with_prefix("tree_"), self.num_features)
            return phi.expand(*rows, self.num_features)
        sq = (z * z).sum(-1, keepdim=True)
        blocks = [torch.exp(-sq).expand(*rows, 1)]
        for a, m in enumerate(self.degree_features):
            if a == 0:
                continue
            # e^{-||z||^2} T_a(z, ..., z) = T_a(w, ..., w) with w = z e^{-||z||^2 / a}, by
            # multilinearity: ||w|| <= sqrt(a / 2) e^{-1/2}, so nothing overflows far out.
            w = z * torch.exp(-sq / a)
            sketch = _apply_tree([w] * a, self._weights_with_prefix(f"degree{a}_"), m)
            coef = math.exp(0.5 * (a * math.log(2.0) - math.lgamma(a + 1)))
            blocks.append((coef * sketch).expand(*rows, m))
        return torch.cat(blocks, dim=-1)

    def weight_settings(self) -> Dict[str, Any]:
        return {**super().weight_settings(), "truncation": self.truncation,
                "variant": self.variant}

    def expected_matrix(self, x1: Tensor, x2: Tensor) -> Tensor:
        r"""The truncated kernel :math:`k_s(x_1, x_2) = \mathbb{E}[\hat k]`, ``(N, M)``."""
        z1, z2 = self._scaled(x1), self._scaled(x2)
        if self.variant == "coordinate":
            prod = 2.0 * z1.unsqueeze(-2) * z2.unsqueeze(-3)  # (N, M, d)
            series = sum(prod**a * math.exp(-math.lgamma(a + 1)) for a in range(self.truncation))
            envelope = torch.exp(-(z1 * z1).unsqueeze(-2) - (z2 * z2).unsqueeze(-3))
            return (envelope * series).prod(-1)
        inner = 2.0 * z1 @ z2.transpose(-1, -2)
        series = sum(inner**a * math.exp(-math.lgamma(a + 1)) for a in range(self.truncation))
        envelope = torch.exp(-(z1 * z1).sum(-1).unsqueeze(-1) - (z2 * z2).sum(-1).unsqueeze(-2))
        return envelope * series

    def variance_correction(self, x: Tensor) -> Tensor:
        r""":math:`k(x, x) - \mathbb{E}[\hat k(x, x)] = 1 - k_s(x, x) \ge 0`, shape ``(N,)``."""
        x = self._checked_active_input(x)
        z2 = (self._scaled(x) ** 2).detach().cpu().double().numpy()
        if self.variant == "coordinate":
            kept = poisson.cdf(self.truncation - 1, 2.0 * z2).prod(-1)
        else:
            kept = poisson.cdf(self.truncation - 1, 2.0 * z2.sum(-1))
        return (1.0 - torch.from_numpy(kept)).to(device=x.device, dtype=x.dtype)

    def exact_kernel(self):
        """``gpytorch.kernels.RBFKernel`` with this kernel's lengthscale."""
        from gpytorch.kernels import RBFKernel

        exact = RBFKernel(ard_num_dims=self.ard_num_dims, batch_shape=self.batch_shape,
                          active_dims=self.active_dims)
        exact = exact.to(self.lengthscale)
        exact.lengthscale = self.lengthscale.detach().clone()
        return exact

    def extra_repr(self) -> str:
        return (f"num_features={self.num_features}, truncation={self.truncation}, "
                f"variant={self.variant!r}, input_dim={self.input_dim}")
