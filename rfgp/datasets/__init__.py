"""Loaders for the real data sets bundled with rfgp.

* UCI regression sets (``boston``, ``concrete``, ``energy``, ``yacht``, ``power-plant``,
  ``wine-quality-red``): see ``data/uci/LICENSE-source.txt``; the larger ``elevators``,
  ``pol``, ``bike``, ``pumadyn32nm``, ``tamielectric`` and ``keggundirected`` (8192 to 63608
  rows): see ``data/uci-large/LICENSE-source.txt``.
* UCI classification sets (``letter``, ``magic``, ``adult``; 19,020 to 48,842 rows) with
  :func:`load_uci_classification` and adult's one-hot encoding
  (:func:`encode_adult_categories`): see ``data/uci-cls/LICENSE-source.txt``.
* The 200 hPa global wind field with its Helmholtz decomposition: see
  ``data/wind/LICENSE-source.txt``.
"""

from __future__ import annotations

import gzip
import numbers
from dataclasses import dataclass
from importlib import resources
from typing import Any, Dict, Optional, Tuple, Union

import numpy as np
import torch
from torch import Tensor

from rfgp._ops import column_power_of_two_scale
from rfgp._validation import (
    check_choice,
    check_dtype,
    check_finite,
    check_int,
    check_real,
    describe,
)
from rfgp.datasets._classification import (
    ADULT_CATEGORIES,
    ADULT_MISSING,
    ADULT_NUMERIC,
    UCI_CLASSIFICATION_DATASETS,
    ClassificationSet,
    decode_adult_categories,
    encode_adult_categories,
    load_uci_classification,
)

__all__ = ["UCI_DATASETS", "WindField", "load_uci", "load_wind", "train_test_split",
           "standardize", "ADULT_CATEGORIES", "ADULT_MISSING", "ADULT_NUMERIC",
           "UCI_CLASSIFICATION_DATASETS", "ClassificationSet", "decode_adult_categories",
           "encode_adult_categories", "load_uci_classification"]

#: name -> (file name, number of input columns); the target is the last column. The first six
#: (277 to 9568 rows) are in ``data/uci``, the larger six (8192 to 63608 rows) in
#: ``data/uci-large``, gzip-compressed.
UCI_DATASETS: Dict[str, Tuple[str, int]] = {
    "boston": ("boston.txt", 13),
    "concrete": ("concrete.txt", 8),
    "energy": ("energy.txt", 8),
    "yacht": ("yacht.txt", 6),
    "power-plant": ("power-plant.txt", 4),
    "wine-quality-red": ("wine-quality-red.txt", 11),
    "elevators": ("uci-large/elevators.txt.gz", 18),
    "pol": ("uci-large/pol.txt.gz", 26),
    "bike": ("uci-large/bike.txt.gz", 17),
    "pumadyn32nm": ("uci-large/pumadyn32nm.txt.gz", 32),
    "tamielectric": ("uci-large/tamielectric.txt.gz", 3),
    "keggundirected": ("uci-large/keggundirected.txt.gz", 27),
}


def _data_path(*parts: str):
    return resources.files("rfgp.datasets").joinpath("data", *parts)


def load_uci(
    name: str, dtype: Union[torch.dtype, str] = torch.float64
) -> Tuple[Tensor, Tensor]:
    """Load a bundled UCI regression set.

    Args:
        name: one of :data:`UCI_DATASETS`.
        dtype: floating dtype of the returned tensors, a ``torch.dtype`` or its name
            (``"float32"``).

    Returns:
        ``(x, y)`` with ``x`` of shape ``(N, d)`` and ``y`` of shape ``(N,)``, unnormalised.

    Example:
        >>> x, y = load_uci("yacht")
        >>> tuple(x.shape), tuple(y.shape)
        ((308, 6), (308,))
    """
    check_choice("name", name, sorted(UCI_DATASETS))
    dtype = check_dtype("dtype", dtype)
    file_name, num_inputs = UCI_DATASETS[name]
    if file_name.endswith(".gz"):
        folder, file_name = file_name.split("/")
        text = gzip.decompress(_data_path(folder, file_name).read_bytes()).decode()
    else:
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


