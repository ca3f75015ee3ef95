"""The outputscale factor chosen by the held-out NLL: at that NLL's minimum where the rows
resolve it, and the factor nearest 1 among those they cannot tell apart."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from rfgp.classification._held_out import held_out_cost, held_out_nll, held_out_statistics
from rfgp.classification._held_out_scale import (
    FIRST_STEP,
    LOG_FACTOR_RANGE,
    LOG_FACTOR_TOLERANCE,
    SCALE_EVALUATIONS,
    held_out_scale,
    held_out_scale_cost,
    paired_standard_error,
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


class _Curve:
    """A synthetic held-out statistic: row ``n`` at ``t = log a`` has the NLL
    ``curve(t) + e_n t``, with ``e`` of mean exactly 0 and sample standard deviation
    ``spread``: the mean is ``curve(t)`` and the paired standard error of ``t`` against ``u``
    is ``spread |t - u| / sqrt(rows)``."""

    def __init__(self, curve, spread, rows=1000, seed=0):
        e = torch.randn(rows, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
        self.curve, self.e = curve, (e - e.mean()) / e.std() * spread

    def row_nll(self, alpha, factor):
        t = math.log(factor)
        return self.curve(t) + self.e * t


class _Pooled:
    """``statistics`` with every row at the mean NLL: the paired standard error of any two
    factors is 0, and the search is the plain golden section."""

    def __init__(self, statistics):
        self.statistics = statistics

    def row_nll(self, alpha, factor):
        rows = self.statistics.row_nll(alpha, factor)
        return rows.mean().expand(rows.shape)


@pytest.mark.parametrize("num_features, per_class, outputscale", [
    (64, 40, 2.5),     # weight space (90 training rows, 64 features), the minimum above 1
    (64, 40, 400.0),   # the same, started far above it: the bracket grows downwards
    (256, 30, 0.05),   # function space (67 training rows, 256 features)
])
def test_without_an_error_the_chosen_factor_is_at_the_held_out_minimum(num_features, per_class,
                                                                      outputscale):
    data = _split(per_class, seed=2)
    kernel = make_ard_kernel(num_features, 2, seed=1)
    kernel.base_kernel.lengthscale = torch.tensor([[0.7, 1.3]], dtype=torch.float64)
    kernel.outputscale = outputscale
    alpha = 0.01
    choice = held_out_scale(_Pooled(held_out_statistics(kernel, *data, 3)), alpha)
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


@pytest.mark.parametrize("num_features, per_class, outputscale", [
    (64, 40, 2.5), (64, 40, 400.0), (256, 30, 0.05)])
def test_the_chosen_factor_is_the_nearest_one_within_its_error_of_the_best(
        num_features, per_class, outputscale):
    # 30 validation rows: their paired errors (0.004 to 0.012 here) are not small
    data = _split(per_class, seed=2)
    kernel = make_ard_kernel(num_features, 2, seed=1)
    kernel.base_kernel.lengthscale = torch.tensor([[0.7, 1.3]], dtype=torch.float64)
    kernel.outputscale = outputscale
    statistics = held_out_statistics(kernel, *data, 3)
    choice = held_out_scale(statistics, 0.01)
    assert choice.nll == pytest.approx(_nll_at(kernel, choice.factor, data, 0.01), rel=SAME)
    assert choice.nll <= choice.evaluations[1.0]
    best = min(choice.evaluations, key=choice.evaluations.__getitem__)
    rows = {factor: statistics.row_nll(0.01, factor) for factor in choice.evaluations}

    def tied(factor):
        return choice.evaluations[factor] - choice.evaluations[best] <= (
            paired_standard_error(rows[factor], rows[best]))

    assert tied(choice.factor)
    # every evaluated factor nearer 1 is told apart from the best (or above the factor 1)
    for factor, nll in choice.evaluations.items():
        if abs(math.log(factor)) < abs(math.log(choice.factor)):
            assert not tied(factor) or nll > choice.evaluations[1.0]
    if outputscale == 400.0:  # the fall from 400 is far larger than its error
        assert choice.factor < math.exp(-1)


@pytest.mark.parametrize("minimum", [2.0, -1.5, 0.3])
def test_a_clear_interior_minimum_is_found_within_the_tolerance(minimum):
    # 0.05 (t - t*)^2 with rows of spread 0.01: the paired error of t against t* is
    # 3.2e-4 |t - t*|, below the curve's rise from 0.0064 on, and the factor 1 lies 0.2
    # (or 0.0045, at t* = 0.3) above the minimum, many times its error.
    statistics = _Curve(lambda t: 0.3 + 0.05 * (t - minimum) ** 2, spread=0.01)
    choice = held_out_scale(statistics, 0.01)
    assert abs(math.log(choice.factor) - minimum) <= LOG_FACTOR_TOLERANCE
    assert choice.nll == pytest.approx(0.3, abs=0.05 * LOG_FACTOR_TOLERANCE**2)


@pytest.mark.parametrize("curve, most", [
    (lambda t: 0.2 - 1e-5 * t, 0.0),                                # flat: the factor 1
    (lambda t: 0.2 + 0.1 * math.exp(-2 * t) - 1e-5 * t, 3.0),       # a real fall, then flat
])
def test_the_search_stops_where_the_nll_is_flat_within_its_error(curve, most):
    # Both curves fall all the way to the range's end: without an error (rows without
    # spread) the search runs to it; rows with spread 0.5 (paired error 0.016 |t - u|) stop
    # it where a step gains less than that, and the factor nearest 1 among the tied is kept.
    plain = held_out_scale(_Curve(curve, spread=0.0), 0.01)
    assert plain.factor == pytest.approx(math.exp(LOG_FACTOR_RANGE), rel=1e-12)
    statistics = _Curve(curve, spread=0.5)
    choice = held_out_scale(statistics, 0.01)
    t = math.log(choice.factor)
    assert 0.0 <= t <= most
    assert len(choice.evaluations) < len(plain.evaluations)
    # the chosen is within its paired error of every evaluated factor
    chosen = statistics.row_nll(0.01, choice.factor)
    for factor, nll in choice.evaluations.items():
        rows = statistics.row_nll(0.01, factor)
        assert choice.nll - nll <= paired_standard_error(chosen, rows) + 1e-12
    if most > 0:  # the fall from 1 to e^0.5 (0.063, against an error of 0.008) is followed
        assert t >= FIRST_STEP


def test_the_paired_standard_error_is_the_sample_deviation_of_the_differences():
    data = _split(40, seed=5)
    statistics = held_out_statistics(make_ard_kernel(64, 2, seed=3), *data, 3)
    rows, other = statistics.row_nll(0.01, 2.0), statistics.row_nll(0.01, 0.3)
    d = [float(x) - float(y) for x, y in zip(rows, other)]
    mean = sum(d) / len(d)
    direct = math.sqrt(sum((x - mean) ** 2 for x in d) / (len(d) - 1)) / math.sqrt(len(d))
    assert paired_standard_error(rows, other) == pytest.approx(direct, rel=1e-12)
    # paired: a difficulty common to both factors' rows cancels
    shift = torch.linspace(0, 5, rows.numel(), dtype=torch.float64)
    assert paired_standard_error(rows + shift, other + shift) == pytest.approx(direct, rel=1e-12)
    assert paired_standard_error(rows, rows) == 0.0
    # an infinite row NLL: no error can be told
    assert paired_standard_error(rows, torch.full_like(other, math.inf)) == 0.0


def test_a_given_nll_at_the_factor_one_is_not_recomputed():
    data = _split(40, seed=3)
    kernel = make_ard_kernel(64, 2, seed=0)
    statistics = held_out_statistics(kernel, *data, 3)
    known = statistics.row_nll(0.1)
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
    # the factor's evaluations and one more: the latent moments the temperature is chosen on
    for n, held, d in ((1000, 100, 256), (100, 10, 4096)):  # weight space, function space
        per_alpha = held_out_cost(n, held, d, 4, 1) - held_out_cost(n, held, d, 4, 0)
        assert held_out_scale_cost(n, held, d, 4) == pytest.approx(
            (SCALE_EVALUATIONS + 1) * per_alpha)


def test_the_factor_stops_at_the_range_where_the_nll_falls_all_the_way():
    # An outputscale of 1e-7: the held-out minimum lies beyond exp(12) times it.
    data = _split(40, seed=2)
    kernel = make_ard_kernel(64, 2, seed=1)
    kernel.base_kernel.lengthscale = torch.tensor([[0.7, 1.3]], dtype=torch.float64)
    kernel.outputscale = 1e-7
    choice = held_out_scale(held_out_statistics(kernel, *data, 3), 0.01)
    assert choice.factor == pytest.approx(math.exp(LOG_FACTOR_RANGE), rel=1e-12)
    below = _nll_at(kernel, choice.factor * math.exp(-0.1), data, 0.01)
    assert below >= choice.nll * (1 - SAME)
