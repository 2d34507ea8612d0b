"""Map machine code W^X and call it through cffi (ABI mode: no compiler), one call per THREAD index.

Stage: running. Input: position-independent code bytes (emit.py) and the kernel's launch contract.
Output: a callable program. The code is mapped by mapping.py (read+write while copied in, then
read+execute: never writable and executable at once). Every kernel has the C
signature `void kernel(const int64_t *args)`; `args` holds the buffer addresses, the symbolic-size
variables, the thread index and the addresses of the libm functions the kernel calls (pow, fmod, fma:
resolved here, per process, so cached code holds no absolute address). A THREAD kernel's indices run
in parallel on pool.py's workers (machine code of our own, one foreign call per launch; cffi releases
the GIL during it), or on a Python thread pool where that pool cannot start; on as many threads as the
running thread's POLY_THREADS says at that launch (a Context applies), at most the kernel's split.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import time
from typing import Any, Callable

from polygrad.backend_api import run_split

from polygrad_backend_x86.mapping import FFI, CodeMapping
from polygrad_backend_x86.pool import shared_pool

_LIBM_CACHE: dict[str, int] = {}


def libm_address(name: str) -> int:
    """Address of a C math function (pow, powf, fmod, fmodf, fma, fmaf) in this process."""
    hit = _LIBM_CACHE.get(name)
    if hit is None:
        path = ctypes.util.find_library("m")
        lib = ctypes.CDLL(path) if path else ctypes.CDLL(None)
        hit = _LIBM_CACHE[name] = ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
    return hit


class X86Program:
    """A kernel in executable memory; call with host buffers (backend_api.HostMemory)."""

    def __init__(self, spec: Any, code: bytes, externs: tuple[str, ...]):
        self.spec = spec
        self.mapping = CodeMapping(code)
        self.fn = self.mapping.fn
        self.threads = spec.threads
        self.n_fixed = len(spec.globals) + len(spec.vars)
        self.externs = [libm_address(name) for name in externs]

    def __call__(self, buffers: list[Any], var_vals: tuple[int, ...] = (), timing: bool = False) -> float | None:
        head = [b.addr for b in buffers]
        head.extend(var_vals)
        t0 = time.perf_counter() if timing else 0.0
        if self.threads == 1:
            self.fn(FFI.new("int64_t[]", head + [0] + self.externs))
        else:
            arrays = [FFI.new("int64_t[]", head + [t] + self.externs) for t in range(self.threads)]
            native = shared_pool()
            if native is not None:
                native.launch(self.fn, self.mapping.addr, arrays)
            else:
                fn = self.fn
                run_split(lambda part: fn(arrays[part]), self.threads)
        return time.perf_counter() - t0 if timing else None

    def bind(self, buffers: list[Any], var_vals: tuple[int, ...] = ()) -> Callable[[], Any]:
        """A launcher with these buffers and values fixed: calling it (no arguments) runs the kernel with
        argument arrays built once (a JIT replay keeps one per launch and rebinds when an input changes)."""
        head = [b.addr for b in buffers] + list(var_vals)
        if self.threads == 1:
            return functools.partial(self.fn, FFI.new("int64_t[]", head + [0] + self.externs))
        native = shared_pool()
        if native is None:
            return functools.partial(self, list(buffers), tuple(var_vals))
        arrays = [FFI.new("int64_t[]", head + [t] + self.externs) for t in range(self.threads)]
        return native.bound(self.fn, self.mapping.addr, arrays)
