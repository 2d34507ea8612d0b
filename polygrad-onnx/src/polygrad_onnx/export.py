"""export: a polygrad Model -> an ONNX graph of its forward entrypoint.

Stage: user API (the inverse of loader.py). Input: a Model built by polygrad.models.Sequential / Graph (its
layer structure, kept as `model.models_config`, and its current parameter values), or one loaded by
polygrad.onnx.load (its graph, with the current parameter values). Output: ONNX bytes (or a file) that
onnxruntime runs with the Model's outputs. A Model captured from an arbitrary callable holds compiled
kernels, not layers, and is refused with an OnnxError: build it with polygrad.models to export it.
"""
from __future__ import annotations

import math
import os
from typing import Any

import numpy as np

from polygrad_onnx.errors import OnnxError
from polygrad_onnx.reader import MIN_OPSET, onnx_module

EXPORT_OPSETS = range(MIN_OPSET, 22)


class GraphBuilder:
    """Collects nodes and initializers; each add() returns the name of the node's (first) output."""

    def __init__(self, onnx: Any, opset: int):
        self.onnx, self.opset = onnx, opset
        self.nodes: list[Any] = []
        self.initializers: list[Any] = []
        self.count = 0

    def name(self, hint: str) -> str:
        self.count += 1
        return f"{hint}_{self.count}"

    def const(self, value: np.ndarray, hint: str = "const") -> str:
        name = self.name(hint)
        self.initializers.append(self.onnx.numpy_helper.from_array(np.asarray(value), name))
        return name

    def add(self, op_type: str, inputs: list[str], **attrs: Any) -> str:
        out = self.name(op_type.lower())
        self.nodes.append(self.onnx.helper.make_node(op_type, inputs, [out], **attrs))
        return out

    def mean_last(self, x: str) -> str:
        """ReduceMean over the last axis, keeping it (axes became an input in opset 18)."""
        if self.opset >= 18:
            return self.add("ReduceMean", [x, self.const(np.array([-1], np.int64))])
        return self.add("ReduceMean", [x], axes=[-1])


def _pair(v: Any, n: int) -> list[int]:
    return list(v) if isinstance(v, (list, tuple)) else [int(v)] * n


def _activation(b: GraphBuilder, x: str, act: str | None) -> str:
    if act is None or act == "linear":
        return x
    simple = {"relu": "Relu", "tanh": "Tanh", "sigmoid": "Sigmoid", "elu": "Elu", "softplus": "Softplus"}
    if act in simple:
        return b.add(simple[act], [x])
    if act == "leaky_relu":
        return b.add("LeakyRelu", [x], alpha=0.01)
    if act == "gelu":  # exact (erf) GELU, as polygrad's default; the Gelu operator needs opset 20
        half = b.add("Mul", [x, b.const(np.array(0.5, np.float32))])
        erf = b.add("Erf", [b.add("Mul", [x, b.const(np.array(1 / math.sqrt(2), np.float32))])])
        return b.add("Mul", [half, b.add("Add", [erf, b.const(np.array(1.0, np.float32))])])
    if act == "silu":
        return b.add("Mul", [x, b.add("Sigmoid", [x])])
    if act == "mish":
        return b.add("Mul", [x, b.add("Tanh", [b.add("Softplus", [x])])])
    if act == "softmax":
        return b.add("Softmax", [x], axis=-1)
    if act == "log_softmax":
        return b.add("LogSoftmax", [x], axis=-1)
    raise OnnxError(f"activation {act!r} has no ONNX export")


def _norm_affine(b: GraphBuilder, y: str, params: dict, prefix: str, channel_shape: list[int] | None) -> str:
    w, bias = params.get(f"{prefix}.weight"), params.get(f"{prefix}.bias")
    if w is not None:
        y = b.add("Mul", [y, b.const(w.reshape(channel_shape) if channel_shape else w, "weight")])
    if bias is not None:
        y = b.add("Add", [y, b.const(bias.reshape(channel_shape) if channel_shape else bias, "bias")])
    return y


