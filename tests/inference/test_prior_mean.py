"""The constant prior mean of RandomFeatureGP: the model with mean m on y is the zero-mean
model on y - m with m added to every output (an exact identity), on every path that fits,
predicts, samples, saves or selects."""

from __future__ import annotations

import io

import pytest
import torch
from gpytorch.kernels import ScaleKernel

from rfgp import RandomFeatureGP
from rfgp._data import ArraySource
from rfgp.botorch import RandomFeatureModel
from rfgp.inference import StaleFitError
from rfgp.inference._evidence_search import regression_objective
from rfgp.inference._prior_mean import adopt_prior_mean, check_prior_mean
from rfgp.kernels import CurlFreeFeatureKernel, FourierFeatureKernel

DT = torch.float64


def _data(n=300, columns=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 2, generator=g, dtype=DT)
    f = torch.sin(5 * x[:, 0]) * x[:, 1]
    if columns is None:
        return x, f + 3.0 + 0.05 * torch.randn(n, generator=g, dtype=DT)
    return x, torch.stack([(t + 1) * f - 2.0 * t + 0.05 * torch.randn(n, generator=g, dtype=DT)
                           for t in range(columns)], -1)


def _gp(mean=0.0, solve="weight", features=64):
    return RandomFeatureGP(FourierFeatureKernel(features, seed=0).double(), noise=0.01,
                           solve=solve, prior_mean=mean)


def _close(a, b, atol=1e-10):
    torch.testing.assert_close(a, b, rtol=0, atol=atol)


@pytest.mark.parametrize("solve", ["weight", "function", "cg"])
def test_a_prior_mean_is_the_zero_mean_model_on_the_centred_targets(solve):
    x, y = _data()
    xq = torch.rand(7, 2, dtype=DT) * 3  # some far from the data
    with_mean = _gp(3.0, solve).fit(x, y)
    centred = _gp(0.0, solve).fit(x, y - 3.0)
    mean, std = with_mean.predict(xq, return_std=True)
    mean0, std0 = centred.predict(xq, return_std=True)
    atol = 1e-6 if solve == "cg" else 1e-10  # CG: two runs on targets of other sizes
    _close(mean, mean0 + 3.0, atol)
    _close(std, std0, atol)
    post, post0 = with_mean.posterior(xq), centred.posterior(xq)
    _close(post.mean, post0.mean + 3.0, atol)
    _close(post.covariance_matrix, post0.covariance_matrix, atol)
    paths = with_mean.sample_functions(3, torch.Generator().manual_seed(1))(xq)
    paths0 = centred.sample_functions(3, torch.Generator().manual_seed(1))(xq)
    _close(paths, paths0 + 3.0, atol)
    if solve != "cg":  # (the CG evidence is a stochastic estimate)
        _close(with_mean.log_marginal_likelihood(), centred.log_marginal_likelihood())
        _close(with_mean.log_marginal_likelihood(x, y),
               centred.log_marginal_likelihood(x, y - 3.0))


def test_one_mean_per_column_and_per_output():
    x, y = _data(columns=2)
    m = torch.tensor([0.5, -2.0], dtype=DT)
    a = _gp(m).fit(x, y)
    b = _gp().fit(x, y - m)
    _close(a.predict(x[:5]), b.predict(x[:5]) + m)
    _close(a.posterior(x[:5]).mean, b.posterior(x[:5]).mean + m)
    _close(a.sample_functions(2, torch.Generator().manual_seed(0))(x[:5]),
           b.sample_functions(2, torch.Generator().manual_seed(0))(x[:5]) + m)
    # p = 2 outputs per input (interleaved rows): one mean per output
    field = _data(columns=2)[1]
    a = RandomFeatureGP(CurlFreeFeatureKernel(32, seed=0).double(), noise=0.1, prior_mean=m)
    b = RandomFeatureGP(CurlFreeFeatureKernel(32, seed=0).double(), noise=0.1)
    a.fit(x, field)
    b.fit(x, field - m)
    _close(a.predict(x[:5]), b.predict(x[:5]) + m)
    _close(a.sample_functions(2, torch.Generator().manual_seed(0))(x[:5]),
           b.sample_functions(2, torch.Generator().manual_seed(0))(x[:5]) + m)
    # BoTorch's view carries the mean too
    model, model0 = RandomFeatureModel(a), RandomFeatureModel(b)
    xb = x[:6].reshape(2, 3, 2)
    _close(model.posterior(xb).mean, model0.posterior(xb).mean + m)


