r"""Closed-form variances of the polynomial sketches (real, complex and Complex-to-Real).

The functions live in :mod:`rfgp.kernels.maclaurin.variance`, beside the Maclaurin degree
allocation that uses them; this module is their public short path, ``from rfgp import
variance``. The formulas are documented there.

Example:
    >>> import torch
    >>> from rfgp.variance import sketch_variance
    >>> x = torch.ones(1, 4, dtype=torch.float64) / 2
    >>> float(sketch_variance(x, x, 1, 4, "tensorsrht"))   # degree 1, D = d: exact
    0.0
"""

from rfgp.kernels.maclaurin.variance import (
    gaussian_sketch_variance,
    pair_moments,
    rademacher_sketch_variance,
    sketch_variance,
    srht_pair_count,
    tensorsketch_variance,
    tensorsrht_variance,
    tensorsrht_variance_terms,
    unstructured_pseudo_variance,
    unstructured_variance,
)

__all__ = [
    "pair_moments",
    "srht_pair_count",
    "unstructured_variance",
    "unstructured_pseudo_variance",
    "gaussian_sketch_variance",
    "rademacher_sketch_variance",
    "tensorsrht_variance",
    "tensorsrht_variance_terms",
    "tensorsketch_variance",
    "sketch_variance",
]
