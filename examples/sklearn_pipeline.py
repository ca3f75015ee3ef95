"""A scikit-learn pipeline: ``rfgp.sklearn.RandomFeatureGPRegressor`` after a scaler, tuned by
``GridSearchCV``.

The estimator takes and returns numpy arrays and works with ``Pipeline``, ``GridSearchCV`` and
``clone`` like any scikit-learn regressor. Here a ``StandardScaler`` feeds it the bundled
``yacht`` set (308 rows, 6 inputs); a grid search with 3-fold cross-validation chooses the
kernel (RBF or Matérn 5/2) and the number of random features, each candidate's
hyperparameters fitted by L-BFGS on its evidence. The refitted best pipeline predicts a
held-out quarter of the rows with standard deviations (``predict(X, return_std=True)`` passes
through the pipeline), and the script prints the chosen parameters, the test R^2 and the
coverage of the 95% predictive intervals.

Needs scikit-learn (``pip install "rfgp[sklearn]"``); without it the script says so and stops.
Run: ``python examples/sklearn_pipeline.py`` (about half a minute on two cores).
``RFGP_EXAMPLES_FAST=1`` searches a smaller grid with fewer iterations.
"""

import importlib.util
import os

import numpy as np

from rfgp.datasets import load_uci

FAST = os.environ.get("RFGP_EXAMPLES_FAST") == "1"


def main() -> dict:
    if importlib.util.find_spec("sklearn") is None:
        print('This example needs scikit-learn: pip install "rfgp[sklearn]"')
        return {}
    from sklearn.model_selection import GridSearchCV, train_test_split
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import StandardScaler

    from rfgp.sklearn import RandomFeatureGPRegressor

    x, y = (t.numpy() for t in load_uci("yacht"))
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.25, random_state=0)

    pipeline = Pipeline([
        ("scale", StandardScaler()),
        ("gp", RandomFeatureGPRegressor(optimizer="lbfgs", max_iter=5 if FAST else 30,
                                        random_state=0)),
    ])
    grid = {"gp__kernel": ["rbf", "matern52"],
            "gp__num_features": [64] if FAST else [256, 1024]}
    search = GridSearchCV(pipeline, grid, cv=3).fit(x_train, y_train)

    mean, std = search.best_estimator_.predict(x_test, return_std=True)
    gp = search.best_estimator_.named_steps["gp"]
    predictive_std = np.sqrt(std**2 + gp.noise_)  # latent std plus the noise, units of y
    scores = {
        "test R^2": float(search.score(x_test, y_test)),
        "coverage": float(np.mean(np.abs(mean - y_test) <= 1.96 * predictive_std)),
    }
    print(f"chosen: {search.best_params_} (cross-validated R^2 {search.best_score_:.3f})")
    print(", ".join(f"{name} {value:.3f}" for name, value in scores.items()))
    return scores


if __name__ == "__main__":
    main()
