"""The `.pgb` bundle: a Model's signature, kernels and state in one checked, portable file.

Stage: export / import. Input (write): a manifest dict and the raw bytes of every stored buffer.
Output (read): the validated manifest, the decoded kernels and a view of each stored buffer's bytes.
The layout is specified in docs/bundle-format.md (precise enough to write another reader); in short:

    header   64 bytes: magic, format version, flags, manifest and data lengths, two CRC-32s
    manifest UTF-8 JSON, zero-padded to a multiple of 64 bytes
    data     the stored buffers, raw little-endian, each at a 64-byte aligned offset

Reading never executes anything from the file and never uses pickle: it is `struct`, `zlib.crc32`,
`json` and table look-ups. Every field is type- and range-checked before it is used, sizes and offsets
are checked against the file and against `max_bytes` before anything is allocated (the caps are in
`polygrad/limits.py`), and every problem raises `BundleError` naming the field and what was expected.
The kernels are decoded by `uop/serialize.py` and each call is checked against its buffers
(`uop/validate.py` where available).

>>> data = write({"format": FORMAT, "version": VERSION}, [])
>>> data[:8] == MAGIC, len(data) % 64
(True, 0)
"""
from __future__ import annotations

import json
import struct
import zlib
from typing import Any, Callable, Sequence

from polygrad.definitions import bundle as bundle_format
from polygrad.errors import PolygradError
from polygrad.limits import MAX_ELEMENTS, MAX_JSON_DEPTH, MAX_MANIFEST
from polygrad.uop.serialize import json_int

# the layout's names, versions and header (polygrad/definitions/bundle.py; polygrad-js's bundle.js reads the same)
MAGIC = bundle_format.MAGIC
FORMAT = bundle_format.FORMAT
VERSION = bundle_format.VERSION  # what a bundle is written as unless it needs version 2 (model/format.format_version)
SUPPORTED_VERSIONS = bundle_format.SUPPORTED_VERSIONS  # 2 adds cache buffers, Variables in any dimension, arguments
HEADER = struct.Struct(bundle_format.HEADER_FORMAT)  # magic, version, flags, manifest_len, data_len, two CRCs
ALIGN = bundle_format.ALIGN


class BundleError(PolygradError, ValueError):
    """A .pgb file that cannot be read: truncated, corrupted, another format version, or inconsistent."""


