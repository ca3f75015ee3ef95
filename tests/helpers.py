"""Plain helpers shared by test modules (imported, not fixtures): seeded draws in float64."""

import torch

DT = torch.float64


def gen(seed: int) -> torch.Generator:
    """A fresh CPU generator seeded with ``seed``."""
    return torch.Generator().manual_seed(seed)


def rand(*shape: int, seed: int = 0) -> torch.Tensor:
    """Uniform draws on ``[-1, 1)`` of ``shape`` (float64) from ``gen(seed)``."""
    return torch.rand(*shape, generator=gen(seed), dtype=DT) * 2 - 1
