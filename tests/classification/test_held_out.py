"""The held-out NLL of many alphas from one pass over the rows equals fitting each."""

from __future__ import annotations

import pytest
import torch

from rfgp.classification import DirichletGPClassifier
from rfgp.classification._held_out import held_out_cost, held_out_nll, held_out_statistics
from rfgp.recipes._start import make_ard_kernel
from tests.classification.data import THREE_CENTRES, blobs

ALPHAS = (1e-4, 1e-2, 0.3)


def _fitted_nll(kernel, x_train, y_train, x_valid, y_valid, alpha):
    clf = DirichletGPClassifier(kernel, alpha_epsilon=alpha, num_classes=3, outputscale=1.0)
    log_proba = clf.fit(x_train, y_train).predict_log_proba(x_valid, method="mean_field")
    return float(-log_proba.gather(1, y_valid.reshape(-1, 1)).mean())


@pytest.mark.parametrize("num_features, per_class", [(64, 40), (256, 30)])  # N > D, N < D
def test_held_out_nll_equals_a_fit_per_alpha(num_features, per_class):
    x, labels = blobs(per_class, THREE_CENTRES, 0.8, seed=2)
    kernel = make_ard_kernel(num_features, 2, seed=1)
    kernel.base_kernel.lengthscale = torch.tensor([[0.7, 1.3]], dtype=torch.float64)
    kernel.outputscale = 2.5
    split = x.shape[0] - 20
    # A small chunk: the Gram matrices summed over several chunks.
    ours = held_out_nll(kernel, x[:split], labels[:split], x[split:], labels[split:], 3, ALPHAS,
                        chunk_rows=17)
    theirs = [_fitted_nll(kernel, x[:split], labels[:split], x[split:], labels[split:], a)
              for a in ALPHAS]
    # Two exact computations of the same posterior (weight space against the classifier's
    # own solve): equal to rounding.
    torch.testing.assert_close(ours, torch.tensor(theirs, dtype=torch.float64), rtol=1e-8,
                               atol=1e-10)


@pytest.mark.parametrize("num_features, per_class", [(64, 40), (256, 30)])  # N > D, N < D
def test_the_per_row_nll_is_the_fitted_classifiers_row_by_row(num_features, per_class):
    x, labels = blobs(per_class, THREE_CENTRES, 0.8, seed=5)
    kernel = make_ard_kernel(num_features, 2, seed=3)
    kernel.outputscale = 0.7
    split = x.shape[0] - 20
    data = (x[:split], labels[:split], x[split:], labels[split:])
    statistics = held_out_statistics(kernel, *data, 3)
    rows = statistics.row_nll(0.05)
    clf = DirichletGPClassifier(kernel, alpha_epsilon=0.05, num_classes=3, outputscale=1.0)
    log_proba = clf.fit(*data[:2]).predict_log_proba(data[2], method="mean_field")
    # each row is -log p(true class) of the same posterior (two exact solves: rounding apart)
    torch.testing.assert_close(rows, -log_proba.gather(1, data[3].reshape(-1, 1)).squeeze(1),
                               rtol=1e-8, atol=1e-10)
    assert bool(rows.mean() == statistics.nll(0.05))  # the mean is the NLL, to the bit


@pytest.mark.parametrize("num_features", [32, 128])  # weight space, function space
def test_a_class_absent_from_the_training_rows_keeps_its_prior(num_features):
    x, labels = blobs(30, THREE_CENTRES, 0.8, seed=3)
    train = labels != 2
    kernel = make_ard_kernel(num_features, 2, seed=0)
    ours = held_out_nll(kernel, x[train], labels[train], x[~train], labels[~train], 3, (0.01,))
    theirs = _fitted_nll(kernel, x[train], labels[train], x[~train], labels[~train], 0.01)
    assert float(ours[0]) == pytest.approx(theirs, rel=1e-8)


def test_held_out_cost_counts_one_gram_for_every_alpha():
    one, six = held_out_cost(1000, 100, 256, 4, 1), held_out_cost(1000, 100, 256, 4, 6)
    gram = 2 * 1000 * 256**2
    assert six - gram == pytest.approx(6 * (one - gram))
    # on fewer rows than features, the kernel matrices: N_t plays the part of D
    one, six = held_out_cost(100, 10, 4096, 4, 1), held_out_cost(100, 10, 4096, 4, 6)
    kernel = 100 * 110 * 4096
    assert six - kernel == pytest.approx(6 * (one - kernel))
    assert one - kernel == pytest.approx(4 * (100**3 / 3 + 10 * 100**2))
