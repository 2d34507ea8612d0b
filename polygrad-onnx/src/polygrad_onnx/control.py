"""Control flow: If, Loop and Scan, unrolled while the graph runs.

Stage: operator implementations (graph.py runs them with a graph.Scope). Input: a Node, the Scope (outer
values by name, the unroll budget) and the node's inputs as they are (Tensors or NumPy arrays). Output:
Tensors or arrays. Nothing here stays a loop: an If known at load runs its taken branch; a Loop runs its
body once per iteration, its trip count and condition known at load; a Scan runs its body once per slice
of its scan inputs, whose length is a fixed size. Every copy of a body is counted against the run's
UnrollBudget, so a huge trip count is an OnnxError instead of an exhausted machine.

An If whose condition is computed from the data runs both branches and selects with `where` when they give
the same shapes and dtypes (ONNX branches have no side effects, so this is the same function). Two caveats,
both the usual ones of `where`: both branches are computed, and in training a branch that is not taken
still gets zero gradients through operations whose own gradient is inf or nan there (log(0), 1/0), which can
make the parameters' gradients nan. Branches of different shapes are refused when captured.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from polygrad import Tensor
from polygrad.engine.capture import active as capturing

from polygrad_onnx.node import Node, as_tensor, np_dtype, op

UNROLL_WHY = "polygrad.onnx unrolls {op} at load, so {what} must be a constant or computed from shapes"


def _flag(node: Node, value: np.ndarray, what: str) -> bool:
    if value.size != 1:
        raise node.fail(f"{what} must hold one element, got shape {value.shape}")
    return bool(value.reshape(-1)[0])


def _same_shape(a: tuple, b: tuple) -> bool:
    """Shapes equal entry by entry (a symbolic size equals only itself: Variables do not compare to bool)."""
    return len(a) == len(b) and all(x is y or (isinstance(x, int) and isinstance(y, int) and x == y)
                                    for x, y in zip(a, b))


def _select(node: Node, cond: Tensor, then: list, other: list) -> list | None:
    """where(cond, then, other) per output, or None when a pair differs in shape or dtype."""
    pairs = [(as_tensor(a, node), as_tensor(b, node)) for a, b in zip(then, other)]
    if any(a.dtype != b.dtype or not _same_shape(tuple(a.shape), tuple(b.shape)) for a, b in pairs):
        return None
    flag = cond.reshape(())
    return [flag.where(a, b) for a, b in pairs]


@op("If", static=(0,), scoped=True)
def if_(node: Node, scope: Any, cond: Any) -> list:
    then_graph, else_graph = node.attr("then_branch"), node.attr("else_branch")
    if isinstance(cond, np.ndarray):
        return scope.run(node, then_graph if _flag(node, cond, "the condition") else else_graph, [])
    if not all(isinstance(d, int) for d in cond.shape) or int(np.prod(cond.shape)) != 1:
        raise node.fail(f"the condition must hold one element, got shape {tuple(cond.shape)}")
    then, other = scope.run(node, then_graph, []), scope.run(node, else_graph, [])
    if len(then) != len(other):
        raise node.fail(f"the branches give {len(then)} and {len(other)} outputs")
    selected = _select(node, cond, then, other)
    if selected is not None:
        return selected
    if not capturing():  # an eager run reads the condition, as it reads any load-time input
        return then if _flag(node, cond.numpy(), "the condition") else other
    shapes = [(tuple(a.shape), tuple(b.shape)) for a, b in zip(then, other)]
    raise node.fail("the condition is computed from the data and the branches give different shapes or dtypes "
                    f"({shapes}); polygrad.onnx unrolls If at load, so it can select between branches only when "
                    "they agree: make the condition a constant or the branches' outputs alike")


def _empty_sequence(node: Node, value_info: Any, axis: int) -> np.ndarray:
    """The stacked scan output of zero iterations, from the body output's declared element shape."""
    t = value_info.type.tensor_type
    dims = [int(d.dim_value) if d.HasField("dim_value") else None for d in t.shape.dim]
    if not t.HasField("shape") or None in dims:
        raise node.fail(f"runs zero iterations and the shape of scan output {value_info.name!r} is not declared "
                        "in the body; polygrad.onnx cannot build the empty result")
    return np.zeros(dims[:axis] + [0] + dims[axis:], dtype=np_dtype(t.elem_type, node))


def _stack(node: Node, values: list, axis: int) -> Any:
    if all(isinstance(v, np.ndarray) for v in values):
        return np.stack(values, axis=axis)
    return Tensor.stack([as_tensor(v, node) for v in values], dim=axis)


def _take(value: Any, axis: int, index: int) -> Any:
    """value[..., index, ...] along `axis`, that axis removed."""
    if isinstance(value, np.ndarray):
        return np.take(value, index, axis=axis)
    bounds = tuple((index, index + 1) if k == axis else None for k in range(value.ndim))
    return value.shrink(bounds).squeeze(axis)


