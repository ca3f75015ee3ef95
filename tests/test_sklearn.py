"""scikit-learn estimators: sklearn's estimator checks, Pipeline, GridSearchCV, GP identities."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("sklearn")

from sklearn.base import clone  # noqa: E402
from sklearn.model_selection import GridSearchCV  # noqa: E402
from sklearn.pipeline import make_pipeline  # noqa: E402
from sklearn.preprocessing import StandardScaler  # noqa: E402
from sklearn.utils.estimator_checks import parametrize_with_checks  # noqa: E402

from rfgp.kernels import FourierFeatureKernel  # noqa: E402
from rfgp.recipes import FitReport, fit_auto  # noqa: E402
from rfgp.sklearn import (  # noqa: E402
    KERNELS,
    RandomFeatureGPClassifier,
    RandomFeatureGPRegressor,
    make_kernel,
)


@parametrize_with_checks(
    [
        RandomFeatureGPRegressor(num_features=32, max_iter=3, random_state=0),
        # optimizer="auto" with a kernel outside the recipe: L-BFGS.
        RandomFeatureGPRegressor("polynomial", num_features=32, max_iter=3, random_state=0),
        RandomFeatureGPClassifier(num_features=32, mc_samples=64, random_state=0),
    ]
)
def test_sklearn_estimator_checks(estimator, check):
    check(estimator)


def _regression_data(n=120, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-3, 3, size=(n, 2))
    y = np.sin(X[:, 0]) + 0.5 * X[:, 1] + 0.1 * rng.standard_normal(n)
    return X, y


def test_regressor_matches_random_feature_gp():
    # Without optimisation and normalisation the estimator is RandomFeatureGP on float64 data.
    from rfgp import RandomFeatureGP

    X, y = _regression_data()
    kernel = FourierFeatureKernel(64, seed=3).double()
    reg = RandomFeatureGPRegressor(kernel, optimizer=None, normalize_y=False, noise=0.05)
    mean, std = reg.fit(X, y).predict(X[:7], return_std=True)
    gp = RandomFeatureGP(FourierFeatureKernel(64, seed=3).double(), noise=0.05)
    gp.fit(torch.tensor(X), torch.tensor(y))
    ref_mean, ref_std = gp.predict(torch.tensor(X[:7]), return_std=True)
    np.testing.assert_allclose(mean, ref_mean.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(std, ref_std.numpy(), rtol=1e-10, atol=1e-12)
    # The given kernel is copied, never changed (its weights are still undrawn).
    assert not kernel.weights_initialized


def test_regressor_std_cov_and_samples_agree():
    X, y = _regression_data()
    reg = RandomFeatureGPRegressor(num_features=64, max_iter=5, random_state=0).fit(X, y * 10 + 3)
    Xq = X[:5]
    mean, std = reg.predict(Xq, return_std=True)
    mean_c, cov = reg.predict(Xq, return_cov=True)
    np.testing.assert_allclose(mean, mean_c, rtol=1e-10)
    np.testing.assert_allclose(np.sqrt(np.diag(cov)), std, rtol=1e-8)
    draws = reg.sample_y(Xq, n_samples=4000, random_state=1)
    assert draws.shape == (5, 4000)
    # Monte Carlo mean of posterior functions: within 5 standard errors of the mean.
    assert np.all(np.abs(draws.mean(1) - mean) < 5 * std / np.sqrt(4000))
    # Sample variance: relative standard error sqrt(2 / S).
    np.testing.assert_allclose(draws.var(1), std**2, rtol=5 * np.sqrt(2 / 4000))
    with pytest.raises(RuntimeError, match="return_std and return_cov"):
        reg.predict(Xq, return_std=True, return_cov=True)


def test_regressor_multi_output_shapes():
    X, y = _regression_data()
    Y = np.stack([y, -2 * y], axis=1)
    reg = RandomFeatureGPRegressor(num_features=32, optimizer=None, random_state=0).fit(X, Y)
    mean, cov = reg.predict(X[:4], return_cov=True)
    assert mean.shape == (4, 2) and cov.shape == (4, 4, 2)
    # The second target is -2 times the first: standardised they have equal posteriors.
    np.testing.assert_allclose(cov[..., 1], 4 * cov[..., 0], rtol=1e-8)
    assert reg.sample_y(X[:4], n_samples=3).shape == (4, 2, 3)


def test_random_state_controls_the_features():
    X, y = _regression_data()
    a = RandomFeatureGPRegressor(num_features=32, optimizer=None, random_state=1).fit(X, y)
    b = RandomFeatureGPRegressor(num_features=32, optimizer=None, random_state=1).fit(X, y)
    c = RandomFeatureGPRegressor(num_features=32, optimizer=None, random_state=2).fit(X, y)
    np.testing.assert_array_equal(a.predict(X), b.predict(X))
    assert not np.allclose(a.predict(X), c.predict(X))


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_every_named_kernel_fits(name):
    X, y = _regression_data(80)
    X = X / 3
    reg = RandomFeatureGPRegressor(name, num_features=16, optimizer=None, random_state=0)
    assert np.isfinite(reg.fit(X, y).predict(X)).all()


def test_default_feature_counts_inside_and_outside_the_recipe():
    # The recipe's refit goes past 8192 features on few rows (function space); a fit outside
    # the recipe (here a fixed-hyperparameter RBF fit) keeps at most 8192.
    from rfgp.recipes import RegressionOptions
    from rfgp.recipes._regression import plan_regression

    X, y = _regression_data(60)
    recipe = RandomFeatureGPRegressor(random_state=0, cv_folds=0).fit(X, y)
    expected = plan_regression(60, X.shape[1], RegressionOptions()).num_features
    assert recipe.fit_report_.num_features == expected == 32768
    assert recipe.gp_.solve_used == "function"
    plain = RandomFeatureGPRegressor(optimizer=None, random_state=0).fit(X, y)
    assert plain.gp_.kernel.base_kernel.num_features == 8192


def test_classifier_string_labels_and_probabilities():
    from sklearn.datasets import load_iris

    X, y_int = load_iris(return_X_y=True)
    names = np.array(["setosa", "versicolor", "virginica"])[y_int]
    clf = make_pipeline(StandardScaler(),
                        RandomFeatureGPClassifier(num_features=64, random_state=0))
    clf.fit(X, names)
    proba = clf.predict_proba(X)
    np.testing.assert_allclose(proba.sum(1), 1.0, rtol=1e-12)
    assert list(clf.classes_) == ["setosa", "versicolor", "virginica"]
    assert set(clf.predict(X)) <= set(names)
    assert clf.score(X, names) > 0.9
    # Row-wise invariance: a row's probabilities do not depend on the other rows.
    np.testing.assert_allclose(clf.predict_proba(X[5:6]), proba[5:6], rtol=1e-12)


def test_classifier_validation_selects_alpha():
    from sklearn.datasets import load_breast_cancer

    from rfgp.classification import ALPHA_GRID

    X, y = load_breast_cancer(return_X_y=True)
    X = (X - X.mean(0)) / X.std(0)
    clf = RandomFeatureGPClassifier(num_features=32, lengthscale=4.0, optimizer="validation",
                                    proba_method="mean_field", random_state=0).fit(X, y)
    assert clf.classifier_.alpha_epsilon in ALPHA_GRID
    assert sum(r["selected"] for r in clf.classifier_.selection_) == 1
    assert clf.score(X, y) > 0.9


def test_classifier_recipe_chooses_alpha_unless_told_not_to():
    from rfgp.classification import ALPHA_GRID

    rng = np.random.default_rng(3)
    X = rng.normal(size=(120, 2))
    y = (X[:, 0] + 0.5 * rng.normal(size=120) > 0).astype(int)
    chosen = RandomFeatureGPClassifier(num_features=64, alpha_epsilon=0.05,
                                       random_state=0).fit(X, y)
    assert chosen.fit_report_.choice["alpha_epsilon"] == chosen.classifier_.alpha_epsilon
    assert chosen.classifier_.alpha_epsilon in ALPHA_GRID
    kept = RandomFeatureGPClassifier(num_features=64, alpha_epsilon=0.05, select_alpha=False,
                                     random_state=0).fit(X, y)
    assert kept.classifier_.alpha_epsilon == 0.05 and kept.fit_report_.choice == {}
    with pytest.raises(ValueError, match="select_alpha"):
        RandomFeatureGPClassifier(select_alpha="yes").fit(X, y)


def test_pipeline_and_grid_search():
    X, y = _regression_data(100)
    pipe = make_pipeline(StandardScaler(),
                         RandomFeatureGPRegressor(num_features=32, optimizer=None, random_state=0))
    search = GridSearchCV(pipe, {"randomfeaturegpregressor__lengthscale": [0.05, 1.0],
                                 "randomfeaturegpregressor__kernel": ["rbf", "matern32"]}, cv=3)
    search.fit(X, y)
    # A lengthscale of 0.05 on standardised inputs interpolates noise: 1.0 must win.
    assert search.best_params_["randomfeaturegpregressor__lengthscale"] == 1.0
    assert search.score(X, y) > 0.8
    clone(search.best_estimator_).fit(X, y)


def test_bad_arguments():
    X, y = _regression_data(20)
    with pytest.raises(ValueError, match="kernel must be one of"):
        RandomFeatureGPRegressor("nope").fit(X, y)
    with pytest.raises(TypeError, match="kernel must be"):
        RandomFeatureGPRegressor(kernel=3.0).fit(X, y)
    with pytest.raises(ValueError, match="noise must be a finite real number > 0, got -1.0"):
        RandomFeatureGPRegressor(noise=-1.0).fit(X, y)
    # A wrong type is a TypeError (and a ValueError, as scikit-learn's checks expect).
    with pytest.raises(TypeError,
                       match=r"noise must be a finite real number > 0, got 'big' \(str\)"):
        RandomFeatureGPRegressor(noise="big").fit(X, y)
    with pytest.raises(TypeError, match=r"num_features must be a positive integer.*\(float\)"):
        make_kernel("rbf", num_features=8.0)
    with pytest.raises(ValueError, match=r"num_features must be a positive integer.*\(bool\)"):
        make_kernel("rbf", num_features=True)
    with pytest.raises(ValueError, match="optimizer"):
        RandomFeatureGPRegressor(optimizer="sgd").fit(X, y)
    with pytest.raises(ValueError, match="num_features"):
        make_kernel("rbf", num_features=0)
    with pytest.raises(ValueError, match="lengthscale"):
        make_kernel("rbf", lengthscale=0.0)
    with pytest.raises(ValueError, match="at least 2 classes"):
        RandomFeatureGPClassifier().fit(X, np.zeros(20))
    with pytest.raises(ValueError, match="proba_method"):
        RandomFeatureGPClassifier(proba_method="x").fit(X, np.arange(20) % 2)
    # The recipe's options are checked by the one table (rfgp._parameters), as
    # InvalidParameterError (a ValueError and a TypeError) naming the estimator's parameter.
    for bad in (0.0, -2.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="max_lengthscale must be a finite real number > 0"):
            RandomFeatureGPRegressor(max_lengthscale=bad).fit(X, y)
    with pytest.raises(TypeError, match=r"max_lengthscale must be a finite real number > 0 "
                       r"or None, got '4' \(str\)"):
        RandomFeatureGPRegressor(max_lengthscale="4").fit(X, y)
    for bad in (1, -1, 2.5, True):
        with pytest.raises(ValueError, match="cv_folds must be"):
            RandomFeatureGPRegressor(cv_folds=bad).fit(X, y)
    for bad in (-1, 2.5, True, "32"):
        with pytest.raises(ValueError, match="lengthscale_draws must be an integer"):
            RandomFeatureGPRegressor(lengthscale_draws=bad).fit(X, y)
    for bad in (-1.0, "60"):
        with pytest.raises(ValueError, match="time_budget must be"):
            RandomFeatureGPRegressor(time_budget=bad).fit(X, y)
    with pytest.raises(ValueError, match="max_iter must be"):
        RandomFeatureGPRegressor(max_iter=0).fit(X, y)
    for bad in (1, 0, "yes", None):
        with pytest.raises(TypeError, match="local_search must be a bool"):
            RandomFeatureGPRegressor(local_search=bad).fit(X, y)


def test_recipe_options_reach_the_recipe():
    # The estimator's bound options are fit_auto's: the same fit on the same targets.
    X, y = _regression_data(60)
    y_std = (y - y.mean()) / y.std()
    for options in ({"max_lengthscale": None}, {"max_lengthscale": 2.0, "cv_folds": 0},
                    {"lengthscale_draws": 0}, {"lengthscale_draws": 5}):
        reg = RandomFeatureGPRegressor(num_features=64, random_state=0, normalize_y=False,
                                       **options).fit(X, y_std)
        seed = 0  # random_state=0 is the recipe's seed 0
        report = FitReport()
        fit_auto(torch.from_numpy(X), torch.from_numpy(y_std), num_features=64, seed=seed,
                 report=report, **options)
        torch.testing.assert_close(reg.fit_report_.lengthscale, report.lengthscale)
        if report.lengthscale_draws is None:
            assert reg.fit_report_.lengthscale_draws is None
        else:
            assert report.lengthscale_draws.shape[0] == options.get("lengthscale_draws", 32)
            torch.testing.assert_close(reg.fit_report_.lengthscale_draws,
                                       report.lengthscale_draws)


@pytest.mark.parametrize("local_search", [True, False])
def test_local_search_option_reaches_the_recipe(local_search):
    # More rows than the recipe's 2000-row subsample: a refinement, then the local stage.
    X, y = _regression_data(2100)
    y_std = (y - y.mean()) / y.std()
    options = dict(num_features=64, lengthscale_draws=0, local_search=local_search)
    reg = RandomFeatureGPRegressor(random_state=0, normalize_y=False, max_iter=20,
                                   **options).fit(X, y_std)
    seed = 0  # random_state=0 is the recipe's seed 0
    report = FitReport()
    fit_auto(torch.from_numpy(X), torch.from_numpy(y_std), seed=seed, report=report,
             max_iterations=20, **options)
    expected = 4 if reg.fit_report_.schedule.local_starts else 0
    assert reg.fit_report_.local_blocks == report.local_blocks == expected
    torch.testing.assert_close(reg.fit_report_.lengthscale, report.lengthscale)


def test_local_search_changed_after_a_fit_refits_without_it():
    X, y = _regression_data(2100)
    reg = RandomFeatureGPRegressor(random_state=0, num_features=64, lengthscale_draws=0,
                                   max_iter=20).fit(X, y)
    assert reg.fit_report_.local_blocks == 4
    reg.set_params(local_search=False).fit(X, y)
    assert reg.fit_report_.local_blocks == 0 and "local" not in reg.fit_report_.seconds


# ------------------------------------------------------------------------------ hostile input
@pytest.mark.parametrize("normalize_y", [True, False])
@pytest.mark.parametrize("optimizer", [None, "lbfgs"])
def test_huge_targets_give_finite_predictions(normalize_y, optimizer):
    # The posterior mean is linear in y: scaled targets must give scaled predictions.
    X, y = _regression_data(60)
    kwargs = dict(num_features=32, optimizer=optimizer, max_iter=3, normalize_y=normalize_y,
                  random_state=0)
    small = RandomFeatureGPRegressor(**kwargs).fit(X, y)
    huge = RandomFeatureGPRegressor(**kwargs).fit(X, y * 1e160)
    mean, std = huge.predict(X[:5], return_std=True)
    assert np.isfinite(mean).all() and np.isfinite(std).all()
    if normalize_y:  # standardised targets: the same model at any scale
        np.testing.assert_allclose(mean / 1e160, small.predict(X[:5]), rtol=1e-8, atol=1e-12)
        np.testing.assert_allclose(std / 1e160, small.predict(X[:5], return_std=True)[1],
                                   rtol=1e-8)
    assert np.isfinite(huge.sample_y(X[:3], 2)).all()


def test_huge_targets_without_normalisation_are_exactly_rescaled():
    X, y = _regression_data(60)
    kw = dict(num_features=32, optimizer=None, normalize_y=False, random_state=0)
    small = RandomFeatureGPRegressor(**kw).fit(X, y)
    huge = RandomFeatureGPRegressor(**kw).fit(X, y * 1e160)
    peak = np.abs(y * 1e160).max()
    # fixed hyperparameters: the mean of y * c is c times the mean of y (up to the internal
    # division by max|y|, which is exact in the mean but changes the noise-to-signal ratio
    # only if hyperparameters were learned)
    np.testing.assert_allclose(huge.predict(X[:5]) / peak,
                               RandomFeatureGPRegressor(**kw).fit(X, y * 1e160 / peak)
                               .predict(X[:5]), rtol=1e-10, atol=1e-14)
    assert np.isfinite(small.predict(X[:5])).all()


@pytest.mark.parametrize(
    "y, match",
    [
        (np.array(list("abcdefghij") * 2), "could not convert string to float"),
        (np.array([1, "a"] * 10, dtype=object), "could not convert string to float"),
    ],
)
def test_string_targets_raise_like_sklearn_regressors(y, match):
    from sklearn.linear_model import Ridge

    X, _ = _regression_data(20)
    with pytest.raises(ValueError, match=match):
        Ridge().fit(X, y)
    with pytest.raises(ValueError, match=match):
        RandomFeatureGPRegressor(num_features=8, optimizer=None).fit(X, y)
    numeric = np.array([str(v) for v in np.arange(20.0)])  # numeric strings convert, as there
    Ridge().fit(X, numeric)
    RandomFeatureGPRegressor(num_features=8, optimizer=None).fit(X, numeric)


def test_mixed_type_labels_raise_like_sklearn_classifiers():
    from sklearn.linear_model import LogisticRegression

    X, _ = _regression_data(20)
    for y in (np.array(["a", 1] * 10, dtype=object), np.array([1, "a"] * 10, dtype=object)):
        with pytest.raises((TypeError, ValueError)) as ours:
            RandomFeatureGPClassifier(num_features=8).fit(X, y)
        with pytest.raises((TypeError, ValueError)) as theirs:
            LogisticRegression().fit(X, y)
        assert ours.type is theirs.type
    with pytest.raises(TypeError, match=r"all strings or all numbers.*\['int', 'str'\]"):
        RandomFeatureGPClassifier(num_features=8).fit(X, np.array(["a", 1] * 10, dtype=object))


def test_classifier_large_integer_labels_make_few_classes():
    X, _ = _regression_data(40)
    y = np.where(X[:, 0] > 0, 10**9, -7)
    clf = RandomFeatureGPClassifier(num_features=32, random_state=0).fit(X, y)
    assert list(clf.classes_) == [-7, 10**9]
    assert clf.predict_proba(X).shape == (40, 2)
    assert set(clf.predict(X)) <= {-7, 10**9}


@pytest.mark.parametrize("proba_method", ["mc", "mean_field", "lognormal"])
def test_classifier_predict_log_proba_is_the_log_space_path(proba_method):
    from sklearn.datasets import load_iris

    from rfgp.classification import softmax_expectation

    X, y = load_iris(return_X_y=True)
    X = (X - X.mean(0)) / X.std(0)
    clf = RandomFeatureGPClassifier(num_features=32, proba_method=proba_method,
                                    mc_samples=200, random_state=0).fit(X, y)
    log_proba = clf.predict_log_proba(X[:10])
    mean, variance = clf.classifier_.probability_moments(torch.tensor(X[:10]))
    expected = softmax_expectation(mean, variance, proba_method, 200,
                                   torch.Generator().manual_seed(clf._draw_seed), log=True)
    np.testing.assert_allclose(log_proba, expected.numpy(), rtol=1e-12)
    np.testing.assert_allclose(np.exp(log_proba), clf.predict_proba(X[:10]), rtol=1e-12)
    assert np.isfinite(log_proba).all()


# ------------------------------------------------------------------------------ estimator = recipe
def test_the_regressor_is_the_recipe_on_standardised_data():
    # Same standardised data, random_state=s and seed=s: the same model, so the same
    # predictions (the estimator's own standardisation of standardised targets is exact up
    # to rounding).
    from rfgp.datasets import load_uci, standardize

    x, y = load_uci("concrete")
    x, _, _ = standardize(x)
    y, _, _ = standardize(y)
    y = y - y.mean()
    y = y / y.std(unbiased=False)
    reg = RandomFeatureGPRegressor(random_state=3).fit(x.numpy(), y.numpy())
    gp = fit_auto(x, y, seed=3)
    mean, std = reg.predict(x[:50].numpy(), return_std=True)
    mean2, std2 = gp.predict(x[:50], return_std=True)
    np.testing.assert_allclose(mean, mean2.numpy(), rtol=0, atol=1e-6)
    np.testing.assert_allclose(std, std2.numpy(), rtol=0, atol=1e-6)


def test_the_classifier_is_the_recipe():
    from rfgp.recipes import fit_classifier_auto

    g = np.random.RandomState(0)
    X = g.randn(200, 2)
    labels = (X[:, 0] * X[:, 1] > 0).astype(np.int64)
    clf = RandomFeatureGPClassifier(random_state=5, num_features=256).fit(X, labels)
    model = fit_classifier_auto(torch.from_numpy(X), torch.from_numpy(labels), seed=5,
                                num_features=256, num_classes=2)
    post = model.latent_posterior(torch.from_numpy(X[:20]))
    post_est = clf.classifier_.latent_posterior(torch.from_numpy(X[:20]))
    torch.testing.assert_close(post.mean, post_est.mean, rtol=0, atol=1e-6)
    torch.testing.assert_close(post.variance, post_est.variance, rtol=0, atol=1e-6)


@pytest.mark.parametrize("kernel", ["polynomial", "exponential", "gaussian_sketch", "object"])
def test_auto_optimizer_runs_lbfgs_outside_the_recipe(kernel):
    X, y = _regression_data(60)
    X = X / 3

    def make(optimizer):
        k = FourierFeatureKernel(32, seed=0).double() if kernel == "object" else kernel
        return RandomFeatureGPRegressor(k, num_features=32, optimizer=optimizer, max_iter=5,
                                        random_state=0).fit(X, y)

    auto, lbfgs = make("auto"), make("lbfgs")
    assert auto.fit_report_ is None and auto.n_iter_ == lbfgs.n_iter_ >= 1
    np.testing.assert_array_equal(auto.predict(X), lbfgs.predict(X))


def test_grid_search_over_kernel_names_with_the_default_optimizer():
    X, y = _regression_data(60)
    search = GridSearchCV(RandomFeatureGPRegressor(num_features=32, max_iter=3, random_state=0,
                                                   cv_folds=0, lengthscale_draws=0,
                                                   local_search=False),
                          {"kernel": ["polynomial", "matern32"]}, cv=2)
    search.fit(X / 3, y)
    assert np.isfinite(search.cv_results_["mean_test_score"]).all()


@pytest.mark.parametrize("n_samples, error", [(2.5, TypeError), (2.0, TypeError),
                                              (True, TypeError), (0, ValueError)])
def test_sample_y_refuses_a_non_integer_count(n_samples, error):
    X, y = _regression_data(40)
    reg = RandomFeatureGPRegressor(num_features=16, optimizer=None, random_state=0).fit(X, y)
    with pytest.raises(error, match="n_samples must be an integer"):
        reg.sample_y(X[:3], n_samples=n_samples)
    assert reg.sample_y(X[:3], n_samples=np.int64(2)).shape == (3, 2)


@pytest.mark.parametrize("random_state, error", [
    (2**64, ValueError), (-1, ValueError), ("x", TypeError), (1.5, TypeError),
])
def test_random_state_follows_the_recipes_seed_rule(random_state, error):
    X, y = _regression_data(20)
    rule = r"random_state must be (None, a numpy RandomState or )?an integer in \[0, 2\*\*64 - 1\]"
    for estimator, target in ((RandomFeatureGPRegressor, y),
                              (RandomFeatureGPClassifier, (y > 0).astype(int))):
        with pytest.raises(error, match=rule):
            estimator(num_features=16, random_state=random_state).fit(X, target)
    with pytest.raises(error, match=rule):
        RandomFeatureGPRegressor(num_features=16, optimizer=None).fit(X, y).sample_y(
            X[:2], random_state=random_state)


def test_a_seed_beyond_2_to_the_63_is_the_recipes_seed():
    # random_state=s fits as fit_auto(seed=s) for every seed the recipe takes, 2**63 included
    # (numpy's RandomState stops at 2**32, which is not the rule).
    X, y = _regression_data(40)
    seed = 2**63 + 5
    options = dict(num_features=16, lengthscale_draws=0, cv_folds=0, local_search=False)
    reg = RandomFeatureGPRegressor(random_state=seed, **options).fit(X, y)
    scaled = (y - y.mean()) / y.std()
    gp = fit_auto(torch.tensor(X), torch.tensor(scaled), seed=seed, **options)
    np.testing.assert_allclose(reg.predict(X[:5]), gp.predict(torch.tensor(X[:5])).numpy()
                               * y.std() + y.mean(), rtol=0, atol=1e-12)


@pytest.mark.parametrize("value", [0.0, 0.1, 1 / 3, 7.7, -123.456])
@pytest.mark.parametrize("normalize_y", [True, False])
def test_constant_targets_are_refused_naming_y(value, normalize_y):
    X, _ = _regression_data(30)
    y = np.full(30, value)
    if value and not normalize_y:
        # As given, a non-zero constant is a target to fit (the prior mean is zero).
        reg = RandomFeatureGPRegressor(num_features=16, normalize_y=False, random_state=0)
        assert np.all(np.isfinite(reg.fit(X, y).predict(X[:3])))
        return
    with pytest.raises(ValueError, match=r"y must vary, got 30 samples where every target"):
        RandomFeatureGPRegressor(num_features=16, normalize_y=normalize_y,
                                 random_state=0).fit(X, y)


def test_a_constant_column_is_scaled_by_its_value_exactly():
    from rfgp.sklearn._support import target_scaling

    # The mean of 30 copies of 0.1 is not 0.1 in floating point, and the standard deviation
    # is then that rounding: the column must not become +-1 in every row.
    y = np.stack([np.full(30, 0.1), np.arange(30.0)], 1)
    offset, scale = target_scaling(y, True)
    assert offset[0] == 0.1 and scale[0] == 1.0
    assert not np.any((y[:, 0] - offset[0]) / scale[0])
    assert offset[1] == y[:, 1].mean() and scale[1] == y[:, 1].std()
    X, _ = _regression_data(30)
    reg = RandomFeatureGPRegressor(num_features=16, random_state=0).fit(X, y)
    # The zero column's posterior mean is zero: its prediction is its value, exactly.
    assert np.all(reg.predict(X[:4])[:, 0] == 0.1)


@pytest.mark.parametrize("name, value", [
    ("lengthscale", "x"), ("lengthscale", float("nan")), ("lengthscale", -1.0),
    ("lengthscale", None), ("sampling", "sobol"), ("sampling", None), ("sampling", 1),
    ("degree", 0), ("degree", 2.0), ("degree", True), ("bias", -1.0), ("bias", float("inf")),
    ("bias", "1"), ("projection", "srht"), ("projection", float("nan")),
])
@pytest.mark.parametrize("estimator", [RandomFeatureGPRegressor, RandomFeatureGPClassifier])
def test_kernel_parameters_are_checked_on_every_path(estimator, name, value):
    # The default recipe does not use them; an invalid one is still refused, not ignored.
    X, y = _regression_data(20)
    target = y if estimator is RandomFeatureGPRegressor else (y > 0).astype(int)
    with pytest.raises((ValueError, TypeError), match=f"^{name} must be"):
        estimator(num_features=16, random_state=0, **{name: value}).fit(X, target)


@pytest.mark.parametrize("value", [float("nan"), 1, "yes", None])
def test_normalize_y_must_be_a_bool(value):
    # bool(nan) and bool("yes") are True: such a value was taken as a truth value.
    X, y = _regression_data(20)
    with pytest.raises(TypeError, match="normalize_y must be a bool"):
        RandomFeatureGPRegressor(num_features=16, normalize_y=value).fit(X, y)


def test_counts_beyond_torchs_sizes_are_named():
    X, y = _regression_data(20)
    with pytest.raises(ValueError, match="num_features must be a positive integer of at most"):
        RandomFeatureGPRegressor(num_features=2**64).fit(X, y)
    with pytest.raises(ValueError, match="lengthscale_draws must be an integer in"):
        RandomFeatureGPRegressor(num_features=16, lengthscale_draws=2**64).fit(X, y)
    with pytest.raises(ValueError, match="mc_samples must be a positive integer of at most"):
        RandomFeatureGPClassifier(num_features=16, mc_samples=2**64).fit(X, (y > 0).astype(int))
