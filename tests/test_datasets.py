"""Tests of rfgp.datasets: the bundled loaders, the seeded split and standardisation."""

import numpy as np
import pytest
import torch

from rfgp import datasets
from rfgp.datasets import (
    ADULT_CATEGORIES,
    ADULT_NUMERIC,
    UCI_CLASSIFICATION_DATASETS,
    UCI_DATASETS,
    decode_adult_categories,
    encode_adult_categories,
    load_uci,
    load_uci_classification,
    load_wind,
    standardize,
    train_test_split,
)

DT = torch.float64


# ------------------------------------------------------------------------------ loaders
@pytest.mark.parametrize("name", sorted(UCI_DATASETS))
def test_every_uci_set_loads_with_its_declared_width(name):
    x, y = load_uci(name)
    assert x.dtype == y.dtype == DT
    assert x.dim() == 2 and x.shape[1] == UCI_DATASETS[name][1]
    assert y.shape == (x.shape[0],) and x.shape[0] > 100
    assert torch.isfinite(x).all() and torch.isfinite(y).all()


@pytest.mark.parametrize("dtype", ["float32", torch.float32, "torch.float32"])
def test_load_uci_dtype_as_name_or_dtype(dtype):
    x, y = load_uci("yacht", dtype=dtype)
    assert x.dtype == y.dtype == torch.float32
    x64, _ = load_uci("yacht")
    torch.testing.assert_close(x, x64.float())


@pytest.mark.parametrize("dtype, error", [("int64", TypeError), (torch.long, TypeError),
                                          ("cuda", TypeError), (None, TypeError)])
def test_load_uci_refuses_non_floating_dtypes(dtype, error):
    with pytest.raises(error, match="dtype must be a floating torch dtype"):
        load_uci("yacht", dtype=dtype)


def test_load_uci_refuses_unknown_names():
    with pytest.raises(ValueError, match="name must be one of"):
        load_uci("mnist")


# The class counts of the UCI description of each set (letter's .names file; MAGIC: g 12332,
# h 6688; adult: 24720 + 12435 rows <=50K, 7841 + 3846 rows >50K).
_LETTER_COUNTS = [789, 766, 736, 805, 768, 775, 773, 734, 755, 747, 739, 761, 792, 783, 753,
                  803, 783, 758, 748, 796, 813, 764, 752, 787, 786, 734]
_CLASS_COUNTS = {"letter": _LETTER_COUNTS, "magic": [12332, 6688], "adult": [37155, 11687]}


@pytest.mark.parametrize("name", sorted(UCI_CLASSIFICATION_DATASETS))
def test_uci_classification_sets_have_their_declared_shape_and_class_counts(name):
    spec = UCI_CLASSIFICATION_DATASETS[name]
    x, labels = load_uci_classification(name)
    assert x.dtype == DT and labels.dtype == torch.int64
    assert x.shape == (sum(spec.rows), spec.num_inputs) and labels.shape == (x.shape[0],)
    assert torch.isfinite(x).all()
    counts = torch.bincount(labels, minlength=len(spec.classes))
    assert counts.tolist() == _CLASS_COUNTS[name]


def test_letter_inputs_are_the_integers_0_to_15():
    x, _ = load_uci_classification("letter")
    assert torch.equal(x, x.round()) and x.min() == 0 and x.max() == 15


def test_adult_given_split_is_the_two_files_in_order():
    x, labels = load_uci_classification("adult")
    x_train, y_train = load_uci_classification("adult", split="train")
    x_test, y_test = load_uci_classification("adult", split="test")
    assert x_train.shape[0] == 32561 and x_test.shape[0] == 16281
    assert torch.equal(torch.cat([x_train, x_test]), x)
    assert torch.equal(torch.cat([y_train, y_test]), labels)
    # the test file's labels carry a trailing dot in the file: both classes are still found
    assert torch.bincount(y_test).tolist() == [12435, 3846]


def test_adult_rows_are_numbers_then_one_valid_category_or_none_per_variable():
    x, _ = load_uci_classification("adult", split="train")
    numeric, one_hot = x[:, :len(ADULT_NUMERIC)], x[:, len(ADULT_NUMERIC):]
    assert one_hot.shape[1] == sum(len(c) for c in ADULT_CATEGORIES.values())
    assert float(numeric[:, 0].min()) == 17 and float(numeric[:, 0].max()) == 90  # age
    decoded = decode_adult_categories(one_hot)
    # the first row of adult.data, as the file writes it
    assert decoded[0] == ("State-gov", "Bachelors", "Never-married", "Adm-clerical",
                          "Not-in-family", "White", "Male", "United-States")
    # missing values ("?") are kept, as all-zero blocks: the UCI counts of adult.data
    missing = [sum(row[j] == "?" for row in decoded) for j in range(len(ADULT_CATEGORIES))]
    assert missing == [1836, 0, 0, 1843, 0, 0, 0, 583]


