"""The compiled (numba) TensorSRHT kernel against Algorithm 1 written out with dense matrices."""

import math
import warnings

import pytest
import torch
from scipy.linalg import hadamard

from rfgp.kernels import PolynomialSketchKernel, apply_sketch, sample_sketch
from rfgp.kernels._sketches import _srht_numba

needs_numba = pytest.mark.skipif(not _srht_numba.available(), reason="numba is not installed")


def algorithm_1(x, w, degree, complex, scale=None, root=None):
    """phi_l = prod_i (H_{d'} diag(s_{i, b(l)}) x~)_{pi_i(l)} / sqrt(D) with dense H_{d'}."""
    x = x.double()
    if scale is not None:
        x = x / scale.double().reshape(-1)
    if root is not None:
        x = torch.cat([x, root.double().expand(x.shape[0], 1)], dim=-1)
    signs, idx = w["signs"].double(), w["indices"]
    padded = signs.shape[-2] if complex else signs.shape[-1]
    x = torch.nn.functional.pad(x, (0, padded - x.shape[-1]))
    s = torch.complex(signs[..., 0], signs[..., 1]) if complex else signs  # (p, K, d')
    h = torch.from_numpy(hadamard(padded)).to(s.dtype)
    # t[n, i, b, k] = sum_j H[k, j] s[i, b, j] x[n, j]
    t = torch.einsum("kj,nibj->nibk", h, s.unsqueeze(0) * x[:, None, None, :].to(s.dtype))
    t = t.reshape(x.shape[0], degree, t.shape[-2] * t.shape[-1])
    phi = torch.ones(x.shape[0], idx.shape[-1], dtype=s.dtype)
    for i in range(degree):
        phi = phi * t[:, i, idx[i]]
    return phi / math.sqrt(idx.shape[-1])


def _close(out, ref):
    if out.dtype in (torch.float64, torch.complex128):
        torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    else:  # float32 rounding of p-fold products of sums of d' terms
        scale = float(ref.abs().max()) if ref.numel() else 1.0
        torch.testing.assert_close(out, ref.to(out.dtype), rtol=1e-4, atol=1e-5 * scale)


# (rows, input dim, features, degree): d' = 1, 2, 4, 8 (odd and even log2 d': radix-2 first
# pass or not), 64, 2048 (32-row tiles); D below, equal to and above d', not a multiple of d';
# rows below one tile, several tiles with a partial last one, and none.
SHAPES = [(7, 1, 5, 3), (100, 2, 3, 2), (65, 3, 9, 4), (130, 5, 20, 3), (1, 16, 16, 1),
          (130, 33, 200, 4), (65, 8, 24, 7), (70, 1500, 100, 2), (0, 6, 10, 2)]


@needs_numba
@pytest.mark.parametrize("complex", [False, True])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("n,d,num_features,degree", SHAPES)
def test_matches_algorithm_1(complex, dtype, n, d, num_features, degree):
    g = torch.Generator().manual_seed(n + d + num_features)
    w = sample_sketch(degree, num_features, d, "tensorsrht", complex, generator=g)
    x = torch.randn(n, d, dtype=dtype, generator=g)
    out = _srht_numba.tensorsrht(x, w["signs"], w["indices"], complex)
    assert out.shape == (n, num_features)
    assert out.dtype == (x.dtype if not complex else torch.complex128 if dtype == torch.float64
                         else torch.complex64)
    _close(out, algorithm_1(x, w, degree, complex))
    # the public entry point takes this path for unbatched CPU weights without autograd
    _close(apply_sketch(x, w, degree, "tensorsrht", complex), algorithm_1(x, w, degree, complex))


@needs_numba
@pytest.mark.parametrize("complex", [False, True])
@pytest.mark.parametrize("rows", [1, 3, 8])
def test_any_tile_height(monkeypatch, complex, rows):
    # tiles of fewer rows (what very large d' gets) and heights that leave vector remainders
    monkeypatch.setattr(_srht_numba, "_tile_rows", lambda padded: rows)
    g = torch.Generator().manual_seed(rows)
    w = sample_sketch(3, 40, 12, "tensorsrht", complex, generator=g)
    x = torch.randn(11, 12, dtype=torch.float64, generator=g)
    _close(_srht_numba.tensorsrht(x, w["signs"], w["indices"], complex),
           algorithm_1(x, w, 3, complex))


def test_tile_rows_bound_the_tile_size():
    for log2 in range(0, 21):
        rows = _srht_numba._tile_rows(1 << log2)
        assert 1 <= rows <= 64 and (rows << log2) <= max(1 << 16, 1 << log2)
        if log2 <= 12:
            assert rows % 16 == 0


