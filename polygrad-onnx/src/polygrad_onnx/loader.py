"""load: an .onnx file -> an ordinary polygrad Model.

Stage: user API. Input: a path or bytes, bounds for the symbolic dimensions, optionally a loss and
targets. Output: a `polygrad.Model` captured from graph.OnnxGraph: `forward(**inputs)` with the graph's
inputs and outputs (names made identifiers: `input.1` -> `input_1`), the float initializers as its
parameters (BatchNormalization statistics as state), and with a loss the training entrypoints, so it
fits in Python and fine-tunes in polygrad-js like any other Model.

A convolution weight is stored in the layout its kernel reads fastest (`weight_layouts`): the parameter
of a group-1 Conv's weight is (*kernel, in, out), output channels contiguous, and the graph reads it
through a permuted view in ONNX's (out, in, *kernel) order; export() writes it back in ONNX's order.
"""
from __future__ import annotations

import keyword
import os
import re
from typing import Any, Callable, Mapping

import numpy as np

from polygrad import Context, Model, Tensor, Variable, models, runtime_context
from polygrad.device import canonicalize

from polygrad_onnx.errors import OnnxError
from polygrad_onnx.graph import MAX_UNROLLED_NODES, OnnxGraph, check_operators
from polygrad_onnx.node import pg_dtype
from polygrad_onnx.reader import read_model, tensor_array

# (op, input index) of initializers that are running statistics, not trained
STATE_INPUTS = {("BatchNormalization", 3), ("BatchNormalization", 4)}


def identifier(name: str, taken: set[str]) -> str:
    """`name` made a Python identifier, distinct from those in `taken` (which it joins)."""
    out = re.sub(r"\W", "_", name) or "x"
    if out[0].isdigit() or keyword.iskeyword(out):
        out = "_" + out
    base, k = out, 1
    while out in taken:
        k += 1
        out = f"{base}_{k}"
    taken.add(out)
    return out


def weight_layouts(graph: Any, initial: Mapping[str, np.ndarray]) -> dict[str, tuple[int, ...]]:
    """{initializer: the axis order it is stored in} for float weights read only as a group-1 Conv's weight.

    They are kept as (*kernel, in, out): the convolution's register tile takes its vector lanes from
    the output channels, and in ONNX's (out, in, *kernel) those are strided by in*kernel, so a layer
    whose image is narrower than a vector (ResNet's 14x14 and 7x7 stages, MobileNet's 1x1 projections)
    had no vector operand at all: 5-25x slower per layer. Depthwise (grouped) weights keep ONNX's order.
    """
    uses: dict[str, list[tuple[Any, int]]] = {}
    for proto in graph.node:
        for k, name in enumerate(proto.input):
            uses.setdefault(name, []).append((proto, k))
    out = {}
    for name, arr in initial.items():
        if arr.dtype.kind != "f" or arr.ndim < 3 or name not in uses:
            continue
        if all(p.op_type == "Conv" and k == 1 and conv_groups(p) == 1 for p, k in uses[name]):
            out[name] = (*range(2, arr.ndim), 1, 0)
    return out


def conv_groups(proto: Any) -> int:
    return next((int(a.i) for a in proto.attribute if a.name == "group"), 1)


def graph_inputs(graph: Any, initial: Mapping[str, Any]) -> list[Any]:
    return [i for i in graph.input if i.name not in initial]


def input_spec(value: Any, max_batch: int | None, bounds: dict[str, int], variables: dict[str, Any],
               label: str, device: str) -> Tensor:
    """Tensor.empty(...) declaring one graph input, its symbolic dimensions as bounded Variables."""
    t = value.type
    if not t.HasField("tensor_type"):
        raise OnnxError(f"{label}: input {value.name!r} is not a tensor (sequences, maps and optionals are not "
                        "supported)")
    dims: list[Any] = []
    for k, d in enumerate(t.tensor_type.shape.dim):
        if d.HasField("dim_value"):
            dims.append(int(d.dim_value))
            continue
        sym = d.dim_param or f"{value.name}_dim{k}"
        hi = bounds.get(sym, max_batch if k == 0 else None)
        if hi is None:
            raise OnnxError(f"{label}: input {value.name!r} dimension {k} is symbolic ({sym!r}) with no bound; pass "
                            f"load(..., {sym}=N)" + (" or max_batch=N" if k == 0 else "") +
                            (" through dim_bounds" if not sym.isidentifier() else ""))
        if sym not in variables:
            variables[sym] = Variable(identifier(sym, set()), 1, int(hi))
        dims.append(variables[sym])
    return Tensor.empty(*dims, dtype=pg_dtype(t.tensor_type.elem_type), device=device)


