"""The evidence search along two paths: the direct L-BFGS path and the Adam warm-up path."""

from __future__ import annotations

import torch

from rfgp import RandomFeatureGP
from rfgp._initial import initial_hyperparameters
from rfgp.datasets import load_uci, standardize
from rfgp.recipes._search import maximize_evidence, two_path_search
from rfgp.recipes._start import make_ard_kernel, search_model
from tests.helpers import DT, gen


def _pumadyn(rows=1000):
    # 32 inputs of which a few matter: from the median-heuristic start (every lengthscale
    # near sqrt(32) standard deviations) the signal is smoothed away.
    x, y = load_uci("pumadyn32nm")
    x, _, _ = standardize(x[:rows])
    y, _, _ = standardize(y[:rows])
    return x, y


def test_two_paths_keep_the_higher_evidence_and_escape_a_flat_start():
    x, y = _pumadyn()
    start = initial_hyperparameters(x, y, generator=gen(0))
    direct = search_model(256, start, "rbf", 0, x)
    direct_result = maximize_evidence(direct, x, y, 200, 1e-4)
    both = search_model(256, start, "rbf", 0, x)
    result = two_path_search(both, x, y, 200, 1e-4)
    # The direct path is one of the two: the kept end is at least as good.
    assert min(result.losses) <= min(direct_result.losses) + 1e-12
    # Here the direct path stops at "all noise" (noise near the targets' variance, 1);
    # the warm-up path finds the signal.
    assert float(direct.noise) > 0.5
    assert float(both.noise) < 0.2


def test_two_path_search_ends_at_the_kept_paths_point():
    g = gen(1)
    x = torch.rand(150, 2, generator=g, dtype=DT)
    y = torch.sin(6 * x[:, 0]) + 0.1 * torch.randn(150, generator=g, dtype=DT)
    gp = RandomFeatureGP(make_ard_kernel(64, 2, seed=0), noise=0.3)
    result = two_path_search(gp, x, y - y.mean(), 200, 1e-6)
    # The model holds the hyperparameters of the kept path's best evaluation.
    kernel = gp.kernel
    with torch.no_grad():
        z = kernel.base_kernel.features(x) * kernel.outputscale.sqrt()
    from rfgp.inference._evidence import negative_log_evidence

    floor = 1e-6 * float((y - y.mean()).square().mean())
    loss = float(negative_log_evidence(z, (y - y.mean()).unsqueeze(-1), gp.noise)) / 150
    assert abs(loss - min(result.losses)) < 1e-6 + floor
