"""Seeded toy classification data shared by the classification tests."""

import gpytorch
import torch

DTYPE = torch.float64
THREE_CENTRES = [[0.0, 0.0], [2.0, 0.0], [1.0, 1.7]]


def blobs(n_per_class, centres, spread, seed):
    """Gaussian blobs around ``centres`` (float64), labels ``0 .. C-1``, rows shuffled."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.as_tensor(centres, dtype=DTYPE)
    xs, ys = [], []
    for c, centre in enumerate(centres):
        xs.append(centre + spread * torch.randn(n_per_class, centres.shape[1], generator=g,
                                                dtype=DTYPE))
        ys.append(torch.full((n_per_class,), c, dtype=torch.long))
    x, y = torch.cat(xs), torch.cat(ys)
    perm = torch.randperm(x.shape[0], generator=g)
    return x[perm], y[perm]


def rbf(lengthscale):
    """GPyTorch's exact RBF kernel in float64 with the given lengthscale."""
    k = gpytorch.kernels.RBFKernel().double()
    k.lengthscale = lengthscale
    return k


def fitted_binary(seed=0):
    """A small random-feature Dirichlet classifier fitted on 120 noisy two-class rows, and its
    inputs: the model the temperature and class-map tests change after a fit."""
    from rfgp.classification import DirichletGPClassifier
    from rfgp.kernels import FourierFeatureKernel

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(120, 2, generator=g, dtype=DTYPE)
    labels = (x[:, 0] + 0.5 * torch.randn(120, generator=g, dtype=DTYPE) > 0).long()
    clf = DirichletGPClassifier(FourierFeatureKernel(64, seed=0).double(), seed=0).fit(x, labels)
    return clf, x
