"""Doctest namespace: docstring examples may use torch, gpytorch and numpy without importing."""

import importlib.util

import gpytorch
import numpy
import pytest
import torch

# The BoTorch adapter needs the optional extra ``botorch``: skip its doctests without it.
collect_ignore = [] if importlib.util.find_spec("botorch") else ["rfgp/botorch.py"]


@pytest.fixture(autouse=True)
def _doctest_namespace(doctest_namespace):
    doctest_namespace["torch"] = torch
    doctest_namespace["gpytorch"] = gpytorch
    doctest_namespace["np"] = numpy
    torch.manual_seed(0)
