"""Bayesian optimisation with BoTorch on a random-feature GP (``rfgp.botorch.RandomFeatureModel``).

Minimises the Branin function on the square ``[-5, 10] x [0, 15]`` (three global minima of
0.3979). Each round fits a :class:`rfgp.RandomFeatureGP` with random Fourier features to the
points seen so far (hyperparameters by the evidence), hands it to BoTorch as a
``RandomFeatureModel`` and picks the next point by maximising ``LogExpectedImprovement`` with
``optimize_acqf``. A posterior at ``q`` points costs :math:`O(q D^2)` whatever the number of
observations. Prints the best value found after each round.

Needs BoTorch (``pip install "rfgp[botorch]"``); without it the script says so and stops.
Run: ``python examples/bayesopt.py`` (about half a minute on two cores).
``RFGP_EXAMPLES_FAST=1`` runs three small rounds.
"""

import importlib.util
import math
import os

import torch

from rfgp import RandomFeatureGP
from rfgp.kernels import FourierFeatureKernel

FAST = os.environ.get("RFGP_EXAMPLES_FAST") == "1"
LOW, HIGH = torch.tensor([-5.0, 0.0]), torch.tensor([10.0, 15.0])


def branin(u: torch.Tensor) -> torch.Tensor:
    """Branin on the unit square (rescaled to its domain)."""
    a, b = (LOW + u * (HIGH - LOW)).to(u).unbind(-1)
    return ((b - 5.1 / (4 * math.pi**2) * a**2 + 5 / math.pi * a - 6) ** 2
            + 10 * (1 - 1 / (8 * math.pi)) * torch.cos(a) + 10)


def main() -> float:
    if importlib.util.find_spec("botorch") is None:
        print('This example needs BoTorch: pip install "rfgp[botorch]"')
        return math.nan
    from botorch.acquisition import LogExpectedImprovement
    from botorch.optim import optimize_acqf

    from rfgp.botorch import RandomFeatureModel

    rounds = 3 if FAST else 20
    generator = torch.Generator().manual_seed(0)
    x = torch.rand(8, 2, generator=generator, dtype=torch.float64)  # the unit square
    y = branin(x)
    bounds = torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=torch.float64)
    for round_ in range(rounds):
        # BoTorch maximises: the GP models -branin, standardised (its prior mean is zero).
        target = (-y - (-y).mean()) / y.std()
        kernel = FourierFeatureKernel(128 if FAST else 512, sampling="orthogonal", seed=round_)
        gp = RandomFeatureGP(kernel.double(), noise=1e-3)
        gp.optimize_hyperparameters(x, target, num_iterations=10 if FAST else 50)
        acquisition = LogExpectedImprovement(RandomFeatureModel(gp), best_f=target.max())
        batch, _ = optimize_acqf(acquisition, bounds, q=1, num_restarts=2 if FAST else 8,
                                 raw_samples=32 if FAST else 256)
        x, y = torch.cat([x, batch.detach()]), torch.cat([y, branin(batch.detach())])
        print(f"round {round_ + 1}: {x.shape[0]} evaluations, best value {float(y.min()):.4f}"
              " (optimum 0.3979)")
    return float(y.min())


if __name__ == "__main__":
    main()
