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
    from polygrad.engine.programs import runtime_stats
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


@pytest.mark.parametrize("device", ["CPU", "INTERP"])
def test_reads_of_old_value_run_before_assign(device):
    a = Tensor(np.array([1.0, 2.0], dtype=np.float32), device=device).realize()
    b = Tensor(np.array([10.0, 20.0], dtype=np.float32), device=device).realize()
    total = (a * 1).sum()  # reads a's old value
    b.assign(b + a.sum())  # reads a's old value
    a.assign(a * 100)  # overwrites a; scheduled in the same realize
    Tensor.realize_all(a, b, total)
    assert total.item() == 3.0
    assert b.numpy().tolist() == [13.0, 23.0]
    assert a.numpy().tolist() == [100.0, 200.0]


def test_assign_cycle_is_rejected_clearly():
    from polygrad.errors import PolygradError
    a = Tensor([1.0, 2.0], device="CPU").realize()
    b = Tensor([3.0, 4.0], device="CPU").realize()
    old_a = Tensor(a.uop)  # a's buffer before the assign below
    a.assign(b + 0)  # a reads b's old buffer
    b.assign(old_a + 0)  # b reads a's old buffer: neither order is right
    with pytest.raises(PolygradError, match="cycle"):
        Tensor.realize_all(a, b)


@pytest.mark.parametrize("device", ["CPU", "INTERP"])
def test_assign_reading_its_target_elsewhere(device):
    """a.assign(a.flip(0)) must read every element before any is overwritten."""
    a = Tensor([1.0, 2.0, 3.0, 4.0], device=device).realize()
    a.assign(a.flip(0)).realize()
    assert a.numpy().tolist() == [4.0, 3.0, 2.0, 1.0]
    m = np.arange(64, dtype=np.float32).reshape(8, 8)
    b = Tensor(m, device=device).realize()
    b.assign(b.T).realize()
    assert np.array_equal(b.numpy(), m.T)
    c = Tensor(np.arange(6, dtype=np.float32), device=device).realize()
    c.assign(c.pad(((1, 0),)).shrink(((0, 6),)) + c).realize()
    assert c.numpy().tolist() == [0.0, 1.0, 3.0, 5.0, 7.0, 9.0]


def test_elementwise_self_assign_stays_one_kernel():
    w = Tensor([1.0, 2.0], device="CPU").realize()
    GlobalCounters.reset()
    w.assign(w * 2 - 1).realize()
    assert GlobalCounters.kernel_count == 1 and w.numpy().tolist() == [1.0, 3.0]


@pytest.mark.parametrize("device", ["CPU", "INTERP"])
def test_integer_constants_wrap_like_c(device):
    x = Tensor.full((4,), 2**30, dtype="int32", device=device)
    assert ((x * 4) // 3).numpy().tolist() == [0] * 4
    y = Tensor.full((4,), 250, dtype="uint8", device=device)
    assert ((y + 10) // 3).numpy().tolist() == [1] * 4
    z = Tensor(np.array([250, 5, 7, 9], np.uint8), device=device)
    assert (z // 3).numpy().tolist() == [83, 1, 2, 3]


@pytest.mark.parametrize("device", ["CPU", "INTERP"])
def test_assign_through_a_view_writes_the_base(device):
    a = Tensor([1.0, 2.0, 3.0, 4.0], device=device).realize()
    a[1:3].assign(Tensor([7.0, 8.0], device=device)).realize()
    assert a.numpy().tolist() == [1.0, 7.0, 8.0, 4.0]
    m = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3), device=device).realize()
    v = m.T
    v.assign(v * 10).realize()
    assert m.numpy().tolist() == [[0.0, 10.0, 20.0], [30.0, 40.0, 50.0]]


@pytest.mark.parametrize("device", ["CPU", "INTERP"])
def test_finished_assign_in_a_live_graph_does_not_shift_the_buffer_table(device):
    """The history-dependent corruption of issue 11: a graph holding an assign that already ran stands
    for the assigned buffer, but the buffer that fed the assign still took an input slot. The schedule
    cached for the same structure then put its new buffer at that slot's index and wrote the result
    into `v`, an unrelated live tensor (or indexed past the table)."""
    q = Tensor(np.full(4, 5, np.float32), device=device) * 2.0 + 1.0
    assert q.tolist() == [11.0] * 4  # caches the schedule of `buffer * 2 + 1`
    a = Tensor(np.zeros(4, np.float32), device=device).realize()
    v = Tensor(np.ones(4, np.float32), device=device).realize()
    w = a.assign(v * 3)
    z = w * 2.0 + 1.0  # holds the assign
    w.realize()
    assert z.tolist() == [7.0] * 4
    assert v.tolist() == [1.0] * 4
    q2 = Tensor(np.full(4, 2, np.float32), device=device) * 2.0 + 1.0
    assert q2.tolist() == [5.0] * 4 and v.tolist() == [1.0] * 4
