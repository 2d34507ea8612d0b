"""Load compiled kernels through cffi and launch them, splitting the thread range across cores."""
from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import cffi

from polygrad.backend_api import ProgramSpec

_pool: ThreadPoolExecutor | None = None
PARALLEL_MIN_OPS = 1 << 17


def _threads() -> int:
    return max(1, int(os.environ.get("POLY_THREADS") or os.cpu_count() or 1))


def pool() -> ThreadPoolExecutor:
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(max_workers=_threads(), thread_name_prefix="polygrad-cpu")
    return _pool


class CPUProgram:
    """A kernel in a shared object; call with host buffers (NumPy uint8 arrays)."""

    def __init__(self, spec: ProgramSpec, path: str):
        self.spec = spec
        self.ffi = cffi.FFI()
        params = ", ".join(["void*"] * len(spec.globals) + ["int", "int"])
        self.ffi.cdef(f"void {spec.name}({params});")
        self.lib = self.ffi.dlopen(path)
        self.fn = getattr(self.lib, spec.name)
        self.size = spec.thread_size
        work = spec.ops + spec.mem_bytes
        self.split = self.size > 1 and _threads() > 1 and work >= PARALLEL_MIN_OPS
        self.ptr_cache: dict[int, Any] = {}

    def _ptr(self, arr: Any) -> Any:
        addr = arr.ctypes.data
        p = self.ptr_cache.get(addr)
        if p is None:
            if len(self.ptr_cache) > 4096:
                self.ptr_cache.clear()
            p = self.ptr_cache[addr] = self.ffi.cast("void*", addr)
        return p

    def __call__(self, buffers: list[Any], var_vals: tuple[int, ...] = (), timing: bool = False) -> float | None:
        args = [self._ptr(b) for b in buffers]
        t0 = time.perf_counter() if timing else 0.0
        if not self.split:
            self.fn(*args, 0, max(self.size, 1))
        else:
            n = _threads()
            step = -(-self.size // n)
            chunks = [(i, min(i + step, self.size)) for i in range(0, self.size, step)]
            futures = [pool().submit(self.fn, *args, lo, hi) for lo, hi in chunks[1:]]
            self.fn(*args, *chunks[0])
            for f in futures:
                f.result()
        return time.perf_counter() - t0 if timing else None


def load_program(spec: ProgramSpec, path: str) -> CPUProgram:
    return CPUProgram(spec, path)
