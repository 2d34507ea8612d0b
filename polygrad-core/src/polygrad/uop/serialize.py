"""A serialised, versioned form of kernel IR: `dumps(ast) -> bytes`, `loads(data) -> UOp`.

Stage: shared. Input: a kernel SINK, normally in a bundle's stored form (`model/format.stored_kernel`:
the scheduler's output with transcendentals decomposed, index-simplified, before device
optimisation), though any UOp graph whose args are of the kinds below can be written. Output: UTF-8
JSON bytes, and back the very same hash-consed UOp
(`loads(dumps(x)) is x`). The form is meant for golden files, caches and other implementations of the
IR (see docs/kernel-ir.md, "Serialised form"):

    {"format": "polygrad-kernel", "version": 1,
     "nodes": [[op, dtype, [src indices], arg], ...],   # sources before users
     "roots": [index, ...]}

Ops and dtypes are written by name ("ADD", "float32"), never by enum number, so the numbering in
ops.py can change without breaking stored kernels. Args carry explicit tags (see `encode_arg`) so that
int / float / bool / str / tuple / None / KernelInfo / Ops / DType / AxisKind come back exactly, floats bit for
bit (-0.0, NaN payloads, infinities). Reading never evaluates code: it is plain `json` plus table
look-ups, and anything unexpected raises `KernelFormatError` saying what is wrong. Both directions
are iterative over the node list, so a graph of any depth is fine.
"""
from __future__ import annotations

import json
import struct
from typing import Any, Iterable

from polygrad.definitions import bundle as bundle_format
from polygrad.definitions import dtypes as dtype_table
from polygrad.dtype import DType, dtypes
from polygrad.errors import PolygradError
from polygrad.limits import MAX_ARG_DEPTH, MAX_NODES
from polygrad.uop.ops import AxisKind, KernelInfo, Ops, UOp

FORMAT = bundle_format.KERNEL_FORMAT
VERSION = bundle_format.KERNEL_VERSION  # writers use 1 unless a ["uop", index] arg needs 2
SUPPORTED_VERSIONS = bundle_format.KERNEL_SUPPORTED_VERSIONS

# language-neutral dtype names (width explicit; polygrad/definitions/dtypes.py); DType.name is the C-ish "float"
DTYPE_NAMES: dict[DType, str] = {getattr(dtypes, name): name for name in dtype_table.NAMES}
DTYPES_BY_NAME: dict[str, DType] = {v: k for k, v in DTYPE_NAMES.items()}


class KernelFormatError(PolygradError, ValueError):
    """Serialised kernel data that cannot be read (or a graph that cannot be written)."""


def json_int(v: Any) -> int | None:
    """A JSON number with an integral value as an int (`5`, `5.0`, `5e0` alike: JSON has one number type,
    and JavaScript's reader cannot tell them apart), else None; a boolean is never an integer.

    >>> json_int(5), json_int(5.0), json_int(5.5), json_int(True)
    (5, 5, None, None)
    """
    if type(v) is int:
        return v
    if type(v) is float and v.is_integer():
        return int(v)
    return None


# ---------------------------------------------------------------------------------------------------
# args


def _float_bits(x: float) -> str:
    return struct.pack(">d", x).hex()


