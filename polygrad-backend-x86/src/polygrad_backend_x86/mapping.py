"""Executable memory: code bytes mapped W^X (written while read+write, then made read+execute).

Stage: running. Input: position-independent code bytes (a kernel from emit.py, the thread pool's
routines from pool.py, the cpuid stub of cpu.py). Output: a `CodeMapping` whose `fn` is the code as a
cffi function pointer `void(const int64_t *)`. Pages are never writable and executable at once.
runtime.py and pool.py both build on it (neither imports the other for it).
"""
from __future__ import annotations

import os
import weakref

import cffi

FFI = cffi.FFI()
FFI.cdef("""
void *mmap(void *addr, size_t length, int prot, int flags, int fd, long offset);
int mprotect(void *addr, size_t len, int prot);
int munmap(void *addr, size_t length);
""")
_LIBC = FFI.dlopen(None)
PROT_READ, PROT_WRITE, PROT_EXEC = 1, 2, 4
MAP_PRIVATE, MAP_ANONYMOUS = 0x02, (0x1000 if os.uname().sysname == "Darwin" else 0x20)
KERNEL_TYPE = FFI.typeof("void(*)(const int64_t *)")


class ExecError(OSError):
    """Executable memory could not be mapped (a hardened kernel, SELinux execmem, ...)."""


class CodeMapping:
    """Code bytes in their own read+execute pages; unmapped when the object is garbage (never where
    `permanent`: the thread pool's routines, which its workers run until the process ends)."""

    def __init__(self, code: bytes, permanent: bool = False):
        self.size = max(len(code), 1)
        addr = _LIBC.mmap(FFI.NULL, self.size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
        if int(FFI.cast("intptr_t", addr)) in (-1, 0):
            raise ExecError(f"mmap of {self.size} bytes failed (errno {FFI.errno})")
        FFI.memmove(addr, code, len(code))
        if _LIBC.mprotect(addr, self.size, PROT_READ | PROT_EXEC) != 0:
            _LIBC.munmap(addr, self.size)
            raise ExecError(f"mprotect(PROT_READ|PROT_EXEC) failed (errno {FFI.errno}): this system does not "
                            "allow executable memory; use DEV=CPU or DEV=INTERP")
        self.addr = int(FFI.cast("uintptr_t", addr))
        self.fn = FFI.cast(KERNEL_TYPE, addr)
        if not permanent:
            weakref.finalize(self, _LIBC.munmap, addr, self.size)
