"""safe_save / safe_load / safe_load_metadata, cross-checked with the `safetensors` package both ways."""
from __future__ import annotations

import json
import struct

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file as np_load_file
from safetensors.numpy import save_file as np_save_file
from safetensors.torch import load_file as torch_load_file
from safetensors.torch import save_file as torch_save_file

from polygrad import Tensor, dtypes, nn
from polygrad.errors import SafetensorsError
from polygrad.nn import get_state_dict, load_state_dict, safe_load, safe_load_metadata, safe_save
from polygrad.nn.safetensors import safe_load_numpy

from conftest import DEVICES  # every usable backend: CPU, INTERP, X86, ...


def _sample():
    rng = np.random.default_rng(0)
    return {
        "f32": rng.standard_normal((3, 4)).astype(np.float32),
        "f16": rng.standard_normal((5,)).astype(np.float16),
        "f64": rng.standard_normal((2, 2)).astype(np.float64),
        "i64": np.arange(6, dtype=np.int64).reshape(2, 3),
        "i32": np.array([-1, 2, 3], dtype=np.int32),
        "u8": np.array([0, 255, 7], dtype=np.uint8),
        "bool": np.array([True, False, True]),
        "scalar": np.array(3.5, dtype=np.float32),
        "empty": np.zeros((0, 3), dtype=np.float32),
    }


@pytest.mark.parametrize("device", DEVICES)
def test_ours_to_safetensors_package(tmp_path, device):
    path = tmp_path / "a.safetensors"
    arrays = _sample()
    safe_save({k: Tensor(v, device=device) for k, v in arrays.items()}, path, metadata={"format": "pt"})
    loaded = np_load_file(str(path))
    assert set(loaded) == set(arrays)
    for k, v in arrays.items():
        assert loaded[k].dtype == v.dtype and loaded[k].shape == v.shape, k
        np.testing.assert_array_equal(loaded[k], v, err_msg=k)
    assert safe_load_metadata(path)["__metadata__"] == {"format": "pt"}


@pytest.mark.parametrize("device", DEVICES)
def test_safetensors_package_to_ours(tmp_path, device):
    path = tmp_path / "b.safetensors"
    arrays = _sample()
    np_save_file(arrays, str(path), metadata={"who": "safetensors"})
    loaded = safe_load(path, device=device)
    assert list(loaded) == sorted(loaded, key=list(loaded).index)  # file order
    for k, v in arrays.items():
        assert loaded[k].device == device and loaded[k].shape == v.shape, k
        np.testing.assert_array_equal(loaded[k].numpy(), v, err_msg=k)
    header = safe_load_metadata(path)
    assert header["__metadata__"] == {"who": "safetensors"}
    assert header["f32"]["dtype"] == "F32" and header["f32"]["shape"] == [3, 4]


def test_bfloat16_both_ways(tmp_path):
    values = torch.tensor([1.0, -2.5, 3.140625, 1e-3], dtype=torch.bfloat16)
    torch_save_file({"w": values}, str(tmp_path / "t.safetensors"))
    loaded = safe_load(tmp_path / "t.safetensors")["w"]
    assert loaded.dtype == dtypes.bfloat16
    np.testing.assert_array_equal(loaded.numpy(), values.float().numpy())
    safe_save({"w": loaded, "h": Tensor([0.5, 1.5], dtype=dtypes.float16)}, tmp_path / "o.safetensors")
    back = torch_load_file(str(tmp_path / "o.safetensors"))
    assert back["w"].dtype == torch.bfloat16 and torch.equal(back["w"], values)
    assert back["h"].dtype == torch.float16 and back["h"].tolist() == [0.5, 1.5]


def test_model_roundtrip(tmp_path):
    model = {"conv": nn.Conv2d(1, 2, 3), "norm": nn.BatchNorm2d(2)}
    safe_save(get_state_dict(model), tmp_path / "m.safetensors")
    other = {"conv": nn.Conv2d(1, 2, 3), "norm": nn.BatchNorm2d(2)}
    load_state_dict(other, safe_load(tmp_path / "m.safetensors"))
    for k, v in get_state_dict(model).items():
        np.testing.assert_array_equal(get_state_dict(other)[k].numpy(), v.numpy(), err_msg=k)


def test_load_from_bytes():
    data = _file_bytes({"x": np.array([1.0, 2.0], dtype=np.float32)})
    assert safe_load(data)["x"].numpy().tolist() == [1.0, 2.0]


def _file_bytes(arrays, metadata=None):
    from safetensors.numpy import save
    return save(arrays, metadata=metadata)


def _with_header(header: dict, data: bytes = b"") -> bytes:
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