def encode_arg(arg: Any, depth: int = 0, refs: dict[UOp, int] | None = None) -> Any:
    """A UOp arg as tagged JSON. None is `null`; everything else is `[tag, payload]`:

    ["int", 5]                       any Python int (JSON integers are unbounded)
    ["float", "3ff0000000000000"]    the IEEE float64 bits, big-endian hex (16 digits)
    ["bool", true]   ["str", "global"]   ["tuple", [arg, ...]]
    ["op", "ADD"]    ["dtype", "float32"]    ["axis_kind", "global"]   (a RANGE's AxisKind, by value)
    ["kernel_info", {"name": "E_4", "opts": arg}]   (opts is itself an encoded tuple)
    ["uop", 3]       a UOp (a symbolic size such as batch*16), by the index of an earlier node (version 2)
    """
    if depth > MAX_ARG_DEPTH:
        raise KernelFormatError(f"arg nested deeper than {MAX_ARG_DEPTH} levels; kernel args are flat tuples")
    if arg is None:
        return None
    t = type(arg)
    if t is bool:
        return ["bool", arg]
    if t is int:
        return ["int", arg]
    if t is float:
        return ["float", _float_bits(arg)]
    if t is str:
        return ["str", arg]
    if t is tuple:
        return ["tuple", [encode_arg(a, depth + 1, refs) for a in arg]]
    if t is Ops:
        return ["op", arg.name]
    if t is DType:
        return ["dtype", DTYPE_NAMES[arg]]
    if t is AxisKind:
        return ["axis_kind", arg.value]
    if t is KernelInfo:
        if type(arg.name) is not str or type(arg.opts) is not tuple:
            raise KernelFormatError(f"KernelInfo needs a str name and a tuple of opts, got {arg!r}")
        return ["kernel_info", {"name": arg.name, "opts": encode_arg(arg.opts, depth + 1)}]
    if t is UOp and refs is not None and arg in refs:
        return ["uop", refs[arg]]
    raise KernelFormatError(
        f"cannot serialise a UOp arg of type {t.__name__} ({arg!r:.80}); only None, bool, int, float, str, tuple, "
        "Ops, DType, AxisKind and KernelInfo are part of the kernel form. Serialise kernel IR (a scheduled SINK), "
        "not a tensor graph holding buffers")


def decode_arg(obj: Any, where: str = "arg", depth: int = 0, built: list[UOp] | None = None) -> Any:
    """The inverse of `encode_arg`; raises KernelFormatError on anything it does not know."""
    if depth > MAX_ARG_DEPTH:
        raise KernelFormatError(f"{where}: nested deeper than {MAX_ARG_DEPTH} levels")
    if obj is None:
        return None
    if type(obj) is not list or len(obj) != 2 or type(obj[0]) is not str:
        raise KernelFormatError(f"{where}: expected null or a [tag, payload] pair, got {obj!r:.80}")
    tag, val = obj
    if tag == "int":
        if json_int(val) is None:
            raise KernelFormatError(f"{where}: an int arg needs a JSON integer, got {val!r:.40}")
        return json_int(val)
    if tag == "float":
        if type(val) is not str or len(val) != 16:
            raise KernelFormatError(f"{where}: a float arg is 16 hex digits of float64 bits, got {val!r:.40}")
        try:
            return struct.unpack(">d", bytes.fromhex(val))[0]
        except ValueError as e:
            raise KernelFormatError(f"{where}: bad float bits {val!r}: {e}") from None
    if tag == "bool":
        if type(val) is not bool:
            raise KernelFormatError(f"{where}: a bool arg needs true or false, got {val!r:.40}")
        return val
    if tag == "str":
        if type(val) is not str:
            raise KernelFormatError(f"{where}: a str arg needs a JSON string, got {val!r:.40}")
        return val
    if tag == "tuple":
        if type(val) is not list:
            raise KernelFormatError(f"{where}: a tuple arg needs a JSON list, got {val!r:.40}")
        return tuple(decode_arg(v, f"{where}[{i}]", depth + 1, built) for i, v in enumerate(val))
    if tag == "uop":
        val = json_int(val)
        if built is None or val is None or not 0 <= val < len(built):
            n = len(built) if built is not None else 0
            raise KernelFormatError(f"{where}: a uop arg needs the index of an earlier node (0..{n - 1}), "
                                    f"got {val!r:.20}")
        return built[val]
    if tag == "op":
        return _op_named(val, where)
    if tag == "dtype":
        return _dtype_named(val, where)
    if tag == "axis_kind":
        kind = AxisKind._value2member_map_.get(val) if type(val) is str else None
        if kind is None:
            known = ", ".join(k.value for k in AxisKind)
            raise KernelFormatError(f"{where}: unknown axis kind {val!r:.40}; use one of {known}")
        return kind
    if tag == "kernel_info":
        if type(val) is not dict or set(val) != {"name", "opts"} or type(val["name"]) is not str:
            raise KernelFormatError(f"{where}: kernel_info needs exactly {{'name': str, 'opts': tuple}}, "
                                    f"got {val!r:.80}")
        opts = decode_arg(val["opts"], f"{where}.opts", depth + 1)
        if type(opts) is not tuple:
            raise KernelFormatError(f"{where}: kernel_info opts must be a tuple arg, got {opts!r:.40}")
        return KernelInfo(name=val["name"], opts=opts)
    raise KernelFormatError(f"{where}: unknown arg tag {tag!r}; known tags are int, float, bool, str, tuple, op, "
                            f"dtype, axis_kind, kernel_info (format version {VERSION}). Data from a newer polygrad "
                            "needs a newer reader")


