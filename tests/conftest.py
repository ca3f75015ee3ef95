"""Shared fixtures: seeded generators, small data sets and Monte Carlo helpers.

Every statistical test in the suite uses float64 and a fixed ``torch.Generator`` so that it is
deterministic; tolerances come from Monte Carlo standard errors (see :func:`mc_mean`).
"""

from __future__ import annotations

import math
from typing import Callable, Tuple

import pytest
import torch
from torch import Tensor


@pytest.fixture(autouse=True, scope="session")
def _single_thread():
    # The test machines are shared 2-core boxes; one thread per worker keeps runs predictable.
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture
def make_generator() -> Callable[[int], torch.Generator]:
    """Factory: ``make_generator(seed)`` returns a fresh CPU generator seeded with ``seed``."""

    def factory(seed: int = 0) -> torch.Generator:
        return torch.Generator().manual_seed(seed)

    return factory


@pytest.fixture
def generator() -> torch.Generator:
    """A CPU generator seeded with 0."""
    return torch.Generator().manual_seed(0)


def _points_at_distances(
    distances, input_dim: int, generator: torch.Generator, lengthscale: float = 1.0
) -> Tuple[Tensor, Tensor]:
    """Pairs ``(x_j, y_j)`` with ``||x_j - y_j|| / lengthscale = distances[j]``, random directions.

    Returns two ``(len(distances), input_dim)`` float64 tensors.
    """
    distances = torch.as_tensor(distances, dtype=torch.float64)
    n = distances.numel()
    x = torch.randn(n, input_dim, generator=generator, dtype=torch.float64)
    direction = torch.randn(n, input_dim, generator=generator, dtype=torch.float64)
    direction = direction / direction.norm(dim=-1, keepdim=True)
    y = x + lengthscale * distances.unsqueeze(-1) * direction
    return x, y


def _mc_mean(samples: Tensor, dim: int = 0) -> Tuple[Tensor, Tensor]:
    """Sample mean and its standard error along ``dim``."""
    num = samples.shape[dim]
    return samples.mean(dim), samples.std(dim) / math.sqrt(num)


def _mc_variance(samples: Tensor, dim: int = 0) -> Tuple[Tensor, Tensor]:
    """Sample variance and its standard error ``sqrt((m4 - var^2) / T)`` along ``dim``."""
    num = samples.shape[dim]
    centred = samples - samples.mean(dim, keepdim=True)
    var = centred.pow(2).mean(dim)
    m4 = centred.pow(4).mean(dim)
    return var * num / (num - 1), torch.sqrt((m4 - var.pow(2)).clamp_min(0) / num)


@pytest.fixture
def points_at_distances():
    """:func:`_points_at_distances`: pairs of points at given (scaled) distances."""
    return _points_at_distances


@pytest.fixture
def mc_mean():
    """:func:`_mc_mean`: Monte Carlo mean and standard error."""
    return _mc_mean


@pytest.fixture
def mc_variance():
    """:func:`_mc_variance`: Monte Carlo variance and its standard error."""
    return _mc_variance


@pytest.fixture
def regression_data() -> Tuple[Tensor, Tensor]:
    """A small smooth 2-D regression problem (float64): 60 inputs, noisy targets."""
    gen = torch.Generator().manual_seed(123)
    x = torch.rand(60, 2, generator=gen, dtype=torch.float64) * 4 - 2
    y = torch.sin(2 * x[:, 0]) * torch.cos(x[:, 1]) + 0.1 * torch.randn(
        60, generator=gen, dtype=torch.float64
    )
    return x, y
