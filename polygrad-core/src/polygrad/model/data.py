"""Caller data in: the input forms of docs/bundle-format.md section 3, checked against a Program.

Stage: user API, before execution (polygrad-js: data.js and Model._feeds). Input: the values a caller
passes to an entrypoint (Tensors, NumPy arrays, nested lists, flat data read with the signature's
shape, ints for Variable arguments) or to fit() (columns with samples on the leading axis). Output:
{slot: Buffer or flat host array} feeds and {Variable: value} for the executor, or `ModelInputError`
naming the input, what it got and what was expected (class labels included: a label the captured loss
cannot take is refused on host data, where the loss would turn it into a NaN).
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from polygrad.dtype import dtypes
from polygrad.model.errors import ModelInputError
from polygrad.model.program import Program, Spec, dtype_name
from polygrad.tensor import Tensor, _np_cast
from polygrad.tensor_indexing import host_values
from polygrad.tensor_losses import bad_label
from polygrad.uop import sint


def entry_specs(p: Program, entry: str) -> dict[str, Spec]:
    """{input name: Spec} of an entrypoint's tensor inputs (their buffers carry dtype and shape)."""
    return {k: Spec(k, p.slots[s].dtype, p.slots[s].shape) for k, s in p.entries[entry].inputs.items()}


def feeds(p: Program, entry: str, given: Mapping[str, Any], device: str) -> tuple[dict[int, Any], dict[str, int]]:
    """({slot: Buffer or flat host array}, {Variable: value}) of one call of `entry` on `device`."""
    e = p.entries[entry]
    specs = entry_specs(p, entry)
    names = list(specs) + list(e.args)
    unknown = sorted(set(given) - set(names))
    missing = [k for k in names if k not in given]
    if unknown or missing:
        raise ModelInputError(f"entrypoint {entry!r} takes {names}; " +
                              (f"unknown {unknown}" if unknown else "") + ("; " if unknown and missing else "") +
                              (f"missing {missing}" if missing else ""))
    env: dict[str, int] = {}
    for v in e.args:
        env[v] = argument(p, v, given[v])
    out: dict[int, Any] = {}
    for k, spec in specs.items():
        value, found = convert(p, spec, given[k], device)
        for var, n in found.items():
            if env.setdefault(var, n) != n:
                raise ModelInputError(f"input {k!r} gives Variable {var!r} the value {n}, while another input "
                                      f"or argument gives it {env[var]}")
        out[e.inputs[k]] = value
    for v, (lo, hi) in p.variables.items():
        env.setdefault(v, hi)
    return out, env


def argument(p: Program, name: str, value: Any) -> int:
    """The int a Variable argument (`pos` of a decode entrypoint) takes, within its bounds."""
    lo, hi = p.variables[name]
    if not isinstance(value, (int, np.integer)) or isinstance(value, (bool, np.bool_)):
        raise ModelInputError(f"argument {name!r} is a Variable and takes an int in {lo}..{hi}, "
                              f"got {type(value).__name__}")
    if not lo <= int(value) <= hi:
        raise ModelInputError(f"argument {name!r} = {int(value)} is outside Variable {name!r} bounds {lo}..{hi}")
    return int(value)


