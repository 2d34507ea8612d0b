"""Load compiled kernels and launch them through cffi, one call per THREAD index.

One FFI instance serves every kernel: each shared object is opened with ctypes only to find the
symbol's address, which is cast to a cffi function pointer of the kernel's signature (pointers, the
integer variables, and the thread index when the lowering gave the kernel a THREAD axis). Buffer
pointers are cached on the host allocations, so a launch does no address lookups. cffi releases the
GIL during the call, so the pool's workers run the other thread indices in parallel.
"""
from __future__ import annotations

import ctypes
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import _cffi_backend
import cffi

from polygrad.backend_api import ProgramSpec
from polygrad_backend_cpu.compiler import symbol_names

FFI = cffi.FFI()
_fn_types: dict[int, Any] = {}
_libs: list[Any] = []  # keep shared objects loaded for the life of the process
_pool: ThreadPoolExecutor | None = None


def _threads() -> int:
    return max(1, int(os.environ.get("POLY_THREADS") or os.cpu_count() or 1))


def pool() -> ThreadPoolExecutor:
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(max_workers=_threads(), thread_name_prefix="polygrad-cpu")
    return _pool


try:  # the pointer type without parsing "void*" (the first parse of any C text costs milliseconds)
    _VOID_P: Any = _cffi_backend.new_pointer_type(_cffi_backend.new_void_type())
except AttributeError:
    _VOID_P = "void*"


def _fn_type(n_buffers: int, var_types: tuple[str, ...], threaded: bool) -> Any:
    key = (n_buffers, var_types, threaded)
    t = _fn_types.get(key)
    if t is None:
        names = ["void*"] * n_buffers + list(var_types) + (["int"] if threaded else [])
        try:  # built from cffi's type constructors: parsing C text costs ~0.5 ms a signature (3 ms the first)
            void = _cffi_backend.new_void_type()
            params = tuple(_cffi_backend.new_pointer_type(void) if n == "void*" else
                           _cffi_backend.new_primitive_type(n) for n in names)
            t = _cffi_backend.new_function_type(params, void, False)
        except (AttributeError, TypeError, KeyError):
            t = FFI.typeof(f"void(*)({', '.join(names) or 'void'})")
        _fn_types[key] = t
    return t


def pointer(handle: Any) -> Any:
    p = handle.ptr
    if p is None:
        p = handle.ptr = FFI.cast(_VOID_P, handle.addr)
    return p


class CPUProgram:
    """A kernel in a shared object; call with host buffers (backend_api.HostMemory)."""

    def __init__(self, spec: ProgramSpec, path: str):
        self.spec = spec
        lib = ctypes.CDLL(path)
        _libs.append(lib)
        renamed, plain = symbol_names(spec.name, path)
        fn = getattr(lib, renamed, None) or getattr(lib, plain)
        addr = ctypes.cast(fn, ctypes.c_void_p).value
        var_types = tuple("long long" if v.dtype.itemsize == 8 else "int" for v in spec.vars)
        self.threads = spec.threads
        self.fn = FFI.cast(_fn_type(len(spec.globals), var_types, self.threads > 1), addr)

    def __call__(self, buffers: list[Any], var_vals: tuple[int, ...] = (), timing: bool = False) -> float | None:
        args = [b.ptr if b.ptr is not None else pointer(b) for b in buffers]
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


def load_program(spec: ProgramSpec, path: str) -> CPUProgram:
    return CPUProgram(spec, path)
