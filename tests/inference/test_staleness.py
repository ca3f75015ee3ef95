"""A fitted RandomFeatureGP never disagrees with its kernel: every parameter and buffer of every
kernel family, the outputscale, the noise, resample() and the dtype are changed after a fit, and
the model either refits (training data held) to exactly a fresh fit, or raises naming the change.
"""

from __future__ import annotations

import gpytorch
import pytest
import torch

from rfgp import DirichletGPClassifier, RandomFeatureGP
from rfgp.inference._fit_state import StaleFitError
from rfgp.kernels import (
    CurlFreeFeatureKernel,
    FourierFeatureKernel,
    GaussianSketchKernel,
    MaclaurinKernel,
    PolynomialSketchKernel,
    SphericalFeatureKernel,
)

DT = torch.float64

FAMILIES = {
    "fourier": lambda: FourierFeatureKernel(16, seed=0),
    "polynomial": lambda: PolynomialSketchKernel(2, 16, bias=0.5, seed=0),
    "tensorsrht": lambda: PolynomialSketchKernel(3, 16, projection="tensorsrht", seed=0),
    "maclaurin": lambda: MaclaurinKernel("exponential", 16, seed=0),
    "gaussian_sketch": lambda: GaussianSketchKernel(16, seed=0),
    "spherical": lambda: SphericalFeatureKernel(16, 3, seed=0),
    "curl_free": lambda: CurlFreeFeatureKernel(16, seed=0),
}


def _data(family):
    g = torch.Generator().manual_seed(1)
    d = 2 if family == "curl_free" else 3
    x = torch.nn.functional.normalize(torch.rand(40, d, generator=g, dtype=DT), dim=-1)
    xt = torch.nn.functional.normalize(torch.rand(7, d, generator=g, dtype=DT), dim=-1)
    y = torch.sin(3 * x.sum(-1, keepdim=True)) + 0.1 * torch.randn(40, 1, generator=g, dtype=DT)
    if family == "curl_free":
        y = torch.cat([y, -y], -1)
    return x, y.squeeze(-1) if family != "curl_free" else y, xt


def _perturb(name: str, tensor: torch.Tensor) -> bool:
    """Change a parameter or buffer in place (through .data, as GPyTorch's setters do) to a
    value the kernel can still evaluate; False for tensors that define shapes (counts)."""
    data = tensor.data
    if data.numel() == 0:
        return False
    if data.is_floating_point():
        if data.numel() == 1:
            if not bool(torch.isfinite(data).all()):
                return False
            data.add_(0.05)
        elif not torch.equal(data, data.flip(-1)):
            data.copy_(data.flip(-1))
        else:
            data.mul_(1.3)
        return True
    # Integer buffers (indices, hashes, counts) define the sketch's structure: kernels may derive
    # cached plans from them, so they change only through resample() (tested below).
    return False


def _named_tensors(module):
    return [name for name, _ in list(module.named_parameters()) + list(module.named_buffers())]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_parameter_and_buffer_change_refits_or_raises(family):
    x, y, xt = _data(family)
    names = None
    for index in range(64):
        kernel = gpytorch.kernels.ScaleKernel(FAMILIES[family]()).double()
        held = RandomFeatureGP(kernel, noise=0.1).fit(x, y)
        streamed = RandomFeatureGP(kernel, noise=0.1).fit_stream([(x, y)])
        names = names or _named_tensors(kernel)
        if index >= len(names):
            break
        name = names[index]
        tensors = dict(kernel.named_parameters())
        tensors.update(kernel.named_buffers())
        if not _perturb(name, tensors[name]):
            continue
        fresh = RandomFeatureGP(kernel, noise=0.1).fit(x, y)
        torch.testing.assert_close(held.predict(xt), fresh.predict(xt), rtol=1e-12, atol=1e-12)
        with pytest.raises(StaleFitError, match=name.replace(".", r"\.")):
            streamed.predict(xt)
    assert "raw_outputscale" in names
    # resample(): every random buffer, integer ones included, drawn afresh
    kernel = gpytorch.kernels.ScaleKernel(FAMILIES[family]()).double()
    held = RandomFeatureGP(kernel, noise=0.1).fit(x, y)
    streamed = RandomFeatureGP(kernel, noise=0.1).fit_stream([(x, y)])
    kernel.base_kernel.resample(torch.Generator().manual_seed(11))
    fresh = RandomFeatureGP(kernel, noise=0.1).fit(x, y)
    torch.testing.assert_close(held.predict(xt), fresh.predict(xt), rtol=1e-12, atol=1e-12)
    with pytest.raises(StaleFitError, match="call fit"):
        streamed.predict(xt)