def _layer(b: GraphBuilder, spec: dict, x: str, rank: int, params: dict, prefix: str) -> str:
    """One layer of a models config applied to `x` (of `rank` dims, batch included)."""
    t = spec["type"]
    p = {k[len(prefix) + 1:]: v for k, v in params.items() if k.startswith(prefix + ".")}
    if t == "linear":
        y = b.add("MatMul", [x, b.const(p["weight"].T.copy(), "weight")])
        return b.add("Add", [y, b.const(p["bias"], "bias")]) if "bias" in p else y
    if t in ("conv1d", "conv2d"):
        w = p["weight"]
        nd = w.ndim - 2
        kernel = list(w.shape[2:])
        stride, dil = _pair(spec.get("stride", 1), nd), _pair(spec.get("dilation", 1), nd)
        padding = spec.get("padding", 0)
        if padding == "valid":
            pads = [0] * (2 * nd)
        elif padding == "same":  # stride 1: the extra pad at the end, as torch and polygrad
            total = [d * (k - 1) for d, k in zip(dil, kernel)]
            pads = [tp // 2 for tp in total] + [tp - tp // 2 for tp in total]
        else:
            pads = _pair(padding, nd) * 2
        inputs = [x, b.const(w, "weight")] + ([b.const(p["bias"], "bias")] if "bias" in p else [])
        return b.add("Conv", inputs, kernel_shape=kernel, strides=stride, dilations=dil, pads=pads,
                     group=int(spec.get("groups", 1)))
    if t in ("max_pool2d", "avg_pool2d"):
        k = _pair(spec.get("kernel_size", 2), 2)
        stride = _pair(spec["stride"], 2) if spec.get("stride") is not None else k
        pads = _pair(spec.get("padding", 0), 2) * 2
        if t == "max_pool2d":
            return b.add("MaxPool", [x], kernel_shape=k, strides=stride, pads=pads)
        return b.add("AveragePool", [x], kernel_shape=k, strides=stride, pads=pads, count_include_pad=1)
    if t == "batchnorm":
        c = p["running_mean"].shape[0]
        w = p.get("weight", np.ones(c, np.float32))
        bias = p.get("bias", np.zeros(c, np.float32))
        return b.add("BatchNormalization", [x, b.const(w, "weight"), b.const(bias, "bias"),
                                            b.const(p["running_mean"], "mean"), b.const(p["running_var"], "var")],
                     epsilon=float(spec.get("eps", 1e-5)))
    if t == "layernorm":
        mean = b.mean_last(x)
        centered = b.add("Sub", [x, mean])
        var = b.mean_last(b.add("Mul", [centered, centered]))
        eps = b.const(np.array(float(spec.get("eps", 1e-5)), np.float32))
        y = b.add("Div", [centered, b.add("Sqrt", [b.add("Add", [var, eps])])])
        return _norm_affine(b, y, params, prefix, None)
    if t == "rmsnorm":
        eps = spec.get("eps")
        eps = float(np.finfo(np.float32).eps) if eps is None else float(eps)
        ms = b.mean_last(b.add("Mul", [x, x]))
        y = b.add("Div", [x, b.add("Sqrt", [b.add("Add", [ms, b.const(np.array(eps, np.float32))])])])
        return _norm_affine(b, y, params, prefix, None)
    if t == "groupnorm":
        groups = int(spec["num_groups"])
        grouped = b.add("Reshape", [x, b.const(np.array([0, groups, -1], np.int64))])
        mean = b.mean_last(grouped)
        centered = b.add("Sub", [grouped, mean])
        var = b.mean_last(b.add("Mul", [centered, centered]))
        eps = b.const(np.array(float(spec.get("eps", 1e-5)), np.float32))
        y = b.add("Div", [centered, b.add("Sqrt", [b.add("Add", [var, eps])])])
        y = b.add("Reshape", [y, b.add("Shape", [x])])
        return _norm_affine(b, y, params, prefix, [-1] + [1] * (rank - 2))
    if t == "embedding":
        return b.add("Gather", [b.const(p["weight"], "weight"), b.add("Cast", [x], to=7)])
    if t == "dropout":
        return b.add("Identity", [x])
    if t == "flatten":
        return b.add("Flatten", [x], axis=1)
    if t == "reshape":
        return b.add("Reshape", [x, b.const(np.array([0, *spec["shape"]], np.int64))])
    return _activation(b, x, t)  # an activation used as a layer


def _value_info(onnx: Any, name: str, dtype: str, shape: list) -> Any:
    elem = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    return onnx.helper.make_tensor_value_info(name, elem, shape)


def _rank_after(spec: dict, rank: int) -> int:
    t = spec["type"]
    if t == "flatten":
        return 2
    if t == "reshape":
        return 1 + len(spec["shape"])
    if t == "embedding":
        return rank + 1
    return rank


def _from_config(model: Any, opset: int) -> Any:
    onnx = onnx_module()
    kind, cfg = model.models_config
    params = {k: v.numpy() for k, v in model.parameters().items()}
    b = GraphBuilder(onnx, opset)
    summary = model.summary()
    in_specs = {r["name"]: r for r in summary.inputs}
    if kind == "Sequential":
        name = cfg["input"]["name"]
        x, rank = name, len(in_specs[name]["shape"])
        for i, spec in enumerate(cfg["layers"]):
            x = _layer(b, spec, x, rank, params, f"layers.{i}")
            rank = _rank_after(spec, rank)
            x = _activation(b, x, spec.get("activation"))
        produced = {cfg.get("output", "output"): x}
    else:
        values = {s["name"]: (s["name"], len(in_specs[s["name"]]["shape"])) for s in cfg["inputs"]}
        specs = {s["name"]: s for s in cfg["nodes"]}
        srcs = {s["name"]: list(s.get("inputs", [])) for s in cfg["nodes"]}
        for src, dst in cfg.get("edges", []):
            srcs[dst].append(src)
        pending = list(specs)
        while pending:  # the config's topological order, recomputed
            ready = [n for n in pending if all(s in values for s in srcs[n])]
            for n in ready:
                spec, xs = specs[n], [values[s] for s in srcs[n]]
                t = spec["type"]
                if t in ("add", "mul", "sub"):
                    out = xs[0][0]
                    for other in xs[1:]:
                        out = b.add(t.capitalize(), [out, other[0]])
                    rank = xs[0][1]
                elif t == "concat":
                    out, rank = b.add("Concat", [v for v, _ in xs], axis=int(spec.get("axis", -1))), xs[0][1]
                else:
                    out = _layer(b, spec, xs[0][0], xs[0][1], params, f"nodes.{n}")
                    rank = _rank_after(spec, xs[0][1])
                values[n] = (_activation(b, out, spec.get("activation")), rank)
                pending.remove(n)
        produced = {o: values[o][0] for o in cfg["outputs"]}
    outputs = []
    for row in summary.outputs:
        b.nodes.append(onnx.helper.make_node("Identity", [produced[row["name"]]], [row["name"]]))
        outputs.append(_value_info(onnx, row["name"], row["dtype"], list(row["shape"])))
    inputs = [_value_info(onnx, r["name"], r["dtype"], list(r["shape"])) for r in summary.inputs]
    graph = onnx.helper.make_graph(b.nodes, "polygrad", inputs, outputs, b.initializers)
    return onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)],
                                  producer_name="polygrad", ir_version=8)


