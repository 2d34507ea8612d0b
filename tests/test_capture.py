"""engine/capture.py: what a capture records, buffer roles, replay against NumPy, typed errors, and
that TinyJit and linalg's step loops are built on it."""
import numpy as np
import pytest

from polygrad import JitError, Tensor, jit
from polygrad.engine import capture as cap_mod
from polygrad.engine import programs, realize
from polygrad.engine.capture import CaptureError, CapturedGraph, capture
from polygrad.errors import PolygradError
from polygrad.uop.ops import AxisKind, Ops

from conftest import DEVICES  # every usable backend: CPU, INTERP, X86, ...


def _t(arr, device="CPU"):
    return Tensor(np.asarray(arr, dtype=np.float32), device=device).realize()


def _mlp_like(x, w):
    h = (x * w).contiguous()  # kernel 1: elementwise into a new buffer
    return (h.sum(1) + h.max(1)).realize()  # kernel 2: two reductions fused


def _capture_mlp_like(device):
    x, w = _t(np.arange(6).reshape(2, 3), device), _t([1.0, 2.0, 3.0], device)
    with capture() as cap:
        y = _mlp_like(x, w)
    return cap, x, w, y


@pytest.mark.parametrize("device", DEVICES)
def test_records_device_independent_kernels_in_order(device):
    cap, *_ = _capture_mlp_like(device)
    assert [x.kind for x in cap.launches] == ["kernel", "kernel"] and len(cap.kernels) == 2
    for launch in cap.launches:
        assert launch.device == device and launch.var_vals == {}
        assert launch.ast.op is Ops.SINK
        kinds = {n.arg[1] for n in launch.ast.toposort() if n.op is Ops.RANGE}
        assert kinds and kinds <= {AxisKind.GLOBAL, AxisKind.REDUCE}  # not lowered: no upcast/thread ranges
        assert programs.program_cache[(launch.ast, device)] is launch.program  # the program it ran
        assert launch.program.spec.ast is not launch.ast  # the lowered form lives in the program only
    assert {n.arg[1] for n in cap.launches[1].ast.toposort() if n.op is Ops.RANGE} == {AxisKind.GLOBAL, AxisKind.REDUCE}


def test_records_copies_with_dst_and_src():
    x = _t([1.0, 2.0, 3.0], "CPU")
    with capture() as cap:
        y = x.to("INTERP").realize()
    kinds = [launch.kind for launch in cap.launches]
    assert "copy" in kinds
    copy = cap.launches[kinds.index("copy")]
    assert copy.ast is None and copy.program is None and len(copy.buffers) == 2
    assert copy.buffers[0] is y._buffer()
    g = cap.graph(inputs=[x._buffer()], outputs=[y._buffer()])
    assert g.n_copies == 1
    out = g.replay([_t([7.0, 8.0, 9.0], "CPU")._buffer()])
    assert out[0].numpy().tolist() == [7.0, 8.0, 9.0]


def test_buffer_roles():
    cap, x, w, y = _capture_mlp_like("CPU")
    g = cap.graph(inputs=[x._buffer()], outputs=[y._buffer()])
    role = dict(zip(map(id, g.buffers), g.roles))
    assert role[id(x._buffer())] == "input"
    assert role[id(w._buffer())] == "param"  # alive before the capture, kept by reference
    assert role[id(y._buffer())] == "intermediate"  # made by the captured work
    assert g.roles.count("intermediate") == 2  # h and y
    assert g.input_slots == [g.buffers.index(x._buffer())]
    assert [g.buffers[s] for s in g.output_slots] == [y._buffer()]
    assert g.intermediate_slots == [s for s, r in enumerate(g.roles) if r == "intermediate"]
    # launches are expressed over table slots: what an exporter serializes with the asts
    assert [tuple(g.buffers[s] for s in launch.args) for launch in g.launches] == \
           [tuple(launch.buffers) for launch in cap.launches]
    assert [s.role for s in g.slots()] == g.roles and g.slots()[0].size == g.buffers[0].size
    assert g.n_kernels == 2 and g.n_copies == 0 and g.ops > 0


