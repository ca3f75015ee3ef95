"""Doctest namespace: docstring examples may use torch, gpytorch and numpy without importing."""

import gpytorch
import numpy
import pytest
import torch


@pytest.fixture(autouse=True)
def _doctest_namespace(doctest_namespace):
    doctest_namespace["torch"] = torch
    doctest_namespace["gpytorch"] = gpytorch
    doctest_namespace["np"] = numpy
    torch.manual_seed(0)
