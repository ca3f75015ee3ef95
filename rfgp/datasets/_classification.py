r"""Loaders of the bundled UCI classification sets: letter, MAGIC gamma telescope and adult.

The files are the UCI distributions, gzip-compressed, in ``data/uci-cls`` (license and source
note: ``data/uci-cls/LICENSE-source.txt``). Inputs come back as float64 (or the requested
floating dtype) and labels as int64 class indices ``0 .. C-1`` into the set's
:attr:`ClassificationSet.classes`.

Adult's eight categorical inputs are one-hot encoded with the fixed category lists of
:data:`ADULT_CATEGORIES` (every category of ``adult.data`` and ``adult.test``, in sorted
order), so the encoding does not depend on which rows are loaded:
:func:`encode_adult_categories` and :func:`decode_adult_categories` are each other's inverse.
"""

from __future__ import annotations

import gzip
from importlib import resources
from typing import Dict, List, NamedTuple, Sequence, Tuple, Union

import numpy as np
import torch
from torch import Tensor

from rfgp._validation import check_choice, check_dtype, describe

__all__ = [
    "ADULT_CATEGORIES",
    "ADULT_MISSING",
    "ADULT_NUMERIC",
    "UCI_CLASSIFICATION_DATASETS",
    "ClassificationSet",
    "decode_adult_categories",
    "encode_adult_categories",
    "load_uci_classification",
]


class ClassificationSet(NamedTuple):
    """What :func:`load_uci_classification` returns for one set.

    Attributes:
        files: the data files in ``data/uci-cls`` (adult: training then test file).
        num_inputs: columns of the returned inputs (adult: after one-hot encoding).
        classes: the class names; label ``c`` is ``classes[c]``.
        rows: rows of each file.
    """

    files: Tuple[str, ...]
    num_inputs: int
    classes: Tuple[str, ...]
    rows: Tuple[int, ...]


#: Adult's numeric inputs, the first six columns of its input matrix, in this order.
ADULT_NUMERIC: Tuple[str, ...] = (
    "age", "fnlwgt", "education-num", "capital-gain", "capital-loss", "hours-per-week",
)

#: Adult's categorical inputs and their categories, in the order of their one-hot blocks
#: (after the six numeric columns); each list is sorted and holds every category that occurs
#: in ``adult.data`` or ``adult.test`` (``Holand-Netherlands`` occurs in ``adult.data`` only).
ADULT_CATEGORIES: Dict[str, Tuple[str, ...]] = {
    "workclass": (
        "Federal-gov", "Local-gov", "Never-worked", "Private", "Self-emp-inc",
        "Self-emp-not-inc", "State-gov", "Without-pay",
    ),
    "education": (
        "10th", "11th", "12th", "1st-4th", "5th-6th", "7th-8th", "9th", "Assoc-acdm",
        "Assoc-voc", "Bachelors", "Doctorate", "HS-grad", "Masters", "Preschool",
        "Prof-school", "Some-college",
    ),
    "marital-status": (
        "Divorced", "Married-AF-spouse", "Married-civ-spouse", "Married-spouse-absent",
        "Never-married", "Separated", "Widowed",
    ),
    "occupation": (
        "Adm-clerical", "Armed-Forces", "Craft-repair", "Exec-managerial", "Farming-fishing",
        "Handlers-cleaners", "Machine-op-inspct", "Other-service", "Priv-house-serv",
        "Prof-specialty", "Protective-serv", "Sales", "Tech-support", "Transport-moving",
    ),
    "relationship": (
        "Husband", "Not-in-family", "Other-relative", "Own-child", "Unmarried", "Wife",
    ),
    "race": ("Amer-Indian-Eskimo", "Asian-Pac-Islander", "Black", "Other", "White"),
    "sex": ("Female", "Male"),
    "native-country": (
        "Cambodia", "Canada", "China", "Columbia", "Cuba", "Dominican-Republic", "Ecuador",
        "El-Salvador", "England", "France", "Germany", "Greece", "Guatemala", "Haiti",
        "Holand-Netherlands", "Honduras", "Hong", "Hungary", "India", "Iran", "Ireland",
        "Italy", "Jamaica", "Japan", "Laos", "Mexico", "Nicaragua",
        "Outlying-US(Guam-USVI-etc)", "Peru", "Philippines", "Poland", "Portugal",
        "Puerto-Rico", "Scotland", "South", "Taiwan", "Thailand", "Trinadad&Tobago",
        "United-States", "Vietnam", "Yugoslavia",
    ),
}

