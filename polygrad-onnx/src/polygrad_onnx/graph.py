"""Running a graph: ONNX nodes in order over polygrad Tensors, with values known at load kept on the host.

Stage: graph evaluation (called by Model capture, and directly by the operator tests). Input: a GraphProto,
the opset, the initializers (as Tensors for data and as NumPy arrays for load-time use), inputs by ONNX
name. Output: the graph outputs by ONNX name.

A value is a Tensor, or a NumPy array when it is known at load: a Constant, an integer initializer, a
Shape (whose entries may be symbolic sizes, held in an object array), and whatever an operator with a
NumPy implementation computes from such values. So a shape subgraph (Shape -> Gather -> Concat ->
Reshape) is folded while the graph is captured and never becomes a kernel; inputs an operator needs at
load (a Reshape's shape, a Slice's starts) must be such values.

Control flow (If, Loop, Scan in control.py) is unrolled: such an operator gets a `Scope` (the values in
scope, which its subgraphs read by name) and runs its subgraphs through `Scope.run` as many times as its
trip count says, every node of every copy counted against one `UnrollBudget` per run of the graph.
"""
from __future__ import annotations

from collections import ChainMap
from dataclasses import dataclass, field
from typing import Any, Mapping, MutableMapping, Sequence

import numpy as np

from polygrad import Tensor
from polygrad.engine.capture import active as capturing

from polygrad_onnx import (  # noqa: F401  (they fill OPS)
    control, ops_extra, ops_math, ops_nn, ops_quant, ops_rnn, ops_shape)
from polygrad_onnx.errors import OnnxError, UnsupportedOpError
from polygrad_onnx.node import OPS, Node, as_tensor
from polygrad_onnx.reader import onnx_module, tensor_array

# nodes that unrolled control flow (every iteration of a Loop or Scan body, every If branch) may run in one
# run of a graph: a crafted file with a huge trip count is refused instead of exhausting the machine
MAX_UNROLLED_NODES = 200_000

# operators a training graph does not contain: refused by name rather than "not implemented yet"
REFUSED_KINDS = {
    "String": "string", "Regex": "string", "TfIdf": "string", "LabelEncoder": "string",
    "Sequence": "sequence", "SplitToSequence": "sequence", "ConcatFromSequence": "sequence",
    "Optional": "optional", "ImageDecoder": "image decoding",
}


def refused_kind(op_type: str) -> str | None:
    return next((kind for prefix, kind in REFUSED_KINDS.items() if op_type.startswith(prefix)), None)


def subgraphs(proto: Any) -> list[Any]:
    """The GraphProtos a node holds as attributes (If's branches, a Loop or Scan body)."""
    kinds = onnx_module().AttributeProto
    out = []
    for a in proto.attribute:
        if a.type == kinds.GRAPH:
            out.append(a.g)
        elif a.type == kinds.GRAPHS:
            out.extend(a.graphs)
    return out


def check_operators(graph: Any, label: str) -> None:
    """Refuse a graph (subgraphs included) with an operator polygrad.onnx does not implement, naming the op and
    the node."""
    for proto in graph.node:
        for sub in subgraphs(proto):
            check_operators(sub, label)
        if proto.op_type in OPS:
            continue
        where = f"node {proto.name!r}" if proto.name else f"the node computing {proto.output[0]!r}"
        kind = refused_kind(proto.op_type)
        if kind is not None:
            raise UnsupportedOpError(f"{label}: {proto.op_type} ({where}) is a {kind} operator; polygrad.onnx "
                                     "imports numeric tensor graphs only: remove it from the exported graph")
        raise UnsupportedOpError(f"{label}: operator {proto.op_type} ({where}) is not implemented by polygrad.onnx; "
                                 "re-export the model without it or open an issue naming the operator")


def run_node(proto: Any, opset: int, env: MutableMapping[str, Any], initial: Mapping[str, np.ndarray],
             budget: UnrollBudget | None = None) -> None:
    """Run one node, reading its inputs from `env` and writing its outputs there."""
    node = Node(proto, opset)
    opdef = OPS[proto.op_type]
    values = []
    for name in proto.input:
        if name and name not in env:
            raise node.fail(f"input {name!r} is not computed before this node (the graph is not in order)")
        values.append(env[name] if name else None)
    if opdef.scoped:
        scope = Scope(env, initial, opset, budget if budget is not None else UnrollBudget())
        out = opdef.fn(node, scope, *values)
    elif opdef.any_input or (opdef.host is not None and all(v is None or isinstance(v, np.ndarray) for v in values)):
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


def static_value(node: Node, name: str, v: Any, initial: Mapping[str, np.ndarray],
                 why: str = "polygrad.onnx does not support data-dependent shapes here") -> np.ndarray:
    if isinstance(v, np.ndarray):
        return v
    if name in initial:
        return initial[name]
    if not capturing():  # an eager run reads the value; a captured Model cannot (its shapes are fixed at load)
        return v.numpy()
    raise OnnxError(f"{node.label}: input {name!r} must be known when the model is loaded (a constant, an "
                    f"initializer or computed from shapes); {why}")


