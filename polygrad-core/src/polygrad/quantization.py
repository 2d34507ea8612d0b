"""polygrad.quantize: weight-only quantization of a state dict or a module to llama.cpp's block formats.

Stage: user API (before capture). Input: a state dict ({name: Tensor or float array}) or an object
holding polygrad.nn Linear / Embedding layers, and a format ("q8_0", "q4_0", "q4_k", ...;
definitions/quant_formats.py).
Output: the state dict with its matrices as `QuantWeight`s, or the same object with those layers'
weights replaced in place, so their forward reads uint8 blocks and dequantizes them inside the kernel
(polygrad/nn/quant.py). A captured Model is not rewritten: its kernels already read float buffers.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping

import numpy as np

from polygrad.errors import QuantizationError
from polygrad.model import Model
from polygrad.model.program import dtype_name
from polygrad.nn.layers import Embedding, Linear
from polygrad.nn.quant import QuantWeight, quantizable_format
from polygrad.nn.state import get_layers
from polygrad.tensor import Tensor


def quantize(obj: Any, fmt: str, names: Iterable[str] | None = None) -> Any:
    """Weights of `obj` rounded to nearest per block in `fmt`, one of llama.cpp's layouts: "q8_0", "q4_0",
    "q4_1", "q5_0", "q5_1" (32-value blocks, byte for byte what llama.cpp's and the `gguf` package's
    quantizers write), "q4_k", "q5_k", "q6_k", "q8_k" (256-value super-blocks, llama.cpp's layout rounded
    to nearest rather than llama.cpp's scale search; polygrad/nn/quantizers.py).

    A state dict (a mapping whose values are all Tensors or arrays): returns a new dict in which every 2-d
    float weight whose rows hold whole blocks (columns divisible by 32, or 256) is a `QuantWeight`; every
    other entry (vectors such as biases and norms, integer tensors, matrices of other widths) is the same
    object as before. Any other object: every `polygrad.nn.Linear` (weight (out, in), blocks along `in`)
    and `polygrad.nn.Embedding` (blocks along the embedding) found in it as `polygrad.nn.state` walks it
    gets its weight replaced in place by a `QuantWeight` when it fits those rules; the object is returned.
    Biases, norms, convolutions and tensors outside those layers stay float. A weight shared by several
    layers (tied embeddings) is quantized once and stays shared.

    `names` quantizes only those state-dict entries (or layers' weights, "fc.weight"); then one that does
    not fit is a QuantizationError saying why. Quantize a module before building its `Model`: a captured
    Model is a QuantizationError.

    >>> from polygrad.nn import Linear
    >>> layer = quantize(Linear(64, 8), "q8_0")
    >>> type(layer.weight).__name__, layer.weight.blocks.shape, layer(Tensor.ones(2, 64)).shape
    ('QuantWeight', (8, 2, 34), (2, 8))
    """
    if isinstance(obj, Model):
        raise QuantizationError("a captured Model cannot be quantized: its kernels read float weights. Quantize the "
                                "module first, then build the Model: polygrad.quantize(module, fmt); "
                                "Model(module, inputs=...)")
    f = quantizable_format(fmt)
    wanted = None if names is None else _names(names)
    if isinstance(obj, Mapping) and obj and all(isinstance(v, (Tensor, np.ndarray)) for v in obj.values()):
        return _quantize_state(dict(obj), f.name, wanted)
    return _quantize_layers(obj, f.name, wanted)


def _names(names: Iterable[str]) -> set[str]:
    if isinstance(names, str) or not all(isinstance(n, str) for n in names):
        raise QuantizationError(f"names= takes a list of state-dict names, got {names!r:.80}")
    return set(names)


def _unfit(value: Any, fmt: str) -> str | None:
    """Why `value` cannot be kept in `fmt` (None: it can)."""
    kind = value.dtype.is_float if isinstance(value, Tensor) else np.asarray(value).dtype.kind == "f"
    dtype = dtype_name(value.dtype) if isinstance(value, Tensor) else np.asarray(value).dtype.name
    shape = tuple(value.shape)
    if not kind:
        return f"it holds {dtype} values, not floats (only float weights are quantized)"
    if len(shape) != 2:
        return f"it has shape {list(shape)}; only matrices are quantized, in blocks along their rows"
    block = quantizable_format(fmt).block
    if shape[1] % block:
        return (f"its rows hold {shape[1]} values, not whole {block}-value blocks; pad the layer's input width "
                f"to a multiple of {block} or leave it out of names=")
    return None


def _check_named(wanted: set[str] | None, found: Mapping[str, Any], fmt: str, what: str) -> None:
    """QuantizationError when a name asked for is missing or cannot be kept in `fmt`."""
    if wanted is None:
        return
    missing = sorted(wanted - set(found))
    if missing:
        raise QuantizationError(f"names= asks for {missing}, which are not {what}; the candidates are "
                                f"{sorted(found)[:20]}")
    for name in sorted(wanted):
        reason = _unfit(found[name], fmt)
        if reason is not None:
            raise QuantizationError(f"{name!r} cannot be quantized to {fmt.lower()}: {reason}")


def _quantize_state(state: dict[str, Any], fmt: str, wanted: set[str] | None) -> dict[str, Any]:
    _check_named(wanted, state, fmt, "in the state dict")
    done: dict[int, QuantWeight] = {}  # id(tensor) -> its blocks: a tensor under two names stays one
    for name, value in state.items():
        if (wanted is None or name in wanted) and _unfit(value, fmt) is None:
            if id(value) not in done:
                done[id(value)] = QuantWeight.from_float(value, fmt)
            state[name] = done[id(value)]
    return state


def _quantize_layers(obj: Any, fmt: str, wanted: set[str] | None) -> Any:
    layers = get_layers(obj, (Linear, Embedding))
    weights = {f"{name}.weight" if name else "weight": layer.weight for name, layer in layers.items()
               if isinstance(layer.weight, Tensor)}
    _check_named(wanted, weights, fmt, "weights of Linear or Embedding layers")
    done: dict[int, QuantWeight] = {}
    for name, layer in layers.items():
        key = f"{name}.weight" if name else "weight"
        weight = layer.weight
        if not isinstance(weight, Tensor) or (wanted is not None and key not in wanted):
            continue  # already quantized (a layer held twice), or not asked for
        if _unfit(weight, fmt) is not None:
            continue
        if id(weight) not in done:
            done[id(weight)] = QuantWeight.from_float(weight, fmt)
        layer.weight = done[id(weight)]
    return obj
