"""Host memory shared by the host backends (CPU, INTERP, X86): NumPy byte arrays aligned to a cache line.

Stage: running (memory). Input: byte counts. Output: `HostMemory` handles (the array, its address, a
slot for a backend's cached foreign pointer). Backends reach it through `polygrad.backend_api`.

An allocation of MAP_BYTES or more is its own anonymous memory map (page-aligned, zero pages from the
kernel, huge pages asked for from HUGE_BYTES): it goes back to the system when its last view dies. From
the C heap (NumPy's malloc), freed buffers of a few MiB stayed in the process (glibc raises its mmap
threshold to the size of each mapped block freed, up to 32 MiB, and serves the next ones from the heap,
which only malloc_trim gives back): a decoder's steady state kept ~1.3 GB of freed heap. A fresh map
needs no zero-fill: its pages are the kernel's zeros (`HostMemory.zeroed`; device.Buffer skips the fill
of such a handle when it comes straight from `alloc`, never when it comes back from the reuse cache).

`HostAllocator.adopt` makes a handle of a caller's read-only array instead (a memory-mapped file's
pages: GGUF weights are used where the file maps them, as llama.cpp does, instead of being copied).
Such a handle is `readonly`: device.Buffer refuses writes into it and never puts it in the reuse cache.
Kernels load through unaligned copies (renderer/cstyle.py), so an adopted array needs only its
elements' natural alignment; HOST_ALIGN matters for stores, which it never receives.
"""
from __future__ import annotations

import mmap
from typing import Any

import numpy as np

from polygrad.filemap import copy_dropping

# allocations from this size on are memory maps of their own (below it: the C heap, whose small blocks
# are cheap and reused)
MAP_BYTES = 1 << 20
# and from this size on ask for transparent huge pages (fewer TLB misses on a large operand), as NumPy
# does for its own large arrays
HUGE_BYTES = 4 << 20
# and from this size on are zeroed by giving their pages back (madvise MADV_DONTNEED: the next touch
# of a page maps one of the kernel's zero pages) instead of a memset: a buffer sized for a Variable's
# maximum (a decoder's logits for max_seq_len tokens, 100 MB for GPT-2 at 520) is zeroed each time the
# reuse cache hands it out again, and a memset made every page resident while a prompt writes a few rows.
# Below it, a memset is cheaper than the page faults that follow a release.
RELEASE_ZERO_BYTES = 8 << 20
# and from this size on give their pages back as they enter the reuse cache (kept there as address space
# only): a 512-token prompt's logits (103 MB) freed by the caller stayed resident next to the next
# prompt's. Writing such a buffer costs far more than faulting its pages in again, as in glibc, whose
# blocks above its mmap threshold go back to the system when freed.
RELEASE_ON_FREE_BYTES = 64 << 20
# a copy in of at least this many bytes from a read-only file map gives the map's pages back as it goes
# (filemap.copy_dropping); a smaller one holds few whole pages, and the look at its source costs a feed's time
DROP_PAGES_FROM = 64 << 10


class HostMemory:
    """A host allocation: the NumPy byte array, its address, and a slot backends may cache a
    foreign-function pointer in (so launching a kernel costs no per-call address lookups)."""

    __slots__ = ("arr", "addr", "ptr", "zeroed", "readonly", "region")

    def __init__(self, arr: Any, zeroed: bool = False, readonly: bool = False, region: Any = None):
        self.arr = arr
        self.region = region  # the anonymous memory map of a large allocation (zero() releases its pages)
        self.addr = int(arr.ctypes.data)
        self.ptr: Any = None
        self.zeroed = zeroed  # came from the system as zero pages (a memory map): zero when first handed out
        self.readonly = readonly  # the caller's read-only memory (HostAllocator.adopt): never written


# host buffers start on a cache line: NumPy puts a large array 16 bytes past a page, so every 64-byte vector
# access of a kernel would straddle two lines, and aligned (non-temporal) stores would be impossible
HOST_ALIGN = 64


class HostAllocator:
    """Memory from NumPy arrays, aligned to HOST_ALIGN bytes: shared by host backends (CPU, INTERP, X86)."""

    def alloc(self, nbytes: int) -> HostMemory:
        n = max(nbytes, 1)
        if n >= MAP_BYTES:
            region = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            if n >= HUGE_BYTES and hasattr(mmap, "MADV_HUGEPAGE"):
                try:
                    region.madvise(mmap.MADV_HUGEPAGE)
                except OSError:  # a kernel without transparent huge pages: plain pages serve
                    pass
            # the array's base is the map: munmap when the last view of it dies
            return HostMemory(np.frombuffer(region, dtype=np.uint8), zeroed=True, region=region)
        raw = np.empty(n + HOST_ALIGN, dtype=np.uint8)
        skip = -int(raw.ctypes.data) % HOST_ALIGN
        return HostMemory(raw[skip:skip + n])  # the view keeps the allocation alive

    def adopt(self, arr: np.ndarray) -> HostMemory:
        """A read-only handle over `arr`'s own memory, no copy (the caller checked it is contiguous,
        read-only and aligned: device.adopt_host_array). The handle keeps `arr`, and so its map, alive."""
        flat = arr.reshape(-1).view(np.uint8)
        return HostMemory(flat, readonly=True)

    def free(self, handle: Any, nbytes: int) -> None:
        pass

    def release_pages(self, handle: HostMemory, nbytes: int) -> None:
        """Give a cached allocation's pages back (RELEASE_ON_FREE_BYTES and up); it reads as zeros after."""
        region = getattr(handle, "region", None)
        if region is not None and hasattr(mmap, "MADV_DONTNEED"):
            region.madvise(mmap.MADV_DONTNEED, 0, nbytes - nbytes % mmap.PAGESIZE)

    def zero(self, handle: HostMemory, nbytes: int) -> None:
        region = getattr(handle, "region", None)
        if region is not None and nbytes >= RELEASE_ZERO_BYTES and hasattr(mmap, "MADV_DONTNEED"):
            whole = nbytes - nbytes % mmap.PAGESIZE  # the map starts on a page; its last page may be partial
            region.madvise(mmap.MADV_DONTNEED, 0, whole)
            handle.arr[whole:nbytes] = 0
            return
        handle.arr[:nbytes] = 0

    def copyin(self, handle: HostMemory, src: memoryview) -> None:
        # from a file's map (Model.load of a bundle path): its pages go back as the copy goes, so the load
        # holds the copy, not the file's bytes beside it (smaller copies skip the look at their source)
        if src.nbytes < DROP_PAGES_FROM or not copy_dropping(handle.arr, src):
            handle.arr[: src.nbytes] = np.frombuffer(src, dtype=np.uint8)

    def copyout(self, dest: memoryview, handle: HostMemory) -> None:
        np.frombuffer(dest, dtype=np.uint8)[:] = handle.arr[: dest.nbytes]
