"""The RandomFeatureKernel contract (DESIGN §3), exercised through FourierFeatureKernel.

Two tiny subclasses defined here check the parts FourierFeatureKernel does not use: complex
features (real form ``[Re Phi, Im Phi]``, weights stored as real views) and multi-output
features (GPyTorch's interleaved rows).
"""

from __future__ import annotations

import io
import math
import pickle

import gpytorch
import numpy as np
import pytest
import torch
from gpytorch.models.exact_prediction_strategies import LinearPredictionStrategy
from linear_operator.operators import (
    LowRankRootLinearOperator,
    MatmulLinearOperator,
    RootLinearOperator,
)

from rfgp._ops import complex_gaussian
from rfgp.kernels import FourierFeatureKernel, RandomFeatureKernel, real_form


# ---------------------------------------------------------------- helpers
class ComplexExponentialKernel(RandomFeatureKernel):
    """``Phi(x) = exp(i W x / l) / sqrt(D)``: complex features of the RBF kernel."""

    has_lengthscale = True

    def __init__(self, num_features, **kwargs):
        super().__init__(num_features, **kwargs)
        self.is_complex = True

    def _sample_weights(self, input_dim, generator):
        w = torch.randn(*self.batch_shape, input_dim, self.num_features, generator=generator,
                        dtype=torch.float64)
        shift = complex_gaussian((*self.batch_shape, self.num_features), generator)
        return {"frequencies": w, "shift": torch.view_as_real(shift)}

    def _features(self, x):
        proj = (x / self.lengthscale.to(x.dtype)) @ self.frequencies.to(x.dtype)
        complex_dtype = torch.complex128 if x.dtype == torch.float64 else torch.complex64
        phase = torch.view_as_complex(self.shift.contiguous()).to(complex_dtype)
        phase = phase / phase.abs()  # unit modulus: cancels in Phi Phi^H
        return torch.exp(1j * proj.to(complex_dtype)) * phase / math.sqrt(self.num_features)


