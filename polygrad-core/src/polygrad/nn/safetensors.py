"""Read and write the safetensors format: `safe_save`, `safe_load`, `safe_load_metadata`.

Stage: serialisation. Input: a dict of Tensors (save) or a file / bytes (load). Output: a file laid out
as the `safetensors` package does (u64 little-endian header length, a JSON header padded with spaces
to 8 bytes, then the raw little-endian data), or a dict of Tensors.

Loading memory-maps the file, so only the bytes of each tensor are read, straight into its device
buffer. Every offset is checked first: a corrupt or truncated file raises SafetensorsError.
"""
from __future__ import annotations

import json
import math
import os
import struct
from typing import Any

import numpy as np

from polygrad.dtype import DType, dtypes
from polygrad.errors import SafetensorsError
from polygrad.filemap import map_file
from polygrad.tensor import Tensor

__all__ = ["safe_load", "safe_load_metadata", "safe_load_numpy", "safe_save"]

SAFETENSORS_DTYPES: dict[str, DType] = {
    "BOOL": dtypes.bool, "U8": dtypes.uint8, "I8": dtypes.int8, "U16": dtypes.uint16, "I16": dtypes.int16,
    "U32": dtypes.uint32, "I32": dtypes.int32, "U64": dtypes.uint64, "I64": dtypes.int64,
    "F16": dtypes.float16, "BF16": dtypes.bfloat16, "F32": dtypes.float32, "F64": dtypes.float64,
}
_CODE_OF = {dt: code for code, dt in SAFETENSORS_DTYPES.items()}
_MAX_HEADER = 100 * 1024 * 1024  # the safetensors package's own limit


def safe_save(tensors: dict[str, Tensor], path: str | os.PathLike, metadata: dict[str, str] | None = None) -> None:
    """Write tensors (and optional string metadata) to a .safetensors file.

    >>> import tempfile, os
    >>> p = os.path.join(tempfile.mkdtemp(), "w.safetensors")
    >>> safe_save({"w": Tensor([1.0, 2.0])}, p)
    >>> safe_load(p)["w"].numpy().tolist()
    [1.0, 2.0]
    """
    header: dict[str, Any] = {}
    if metadata:
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise TypeError("safetensors metadata must map str to str; convert the values with str() or json.dumps")
        header["__metadata__"] = dict(metadata)
    blobs = []
    offset = 0
    for name, t in tensors.items():
        if not isinstance(t, Tensor):
            raise TypeError(f"safe_save: {name!r} is a {type(t).__name__}, not a Tensor")
        if name == "__metadata__":
            raise ValueError("'__metadata__' is reserved by the safetensors format; rename that tensor")
        blob = _raw_bytes(t)
        header[name] = {"dtype": _CODE_OF[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
        blobs.append(blob)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)


def _raw_bytes(t: Tensor) -> bytes:
    if t.numel() == 0:
        return b""
    # the storage view keeps bfloat16 as its raw 16 bits (numpy() would widen it to float32)
    storage = t.contiguous()._buffer().numpy()
    return storage.astype(storage.dtype.newbyteorder("<"), copy=False).tobytes()


def safe_load_metadata(source: str | os.PathLike | bytes) -> dict[str, Any]:
    """The parsed, validated JSON header: {name: {"dtype", "shape", "data_offsets"}, "__metadata__": {...}}."""
    data = _open(source)
    header, _ = _parse_header(data)
    return header


def safe_load(source: str | os.PathLike | bytes, device: str | None = None) -> dict[str, Tensor]:
    """Load every tensor of a safetensors file (or its bytes) onto `device`, in file order."""
    data = _open(source)
    header, data_start = _parse_header(data)
    out: dict[str, Tensor] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dt = SAFETENSORS_DTYPES[info["dtype"]]
        begin, end = info["data_offsets"]
        arr = np.frombuffer(data, dtype=dt.np.newbyteorder("<"), count=(end - begin) // dt.itemsize,
                            offset=data_start + begin)
        out[name] = Tensor(arr.astype(dt.np, copy=False).reshape(info["shape"]), device=device, dtype=dt)
    return out


def safe_load_numpy(source: str | os.PathLike | bytes) -> dict[str, tuple[np.ndarray, DType]]:
    """{name: (array, dtype)}: every tensor as a read-only NumPy view of the (memory-mapped) file, nothing
    copied, for loaders that convert on the host; a bfloat16 tensor comes as its raw uint16 bits. The header
    is validated as in safe_load (SafetensorsError names the tensor)."""
    data = _open(source)
    header, data_start = _parse_header(data)
    out: dict[str, tuple[np.ndarray, DType]] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dt = SAFETENSORS_DTYPES[info["dtype"]]
        begin, end = info["data_offsets"]
        arr = np.frombuffer(data, dtype=np.dtype(dt.np).newbyteorder("<"), count=(end - begin) // dt.itemsize,
                            offset=data_start + begin)
        out[name] = (arr.reshape(info["shape"]), dt)
    return out


def _open(source: str | os.PathLike | bytes) -> Any:
    if isinstance(source, (bytes, bytearray, memoryview)):
        view = memoryview(source)
        return view.cast("B") if view.c_contiguous else memoryview(view.tobytes())
    if not isinstance(source, (str, os.PathLike)):  # an int would open that file descriptor
        raise SafetensorsError(f"safetensors source must be a path or bytes, got {type(source).__name__}; "
                               "pass the file's path (str or pathlib.Path) or its contents as bytes")
    try:
        return map_file(source)
    except FileNotFoundError as e:
        raise FileNotFoundError(f"safetensors file {os.fspath(source)!r} does not exist") from e


def _parse_header(data: Any) -> tuple[dict[str, Any], int]:
    size = len(data)
    if size < 8:
        raise SafetensorsError(f"safetensors data is truncated: {size} bytes, fewer than the 8-byte header length")
    (n,) = struct.unpack("<Q", bytes(data[:8]))
    if n > _MAX_HEADER:
        raise SafetensorsError(f"safetensors header claims {n} bytes (limit {_MAX_HEADER}); the file is corrupt")
    if 8 + n > size:
        raise SafetensorsError(f"safetensors file is truncated: header needs {n} bytes, only {size - 8} follow")
    text = bytes(data[8:8 + n])
    try:
        header = json.loads(text.decode("utf-8"), object_pairs_hook=_unique_keys)
    # JSONDecodeError, the int digit limit (ValueError), brackets nested past the recursion limit
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        if isinstance(e, SafetensorsError):
            raise
        raise SafetensorsError(f"safetensors header is not valid JSON ({e}); the file is corrupt") from e
    if not isinstance(header, dict):
        raise SafetensorsError("safetensors header must be a JSON object; the file is corrupt")
    data_len = size - 8 - n
    spans = []
    for name, info in header.items():
        if name == "__metadata__":
            _check_metadata(info)
        else:
            begin, end = _check_entry(name, info, data_len)
            if end > begin:  # an empty tensor's offsets overlap nothing
                spans.append((begin, end, name))
    spans.sort()
    for (_, end, first), (begin, _, second) in zip(spans, spans[1:]):
        if begin < end:
            raise SafetensorsError(f"tensors {first!r} and {second!r} overlap in the data (data_offsets); the file "
                                   "is corrupt")
    return header, 8 + n


MAX_DIMS = 64


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise SafetensorsError(f"safetensors header has the key {key!r} twice; the file is corrupt")
        out[key] = value
    return out


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)  # JSON true is not a size


