"""The exact DotProductKernel."""

import math

import torch

from rfgp.kernels import DotProductKernel


# ---------------------------------------------------------------------------- exact kernel
def test_dot_product_kernel():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 3, dtype=torch.float64, generator=g)
    y = torch.randn(5, 3, dtype=torch.float64, generator=g)
    k = DotProductKernel("polynomial", degree=3, bias=0.5, ard_num_dims=3).double()
    ls = torch.tensor([[0.5, 1.0, 2.0]], dtype=torch.float64)
    k.lengthscale = ls
    torch.testing.assert_close(k(x, y).to_dense(), ((x / ls) @ (y / ls).T + 0.5) ** 3)
    torch.testing.assert_close(k(x, diag=True), (((x / ls) ** 2).sum(-1) + 0.5) ** 3)
    e = DotProductKernel("exponential").double()
    e.lengthscale = 2.0
    torch.testing.assert_close(e(x, y).to_dense(), torch.exp(x @ y.T / 4))
    # scikit-learn convention: gamma = 1 / l^2, coef0 = bias
    from sklearn.metrics.pairwise import polynomial_kernel

    p = DotProductKernel("polynomial", degree=2, bias=1.5).double()
    p.lengthscale = 1 / math.sqrt(0.3)
    ref = polynomial_kernel(x.numpy(), y.numpy(), degree=2, gamma=0.3, coef0=1.5)
    torch.testing.assert_close(p(x, y).to_dense(), torch.from_numpy(ref))
