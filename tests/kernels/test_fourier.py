"""Statistical and exact tests of FourierFeatureKernel (RFF, ORF, SORF).

Reference values: Yu et al., *Orthogonal Random Features* (2016); see
``reference/orthogonal-features.md`` Sections 5.3 (ORF' closed forms) and 5.5 (variance ratios).
Monte Carlo runs draw ``T`` independent weight sets at once through a batch kernel
(``batch_shape=(T,)``), which the base class fills with independent draws.
"""

from __future__ import annotations

import math

import gpytorch
import numpy as np
import pytest
import scipy.linalg
import torch
from scipy import stats
from scipy.special import hyp0f1

from rfgp.kernels import FourierFeatureKernel
from rfgp.kernels._fourier import haar_orthogonal, sample_frequencies

SPECTRALS = ["rbf", "matern12", "matern32", "matern52"]
NU = {"matern12": 0.5, "matern32": 1.5, "matern52": 2.5}


# ---------------------------------------------------------------- helpers
def batch_kernel(spectral, sampling, input_dim, num_frequencies, num_draws, seed, lengthscale=1.0):
    kernel = FourierFeatureKernel(
        2 * num_frequencies,
        spectral=spectral,
        sampling=sampling,
        input_dim=input_dim,
        batch_shape=torch.Size([num_draws]),
    ).double()
    # A float64 tensor: GPyTorch turns a Python float into float32 before the inverse softplus.
    kernel.lengthscale = torch.tensor(lengthscale, dtype=torch.float64)
    kernel.resample(torch.Generator().manual_seed(seed))
    return kernel


def kernel_estimates(kernel, x, y):
    """``k_hat(x_j, y_j)`` for each weight draw: ``(T, n)``."""
    with torch.no_grad():
        return (kernel.features(x) * kernel.features(y)).sum(-1)


def exact_gpytorch(spectral, x, y, lengthscale):
    """The GPyTorch kernel (built independently of rfgp) on row pairs."""
    if spectral == "rbf":
        kernel = gpytorch.kernels.RBFKernel()
    else:
        kernel = gpytorch.kernels.MaternKernel(nu=NU[spectral])
    kernel = kernel.double()
    kernel.lengthscale = torch.tensor(lengthscale, dtype=torch.float64)
    with torch.no_grad():
        return kernel(x, y, diag=True)


def orf_prime_mean(spectral, dim, z):
    r"""``E[cos(w^T z)]`` for ``w = s sqrt(d) u``, u uniform on the sphere (ORF', Section 5.3).

    RBF: ``s = 1`` and the mean is ``0F1(; d/2; -d z^2/4)``. Matérn-nu: ``s^2 = 2 nu / c`` with
    ``c ~ chi2_{2 nu}`` (the Student-t radial scale), averaged numerically.
    """
    if spectral == "rbf":
        return hyp0f1(dim / 2, -dim * z**2 / 4)
    nu = NU[spectral]
    return stats.chi2(2 * nu).expect(lambda c: hyp0f1(dim / 2, -dim * z**2 * (2 * nu / c) / 4))


# ---------------------------------------------------------------- unbiasedness
@pytest.mark.parametrize("spectral", SPECTRALS)
@pytest.mark.parametrize(
    "sampling, input_dim, num_frequencies",
    [
        ("iid", 5, 8),
        ("orthogonal", 5, 8),  # one full and one partial block
        ("orthogonal", 6, 4),  # fewer frequencies than d: the first rows of one block
        ("orthogonal", 3, 9),  # three full blocks
    ],
)
def test_unbiased_against_gpytorch_kernel(
    spectral, sampling, input_dim, num_frequencies, points_at_distances, mc_mean
):
    num_draws, lengthscale = 4000, 1.3
    gen = torch.Generator().manual_seed(11)
    x, y = points_at_distances([0.3, 0.8, 1.5, 2.5], input_dim, gen, lengthscale)
    kernel = batch_kernel(spectral, sampling, input_dim, num_frequencies, num_draws, 1, lengthscale)
    mean, stderr = mc_mean(kernel_estimates(kernel, x, y))
    exact = exact_gpytorch(spectral, x, y, lengthscale)
    assert torch.all((mean - exact).abs() < 5 * stderr), (mean - exact) / stderr