def _as_data_tensor(name: str, value: Any) -> Tensor:
    if isinstance(value, np.ndarray):
        value = torch.from_numpy(np.ascontiguousarray(value))
    if not isinstance(value, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or NumPy array, got {describe(value)}")
    if value.dim() == 0:
        raise ValueError(f"{name} must have a leading row dimension, got {describe(value)}")
    return value


def _as_generator(generator: Any) -> Optional[torch.Generator]:
    if generator is None or isinstance(generator, torch.Generator):
        return generator
    if isinstance(generator, (bool, np.bool_)) or not isinstance(generator, numbers.Integral):
        raise TypeError(
            "generator must be None, an integer seed or a torch.Generator, got "
            f"{describe(generator)}"
        )
    return torch.Generator().manual_seed(check_int("generator", generator, minimum=0))


def train_test_split(
    x: Any,
    y: Any,
    test_fraction: float = 0.1,
    generator: Union[torch.Generator, int, None] = None,
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """Random split into ``(x_train, y_train, x_test, y_test)``.

    Args:
        x: ``(N, ...)`` inputs (a tensor or NumPy array).
        y: ``(N, ...)`` targets (a tensor or NumPy array).
        test_fraction: share of the rows in the test part, in ``(0, 1)``; the test part gets
            ``max(1, round(test_fraction N))`` rows and the training part at least one.
        generator: ``torch.Generator`` of the permutation, or an integer seed for a fresh one
            (``None``: the global RNG).

    Returns:
        ``(x_train, y_train, x_test, y_test)``.

    Example:
        >>> x, y = torch.arange(10.).unsqueeze(-1), torch.arange(10.)
        >>> parts = train_test_split(x, y, 0.2, generator=0)
        >>> [tuple(p.shape) for p in parts]
        [(8, 1), (8,), (2, 1), (2,)]
    """
    x, y = _as_data_tensor("x", x), _as_data_tensor("y", y)
    test_fraction = check_real("test_fraction", test_fraction, low=0.0, high=1.0,
                               low_inclusive=False, high_inclusive=False)
    generator = _as_generator(generator)
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"x and y must have the same number of rows, got {x.shape[0]} and "
                         f"{y.shape[0]}")
    n = x.shape[0]
    num_test = max(1, int(round(test_fraction * n)))
    if num_test >= n:
        raise ValueError(
            f"x and y must have enough rows for a non-empty training and test part at "
            f"test_fraction={test_fraction}, got {n} rows"
        )
    perm = torch.randperm(n, generator=generator)
    test, train = perm[:num_test], perm[num_test:]
    return x[train], y[train], x[test], y[test]


def standardize(train: Any, *others: Any) -> Tuple[Tensor, ...]:
    r"""Standardise columns with the training mean and standard deviation (constant columns kept).

    :math:`\tilde x = (x - \bar x_\text{train}) / s_\text{train}` column by column, with the
    standard deviation :math:`s` replaced by 1 where the column is constant (or has one row).
    The statistics are computed on each column over a power of two near its largest value, so
    data of any scale (``1e200``, ``1e-200``) give the same standardised values.

    Args:
        train: ``(N, ...)`` the data whose statistics are used: a tensor or NumPy array;
            integer data are standardised in float64 (the result is a float tensor).
        *others: data standardised with the same statistics (e.g. the test set), with the
            trailing shape of ``train``.

    Returns:
        ``(train_std, *others_std, mean, std)``, floating tensors.

    Raises:
        TypeError: a list or other non-array input, complex or boolean data.
        ValueError: empty or non-finite data, or ``others`` whose trailing shape differs.

    Example:
        >>> train = torch.tensor([[0.0], [2.0]], dtype=torch.float64)
        >>> a, b, mean, std = standardize(train, torch.tensor([[1.0]], dtype=torch.float64))
        >>> a.flatten().tolist(), b.flatten().tolist(), mean.tolist()
        ([-0.7071067811865475, 0.7071067811865475], [0.0], [1.0])
    """
    names = ["train"] + [f"others[{i}]" for i in range(len(others))]
    tensors = []
    for name, value in zip(names, (train, *others)):
        value = _as_data_tensor(name, value)
        if value.is_complex() or value.dtype == torch.bool:
            raise TypeError(f"{name} must hold real numbers, got dtype {value.dtype}")
        if not value.is_floating_point():
            value = value.to(torch.float64)  # integers: exact in float64 up to 2**53
        check_finite(name, value)
        tensors.append(value)
    train = tensors[0]
    if train.shape[0] == 0:
        raise ValueError(f"train must have at least one row, got {describe(train)}")
    for name, value in zip(names[1:], tensors[1:]):
        if value.shape[1:] != train.shape[1:]:
            raise ValueError(
                f"{name} must have the trailing shape {tuple(train.shape[1:])} of train, got "
                f"{describe(value)}"
            )
    # The statistics of each column over a power of two near its largest value: exact
    # divisions, so columns of 1e200 or 1e-200 neither overflow nor underflow in the variance.
    scale = column_power_of_two_scale(train)
    unit = train / scale
    # A constant column is found by equality: its rounded mean can differ from its value by an
    # ulp (three rows of 0.1), which would leave a spurious std of 1e-17.
    constant = (train == train[:1]).all(0)
    mean = torch.where(constant, unit[0], unit.mean(0))
    std = unit.std(0) if train.shape[0] > 1 else torch.zeros_like(mean)
    std = torch.where(constant | (std == 0), 1 / scale, std)  # a constant column keeps std 1
    standardized = ((t.to(mean.dtype) / scale - mean) / std for t in tensors)
    return (*standardized, mean * scale, std * scale)
