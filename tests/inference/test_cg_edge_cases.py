"""The iterative solve (solve="cg") at the edges: units of any scale, float32 with tiny noise,
a zero kernel, invalid arguments. It answers as the weight-space solve does, or refuses as
clearly."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from gpytorch.kernels import ScaleKernel
from linear_operator.utils.errors import NotPSDError

from rfgp import RandomFeatureGP
from rfgp.inference._iterative import conjugate_gradients, lanczos_condition
from rfgp.inference._nystrom import NystromPreconditioner
from rfgp.inference._stochastic_evidence import stochastic_log_evidence
from rfgp.kernels import FourierFeatureKernel, PolynomialSketchKernel

DT = torch.float64


def _data(n=200, dtype=DT, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 2, generator=g, dtype=DT)
    y = torch.sin(6 * x[:, 0]) + 0.05 * torch.randn(n, generator=g, dtype=DT)
    return x.to(dtype), y.to(dtype)


def _scaled_kernel(outputscale, dtype=DT, num=128):
    kernel = ScaleKernel(FourierFeatureKernel(num, seed=0)).to(dtype)
    # A tensor in the kernel's dtype: a Python float of 1e-300 would pass through float32 (0).
    kernel.outputscale = torch.tensor(outputscale, dtype=dtype)
    return kernel


def _fit(scale, solve, noise=1e-3, **options):
    x, y = _data()
    gp = RandomFeatureGP(_scaled_kernel(scale**2), noise=noise * scale**2, solve=solve,
                         **options)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no ConvergenceWarning either
        gp.fit(x, y * scale)
        mean, std = gp.predict(x[:20], return_std=True)
    return gp, mean / scale, std / scale


@pytest.mark.parametrize("rank", [None, 0])
@pytest.mark.parametrize("scale", [1e-150, 1e150])
def test_cg_is_equivariant_to_the_units(scale, rank):
    # Multiplying y by s, the outputscale and the noise by s^2 leaves B unchanged and scales
    # the right-hand sides (Phi^H S^-1 y, phi*) by 1/s and s: CG must take the same steps and
    # return the same posterior in the new units, as the weight-space solve does.
    options = dict(cg_tolerance=1e-10, preconditioner_rank=rank)
    _, mean_w, std_w = _fit(1.0, "weight")
    reference, mean_1, std_1 = _fit(1.0, "cg", **options)
    scaled, mean_s, std_s = _fit(scale, "cg", **options)
    # The CG error in the posterior is of the order of its tolerance times B's condition.
    torch.testing.assert_close(mean_1, mean_w, rtol=0, atol=1e-6)
    torch.testing.assert_close(std_1, std_w, rtol=1e-6, atol=0)
    torch.testing.assert_close(mean_s, mean_1, rtol=0, atol=1e-8)
    torch.testing.assert_close(std_s, std_1, rtol=1e-8, atol=0)
    # Same steps up to rounding: without a preconditioner (condition ~1e5, tens of
    # iterations) rounding alone moves the stopping iteration by a few.
    assert abs(scaled.cg_info["iterations"] - reference.cg_info["iterations"]) <= max(
        1, reference.cg_info["iterations"] // 10)
    # The draws (same generator) and the evidence follow: log p(s y) = log p(y) - N log s.
    x = _data()[0][:5]
    draws = [gp.sample_functions(3, generator=torch.Generator().manual_seed(0))(x)
             for gp in (reference, scaled)]
    torch.testing.assert_close(draws[1] / scale, draws[0], rtol=0, atol=1e-6)
    expected = float(reference.log_marginal_likelihood()) - 200 * math.log(scale)
    assert float(scaled.log_marginal_likelihood()) == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("rank", [None, 0])
def test_cg_refuses_float32_where_the_weight_solve_refuses(rank):
    # noise 1e-7 against unit features: B's condition number (~1e9) is beyond float32's
    # 1 / eps (~1.7e7). The weight solve's Cholesky fails; CG must not return NaN or a mean
    # its residual recurrence only pretends to have reached.
    x, y = _data(dtype=torch.float32)
    with pytest.raises(NotPSDError, match="float64"):
        RandomFeatureGP(FourierFeatureKernel(64, seed=0), noise=1e-7, solve="weight").fit(x, y)
    gp = RandomFeatureGP(FourierFeatureKernel(64, seed=0), noise=1e-7, solve="cg",
                         preconditioner_rank=rank)
    with pytest.raises(NotPSDError, match="torch.float32.*use float64"):
        gp.fit(x, y)


def test_cg_in_float32_at_a_resolvable_noise_agrees_with_float64():
    # At noise 1e-2 B's condition (~1e5) is within float32: the answer stands, to float32's
    # accuracy times that condition.
    x, y = _data()
    exact = RandomFeatureGP(FourierFeatureKernel(64, seed=0).double(), noise=1e-2,
                            solve="weight").fit(x, y)
    gp = RandomFeatureGP(FourierFeatureKernel(64, seed=0), noise=1e-2, solve="cg").fit(
        x.float(), y.float())
    mean, std = gp.predict(x[:20].float(), return_std=True)
    mean_w, std_w = exact.predict(x[:20], return_std=True)
    assert torch.isfinite(mean).all() and torch.isfinite(std).all()
    torch.testing.assert_close(mean.double(), mean_w, rtol=0, atol=1e-3)
    torch.testing.assert_close(std.double(), std_w, rtol=1e-2, atol=0)


@pytest.mark.parametrize("rank", [None, 0])
def test_cg_mean_is_within_its_tolerance_in_posterior_standard_deviations(rank):
    # noise 1e-6 on unit-scale features: B's condition is ~1e8. A relative residual of 1e-6
    # alone left the mean 3.9 posterior standard deviations off without a preconditioner;
    # sqrt(r^H P^-1 r) <= tolerance bounds |mean error| <= tolerance * sd at every input.
    x, y = _data(n=300)
    exact = RandomFeatureGP(FourierFeatureKernel(256, seed=0).double(), noise=1e-6,
                            solve="weight").fit(x, y)
    mean_w, std_w = exact.predict(x[:50], return_std=True)
    gp = RandomFeatureGP(FourierFeatureKernel(256, seed=0).double(), noise=1e-6, solve="cg",
                         preconditioner_rank=rank).fit(x, y)
    mean = gp.predict(x[:50])
    # 1e-6 of the bound, plus the weight solve's own rounding (condition 1e8 times eps)
    assert float(((mean - mean_w).abs() / std_w).max()) < 1e-5


@pytest.mark.parametrize("rank", [None, 0])
def test_cg_in_float32_near_its_precision_is_as_accurate_as_the_weight_solve(rank):
    # noise 3e-5: B's largest eigenvalue ~7e6, just within float32's 1 / eps. The Nystrom
    # preconditioner's r^H P^-1 r, formed directly, rounded below zero (a breakdown); as
    # ||P^-1/2 r||^2 it cannot. Against float64, the float32 weight solve is 0.23 posterior
    # standard deviations off (its features' rounding); CG must do no worse.
    x, y = _data()
    exact = RandomFeatureGP(FourierFeatureKernel(64, seed=0).double(), noise=3e-5,
                            solve="weight").fit(x, y)
    mean_w, std_w = exact.predict(x[:50], return_std=True)
    single = RandomFeatureGP(FourierFeatureKernel(64, seed=0), noise=3e-5, solve="weight").fit(
        x.float(), y.float())
    gp = RandomFeatureGP(FourierFeatureKernel(64, seed=0), noise=3e-5, solve="cg",
                         preconditioner_rank=rank).fit(x.float(), y.float())
    weight_error = ((single.predict(x[:50].float()).double() - mean_w).abs() / std_w).max()
    cg_error = ((gp.predict(x[:50].float()).double() - mean_w).abs() / std_w).max()
    assert float(cg_error) <= float(weight_error)


@pytest.mark.parametrize("zero", ["outputscale", "features"])
def test_cg_with_a_zero_kernel_returns_the_prior_like_the_weight_solve(zero):
    # K = 0: the posterior is the prior, mean 0 and standard deviation 0, and the evidence is
    # that of pure noise. The Nystrom sketch of a zero Gram has nothing to factorise.
    x, y = _data(n=50)
    if zero == "features":
        # A homogeneous polynomial sketch (bias 0) maps x = 0 to the zero feature vector.
        x = torch.zeros_like(x)

    def kernel_of():
        if zero == "outputscale":
            return _scaled_kernel(0.0)
        return PolynomialSketchKernel(2, 64, bias=0.0, seed=0).double()

    fits = {solve: RandomFeatureGP(kernel_of(), noise=0.1, solve=solve).fit(x, y)
            for solve in ("weight", "cg")}
    for gp in fits.values():
        mean, std = gp.predict(x[:5], return_std=True)
        assert torch.equal(mean, torch.zeros_like(mean))
        assert torch.equal(std, torch.zeros_like(std))
    expected = -0.5 * (50 * math.log(2 * math.pi * 0.1) + float(y.square().sum()) / 0.1)
    for gp in fits.values():
        assert float(gp.log_marginal_likelihood()) == pytest.approx(expected, rel=1e-12)
    draws = fits["cg"].sample_functions(3, generator=torch.Generator().manual_seed(0))(x[:5])
    assert torch.equal(draws, torch.zeros_like(draws))


# ---------------------------------------------------------------------- conjugate_gradients
@pytest.mark.parametrize("exponent", [-1000, 1000])
def test_conjugate_gradients_is_linear_in_the_right_hand_side_at_any_scale(exponent):
    # A power-of-two factor on b is exact in floating point: the solution scales by it, the
    # step lengths and ratios (the Lanczos coefficients) do not change at all.
    g = torch.Generator().manual_seed(0)
    root = torch.randn(40, 40, generator=g, dtype=DT)
    a = root @ root.T / 40 + torch.eye(40, dtype=DT)
    b = torch.randn(40, 2, generator=g, dtype=DT)
    unit = conjugate_gradients(lambda v: a @ v, b, tolerance=1e-12)
    factor = 2.0**exponent
    scaled = conjugate_gradients(lambda v: a @ v, b * factor, tolerance=1e-12)
    assert scaled.iterations == unit.iterations
    assert scaled.converged
    torch.testing.assert_close(scaled.solution / factor, unit.solution, rtol=0, atol=0)
    assert lanczos_condition(scaled) == lanczos_condition(unit)


@pytest.mark.parametrize("size", [1.7e308, 1e-310])
def test_conjugate_gradients_near_the_ends_of_float64(size):
    # A right-hand side near the largest float64 (and a subnormal one): A^-1 b is
    # representable, so CG returns it rather than inf or 0.
    a = torch.diag(torch.tensor([1.0, 2.0, 4.0], dtype=DT))
    b = torch.tensor([[1.0], [0.5], [0.25]], dtype=DT) * size
    result = conjugate_gradients(lambda v: a @ v, b, tolerance=1e-12)
    expected = torch.tensor([[1.0], [0.25], [0.0625]], dtype=DT)
    torch.testing.assert_close(result.solution / size, expected, rtol=1e-12, atol=0)


def test_conjugate_gradients_refuses_an_indefinite_matrix():
    a = torch.diag(torch.tensor([2.0, -1.0, 3.0], dtype=DT))
    b = torch.ones(3, 1, dtype=DT)
    with pytest.raises(NotPSDError, match="not positive definite in torch.float64"):
        conjugate_gradients(lambda v: a @ v, b)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_conjugate_gradients_refuses_a_non_finite_right_hand_side(bad):
    b = torch.ones(3, 1, dtype=DT)
    b[1] = bad
    with pytest.raises(NotPSDError, match="right-hand side holds NaN or infinite"):
        conjugate_gradients(lambda v: v, b)


def test_conjugate_gradients_with_zero_right_hand_sides_takes_no_step():
    result = conjugate_gradients(lambda v: 2 * v, torch.zeros(3, 2, dtype=DT))
    assert result.iterations == 0 and result.converged
    assert torch.equal(result.solution, torch.zeros(3, 2, dtype=DT))
    assert lanczos_condition(result) == 1.0


def test_nystrom_inverse_stays_positive_definite_beyond_one_over_eps():
    # lambda = 1e9 in float32: (1 + lambda)^-1 - 1 rounds to -1, which would make P^-1 singular
    # along u. P^-1 u must stay u / (1 + lambda).
    basis = torch.zeros(4, 1)
    basis[0, 0] = 1.0
    pre = NystromPreconditioner(basis, torch.tensor([1e9]))
    v = torch.tensor([[1.0], [0.0], [0.0], [0.0]])
    torch.testing.assert_close(pre.inverse(v), v / (1 + 1e9), rtol=1e-6, atol=0)
    torch.testing.assert_close(pre.inverse_sqrt(v), v / (1 + 1e9) ** 0.5, rtol=1e-6, atol=0)


# ---------------------------------------------------------------------- stochastic evidence
def _probe_model():
    # No preconditioner: the log-determinant is all probes, so its standard error is visible.
    x, y = _data(n=150)
    gp = RandomFeatureGP(FourierFeatureKernel(128, seed=0).double(), noise=0.05, solve="cg",
                         preconditioner_rank=0, cg_tolerance=1e-10).fit(x, y)
    exact = RandomFeatureGP(FourierFeatureKernel(128, seed=0).double(), noise=0.05,
                            solve="weight").fit(x, y)
    return gp, float(exact.log_marginal_likelihood())


def test_stochastic_log_evidence_of_a_fitted_model_is_an_estimate_within_its_error():
    gp, exact = _probe_model()
    value, error = stochastic_log_evidence(gp)
    assert float(value) == float(gp.log_marginal_likelihood())
    assert error > 0
    more, more_error = stochastic_log_evidence(gp, num_probes=64)
    # Four standard errors of the probes' mean (the quadratic term is exact to 1e-10).
    assert abs(float(value) - exact) < 4 * error
    assert abs(float(more) - exact) < 4 * more_error
    assert more_error < error


@pytest.mark.parametrize("num_probes", [64, 1, "8"])
def test_stochastic_log_evidence_never_changes_the_fitted_model(num_probes):
    gp, _ = _probe_model()
    before = gp.log_marginal_likelihood()
    settings = dict(gp.cg_settings.state())
    try:
        stochastic_log_evidence(gp, num_probes=num_probes)
    except (TypeError, ValueError) as err:
        assert "num_probes" in str(err)
    assert gp.cg_settings.state() == settings
    assert torch.equal(gp.log_marginal_likelihood(), before)


def test_stochastic_log_evidence_names_a_wrong_model_or_generator():
    gp, _ = _probe_model()
    with pytest.raises(TypeError, match="gp must be a RandomFeatureGP, got FourierFeatureKernel"):
        stochastic_log_evidence(gp.kernel)
    for bad in (0, "seed", torch.zeros(2)):
        with pytest.raises(TypeError, match="generator must be a torch.Generator or None"):
            stochastic_log_evidence(gp, generator=bad)
        x, y = _data(n=20)
        with pytest.raises(TypeError, match="generator must be a torch.Generator or None"):
            stochastic_log_evidence(gp, x, y, generator=bad)
        with pytest.raises(TypeError, match="generator must be a torch.Generator or None"):
            gp.sample_functions(2, generator=bad)


def test_stochastic_log_evidence_follows_its_generator_on_a_fitted_model():
    gp, _ = _probe_model()
    a = stochastic_log_evidence(gp, generator=torch.Generator().manual_seed(1))
    b = stochastic_log_evidence(gp, generator=torch.Generator().manual_seed(1))
    c = stochastic_log_evidence(gp, generator=torch.Generator().manual_seed(2))
    assert torch.equal(a[0], b[0]) and not torch.equal(a[0], c[0])


def test_the_scaling_guides_cg_example_runs():
    # The guide's code block, at D = 256 instead of 32768, on small data.
    from pathlib import Path

    guide = (Path(__file__).parents[2] / "docs" / "guide" / "scaling.md").read_text()
    blocks = [b.split("```", 1)[0] for b in guide.split("```python")[1:]]
    (code,) = [b for b in blocks if "stochastic_log_evidence(gp)" in b]
    assert "32768" in code
    x, y = _data(n=100)
    namespace = dict(RandomFeatureGP=RandomFeatureGP, FourierFeatureKernel=FourierFeatureKernel,
                     x=x.float(), y=y.float(), x_test=x[:5].float())
    exec(code.replace("32768", "256"), namespace)
    assert namespace["mean"].shape == namespace["std"].shape == (5,)
    assert torch.isfinite(namespace["value"]) and namespace["error"] >= 0
    assert namespace["paths"](x[:5].float()).shape == (16, 5)


# ---------------------------------------------------------------------- solve="auto"
def test_auto_takes_cg_when_neither_the_function_nor_the_weight_solve_fits(monkeypatch):
    # Fewer rows than features: the N x N solve is the cheaper by operations, but with its
    # features (50 x 4096) beyond a 1 MB memory, and the D x D matrices (400 MB) too, only the
    # matrix-free solve fits; it must be chosen, and give the weight solve's posterior.
    from rfgp.inference import _fitting, _linalg

    x, y = _data(n=50)
    exact = RandomFeatureGP(FourierFeatureKernel(4096, seed=0).double(), noise=0.1,
                            solve="weight").fit(x, y)
    mean_w, std_w = exact.predict(x[:5], return_std=True)
    small = lambda device: 1 << 20  # noqa: E731
    monkeypatch.setattr(_fitting, "available_memory", small)
    monkeypatch.setattr(_linalg, "available_memory", small)
    gp = RandomFeatureGP(FourierFeatureKernel(4096, seed=0).double(), noise=0.1,
                         cg_tolerance=1e-10).fit(x, y)
    assert gp.solve_used == "cg"
    mean, std = gp.predict(x[:5], return_std=True)
    torch.testing.assert_close(mean, mean_w, rtol=0, atol=1e-7)
    torch.testing.assert_close(std, std_w, rtol=1e-6, atol=0)
    with pytest.raises(MemoryError, match="use solve='cg'"):
        RandomFeatureGP(FourierFeatureKernel(4096, seed=0).double(), noise=0.1,
                        solve="function").fit(x, y)


def test_cg_refuses_a_float32_noise_beyond_its_range():
    # Units of 1e-20 in float32: outputscale 1e-40 and noise 1e-42 are subnormal, and
    # Phi^H S^-1 y overflows. A clear refusal, not NaN from inside the preconditioner.
    x, y = _data()
    kernel = _scaled_kernel(1e-40, dtype=torch.float32)
    gp = RandomFeatureGP(kernel, noise=1e-42, solve="cg")
    with pytest.raises(NotPSDError, match="NaN or infinite entries .*torch.float32.*float64"):
        gp.fit(x.float(), (y * 1e-20).float())


def test_stochastic_log_evidence_refuses_probes_beyond_memory():
    gp, _ = _probe_model()
    before = gp.log_marginal_likelihood()
    with pytest.raises(MemoryError, match="num_probes=10000000000000000000.*fewer num_probes"):
        stochastic_log_evidence(gp, num_probes=10**19)
    assert torch.equal(gp.log_marginal_likelihood(), before)


def test_cg_on_constant_inputs_zero_targets_and_empty_queries_matches_the_weight_solve():
    # Constant inputs: a rank-one Gram (every row the same feature vector); zero targets: a
    # zero right-hand side (no step, zero mean); an empty query: empty results.
    x, y = _data(n=60)
    constant = torch.full_like(x, 0.3)
    for inputs, targets in ((constant, y), (x, torch.zeros_like(y))):
        fits = [RandomFeatureGP(FourierFeatureKernel(64, seed=0).double(), noise=0.01,
                                solve=solve).fit(inputs, targets) for solve in ("weight", "cg")]
        (mean_w, std_w), (mean, std) = (gp.predict(x[:5], return_std=True) for gp in fits)
        torch.testing.assert_close(mean, mean_w, rtol=0, atol=1e-6 * float(std_w.min()))
        torch.testing.assert_close(std, std_w, rtol=1e-6, atol=0)
        empty_mean, empty_std = fits[1].predict(x[:0], return_std=True)
        assert empty_mean.shape == empty_std.shape == (0,)