def test_adult_encoding_round_trips_every_category_and_the_missing_mark():
    names = list(ADULT_CATEGORIES)
    width = max(len(c) for c in ADULT_CATEGORIES.values())
    # row i takes category i of each variable (cycled), and a row of missing values
    rows = [tuple(ADULT_CATEGORIES[n][i % len(ADULT_CATEGORIES[n])] for n in names)
            for i in range(width)] + [("?",) * len(names)]
    one_hot = encode_adult_categories(rows)
    assert one_hot.shape == (len(rows), 99)
    assert one_hot[:-1].sum(1).tolist() == [len(names)] * width and one_hot[-1].sum() == 0
    assert decode_adult_categories(one_hot) == rows
    assert decode_adult_categories(torch.from_numpy(one_hot)) == rows


def test_adult_encoding_refuses_unknown_categories_by_name():
    row = ["Private", "Bachelors", "Never-married", "Sales", "Own-child", "White", "Female",
           "Atlantis"]
    unknown = r"rows\[0\]: native-country has no category 'Atlantis'"
    with pytest.raises(ValueError, match=unknown):
        encode_adult_categories([row])
    with pytest.raises(ValueError, match="rows\\[0\\] must hold 8 values"):
        encode_adult_categories([row[:7]])
    with pytest.raises(TypeError, match="sex must be a string"):
        encode_adult_categories([row[:6] + [1, "Cuba"]])
    two = encode_adult_categories([row[:7] + ["Cuba"]])
    two[0, 1] = 1.0  # a second workclass
    with pytest.raises(ValueError, match="sets 2 categories of workclass"):
        decode_adult_categories(two)
    with pytest.raises(ValueError, match="only zeros and ones"):
        decode_adult_categories(two / 2)
    with pytest.raises(ValueError, match="shape"):
        decode_adult_categories(np.zeros((1, 98)))


def test_load_uci_classification_refuses_bad_names_splits_and_dtypes():
    with pytest.raises(ValueError, match="name must be one of \\['adult', 'letter', 'magic'\\]"):
        load_uci_classification("mnist")
    with pytest.raises(ValueError, match="split must be one of \\['all'\\], got 'test'"):
        load_uci_classification("letter", split="test")
    with pytest.raises(ValueError, match="split must be one of"):
        load_uci_classification("adult", split="validation")
    with pytest.raises(TypeError, match="dtype must be a floating torch dtype"):
        load_uci_classification("magic", dtype=torch.int64)
    x, _ = load_uci_classification("magic", dtype="float32")
    assert x.dtype == torch.float32


def test_wind_field_is_the_sum_of_its_helmholtz_parts():
    w = load_wind()
    assert w.u.shape == w.v.shape == (73, 144)
    assert w.latitude.shape == (73,) and w.longitude.shape == (144,)
    scale = np.abs(w.u).max()
    np.testing.assert_allclose(w.u, w.u_chi + w.u_psi, atol=1e-3 * scale)
    # the decomposition is a truncated spherical-harmonic series: v near the poles is the
    # least exact part (about 0.1% of the largest wind)
    np.testing.assert_allclose(w.v, w.v_chi + w.v_psi, atol=2e-3 * np.abs(w.v).max())


# ------------------------------------------------------------------------------ split
def test_split_is_a_partition_and_seeded():
    x = torch.arange(20, dtype=DT).unsqueeze(-1)
    y = torch.arange(20, dtype=DT) * 10
    x_tr, y_tr, x_te, y_te = train_test_split(x, y, 0.25, generator=3)
    assert x_te.shape == (5, 1) and x_tr.shape == (15, 1)
    rows = torch.cat([x_tr[:, 0], x_te[:, 0]]).sort().values
    assert torch.equal(rows, x[:, 0])  # every row exactly once
    torch.testing.assert_close(y_tr, 10 * x_tr[:, 0])  # rows stay paired
    again = train_test_split(x, y, 0.25, generator=torch.Generator().manual_seed(3))
    assert torch.equal(again[2], x_te)  # a seed means a fresh generator with that seed
    np_parts = train_test_split(x.numpy(), y.numpy(), 0.25, generator=3)
    assert torch.equal(np_parts[2], x_te)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"generator": 0.5}, TypeError, "generator must be None, an integer seed"),
        ({"generator": "0"}, TypeError, "generator must be None, an integer seed"),
        ({"generator": True}, TypeError, "generator must be None, an integer seed"),
        ({"generator": -1}, ValueError, "generator must be an integer >= 0"),
        ({"test_fraction": 1.0}, ValueError, "test_fraction"),
        ({"test_fraction": float("nan")}, ValueError, "test_fraction"),
    ],
)
def test_split_bad_arguments(kwargs, error, match):
    x = torch.zeros(10, 2)
    with pytest.raises(error, match=match):
        train_test_split(x, torch.zeros(10), **kwargs)


def test_split_bad_data():
    with pytest.raises(ValueError, match="same number of rows"):
        train_test_split(torch.zeros(10, 2), torch.zeros(9))
    with pytest.raises(ValueError, match="enough rows"):
        train_test_split(torch.zeros(1, 2), torch.zeros(1), 0.5)
    with pytest.raises(TypeError, match="x must be a torch.Tensor or NumPy array"):
        train_test_split([[0.0]] * 4, torch.zeros(4))