@op("Loop", static=(0, 1), scoped=True)
def loop(node: Node, scope: Any, trip: Any = None, cond: Any = None, *carried: Any) -> list:
    body = node.attr("body")
    limit = None
    if trip is not None:
        why = UNROLL_WHY.format(op="Loop", what="its trip count")
        limit = int(np.asarray(scope.known(node, 0, trip, why)).reshape(-1)[0])
    go = True
    if cond is not None:
        go = _flag(node, scope.known(node, 1, cond, UNROLL_WHY.format(op="Loop", what="its condition")),
                   "the condition")
    if limit is None and cond is None:
        raise node.fail("has neither a trip count nor a condition (an endless loop); polygrad.onnx unrolls Loop "
                        "at load and needs one of them")
    n_carried = len(carried)
    n_scan = len(body.output) - 1 - n_carried
    if n_scan < 0 or len(body.input) != 2 + n_carried:
        raise node.fail(f"the body takes {len(body.input)} inputs and gives {len(body.output)} outputs for "
                        f"{n_carried} loop-carried values (expected {2 + n_carried} inputs, at least "
                        f"{1 + n_carried} outputs)")
    if cond is None:  # a fixed trip count: refuse a huge one before running any of it
        scope.budget.require(node, limit * max(1, len(body.node)))
    values, scans, step = list(carried), [[] for _ in range(n_scan)], 0
    while go and (limit is None or step < limit):
        outs = scope.run(node, body, [np.asarray(step, np.int64), np.asarray(go), *values])
        why = UNROLL_WHY.format(op="Loop", what="the condition its body computes")
        go = _flag(node, scope.known_value(node, body.output[0].name, outs[0], why), "the body's condition")
        values = outs[1:1 + n_carried]
        for seq, v in zip(scans, outs[1 + n_carried:]):
            seq.append(v)
        step += 1
    stacked = [_stack(node, seq, 0) if seq else _empty_sequence(node, info, 0)
               for seq, info in zip(scans, body.output[1 + n_carried:])]
    return [*values, *stacked]


def _axes(node: Node, name: str, count: int, ranks: list[int]) -> list[int]:
    """The attribute `name` (one axis per value, default 0) with negative axes counted from each rank."""
    axes = node.ints(name, [0] * count)
    if len(axes) != count:
        raise node.fail(f"{name} has {len(axes)} entries for {count} values")
    for a, r in zip(axes, ranks):
        if not -r <= a < r:
            raise node.fail(f"{name} entry {a} is outside a rank-{r} value")
    return [a % r for a, r in zip(axes, ranks)]


def _directions(node: Node, name: str, count: int) -> list[int]:
    dirs = node.ints(name, [0] * count)
    if len(dirs) != count or any(d not in (0, 1) for d in dirs):
        raise node.fail(f"{name}={dirs} must hold 0 (forward) or 1 (reverse) for each of the {count} values")
    return dirs


@op("Scan", scoped=True)
def scan(node: Node, scope: Any, *inputs: Any) -> list:
    body = node.attr("body")
    n_scan_in = int(node.attr("num_scan_inputs"))
    n_state = len(inputs) - n_scan_in
    if n_state < 0 or len(body.input) != len(inputs) or len(body.output) < n_state:
        raise node.fail(f"num_scan_inputs={n_scan_in} does not fit {len(inputs)} inputs and a body of "
                        f"{len(body.input)} inputs and {len(body.output)} outputs")
    xs = inputs[n_state:]
    if any(x is None for x in inputs):
        raise node.fail("an input is missing (Scan has no optional inputs)")
    n_out = len(body.output) - n_state
    in_axes = _axes(node, "scan_input_axes", n_scan_in, [len(x.shape) for x in xs])
    in_dirs = _directions(node, "scan_input_directions", n_scan_in)
    out_dirs = _directions(node, "scan_output_directions", n_out)
    lengths = {x.shape[a] for x, a in zip(xs, in_axes)}
    if len(lengths) != 1 or not isinstance(next(iter(lengths)), (int, np.integer)):
        raise node.fail(f"the scan inputs' lengths {sorted(map(str, lengths))} must be one fixed size; "
                        "polygrad.onnx unrolls Scan at load, so a symbolic sequence length cannot be scanned")
    length = int(next(iter(lengths)))
    scope.budget.require(node, length * max(1, len(body.node)))
    states, scans = list(inputs[:n_state]), [[] for _ in range(n_out)]
    for t in range(length):
        slices = [_take(x, a, length - 1 - t if d else t) for x, a, d in zip(xs, in_axes, in_dirs)]
        outs = scope.run(node, body, [*states, *slices])
        states = outs[:n_state]
        for seq, v in zip(scans, outs[n_state:]):
            seq.append(v)
    ranks = [len(seq[0].shape) + 1 if seq else len(info.type.tensor_type.shape.dim) + 1
             for seq, info in zip(scans, body.output[n_state:])]
    out_axes = _axes(node, "scan_output_axes", n_out, ranks)
    stacked = [_stack(node, seq[::-1] if d else seq, a) if seq else _empty_sequence(node, info, a)
               for seq, a, d, info in zip(scans, out_axes, out_dirs, body.output[n_state:])]
    return [*states, *stacked]
