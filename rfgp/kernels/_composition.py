r"""Feature maps of composed kernels: sums and products of random-feature kernels.

GPyTorch composes kernels with ``+`` (``AdditiveKernel``), ``*`` (``ProductKernel``) and
``ScaleKernel``, each part possibly on its own ``active_dims``. Over rfgp's random-feature kernels
every such tree has a random feature map of its own:

* **Sum** :math:`k = \sum_i k_i`: the concatenation :math:`\Phi = [\Phi_1, \dots, \Phi_m]`,
  since :math:`\Phi(x)^\top \overline{\Phi(y)} = \sum_i \hat k_i(x, y)` (exact: the same draws
  give exactly the sum of the parts' estimates, ``D = \sum_i D_i`` columns).
* **Scale** :math:`c\,k`: :math:`\sqrt c\,\Phi`.
* **Product** :math:`k = \prod_i k_i` of independent parts of equal width ``D``:
  the elementwise (Hadamard) product

  .. math::
      \Phi_j(x) = D^{(m-1)/2} \prod_{i=1}^m \Phi_{i, \pi_i(j)}(x), \qquad j = 1, \dots, D,

  with independent uniform random permutations :math:`\pi_2, \dots, \pi_m` of the columns
  (:math:`\pi_1` the identity). The permutation makes every column of a part an unbiased
  estimate of :math:`k_i / D` on average, whatever the part's column layout (Fourier features
  hold a cos and a sin block, Maclaurin features blocks of different degrees), so with the
  parts independent :math:`\mathbb{E}\,\hat k = \prod_i k_i` (unbiased). This is the
  construction behind the polynomial sketches, and costs ``D`` columns instead of
  :math:`\prod_i D_i`.

  **Variance.** When every part has i.i.d. columns (e.g. Gaussian or Rademacher polynomial
  sketches, complex Fourier features) with :math:`\mathbb{V}[\hat k_i] = v_i` at width ``D``, the
  product's columns are i.i.d. too and

  .. math::
      \mathbb{V}[\hat k] = \frac1D\Big(\prod_i (k_i^2 + D v_i) - \prod_i k_i^2\Big)
      \;\overset{m=2}{=}\; k_1^2 v_2 + k_2^2 v_1 + D\,v_1 v_2,

  against :math:`\prod_i (k_i^2 + v_i) - \prod_i k_i^2 = k_1^2 v_2 + k_2^2 v_1 + v_1 v_2` for the
  full tensor product of the same parts (:func:`~rfgp.kernels.product_variance` evaluates
  both). The elementwise product pays the extra :math:`(D - 1) v_1 v_2`, small where the parts are
  accurate, for ``D`` instead of :math:`D^2` columns.
* **Tensor product** (``product="tensor"``, for small widths): :math:`\Phi = \mathrm{vec}(\Phi_1
  \otimes \dots \otimes \Phi_m)` with :math:`\prod_i D_i` columns, whose estimate is exactly
  :math:`\prod_i \hat k_i` on the same draws (for real parts exactly what GPyTorch evaluates).

Complex parts compose too: a sum holding a complex part is complex (the real parts enter with a
zero imaginary part), and a product of complex parts multiplies the complex features, whose
real form :math:`[\mathrm{Re}\,\Phi, \mathrm{Im}\,\Phi]` estimates :math:`\prod_i k_i` without
bias (GPyTorch multiplies the real parts of the parts' estimates instead, which has the same
expectation).

**Variance correction.** Biased (truncated) parts keep their correction
:math:`c_i = k_i(x, x) - \mathbb{E}[\hat k_i(x, x)]`: scales multiply it, sums add it, and a
product of independent parts has :math:`c = \prod_i k_i - \prod_i (k_i - c_i)`
(:meth:`ComposedFeatureKernel.variance_correction`).

Use :func:`as_feature_kernel`; :class:`ComposedFeatureKernel` shares (does not copy) the tree's
parameters and random weights.
"""

from __future__ import annotations

import itertools
import math
from typing import Dict, List, Optional, Tuple

import torch
from gpytorch.kernels import AdditiveKernel, Kernel, ScaleKernel
from torch import Tensor

from rfgp._ops import make_generator
from rfgp._validation import check_choice, select_active_columns
from rfgp.kernels._base import RandomFeatureKernel
from rfgp.kernels._fourier import FourierFeatureKernel
from rfgp.kernels._kernel_tree import (
    check_feature_tree,
    children_of,
    feature_leaves,
    is_composition,
    is_feature_composition,
)

