"""The registry of live Tensors: every Tensor alive now, held by weak references.

Stage: graph construction (bookkeeping). Input: each Tensor as it is made (tensor.py adds it). Output:
the live tensors, for backward() (which leaves want gradients), a capture (which tensors existed before
it began: engine/capture.py) and the optimizer (values a step would overwrite). It lives below both
tensor.py and the capture, so the capture reads it without importing the Tensor class.
"""
from __future__ import annotations

import threading
import weakref
from typing import Any


class _LiveTensors:
    """Every live Tensor (backward() looks for the ones that want gradients), held by weak references
    without callbacks, since every op makes a tensor: adding one is a C call, and dead references are
    dropped whenever the list has doubled since the last sweep (amortised constant time).

    Threads add without a lock (one append to the one list, which is never replaced); a sweep rewrites
    the part of the list it read, under `lock`, so what other threads append meanwhile is kept."""

    __slots__ = ("refs", "limit", "lock")

    def __init__(self) -> None:
        self.refs: list[weakref.ref] = []
        self.limit = 1024
        self.lock = threading.Lock()

    def add(self, t: Any) -> None:
        self.refs.append(weakref.ref(t))
        if len(self.refs) >= self.limit:
            self.sweep()

    def sweep(self) -> None:
        """Drop the references to dead tensors; the next sweep waits until the list has doubled."""
        if self.lock.acquire(blocking=False):  # else a sweep is under way
            try:
                self._compact()
            finally:
                self.lock.release()
            self.limit = max(1024, 2 * len(self.refs))

    def _compact(self) -> list[Any]:
        refs = self.refs
        n = len(refs)
        pairs = [(r, t) for r in refs[:n] if (t := r()) is not None]
        refs[:n] = [r for r, _ in pairs]  # one C call: an append from another thread lands after it
        return [t for _, t in pairs]

    def __iter__(self):
        with self.lock:
            return iter(self._compact())


all_tensors = _LiveTensors()


def live_tensors() -> list[Any]:
    """Every Tensor object alive now."""
    return list(all_tensors)
