"""Tests of the Dirichlet transform and likelihood (Milios et al., 2018) in rfgp.likelihoods."""

import re

import gpytorch
import numpy as np
import pytest
import torch

from rfgp.classification import ALPHA_GRID
from rfgp.likelihoods import DirichletLikelihood, dirichlet_transform, validate_labels
from tests.classification.data import DTYPE

# ------------------------------------------------------------------------------ transform
# (alpha, y=1 noise, y=1 target, y=0 noise, y=0 target), from the closed form in the digest.
TABLE = [
    (1e-5, 0.693142, -0.346561, 11.512935, -17.269393),
    (1e-4, 0.693097, -0.346449, 9.210440, -13.815561),
    (1e-3, 0.692648, -0.345324, 6.908755, -10.362133),
    (1e-2, 0.688184, -0.334142, 4.615121, -6.912730),
    (1e-1, 0.646627, -0.228003, 2.397895, -3.501533),
    (1.0, 0.405465, 0.490415, 0.693147, -0.346574),
]


@pytest.mark.parametrize("alpha, s1, y1, s0, y0", TABLE)
def test_transform_matches_table(alpha, s1, y1, s0, y0):
    targets, noise = dirichlet_transform(torch.tensor([1, 0]), 2, alpha)
    # row 0 has label 1: column 1 is the positive class
    assert targets.shape == noise.shape == (2, 2)
    torch.testing.assert_close(noise[0], torch.tensor([s0, s1], dtype=DTYPE), atol=1e-6, rtol=0)
    torch.testing.assert_close(targets[0], torch.tensor([y0, y1], dtype=DTYPE), atol=1e-6, rtol=0)
    torch.testing.assert_close(noise[1], torch.tensor([s1, s0], dtype=DTYPE), atol=1e-6, rtol=0)


@pytest.mark.parametrize("alpha", ALPHA_GRID)
def test_transform_moment_matches_gamma(alpha):
    labels = torch.tensor([0, 1, 2, 2, 1])
    targets, noise = dirichlet_transform(labels, 4, alpha)
    conc = torch.nn.functional.one_hot(labels, 4).to(DTYPE) + alpha
    # log-normal mean and variance equal the Gamma(conc, 1) mean and variance
    torch.testing.assert_close(torch.exp(targets + noise / 2), conc, rtol=1e-12, atol=0)
    torch.testing.assert_close(torch.expm1(noise) * torch.exp(2 * targets + noise), conc,
                               rtol=1e-10, atol=0)
    # absent class (3) is kept; negatives are noisier than positives for alpha < 1
    assert (targets[:, 3] == targets[0, 1]).all()
    if alpha < 1:
        assert (noise[conc < 1] > noise[conc > 1].max()).all()


def test_likelihood_targets_noise_and_centring():
    labels = torch.tensor([0, 2, 2, 1, 0, 0])
    lik = DirichletLikelihood(num_classes=4, alpha_epsilon=0.1, centre=False)
    targets = lik.set_train_labels(labels)
    ref_t, ref_s = dirichlet_transform(labels, 4, 0.1)
    torch.testing.assert_close(targets, ref_t.T)
    torch.testing.assert_close(lik.noise, ref_s.T)
    assert (lik.class_offsets == 0).all()
    lik_c = DirichletLikelihood(num_classes=4, alpha_epsilon=0.1, centre=True)
    centred = lik_c.set_train_labels(labels)
    torch.testing.assert_close(centred.mean(-1), torch.zeros(4, dtype=DTYPE), atol=1e-14, rtol=0)
    torch.testing.assert_close(centred + lik_c.class_offsets.unsqueeze(-1), ref_t.T)


def test_likelihood_noise_used_by_gpytorch_marginal():
    labels = torch.tensor([0, 1, 1, 0])
    lik = DirichletLikelihood(2, alpha_epsilon=0.01, labels=labels)
    mvn = gpytorch.distributions.MultivariateNormal(
        torch.zeros(2, 4, dtype=DTYPE), torch.eye(4, dtype=DTYPE).expand(2, 4, 4)
    )
    marginal = lik(mvn)
    torch.testing.assert_close(marginal.variance, 1 + lik.noise)
    with pytest.raises(ValueError, match="training"):
        lik(gpytorch.distributions.MultivariateNormal(
            torch.zeros(2, 3, dtype=DTYPE), torch.eye(3, dtype=DTYPE).expand(2, 3, 3)))
    with pytest.raises(RuntimeError, match="set_train_labels"):
        DirichletLikelihood(2)(mvn)