__all__ = [
    "ComposedFeatureKernel",
    "PRODUCT_MODES",
    "as_feature_kernel",
    "is_composition",
    "is_feature_composition",
]

#: How a product of feature maps is formed: Hadamard product of equal widths, or the full
#: tensor (outer) product.
PRODUCT_MODES = ("elementwise", "tensor")


def _width_of(node: Kernel, product: str) -> int:
    """Columns of ``node``'s features in a composition with products of kind ``product``."""
    if isinstance(node, RandomFeatureKernel):
        return int(node.num_features)
    if isinstance(node, ScaleKernel):
        return _width_of(node.base_kernel, product)
    widths = [_width_of(child, product) for _, child in children_of(node)]
    if isinstance(node, AdditiveKernel):
        return sum(widths)
    return math.prod(widths) if product == "tensor" else widths[0]


def _real_to_complex(phi: Tensor) -> Tensor:
    return phi if phi.is_complex() else torch.complex(phi, torch.zeros_like(phi))


class ComposedFeatureKernel(RandomFeatureKernel):
    r"""The random feature map of a GPyTorch kernel tree over rfgp random-feature kernels.

    Sums concatenate the (scaled) parts' features, products multiply independent parts
    elementwise (or form their tensor product); :func:`~rfgp.kernels.product_variance` gives
    the variance of a product, and the *Composing kernels* section of the feature-map guide
    the formulas. The tree is held as the sub-module :attr:`tree`, so its parameters (lengthscales,
    outputscales, biases) and the leaves' random weights are shared, not copied: optimising
    this kernel optimises the tree, and the tree's GPyTorch evaluation :math:`k(x, y)` is what
    this kernel's :math:`\hat k(x, y)` estimates.

    GPyTorch's semantics are followed exactly: a node's ``active_dims`` select the columns it
    sees, and a ``ScaleKernel`` passes its (already selected) inputs to its base kernel without
    selecting again (it copies the base kernel's ``active_dims`` at construction).

    The leaves keep their own random weights (drawn at their first call, from their own
    ``seed``); :meth:`resample` redraws all of them. For a distributed fit give every leaf a
    ``seed`` so that all processes hold the same features.

    Args:
        kernel: a tree of ``AdditiveKernel`` / ``ProductKernel`` / ``ScaleKernel`` nodes over
            :class:`~rfgp.kernels.RandomFeatureKernel` leaves (built with ``+``, ``*``,
            ``ScaleKernel``), without batch shapes.
        product: ``"elementwise"`` (parts of equal width ``D``, ``D`` columns) or ``"tensor"``
            (:math:`\prod_i D_i` columns).
        seed: seed of the column permutations of elementwise products (``None``: global RNG).

    Attributes:
        tree (Kernel): the composed GPyTorch kernel (shared).
        num_features (int): ``D`` of the composition (a complex column counts once).
        is_complex (bool): whether any part is complex.

    Raises:
        TypeError: if a node is not a sum, product, scale or random-feature kernel.
        ValueError: for batch shapes, unequal widths in an elementwise product, a leaf used in
            two factors of one product (the factors must be independent), or multi-output
            parts in a product.

    Example:
        >>> import gpytorch
        >>> from rfgp.kernels import FourierFeatureKernel, PolynomialSketchKernel
        >>> tree = gpytorch.kernels.ScaleKernel(FourierFeatureKernel(64, active_dims=[0, 1])) \
        ...     + FourierFeatureKernel(64, active_dims=[2]) * PolynomialSketchKernel(
        ...         2, 64, bias=1.0, projection="gaussian", active_dims=[3])
        >>> k = as_feature_kernel(tree)
        >>> x = torch.randn(10, 4, dtype=torch.float64)
        >>> k.features(x).shape   # 64 (scaled part) + 64 (elementwise product)
        torch.Size([10, 128])
        >>> sorted(n for n, _ in k.named_parameters())[:2]   # the tree's own parameters
        ['tree.kernels.0.base_kernel.raw_lengthscale', 'tree.kernels.0.raw_outputscale']
    """

    def __init__(self, kernel: Kernel, product: str = "elementwise", seed: Optional[int] = None):
        check_feature_tree(kernel, "kernel")
        # Set before Module.__init__ (plain attributes may be): _shape_of reads it.
        self.product = check_choice("product", product, PRODUCT_MODES)
        self._permutation_specs: List[Tuple[str, int]] = []  # (buffer name, width)
        width, complex_, outputs = self._shape_of(kernel, "kernel", [0])
        super().__init__(num_features=width, seed=seed)
        self.tree = kernel
        self.is_complex = complex_
        self._outputs_per_input = outputs
        # The parts may have been moved (.double(), .cuda()) before composing: the anchor that
        # this kernel's own weights and dtype follow starts where they are, not in float32.
        for tensor in itertools.chain(kernel.parameters(), kernel.buffers()):
            if tensor.is_floating_point():
                self._dtype_anchor = self._dtype_anchor.to(tensor)
                break

    # ------------------------------------------------------------------ structure
    def _shape_of(self, node: Kernel, path: str, counter: List[int]) -> Tuple[int, bool, int]:
        """(width, complex, outputs per input) of a node; registers product permutations in
        the order ``_evaluate`` visits the nodes."""
        if isinstance(node, RandomFeatureKernel):
            return node.num_features, bool(node.is_complex), int(node.num_outputs_per_input())
        if isinstance(node, ScaleKernel):
            return self._shape_of(node.base_kernel, f"{path}.base_kernel", counter)
        parts = [
            self._shape_of(child, f"{path}.{name}", counter) for name, child in children_of(node)
        ]
        widths = [w for w, _, _ in parts]
        complex_ = any(c for _, c, _ in parts)
        outputs = {o for _, _, o in parts}
        if isinstance(node, AdditiveKernel):
            if len(outputs) > 1:
                raise ValueError(
                    f"{path}: the parts of a sum must have the same number of outputs per "
                    f"input, got {sorted(outputs)}"
                )
            return sum(widths), complex_, outputs.pop()
        # ProductKernel
        if outputs != {1}:
            raise ValueError(
                f"{path}: products of multi-output kernels are not supported, got parts with "
                f"{sorted(outputs)} outputs per input"
            )
        seen: Dict[int, int] = {}
        for index, (_, child) in enumerate(children_of(node)):
            for leaf in feature_leaves(child):
                if seen.setdefault(id(leaf), index) != index:
                    raise ValueError(
                        f"{path}: the factors of a product must be independent, but the "
                        f"{type(leaf).__name__} object appears in factors {seen[id(leaf)]} and "
                        f"{index}; build each factor from its own kernel"
                    )
        if self.product == "tensor":
            return math.prod(widths), complex_, 1
        if len(set(widths)) > 1:
            raise ValueError(
                f"{path}: an elementwise product needs factors of equal width, got widths "
                f"{widths}; give the parts the same num_features, or use product='tensor'"
            )
        for _ in widths[1:]:
            self._permutation_specs.append((f"permutation_{counter[0]}", widths[0]))
            counter[0] += 1
        return widths[0], complex_, 1

    # ------------------------------------------------------------------ random weights
    def _sample_weights(
        self, input_dim: int, generator: Optional[torch.Generator]
    ) -> Dict[str, Tensor]:
        device = generator.device if generator is not None else torch.device("cpu")
        return {
            name: torch.randperm(width, generator=generator, device=device)
            for name, width in self._permutation_specs
        }

    def resample(self, generator: Optional[torch.Generator] = None) -> ComposedFeatureKernel:
        """Draw fresh random weights for every part and fresh permutations, in place.

        Args:
            generator: a ``torch.Generator``; the same state gives the same draws.

        Returns:
            ``self``.

        Raises:
            RuntimeError: if a part's input dimension is unknown (give it ``input_dim`` or
                ``active_dims``, or evaluate the kernel once).
        """
        for leaf in feature_leaves(self.tree):
            leaf.resample(generator)
        # The permutations depend on the widths only, not on the input dimension.
        self._set_weights(self._sample_weights(0, generator))
        return self

    def ensure_weights(self, x: Tensor) -> None:
        """Fix the input dimension from ``x`` and draw the product permutations if not drawn
        yet (the leaves draw their own weights at their first call)."""
        if self.input_dim is None:
            self.input_dim = int(x.shape[-1])
        elif x.shape[-1] != self.input_dim:
            raise ValueError(
                f"ComposedFeatureKernel: x must have {self.input_dim} input columns, got "
                f"{x.shape[-1]}"
            )
        if self._permutation_specs and not self.weights_initialized:
            self._set_weights(self._sample_weights(self.input_dim, make_generator(self.seed)))

    # ------------------------------------------------------------------ features
    def _features(self, x: Tensor) -> Tensor:
        counter = [0]
        phi = self._evaluate(self.tree, x, counter, select=True)
        if self.is_complex:
            phi = _real_to_complex(phi)
        return phi

    def _features_into(self, x: Tensor, out: Tensor) -> Tensor:
        # A sum's parts are written side by side into out's columns (no concatenation: that
        # would be a second N x D buffer and pass per chunk); real scalar-output trees only.
        if self.is_complex or self._outputs_per_input != 1 or torch.is_grad_enabled():
            return self._features(x)
        return self._evaluate(self.tree, x, [0], select=True, out=out)

    def _evaluate(self, node: Kernel, x: Tensor, counter: List[int], select: bool,
                  out: Optional[Tensor] = None) -> Tensor:
        """Features of ``node`` at ``x``; ``select`` applies the node's ``active_dims`` (what
        GPyTorch's ``Kernel.__call__`` does, and ``ScaleKernel.forward`` skips). With ``out``
        (real scalar-output trees, without autograd) a sum and the leaves under it write into
        ``out`` where they can; the result is ``out`` or a tensor of its own."""
        if select:
            x = select_active_columns(x, node.active_dims)
        if isinstance(node, RandomFeatureKernel):
            # The leaf's own active_dims were applied above (or, under a ScaleKernel, by it).
            x = node.check_input(x)
            node.ensure_weights(x)
            return node._features(x) if out is None else node._features_into(x, out)
        if isinstance(node, ScaleKernel):
            phi = self._evaluate(node.base_kernel, x, counter, select=False, out=out)
            scale = node.outputscale.sqrt().to(phi.real.dtype)
            written = out is not None and self._written_into(phi, out)
            if (written or isinstance(node.base_kernel, FourierFeatureKernel)) and not (
                    phi.requires_grad or scale.requires_grad):
                # In place where nothing is recorded (the pass's own buffer, or
                # cos_sin_features's fresh one): no second N x D buffer per chunk, where a
                # large model's feature passes are bound by memory traffic.
                return phi.mul_(scale)
            return phi * scale
        if out is not None and isinstance(node, AdditiveKernel):
            start = 0
            for _, child in children_of(node):
                width = _width_of(child, self.product)
                block = out[..., start:start + width]
                phi = self._evaluate(child, x, counter, select=True, out=block)
                if not self._written_into(phi, block):
                    block.copy_(phi)
                start += width
            return out
        parts = [self._evaluate(child, x, counter, select=True) for _, child in children_of(node)]
        if any(p.is_complex() for p in parts):
            parts = [_real_to_complex(p) for p in parts]
        if isinstance(node, AdditiveKernel):
            return torch.cat(parts, dim=-1)
        if self.product == "tensor":
            phi = parts[0]
            for part in parts[1:]:
                # (..., N, D1, 1) * (..., N, 1, D2) -> (..., N, D1 D2)
                phi = (phi.unsqueeze(-1) * part.unsqueeze(-2)).flatten(-2)
            return phi
        width = parts[0].shape[-1]
        phi = parts[0]
        for part in parts[1:]:
            perm = getattr(self, f"permutation_{counter[0]}").to(part.device)
            counter[0] += 1
            phi = phi * part.index_select(-1, perm)
        return phi * width ** ((len(parts) - 1) / 2)

    # ------------------------------------------------------------------ variance correction
    @property
    def has_variance_correction(self) -> bool:  # type: ignore[override]
        """Whether a part is a biased (truncated) approximation with a variance correction."""
        return any(leaf.has_variance_correction for leaf in feature_leaves(self.tree))

    def variance_correction(self, x: Tensor) -> Tensor:
        r""":math:`k(x, x) - \mathbb{E}[\hat k(x, x)]` of the composition, shape ``(..., N p)``.

        Built from the parts' corrections :math:`c_i` and exact diagonals :math:`k_i(x, x)`:
        a scale multiplies, a sum adds, and a product of independent parts (elementwise or
        tensor, both with :math:`\mathbb{E}\,\hat k = \prod_i \mathbb{E}\,\hat k_i`) has

        .. math::
            c = \prod_i k_i - \prod_i (k_i - c_i).

        A part's :math:`k_i(x, x)` comes from its exact kernel, or, for a part without one, from
        the unbiased estimate :math:`\|\phi_i(x)\|^2 + c_i`; it is needed only inside
        products with a corrected factor. Zero when no part has a correction.
        """
        x = self.check_input(x)
        if not self.has_variance_correction:
            return super().variance_correction(x)
        # Some part has a correction, so every node above it returns one (not None).
        return self._correction(self.tree, x, need_diagonal=False)[1]

    def _correction(
        self, node: Kernel, x: Tensor, need_diagonal: bool
    ) -> Tuple[Optional[Tensor], Optional[Tensor]]:
        """``(k(x, x) or None, correction or None)`` of ``node`` at ``x``, the node's input
        before its own ``active_dims`` (every part selects its own columns from it)."""
        if isinstance(node, RandomFeatureKernel):
            corr = node.variance_correction(x) if node.has_variance_correction else None
            return (self._leaf_diagonal(node, x, corr) if need_diagonal else None), corr
        if isinstance(node, ScaleKernel):
            inner = node.base_kernel
            if inner.active_dims is None:
                x = select_active_columns(x, node.active_dims)
            diag, corr = self._correction(inner, x, need_diagonal)
            scale = node.outputscale.to(x.dtype)
            return (None if diag is None else diag * scale), (
                None if corr is None else corr * scale
            )
        x = select_active_columns(x, node.active_dims)
        children = [child for _, child in children_of(node)]
        if isinstance(node, AdditiveKernel):
            parts = [self._correction(child, x, need_diagonal) for child in children]
            corrs = [c for _, c in parts if c is not None]
            diag = sum(d for d, _ in parts) if need_diagonal else None
            return diag, (sum(corrs) if corrs else None)
        parts = [self._correction(child, x, need_diagonal=True) for child in children]
        full = math.prod(d for d, _ in parts)
        if all(c is None for _, c in parts):
            return full, None
        expected = math.prod(d if c is None else d - c for d, c in parts)
        return full, full - expected

    @staticmethod
    def _leaf_diagonal(leaf: RandomFeatureKernel, x: Tensor, corr: Optional[Tensor]) -> Tensor:
        try:
            # GPyTorch's call applies the leaf's active_dims to x, as the leaf does.
            return leaf.exact_kernel()(x, x, diag=True).to(x.dtype)
        except NotImplementedError:
            phi = leaf.features(x)
            estimate = (phi.abs() ** 2).sum(-1)
            return estimate if corr is None else estimate + corr

    def extra_repr(self) -> str:
        return (
            f"num_features={self.num_features}, product={self.product!r}, "
            f"is_complex={self.is_complex}"
        )


