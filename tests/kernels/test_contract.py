"""The contract every kernel of rfgp keeps, checked on every kernel and mode.

State (``state_dict`` into a fresh kernel, pickle, ``deepcopy``, dtype casts, ``resample``),
batch shapes, edge-case inputs (no rows, 0-d, no columns, half precision) and strict loading of
the random weights. The finite-feature checks live in ``test_finite_features.py``.
"""

from __future__ import annotations

import copy
import io
import pickle
from typing import Any

import pytest
import torch

from rfgp.kernels import (
    FourierFeatureKernel,
    MaclaurinKernel,
    PolynomialSketchKernel,
    RandomFeatureKernel,
)
from tests.kernels.kernel_registry import (
    ALL_KERNELS,
    FEATURE_KERNELS,
    D,
    build,
    construct,
    data,
    evaluate,
    outputs,
)

feature_names = pytest.mark.parametrize("name", list(FEATURE_KERNELS))
all_names = pytest.mark.parametrize("name", list(ALL_KERNELS))


# ------------------------------------------------------------------------------ state
@all_names
def test_state_dict_into_a_fresh_kernel_gives_identical_values(name):
    kernel = build(name)
    x = data()
    expected = evaluate(kernel, x)
    fresh = construct(name, seed=1)
    fresh.load_state_dict(kernel.state_dict())  # strict: every key matches
    assert torch.equal(evaluate(fresh, x), expected)


@all_names
def test_state_dict_through_torch_save(name):
    kernel = build(name)
    x = data()
    expected = evaluate(kernel, x)
    buffer = io.BytesIO()
    torch.save(kernel.state_dict(), buffer)
    buffer.seek(0)
    fresh = construct(name, seed=1)
    fresh.load_state_dict(torch.load(buffer))
    assert torch.equal(evaluate(fresh, x), expected)


@all_names
def test_pickle_and_deepcopy_give_identical_values(name):
    kernel = build(name)
    x = data()
    expected = evaluate(kernel, x)
    assert torch.equal(evaluate(pickle.loads(pickle.dumps(kernel)), x), expected)
    assert torch.equal(evaluate(copy.deepcopy(kernel), x), expected)


@all_names
def test_pickle_before_first_use_draws_the_same_weights(name):
    # Lazily drawn weights come from the seed: a copy made before the first call must draw
    # exactly the weights the original draws.
    kernel = build(name)
    clone = pickle.loads(pickle.dumps(kernel))
    x = data()
    assert torch.equal(evaluate(clone, x), evaluate(kernel, x))


@all_names
def test_to_dtype_casts_every_tensor_and_round_trips(name):
    kernel = build(name)
    x = data()
    single = evaluate(kernel, x)
    kernel.double()
    double = evaluate(kernel, x.double())
    assert double.dtype in (torch.float64, torch.complex128)
    tensors = [t for t in kernel.state_dict().values() if isinstance(t, torch.Tensor)]
    assert all(t.dtype in (torch.float64, torch.long) for t in tensors)
    scale = single.abs().max().item() + 1.0
    torch.testing.assert_close(double, single.to(double.dtype), atol=1e-4 * scale, rtol=1e-4)
    kernel.float()
    # float32 -> float64 -> float32 is exact: the weights come back bit for bit
    assert torch.equal(evaluate(kernel, x), single)


@feature_names
def test_resample_same_generator_state_same_weights(name):
    kernel = build(name)
    x = data()
    first = kernel.features(x)
    kernel.resample(torch.Generator().manual_seed(5))
    a = kernel.features(x)
    kernel.resample(torch.Generator().manual_seed(5))
    assert torch.equal(kernel.features(x), a)
    kernel.resample(torch.Generator().manual_seed(6))
    assert not torch.equal(kernel.features(x), a)
    assert a.shape == first.shape


@all_names
def test_batch_kernel_shapes_and_independent_members(name):
    kernel = build(name, batch_shape=torch.Size([2]))
    x = data()
    p = outputs(kernel)
    with torch.no_grad():
        covar = kernel(x).to_dense()
        assert covar.shape == (2, 6 * p, 6 * p)
        assert kernel(x, diag=True).shape == (2, 6 * p)
        assert kernel(data(6, torch.float32, 0, 2)).to_dense().shape == (2, 6 * p, 6 * p)
    if isinstance(kernel, RandomFeatureKernel):
        phi = kernel.features(x)
        tail = (p, kernel.num_features) if p > 1 else (kernel.num_features,)
        assert phi.shape == (2, 6, *tail)
        assert not torch.equal(phi[0], phi[1])  # independent draws per batch member
        # kernel[i] is batch member i (batched and unbatched products round differently)
        member = kernel[1].features(x)
        torch.testing.assert_close(member, phi[1], rtol=1e-4,
                                   atol=1e-5 * phi.abs().max().item())