def test_update_stream_and_source_fits_centre_their_targets_too():
    x, y = _data()
    whole = _gp(3.0).fit(x, y)
    xq = x[:9]
    _close(_gp(3.0).fit(x[:120], y[:120]).update(x[120:], y[120:]).predict(xq),
           whole.predict(xq), 1e-9)
    _close(_gp(3.0).fit_stream([(x[:100], y[:100]), (x[100:], y[100:])]).predict(xq),
           whole.predict(xq), 1e-9)
    # rows read from a data source at every CG product
    source = _gp(3.0, "cg")._fit_source(ArraySource(x, y), (x[:1], y[:1]))
    _close(source.predict(xq), _gp(3.0, "cg").fit(x, y).predict(xq), 1e-6)


def test_a_new_prior_mean_refits_and_a_checkpoint_keeps_it():
    x, y = _data()
    gp = _gp(3.0).fit(x, y)
    gp.prior_mean = 1.0  # held data: refitted on first use, as a fresh fit
    _close(gp.predict(x[:5]), _gp(1.0).fit(x, y).predict(x[:5]))
    streamed = _gp(3.0).fit_stream([(x, y)])
    streamed.prior_mean = 1.0
    with pytest.raises(StaleFitError, match="prior mean"):
        streamed.predict(x[:5])
    # state_dict round trip: the mean and the fit it was subtracted in
    fitted = _gp(torch.tensor(2.5, dtype=DT)).fit(x, y)
    buffer = io.BytesIO()
    torch.save(fitted.state_dict(), buffer)
    buffer.seek(0)
    loaded = _gp()
    loaded.load_state_dict(torch.load(buffer, weights_only=True))
    assert float(loaded.prior_mean) == 2.5
    _close(loaded.predict(x[:5]), fitted.predict(x[:5]), 0.0)
    # a checkpoint of a model without a prior mean (saved before it existed) loads as zero
    plain = _gp().fit(x, y - 3.0)
    state = plain.state_dict()
    del state["prior_mean"]
    del state["_extra_state"]["prior_mean"]
    old = _gp(7.0)
    old.load_state_dict(state)
    assert float(old.prior_mean) == 0.0
    _close(old.predict(x[:5]), plain.predict(x[:5]), 0.0)


def test_a_model_fitted_on_centred_targets_adopts_their_mean():
    x, y = _data()
    adopted = _gp().fit(x, y - 3.0)
    adopt_prior_mean(adopted, torch.tensor(3.0, dtype=DT))
    direct = _gp(3.0).fit(x, y)
    _close(adopted.predict(x[:5]), direct.predict(x[:5]))
    # the held targets are the uncentred ones: a kernel change refits both alike
    adopted.kernel.lengthscale = 0.3
    direct.kernel.lengthscale = 0.3
    _close(adopted.predict(x[:5]), direct.predict(x[:5]))
    with pytest.raises(ValueError, match="must be zero before"):
        adopt_prior_mean(direct, torch.tensor(1.0, dtype=DT))


@pytest.mark.parametrize("bad, error, match", [
    (float("nan"), ValueError, "prior_mean must be finite"),
    (float("inf"), ValueError, "prior_mean must be finite"),
    (torch.zeros(2, 2), ValueError, "prior_mean must be a number or a non-empty 1-D"),
    (torch.zeros(0), ValueError, "prior_mean must be a number or a non-empty 1-D"),
    (True, TypeError, "prior_mean must be a number"),
    ("zero", TypeError, "prior_mean"),
    (torch.tensor([1, 2]), TypeError, "prior_mean must have a floating dtype"),
    (torch.tensor(1.0 + 1.0j), TypeError, "prior_mean must be real"),
])
def test_a_bad_prior_mean_is_refused_naming_it(bad, error, match):
    with pytest.raises(error, match=match):
        _gp(bad)
    gp = _gp()
    with pytest.raises(error, match=match):
        gp.prior_mean = bad
    assert float(gp.prior_mean) == 0.0
    assert float(check_prior_mean(torch.tensor(2.0, dtype=torch.float32))) == 2.0


