"""Fitted posteriors move with .to() and round-trip through state_dict: a checkpoint loaded into a
freshly built model in another process predicts bit-identically without the training data."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from rfgp import RandomFeatureGP
from rfgp.inference._fit_state import StaleFitError
from rfgp.kernels import FourierFeatureKernel

DT = torch.float64
ROOT = Path(__file__).resolve().parents[2]


def _data(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 3, generator=g, dtype=DT)
    y = torch.stack([torch.sin(4 * x[:, 0]), torch.cos(3 * x[:, 1])], -1)
    return x, y + 0.1 * torch.randn(n, 2, generator=g, dtype=DT), torch.rand(9, 3, generator=g,
                                                                              dtype=DT)


_LOADER = textwrap.dedent(
    """
    import sys, torch
    from rfgp import RandomFeatureGP
    from rfgp.kernels import FourierFeatureKernel
    saved = torch.load(sys.argv[1])
    gp = RandomFeatureGP(FourierFeatureKernel(48, seed=123).double(), solve=sys.argv[3])
    gp.load_state_dict(saved["model"])
    mean, std = gp.predict(saved["xt"], return_std=True)
    torch.save({"mean": mean, "std": std, "lml": gp.log_marginal_likelihood(),
                "held": gp.holds_training_data}, sys.argv[2])
    """
)


@pytest.mark.parametrize("solve", ["weight", "function"])
def test_checkpoint_loads_in_another_process_bit_identically(tmp_path, solve):
    x, y, xt = _data(300 if solve == "weight" else 30)
    noise = torch.tensor([0.05, 0.2], dtype=DT)
    gp = RandomFeatureGP(FourierFeatureKernel(48, seed=0).double(), noise=noise, solve=solve)
    gp.fit(x, y)
    mean, std = gp.predict(xt, return_std=True)
    torch.save({"model": gp.state_dict(), "xt": xt}, tmp_path / "gp.pt")
    script = tmp_path / "load.py"
    script.write_text(_LOADER)
    subprocess.run(
        [sys.executable, str(script), str(tmp_path / "gp.pt"), str(tmp_path / "out.pt"), solve],
        check=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
    )
    out = torch.load(tmp_path / "out.pt")
    assert torch.equal(out["mean"], mean) and torch.equal(out["std"], std)
    assert torch.equal(out["lml"], gp.log_marginal_likelihood())
    assert out["held"] is False


def test_checkpoint_size_does_not_grow_with_n_and_loaded_model_refuses_a_changed_kernel():
    sizes = []
    for n in (200, 2000):
        x, y, _ = _data(n)
        gp = RandomFeatureGP(FourierFeatureKernel(48, seed=0).double(), noise=0.1, solve="weight")
        state = gp.fit(x, y).state_dict()
        tensors = [t for t in _flatten(state) if isinstance(t, torch.Tensor)]
        sizes.append(sum(t.numel() for t in tensors))
    assert sizes[0] == sizes[1]
    kernel = FourierFeatureKernel(48, seed=5).double()
    loaded = RandomFeatureGP(kernel, solve="weight")
    loaded.load_state_dict(state)
    kernel.lengthscale = 0.3
    with pytest.raises(StaleFitError, match="raw_lengthscale"):
        loaded.predict(x[:3])
    with pytest.raises(StaleFitError, match="call fit"):
        loaded.update(x[:3], y[:3])


def _flatten(value):
    if isinstance(value, dict):
        for v in value.values():
            yield from _flatten(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _flatten(v)
    else:
        yield value


def test_to_moves_the_fitted_posterior_and_queries_are_cast():
    x, y, xt = _data(200)
    gp = RandomFeatureGP(FourierFeatureKernel(48, seed=0).double(), noise=0.1).fit(x, y)
    mean64 = gp.predict(xt)
    # a float32 query on a float64 model is cast, not an error
    cast = gp.predict(xt.float())
    assert cast.dtype == DT
    torch.testing.assert_close(cast, gp.predict(xt.float().double()), rtol=0, atol=0)
    gp.float()
    assert gp.dtype == torch.float32 and gp.noise.dtype == torch.float32
    mean32 = gp.predict(xt)
    assert mean32.dtype == torch.float32
    torch.testing.assert_close(mean32.double(), mean64, rtol=0, atol=1e-5)
    gp.double()
    torch.testing.assert_close(gp.predict(xt), mean64, rtol=0, atol=1e-5)
    # held data moved too: a kernel change refits in the model's dtype
    gp.kernel.lengthscale = 0.5
    fresh = RandomFeatureGP(gp.kernel, noise=0.1).fit(x, y)
    torch.testing.assert_close(gp.predict(xt), fresh.predict(xt))


def test_fit_stream_rejects_batches_of_mixed_dtype():
    x, y, _ = _data(40)
    gp = RandomFeatureGP(FourierFeatureKernel(16, seed=0).double(), noise=0.1)
    with pytest.raises(ValueError, match="one dtype"):
        gp.fit_stream([(x[:20], y[:20]), (x[20:].float(), y[20:].float())])


def test_sample_paths_move_and_save(tmp_path):
    x, y, xt = _data(100)
    gp = RandomFeatureGP(FourierFeatureKernel(32, seed=0).double(), noise=0.1).fit(x, y)
    paths = gp.sample_functions(5, generator=torch.Generator().manual_seed(0))
    values = paths(xt)
    assert values.shape == (5, 9, 2)
    torch.save(paths, tmp_path / "paths.pt")
    again = torch.load(tmp_path / "paths.pt", weights_only=False)
    assert torch.equal(again(xt), values)
    state = paths.state_dict()
    fresh = gp.sample_functions(5, generator=torch.Generator().manual_seed(1))
    fresh.load_state_dict(state)
    assert torch.equal(fresh(xt), values)
    paths.float()
    assert paths(xt).dtype == torch.float32
    torch.testing.assert_close(paths(xt).double(), values, rtol=0, atol=1e-4)
