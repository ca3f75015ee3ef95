"""Tests of alpha (and lengthscale) selection on a validation split: fresh candidates."""

import gpytorch
import pytest
import torch

from rfgp import DirichletGPClassifier
from rfgp.classification import select_alpha
from rfgp.kernels import FourierFeatureKernel
from tests.classification.data import THREE_CENTRES, blobs


def test_select_alpha_picks_minimum_validation_mnll():
    x, y = blobs(25, THREE_CENTRES, 0.7, seed=24)
    kernel = FourierFeatureKernel(256, seed=0).double()
    clf = DirichletGPClassifier(kernel, seed=0)
    clf.select_alpha(x, y, alphas=(1e-3, 1e-2, 1e-1), lengthscales=(0.5, 1.0, 3.0),
                     validation_fraction=0.2, seed=1)
    rows = clf.selection_
    assert len(rows) == 9
    best = min(rows, key=lambda r: r["mnll"])
    assert [r for r in rows if r["selected"]] == [best]
    assert clf.alpha_epsilon == best["alpha_epsilon"]
    assert kernel.lengthscale.item() == pytest.approx(best["lengthscale"])
    assert clf.gp.num_data == 75  # refitted on all data
    # marginal likelihood picks the lengthscale per alpha; alpha still by validation MNLL
    clf.select_alpha(x, y, alphas=(1e-2, 1e-1), lengthscales=(0.5, 1.0, 3.0),
                     lengthscale_criterion="marginal_likelihood", seed=1)
    rows = clf.selection_
    chosen = [r for r in rows if r["selected"]][0]
    same_alpha = [r for r in rows if r["alpha_epsilon"] == chosen["alpha_epsilon"]]
    assert chosen["log_marginal_likelihood"] == max(r["log_marginal_likelihood"]
                                                    for r in same_alpha)



def test_select_alpha_fits_fresh_candidates_and_leaves_the_template_alone():
    from rfgp.datasets import train_test_split
    from rfgp.metrics import mnll_classification

    x, y = blobs(20, THREE_CENTRES, 0.7, seed=40)
    kernel = FourierFeatureKernel(128, seed=0).double()
    kernel.lengthscale = 0.7
    clf = DirichletGPClassifier(kernel, alpha_epsilon=0.3, seed=0).fit(x, y)
    before = clf.predict_proba(x, method="mean_field")
    best, rows = select_alpha(clf, x, y, alphas=(1e-3, 1e-1), lengthscales=(0.5, 2.0),
                              validation_fraction=0.25, seed=3)
    # the template is untouched: same settings, same kernel, same fit
    assert clf.alpha_epsilon == 0.3 and kernel.lengthscale.item() == pytest.approx(0.7)
    torch.testing.assert_close(clf.predict_proba(x, method="mean_field"), before)
    # the winner is a separate model with its own kernel copy and the selected settings
    chosen = [r for r in rows if r["selected"]]
    assert len(chosen) == 1 and best is not clf and best.kernel is not kernel
    assert best.alpha_epsilon == chosen[0]["alpha_epsilon"]
    assert best.kernel.lengthscale.item() == pytest.approx(chosen[0]["lengthscale"])
    assert chosen[0]["mnll"] == min(r["mnll"] for r in rows)
    # it was fitted on the training part and scored on the validation part
    x_tr, y_tr, x_val, y_val = train_test_split(x, y, 0.25, torch.Generator().manual_seed(3))
    assert best.gp.num_data == x_tr.shape[0]
    score = mnll_classification(best.predict_proba(x_val, method="mean_field"), y_val)
    assert float(score) == pytest.approx(chosen[0]["mnll"], rel=1e-12)


def test_select_alpha_failure_leaves_the_classifier_as_it_was(monkeypatch):
    x, y = blobs(15, THREE_CENTRES, 0.7, seed=41)
    kernel = FourierFeatureKernel(64, seed=0).double()
    clf = DirichletGPClassifier(kernel, alpha_epsilon=0.2, seed=0).fit(x, y)
    before = clf.predict_proba(x, method="mean_field")
    ls_before = kernel.lengthscale.clone()
    calls = {"n": 0}
    original = DirichletGPClassifier.fit

    def failing_fit(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("candidate failed")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(DirichletGPClassifier, "fit", failing_fit)
    with pytest.raises(RuntimeError, match="candidate failed"):
        clf.select_alpha(x, y, alphas=(1e-2, 1e-1), lengthscales=(0.5, 2.0))
    monkeypatch.undo()
    assert clf.alpha_epsilon == 0.2 and torch.equal(kernel.lengthscale, ls_before)
    torch.testing.assert_close(clf.predict_proba(x, method="mean_field"), before)


def test_select_alpha_without_refit_asks_for_a_fit():
    x, y = blobs(15, THREE_CENTRES, 0.7, seed=42)
    clf = DirichletGPClassifier(FourierFeatureKernel(64, seed=0).double(), alpha_epsilon=0.7,
                                seed=0).fit(x, y)
    clf.select_alpha(x, y, alphas=(1e-3, 1e-2), refit=False)
    assert clf.alpha_epsilon in (1e-3, 1e-2)
    with pytest.raises(RuntimeError, match="changed since fit"):
        clf.predict_proba(x)


def test_select_alpha_bad_arguments():
    x, y = blobs(6, THREE_CENTRES, 0.7, seed=43)
    clf = DirichletGPClassifier(gpytorch.kernels.RBFKernel().double())
    with pytest.raises(ValueError, match="validation_fraction"):
        clf.select_alpha(x, y, validation_fraction=1.5)
    with pytest.raises(ValueError, match="alphas"):
        clf.select_alpha(x, y, alphas=(0.1, -1.0))
    with pytest.raises(ValueError, match="lengthscale_criterion"):
        clf.select_alpha(x, y, lengthscale_criterion="aic")
    with pytest.raises(ValueError, match="no lengthscale"):
        DirichletGPClassifier(gpytorch.kernels.LinearKernel().double()).select_alpha(
            x, y, lengthscales=(1.0,))
    with pytest.raises(TypeError, match="classifier must be a DirichletGPClassifier"):
        select_alpha("clf", x, y)


def test_a_split_that_loses_a_class_is_named_with_the_counts():
    x = torch.randn(4, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    labels = torch.tensor([0, 0, 1, 1])
    clf = DirichletGPClassifier(FourierFeatureKernel(16, seed=0).double())
    # seed 0 puts both rows of one class into the validation half.
    with pytest.raises(ValueError, match=r"training part of the validation split "
                                         r"\(validation_fraction=0.5, seed=0\) holds 2 of 4 rows, "
                                         r"all of class [01].*\{0: 2, 1: 2\}.*lower "
                                         r"validation_fraction"):
        select_alpha(clf, x, labels, validation_fraction=0.5, seed=0)


def test_the_selected_candidate_predicts_the_users_class_ids():
    x, y = blobs(15, THREE_CENTRES[:2], 0.4, seed=3)
    ids = torch.tensor([-7, 1000])
    clf = DirichletGPClassifier(FourierFeatureKernel(64, seed=0).double(), seed=0)
    best, _ = select_alpha(clf, x, ids[y], alphas=(0.1,), validation_fraction=0.2)
    assert torch.equal(best.classes_, ids)
    # Its probabilities are those of class indices 0, 1 in id order; predict maps them to ids.
    predicted = best.predict(x, method="mean_field")
    proba = best.predict_proba(x, method="mean_field")
    assert torch.equal(predicted, ids[proba.argmax(-1)])
