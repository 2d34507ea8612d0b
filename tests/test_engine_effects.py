"""Effects (assign) run exactly once per call, even when two calls build identical graphs."""
import numpy as np
import pytest

from polygrad import GlobalCounters, Tensor


@pytest.mark.parametrize("device", ["CPU", "INTERP"])
def test_identical_assigns_each_run(device):
    w = Tensor(np.ones(4, dtype=np.float32), device=device).realize()
    g = Tensor(np.full(4, 0.5, dtype=np.float32), device=device).realize()
    for step in range(1, 4):
        w.assign(w - g)  # the same expression over the same buffers every step
        w.realize()
        assert np.allclose(w.numpy(), 1 - 0.5 * step), (step, w.numpy())


@pytest.mark.parametrize("device", ["CPU", "INTERP"])
def test_assign_seen_by_later_graph_runs_once(device):
    w = Tensor(np.zeros(3, dtype=np.float32), device=device).realize()
    w.assign(w + 1)
    later = w * 10  # built on the pending assign
    w.realize()
    assert later.numpy().tolist() == [10.0, 10.0, 10.0]
    assert w.numpy().tolist() == [1.0, 1.0, 1.0]


@pytest.mark.parametrize("device", ["CPU", "INTERP"])
def test_recompute_after_copy_from(device):
    x = Tensor(np.array([1, 2, 3], dtype=np.float32), device=device).realize()
    assert (x * 2).numpy().tolist() == [2, 4, 6]
    x.copy_from(np.array([4, 5, 6], dtype=np.float32))
    assert (x * 2).numpy().tolist() == [8, 10, 12]


def test_same_structure_hits_schedule_cache():
    from polygrad.engine.realize import runtime_stats
    a = Tensor(np.ones(5, dtype=np.float32), device="CPU").realize()
    (a + a).realize()
    compiled = runtime_stats["programs_compiled"]
    GlobalCounters.reset()
    for k in range(5):
        b = Tensor(np.full(5, k, dtype=np.float32), device="CPU").realize()
        assert (b + b).numpy().tolist() == [2.0 * k] * 5
    assert runtime_stats["programs_compiled"] == compiled
    assert GlobalCounters.kernel_count == 5


@pytest.mark.parametrize("device", ["CPU", "INTERP"])
def test_identical_custom_kernel_calls_each_run(device):
    from polygrad.uop.ops import KernelInfo, UOp

    def inc(out, a):
        out, a = out.flatten(), a.flatten()
        i = UOp.range(out.ctx, out.numel(), 0)
        return out[i].store(a[i] + 1.0).end(i).sink(arg=KernelInfo(name="inc_in_place"))

    x = Tensor([1.0, 2.0], device=device).realize()
    for step in range(1, 4):
        x = x.custom_kernel(x, fxn=inc)[0]
        assert x.numpy().tolist() == [1.0 + step, 2.0 + step]
