"""Read the GGUF container (llama.cpp's format, versions 2 and 3): header, metadata, tensor infos, data.

Stage: checkpoint reading (used by gguf_file.py). Input: a .gguf path. Output: a `GGUFFile` holding the
metadata (scalars decoded; arrays kept as `GGUFArray` records of offset, type and count, decoded only
when asked), the tensor infos, and each tensor's data as a numpy view of one read-only memory map of
the file (no copy, no decoding pass: a page is read when a kernel or a copy first touches it).

The layout (ggml/docs/gguf.md), all little-endian: "GGUF", uint32 version, uint64 tensor count, uint64
key/value count; each key/value is a string (uint64 length, UTF-8 bytes), a uint32 value type and the
value (an array is a uint32 element type, a uint64 count and the elements; arrays may nest); each
tensor info is a string name, uint32 n_dims, n_dims uint64 dimensions (fastest-varying first), uint32
ggml type and a uint64 offset into the data section, which starts at the next multiple of
`general.alignment` (32 when absent) after the infos.

Every count, length and offset is checked against the file before it is used, in Python integers (no
uint64 wrap): a problem is a CheckpointError naming the file and the key or tensor, never an IndexError,
struct.error or MemoryError. Parsing a 50,000-token vocabulary walks the string lengths only.
"""
from __future__ import annotations

import math
import mmap
import os
import struct
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from polygrad.definitions.quant_formats import FORMATS
from polygrad_hf.errors import CheckpointError

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4
MAX_NESTING = 8  # arrays of arrays: deeper would only serve a crafted file's recursion

# GGUF value types: id -> (name, struct format of a scalar or None); 8 STRING and 9 ARRAY are variable
VALUE_TYPES = {0: ("UINT8", "<B"), 1: ("INT8", "<b"), 2: ("UINT16", "<H"), 3: ("INT16", "<h"),
               4: ("UINT32", "<I"), 5: ("INT32", "<i"), 6: ("FLOAT32", "<f"), 7: ("BOOL", "<?"),
               8: ("STRING", None), 9: ("ARRAY", None), 10: ("UINT64", "<Q"), 11: ("INT64", "<q"),
               12: ("FLOAT64", "<d")}
STRING, ARRAY = 8, 9


class TensorType(NamedTuple):
    name: str
    block: int        # values per block (1 for the plain types)
    block_bytes: int
    dtype: str | None  # the numpy dtype of a plain type's values; None for a block format (read as uint8)


# ggml tensor types by id (ggml.h's enum ggml_type); ids 4, 5 and 31..33 are retired, and 9 (Q8_1) is
# ggml's operand format for dot products, never a stored tensor (the gguf package gives it 40 bytes, ggml 36).
# The block formats polygrad keeps come from their shared definition; the others are read only to be named
# in errors and checked for layout.
TENSOR_TYPES = {
    0: TensorType("F32", 1, 4, "<f4"), 1: TensorType("F16", 1, 2, "<f2"),
    **{f.ggml_type: TensorType(f.name, f.block, f.block_bytes, None) for f in FORMATS},
    10: TensorType("Q2_K", 256, 84, None), 11: TensorType("Q3_K", 256, 110, None),
    16: TensorType("IQ2_XXS", 256, 66, None), 17: TensorType("IQ2_XS", 256, 74, None),
    18: TensorType("IQ3_XXS", 256, 98, None), 19: TensorType("IQ1_S", 256, 50, None),
    20: TensorType("IQ4_NL", 32, 18, None), 21: TensorType("IQ3_S", 256, 110, None),
    22: TensorType("IQ2_S", 256, 82, None), 23: TensorType("IQ4_XS", 256, 136, None),
    24: TensorType("I8", 1, 1, "<i1"), 25: TensorType("I16", 1, 2, "<i2"), 26: TensorType("I32", 1, 4, "<i4"),
    27: TensorType("I64", 1, 8, "<i8"), 28: TensorType("F64", 1, 8, "<f8"), 29: TensorType("IQ1_M", 256, 56, None),
    30: TensorType("BF16", 1, 2, "<u2"), 34: TensorType("TQ1_0", 256, 54, None),
    35: TensorType("TQ2_0", 256, 66, None), 39: TensorType("MXFP4", 32, 17, None),
}