def convert(p: Program, spec: Spec, value: Any, device: str) -> tuple[Any, dict[str, int]]:
    """(a Buffer or a flat host array, {Variable: value} read off its shape) for one input."""
    sym = [k for k, d in enumerate(spec.shape) if isinstance(d, str)]
    want = "[" + ", ".join(str(d) for d in spec.shape) + "]"
    if isinstance(value, Tensor):
        if value.dtype != spec.dtype:
            raise ModelInputError(f"input {spec.name!r} is a {dtype_name(value.dtype)} Tensor; "
                                  f"expected {dtype_name(spec.dtype)}")
        if value.device != device:
            raise ModelInputError(f"input {spec.name!r} is on {value.device}, the model on {device}; "
                                  "use .to() first")
        found = dims(p, spec, sint.concrete_shape(value.shape), want)
        check_labels(p, spec.name, value, "input")
        # the tensor's own buffer when it is one whole buffer (realized here if it is lazy), bound for the call
        # without a copy; a view (a slice, a transpose) is made contiguous first
        return value._buffer(), found
    if isinstance(value, np.ndarray):
        arr = value
        if arr.dtype != spec.dtype.np and not np.can_cast(arr.dtype, spec.dtype.np, "same_kind") and \
                spec.dtype is not dtypes.bfloat16:
            raise ModelInputError(f"input {spec.name!r} has dtype {arr.dtype}; expected {dtype_name(spec.dtype)} "
                                  "(cast it with .astype)")
    else:
        try:
            arr = np.asarray(value, dtype=np.float32 if spec.dtype is dtypes.bfloat16 else spec.dtype.np)
        except (TypeError, ValueError) as e:
            raise ModelInputError(f"input {spec.name!r}: cannot read {type(value).__name__} as "
                                  f"{dtype_name(spec.dtype)}: {e}") from None
    if arr.ndim <= 1 and len(spec.shape) != 1:  # flat data: the signature gives the shape
        fixed = int(np.prod([d for d in spec.shape if isinstance(d, int)], dtype=np.int64))
        if len(sym) > 1:
            raise ModelInputError(f"input {spec.name!r} has {len(sym)} Variable dimensions {want}; pass an array "
                                  "of that shape, not flat data")
        if sym:
            if fixed == 0 or arr.size % fixed:
                raise ModelInputError(f"input {spec.name!r} has {arr.size} values; expected a multiple of "
                                      f"{fixed} for shape {want}")
            shape = tuple(arr.size // fixed if isinstance(d, str) else d for d in spec.shape)
            found = dims(p, spec, shape, want)
        else:
            found = {}
            if arr.size != fixed:
                raise ModelInputError(f"input {spec.name!r} has {arr.size} values; expected {fixed} for "
                                      f"shape {want}")
    else:
        found = dims(p, spec, arr.shape, want)
    flat = _np_cast(np.ascontiguousarray(arr).reshape(-1), spec.dtype)
    check_labels(p, spec.name, flat, "input")
    return flat, found


def check_labels(p: Program, name: str, values: Any, what: str) -> None:
    """ModelInputError for a class label the loss cannot take (eager cross_entropy's IndexError; the
    captured loss would turn it into a NaN). Checks host data: a Tensor only when its buffer is in host
    memory (no device read), as eager cross_entropy does."""
    rules = p.labels.get(name, [])
    host = host_values(values) if rules and isinstance(values, Tensor) else values
    for n_classes, ignore in rules if host is not None else []:
        label = bad_label(np.asarray(host), n_classes, ignore)
        if label is not None:
            raise ModelInputError(f"{what} {name!r} holds the class label {label}; the loss takes labels in "
                                  f"[0, {n_classes}) (or {ignore}, which skips a sample)")


def dims(p: Program, spec: Spec, shape: tuple[int, ...], want: str) -> dict[str, int]:
    """{Variable: value} of a shape that matches the spec (fixed dims equal, Variables within bounds)."""
    if len(shape) != len(spec.shape) or any(a != b for a, b in zip(shape, spec.shape) if isinstance(b, int)):
        raise ModelInputError(f"input {spec.name!r} has shape {list(shape)}; expected {want}")
    found: dict[str, int] = {}
    for n, d in zip(shape, spec.shape):
        if isinstance(d, str):
            lo, hi = p.variables[d]
            if not lo <= n <= hi:
                raise ModelInputError(f"input {spec.name!r} has shape {list(shape)}; Variable {d!r} allows "
                                      f"{lo}..{hi}")
            if found.setdefault(d, int(n)) != n:
                raise ModelInputError(f"input {spec.name!r} has shape {list(shape)}: the dimensions named "
                                      f"{d!r} differ")
    return found


def host_column(spec: Spec, col: Any) -> np.ndarray:
    """A fit() column given as host data: an array of [samples, *the spec's trailing shape] in its dtype."""
    try:
        arr = np.asarray(col) if isinstance(col, np.ndarray) else \
            np.asarray(col, dtype=np.float32 if spec.dtype is dtypes.bfloat16 else spec.dtype.np)
    except (TypeError, ValueError) as e:
        raise ModelInputError(f"fit data {spec.name!r}: cannot read it as {dtype_name(spec.dtype)}: {e}") from None
    if isinstance(col, np.ndarray) and arr.dtype != spec.dtype.np and \
            not np.can_cast(arr.dtype, spec.dtype.np, "same_kind"):
        raise ModelInputError(f"fit data {spec.name!r} has dtype {arr.dtype}; expected {dtype_name(spec.dtype)}")
    trailing = tuple(spec.shape[1:])
    per = int(np.prod(trailing, dtype=np.int64))
    if arr.ndim == 1 and trailing and per and arr.size % per == 0:
        arr = arr.reshape(-1, *trailing)  # flat samples: the signature gives the trailing shape
    if arr.ndim == 0 or tuple(arr.shape[1:]) != trailing:
        raise ModelInputError(f"fit data {spec.name!r} has shape {list(arr.shape)}; expected [samples"
                              + "".join(f", {d}" for d in trailing) + "]")
    return _np_cast(np.ascontiguousarray(arr), spec.dtype).reshape(arr.shape)