def test_host_data_made_inside_a_capture_is_a_param():
    x = _t([1.0, 2.0], "CPU")
    with capture() as cap:
        c = Tensor(np.array([10.0, 20.0], np.float32))
        y = (x + c).realize()
    g = cap.graph(inputs=[x._buffer()], outputs=[y._buffer()])
    assert dict(zip(map(id, g.buffers), g.roles))[id(c._buffer())] == "param"


@pytest.mark.parametrize("device", DEVICES)
def test_replay_with_new_inputs_matches_numpy(device):
    cap, x, w, y = _capture_mlp_like(device)
    g = cap.graph(inputs=[x._buffer(), w._buffer()], outputs=[y._buffer()])
    rng = np.random.default_rng(0)
    for _ in range(3):
        a, b = rng.standard_normal((2, 3)).astype(np.float32), rng.standard_normal(3).astype(np.float32)
        (out,) = g.replay([_t(a, device)._buffer(), _t(b, device)._buffer()])
        assert out is y._buffer()  # intermediates are reused unless scratch is given
        h = a * b
        np.testing.assert_allclose(out.numpy(), h.sum(1) + h.max(1), rtol=1e-5, atol=1e-5)


def test_replay_into_fresh_scratch_keeps_earlier_results():
    cap, x, w, y = _capture_mlp_like("CPU")
    g = cap.graph(inputs=[x._buffer()], outputs=[y._buffer()])
    (first,) = g.replay([_t(np.ones((2, 3)))._buffer()], scratch=g.new_scratch())
    (second,) = g.replay([_t(np.zeros((2, 3)))._buffer()], scratch=g.new_scratch())
    assert first is not second and first is not y._buffer()
    assert first.numpy().tolist() == [9.0, 9.0] and second.numpy().tolist() == [0.0, 0.0]
    with pytest.raises(CaptureError, match="intermediates"):
        g.bind_scratch([])


def test_replay_counts_kernels_and_skips_scheduler(monkeypatch):
    from polygrad import GlobalCounters
    cap, x, w, y = _capture_mlp_like("CPU")
    g = cap.graph(inputs=[x._buffer()], outputs=[y._buffer()])

    def boom(*a, **k):
        raise AssertionError("replay reached the scheduler or compiler")

    monkeypatch.setattr(programs, "get_program", boom)
    monkeypatch.setattr(realize, "run_template", boom)
    GlobalCounters.reset()
    g.replay([_t(np.ones((2, 3)))._buffer()])
    assert GlobalCounters.kernel_count == 2 and GlobalCounters.global_ops == g.ops


def test_var_vals_are_recorded_empty_and_checked_on_replay():
    cap, x, w, y = _capture_mlp_like("CPU")
    g = cap.graph(inputs=[x._buffer()], outputs=[y._buffer()])
    assert all(launch.var_vals == {} for launch in g.launches)
    g.replay([x._buffer()], var_vals={})
    with pytest.raises(CaptureError, match="variable"):
        g.replay([x._buffer()], var_vals={"n": 3})


def test_replay_input_checks():
    cap, x, w, y = _capture_mlp_like("CPU")
    g = cap.graph(inputs=[x._buffer()], outputs=[y._buffer()])
    with pytest.raises(CaptureError, match="inputs"):
        g.replay([])
    with pytest.raises(CaptureError, match="captured with 6"):
        g.replay([_t(np.ones(5))._buffer()])
    with pytest.raises(CaptureError, match="twice"):
        cap.graph(inputs=[x._buffer(), x._buffer()])


def test_nested_captures_all_record():
    x = _t([1.0, 2.0], "CPU")
    with capture() as outer:
        a = (x + 1).realize()
        with capture() as inner:
            b = (a * 3).realize()
        c = (b - 1).realize()
    assert len(inner.launches) == 1 and len(outer.launches) == 3
    assert outer.launches[1] is inner.launches[0]
    # a is made inside the outer capture but before the inner one: an intermediate only for outer
    og = outer.graph(inputs=[x._buffer()], outputs=[c._buffer()])
    ig = inner.graph(inputs=[], outputs=[b._buffer()])
    assert dict(zip(map(id, og.buffers), og.roles))[id(a._buffer())] == "intermediate"
    assert dict(zip(map(id, ig.buffers), ig.roles))[id(a._buffer())] == "param"
    assert og.replay([_t([5.0, 6.0])._buffer()])[0].numpy().tolist() == [17.0, 20.0]
    assert not realize.capture_hooks()  # the hook is installed only while a capture is active


