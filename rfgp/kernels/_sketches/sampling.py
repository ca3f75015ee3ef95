r"""The random weights of a polynomial sketch: drawing them and reading them back.

:func:`sample_sketch` draws the weight dictionary of each projection; the helpers below read
and check its entries for the functions that apply a sketch.

Internal: not part of the public API (see :mod:`rfgp.kernels`).
"""

from __future__ import annotations

import math
from typing import Any, Dict, Optional, Tuple

import torch
from torch import Tensor

from rfgp._ops import (
    complex_gaussian,
    complex_rademacher,
    gaussian,
    generator_device,
    next_power_of_two,
    rademacher,
)
from rfgp._validation import check_bool, check_choice, check_int

__all__ = [
    "PROJECTIONS",
    "sample_sketch",
    "check_projection",
    "as_batch_shape",
    "feature_count_tensor",
    "sketch_weight",
    "as_complex_weight",
    "check_weight_columns",
]

#: the supported projections.
PROJECTIONS = ("gaussian", "rademacher", "tensorsketch", "tensorsrht")

_NO_BATCH = torch.Size()



# ---------------------------------------------------------------------------------- validation
def check_projection(projection: Any, is_complex: Any) -> Tuple[str, bool]:
    """Check a sketch's ``projection`` name and its ``complex`` flag; return both.

    Example:
        >>> check_projection("tensorsrht", True)
        ('tensorsrht', True)
    """
    return check_choice("projection", projection, PROJECTIONS), check_bool("complex", is_complex)


def as_batch_shape(batch_shape: Any) -> torch.Size:
    """``batch_shape`` as a ``torch.Size`` of positive entries (``TypeError`` / ``ValueError``)."""
    try:
        shape = torch.Size(batch_shape)
    except TypeError as err:
        raise TypeError(
            f"batch_shape must be a torch.Size or a tuple of ints, got {batch_shape!r}"
        ) from err
    if any(s < 1 for s in shape):
        raise ValueError(f"batch_shape entries must be positive, got {tuple(shape)}")
    return shape


def feature_count_tensor(batch_shape: torch.Size, num_features: int, device) -> Tensor:
    """The ``feature_count`` entry of a weight dict: ``batch_shape`` int64 filled with ``D``."""
    # TensorSketch hashes do not reveal D, so every weight dict carries it explicitly (as a
    # batch-shaped integer tensor, so that batch indexing and .to() treat it like the weights).
    return torch.full(tuple(batch_shape), num_features, dtype=torch.long, device=device)


