"""Memory is given back: collect() unloads CPU programs no cache or capture holds, and the resident set
returns to where it started after thousands of distinct graphs (issue 11).

Before, every loaded shared object stayed mapped for the life of the process (200 cached kernels left
1,000 mappings). The RSS checks run in a child interpreter, so the test runner's own memory does
not count.
"""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

import polygrad
import resident
from conftest import run_python
from polygrad import Tensor, TinyJit

needs_cc = pytest.mark.skipif(shutil.which("clang") is None and shutil.which("gcc") is None
                              and shutil.which("cc") is None, reason="needs a C compiler")


def _kernel_mappings() -> int:
    """Mappings of shared objects from the compile cache (POLY_CACHE_DIR/cpu) in this process."""
    with open("/proc/self/maps") as f:
        return sum(1 for line in f if "/cpu/" in line and line.rstrip().endswith(".so"))


@needs_cc
def test_collect_unloads_programs_no_one_uses() -> None:
    from polygrad_backend_cpu import runtime as cpu_runtime
    polygrad.runtime.collect()
    base_open, base_maps = cpu_runtime.loaded["open"], _kernel_mappings()
    x = Tensor(np.arange(8, dtype=np.float32), device="CPU").realize()
    keep = TinyJit(lambda t: (t * 3.5 + 0.25).realize())  # a live capture keeps its program loaded
    for _ in range(3):
        keep(x)
    for k in range(24):  # distinct kernels (a constant each)
        assert (x * (k + 0.5)).tolist()[1] == k + 0.5
    assert cpu_runtime.loaded["open"] >= base_open + 25
    assert _kernel_mappings() > base_maps
    polygrad.runtime.clear_schedule_cache()
    polygrad.runtime.collect()
    assert cpu_runtime.loaded["open"] <= base_open + 1, cpu_runtime.loaded
    assert _kernel_mappings() <= base_maps + 8  # the jitted program's object only
    y = Tensor(np.ones(8, dtype=np.float32), device="CPU").realize()
    assert keep(y).tolist() == [3.75] * 8  # the kept program still runs
    assert (x * 0.5).tolist()[2] == 1.0  # and a dropped one reloads from the disk cache


# the child programs' common start: imports, rss(), the device (format field `device`)
RSS_PRELUDE = """
import gc, itertools, json, os
import numpy as np
import polygrad
from polygrad import Tensor
from polygrad.device import free_cached

DEV = {device!r}
""" + resident.PRELUDE

RSS_PROGRAM = RSS_PRELUDE + """
x = Tensor(np.linspace(-1, 1, 64, dtype=np.float32).reshape(8, 8), device=DEV).realize()
# distinct graphs: on INTERP each one its own kernels; on CPU distinct combinations of a pool of
# expressions (distinct schedules sharing compiled programs, so CI does not pay 2,000 compiles)
pool = [lambda t, k=k: (t * (k + 1.5)).relu().sum(1) for k in range(10)]
pool += [lambda t, k=k: (t + k).exp().max(0) for k in range(10)]
pool += [lambda t, k=k: (t @ t.T + k).mean() for k in range(4)]

def graph(i):
    if DEV == "INTERP":
        k = i % 97 + 0.5
        shape = (8, 8) if i % 2 else (4, 16)
        return [((x.reshape(shape) * k + i).relu().sum(1 + 0 * i % 1) / (k + i % 13)) * (i % 7 + 1)]
    combo = combos[i]
    return [pool[j](x) for j in combo]

combos = list(itertools.combinations(range(len(pool)), 3))
for i in range(20):  # warm up: imports, the first programs, allocator pools
    Tensor.realize_all(*graph(i))
polygrad.runtime.clear_schedule_cache()
polygrad.runtime.collect()
start = rss()
for i in range(20, 20 + {n}):
    outs = graph(i)
    Tensor.realize_all(*outs)
    del outs
peak = rss()
schedules = polygrad.stats()["schedules_cached"]
polygrad.runtime.clear_schedule_cache()
polygrad.runtime.collect()
end = rss()
print(json.dumps({{"start": start, "peak": peak, "end": end, "schedules": schedules}}))
"""


