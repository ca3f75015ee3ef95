"""Classification with calibrated probabilities: ``rfgp.fit_classifier_auto``.

The Dirichlet GP classifier turns ``C``-class labels into ``C`` GP regressions with a closed-form
posterior; the default recipe learns ARD lengthscales and the outputscale by their evidence.
On scikit-learn's bundled breast-cancer data (569 rows, 30 inputs, 2 classes; 75/25 split) it
prints the test accuracy, the mean negative log likelihood of the predicted probabilities
(MNLL) and the expected calibration error (ECE), and a reliability table: in each bin of
confidence (the largest class probability), how often that class is the right one. Calibrated
probabilities put the two columns close together.

Needs scikit-learn for the data (``pip install "rfgp[sklearn]"``); without it the script says so
and stops. Run: ``python examples/classification.py`` (about half a minute on two cores).
``RFGP_EXAMPLES_FAST=1`` uses a small budget and fewer features.
"""

import importlib.util
import os

import torch

import rfgp
from rfgp import metrics
from rfgp.datasets import standardize, train_test_split

FAST = os.environ.get("RFGP_EXAMPLES_FAST") == "1"


def main() -> dict:
    if importlib.util.find_spec("sklearn") is None:
        print('This example needs scikit-learn for its data: pip install "rfgp[sklearn]"')
        return {}
    from sklearn.datasets import load_breast_cancer

    data = load_breast_cancer()
    x = torch.as_tensor(data.data, dtype=torch.float64)
    labels = torch.as_tensor(data.target, dtype=torch.long)
    x_train, y_train, x_test, y_test = train_test_split(x, labels, 0.25, generator=0)
    x_train, x_test, _, _ = standardize(x_train, x_test)

    options = dict(time_budget=2.0, num_features=128, num_samples=200) if FAST else {}
    classifier = rfgp.fit_classifier_auto(x_train, y_train, seed=0, **options)
    probs = classifier.predict_proba(x_test)  # (N_test, C), rows sum to one

    scores = {
        "accuracy": float(metrics.accuracy(probs, y_test)),
        "MNLL": float(metrics.mnll_classification(probs, y_test)),
        "ECE": float(metrics.expected_calibration_error(probs, y_test)),
    }
    print("test: " + ", ".join(f"{name} {value:.3f}" for name, value in scores.items()))
    diagram = metrics.reliability_diagram(probs, y_test, num_bins=5)
    print("confidence bin   mean confidence   accuracy   points")
    for i, count in enumerate(diagram["count"].tolist()):
        if count == 0:
            continue
        low, high = diagram["bin_edges"][i].item(), diagram["bin_edges"][i + 1].item()
        print(f"  [{low:.1f}, {high:.1f}]        {diagram['confidence'][i].item():.3f}"
              f"           {diagram['accuracy'][i].item():.3f}      {int(count)}")
    return scores


if __name__ == "__main__":
    main()