def _from_onnx(model: Any) -> Any:
    onnx = onnx_module()
    proto = onnx.ModelProto()
    proto.CopyFrom(model.onnx_model)
    values = {k: v.numpy() for k, v in model.parameters().items()}
    for name, order in getattr(model, "onnx_layouts", {}).items():  # stored as loader.weight_layouts chose
        values[name] = values[name].transpose(np.argsort(order))
    for t in proto.graph.initializer:
        if t.name in values:
            t.CopyFrom(onnx.numpy_helper.from_array(values[t.name].astype(onnx.helper.tensor_dtype_to_np_dtype(
                t.data_type)), t.name))
    return proto


def export(model: Any, path: str | os.PathLike | None = None, opset: int = 17) -> bytes | None:
    """Write the Model's forward entrypoint as an ONNX graph to `path` (or return its bytes).

    >>> m = polygrad.models.Sequential({...})      # doctest: +SKIP
    >>> polygrad.onnx.export(m, "model.onnx")      # doctest: +SKIP
    """
    onnx = onnx_module()
    if opset not in EXPORT_OPSETS:
        raise OnnxError(f"export writes ai.onnx opsets {EXPORT_OPSETS.start}..{EXPORT_OPSETS.stop - 1}, "
                        f"got opset={opset!r}")
    if getattr(model, "models_config", None) is not None:
        proto = _from_config(model, opset)
    elif getattr(model, "onnx_model", None) is not None:
        proto = _from_onnx(model)
    else:
        raise OnnxError("export needs a Model built by polygrad.models.Sequential / Graph or loaded by "
                        "polygrad.onnx.load: a Model captured from a Python callable holds compiled kernels, not "
                        "layers; describe it with polygrad.models to export it")
    onnx.checker.check_model(proto)
    data = proto.SerializeToString()
    if path is None:
        return data
    with open(path, "wb") as f:
        f.write(data)
    return None