@dataclass(frozen=True)
class GGUFArray:
    """A metadata array left undecoded: its elements' value type, count and byte span in the file.
    `decode()` reads it: a numpy array (a view of the file) for numbers, a list of str for strings,
    a list of decoded arrays for nested ones."""
    buf: Any  # the file's memory map (not the GGUFFile: a reference cycle would keep the map alive)
    path: str
    key: str
    value_type: int
    count: int
    offset: int  # of the first element
    end: int     # one past the last element's last byte

    def decode(self) -> Any:
        if self.value_type == STRING:
            return _read_strings(self.buf, self.offset, self.count, self.path, self.key)
        if self.value_type == ARRAY:
            cur = _Cursor(self.buf, len(self.buf), self.path)
            cur.pos = self.offset
            return [_skip_array(cur, self.key).decode() for _ in range(self.count)]
        dtype = np.dtype(VALUE_TYPES[self.value_type][1].replace("?", "b1"))
        return np.frombuffer(self.buf, dtype, self.count, self.offset)

    def __repr__(self) -> str:
        return f"<GGUF array of {self.count} {VALUE_TYPES[self.value_type][0]}>"


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dims: tuple[int, ...]  # as stored: the fastest-varying (a row's length) first
    type_id: int
    offset: int            # into the data section
    nbytes: int
    info_offset: int       # of the tensor-info record in the file

    @property
    def type(self) -> TensorType:
        return TENSOR_TYPES[self.type_id]

    @property
    def shape(self) -> tuple[int, ...]:
        """Row-major (numpy) shape: the dimensions reversed."""
        return self.dims[::-1]


