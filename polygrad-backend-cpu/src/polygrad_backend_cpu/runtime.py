"""Load compiled kernels and launch them through cffi, one call per THREAD index.

One FFI instance serves every kernel: each shared object is opened with ctypes only to find the
symbol's address, which is cast to a cffi function pointer of the kernel's signature (pointers, the
integer variables, and the thread index when the lowering gave the kernel a THREAD axis). Buffer
pointers are cached on the host allocations, so a launch does no address lookups. cffi releases the
GIL during the call, so the pool's workers run the other thread indices in parallel.

A program owns its shared object: when the CPUProgram is garbage (polygrad.collect() dropped the
program cache and no captured graph or schedule holds it), the object is closed (dlclose) and its
mappings go away. Nothing else may keep the function pointer.
"""
from __future__ import annotations

import _ctypes
import ctypes
import os
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import cffi

from polygrad.backend_api import CompileError, ProgramSpec

FFI = cffi.FFI()
_fn_types: dict[int, Any] = {}
loaded = {"open": 0}  # shared objects currently open (tests read it)
_pool: ThreadPoolExecutor | None = None


def _threads() -> int:
    return max(1, int(os.environ.get("POLY_THREADS") or os.cpu_count() or 1))


def pool() -> ThreadPoolExecutor:
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(max_workers=_threads(), thread_name_prefix="polygrad-cpu")
    return _pool


def _fn_type(n_buffers: int, var_types: tuple[str, ...], threaded: bool) -> Any:
    key = (n_buffers, var_types, threaded)
    t = _fn_types.get(key)
    if t is None:
        params = ", ".join(["void*"] * n_buffers + list(var_types) + (["int"] if threaded else [])) or "void"
        t = _fn_types[key] = FFI.typeof(f"void(*)({params})")
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
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            raise CompileError(f"could not load kernel {spec.name} from {path}: {e}; delete that file (or the "
                               "POLY_CACHE_DIR folder) to have it compiled again") from e
        loaded["open"] += 1
        weakref.finalize(self, _close, lib._handle).atexit = False  # the process exit unmaps it anyway
        try:
            addr = ctypes.cast(getattr(lib, spec.name), ctypes.c_void_p).value
        except AttributeError as e:
            raise CompileError(f"{path} has no function {spec.name}; it is not the kernel's shared object: delete "
                               "it (or the POLY_CACHE_DIR folder) to have it compiled again") from e
        var_types = tuple("long long" if v.dtype.itemsize == 8 else "int" for v in spec.vars)
        self.threads = spec.threads
        self.fn = FFI.cast(_fn_type(len(spec.globals), var_types, self.threads > 1), addr)

    def __call__(self, buffers: list[Any], var_vals: tuple[int, ...] = (), timing: bool = False) -> float | None:
        args = [pointer(b) for b in buffers]
        args.extend(var_vals)
        t0 = time.perf_counter() if timing else 0.0
        if self.threads == 1:
            self.fn(*args)
        else:
            futures = [pool().submit(self.fn, *args, t) for t in range(1, self.threads)]
            self.fn(*args, 0)
            for f in futures:
                f.result()
        return time.perf_counter() - t0 if timing else None


def _close(handle: int) -> None:
    loaded["open"] -= 1
    _ctypes.dlclose(handle)


def load_program(spec: ProgramSpec, path: str) -> CPUProgram:
    return CPUProgram(spec, path)
