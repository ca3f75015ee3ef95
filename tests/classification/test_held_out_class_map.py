"""The per-class map of the latents: its maximum-likelihood fit, the cross-validated choice
against the temperature, and the classifier's attribute."""

from __future__ import annotations

import math
import pickle

import pytest
import torch

from rfgp.classification import DirichletGPClassifier, softmax_expectation
from rfgp.classification._held_out_class_map import (
    SCALE_RANGE,
    fit_class_map,
    held_out_class_map,
)
from rfgp.classification._held_out_temperature import held_out_temperature
from rfgp.kernels import FourierFeatureKernel
from rfgp.recipes import ClassifierFitReport, fit_classifier_auto
from tests.classification.data import fitted_binary

DT = torch.float64


def _draw(n, scales, offsets, seed):
    """Latent means g (no variance) and labels drawn from softmax(s * g + o)."""
    g = torch.Generator().manual_seed(seed)
    means = 1.5 * torch.randn(n, len(scales), generator=g, dtype=DT)
    truth = torch.softmax(means * torch.tensor(scales, dtype=DT)
                          + torch.tensor(offsets, dtype=DT), -1)
    labels = torch.multinomial(truth, 1, generator=g).squeeze(1)
    return means, labels


def _standard_errors(means, labels, scales, offsets):
    """Standard errors of (log s, o) from the observed information of the total NLL (the
    inverse Hessian at the estimate), with o's common shift fixed by sum(o) = 0."""
    c = means.shape[1]
    basis = torch.eye(c, dtype=DT)[:, :-1] - 1.0 / c  # centred offsets: o = basis @ z

    def total(params):
        log_s, z = params[:c], params[c:]
        logits = log_s.exp() * means + basis @ z
        return -torch.log_softmax(logits, -1).gather(1, labels.reshape(-1, 1)).sum()

    z = torch.linalg.lstsq(basis, offsets.reshape(-1, 1)).solution.reshape(-1)
    hessian = torch.autograd.functional.hessian(total, torch.cat([scales.log(), z]))
    cov = torch.linalg.inv(hessian)
    log_s_se = cov.diagonal()[:c].sqrt()
    offset_se = (basis @ cov[c:, c:] @ basis.T).diagonal().sqrt()
    return log_s_se, offset_se


def test_the_fit_recovers_a_known_map_within_its_standard_errors():
    # Labels from softmax(s g + o), the latents' variances zero (the mean-field probabilities
    # are then the softmax itself): the maximum-likelihood map is consistent, within a few
    # standard errors of the observed information.
    s_true, o_true = [0.6, 1.0, 2.0], [0.4, -0.1, -0.3]
    means, labels = _draw(20000, s_true, o_true, 0)
    scales, offsets, converged = fit_class_map(means, torch.zeros_like(means), labels, 1.0)
    assert converged
    assert abs(float(offsets.sum())) < 1e-10
    log_se, o_se = _standard_errors(means, labels, scales, offsets)
    assert bool(((scales.log() - torch.tensor(s_true, dtype=DT).log()).abs() <= 4 * log_se).all())
    assert bool(((offsets - torch.tensor(o_true, dtype=DT)).abs() <= 4 * o_se).all())


def test_the_map_is_chosen_where_the_classes_scales_differ():
    means, labels = _draw(4000, [0.5, 2.0], [0.3, -0.3], 1)
    zero = torch.zeros_like(means)
    choice = held_out_class_map(means, zero, labels, held_out_temperature(means, zero, labels))
    assert choice.scales is not None and choice.offsets is not None
    assert choice.cv_nll["class_map"] < choice.cv_nll["temperature"]
    assert 2.5 < float(choice.scales[1] / choice.scales[0]) < 6.0  # 4 within its error


def test_a_true_temperature_keeps_the_temperature():
    # Labels from softmax(g / 0.8) in 10 classes: the map's 18 extra numbers gain nothing out
    # of sample; the in-sample gain stays within Akaike's 18 nats or the folds reject it.
    means, labels = _draw(2000, [1.25] * 10, [0.0] * 10, 2)
    zero = torch.zeros_like(means)
    temperature = held_out_temperature(means, zero, labels)
    choice = held_out_class_map(means, zero, labels, temperature)
    assert choice.scales is None and choice.offsets is None
    assert abs(math.log(temperature.temperature / 0.8)) < 0.2


def test_rows_without_error_give_no_map():
    # Every row of its most probable class: no temperature is bracketed, so no map either.
    g = torch.Generator().manual_seed(3)
    means = torch.randn(300, 3, generator=g, dtype=DT)
    labels = means.argmax(-1)
    zero = torch.full_like(means, 0.01)
    temperature = held_out_temperature(means, zero, labels)
    assert temperature.temperature == 1.0
    choice = held_out_class_map(means, zero, labels, temperature)
    assert choice.scales is None and choice.cv_nll == {}