#: How adult marks a missing categorical value (workclass, occupation, native-country).
ADULT_MISSING = "?"

_ADULT_WIDTH = sum(len(c) for c in ADULT_CATEGORIES.values())  # 99 one-hot columns
# Positions of the inputs in a row of the adult files (the label is column 14).
_ADULT_COLUMNS = (
    "age", "workclass", "fnlwgt", "education", "education-num", "marital-status",
    "occupation", "relationship", "race", "sex", "capital-gain", "capital-loss",
    "hours-per-week", "native-country",
)

#: name -> :class:`ClassificationSet`.
UCI_CLASSIFICATION_DATASETS: Dict[str, ClassificationSet] = {
    "letter": ClassificationSet(
        ("letter-recognition.data.gz",), 16,
        tuple(chr(ord("A") + i) for i in range(26)), (20_000,),
    ),
    "magic": ClassificationSet(("magic04.data.gz",), 10, ("g", "h"), (19_020,)),
    "adult": ClassificationSet(
        ("adult.data.gz", "adult.test.gz"), len(ADULT_NUMERIC) + _ADULT_WIDTH,
        ("<=50K", ">50K"), (32_561, 16_281),
    ),
}

_SPLITS = ("all", "train", "test")


def _read_lines(file_name: str) -> List[str]:
    path = resources.files("rfgp.datasets").joinpath("data", "uci-cls", file_name)
    text = gzip.decompress(path.read_bytes()).decode("ascii")
    # adult.test opens with UCI's line "|1x3 Cross validator"; adult.data ends with a blank.
    return [line for line in text.splitlines() if line.strip() and not line.startswith("|")]


def _label_indices(names: Sequence[str], classes: Tuple[str, ...], file_name: str) -> Tensor:
    lookup = {name: i for i, name in enumerate(classes)}
    unknown = sorted(set(names) - set(lookup))
    if unknown:
        raise RuntimeError(f"{file_name}: unexpected labels {unknown[:5]}, expected {classes}")
    return torch.tensor([lookup[name] for name in names], dtype=torch.int64)


