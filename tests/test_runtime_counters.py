"""GlobalCounters (tinygrad-compatible) and polygrad.stats(): values checked by hand-counting."""
import gc

import numpy as np
import pytest

import polygrad
from polygrad import GlobalCounters, Tensor

from conftest import DEVICES  # every usable backend: CPU, INTERP, X86, ...


@pytest.mark.parametrize("device", DEVICES)
def test_matmul_counts_ops_bytes_kernels_and_time(device):
    m, k, n = 8, 16, 4
    a = Tensor(np.ones((m, k), np.float32), device=device).realize()
    b = Tensor(np.ones((k, n), np.float32), device=device).realize()
    GlobalCounters.reset()
    c = (a @ b).realize()
    assert GlobalCounters.kernel_count == 1
    assert GlobalCounters.global_ops == 2 * m * k * n  # one multiply and one add per term
    assert GlobalCounters.global_mem == (m * k + k * n + m * n) * 4
    assert GlobalCounters.time_sum_s > 0
    assert c.numpy().tolist() == [[16.0] * n] * m


@pytest.mark.parametrize("device", DEVICES)
def test_mem_used_tracks_live_buffers_and_survives_reset(device):
    from polygrad.device import free_cached
    gc.collect()
    free_cached()
    base, base_dev = GlobalCounters.mem_used, GlobalCounters.mem_used_per_device.get(device, 0)
    live_before = polygrad.stats()["buffers_live"]
    x = Tensor(np.zeros(1000, np.float32), device=device).realize()
    assert GlobalCounters.mem_used - base == 4000
    assert GlobalCounters.mem_used_per_device[device] - base_dev == 4000
    assert polygrad.stats()["buffers_live"] == live_before + 1
    GlobalCounters.reset()
    assert GlobalCounters.kernel_count == 0 and GlobalCounters.global_ops == 0 and GlobalCounters.time_sum_s == 0
    assert GlobalCounters.mem_used - base == 4000
    del x
    gc.collect()
    # the freed allocation is kept for reuse: still held by the runtime, no longer live
    assert polygrad.stats()["buffers_live"] == live_before
    assert GlobalCounters.mem_used - base == 4000
    assert polygrad.stats()["bytes_cached_for_reuse"] >= 4000
    y = Tensor(np.ones(1000, np.float32), device=device).realize()  # reuses it
    assert GlobalCounters.mem_used - base == 4000 and y.numpy().sum() == 1000
    del y
    free_cached()
    assert GlobalCounters.mem_used == base


def test_stats_reports_compiles_cache_hits_and_buffers():
    s0 = polygrad.stats()
    for key in ["programs_compiled", "program_cache_hits", "buffers_live", "mem_used", "mem_used_per_device",
                "kernels_run", "programs_cached", "schedules_cached"]:
        assert key in s0, key
    x = Tensor(np.arange(7, dtype=np.float32), device="CPU").realize()
    (x * 3.5 - 0.25).realize()
    s1 = polygrad.stats()
    (x * 3.5 - 0.25).realize()
    s2 = polygrad.stats()
    assert s2["program_cache_hits"] == s1["program_cache_hits"] + 1
    assert s2["programs_compiled"] == s1["programs_compiled"]
    assert s2["kernels_run"] == s1["kernels_run"] + 1