def _op_named(name: Any, where: str) -> Ops:
    op = Ops.__members__.get(name) if type(name) is str else None
    if op is None:
        raise KernelFormatError(f"{where}: unknown op {name!r:.40}; this polygrad knows "
                                f"{', '.join(Ops.__members__)}. Upgrade polygrad or regenerate the file")
    return op


def _dtype_named(name: Any, where: str) -> DType:
    dt = DTYPES_BY_NAME.get(name) if type(name) is str else None
    if dt is None:
        raise KernelFormatError(f"{where}: unknown dtype {name!r:.40}; use one of {', '.join(DTYPES_BY_NAME)}")
    return dt


# ---------------------------------------------------------------------------------------------------
# graphs


def encode(asts: UOp | Iterable[UOp]) -> dict:
    """The JSON object (a dict) for one UOp or a list of them sharing one node table."""
    roots = [asts] if isinstance(asts, UOp) else list(asts)
    for r in roots:
        if not isinstance(r, UOp):
            raise KernelFormatError(f"can only serialise UOps, got {type(r).__name__}")
    index: dict[UOp, int] = {}
    nodes: list[list] = []
    uses_refs = False

    def add(root: UOp) -> None:
        nonlocal uses_refs
        for n in root.toposort():  # iterative, sources first
            if n in index:
                continue
            inner = [u for u in _arg_uops(n.arg) if u not in index]
            for u in inner:  # symbolic sizes in args (shallow) are listed before the node using them
                add(u)
            uses_refs |= bool(_arg_uops(n.arg))
            if n.dtype is not None and n.dtype not in DTYPE_NAMES:
                raise KernelFormatError(f"{n.op.name} node has dtype {n.dtype!r}, which has no serialised name")
            try:
                arg = encode_arg(n.arg, refs=index)
            except KernelFormatError as e:
                raise KernelFormatError(f"{n.op.name} node (#{len(nodes)}): {e}") from None
            index[n] = len(nodes)
            nodes.append([n.op.name, DTYPE_NAMES[n.dtype] if n.dtype is not None else None,
                          [index[s] for s in n.src], arg])

    for root in roots:
        if root not in index:
            add(root)
    return {"format": FORMAT, "version": 2 if uses_refs else 1, "nodes": nodes, "roots": [index[r] for r in roots]}


def _arg_uops(arg: Any) -> list[UOp]:
    if isinstance(arg, UOp):
        return [arg]
    if type(arg) is tuple:
        return [u for a in arg for u in _arg_uops(a)]
    return []


