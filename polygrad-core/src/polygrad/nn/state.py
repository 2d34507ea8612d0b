"""State dicts: find a model's tensors by dotted name, and load tensors back into them.

Stage: model (de)serialisation. Input: any object holding Tensors in attributes, lists, tuples and
dicts (tinygrad style: no Module base class). Output: `{"layers.0.weight": Tensor, ...}` in attribute
order; `load_state_dict` writes into the model's existing buffers, so optimizers that hold the
parameters keep working. safetensors files: `safe_save` / `safe_load` / `safe_load_metadata`.
"""
from __future__ import annotations

import types
from collections import OrderedDict
from typing import Any

import numpy as np

from polygrad.errors import StateDictError
from polygrad.nn.safetensors import safe_load, safe_load_metadata, safe_save
from polygrad.tensor import Tensor

__all__ = ["get_layers", "get_parameters", "get_state_dict", "load_state_dict", "safe_load", "safe_load_metadata",
           "safe_save"]

_SKIPPED_TYPES = (types.ModuleType, types.FunctionType, types.MethodType, types.BuiltinFunctionType, type)


def get_state_dict(obj: Any, prefix: str = "") -> dict[str, Tensor]:
    """Every Tensor reachable from obj through attributes, lists, tuples and dicts, by dotted name.

    >>> from polygrad.nn import Linear
    >>> list(get_state_dict({"fc": Linear(2, 3)}))
    ['fc.weight', 'fc.bias']
    """
    out: dict[str, Tensor] = {}
    _walk(obj, prefix, out, set(), Tensor)
    return out


def get_layers(obj: Any, kinds: type | tuple[type, ...], prefix: str = "") -> dict[str, Any]:
    """Every object of type `kinds` reachable from obj as get_state_dict walks it, by dotted name (the walk
    does not look inside one it found; a layer held twice is listed under both names).

    >>> from polygrad.nn import Linear
    >>> list(get_layers({"fc": [Linear(2, 3), Linear(3, 1)]}, Linear))
    ['fc.0', 'fc.1']
    """
    out: dict[str, Any] = {}
    _walk(obj, prefix, out, set(), kinds)
    return out


def _walk(obj: Any, prefix: str, out: dict[str, Any], active: set[int], kinds: type | tuple[type, ...]) -> None:
    if isinstance(obj, kinds):
        out[prefix.rstrip(".")] = obj
        return
    if obj is None or isinstance(obj, (str, bytes, int, float, bool, np.ndarray, *_SKIPPED_TYPES)):
        return
    if id(obj) in active:  # a reference cycle (e.g. a child pointing at its parent)
        return
    active.add(id(obj))
    try:
        if hasattr(obj, "_asdict"):  # namedtuple
            _walk(obj._asdict(), prefix, out, active, kinds)
        elif isinstance(obj, (dict, OrderedDict)):
            for k, v in obj.items():
                _walk(v, f"{prefix}{k}.", out, active, kinds)
        elif isinstance(obj, (list, tuple)):
            for i, v in enumerate(obj):
                _walk(v, f"{prefix}{i}.", out, active, kinds)
        elif hasattr(obj, "__dict__"):
            _walk(vars(obj), prefix, out, active, kinds)
    finally:
        active.discard(id(obj))


def get_parameters(obj: Any) -> list[Tensor]:
    """The distinct Tensors of get_state_dict(obj), in order (a shared tensor appears once).

    >>> from polygrad.nn import Linear
    >>> [p.shape for p in get_parameters(Linear(2, 3))]
    [(3, 2), (3,)]
    """
    seen: set[int] = set()
    params = []
    for t in get_state_dict(obj).values():
        if id(t) not in seen:
            seen.add(id(t))
            params.append(t)
    return params


def load_state_dict(model: Any, state_dict: dict[str, Any], strict: bool = True, verbose: bool = False) -> dict:
    """Copy `state_dict` (Tensors or NumPy arrays) into the model's tensors, in place.

    strict=True: a missing or unexpected key raises StateDictError naming them all. Wrong shapes
    raise in either mode. Returns {"missing_keys": [...], "unexpected_keys": [...]} like torch.
    """
    model_state = get_state_dict(model)
    missing = [k for k in model_state if k not in state_dict]
    unexpected = [k for k in state_dict if k not in model_state]
    wrong = [f"{k}: model has {model_state[k].shape}, state dict has {tuple(_shape(state_dict[k]))}"
             for k in model_state if k in state_dict and tuple(_shape(state_dict[k])) != model_state[k].shape]
    problems = []
    if wrong:
        problems.append("wrong shape: " + "; ".join(wrong))
    if strict and missing:
        problems.append(f"missing keys: {missing}")
    if strict and unexpected:
        problems.append(f"unexpected keys: {unexpected}")
    if problems:
        hint = "" if not strict or wrong else " (pass strict=False to load the keys that match)"
        raise StateDictError("load_state_dict: " + " | ".join(problems) + hint)
    for k, target in model_state.items():
        if k in state_dict:
            if verbose:
                print(f"load_state_dict: {k} {target.shape}")
            _write(target, state_dict[k])
    return {"missing_keys": missing, "unexpected_keys": unexpected}


def _shape(value: Any) -> tuple[int, ...]:
    return value.shape if isinstance(value, Tensor) else np.shape(value)


def _write(target: Tensor, value: Any) -> None:
    """Write value into target's buffer, keeping the Tensor object (and the buffer when it has one)."""
    if not isinstance(value, Tensor):
        value = Tensor(np.asarray(value), device=target.device, dtype=target.dtype, _runtime=target._runtime)
    value = value.to(target.device).cast(target.dtype)
    if target.numel() == 0:
        return
    target.assign(value.detach()).realize()