def test_replay_inside_a_capture_is_recorded_with_its_intermediates():
    cap, x, w, y = _capture_mlp_like("CPU")
    g = cap.graph(inputs=[x._buffer()], outputs=[y._buffer()])
    x2 = _t(np.ones((2, 3)))
    with capture() as outer:
        g.replay([x2._buffer()])
    assert [launch.ast for launch in outer.launches] == [launch.ast for launch in g.launches]
    og = outer.graph(inputs=[x2._buffer()], outputs=[y._buffer()])
    assert sorted(og.roles) == sorted(g.roles)  # g's scratch counts as made by the captured work


def test_misuse_raises_typed_errors():
    assert issubclass(CaptureError, PolygradError) and issubclass(CaptureError, RuntimeError)
    c = capture()
    with c:
        with pytest.raises(CaptureError, match="still recording"):
            c.graph()
        with pytest.raises(CaptureError, match="records once"):
            c.__enter__()
    with pytest.raises(CaptureError, match="records once"):
        with c:
            pass
    a, b = capture(), capture()
    a.__enter__()
    b.__enter__()
    with pytest.raises(CaptureError, match="reverse order"):
        a.__exit__(None, None, None)
    b.__exit__(None, None, None)
    assert not cap_mod.active() and not realize.capture_hooks()


def test_random_keys_are_refilled_on_replay():
    x = _t(np.zeros(4))
    with capture() as cap:
        y = (x + Tensor.rand(4, device="CPU")).realize()
    g = cap.graph(inputs=[x._buffer()], outputs=[y._buffer()])
    assert len(g.rng_slots) == 1 and g.roles[g.rng_slots[0]] == "param"
    first = y.numpy().copy()
    second = g.replay([x._buffer()])[0].numpy().copy()
    third = g.replay([x._buffer()])[0].numpy().copy()
    assert not np.array_equal(first, second) and not np.array_equal(second, third)


# ---- the users of the layer


def _count_calls(monkeypatch, cls, name):
    calls = []
    orig = getattr(cls, name)

    def wrapper(self, *a, **k):
        calls.append(self)
        return orig(self, *a, **k)

    monkeypatch.setattr(cls, name, wrapper)
    return calls


def test_tinyjit_captures_and_replays_through_the_layer(monkeypatch):
    entered = _count_calls(monkeypatch, cap_mod.Capture, "__enter__")
    launched = _count_calls(monkeypatch, CapturedGraph, "launch")
    f = jit(lambda x: (x * 2 + 1).realize())
    outs = [f(_t([i, i + 1.0])).numpy().tolist() for i in range(5)]
    assert outs == [[2 * i + 1, 2 * i + 3] for i in range(5)]
    assert len(entered) == 1 and len(launched) == 3
    assert isinstance(f.graph, CapturedGraph) and f.graph.n_kernels == f.stats()["captured_kernels"] == 1
    assert f.graph.roles.count("input") == 1


def test_tinyjit_inside_a_capture_runs_plainly_and_is_recorded():
    f = jit(lambda x: (x + 1).realize())
    for i in range(3):
        f(_t([i, i]))
    with capture() as cap:
        out = f(_t([5.0, 6.0]))
    assert out.numpy().tolist() == [6.0, 7.0] and len(cap.kernels) == 1
    assert f.stats()["replays"] == 1  # the call inside the capture did not count as a replay
    with pytest.raises(JitError, match="no kernels"):
        g = jit(lambda x: x)
        g(_t([1.0]))
        g(_t([2.0]))


