"""JIT capture and replay: values against NumPy, input checks, no scheduler on replay, compile()."""
import numpy as np
import pytest

from polygrad import GlobalCounters, JitError, Tensor, TinyJit, compile, jit
from polygrad.engine import programs, realize

from conftest import DEVICES  # every usable backend: CPU, INTERP, X86, ...


def _t(arr, device):
    return Tensor(np.asarray(arr, dtype=np.float32), device=device).realize()


@pytest.mark.parametrize("device", DEVICES)
def test_values_across_warmup_capture_replay(device):
    @jit
    def f(x, y):
        return ((x * y).sum(1) + x.max(1)).realize()

    rng = np.random.default_rng(0)
    for _ in range(5):
        a, b = rng.standard_normal((3, 5)).astype(np.float32), rng.standard_normal((3, 5)).astype(np.float32)
        out = f(_t(a, device), _t(b, device))
        np.testing.assert_allclose(out.numpy(), (a * b).sum(1) + a.max(1), rtol=1e-5, atol=1e-5)
    s = f.stats()
    assert (s["calls"], s["captures"], s["replays"]) == (5, 1, 3)
    assert s["captured_kernels"] >= 1 and s["state"] == "captured"


@pytest.mark.parametrize("device", DEVICES)
def test_replay_runs_no_scheduler_or_compiler(device, monkeypatch):
    @jit
    def f(x):
        return (x.exp() + 1).realize()

    for i in range(2):
        f(_t([i, i + 1.0], device))
    x = _t([0.5, -1.0], device)

    def boom(*a, **k):
        raise AssertionError("replay reached the scheduler or compiler")

    monkeypatch.setattr(realize, "realize_uops", boom)
    monkeypatch.setattr(programs, "get_program", boom)
    monkeypatch.setattr(realize, "normalize", boom)
    monkeypatch.setattr(realize, "template_for", boom)
    out = f(x)
    np.testing.assert_allclose(out.numpy(), np.exp([0.5, -1.0]) + 1, rtol=1e-5)


def test_replay_returns_the_captured_tensors_like_tinygrad():
    f = jit(lambda x: (x + 1).realize())
    f(_t([1, 2], "CPU"))
    captured = f(_t([3, 4], "CPU"))
    replayed = f(_t([5, 6], "CPU"))
    assert replayed is captured
    assert replayed.numpy().tolist() == [6.0, 7.0]


def test_shape_change_after_capture_raises():
    f = jit(lambda x: (x * 2).realize())
    f(_t([1, 2, 3], "CPU"))
    f(_t([1, 2, 3], "CPU"))
    with pytest.raises(JitError, match="shape|inputs changed"):
        f(_t([1, 2, 3, 4], "CPU"))


def test_dtype_change_after_capture_raises():
    f = jit(lambda x: (x * 2).realize())
    f(_t([1, 2, 3], "CPU"))
    f(_t([1, 2, 3], "CPU"))
    with pytest.raises(JitError):
        f(Tensor([1, 2, 3], dtype="int32", device="CPU").realize())


def test_same_buffer_passed_twice_is_rejected():
    f = jit(lambda x, y: (x + y).realize())
    x = _t([1, 2], "CPU")
    with pytest.raises(JitError, match="same realized buffer"):
        f(x, x)


def test_function_without_kernels_is_rejected_at_capture():
    f = jit(lambda x: x)
    x = _t([1, 2], "CPU")
    f(x)
    with pytest.raises(JitError, match="no kernels"):
        f(_t([3, 4], "CPU"))


def test_lazy_inputs_are_realized_and_kwargs_count():
    @jit
    def f(x, *, scale):
        return (x * scale).realize()

    for i in range(4):
        base = _t([1, 2, 3], "CPU")
        out = f(base + i, scale=_t([2, 2, 2], "CPU"))  # lazy positional input
        assert out.numpy().tolist() == [2.0 * (1 + i), 2.0 * (2 + i), 2.0 * (3 + i)]


def test_jitted_method_binds_self():
    class Model:
        def __init__(self):
            self.w = _t([1, 2, 3], "CPU")

        @TinyJit
        def __call__(self, x):
            return (x * self.w).sum().realize()

    m = Model()
    vals = [m(_t([i, i, i], "CPU")).item() for i in range(4)]
    assert vals == [0.0, 6.0, 12.0, 18.0]


def test_counters_advance_on_replay():
    f = jit(lambda x: ((x + 1) * 2).contiguous().sum().realize())
    for i in range(2):
        f(_t(np.arange(8), "CPU"))
    GlobalCounters.reset()
    f(_t(np.arange(8), "CPU"))
    assert GlobalCounters.kernel_count == f.stats()["captured_kernels"]
    assert GlobalCounters.global_ops > 0


@pytest.mark.parametrize("device", DEVICES)
def test_compile_run_stats_dispose(device):
    def step(x):
        return (x + 1).realize()

    compiled = compile(step, [Tensor([1, 2, 3], device=device).realize()])
    out = compiled.run([Tensor([7, 8, 9], device=device).realize()])
    assert out.numpy().tolist() == [8, 9, 10]
    s = compiled.stats()
    assert s["captures"] == 1 and s["replays"] == 1 and s["calls"] == 3
    compiled.dispose()
    with pytest.raises(JitError, match="disposed"):
        compiled.run([Tensor([1, 2, 3], device=device).realize()])


@pytest.mark.parametrize("device", DEVICES)
def test_copy_from_keeps_identity_for_replay(device):
    x = _t([1, 2, 3], device)
    f = compile(lambda x: x.square().sum().realize(), [x])
    assert f.run([x]).item() == 14.0
    x.copy_from(np.array([4, 5, 6], dtype=np.float32))
    assert f.run([x]).item() == 77.0
    x.update_from(np.array([1, 1, 1], dtype=np.float32))
    assert f.run([x]).item() == 3.0


