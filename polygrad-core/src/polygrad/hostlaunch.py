"""How many host threads run a kernel split over a THREAD axis, and a Python pool that runs the parts.

Stage: running (host backends, CPU and X86, reach it through backend_api). Input: the number of parts
a kernel was split into when it was lowered (`Capabilities.threads`: POLY_THREADS when the device
opened) and the running thread's POLY_THREADS (a Context applies). Output: every part run, on at most
that many threads.

The split is fixed in the compiled kernel, the thread count is read at each launch: so
`with Context(POLY_THREADS=1):` runs every part on the calling thread, also in a JIT replay or a
captured Model whose launchers were bound before, and never needs a recompile. A Context can lower
the count, not raise it above the split. The backends' own pools (a C pool for CPU, machine code for
X86) take `launch_threads`; `run_split` is the Python pool they fall back on.
"""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from polygrad.config import current, process_value

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def launch_threads(split: int) -> int:
    """Threads a launch of a kernel split `split` ways runs on now: POLY_THREADS of this thread (at
    least 1: config checks it), at most `split`."""
    n = current.values["POLY_THREADS"]
    return n if n < split else split


def run_split(run_part: Callable[[int], Any], split: int) -> int:
    """Run run_part(0), ..., run_part(split - 1) on `launch_threads(split)` threads (this one and the
    Python pool's), thread w taking parts w, w + n, w + 2n...; returns n."""
    n = launch_threads(split)
    if n == 1:
        for part in range(split):
            run_part(part)
        return 1
    futures = [_python_pool().submit(_run_parts, run_part, first, split, n) for first in range(1, n)]
    _run_parts(run_part, 0, split, n)
    for f in futures:
        f.result()
    return n


def _run_parts(run_part: Callable[[int], Any], first: int, split: int, step: int) -> None:
    for part in range(first, split, step):
        run_part(part)


def _python_pool() -> ThreadPoolExecutor:
    global _pool
    if _pool is None:
        with _pool_lock:
            if _pool is None:
                _pool = ThreadPoolExecutor(max_workers=max(1, process_value("POLY_THREADS") - 1),
                                           thread_name_prefix="polygrad-host")
    return _pool
