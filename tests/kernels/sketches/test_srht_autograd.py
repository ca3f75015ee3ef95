"""Gradients of the compiled TensorSRHT kernel: gradcheck, and agreement with the GEMM path.

The compiled backward is the transposed transform of the incoming gradient; these tests check
it against finite differences (``torch.autograd.gradcheck``, float64) and against autograd
through the GEMM path (same weights, so the same function: the gradients agree up to the
rounding of float64 sums).
"""

import pytest
import torch

from rfgp.kernels import PolynomialSketchKernel, sample_sketch
from rfgp.kernels._sketches import _srht_numba

needs_numba = pytest.mark.skipif(not _srht_numba.available(), reason="numba is not installed")

# (rows, input dim, features, degree, bias): d' = 2, 4, 8, 16 (odd and even log2 d': the last
# butterfly pass radix 2 or radix 4), D below, equal to and above d', not a multiple of d' (the
# last block's unused coefficients), degree 1 (no other factors) and several.
GRADCHECK_SHAPES = [(4, 1, 3, 2, True), (5, 3, 4, 3, False), (3, 3, 10, 2, True),
                    (3, 5, 16, 1, True), (4, 6, 20, 3, False), (2, 12, 16, 4, True)]


def _inputs(n, d, num_features, degree, bias, complex, ard, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = sample_sketch(degree, num_features, d + bias, "tensorsrht", complex, generator=g)
    x = torch.randn(n, d, dtype=torch.float64, generator=g).requires_grad_()
    scale = (torch.rand(d if ard else 1, dtype=torch.float64, generator=g) + 0.5).requires_grad_()
    root = torch.tensor(0.8, dtype=torch.float64, requires_grad=True) if bias else None
    return w, x, scale, root


@needs_numba
@pytest.mark.parametrize("complex", [False, True])
@pytest.mark.parametrize("ard", [False, True])
@pytest.mark.parametrize("n,d,num_features,degree,bias", GRADCHECK_SHAPES)
def test_gradcheck(complex, ard, n, d, num_features, degree, bias):
    w, x, scale, root = _inputs(n, d, num_features, degree, bias, complex, ard, seed=n + d)

    def features(x, scale, *root):
        return _srht_numba.TensorSRHTFunction.apply(x, scale, root[0] if root else None,
                                                    w["signs"], w["indices"], complex)

    inputs = (x, scale) + ((root,) if bias else ())
    assert torch.autograd.gradcheck(features, inputs)


def _kernel(complex, ard, bias, d=7, num_features=40, degree=3):
    kw = {"ard_num_dims": d} if ard else {}
    k = PolynomialSketchKernel(degree, num_features, bias=bias, projection="tensorsrht",
                               complex=complex, seed=1, **kw).double()
    g = torch.Generator().manual_seed(5)
    k.lengthscale = torch.rand(k.lengthscale.shape, dtype=torch.float64, generator=g) + 0.5
    if bias:
        k.bias = 0.6
    return k


def _features_and_gradients(k, x, weight):
    k.zero_grad()
    x = x.clone().requires_grad_()
    phi = k.real_features(x)
    (phi * weight).sum().backward()
    grads = {name: p.grad.clone() for name, p in k.named_parameters()}
    return phi.detach(), x.grad, grads


def _compiled_and_gemm(k, x, weight):
    """:func:`_features_and_gradients` through the compiled path, then through the GEMM path."""
    compiled = _features_and_gradients(k, x, weight)
    previous = _srht_numba.set_enabled(False)
    try:
        gemm = _features_and_gradients(k, x, weight)
    finally:
        _srht_numba.set_enabled(previous)
    return compiled, gemm


@needs_numba
@pytest.mark.parametrize("complex", [False, True])
@pytest.mark.parametrize("ard", [False, True])
@pytest.mark.parametrize("bias", [0.0, 0.6])
def test_kernel_gradients_match_the_gemm_path(complex, ard, bias):
    # real features and CtR ([Re, Im] of the complex ones); inputs, lengthscale and bias
    k = _kernel(complex, ard, bias)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(150, 7, dtype=torch.float64, generator=g)  # several tiles, a partial one
    weight = torch.randn(150, k.num_real_features, dtype=torch.float64, generator=g)
    compiled, gemm = _compiled_and_gemm(k, x, weight)
    torch.testing.assert_close(compiled[0], gemm[0], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(compiled[1], gemm[1], rtol=1e-10, atol=1e-12)
    assert set(compiled[2]) == set(gemm[2]) and compiled[2]
    for name in gemm[2]:
        torch.testing.assert_close(compiled[2][name], gemm[2][name], rtol=1e-10, atol=1e-12)


@needs_numba
@pytest.mark.parametrize("complex", [False, True])
def test_backward_threads_split_rows_without_changing_values(complex):
    w, x, scale, root = _inputs(333, 20, 70, 4, True, complex, ard=True, seed=3)
    threads = torch.get_num_threads()
    grads = []
    try:
        for count in (1, 3):
            torch.set_num_threads(count)
            out = _srht_numba.differentiable_tensorsrht(x, w["signs"], w["indices"], complex,
                                                        scale, root)
            grad = torch.ones_like(out)
            grads.append(torch.autograd.grad(out, (x, scale, root), grad))
    finally:
        torch.set_num_threads(threads)
    for one, three in zip(*grads):
        assert torch.equal(one, three)


@needs_numba
def test_batched_inputs_with_one_draw_of_weights():
    # x with leading batch dimensions (unbatched kernel): rows flattened through the compiled
    # function, gradients as through the GEMM path
    k = _kernel(complex=False, ard=True, bias=0.6)
    g = torch.Generator().manual_seed(7)
    x = torch.randn(2, 3, 20, 7, dtype=torch.float64, generator=g)
    weight = torch.randn(2, 3, 20, k.num_real_features, dtype=torch.float64, generator=g)
    compiled, gemm = _compiled_and_gemm(k, x, weight)
    assert compiled[0].shape == (2, 3, 20, 40)
    for a, b in zip(compiled[:2], gemm[:2]):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    for name in gemm[2]:
        torch.testing.assert_close(compiled[2][name], gemm[2][name], rtol=1e-10, atol=1e-12)


@needs_numba
@pytest.mark.parametrize("ard", [False, True])
@pytest.mark.parametrize("bias", [0.0, 0.6])
def test_conjugated_gradients_of_complex_features_match_the_gemm_path(ard, bias):
    # A loss on features.conj() hands the backward pass a lazily conjugated gradient (and
    # .conj().imag a negated one): both must be materialised before the compiled kernel reads
    # them, and give the GEMM path's gradients.
    k = _kernel(complex=True, ard=ard, bias=bias)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(90, 7, dtype=torch.float64, generator=g)
    weight = torch.randn(90, k.num_features, dtype=torch.complex128, generator=g)

    def gradients():
        k.zero_grad()
        xg = x.clone().requires_grad_()
        phi = k.features(xg)
        (phi.conj() * weight).real.sum().backward()
        return xg.grad, {name: p.grad.clone() for name, p in k.named_parameters()}

    compiled = gradients()
    previous = _srht_numba.set_enabled(False)
    try:
        gemm = gradients()
    finally:
        _srht_numba.set_enabled(previous)
    torch.testing.assert_close(compiled[0], gemm[0], rtol=1e-10, atol=1e-12)
    assert set(compiled[1]) == set(gemm[1]) and compiled[1]
    for name in gemm[1]:
        torch.testing.assert_close(compiled[1][name], gemm[1][name], rtol=1e-10, atol=1e-12)


@needs_numba
def test_gradcheck_through_conjugated_features():
    w, x, scale, root = _inputs(4, 3, 10, 2, True, True, ard=True, seed=11)

    def features(x, scale, root):
        phi = _srht_numba.TensorSRHTFunction.apply(x, scale, root, w["signs"], w["indices"], True)
        return phi.conj()

    assert torch.autograd.gradcheck(features, (x, scale, root))


@needs_numba
@pytest.mark.parametrize("complex", [False, True])
def test_backward_reads_lazy_views_of_the_gradient(complex):
    # a conjugated or negated view gives the gradient of its materialised values
    w, x, scale, root = _inputs(6, 5, 24, 3, True, complex, ard=False, seed=12)
    dtype = torch.complex128 if complex else torch.float64
    grad = torch.randn(6, 24, dtype=dtype, generator=torch.Generator().manual_seed(4))
    views = [torch._neg_view(grad)] + ([grad.conj()] if complex else [])
    for view in views:
        z = _srht_numba.tensorsrht_backward(x, w["signs"], w["indices"], complex, view, scale,
                                            root)
        expected = _srht_numba.tensorsrht_backward(x, w["signs"], w["indices"], complex,
                                                   view.clone().resolve_conj().resolve_neg(),
                                                   scale, root)
        assert torch.equal(z, expected)