def decode(obj: Any, max_nodes: int = MAX_NODES) -> list[UOp]:
    """The roots of an `encode` object, as hash-consed UOps (the same objects, if they are alive).

    More than `max_nodes` nodes or roots are refused before any node is built."""
    if type(obj) is not dict:
        raise KernelFormatError(f"serialised kernel must be a JSON object, got {type(obj).__name__}")
    fmt = obj.get("format")
    if fmt != FORMAT:
        raise KernelFormatError(f"not a polygrad kernel: format is {fmt!r:.40}, expected {FORMAT!r}")
    version = json_int(obj.get("version"))
    if version is None:
        raise KernelFormatError(f"serialised kernel has no integer 'version' (got {version!r:.40}); the file is "
                                "damaged or not written by polygrad.uop.serialize")
    if version not in SUPPORTED_VERSIONS:
        newer = version > max(SUPPORTED_VERSIONS)
        raise KernelFormatError(
            f"serialised kernel is format version {version}; this polygrad reads versions "
            f"{', '.join(map(str, SUPPORTED_VERSIONS))}. "
            + ("Upgrade polygrad to read it." if newer else "Regenerate it with this polygrad."))
    extra = set(obj) - set(bundle_format.KERNEL_FIELDS)
    if extra:
        raise KernelFormatError(f"serialised kernel has unknown fields {sorted(extra)} for version {version}")
    nodes, roots = obj.get("nodes"), obj.get("roots")
    if type(nodes) is not list or type(roots) is not list:
        raise KernelFormatError("serialised kernel needs a 'nodes' list and a 'roots' list")
    if len(nodes) > max_nodes or len(roots) > max_nodes:
        raise KernelFormatError(f"serialised kernel has {len(nodes)} nodes and {len(roots)} roots; the limit is "
                                f"{max_nodes} (generated kernel tables have thousands)")
    built: list[UOp] = []
    for i, node in enumerate(nodes):
        where = f"node #{i}"
        if type(node) is not list or len(node) != 4:
            raise KernelFormatError(f"{where}: expected [op, dtype, [src indices], arg], got {node!r:.80}")
        op_name, dt_name, src, arg = node
        op = _op_named(op_name, where)
        dtype = None if dt_name is None else _dtype_named(dt_name, where)
        if type(src) is not list:
            raise KernelFormatError(f"{where}: src must be a list of node indices, got {src!r:.40}")
        src = [json_int(s) for s in src]
        for s in src:
            if s is None or not 0 <= s < i:
                raise KernelFormatError(f"{where}: src index {s!r:.20} is not an earlier node (0..{i - 1}); nodes "
                                        "must be listed sources first")
        value = decode_arg(arg, f"{where} ({op_name}) arg", built=built if version >= 2 else None)
        built.append(UOp(op, dtype, tuple(built[s] for s in src), value))
    out = []
    for r in map(json_int, roots):
        if r is None or not 0 <= r < len(built):
            raise KernelFormatError(f"root {r!r:.20} is not a node index (0..{len(built) - 1})")
        out.append(built[r])
    return out


def _no_constants(name: str) -> Any:
    raise KernelFormatError(f"JSON constant {name} is not allowed in a serialised kernel (floats are stored as bits)")


def _parse(data: bytes | str) -> Any:
    if isinstance(data, (bytes, bytearray, memoryview)):
        try:
            data = bytes(data).decode("utf-8")
        except UnicodeDecodeError as e:
            raise KernelFormatError(f"serialised kernel is not UTF-8 text ({e}); pass the bytes dumps() wrote") \
                from None
    elif not isinstance(data, str):
        raise KernelFormatError(f"loads() takes bytes or str, got {type(data).__name__}")
    try:
        return json.loads(data, parse_constant=_no_constants)
    except json.JSONDecodeError as e:
        raise KernelFormatError(f"serialised kernel is not valid JSON ({e}); the data is truncated or damaged, "
                                "write it again with polygrad.uop.serialize.dumps") from None
    except RecursionError:
        raise KernelFormatError("serialised kernel nests JSON too deeply; the data is damaged") from None


def _to_bytes(obj: dict) -> bytes:
    # deterministic: fixed key order, no whitespace, ASCII only
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def dumps(ast: UOp) -> bytes:
    """One UOp graph (normally a kernel SINK) as deterministic UTF-8 JSON bytes."""
    if not isinstance(ast, UOp):
        raise KernelFormatError(f"dumps() takes a UOp, got {type(ast).__name__}; use dumps_many for a list")
    return _to_bytes(encode(ast))


def loads(data: bytes | str) -> UOp:
    """The UOp `dumps` wrote: the same hash-consed object when that UOp is alive."""
    roots = decode(_parse(data))
    if len(roots) != 1:
        raise KernelFormatError(f"loads() expects one root, the data holds {len(roots)}; use loads_many")
    return roots[0]


def dumps_many(asts: Iterable[UOp]) -> bytes:
    """Several graphs in one bundle; shared nodes are written once."""
    return _to_bytes(encode(list(asts)))


def loads_many(data: bytes | str) -> list[UOp]:
    return decode(_parse(data))


__all__ = ["FORMAT", "VERSION", "KernelFormatError", "dumps", "loads", "dumps_many", "loads_many", "encode",
           "decode", "encode_arg", "decode_arg", "DTYPE_NAMES"]
