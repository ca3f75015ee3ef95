"""The classification recipe: the fixed-noise evidence, its gradient, the search and the refit."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch

from rfgp.classification import DirichletGPClassifier
from rfgp.inference._evidence_search import dirichlet_objective
from rfgp.inference._heteroscedastic_evidence import (
    heteroscedastic_negative_log_evidence,
    shared_weight_split,
)
from rfgp.likelihoods import dirichlet_transform
from rfgp.recipes import ClassifierFitReport, ClassifierOptions, fit_classifier_auto
from rfgp.recipes._classification import plan_classifier
from rfgp.recipes._schedule import default_budget
from rfgp.recipes._start import make_ard_kernel
from tests.classification.data import THREE_CENTRES, blobs

DTYPE = torch.float64


def _exact_nll(z, y, noise):
    """-log p(Y) from torch's multivariate normal density with K = Z Z^T + diag(s_t)."""
    n = z.shape[0]
    total = 0.0
    for t in range(y.shape[1]):
        cov = z @ z.T + torch.diag(noise[:, t])
        dist = torch.distributions.MultivariateNormal(torch.zeros(n, dtype=DTYPE), cov)
        total = total - dist.log_prob(y[:, t])
    return total


def _dirichlet_problem(n, width, num_classes=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, width, dtype=DTYPE, generator=g) / width**0.5
    labels = torch.randint(0, num_classes, (n,), generator=g)
    targets, noise = dirichlet_transform(labels, num_classes, 0.1)
    return z, targets - targets.mean(0), noise


