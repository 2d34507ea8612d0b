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


def test_matmul_result_transposed_off_its_last_axis_gets_a_tile_along_the_weight():
    """BERT's attention scores as torch exports them: q = (x @ wq).reshape.transpose(0, 2, 1, 3),
    k = (x @ wk + bk).reshape.transpose(0, 2, 3, 1), (q * c) @ (k * c). The key's product stays fused with
    its transpose (stored along the sequence): its register tile's vectors run along the weight's
    contiguous axis (a head's D values), not along the store, so no operand is strided in the vector
    loop; q @ k then reads k contiguous along its output columns and gets an outer-product tile too.
    (Realized in its own order first, as the importer once did, q @ k got a tile of dot products
    instead: 4x slower on BERT-Small.)"""
    from polygrad import Tensor
    from polygrad.codegen.analysis import ranges_of
    from polygrad.codegen.passes import kernel_for_opts
    from polygrad.engine import programs
    from polygrad.uop.ops import Ops
    from polygrad.uop.symbolic import range_coeff
    from polygrad_onnx.graph import OnnxGraph
    import hf_checkpoints as hc
    rng = np.random.default_rng(0)
    s, width, heads = 32, 64, 2
    params = {n: rng.standard_normal((width, width)).astype(np.float32) for n in ("wq", "wk")}
    params["bk"] = rng.standard_normal(width).astype(np.float32)
    shape = np.array([1, s, heads, width // heads], np.int64)
    nodes = [helper.make_node("MatMul", ["x", "wk"], ["pk"]), helper.make_node("Add", ["pk", "bk"], ["pb"]),
             helper.make_node("Reshape", ["pb", "shape"], ["rk"]),
             helper.make_node("Transpose", ["rk"], ["k"], perm=[0, 2, 3, 1]),
             helper.make_node("MatMul", ["x", "wq"], ["pq"]), helper.make_node("Reshape", ["pq", "shape"], ["rq"]),
             helper.make_node("Transpose", ["rq"], ["q"], perm=[0, 2, 1, 3]),
             helper.make_node("Mul", ["q", "scale"], ["qs"]), helper.make_node("Mul", ["k", "scale"], ["ks"]),
             helper.make_node("MatMul", ["qs", "ks"], ["scores"])]
    initial = {**params, "shape": shape, "scale": np.array(0.5, np.float32)}
    graph = helper.make_graph(nodes, "scores", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, s, width])],
                              [helper.make_tensor_value_info("scores", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(v, n) for n, v in initial.items()])
    x = rng.standard_normal((1, s, width)).astype(np.float32)
    out = OnnxGraph(graph, 17, {k: Tensor(v) for k, v in params.items()}, initial, {"x": "x"},
                    {"scores": "scores"}).run({"x": Tensor(x)})["scores"]
    with hc.RecordedKernels() as rec:
        got = out.numpy()
    products = [a for a in dict.fromkeys(rec.asts) if any(n.op is Ops.REDUCE for n in a.toposort())]
    assert len(products) == 3  # the query's and the key's products, then q @ k
    for ast in products:
        opts = programs.get_program(ast, "CPU").spec.opts
        assert sum(o.kind == "UPCAST" for o in opts) == 2 and not any(o.kind == "SPLIT_REDUCE" for o in opts), opts
        vectors = max((o for o in opts if o.kind == "UPCAST"), key=lambda o: o.amount).axis
        split = kernel_for_opts(ast)
        along = next(r for r in ranges_of(split) if r.arg[0] == vectors)
        operands = [n.src[0] for n in split.toposort() if n.op is Ops.LOAD]
        assert any(range_coeff(ix.src[1], along) == 1 for ix in operands)
    ref = lambda w: (x @ w).reshape(1, s, heads, width // heads)  # noqa: E731
    want = ref(params["wq"]).transpose(0, 2, 1, 3) @ (ref(params["wk"]) + params["bk"].reshape(heads, -1)
                                                       ).transpose(0, 2, 3, 1) / 4
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)