@pytest.mark.slow
@pytest.mark.parametrize("spectral", SPECTRALS)
@pytest.mark.parametrize("direction", ["random", "axis"])
def test_structured_bias_matches_orf_prime(spectral, direction, points_at_distances, mc_mean):
    """SORF behaves like ORF' (fixed row norms): its bias is the ORF' closed-form bias.

    The tolerance is five standard errors plus 20% of the ORF' bias (SORF is only asymptotically
    equal to ORF'). An axis-aligned difference catches a missing HD block: with one block,
    ``sqrt(d) H D e_1`` has entries ``+-1`` and the estimate would be ``cos(z)`` exactly.
    """
    input_dim, num_draws, lengthscale = 32, 4000, 0.7
    distances = torch.tensor([0.5, 1.0, 1.5], dtype=torch.float64)
    gen = torch.Generator().manual_seed(5)
    x, y = points_at_distances(distances, input_dim, gen, lengthscale)
    if direction == "axis":
        y = x.clone()
        y[:, 7] += lengthscale * distances
    kernel = batch_kernel(spectral, "structured", input_dim, 48, num_draws, 2, lengthscale)
    mean, stderr = mc_mean(kernel_estimates(kernel, x, y))
    exact = exact_gpytorch(spectral, x, y, lengthscale)
    orf_prime = torch.tensor([orf_prime_mean(spectral, input_dim, z) for z in distances.tolist()])
    bias_bound = (orf_prime - exact).abs()
    assert torch.all(bias_bound > 0)
    assert torch.all((mean - orf_prime).abs() < 5 * stderr + 0.2 * bias_bound)
    assert torch.all((mean - exact).abs() < 5 * stderr + 1.2 * bias_bound)


def test_structured_padding_uses_the_padded_dimension(points_at_distances, mc_mean):
    # d = 20 is padded to d' = 32; the frequencies must be scaled by sqrt(32), not sqrt(20).
    num_draws, distance = 4000, 1.0
    x, y = points_at_distances([distance], 20, torch.Generator().manual_seed(3))
    kernel = batch_kernel("rbf", "structured", 20, 32, num_draws, 4)
    mean, stderr = mc_mean(kernel_estimates(kernel, x, y))
    orf_prime = hyp0f1(32 / 2, -32 * distance**2 / 4)
    bias = abs(orf_prime - math.exp(-0.5))
    assert abs(mean.item() - orf_prime) < 5 * stderr.item() + 0.2 * bias
    assert abs(mean.item() - math.exp(-0.5)) < 0.02


def test_structured_one_dimensional_input_is_a_cosine():
    # d = d' = 1: every frequency is +-1, so k_hat(x, y) = cos(x - y) for every draw.
    kernel = FourierFeatureKernel(8, sampling="structured", seed=0).double()
    kernel.lengthscale = torch.tensor(1.0, dtype=torch.float64)
    x = torch.tensor([[0.0], [0.4], [1.0], [-2.0]], dtype=torch.float64)
    with torch.no_grad():
        gram = kernel.features(x) @ kernel.features(x).T
    torch.testing.assert_close(gram, torch.cos(x - x.T), rtol=0, atol=1e-12)


# ---------------------------------------------------------------- variance reduction
# Var_ORF / Var_RFF at D = d frequencies (one block), exact series (digest Section 5.5).
ORF_VARIANCE_RATIO = {
    (16, 0.5): 0.1503,
    (16, 1.0): 0.1577,
    (16, 2.0): 0.6712,
    (32, 0.5): 0.0806,
    (32, 1.0): 0.1171,
    (32, 2.0): 0.6849,
}


