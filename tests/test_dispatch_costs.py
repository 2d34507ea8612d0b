"""Deterministic guards for per-call dispatch (issue 17 item 5, "tiny op" and "jit replay"), counted in
Python calls and cache misses, never timed:

- a realize whose graph structure was seen neither schedules nor lowers again, and a changed structure
  (another op, shape or dtype) never reuses the old template or program;
- a cached one-op realize stays within a budget of Python function calls;
- a TinyJit replay launches its kernels through launchers bound once, so its Python calls do not grow
  with the number of kernels; a replay with other input buffers rebinds and computes with them; a
  replay with a wrong shape, dtype or device still raises the typed JitError;
- the counters and the IR's op enum keep their public behaviour after the changes that made them cheap.
"""
from __future__ import annotations

import gc
import pickle
import sys
from collections import Counter

import numpy as np
import pytest

from conftest import DEVICES
from polygrad import GlobalCounters, Tensor, Variable, dtypes, jit
from polygrad import tensor as tensor_module
from polygrad.engine import programs
from polygrad.engine.jit import JitError
from polygrad.schedule import template
from polygrad.uop.ops import Ops

needs_cc = pytest.mark.skipif("CPU" not in DEVICES, reason="needs the CPU backend")

# A cached realize of (a + b), from the op to the result's death, enters 12 Python functions (the tensor op
# and its node, realize, the eager-op cache's signature, one buffer and its take from the reuse cache, the
# program lookup, the result's UOp; then, as the result dies, the op node's hash-cons entry and the buffer's
# return to the reuse cache); the kernel is called straight through its cffi function. It took 53 before
# issue 17's dispatch work, 29 with a walk of the graph (before issue 32's leaf cache), 18 through
# realize_uops and run_template (before realize_eager), 14 with the backend's own launch frame, the result
# Tensor's, the kept value's and a second one for the buffer (before issue 32's Program.pointer_call and
# Buffer.written): those counts stopped at the result, whose death added 3 more (13 in all at fdd5dad, with
# CompiledProgram.launch's frame and the result node's hash-cons entry). A scheduler or lowering run takes
# hundreds.
TINY_OP_CALL_BUDGET = 12


def _python_calls(fn) -> int:
    """Python-level function calls (frames entered) while fn runs, and while what it returns dies: the
    result is dropped before counting stops, so finalizers and weakref callbacks it sets off count. The
    garbage collector waits, so finalizers of unrelated garbage do not count."""
    return sum(_python_call_names(fn).values())


def _python_call_names(fn) -> Counter:
    """The Python functions entered (code name -> calls) while fn runs and its result dies, fn excluded."""
    names: Counter = Counter()

    def profile(frame, event, arg):
        if event == "call":
            names[frame.f_code.co_name] += 1
    enabled = gc.isenabled()
    gc.disable()
    sys.setprofile(profile)
    try:
        fn()  # (its result is dropped here, with the profile on)
    finally:
        sys.setprofile(None)
        if enabled:
            gc.enable()
    names[fn.__code__.co_name] -= 1
    return +names


def _forbid(monkeypatch, what: str) -> None:
    def boom(*a, **k):
        raise AssertionError(f"a realize of a seen graph structure reached {what}")
    if what == "build_template":
        monkeypatch.setattr(template, "build_template", boom)
    else:
        monkeypatch.setattr(programs, what, boom)


@pytest.mark.parametrize("device", DEVICES)
def test_seen_structure_skips_scheduling_and_lowering(device, monkeypatch):
    a_np, b_np = np.arange(4, dtype=np.float32), np.arange(4, dtype=np.float32)[::-1].copy()
    (Tensor(a_np, device=device) + Tensor(b_np, device=device)).realize()
    for what in ("build_template", "lower", "lower_and_render"):
        _forbid(monkeypatch, what)
    for k in range(3):  # new data, same structure: served from the schedule and program caches
        got = (Tensor(a_np * k, device=device) + Tensor(b_np, device=device)).numpy()
        np.testing.assert_allclose(got, a_np * k + b_np)


