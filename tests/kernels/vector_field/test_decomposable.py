"""DecomposableFeatureKernel: scalar random Fourier features times the task covariance."""


import torch

from rfgp.kernels import (
    DecomposableFeatureKernel,
)
from tests.helpers import DT, gen, rand


def blocks_from_features(phi1, phi2):
    """(N, p, D), (M, p, D) -> (N, M, p, p) blocks Phi(x)^T Phi(z)."""
    return torch.einsum("npd,mqd->nmpq", phi1, phi2)


def test_decomposable_is_scalar_rff_times_task_covariance():
    k = DecomposableFeatureKernel(2 * 50 * 5, num_tasks=3, rank=2, seed=1, ard_num_dims=4).to(DT)
    with torch.no_grad():
        k.task_factor.copy_(torch.randn(3, 2, generator=gen(9), dtype=DT))
        k.task_diag = torch.tensor([0.1, 0.5, 2.0], dtype=DT)
        k.lengthscale = torch.tensor([0.5, 1.0, 1.5, 2.0], dtype=DT)
    x, z = rand(5, 4, seed=1), rand(6, 4, seed=2)
    bxz = blocks_from_features(k.features(x), k.features(z)).detach()
    omega = k.frequencies / k.lengthscale
    k_hat = torch.cos((x @ omega.T).unsqueeze(1) - (z @ omega.T).unsqueeze(0)).mean(-1).detach()
    a = k.task_covariance.detach()
    torch.testing.assert_close(bxz, k_hat[..., None, None] * a, atol=1e-12, rtol=0)
    # the exact reference is GPyTorch's MultitaskKernel with the same A and lengthscale
    exact = k.exact_kernel()
    rbf = torch.exp(-0.5 * ((x.unsqueeze(1) - z.unsqueeze(0)) / k.lengthscale.detach())
                    .pow(2).sum(-1))
    torch.testing.assert_close(exact(x, z).to_dense().detach(), torch.kron(rbf, a))


def test_decomposable_independent_outputs():
    k = DecomposableFeatureKernel(2 * 20 * 2, num_tasks=2, rank=0, seed=0).to(DT)
    x = rand(4, 3)
    blocks = blocks_from_features(k.features(x), k.features(x)).detach()
    assert (blocks[..., 0, 1] == 0).all()
