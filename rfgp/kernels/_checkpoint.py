r"""Checkpoints of random-feature kernels: what a ``state_dict`` records of the random weights,
and how loading one checks it.

A :class:`~rfgp.kernels.RandomFeatureKernel`'s random weights are buffers drawn lazily, whose
names, shapes and meaning depend on the kernel's kind and settings. Its ``state_dict`` therefore
carries, next to the tensors, a record under the key ``"_extra_state"`` (torch's extra state,
a plain entry of the dictionary, so a plain ``dict(k.state_dict())`` keeps it):

* ``random_buffers``: the names of the random weights the kernel held;
* ``input_dim``: the input dimension they were drawn for;
* ``weight_settings``: :meth:`~rfgp.kernels.RandomFeatureKernel.weight_settings` (the kernel's
  class, ``num_features``, spectral density, degree, sampling, ...);
* ``seed`` and ``pending_batch_ops``: for a kernel that has not drawn its weights yet, the
  seed of its first draw and the batch operations queued before it, if any (a loaded copy
  then draws the same weights).

Loading follows ``torch.nn.Module.load_state_dict``: a recorded weight the dictionary lacks
is a missing key, a key that is neither a recorded weight nor a parameter or buffer of the
kernel is unexpected (never registered as a weight), and a checkpoint without the record is
missing its ``"_extra_state"`` key (an error under ``strict=True``; under ``strict=False``
nothing of the weights is checked, and they load only into weights the kernel already holds).
A malformed record is refused, naming the entry. Weights drawn for another kind of kernel, other
settings, another input dimension or of another shape are refused whatever ``strict`` says, as
torch refuses a size mismatch. Checkpoints from before the record lived in the dictionary kept
it in the ``OrderedDict``'s metadata; they still load.

Example:
    >>> from rfgp.kernels import FourierFeatureKernel
    >>> k = FourierFeatureKernel(8, input_dim=2, seed=0)
    >>> _ = k.features(torch.zeros(1, 2))   # draws the weights
    >>> sd = dict(k.state_dict())
    >>> sd["_extra_state"]["random_buffers"], sd["_extra_state"]["weight_settings"]["spectral"]
    (['frequencies'], 'rbf')
    >>> other = FourierFeatureKernel(8, spectral="matern12", input_dim=2)
    >>> other.load_state_dict(sd)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    RuntimeError: Error(s) in loading state_dict ... drawn for spectral='rbf', this kernel ...

Internal: not part of the public API (see :mod:`rfgp.kernels`).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

__all__ = ["EXTRA_STATE_KEY", "check_loaded_weights", "checkpoint_state", "load_checkpoint"]

#: torch's key suffix of a module's extra state in a ``state_dict``.
EXTRA_STATE_KEY = "_extra_state"

# the record's fields and their keys in the metadata of older checkpoints
_LEGACY_KEYS = {"random_buffers": "rfgp_random_buffers", "input_dim": "rfgp_input_dim",
                "weight_settings": "rfgp_weight_settings",
                "pending_batch_ops": "rfgp_pending_batch_ops"}


def checkpoint_state(kernel: Any) -> Dict[str, Any]:
    """The record of ``kernel``'s random weights saved with its ``state_dict`` (plain values:
    names, integers, strings; see the module docstring)."""
    state: Dict[str, Any] = {"random_buffers": list(kernel._random_buffer_names),
                             "input_dim": kernel.input_dim,
                             "weight_settings": kernel.weight_settings()}
    if not kernel._random_buffer_names and kernel.seed is not None:
        # weights not drawn yet: a loaded copy draws them with this seed, as this kernel would
        state["seed"] = kernel.seed
    if kernel._pending_batch_ops:
        # weights not drawn yet after expand_batch / kernel[index]: the first draw replays
        # these, so a loaded copy draws the same weights
        state["pending_batch_ops"] = (list(kernel._draw_batch_shape),
                                      [_plain_op(op) for op in kernel._pending_batch_ops])
    return state


def _plain_op(op: tuple) -> list:
    """A queued batch operation as lists, numbers and strings (``torch.load(weights_only=True)``
    refuses slices, ``Ellipsis`` and ``torch.Size``)."""
    if op[0] == "expand":
        return ["expand", list(op[1]), op[2]]
    return ["index", [_plain_index(i) for i in op[1]]]


def _plain_index(index: Any) -> Any:
    if isinstance(index, slice):
        return {"slice": [index.start, index.stop, index.step]}
    if index is Ellipsis:
        return {"ellipsis": True}
    return index  # an integer, None or a tensor


def _batch_op(plain: Any) -> tuple:
    """The inverse of :func:`_plain_op` (older checkpoints hold the tuples themselves)."""
    if isinstance(plain, tuple):
        return plain
    if plain[0] == "expand":
        return ("expand", tuple(plain[1]), plain[2])
    return ("index", tuple(_index(i) for i in plain[1]))


def _index(plain: Any) -> Any:
    if isinstance(plain, dict) and "slice" in plain:
        return slice(*plain["slice"])
    if isinstance(plain, dict) and plain.get("ellipsis"):
        return Ellipsis
    return plain


def _saved_record(state_dict: Dict[str, Any], prefix: str,
                  local_metadata: Dict[str, Any]) -> Tuple[Optional[Dict[str, Any]], bool]:
    """``(record or None, whether it came from an older checkpoint's metadata)``."""
    saved = state_dict.get(prefix + EXTRA_STATE_KEY)
    if isinstance(saved, dict):
        return saved, False
    if any(key in local_metadata for key in _LEGACY_KEYS.values()):
        return {field: local_metadata.get(key) for field, key in _LEGACY_KEYS.items()}, True
    return None, False


def _record_errors(record: Any, key: str) -> List[str]:
    """What is malformed in a checkpoint's record (hand-edited, or not written by
    :func:`checkpoint_state`): each entry named with what it should hold."""
    if not isinstance(record, dict):
        return [f"{key!r} must be the record dict that state_dict() saves, got "
                f"{type(record).__name__}"]
    checks = {
        "random_buffers": (lambda v: isinstance(v, (list, tuple))
                           and all(isinstance(n, str) for n in v), "a list of weight names"),
        "input_dim": (lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool)
                                              and v >= 1), "None or an integer >= 1"),
        "weight_settings": (lambda v: v is None or isinstance(v, dict), "None or a dict"),
        "seed": (lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool)),
                 "None or an integer"),
        "pending_batch_ops": (lambda v: v is None or (isinstance(v, (list, tuple))
                                                      and len(v) == 2), "None or a pair "
                              "(batch shape, operations)"),
    }
    errors = []
    for field, (valid, expected) in checks.items():
        if field in record and not valid(record[field]):
            errors.append(f"{key!r}[{field!r}] must be {expected}, got "
                          f"{type(record[field]).__name__} {record[field]!r:.80}")
    return errors