# ------------------------------------------------------------------------------ standardize
def test_standardize_moments_and_constant_columns():
    g = torch.Generator().manual_seed(0)
    train = torch.randn(50, 3, generator=g, dtype=DT) * torch.tensor([1.0, 5.0, 0.0]) + 7
    test = torch.randn(10, 3, generator=g, dtype=DT)
    a, b, mean, std = standardize(train, test)
    torch.testing.assert_close(a[:, :2].mean(0), torch.zeros(2, dtype=DT), atol=1e-12, rtol=0)
    torch.testing.assert_close(a[:, :2].std(0), torch.ones(2, dtype=DT))
    assert std[2] == 1 and (a[:, 2] == 0).all()  # a constant column is centred, not divided
    torch.testing.assert_close(b, (test - mean) / std)


def test_standardize_numpy_and_integer_input():
    ints = np.array([[0, 10], [2, 10], [4, 10]])
    a, mean, std = standardize(ints)
    assert a.dtype == DT
    torch.testing.assert_close(mean, torch.tensor([2.0, 10.0], dtype=DT))
    torch.testing.assert_close(a[:, 0], torch.tensor([-1.0, 0.0, 1.0], dtype=DT))
    a_t, b_t, _, _ = standardize(torch.as_tensor(ints), torch.tensor([[6, 10]]))
    torch.testing.assert_close(b_t, torch.tensor([[2.0, 0.0]], dtype=DT))
    one, _, std_one = standardize(torch.tensor([[3.0, 4.0]], dtype=DT))
    assert (std_one == 1).all() and (one == 0).all()  # one row: no spread, no NaN


@pytest.mark.parametrize(
    "args, error, match",
    [
        ((torch.zeros(4, 3), torch.zeros(2, 2)), ValueError,
         r"others\[0\] must have the trailing shape \(3,\)"),
        ((torch.zeros(0, 3),), ValueError, "train must have at least one row"),
        ((torch.tensor([[1.0], [float("nan")]]),), ValueError, "train must be finite"),
        ((torch.zeros(3, 1), torch.tensor([[float("inf")]])), ValueError,
         r"others\[0\] must be finite"),
        (([[1.0], [2.0]],), TypeError, "train must be a torch.Tensor or NumPy array"),
        ((torch.zeros(3, 1, dtype=torch.complex64),), TypeError, "real numbers"),
        ((torch.zeros(3, 1, dtype=torch.bool),), TypeError, "real numbers"),
        ((torch.tensor(1.0),), ValueError, "leading row dimension"),
    ],
)
def test_standardize_bad_input(args, error, match):
    with pytest.raises(error, match=match):
        standardize(*args)


def test_public_names():
    assert set(datasets.__all__) == {
        "UCI_DATASETS", "WindField", "load_uci", "load_wind", "train_test_split", "standardize",
        "ADULT_CATEGORIES", "ADULT_MISSING", "ADULT_NUMERIC", "UCI_CLASSIFICATION_DATASETS",
        "ClassificationSet", "decode_adult_categories", "encode_adult_categories",
        "load_uci_classification"}


@pytest.mark.parametrize("c", [2.0**664, 2.0**-664, 1e200, 1e-200])
def test_standardize_is_scale_equivariant(c):
    g = torch.Generator().manual_seed(0)
    train = torch.randn(20, 3, generator=g, dtype=torch.float64)
    test = torch.randn(5, 3, generator=g, dtype=torch.float64)
    train[:, 2] = 3.0  # a constant column keeps std 1 at every scale
    a, b, mean, std = standardize(train, test)
    sa, sb, smean, sstd = standardize(c * train, c * test)
    # Exact for powers of two; within rounding of c * x for decimal scales.
    tol = dict(rtol=0, atol=0) if c in (2.0**664, 2.0**-664) else dict(rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(sa[:, :2], a[:, :2], **tol)
    torch.testing.assert_close(sb[:, :2], b[:, :2], **tol)
    torch.testing.assert_close(smean, c * mean, **{**tol, "atol": 0})
    torch.testing.assert_close(sstd[:2], c * std[:2], **{**tol, "atol": 0})
    assert sstd[2] == 1.0 and bool((sa[:, 2] == 0).all())
    torch.testing.assert_close(sb[:, 2], c * test[:, 2] - c * 3.0, rtol=1e-13, atol=0)


def test_standardize_finds_constant_columns_whose_mean_rounds():
    # The mean of three 0.1 is not 0.1 in float64: the column is still constant.
    train = torch.tensor([[0.1, 0.0], [0.1, 1.0], [0.1, 2.0]], dtype=torch.float64)
    a, b, mean, std = standardize(train, torch.tensor([[0.6, 1.0]], dtype=torch.float64))
    assert std[0] == 1.0 and mean[0] == 0.1 and bool((a[:, 0] == 0).all())
    assert b[0, 0] == 0.6 - 0.1
