"""Reading: an .onnx path or its bytes -> a checked ModelProto and its initializers as NumPy arrays.

Stage: parse (first in the pipeline). Input: a path or bytes. Output: `OnnxFile` (the ModelProto, the
ai.onnx opset, the folder external data may come from) and `tensor_array(TensorProto)`. Parsing is the
`onnx` package's; what this module adds is refusal: bytes that are not a model, an opset outside the
supported range, another operator domain, and external data whose path leaves the model's folder (checked
on the path before any file is opened).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from polygrad_onnx.errors import OnnxError

MIN_OPSET = 13
# the newest ai.onnx opset the operator tests were run against (onnx 1.23's own operator tests); older
# models (opsets 7-12) are converted to MIN_OPSET with onnx.version_converter first
MAX_OPSET = 28

# ONNX element types polygrad holds, by TensorProto enum value (others: strings, complex, bfloat16, float8, int4)
NUMPY_TYPES = {1: np.float32, 2: np.uint8, 3: np.int8, 4: np.uint16, 5: np.int16, 6: np.int32, 7: np.int64,
               9: np.bool_, 10: np.float16, 11: np.float64, 12: np.uint32, 13: np.uint64}


def onnx_module() -> Any:
    """The `onnx` package, or an OnnxError naming the pip line."""
    try:
        import onnx
    except ImportError:
        raise OnnxError("polygrad.onnx needs the 'onnx' package: pip install onnx") from None
    return onnx


@dataclass(frozen=True)
class OnnxFile:
    """A parsed model: the proto, its ai.onnx opset, and the folder its external data may be read from."""

    model: Any
    opset: int
    folder: str | None
    source: str


def read_model(source: Any) -> OnnxFile:
    """Parse `source` (a path or bytes) into a checked OnnxFile."""
    onnx = onnx_module()
    if isinstance(source, (bytes, bytearray, memoryview)):
        data, folder, label = bytes(source), None, "<bytes>"
    elif isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as e:
            raise OnnxError(f"cannot read ONNX file {path!r}: {e.strerror}") from None
        folder, label = os.path.dirname(os.path.realpath(path)), path
    else:
        raise OnnxError(f"polygrad.onnx.load takes a path or bytes, got {type(source).__name__}")
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except Exception as e:  # protobuf's DecodeError and friends
        raise OnnxError(f"{label} is not an ONNX model (protobuf parse failed: {e}); was it truncated?") from None
    if not model.HasField("graph") or not model.graph.output or model.ir_version <= 0:
        raise OnnxError(f"{label} is not an ONNX model (no graph outputs or IR version); was it truncated?")
    opset = check_opsets(model, label)
    if opset < MIN_OPSET:
        model, opset = upgrade(model, opset, label), MIN_OPSET
    for t in model.graph.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            external_path(t, folder, label)  # refuse a bad path before anything is read
    try:  # from the path, the checker finds external data next to the model (paths checked above)
        onnx.checker.check_model(label if folder is not None else model)
    except Exception as e:
        raise OnnxError(f"{label} is not a valid ONNX model: {str(e).splitlines()[0][:300]}") from None
    return OnnxFile(model, opset, folder, label)


def check_opsets(model: Any, label: str) -> int:
    """The model's ai.onnx opset; an OnnxError for another domain or an opset outside the supported range."""
    opset = None
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            opset = imp.version
        elif any(n.domain == imp.domain for n in model.graph.node):
            raise OnnxError(f"{label} uses operator domain {imp.domain!r}; polygrad.onnx implements the standard "
                            "ai.onnx domain only")
    if opset is None:
        raise OnnxError(f"{label} declares no ai.onnx opset")
    if opset > MAX_OPSET:
        raise OnnxError(f"{label} uses ai.onnx opset {opset}; polygrad.onnx reads opsets up to {MAX_OPSET}: "
                        f"convert it with onnx.version_converter.convert_version(model, {MAX_OPSET})")
    return opset


def upgrade(model: Any, opset: int, label: str) -> Any:
    """An opset 7-12 model converted to MIN_OPSET by onnx.version_converter (the operators polygrad.onnx
    implements are written against opset 13 and later)."""
    onnx = onnx_module()
    try:
        return onnx.version_converter.convert_version(model, MIN_OPSET)
    except Exception as e:
        raise OnnxError(f"{label} uses ai.onnx opset {opset} and onnx.version_converter cannot convert it to "
                        f"{MIN_OPSET} ({str(e).splitlines()[0][:200] if str(e) else type(e).__name__}); re-export "
                        f"it with opset {MIN_OPSET} or later") from None


def external_path(t: Any, folder: str | None, label: str) -> tuple[str, int, int | None]:
    """(file, offset, length) of an initializer stored outside the model, the file inside the model's folder."""
    info = {e.key: e.value for e in t.external_data}
    where = info.get("location", "")
    if folder is None:
        raise OnnxError(f"initializer {t.name!r} of {label} is stored in an external file ({where!r}); load the "
                        "model from its path so the file can be found next to it")
    if not where or os.path.isabs(where) or os.path.splitdrive(where)[0]:
        raise OnnxError(f"initializer {t.name!r} names external data {where!r}; only a relative path inside the "
                        f"model's folder {folder!r} is read")
    path = os.path.realpath(os.path.join(folder, where))
    if os.path.commonpath([path, folder]) != folder:
        raise OnnxError(f"initializer {t.name!r} names external data {where!r}, which is outside the model's folder "
                        f"{folder!r}; polygrad.onnx reads external data only from inside that folder")
    try:
        offset = int(info.get("offset", "0"))
        length = int(info["length"]) if "length" in info else None
    except ValueError:
        raise OnnxError(f"initializer {t.name!r}: external data offset/length must be integers") from None
    if offset < 0 or (length is not None and length < 0):
        raise OnnxError(f"initializer {t.name!r}: negative external data offset or length")
    return path, offset, length


def tensor_array(t: Any, folder: str | None = None, label: str = "<bytes>") -> np.ndarray:
    """A TensorProto's contents as a NumPy array (external data read from inside `folder`)."""
    onnx = onnx_module()
    if t.data_type not in NUMPY_TYPES:
        name = onnx.TensorProto.DataType.Name(t.data_type) if t.data_type in onnx.TensorProto.DataType.values() \
            else str(t.data_type)
        raise OnnxError(f"tensor {t.name!r} has element type {name}; polygrad.onnx holds "
                        "float16/32/64, int8..int64, uint8..uint64 and bool")
    if t.data_location == onnx.TensorProto.EXTERNAL:
        path, offset, length = external_path(t, folder, label)
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                raw = f.read() if length is None else f.read(length)
        except OSError as e:
            raise OnnxError(f"cannot read external data of {t.name!r} from {path!r}: {e.strerror}") from None
        inline = onnx.TensorProto()
        inline.CopyFrom(t)
        del inline.external_data[:]
        inline.data_location = onnx.TensorProto.DEFAULT
        inline.raw_data = raw
        t = inline
    count = int(np.prod(t.dims, dtype=np.int64)) if t.dims else 1
    try:
        arr = onnx.numpy_helper.to_array(t)
    except Exception as e:
        raise OnnxError(f"tensor {t.name!r}: its data does not match its shape {list(t.dims)} ({e})") from None
    if arr.size != count:
        raise OnnxError(f"tensor {t.name!r}: {arr.size} values for shape {list(t.dims)}")
    arr = arr.astype(NUMPY_TYPES[t.data_type], copy=False)
    return arr if arr.flags.c_contiguous else arr.copy()  # (np.ascontiguousarray makes a scalar 1-d)
