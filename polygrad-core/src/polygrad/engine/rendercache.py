"""Lowered and rendered kernels kept on disk, so a warm process never lowers or renders again.

Stage: execution support (between the scheduler's kernel and the device compiler). Input: a
device-independent kernel AST, the device, its opened DeviceImpl and the opts chosen for it. Output:
the `ProgramSpec` and the source that `lower` and `DeviceImpl.render` made of them in an earlier
process, or None; `store` writes them for the next one.

Lowering and rendering cost milliseconds a kernel (a register-tiled matmul the most), which dominated
a first call whose compiled programs were already on disk. An entry lives under
POLY_CACHE_DIR/rendered/<device>/<key>.json in the checked entry format of `polygrad.diskcache`
(length and sha256 trailer: a corrupt file is discarded with a warning and the kernel is lowered
again). The key hashes everything the output depends on:
- the kernel's full structure (`search.kernel_key`) and the device name;
- the device's `Capabilities` (vector width, threads, registers, FMA...) in a stable spelling;
- the opts (`choose_opts`: BEAM's choice, or None for the heuristics) and NOOPT;
- the code that lowers and renders: the path, size and modification time of every Python file of
  polygrad core and of the device's backend package (as Python's own bytecode cache checks a
  source), taken once per process, so an edited or upgraded polygrad never reads an old entry.
Only devices whose `DeviceImpl.render_cacheable` says their render is a function of the spec alone
(the CPU backend) use it. The spec's lowered AST, variables and symbolic sizes are stored with
`uop/serialize.py` (reading evaluates no code and gives back the same hash-consed UOps); a kernel that
cannot be serialised is simply not cached.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
from typing import Any

from polygrad import config
from polygrad.codegen.opts import Opt, OptKind
from polygrad.codegen.search import kernel_key
from polygrad.contract import GlobalArg, ProgramSpec
from polygrad.diskcache import cache_dir, read_entry, write_entry
from polygrad.dtype import DType
from polygrad.uop import serialize
from polygrad.uop.ops import UOp

FORMAT = "polygrad-rendered-1"
_signatures: dict[str, str] = {}  # backend module -> code signature (polygrad core + that package)
stats = {"hits": 0, "misses": 0, "stored": 0}  # tests read them


def code_signature(module: str) -> str:
    """A hash of (path, size, mtime) of every .py file of polygrad core and of `module`'s top package,
    computed once per process."""
    sig = _signatures.get(module)
    if sig is None:
        h = hashlib.sha256()
        roots = {_package_dir("polygrad"), _package_dir(module.split(".")[0])}
        for root in sorted(r for r in roots if r):
            for path, size, mtime in _python_files(root):
                h.update(f"{path}|{size}|{mtime}\n".encode())
        sig = _signatures[module] = h.hexdigest()
    return sig


def _package_dir(name: str) -> str | None:
    mod = sys.modules.get(name)
    path = getattr(mod, "__file__", None)
    return os.path.dirname(os.path.abspath(path)) if path else None


def _python_files(root: str) -> list[tuple[str, int, int]]:
    out = []
    stack = [root]
    while stack:
        folder = stack.pop()
        try:
            with os.scandir(folder) as entries:
                for e in entries:
                    if e.name.endswith(".py"):
                        st = e.stat()
                        out.append((e.path, st.st_size, st.st_mtime_ns))
                    elif e.name != "__pycache__" and e.is_dir():
                        stack.append(e.path)
        except OSError:
            out.append((folder, -1, -1))
    return sorted(out)


def _stable(caps: Any) -> str:
    """Capabilities in a spelling that does not depend on the process (sets are sorted)."""
    if not dataclasses.is_dataclass(caps):
        return repr(caps)
    parts = []
    for f in dataclasses.fields(caps):
        v = getattr(caps, f.name)
        parts.append(f"{f.name}={sorted(map(repr, v)) if isinstance(v, (set, frozenset)) else repr(v)}")
    return ",".join(parts)


def key(ast: UOp, device: str, impl: Any, opts: list[Opt] | None) -> str:
    """The entry name for `ast` lowered with `opts` and rendered for `device`."""
    module = getattr(impl.render, "__module__", None) or type(impl.render).__module__
    parts = (FORMAT, kernel_key(ast, device, 0), device, _stable(impl.capabilities),
             repr(None if opts is None else [(o.kind.value, o.axis, o.amount) for o in opts]),
             f"NOOPT={config.get('NOOPT')}", code_signature(module))
    if config.get("POLY_ALLOW_TF32"):  # the heuristics (opts None) then choose TF32 tensor cores
        parts += ("POLY_ALLOW_TF32=1",)
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:40]


def _path(device: str, name: str) -> str:
    safe = "".join(c if c.isalnum() else "_" for c in device)
    return os.path.join(cache_dir("rendered", safe), f"{name}.json")


def load(device: str, name: str) -> tuple[ProgramSpec, str] | None:
    """The (spec, source) stored under `name`, or None (missing, corrupt, or of another layout)."""
    data = read_entry(_path(device, name))
    if data is None:
        stats["misses"] += 1
        return None
    try:
        obj = json.loads(data)
        spec = _decode_spec(obj["spec"])
        source = obj["source"]
        if not isinstance(source, str):
            raise TypeError("source")
    except (ValueError, KeyError, TypeError, IndexError, serialize.KernelFormatError):
        stats["misses"] += 1
        return None  # a well-formed entry of another layout: lowered again and overwritten
    stats["hits"] += 1
    return spec, source


def store(device: str, name: str, spec: ProgramSpec, source: Any) -> None:
    """Keep (spec, source) under `name`; a kernel that cannot be serialised, or a source that is not
    text, is skipped, and so is a cache folder that cannot be written."""
    if not isinstance(source, str):
        return
    try:
        blob = json.dumps({"format": FORMAT, "spec": _encode_spec(spec), "source": source}).encode()
    except (serialize.KernelFormatError, TypeError, ValueError):
        return
    try:
        write_entry(_path(device, name), blob)
    except OSError:
        return
    stats["stored"] += 1


def _encode_spec(spec: ProgramSpec) -> dict:
    sym = [g.size for g in spec.globals if isinstance(g.size, UOp)]
    graph = serialize.encode([spec.ast, *spec.vars, *sym])
    sizes, k = [], 1 + len(spec.vars)
    for g in spec.globals:
        if isinstance(g.size, UOp):
            sizes.append(["uop", k])
            k += 1
        else:
            sizes.append(["int", int(g.size)])
    return {"name": spec.name, "graph": graph, "n_vars": len(spec.vars),
            "globals": [[g.slot, serialize.DTYPE_NAMES[g.dtype], size, g.written]
                        for g, size in zip(spec.globals, sizes)],
            "ops": spec.ops, "mem_bytes": spec.mem_bytes, "threads": spec.threads,
            "vector_width": spec.vector_width,
            "opts": [[_opt_tuple(o)[0], _opt_tuple(o)[1], _opt_tuple(o)[2]] for o in spec.opts]}


def _opt_tuple(o: Any) -> tuple[str, int, int]:
    if not isinstance(o, Opt):
        raise TypeError(f"spec opt {o!r} is not an Opt")
    return (o.kind.value, int(o.axis), int(o.amount))


def _decode_spec(obj: dict) -> ProgramSpec:
    roots = serialize.decode(obj["graph"])
    n_vars = obj["n_vars"]
    ast, variables = roots[0], tuple(roots[1:1 + n_vars])
    params = []
    for slot, dtype_name, (kind, size), written in obj["globals"]:
        dtype: DType = serialize.DTYPES_BY_NAME[dtype_name]
        params.append(GlobalArg(int(slot), dtype, roots[size] if kind == "uop" else int(size), bool(written)))
    opts = tuple(Opt(OptKind(k), int(a), int(n)) for k, a, n in obj["opts"])
    return ProgramSpec(name=str(obj["name"]), ast=ast, globals=tuple(params), ops=int(obj["ops"]),
                       mem_bytes=int(obj["mem_bytes"]), opts=opts, vars=variables, threads=int(obj["threads"]),
                       vector_width=int(obj["vector_width"]))