@pytest.mark.slow
@pytest.mark.parametrize("input_dim", [16, 32])
def test_orf_variance_ratio_matches_theory(input_dim, points_at_distances, mc_variance):
    num_draws = 6000
    distances = torch.tensor([0.5, 1.0, 2.0], dtype=torch.float64)
    x, y = points_at_distances(distances, input_dim, torch.Generator().manual_seed(8))
    rff = kernel_estimates(batch_kernel("rbf", "iid", input_dim, input_dim, num_draws, 1), x, y)
    orf = kernel_estimates(
        batch_kernel("rbf", "orthogonal", input_dim, input_dim, num_draws, 2), x, y
    )
    var_rff, se_rff = mc_variance(rff)
    var_orf, se_orf = mc_variance(orf)
    # RFF variance in closed form (Lemma 1): (1 - e^{-z^2})^2 / (2 D).
    exact_rff = (1 - torch.exp(-(distances**2))) ** 2 / (2 * input_dim)
    assert torch.all((var_rff - exact_rff).abs() < 5 * se_rff)
    expected = torch.tensor(
        [ORF_VARIANCE_RATIO[(input_dim, z)] for z in distances.tolist()], dtype=torch.float64
    )
    # Against the exact RFF variance: the only noise is that of the ORF variance estimate.
    assert torch.all((var_orf / exact_rff - expected).abs() < 5 * se_orf / exact_rff)
    # Empirical ratio of two independent estimates (delta method for the standard error).
    ratio = var_orf / var_rff
    se_ratio = ratio * torch.sqrt((se_orf / var_orf) ** 2 + (se_rff / var_rff) ** 2)
    assert torch.all((ratio - expected).abs() < 5 * se_ratio)
    assert torch.all(ratio + 5 * se_ratio < 1)


def test_orf_blocks_add_independently(points_at_distances, mc_variance):
    # Var_ORF(D = m d) = Var_ORF(D = d) / m (Corollary 1 with independent blocks).
    input_dim, num_draws = 8, 6000
    x, y = points_at_distances([1.0], input_dim, torch.Generator().manual_seed(2))
    one = kernel_estimates(batch_kernel("rbf", "orthogonal", input_dim, 8, num_draws, 1), x, y)
    three = kernel_estimates(batch_kernel("rbf", "orthogonal", input_dim, 24, num_draws, 2), x, y)
    var_one, se_one = mc_variance(one)
    var_three, se_three = mc_variance(three)
    diff = var_three - var_one / 3
    assert diff.abs().item() < 5 * math.sqrt(se_three.item() ** 2 + (se_one.item() / 3) ** 2)


# ---------------------------------------------------------------- ORF structure
@pytest.mark.parametrize("input_dim, num_frequencies", [(7, 7), (7, 17), (16, 40), (10, 4)])
def test_orf_rows_orthogonal_within_each_block(input_dim, num_frequencies, generator):
    w = sample_frequencies(num_frequencies, input_dim, "rbf", "orthogonal",
                           torch.Size([3]), generator)
    assert w.shape == (3, num_frequencies, input_dim)
    for start in range(0, num_frequencies, input_dim):
        block = w[:, start : start + input_dim]
        gram = block @ block.transpose(-1, -2)
        norms2 = torch.diagonal(gram, dim1=-2, dim2=-1)
        off = gram - torch.diag_embed(norms2)
        assert off.abs().max() < 1e-12 * norms2.max()
    if num_frequencies > input_dim:
        # Rows of different blocks are not orthogonal (independent rotations).
        cross = w[:, :input_dim] @ w[:, input_dim : 2 * input_dim].transpose(-1, -2)
        assert cross.abs().max() > 1e-3


@pytest.mark.parametrize("spectral", ["rbf", "matern32"])
def test_orf_row_norms_follow_the_radial_law(spectral, generator):
    """RBF: ||w|| ~ chi_d. Matérn-nu: ||w||^2 / d ~ F(d, 2 nu) (chi2_d / d over chi2_{2nu} / 2nu).

    Kolmogorov–Smirnov at level 1e-3 (a wrong law, e.g. unit rows or chi_{d-1}, fails clearly).
    """
    input_dim = 6
    w = sample_frequencies(600 * input_dim, input_dim, spectral, "orthogonal", generator=generator)
    norms = w.norm(dim=-1).numpy()
    if spectral == "rbf":
        result = stats.kstest(norms, stats.chi(df=input_dim).cdf)
        wrong = stats.kstest(norms, stats.chi(df=input_dim - 1).cdf)
    else:
        nu = NU[spectral]
        result = stats.kstest(norms**2 / input_dim, stats.f(input_dim, 2 * nu).cdf)
        wrong = stats.kstest(norms**2 / input_dim, stats.f(input_dim, 2 * nu + 2).cdf)
    assert result.pvalue > 1e-3
    assert wrong.pvalue < 1e-3


