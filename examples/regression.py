"""GP regression in one call: ``rfgp.fit_auto`` on a bundled UCI data set.

Loads the ``concrete`` set (1,030 rows, 8 inputs), holds back 10% of the rows, standardises
with the training statistics and fits a GP by the default recipe: ARD lengthscales, outputscale
and noise by the evidence, the final random Fourier feature model calibrated by its own
evidence, all within a time budget. Prints the held-out RMSE, the mean negative log
predictive density (MNLL, of the standardised targets) and how often the 95% predictive
intervals cover the truth (about 0.95 when the uncertainty is honest), and the time each
stage of the recipe took against its share of the budget.

Run: ``python examples/regression.py`` (about half a minute on two cores).
``RFGP_EXAMPLES_FAST=1`` runs a small budget on a few hundred rows in seconds.
"""

import os

import rfgp
from rfgp import metrics
from rfgp.datasets import load_uci, standardize, train_test_split
from rfgp.recipes import FitReport

FAST = os.environ.get("RFGP_EXAMPLES_FAST") == "1"


def main() -> dict:
    x, y = load_uci("concrete")
    if FAST:
        x, y = x[:300], y[:300]
    x_train, y_train, x_test, y_test = train_test_split(x, y, 0.1, generator=0)
    x_train, x_test, _, _ = standardize(x_train, x_test)
    # Targets near unit scale (the recipe chooses its constant prior mean on that scale);
    # the predictions are undone from it.
    y_train, y_test, y_mean, y_std = standardize(y_train, y_test)

    report = FitReport()
    options = dict(time_budget=3.0, num_features=256, lengthscale_draws=0) if FAST else {}
    gp = rfgp.fit_auto(x_train, y_train, report=report, seed=0, **options)

    mean, std = gp.predict(x_test, return_std=True)     # the latent function's mean and std
    predictive_std = (std**2 + gp.noise).sqrt()         # of a new observation: add the noise
    covered = ((mean - y_test).abs() <= 1.96 * predictive_std).double().mean()
    scores = {
        "RMSE": float(metrics.rmse(y_test, mean)) * float(y_std),   # in the data's units
        "MNLL": float(metrics.mnll(y_test, mean, predictive_std**2)),
        "coverage": float(covered),
    }
    print(f"concrete: {x_train.shape[0]} training rows, D = {report.num_features} features")
    print(f"noise variance (standardised units): {float(gp.noise):.4f}")
    print("held out: " + ", ".join(f"{name} {value:.3f}" for name, value in scores.items()))
    print(report.timing())
    return scores


if __name__ == "__main__":
    main()