@pytest.mark.parametrize("n, width", [(40, 8), (8, 40)])  # weight space, function space
def test_evidence_equals_gaussian_density_for_dirichlet_noise(n, width):
    z, y, noise = _dirichlet_problem(n, width)
    value = heteroscedastic_negative_log_evidence(z, y, noise)
    torch.testing.assert_close(value, _exact_nll(z, y, noise), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("n, width", [(30, 6), (6, 30)])
def test_evidence_equals_gaussian_density_for_arbitrary_noise(n, width):
    # Every entry distinct: no shared weight, each column's Gram built from all rows.
    g = torch.Generator().manual_seed(1)
    z = torch.randn(n, width, dtype=DTYPE, generator=g)
    y = torch.randn(n, 2, dtype=DTYPE, generator=g)
    noise = torch.rand(n, 2, dtype=DTYPE, generator=g) + 0.05
    value = heteroscedastic_negative_log_evidence(z, y, noise)
    torch.testing.assert_close(value, _exact_nll(z, y, noise), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("n, width", [(25, 6), (6, 25)])
def test_evidence_gradient_matches_finite_differences(n, width):
    z, y, noise = _dirichlet_problem(n, width, seed=2)
    noise = noise.clone()
    noise[0, 0] = 0.9  # a third value in one column: the correction rows are not one class
    z.requires_grad_(True)
    y.requires_grad_(True)
    assert torch.autograd.gradcheck(
        lambda a, b: heteroscedastic_negative_log_evidence(a, b, noise), (z, y)
    )


def test_shared_weight_split_reconstructs_the_weighted_gram():
    _, _, noise = _dirichlet_problem(50, 4)
    weights = noise.reciprocal()
    shared, rows = shared_weight_split(weights)
    for t, r in enumerate(rows):
        rebuilt = torch.full((50,), float(shared[t]), dtype=DTYPE)
        rebuilt[r] = weights[r, t]
        torch.testing.assert_close(rebuilt, weights[:, t], rtol=0, atol=0)
        assert 2 * r.numel() <= 50  # the Dirichlet columns share their "other class" weight


def test_evidence_rejects_bad_shapes():
    z, y, noise = _dirichlet_problem(10, 4)
    with pytest.raises(ValueError, match="noise"):
        heteroscedastic_negative_log_evidence(z, y, noise[:, :2])
    with pytest.raises(ValueError, match="z must have shape"):
        heteroscedastic_negative_log_evidence(z[:0], y[:0], noise[:0])


def _fit_with_calibration_cost(n, d, c):
    # The calibration: the Gram matrices and one eigendecomposition per class (or the kernel
    # matrix and N x N ones on fewer rows than features); then the cheaper fit.
    calibration = n * n * d + 2 * c * n**3 if n < d else 2 * n * d * d + 2 * c * d**3
    return calibration + min(2 * n * d * d + c * d**3 / 3, n * n * d + c * n**3 / 3)


def test_classifier_features_respect_the_final_share_of_the_budget():
    # A budget of 1e10 multiply-adds for the final fit: its 40% share of 0.25 s at 1e11 / s.
    options = ClassifierOptions(time_budget=0.25, machine_rate=1e11,
                                select_alpha=False).checked()
    budget = 1e10
    previous = None
    for n in (100, 1000, 10_000, 100_000):
        d = plan_classifier(n, 2, 10, options).num_features
        assert d == 512 or _fit_with_calibration_cost(n, d, 10) <= budget
        if d < 8192:
            assert _fit_with_calibration_cost(n, 2 * d, 10) > budget
        assert previous is None or d <= previous  # more rows never give more features
        previous = d


def _three_blobs():
    return blobs(40, THREE_CENTRES, 0.6, seed=3)


def test_recipe_increases_the_evidence_over_the_start():
    x, labels = _three_blobs()
    report = ClassifierFitReport()
    # At the search's alpha_epsilon: evidences at two alphas are densities of different data.
    clf = fit_classifier_auto(x, labels, num_features=128, search_features=128, seed=0,
                              select_alpha=False, report=report)
    assert report.converged["search"]
    # The evidence of the fitted classifier (RandomFeatureGP's own computation) against a
    # classifier with the same features at the starting hyperparameters.
    start = make_ard_kernel(128, 2, seed=0)
    start.base_kernel.lengthscale = report.initial["lengthscale"].reshape(1, -1)
    start.outputscale = report.initial["outputscale"]
    at_start = DirichletGPClassifier(start, outputscale=1.0).fit(x, labels)
    assert clf.log_marginal_likelihood() > at_start.log_marginal_likelihood() + 1.0
    # The search's own losses are the negative evidence per datum and class; with the same
    # features and rows the calibration can only raise the evidence, and barely: the search
    # stopped at its gradient tolerance.
    final = -clf.log_marginal_likelihood() / (x.shape[0] * 3)
    assert report.calibration["negative_log_evidence"] == pytest.approx(final, rel=1e-10)
    assert final <= report.losses["search"][-1] + 1e-12
    assert report.losses["search"][-1] == pytest.approx(final, rel=1e-6)


@pytest.mark.parametrize("num_features", [128, 256])
def test_refit_equals_a_direct_fit_at_the_found_hyperparameters(num_features):
    x, labels = _three_blobs()
    clf = fit_classifier_auto(x, labels, num_features=num_features, search_features=128,
                              subsample=10_000, seed=4)
    found = clf.kernel
    kernel = make_ard_kernel(num_features, 2, seed=4)  # the same frequencies (seed)
    kernel.base_kernel.lengthscale = found.base_kernel.lengthscale.detach()
    kernel.outputscale = found.outputscale.detach()
    direct = DirichletGPClassifier(kernel, alpha_epsilon=clf.alpha_epsilon,
                                   outputscale=1.0).fit(x, labels)
    test = torch.linspace(-1, 3, 21, dtype=DTYPE).reshape(-1, 1).repeat(1, 2)
    ours, theirs = clf.latent_posterior(test), direct.latent_posterior(test)
    torch.testing.assert_close(ours.mean, theirs.mean, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(ours.variance, theirs.variance, rtol=1e-10, atol=1e-10)
    assert found.base_kernel.num_features == num_features


def test_recipe_subsample_and_refinement_stages():
    x, labels = blobs(300, THREE_CENTRES, 0.6, seed=5)
    report = ClassifierFitReport()
    fit_classifier_auto(x, labels, num_features=64, subsample=200, refine_iterations=3,
                        refine_rows=500, seed=0, report=report)
    assert report.subsample == 200 and report.refine_rows == 500
    assert report.iterations["refine"] <= 3
    # The refinement starts where the subsample stage stopped and never ends higher.
    assert report.losses["refine"][-1] <= report.losses["refine"][0]


def test_select_alpha_after_the_search():
    from rfgp.classification import ALPHA_GRID

    x, labels = _three_blobs()
    clf = fit_classifier_auto(x, labels, num_features=64, select_alpha=True, seed=0)
    assert clf.alpha_epsilon in ALPHA_GRID
    assert sum(r["selected"] for r in clf.selection_) == 1


def test_estimator_default_is_the_recipe():
    pytest.importorskip("sklearn")
    from rfgp.classification import softmax_expectation
    from rfgp.sklearn import RandomFeatureGPClassifier

    x, labels = _three_blobs()
    X, y = x.numpy(), labels.numpy() + 10  # labels of any values
    est = RandomFeatureGPClassifier(num_features=128, random_state=0).fit(X, y)
    seed = 0  # random_state=0 is the recipe's seed 0
    clf = fit_classifier_auto(x, labels, num_features=128, seed=seed)
    ours = est.classifier_.latent_posterior(x)
    theirs = clf.latent_posterior(x)
    torch.testing.assert_close(ours.mean, theirs.mean, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(ours.variance, theirs.variance, rtol=1e-10, atol=1e-10)
    # the probabilities are E[softmax((s f + o) / T)], with the recipe's T and map (s, o)
    t, class_map = clf.temperature, clf.class_map
    assert est.classifier_.temperature == t
    assert (est.classifier_.class_map is None) == (class_map is None)
    s, o = (1.0, 0.0) if class_map is None else class_map
    if class_map is not None:
        torch.testing.assert_close(est.classifier_.class_map[0], s, rtol=0, atol=0)
        torch.testing.assert_close(est.classifier_.class_map[1], o, rtol=0, atol=0)
    mean, var = (theirs.mean * s + o) / t, theirs.variance * s * s / t**2
    proba = softmax_expectation(mean, var, "mc", 1000, torch.Generator().manual_seed(seed))
    np.testing.assert_allclose(est.predict_proba(X), proba.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(est.predict(X), proba.argmax(-1).numpy() + 10)
    assert est.fit_report_ is not None and est.n_iter_ > 0
    # optimizer=None keeps the given lengthscale: no report, no iterations.
    old = RandomFeatureGPClassifier(num_features=64, optimizer=None, random_state=0).fit(X, y)
    assert old.fit_report_ is None and old.n_iter_ == 0
    assert float(old.classifier_.kernel.lengthscale.detach()) == 1.0


def test_hostile_input_names_the_argument():
    x, labels = _three_blobs()
    bad = x.clone()
    bad[3, 1] = float("nan")
    with pytest.raises(ValueError, match="x must be finite"):
        fit_classifier_auto(bad, labels)
    with pytest.raises(ValueError, match="x must have at least one row"):
        fit_classifier_auto(x[:0], labels[:0])
    with pytest.raises(TypeError, match="x must have a floating dtype"):
        fit_classifier_auto(x.long(), labels)
    with pytest.raises(TypeError, match="labels must hold integer"):
        fit_classifier_auto(x, labels.double())
    with pytest.raises(ValueError, match="labels must have one entry per row"):
        fit_classifier_auto(x, labels[:-1])
    with pytest.raises(ValueError, match="spectral"):
        fit_classifier_auto(x, labels, spectral="cosine")
    with pytest.raises(ValueError, match="alpha_epsilon"):
        fit_classifier_auto(x, labels, alpha_epsilon=0.0)
    with pytest.raises(TypeError, match="select_alpha"):
        fit_classifier_auto(x, labels, select_alpha="yes")
    with pytest.raises(ValueError, match="num_features"):
        fit_classifier_auto(x, labels, num_features=1)


def test_recipe_does_not_change_its_inputs():
    x, labels = _three_blobs()
    x0, l0 = copy.deepcopy(x), copy.deepcopy(labels)
    fit_classifier_auto(x, labels, num_features=64, seed=0)
    assert torch.equal(x, x0) and torch.equal(labels, l0)


def test_evidence_search_checks_its_arguments():
    def dirichlet_evidence_search(*args):
        return dirichlet_objective(*args)

    x, labels = _three_blobs()
    targets, noise = dirichlet_transform(labels, 3)
    kernel = make_ard_kernel(32, 2, seed=0)
    with pytest.raises(TypeError, match="kernel must be a ScaleKernel"):
        dirichlet_evidence_search(kernel.base_kernel, x, targets, noise)
    with pytest.raises(ValueError, match="targets and noise must have shape"):
        dirichlet_evidence_search(kernel, x, targets, noise[:, :2])
    with pytest.raises(ValueError, match="noise must be positive"):
        dirichlet_evidence_search(kernel, x, targets, -noise)
    with pytest.raises(ValueError, match="x must be finite"):
        dirichlet_evidence_search(kernel, x * float("nan"), targets, noise)


def test_recipe_finds_the_irrelevant_inputs():
    # Labels depend on the first two of four inputs: the evidence (ARD) lengthscales of the
    # other two grow far beyond those of the relevant ones.
    g = torch.Generator().manual_seed(7)
    x = torch.randn(300, 4, generator=g, dtype=DTYPE)
    labels = (torch.sin(2 * x[:, 0]) + x[:, 1] > 0).long()
    clf = fit_classifier_auto(x, labels, num_features=256, seed=0)
    lengthscale = clf.kernel.base_kernel.lengthscale.detach().reshape(-1)
    assert float(lengthscale[2:].min()) > 5 * float(lengthscale[:2].max())


def test_a_classifier_report_passed_again_describes_the_new_fit_only():
    x, labels = blobs(300, THREE_CENTRES, 0.6, seed=5)
    report = ClassifierFitReport()
    clf = fit_classifier_auto(x, labels, num_features=64, subsample=200, refine_iterations=2,
                              seed=0, report=report)
    assert "refine" in report.seconds and report.lengthscale_draws is None
    torch.testing.assert_close(report.lengthscale,
                               clf.kernel.base_kernel.lengthscale.detach().reshape(-1))
    assert report.choice["num_features"] == 64
    # no refinement, no choice
    fit_classifier_auto(x, labels, num_features=64, seed=0, select_alpha=False, report=report)
    assert set(report.seconds) == {"search", "refit"} and report.choice == {}
    assert set(report.iterations) == {"search"}


def test_recipe_keeps_uint64_class_ids():
    # Ids of 2**63 and more used to wrap to negative int64 classes.
    x, y = blobs(20, THREE_CENTRES, 0.4, seed=7)
    ids = np.array([0, 2**63 + 5, 2**64 - 1], dtype=np.uint64)
    clf = fit_classifier_auto(x, ids[y.numpy()], num_features=64, search_features=64,
                              max_iterations=3, refine_iterations=0, seed=0)
    assert clf.classes_.dtype == torch.uint64
    assert [int(c) for c in clf.classes_.numpy()] == [0, 2**63 + 5, 2**64 - 1]
    assert set(int(v) for v in clf.predict(x, method="mean_field").numpy()) <= set(
        int(i) for i in ids)


# ------------------------------------------------------------------ the final model's own scale
def _negative_evidence_gradient(clf, x, labels):
    """d(-log p(Y)) / d(log outputscale) of the fitted classifier's own model, by autograd
    through the dense heteroscedastic evidence (not through the calibration's spectra)."""
    targets, noise = dirichlet_transform(labels, clf.num_classes_, clf.alpha_epsilon)
    targets = targets - targets.mean(0)
    kernel = clf.kernel
    with torch.no_grad():
        z = kernel.base_kernel.features(x) * kernel.outputscale.sqrt()
    log_factor = torch.zeros((), dtype=DTYPE, requires_grad=True)
    value = heteroscedastic_negative_log_evidence(z * (log_factor / 2).exp(), targets, noise)
    (grad,) = torch.autograd.grad(value, log_factor)
    return float(grad), float(value)


@pytest.mark.parametrize("n_per_class, num_features", [(100, 64), (20, 256)])
def test_calibrated_classifier_is_at_its_own_evidence_maximum(n_per_class, num_features):
    # 300 rows, 64 features (weight space) and 60 rows, 256 features (function space); the
    # search ran with 16 features, so its outputscale is not the final model's best.
    # (Without the held-out choice, which chooses the outputscale by the held-out NLL.)
    x, labels = blobs(n_per_class, THREE_CENTRES, 0.6, seed=5)
    report = ClassifierFitReport()
    clf = fit_classifier_auto(x, labels, num_features=num_features, search_features=16, seed=1,
                              select_alpha=False, report=report)
    assert abs(math.log(report.calibration["factor"])) > 1e-3  # the calibration moved it
    grad, value = _negative_evidence_gradient(clf, x, labels)
    # Newton stops at steps of 1e-12 in log a on a curvature of O(N C): the derivative per
    # datum and class is zero to rounding of sums of N C terms of O(1).
    assert abs(grad) / labels.numel() / 3 < 1e-8
    # and it is a maximum: the evidence is lower at 0.9 and 1.1 times the outputscale
    for step in (-0.1, 0.1):
        shifted = copy.deepcopy(clf)
        shifted.kernel.outputscale = clf.kernel.outputscale * math.exp(step)
        assert _negative_evidence_gradient(shifted, x, labels)[1] > value
    assert report.calibration["negative_log_evidence"] == pytest.approx(
        value / (labels.numel() * 3), rel=1e-10)


def test_estimator_equals_the_recipe_with_the_same_seed():
    from rfgp.sklearn import RandomFeatureGPClassifier

    x, labels = blobs(30, THREE_CENTRES, 0.6, seed=6)
    test = torch.linspace(-1, 3, 25, dtype=DTYPE).reshape(-1, 1).repeat(1, 2)
    est = RandomFeatureGPClassifier(num_features=128, random_state=3).fit(
        x.numpy(), labels.numpy())
    clf = fit_classifier_auto(x, labels, num_features=128, seed=3)
    np.testing.assert_allclose(est.predict_proba(test.numpy()), clf.predict_proba(test).numpy(),
                               rtol=0, atol=1e-6)


def _letter_subsample(per_class, seed=0):
    """``per_class`` rows of each of letter's 26 classes (float64 inputs)."""
    from rfgp.datasets import load_uci_classification

    x, labels = load_uci_classification("letter")
    g = torch.Generator().manual_seed(seed)
    rows = torch.cat([torch.nonzero(labels == c).reshape(-1)[:per_class] for c in range(26)])
    rows = rows[torch.randperm(rows.numel(), generator=g)]
    return x[rows], labels[rows]


def test_26_class_fit_equals_the_dense_function_space_gp():
    # 312 rows of letter's 26 classes, 96 features: the weight-space path with one shared
    # Gram matrix and 26 heteroscedastic corrections, against the N x N posterior of each
    # class with its own Dirichlet noise, built from the same features.
    x, labels = _letter_subsample(12)
    x_train, y_train, x_test = x[:286], labels[:286], x[286:]
    clf = fit_classifier_auto(x_train, y_train, num_features=96, search_features=96,
                              max_iterations=5, seed=0)
    assert clf.num_classes_ == 26
    targets, noise = dirichlet_transform(y_train, 26, clf.alpha_epsilon)
    offsets = targets.mean(0)
    kernel = clf.kernel
    with torch.no_grad():
        z = kernel.base_kernel.features(x_train) * kernel.outputscale.sqrt()
        z_test = kernel.base_kernel.features(x_test) * kernel.outputscale.sqrt()
    k_train, k_cross = z @ z.T, z_test @ z.T
    means, variances, log_evidence = [], [], 0.0
    for c in range(26):
        cov = k_train + torch.diag(noise[:, c])
        y = targets[:, c] - offsets[c]
        solved = torch.linalg.solve(cov, torch.cat([y.unsqueeze(-1), k_cross.T], dim=1))
        means.append(k_cross @ solved[:, 0] + offsets[c])
        variances.append(z_test.square().sum(-1) - (k_cross * solved[:, 1:].T).sum(-1))
        log_evidence += float(torch.distributions.MultivariateNormal(
            torch.zeros(286, dtype=DTYPE), cov).log_prob(y))
    post = clf.latent_posterior(x_test)
    torch.testing.assert_close(post.mean, torch.stack(means, -1), rtol=1e-8, atol=1e-8)
    torch.testing.assert_close(post.variance, torch.stack(variances, -1), rtol=1e-7,
                               atol=1e-9)
    assert clf.log_marginal_likelihood() == pytest.approx(log_evidence, rel=1e-10)


@pytest.mark.parametrize("num_classes", [2, 26])
def test_a_larger_budget_never_plans_less(num_classes):
    # 2x and 4x the default budget: the final fit gets at least the default's features, the
    # refinement at least its rows, the search the same subsample.
    for n in (1_000, 15_000, 40_000):
        base = ClassifierOptions().checked()
        plans = [plan_classifier(n, 16, num_classes, base.replace(
            time_budget=factor * default_budget(n)).checked()) for factor in (1, 2, 4)]
        assert plans[0].budget == default_budget(n)
        for smaller, larger in zip(plans, plans[1:]):
            assert larger.num_features >= smaller.num_features
            assert larger.refine_rows >= smaller.refine_rows
            assert larger.subsample == smaller.subsample
        # and the planned final fit stays within its share of each budget
        for plan in plans:
            cost = _fit_with_calibration_cost(n, plan.num_features, num_classes)
            assert plan.num_features == 512 or cost <= 0.4 * plan.budget * base.machine_rate


# ------------------------------------------------------------------ the held-out choice
def _choice_cost(n, held, ladder, num_classes, num_alphas=6):
    # The Gram matrices once per D (the shared one and the classes' own rows), then per alpha
    # and class one Cholesky factor and a triangular solve of the held-out rows' features;
    # on fewer training rows than features the kernel matrices, N_t in place of D.
    t, total = n - held, 0.0
    for m in ladder:
        if t < m:
            total += t * n * m + num_alphas * num_classes * (t**3 / 3 + held * t * t)
        else:
            total += 2 * t * m * m + num_alphas * num_classes * (m**3 / 3 + held * m * m)
    return total


def _scale_cost(n, held, top, num_classes):
    # The outputscale's search at the top rung: 8 evaluations of the held-out NLL, and one for
    # the latent moments the temperature is chosen on, each one Cholesky factor and
    # triangular solve per class on the Gram matrices already formed.
    t = n - held
    size = min(t, top)
    return 9 * num_classes * (size**3 / 3 + held * size * size)


@pytest.mark.parametrize("num_classes", [2, 26])
def test_the_choice_is_booked_within_its_share_and_its_ladder_only_grows(num_classes):
    rate = ClassifierOptions().machine_rate
    for n in (1_000, 15_000, 40_000):
        plans = []
        for factor in (1, 2, 4):
            options = ClassifierOptions(time_budget=factor * default_budget(n)).checked()
            plan = plan_classifier(n, 16, num_classes, options)
            without = plan_classifier(n, 16, num_classes, options.replace(select_alpha=False))
            ladder, held = plan.settings["choice_features"], plan.settings["validation_rows"]
            assert held == round(0.1 * n)
            assert ladder[0] == 512 and ladder[-1] == plan.num_features
            assert all(2 * a == b for a, b in zip(ladder, ladder[1:]))
            assert plan.num_features <= without.num_features
            cost = _choice_cost(n, held, ladder, num_classes)
            scale = _scale_cost(n, held, ladder[-1], num_classes)
            assert plan.predicted["choose"] == pytest.approx((cost + scale) / rate, rel=1e-12)
            # the refit takes the chosen outputscale: no evidence calibration booked
            fit = min(2 * n * ladder[-1]**2 + num_classes * ladder[-1]**3 / 3,
                      n * n * ladder[-1] + num_classes * n**3 / 3)
            assert plan.predicted["refit"] == pytest.approx(fit / rate, rel=1e-12)
            assert len(ladder) == 1 or cost <= 0.3 * plan.budget * rate
            if plan.num_features < without.num_features:  # cut by its share, not less
                assert _choice_cost(n, held, ladder + (2 * ladder[-1],), num_classes) > (
                    0.3 * plan.budget * rate)
            assert list(plan.predicted)[-2:] == ["choose", "refit"]
            plans.append(plan)
        for small, large in zip(plans, plans[1:]):
            assert set(small.settings["choice_features"]) <= set(
                large.settings["choice_features"])
            # from the default budget up, the search stages plan alike: the choice compares
            # candidates of the same lengthscales
            assert small.settings["search_paths"] == large.settings["search_paths"]
            assert small.refine_rows == large.refine_rows


def test_two_paths_only_where_the_budget_affords_them():
    options = ClassifierOptions(search_features=64, subsample=5000, machine_rate=1e10)
    tiny = plan_classifier(1200, 2, 3, options.replace(time_budget=1.0).checked())
    ample = plan_classifier(1200, 2, 3, options.replace(time_budget=3.0).checked())
    forced = plan_classifier(1200, 2, 3,
                             options.replace(time_budget=1.0, two_paths=True).checked())
    assert tiny.settings["search_paths"] == 1 and ample.settings["search_paths"] == 2
    assert forced.settings["search_paths"] == 2
    # two L-BFGS runs to convergence and the warm-up's 100 steps against one run
    assert ample.predicted["search"] == pytest.approx(tiny.predicted["search"] * 220 / 60)


def test_two_path_search_is_never_worse_than_the_direct_path():
    from rfgp.inference._evidence_search import search_evidence, search_two_paths

    # Labels from the first two of four inputs, searched from lengthscales of 30 standard
    # deviations: a nearly flat start.
    g = torch.Generator().manual_seed(11)
    x = torch.randn(200, 4, generator=g, dtype=DTYPE)
    labels = (x[:, 0] * x[:, 1] > 0).long()
    targets, noise = dirichlet_transform(labels, 2, 0.01)
    targets = targets - targets.mean(0)
    start = make_ard_kernel(64, 4, seed=0)
    start.base_kernel.lengthscale = torch.full((1, 4), 30.0, dtype=DTYPE)
    start.outputscale = 0.5
    single, double = copy.deepcopy(start), copy.deepcopy(start)
    search_evidence(dirichlet_objective(single, x, targets, noise), 100, 1e-5)
    params = list(double.parameters())

    def put(values):
        with torch.no_grad():
            for param, value in zip(params, values):
                param.copy_(value)

    search_two_paths(lambda: dirichlet_objective(double, x, targets, noise),
                     lambda: [p.detach().clone() for p in params], put, 100, 1e-5)
    with torch.no_grad():
        one = float(dirichlet_objective(single, x, targets, noise).loss())
        two = float(dirichlet_objective(double, x, targets, noise).loss())
    # The direct path is the single search itself: the kept point is at most its loss (the
    # same evaluations, so to rounding).
    assert two <= one + 1e-12


def test_the_choice_is_never_worse_with_more_budget():
    # Budgets of 3, 6 and 12 s at 1e10 multiply-adds per second: ladders up to 512, 1024 and
    # 2048 features; the search (on every row, along two paths each time) runs alike.
    x, labels = blobs(400, THREE_CENTRES, 0.9, seed=8)
    reports = []
    for factor in (1, 2, 4):
        report = ClassifierFitReport()
        clf = fit_classifier_auto(x, labels, search_features=64, subsample=5000,
                                  time_budget=3.0 * factor, machine_rate=1e10, seed=0,
                                  report=report)
        choice = report.choice
        chosen = (choice["features"].index(choice["num_features"]),
                  choice["alphas"].index(choice["alpha_epsilon"]))
        assert float(choice["nll"][chosen]) == float(choice["nll"].min())
        assert clf.kernel.base_kernel.num_features == choice["num_features"]
        assert clf.alpha_epsilon == choice["alpha_epsilon"]
        # the outputscale chosen at that pair: the factor 1 (the table's) is a candidate
        assert choice["scaled_nll"] <= float(choice["nll"].min())
        assert report.calibration["factor"] == choice["outputscale_factor"]
        assert float(clf.kernel.outputscale) == float(report.calibration["outputscale"])
        reports.append(report)
    assert len({r.schedule.settings["search_paths"] for r in reports}) == 1
    assert reports[0].choice["features"] != reports[1].choice["features"]
    for small, large in zip(reports, reports[1:]):
        assert large.losses["search"] == small.losses["search"]
        rungs = len(small.choice["features"])
        assert large.choice["features"][:rungs] == small.choice["features"]
        # the smaller budget's candidates, scored alike, are among the larger's
        torch.testing.assert_close(large.choice["nll"][:rungs], small.choice["nll"],
                                   rtol=1e-12, atol=0)
        assert float(large.choice["nll"].min()) <= float(small.choice["nll"].min())


def test_the_final_outputscale_is_the_held_out_choice():
    from rfgp.classification._held_out import held_out_nll, held_out_statistics
    from rfgp.classification._held_out_scale import paired_standard_error
    from rfgp.recipes._classification import validation_rows

    # 300 rows, 64 features: the choice holds out 30 rows (a permutation of the seed) and
    # fits on 270, in weight space.
    x, labels = blobs(100, THREE_CENTRES, 0.9, seed=9)
    report = ClassifierFitReport()
    clf = fit_classifier_auto(x, labels, num_features=64, seed=2, report=report)
    order = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(2))
    held = validation_rows(x.shape[0])
    valid, train = order[:held], order[held:]
    split = (x[train], labels[train], x[valid], labels[valid])

    # The classifier's outputscale is the choice's: its held-out NLL is the one reported
    # (two computations of one posterior, equal to rounding, as in test_held_out.py).
    kernel = copy.deepcopy(clf.kernel)
    assert report.choice["scaled_nll"] == pytest.approx(
        float(held_out_nll(kernel, *split, 3, (clf.alpha_epsilon,))[0]), rel=1e-8)
    # No factor the search evaluated is lower by more than its paired standard error (the
    # statistics of the final kernel: the factor f of the search is f / chosen here).
    kernel.outputscale = clf.kernel.outputscale.detach() / report.choice["outputscale_factor"]
    statistics = held_out_statistics(kernel, *split, 3)
    chosen = statistics.row_nll(clf.alpha_epsilon, report.choice["outputscale_factor"])
    for factor, nll in report.choice["scale_evaluations"].items():
        rows = statistics.row_nll(clf.alpha_epsilon, factor)
        assert float(rows.mean()) == pytest.approx(nll, rel=1e-8)
        assert float(chosen.mean()) - nll <= paired_standard_error(chosen, rows) + 1e-12