def test_data_flow_update_from_keeps_buffer():
    x = Tensor.empty((4,), dtype="float32", device="CPU")
    x.copy_from(np.array([1, 2, 3, 4], dtype=np.float32))
    buf = x._buffer()
    x.update_from(np.array([5, 6, 7, 8], dtype=np.float32))
    assert x._buffer() is buf
    assert (x + 1).numpy().tolist() == [6.0, 7.0, 8.0, 9.0]


def test_random_numbers_are_fresh_on_replay_and_match_eager():
    @jit
    def f(x):
        return (x + Tensor.rand(4, device="CPU")).realize()

    Tensor.manual_seed(7)
    eager = [Tensor.rand(4, device="CPU").numpy() for _ in range(5)]
    Tensor.manual_seed(7)
    jitted = [f(_t(np.zeros(4), "CPU")).numpy().copy() for _ in range(5)]
    assert f.stats()["replays"] == 3
    np.testing.assert_array_equal(np.array(jitted), np.array(eager))


# ---- inputs beyond plain Tensor arguments (issue 11): nothing is silently replayed stale

@pytest.mark.parametrize("wrap", ["list", "tuple", "dict", "nested"])
def test_tensors_nested_in_containers_are_inputs(wrap):
    def pack(a, b):
        return {"list": [a, b], "tuple": (a, b), "dict": {"a": a, "b": b}, "nested": [{"a": (a,)}, [b]]}[wrap]

    def unpack(p):
        return {"list": lambda: p, "tuple": lambda: p, "dict": lambda: (p["a"], p["b"]),
                "nested": lambda: (p[0]["a"][0], p[1][0])}[wrap]()

    f = jit(lambda p: (unpack(p)[0] * 10 + unpack(p)[1]).realize())
    for i in range(5):
        out = f(pack(_t([i, 2 * i], "CPU"), _t([1, 1], "CPU")))
        assert out.numpy().tolist() == [10.0 * i + 1, 20.0 * i + 1]
    assert f.stats()["replays"] == 3


def test_non_tensor_arguments_are_part_of_the_capture_key():
    f = jit(lambda x, k, opts: (x * k + opts["shift"]).realize())
    for k in (2, 3, 4, 5, 5, 5, 2.5):
        out = f(_t([1, 2], "CPU"), k, {"shift": 1})
        assert out.numpy().tolist() == [k + 1, 2 * k + 1], k
    out = f(_t([1, 2], "CPU"), 5, {"shift": 7})
    assert out.numpy().tolist() == [12.0, 17.0]
    assert f.stats()["replays"] == 2  # the second and third calls with k=5; each change warmed up again


def test_non_tensor_objects_compare_by_identity():
    class Scale:
        def __init__(self, k):
            self.k = k

    f = jit(lambda x, s: (x * s.k).realize())
    a, b = Scale(2.0), Scale(3.0)
    for s in (a, a, a, b, b, b, a):
        assert f(_t([1, 2], "CPU"), s).numpy().tolist() == [s.k, 2 * s.k]


def test_host_readback_during_capture_raises():
    def g(x):
        y = (x * 2).realize()
        scale = y.sum().item()  # would be frozen into the replay
        return (y * scale).realize()

    f = jit(g)
    f(_t([1, 2], "CPU"))  # the warm-up runs plainly
    with pytest.raises(JitError, match=r"item\(\).*outside the jitted function"):
        f(_t([1, 2], "CPU"))
    h = jit(lambda x: Tensor((x + 1).numpy()).realize())
    h(_t([1, 2], "CPU"))
    with pytest.raises(JitError, match=r"numpy\(\)"):
        h(_t([1, 2], "CPU"))
    assert Tensor([1.0, 2.0]).sum().item() == 3.0  # the guard is gone after the error


def test_jitted_function_calling_itself_raises():
    @jit
    def f(x, depth):
        if depth:
            return f(x, depth - 1) + 1
        return (x * 2).realize()

    with pytest.raises(JitError, match="called itself"):
        for _ in range(3):
            f(_t([1, 2], "CPU"), 1)
    assert f(_t([1, 2], "CPU"), 0).numpy().tolist() == [2.0, 4.0]  # still usable without recursion


def test_replay_with_the_same_inputs_checks_them_once(monkeypatch):
    """A replay whose arguments are the very realized tensors of the last replay reuses that call's checked
    buffers and shapes (engine/jit.py TinyJit._inputs): no argument walk. New data in the same buffers is
    still read, another tensor is checked again, and a freed-and-changed input is still rejected."""
    from polygrad.engine import jit as jit_mod
    f = jit(lambda x, y: (x * y).realize())
    x, y = _t([1, 2, 3], "CPU"), _t([4, 5, 6], "CPU")
    for _ in range(3):
        f(x, y)
    calls = []
    real = jit_mod._prepare_inputs
    monkeypatch.setattr(jit_mod, "_prepare_inputs", lambda *a: calls.append(1) or real(*a))
    for _ in range(5):
        out = f(x, y)
    assert calls == [] and out.numpy().tolist() == [4.0, 10.0, 18.0]
    x.assign(Tensor(np.array([2, 2, 2], np.float32))).realize()  # new values, same buffer
    assert f(x, y).numpy().tolist() == [8.0, 10.0, 12.0]
    z = _t([1, 1, 1], "CPU")
    assert f(z, y).numpy().tolist() == [4.0, 5.0, 6.0] and len(calls) >= 1
    with pytest.raises(JitError):
        f(z, z)
    with pytest.raises(JitError):
        f(_t([1, 2], "CPU"), y)