class TwoOutputKernel(RandomFeatureKernel):
    """Features ``(N, 2, D)``: output t uses its own half-scaled copy of an RFF map."""

    def __init__(self, num_features, **kwargs):
        super().__init__(num_features, **kwargs)
        self._outputs_per_input = 2

    def _sample_weights(self, input_dim, generator):
        return {"w": torch.randn(*self.batch_shape, input_dim, self.num_features // 2,
                                 generator=generator, dtype=torch.float64)}

    def _features(self, x):
        proj = x @ self.w.to(x.dtype)
        phi = torch.cat([proj.cos(), proj.sin()], -1) / math.sqrt(self.num_features // 2)
        return torch.stack([phi, 0.5 * phi], dim=-2)


class GPModel(gpytorch.models.ExactGP):
    def __init__(self, x, y, likelihood, kernel):
        super().__init__(x, y, likelihood)
        self.mean_module = gpytorch.means.ConstantMean()
        self.covar_module = gpytorch.kernels.ScaleKernel(kernel)

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def make_model(x, y, num_features=32, seed=0, sampling="orthogonal"):
    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    kernel = FourierFeatureKernel(num_features, sampling=sampling, seed=seed)
    return GPModel(x, y, likelihood, kernel).double(), likelihood.double()


def dense(op):
    return op.to_dense() if hasattr(op, "to_dense") else op


# ---------------------------------------------------------------- forward and operators
def test_operator_types(generator):
    kernel = FourierFeatureKernel(16, seed=0).double()
    many = torch.randn(40, 3, generator=generator, dtype=torch.float64)
    few = torch.randn(10, 3, generator=generator, dtype=torch.float64)
    with torch.no_grad():
        assert isinstance(kernel(many).evaluate_kernel(), LowRankRootLinearOperator)  # D < N
        assert isinstance(kernel(few).evaluate_kernel(), RootLinearOperator)  # D >= N
        assert not isinstance(kernel(few).evaluate_kernel(), LowRankRootLinearOperator)
        assert isinstance(kernel(many, few).evaluate_kernel(), MatmulLinearOperator)
        # A copy of x1 counts as x1 == x2.
        assert isinstance(kernel(many, many.clone()).evaluate_kernel(), LowRankRootLinearOperator)


def test_forward_is_the_feature_gram_matrix(generator):
    kernel = FourierFeatureKernel(16, seed=0).double()
    x1 = torch.randn(12, 3, generator=generator, dtype=torch.float64)
    x2 = torch.randn(7, 3, generator=generator, dtype=torch.float64)
    with torch.no_grad():
        phi1, phi2 = kernel.features(x1), kernel.features(x2)
        torch.testing.assert_close(kernel(x1).to_dense(), phi1 @ phi1.T)
        torch.testing.assert_close(kernel(x1, x2).to_dense(), phi1 @ phi2.T)


def test_diag(generator):
    kernel = FourierFeatureKernel(16, seed=0).double()
    scaled = gpytorch.kernels.ScaleKernel(kernel).double()
    scaled.outputscale = torch.tensor(2.5, dtype=torch.float64)
    x1 = torch.randn(9, 3, generator=generator, dtype=torch.float64)
    x2 = torch.randn(9, 3, generator=generator, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(kernel(x1, diag=True), torch.diagonal(kernel(x1).to_dense()))
        # sin/cos features: k_hat(x, x) = 1 exactly.
        torch.testing.assert_close(kernel(x1, diag=True), torch.ones(9, dtype=torch.float64))
        torch.testing.assert_close(scaled(x1, diag=True), torch.full((9,), 2.5,
                                                                     dtype=torch.float64))
        cross = kernel(x1, x2).to_dense()
        torch.testing.assert_close(kernel(x1, x2, diag=True), torch.diagonal(cross))


def test_scale_kernel(generator):
    kernel = FourierFeatureKernel(16, seed=0).double()
    scaled = gpytorch.kernels.ScaleKernel(kernel).double()
    scaled.outputscale = torch.tensor(3.0, dtype=torch.float64)
    x = torch.randn(20, 2, generator=generator, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(scaled(x).to_dense(), 3.0 * kernel(x).to_dense())


def test_last_dim_is_batch_is_refused(generator):
    kernel = FourierFeatureKernel(16, seed=0)
    x = torch.randn(5, 2, generator=generator)
    with pytest.raises(NotImplementedError, match="last_dim_is_batch"):
        kernel.forward(x, x, last_dim_is_batch=True)


# ---------------------------------------------------------------- randomness and seeds
@pytest.mark.parametrize("sampling", ["iid", "orthogonal", "structured"])
def test_same_seed_same_features(sampling, generator):
    x = torch.randn(6, 4, generator=generator, dtype=torch.float64)
    a = FourierFeatureKernel(16, sampling=sampling, seed=7).double()
    b = FourierFeatureKernel(16, sampling=sampling, seed=7).double()
    c = FourierFeatureKernel(16, sampling=sampling, seed=8).double()
    with torch.no_grad():
        torch.testing.assert_close(a.features(x), b.features(x), rtol=0, atol=0)
        assert (a.features(x) - c.features(x)).abs().max() > 1e-3


def test_seed_does_not_touch_global_rng():
    torch.manual_seed(0)
    expected = torch.rand(2)
    torch.manual_seed(0)
    FourierFeatureKernel(16, seed=3).features(torch.randn(3, 2, generator=torch.Generator()))
    torch.testing.assert_close(torch.rand(2), expected, rtol=0, atol=0)


@pytest.mark.parametrize("sampling", ["iid", "orthogonal", "structured"])
def test_resample_with_generator_is_reproducible(sampling, generator):
    x = torch.randn(6, 4, generator=generator, dtype=torch.float64)
    kernel = FourierFeatureKernel(16, sampling=sampling, input_dim=4, seed=0).double()
    with torch.no_grad():
        before = kernel.features(x)
        assert kernel.resample(torch.Generator().manual_seed(5)) is kernel
        first = kernel.features(x)
        kernel.resample(torch.Generator().manual_seed(5))
        second = kernel.features(x)
        kernel.resample(torch.Generator().manual_seed(6))
        third = kernel.features(x)
    torch.testing.assert_close(first, second, rtol=0, atol=0)
    assert (first - before).abs().max() > 1e-3
    assert (first - third).abs().max() > 1e-3
    # Resampling keeps the buffers' dtype.
    for name in kernel.random_weight_names:
        buffer = getattr(kernel, name)
        assert not buffer.is_floating_point() or buffer.dtype == torch.float64


def test_resample_errors():
    with pytest.raises(RuntimeError, match="input dimension is unknown"):
        FourierFeatureKernel(8).resample()
    with pytest.raises(TypeError, match="generator must be a torch.Generator"):
        FourierFeatureKernel(8, input_dim=2).resample(3)


def test_constructor_errors():
    with pytest.raises(TypeError, match="seed must be an integer"):
        FourierFeatureKernel(8, seed=1.5)
    with pytest.raises(ValueError, match="input_dim must be an integer >= 1"):
        FourierFeatureKernel(8, input_dim=0)
    with pytest.raises(ValueError, match="num_features must be an integer >= 1"):
        ComplexExponentialKernel(0)


def test_weights_drawn_lazily_and_input_dim_inferred():
    kernel = FourierFeatureKernel(8)
    assert not kernel.weights_initialized and kernel.input_dim is None
    kernel.features(torch.randn(3, 5))
    assert kernel.weights_initialized and kernel.input_dim == 5
    assert FourierFeatureKernel(8, ard_num_dims=3).input_dim == 3
    assert FourierFeatureKernel(8, active_dims=[0, 4]).input_dim == 2
    # 1-D inputs mean d = 1.
    assert FourierFeatureKernel(8, seed=0).features(torch.randn(7)).shape == (7, 8)


# ---------------------------------------------------------------- batches
def test_batch_kernels_draw_independently(generator):
    kernel = FourierFeatureKernel(2 * 500, sampling="iid", batch_shape=torch.Size([3]),
                                  input_dim=2, seed=0).double()
    kernel.features(torch.randn(3, 4, 2, generator=generator, dtype=torch.float64))
    w = kernel.frequencies
    assert w.shape == (3, 500, 2)
    flat = w.reshape(3, -1)
    corr = torch.corrcoef(flat)
    off_diagonal = corr[~torch.eye(3, dtype=torch.bool)]
    # Independent standard normals: sample correlation ~ N(0, 1/n).
    assert off_diagonal.abs().max() < 5 / math.sqrt(flat.shape[1])


@pytest.mark.parametrize("sampling", ["iid", "orthogonal", "structured"])
def test_kernel_indexing_equals_batch_slice(sampling, generator):
    kernel = FourierFeatureKernel(16, sampling=sampling, batch_shape=torch.Size([3]),
                                  ard_num_dims=2, seed=0).double()
    kernel.lengthscale = torch.rand(3, 1, 2, generator=generator, dtype=torch.float64) + 0.5
    x = torch.randn(3, 6, 2, generator=generator, dtype=torch.float64)
    with torch.no_grad():
        full = kernel(x).to_dense()
        assert full.shape == (3, 6, 6)
        for i in range(3):
            sub = kernel[i]
            assert sub.batch_shape == torch.Size([])
            torch.testing.assert_close(sub(x[i]).to_dense(), full[i], rtol=1e-12, atol=1e-12)
        assert (full[0] - full[1]).abs().max() > 1e-3
        # The original kernel is untouched.
        torch.testing.assert_close(kernel(x).to_dense(), full, rtol=0, atol=0)


def test_batch_kernel_broadcasts_over_unbatched_inputs(generator):
    kernel = FourierFeatureKernel(16, batch_shape=torch.Size([2]), seed=0).double()
    x = torch.randn(5, 3, generator=generator, dtype=torch.float64)
    assert kernel.features(x).shape == (2, 5, 16)
    assert kernel(x).shape == (2, 5, 5)


# ---------------------------------------------------------------- hyperparameters
def test_active_dims(generator):
    x = torch.randn(8, 4, generator=generator, dtype=torch.float64)
    with_dims = FourierFeatureKernel(16, active_dims=[0, 2], seed=3).double()
    without = FourierFeatureKernel(16, seed=3).double()
    with torch.no_grad():
        torch.testing.assert_close(with_dims.features(x), without.features(x[:, [0, 2]]))
        torch.testing.assert_close(with_dims(x).to_dense(), without(x[:, [0, 2]]).to_dense())
    assert with_dims.input_dim == 2


@pytest.mark.parametrize("dims,bad", [([5], "the largest index 5"), ([0, 3], "the largest index 3"),
                                      ([-1], "the index -1")])
def test_active_dims_beyond_the_inputs_columns_are_named(dims, bad):
    x = torch.randn(6, 3, dtype=torch.float64)
    kernel = FourierFeatureKernel(32, active_dims=dims).double()
    message = f"active_dims must index the 3 columns of x (0 to 2), got {bad}"
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        kernel.features(x)
    with pytest.raises(ValueError, match="active_dims must index the 3 columns of x1"):
        kernel(x).to_dense()


def test_ard_lengthscale_shape_and_gradients(generator):
    kernel = FourierFeatureKernel(32, ard_num_dims=3, seed=0).double()
    assert kernel.lengthscale.shape == (1, 3)
    x = torch.randn(10, 3, generator=generator, dtype=torch.float64)
    kernel(x).to_dense().sum().backward()
    assert torch.isfinite(kernel.raw_lengthscale.grad).all()
    assert torch.all(kernel.raw_lengthscale.grad != 0)


# ---------------------------------------------------------------- serialisation and dtype
@pytest.mark.parametrize("sampling", ["iid", "orthogonal", "structured"])
def test_state_dict_round_trip_into_fresh_kernel(sampling, generator):
    kernel = FourierFeatureKernel(16, spectral="matern32", sampling=sampling,
                                  ard_num_dims=3).double()
    x = torch.randn(6, 3, generator=generator, dtype=torch.float64)
    kernel.lengthscale = torch.tensor([[0.5, 1.0, 2.0]], dtype=torch.float64)
    with torch.no_grad():
        expected = kernel(x).to_dense()
    buffer = io.BytesIO()
    torch.save(kernel.state_dict(), buffer)
    buffer.seek(0)
    fresh = FourierFeatureKernel(16, spectral="matern32", sampling=sampling,
                                 ard_num_dims=3).double()
    fresh.load_state_dict(torch.load(buffer))
    assert fresh.weights_initialized
    with torch.no_grad():
        torch.testing.assert_close(fresh(x).to_dense(), expected, rtol=0, atol=0)


def test_pickle_round_trip(generator):
    kernel = FourierFeatureKernel(16, sampling="structured", spectral="matern52",
                                  seed=1).double()
    x = torch.randn(6, 3, generator=generator, dtype=torch.float64)
    with torch.no_grad():
        expected = kernel(x).to_dense()
        restored = pickle.loads(pickle.dumps(kernel))
        torch.testing.assert_close(restored(x).to_dense(), expected, rtol=0, atol=0)
    # A kernel pickled before its first call draws the same weights from its seed.
    lazy = pickle.loads(pickle.dumps(FourierFeatureKernel(16, seed=4).double()))
    with torch.no_grad():
        torch.testing.assert_close(lazy.features(x),
                                   FourierFeatureKernel(16, seed=4).double().features(x))


def test_to_dtype_moves_random_buffers(generator):
    kernel = FourierFeatureKernel(16, spectral="matern12", sampling="structured", seed=0)
    x = torch.randn(5, 3, generator=generator)
    with torch.no_grad():
        phi32 = kernel.features(x)
    assert kernel.radial_scale.dtype == torch.float32
    assert phi32.dtype == torch.float32
    kernel = kernel.to(torch.float64)
    assert kernel.radial_scale.dtype == torch.float64
    assert kernel.signs.dtype == torch.float64
    with torch.no_grad():
        phi64 = kernel.features(x.double())
    assert phi64.dtype == torch.float64
    torch.testing.assert_close(phi64, phi32.double(), rtol=0, atol=1e-5)
    # The weights are not redrawn by the cast.
    assert kernel.weights_initialized


def test_weights_drawn_after_cast_follow_the_module_dtype_without_parameters():
    # A kernel with no parameters has nothing else that records the dtype of .double().
    class Unscaled(RandomFeatureKernel):
        def _sample_weights(self, input_dim, generator):
            return {"w": torch.randn(self.num_features, input_dim, generator=generator,
                                     dtype=torch.float64)}

        def _features(self, x):
            return x @ self.w.to(x.dtype).T

    kernel = Unscaled(4, seed=0)
    assert not list(kernel.parameters())
    kernel = kernel.double()
    kernel.features(torch.zeros(2, 3, dtype=torch.float64))
    assert kernel.w.dtype == torch.float64
    assert "_dtype_anchor" not in kernel.state_dict()


# ---------------------------------------------------------------- contract for subclasses
def test_complex_subclass_real_form_and_dtype_cast(generator):
    kernel = ComplexExponentialKernel(64, seed=0)
    kernel.lengthscale = torch.tensor(1.3)
    x = torch.randn(10, 2, generator=generator)
    with torch.no_grad():
        phi = kernel.features(x)
        assert phi.dtype == torch.complex64 and kernel.is_complex
        assert kernel.num_real_features == 128
        gram = kernel(x).to_dense()
        torch.testing.assert_close(gram, (phi @ phi.conj().T).real)
        torch.testing.assert_close(kernel.real_features(x), real_form(phi))
    # The complex weight survives a dtype cast (stored as a real view).
    shift32 = kernel.shift.clone()
    kernel = kernel.double()
    assert kernel.shift.dtype == torch.float64 and kernel.shift.shape[-1] == 2
    torch.testing.assert_close(kernel.shift, shift32.double())
    with torch.no_grad():
        phi64 = kernel.features(x.double())
    assert phi64.dtype == torch.complex128
    torch.testing.assert_close(phi64, phi.to(torch.complex128), rtol=0, atol=1e-5)


def test_real_form():
    phi = torch.tensor([[1 + 2j, 3 - 1j]])
    torch.testing.assert_close(real_form(phi), torch.tensor([[1.0, 3.0, 2.0, -1.0]]))
    real = torch.ones(2, 3)
    assert real_form(real) is real


@pytest.mark.parametrize("bad", [np.zeros((2, 2)), [[1.0]], 1.0, None])
def test_real_form_names_a_non_tensor(bad):
    with pytest.raises(TypeError, match="phi must be a torch.Tensor of features, got"):
        real_form(bad)


@pytest.mark.parametrize("phi", [torch.tensor(1 + 2j), torch.tensor(1.0)])
def test_real_form_names_a_0d_tensor(phi):
    with pytest.raises(ValueError, match="phi must have shape \\(..., D\\) .* got a 0-d tensor"):
        real_form(phi)


def test_multi_output_subclass_interleaves_rows(generator):
    kernel = TwoOutputKernel(16, seed=0).double()
    x = torch.randn(5, 2, generator=generator, dtype=torch.float64)
    assert kernel.num_outputs_per_input(x, x) == 2
    with torch.no_grad():
        phi = kernel.features(x)
        assert phi.shape == (5, 2, 16)
        covar = kernel(x).to_dense()
    assert covar.shape == (10, 10)
    # Row n * p + t is output t of input n.
    base = phi[:, 0] @ phi[:, 0].T
    torch.testing.assert_close(covar[0::2, 0::2], base)
    torch.testing.assert_close(covar[1::2, 1::2], 0.25 * base)
    torch.testing.assert_close(covar[0::2, 1::2], 0.5 * base)


# ---------------------------------------------------------------- ExactGP integration
@pytest.mark.parametrize("num_features", [16, 128])  # D < N and D >= N
def test_exact_gp_posterior_equals_dense_computation(num_features, regression_data, generator):
    x, y = regression_data
    model, likelihood = make_model(x, y, num_features=num_features)
    model.covar_module.outputscale = torch.tensor(1.7, dtype=torch.float64)
    model.covar_module.base_kernel.lengthscale = torch.tensor(0.8, dtype=torch.float64)
    model.mean_module.constant.data.fill_(0.3)
    likelihood.noise = torch.tensor(0.05, dtype=torch.float64)
    x_test = torch.randn(15, 2, generator=generator, dtype=torch.float64)
    model.eval()
    likelihood.eval()
    with torch.no_grad():
        posterior = model(x_test)
        assert isinstance(model.prediction_strategy, LinearPredictionStrategy)
        kernel = model.covar_module.base_kernel
        phi, phi_test = kernel.features(x) * math.sqrt(1.7), kernel.features(x_test) * math.sqrt(
            1.7)
        k_train = phi @ phi.T + 0.05 * torch.eye(60, dtype=torch.float64)
        k_cross = phi_test @ phi.T
        mean = 0.3 + k_cross @ torch.linalg.solve(k_train, y - 0.3)
        covar = phi_test @ phi_test.T - k_cross @ torch.linalg.solve(k_train, k_cross.T)
    torch.testing.assert_close(posterior.mean, mean, rtol=1e-8, atol=1e-8)
    torch.testing.assert_close(posterior.covariance_matrix, covar, rtol=1e-6, atol=1e-8)


def test_adam_training_improves_marginal_likelihood(regression_data):
    x, y = regression_data
    model, likelihood = make_model(x, y, num_features=64)
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
    model.train()
    likelihood.train()

    def objective():
        return mll(model(x), y)

    with torch.no_grad():
        initial = objective().item()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    for _ in range(60):
        optimizer.zero_grad()
        loss = -objective()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        final = objective().item()
    assert math.isfinite(final)
    # Per-datum log likelihood; the noise level of the data is 0.1, so a good fit gains a lot.
    assert final > initial + 0.3, (initial, final)
    assert likelihood.noise.item() < 0.1


def test_exact_gp_state_dict_and_pickle_give_identical_predictions(regression_data, generator):
    x, y = regression_data
    model, likelihood = make_model(x, y, sampling="structured", seed=None)
    model.covar_module.base_kernel.lengthscale = torch.tensor(0.6, dtype=torch.float64)
    x_test = torch.randn(7, 2, generator=generator, dtype=torch.float64)
    model.eval()
    likelihood.eval()
    with torch.no_grad():
        expected = likelihood(model(x_test))
    fresh, fresh_likelihood = make_model(x, y, sampling="structured", seed=None)
    fresh.load_state_dict(model.state_dict())
    fresh.eval()
    fresh_likelihood.eval()
    unpickled = pickle.loads(pickle.dumps(model))
    unpickled.eval()
    with torch.no_grad():
        for restored in (fresh(x_test), unpickled(x_test)):
            torch.testing.assert_close(restored.mean, expected.mean, rtol=0, atol=1e-12)
        torch.testing.assert_close(fresh_likelihood(fresh(x_test)).variance, expected.variance,
                                   rtol=0, atol=1e-12)


# ---------------------------------------------------------------------------- declared contract
def test_subclasses_must_implement_the_abstract_methods():
    class OnlyWeights(RandomFeatureKernel):
        def _sample_weights(self, input_dim, generator):
            return {}

    with pytest.raises(TypeError, match="abstract"):
        OnlyWeights(4)


def test_optional_hooks_default_to_not_needed():
    kernel = ComplexExponentialKernel(6, seed=0).double()
    x = torch.randn(5, 2, dtype=torch.float64)
    assert kernel.needs_allocation is False
    assert kernel.allocate(x) is kernel
    assert kernel.has_variance_correction is False
    torch.testing.assert_close(kernel.variance_correction(x), torch.zeros(5, dtype=x.dtype))
    with pytest.raises(NotImplementedError, match="no exact GPyTorch kernel"):
        kernel.exact_kernel()
    two = TwoOutputKernel(6, seed=0).double()
    assert two.variance_correction(x).shape == (10,)  # (N p,), GPyTorch's interleaved rows


def test_exact_matrix_evaluates_the_exact_kernel():
    kernel = FourierFeatureKernel(8, spectral="matern32", seed=0).double()
    kernel.lengthscale = 0.7
    x = torch.randn(4, 3, dtype=torch.float64)
    expected = gpytorch.kernels.MaternKernel(nu=1.5).double()
    expected.lengthscale = 0.7
    torch.testing.assert_close(kernel.exact_matrix(x, x), expected(x, x).to_dense().detach())


def test_prepare_input_checks_restricts_and_draws():
    kernel = FourierFeatureKernel(8, active_dims=[0, 2], seed=0).double()
    x = torch.randn(3, 4, dtype=torch.float64)
    assert not kernel.weights_initialized
    prepared = kernel.prepare_input(x)
    torch.testing.assert_close(prepared, x[:, [0, 2]], rtol=0, atol=0)
    assert kernel.weights_initialized and kernel.random_weight_names
    torch.testing.assert_close(kernel.features(x), kernel._features(prepared), rtol=0, atol=0)
    with pytest.raises(ValueError, match="finite"):
        kernel.prepare_input(torch.full((2, 4), float("nan"), dtype=torch.float64))


def test_check_input_and_ensure_weights():
    kernel = FourierFeatureKernel(8, seed=0).double()
    x = torch.randn(3, dtype=torch.float64)
    assert kernel.check_input(x).shape == (3, 1)
    kernel.ensure_weights(kernel.check_input(x))
    assert kernel.weights_initialized and kernel.input_dim == 1


def test_unwrap_scale_kernel():
    from rfgp.kernels._base import unwrap_scale_kernel

    base = FourierFeatureKernel(8)
    assert unwrap_scale_kernel(base) is base
    assert unwrap_scale_kernel(gpytorch.kernels.ScaleKernel(base)) is base
    with pytest.raises(TypeError, match="RandomFeatureKernel"):
        unwrap_scale_kernel(gpytorch.kernels.RBFKernel())


def test_kernels_never_import_inference():
    # Kernels know nothing about solvers: no module of rfgp.kernels imports rfgp.inference.
    import ast
    import pathlib

    import rfgp.kernels

    root = pathlib.Path(rfgp.kernels.__file__).parent
    offenders = []
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            offenders += [f"{path.name}: {n}" for n in names if n.startswith("rfgp.inference")]
    assert offenders == []


@pytest.mark.parametrize("keyword", [{"nu": 1.5}, {"lengthscale": 0.5}, {"ard_num_dim": 3}])
def test_unknown_keyword_arguments_are_refused_not_swallowed(keyword):
    # GPyTorch's Kernel ignores unknown keywords: nu=1.5 would silently give an RBF kernel.
    with pytest.raises(TypeError, match=f"FourierFeatureKernel got unexpected keyword "
                                        f"argument\\(s\\) \\['{next(iter(keyword))}'\\]"):
        FourierFeatureKernel(16, **keyword)
    FourierFeatureKernel(16, ard_num_dims=3, active_dims=[0, 1, 2], batch_shape=torch.Size([]))


@pytest.mark.parametrize("bad,error", [(math.nan, ValueError), (0.0, ValueError),
                                       (math.inf, ValueError), (True, TypeError),
                                       ("0.5", TypeError)])
def test_lengthscale_setter_refuses_by_name_through_the_shared_check(bad, error):
    kernel = FourierFeatureKernel(8)
    before = kernel.lengthscale.clone()
    with pytest.raises(error, match="lengthscale must be"):
        kernel.lengthscale = bad
    assert torch.equal(kernel.lengthscale, before)
