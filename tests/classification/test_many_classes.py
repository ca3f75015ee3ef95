"""Many classes on one feature computation: the iterative (CG) path of the Dirichlet
classifier with its per-class heteroscedastic noise, against the Cholesky path."""

import pytest
import torch
from gpytorch.kernels import ScaleKernel

from rfgp import DirichletGPClassifier
from rfgp.datasets import load_uci_classification, standardize
from rfgp.kernels import FourierFeatureKernel
from rfgp.likelihoods import dirichlet_transform

DTYPE = torch.float64
CG_TOLERANCE = 1e-10


def _letter(rows):
    x, labels = load_uci_classification("letter")
    g = torch.Generator().manual_seed(0)
    keep = torch.randperm(x.shape[0], generator=g)[:rows]
    return standardize(x[keep])[0], labels[keep]


@pytest.mark.parametrize("num_features", [128, 512])  # fewer and more features than rows
def test_cg_path_equals_the_cholesky_path_for_26_classes(num_features):
    x, labels = _letter(400)
    assert labels.unique().numel() == 26
    kernel = ScaleKernel(FourierFeatureKernel(num_features, ard_num_dims=16, seed=0)).double()
    kernel.base_kernel.lengthscale = 3.0
    kernel.outputscale = 2.0
    exact = DirichletGPClassifier(kernel, outputscale=1.0, solve="weight").fit(x, labels)
    iterative = DirichletGPClassifier(kernel, outputscale=1.0, solve="cg",
                                      cg_tolerance=CG_TOLERANCE).fit(x, labels)
    test = x[:20]
    ours, reference = iterative.latent_posterior(test), exact.latent_posterior(test)
    # CG stops at a relative residual of CG_TOLERANCE: the weights' relative error is at most
    # that times the condition number of each class's B = I + s^2 Z^T S_c^-1 Z.
    _, noise = dirichlet_transform(labels, 26, exact.alpha_epsilon)
    with torch.no_grad():
        z = kernel.base_kernel.features(x) * kernel.outputscale.sqrt()
    largest = max(float(torch.linalg.eigvalsh(z.T @ (z / noise[:, c:c + 1]))[-1])
                  for c in range(26))
    bound = CG_TOLERANCE * (1 + largest)
    scale = float(reference.mean.abs().max())
    torch.testing.assert_close(ours.mean, reference.mean, rtol=0, atol=10 * bound * scale)
    torch.testing.assert_close(ours.variance, reference.variance, rtol=0,
                               atol=10 * bound * float(reference.variance.max()))
