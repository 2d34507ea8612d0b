"""Load compiled kernels and launch them through cffi, splitting the thread range across cores.

One FFI instance serves every kernel: each shared object is opened with ctypes only to find the
symbol's address, which is cast to a cffi function pointer of the kernel's arity. Buffer pointers are
cached on the host allocations, so a launch does no address lookups. cffi releases the GIL during the
call, so worker threads run chunks of the outermost loop in parallel. A kernel over symbolic sizes
takes one int per Variable after the buffers (spec.vars order); its thread range's length is then read
from those values on each launch.
"""
from __future__ import annotations

import ctypes
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import cffi

from polygrad.backend_api import ProgramSpec

FFI = cffi.FFI()
_fn_types: dict[int, Any] = {}
_libs: list[Any] = []  # keep shared objects loaded for the life of the process
_pool: ThreadPoolExecutor | None = None
PARALLEL_MIN_WORK = 1 << 17


def _threads() -> int:
    return max(1, int(os.environ.get("POLY_THREADS") or os.cpu_count() or 1))


def pool() -> ThreadPoolExecutor:
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(max_workers=_threads(), thread_name_prefix="polygrad-cpu")
    return _pool


def _fn_type(n_buffers: int, n_vars: int = 0) -> Any:
    t = _fn_types.get((n_buffers, n_vars))
    if t is None:
        params = ", ".join(["void*"] * n_buffers + ["int"] * n_vars + ["long long", "long long"])
        t = _fn_types[(n_buffers, n_vars)] = FFI.typeof(f"void(*)({params})")
    return t


def pointer(handle: Any) -> Any:
    p = handle.ptr
    if p is None:
        p = handle.ptr = FFI.cast("void*", handle.addr)
    return p


class CPUProgram:
    """A kernel in a shared object; call with host buffers (backend_api.HostMemory)."""

    def __init__(self, spec: ProgramSpec, path: str):
        self.spec = spec
        lib = ctypes.CDLL(path)
        _libs.append(lib)
        addr = ctypes.cast(getattr(lib, spec.name), ctypes.c_void_p).value
        self.fn = FFI.cast(_fn_type(len(spec.globals), len(spec.vars)), addr)
        self.size = spec.thread_size  # the largest, for a symbolic thread range
        end = spec.thread_range.src[0] if spec.thread_range is not None else None
        self.symbolic = end is not None and end.op.name != "CONST"
        # decide from what the kernel computes and stores, not from the size of the buffers it
        # touches: a small kernel reading a slice of a big buffer is cheaper than a thread handoff
        work = spec.ops + _stores(spec)
        self.split = self.size > 1 and _threads() > 1 and work >= PARALLEL_MIN_WORK

    def __call__(self, buffers: list[Any], var_vals: tuple[int, ...] = (), timing: bool = False) -> float | None:
        args = [pointer(b) for b in buffers]
        args.extend(var_vals)
        size = self.spec.thread_size_at(var_vals) if self.symbolic else self.size
        t0 = time.perf_counter() if timing else 0.0
        if not self.split or size <= 1:
            self.fn(*args, 0, max(size, 1))
        else:
            n = _threads()
            step = -(-size // n)
            chunks = [(i, min(i + step, size)) for i in range(0, size, step)]
            futures = [pool().submit(self.fn, *args, lo, hi) for lo, hi in chunks[1:]]
            self.fn(*args, *chunks[0])
            for f in futures:
                f.result()
        return time.perf_counter() - t0 if timing else None


def _stores(spec: ProgramSpec) -> int:
    total = 0
    for block in spec.ast.src:
        trips = 1
        for r in block.src[1:]:
            if r.op.name == "RANGE":
                end = r.src[0]
                trips *= spec.max_int(end)
        total += trips
    return total


def load_program(spec: ProgramSpec, path: str) -> CPUProgram:
    return CPUProgram(spec, path)