# ------------------------------------------------------------------------------ inputs
@all_names
def test_no_rows_give_an_empty_result_of_the_right_shape(name):
    kernel = build(name)
    x = data()
    evaluate(kernel, x)  # weights drawn
    empty = x[:0]
    p = outputs(kernel)
    with torch.no_grad():
        assert kernel(empty).to_dense().shape == (0, 0)
        assert kernel(empty, x).to_dense().shape == (0, 6 * p)
        assert kernel(empty, diag=True).shape == (0,)
    if isinstance(kernel, RandomFeatureKernel):
        tail = (p, kernel.num_features) if p > 1 else (kernel.num_features,)
        phi = kernel.features(empty)
        assert phi.shape == (0, *tail)
        assert phi.is_complex() == kernel.is_complex
        # and on a fresh kernel (weights not drawn yet: the zero rows still fix d)
        fresh = build(name)
        assert fresh.features(empty).shape == (0, *tail)


@all_names
def test_zero_dimensional_input_is_refused(name):
    kernel = build(name)
    x = torch.tensor(0.5)
    with pytest.raises(ValueError, match="0-d|dimension"):
        evaluate(kernel, x)


@all_names
def test_inputs_without_columns_are_refused(name):
    kernel = build(name)
    with pytest.raises(ValueError, match="d >= 1|at least one"):
        evaluate(kernel, torch.zeros(4, 0))


@all_names
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_is_refused_naming_the_supported_dtypes(name, dtype):
    kernel = build(name)
    with pytest.raises(TypeError, match="float32.*float64"):
        evaluate(kernel, data().to(dtype))


@all_names
def test_integer_inputs_are_refused(name):
    kernel = build(name)
    with pytest.raises(TypeError, match="float"):
        evaluate(kernel, torch.ones(4, D, dtype=torch.long))


# ------------------------------------------------------------------------------ strict state
def _trained(name: str, **kwargs: Any) -> RandomFeatureKernel:
    kernel = build(name, **kwargs)
    kernel.features(data())
    return kernel


def _random_keys(kernel: RandomFeatureKernel):
    return list(kernel.random_weight_names)


@feature_names
def test_strict_load_refuses_a_missing_weight(name):
    state = _trained(name).state_dict()
    victim = _random_keys(_trained(name))[0]
    del state[victim]
    fresh = FEATURE_KERNELS[name](seed=1)
    with pytest.raises(RuntimeError, match="Missing key"):
        fresh.load_state_dict(state)


@feature_names
def test_strict_load_refuses_an_unexpected_key(name):
    state = _trained(name).state_dict()
    state["stray_weights"] = torch.zeros(3)
    fresh = FEATURE_KERNELS[name](seed=1)
    with pytest.raises(RuntimeError, match="Unexpected key"):
        fresh.load_state_dict(state)
    assert "stray_weights" not in dict(fresh.named_buffers())


@feature_names
def test_non_strict_load_keeps_torch_semantics(name):
    kernel = _trained(name)
    state = kernel.state_dict()
    victim = _random_keys(kernel)[0]
    del state[victim]
    state["stray_weights"] = torch.zeros(3)
    fresh = FEATURE_KERNELS[name](seed=1)
    result = fresh.load_state_dict(state, strict=False)
    assert victim in result.missing_keys
    assert "stray_weights" in result.unexpected_keys
    assert "stray_weights" not in dict(fresh.named_buffers())
    if any(name != victim for name in kernel.random_weight_names):
        # the loaded weights alone cannot make features: a clear error, not a missing attribute
        with pytest.raises(RuntimeError, match="strict=False"):
            fresh.features(data())
        fresh.resample(torch.Generator().manual_seed(0))
    assert fresh.features(data()).shape[-1] == kernel.num_features


def test_strict_load_refuses_another_number_of_features():
    state = _trained("fourier-iid-rbf").state_dict()  # D = 32
    with pytest.raises(RuntimeError, match="num_features=32"):
        FourierFeatureKernel(64).load_state_dict(state)
    big = FourierFeatureKernel(64, seed=0)
    big.features(data())
    with pytest.raises(RuntimeError, match="num_features=64"):
        FourierFeatureKernel(32).load_state_dict(big.state_dict())
    # a plain dict of the checkpoint keeps the record of the weights, and its checks
    with pytest.raises(RuntimeError, match="num_features=64"):
        FourierFeatureKernel(32, input_dim=3).load_state_dict(dict(big.state_dict()))