def test_haar_orthogonal_is_uniform(generator):
    q = haar_orthogonal((20000,), 3, generator)
    torch.testing.assert_close(q @ q.transpose(-1, -2), torch.eye(3, dtype=torch.float64).expand(
        20000, 3, 3), rtol=0, atol=1e-12)
    # Haar: every entry has mean 0 and variance 1/d; without the sign fix of QR, Q[0, 0] < 0.
    entries = q.reshape(20000, 9)
    stderr = math.sqrt(1 / 3 / 20000)
    assert entries.mean(0).abs().max() < 5 * stderr
    # Q[0, 0]^2 ~ Beta(1/2, (d - 1)/2).
    assert stats.kstest(q[:, 0, 0].pow(2).numpy(), stats.beta(0.5, 1.0).cdf).pvalue > 1e-3


# ---------------------------------------------------------------- SORF structure
def dense_sorf_matrix(signs: torch.Tensor) -> torch.Tensor:
    """Rows ``sqrt(d') H D_1 H D_2 H D_3`` per block from the sign buffer ``(B, 3, d')``."""
    padded = signs.shape[-1]
    h = torch.from_numpy(scipy.linalg.hadamard(padded).astype(np.float64)) / math.sqrt(padded)
    blocks = [
        math.sqrt(padded) * h @ torch.diag(s[0]) @ h @ torch.diag(s[1]) @ h @ torch.diag(s[2])
        for s in signs
    ]
    return torch.cat(blocks, 0)


@pytest.mark.parametrize("dense_max_dim", [0, 1024])  # the FWHT route and the dense route
@pytest.mark.parametrize(
    "input_dim, num_frequencies", [(1, 3), (8, 8), (5, 20), (32, 50), (100, 300), (300, 700)]
)
def test_structured_projection_matches_dense_reference(
    input_dim, num_frequencies, dense_max_dim, generator
):
    kernel = FourierFeatureKernel(2 * num_frequencies, sampling="structured", seed=3).double()
    kernel.structured_dense_max_dim = dense_max_dim
    kernel.lengthscale = torch.tensor(0.8, dtype=torch.float64)
    x = torch.randn(2 * input_dim + 1, input_dim, generator=generator, dtype=torch.float64)
    with torch.no_grad():
        phi = kernel.features(x)
    signs = kernel.signs
    padded = 1 << (input_dim - 1).bit_length()
    assert signs.shape == (math.ceil(num_frequencies / padded), 3, padded)
    assert set(signs.unique().tolist()) == {-1.0, 1.0}
    w = dense_sorf_matrix(signs)[:num_frequencies]
    x_padded = torch.cat([x, torch.zeros(len(x), padded - input_dim, dtype=torch.float64)], -1)
    proj = x_padded / 0.8 @ w.T
    expected = torch.cat([torch.cos(proj), torch.sin(proj)], -1) / math.sqrt(num_frequencies)
    torch.testing.assert_close(phi, expected, rtol=1e-10, atol=1e-10)
    # Gradients with respect to the lengthscale agree between the two routes.
    phi_sum = kernel.features(x).sum()
    (grad,) = torch.autograd.grad(phi_sum, kernel.raw_lengthscale)
    lengthscale = kernel.lengthscale.detach().requires_grad_(True)
    proj_ref = x_padded / lengthscale @ w.T
    ref_sum = (torch.cat([proj_ref.cos(), proj_ref.sin()], -1) / math.sqrt(num_frequencies)).sum()
    (grad_l,) = torch.autograd.grad(ref_sum, lengthscale)
    sigmoid = torch.sigmoid(kernel.raw_lengthscale.detach())  # d softplus / d raw
    torch.testing.assert_close(grad, grad_l * sigmoid, rtol=1e-8, atol=1e-10)


def test_structured_rows_have_norm_sqrt_padded_dim():
    # W_b W_b^T = d' I for every block (digest Section 8, property 2).
    kernel = FourierFeatureKernel(2 * 64, sampling="structured", input_dim=32, seed=1).double()
    with torch.no_grad():
        w_t = kernel.projections(torch.eye(32, dtype=torch.float64))  # (d, M) = W^T
    for block in w_t.T.split(32):
        torch.testing.assert_close(block @ block.T, 32 * torch.eye(32, dtype=torch.float64),
                                   rtol=0, atol=1e-10)


