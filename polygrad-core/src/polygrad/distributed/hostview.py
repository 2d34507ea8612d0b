"""Device buffers as host arrays for MPI: a view of the buffer's own memory where the device is the host.

Stage: distributed runtime (data exchange). Input: realized `Buffer`s. Output: NumPy arrays MPI reads
and writes: on a host device (CPU, X86, INTERP: `DeviceImpl.host_memory`) a view of the allocation
itself, so MPI reads and writes the buffer's memory with no copy; on another device (CUDA) a host copy
(`readable`) or a host array written back afterwards (`write_back`). Every write tells the value
caches that the buffer changed (`device.note_overwrite`).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from polygrad.device import Buffer, note_overwrite


def host_view(buf: Buffer) -> np.ndarray | None:
    """The buffer's own memory as a flat array of its storage dtype, or None when it is not host memory."""
    if not getattr(buf.impl(), "host_memory", False):
        return None
    arr = getattr(buf.handle, "arr", None)  # HostMemory (hostmemory.py) and its guarded form
    if arr is None:
        return None
    return arr[:buf.nbytes].view(buf.dtype.np)


def readable(buf: Buffer) -> np.ndarray:
    """The contents for MPI to read: the buffer's memory itself on the host, else a host copy."""
    view = host_view(buf)
    if view is None:
        return buf.numpy()
    buf.impl().synchronize()
    return view


def writable(buf: Buffer) -> np.ndarray:
    """An array for MPI to write the buffer's new contents into: its memory on the host, else a host
    array that `write_back` copies in. The buffer counts as written in full (nothing zeroes it first)."""
    buf.ensure_allocated(written=True)
    view = host_view(buf)
    return view if view is not None else np.empty(buf.size, dtype=buf.dtype.np)


def write_back(buf: Buffer, arr: Any) -> None:
    """Finish a write through `writable`: copy a host array in, or note that the host memory changed."""
    if host_view(buf) is None:
        buf.copyin(arr)
    else:
        note_overwrite(buf)
