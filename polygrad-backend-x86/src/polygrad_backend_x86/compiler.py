"""Kernel source and machine code for the X86 device, with the code cached in memory and on disk.

Stage: rendering and compiling. `render(spec)` linearizes the kernel (with the ISA's vector lanes) and
returns an `X86Source`; its text (`str()`, what POLY_DUMP_KERNELS prints) is the disassembly of the
code. `compile(source)` returns the `Kernel` (code bytes, constant-pool size, libm functions used):
from memory, from `POLY_CACHE_DIR/x86/<key>.bin` (a checked entry of polygrad.diskcache), or by
running expand -> allocate -> emit. The key is a hash of the linear program's listing, the ISA tier
and features, and the emitter version, so a cached file never serves another CPU's code. A kernel
whose vector instructions the emitter cannot encode is emitted again from the scalar linearization.
"""
from __future__ import annotations

import hashlib
import inspect
import json
import os
from typing import Any

from polygrad.backend_api import (CompileError, LinearProgram, cache_dir, linearize, read_entry, simplify_linear,
                                  write_entry)

from polygrad_backend_x86.asm import disassemble
from polygrad_backend_x86.cpu import Isa
from polygrad_backend_x86.emit import Kernel, VectorUnsupported
from polygrad_backend_x86.expand import expand
from polygrad_backend_x86.regalloc import allocate
from polygrad_backend_x86.vector import VectorEmitter



def _emitter_version() -> str:
    """A hash of the code generator's own source and of core's linear passes it runs first: a changed
    emitter never reads old cached code."""
    h = hashlib.sha256()
    here = os.path.dirname(os.path.abspath(__file__))
    names = ("arith.py", "asm.py", "compiler.py", "emit.py", "expand.py", "halves.py", "regalloc.py", "vector.py")
    for path in [os.path.join(here, name) for name in names] + [inspect.getfile(simplify_linear)]:
        try:
            with open(path, "rb") as f:
                h.update(f.read())
        except OSError:
            h.update(os.path.basename(path).encode())
    return h.hexdigest()[:16]


EMITTER_VERSION = _emitter_version()


def cache_root() -> str:
    """POLY_CACHE_DIR/x86 (or the temporary folder used instead when that cannot be written)."""
    return cache_dir("x86")


def vector_lanes(spec: Any, isa: Isa) -> int:
    """float32-equivalent lanes for this kernel: one vector register must hold its widest element type."""
    width = getattr(spec, "vector_width", 1)
    if isa.lanes <= 1 or width <= 1:
        return 1
    widest = max((u.dtype.itemsize for u in spec.ast.toposort() if u.dtype is not None), default=4)
    return max(1, min(width, isa.lanes, isa.vec_bits // 8 // max(widest, 4)))


def emit_program(prog: LinearProgram, isa: Isa) -> Kernel:
    """expand -> allocate -> emit for one linear program."""
    xprog = expand(prog)
    vec_bytes = isa.vec_bits // 8 if isa.lanes > 1 else 16
    frame = allocate(xprog, isa.vec_regs, vec_bytes, isa.high_vec_regs)
    return VectorEmitter(xprog, isa, frame, vec_bytes).run()


class X86Source:
    """What render() returns: the linear programs and the cache key; str() is the disassembly."""

    def __init__(self, spec: Any, isa: Isa):
        self.spec, self.isa = spec, isa
        lanes = vector_lanes(spec, isa)
        self.prog = linearize(spec, vector_width=lanes)
        self.scalar = lanes == 1
        text = self.prog.text()
        h = hashlib.sha256()
        for part in (EMITTER_VERSION, isa.tier, str(isa.fma), ",".join(isa.features), text):
            h.update(part.encode())
            h.update(b"\0")
        self.key = h.hexdigest()[:40]
        self._kernel: Kernel | None = None

    def kernel(self) -> Kernel:
        if self._kernel is None:
            self._kernel = load_or_emit(self)
        return self._kernel

    def emit(self) -> Kernel:
        try:
            return emit_program(self.prog, self.isa)
        except VectorUnsupported:
            if self.scalar:
                raise CompileError(f"X86 backend: kernel {self.spec.name} needs vector code it cannot emit")
            self.prog = linearize(self.spec, vector_width=1)
            self.scalar = True
            stats["scalar_fallbacks"] += 1
            return emit_program(self.prog, self.isa)

    def __str__(self) -> str:
        k = self.kernel()
        return (f"; x86-64 {self.isa.tier} kernel: {len(k.code)} bytes"
                f"{', calls ' + ', '.join(k.externs) if k.externs else ''}\n{disassemble(k.code, k.pool)}")

    def __contains__(self, text: str) -> bool:
        return text in str(self)


_memory: dict[str, Kernel] = {}
stats = {"emitted": 0, "disk_hits": 0, "scalar_fallbacks": 0}  # for tests and DEBUG


def load_or_emit(src: X86Source) -> Kernel:
    hit = _memory.get(src.key)
    if hit is not None:
        return hit
    path = os.path.join(cache_root(), f"{src.key}.bin")
    kernel = read_cached(path)
    if kernel is None:
        kernel = src.emit()
        stats["emitted"] += 1
        write_cached(path, kernel)
    else:
        stats["disk_hits"] += 1
    _memory[src.key] = kernel
    return kernel


def read_cached(path: str) -> Kernel | None:
    """The kernel of a checked cache entry (diskcache: a damaged one is discarded with a warning)."""
    data = read_entry(path)
    if data is None:
        return None
    try:
        head, code = data.split(b"\n", 1)
        meta = json.loads(head)
        if meta.get("size") != len(code):
            return None
        return Kernel(code, int(meta["pool"]), tuple(meta["externs"]))
    except (ValueError, KeyError, TypeError):
        return None  # an entry of another layout: emit again


def write_cached(path: str, kernel: Kernel) -> None:
    head = json.dumps({"size": len(kernel.code), "pool": kernel.pool, "externs": list(kernel.externs)}).encode()
    try:
        write_entry(path, head + b"\n" + kernel.code)
    except OSError:
        pass  # a read-only cache folder only costs speed


def compile_source(src: X86Source) -> Kernel:
    return src.kernel()
