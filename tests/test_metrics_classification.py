"""Tests of the classification metrics: accuracy, MNLL of class probabilities, calibration."""

import math

import numpy as np
import pytest
import torch

from rfgp.metrics import (
    accuracy,
    expected_calibration_error,
    mnll_classification,
    reliability_diagram,
)

DTYPE = torch.float64


def test_accuracy_from_labels_and_probabilities():
    labels = torch.tensor([0, 1, 2, 1])
    assert accuracy(torch.tensor([0, 1, 1, 1]), labels) == 0.75
    probs = torch.tensor([[0.8, 0.1, 0.1], [0.1, 0.2, 0.7], [0.0, 0.0, 1.0], [0.3, 0.4, 0.3]])
    assert accuracy(probs, labels) == 0.75


def test_mnll_is_mean_negative_log_probability():
    probs = torch.tensor([[0.2, 0.8], [0.6, 0.4], [0.5, 0.5]], dtype=DTYPE)
    labels = torch.tensor([1, 1, 0])
    expected = -(math.log(0.8) + math.log(0.4) + math.log(0.5)) / 3
    assert mnll_classification(probs, labels).item() == pytest.approx(expected, rel=1e-14)
    # uniform prediction: log C
    uniform = torch.full((5, 7), 1 / 7, dtype=DTYPE)
    assert mnll_classification(uniform, torch.arange(5)).item() == pytest.approx(math.log(7))


def test_mnll_of_zero_probability_is_large_and_finite():
    probs = torch.tensor([[1.0, 0.0]], dtype=DTYPE)
    value = mnll_classification(probs, torch.tensor([1]))
    assert torch.isfinite(value) and value > 700


def test_ece_hand_computed():
    # bins of width 0.5: confidences 0.9, 0.8 (bin 2, accuracy 1/2) and 0.3 would be bin 1 but
    # the max probability is >= 1/C = 0.5 with two classes, so use three classes.
    probs = torch.tensor([[0.9, 0.05, 0.05], [0.8, 0.1, 0.1], [0.4, 0.3, 0.3]], dtype=DTYPE)
    labels = torch.tensor([0, 1, 0])
    # bin (0.5, 1]: conf mean 0.85, acc 0.5 -> gap 0.35, weight 2/3; bin [0, 0.5]: conf 0.4,
    # acc 1 -> gap 0.6, weight 1/3
    expected = 2 / 3 * 0.35 + 1 / 3 * 0.6
    assert expected_calibration_error(probs, labels, num_bins=2).item() == pytest.approx(expected)
    diagram = reliability_diagram(probs, labels, num_bins=2)
    assert diagram["count"].tolist() == [1, 2]
    torch.testing.assert_close(diagram["accuracy"], torch.tensor([1.0, 0.5], dtype=DTYPE))
    torch.testing.assert_close(diagram["confidence"], torch.tensor([0.4, 0.85], dtype=DTYPE))


def test_ece_of_calibrated_predictions_is_small():
    # labels drawn from the predicted probabilities: calibrated by construction
    g = torch.Generator().manual_seed(0)
    n, c = 20000, 4
    probs = torch.softmax(2 * torch.randn(n, c, generator=g, dtype=DTYPE), dim=-1)
    labels = torch.multinomial(probs, 1, generator=g).squeeze(-1)
    ece = expected_calibration_error(probs, labels, num_bins=10)
    # each bin's accuracy has standard error <= 0.5 / sqrt(n_b); the weighted sum of
    # |gaps| is then about sum_b (n_b / n) 0.8 * 0.5 / sqrt(n_b) <= 0.4 sqrt(B / n)
    assert ece < 3 * 0.4 * math.sqrt(10 / n)
    # always-confident wrong predictions: ECE = confidence
    wrong = torch.tensor([[0.9, 0.1]] * 10, dtype=DTYPE)
    assert expected_calibration_error(wrong, torch.ones(10, dtype=torch.long)).item() == \
        pytest.approx(0.9)


def test_reliability_diagram_empty_bins_are_nan_and_counts_sum():
    probs = torch.tensor([[0.95, 0.05], [0.97, 0.03]], dtype=DTYPE)
    diagram = reliability_diagram(probs, torch.tensor([0, 0]), num_bins=10)
    assert diagram["count"].sum() == 2 and diagram["count"][9] == 2
    assert torch.isnan(diagram["accuracy"][:9]).all()
    assert diagram["bin_edges"].shape == (11,)