def test_a_class_without_error_gives_no_map():
    # Class 2 is separated from the others by the sign of its latent, by a small margin: its
    # scale has no finite maximum, and before the likelihood flattens (a gradient near
    # exp(-s m) for the margin m) the fit ends on a slope or past the allowed range. The
    # temperature stays. (With a wide margin the likelihood is flat at a moderate scale, and
    # the map is a maximum in all but name; latents with variances saturate there anyway.)
    g = torch.Generator().manual_seed(4)
    means = torch.randn(3000, 3, generator=g, dtype=DT)
    labels = torch.multinomial(torch.softmax(means[:, :2], -1), 1, generator=g).squeeze(1)
    top = torch.rand(3000, generator=g, dtype=DT) < 0.3
    labels[top] = 2
    # Class 2's latent is +0.2 on its rows and -0.2 on the rest (the others' are N(0, 1)):
    # raising its scale raises every row's likelihood, without limit.
    means[:, 2] = torch.where(top, 0.2, -0.2)
    zero = torch.zeros_like(means)
    temperature = held_out_temperature(means, zero, labels)
    scales, _, converged = fit_class_map(means, zero, labels, 1.0 / temperature.temperature)
    assert not converged or float((scales * temperature.temperature).max()) > SCALE_RANGE
    assert int((scales * temperature.temperature).argmax()) == 2  # the one that ran off
    assert held_out_class_map(means, zero, labels, temperature).scales is None


def test_the_probabilities_are_the_softmax_of_the_mapped_latents():
    clf, x = fitted_binary()
    mean, var = clf._latent_moments(x[:20])
    s, o = torch.tensor([0.7, 1.6], dtype=DT), torch.tensor([0.2, -0.2], dtype=DT)
    clf.class_map = (s, o)  # no refit: the posterior is unchanged
    clf.temperature = 0.5
    expected = softmax_expectation((mean * s + o) / 0.5, var * s * s / 0.25,
                                   method="mean_field")
    torch.testing.assert_close(clf.predict_proba(x[:20], method="mean_field"), expected,
                               rtol=1e-12, atol=0)
    restored = pickle.loads(pickle.dumps(clf))
    torch.testing.assert_close(restored.class_map[0], s, rtol=0, atol=0)
    torch.testing.assert_close(restored.predict_proba(x[:20], method="mean_field"), expected,
                               rtol=1e-12, atol=0)
    clf.class_map, clf.temperature = None, 1.0  # back to the model's own map
    torch.testing.assert_close(clf.predict_proba(x[:20], method="mean_field"),
                               softmax_expectation(mean, var, method="mean_field"),
                               rtol=1e-12, atol=0)
    # A classifier pickled before the map existed reads as having none.
    state = clf.__getstate__()
    del state["_class_map"]
    old = DirichletGPClassifier.__new__(DirichletGPClassifier)
    old.__setstate__(state)
    assert old.class_map is None


@pytest.mark.parametrize("bad", [
    "scales", ([1.0, 2.0],), ([1.0, 0.0], [0.0, 0.0]), ([1.0, -1.0], [0.0, 0.0]),
    ([1.0, math.nan], [0.0, 0.0]), ([1.0, 1.0], [0.0, math.inf]), ([1.0, 1.0], [0.0]),
    ([[1.0, 1.0]], [[0.0, 0.0]]), ([1.0], [0.0]), ([1.0, 1.0], [1j, 0.0]),
    ([1.0, 1.0], ["a", "b"]), ([True, True], [0.0, 0.0]),
])
def test_a_bad_class_map_is_refused_by_name(bad):
    with pytest.raises((TypeError, ValueError), match="class_map"):
        DirichletGPClassifier(FourierFeatureKernel(8, seed=0), class_map=bad)
    clf, _ = fitted_binary()
    with pytest.raises((TypeError, ValueError), match="class_map"):
        clf.class_map = bad
    assert clf.class_map is None  # a refused value leaves the attribute as it was


def test_a_map_of_the_wrong_length_is_refused_at_prediction():
    clf, x = fitted_binary()
    clf.class_map = ([1.0, 1.0, 1.0], [0.0, 0.0, 0.0])
    with pytest.raises(ValueError, match="class_map has 3 entries.*2 classes"):
        clf.predict_proba(x[:3])


def test_the_recipe_gives_the_classifier_the_map_its_choice_reports():
    # Unequal classes (about 1 in 5 of class 1) whose two latents the transform distorts
    # differently; whatever the choice, the classifier carries what the report says.
    g = torch.Generator().manual_seed(6)
    x = torch.randn(1500, 2, generator=g, dtype=DT)
    labels = (x[:, 0] + 0.4 * x[:, 1] ** 2 + 0.7 * torch.randn(1500, generator=g, dtype=DT)
              > 1.2).long()
    report = ClassifierFitReport()
    clf = fit_classifier_auto(x, labels, num_features=128, seed=0, report=report)
    chosen = report.choice["class_map"]
    if chosen is None:
        assert clf.class_map is None and clf.temperature == report.choice["temperature"]
    else:
        assert clf.temperature == 1.0
        torch.testing.assert_close(clf.class_map[0], chosen[0].to(DT), rtol=0, atol=0)
        torch.testing.assert_close(clf.class_map[1], chosen[1].to(DT), rtol=0, atol=0)
        cv = report.choice["class_map_cv_nll"]
        assert cv["class_map"] < cv["temperature"]
