"""The probabilities' temperature: the held-out choice and the classifier's attribute."""

from __future__ import annotations

import math
import pickle

import pytest
import torch

from rfgp.classification import DirichletGPClassifier, softmax_expectation
from rfgp.classification._held_out_temperature import held_out_temperature
from rfgp.kernels import FourierFeatureKernel
from rfgp.recipes import ClassifierFitReport, fit_classifier_auto
from tests.classification.data import fitted_binary

DT = torch.float64


def _labels_from(logits: torch.Tensor, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.multinomial(torch.softmax(logits, -1), 1, generator=g).squeeze(1)


@pytest.mark.parametrize("multiple", [0.5, 3.0])
def test_the_chosen_temperature_undoes_a_known_multiple_of_the_log_odds(multiple):
    # Labels drawn from softmax(g); the model's latent means are m g with no variance. The
    # NLL is a proper scoring rule, so its expectation is least at T = m; 20,000 rows place
    # it within the search's 10% in log T and the paired error's resolution (about 3%).
    g = torch.Generator().manual_seed(1)
    logits = 1.5 * torch.randn(20000, 3, generator=g, dtype=DT)
    labels = _labels_from(logits, 2)
    choice = held_out_temperature(multiple * logits, torch.zeros_like(logits), labels)
    assert abs(math.log(choice.temperature / multiple)) <= 0.2
    assert choice.nll <= choice.evaluations[1.0]


def test_the_temperature_is_the_held_out_minimum_even_within_its_paired_error():
    # 400 rows at m = 0.85: the gain of T = 0.85 over T = 1 is below its paired standard
    # error, which would keep T = 1 under the outputscale factor's rule; the temperature is
    # the held-out rows' maximum likelihood value, the lowest NLL evaluated.
    g = torch.Generator().manual_seed(5)
    logits = 1.5 * torch.randn(400, 2, generator=g, dtype=DT)
    labels = _labels_from(logits, 6)
    choice = held_out_temperature(0.85 * logits, torch.zeros_like(logits), labels)
    assert choice.nll == min(choice.evaluations.values())
    assert choice.temperature == min(choice.evaluations, key=choice.evaluations.get)
    assert choice.temperature != 1.0


def test_rows_without_error_identify_no_temperature():
    # Every validation row is of its most probable class: the NLL falls towards T -> 0 without
    # a minimum, and the temperature stays 1 rather than sharpening without bound.
    g = torch.Generator().manual_seed(3)
    means = torch.randn(200, 2, generator=g, dtype=DT)
    labels = means.argmax(-1)
    choice = held_out_temperature(means, torch.full_like(means, 0.01), labels)
    assert choice.temperature == 1.0
    assert min(choice.evaluations) < 1.0  # sharper ones were tried
    assert choice.nll == choice.evaluations[1.0]


def test_the_probabilities_are_the_softmax_of_the_latents_over_t():
    clf, x = fitted_binary()
    mean, var = clf._latent_moments(x[:20])
    one = clf.predict_proba(x[:20], method="mean_field")
    clf.temperature = 0.5  # no refit: the posterior is unchanged
    expected = softmax_expectation(mean / 0.5, var / 0.25, method="mean_field")
    torch.testing.assert_close(clf.predict_proba(x[:20], method="mean_field"), expected,
                               rtol=1e-12, atol=0)
    # sharper: the top probability of every row rises
    assert bool((clf.predict_proba(x[:20], method="mean_field").max(-1).values
                 >= one.max(-1).values - 1e-12).all())
    restored = pickle.loads(pickle.dumps(clf))
    assert restored.temperature == 0.5
    torch.testing.assert_close(restored.predict_proba(x[:20], method="mean_field"), expected,
                               rtol=1e-12, atol=0)


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf, "1", True, None])
def test_a_bad_temperature_is_refused_by_name(bad):
    with pytest.raises((TypeError, ValueError), match="temperature"):
        DirichletGPClassifier(FourierFeatureKernel(8, seed=0), temperature=bad)
    clf, _ = fitted_binary()
    with pytest.raises((TypeError, ValueError), match="temperature"):
        clf.temperature = bad
    assert clf.temperature == 1.0  # a refused value leaves the attribute as it was


def test_the_recipe_gives_the_classifier_the_temperature_its_choice_reports():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(400, 2, generator=g, dtype=DT)
    labels = (x[:, 0] * x[:, 1] + 0.3 * torch.randn(400, generator=g, dtype=DT) > 0).long()
    report = ClassifierFitReport()
    clf = fit_classifier_auto(x, labels, num_features=128, seed=0, report=report)
    # the classifier reads its probabilities at the temperature unless a per-class map,
    # which holds the scale, replaced it
    map_chosen = report.choice["class_map"] is not None
    assert clf.temperature == (1.0 if map_chosen else report.choice["temperature"])
    evaluations = report.choice["temperature_evaluations"]
    assert 1.0 in evaluations
    assert report.choice["temperature_nll"] == evaluations[report.choice["temperature"]]
    assert report.choice["temperature_nll"] <= evaluations[1.0]