@pytest.mark.parametrize("device", DEVICES)
def test_changed_structure_never_hits_a_stale_entry(device, monkeypatch):
    monkeypatch.setattr(template, "schedule_cache", {})  # structures other tests realized do not count
    monkeypatch.setattr(template, "leaf_cache", {})  # nor eager ops they realized (template.leaf_cache)
    a_np = np.arange(6, dtype=np.float32)

    def inputs(arr):
        return Tensor(arr, device=device).realize(), Tensor(arr, device=device).realize()
    x, y = inputs(a_np)
    (x + y).realize()
    built = []
    real = template.build_template
    monkeypatch.setattr(template, "build_template", lambda *a: built.append(a) or real(*a))
    i32 = a_np.astype(np.int32)
    cases = [(lambda x, y: x * y, a_np, a_np * a_np),  # another op
             (lambda x, y: x + y, a_np[:4], a_np[:4] * 2),  # another shape
             (lambda x, y: x + y, i32, i32 * 2)]  # another dtype
    for op, arr, want in cases:
        x, y = inputs(arr)
        n = len(built)
        got = op(x, y).numpy()
        assert len(built) == n + 1, "a graph of a new structure must get its own template"
        np.testing.assert_array_equal(got, want)
        assert got.dtype == want.dtype


@needs_cc
def test_cached_tiny_op_stays_within_its_call_budget():
    a = Tensor(np.array([1, 2, 3, 4], np.float32), device="CPU").realize()
    b = Tensor(np.array([4, 3, 2, 1], np.float32), device="CPU").realize()
    for _ in range(3):
        (a + b).realize()
    calls = _python_calls(lambda: (a + b).realize())  # the result dies inside: its lifecycle counts
    assert calls <= TINY_OP_CALL_BUDGET, f"{calls} Python calls for a cached a + b, made and dropped"
    assert (a + b).realize().numpy().tolist() == [5.0] * 4


@needs_cc
def test_cached_tiny_op_lifecycle_runs_no_launch_frame_and_one_hash_cons_callback():
    """What the budget above is made of: the launch runs inline in realize_eager (no CompiledProgram.launch
    frame), and of the two nodes an eager op makes only the op node has a hash-cons entry whose death calls
    _forget: the result's BUFFER node (UOp.fresh) is kept on its Buffer, so its death runs no Python."""
    a = Tensor(np.array([1, 2, 3, 4], np.float32), device="CPU").realize()
    b = Tensor(np.array([4, 3, 2, 1], np.float32), device="CPU").realize()
    for _ in range(3):
        (a + b).realize()
    names = _python_call_names(lambda: (a + b).realize())
    assert names["launch"] == 0 and names["fresh"] == 1, names
    assert names["_forget"] == 1 and names["__del__"] == 1, names
    assert names["_take_cached"] == 1, names  # the reuse cache's one take, shared with ensure_allocated


@needs_cc
def test_cached_tiny_op_launches_through_the_kernels_pointer_call(monkeypatch):
    """A variable-free one-thread CPU kernel runs as one cffi call on its buffers' pointers: the backend
    program's own __call__ runs only for a handle whose pointer is not made yet (a new allocation), and a
    launch counts one kernel either way."""
    from polygrad_backend_cpu.runtime import CPUProgram
    a_np = np.array([1.5, -2.0, 3.25, 4.0, 0.5, 6.0, 7.0], np.float32)  # 7 elements: sizes other tests use not
    b_np = np.array([4.0, 3.0, 2.0, 1.0, -0.5, 9.0, 1e-3], np.float32)
    a, b = Tensor(a_np, device="CPU").realize(), Tensor(b_np, device="CPU").realize()
    for _ in range(3):
        (a + b).realize()
    backend_calls = []
    original = CPUProgram.__call__
    monkeypatch.setattr(CPUProgram, "__call__", lambda *args: backend_calls.append(1) or original(*args))
    GlobalCounters.reset()
    kept = [(a + b).realize() for _ in range(4)]  # each takes a new allocation (the others are held)
    assert GlobalCounters.kernel_count == 4
    for t in kept:
        np.testing.assert_array_equal(t.numpy(), a_np + b_np)
    fresh = len(backend_calls)  # the allocations no earlier launch had cast to a pointer
    del kept
    backend_calls.clear()
    GlobalCounters.reset()
    for _ in range(4):  # each takes an allocation cast by a launch above
        np.testing.assert_array_equal((a + b).realize().numpy(), a_np + b_np)
    assert backend_calls == [] and GlobalCounters.kernel_count == 4, (fresh, backend_calls)


@needs_cc
def test_cached_tiny_op_results_go_back_to_the_reuse_cache():
    """The eager path's output buffers (Buffer.written) keep the live-buffer count and the reuse cache's
    bytes as ensure_allocated does: a result's allocation is reused once it dies, and none leaks."""
    from polygrad import device as device_module
    a = Tensor(np.arange(5, dtype=np.float32), device="CPU").realize()
    b = Tensor(np.ones(5, np.float32), device="CPU").realize()
    (a + b).realize()
    gc.collect()
    live, cached = device_module.buffers_live.get("CPU", 0), device_module.alloc_cache_bytes["total"]
    t = (a + b).realize()
    assert device_module.buffers_live["CPU"] == live + 1
    assert device_module.alloc_cache_bytes["total"] == cached - 20  # taken from the cache: 5 float32
    handle = t._buffer()._handle
    del t
    assert device_module.buffers_live["CPU"] == live and device_module.alloc_cache_bytes["total"] == cached
    t = (a + b).realize()
    assert t._buffer()._handle is handle  # the allocation the last result gave back
    np.testing.assert_array_equal(t.numpy(), np.arange(5, dtype=np.float32) + 1)


