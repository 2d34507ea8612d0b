"""Running a graph: ONNX nodes in order over polygrad Tensors, with values known at load kept on the host.

Stage: graph evaluation (called by Model capture, and directly by the operator tests). Input: a GraphProto,
the opset, the initializers (as Tensors for data and as NumPy arrays for load-time use), inputs by ONNX
name. Output: the graph outputs by ONNX name.

A value is a Tensor, or a NumPy array when it is known at load: a Constant, an integer initializer, a
Shape (whose entries may be symbolic sizes, held in an object array), and whatever an operator with a
NumPy implementation computes from such values. So a shape subgraph (Shape -> Gather -> Concat ->
Reshape) is folded while the graph is captured and never becomes a kernel; inputs an operator needs at
load (a Reshape's shape, a Slice's starts) must be such values.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from polygrad import Tensor
from polygrad.engine.capture import active as capturing

from polygrad_onnx import ops_extra, ops_math, ops_nn, ops_quant, ops_shape  # noqa: F401  (they fill OPS)
from polygrad_onnx.errors import OnnxError, UnsupportedOpError
from polygrad_onnx.node import OPS, Node, as_tensor

# operators a training graph does not contain: refused by name rather than "not implemented yet"
REFUSED_KINDS = {
    "String": "string", "Regex": "string", "TfIdf": "string", "LabelEncoder": "string",
    "Sequence": "sequence", "SplitToSequence": "sequence", "ConcatFromSequence": "sequence",
    "Optional": "optional", "ImageDecoder": "image decoding",
}


def refused_kind(op_type: str) -> str | None:
    return next((kind for prefix, kind in REFUSED_KINDS.items() if op_type.startswith(prefix)), None)


def check_operators(graph: Any, label: str) -> None:
    """Refuse a graph with an operator polygrad.onnx does not implement, naming the op and the node."""
    for proto in graph.node:
        if proto.op_type in OPS:
            continue
        where = f"node {proto.name!r}" if proto.name else f"the node computing {proto.output[0]!r}"
        kind = refused_kind(proto.op_type)
        if kind is not None:
            raise UnsupportedOpError(f"{label}: {proto.op_type} ({where}) is a {kind} operator; polygrad.onnx "
                                     "imports numeric tensor graphs only: remove it from the exported graph")
        raise UnsupportedOpError(f"{label}: operator {proto.op_type} ({where}) is not implemented by polygrad.onnx; "
                                 "re-export the model without it or open an issue naming the operator")


def run_node(proto: Any, opset: int, env: dict[str, Any], initial: dict[str, np.ndarray]) -> None:
    """Run one node, reading its inputs from `env` and writing its outputs there."""
    node = Node(proto, opset)
    opdef = OPS[proto.op_type]
    values = []
    for name in proto.input:
        if name and name not in env:
            raise node.fail(f"input {name!r} is not computed before this node (the graph is not in order)")
        values.append(env[name] if name else None)
    if opdef.any_input or (opdef.host is not None and all(v is None or isinstance(v, np.ndarray) for v in values)):
        out = (opdef.fn if opdef.any_input else opdef.host)(node, *values)
    else:
        args = []
        for i, (name, v) in enumerate(zip(proto.input, values)):
            if v is None:
                args.append(None)
            elif i in opdef.static:
                args.append(static_value(node, name, v, initial))
            else:
                args.append(as_tensor(v, node))
        out = opdef.fn(node, *args)
    node.check_all_read()
    outs = out if isinstance(out, (tuple, list)) else (out,)
    outs = [o if o is None or isinstance(o, (Tensor, np.ndarray)) else host_array(o) for o in outs]
    for k, name in enumerate(proto.output):
        if not name:
            continue
        if k >= len(outs) or outs[k] is None:
            raise node.fail(f"output {k} ({name!r}) is not produced by polygrad.onnx's implementation")
        env[name] = outs[k]


def host_array(value: Any) -> np.ndarray:
    """A host result as an array: a NumPy scalar as a 0-d array, a symbolic size as a 0-d object array."""
    if isinstance(value, (bool, int, float, np.generic)):
        return np.asarray(value)
    out = np.empty((), dtype=object)
    out[()] = value
    return out


def static_value(node: Node, name: str, v: Any, initial: dict[str, np.ndarray]) -> np.ndarray:
    if isinstance(v, np.ndarray):
        return v
    if name in initial:
        return initial[name]
    if not capturing():  # an eager run reads the value; a captured Model cannot (its shapes are fixed at load)
        return v.numpy()
    raise OnnxError(f"{node.label}: input {name!r} must be known when the model is loaded (a constant, an "
                    "initializer or computed from shapes); polygrad.onnx does not support data-dependent shapes here")


class OnnxGraph:
    """An ONNX graph as a callable over polygrad Tensors: graph(**{python name: Tensor}) -> {python name: Tensor}.

    `params` are the Tensors of the float initializers (the Model's parameters and state); `initial` holds
    every initializer as a NumPy array for load-time use; `inputs`/`outputs` map python names to ONNX names;
    `layouts` names the params stored with their axes in another order (loader.weight_layouts): the graph
    reads them through the inverse permutation.
    """

    def __init__(self, graph: Any, opset: int, params: dict[str, Tensor], initial: dict[str, np.ndarray],
                 inputs: dict[str, str], outputs: dict[str, str], constants: dict[str, np.ndarray] | None = None,
                 layouts: dict[str, tuple[int, ...]] | None = None):
        self.graph, self.opset = graph, opset
        self.params, self.initial = params, initial
        self.inputs, self.outputs = inputs, outputs
        self.constants = dict(constants or {})
        self.layouts = dict(layouts or {})

    def run(self, feeds: dict[str, Any]) -> dict[str, Any]:
        """{ONNX name: value} of the graph outputs for {ONNX name: Tensor or array} inputs."""
        env: dict[str, Any] = {k: v for k, v in self.initial.items() if k not in self.params}
        env.update(self.params)
        for name, order in self.layouts.items():
            env[name] = env[name].permute(*np.argsort(order).tolist())
        env.update(self.constants)
        env.update(feeds)
        for proto in self.graph.node:
            run_node(proto, self.opset, env, self.initial)
        missing = [o for o in self.outputs.values() if o not in env]
        if missing:
            raise OnnxError(f"graph outputs {missing} are not computed by any node")
        return {o: env[o] for o in self.outputs.values()}

    def __call__(self, **inputs: Tensor) -> dict[str, Tensor]:
        result = self.run({self.inputs[k]: v for k, v in inputs.items()})
        return {py: as_tensor(result[name]) for py, name in self.outputs.items()}
