"""Hand-edited checkpoints of a fitted RandomFeatureGP: every missing or malformed entry of the
fit record is refused naming it, never a KeyError or a torch error from deep inside a solver."""

from __future__ import annotations

import copy
import warnings
from typing import Any, Iterator, List, Tuple

import pytest
import torch

from rfgp import RandomFeatureGP, StaleFitError
from rfgp.inference._checkpoint_record import CheckpointRecord
from rfgp.kernels import FourierFeatureKernel

DT = torch.float64
KEY = "_extra_state"


def _fitted(solve: str, fixed: bool = False) -> Tuple[RandomFeatureGP, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.rand(40, 2, generator=g, dtype=DT)
    y = torch.stack([torch.sin(4 * x[:, 0]), x[:, 1]], -1)
    gp = RandomFeatureGP(FourierFeatureKernel(16, seed=0).double(),
                         noise=torch.tensor([0.1, 0.2], dtype=DT), solve=solve)
    # fixed: a noise per row given to fit, folded into the solver's record
    gp.fit(x, y, noise=0.05 + 0.1 * torch.rand(40, 2, generator=g, dtype=DT) if fixed else None)
    return gp, x[:5]


def _paths(value: Any, path: Tuple = ()) -> Iterator[Tuple]:
    """Every entry of a nested record (dict keys and list positions)."""
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, (list, tuple)):
        items = enumerate(value)
    else:
        return
    for key, item in items:
        yield path + (key,)
        yield from _paths(item, path + (key,))


def _edit(record: Any, path: Tuple, replace: Any, delete: bool) -> Any:
    record = copy.deepcopy(record)
    parent = record
    trail: List[Any] = []
    for key in path[:-1]:
        trail.append((parent, key))
        parent = parent[key]
    if isinstance(parent, tuple):  # rebuild the tuple as a list, then put it back
        parent = list(parent)
        owner, key = trail[-1]
        owner[key] = parent
    if delete:
        del parent[path[-1]]
    else:
        parent[path[-1]] = replace
    return record


def _entry(record: Any, path: Tuple) -> Any:
    for key in path:
        record = record[key]
    return record


def _load(gp: RandomFeatureGP, state: dict, query: torch.Tensor):
    fresh = RandomFeatureGP(FourierFeatureKernel(16, seed=0).double(),
                            noise=torch.tensor([0.1, 0.2], dtype=DT), solve=gp.solve)
    fresh.load_state_dict(state)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fresh.predict(query, return_std=True)


@pytest.mark.parametrize("fixed", [False, True])
@pytest.mark.parametrize("solve", ["weight", "function", "cg"])
@pytest.mark.parametrize("edit", ["delete", "string", "none", "truncate"])
def test_every_missing_or_malformed_entry_is_named(solve, edit, fixed):
    gp, query = _fitted(solve, fixed)
    state = dict(gp.state_dict())
    expected = gp.predict(query, return_std=True)
    assert _load(gp, state, query)[0].allclose(expected[0])
    failures = []
    for path in _paths(state[KEY]):
        if path[0] == "fingerprint" and edit == "delete":
            continue  # a fingerprint entry fewer: the fit is stale (below), not malformed
        if edit == "truncate":  # a tensor one row short (or empty where it had one row)
            value = _entry(state[KEY], path)
            if not isinstance(value, torch.Tensor) or value.dim() == 0:
                continue
            edited = _edit(state[KEY], path, value[:-1], False)
        else:
            edited = _edit(state[KEY], path, None if edit == "none" else "x", edit == "delete")
        name = "".join(f"[{key!r}]" for key in path[:1])
        try:
            mean, std = _load(gp, {**state, KEY: edited}, query)
        except (TypeError, ValueError) as err:
            # The message names the entry, from the top of the record.
            message = str(err)
            if not message.startswith("checkpoint entr") or f"'_extra_state'{name}" not in message:
                failures.append((path, repr(err)[:200]))
            continue
        except StaleFitError:
            continue  # a fingerprint value replaced: named as a change of the kernel
        except Exception as err:  # noqa: BLE001 - a raw error is what this test hunts
            failures.append((path, repr(err)[:200]))
            continue
        # Loaded: only where the entry may be absent or None, and then the fit is the same.
        if not (torch.equal(mean, expected[0]) and torch.equal(std, expected[1])):
            failures.append((path, "loaded, different predictions"))
    assert not failures, failures


@pytest.mark.parametrize("solve", ["weight", "function", "cg"])
def test_factors_must_cover_every_output_column(solve):
    gp, query = _fitted(solve)
    state = dict(gp.state_dict())
    key = "groups" if solve == "cg" else "factors"
    solver = state[KEY]["solver"]
    assert len(solver[key]) == 2  # two noise values: two groups
    edited = _edit(state[KEY], ("solver", key, 1), None, delete=True)
    if solve == "cg":
        edited["solver"]["preconditioners"] = edited["solver"]["preconditioners"][:1]
    with pytest.raises(ValueError, match="must cover the 2 output columns once each, got "
                                         "columns \\[0\\]"):
        _load(gp, {**state, KEY: edited}, query)


def test_a_cg_record_without_its_data_is_refused_naming_it():
    gp, query = _fitted("cg")
    state = dict(gp.state_dict())
    edited = _edit(state[KEY], ("solver", "data"), None, delete=True)
    with pytest.raises(ValueError, match="checkpoint entry '_extra_state'\\['solver'\\]"
                                         "\\['data'\\] is missing"):
        _load(gp, {**state, KEY: edited}, query)
    edited = _edit(state[KEY], ("solver", "data"), [], delete=False)
    with pytest.raises(ValueError, match="must hold the training batches"):
        _load(gp, {**state, KEY: edited}, query)


def test_a_record_that_is_not_a_dict_is_refused():
    gp, query = _fitted("weight")
    with pytest.raises(TypeError, match="checkpoint entry '_extra_state' must be a dict, got str"):
        _load(gp, {**dict(gp.state_dict()), KEY: "fitted"}, query)


def test_record_reader_names_types_and_ranges():
    record = CheckpointRecord({"n": -1, "t": torch.zeros(2), "d": "int8", "b": 1}, "'r'")
    with pytest.raises(ValueError, match="'r'\\['n'\\] must be an integer >= 0, got -1"):
        record.integer("n")
    with pytest.raises(ValueError, match="'r'\\['t'\\] must be a floating tensor of 2 dimensions"):
        record.tensor("t", ndim=2)
    with pytest.raises(TypeError, match="'r'\\['d'\\] must be a floating dtype's name"):
        record.dtype("d")
    with pytest.raises(TypeError, match="'r'\\['b'\\] must be a bool, got int 1"):
        record.boolean("b")
    assert record.boolean("absent", False) is False