def encode_adult_categories(rows: Sequence[Sequence[str]]) -> np.ndarray:
    r"""One-hot encode adult's categorical inputs with the fixed lists of
    :data:`ADULT_CATEGORIES`.

    Each variable becomes a block of 0/1 columns, one per category, the blocks in the order of
    :data:`ADULT_CATEGORIES` (99 columns in all). A missing value (:data:`ADULT_MISSING`,
    ``"?"``) sets no column: its block is all zeros, which no category has, so the row stays
    distinguishable from every observed category and equally far from each.

    Args:
        rows: ``N`` rows of 8 strings each, the values of ``workclass``, ``education``,
            ``marital-status``, ``occupation``, ``relationship``, ``race``, ``sex`` and
            ``native-country`` (surrounding spaces are stripped).

    Returns:
        ``(N, 99)`` float64 array of zeros and ones.

    Raises:
        ValueError: a row without 8 values, or a value that is neither a category of its
            variable nor ``"?"`` (the message names the variable, the value and the row).
        TypeError: a value that is not a string.

    Example:
        >>> one_hot = encode_adult_categories([["Private", "Bachelors", "Never-married",
        ...     "Sales", "Own-child", "White", "Female", "?"]])
        >>> one_hot.shape, int(one_hot.sum())
        ((1, 99), 7)
        >>> decode_adult_categories(one_hot)[0][-1]
        '?'
    """
    names = list(ADULT_CATEGORIES)
    lookups = [{c: i for i, c in enumerate(cats)} for cats in ADULT_CATEGORIES.values()]
    offsets = np.cumsum([0] + [len(c) for c in ADULT_CATEGORIES.values()])[:-1]
    out = np.zeros((len(rows), _ADULT_WIDTH), dtype=np.float64)
    for r, row in enumerate(rows):
        if isinstance(row, str) or len(row) != len(names):
            raise ValueError(
                f"rows[{r}] must hold {len(names)} values ({', '.join(names)}), got "
                f"{describe(row)}"
            )
        for j, value in enumerate(row):
            if not isinstance(value, str):
                raise TypeError(
                    f"rows[{r}]: {names[j]} must be a string, got {describe(value)}"
                )
            value = value.strip()
            if value == ADULT_MISSING:
                continue
            index = lookups[j].get(value)
            if index is None:
                raise ValueError(
                    f"rows[{r}]: {names[j]} has no category {value!r}; expected one of "
                    f"{list(ADULT_CATEGORIES[names[j]])} or {ADULT_MISSING!r} (missing)"
                )
            out[r, offsets[j] + index] = 1.0
    return out


def decode_adult_categories(one_hot: Union[np.ndarray, Tensor]) -> List[Tuple[str, ...]]:
    """The category names behind one-hot blocks of :func:`encode_adult_categories`.

    Args:
        one_hot: ``(N, 99)`` array or tensor of zeros and ones (the last 99 columns of adult's
            inputs), at most one 1 per block.

    Returns:
        ``N`` tuples of 8 strings; an all-zero block gives :data:`ADULT_MISSING` (``"?"``).

    Raises:
        ValueError: a wrong shape, an entry other than 0 or 1, or a block with two ones.

    Example:
        >>> row = ("Private", "HS-grad", "Divorced", "Sales", "Unmarried", "Black", "Male",
        ...        "Mexico")
        >>> decode_adult_categories(encode_adult_categories([row]))[0] == row
        True
    """
    array = one_hot.detach().cpu().numpy() if isinstance(one_hot, Tensor) else np.asarray(one_hot)
    if array.ndim != 2 or array.shape[1] != _ADULT_WIDTH:
        raise ValueError(
            f"one_hot must have shape (N, {_ADULT_WIDTH}), got shape {tuple(array.shape)}"
        )
    if not np.isin(array, (0, 1)).all():
        raise ValueError("one_hot must hold only zeros and ones")
    decoded: List[List[str]] = [[] for _ in range(array.shape[0])]
    start = 0
    for name, categories in ADULT_CATEGORIES.items():
        block = array[:, start:start + len(categories)]
        counts = block.sum(1)
        if (counts > 1).any():
            row = int(np.argmax(counts > 1))
            raise ValueError(f"one_hot row {row} sets {int(counts[row])} categories of {name}")
        for r, (hot, index) in enumerate(zip(counts, block.argmax(1))):
            decoded[r].append(categories[index] if hot else ADULT_MISSING)
        start += len(categories)
    return [tuple(row) for row in decoded]


def _load_adult(file_name: str) -> Tuple[np.ndarray, List[str]]:
    rows = [[field.strip() for field in line.split(",")] for line in _read_lines(file_name)]
    if any(len(row) != len(_ADULT_COLUMNS) + 1 for row in rows):
        raise RuntimeError(f"{file_name}: expected {len(_ADULT_COLUMNS) + 1} columns per row")
    numeric = [_ADULT_COLUMNS.index(name) for name in ADULT_NUMERIC]
    categorical = [_ADULT_COLUMNS.index(name) for name in ADULT_CATEGORIES]
    values = np.asarray([[float(row[j]) for j in numeric] for row in rows])
    one_hot = encode_adult_categories([[row[j] for j in categorical] for row in rows])
    # adult.test writes its labels with a trailing dot ("<=50K.").
    labels = [row[-1].rstrip(".") for row in rows]
    return np.concatenate([values, one_hot], axis=1), labels