def _chain(n: int):
    def f(x):
        for _ in range(n):
            x = (x * 2 + 1).realize()  # one kernel each
        return x
    return jit(f)


@needs_cc
def test_jit_replay_calls_do_not_grow_with_kernels():
    x = Tensor(np.ones(8, np.float32), device="CPU").realize()
    short, long = _chain(2), _chain(8)  # (two or more: a kernel alone keeps its bound launcher, no launch plan)
    for f in (short, long):
        for _ in range(3):
            f(x)
    GlobalCounters.reset()
    calls_long = _python_calls(lambda: long(x))
    assert GlobalCounters.kernel_count == 8
    calls_short = _python_calls(lambda: short(x))
    assert calls_long == calls_short, (calls_short, calls_long)
    want = np.ones(8, np.float32)
    for _ in range(8):
        want = want * 2 + 1
    np.testing.assert_allclose(long(x).numpy(), want)


@pytest.mark.parametrize("device", DEVICES)
def test_jit_replay_follows_new_input_buffers(device):
    f = jit(lambda x, y: (x * y + 1).realize())
    xs = [Tensor(np.full(4, v, np.float32), device=device).realize() for v in (1, 2, 3)]
    y = Tensor(np.arange(4, dtype=np.float32), device=device).realize()
    for x in xs + xs[::-1] + [xs[1], xs[1], xs[0]]:  # captured, rebound, replayed as bound, rebound again
        want = x.numpy() * np.arange(4, dtype=np.float32) + 1
        np.testing.assert_allclose(f(x, y).numpy(), want)
    assert f.stats()["replays"] == 7


@pytest.mark.parametrize("device", DEVICES)
def test_jit_replay_still_checks_inputs(device):
    f = jit(lambda x: (x + 1).realize())
    x = Tensor(np.ones(4, np.float32), device=device).realize()
    for _ in range(3):
        f(x)
    bad = [Tensor(np.ones(5, np.float32), device=device).realize(),
           Tensor(np.ones(4, np.int32), device=device).realize()]
    other = [d for d in DEVICES if d != device]
    if other:
        bad.append(Tensor(np.ones(4, np.float32), device=other[0]).realize())
    for b in bad:
        with pytest.raises(JitError, match="inputs changed since capture"):
            f(b)
    np.testing.assert_allclose(f(x).numpy(), [2.0] * 4)  # still serves the captured inputs


def test_counters_keep_their_class_attribute_spelling():
    GlobalCounters.reset()
    assert (GlobalCounters.kernel_count, GlobalCounters.global_ops, GlobalCounters.time_sum_s) == (0, 0, 0.0)
    (Tensor([1.0, 2.0]) + 1).realize()
    assert GlobalCounters.kernel_count == 1 and GlobalCounters.global_ops == 2
    GlobalCounters.kernel_count += 4
    assert GlobalCounters.kernel_count == 5
    GlobalCounters.reset()
    assert GlobalCounters.kernel_count == 0 and GlobalCounters.mem_used > 0  # live memory is kept


def test_op_enum_keeps_its_enum_behaviour():
    assert type(Ops).__dict__.get("__getattr__") is None or sys.version_info >= (3, 12)
    assert Ops["ADD"] is Ops.ADD and Ops(Ops.ADD.value) is Ops.ADD
    assert list(Ops)[0] is Ops.BUFFER and len(Ops) == len(Ops.__members__) and Ops.SINK in Ops
    assert pickle.loads(pickle.dumps(Ops.WHERE)) is Ops.WHERE
    assert repr(Ops.ADD) == "Ops.ADD" and Ops.ADD.name == "ADD"
    with pytest.raises(AttributeError):
        Ops.NOT_AN_OP  # noqa: B018
    with pytest.raises(AttributeError):
        Ops.ADD = 3
    with pytest.raises(AttributeError):
        del Ops.ADD
    Ops.extra_note = "set"  # other class attributes can be set and deleted (mock.patch does)
    assert Ops.extra_note == "set"
    del Ops.extra_note
    assert not hasattr(Ops, "extra_note")