class _Cursor:
    """Reads the header's fields in order, each checked to lie inside the file."""

    def __init__(self, buf: Any, size: int, path: str) -> None:
        self.buf, self.size, self.path, self.pos = buf, size, path, 0

    def fail(self, what: str) -> CheckpointError:
        return CheckpointError(f"{self.path}: not a readable GGUF file: {what}")

    def need(self, n: int, what: str) -> None:
        if self.pos + n > self.size:
            raise self.fail(f"{what} needs bytes {self.pos}..{self.pos + n}, past the end of the file "
                            f"({self.size} bytes); the file is truncated or corrupt")

    def scalar(self, fmt: str, what: str) -> Any:
        n = struct.calcsize(fmt)
        self.need(n, what)
        (v,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return v

    def raw_string(self, what: str) -> bytes:
        n = self.scalar("<Q", what)
        self.need(n, f"{what} ({n} bytes)")
        s = self.buf[self.pos:self.pos + n]
        self.pos += n
        return s

    def string(self, what: str) -> str:
        raw = self.raw_string(what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what} is not UTF-8 ({raw[:40]!r})") from None


class GGUFFile:
    """A parsed GGUF file. `metadata` maps keys to decoded scalars or GGUFArray records; `tensors` maps
    names to TensorInfo in file order; `data(info)` is the tensor's bytes as a numpy view of the file.

    >>> f = GGUFFile("model.gguf")                          # doctest: +SKIP
    >>> f.metadata["general.architecture"], f.tensors["token_embd.weight"].shape  # doctest: +SKIP
    ('gpt2', (50257, 768))
    """

    def __init__(self, path: str) -> None:
        self.path = str(path)
        try:
            with open(self.path, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                if size < 24:
                    raise CheckpointError(f"{self.path}: not a readable GGUF file: {size} bytes, less than the "
                                          "24-byte header; the file is truncated")
                self._map = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        except OSError as e:
            raise CheckpointError(f"{self.path}: cannot read the file ({e})") from None
        self.file_size = size
        cur = _Cursor(self._map, size, self.path)
        if self._map[:4] != MAGIC:
            raise cur.fail(f"it starts with {self._map[:4]!r}, not {MAGIC!r}")
        cur.pos = 4
        self.version = cur.scalar("<I", "the version")
        if self.version not in VERSIONS:
            swapped = int.from_bytes(self.version.to_bytes(4, "little"), "big")
            hint = (f" (it reads as {swapped} big-endian: polygrad-hf reads little-endian files)"
                    if swapped in VERSIONS else "; convert it with a current llama.cpp")
            raise cur.fail(f"version {self.version}, expected one of {list(VERSIONS)}{hint}")
        n_tensors = cur.scalar("<Q", "the tensor count")
        n_kv = cur.scalar("<Q", "the metadata count")
        # the smallest key/value is 13 bytes (empty key, type, one byte); the smallest tensor info 24
        if n_kv * 13 + n_tensors * 24 > size - cur.pos:
            raise cur.fail(f"{n_kv} metadata entries and {n_tensors} tensors cannot fit in {size} bytes; the file "
                           "is truncated or corrupt")
        self.metadata: dict[str, Any] = {}
        for i in range(n_kv):
            key = cur.string(f"metadata key {i}")
            if key in self.metadata:
                raise cur.fail(f"metadata key {key!r} appears twice")
            kind = cur.scalar("<I", f"the type of metadata key {key!r}")
            self.metadata[key] = self._value(cur, kind, key)
        self.alignment = self._alignment(cur)
        self.tensors: dict[str, TensorInfo] = {}
        for i in range(n_tensors):
            info = self._tensor_info(cur, i)
            if info.name in self.tensors:
                raise cur.fail(f"tensor {info.name!r} appears twice")
            self.tensors[info.name] = info
        self.data_offset = -(-cur.pos // self.alignment) * self.alignment
        self._check_layout()

    # ---------------------------------------------------------------- metadata

    def _value(self, cur: _Cursor, kind: int, key: str) -> Any:
        if kind not in VALUE_TYPES:
            raise cur.fail(f"metadata key {key!r} has value type {kind}, not a GGUF type (0..12)")
        if kind == STRING:
            return cur.string(f"the value of metadata key {key!r}")
        if kind == ARRAY:
            return _skip_array(cur, key)
        return cur.scalar(VALUE_TYPES[kind][1], f"the value of metadata key {key!r}")

    def _alignment(self, cur: _Cursor) -> int:
        v = self.metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0 or v & (v - 1):
            raise cur.fail(f"'general.alignment' must be a power of two, got {v!r:.40}")
        return v

    # ---------------------------------------------------------------- tensors

    def _tensor_info(self, cur: _Cursor, i: int) -> TensorInfo:
        at = cur.pos
        name = cur.string(f"the name of tensor {i}")
        where = f"tensor {name!r}"
        n_dims = cur.scalar("<I", f"the dimension count of {where}")
        if n_dims > MAX_DIMS:
            raise cur.fail(f"{where} has {n_dims} dimensions; GGUF tensors have at most {MAX_DIMS}")
        cur.need(8 * n_dims, f"the dimensions of {where}")
        dims = struct.unpack_from(f"<{n_dims}Q", self._map, cur.pos)
        cur.pos += 8 * n_dims
        type_id = cur.scalar("<I", f"the type of {where}")
        offset = cur.scalar("<Q", f"the data offset of {where}")
        kind = TENSOR_TYPES.get(type_id)
        if kind is None:
            raise cur.fail(f"{where} has ggml type {type_id}, which is not a known type (ids "
                           f"{sorted(TENSOR_TYPES)})")
        if kind.block > 1 and (not dims or dims[0] % kind.block):  # a block format needs rows of whole blocks
            row = dims[0] if dims else 1
            raise CheckpointError(f"{self.path}: tensor {name!r} is {kind.name} with rows of {row} values, not a "
                                  f"multiple of its {kind.block}-value block; llama.cpp writes whole blocks, so the "
                                  "file is corrupt")
        nbytes = math.prod(dims) // kind.block * kind.block_bytes
        if nbytes >= 2**64:
            raise cur.fail(f"{where} of dimensions {list(dims)} would take {nbytes} bytes (past 2**64); the file is "
                           "corrupt")
        return TensorInfo(name, tuple(dims), type_id, offset, nbytes, at)

    def _check_layout(self) -> None:
        """Every tensor's data lies inside the data section, starts on the file's alignment and overlaps no
        other tensor's."""
        size = self.file_size - self.data_offset
        if size < 0 and self.tensors:
            raise CheckpointError(f"{self.path}: not a readable GGUF file: the data section would start at byte "
                                  f"{self.data_offset}, past the end of the file ({self.file_size} bytes)")
        spans = []
        for t in self.tensors.values():
            where = f"{self.path}: tensor {t.name!r}"
            if t.offset + t.nbytes > size:
                raise CheckpointError(f"{where} needs bytes {t.offset}..{t.offset + t.nbytes} of the data section, "
                                      f"which holds {size}; the file is truncated or corrupt")
            if t.offset % self.alignment:
                raise CheckpointError(f"{where} starts at data offset {t.offset}, not a multiple of the file's "
                                      f"alignment {self.alignment}; the file is corrupt")
            if t.nbytes:
                spans.append((t.offset, t.offset + t.nbytes, t.name))
        spans.sort()
        for (_, end, first), (begin, _, second) in zip(spans, spans[1:]):
            if begin < end:
                raise CheckpointError(f"{self.path}: tensors {first!r} and {second!r} overlap in the data; the file "
                                      "is corrupt")

    def data(self, t: TensorInfo) -> np.ndarray:
        """The tensor's stored values as a read-only view of the file: a plain type in its numpy dtype
        (BF16 as uint16 bit patterns) shaped `t.shape`; a block format as uint8 rows of blocks
        (*t.shape[:-1], bytes per row)."""
        kind = t.type
        start = self.data_offset + t.offset
        if kind.dtype is not None:
            return np.frombuffer(self._map, np.dtype(kind.dtype), math.prod(t.dims), start).reshape(t.shape)
        rows = t.shape[:-1]
        row_bytes = t.dims[0] // kind.block * kind.block_bytes if t.dims else kind.block_bytes
        return np.frombuffer(self._map, np.uint8, t.nbytes, start).reshape(*rows, row_bytes)


def _skip_array(cur: _Cursor, key: str, depth: int = 0) -> GGUFArray:
    """Skip an array's elements (walking string lengths and nested headers) and record where they are."""
    if depth >= MAX_NESTING:
        raise cur.fail(f"metadata array {key!r} nests arrays more than {MAX_NESTING} deep")
    kind = cur.scalar("<I", f"the element type of metadata array {key!r}")
    count = cur.scalar("<Q", f"the length of metadata array {key!r}")
    if kind not in VALUE_TYPES:
        raise cur.fail(f"metadata array {key!r} has element type {kind}, not a GGUF type (0..12)")
    start = cur.pos
    # every element takes at least one byte, a string 8, a nested array 12
    least = {STRING: 8, ARRAY: 12}.get(kind) or struct.calcsize(VALUE_TYPES[kind][1])
    cur.need(count * least, f"metadata array {key!r} of {count} {VALUE_TYPES[kind][0]}")
    if kind == STRING:
        buf, size, pos = cur.buf, cur.size, cur.pos
        unpack = struct.Struct("<Q").unpack_from
        for _ in range(count):
            if pos + 8 > size:
                break
            pos += 8 + unpack(buf, pos)[0]
        else:
            if pos <= size:
                cur.pos = pos
                return GGUFArray(buf, cur.path, key, kind, count, start, pos)
        raise cur.fail(f"metadata array {key!r}: its {count} strings run past the end of the file "
                       f"({size} bytes); the file is truncated or corrupt")
    elif kind == ARRAY:
        for _ in range(count):
            _skip_array(cur, key, depth + 1)
    else:
        cur.pos += count * least
    return GGUFArray(cur.buf, cur.path, key, kind, count, start, cur.pos)


def _read_strings(buf: Any, pos: int, count: int, path: str, key: str) -> list[str]:
    """The `count` strings of a string array from `pos` (its bounds were checked when it was skipped)."""
    unpack = struct.Struct("<Q").unpack_from
    out = []
    for _ in range(count):
        n = unpack(buf, pos)[0]
        raw = buf[pos + 8:pos + 8 + n]
        pos += 8 + n
        try:
            out.append(raw.decode("utf-8"))
        except UnicodeDecodeError:
            raise CheckpointError(f"{path}: metadata array {key!r} holds a string that is not UTF-8 "
                                  f"({raw[:40]!r})") from None
    return out