@pytest.mark.parametrize("device", ["CPU", "INTERP"])
def test_rss_returns_after_2000_distinct_graphs(device: str) -> None:
    if device == "CPU" and shutil.which("clang") is None and shutil.which("gcc") is None:
        pytest.skip("needs a C compiler")
    proc = run_python(RSS_PROGRAM.format(device=device, n=2000), {"DEV": device}, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r["schedules"] >= 2000  # the graphs were distinct: each one cached its own schedule
    assert r["peak"] > r["start"]
    assert r["end"] <= 1.2 * r["start"], {k: round(v / 2**20, 1) for k, v in r.items()}


FREED_HEAP_PROGRAM = RSS_PRELUDE + """
(Tensor.ones(64, device=DEV) * 2).realize()  # imports, the first programs
for size in (1, 2, 3, 4, 5):  # the programs of every size below, so compiling adds nothing later
    (Tensor.ones(size << 18, device=DEV) * 3).realize()
# a 16 MiB block freed first: glibc then serves every block under 16 MiB from its heap
big = (Tensor.ones(4 << 20, device=DEV) * 2).realize()
del big
gc.collect()
free_cached()
start = rss()
keep = []
for rnd in range(20):
    tmp = [(Tensor.ones((1 + i % 5) << 18, device=DEV) * 3).realize() for i in range(10)]  # 1 to 5 MiB each
    keep.append((Tensor.ones(1024, device=DEV) + rnd).realize())  # a small survivor after them on the heap
    del tmp
    gc.collect()
free_cached()
gc.collect()
print(json.dumps({{"start": start, "end": rss()}}))
"""


@pytest.mark.parametrize("device", ["CPU", "INTERP"])
def test_freed_megabyte_buffers_go_back_to_the_system(device: str) -> None:
    """Host buffers of 1 MiB and more are memory maps of their own (hostmemory.py): once freed (and the reuse
    cache emptied) they leave the process. From the C heap, 20 rounds of 1-5 MiB temporaries with a small
    survivor after each kept ~33 MiB resident (glibc's raised mmap threshold, only malloc_trim returned it)."""
    if device == "CPU" and shutil.which("clang") is None and shutil.which("gcc") is None:
        pytest.skip("needs a C compiler")
    proc = run_python(FREED_HEAP_PROGRAM.format(device=device), {"DEV": device}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r["end"] - r["start"] < 12 << 20, {k: round(v / 2**20, 1) for k, v in r.items()}


def test_a_reused_mapped_buffer_is_zeroed_again() -> None:
    """A fresh map skips its zero-fill (its pages are the system's zeros); the same memory handed out again from
    the reuse cache must be cleared: a buffer no kernel writes reads zeros, not the earlier computation's 7s."""
    from polygrad.device import Buffer
    from polygrad.dtype import dtypes
    n = 1 << 19  # 2 MiB of float32: a memory map
    first = Buffer("INTERP", n, dtypes.float32).ensure_allocated(written=True)
    assert first._handle.zeroed
    first.copyin(np.full(n, 7, np.float32))
    handle = first._handle
    del first  # into the reuse cache
    again = Buffer("INTERP", n, dtypes.float32).ensure_allocated()
    assert again._handle is handle  # the same memory came back
    out = np.empty(n, np.float32)
    again.impl().allocator.copyout(memoryview(out).cast("B"), again._handle)
    assert not out.any()


def test_a_large_reused_buffer_is_zeroed_by_giving_its_pages_back() -> None:
    """From hostmemory.RELEASE_ZERO_BYTES, a buffer the reuse cache hands out again is zeroed by releasing its
    pages (MADV_DONTNEED), not by a memset that made them all resident: a decoder's logits sized for its longest
    prompt (100 MB for GPT-2 at 520 tokens) stayed resident after every prompt. It reads zeros all the same."""
    from polygrad.device import Buffer, free_cached
    from polygrad.dtype import dtypes
    from polygrad.hostmemory import RELEASE_ZERO_BYTES
    n = 4 * RELEASE_ZERO_BYTES // 4 + 3  # float32s: a partial last page is cleared by hand
    free_cached()  # room in the cache, whatever earlier tests left there
    first = Buffer("INTERP", n, dtypes.float32).ensure_allocated(written=True)
    first.copyin(np.full(n, 7, np.float32))
    handle = first._handle
    del first  # into the reuse cache, every page resident
    before = resident.rss()
    again = Buffer("INTERP", n, dtypes.float32).ensure_allocated()
    assert again._handle is handle
    assert before - resident.rss() > 3 * RELEASE_ZERO_BYTES  # the pages went back: 4 x 8 MiB were resident
    assert not again.numpy().any()


def test_a_huge_freed_buffer_waits_in_the_reuse_cache_without_its_pages() -> None:
    """From hostmemory.RELEASE_ON_FREE_BYTES, a freed buffer keeps its address in the reuse cache but gives its
    pages back: a 512-token prompt's logits (103 MB for GPT-2) freed by the caller stayed resident beside the
    next prompt's, 100 MB of the decoder's peak. Handed out again, it reads zeros."""
    from polygrad import device
    from polygrad.device import Buffer
    from polygrad.dtype import dtypes
    from polygrad.hostmemory import RELEASE_ON_FREE_BYTES
    n = RELEASE_ON_FREE_BYTES // 4
    device.free_cached()  # room in the cache, whatever earlier tests left there
    buf = Buffer("INTERP", n, dtypes.float32).ensure_allocated(written=True)
    buf.copyin(np.full(n, 7, np.float32))
    handle = buf._handle
    cached = device.alloc_cache_bytes["total"]
    before = resident.rss()
    del buf
    assert device.alloc_cache_bytes["total"] == cached + RELEASE_ON_FREE_BYTES  # kept for reuse
    assert before - resident.rss() > RELEASE_ON_FREE_BYTES * 9 // 10  # without its pages
    again = Buffer("INTERP", n, dtypes.float32).ensure_allocated()
    assert again._handle is handle
    assert not again.numpy().any()