def test_scalar_operand_builds_the_general_paths_nodes_with_fewer_calls():
    x = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4)).realize()
    i = Tensor(np.arange(12, dtype=np.int32).reshape(3, 4)).realize()
    # the same nodes as a constant tensor broadcast by hand (hash-consing makes them the same objects)
    two = Tensor(2.0).reshape(1, 1).expand(3, 4)
    assert (x * 2).uop is (x * two).uop and (2 * x).uop is (two * x).uop
    assert (x - 1.5).uop is (x - Tensor(1.5).reshape(1, 1).expand(3, 4)).uop
    # promotions still go through the general path: int tensor with a float scalar is float
    assert (i * 2.5).dtype == dtypes.float32 and (i * 2).dtype == dtypes.int32
    np.testing.assert_array_equal((2 - x).numpy(), 2 - np.arange(12, dtype=np.float32).reshape(3, 4))
    np.testing.assert_array_equal(((x * 2 + 1).relu() * x).numpy(),
                                  np.maximum(np.arange(12, dtype=np.float32) * 2 + 1, 0).reshape(3, 4) *
                                  np.arange(12, dtype=np.float32).reshape(3, 4))
    x * 2
    # a scalar's nodes at a shape are kept for the next op (tensor._const_nodes): 21 calls now, 93 when
    # they were made again each time, 171 before the scalar path
    assert _python_calls(lambda: x * 2) <= 40
    (x * 2 + 1).relu() * x
    assert _python_calls(lambda: (x * 2 + 1).relu() * x) <= 220  # 159 now, then 408, and 766 at first


def test_kept_scalar_nodes_tell_signed_zeros_and_types_apart():
    x = Tensor(np.array([1.0, -2.0, 0.0], np.float32)).realize()
    pos, neg = x * 0.0, x * -0.0  # 0.0 == -0.0 in Python: a key on the value alone would mix them up
    assert pos.uop is not neg.uop
    np.testing.assert_array_equal(np.signbit(pos.numpy()), np.signbit(np.array([1.0, -2.0, 0.0], np.float32) * 0.0))
    np.testing.assert_array_equal(np.signbit(neg.numpy()), np.signbit(np.array([1.0, -2.0, 0.0], np.float32) * -0.0))
    for scalar in (np.float32(-0.0), np.float64(-0.0)):  # NumPy scalars are not kept: still exact
        np.testing.assert_array_equal(np.signbit((x * scalar).numpy()), np.signbit(np.array([1.0, -2.0, 0.0]) * -0.0))
    b = Tensor(np.array([True, False]))
    i = Tensor(np.array([3, 4], np.int32))
    assert (b * True).dtype == dtypes.bool and (b * 1).dtype == dtypes.default_int  # bool/int keys differ
    assert (i * True).numpy().tolist() == [3, 4] and (i * 2).numpy().tolist() == [6, 8]
    y = Tensor(np.ones((2, 3), np.float32))
    assert (y * 2).shape == (2, 3) and (x * 2).shape == (3,)  # keyed by shape
    for n in range(tensor_module._CONST_NODES_MAX + 5):  # bounded: the table is cleared when full
        x + float(n)
    assert len(tensor_module._const_nodes) <= tensor_module._CONST_NODES_MAX
    np.testing.assert_array_equal((x + 7.0).numpy(), np.array([8.0, 5.0, 7.0], np.float32))


def test_matmul_build_and_cached_realize_stay_within_call_budgets():
    # Shape arguments and node args are checked for plain ints in C (a frozenset's issuperset over
    # map(type, ...)), not by a generator per element, and Tensor.shape/ndim read the node's filled slot:
    # here a @ b was built in 424 Python calls and its cached realize took 94 before that; 306 and 58 now.
    a = Tensor(np.arange(64 * 48, dtype=np.float32).reshape(64, 48) / 100).realize()
    b = Tensor(np.arange(48 * 32, dtype=np.float32).reshape(48, 32) / 100).realize()
    for _ in range(3):
        (a @ b).realize()
    n_build = _python_calls(lambda: a @ b)
    assert n_build <= 340, n_build
    c = a @ b
    n_realize = _python_calls(lambda: c.realize())
    assert n_realize <= 70, n_realize
    np.testing.assert_allclose(c.numpy(), a.numpy() @ b.numpy(), rtol=1e-5)
    # sizes that are not plain ints still take the careful paths
    v = Variable("n", 1, 64)
    assert (a.shrink(((0, v.bind(8)), None)) @ b).shape[1] == 32
    r = a.reshape(np.int64(48), True + 63)
    assert r.shape == (48, 64) and all(type(s) is int for s in r.shape)