@needs_numba
@pytest.mark.parametrize("complex", [False, True])
@pytest.mark.parametrize("shared", [False, True])
def test_homogenisation_in_the_tile_fill(complex, shared):
    # [x / scale, root] built inside the kernel equals the explicitly homogenised input
    g = torch.Generator().manual_seed(4)
    x = torch.randn(90, 6, dtype=torch.float64, generator=g)
    w = sample_sketch(3, 30, 7, "tensorsrht", complex, generator=g)
    scale = torch.rand(1 if shared else 6, 1, dtype=torch.float64, generator=g) + 0.5
    root = torch.tensor(0.8, dtype=torch.float64)
    out = _srht_numba.tensorsrht(x, w["signs"], w["indices"], complex, scale, root)
    _close(out, algorithm_1(x, w, 3, complex, scale.expand(6, 1), root))


@needs_numba
@pytest.mark.parametrize("complex", [False, True])
def test_threads_split_rows_without_changing_values(complex):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(333, 20, generator=g)
    w = sample_sketch(4, 70, 20, "tensorsrht", complex, generator=g)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = _srht_numba.tensorsrht(x, w["signs"], w["indices"], complex)
        torch.set_num_threads(3)
        three = _srht_numba.tensorsrht(x, w["signs"], w["indices"], complex)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, three)  # each row is computed by the same sequence of operations


@needs_numba
def test_kernel_features_take_the_compiled_path(monkeypatch):
    k = PolynomialSketchKernel(3, 40, bias=0.5, projection="tensorsrht", ard_num_dims=5,
                               seed=0).double()
    x = torch.randn(50, 5, dtype=torch.float64)
    calls = []
    for name in ("tensorsrht", "tensorsrht_backward"):
        original = getattr(_srht_numba, name)
        monkeypatch.setattr(_srht_numba, name,
                            lambda *a, f=original, n=name, **kw: calls.append(n) or f(*a, **kw))
    with torch.no_grad():
        phi = k.features(x)
    assert calls == ["tensorsrht"]
    ls = k.lengthscale.detach().reshape(-1, 1)
    _close(phi, algorithm_1(x, k._weights(), 3, False, ls, k.bias.detach().sqrt().reshape(())))
    # with autograd (learnable lengthscale and bias) forward and backward run compiled too
    calls.clear()
    out = k.features(x)
    torch.testing.assert_close(out.detach(), phi)
    out.sum().backward()
    assert calls[-2:] == ["tensorsrht", "tensorsrht_backward"]  # after a one-row warm-up
    assert k.raw_lengthscale.grad.abs().sum() > 0 and k.raw_bias.grad.abs().sum() > 0


def test_applies_only_where_it_can():
    g = torch.Generator().manual_seed(0)
    w = sample_sketch(2, 8, 4, "tensorsrht", generator=g)
    x = torch.randn(3, 4)
    xg = x.clone().requires_grad_(True)
    assert _srht_numba.applies(xg, w["indices"]) == _srht_numba.available()  # autograd too
    assert not _srht_numba.applies(x.half(), w["indices"])
    assert not _srht_numba.applies(x, w["indices"].unsqueeze(0))  # batched weights


def test_environment_variable_disables_it(monkeypatch):
    monkeypatch.setenv("RFGP_DISABLE_NUMBA", "1")
    assert not _srht_numba.available()
    g = torch.Generator().manual_seed(1)
    w = sample_sketch(3, 12, 5, "tensorsrht", generator=g)
    x = torch.randn(9, 5, dtype=torch.float64, generator=g)
    _close(apply_sketch(x, w, 3, "tensorsrht"), algorithm_1(x, w, 3, False))


def _pretend_numba(monkeypatch, installed):
    monkeypatch.delenv("RFGP_DISABLE_NUMBA", raising=False)
    monkeypatch.setitem(_srht_numba._state, "enabled", True)
    monkeypatch.setitem(_srht_numba._state, "checked", True)
    monkeypatch.setitem(_srht_numba._state, "numba", installed)
    monkeypatch.setitem(_srht_numba._state, "warned", False)
    monkeypatch.setitem(_srht_numba._state, "backward_ready", set())


