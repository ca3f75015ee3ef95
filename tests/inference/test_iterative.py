"""The iterative solve (solve="cg"): it equals the Cholesky solve up to its tolerance."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from rfgp import RandomFeatureGP
from rfgp.inference import ConvergenceWarning
from rfgp.inference import _cg_solver as cg_solver
from rfgp.inference._cg_cost import cg_fit_cost, cg_fit_seconds, cg_num_features
from rfgp.inference._iterative import (
    cg_iterations_bound,
    conjugate_gradients,
    lanczos_condition,
    lanczos_log_quadrature,
    standard_normal,
)
from rfgp.inference._nystrom import (
    MAX_AUTO_RANK,
    RANK_STOP_EIGENVALUE,
    NystromPreconditioner,
    NystromSketch,
    doubling_pays,
)
from rfgp.inference._stochastic_evidence import stochastic_log_evidence
from rfgp.kernels import FourierFeatureKernel, PolynomialSketchKernel

DT = torch.float64
TIGHT = 1e-11  # a CG tolerance far below the compared accuracy
# a bound on the low-rank variances' relative excess far below the compared accuracy
VARIANCE = 1e-8
DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                  reason="no CUDA device")),
]


def _data(n=300, d=3, seed=0, columns=None):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, d, generator=g, dtype=DT)
    f = torch.sin(5 * x[:, 0]) + x[:, 1]
    y = f if columns is None else torch.stack([f * (c + 1) for c in range(columns)], -1)
    y = y + 0.1 * torch.randn(y.shape, generator=g, dtype=DT)
    return x, y, torch.rand(20, d, generator=g, dtype=DT)


def _fourier(num=512):
    kernel = FourierFeatureKernel(num, seed=0).double()
    kernel.lengthscale = 0.3
    return kernel


def _complex_sketch(num=256):
    return PolynomialSketchKernel(3, num, bias=1.0, projection="tensorsrht", complex=True,
                                  seed=0).double()


def _pair(make_kernel, noise=0.05, **cg):
    reference = RandomFeatureGP(make_kernel(), noise=noise, solve="weight")
    cg = {"cg_variance_tolerance": VARIANCE, **cg}
    iterative = RandomFeatureGP(make_kernel(), noise=noise, solve="cg", cg_tolerance=TIGHT, **cg)
    return reference, iterative


def _relative(a, b):
    return float((a - b).abs().max() / b.abs().max().detach())


# ====================================================================== posterior
CASES = {
    "real": (_fourier, None, None),
    "complex": (_complex_sketch, None, None),
    "multi-output": (_fourier, 3, torch.tensor([0.05, 0.2, 0.05], dtype=DT)),
    "heteroscedastic": (_fourier, 2, "rows"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_cg_mean_and_variance_equal_the_cholesky_solution(case):
    make_kernel, columns, noise = CASES[case]
    x, y, xt = _data(columns=columns)
    reference, iterative = _pair(make_kernel)
    if isinstance(noise, torch.Tensor):
        reference.noise = iterative.noise = noise
        fit_noise = None
    elif noise == "rows":
        fit_noise = 0.02 + 0.1 * torch.rand(y.shape, generator=torch.Generator().manual_seed(3),
                                            dtype=DT)
        fit_noise[:, 1] = fit_noise[:, 0] * 2
    else:
        fit_noise = None
    reference.fit(x, y, fit_noise)
    iterative.fit(x, y, fit_noise)
    assert iterative.solve_used == "cg"
    assert iterative.factorization_groups == reference.factorization_groups
    mean0, std0 = reference.predict(xt, return_std=True)
    mean1, std1 = iterative.predict(xt, return_std=True)
    assert _relative(mean1, mean0) < 1e-6
    assert float(((std1.square() - std0.square()) / std0.square()).abs().max()) < 1e-3


def test_cg_vector_field_fit_with_per_output_noise_equals_the_cholesky_fit():
    from rfgp.kernels import CurlFreeFeatureKernel

    x, _, xt = _data(n=150, d=2)
    y = torch.stack([torch.sin(3 * x[:, 0]), torch.cos(2 * x[:, 1])], -1)

    def make_kernel():
        return CurlFreeFeatureKernel(512, input_dim=2, seed=0).to(DT)

    reference, iterative = _pair(make_kernel)
    reference.noise = iterative.noise = torch.tensor([0.05, 0.1], dtype=DT)  # folded in
    mean0, std0 = reference.fit(x, y).predict(xt, return_std=True)
    mean1, std1 = iterative.fit(x, y).predict(xt, return_std=True)
    assert mean1.shape == (20, 2)
    assert _relative(mean1, mean0) < 1e-6
    assert _relative(std1, std0) < 1e-6


def test_a_new_model_noise_resolves_without_refitting():
    x, y, xt = _data()
    gp = RandomFeatureGP(_fourier(), noise=0.05, solve="cg", cg_tolerance=TIGHT).fit(x, y)
    gp.noise = 0.2
    fresh = RandomFeatureGP(_fourier(), noise=0.2, solve="weight").fit(x, y)
    assert _relative(gp.predict(xt), fresh.predict(xt)) < 1e-6


def test_cg_posterior_covariance_and_its_gradient_equal_the_cholesky_ones():
    x, y, xt = _data()
    reference, iterative = _pair(_fourier)
    reference.fit(x, y)
    iterative.fit(x, y)
    q0 = xt[:6].clone().requires_grad_(True)
    q1 = xt[:6].clone().requires_grad_(True)
    post0, post1 = reference.posterior(q0), iterative.posterior(q1)
    cov0, cov1 = post0.covariance_matrix, post1.covariance_matrix
    assert _relative(cov1, cov0) < 1e-6
    assert torch.equal(cov1, cov1.transpose(-1, -2))
    (cov0.sum() + post0.mean.sum()).backward()
    (cov1.sum() + post1.mean.sum()).backward()
    assert _relative(q1.grad, q0.grad) < 1e-6


def _complex_rademacher(num=256):
    # A projection whose backward pass takes any complex gradient (the TensorSRHT kernel's
    # does not accept conjugated gradients, whichever solver produces them).
    return PolynomialSketchKernel(3, num, bias=1.0, projection="rademacher", complex=True,
                                  seed=0).double()


def test_cg_predictive_std_gradient_equals_the_cholesky_one():
    x, y, xt = _data()
    reference, iterative = _pair(_complex_rademacher)
    reference.fit(x, y)
    iterative.fit(x, y)
    q0, q1 = xt.clone().requires_grad_(True), xt.clone().requires_grad_(True)
    reference.predict(q0, return_std=True)[1].sum().backward()
    iterative.predict(q1, return_std=True)[1].sum().backward()
    assert _relative(q1.grad, q0.grad) < 1e-5


@pytest.mark.parametrize("make_kernel", [_fourier, _complex_sketch], ids=["real", "complex"])
def test_sample_then_optimise_draws_have_the_posterior_moments(make_kernel):
    x, y, xt = _data(n=200)
    gp = RandomFeatureGP(make_kernel(), noise=0.05, solve="cg", cg_tolerance=1e-10).fit(x, y)
    mean, std = gp.predict(xt[:8], return_std=True)
    num = 1500
    paths = gp.sample_functions(num, generator=torch.Generator().manual_seed(1))
    values = paths(xt[:8]).detach()  # (S, M)
    # Mean: standard error std / sqrt(S); variance: var * sqrt(2 / (S - 1)) (Gaussian draws).
    assert bool(((values.mean(0) - mean).abs() < 4.5 * std / math.sqrt(num)).all())
    var_error = std.square() * math.sqrt(2.0 / (num - 1))
    assert bool(((values.var(0) - std.square()).abs() < 4.5 * var_error).all())


# ====================================================================== evidence
def test_stochastic_evidence_is_unbiased_within_its_standard_error():
    x, y, _ = _data(n=250)
    kernel = _fourier(256)
    exact = RandomFeatureGP(kernel, noise=0.05, solve="weight").fit(x, y)
    exact_value = float(exact.log_marginal_likelihood())
    gp = RandomFeatureGP(_fourier(256), noise=0.05, solve="cg", preconditioner_rank=4,
                         cg_tolerance=1e-10)
    values, errors = [], []
    for seed in range(8):
        value, error = stochastic_log_evidence(gp, x, y, num_probes=8,
                                               generator=torch.Generator().manual_seed(seed))
        values.append(float(value))
        errors.append(error)
    mean = sum(values) / len(values)
    combined = math.sqrt(sum(e * e for e in errors)) / len(errors)
    assert combined > 0
    assert abs(mean - exact_value) < 4 * combined
    # The fitted model's estimate and the recomputed one agree with the exact value as well.
    gp.fit(x, y)
    fitted = float(gp.log_marginal_likelihood())
    assert abs(fitted - exact_value) < 4 * gp._state.solver.evidence_standard_error + 1e-8
    assert gp._state.solver.evidence_standard_error > 0


def test_stochastic_evidence_of_a_complex_fit_is_that_of_the_real_form():
    # The evidence is the real GP's (kernel Re k_hat) for either posterior, as in the exact solve.
    x, y, _ = _data(n=200, columns=2)
    exact = RandomFeatureGP(_complex_sketch(128), noise=0.05, solve="weight").fit(x, y)
    gp = RandomFeatureGP(_complex_sketch(128), noise=0.05, solve="cg", preconditioner_rank=8,
                         cg_tolerance=1e-10).fit(x, y)
    values, errors = [], []
    for seed in range(6):
        value, error = cg_solver.fitted_log_evidence(
            gp._state.solver, torch.Generator().manual_seed(seed))
        values.append(float(value))
        errors.append(error)
    combined = math.sqrt(sum(e * e for e in errors)) / len(errors)
    assert combined > 0
    assert abs(sum(values) / len(values) - float(exact.log_marginal_likelihood())) < 4 * combined


def test_stochastic_evidence_gradient_is_unbiased():
    x, y, _ = _data(n=250)
    noise = torch.tensor(0.05, dtype=DT, requires_grad=True)
    exact_kernel = _fourier(256)
    exact = RandomFeatureGP(exact_kernel, solve="weight").log_marginal_likelihood(x, y, noise)
    params = [exact_kernel.raw_lengthscale, noise]
    exact_grad = torch.cat([g.reshape(-1) for g in torch.autograd.grad(exact, params)])
    kernel = _fourier(256)
    gp = RandomFeatureGP(kernel, solve="cg", preconditioner_rank=4, cg_tolerance=1e-10)
    grads = []
    for seed in range(10):
        value, _ = stochastic_log_evidence(gp, x, y, noise, num_probes=4,
                                           generator=torch.Generator().manual_seed(seed))
        grad = torch.autograd.grad(value, [kernel.raw_lengthscale, noise])
        grads.append(torch.cat([g.reshape(-1) for g in grad]))
    grads = torch.stack(grads)
    error = grads.std(0) / math.sqrt(grads.shape[0])
    assert bool((error > 0).all())
    assert bool(((grads.mean(0) - exact_grad).abs() < 4.5 * error + 1e-6).all())


def test_log_marginal_likelihood_of_a_cg_model_uses_the_stochastic_estimate():
    x, y, _ = _data(n=150)
    gp = RandomFeatureGP(_fourier(256), noise=0.05, solve="cg", preconditioner_rank=4)
    value = gp.log_marginal_likelihood(x, y)
    assert torch.equal(value.detach(), stochastic_log_evidence(gp, x, y)[0].detach())


def test_hyperparameter_search_on_the_stochastic_evidence_reaches_the_exact_optimum():
    x, y, _ = _data(n=300, d=2)
    found = {}
    for solve in ("weight", "cg"):
        kernel = FourierFeatureKernel(256, seed=0).double()
        kernel.lengthscale = 1.0
        gp = RandomFeatureGP(kernel, noise=1.0, solve=solve)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            gp.optimize_hyperparameters(x, y, num_iterations=15)
        found[solve] = (float(kernel.lengthscale), float(gp.noise))
    # The exact evidence per datum at the CG search's point is within 0.01 of its maximum.
    values = {}
    for solve, (lengthscale, noise) in found.items():
        kernel = FourierFeatureKernel(256, seed=0).double()
        kernel.lengthscale = lengthscale
        exact = RandomFeatureGP(kernel, noise=noise, solve="weight").fit(x, y)
        values[solve] = float(exact.log_marginal_likelihood()) / x.shape[0]
    assert values["cg"] > values["weight"] - 0.01


# ====================================================================== streams, updates
def test_streamed_and_updated_cg_fits_equal_the_in_memory_fit():
    x, y, xt = _data()
    full = RandomFeatureGP(_fourier(), noise=0.05, solve="cg", cg_tolerance=TIGHT).fit(x, y)
    mean, std = full.predict(xt, return_std=True)
    stream = RandomFeatureGP(_fourier(), noise=0.05, solve="cg", cg_tolerance=TIGHT)
    stream.fit_stream([(x[:100], y[:100]), (x[100:], y[100:])])
    upd = RandomFeatureGP(_fourier(), noise=0.05, solve="cg", cg_tolerance=TIGHT)
    upd.fit(x[:120], y[:120]).update(x[120:], y[120:])
    for model in (stream, upd):
        m, s = model.predict(xt, return_std=True)
        assert model.num_data == x.shape[0]
        assert _relative(m, mean) < 1e-8
        assert _relative(s, std) < 1e-8


def test_a_cg_fit_keeps_its_own_copy_of_the_data():
    x, y, xt = _data()
    noise = torch.full((300,), 0.05, dtype=DT)
    gp = RandomFeatureGP(_fourier(), solve="cg", cache_bytes=0).fit(x, y, noise)
    mean, std = gp.predict(xt, return_std=True)
    x.mul_(2.0)
    noise.mul_(3.0)
    again_mean, again_std = gp.predict(xt, return_std=True)
    assert torch.equal(mean, again_mean) and torch.equal(std, again_std)


def test_cached_and_recomputed_features_give_the_same_fit():
    x, y, xt = _data()
    cached = RandomFeatureGP(_fourier(), noise=0.05, solve="cg").fit(x, y, chunk_size=64)
    recomputed = RandomFeatureGP(_fourier(), noise=0.05, solve="cg", cache_bytes=0)
    recomputed.fit(x, y, chunk_size=64)
    assert recomputed._state.solver.operator._cache == {}
    assert len(cached._state.solver.operator._cache) == math.ceil(300 / 64)
    torch.testing.assert_close(cached.predict(xt), recomputed.predict(xt), rtol=0, atol=0)


def test_float32_features_with_float64_statistics():
    x, y, xt = _data()
    kernel = FourierFeatureKernel(512, seed=0)
    kernel.lengthscale = 0.3
    reference = RandomFeatureGP(_fourier(), noise=0.05, solve="weight").fit(x, y)
    gp = RandomFeatureGP(kernel, noise=0.05, solve="cg", statistics_dtype=torch.float64)
    gp.fit(x.float(), y.float())
    assert gp._state.solver.dtype == torch.float64
    mean = gp.predict(xt.float())
    assert mean.dtype == torch.float32
    # float32 features (round-off ~1e-7 relative) through a well-conditioned system
    assert _relative(mean.double(), reference.predict(xt)) < 1e-4


def test_a_cg_fit_moves_with_the_model_to_float32():
    x, y, xt = _data()
    gp = RandomFeatureGP(_fourier(), noise=0.05, solve="cg", cg_tolerance=TIGHT).fit(x, y)
    mean, std = gp.predict(xt, return_std=True)
    gp.float()
    mean32, std32 = gp.predict(xt.float(), return_std=True)
    assert mean32.dtype == std32.dtype == torch.float32
    assert gp._state.solver.dtype == torch.float32
    # float32 round-off (~1e-7) through a well-conditioned system and a 1e-4 CG tolerance
    assert _relative(mean32.double(), mean) < 1e-4
    assert _relative(std32.double(), std) < 1e-3


def test_stochastic_evidence_of_other_solvers_is_exact_and_arguments_are_checked():
    x, y, _ = _data(n=100)
    gp = RandomFeatureGP(_fourier(256), noise=0.05, solve="weight").fit(x, y)
    value, error = stochastic_log_evidence(gp)
    assert torch.equal(value, gp.log_marginal_likelihood()) and error == 0.0
    with pytest.raises(ValueError, match="x and y must be given together"):
        stochastic_log_evidence(gp, x)
    with pytest.raises(ValueError, match="noise needs x and y"):
        stochastic_log_evidence(gp, noise=0.1)
    with pytest.raises(ValueError, match="num_probes"):
        stochastic_log_evidence(gp, x, y, num_probes=1)


# ====================================================================== checkpoints
def test_checkpoint_round_trip_predicts_identically_without_a_d_by_d_matrix():
    x, y, xt = _data()
    gp = RandomFeatureGP(_complex_sketch(), noise=0.05, solve="cg").fit(x, y)
    state = gp.state_dict()
    width = gp.feature_map.num_real_features

    def tensors(value):
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, dict):
            for v in value.values():
                yield from tensors(v)
        elif isinstance(value, (list, tuple)):
            for v in value:
                yield from tensors(v)

    assert all(t.numel() < (width // 2) ** 2 for t in tensors(state))
    loaded = RandomFeatureGP(_complex_sketch(), noise=1.0, solve="cg")
    loaded.load_state_dict(state)
    m0, s0 = gp.predict(xt, return_std=True)
    m1, s1 = loaded.predict(xt, return_std=True)
    assert torch.equal(m0, m1) and torch.equal(s0, s1)


# ====================================================================== auto, memory
def test_auto_takes_cg_when_the_d_by_d_matrices_do_not_fit(monkeypatch):
    import rfgp.inference._fitting as fitting
    import rfgp.inference._linalg as linalg

    x, y, _ = _data(n=600)  # more rows than features: the N x N solve is not cheaper
    limit = 512 * 512 * 8 // 2  # half of one D x D float64 matrix
    monkeypatch.setattr(fitting, "available_memory", lambda device: limit)
    assert RandomFeatureGP(_fourier(), noise=0.05).fit(x, y, chunk_size=64).solve_used == "cg"
    monkeypatch.setattr(linalg, "available_memory", lambda device: limit)
    with pytest.raises(MemoryError, match="solve='cg'"):
        RandomFeatureGP(_fourier(), noise=0.05, solve="weight").fit(x, y, chunk_size=64)


# ====================================================================== preconditioner
def test_nystrom_preconditioner_reduces_iterations_on_a_known_spectrum():
    width = 400
    g = torch.Generator().manual_seed(0)
    basis = torch.linalg.qr(torch.randn(width, width, generator=g, dtype=DT))[0]
    spectrum = 1e4 * 0.9 ** torch.arange(width, dtype=DT)  # eigenvalues of B - I
    gram = basis @ torch.diag(spectrum) @ basis.T
    rhs = torch.randn(width, 3, generator=g, dtype=DT)

    def product(v):
        return gram @ v + v

    plain = conjugate_gradients(product, rhs, tolerance=1e-8, max_iterations=2000)
    pre = NystromPreconditioner.sketch(lambda v: gram @ v, width, DT, torch.device("cpu"), None)
    # The automatic rank stops once the r-th eigenvalue is below 4: lambda_r < 4 <= lambda_{r/2}.
    assert spectrum[pre.rank - 1] < 4 * 1.5 and spectrum[pre.rank // 2 - 1] >= 4
    fast = conjugate_gradients(product, rhs, pre.inverse, tolerance=1e-8, max_iterations=2000)
    assert fast.converged and plain.converged
    assert fast.iterations < plain.iterations / 3
    torch.testing.assert_close(fast.solution, torch.linalg.solve(gram + torch.eye(width, dtype=DT),
                                                                 rhs), rtol=1e-6, atol=1e-8)
    # With the full rank, P = B exactly: one iteration.
    exact = NystromPreconditioner.sketch(lambda v: gram @ v, width, DT, torch.device("cpu"), width)
    assert conjugate_gradients(product, rhs, exact.inverse, tolerance=1e-8).iterations == 1


def test_rank_grows_beyond_the_automatic_cap_only_where_it_pays():
    # A slowly decaying spectrum (lambda_512 ~ 7.7e3): at rank 512 CG still needs hundreds of
    # iterations, so a sketch that serves many solves should grow, and one solve should not.
    width = 2048
    g = torch.Generator().manual_seed(2)
    basis = torch.linalg.qr(torch.randn(width, width, generator=g, dtype=DT))[0]
    spectrum = 1e5 * 0.995 ** torch.arange(width, dtype=DT)
    gram = (basis * spectrum) @ basis.T
    rhs = torch.randn(width, 4, generator=g, dtype=DT)

    def sketch(solves):
        return NystromPreconditioner.sketch(lambda v: gram @ v, width, DT, torch.device("cpu"),
                                            None, torch.Generator().manual_seed(0),
                                            max_rank=width, solves=solves, rows=10**5)

    capped, single, shared = sketch(0.0), sketch(1.0), sketch(1000.0)
    assert capped.rank == MAX_AUTO_RANK and single.rank == MAX_AUTO_RANK
    assert shared.rank > MAX_AUTO_RANK

    def iterations(pre):
        out = conjugate_gradients(lambda v: gram @ v + v, rhs, pre.inverse, tolerance=1e-6,
                                  max_iterations=5000)
        assert out.converged
        return out.iterations

    # The grown rank leaves a condition number near 1 + lambda_r: fewer iterations, within
    # CG's bound for that condition number.
    grown = iterations(shared)
    assert grown < iterations(capped)
    assert grown <= cg_iterations_bound(1 + float(spectrum[shared.rank - 1]) * 1.5, 1e-6)


def test_lanczos_condition_is_the_spectrum_cg_met():
    # The extreme Ritz values of a CG run approach the matrix's extreme eigenvalues from
    # inside: a lower bound on the condition number, close once the run is long.
    g = torch.Generator().manual_seed(5)
    width = 300
    basis = torch.linalg.qr(torch.randn(width, width, generator=g, dtype=DT))[0]
    spectrum = torch.logspace(0, 3, width, dtype=DT)
    a = (basis * spectrum) @ basis.T
    run = conjugate_gradients(lambda v: a @ v, torch.randn(width, 3, generator=g, dtype=DT),
                              None, 1e-10, 2000)
    assert run.converged and run.iterations > 30
    assert 0.95e3 <= lanczos_condition(run) <= 1e3 * (1 + 1e-9)
    # Preconditioned by the exact inverse: one step, condition 1.
    exact = conjugate_gradients(lambda v: a @ v, torch.randn(width, 1, generator=g, dtype=DT),
                                lambda v: torch.linalg.solve(a, v), 1e-10)
    assert lanczos_condition(exact) == pytest.approx(1.0, abs=1e-6)


def test_sketch_grows_by_blocks_without_repeating_a_product():
    g = torch.Generator().manual_seed(6)
    width = 200
    basis = torch.linalg.qr(torch.randn(width, width, generator=g, dtype=DT))[0]
    gram = (basis * 1e4 * 0.9 ** torch.arange(width, dtype=DT)) @ basis.T
    columns = []

    def product(v):
        columns.append(v.shape[1])
        return gram @ v

    sketch = NystromSketch(product, width, DT, torch.device("cpu"))
    sketch.grow(32)
    grown = sketch.grow(64)
    assert columns == [32, 32] and grown.rank == 64
    # The blocks form one orthonormal test matrix, and the approximation is the Nyström
    # approximation (A O)(O^T A O)^-1 (A O)^T of all of it.
    test = sketch.test
    torch.testing.assert_close(test.T @ test, torch.eye(64, dtype=DT), rtol=0, atol=1e-12)
    image = gram @ test
    nystrom = image @ torch.linalg.solve(test.T @ image, image.T)
    approx = (grown.basis * grown.eigenvalues) @ grown.basis.T
    torch.testing.assert_close(approx, nystrom, rtol=0, atol=1e-9 * float(gram.norm()))


def test_refine_grows_the_rank_to_the_condition_a_solve_met():
    # A sketch adapted at scale 1 serves I + 1000 A: its condition number there is about
    # 1 + 1000 lambda_r, far above the target. Measured by the solve, it makes the rank grow
    # until the preconditioned condition number is near the target again.
    g = torch.Generator().manual_seed(7)
    width = 1024
    basis = torch.linalg.qr(torch.randn(width, width, generator=g, dtype=DT))[0]
    spectrum = 1e4 * torch.arange(1, width + 1, dtype=DT) ** -2.0
    gram = (basis * spectrum) @ basis.T
    sketch = NystromSketch(lambda v: gram @ v, width, DT, torch.device("cpu"))
    first = sketch.adapt(width, 100.0, 10**6, 1e-6)
    scale = 1000.0
    b = scale * gram + torch.eye(width, dtype=DT)
    rhs = torch.randn(width, 4, generator=g, dtype=DT)

    def solve(pre):
        scaled = NystromPreconditioner(pre.basis, scale * pre.eigenvalues)
        return conjugate_gradients(lambda v: b @ v, rhs, scaled.inverse, 1e-8, 2000)

    before = solve(first)
    assert lanczos_condition(before) > 1 + 2 * RANK_STOP_EIGENVALUE
    assert sketch.refine(lanczos_condition(before), scale, width, 100.0, 10**6, 1e-6)
    after = solve(sketch.preconditioner)
    assert sketch.rank > first.rank
    assert lanczos_condition(after) <= 1 + 2 * RANK_STOP_EIGENVALUE
    assert after.iterations < before.iterations / 2
    # Within the target, nothing grows.
    rank = sketch.rank
    assert not sketch.refine(lanczos_condition(after), scale, width, 100.0, 10**6, 1e-6)
    assert sketch.rank == rank


def test_doubling_pays_weighs_the_sketch_against_the_saved_iterations():
    fast = 1e4 * 0.5 ** torch.arange(600, dtype=DT)  # lambda_r already tiny: nothing to save
    slow = 1e4 * 0.9999 ** torch.arange(600, dtype=DT)  # flat: doubling barely moves kappa
    steep = 1e8 * torch.arange(1, 601, dtype=DT) ** -2.0  # kappa / 4 per doubling
    assert not doubling_pays(fast, 1e6, 4096, None, 1e-6)
    assert not doubling_pays(steep, 1.0, 4096, None, 1e-6)
    assert doubling_pays(steep, 100.0, 4096, None, 1e-6)
    # A flat spectrum's extrapolation predicts no gain worth 600 products over 10 solves.
    assert not doubling_pays(slow, 10.0, 4096, None, 1e-6)
    # The preconditioner's own cost counts: on few rows per product it stops paying.
    assert doubling_pays(steep, 100.0, 4096, 10**6, 1e-6)
    assert not doubling_pays(steep, 100.0, 4096, 100, 1e-6)


def test_cg_from_a_starting_guess():
    g = torch.Generator().manual_seed(1)
    a = torch.randn(30, 30, generator=g, dtype=DT)
    spd = a @ a.T + torch.eye(30, dtype=DT)
    b = torch.randn(30, 2, generator=g, dtype=DT)
    exact = torch.linalg.solve(spd, b)
    assert conjugate_gradients(lambda v: spd @ v, b, initial=exact).iterations == 0
    near = exact + 1e-3 * torch.randn(30, 2, generator=g, dtype=DT)
    result = conjugate_gradients(lambda v: spd @ v, b, tolerance=1e-12, initial=near)
    torch.testing.assert_close(result.solution, exact, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("complex_", [False, True])
def test_relative_energy_brackets_the_quadratic_form(complex_):
    # A = G + I with a preconditioner P = I + (part of G) <= A: each column's
    # b^H w + r^H P^-1 r must lie in [b^H A^-1 b, (1 + rho) b^H A^-1 b], and the rising lower
    # bound b^H w lets it stop before a fixed energy target set from a low estimate would.
    g = torch.Generator().manual_seed(3)
    dtype = torch.complex128 if complex_ else DT
    n = 200
    q, _ = torch.linalg.qr(torch.randn(n, n, generator=g, dtype=DT))
    spectrum = torch.logspace(4, -2, n, dtype=DT)
    gram = (q * spectrum) @ q.T
    a = (gram + torch.eye(n, dtype=DT)).to(dtype)
    held = 20  # P keeps the 20 largest eigenvalues of G: P <= A, condition 1 + spectrum[20]
    basis = q[:, :held].to(dtype)

    def precondition(r):
        inner = basis.transpose(0, 1).conj() @ r
        return r - basis @ (inner * (spectrum[:held] / (1 + spectrum[:held])).to(dtype)[:, None])

    b = torch.randn(n, 4, generator=g, dtype=DT).to(dtype) * torch.tensor(
        [1.0, 1e-6, 1e6, 3.0], dtype=DT)
    exact = (b.conj() * torch.linalg.solve(a, b)).sum(0).real
    for rho in (1e-1, 1e-2, 1e-4):
        result = conjugate_gradients(lambda v: a @ v, b, precondition, 1.0, 500,
                                     relative_energy=rho)
        w = result.solution
        r = b - a @ w
        value = (b.conj() * w).sum(0).real + (r.conj() * precondition(r)).sum(0).real
        assert result.converged
        assert bool((value >= exact * (1 - 1e-10)).all())
        assert bool((value <= exact * (1 + rho) * (1 + 1e-10)).all())
    # A fixed target rho * (b^H A^-1 b) / kappa(P^-1 A) (what a bound on the low estimate gives)
    # needs more iterations than the running lower bound.
    kappa = 1 + float(spectrum[held])
    fixed = conjugate_gradients(lambda v: a @ v, b, precondition, 1.0, 500,
                                energy_tolerance=(1e-2 * exact / kappa).sqrt())
    running = conjugate_gradients(lambda v: a @ v, b, precondition, 1.0, 500,
                                  relative_energy=1e-2)
    assert running.iterations < fixed.iterations


def test_relative_energy_needs_a_zero_start():
    a = torch.eye(3, dtype=DT) * 2
    b = torch.ones(3, 1, dtype=DT)
    with pytest.raises(ValueError, match="zero start"):
        conjugate_gradients(lambda v: a @ v, b, initial=b, relative_energy=0.1)


def test_preconditioner_reduces_the_iterations_of_a_fit():
    x, y, _ = _data()
    plain = RandomFeatureGP(_fourier(), noise=0.01, solve="cg", preconditioner_rank=0).fit(x, y)
    auto = RandomFeatureGP(_fourier(), noise=0.01, solve="cg").fit(x, y)
    assert auto._state.solver.iterations < plain._state.solver.iterations


def test_complex_hermitian_cg_and_lanczos_quadrature():
    g = torch.Generator().manual_seed(0)
    raw = torch.randn(6, 6, 2, generator=g, dtype=DT)
    a = torch.view_as_complex(raw)
    herm = a @ a.conj().T + torch.eye(6, dtype=torch.complex128)
    b = torch.view_as_complex(torch.randn(6, 2, 2, generator=g, dtype=DT))
    result = conjugate_gradients(lambda v: herm @ v, b, tolerance=1e-12)
    torch.testing.assert_close(result.solution, torch.linalg.solve(herm, b))
    # Gauss quadrature with as many nodes as the dimension is exact: v^T log(A) v.
    spd = herm.real @ herm.real.T + torch.eye(6, dtype=DT)
    v = torch.tensor([[1.0], [-1.0], [1.0], [1.0], [-1.0], [1.0]], dtype=DT)
    run = conjugate_gradients(lambda u: spd @ u, v, tolerance=1e-14, max_iterations=6, warn=False)
    assert run.iterations == 6
    theta, vectors = torch.linalg.eigh(spd)
    exact = float(v[:, 0] @ vectors @ torch.diag(theta.log()) @ vectors.T @ v[:, 0])
    assert abs(6 * float(lanczos_log_quadrature(run)[0]) - exact) < 1e-8


# ====================================================================== bad input
@pytest.mark.parametrize("kwargs, error, match", [
    ({"solve": "conjugate"}, ValueError, "solve"),
    ({"cg_tolerance": 0.0}, ValueError, "cg_tolerance"),
    ({"cg_tolerance": float("nan")}, ValueError, "cg_tolerance"),
    ({"cg_tolerance": 1.5}, ValueError, "cg_tolerance"),
    ({"max_cg_iterations": 0}, ValueError, "max_cg_iterations"),
    ({"preconditioner_rank": -1}, ValueError, "preconditioner_rank"),
    ({"preconditioner_rank": 2.0}, TypeError, "preconditioner_rank"),
    ({"cache_bytes": -1}, ValueError, "cache_bytes"),
])
def test_bad_settings_are_rejected_by_name(kwargs, error, match):
    with pytest.raises(error, match=match):
        RandomFeatureGP(_fourier(), **kwargs)


def test_nan_input_is_rejected():
    x, y, _ = _data()
    x[3, 1] = float("nan")
    with pytest.raises(ValueError, match="x"):
        RandomFeatureGP(_fourier(), solve="cg").fit(x, y)


def test_non_convergence_warns_with_the_residual_reached():
    x, y, xt = _data()
    gp = RandomFeatureGP(_fourier(), noise=1e-4, solve="cg", preconditioner_rank=0,
                         max_cg_iterations=3)
    with pytest.warns(ConvergenceWarning, match=r"relative residual \d"):
        gp.fit(x, y)


def test_cost_model_is_the_documented_sum():
    from rfgp.inference._cg_cost import PASS_TRAFFIC

    n, d, dim, it, r = 1000, 256, 4, 20, 16
    features = n * d * (dim + 4.0)
    products = 2.0 * n * d * (1 * (it + 1) + r)
    traffic = PASS_TRAFFIC * n * d * (it + 2)  # every pass reads each feature entry
    expected = (it + 2) * features + products + traffic + 2.0 * d * r**2
    assert cg_fit_cost(n, d, dim, iterations=it, rank=r) == expected
    cached = cg_fit_cost(n, d, dim, iterations=it, rank=r, cached=True)
    assert cached == expected - (it + 1) * features
    assert cg_fit_seconds(n, d, dim, iterations=it, rank=r,
                          multiply_adds_per_second=1e9) == expected / 1e9
    with pytest.raises(ValueError, match="num_features"):
        cg_fit_cost(n, 0, dim)
    # The budgeted D: the largest power of two whose predicted time is within the budget.
    rate = 1e9
    budget = cg_fit_seconds(n, 4096, dim, iterations=it, multiply_adds_per_second=rate)
    assert cg_num_features(n, dim, budget, multiply_adds_per_second=rate, iterations=it,
                           smallest=256) == 4096
    assert cg_num_features(n, dim, budget * 0.99, multiply_adds_per_second=rate,
                           iterations=it, smallest=256) == 2048
    with pytest.raises(ValueError, match="seconds"):
        cg_num_features(n, dim, 0.0, multiply_adds_per_second=rate)
    with pytest.raises(ValueError, match="multiply_adds_per_second"):
        cg_fit_seconds(n, d, dim, multiply_adds_per_second=0.0)


# ====================================================================== devices, bayesopt
@pytest.mark.parametrize("device", DEVICES)
def test_cg_fit_on_device_matches_cpu_cholesky(device):
    x, y, xt = _data()
    reference = RandomFeatureGP(_fourier(), noise=0.05, solve="weight").fit(x, y)
    kernel = _fourier()
    kernel.features(x[:1])
    gp = RandomFeatureGP(kernel.to(device), noise=0.05, solve="cg", cg_tolerance=TIGHT)
    gp.fit(x.to(device), y.to(device))
    mean, std = gp.predict(xt.to(device), return_std=True)
    assert mean.device.type == device
    ref_mean, ref_std = reference.predict(xt, return_std=True)
    assert _relative(mean.cpu(), ref_mean) < 1e-6
    assert _relative(std.cpu(), ref_std) < 1e-6


def test_thompson_sampling_and_botorch_posterior_work_with_a_cg_fit():
    from rfgp.bayesopt import thompson_sample

    x, y, _ = _data(n=100, d=2)
    gp = RandomFeatureGP(_fourier(256), noise=0.05, solve="cg").fit(x, y - y.mean())
    bounds = torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=DT)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        points = thompson_sample(gp, bounds, 2, raw_samples=64, steps=5, num_restarts=2,
                                 generator=torch.Generator().manual_seed(0))
    assert points.shape == (2, 2)
    pytest.importorskip("botorch")
    from rfgp.botorch import RandomFeatureModel

    post = RandomFeatureModel(gp).posterior(torch.rand(4, 3, 2, dtype=DT))
    assert post.mean.shape == (4, 3, 1)


# ====================================================================== distributed
WORLD = 2


def _distributed_data():
    x, y, xt = _data(n=301, columns=2)
    y[200] = 40.0  # rank 1's targets reach a larger power of two than rank 0's
    noise = 0.05 + 0.1 * torch.rand(y.shape, generator=torch.Generator().manual_seed(5),
                                    dtype=DT)
    noise[:150, 1] = noise[:150, 0]  # the columns' noise agrees on rank 0's shard only
    return x, y, noise, xt


def _distributed_worker(rank, store_path, out_path):
    import torch.distributed as dist

    from tests import ranks

    ranks.join(rank, store_path, WORLD)
    try:
        x, y, noise, xt = _distributed_data()
        s = slice(0, 150) if rank == 0 else slice(150, x.shape[0])
        kernel = FourierFeatureKernel(512, seed=rank).double()  # rank 0's weights are broadcast
        kernel.lengthscale = 0.3
        gp = RandomFeatureGP(kernel, solve="cg", cg_tolerance=TIGHT,
                             cg_variance_tolerance=VARIANCE)
        gp.fit(x[s], y[s], noise[s], distributed=True, chunk_size=40)
        mean, std = gp.predict(xt, return_std=True)
        # The shards' targets have different powers of two: the scale must be agreed.
        weight = RandomFeatureGP(_fourier(), solve="weight")
        weight.fit(x[s], y[s], noise[s], distributed=True)
        stream = RandomFeatureGP(_fourier(), noise=0.1, solve="cg", cg_tolerance=TIGHT)
        stream.fit_stream([(x[s][:70], y[s][:70]), (x[s][70:], y[s][70:])], distributed=True)
        # A low-rank form capped far above its tolerance: the variances of 40 rows take the
        # dense route, B all-reduced, decided alike on every process.
        capped = RandomFeatureGP(_fourier(), solve="cg", cg_tolerance=TIGHT,
                                 cg_variance_tolerance=VARIANCE, cg_variance_rank=8,
                                 preconditioner_rank=8)
        capped.fit(x[s], y[s], noise[s], distributed=True, chunk_size=40)
        capped_std = capped.predict(torch.cat([xt, 0.5 * xt]), return_std=True)[1]
        ranks.leave({"mean": mean, "std": std, "groups": gp.factorization_groups,
                     "capped_std": capped_std, "routes": capped.cg_info["variance_routes"],
                     "lml": gp.log_marginal_likelihood(), "stream": stream.predict(xt),
                     "weight": weight.predict(xt)}, out_path, rank)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_distributed_cg_fit_equals_the_single_process_fit(tmp_path):
    import torch.distributed as dist

    from tests import ranks

    if not dist.is_available():
        pytest.skip("torch.distributed is not available")
    results = ranks.run(_distributed_worker, tmp_path, (), WORLD)
    x, y, noise, xt = _distributed_data()
    single = RandomFeatureGP(_fourier(), solve="cg", cg_tolerance=TIGHT,
                             cg_variance_tolerance=VARIANCE).fit(x, y, noise)
    mean, std = single.predict(xt, return_std=True)
    stream = RandomFeatureGP(_fourier(), noise=0.1, solve="cg", cg_tolerance=TIGHT).fit(x, y)
    many_std = RandomFeatureGP(_fourier(), solve="weight").fit(x, y, noise).predict(
        torch.cat([xt, 0.5 * xt]), return_std=True)[1]
    for res in results:
        assert res["groups"] == single.factorization_groups == [[0], [1]]
        assert _relative(res["weight"], mean) < 1e-8
        assert _relative(res["mean"], mean) < 1e-8
        assert _relative(res["std"], std) < 1e-8
        assert _relative(res["stream"], stream.predict(xt)) < 1e-8
        assert res["routes"] == ["dense", "dense"]
        assert _relative(res["capped_std"], many_std) < 1e-8
        # Same probes on every process: the same estimate, up to the CG tolerance.
        assert abs(float(res["lml"] - single.log_marginal_likelihood())) < 1e-6


def test_a_mean_prediction_runs_no_cg_solve_and_equals_the_full_one(monkeypatch):
    # A variance of a CG fit is a CG solve per query row; a mean is one product with the
    # weights. Asking for means only must not pay for variances.
    x, y, _ = _data()
    _, gp = _pair(_fourier)
    gp.fit(x, y)
    full_mean, _ = gp.predict(x[:40], return_std=True)

    def refuse(*args, **kwargs):
        raise AssertionError("a mean prediction ran a CG solve")

    monkeypatch.setattr(cg_solver.ConjugateGradientSolver, "solve", refuse)
    torch.testing.assert_close(gp.predict(x[:40]), full_mean, rtol=0, atol=0)
    torch.testing.assert_close(gp.predict_from_features(gp.base_kernel.features(x[:40])),
                               full_mean, rtol=0, atol=0)


@pytest.mark.parametrize("scale", [1e-150, 1.0, 1e150])
def test_cg_energy_is_the_preconditioned_norm_of_the_final_residual(scale):
    # The recorded r^H P^-1 r (from CG's recurrence) equals the explicit residual's, at any
    # scale of the right-hand side (the columns are normalised inside and scaled back).
    g = torch.Generator().manual_seed(0)
    q = torch.linalg.qr(torch.randn(60, 60, generator=g, dtype=DT))[0]
    a = q @ torch.diag(1.0 + 100.0 * torch.rand(60, generator=g, dtype=DT)) @ q.T
    p_inv = torch.linalg.inv(a + 0.3 * torch.eye(60, dtype=DT))  # some P ~ A
    rhs = scale * torch.randn(60, 3, generator=g, dtype=DT)
    result = conjugate_gradients(lambda v: a @ v, rhs, lambda r: p_inv @ r, 1.0, 2,
                                 relative_energy=1e-12, warn=False)
    residual = rhs - a @ result.solution
    explicit = (residual * (p_inv @ residual)).sum(0)
    torch.testing.assert_close(result.energy, explicit, rtol=1e-8, atol=0)


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
def test_the_rank_zero_preconditioner_is_the_identity(dtype):
    pre = NystromPreconditioner.identity(7, dtype, torch.device("cpu"))
    v = torch.randn(7, 3, dtype=dtype, generator=torch.Generator().manual_seed(0))
    assert pre.rank == 0
    assert torch.equal(pre.inverse(v), v)


def test_complex_standard_normal_draws_have_unit_variance_in_each_part():
    # E|z|^2 = 2 for z = a + i b, a, b ~ N(0, 1) independent: the sample means of a^2, b^2
    # and a b over n draws lie within 5 standard errors (sqrt(2 / n), sqrt(1 / n)).
    n = 40000
    z = standard_normal((n,), torch.complex128, torch.Generator().manual_seed(1),
                        torch.device("cpu"))
    a, b = z.real, z.imag
    assert abs(float(a.square().mean()) - 1) < 5 * math.sqrt(2 / n)
    assert abs(float(b.square().mean()) - 1) < 5 * math.sqrt(2 / n)
    assert abs(float((a * b).mean())) < 5 * math.sqrt(1 / n)
    real = standard_normal((3, 2), torch.float32, None, torch.device("cpu"))
    assert real.dtype == torch.float32 and real.shape == (3, 2)
