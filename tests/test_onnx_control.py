"""polygrad.onnx control flow (If, Loop, Scan) and recurrent operators (RNN, GRU, LSTM) against onnxruntime.

The onnx package's operator tests (test_onnx_node.py) cover the default forms; here: torch-exported nn.LSTM
and nn.GRU and a torch-scripted If and Loop loaded as captured Models, the recurrent attributes those
tests leave out (clip, activations with alpha/beta, sequence_lens, input_forget, linear_before_reset), and
the refusals: a trip count or sequence length known only from the data, a trip count past the unroll cap,
an If on data whose branches disagree. Small sizes, INTERP. Skipped without onnx, onnxruntime or torch.
"""
from __future__ import annotations

import io
import warnings

import numpy as np
import pytest

import polygrad

onnx = pytest.importorskip("onnx", reason="polygrad.onnx tests need the onnx package")
ort = pytest.importorskip("onnxruntime", reason="the reference outputs come from onnxruntime")
torch = pytest.importorskip("torch", reason="the models are exported by torch.onnx")

import polygrad.onnx as pgo  # noqa: E402
from onnx import TensorProto, helper  # noqa: E402

RNG = np.random.default_rng(0)


def _reference(data: bytes, feeds: dict) -> list:
    return ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)


def _forward(data: bytes, feeds: dict, **load_kw) -> dict:
    rt = polygrad.create(device="INTERP")
    try:
        model = pgo.load(data, runtime=rt, **load_kw)
        out = {k: v.numpy() for k, v in model.forward(**feeds).items()}
        model.dispose()
        return out
    finally:
        rt.dispose()


def _torch_onnx(net, args, **kw) -> bytes:
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, args, buf, opset_version=17, dynamo=False, **kw)
    return buf.getvalue()


class Recurrent(torch.nn.Module):
    """Two stacked bidirectional layers, batch first, and a Linear head."""

    def __init__(self, kind: str):
        super().__init__()
        self.rnn = getattr(torch.nn, kind)(5, 6, num_layers=2, batch_first=True, bidirectional=True)
        self.head = torch.nn.Linear(12, 3)

    def forward(self, x):
        return self.head(self.rnn(x)[0])


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_torch_recurrent_layers_match_onnxruntime(kind):
    torch.manual_seed(0)
    data = _torch_onnx(Recurrent(kind).eval(), (torch.randn(2, 4, 5),), input_names=["x"], output_names=["y"],
                       dynamic_axes={"x": {0: "batch"}})
    assert kind in {n.op_type for n in onnx.load_from_string(data).graph.node}
    x = RNG.standard_normal((3, 4, 5)).astype(np.float32)
    np.testing.assert_allclose(_forward(data, {"x": x}, max_batch=4)["y"], _reference(data, {"x": x})[0],
                               rtol=1e-4, atol=1e-5)