def _check_metadata(info: Any) -> None:
    if not isinstance(info, dict) or not all(isinstance(v, str) for v in info.values()):
        raise SafetensorsError("safetensors __metadata__ must map strings to strings; the file is corrupt")


def _check_entry(name: str, info: Any, data_len: int) -> tuple[int, int]:
    """Validate one tensor's entry; returns its (begin, end) in the data."""
    if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= set(info):
        raise SafetensorsError(f"safetensors entry {name!r} lacks dtype/shape/data_offsets; the file is corrupt")
    code, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    if not isinstance(code, str) or code not in SAFETENSORS_DTYPES:
        raise SafetensorsError(f"tensor {name!r} has dtype {code!r:.80}, which polygrad cannot hold; supported: "
                               f"{sorted(SAFETENSORS_DTYPES)}")
    if not isinstance(shape, list) or len(shape) > MAX_DIMS or not all(_is_int(d) and 0 <= d < 2**63 for d in shape):
        raise SafetensorsError(f"tensor {name!r} has an invalid shape {shape!r:.80}; the file is corrupt")
    if (not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_int(o) for o in offsets)
            or not 0 <= offsets[0] <= offsets[1]):
        raise SafetensorsError(f"tensor {name!r} has invalid data_offsets {offsets!r:.80}; the file is corrupt")
    itemsize = SAFETENSORS_DTYPES[code].itemsize
    # NumPy's bound on an array (an empty one too): its non-zero dimensions times the item size
    if math.prod(d for d in shape if d) * itemsize >= 2**63:
        raise SafetensorsError(f"tensor {name!r} has shape {shape!r:.80} of {code}, whose dimensions multiply past "
                               "2**63 bytes; the file is corrupt")
    expected = math.prod(shape) * itemsize
    if offsets[1] - offsets[0] != expected:
        raise SafetensorsError(f"tensor {name!r}: shape {shape} of {code} needs {expected} bytes, data_offsets "
                               f"span {offsets[1] - offsets[0]}; the file is corrupt")
    if offsets[1] > data_len:
        raise SafetensorsError(f"tensor {name!r} ends at byte {offsets[1]} of the data, but only {data_len} bytes "
                               "are present; the file is truncated")
    return offsets[0], offsets[1]