def test_linalg_steps_capture_once_and_replay_through_the_layer(monkeypatch):
    from polygrad import linalg
    linalg.clear_cache()
    entered = _count_calls(monkeypatch, cap_mod.Capture, "__enter__")
    launched = _count_calls(monkeypatch, CapturedGraph, "launch")
    rng = np.random.default_rng(3)
    a = rng.standard_normal((5, 5)).astype(np.float32) + 5 * np.eye(5, dtype=np.float32)
    b = rng.standard_normal((5, 2)).astype(np.float32)
    x = Tensor(a, device="CPU").solve(Tensor(b, device="CPU")).numpy()
    np.testing.assert_allclose(x, np.linalg.solve(a, b), rtol=1e-4, atol=1e-5)
    # one capture per distinct step (panel step, block update); the other 4 + 0 runs are replays
    assert len(entered) == len(linalg._replays) == 2
    assert len(launched) == 4
    for r in linalg._replays.values():
        assert isinstance(r.graph, CapturedGraph) and "param" not in r.graph.roles
    x2 = Tensor(a.T.copy(), device="CPU").solve(Tensor(b, device="CPU")).numpy()  # now all replays
    np.testing.assert_allclose(x2, np.linalg.solve(a.T, b), rtol=1e-4, atol=1e-5)
    assert len(entered) == 2 and len(launched) == 4 + 6


def test_linalg_inside_a_capture_is_recorded():
    from polygrad import linalg
    linalg.clear_cache()
    a = Tensor([[4.0, 2.0], [2.0, 5.0]], device="CPU").realize()
    b = Tensor([1.0, 3.0], device="CPU").realize()
    a.solve(b).realize()  # the linalg steps are captured here, outside the capture below
    with capture() as cap:
        x = a.solve(b).realize()
    g = cap.graph(inputs=[a._buffer(), b._buffer()], outputs=[x._buffer()])
    assert g.n_kernels > 2 and g.n_copies == 0
    # linalg's scratch buffers existed before the capture but count as intermediates
    assert g.roles.count("intermediate") > g.roles.count("param")
    a2, b2 = np.array([[3.0, 1.0], [1.0, 2.0]], np.float32), np.array([1.0, 1.0], np.float32)
    (out,) = g.replay([_t(a2)._buffer(), _t(b2)._buffer()])
    np.testing.assert_allclose(out.numpy(), np.linalg.solve(a2, b2), rtol=1e-5, atol=1e-6)


def _launch_counter(monkeypatch):
    ran = []
    real = programs.CompiledProgram.launch
    monkeypatch.setattr(programs.CompiledProgram, "launch",
                        lambda self, *a, **k: ran.append(self) or real(self, *a, **k))
    return ran


@pytest.mark.parametrize("device", DEVICES)
def test_deferred_capture_records_without_compiling_and_a_read_runs_what_is_pending(monkeypatch, device):
    """realize.deferred() (Model's capture run): launches are recorded with no program, nothing is compiled or
    run, and what is still pending at the end is dropped; a host read inside the block first runs the pending
    launches in order, so it sees NumPy's values."""
    ran = _launch_counter(monkeypatch)
    x, w = _t(np.arange(6).reshape(2, 3), device), _t([1.0, 2.0, 3.0], device)
    with realize.deferred(), capture() as cap:
        h = (x * w * 1.4375).contiguous().realize()  # this test's constant: a kernel new to the program cache
        y = (h.sum(1) - 0.8125).realize()
    assert ran == [] and [launch.program for launch in cap.launches] == [None, None]
    assert all((launch.ast, device) not in programs.program_cache for launch in cap.launches)
    with realize.deferred(), capture() as cap:
        h = (x * w * 1.4375).contiguous().realize()
        y = (h.sum(1) - 0.8125).realize()
        assert ran == []
        got = y.numpy()  # runs both kernels first
        assert len(ran) == 2
    np.testing.assert_allclose(got, (np.arange(6).reshape(2, 3) * [1.0, 2.0, 3.0] * 1.4375).sum(1) - 0.8125)
    assert len(cap.launches) == 2  # the read's own work is not recorded twice


@pytest.mark.parametrize("device", DEVICES)
def test_graph_of_a_deferred_capture_compiles_its_programs_and_replays(device):
    x, w = _t(np.arange(6).reshape(2, 3), device), _t([1.0, 2.0, 3.0], device)
    with realize.deferred(), capture() as cap:
        y = _mlp_like(x, w)
    g = cap.graph(inputs=[x._buffer()], outputs=[y._buffer()])
    assert all(launch.program is not None for launch in g.launches)
    new = np.array([[1.0, -2.0, 3.0], [4.0, 0.5, -6.0]], np.float32)
    (out,) = g.replay([_t(new, device)._buffer()])
    h = new * [1.0, 2.0, 3.0]
    np.testing.assert_allclose(out.numpy(), h.sum(1) + h.max(1), rtol=1e-6)
