"""Files polygrad.onnx.load refuses, each with an OnnxError that says what to do, and nothing read outside.

Garbage and truncated bytes, unknown and refused operators (named with their node), unsupported attribute
values, an opset newer than the supported range, another operator domain, and external data whose path
leaves the model's folder (refused before any file is opened); external data inside the folder loads.
Skipped without onnx.
"""
from __future__ import annotations

import builtins
import os

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="polygrad.onnx tests need the onnx package")

import polygrad.onnx as pgo  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402


def _model(nodes, inputs, outputs, initializers=(), opset=17, domains=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    imports = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, 1) for d in domains]
    return helper.make_model(graph, opset_imports=imports, ir_version=8)


def _io(name, shape=(2, 3)):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))


def _relu_model() -> bytes:
    return _model([helper.make_node("Relu", ["x"], ["y"])], [_io("x")], [_io("y")]).SerializeToString()


def test_good_model_loads():
    model = pgo.load(_relu_model())
    assert np.array_equal(model.forward(x=[[-1, 2, -3], [4, -5, 6]])["y"].numpy(), [[0, 2, 0], [4, 0, 6]])
    model.dispose()


@pytest.mark.parametrize("data", [b"", b"\x00\x01garbage\xff" * 10, b"not a model at all"])
def test_garbage_is_refused(data):
    with pytest.raises(pgo.OnnxError, match="not an ONNX model|not a valid ONNX model"):
        pgo.load(data)


def test_truncated_file_is_refused(tmp_path):
    data = _relu_model()
    path = tmp_path / "cut.onnx"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(pgo.OnnxError, match="truncated|not a valid"):
        pgo.load(path)


def test_missing_file_is_an_onnx_error(tmp_path):
    with pytest.raises(pgo.OnnxError, match="cannot read"):
        pgo.load(tmp_path / "nope.onnx")


def test_unknown_operator_names_op_and_node():
    m = _model([helper.make_node("Relu", ["x"], ["h"]), helper.make_node("Bernoulli", ["h"], ["y"],
                                                                        name="the_draw")], [_io("x")], [_io("y")])
    with pytest.raises(pgo.UnsupportedOpError, match="Bernoulli.*the_draw"):
        pgo.load(m.SerializeToString())


def test_string_operator_is_refused_by_kind():
    s = helper.make_tensor_value_info("s", TensorProto.STRING, [2])
    m = _model([helper.make_node("StringNormalizer", ["s"], ["y"], name="norm")], [s],
               [helper.make_tensor_value_info("y", TensorProto.STRING, [2])])
    with pytest.raises(pgo.UnsupportedOpError, match="StringNormalizer.*string operator"):
        pgo.load(m.SerializeToString())


def test_unsupported_attribute_value_raises():
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="linear", antialias=1)
    scales = numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")
    m = _model([node], [_io("x", (1, 1, 2, 2))], [_io("y", (1, 1, 4, 4))], [scales], opset=18)
    with pytest.raises(pgo.UnsupportedOpError, match="antialias=1"):
        pgo.load(m.SerializeToString())


def test_unknown_attribute_raises():
    node = helper.make_node("Relu", ["x"], ["y"], some_future_flag=1)
    m = _model([node], [_io("x")], [_io("y")])
    with pytest.raises(pgo.OnnxError, match="some_future_flag"):
        pgo.load(m.SerializeToString())


def test_too_new_opset_and_other_domains_are_refused():
    m = _model([helper.make_node("Relu", ["x"], ["y"])], [_io("x")], [_io("y")], opset=99)
    with pytest.raises(pgo.OnnxError, match="opset 99"):
        pgo.load(m.SerializeToString())
    m = _model([helper.make_node("Gelu", ["x"], ["y"], domain="com.microsoft")], [_io("x")], [_io("y")],
               domains=["com.microsoft"])
    with pytest.raises(pgo.OnnxError, match="com.microsoft"):
        pgo.load(m.SerializeToString())


def test_data_dependent_shape_is_refused():
    node = helper.make_node("Reshape", ["x", "shape"], ["y"])
    shape = helper.make_tensor_value_info("shape", TensorProto.INT64, [2])
    m = _model([node], [_io("x"), shape], [_io("y", (3, 2))])
    with pytest.raises(pgo.OnnxError, match="known when the model is loaded"):
        pgo.load(m.SerializeToString())