class LstmHead(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn, self.head = torch.nn.LSTM(5, 4, batch_first=True), torch.nn.Linear(4, 3)

    def forward(self, x):
        return self.head(self.rnn(x)[0])


def test_imported_lstm_trains_like_torch():
    """Gradients flow through the unrolled steps: three SGD steps follow torch's loss trajectory (SGD does not
    care that ONNX stores the gates in another order)."""
    torch.manual_seed(1)
    net = LstmHead()
    data = _torch_onnx(net, (torch.randn(2, 3, 5),), input_names=["x"], output_names=["y"],
                       dynamic_axes={"x": {0: "batch"}})
    x, y = RNG.standard_normal((2, 3, 5)).astype(np.float32), RNG.standard_normal((2, 3, 3)).astype(np.float32)
    rt = polygrad.create(device="INTERP")
    try:
        model = pgo.load(data, max_batch=2, loss="mse", runtime=rt)
        losses = model.fit({"x": x, "y": y}, epochs=3, optimizer="sgd", lr=0.1, batch_size=2)
        model.dispose()
    finally:
        rt.dispose()
    opt, ref = torch.optim.SGD(net.parameters(), lr=0.1), []
    for _ in range(3):
        opt.zero_grad()
        loss = ((net(torch.tensor(x)) - torch.tensor(y)) ** 2).mean()
        loss.backward()
        opt.step()
        ref.append(loss.item())
    np.testing.assert_allclose(losses, ref, rtol=1e-5)
    assert ref[-1] < ref[0]


class DataIf(torch.nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return x * 2.0 + 1.0
        return x.exp() - 1.0


def test_torch_scripted_if_on_data_selects_like_onnxruntime():
    data = _torch_onnx(torch.jit.script(DataIf()), (torch.randn(2, 3),), input_names=["x"], output_names=["y"])
    assert "If" in {n.op_type for n in onnx.load_from_string(data).graph.node}
    rt = polygrad.create(device="INTERP")
    try:
        model = pgo.load(data, runtime=rt)
        for sign in (1.0, -1.0):  # one captured Model, both branches
            x = (sign * np.abs(RNG.standard_normal((2, 3)))).astype(np.float32)
            np.testing.assert_allclose(model.forward(x=x)["y"].numpy(), _reference(data, {"x": x})[0], rtol=1e-5)
        model.dispose()
    finally:
        rt.dispose()


class RowLoop(torch.nn.Module):
    def forward(self, x):
        acc = torch.zeros_like(x[0])
        for i in range(x.size(0)):
            acc = acc * 0.5 + x[i]
        return acc


def test_torch_scripted_loop_is_unrolled_like_onnxruntime():
    data = _torch_onnx(torch.jit.script(RowLoop()), (torch.randn(4, 3),), input_names=["x"], output_names=["y"])
    assert "Loop" in {n.op_type for n in onnx.load_from_string(data).graph.node}
    x = RNG.standard_normal((4, 3)).astype(np.float32)
    np.testing.assert_allclose(_forward(data, {"x": x})["y"], _reference(data, {"x": x})[0], rtol=1e-5)


def _model(nodes, inputs, outputs, initializers=(), opset=17) -> bytes:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return model.SerializeToString()


def _value(name, shape, dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, shape)


def _loop_body():
    """Loop body: (i, cond, acc) -> (cond, acc + 1, acc as a scan output)."""
    one = helper.make_node("Constant", [], ["one"], value=helper.make_tensor("v", TensorProto.FLOAT, [], [1.0]))
    nodes = [one, helper.make_node("Identity", ["cond_in"], ["cond_out"]),
             helper.make_node("Add", ["acc_in", "one"], ["acc_out"]), helper.make_node("Identity", ["acc_in"], ["seq"])]
    inputs = [_value("i", [], TensorProto.INT64), _value("cond_in", [], TensorProto.BOOL), _value("acc_in", [2])]
    outputs = [_value("cond_out", [], TensorProto.BOOL), _value("acc_out", [2]), _value("seq", [2])]
    return helper.make_graph(nodes, "body", inputs, outputs)


def _loop_model(trip_from_input: bool, trip: int = 3) -> bytes:
    nodes = [helper.make_node("Loop", ["M", "", "x"], ["acc", "seqs"], body=_loop_body(), name="the_loop")]
    inputs = [_value("x", [2])]
    inits = []
    if trip_from_input:
        inputs.append(_value("M", [], TensorProto.INT64))
    else:
        inits.append(helper.make_tensor("M", TensorProto.INT64, [], [trip]))
    return _model(nodes, inputs, [_value("acc", [2]), _value("seqs", [None, 2])], inits)


def test_loop_with_a_constant_trip_count_matches_onnxruntime():
    data = _loop_model(False, 3)
    x = np.array([1.0, -2.0], np.float32)
    got, (acc, seqs) = _forward(data, {"x": x}), _reference(data, {"x": x})
    np.testing.assert_array_equal(got["acc"], acc)
    np.testing.assert_array_equal(got["seqs"], seqs)


def test_loop_trip_count_from_the_data_is_refused():
    with pytest.raises(pgo.OnnxError, match=r"Loop node 'the_loop'.*trip count must be a constant"):
        pgo.load(_loop_model(True))


def test_huge_trip_count_is_refused_before_unrolling():
    data = _loop_model(False, 10**12)
    with pytest.raises(pgo.OnnxError, match=r"the_loop.*more than 200000 nodes.*max_unrolled_nodes"):
        pgo.load(data)
    with pytest.raises(pgo.OnnxError, match=r"more than 50 nodes"):
        pgo.load(_loop_model(False, 20), max_unrolled_nodes=50)


def test_if_on_data_with_branches_of_different_shapes_is_refused():
    def branch(name, shape):
        return helper.make_graph([helper.make_node("Constant", [], [name], value=helper.make_tensor(
            "v", TensorProto.FLOAT, shape, [1.0] * int(np.prod(shape))))], name, [], [_value(name, shape)])
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=branch("a", [2]), else_branch=branch("b", [3]),
                              name="pick")]
    data = _model(nodes, [_value("x", [2])], [_value("y", [None])],
                  [helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0])])
    with pytest.raises(pgo.OnnxError, match=r"If node 'pick'.*different shapes"):
        pgo.load(data)


def test_unknown_operator_inside_a_subgraph_is_refused_at_load():
    then_graph = helper.make_graph([helper.make_node("Bernoulli", ["x"], ["a"], name="draw")], "then", [],
                                   [_value("a", [2])])
    else_graph = helper.make_graph([helper.make_node("Identity", ["x"], ["b"])], "else", [], [_value("b", [2])])
    nodes = [helper.make_node("If", ["c"], ["y"], then_branch=then_graph, else_branch=else_graph)]
    data = _model(nodes, [_value("x", [2])], [_value("y", [2])], [helper.make_tensor("c", TensorProto.BOOL, [], [1])])
    with pytest.raises(pgo.UnsupportedOpError, match=r"Bernoulli \(node 'draw'\) is not implemented"):
        pgo.load(data)


