"""Files read through a read-only memory map, and the map's pages given back once their bytes were copied.

Stage: file input (Model.load of a bundle path, polygrad-hf's checkpoint readers). Input: a path, or arrays
that view a file's map. Output: the map (`map_file`), the map an array views (`root_of`), and the resident
set without the pages a copy already read (`drop_pages`, `copy_dropping`). A map's page read again faults
back in from the file (its page cache), so giving pages back never changes a value; it only keeps a load
from holding the file's bytes beside the copy it made of them (a 498 MB bundle peaked at 2x).
"""
from __future__ import annotations

import mmap
import os
from typing import Any

import numpy as np

# the bytes copied between two page releases: small beside any weight, large beside a system call
COPY_CHUNK = 8 << 20


def map_file(path: str | os.PathLike) -> mmap.mmap | bytes:
    """A read-only map of the file, or its bytes where it cannot be mapped (empty, a pipe or a device).
    OSError (the caller names the file) when it cannot be opened or read."""
    with open(path, "rb") as f:
        try:
            if os.fstat(f.fileno()).st_size > 0:
                return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError):  # not a regular file (mmap refuses it): read it as a stream
            pass
        return f.read()


def root_of(arr: Any) -> Any:
    """The object whose memory `arr` (an array or a memoryview) views: a file's map, for bytes read from one."""
    while True:
        if isinstance(arr, np.ndarray) and arr.base is not None:
            arr = arr.base
        elif isinstance(arr, memoryview):
            arr = arr.obj
        else:
            return arr


def _mapped(part: Any) -> mmap.mmap | None:
    """The read-only file map `part` views, or None (a private map's pages may hold writes: never dropped)."""
    root = root_of(part)
    if not isinstance(root, mmap.mmap) or not hasattr(root, "madvise") or root.closed:
        return None
    return root if memoryview(root).readonly else None


def drop_pages(part: Any) -> None:
    """Give back the resident pages of a file map that only `part` (an array or a memoryview) lay on, once it
    was copied or converted (into a joined, float or quantized weight, to float32, into a Model's buffer):
    the copy read them in, and nothing reads them again (the kernels read the copy). A part that is not a
    view of a read-only file map is left alone."""
    root = _mapped(part)
    arr = part if isinstance(part, np.ndarray) else np.frombuffer(part, np.uint8)
    if root is None or not arr.nbytes:
        return
    start = arr.__array_interface__["data"][0] - np.frombuffer(root, np.uint8, 1).__array_interface__["data"][0]
    first, end = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE, (start + arr.nbytes) // mmap.PAGESIZE * mmap.PAGESIZE
    if end > first:
        root.madvise(mmap.MADV_DONTNEED, first, end - first)


def copy_dropping(dest: np.ndarray, src: memoryview) -> bool:
    """Copy `src`, a view of a read-only file map, into the flat uint8 array `dest` COPY_CHUNK bytes at a time,
    giving each chunk's pages back after its copy: the resident set grows by the destination only, never by
    the whole source. False (nothing copied) when `src` views no such map."""
    if _mapped(src) is None:
        return False
    data = np.frombuffer(src, np.uint8)
    skew = data.__array_interface__["data"][0] % mmap.PAGESIZE  # chunks end on the map's pages: none is kept
    lo = 0
    while lo < data.nbytes:
        hi = min((lo + skew) // COPY_CHUNK * COPY_CHUNK + COPY_CHUNK - skew, data.nbytes)
        dest[lo:hi] = data[lo:hi]
        drop_pages(data[lo:hi])
        lo = hi
    return True