@pytest.mark.parametrize("blob, message", [
    (b"", "truncated"),
    (b"\x05\x00\x00", "truncated"),
    (struct.pack("<Q", 1000) + b"{}", "truncated"),
    (struct.pack("<Q", 1 << 40), "corrupt"),
    (struct.pack("<Q", 4) + b"{no}", "not valid JSON"),
    (_with_header([1, 2]), "JSON object"),
    (_with_header({"x": {"dtype": "F32", "shape": [2]}}), "lacks"),
    (_with_header({"x": {"dtype": "F8_E4M3", "shape": [1], "data_offsets": [0, 1]}}, b"\x00"), "cannot hold"),
    (_with_header({"x": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, b"\x00" * 4), "invalid shape"),
    (_with_header({"x": {"dtype": "F32", "shape": [2], "data_offsets": [4, 0]}}, b"\x00" * 8), "data_offsets"),
    (_with_header({"x": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\x00" * 8), "needs 12 bytes"),
    (_with_header({"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, b"\x00" * 8), "truncated"),
    (_with_header({"__metadata__": {"a": 1}}), "__metadata__"),
])
def test_corrupt_files_raise_typed_errors(tmp_path, blob, message):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(blob)
    with pytest.raises(SafetensorsError, match=message):
        safe_load(path)
    with pytest.raises(SafetensorsError):
        safe_load_metadata(blob)


def _raw_header(text: str, data: bytes = b"") -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw + data


F32x2 = '"dtype": "F32", "shape": [2], "data_offsets": [0, 8]'


# crafted headers that raised TypeError / RecursionError / ValueError, or loaded, before (issue 11)
@pytest.mark.parametrize("blob, message", [
    (_with_header({"x": {"dtype": ["F32"], "shape": [2], "data_offsets": [0, 8]}}, b"\x00" * 8), "cannot hold"),
    (_with_header({"x": {"dtype": {"F32": 1}, "shape": [2], "data_offsets": [0, 8]}}, b"\x00" * 8), "cannot hold"),
    (_with_header({"x": {"dtype": "F32", "shape": [True, 2], "data_offsets": [0, 8]}}, b"\x00" * 8),
     "invalid shape"),
    (_raw_header("[" * 100_000 + "]" * 100_000), "not valid JSON"),
    (_raw_header('{"x": {"dtype": "F32", "shape": [' + "9" * 5000 + '], "data_offsets": [0, 8]}}', b"\x00" * 8),
     "corrupt"),
    (_with_header({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                   "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, b"\x00" * 12), "overlap"),
    (_raw_header("{" + f'"x": {{{F32x2}}}, "x": {{{F32x2}}}' + "}", b"\x00" * 8), "twice"),
    (_raw_header('{"x": {"dtype": "U8", "shape": [1], "data_offsets": [false, true]}}', b"\x00"), "data_offsets"),
    (_raw_header('{"x": {"dtype": "U8", "shape": [1], "data_offsets": [0.0, 1.0]}}', b"\x00"), "data_offsets"),
])
def test_crafted_headers_raise_safetensors_error(blob, message):
    with pytest.raises(SafetensorsError, match=message):
        safe_load(blob)
    with pytest.raises(SafetensorsError, match=message):
        safe_load_metadata(blob)


@pytest.mark.parametrize("shape, code", [([2**62, 2**62, 0], "F32"), ([2**61, 0], "F32"), ([0, 2**62, 2], "U8")])
def test_empty_shapes_too_large_for_an_array_raise_safetensors_error(shape, code):
    # an empty tensor whose other dimensions multiply past 2**63 bytes: NumPy's reshape raised a builtin
    # ValueError (issue 28, item 13)
    blob = _with_header({"x": {"dtype": code, "shape": shape, "data_offsets": [0, 0]}})
    for read in (safe_load, safe_load_metadata, safe_load_numpy):
        with pytest.raises(SafetensorsError, match=r"'x'.*multiply past 2\*\*63 bytes"):
            read(blob)


def test_large_empty_shapes_within_the_bound_load():
    blob = _with_header({"x": {"dtype": "F32", "shape": [2**40, 0], "data_offsets": [0, 0]}})
    assert safe_load(blob)["x"].shape == (2**40, 0)
    assert safe_load_numpy(blob)["x"][0].shape == (2**40, 0)


def test_source_must_be_a_path_or_bytes():
    with pytest.raises(SafetensorsError, match="path or bytes"):  # 5 used to open file descriptor 5
        safe_load(5)
    data = _file_bytes({"a": np.arange(3, dtype=np.float32)})
    assert safe_load(memoryview(np.frombuffer(data, np.uint8)))["a"].tolist() == [0.0, 1.0, 2.0]


def test_truncated_real_file(tmp_path):
    full = _file_bytes({"a": np.ones((4, 4), np.float32), "b": np.ones(3, np.float32)})
    path = tmp_path / "cut.safetensors"
    path.write_bytes(full[:-5])
    with pytest.raises(SafetensorsError, match="truncated"):
        safe_load(path)


def test_save_rejects_bad_input(tmp_path):
    with pytest.raises(TypeError, match="str to str"):
        safe_save({"a": Tensor([1.0])}, tmp_path / "x.safetensors", metadata={"n": 1})
    with pytest.raises(TypeError, match="not a Tensor"):
        safe_save({"a": np.zeros(2)}, tmp_path / "x.safetensors")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        safe_load(tmp_path / "missing.safetensors")


def test_header_is_padded_to_eight_bytes(tmp_path):
    safe_save({"abc": Tensor([1.0, 2.0, 3.0])}, tmp_path / "p.safetensors")
    raw = (tmp_path / "p.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    assert n % 8 == 0 and len(raw) == 8 + n + 12


def test_a_pipe_loads_as_a_stream(tmp_path):
    """A path that cannot be mapped (a named pipe, as `<(cat file)` gives) is read as a stream, as Model.load
    reads one (filemap.map_file serves both)."""
    import os
    import threading
    data = _file_bytes({"a": np.arange(6, dtype=np.float32).reshape(2, 3)})
    fifo = tmp_path / "st.fifo"
    os.mkfifo(fifo)

    def feed():
        with open(fifo, "wb") as f:
            f.write(data)
    writer = threading.Thread(target=feed)
    writer.start()
    try:
        assert safe_load(fifo)["a"].numpy().tolist() == [[0, 1, 2], [3, 4, 5]]
    finally:
        writer.join(timeout=10)
