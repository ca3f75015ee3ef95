"""GPyTorch kernel trees over rfgp random-feature kernels: walking them (children, leaves),
checking that one can be turned into features, and recognising a sum or product.

Internal: not part of the public API (see :mod:`rfgp.kernels`).
"""

from __future__ import annotations

from typing import Iterator, List, Tuple

from gpytorch.kernels import AdditiveKernel, Kernel, ProductKernel, ScaleKernel

from rfgp.kernels._base import RandomFeatureKernel

__all__ = [
    "check_feature_tree",
    "children_of",
    "feature_leaves",
    "is_composition",
    "is_feature_composition",
]


def children_of(node: Kernel) -> List[Tuple[str, Kernel]]:
    """The sub-kernels of a composition node with their attribute paths."""
    if isinstance(node, ScaleKernel):
        return [("base_kernel", node.base_kernel)]
    if isinstance(node, (AdditiveKernel, ProductKernel)):
        return [(f"kernels[{i}]", k) for i, k in enumerate(node.kernels)]
    return []


def feature_leaves(node: Kernel) -> Iterator[RandomFeatureKernel]:
    if isinstance(node, RandomFeatureKernel):
        yield node
        return
    for _, child in children_of(node):
        yield from feature_leaves(child)


def check_feature_tree(node: Kernel, path: str) -> None:
    """Every node is a sum, product, scale or random-feature kernel, without batch shape."""
    if not isinstance(node, Kernel):
        raise TypeError(f"{path} must be a gpytorch Kernel, got {type(node).__name__}")
    if len(node.batch_shape):
        raise ValueError(
            f"{path} must have an empty batch_shape, got {tuple(node.batch_shape)} "
            f"({type(node).__name__})"
        )
    if isinstance(node, RandomFeatureKernel):
        if getattr(node, "needs_allocation", False):
            raise ValueError(
                f"{path} ({type(node).__name__}) needs a data-dependent allocation; call its "
                "allocate(x) (on the inputs its active_dims select) before composing it"
            )
        return
    if not isinstance(node, (ScaleKernel, AdditiveKernel, ProductKernel)):
        raise TypeError(
            f"{path} must be an rfgp RandomFeatureKernel, or a gpytorch ScaleKernel, "
            f"AdditiveKernel or ProductKernel of them, got {type(node).__name__}"
        )
    for name, child in children_of(node):
        check_feature_tree(child, f"{path}.{name}")


def is_composition(kernel: Kernel) -> bool:
    """Whether ``kernel`` is a sum or product node, or ``ScaleKernel`` s around one.

    Example:
        >>> from rfgp.kernels import FourierFeatureKernel
        >>> is_composition(FourierFeatureKernel(8) + FourierFeatureKernel(8))
        True
        >>> is_composition(ScaleKernel(FourierFeatureKernel(8)))
        False
    """
    while isinstance(kernel, ScaleKernel):
        kernel = kernel.base_kernel
    return isinstance(kernel, (AdditiveKernel, ProductKernel))


def is_feature_composition(kernel: Kernel) -> bool:
    """Whether ``kernel`` is a composition (:func:`is_composition`) whose leaves are all
    random-feature kernels, i.e. one that :func:`~rfgp.kernels.as_feature_kernel` turns into
    features.

    Example:
        >>> from rfgp.kernels import FourierFeatureKernel
        >>> is_feature_composition(FourierFeatureKernel(8) * FourierFeatureKernel(8))
        True
        >>> from gpytorch.kernels import RBFKernel
        >>> is_feature_composition(FourierFeatureKernel(8) + RBFKernel())
        False
    """

    def all_leaves_random(node: Kernel) -> bool:
        if isinstance(node, RandomFeatureKernel):
            return True
        children = children_of(node)
        return bool(children) and all(all_leaves_random(child) for _, child in children)

    return is_composition(kernel) and all_leaves_random(kernel)
