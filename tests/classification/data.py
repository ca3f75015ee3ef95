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
