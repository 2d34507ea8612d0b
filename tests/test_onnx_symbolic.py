"""Symbolic sizes inside imported graphs: what exported transformers do with their sequence length.

Small graphs, each over x of shape (batch, seq, 4) with both dimensions symbolic, reproduce what
transformers' exports compute from the sequence length: a constant table sliced by it (position ids),
a Range up to it (causal masks), the length used as tensor data, a Gather along a flattened
(batch*seq) axis with negative indices, a Reshape with -1 over both sizes, and size comparisons that
the bounds decide. One loaded Model must match onnxruntime for two sizes; a comparison the bounds do
not decide and a slice bound past its table are refused with OnnxError. Skipped without onnx/onnxruntime.
"""
from __future__ import annotations

import numpy as np
import pytest

import polygrad

onnx = pytest.importorskip("onnx", reason="polygrad.onnx tests need the onnx package")
ort = pytest.importorskip("onnxruntime", reason="the reference outputs come from onnxruntime")

import polygrad.onnx as pgo  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

SIZES = [(2, 5), (3, 8)]
TABLE = 12  # rows of the constant tables the graphs slice by seq (seq <= 8)


def _graph(nodes, out_shape, consts=(), out_type=TensorProto.FLOAT) -> bytes:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 4])
    y = helper.make_tensor_value_info("y", out_type, out_shape)
    consts = [numpy_helper.from_array(np.asarray(v), k) for k, v in dict(consts).items()]
    seq = [helper.make_node("Shape", ["x"], ["shape"]),
           helper.make_node("Gather", ["shape", "one"], ["seq0"]),
           helper.make_node("Unsqueeze", ["seq0", "axis0"], ["seq"])]  # [seq], as transformers' exports get it
    consts += [numpy_helper.from_array(np.array(1, np.int64), "one"),
               numpy_helper.from_array(np.array([0], np.int64), "axis0")]
    graph = helper.make_graph(seq + nodes, "g", [x], [y], consts)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


def _check(data: bytes, device: str) -> None:
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    rt = polygrad.create(device=device)
    try:
        model = pgo.load(data, max_batch=4, seq=8, runtime=rt)
        for k, (b, s) in enumerate(SIZES):
            x = np.random.default_rng(k).standard_normal((b, s, 4)).astype(np.float32)
            ref = session.run(None, {"x": x})[0]
            got = model.forward(x=x)["y"].numpy()
            assert got.shape == ref.shape
            np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-6)
        model.dispose()
    finally:
        rt.dispose()


def test_constant_table_sliced_by_the_sequence_length(device):
    """position_ids[:, :seq] of a constant table, then looked up: a host Slice with a symbolic end."""
    nodes = [helper.make_node("Constant", [], ["table"],
                              value=numpy_helper.from_array(np.arange(TABLE, dtype=np.int64).reshape(1, TABLE))),
             helper.make_node("Slice", ["table", "start", "seq", "axis1"], ["pos"]),
             helper.make_node("Gather", ["emb", "pos"], ["e"]),  # (1, seq, 4)
             helper.make_node("Add", ["x", "e"], ["y"])]
    emb = np.random.default_rng(9).standard_normal((TABLE, 4)).astype(np.float32)
    _check(_graph(nodes, ["batch", "seq", 4], {"start": np.array([0], np.int64), "axis1": np.array([1], np.int64),
                                              "emb": emb}), device)


def test_range_to_the_sequence_length_builds_a_causal_mask(device):
    """Range(0, seq) compared with its transpose (a causal mask) selects between x and 0."""
    nodes = [helper.make_node("Squeeze", ["seq", "axis0"], ["n"]),
             helper.make_node("Range", ["zero", "n", "one"], ["r"]),
             helper.make_node("Unsqueeze", ["r", "axis1"], ["col"]),  # (seq, 1)
             helper.make_node("LessOrEqual", ["r", "col"], ["causal"]),  # (seq, seq): j <= i
             helper.make_node("ReduceSum", ["x", "axis2"], ["xs"], keepdims=1),  # (batch, seq, 1)
             helper.make_node("Where", ["causal", "xs", "zerof"], ["y"])]  # (batch, seq, seq)
    _check(_graph(nodes, ["batch", "seq", "seq"], {"zero": np.array(0, np.int64), "axis1": np.array([1], np.int64),
                                                   "axis2": np.array([2], np.int64),
                                                   "zerof": np.array(0, np.float32)}), device)