def test_a_mean_beyond_the_fits_dtype_is_refused_not_turned_into_nan():
    x, y = _data(50)
    gp = RandomFeatureGP(FourierFeatureKernel(16, seed=0), noise=0.1, prior_mean=1e39)
    with pytest.raises(ValueError, match="not representable in torch.float32"):
        gp.fit(x.float(), y.float())
    assert not gp.is_fitted
    # at a scale float32 holds, the identity with the centred fit stands
    big = RandomFeatureGP(FourierFeatureKernel(16, seed=0).double(), noise=0.1,
                          prior_mean=1e30).fit(x, y * 1e30)
    centred = RandomFeatureGP(FourierFeatureKernel(16, seed=0).double(), noise=0.1)
    centred.fit(x, y * 1e30 - 1e30)
    torch.testing.assert_close(big.predict(x[:3]), centred.predict(x[:3]) + 1e30,
                               rtol=1e-12, atol=0)


def test_a_mean_of_the_wrong_length_is_refused_at_the_fit():
    x, y = _data(columns=2)
    with pytest.raises(ValueError, match="one value per target column \\(2\\), got 3"):
        _gp(torch.zeros(3, dtype=DT)).fit(x, y)
    field = _data(columns=2)[1]
    gp = RandomFeatureGP(CurlFreeFeatureKernel(16, seed=0).double(), noise=0.1,
                         prior_mean=torch.zeros(3, dtype=DT))
    with pytest.raises(ValueError, match="one value per output \\(2\\), got 3"):
        gp.fit(x, field)


@pytest.mark.parametrize("exact", [True, False])
def test_the_searched_mean_is_its_posterior_mean_given_the_hyperparameters(exact):
    # With N(0, v) on m, the objective's minimiser in m at fixed hyperparameters is the
    # posterior mean 1' C^-1 y / (1' C^-1 1 + 1 / v): the objective's gradient in m vanishes
    # there (to rounding) and not elsewhere.
    x, y = _data(200)
    kernel = ScaleKernel(FourierFeatureKernel(64, ard_num_dims=2, seed=0)).double()
    kernel.base_kernel.lengthscale = torch.tensor([[0.3, 0.6]], dtype=DT)
    kernel.outputscale = 0.7
    gp = RandomFeatureGP(kernel, noise=0.05)
    if exact:
        from rfgp.kernels._fourier import stationary_kernel

        k = stationary_kernel(x, x, kernel.base_kernel.lengthscale, None) * 0.7
    else:
        z = kernel.base_kernel.features(x) * 0.7**0.5
        k = z @ z.T
    objective = regression_objective(gp, x, y, exact=exact, mean=True)
    cov = k + 0.05 * torch.eye(200, dtype=DT)  # the objective starts at the model's noise
    ones = torch.ones(200, dtype=DT)
    solve = torch.linalg.solve(cov, torch.stack([y, ones], -1))
    v = float(y.square().mean())
    posterior_mean = float(ones @ solve[:, 0]) / (float(ones @ solve[:, 1]) + 1 / v)
    offset = objective.params[-1]
    for value, vanishes in ((posterior_mean, True), (posterior_mean + 0.1, False)):
        with torch.no_grad():
            offset.fill_(value)
        (grad,) = torch.autograd.grad(objective.loss(), offset)
        assert (abs(float(grad)) < 1e-8) == vanishes
    objective.finish()
    assert float(gp.prior_mean) == pytest.approx(posterior_mean + 0.1, rel=1e-12)


def test_calibrated_fit_with_a_prior_mean_is_that_of_the_centred_targets():
    from rfgp.inference import calibrated_fit

    x, y = _data()
    kernel = ScaleKernel(FourierFeatureKernel(64, ard_num_dims=2, seed=0)).double()
    kernel.base_kernel.lengthscale = torch.tensor([[0.3, 0.6]], dtype=DT)
    with_mean = calibrated_fit(kernel, x, y, 0.1, prior_mean=3.0)
    centred = calibrated_fit(kernel, x, y - 3.0, 0.1)
    assert float(with_mean.prior_mean) == 3.0
    _close(with_mean.noise, centred.noise, 0.0)
    _close(with_mean.predict(x[:5]), centred.predict(x[:5]) + 3.0)
    with pytest.raises(ValueError, match="one value per target column \\(1\\), got 2"):
        calibrated_fit(kernel, x, y, 0.1, prior_mean=torch.zeros(2, dtype=DT))
    with pytest.raises(ValueError, match="prior_mean must be finite"):
        calibrated_fit(kernel, x, y, 0.1, prior_mean=float("nan"))