def _settings_errors(kernel: Any, settings: Optional[Dict[str, Any]]) -> List[str]:
    name = type(kernel).__name__
    if not settings:
        return []
    kind = settings.get("kernel")
    if kind is not None and kind != name:
        return [f"{name}: the checkpoint holds the random weights of a {kind}, not of a {name}; "
                f"load it into a {kind}"]
    mine = kernel.weight_settings()
    return [f"{name}: the checkpoint's random weights were drawn for {key}={value!r}, this "
            f"kernel has {key}={mine[key]!r}"
            for key, value in settings.items() if key in mine and mine[key] != value]


def load_checkpoint(kernel: Any, state_dict: Dict[str, Any], prefix: str,
                    local_metadata: Dict[str, Any], strict: bool, missing_keys: List[str],
                    unexpected_keys: List[str], error_msgs: List[str],
                    load_tensors: Callable[..., None]) -> None:
    """``kernel._load_from_state_dict``: create and check the random weights the record lists,
    then ``load_tensors`` (``torch.nn.Module._load_from_state_dict``) loads every tensor.

    A fresh kernel has no weights yet (they are drawn lazily): they are created from the
    checkpoint, so loading a trained model needs no dummy forward pass.
    """
    name = type(kernel).__name__
    key = prefix + EXTRA_STATE_KEY
    if key in state_dict:
        malformed = _record_errors(state_dict[key], key)
        if malformed:
            error_msgs.extend(f"{name}: {message}" for message in malformed)
            return
    record, legacy = _saved_record(state_dict, prefix, local_metadata)
    if record is None:
        # A missing record is a missing key, which torch reports under strict=True and
        # leaves out under strict=False (nothing of the random weights is then checked, as
        # torch checks nothing of a missing key); torch's own pass below records it.
        names: List[str] = []
    else:
        errors = _settings_errors(kernel, record.get("weight_settings"))
        input_dim = record.get("input_dim")
        if not errors and input_dim is not None and kernel.input_dim is not None \
                and input_dim != kernel.input_dim:
            errors.append(f"{name}: the checkpoint's random weights are for input dimension "
                          f"(input_dim) {input_dim}, this kernel has input_dim={kernel.input_dim}")
        if errors:
            error_msgs.extend(errors)
            return
        names = list(record.get("random_buffers") or [])
        if input_dim is not None:
            kernel.input_dim = input_dim
    if names:
        # The checkpoint's weights replace the current ones, layout included (an optimised
        # Maclaurin allocation may use other degrees).
        for old in list(kernel._random_buffer_names):
            if old not in names:
                del kernel._buffers[old]
                kernel._random_buffer_names.remove(old)
    loaded, absent = [], []
    for weight in names:
        key = prefix + weight
        if key not in state_dict:
            if weight not in kernel._buffers:  # torch reports the buffers it has itself
                missing_keys.append(key)
            absent.append(weight)
            continue
        if weight not in kernel._buffers:
            kernel.register_buffer(weight, torch.empty_like(state_dict[key]))
            kernel._random_buffer_names.append(weight)
        loaded.append(weight)
    if record is not None and not names and not kernel.weights_initialized:
        # a checkpoint of a kernel that had not drawn its weights: draw them as it would
        if record.get("seed") is not None:
            kernel.seed = record["seed"]
        pending = record.get("pending_batch_ops")
        if pending is not None:
            kernel._draw_batch_shape = torch.Size(pending[0])
            kernel._pending_batch_ops = [_batch_op(op) for op in pending[1]]
    load_tensors(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                 error_msgs)
    if legacy and prefix + EXTRA_STATE_KEY in missing_keys:
        missing_keys.remove(prefix + EXTRA_STATE_KEY)  # the metadata held the record
    try:
        kernel.check_hyperparameters()
    except ValueError as err:
        error_msgs.append(f"{name}: {err}")
    # a non-strict load that left the weights incomplete: refused at the next use
    kernel._incomplete_weights = [w for w in absent if w not in kernel._buffers]
    if loaded:
        kernel._draw_batch_shape, kernel._pending_batch_ops = None, []
        if kernel.input_dim is not None:
            check_loaded_weights(kernel, prefix, error_msgs)


def check_loaded_weights(kernel: Any, prefix: str, error_msgs: List[str]) -> None:
    """Append to ``error_msgs`` a message for every loaded random weight that this kernel's
    settings do not draw, or draw with another shape."""
    name = type(kernel).__name__
    try:
        expected = kernel._expected_weight_shapes(kernel.input_dim)
    except (RuntimeError, ValueError) as err:  # e.g. settings that admit no weights
        error_msgs.append(f"{name}: {err}")
        return
    for weight in kernel._random_buffer_names:
        if weight not in expected:
            error_msgs.append(
                f"{name}: unexpected random weight {prefix + weight!r} for this kernel's "
                f"settings (expected {sorted(expected)})"
            )
        elif kernel._buffers[weight].shape != expected[weight]:
            error_msgs.append(
                f"{name}: size mismatch for {prefix + weight}: the checkpoint has shape "
                f"{tuple(kernel._buffers[weight].shape)}, this kernel's settings (num_features, "
                f"degree, input_dim = {kernel.input_dim}, batch_shape) give "
                f"{tuple(expected[weight])}"
            )
