"""Loaders for the real data sets bundled with rfgp.

* UCI regression sets (``boston``, ``concrete``, ``energy``, ``yacht``, ``power-plant``,
  ``wine-quality-red``): see ``data/uci/LICENSE-source.txt``.
* The 200 hPa global wind field with its Helmholtz decomposition: see
  ``data/wind/LICENSE-source.txt``.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from typing import Dict, Optional, Tuple

import numpy as np
import torch
from torch import Tensor

__all__ = ["UCI_DATASETS", "load_uci", "load_wind", "train_test_split", "standardize"]

#: name -> (file name, number of input columns); the target is the last column.
UCI_DATASETS: Dict[str, Tuple[str, int]] = {
    "boston": ("boston.txt", 13),
    "concrete": ("concrete.txt", 8),
    "energy": ("energy.txt", 8),
    "yacht": ("yacht.txt", 6),
    "power-plant": ("power-plant.txt", 4),
    "wine-quality-red": ("wine-quality-red.txt", 11),
}


def _data_path(*parts: str):
    return resources.files("rfgp.datasets").joinpath("data", *parts)


def load_uci(name: str, dtype: torch.dtype = torch.float64) -> Tuple[Tensor, Tensor]:
    """Load a bundled UCI regression set.

    Args:
        name: one of :data:`UCI_DATASETS`.
        dtype: floating dtype of the returned tensors.

    Returns:
        ``(x, y)`` with ``x`` of shape ``(N, d)`` and ``y`` of shape ``(N,)``, unnormalised.

    Example:
        >>> x, y = load_uci("yacht")
        >>> tuple(x.shape), tuple(y.shape)
        ((308, 6), (308,))
    """
    if name not in UCI_DATASETS:
        raise ValueError(f"name must be one of {sorted(UCI_DATASETS)}, got {name!r}")
    file_name, num_inputs = UCI_DATASETS[name]
    text = _data_path("uci", file_name).read_text()
    rows = [line.split() for line in text.splitlines() if line.strip()]
    array = np.asarray(rows, dtype=np.float64)
    if array.shape[1] != num_inputs + 1:
        raise RuntimeError(
            f"{file_name}: expected {num_inputs + 1} columns, found {array.shape[1]}"
        )
    data = torch.from_numpy(array).to(dtype)
    return data[:, :num_inputs].contiguous(), data[:, num_inputs].contiguous()


@dataclass
class WindField:
    """The 200 hPa wind on a 2.5 degree grid (73 latitudes x 144 longitudes), float32 arrays.

    ``u = u_chi + u_psi`` and ``v = v_chi + v_psi``: the divergent (curl-free, ``chi``) and the
    rotational (divergence-free, ``psi``) parts from a spherical-harmonic decomposition.

    Attributes:
        latitude: ``(73,)`` degrees, 90 .. -90.
        longitude: ``(144,)`` degrees, 0 .. 357.5.
        u, v: ``(73, 144)`` eastward and northward wind (m/s).
        u_chi, v_chi: ``(73, 144)`` divergent (curl-free) part (m/s).
        u_psi, v_psi: ``(73, 144)`` rotational (divergence-free) part (m/s).
        divergence, vorticity: ``(73, 144)`` fields of the wind (1/s).

    Example:
        >>> w = load_wind()
        >>> bool(np.allclose(w.u, w.u_chi + w.u_psi, atol=1e-3 * np.abs(w.u).max()))
        True
    """

    latitude: np.ndarray  # (73,) degrees, 90 .. -90
    longitude: np.ndarray  # (144,) degrees, 0 .. 357.5
    u: np.ndarray
    v: np.ndarray
    u_chi: np.ndarray
    v_chi: np.ndarray
    u_psi: np.ndarray
    v_psi: np.ndarray
    divergence: np.ndarray
    vorticity: np.ndarray


def load_wind() -> WindField:
    """Load the bundled wind field with its Helmholtz decomposition.

    Returns:
        A :class:`WindField` of ``(73, 144)`` float32 arrays (latitude x longitude), in m/s
        for the winds.

    Example:
        >>> w = load_wind()
        >>> w.u.shape
        (73, 144)
    """

    def arr(name: str) -> np.ndarray:
        with _data_path("wind", f"{name}.npy").open("rb") as fh:
            return np.load(fh)

    return WindField(
        latitude=np.linspace(90.0, -90.0, 73),
        longitude=np.arange(0.0, 360.0, 2.5),
        u=arr("uwnd"),
        v=arr("vwnd"),
        u_chi=arr("uchi"),
        v_chi=arr("vchi"),
        u_psi=arr("upsi"),
        v_psi=arr("vpsi"),
        divergence=arr("div"),
        vorticity=arr("vrt"),
    )


def train_test_split(
    x: Tensor,
    y: Tensor,
    test_fraction: float = 0.1,
    generator: Optional[torch.Generator] = None,
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """Random split into ``(x_train, y_train, x_test, y_test)``.

    Args:
        x: ``(N, d)`` inputs.
        y: ``(N, ...)`` targets.
        test_fraction: share of the rows in the test part, in ``(0, 1)`` (at least one row).
        generator: ``torch.Generator`` of the permutation.

    Returns:
        ``(x_train, y_train, x_test, y_test)``.

    Example:
        >>> x, y = torch.arange(10.).unsqueeze(-1), torch.arange(10.)
        >>> parts = train_test_split(x, y, 0.2, torch.Generator().manual_seed(0))
        >>> [tuple(p.shape) for p in parts]
        [(8, 1), (8,), (2, 1), (2,)]
    """
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"x and y must have the same number of rows, got {x.shape[0]} and "
                         f"{y.shape[0]}")
    n = x.shape[0]
    perm = torch.randperm(n, generator=generator)
    num_test = max(1, int(round(test_fraction * n)))
    test, train = perm[:num_test], perm[num_test:]
    return x[train], y[train], x[test], y[test]


def standardize(train: Tensor, *others: Tensor) -> Tuple[Tensor, ...]:
    r"""Standardise columns with the training mean and standard deviation (constant columns kept).

    :math:`\tilde x = (x - \bar x_\text{train}) / s_\text{train}` column by column, with the
    standard deviation :math:`s` replaced by 1 where it is zero.

    Args:
        train: ``(N, ...)`` the tensor whose statistics are used.
        *others: tensors standardised with the same statistics (e.g. the test set).

    Returns:
        ``(train_std, *others_std, mean, std)``.

    Example:
        >>> train = torch.tensor([[0.0], [2.0]], dtype=torch.float64)
        >>> a, b, mean, std = standardize(train, torch.tensor([[1.0]], dtype=torch.float64))
        >>> a.flatten().tolist(), b.flatten().tolist(), mean.tolist()
        ([-0.7071067811865475, 0.7071067811865475], [0.0], [1.0])
    """
    mean = train.mean(0)
    std = train.std(0)
    std = torch.where(std > 0, std, torch.ones_like(std))
    return (*((t - mean) / std for t in (train, *others)), mean, std)