def load(source: str | os.PathLike | bytes, max_batch: int | None = None, *, loss: str | Callable | None = None,
         targets: Mapping[str, Any] | None = None, device: str | None = None, runtime: Any = None,
         dim_bounds: Mapping[str, int] | None = None, max_unrolled_nodes: int = MAX_UNROLLED_NODES,
         **bounds: int) -> Model:
    """Load an ONNX model as a polygrad Model.

    Symbolic dimensions become Variables: the first dimension of an input is bounded by `max_batch`, any
    named one by `name=N` (or `dim_bounds={"name": N}` for names that are not identifiers). With `loss`
    ("mse", "l1", "cross_entropy", "binary_cross_entropy", or a callable loss(outputs, **targets)) the
    Model also gets the training entrypoints; `targets` declares their tensors (default: one target "y"
    shaped like the single output, class indices for cross_entropy). Control flow (If, Loop, Scan) is
    unrolled at load; `max_unrolled_nodes` caps the nodes its copies may add.

    >>> model = polygrad.onnx.load("mlp.onnx", max_batch=32)          # doctest: +SKIP
    >>> model.forward(input=np.zeros((4, 784), np.float32))["output"]  # doctest: +SKIP
    """
    limits = dict(dim_bounds or {})
    limits.update(bounds)
    for k, v in list(limits.items()) + [("max_batch", max_batch), ("max_unrolled_nodes", max_unrolled_nodes)]:
        if v is not None and (not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1):
            raise OnnxError(f"{k} must be a positive int, got {v!r}")
    f = read_model(source)
    graph = f.model.graph
    check_operators(graph, f.source)
    rt = runtime if runtime is not None else runtime_context.current()
    dev = canonicalize(device if device is not None else (rt.device if rt is not None else None))
    # the operators' own constants (a Clip's bounds, index tables) are made without a device: the model's
    # device is the default while the graph is built and captured (X86 or INTERP beside a default CPU)
    with runtime_context.using(rt), Context(POLY_DEV=dev):
        initial = {t.name: tensor_array(t, f.folder, f.source) for t in graph.initializer}
        stats = {proto.input[i] for proto in graph.node for (opname, i) in STATE_INPUTS
                 if proto.op_type == opname and len(proto.input) > i}
        layouts = weight_layouts(graph, initial)
        params = {}
        for name, arr in initial.items():
            if arr.dtype.kind == "f":
                stored = np.ascontiguousarray(arr.transpose(layouts[name])) if name in layouts else arr
                t = Tensor(stored, device=dev).realize()
                t.requires_grad = False if name in stats else None
                params[name] = t
        taken: set[str] = set()
        variables: dict[str, Any] = {}
        inputs, in_names = {}, {}
        for value in graph_inputs(graph, initial):
            py = identifier(value.name, taken)
            inputs[py] = input_spec(value, max_batch, limits, variables, f.source, dev)
            in_names[py] = value.name
        out_names = {identifier(o.name, taken): o.name for o in graph.output}
        net = OnnxGraph(graph, f.opset, params, initial, in_names, out_names, layouts=layouts,
                        max_unrolled_nodes=int(max_unrolled_nodes))
        loss_fn, target_specs = training_spec(loss, targets, graph, out_names, inputs, max_batch, variables)
        model = Model(net, inputs=inputs, targets=target_specs, loss=loss_fn, params=params, runtime=rt)
    model.onnx_model = f.model  # type: ignore[attr-defined]  (export() writes it back with trained values)
    model.onnx_inputs = in_names  # type: ignore[attr-defined]
    model.onnx_outputs = out_names  # type: ignore[attr-defined]
    model.onnx_layouts = layouts  # type: ignore[attr-defined]  (export() restores ONNX's axis order)
    return model


def training_spec(loss: Any, targets: Mapping[str, Any] | None, graph: Any, outputs: dict[str, str],
                  inputs: dict[str, Tensor], max_batch: int | None,
                  variables: dict[str, Any]) -> tuple[Callable | None, dict | None]:
    """(loss callable, target declarations) for load(..., loss=, targets=)."""
    if loss is None:
        if targets:
            raise OnnxError("targets were given without a loss; pass loss='mse' (or another) too")
        return None, None
    if callable(loss):
        if not targets:
            raise OnnxError("a callable loss needs targets={name: Tensor.empty(...)} declaring its target tensors")
        return loss, dict(targets)
    if not isinstance(loss, str) or loss.lower() not in models.LOSSES:
        raise OnnxError(f"loss {loss!r} is not one of {sorted(models.LOSSES)} or a callable loss(outputs, **targets)")
    name = loss.lower()
    if len(outputs) != 1:
        raise OnnxError(f"loss={name!r} needs a model with one output, this one has {list(outputs)}; pass a "
                        "callable loss(outputs, **targets) instead")
    out = next(iter(outputs))
    if not targets:
        dims = [d for d in next(o for o in graph.output).type.tensor_type.shape.dim]
        batch = next(iter(inputs.values())).shape[0]
        per_sample = [int(d.dim_value) for d in dims[1:]]
        if any(d <= 0 for d in per_sample) or not dims:
            raise OnnxError("the output's shape is not known from the file; declare targets={'y': Tensor.empty(...)}")
        dtype = models.LOSSES[name][0]
        shape = per_sample[:-1] if dtype == "int32" else per_sample
        targets = {"y": Tensor.empty(batch, *shape, dtype=dtype)}
    tname = next(iter(targets))
    fn = models.LOSSES[name][1]
    return (lambda outs, **ys: fn(outs[out], ys[tname])), dict(targets)