def test_compile_failure_falls_back_with_a_warning(monkeypatch):
    def broken():
        raise RuntimeError("no compiler here")

    _pretend_numba(monkeypatch, True)
    monkeypatch.setattr(_srht_numba, "_kernels", broken)
    g = torch.Generator().manual_seed(3)
    w = sample_sketch(2, 10, 3, "tensorsrht", generator=g)
    x = torch.randn(6, 3, dtype=torch.float64, generator=g)
    with pytest.warns(RuntimeWarning, match="no compiler here"):
        phi = apply_sketch(x, w, 2, "tensorsrht")
    _close(phi, algorithm_1(x, w, 2, False))
    assert not _srht_numba.available()  # switched off: no warning on every call


@pytest.mark.parametrize("complex", [False, True])
def test_backward_compile_failure_falls_back_before_autograd_records(monkeypatch, complex):
    # the backward kernel is tried once per dtype before the autograd function is used: a
    # platform where it cannot compile gets the GEMM path's values and gradients
    _pretend_numba(monkeypatch, True)
    monkeypatch.setattr(_srht_numba, "tensorsrht_backward",
                        lambda *a, **kw: (_ for _ in ()).throw(RuntimeError("no backward")))
    g = torch.Generator().manual_seed(4)
    w = sample_sketch(3, 12, 5, "tensorsrht", complex, generator=g)
    x = torch.randn(8, 4, dtype=torch.float64, generator=g).requires_grad_()
    scale = torch.tensor([1.3], dtype=torch.float64, requires_grad=True)
    root = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    with pytest.warns(RuntimeWarning, match="no backward"):
        out = _srht_numba.differentiable_tensorsrht(x, w["signs"], w["indices"], complex,
                                                    scale, root)
    assert out is None and not _srht_numba.available()
    from rfgp.kernels._sketches.tensorsrht import apply_tensorsrht

    phi = apply_tensorsrht(x, w, 3, complex, scale, root)
    ref = algorithm_1(x, w, 3, complex, scale.expand(4), root)
    _close(phi.detach(), ref.detach())
    got = torch.autograd.grad(phi.real.sum(), (x, scale, root))
    want = torch.autograd.grad(ref.real.sum(), (x, scale, root))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_missing_numba_warns_once_naming_the_extra(monkeypatch):
    _pretend_numba(monkeypatch, False)
    g = torch.Generator().manual_seed(5)
    w = sample_sketch(3, 12, 5, "tensorsrht", generator=g)
    x = torch.randn(9, 5, dtype=torch.float64, generator=g)
    with pytest.warns(UserWarning, match=r"rfgp\[fast\]"):
        phi = apply_sketch(x, w, 3, "tensorsrht")
    _close(phi, algorithm_1(x, w, 3, False))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        apply_sketch(x, w, 3, "tensorsrht")  # once per process, not on every call


def test_disabling_by_environment_does_not_warn(monkeypatch):
    _pretend_numba(monkeypatch, False)
    monkeypatch.setenv("RFGP_DISABLE_NUMBA", "1")
    g = torch.Generator().manual_seed(6)
    w = sample_sketch(3, 12, 5, "tensorsrht", generator=g)
    x = torch.randn(9, 5, dtype=torch.float64, generator=g)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _close(apply_sketch(x, w, 3, "tensorsrht"), algorithm_1(x, w, 3, False))


def test_set_enabled_checks_its_argument():
    with pytest.raises(TypeError, match="enabled must be a bool"):
        _srht_numba.set_enabled("yes")


@needs_numba
@pytest.mark.parametrize("padded", [1, 2, 4, 8, 16, 32, 64, 128, 256])
def test_transform_pair_is_the_signed_hadamard_and_its_transpose(padded):
    # One radix-4 butterfly serves both: signed_fwht is c H diag(s), fwht_signed_add adds
    # c diag(s) H (its transpose, H symmetric); odd and even log2 d' and d' = 1.
    from rfgp.kernels._sketches import _srht_kernels

    kernels = _srht_kernels.build()
    g = torch.Generator().manual_seed(padded)
    rows, c = 5, 0.75
    xt = torch.randn(padded, rows, dtype=torch.float64, generator=g)
    s = torch.randint(0, 2, (padded,), generator=g).double() * 2 - 1
    h = torch.from_numpy(hadamard(padded)).double()
    t = torch.empty(padded, rows, dtype=torch.float64)
    kernels.signed_fwht(t.numpy(), xt.numpy(), s.numpy(), c)
    torch.testing.assert_close(t, c * h @ (s[:, None] * xt), rtol=1e-13, atol=1e-12)
    acc = torch.randn(padded, rows, dtype=torch.float64, generator=g)
    expected = acc + c * s[:, None] * (h @ xt)
    kernels.fwht_signed_add(acc.numpy(), xt.clone().numpy(), s.numpy(), c)
    torch.testing.assert_close(acc, expected, rtol=1e-13, atol=1e-12)