@dataclass
class UnrollBudget:
    """The nodes unrolled control flow may still run in one run of a graph, and the subgraphs' initializers
    (read once per run, not once per iteration)."""

    limit: int = MAX_UNROLLED_NODES
    used: int = 0
    initializers: dict[int, dict[str, np.ndarray]] = field(default_factory=dict)

    def spend(self, node: Node, count: int) -> None:
        self.require(node, count)
        self.used += count

    def require(self, node: Node, count: int) -> None:
        """Refuse now, before anything runs, an unrolling that would take more than is left."""
        if self.used + count > self.limit:
            raise OnnxError(f"{node.label}: unrolling control flow would run more than {self.limit} nodes; "
                            "polygrad.onnx unrolls If/Loop/Scan at load, so a trip count must be small: lower it "
                            "in the model, or raise the cap with load(..., max_unrolled_nodes=N)")


@dataclass
class Scope:
    """What a control-flow operator sees: the values in scope by name (its subgraphs read outer values), the
    initializers, the opset and the run's UnrollBudget."""

    env: MutableMapping[str, Any]
    initial: Mapping[str, np.ndarray]
    opset: int
    budget: UnrollBudget

    def known(self, node: Node, index: int, value: Any, why: str) -> np.ndarray:
        """Input `index` of `node` as a NumPy array known at load (read eagerly outside a capture)."""
        return static_value(node, node.proto.input[index], value, self.initial, why)

    def known_value(self, node: Node, name: str, value: Any, why: str) -> np.ndarray:
        """A subgraph's result `name` as a NumPy array known at load (read eagerly outside a capture)."""
        return static_value(node, name, value, self.initial, why)

    def run(self, node: Node, graph: Any, feeds: Sequence[Any]) -> list[Any]:
        """The outputs of subgraph `graph` (an attribute of `node`) with its inputs bound to `feeds`, in order."""
        if len(feeds) != len(graph.input):
            raise node.fail(f"subgraph {graph.name!r} takes {len(graph.input)} inputs, the operator gives "
                            f"{len(feeds)}")
        self.budget.spend(node, max(1, len(graph.node)))  # an empty body still counts: no endless unrolling
        consts = self.budget.initializers.get(id(graph))
        if consts is None:
            consts = self.budget.initializers[id(graph)] = {t.name: tensor_array(t) for t in graph.initializer}
        local: dict[str, Any] = dict(consts)
        local.update((i.name, v) for i, v in zip(graph.input, feeds))
        env = ChainMap(local, self.env)  # writes go to `local`: the outer scope is only read
        initial = ChainMap(consts, self.initial)
        for proto in graph.node:
            run_node(proto, self.opset, env, initial, self.budget)
        missing = [o.name for o in graph.output if o.name not in env]
        if missing:
            raise node.fail(f"subgraph {graph.name!r} outputs {missing} are not computed by any of its nodes")
        return [env[o.name] for o in graph.output]


class OnnxGraph:
    """An ONNX graph as a callable over polygrad Tensors: graph(**{python name: Tensor}) -> {python name: Tensor}.

    `params` are the Tensors of the float initializers (the Model's parameters and state); `initial` holds
    every initializer as a NumPy array for load-time use; `inputs`/`outputs` map python names to ONNX names;
    `layouts` names the params stored with their axes in another order (loader.weight_layouts): the graph
    reads them through the inverse permutation.
    """

    def __init__(self, graph: Any, opset: int, params: dict[str, Tensor], initial: dict[str, np.ndarray],
                 inputs: dict[str, str], outputs: dict[str, str], constants: dict[str, np.ndarray] | None = None,
                 layouts: dict[str, tuple[int, ...]] | None = None, max_unrolled_nodes: int = MAX_UNROLLED_NODES):
        self.graph, self.opset = graph, opset
        self.params, self.initial = params, initial
        self.inputs, self.outputs = inputs, outputs
        self.constants = dict(constants or {})
        self.layouts = dict(layouts or {})
        self.max_unrolled_nodes = max_unrolled_nodes

    def run(self, feeds: dict[str, Any]) -> dict[str, Any]:
        """{ONNX name: value} of the graph outputs for {ONNX name: Tensor or array} inputs."""
        env: dict[str, Any] = {k: v for k, v in self.initial.items() if k not in self.params}
        env.update(self.params)
        for name, order in self.layouts.items():
            env[name] = env[name].permute(*np.argsort(order).tolist())
        env.update(self.constants)
        env.update(feeds)
        budget = UnrollBudget(self.max_unrolled_nodes)
        for proto in self.graph.node:
            run_node(proto, self.opset, env, self.initial, budget)
        missing = [o for o in self.outputs.values() if o not in env]
        if missing:
            raise OnnxError(f"graph outputs {missing} are not computed by any node")
        return {o: env[o] for o in self.outputs.values()}

    def __call__(self, **inputs: Tensor) -> dict[str, Tensor]:
        result = self.run({self.inputs[k]: v for k, v in inputs.items()})
        return {py: as_tensor(result[name]) for py, name in self.outputs.items()}