@pytest.mark.parametrize(
    "fn", [mnll_classification, expected_calibration_error, reliability_diagram]
)
def test_bad_inputs(fn):
    probs = torch.tensor([[0.5, 0.5], [0.2, 0.8]], dtype=DTYPE)
    with pytest.raises(TypeError, match="labels.*integer"):
        fn(probs, torch.tensor([0.0, 1.0]))
    with pytest.raises(TypeError, match="labels.*integer.*NumPy array of dtype bool"):
        fn(probs, np.array([True, False]))
    with pytest.raises(ValueError, match=r"labels must have shape \(2,\)"):
        fn(probs, torch.tensor([0, 1, 1]))
    with pytest.raises(ValueError, match="labels must lie in"):
        fn(probs, torch.tensor([0, 2]))
    with pytest.raises(ValueError, match="probs must have shape"):
        fn(probs[:, 0], torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="probs must be finite and lie in"):
        fn(probs * 2, torch.tensor([0, 1]))
    with pytest.raises(TypeError, match="probs"):
        fn(torch.tensor([[1, 0]]), torch.tensor([0]))


def test_accuracy_bad_inputs():
    with pytest.raises(ValueError, match="predictions"):
        accuracy(torch.tensor([0.2, 0.8]), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="labels must have shape"):
        accuracy(torch.tensor([0, 1]), torch.tensor([0]))


# ------------------------------------------------------------------------------ hostile input
def test_accuracy_refuses_labels_outside_the_classes_of_the_probabilities():
    probs = torch.tensor([[0.9, 0.1], [0.2, 0.8]], dtype=DTYPE)
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 2\), got range \[0, 5\]"):
        accuracy(probs, torch.tensor([0, 5]))
    with pytest.raises(ValueError, match="labels must lie in"):
        accuracy(torch.tensor([0, 1]), torch.tensor([0, -1]))
    with pytest.raises(ValueError, match="predictions must be finite"):
        accuracy(torch.tensor([[float("nan"), 0.1], [0.2, 0.8]]), torch.tensor([0, 1]))


def test_probability_rows_must_sum_to_one():
    probs = torch.tensor([[0.05, 0.05], [0.2, 0.8]], dtype=DTYPE)  # first row sums to 0.1
    for fn in (mnll_classification, expected_calibration_error, reliability_diagram):
        with pytest.raises(ValueError, match="rows sum to 1, got a row sum off by 0.9"):
            fn(probs, torch.tensor([0, 1]))
    # float32 round-off of a softmax is accepted
    p32 = torch.softmax(torch.randn(50, 7, generator=torch.Generator().manual_seed(0)), -1)
    assert torch.isfinite(mnll_classification(p32, torch.zeros(50, dtype=torch.long)))


def test_classification_metrics_accept_numpy():
    import numpy as np

    probs = np.array([[0.2, 0.8], [0.6, 0.4], [0.5, 0.5]])
    labels = np.array([1, 1, 0])
    expected = -(math.log(0.8) + math.log(0.4) + math.log(0.5)) / 3
    assert mnll_classification(probs, labels).item() == pytest.approx(expected, rel=1e-14)
    assert accuracy(probs, labels).item() == pytest.approx(2 / 3)
    assert accuracy(np.array([1, 0, 0]), labels).item() == pytest.approx(2 / 3)
    torch.testing.assert_close(
        expected_calibration_error(probs, labels, num_bins=2),
        expected_calibration_error(torch.from_numpy(probs), torch.from_numpy(labels), 2),
    )


@pytest.mark.parametrize("fn", [mnll_classification, expected_calibration_error])
def test_empty_and_non_finite_probabilities(fn):
    with pytest.raises(ValueError, match="probs must not be empty"):
        fn(torch.zeros(0, 2, dtype=DTYPE), torch.zeros(0, dtype=torch.long))
    with pytest.raises(ValueError, match="probs must be finite"):
        fn(torch.tensor([[float("nan"), 0.5]], dtype=DTYPE), torch.tensor([0]))
    with pytest.raises(ValueError, match="num_bins|labels"):
        reliability_diagram(torch.tensor([[0.5, 0.5]], dtype=DTYPE), torch.tensor([0]), 0)


def test_accuracy_of_unsigned_labels_compares_values():
    labels = np.array([0, 1, 2, 1], dtype=np.uint32)
    assert accuracy(torch.tensor([0, 1, 1, 1]), labels).item() == 0.75
    assert accuracy(np.array([0, 1, 2, 0], dtype=np.uint64), torch.tensor([0, 1, 2, 1])) == 0.75
    probs = torch.tensor([[0.9, 0.1], [0.2, 0.8]])
    assert accuracy(probs, np.array([0, 0], dtype=np.uint64)).item() == 0.5
    # An id that int64 cannot hold is refused by name, not wrapped to -1.
    with pytest.raises(ValueError, match=r"labels must hold integer class indices below 2\*\*63"
                                         r".*18446744073709551615"):
        accuracy(torch.tensor([0, 1]), np.array([0, 2**64 - 1], dtype=np.uint64))