# ---------------------------------------------------------------------------------- sampling
def sample_sketch(
    degree: int,
    num_features: int,
    input_dim: int,
    projection: str = "rademacher",
    complex: bool = False,
    batch_shape: torch.Size = _NO_BATCH,
    generator: Optional[torch.Generator] = None,
) -> Dict[str, Tensor]:
    r"""Draw the random weights of a degree-``degree`` polynomial sketch.

    All tensors are float64 (or integer) on the generator's device, with leading
    ``batch_shape`` dimensions (independent draws). Complex weights are stored as
    :func:`torch.view_as_real` (a trailing dimension of size 2) so that dtype casts of a module
    holding them cannot drop the imaginary part.

    Layouts (``B = batch_shape``, ``p = degree``, ``D = num_features``, ``d = input_dim``,
    ``d' = next_power_of_two(d)``, ``K = ceil(D / d')``; ``[, 2]`` only for ``complex=True``):

    * ``"gaussian"`` / ``"rademacher"``: ``projections`` ``(*B, d, p, D[, 2])``.
    * ``"tensorsketch"``: ``hashes`` ``(*B, p, d)`` (int64 in ``[0, D)``), ``signs``
      ``(*B, p, d[, 2])``.
    * ``"tensorsrht"``: ``signs`` ``(*B, p, K, d'[, 2])`` and ``indices`` ``(*B, p, D)``
      (int64): feature ``l`` of degree ``i`` reads entry ``indices[i, l]`` of the flattened
      ``(K, d')`` transforms; block ``b`` holds ``b d' + pi_{b,i}``, with an independent
      permutation ``pi_{b,i}`` for every block and degree.
    * every dict also holds ``feature_count`` ``(*B,)`` (int64, filled with ``D``).

    Args:
        degree: polynomial degree ``p >= 1``.
        num_features: number of features ``D >= 1`` (complex features count once).
        input_dim: input dimension ``d >= 1`` (include any appended bias coordinate).
        projection: ``"gaussian"``, ``"rademacher"``, ``"tensorsketch"`` or ``"tensorsrht"``.
        complex: draw the complex version (complex Gaussian ``(v + i w)/sqrt(2)``, signs uniform
            on ``{1, -1, i, -i}``).
        batch_shape: leading shape of independent draws.
        generator: optional ``torch.Generator``; the same state gives the same draw.

    Returns:
        dict of tensors, to be passed to :func:`apply_sketch`.

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> w = sample_sketch(3, 16, 5, projection="tensorsrht", generator=g)
        >>> sorted(w), tuple(w["signs"].shape), tuple(w["indices"].shape)
        (['feature_count', 'indices', 'signs'], (3, 2, 8), (3, 16))

    References:
        Wacker, Kanagawa & Filippone, *Improved Random Features for Dot Product Kernels*, 2022
        (Algorithm 1).
    """
    check_int("degree", degree)
    check_int("num_features", num_features)
    check_int("input_dim", input_dim)
    projection, is_complex = check_projection(projection, complex)
    batch_shape = as_batch_shape(batch_shape)
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(
            f"generator must be a torch.Generator or None, got {type(generator).__name__}"
        )
    device = generator_device(generator)
    b = tuple(batch_shape)

    def signs(shape):
        if is_complex:
            return torch.view_as_real(complex_rademacher(shape, generator))
        return rademacher(shape, generator)

    weights: Dict[str, Tensor] = {}
    if projection in ("gaussian", "rademacher"):
        shape = (*b, input_dim, degree, num_features)
        if projection == "gaussian":
            w = (
                torch.view_as_real(complex_gaussian(shape, generator))
                if is_complex
                else gaussian(shape, generator)
            )
        else:
            w = signs(shape)
        weights["projections"] = w.contiguous()
    elif projection == "tensorsketch":
        weights["hashes"] = torch.randint(
            0, num_features, (*b, degree, input_dim), generator=generator, device=device
        )
        weights["signs"] = signs((*b, degree, input_dim)).contiguous()
    else:
        padded = next_power_of_two(input_dim)
        num_blocks = math.ceil(num_features / padded)
        weights["signs"] = signs((*b, degree, num_blocks, padded)).contiguous()
        # argsort of uniforms = independent uniform permutations, all drawn in one call.
        keys = torch.rand(
            (*b, degree, num_blocks, padded), generator=generator, dtype=torch.float64,
            device=device,
        )
        perms = keys.argsort(dim=-1)
        offsets = torch.arange(num_blocks, device=device).unsqueeze(-1) * padded
        flat = (perms + offsets).reshape(*b, degree, num_blocks * padded)
        weights["indices"] = flat[..., :num_features].contiguous()
    weights["feature_count"] = feature_count_tensor(batch_shape, num_features, device)
    return weights


# ---------------------------------------------------------------------------------- applying
def sketch_weight(weights: Dict[str, Tensor], key: str, projection: str) -> Tensor:
    """Entry ``key`` of a weight dict from :func:`sample_sketch`, with a clear error if absent."""
    if not isinstance(weights, dict) or key not in weights:
        keys = sorted(weights) if isinstance(weights, dict) else type(weights).__name__
        raise ValueError(
            f"weights must be a dict from sample_sketch(projection={projection!r}) with key "
            f"{key!r}, got {keys}"
        )
    return weights[key]


def as_complex_weight(w: Tensor, dtype: torch.dtype) -> Tensor:
    """A complex weight stored as ``view_as_real`` (trailing 2) back as a complex tensor whose
    real dtype is ``dtype``."""
    return torch.view_as_complex(w.to(dtype).contiguous())


def check_weight_columns(x: Tensor, expected: int, what: str) -> None:
    """Raise ``ValueError`` unless ``x`` has the ``expected`` number of columns."""
    if x.shape[-1] != expected:
        raise ValueError(
            f"x must have {expected} columns to match the sketch weights ({what}), "
            f"got shape {tuple(x.shape)}"
        )