def load_uci_classification(
    name: str, split: str = "all", dtype: Union[torch.dtype, str] = torch.float64
) -> Tuple[Tensor, Tensor]:
    r"""Load a bundled UCI classification set.

    * ``"letter"``: 20,000 rows, 16 integer inputs (0..15), 26 classes (the letters A..Z).
    * ``"magic"``: MAGIC gamma telescope, 19,020 rows, 10 real inputs, 2 classes (``"g"``
      gamma = 0, ``"h"`` hadron = 1).
    * ``"adult"``: 48,842 rows (``adult.data`` 32,561, then ``adult.test`` 16,281), 2 classes
      (``"<=50K"`` = 0, ``">50K"`` = 1; the test file's trailing dot on labels is dropped).
      The inputs are the 6 numeric columns of :data:`ADULT_NUMERIC`, unscaled, then the 8
      categorical ones one-hot encoded by :func:`encode_adult_categories` (99 columns, the
      fixed category lists of :data:`ADULT_CATEGORIES`): 105 columns. **Missing values**
      (``"?"``: 2,799 workclass, 2,809 occupation and 857 native-country entries) are kept as
      rows whose block of that variable is all zeros; no row is dropped.

    The rows keep the order of the files; nothing is standardised.

    Args:
        name: one of :data:`UCI_CLASSIFICATION_DATASETS` (``"letter"``, ``"magic"``,
            ``"adult"``).
        split: ``"all"``; for adult also the given split, ``"train"`` (``adult.data``) or
            ``"test"`` (``adult.test``).
        dtype: floating dtype of the inputs, a ``torch.dtype`` or its name.

    Returns:
        ``(x, labels)``: ``x`` of shape ``(N, d)`` in ``dtype`` and ``labels`` of shape
        ``(N,)``, int64 indices into ``UCI_CLASSIFICATION_DATASETS[name].classes``.

    Raises:
        ValueError: an unknown ``name``, or a ``split`` the set does not have.
        TypeError: a non-floating ``dtype``.

    Example:
        >>> x, labels = load_uci_classification("magic")
        >>> tuple(x.shape), x.dtype, labels.dtype, int(labels.max()) + 1
        ((19020, 10), torch.float64, torch.int64, 2)
    """
    check_choice("name", name, sorted(UCI_CLASSIFICATION_DATASETS))
    check_choice("split", split, _SPLITS if name == "adult" else ("all",))
    dtype = check_dtype("dtype", dtype)
    spec = UCI_CLASSIFICATION_DATASETS[name]
    if name == "adult":
        files = {"all": spec.files, "train": spec.files[:1], "test": spec.files[1:]}[split]
        parts = [_load_adult(file_name) for file_name in files]
        inputs = np.concatenate([p[0] for p in parts])
        labels = _label_indices([c for p in parts for c in p[1]], spec.classes, "adult")
    else:
        (file_name,) = spec.files
        rows = [line.split(",") for line in _read_lines(file_name)]
        if name == "letter":  # the label is the first column in UCI's layout
            names, values = [r[0] for r in rows], [r[1:] for r in rows]
        else:
            names, values = [r[-1] for r in rows], [r[:-1] for r in rows]
        inputs = np.asarray(values, dtype=np.float64)
        labels = _label_indices(names, spec.classes, file_name)
    if inputs.shape[1] != spec.num_inputs:
        raise RuntimeError(f"{name}: expected {spec.num_inputs} inputs, found {inputs.shape[1]}")
    return torch.from_numpy(inputs).to(dtype), labels