def _recurrent_model(kind: str, attrs: dict, seq: int = 3, batch: int = 3, size: int = 4, hidden: int = 3,
                     lens: bool = False, peepholes: bool = False, seq_dim=None) -> tuple[bytes, dict]:
    gates = {"RNN": 1, "GRU": 3, "LSTM": 4}[kind]
    dirs = 2 if attrs.get("direction") == "bidirectional" else 1
    init = {"W": RNG.standard_normal((dirs, gates * hidden, size)), "R": RNG.standard_normal((dirs, gates * hidden,
                                                                                              hidden)),
            "B": RNG.standard_normal((dirs, 2 * gates * hidden))}
    names = ["X", "W", "R", "B", "lens" if lens else "", "H0"]
    feeds = {"X": RNG.standard_normal((seq, batch, size)).astype(np.float32),
             "H0": RNG.standard_normal((dirs, batch, hidden)).astype(np.float32)}
    inputs = [_value("X", [seq_dim or seq, batch, size]), _value("H0", [dirs, batch, hidden])]
    if lens:
        feeds["lens"] = np.array([seq, 1, 0][:batch], np.int32)
        inputs.append(_value("lens", [batch], TensorProto.INT32))
    outputs = ["Y", "Y_h"]
    if kind == "LSTM":
        names.append("C0")
        feeds["C0"] = RNG.standard_normal((dirs, batch, hidden)).astype(np.float32)
        inputs.append(_value("C0", [dirs, batch, hidden]))
        outputs.append("Y_c")
        if peepholes:
            names.append("P")
            init["P"] = RNG.standard_normal((dirs, 3 * hidden))
    inits = [helper.make_tensor(k, TensorProto.FLOAT, v.shape, (v * 0.5).astype(np.float32).reshape(-1))
             for k, v in init.items()]
    node = helper.make_node(kind, names, outputs, hidden_size=hidden, name="cell", **attrs)
    shapes = {"Y": [seq, dirs, batch, hidden], "Y_h": [dirs, batch, hidden], "Y_c": [dirs, batch, hidden]}
    return _model([node], inputs, [_value(o, shapes[o]) for o in outputs], inits), feeds


RECURRENT_CASES = {
    "lstm_clip_peepholes_lens_bidirectional": ("LSTM", dict(direction="bidirectional", clip=0.7), True, True),
    "lstm_input_forget_activations": ("LSTM", dict(input_forget=1, activations=["HardSigmoid", "LeakyRelu", "Tanh"],
                                                   activation_alpha=[0.3, 0.2], activation_beta=[0.4]), False, True),
    "gru_linear_before_reset_reverse_lens": ("GRU", dict(linear_before_reset=1, direction="reverse"), True, False),
    "gru_clip_scaled_tanh": ("GRU", dict(clip=0.5, activations=["Sigmoid", "ScaledTanh"], activation_alpha=[1.5],
                                         activation_beta=[0.8]), False, False),
    "rnn_relu_bidirectional_lens": ("RNN", dict(direction="bidirectional", activations=["Relu", "Softsign"]), True,
                                    False),
    "rnn_affine_thresholded_relu": ("RNN", dict(direction="bidirectional", activations=["Affine", "ThresholdedRelu"],
                                                activation_alpha=[0.5, 0.1], activation_beta=[0.2]), False, False),
}


@pytest.mark.parametrize("case", list(RECURRENT_CASES))
def test_recurrent_attributes_match_onnxruntime(case):
    kind, attrs, lens, peepholes = RECURRENT_CASES[case]
    data, feeds = _recurrent_model(kind, attrs, lens=lens, peepholes=peepholes)
    got = _forward(data, feeds)
    for name, want in zip(got, _reference(data, feeds)):
        np.testing.assert_allclose(got[name], want, rtol=1e-5, atol=1e-6, err_msg=f"{case}: {name}")


def test_recurrent_refusals_name_the_node():
    data, _ = _recurrent_model("GRU", dict(activations=["Sigmoid", "Gelu"]))
    with pytest.raises(pgo.UnsupportedOpError, match=r"GRU node 'cell'.*activations='Gelu'"):
        pgo.load(data)
    data, _ = _recurrent_model("RNN", dict(activations=["ScaledTanh"], activation_alpha=[2.0]))
    with pytest.raises(pgo.OnnxError, match=r"RNN node 'cell'.*ScaledTanh needs its alpha and beta"):
        pgo.load(data)
    data, _ = _recurrent_model("LSTM", {}, seq_dim="steps")
    with pytest.raises(pgo.OnnxError, match=r"LSTM node 'cell'.*sequence length is symbolic"):
        pgo.load(data, steps=8)
