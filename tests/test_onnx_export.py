"""polygrad -> ONNX -> onnxruntime: exported Models give the Model's own outputs.

Models built by polygrad.models (an MLP, a conv net with BatchNorm and pooling, a Graph with a merge, norms
and an embedding) are exported with Model.export_onnx / polygrad.onnx.export and run by onnxruntime on the
same inputs; a Model loaded from ONNX exports its graph with the trained values; a captured callable is
refused with a message naming polygrad.models. Skipped without onnx or onnxruntime.
"""
from __future__ import annotations

import numpy as np
import pytest

import polygrad
from polygrad import Model, Tensor, models, nn

onnx = pytest.importorskip("onnx", reason="export tests need the onnx package")
ort = pytest.importorskip("onnxruntime", reason="the exported graphs are run by onnxruntime")

import polygrad.onnx as pgo  # noqa: E402
from test_js import close  # noqa: E402

MLP = {"input": {"name": "x", "shape": [10]}, "batch": {"name": "batch", "min": 1, "max": 8}, "seed": 1,
       "layers": [{"type": "linear", "out_features": 16, "activation": "relu"},
                  {"type": "linear", "out_features": 16, "activation": "gelu"},
                  {"type": "linear", "out_features": 4, "activation": "log_softmax"}],
       "output": "logits", "loss": "cross_entropy"}
CNN = {"input": {"name": "image", "shape": [3, 12, 12]}, "batch": 4, "seed": 2,
       "layers": [{"type": "conv2d", "out_channels": 6, "kernel_size": 3, "padding": 1},
                  {"type": "batchnorm", "activation": "relu"},
                  {"type": "max_pool2d", "kernel_size": 2},
                  {"type": "conv2d", "out_channels": 8, "kernel_size": 3, "stride": 2, "padding": "valid"},
                  {"type": "groupnorm", "num_groups": 2, "activation": "silu"},
                  {"type": "avg_pool2d", "kernel_size": 2, "padding": 1},
                  {"type": "flatten"}, {"type": "dropout", "p": 0.1},
                  {"type": "linear", "out_features": 5, "activation": "tanh"}],
       "output": "scores"}
GRAPH = {"inputs": [{"name": "tokens", "shape": [6], "dtype": "int32"}, {"name": "extra", "shape": [6, 8]}],
         "batch": {"name": "batch", "min": 1, "max": 4}, "seed": 3,
         "nodes": [{"name": "emb", "type": "embedding", "num_embeddings": 20, "embedding_dim": 8, "inputs": ["tokens"]},
                   {"name": "sum", "type": "add", "inputs": ["emb", "extra"]},
                   {"name": "ln", "type": "layernorm", "inputs": ["sum"]},
                   {"name": "rms", "type": "rmsnorm", "inputs": ["ln"]},
                   {"name": "proj", "type": "linear", "out_features": 8, "activation": "sigmoid", "inputs": ["rms"]},
                   {"name": "both", "type": "concat", "axis": -1, "inputs": ["proj", "ln"]},
                   {"name": "flat", "type": "reshape", "shape": [96], "inputs": ["both"]},
                   {"name": "out", "type": "linear", "out_features": 3, "activation": "softmax", "inputs": ["flat"]}],
         "outputs": ["out", "proj"]}


def _check(model: Model, feeds: dict, data: bytes | None = None) -> None:
    data = data if data is not None else model.export_onnx()
    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    got = sess.run(None, feeds)
    ours = model.forward(**feeds)
    for out, value in zip(sess.get_outputs(), got):
        close(value, ours[out.name].numpy(), rtol=1e-4)


def test_mlp_round_trip_after_training(tmp_path):
    model = models.Sequential(MLP)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 10)).astype(np.float32)
    model.fit({"x": x, "y": rng.integers(0, 4, 8).astype(np.int32)}, epochs=3, optimizer="adam", lr=0.01)
    pgo.export(model, tmp_path / "mlp.onnx")
    _check(model, {"x": x[:5]}, (tmp_path / "mlp.onnx").read_bytes())  # a batch other than the export's
    model.dispose()


@pytest.mark.parametrize("opset", [13, 17, 18, 21])
def test_conv_net_with_batchnorm_round_trip(opset):
    model = models.Sequential(CNN)
    rng = np.random.default_rng(1)
    for name, t in model.parameters().items():  # non-trivial BatchNorm statistics
        if name.endswith("running_mean") or name.endswith("running_var"):
            t.assign(Tensor(rng.uniform(0.5, 1.5, t.shape).astype(np.float32))).realize()
    x = rng.standard_normal((4, 3, 12, 12)).astype(np.float32)
    _check(model, {"image": x}, model.export_onnx(opset=opset))
    model.dispose()


def test_graph_with_embedding_norms_and_merges_round_trip():
    model = models.Graph(GRAPH)
    rng = np.random.default_rng(2)
    feeds = {"tokens": rng.integers(0, 20, (3, 6)).astype(np.int32),
             "extra": rng.standard_normal((3, 6, 8)).astype(np.float32)}
    _check(model, feeds)
    model.dispose()


def test_imported_model_exports_its_graph_with_trained_values():
    torch = pytest.importorskip("torch")
    import io
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    buf = io.BytesIO()
    torch.onnx.export(net, (torch.randn(3, 4),), buf, input_names=["x"], output_names=["y"],
                      dynamic_axes={"x": {0: "batch"}}, dynamo=False)
    model = pgo.load(buf.getvalue(), max_batch=8, loss="mse")
    x = np.random.default_rng(3).standard_normal((8, 4)).astype(np.float32)
    model.fit({"x": x, "y": np.zeros((8, 2), np.float32)}, epochs=2, optimizer="sgd", lr=0.1)
    exported = pgo.export(model)
    assert exported != buf.getvalue()  # the trained weights, not the file's
    _check(model, {"x": x}, exported)
    model.dispose()


def test_captured_callable_is_refused():
    class Net:
        def __init__(self):
            self.l = nn.Linear(3, 2)

        def __call__(self, x):
            return {"y": self.l(x)}
    model = Model(Net(), inputs={"x": Tensor.empty(2, 3)})
    with pytest.raises(pgo.OnnxError, match="polygrad.models"):
        model.export_onnx()
    with pytest.raises(pgo.OnnxError, match="opsets"):
        models.Sequential(MLP).export_onnx(opset=9)
    model.dispose()


def test_export_without_the_distribution_names_the_install(monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "polygrad_onnx", None)
    model = models.Sequential(MLP)
    with pytest.raises(polygrad.ModelError, match="pip install polygrad-onnx"):
        model.export_onnx()
    model.dispose()