@pytest.mark.parametrize("solve", ["weight", "function"])
def test_resample_lengthscale_and_outputscale_refit_in_every_use(solve):
    x, y, xt = _data("fourier")
    kernel = gpytorch.kernels.ScaleKernel(FourierFeatureKernel(32, seed=0)).double()
    gp = RandomFeatureGP(kernel, noise=0.1, solve=solve).fit(x, y)
    kernel.base_kernel.resample(torch.Generator().manual_seed(5))
    kernel.outputscale = 2.0
    kernel.base_kernel.lengthscale = 0.4
    fresh = RandomFeatureGP(kernel, noise=0.1, solve=solve).fit(x, y)
    torch.testing.assert_close(gp.posterior(xt).mean, fresh.posterior(xt).mean)
    torch.testing.assert_close(gp.log_marginal_likelihood(), fresh.log_marginal_likelihood())
    # update() after a change conditions the refitted model, not the stale one
    kernel.base_kernel.lengthscale = 0.5
    gp.update(xt, torch.zeros(7, dtype=DT))
    ref = RandomFeatureGP(kernel, noise=0.1, solve=solve).fit(torch.cat([x, xt]),
                                                           torch.cat([y, torch.zeros(7, dtype=DT)]))
    torch.testing.assert_close(gp.predict(xt), ref.predict(xt), rtol=1e-10, atol=1e-12)
    # sample paths drawn after a change come from the refitted posterior
    kernel.base_kernel.lengthscale = 0.6
    draws = gp.sample_functions(2000, generator=torch.Generator().manual_seed(0))(xt)
    post = RandomFeatureGP(kernel, noise=0.1, solve=solve).fit(
        torch.cat([x, xt]), torch.cat([y, torch.zeros(7, dtype=DT)])).posterior(xt)
    assert ((draws.mean(0) - post.mean).abs() / post.stddev).max() < 5 / 2000**0.5


def test_sample_paths_are_a_snapshot_of_their_posterior():
    x, y, xt = _data("fourier")
    kernel = FourierFeatureKernel(32, seed=0).double()
    gp = RandomFeatureGP(kernel, noise=0.1).fit(x, y)
    paths = gp.sample_functions(3, generator=torch.Generator().manual_seed(0))
    before = paths(xt)
    kernel.resample(torch.Generator().manual_seed(9))
    kernel.lengthscale = 3.0
    torch.testing.assert_close(paths(xt), before, rtol=0, atol=0)


def test_kernel_dtype_change_refits_and_stream_raises_naming_the_dtype():
    x, y, xt = _data("fourier")
    kernel = FourierFeatureKernel(32, seed=0).double()
    gp = RandomFeatureGP(kernel, noise=0.1).fit(x, y)
    streamed = RandomFeatureGP(kernel, noise=0.1).fit_stream([(x, y)])
    kernel.float()
    fresh = RandomFeatureGP(kernel, noise=0.1).fit(x, y)
    torch.testing.assert_close(gp.predict(xt), fresh.predict(xt), rtol=0, atol=0)
    with pytest.raises(StaleFitError, match=r"frequencies \(dtype torch.float64 -> torch.float32"):
        streamed.predict(xt)


def test_model_noise_change_refactorises_and_invalid_noise_is_rejected_at_use():
    x, y, xt = _data("fourier")
    kernel = FourierFeatureKernel(32, seed=0).double()
    streamed = RandomFeatureGP(kernel, noise=0.1).fit_stream([(x, y)])
    streamed.noise = 0.4  # unweighted statistics: a new model noise needs no data
    torch.testing.assert_close(streamed.predict(xt),
                               RandomFeatureGP(kernel, noise=0.4).fit(x, y).predict(xt))
    with torch.no_grad():
        streamed.noise.fill_(-1.0)  # in place, past the setter's check
    with pytest.raises(ValueError, match="noise .*must be positive"):
        streamed.predict(xt)
    state = RandomFeatureGP(kernel, noise=0.1).fit(x, y).state_dict()
    state["noise"] = torch.tensor(0.0, dtype=DT)
    loaded = RandomFeatureGP(FourierFeatureKernel(32).double())
    loaded.load_state_dict(state)
    with pytest.raises(ValueError, match="noise .*must be positive"):
        loaded.predict(xt)


def test_classifier_probabilities_never_come_from_a_stale_fit():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(60, 2, generator=g, dtype=DT)
    labels = (x[:, 0] > 0.5).long()
    kernel = FourierFeatureKernel(32, seed=0).double()
    clf = DirichletGPClassifier(kernel, seed=0).fit(x, labels)
    kernel.lengthscale = 0.2
    kernel.resample(torch.Generator().manual_seed(3))
    fresh = DirichletGPClassifier(kernel, seed=0).fit(x, labels)
    expected = fresh.predict_proba(x[:5], method="mean_field")
    try:
        probs = clf.predict_proba(x[:5], method="mean_field")
    except RuntimeError as err:  # refusing is as good as refitting; answering stale is not
        assert "call fit" in str(err)
    else:
        torch.testing.assert_close(probs, expected)


def test_a_reassigned_kernel_is_the_one_used():
    x, y, xt = _data("fourier")
    gp = RandomFeatureGP(FourierFeatureKernel(32, seed=0).double(), noise=0.1).fit(x, y)
    other = FourierFeatureKernel(24, seed=4).double()
    gp.kernel = other
    fresh = RandomFeatureGP(other, noise=0.1).fit(x, y)
    torch.testing.assert_close(gp.predict(xt), fresh.predict(xt))