def test_strict_load_refuses_another_input_dimension():
    state = _trained("sketch-rademacher-real").state_dict()  # d = 3
    with pytest.raises(RuntimeError, match="input_dim|input dimension"):
        PolynomialSketchKernel(2, 16, input_dim=5).load_state_dict(state)


@pytest.mark.parametrize("projection", ["gaussian", "tensorsketch", "tensorsrht"])
def test_strict_load_refuses_another_degree(projection):
    kernel = PolynomialSketchKernel(3, 16, projection=projection, seed=0)
    kernel.features(data())
    with pytest.raises(RuntimeError, match="degree"):
        PolynomialSketchKernel(2, 16, projection=projection).load_state_dict(kernel.state_dict())


def test_strict_load_refuses_another_allocation():
    state = _trained("maclaurin-optimized-gaussian").state_dict()
    random_kernel = MaclaurinKernel("gaussian", 16, allocation="random")
    with pytest.raises(RuntimeError, match="allocation"):
        random_kernel.load_state_dict(state)
    with pytest.raises(RuntimeError, match="allocation"):
        random_kernel.load_state_dict(state, strict=False)


def test_load_into_a_kernel_with_weights_replaces_them():
    kernel = _trained("fourier-iid-rbf")
    other = _trained("fourier-iid-rbf", seed=3)
    other.load_state_dict(kernel.state_dict())
    x = data()
    assert torch.equal(other.features(x), kernel.features(x))


def test_state_dict_of_an_unused_kernel_loads_into_a_fresh_one():
    # No weights drawn yet on either side: nothing is missing; both draw from their seeds.
    kernel = FourierFeatureKernel(32, seed=4)
    fresh = FourierFeatureKernel(32, seed=4)
    fresh.load_state_dict(kernel.state_dict())
    x = data()
    assert torch.equal(fresh.features(x), kernel.features(x))


def test_strict_load_of_an_unused_kernel_into_a_used_one_reports_the_weights_missing():
    used = _trained("fourier-iid-rbf")
    with pytest.raises(RuntimeError, match="Missing key"):
        used.load_state_dict(FourierFeatureKernel(32).state_dict())


# ------------------------------------------------------------------------------ batch operations
@feature_names
def test_expand_batch_before_the_first_call_repeats_the_original_draws(name):
    # expand_batch on a kernel whose weights are not drawn yet: member (i, j) of the expanded
    # kernel is member j of the original, whichever of the two draws first.
    original = build(name, batch_shape=torch.Size([2]))
    expanded = original.expand_batch(torch.Size([3, 2]))
    x = data()
    phi = expanded.features(x)
    reference = original.features(x)
    assert phi.shape[:2] == (3, 2)
    for i in range(3):  # equal weights; batched products may round differently
        torch.testing.assert_close(phi[i], reference, rtol=1e-4,
                                   atol=1e-5 * reference.abs().max().item())


@feature_names
def test_indexing_before_the_first_call_selects_the_original_draws(name):
    original = build(name, batch_shape=torch.Size([3]))
    index = torch.tensor([2, 0])
    picked = original[index]
    x = data()
    phi = picked.features(x)
    reference = original.features(x)
    torch.testing.assert_close(phi, reference[index], rtol=1e-4,
                               atol=1e-5 * reference.abs().max().item())


def test_state_dict_of_an_expanded_kernel_before_the_first_call():
    original = build("sketch-tensorsrht-real", batch_shape=torch.Size([2]))
    expanded = original.expand_batch(torch.Size([3, 2]))[torch.tensor([0, 2])]
    fresh = FEATURE_KERNELS["sketch-tensorsrht-real"](seed=0, batch_shape=torch.Size([2, 2]))
    fresh.load_state_dict(expanded.state_dict())
    x = data()
    assert torch.equal(fresh.features(x), expanded.features(x))
    torch.testing.assert_close(fresh.features(x)[1], original.features(x), rtol=1e-4,
                               atol=1e-5 * original.features(x).abs().max().item())


def test_expand_batch_refuses_incompatible_shapes():
    kernel = build("fourier-iid-rbf", batch_shape=torch.Size([2]))
    with pytest.raises(ValueError, match="cannot expand"):
        kernel.expand_batch(torch.Size([3]))
