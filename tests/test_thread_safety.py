"""State that threads share while they build graphs and realize them stays consistent.

Each test makes threads meet at the shared structure: hash-consed UOps, the live-tensor list, the
allocation cache and its counters, linalg's replayed steps, the settings a `Context` changes and the
RNG counter a Model capture uses. Values are checked against NumPy. The races on shared tables need a
thread switch at one particular bytecode, so those tests shorten the switch interval and run enough
iterations that the unguarded code of ec20aa0 failed in every run we made (see each test's note);
the `Context` and RNG tests force their interleaving with events and fail there every time.
"""
from __future__ import annotations

import gc
import sys
import threading
import weakref

import numpy as np
import pytest

from polygrad import Context, Model, Tensor, config, device, linalg
from polygrad.device import Buffer
from polygrad.engine.live import live_tensors
from polygrad.dtype import dtypes
from polygrad.uop.ops import Ops, UOp


@pytest.fixture
def fast_switching():
    """Threads switch every microsecond (the default is 5 ms), so a race window of a few bytecodes opens."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(old)


def _in_threads(n: int, fn) -> list:
    """fn(k) in n threads started together; returns their results (a thread's exception is re-raised)."""
    results: list = [None] * n
    errors: list[BaseException] = []
    start = threading.Barrier(n)

    def run(k: int) -> None:
        try:
            start.wait()
            results[k] = fn(k)
        except BaseException as e:  # noqa: BLE001 (re-raised below, in the test's thread)
            errors.append(e)
    threads = [threading.Thread(target=run, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def test_hash_consing_makes_one_node_per_structure_across_threads(fast_switching):
    # ec20aa0: 11 to 21 of 50,000 nodes came back twice (two threads both missed, both inserted)
    made = _in_threads(2, lambda k: [UOp(Ops.CONST, dtypes.int32, (), 7_000_000 + i) for i in range(50_000)])
    assert sum(a is not b for a, b in zip(*made)) == 0


def test_live_tensor_list_keeps_tensors_made_during_a_sweep(fast_switching):
    # ec20aa0: about 45 of 80 kept tensors were missing (a sweep replaced the list an append went to);
    # backward() and the overwrite checks look for tensors in this list
    kept: list[Tensor] = []
    done = threading.Event()

    def make(k: int) -> None:
        if k == 1:
            while not done.is_set():
                live_tensors()
            return
        x = Tensor(np.ones(4, np.float32))
        for i in range(8000):
            t = x + i
            if i % 100 == 0:
                kept.append(t)
        done.set()
    _in_threads(2, make)
    live = {id(t) for t in live_tensors()}
    assert sum(id(t) not in live for t in kept) == 0


def test_allocation_counts_stay_exact_under_concurrent_frees(fast_switching):
    # ec20aa0: buffers_live ended off by 1 to 3 in three runs of four (lost read-modify-writes)
    Buffer("CPU", 16, dtypes.float32).ensure_allocated()  # opens the device outside the threads
    gc.collect()
    live, cached = dict(device.buffers_live), device.alloc_cache_bytes["total"]

    def churn(k: int) -> None:
        for _ in range(40_000):
            Buffer("CPU", 16, dtypes.float32).ensure_allocated()  # freed at once, into the reuse cache
    _in_threads(3, churn)
    gc.collect()
    assert device.buffers_live.get("CPU", 0) == live.get("CPU", 0)
    in_cache = sum(nbytes * len(v) for (_, nbytes), v in device._alloc_cache.items())
    assert device.alloc_cache_bytes["total"] == in_cache >= cached


def test_linalg_steps_replay_per_thread(fast_switching):
    # ec20aa0: 1 to 6 of 24 solves were wrong (threads replayed one captured step on each other's buffers)
    def solve(k: int) -> int:
        rng = np.random.default_rng(k)
        wrong = 0
        for _ in range(8):
            a = rng.standard_normal((40, 40)).astype(np.float32) + 6 * np.eye(40, dtype=np.float32)
            b = rng.standard_normal((40, 2)).astype(np.float32)
            got = linalg.solve(Tensor(a, device="CPU"), Tensor(b, device="CPU")).numpy()
            wrong += not np.allclose(got, np.linalg.solve(a, b), rtol=1e-3, atol=1e-3)
        return wrong
    solve(99)  # the first capture of the steps, alone
    assert _in_threads(3, solve) == [0, 0, 0]


def test_settings_contexts_are_per_thread():
    entered, leave = threading.Event(), threading.Event()
    seen = []

    def other() -> None:
        with Context(TRAINING=1):
            entered.set()
            leave.wait(30)
            seen.append(config.get("TRAINING"))
        with Tensor.train():
            seen.append(Tensor.training)
    t = threading.Thread(target=other)
    t.start()
    entered.wait(30)
    try:
        assert config.get("TRAINING") == 0 and not Tensor.training  # the other thread's Context is its own
        with Context(TRAINING=0, BEAM=0):
            leave.set()  # the other thread leaves its Context while this one is open
            t.join(30)
            assert config.get("TRAINING") == 0
        with Context(TRAINING=1):
            config.set_value("TRAINING", 0)  # ends with this Context, as before
            assert config.get("TRAINING") == 0
        assert config.get("TRAINING") == 0 and seen == [1, True]
    finally:
        leave.set()
        t.join(30)


def test_random_draws_in_another_thread_survive_a_model_capture():
    # ec20aa0 restored the global RNG counter after capture, so a key drawn meanwhile was drawn again
    in_capture, drawn = threading.Event(), threading.Event()
    first = []

    class Net:
        def __init__(self):
            self.w = Tensor(np.ones((3, 2), np.float32))

        def __call__(self, x):
            if not in_capture.is_set():
                in_capture.set()
                drawn.wait(30)
            return x @ self.w

    def other() -> None:
        in_capture.wait(30)
        try:
            first.append(Tensor.rand(8).realize())  # read after the capture (ec20aa0 refused it during)
        except BaseException as e:  # noqa: BLE001 (reported below)
            first.append(e)
        drawn.set()
    t = threading.Thread(target=other)
    t.start()
    try:
        m = Model(Net(), inputs={"x": Tensor.empty(2, 3)})
    finally:
        drawn.set()
        t.join(30)
    assert isinstance(first[0], Tensor), f"the other thread's draw failed: {first[0]!r}"
    later = Tensor.rand(8).numpy()
    assert not np.array_equal(first[0].numpy(), later), "a random key was handed out twice"
    np.testing.assert_allclose(m.forward(x=np.ones((2, 3), np.float32))["output"].numpy(), np.full((2, 2), 3.0))
    m.dispose()



def test_a_node_made_again_before_the_dead_ones_entry_went_keeps_its_entry():
    # The hash-cons table takes no lock (uop/ops.py): between a node's death and its _forget, another
    # thread may make the node again, which replaces the dead entry. _forget must then leave that live
    # entry alone, or the next lookup makes a second node. A weak-reference callback registered after the
    # node's own runs before _forget, so it stands in for that thread here, deterministically.
    key = 9_100_000
    node = UOp(Ops.CONST, dtypes.int32, (), key)
    made: list[UOp] = []
    probe = weakref.ref(node, lambda _: made.append(UOp(Ops.CONST, dtypes.int32, (), key)))
    del node
    assert probe() is None and len(made) == 1
    assert UOp(Ops.CONST, dtypes.int32, (), key) is made[0]