def test_sequence_length_used_as_tensor_data(device):
    """x * seq and x / batch*seq: sizes become tensor data without a value read at capture."""
    nodes = [helper.make_node("Cast", ["seq"], ["seqf"], to=TensorProto.FLOAT),
             helper.make_node("Size", ["x"], ["count"]),  # batch*seq*4
             helper.make_node("Cast", ["count"], ["countf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["x", "seqf"], ["xs"]),
             helper.make_node("Div", ["xs", "countf"], ["y"])]
    _check(_graph(nodes, ["batch", "seq", 4]), device)


def test_gather_along_a_flattened_symbolic_axis_with_negative_indices(device):
    """Flatten to (batch*seq, 4) and Gather rows [-1, 0, 2]: negative indices count from the symbolic end."""
    nodes = [helper.make_node("Flatten", ["x"], ["flat"], axis=2),
             helper.make_node("Gather", ["flat", "rows"], ["y"], axis=0)]
    _check(_graph(nodes, [3, 4], {"rows": np.array([-1, 0, 2], np.int64)}), device)


def test_reshape_with_minus_one_over_two_symbolic_sizes_feeds_a_matmul(device):
    """(batch, seq, 4) -> (batch, seq, 2, -1) -> (batch, -1, 2): the inferred sizes are plain 2 and seq*2 (not
    (batch*seq*4)//(batch*seq*2)...), so MatMul with a (2, 3) weight accepts the result; summed over the rows."""
    nodes = [helper.make_node("Reshape", ["x", "heads"], ["h"]),
             helper.make_node("Reshape", ["h", "rows"], ["r"]),
             helper.make_node("MatMul", ["r", "w"], ["m"]),
             helper.make_node("ReduceSum", ["m", "axis1"], ["y"], keepdims=0)]
    w = np.random.default_rng(3).standard_normal((2, 3)).astype(np.float32)
    _check(_graph(nodes, ["batch", 3], {"heads": np.array([0, 0, 2, -1], np.int64),
                                        "rows": np.array([0, -1, 2], np.int64), "w": w,
                                        "axis1": np.array([1], np.int64)}), device)


def test_size_comparisons_decided_by_the_bounds(device):
    """Equal(seq, -1) is false and GreaterOrEqual(seq, 1) true for every seq in [1, 8]: Where picks at load."""
    nodes = [helper.make_node("Equal", ["seq", "minus1"], ["never"]),
             helper.make_node("GreaterOrEqual", ["seq", "one1"], ["always"]),
             helper.make_node("And", ["always", "always"], ["keep"]),
             helper.make_node("Where", ["never", "one1", "seq"], ["n"]),  # seq
             helper.make_node("Max", ["n", "one1"], ["m"]),  # seq
             helper.make_node("Cast", ["m", ], ["mf"], to=TensorProto.FLOAT),
             helper.make_node("Cast", ["keep", ], ["kf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["x", "mf"], ["xm"]),
             helper.make_node("Mul", ["xm", "kf"], ["y"])]
    _check(_graph(nodes, ["batch", "seq", 4], {"minus1": np.array([-1], np.int64), "one1": np.array([1], np.int64)}),
           device)


def test_comparison_the_bounds_do_not_decide_is_refused():
    nodes = [helper.make_node("Equal", ["seq", "five"], ["is5"]),
             helper.make_node("Cast", ["is5"], ["f"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["x", "f"], ["y"])]
    data = _graph(nodes, ["batch", "seq", 4], {"five": np.array([5], np.int64)})
    with pytest.raises(pgo.OnnxError, match="Equal node.*depends on their values"):
        pgo.load(data, max_batch=4, seq=8)


def test_slice_bound_past_its_table_is_refused():
    nodes = [helper.make_node("Slice", ["table", "start", "seq", "axis1"], ["pos"]),
             helper.make_node("Cast", ["pos"], ["posf"], to=TensorProto.FLOAT),
             helper.make_node("Unsqueeze", ["posf", "axis2"], ["p"]),
             helper.make_node("Add", ["x", "p"], ["y"])]
    data = _graph(nodes, ["batch", "seq", 4], {"table": np.arange(TABLE, dtype=np.int64).reshape(1, TABLE),
                                               "start": np.array([0], np.int64), "axis1": np.array([1], np.int64),
                                               "axis2": np.array([2], np.int64)})
    model = pgo.load(data, max_batch=4, seq=TABLE)  # seq <= TABLE: fine
    x = np.ones((1, 3, 4), np.float32)
    np.testing.assert_array_equal(model.forward(x=x)["y"].numpy(), x + np.arange(3, dtype=np.float32)[None, :, None])
    model.dispose()
    with pytest.raises(pgo.OnnxError, match=f"can reach {TABLE + 1}, past this axis's size {TABLE}"):
        pgo.load(data, max_batch=4, seq=TABLE + 1)