# ------------------------------------------------------------------------------ labels
@pytest.mark.parametrize(
    "labels, num_classes, error, match",
    [
        (torch.tensor([0.0, 1.0]), 2, TypeError, "labels.*integer"),
        (np.array([0.0, 1.0]), 2, TypeError, "labels.*integer"),
        (torch.tensor([True, False]), 2, TypeError, "labels.*integer"),
        (np.array([True, False]), 2, TypeError, "labels.*integer.*NumPy array of dtype bool"),
        ([0, 1], 2, TypeError, "labels must be a torch.Tensor"),
        (torch.tensor([0, -1, 1]), 2, ValueError, "labels.*non-negative.*-1"),
        (torch.tensor([0, 1, 3]), 3, ValueError, "labels must be < num_classes = 3, got maximum 3"),
        (torch.tensor([2, 2, 2]), 3, ValueError, "labels.*two distinct classes"),
        (torch.tensor([0, 0]), None, ValueError, "labels.*single class"),
        (torch.tensor([[0, 1]]), 2, ValueError, r"labels.*shape \(N,\)"),
        (torch.tensor([], dtype=torch.long), 2, ValueError, "labels.*empty"),
        (torch.tensor([0, 1]), 1, ValueError, "num_classes must be an integer >= 2"),
    ],
)
def test_bad_labels(labels, num_classes, error, match):
    with pytest.raises(error, match=match):
        validate_labels(labels, num_classes)


def test_validate_labels_accepts_numpy_and_infers_classes():
    labels, c = validate_labels(np.array([3, 0, 1], dtype=np.int32))
    assert c == 4 and labels.dtype == torch.long


# ------------------------------------------------------------------------------ hostile input
def test_transform_dtype_by_name_and_refuses_integer_dtypes():
    targets, noise = dirichlet_transform(torch.tensor([0, 1]), 2, 0.1, dtype="float32")
    assert targets.dtype == noise.dtype == torch.float32
    targets64, _ = dirichlet_transform(torch.tensor([0, 1]), 2, 0.1, dtype=torch.float64)
    torch.testing.assert_close(targets, targets64.float())
    for bad in (torch.long, "int64", "floaty", torch.complex64, 3):
        with pytest.raises(TypeError, match="dtype must be a floating torch dtype"):
            dirichlet_transform(torch.tensor([0, 1]), 2, 0.1, dtype=bad)


@pytest.mark.parametrize("alpha", [0.0, -1.0, float("nan"), float("inf")])
def test_transform_refuses_bad_alpha(alpha):
    with pytest.raises(ValueError, match="alpha_epsilon"):
        dirichlet_transform(torch.tensor([0, 1]), 2, alpha)
    with pytest.raises(ValueError, match="alpha_epsilon"):
        DirichletLikelihood(2, alpha_epsilon=alpha)


def test_likelihood_is_a_public_gpytorch_fixed_noise_likelihood():
    lik = DirichletLikelihood(3, alpha_epsilon=0.1, labels=torch.tensor([0, 1, 2, 2]))
    assert isinstance(lik, gpytorch.likelihoods.FixedNoiseGaussianLikelihood)
    # the noise is GPyTorch's fixed noise: set through its public setter, moved by .to()
    assert lik.noise.shape == (3, 4)
    assert lik.float().noise.dtype == torch.float32
    with pytest.raises(TypeError, match="centre must be a bool"):
        DirichletLikelihood(3, centre=1)
    with pytest.raises(TypeError, match="num_classes must be an integer"):
        DirichletLikelihood(3.0)


def test_likelihood_accepts_test_noise_for_other_points():
    # GPyTorch's own way to add known noise at new points still works.
    lik = DirichletLikelihood(2, labels=torch.tensor([0, 1, 1, 0]))
    mvn = gpytorch.distributions.MultivariateNormal(
        torch.zeros(2, 3, dtype=DTYPE), torch.eye(3, dtype=DTYPE).expand(2, 3, 3)
    )
    marginal = lik(mvn, noise=torch.full((2, 3), 0.5, dtype=DTYPE))
    torch.testing.assert_close(marginal.variance, torch.full((2, 3), 1.5, dtype=DTYPE))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_alpha_epsilon_outside_the_usable_range_is_refused_with_the_range(dtype):
    labels = torch.tensor([0, 1, 1])
    for bad in (1e300, 1e-320, 1e40 if dtype == torch.float32 else 1e16):
        with pytest.raises(ValueError, match=rf"alpha_epsilon must lie in about \[.*\] for "
                                             rf"{dtype} targets.*got {re.escape(repr(bad))}"):
            dirichlet_transform(labels, 2, alpha_epsilon=bad, dtype=dtype)
    # The ends the message names are usable: finite targets and noise, and the labelled
    # class's target above the other's.
    with pytest.raises(ValueError) as info:
        dirichlet_transform(labels, 2, alpha_epsilon=1e300, dtype=dtype)
    low, high = (float(v) for v in str(info.value).split("[")[1].split("]")[0].split(", "))
    for alpha in (low, high):
        targets, noise = dirichlet_transform(labels, 2, alpha_epsilon=alpha, dtype=dtype)
        assert bool(torch.isfinite(targets).all()) and bool(torch.isfinite(noise).all())
        assert bool((noise > 0).all()) and bool(targets[0, 0] > targets[0, 1])


def test_classifier_refuses_an_alpha_epsilon_that_makes_the_targets_equal():
    from rfgp import DirichletGPClassifier
    from rfgp.kernels import FourierFeatureKernel

    x = torch.randn(20, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    labels = (x[:, 0] > 0).long()
    clf = DirichletGPClassifier(FourierFeatureKernel(16, seed=0).double(), alpha_epsilon=1e300)
    with pytest.raises(ValueError, match="alpha_epsilon must lie in about .* got 1e\\+300"):
        clf.fit(x, labels)
