"""The exact curl-free, divergence-free and Helmholtz kernels: Hessians of the Gaussian,
normalisation, layout, and fields free of curl / divergence."""


import pytest
import torch
from torch.autograd.functional import hessian, jacobian

from rfgp.kernels import (
    CurlFreeKernel,
    DivFreeKernel,
    HelmholtzKernel,
)
from rfgp.kernels._vector_field.exact import curl_free_gaussian, div_free_gaussian
from tests.helpers import DT, gen, rand


def gaussian_scalar(delta, lengthscale):
    return torch.exp(-0.5 * (delta / lengthscale).pow(2).sum())


# ----------------------------------------------------------------- exact kernels vs autograd
@pytest.mark.parametrize("dim", [2, 3, 4])
@pytest.mark.parametrize("ard", [False, True])
def test_exact_kernels_are_hessians_of_the_gaussian(dim, ard):
    if ard:
        ls = torch.rand(dim, generator=gen(dim), dtype=DT) + 0.5
    else:
        ls = torch.tensor([0.8], dtype=DT)
    x, z = rand(6, dim, seed=1), rand(6, dim, seed=2)
    curl = curl_free_gaussian(x, z, ls.view(1, -1), normalize=False)
    div = div_free_gaussian(x, z, ls.view(1, -1), normalize=False)
    eye = torch.eye(dim, dtype=DT)
    for n in range(6):
        delta = x[n] - z[n]
        h = hessian(lambda d: gaussian_scalar(d, ls), delta)
        torch.testing.assert_close(curl[n, n], -h, rtol=0, atol=1e-12)
        torch.testing.assert_close(div[n, n], h - torch.trace(h) * eye, rtol=0, atol=1e-12)
        # (x, z) form: K_curl(x, z) = d/dx grad_z k(x, z)
        def grad_z(xx, zn=z[n]):
            return jacobian(lambda zz: gaussian_scalar(xx - zz, ls), zn, create_graph=True)

        mixed = jacobian(grad_z, x[n])
        torch.testing.assert_close(curl[n, n], mixed, rtol=0, atol=1e-12)
    # K_curl + K_div = -Laplacian(k) I and tr K_div = (d - 1) tr K_curl for one lengthscale
    if not ard:
        lap = -curl.diagonal(dim1=-2, dim2=-1).sum(-1)
        torch.testing.assert_close(curl + div, -lap[..., None, None] * eye, atol=1e-12, rtol=0)
        torch.testing.assert_close(div.diagonal(dim1=-2, dim2=-1).sum(-1),
                                   (dim - 1) * curl.diagonal(dim1=-2, dim2=-1).sum(-1))


@pytest.mark.parametrize("dim", [2, 3])
def test_exact_kernels_at_zero_and_normalisation(dim):
    ls = torch.tensor([[0.7]], dtype=DT)
    x = rand(3, dim)
    eye = torch.eye(dim, dtype=DT)
    raw_curl = curl_free_gaussian(x, x, ls, normalize=False)
    raw_div = div_free_gaussian(x, x, ls, normalize=False)
    torch.testing.assert_close(raw_curl[0, 0], eye / 0.49)
    torch.testing.assert_close(raw_div[0, 0], (dim - 1) * eye / 0.49)
    torch.testing.assert_close(curl_free_gaussian(x, x, ls)[1, 1], eye)
    torch.testing.assert_close(div_free_gaussian(x, x, ls)[1, 1], eye)
    # normalisation is a scalar factor: normalised = c * raw
    torch.testing.assert_close(curl_free_gaussian(x, x, ls), 0.49 * raw_curl)
    torch.testing.assert_close(div_free_gaussian(x, x, ls), 0.49 / (dim - 1) * raw_div)


def test_exact_2d_div_is_rotated_curl():
    j = torch.tensor([[0.0, -1.0], [1.0, 0.0]], dtype=DT)
    x, z = rand(7, 2, seed=3), rand(5, 2, seed=4)
    for normalize in (False, True):
        ls = torch.tensor([[0.6]], dtype=DT)
        curl = curl_free_gaussian(x, z, ls, normalize)
        div = div_free_gaussian(x, z, ls, normalize)
        torch.testing.assert_close(div, j @ curl @ j.T, atol=1e-13, rtol=0)


@pytest.mark.parametrize("cls", [CurlFreeKernel, DivFreeKernel, HelmholtzKernel])
def test_exact_kernel_layout_symmetry_and_psd(cls):
    dim = 3
    k = cls(input_dim=dim).to(DT)
    if cls is HelmholtzKernel:
        k.curl_lengthscale, k.div_lengthscale = 0.5, 0.9
        k.curl_outputscale, k.div_outputscale = 1.5, 0.3
    else:
        k.lengthscale = 0.6
    x, z = rand(8, dim, seed=5), rand(6, dim, seed=6)
    kxz = k(x, z).to_dense().detach()
    kzx = k(z, x).to_dense().detach()
    torch.testing.assert_close(kxz, kzx.T)  # K(x, z) = K(z, x)^T blockwise
    blocks = k._blocks(x, z).detach()
    for n, m, a, b in [(0, 0, 0, 1), (3, 2, 2, 0), (7, 5, 1, 1)]:
        assert kxz[n * dim + a, m * dim + b] == blocks[n, m, a, b]
    gram = k(x).to_dense().detach()
    eigs = torch.linalg.eigvalsh(gram + 1e-10 * torch.eye(gram.shape[0], dtype=DT))
    assert eigs.min() > 0
    torch.testing.assert_close(k(x, diag=True).detach(), gram.diagonal())


def test_helmholtz_exact_is_weighted_sum():
    k = HelmholtzKernel(input_dim=2).to(DT)
    k.curl_lengthscale, k.div_lengthscale = 0.4, 1.3
    k.curl_outputscale, k.div_outputscale = 2.0, 0.25
    x = rand(5, 2)
    expected = (2.0 * curl_free_gaussian(x, x, torch.tensor([[0.4]], dtype=DT))
                + 0.25 * div_free_gaussian(x, x, torch.tensor([[1.3]], dtype=DT)))
    torch.testing.assert_close(k._blocks(x, x).detach(), expected)
    curl_part = k.component_kernel("curl")(x).to_dense().detach()
    div_part = k.component_kernel("div")(x).to_dense().detach()
    torch.testing.assert_close(curl_part + div_part, k(x).to_dense().detach())


def test_exact_kernel_columns_are_curl_and_div_free():
    # K(., z) e_b is a curl-free (div-free) field of x, for the closed forms too
    z = rand(1, 3, seed=5)
    ls = torch.tensor([[0.6, 0.9, 1.4]], dtype=DT)
    for fn, check in [(curl_free_gaussian, "curl"), (div_free_gaussian, "div")]:
        for xi in rand(4, 3, seed=6):
            for b in range(3):
                jac = jacobian(lambda xx, fn=fn, b=b: fn(xx.unsqueeze(0), z, ls)[0, 0, :, b], xi)
                if check == "curl":
                    assert (jac - jac.T).abs().max() < 1e-12 * jac.abs().max()
                else:
                    assert jac.trace().abs() < 1e-12 * jac.abs().max()