def feature_kernel(kernel: Kernel) -> Kernel:
    """The kernel a feature map is built from: a sum or product tree turned into one
    feature kernel (:func:`as_feature_kernel`), anything else as it is (a ``ScaleKernel``
    around a feature kernel stays one, so that its outputscale remains its own parameter).

    Example:
        >>> from rfgp.kernels import FourierFeatureKernel
        >>> type(feature_kernel(FourierFeatureKernel(8) + FourierFeatureKernel(8))).__name__
        'ComposedFeatureKernel'
        >>> type(feature_kernel(ScaleKernel(FourierFeatureKernel(8)))).__name__
        'ScaleKernel'
    """
    return as_feature_kernel(kernel) if is_composition(kernel) else kernel


def as_feature_kernel(
    kernel: Kernel, product: str = "elementwise", seed: Optional[int] = None
) -> RandomFeatureKernel:
    r"""The random-feature kernel of a GPyTorch kernel tree over rfgp feature kernels.

    A :class:`~rfgp.kernels.RandomFeatureKernel` is returned as it is; any tree of
    ``AdditiveKernel`` (``k1 + k2``), ``ProductKernel`` (``k1 * k2``) and ``ScaleKernel`` nodes
    over random-feature kernels (``active_dims`` anywhere) becomes a
    :class:`ComposedFeatureKernel` that shares the tree's parameters and random weights. Its
    expected kernel is GPyTorch's evaluation of the tree (exactly, on the same draws, for sums
    and tensor products of real parts).

    Args:
        kernel: the kernel or kernel tree.
        product: ``"elementwise"`` (default; unbiased, ``D`` columns for factors of width ``D``)
            or ``"tensor"`` (exact product of the parts' estimates, :math:`\prod_i D_i`
            columns).
        seed: seed of the elementwise products' column permutations.

    Returns:
        A :class:`~rfgp.kernels.RandomFeatureKernel`.

    Example:
        >>> from rfgp.kernels import FourierFeatureKernel
        >>> tree = FourierFeatureKernel(32, active_dims=[0]) + FourierFeatureKernel(
        ...     32, active_dims=[1])
        >>> k = as_feature_kernel(tree)
        >>> x = torch.randn(6, 2)
        >>> torch.allclose(k(x).to_dense(), tree(x).to_dense(), atol=1e-6)
        True
    """
    if isinstance(kernel, RandomFeatureKernel):
        check_choice("product", product, PRODUCT_MODES)
        return kernel
    return ComposedFeatureKernel(kernel, product=product, seed=seed)
