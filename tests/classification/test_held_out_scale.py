"""The outputscale factor chosen by the held-out NLL is at that NLL's minimum."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from rfgp.classification._held_out import held_out_cost, held_out_nll, held_out_statistics
from rfgp.classification._held_out_scale import (
    LOG_FACTOR_TOLERANCE,
    SCALE_EVALUATIONS,
    held_out_scale,
    held_out_scale_cost,
)
from rfgp.recipes._start import make_ard_kernel
from tests.classification.data import THREE_CENTRES, blobs

# Two exact computations of one posterior (the factor on the Gram matrices against the
# factor in the kernel's outputscale) agree to rounding; test_held_out.py compares two such
# computations at this relative tolerance.
SAME = 1e-8


def _split(per_class, seed):
    x, labels = blobs(per_class, THREE_CENTRES, 0.8, seed=seed)
    split = x.shape[0] - x.shape[0] // 4
    return x[:split], labels[:split], x[split:], labels[split:]


def _nll_at(kernel, factor, data, alpha):
    scaled = copy.deepcopy(kernel)
    scaled.outputscale = kernel.outputscale.detach() * factor
    return float(held_out_nll(scaled, *data, 3, (alpha,))[0])


@pytest.mark.parametrize("num_features, per_class, outputscale", [
    (64, 40, 2.5),     # weight space (90 training rows, 64 features), the minimum above 1
    (64, 40, 400.0),   # the same, started far above it: the bracket grows downwards
    (256, 30, 0.05),   # function space (67 training rows, 256 features)
])
def test_the_chosen_factor_is_at_the_held_out_minimum(num_features, per_class, outputscale):
    data = _split(per_class, seed=2)
    kernel = make_ard_kernel(num_features, 2, seed=1)
    kernel.base_kernel.lengthscale = torch.tensor([[0.7, 1.3]], dtype=torch.float64)
    kernel.outputscale = outputscale
    alpha = 0.01
    statistics = held_out_statistics(kernel, *data, 3)
    choice = held_out_scale(statistics, alpha)
    at_factor = _nll_at(kernel, choice.factor, data, alpha)
    # its NLL is the classifier's at that outputscale, and no higher than at the factor 1
    assert choice.nll == pytest.approx(at_factor, rel=SAME)
    assert choice.nll <= choice.evaluations[1.0]
    # a minimum: 10% either way (the search's tolerance in log a) is not lower, to rounding
    assert LOG_FACTOR_TOLERANCE <= 0.1
    for step in (-0.1, 0.1):
        assert _nll_at(kernel, choice.factor * math.exp(step), data, alpha) >= (
            at_factor * (1 - SAME))
    # the search moved where the start was far from the minimum
    if outputscale == 400.0:
        assert choice.factor < math.exp(-1)


def test_a_given_nll_at_the_factor_one_is_not_recomputed():
    data = _split(40, seed=3)
    kernel = make_ard_kernel(64, 2, seed=0)
    statistics = held_out_statistics(kernel, *data, 3)
    known = float(statistics.nll(0.1))
    fresh = held_out_scale(statistics, 0.1)
    given = held_out_scale(statistics, 0.1, at_one=known)
    assert given.evaluations == fresh.evaluations  # the same search, to the bit
    assert given.factor == fresh.factor


def test_the_statistics_scale_like_the_outputscale():
    # The factor a on the outputscale is sqrt(a) on the features: the NLL of the statistics at
    # a equals the NLL of the kernel with a times its outputscale, at every alpha.
    data = _split(40, seed=4)
    kernel = make_ard_kernel(64, 2, seed=2)
    kernel.outputscale = 1.7
    statistics = held_out_statistics(kernel, *data, 3, chunk_rows=13)
    for alpha in (1e-3, 0.3):
        for factor in (0.01, 3.0):
            assert float(statistics.nll(alpha, factor)) == pytest.approx(
                _nll_at(kernel, factor, data, alpha), rel=SAME)


def test_the_scale_cost_is_its_evaluations_of_the_per_alpha_cost():
    for n, held, d in ((1000, 100, 256), (100, 10, 4096)):  # weight space, function space
        per_alpha = held_out_cost(n, held, d, 4, 1) - held_out_cost(n, held, d, 4, 0)
        assert held_out_scale_cost(n, held, d, 4) == pytest.approx(SCALE_EVALUATIONS * per_alpha)


def test_the_factor_stops_at_the_range_where_the_nll_falls_all_the_way():
    from rfgp.classification._held_out_scale import LOG_FACTOR_RANGE

    # An outputscale of 1e-7: the held-out minimum lies beyond exp(12) times it.
    data = _split(40, seed=2)
    kernel = make_ard_kernel(64, 2, seed=1)
    kernel.base_kernel.lengthscale = torch.tensor([[0.7, 1.3]], dtype=torch.float64)
    kernel.outputscale = 1e-7
    choice = held_out_scale(held_out_statistics(kernel, *data, 3), 0.01)
    assert choice.factor == pytest.approx(math.exp(LOG_FACTOR_RANGE), rel=1e-12)
    below = _nll_at(kernel, choice.factor * math.exp(-0.1), data, 0.01)
    assert below >= choice.nll * (1 - SAME)
