"""Plain helpers shared by test modules (imported, not fixtures): seeded draws in float64 and a
complex random-feature kernel for the complex code paths."""

import importlib.util
import math
import sys
from pathlib import Path

import torch

from rfgp._ops import gaussian
from rfgp.kernels import RandomFeatureKernel

DT = torch.float64


def gen(seed: int) -> torch.Generator:
    """A fresh CPU generator seeded with ``seed``."""
    return torch.Generator().manual_seed(seed)


def rand(*shape: int, seed: int = 0) -> torch.Tensor:
    """Uniform draws on ``[-1, 1)`` of ``shape`` (float64) from ``gen(seed)``."""
    return torch.rand(*shape, generator=gen(seed), dtype=DT) * 2 - 1


class ComplexFourierKernel(RandomFeatureKernel):
    r"""Complex random Fourier features ``D^{-1/2} exp(i w^T x / l)`` (test only).

    ``E[Phi(x)^T conj Phi(y)] = exp(-||x - y||^2 / (2 l^2))``; ``Im K_hat != 0``.
    """

    has_lengthscale = True

    def __init__(self, num_features, **kwargs):
        super().__init__(num_features=num_features, **kwargs)
        self.is_complex = True

    def _sample_weights(self, input_dim, generator):
        return {"frequencies": gaussian((self.num_features, input_dim), generator)}

    def _features(self, x):
        proj = (x / self.lengthscale.to(x.dtype)) @ self.frequencies.to(x.dtype).T
        return torch.polar(torch.ones_like(proj), proj) / math.sqrt(self.num_features)


def assert_resampled_gram_is_unbiased(kernel, x, target, generator, num_draws, atol=1e-12):
    """Redraw ``kernel``'s weights ``num_draws`` times from ``generator``; the Monte Carlo mean of
    ``Re(Phi(x) Phi(x)^H)`` must lie within 5 standard errors (plus ``atol``) of ``target``."""
    draws = []
    for _ in range(num_draws):
        kernel.resample(generator)
        phi = kernel.features(x)
        draws.append((phi @ phi.conj().T).real)
    draws = torch.stack(draws)
    stderr = draws.std(0) / math.sqrt(draws.shape[0])
    assert ((draws.mean(0) - target).abs() <= 5 * stderr + atol).all()


def load_benchmark(name: str):
    """The script ``benchmarks/<name>.py`` imported by path (registered in ``sys.modules``,
    where dataclasses look their module up)."""
    path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