def _external_model(folder, location: str) -> str:
    weight = numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3), "w")
    weight.ClearField("raw_data")
    weight.data_location = TensorProto.EXTERNAL
    for k, v in {"location": location, "offset": "0", "length": "24"}.items():
        e = weight.external_data.add()
        e.key, e.value = k, v
    m = _model([helper.make_node("Add", ["x", "w"], ["y"])], [_io("x")], [_io("y")], [weight])
    path = os.path.join(folder, "model.onnx")
    with open(path, "wb") as f:
        f.write(m.SerializeToString())
    return path


def test_external_data_inside_the_folder_loads(tmp_path):
    (tmp_path / "weights.bin").write_bytes(np.arange(6, dtype=np.float32).tobytes())
    model = pgo.load(_external_model(tmp_path, "weights.bin"))
    assert np.array_equal(model.forward(x=np.ones((2, 3), np.float32))["y"].numpy(),
                          np.arange(6).reshape(2, 3) + 1)
    model.dispose()


@pytest.mark.parametrize("where", ["../secret.bin", "sub/../../secret.bin", "ABS", "link.bin"])
def test_external_data_outside_the_folder_is_refused_unread(tmp_path, monkeypatch, where):
    secret = tmp_path / "secret.bin"
    secret.write_bytes(np.arange(6, dtype=np.float32).tobytes())
    folder = tmp_path / "model"
    folder.mkdir()
    if where == "link.bin":
        os.symlink(secret, folder / "link.bin")  # a link inside the folder that points out of it
    path = _external_model(str(folder), str(secret) if where == "ABS" else where)
    opened = []
    real_open = builtins.open

    def spy(file, *args, **kwargs):
        opened.append(os.path.realpath(os.fspath(file)) if isinstance(file, (str, os.PathLike)) else file)
        return real_open(file, *args, **kwargs)
    monkeypatch.setattr(builtins, "open", spy)
    with pytest.raises(pgo.OnnxError, match="outside the model's folder|relative path inside"):
        pgo.load(path)
    assert str(secret) not in opened


def test_external_data_from_bytes_needs_the_path(tmp_path):
    (tmp_path / "weights.bin").write_bytes(np.arange(6, dtype=np.float32).tobytes())
    path = _external_model(tmp_path, "weights.bin")
    with pytest.raises(pgo.OnnxError, match="load the model from its path"):
        pgo.load(open(path, "rb").read())


def test_shape_subgraph_is_folded_at_load():
    """Shape -> Gather -> Unsqueeze -> Concat -> Reshape over a symbolic batch runs on the host during capture:
    the Model's forward has the one kernel of the Relu and none for the shape arithmetic."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 6])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2, 3])
    consts = [numpy_helper.from_array(np.array(0, np.int64), "zero"),
              numpy_helper.from_array(np.array([0], np.int64), "axes"),
              numpy_helper.from_array(np.array([2, 3], np.int64), "rest")]
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Gather", ["s", "zero"], ["b"]),
             helper.make_node("Unsqueeze", ["b", "axes"], ["b1"]),
             helper.make_node("Concat", ["b1", "rest"], ["shape"], axis=0),
             helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Reshape", ["r", "shape"], ["y"])]
    model = pgo.load(_model(nodes, [x], [y], consts).SerializeToString(), max_batch=4)
    assert len(model._p.entries["forward"].calls) == 1
    data = np.arange(-9, 9, dtype=np.float32).reshape(3, 6)
    assert np.array_equal(model.forward(x=data)["y"].numpy(), np.maximum(data, 0).reshape(3, 2, 3))
    model.dispose()


@pytest.mark.parametrize("device", ["X86", "INTERP"])
def test_load_on_a_device_other_than_the_default(device):
    """load(..., device=) puts the operators' own constants (a Clip's bounds from Constant nodes) on that
    device too: they were made on the default device (CPU) and the capture failed with a DeviceError."""
    from polygrad.device import Device
    if not Device.available(device):
        pytest.skip(f"{device} is not available here")
    bound = {k: helper.make_node("Constant", [], [k], value=numpy_helper.from_array(np.array(v, np.float32), k))
             for k, v in (("lo", 0.0), ("hi", 6.0))}
    clip = helper.make_node("Clip", ["x", "lo", "hi"], ["y"])
    data = _model([*bound.values(), clip], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5])]).SerializeToString()
    x = np.linspace(-3, 9, 10, dtype=np.float32).reshape(2, 5)
    out = pgo.load(data, device=device).forward(x=x)["y"]
    assert out.device == device
    np.testing.assert_array_equal(out.numpy(), np.clip(x, 0, 6))
