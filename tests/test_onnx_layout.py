"""Imported convolution weights are stored output-channels-last (loader.weight_layouts) and read back in
ONNX's order: the Model's parameter has the stored shape, the outputs match onnxruntime, a weight also read
by another node or a grouped Conv keeps ONNX's layout, and export() writes ONNX's layout back (issue 34:
ResNet-18's 7x7 and 14x14 convolutions ran 5-25x slower on strided output-channel vectors).
"""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="the layout tests build ONNX graphs")
ort = pytest.importorskip("onnxruntime", reason="the imported graphs are checked against onnxruntime")

import polygrad.onnx as pgo  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402


def _graph() -> tuple[bytes, dict[str, np.ndarray]]:
    """x -> Conv(w1) -> Conv(w2, depthwise) -> Conv(w3) + Mul(w3 read as data) -> y, w1 (6, 3, 3, 3)."""
    rng = np.random.default_rng(0)
    weights = {"w1": rng.standard_normal((6, 3, 3, 3)), "w2": rng.standard_normal((6, 1, 3, 3)),
               "w3": rng.standard_normal((6, 6, 1, 1))}
    weights = {k: v.astype(np.float32) for k, v in weights.items()}
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["a", "w2"], ["b"], pads=[1, 1, 1, 1], group=6),
             helper.make_node("Conv", ["b", "w3"], ["c"]),
             helper.make_node("ReduceSum", ["w3"], ["s"], keepdims=0),
             helper.make_node("Mul", ["c", "s"], ["y"])]
    graph = helper.make_graph(nodes, "layouts", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 7, 7])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 6, 7, 7])],
                              [numpy_helper.from_array(v, k) for k, v in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return model.SerializeToString(), weights


def test_conv_weights_stored_output_channels_last():
    data, weights = _graph()
    model = pgo.load(data)
    try:
        params = {k: v.numpy() for k, v in model.parameters().items()}
        np.testing.assert_array_equal(params["w1"], weights["w1"].transpose(2, 3, 1, 0))
        np.testing.assert_array_equal(params["w2"], weights["w2"])  # grouped: ONNX's layout
        np.testing.assert_array_equal(params["w3"], weights["w3"])  # also read by ReduceSum
        x = np.random.default_rng(1).standard_normal((2, 3, 7, 7)).astype(np.float32)
        ref = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        np.testing.assert_allclose(model.forward(x=x)["y"].numpy(), ref, rtol=1e-4, atol=1e-4)
        exported = onnx.load_from_string(pgo.export(model))
        for t in exported.graph.initializer:
            np.testing.assert_array_equal(numpy_helper.to_array(t), weights[t.name])
    finally:
        model.dispose()


def test_matmul_result_transposed_off_its_last_axis_is_realized_first():
    """BERT's key: MatMul + Add -> Reshape -> Transpose(0, 2, 3, 1). The product is made contiguous in its own
    order before the permute (fused, it was stored along the sequence with its operand strided: 6 GFLOP/s);
    a Transpose keeping the last axis (the query's (0, 2, 1, 3)) stays a view."""
    from polygrad import Tensor
    from polygrad.uop.ops import Ops
    from polygrad_onnx.graph import OnnxGraph
    rng = np.random.default_rng(0)
    w, b = rng.standard_normal((16, 16)).astype(np.float32), rng.standard_normal(16).astype(np.float32)
    shape = np.array([1, 8, 2, 8], np.int64)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["p"]), helper.make_node("Add", ["p", "b"], ["pb"]),
             helper.make_node("Reshape", ["pb", "shape"], ["r"]),
             helper.make_node("Transpose", ["r"], ["k"], perm=[0, 2, 3, 1]),
             helper.make_node("Transpose", ["r"], ["q"], perm=[0, 2, 1, 3])]
    graph = helper.make_graph(nodes, "key", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16])],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in "kq"],
                              [numpy_helper.from_array(v, n) for n, v in (("w", w), ("b", b), ("shape", shape))])
    initial = {"w": w, "b": b, "shape": shape}
    params = {"w": Tensor(w), "b": Tensor(b)}
    x = rng.standard_normal((1, 8, 16)).astype(np.float32)
    out = OnnxGraph(graph, 17, params, initial, {"x": "x"}, {"k": "k", "q": "q"}).run({"x": Tensor(x)})
    below = lambda t: t.uop.src[0].op  # noqa: E731  (what the permute reads)
    assert out["k"].uop.op is Ops.PERMUTE and below(out["k"]) is Ops.CONTIGUOUS
    assert below(out["q"]) is not Ops.CONTIGUOUS
    ref = (x @ w + b).reshape(1, 8, 2, 8)
    np.testing.assert_allclose(out["k"].numpy(), ref.transpose(0, 2, 3, 1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out["q"].numpy(), ref.transpose(0, 2, 1, 3), rtol=1e-5, atol=1e-5)
