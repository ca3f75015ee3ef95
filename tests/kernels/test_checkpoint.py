"""Kernel checkpoints: the record of the random weights travels in the state dict itself, so a
plain dict of it is checked as strictly as the OrderedDict."""

from __future__ import annotations

import io
from collections import OrderedDict

import pytest
import torch

from rfgp import RandomFeatureGP
from rfgp.kernels import FourierFeatureKernel, MaclaurinKernel, PolynomialSketchKernel
from rfgp.kernels._checkpoint import checkpoint_state

DT = torch.float64


def _x():
    return torch.randn(20, 3, generator=torch.Generator().manual_seed(0), dtype=DT)


def _drawn(kernel):
    kernel.double().features(_x())
    return kernel


def test_a_plain_dict_keeps_the_record_and_round_trips():
    kernel = _drawn(FourierFeatureKernel(16, "matern32", input_dim=3, seed=0))
    state = dict(kernel.state_dict())
    assert state["_extra_state"] == {"random_buffers": ["frequencies"], "input_dim": 3,
                                     "weight_settings": kernel.weight_settings()}
    fresh = FourierFeatureKernel(16, "matern32", input_dim=3, seed=1).double()
    fresh.load_state_dict(state)
    assert torch.equal(fresh.features(_x()), kernel.features(_x()))


def test_a_plain_dict_missing_a_weight_is_refused_not_replaced_by_the_kernels_own():
    state = dict(_drawn(FourierFeatureKernel(16, input_dim=3, seed=0)).state_dict())
    del state["frequencies"]
    other = _drawn(FourierFeatureKernel(16, input_dim=3, seed=1))
    with pytest.raises(RuntimeError, match='Missing key\\(s\\) in state_dict: "frequencies"'):
        other.load_state_dict(state)
    # strict=False: torch's semantics, the missing key reported and the kernel's own kept
    result = other.load_state_dict(state, strict=False)
    assert result.missing_keys == ["frequencies"]


@pytest.mark.parametrize("spectral", ["matern12", "matern52"])
def test_a_plain_dict_of_another_spectral_density_is_refused(spectral):
    state = dict(_drawn(FourierFeatureKernel(16, input_dim=3, seed=0)).state_dict())
    with pytest.raises(RuntimeError, match=f"drawn for spectral='rbf', this kernel has "
                                           f"spectral='{spectral}'"):
        FourierFeatureKernel(16, spectral, input_dim=3).load_state_dict(state)


def test_a_stray_key_is_unexpected_and_never_becomes_a_weight():
    state = dict(_drawn(FourierFeatureKernel(16, input_dim=3, seed=0)).state_dict())
    state["bogus"] = torch.zeros(3, dtype=DT)
    for input_dim in (3, None):
        with pytest.raises(RuntimeError, match='Unexpected key\\(s\\) in state_dict: "bogus"'):
            FourierFeatureKernel(16, input_dim=input_dim).load_state_dict(state)
        lenient = FourierFeatureKernel(16, input_dim=input_dim)
        lenient.load_state_dict(state, strict=False)
        assert "bogus" not in lenient.state_dict()
        assert lenient.random_weight_names == ("frequencies",)


@pytest.mark.parametrize("plain", [False, True])
def test_another_kind_of_kernel_is_refused_at_load_naming_both(plain):
    state = _drawn(FourierFeatureKernel(16, input_dim=3, seed=0)).state_dict()
    state = dict(state) if plain else state
    with pytest.raises(RuntimeError, match="the checkpoint holds the random weights of a "
                                           "FourierFeatureKernel, not of a PolynomialSketchKernel"):
        PolynomialSketchKernel(2, 16, input_dim=3).load_state_dict(state)
    with pytest.raises(RuntimeError, match="of a FourierFeatureKernel, not of a MaclaurinKernel"):
        MaclaurinKernel("exponential", 16, input_dim=3).load_state_dict(state)


def test_a_checkpoint_without_the_record_is_refused_under_strict():
    state = dict(_drawn(FourierFeatureKernel(16, input_dim=3, seed=0)).state_dict())
    del state["_extra_state"]
    with pytest.raises(RuntimeError, match='Missing key\\(s\\) in state_dict: "_extra_state"'):
        FourierFeatureKernel(16, input_dim=3).load_state_dict(state)


def test_without_the_record_a_non_strict_load_reports_it_missing_and_loads_the_rest():
    # As torch does for any missing key: strict=False loads what is there and lists the rest.
    kernel = _drawn(FourierFeatureKernel(16, input_dim=3, seed=0))
    held = _drawn(FourierFeatureKernel(16, input_dim=3, seed=1))
    state = dict(kernel.state_dict())
    del state["_extra_state"]
    result = held.load_state_dict(state, strict=False)
    assert result.missing_keys == ["_extra_state"] and result.unexpected_keys == []
    assert torch.equal(held.frequencies, kernel.frequencies)  # held had its own: replaced
    x = _x()
    gp = RandomFeatureGP(FourierFeatureKernel(16, seed=0).double(), noise=0.1).fit(
        x, torch.sin(x).sum(-1))
    before = gp.predict(x)
    result = gp.load_state_dict({"noise": torch.tensor(0.1, dtype=DT)}, strict=False)
    assert "kernel._extra_state" in result.missing_keys and "_extra_state" in result.missing_keys
    assert torch.equal(gp.predict(x), before)  # the fit is kept: nothing of it was loaded
    gp.load_state_dict({"noise": torch.tensor(0.2, dtype=DT)}, strict=False)
    assert float(gp.noise) == 0.2


