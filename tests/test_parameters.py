"""The declared constraints table (rfgp._parameters) covers every argument of every public entry
point, and validate_parameters names the argument, what was expected and what was received."""

from __future__ import annotations

import dataclasses
import inspect
import math

import numpy as np
import pytest
import torch

from rfgp._parameters import DATA_ARGUMENTS, ESTIMATOR_KERNELS, PARAMETER_CONSTRAINTS
from rfgp._validation import BOOLEAN, Integral, Interval, Options, Real, validate_parameters
from rfgp.recipes import (
    ClassifierOptions,
    RegressionOptions,
    calibrated_fit,
    fit_auto,
    fit_classifier_auto,
)


def _arguments(entry) -> set:
    """The arguments a user passes to ``entry``: its signature's (``**options`` stands for
    the options dataclass's fields), less the data."""
    if dataclasses.is_dataclass(entry):
        return {item.name for item in dataclasses.fields(entry)}
    names = set()
    for parameter in inspect.signature(entry).parameters.values():
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            options = RegressionOptions if entry is fit_auto else ClassifierOptions
            names |= _arguments(options)
        elif parameter.name != "self":
            names.add(parameter.name)
    return names - DATA_ARGUMENTS


def _entry_points() -> dict:
    entries = {"fit_auto": fit_auto, "fit_classifier_auto": fit_classifier_auto,
               "calibrated_fit": calibrated_fit, "RegressionOptions": RegressionOptions,
               "ClassifierOptions": ClassifierOptions}
    try:
        from rfgp.sklearn import (
            RandomFeatureGPClassifier,
            RandomFeatureGPRegressor,
            make_kernel,
        )
    except ImportError:  # the sklearn extra is not installed
        return entries
    return {**entries, "make_kernel": make_kernel,
            "RandomFeatureGPRegressor": RandomFeatureGPRegressor.__init__,
            "RandomFeatureGPClassifier": RandomFeatureGPClassifier.__init__}


@pytest.mark.parametrize("name, entry", list(_entry_points().items()))
def test_the_table_declares_every_argument_of_each_entry_point(name, entry):
    # A new argument without a constraint, or a constraint left behind by a removed
    # argument, fails here.
    assert set(PARAMETER_CONSTRAINTS[name]) == _arguments(entry)


def test_the_table_lists_the_entry_points_it_serves():
    assert set(PARAMETER_CONSTRAINTS) >= set(_entry_points())


def test_the_estimators_kernel_names_are_the_builders():
    sklearn = pytest.importorskip("rfgp.sklearn")
    assert set(ESTIMATOR_KERNELS) == set(sklearn.KERNELS)


def test_every_default_satisfies_its_constraints():
    for name, entry in _entry_points().items():
        if dataclasses.is_dataclass(entry):
            defaults = {item.name: item.default for item in dataclasses.fields(entry)}
        else:
            defaults = {p.name: p.default for p in inspect.signature(entry).parameters.values()
                        if p.default is not inspect.Parameter.empty}
        defaults = {key: value for key, value in defaults.items()
                    if key in PARAMETER_CONSTRAINTS[name]}
        validate_parameters(PARAMETER_CONSTRAINTS[name], defaults)


# ------------------------------------------------------------------ validate_parameters


TABLE = {
    "count": [Interval(Integral, 1, None)],
    "rate": [Interval(Real, 0, None, closed="neither"), None],
    "flag": [BOOLEAN],
    "solve": [Options(("weight", "cg"))],
}


@pytest.mark.parametrize("name, value, error, message", [
    ("count", 2.0, TypeError, "count must be a positive integer, got 2.0 (float)"),
    ("count", True, TypeError, "count must be a positive integer, got True (bool)"),
    ("count", 0, ValueError, "count must be a positive integer, got 0"),
    ("rate", "4", TypeError, "rate must be a finite real number > 0 or None, got '4' (str)"),
    ("rate", math.nan, ValueError, "rate must be a finite real number > 0 or None, got nan"),
    ("rate", math.inf, ValueError, "rate must be a finite real number > 0 or None, got inf"),
    ("flag", 1, TypeError, "flag must be a bool, got 1 (int)"),
    ("solve", "lu", ValueError, "solve must be one of ['weight', 'cg'], got 'lu'"),
    ("solve", 1, ValueError, "solve must be one of ['weight', 'cg'], got 1"),
])
def test_a_bad_value_is_named_with_what_was_expected_and_received(name, value, error, message):
    with pytest.raises(error) as raised:
        validate_parameters(TABLE, {name: value})
    assert str(raised.value) == message


def test_valid_values_come_back_in_their_python_types():
    checked = validate_parameters(TABLE, {"count": np.int64(3), "rate": torch.tensor(0.5),
                                          "flag": np.bool_(True), "solve": "cg"})
    assert checked == {"count": 3, "rate": 0.5, "flag": True, "solve": "cg"}
    assert [type(value) for value in checked.values()] == [int, float, bool, str]
    assert validate_parameters(TABLE, {"rate": None}) == {"rate": None}


def test_an_undeclared_argument_is_a_missing_declaration():
    with pytest.raises(KeyError):
        validate_parameters(TABLE, {"unknown": 1})


def test_the_estimators_raise_an_error_that_is_both_kinds():
    sklearn = pytest.importorskip("rfgp.sklearn")
    with pytest.raises(sklearn.InvalidParameterError) as raised:
        validate_parameters(TABLE, {"count": 0}, sklearn.InvalidParameterError)
    assert isinstance(raised.value, TypeError) and isinstance(raised.value, ValueError)
