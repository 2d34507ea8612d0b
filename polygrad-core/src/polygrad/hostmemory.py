"""Host memory shared by the host backends (CPU, INTERP, X86): NumPy byte arrays aligned to a cache line.

Stage: running (memory). Input: byte counts. Output: `HostMemory` handles (the array, its address, a
slot for a backend's cached foreign pointer). Backends reach it through `polygrad.backend_api`.
"""
from __future__ import annotations

from typing import Any

import numpy as np


class HostMemory:
    """A host allocation: the NumPy byte array, its address, and a slot backends may cache a
    foreign-function pointer in (so launching a kernel costs no per-call address lookups)."""

    __slots__ = ("arr", "addr", "ptr")

    def __init__(self, arr: Any):
        self.arr = arr
        self.addr = int(arr.ctypes.data)
        self.ptr: Any = None


# host buffers start on a cache line: NumPy puts a large array 16 bytes past a page, so every 64-byte vector
# access of a kernel would straddle two lines, and aligned (non-temporal) stores would be impossible
HOST_ALIGN = 64


class HostAllocator:
    """Memory from NumPy arrays, aligned to HOST_ALIGN bytes: shared by host backends (CPU, INTERP, X86)."""

    def alloc(self, nbytes: int) -> HostMemory:
        n = max(nbytes, 1)
        raw = np.empty(n + HOST_ALIGN, dtype=np.uint8)
        skip = -int(raw.ctypes.data) % HOST_ALIGN
        return HostMemory(raw[skip:skip + n])  # the view keeps the allocation alive

    def free(self, handle: Any, nbytes: int) -> None:
        pass

    def zero(self, handle: HostMemory, nbytes: int) -> None:
        handle.arr[:nbytes] = 0

    def copyin(self, handle: HostMemory, src: memoryview) -> None:
        handle.arr[: src.nbytes] = np.frombuffer(src, dtype=np.uint8)

    def copyout(self, dest: memoryview, handle: HostMemory) -> None:
        np.frombuffer(dest, dtype=np.uint8)[:] = handle.arr[: dest.nbytes]
