"""Fuzz the safetensors loader: whatever the bytes, safe_load returns correct tensors or raises
SafetensorsError (never TypeError, RecursionError, a raw ValueError, a crash or a silent misread).

Three generators: arbitrary bytes; headers whose fields are arbitrary JSON values; and byte-level
mutations of valid files. A file that loads is checked against its raw bytes (each tensor must be
exactly the little-endian slice its data_offsets name) and must have passed the format's rules.
CI runs a small budget; POLY_LONG_TESTS=1 runs a long one.
"""
from __future__ import annotations

import json
import math
import struct

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from fuzz_budget import fuzz_settings
from polygrad.errors import SafetensorsError
from polygrad.nn import safe_load
from polygrad.nn.safetensors import SAFETENSORS_DTYPES

CODES = sorted(SAFETENSORS_DTYPES)


def _pack(header: object, data: bytes = b"") -> bytes:
    text = json.dumps(header).encode() if not isinstance(header, bytes) else header
    return struct.pack("<Q", len(text)) + text + data


def _check_loaded(blob: bytes) -> None:
    """Load `blob`; if it loads, every tensor must equal the bytes its header names."""
    try:
        out = safe_load(blob)
    except SafetensorsError:
        return
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    names = [k for k in header if k != "__metadata__"]
    assert list(out) == names
    spans = []
    for name in names:
        info = header[name]
        dt = SAFETENSORS_DTYPES[info["dtype"]]
        begin, end = info["data_offsets"]
        assert all(type(d) is int and d >= 0 for d in info["shape"])
        assert end - begin == math.prod(info["shape"]) * dt.itemsize
        if end > begin:
            spans.append((begin, end))
        raw = np.frombuffer(blob, dtype=dt.np.newbyteorder("<"), count=(end - begin) // dt.itemsize,
                            offset=8 + n + begin)
        t = out[name]
        assert t.shape == tuple(info["shape"]) and t.dtype is dt
        got = t._buffer().numpy() if t.numel() else np.zeros(0, dt.np)
        assert got.tobytes() == raw.astype(dt.np).tobytes(), name
    spans.sort()
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), "overlapping tensors loaded"


@fuzz_settings(150, 20000)
@given(st.binary(max_size=256))
def test_arbitrary_bytes(blob: bytes) -> None:
    _check_loaded(blob)


@fuzz_settings(150, 20000)
@given(st.binary(max_size=200), st.binary(max_size=64))
def test_arbitrary_header_text(text: bytes, data: bytes) -> None:
    _check_loaded(_pack(text, data))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False) | st.text(max_size=6)
    | st.sampled_from(CODES),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
    max_leaves=12)
small_ints = st.integers(-3, 40) | st.sampled_from([True, False, 2**63, -2**63, 10**30])


@st.composite
def entries(draw):
    """A header of 1-4 entries: mostly plausible fields, each sometimes replaced by arbitrary JSON."""
    header, at = {}, 0
    for i in range(draw(st.integers(1, 4))):
        code = draw(st.sampled_from(CODES))
        shape = draw(st.lists(st.integers(0, 4), max_size=3))
        nbytes = math.prod(shape) * SAFETENSORS_DTYPES[code].itemsize
        offsets = [at, at + nbytes]
        at += nbytes
        info = {"dtype": code, "shape": shape, "data_offsets": offsets}
        field = draw(st.sampled_from(["", "dtype", "shape", "data_offsets", "shape_entry", "offset_entry", "drop"]))
        if field in ("dtype", "shape", "data_offsets"):
            info[field] = draw(json_values)
        elif field == "shape_entry" and shape:
            shape[draw(st.integers(0, len(shape) - 1))] = draw(small_ints)
        elif field == "offset_entry":
            offsets[draw(st.integers(0, 1))] = draw(small_ints)
        elif field == "drop":
            del info[draw(st.sampled_from(sorted(info)))]
        header[draw(st.sampled_from([f"t{i}", "t0", "__metadata__"]))] = info
    if draw(st.booleans()):
        header["__metadata__"] = draw(st.dictionaries(st.text(max_size=3), json_values, max_size=2))
    return header, at


@fuzz_settings(300, 30000)
@given(entries(), st.integers(-8, 8))
def test_structured_headers(case, extra: int) -> None:
    header, size = case
    data = bytes(range(256)) * (max(size + extra, 0) // 256 + 1)
    _check_loaded(_pack(header, data[:max(size + extra, 0)]))


@fuzz_settings(200, 20000)
@given(st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=6),
       st.integers(0, 10**6), st.booleans())
def test_mutated_valid_files(flips, cut, truncate: bool) -> None:
    header = {"a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
              "b": {"dtype": "I64", "shape": [2], "data_offsets": [24, 40]},
              "__metadata__": {"format": "pt"}}
    blob = bytearray(_pack(header, bytes(range(40))))
    for at, value in flips:
        blob[at % len(blob)] = value
    if truncate:
        blob = blob[:cut % len(blob)]
    _check_loaded(bytes(blob))