def _pad(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def write(manifest: dict, blobs: Sequence[bytes | memoryview]) -> bytes:
    """The bundle bytes: `manifest` (its buffers' "data" entries are filled in here, blob k at the k-th
    buffer whose "data" is True) and the blobs laid out at aligned offsets."""
    parts: list[bytes | memoryview] = []
    write_to(parts.append, manifest, blobs)
    return b"".join(parts)


def write_to(emit: Callable[[bytes | memoryview], Any], manifest: dict, blobs: Sequence[bytes | memoryview]) -> None:
    """`write`'s bytes handed to `emit` in order (a file's `write`): the header, the manifest, then each blob
    and its padding, never the whole file in memory at once (Model.save(path) of a model the size of the
    machine's memory)."""
    offsets, pos = [], 0
    for b in blobs:
        offsets.append(pos)
        pos = _pad(pos + len(b))
    k = 0
    for buf in manifest.get("buffers", []):
        if buf.get("data") is True:
            buf["data"] = {"offset": offsets[k], "nbytes": len(blobs[k])}
            k += 1
    if k != len(blobs):
        raise BundleError(f"internal: {len(blobs)} blobs for {k} stored buffers")
    text = json.dumps(manifest, separators=(",", ":"), allow_nan=False).encode()
    version = manifest.get("version", VERSION)
    if version not in SUPPORTED_VERSIONS:
        raise BundleError(f"internal: cannot write bundle version {version!r}")
    gaps = [(offsets[i + 1] if i + 1 < len(blobs) else pos) - offsets[i] - len(b) for i, b in enumerate(blobs)]
    crc = 0
    for b, gap in zip(blobs, gaps):
        crc = zlib.crc32(b"\0" * gap, zlib.crc32(b, crc))
    emit(HEADER.pack(MAGIC, version, 0, len(text), pos, zlib.crc32(text), crc))
    emit(text + b"\0" * (_pad(len(text)) - len(text)))
    for b, gap in zip(blobs, gaps):
        emit(b)
        if gap:
            emit(b"\0" * gap)


def read(data: bytes | bytearray | memoryview) -> tuple[dict, memoryview]:
    """(manifest, data section) of a bundle, after the header, checksum and JSON checks.

    The manifest is only parsed here; `check_manifest` validates its contents.
    """
    view = memoryview(data).cast("B") if not isinstance(data, memoryview) else data.cast("B")
    if len(view) < HEADER.size:
        raise BundleError(f"not a polygrad bundle: {len(view)} bytes is shorter than the {HEADER.size}-byte header "
                          "(truncated file?)")
    magic, version, flags, mlen, dlen, mcrc, dcrc = HEADER.unpack_from(view, 0)
    if magic != MAGIC:
        raise BundleError("not a polygrad bundle (wrong magic bytes); .pgb files are written by Model.save()")
    if version not in SUPPORTED_VERSIONS:
        raise BundleError(f"bundle format version {version} is not supported by this polygrad (it reads "
                          f"{list(SUPPORTED_VERSIONS)}); save it again with a matching polygrad")
    if flags != 0:
        raise BundleError(f"bundle header flags {flags:#x} are unknown to this reader (expected 0)")
    if mlen > MAX_MANIFEST:
        raise BundleError(f"bundle manifest length {mlen} exceeds the {MAX_MANIFEST}-byte limit")
    start = HEADER.size + _pad(mlen)
    if start + dlen != len(view):
        raise BundleError(f"bundle size mismatch: header declares {start + dlen} bytes (manifest {mlen}, data "
                          f"{dlen}), the file has {len(view)} (truncated or padded file?)")
    text = bytes(view[HEADER.size:HEADER.size + mlen])
    if zlib.crc32(text) != mcrc:
        raise BundleError("bundle manifest checksum mismatch: the file is corrupted")
    body = view[start:start + dlen]
    if zlib.crc32(body) != dcrc:
        raise BundleError("bundle data checksum mismatch: the file is corrupted")
    try:
        manifest = json.loads(text.decode("utf-8"), parse_constant=_no_constants)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise BundleError(f"bundle manifest is not valid JSON: {e}") from None
    if json_depth(manifest) > MAX_JSON_DEPTH:
        raise BundleError(f"bundle manifest nests JSON deeper than {MAX_JSON_DEPTH} levels (a damaged or crafted file)")
    if not isinstance(manifest, dict):
        raise BundleError("bundle manifest must be a JSON object")
    if manifest.get("format") != FORMAT:
        raise BundleError(f"bundle manifest format is {manifest.get('format')!r}, expected {FORMAT!r}")
    if manifest.get("version") != version:
        raise BundleError(f"bundle manifest version {manifest.get('version')!r} differs from the header's {version}")
    return manifest, body


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not allowed in a bundle manifest")


def json_depth(value: Any, limit: int = MAX_JSON_DEPTH) -> int:
    """The nesting depth of a parsed JSON value (a scalar is 0, `[]` is 1), walked level by level without
    recursion; it stops counting past `limit`.

    >>> json_depth({"a": [1, [2]]}), json_depth(3)
    (3, 0)
    """
    depth, level = 0, [value] if type(value) in (list, dict) else []
    while level and depth <= limit:
        depth += 1
        inner = []
        for v in level:
            for x in (v.values() if type(v) is dict else v):
                if type(x) is list or type(x) is dict:
                    inner.append(x)
        level = inner
    return depth


# ---------------------------------------------------------------------------------------------------
# field checks used by the manifest validation in polygrad/model/format.py


def need(cond: bool, msg: str) -> None:
    if not cond:
        raise BundleError(f"bundle manifest: {msg}")


def get(obj: Any, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    """obj[key], checked to be of `kind` (an int: any JSON number with an integral value, never a bool)."""
    need(isinstance(obj, dict), f"{where} must be an object")
    need(key in obj, f"{where} lacks {key!r}")
    v = obj[key]
    if kind in (int, (int,)):
        need(json_int(v) is not None, f"{where}.{key} must be an integer, got {type(v).__name__}")
        return json_int(v)
    ok = isinstance(v, kind)
    need(ok, f"{where}.{key} must be {_kind_name(kind)}, got {type(v).__name__}")
    return v


def get_int(obj: Any, key: str, where: str, lo: int = 0, hi: int = MAX_ELEMENTS) -> int:
    v = get(obj, key, int, where)
    need(lo <= v <= hi, f"{where}.{key} = {v} is outside [{lo}, {hi}]")
    return v


def check_int(v: Any, where: str, lo: int, hi: int) -> int:
    n = json_int(v)
    need(n is not None, f"{where} must be an integer, got {type(v).__name__}")
    need(lo <= n <= hi, f"{where} = {n} is outside [{lo}, {hi}]")
    return n


def _kind_name(kind: Any) -> str:
    names = {str: "a string", int: "an integer", list: "a list", dict: "an object", bool: "true/false",
             float: "a number"}
    if isinstance(kind, tuple):
        return " or ".join(names.get(k, k.__name__) for k in kind)
    return names.get(kind, kind.__name__)