@pytest.mark.parametrize("record, match", [
    ("x", "'_extra_state' must be the record dict that state_dict\\(\\) saves, got str"),
    (torch.zeros(2), "'_extra_state' must be the record dict .* got Tensor"),
    ({"random_buffers": 5}, "'_extra_state'\\['random_buffers'\\] must be a list of weight"),
    ({"random_buffers": [1]}, "'_extra_state'\\['random_buffers'\\] must be a list"),
    ({"input_dim": "3"}, "'_extra_state'\\['input_dim'\\] must be None or an integer >= 1"),
    ({"input_dim": 0}, "'_extra_state'\\['input_dim'\\] must be None or an integer >= 1"),
    ({"weight_settings": [1]}, "'_extra_state'\\['weight_settings'\\] must be None or a dict"),
    ({"seed": 1.5}, "'_extra_state'\\['seed'\\] must be None or an integer"),
    ({"pending_batch_ops": 3}, "'_extra_state'\\['pending_batch_ops'\\] must be None or a pair"),
])
def test_a_malformed_record_is_refused_naming_the_entry(record, match):
    state = dict(_drawn(FourierFeatureKernel(16, input_dim=3, seed=0)).state_dict())
    state["_extra_state"] = record if not isinstance(record, dict) else {
        **state["_extra_state"], **record}
    for strict in (True, False):
        with pytest.raises(RuntimeError, match=match):
            FourierFeatureKernel(16, input_dim=3).load_state_dict(state, strict=strict)


def test_an_older_checkpoint_with_the_record_in_its_metadata_still_loads():
    kernel = _drawn(FourierFeatureKernel(16, input_dim=3, seed=0))
    state = kernel.state_dict()
    record = state.pop("_extra_state")
    legacy = OrderedDict(state)
    legacy._metadata = OrderedDict({"": {"version": 1, **{
        f"rfgp_{key}": value for key, value in record.items()}}})
    fresh = FourierFeatureKernel(16, input_dim=3, seed=5).double()
    fresh.load_state_dict(legacy)
    assert torch.equal(fresh.features(_x()), kernel.features(_x()))


def test_the_record_is_plain_data_that_torch_load_reads_with_weights_only():
    kernel = MaclaurinKernel("exponential", 32, input_dim=3, seed=0, num_samples=20).double()
    kernel.allocate(_x())
    buffer = io.BytesIO()
    torch.save(dict(kernel.state_dict()), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    assert state["_extra_state"] == checkpoint_state(kernel)
    fresh = MaclaurinKernel("exponential", 32, input_dim=3).double()
    fresh.load_state_dict(state)
    assert torch.equal(fresh.features(_x()), kernel.features(_x()))


def test_a_gp_checkpoint_with_a_stray_kernel_key_fails_at_load():
    x = _x()
    y = torch.sin(x).sum(-1)
    gp = RandomFeatureGP(FourierFeatureKernel(16, seed=0).double(), noise=0.1).fit(x, y)
    state = dict(gp.state_dict())
    state["kernel.bogus"] = torch.zeros(2, dtype=DT)
    fresh = RandomFeatureGP(FourierFeatureKernel(16, seed=3).double(), noise=0.1)
    with pytest.raises(RuntimeError, match='Unexpected key\\(s\\) in state_dict: "kernel.bogus"'):
        fresh.load_state_dict(state)
    fresh = RandomFeatureGP(FourierFeatureKernel(16, seed=3).double(), noise=0.1)
    fresh.load_state_dict(state, strict=False)
    assert torch.equal(fresh.predict(x), gp.predict(x))  # no stale fit: the key was ignored


@pytest.mark.parametrize("index", [(slice(1, None),), (Ellipsis,), (0,), None])
def test_an_undrawn_kernel_round_trips_with_its_seed_and_queued_batch_operations(index):
    # The weights are drawn at first use: the loaded copy must draw those the saved kernel
    # draws (its seed, then its queued index / expand), through weights_only loading too.
    base = FourierFeatureKernel(8, input_dim=2, seed=0, batch_shape=torch.Size([3])).double()
    kernel = base.expand_batch(2, 3) if index is None else base[index]
    buffer = io.BytesIO()
    torch.save(dict(kernel.state_dict()), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    fresh = FourierFeatureKernel(8, input_dim=2, seed=5, batch_shape=kernel.batch_shape).double()
    fresh.load_state_dict(state)
    x = torch.randn(4, 2, dtype=DT)
    assert torch.equal(fresh.features(x), kernel.features(x))