def test_structured_matern_scales_rows_by_student_t(generator):
    kernel = FourierFeatureKernel(2 * 16, spectral="matern52", sampling="structured",
                                  input_dim=16, seed=0).double()
    rbf = FourierFeatureKernel(2 * 16, sampling="structured", input_dim=16, seed=0).double()
    x = torch.randn(4, 16, generator=generator, dtype=torch.float64)
    with torch.no_grad():
        kernel.projections(x)
        rbf.load_state_dict({"signs": kernel.signs, **{k: v for k, v in rbf.state_dict().items()
                                                       if k != "signs"}}, strict=False)
        ratio = kernel.projections(x) / rbf.projections(x)
    assert kernel.radial_scale.shape == (16,)
    torch.testing.assert_close(ratio, kernel.radial_scale.expand(4, 16), rtol=1e-10, atol=0)


# ---------------------------------------------------------------- exact identities
@pytest.mark.parametrize("sampling", ["iid", "orthogonal", "structured"])
def test_feature_identities(sampling, generator):
    kernel = FourierFeatureKernel(40, sampling=sampling, seed=0).double()
    x = torch.randn(30, 3, generator=generator, dtype=torch.float64)
    with torch.no_grad():
        phi = kernel.features(x)
        gram = phi @ phi.T
        proj = kernel.projections(x / kernel.lengthscale)
    # k_hat(x, y) = (1/M) sum_i cos(w_i^T (x - y)); diagonal exactly 1; PSD with rank <= D.
    expected = torch.cos(proj.unsqueeze(1) - proj.unsqueeze(0)).mean(-1)
    torch.testing.assert_close(gram, expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(torch.diagonal(gram), torch.ones(30, dtype=torch.float64))
    eig = torch.linalg.eigvalsh(gram)
    assert eig.min() > -1e-10
    assert int((eig > 1e-9).sum()) <= 40


@pytest.mark.parametrize("sampling", ["iid", "orthogonal", "structured"])
def test_ard_lengthscale_scales_the_inputs(sampling, generator):
    kernel = FourierFeatureKernel(32, sampling=sampling, ard_num_dims=3, seed=4).double()
    lengthscale = torch.tensor([[0.5, 2.0, 1.5]], dtype=torch.float64)
    kernel.lengthscale = lengthscale
    x = torch.randn(10, 3, generator=generator, dtype=torch.float64)
    phi = kernel.features(x)
    unit = FourierFeatureKernel(32, sampling=sampling, ard_num_dims=3, seed=4).double()
    unit.lengthscale = torch.ones(1, 3, dtype=torch.float64)
    torch.testing.assert_close(phi, unit.features(x / lengthscale), rtol=1e-12, atol=1e-14)
    # Gradients reach every lengthscale and are finite.
    phi.sum().backward()
    grad = kernel.raw_lengthscale.grad
    assert grad.shape == (1, 3)
    assert torch.isfinite(grad).all() and torch.all(grad != 0)


@pytest.mark.parametrize("spectral", SPECTRALS)
def test_exact_kernel_is_the_matching_gpytorch_kernel(spectral, generator):
    kernel = FourierFeatureKernel(16, spectral=spectral, ard_num_dims=2).double()
    kernel.lengthscale = torch.tensor([[0.7, 1.9]], dtype=torch.float64)
    exact = kernel.exact_kernel()
    kernels = gpytorch.kernels
    expected_type = kernels.RBFKernel if spectral == "rbf" else kernels.MaternKernel
    assert type(exact) is expected_type
    if spectral != "rbf":
        assert exact.nu == NU[spectral]
    x = torch.randn(5, 2, generator=generator, dtype=torch.float64)
    reference = expected_type(**({} if spectral == "rbf" else {"nu": NU[spectral]}),
                              ard_num_dims=2).double()
    reference.lengthscale = torch.tensor([[0.7, 1.9]], dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(exact(x).to_dense(), reference(x).to_dense())


@pytest.mark.parametrize("sampling", ["iid", "orthogonal", "structured"])
def test_float32_matches_float64(sampling, generator):
    k64 = FourierFeatureKernel(64, spectral="matern32", sampling=sampling, seed=2).double()
    k32 = FourierFeatureKernel(64, spectral="matern32", sampling=sampling, seed=2)
    x = torch.randn(8, 5, generator=generator, dtype=torch.float64)
    with torch.no_grad():
        phi32 = k32.features(x.float())
        phi64 = k64.features(x)
    assert phi32.dtype == torch.float32
    torch.testing.assert_close(phi32.double(), phi64, rtol=0, atol=1e-4)


def test_kernel_matrix_error_shrinks_with_features(generator):
    # ||K_hat - K||_F decreases like D^{-1/2} (here: 16x more features, at least 2x smaller).
    x = torch.randn(40, 4, generator=generator, dtype=torch.float64)
    exact = gpytorch.kernels.RBFKernel().double()
    with torch.no_grad():
        k_exact = exact(x).to_dense()
        errors = []
        for num_features in (32, 512):
            err = 0.0
            for seed in range(5):
                kernel = FourierFeatureKernel(num_features, sampling="iid", seed=seed).double()
                phi = kernel.features(x)
                err += (phi @ phi.T - k_exact).pow(2).sum().item() / 5
            errors.append(err)
    assert errors[1] < errors[0] / 4


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize("bad", [0, 1, 3, 7, -2])
def test_num_features_must_be_even_and_at_least_two(bad):
    with pytest.raises(ValueError, match=rf"num_features must be an even integer >= 2.*{bad!r}"):
        FourierFeatureKernel(bad)


@pytest.mark.parametrize("bad", [4.0, True, "8"])
def test_num_features_must_be_an_integer(bad):
    with pytest.raises(TypeError, match=r"num_features must be an integer"):
        FourierFeatureKernel(bad)


def test_unknown_spectral_and_sampling():
    with pytest.raises(ValueError, match=r"spectral must be one of .*'matern'"):
        FourierFeatureKernel(8, spectral="matern")
    with pytest.raises(ValueError, match=r"sampling must be one of .*'qmc'"):
        FourierFeatureKernel(8, sampling="halton")
    with pytest.raises(ValueError, match=r"sampling must be one of"):
        sample_frequencies(4, 2, sampling="structured")
    with pytest.raises(ValueError, match=r"spectral must be one of"):
        sample_frequencies(4, 2, spectral="laplace")


@pytest.mark.parametrize("sampling", ["iid", "orthogonal", "structured"])
def test_wrong_input_dimension_after_first_call(sampling):
    kernel = FourierFeatureKernel(8, sampling=sampling)
    kernel.features(torch.randn(4, 3))
    with pytest.raises(ValueError, match=r"x must have 3 input columns.*got 5"):
        kernel.features(torch.randn(4, 5))
    with pytest.raises(ValueError, match=r"x must have 3 input columns.*got 2"):
        kernel(torch.randn(4, 2)).to_dense()
    fixed = FourierFeatureKernel(8, sampling=sampling, input_dim=2)
    with pytest.raises(ValueError, match=r"x must have 2 input columns.*got 4"):
        fixed.features(torch.randn(3, 4))


@pytest.mark.parametrize("bad_value", [float("nan"), float("inf")])
def test_non_finite_inputs_raise(bad_value):
    kernel = FourierFeatureKernel(8, seed=0)
    x = torch.randn(4, 2)
    x[1, 0] = bad_value
    with pytest.raises(ValueError, match="x must be finite"):
        kernel.features(x)
    with pytest.raises(ValueError, match="x must be finite"):
        kernel(x).to_dense()


def test_integer_inputs_raise():
    with pytest.raises(TypeError, match="x must have a floating dtype"):
        FourierFeatureKernel(8).features(torch.ones(3, 2, dtype=torch.long))


# ---------------------------------------------------------------- padding option
def test_pad_to_behaves_like_sorf_in_the_padded_dimension(points_at_distances, mc_mean):
    # d = 4 zero-padded to d' = 32: the bias is that of ORF' in dimension 32, not 4.
    num_draws = 4000
    distances = torch.tensor([0.5, 1.0, 1.5], dtype=torch.float64)
    x, y = points_at_distances(distances, 4, torch.Generator().manual_seed(9))
    kernel = FourierFeatureKernel(2 * 32, sampling="structured", input_dim=4, pad_to=20,
                                  batch_shape=torch.Size([num_draws])).double()
    kernel.lengthscale = torch.tensor(1.0, dtype=torch.float64)
    kernel.resample(torch.Generator().manual_seed(1))
    assert kernel.signs.shape == (num_draws, 1, 3, 32)
    mean, stderr = mc_mean(kernel_estimates(kernel, x, y))
    exact = torch.exp(-(distances**2) / 2)
    orf_prime_32 = torch.tensor([hyp0f1(16, -32 * z**2 / 4) for z in distances.tolist()])
    orf_prime_4 = torch.tensor([hyp0f1(2, -4 * z**2 / 4) for z in distances.tolist()])
    bias = (orf_prime_32 - exact).abs()
    assert torch.all((mean - orf_prime_32).abs() < 5 * stderr + 0.2 * bias)
    # Without padding the bias would be that of d' = 4, several times larger.
    assert torch.all((mean - exact).abs() < 0.5 * (orf_prime_4 - exact).abs())


def test_pad_to_matches_dense_reference(generator):
    kernel = FourierFeatureKernel(2 * 40, sampling="structured", pad_to=64, seed=2).double()
    x = torch.randn(9, 3, generator=generator, dtype=torch.float64)
    with torch.no_grad():
        phi = kernel.features(x)
        w = dense_sorf_matrix(kernel.signs)[:40]
    assert kernel.signs.shape == (1, 3, 64)
    x_padded = torch.cat([x, torch.zeros(9, 61, dtype=torch.float64)], -1)
    proj = x_padded / kernel.lengthscale.detach() @ w.T
    expected = torch.cat([proj.cos(), proj.sin()], -1) / math.sqrt(40)
    torch.testing.assert_close(phi, expected, rtol=1e-10, atol=1e-10)


def test_pad_to_errors():
    with pytest.raises(ValueError, match="pad_to must be an integer >= 1, got 0"):
        FourierFeatureKernel(8, sampling="structured", pad_to=0)
    with pytest.raises(ValueError, match="pad_to applies to sampling='structured' only"):
        FourierFeatureKernel(8, sampling="iid", pad_to=32)


@pytest.mark.parametrize("sampling,spectral", [("iid", "rbf"), ("orthogonal", "matern32"),
                                               ("structured", "matern52")])
def test_scaled_projections_are_the_arguments_of_the_features(sampling, spectral):
    # Phi(x) = M^{-1/2} [cos P, sin P] with P = W (x / l): the features from the projections,
    # and P itself from the frequencies' projections of the scaled inputs; a lengthscale set
    # after a first call is used by the next one.
    from rfgp.kernels._fourier import cos_sin_features

    k = FourierFeatureKernel(16, spectral=spectral, sampling=sampling, input_dim=3,
                             ard_num_dims=3, seed=4).double()
    x = torch.randn(7, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    for lengthscale in ([[0.5, 1.0, 2.0]], [[3.0, 0.2, 1.0]]):
        k.lengthscale = torch.tensor(lengthscale, dtype=torch.float64)
        p = k.scaled_projections(x)
        torch.testing.assert_close(p, k.projections(x / k.lengthscale), rtol=1e-12, atol=0)
        torch.testing.assert_close(cos_sin_features(p, 1 / math.sqrt(8)), k.features(x),
                                   rtol=1e-12, atol=1e-15)
    assert k.scaled_projections(x[:0]).shape == (0, 8)


def test_scaled_projections_reject_bad_input():
    k = FourierFeatureKernel(8, input_dim=2, seed=0)
    with pytest.raises(ValueError, match="NaN|finite"):
        k.scaled_projections(torch.tensor([[0.0, float("nan")]]))
    with pytest.raises(ValueError, match="NaN|finite"):
        k.scaled_projections(torch.tensor([[0.0, float("inf")]]))
    with pytest.raises(ValueError):
        k.scaled_projections(torch.tensor(1.0))
    with pytest.raises(TypeError):
        k.scaled_projections(torch.zeros(3, 2, dtype=torch.int64))


def test_cos_sin_features_refuses_a_buffer_it_cannot_write():
    # The buffer route is for passes without autograd, into a buffer of the result's shape
    # and dtype: anything else is refused by name, never written partly or cast.
    from rfgp.kernels._fourier import cos_sin_features

    proj = torch.randn(3, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match="out must have shape"):
        cos_sin_features(proj, 1.0, out=torch.empty(3, 7, dtype=torch.float64))
    with pytest.raises(ValueError, match="out must have shape .* and dtype"):
        cos_sin_features(proj, 1.0, out=torch.empty(3, 8, dtype=torch.float32))
    with pytest.raises(ValueError, match="without autograd"):
        cos_sin_features(proj.requires_grad_(), 1.0, out=torch.empty(3, 8, dtype=torch.float64))
    out = torch.empty(3, 8, dtype=torch.float64)
    assert cos_sin_features(proj.detach(), 0.5, out=out) is out
    torch.testing.assert_close(out, 0.5 * torch.cat([proj.cos(), proj.sin()], -1).detach(),
                               rtol=0, atol=4 * torch.finfo(torch.float64).eps)
