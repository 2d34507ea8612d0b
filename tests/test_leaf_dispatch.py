"""The eager-op short path (issue 32, "tiny-op dispatch"): a realize of one pure node over realized
buffers whose structure was seen before is served from `template.leaf_cache`, keyed by
`normalize.leaf_signature`, without normalize's walk. Guards, never timed:

- a seen eager op neither walks the graph (normalize) nor schedules, and its Python calls stay within a
  budget the walking path exceeded;
- the signature is exactly normalize's key: for many graphs, two graphs share a signature only when
  they share the key, and each short-path result equals NumPy's, for the cases a wrong hit would break
  (shapes of one size, dtypes, an operand used twice, operand order, devices, views, assigns, freed and
  reused buffers, Variables, captures, Contexts, threads, kept values and autograd);
- the cache is bounded.
"""
from __future__ import annotations

import threading

import numpy as np
import pytest

from conftest import DEVICES
from polygrad import Context, Tensor, Variable, dtypes, jit
from polygrad.engine import realize as realize_module
from polygrad.schedule import computed, normalize, template
from polygrad.schedule.normalize import leaf_signature
from polygrad.uop.ops import Ops

needs_cc = pytest.mark.skipif("CPU" not in DEVICES, reason="needs the CPU backend")


def _t(arr, device="CPU"):
    return Tensor(np.asarray(arr), device=device).realize()


@pytest.fixture
def fresh_leaf_cache(monkeypatch):
    monkeypatch.setattr(template, "leaf_cache", {})
    return template


@needs_cc
def test_seen_eager_op_skips_the_walk(monkeypatch, fresh_leaf_cache):
    a, b = _t(np.arange(4, dtype=np.float32)), _t(np.ones(4, np.float32))
    (a * b).realize()  # first: the walking path, which fills the cache
    assert len(fresh_leaf_cache.leaf_cache) == 1

    def boom(*args, **kw):
        raise AssertionError("a seen eager op reached normalize()")
    monkeypatch.setattr(realize_module, "normalize", boom)
    monkeypatch.setattr(template, "build_template", boom)
    for k in range(3):
        x, y = _t(np.arange(4, dtype=np.float32) * k), _t(np.full(4, 2.0, np.float32))
        np.testing.assert_array_equal((x * y).numpy(), np.arange(4, dtype=np.float32) * k * 2)


@needs_cc
def test_seen_eager_op_runs_its_kernel_without_the_general_realize(monkeypatch, fresh_leaf_cache):
    """Tensor.realize serves a seen eager op through realize_eager alone: neither realize_uops nor
    run_template (the general loop over a template's steps) runs, and the kernel still computes."""
    xs = [_t(np.arange(6, dtype=np.float32) + k) for k in range(4)]  # realized before the patch below
    b = _t(np.full(6, 3.0, np.float32))
    (xs[0] * b).realize()
    (xs[0].reshape(2, 3) * xs[0].reshape(2, 3)).realize()
    assert len(fresh_leaf_cache.leaf_cache) == 2
    assert all(e.kernel.kind == "kernel" and e.keep for e in fresh_leaf_cache.leaf_cache.values())

    def boom(*args, **kw):
        raise AssertionError("a seen eager op took the general realize")
    monkeypatch.setattr(realize_module, "realize_uops", boom)
    monkeypatch.setattr(realize_module, "run_template", boom)
    for k in (1, 2, 3):
        want = np.arange(6, dtype=np.float32) + k
        got = (xs[k] * b).realize()
        square = (xs[k].reshape(2, 3) * xs[k].reshape(2, 3)).realize()
        np.testing.assert_array_equal(got.numpy(), want * 3)
        np.testing.assert_array_equal(square.numpy(), want.reshape(2, 3) ** 2)


def test_signature_is_exactly_the_normalized_key():
    """Over a family of eager ops, signatures are equal exactly when normalize's keys are."""
    f4, f22, i4 = np.arange(4, dtype=np.float32), np.arange(4, dtype=np.float32).reshape(2, 2), np.arange(4)
    a, b, c = _t(f4), _t(f4 + 1), _t(f22)
    d, e, g = _t(f22 * 3), _t(i4.astype(np.int32)), _t(np.arange(8, dtype=np.float32))
    graphs = [a + b, b + a, a + a, b + b, a * b, c + d, c + c, d * c, e + e, e * e, a + b.reshape(4),
              a.reshape(2, 2) + d, c.reshape(4) + a, a.reshape(4, 1) + b.reshape(4, 1), (a < b), -a, a.exp2(),
              g[:4] + a, e.cast("float32"), a.reshape(1, 4) + c.reshape(1, 4)]
    seen: dict[tuple, tuple] = {}
    leaves = 0
    for t in graphs:
        sig = leaf_signature(t.uop, None)
        if sig is None:
            continue
        leaves += 1
        key, inputs = normalize.normalize([t.uop], [], {}, None)
        assert [id(x) for x in inputs] == [id(x) for x in sig[1]], "slots in normalize's order"
        if sig[0] in seen:
            assert seen[sig[0]] is key[0] or seen[sig[0]] == key, "one signature, two keys"
        seen[sig[0]] = key
    keys = list(seen.values())
    assert len({k for k in keys}) == len(keys), "one key, two signatures"
    assert leaves >= 14  # the family mostly takes the short path (g[:4] + a, for one, does not)


@pytest.mark.parametrize("device", DEVICES)
def test_short_path_results_match_numpy(device, fresh_leaf_cache):
    rng = np.random.default_rng(0)
    f = rng.standard_normal(12).astype(np.float32)
    cases = [  # same element count, other shapes and dtypes, an operand twice, both operand orders
        (lambda x, y: x + y, f, f[::-1].copy()),
        (lambda x, y: x + x, f, f[::-1].copy()),
        (lambda x, y: y + x, f, f[::-1].copy()),
        (lambda x, y: x.reshape(3, 4) + y.reshape(3, 4), f, f + 1),
        (lambda x, y: x.reshape(4, 3) + y.reshape(4, 3), f, f + 1),
        (lambda x, y: x.reshape(3, 4) + y.reshape(4, 3).reshape(3, 4), f, f + 2),
        (lambda x, y: x + y, f.astype(np.int32), (f * 10).astype(np.int32)),
        (lambda x, y: x < y, f, f[::-1].copy()),
        (lambda x, y: y < x, f, f[::-1].copy()),
        (lambda x, y: x.maximum(y), f, f[::-1].copy()),
        (lambda x, y: x / y, f, f[::-1].copy() + 3),
        (lambda x, y: y / x, f + 3, f[::-1].copy()),
        (lambda x, y: x * y, f[:4], f[4:8]),
    ]
    ref = {0: np.add, 1: lambda x, y: x + x, 2: lambda x, y: y + x, 7: np.less, 8: lambda x, y: y < x,
           9: np.maximum, 10: np.divide, 11: lambda x, y: y / x, 12: np.multiply}
    for _ in range(3):  # the first round fills the cache, the next ones hit it, interleaved
        for i, (op, xn, yn) in enumerate(cases):
            x, y = _t(xn, device), _t(yn, device)
            got = op(x, y).realize()
            if i in ref:
                want = ref[i](xn, yn)
            else:
                want = np.add(xn, yn).reshape(got.shape)
            assert got.shape == want.shape and got.numpy().dtype == want.dtype, i
            np.testing.assert_allclose(got.numpy(), want, rtol=1e-6, err_msg=str(i))


def test_other_device_gets_its_own_entry(fresh_leaf_cache):
    if len(DEVICES) < 2:
        pytest.skip("needs two backends")
    f = np.arange(6, dtype=np.float32)
    for _ in range(2):
        for dev in DEVICES[:2]:
            out = _t(f, dev) + _t(f, dev)
            np.testing.assert_array_equal(out.numpy(), f * 2)
            assert out.realize().device == dev
    assert len(fresh_leaf_cache.leaf_cache) == 2


def test_assigns_freed_buffers_and_views_read_current_values(fresh_leaf_cache):
    a, b = _t(np.ones(8, np.float32)), _t(np.arange(8, dtype=np.float32))
    want_a = np.ones(8, np.float32)
    for step in range(4):
        s = (a + b).realize()  # short path from the second step on
        np.testing.assert_array_equal(s.numpy(), want_a + np.arange(8))
        a.assign(a * b).realize()  # an in-place write between eager ops
        want_a = want_a * np.arange(8, dtype=np.float32)
        del s  # its buffer goes back to the reuse cache and serves the next result
    view = b.reshape(2, 4)
    for _ in range(2):
        np.testing.assert_array_equal((view + view).numpy(), np.arange(8).reshape(2, 4) * 2)
    np.testing.assert_array_equal((b[2:6] + b[2:6]).numpy(), np.arange(2, 6) * 2)  # a shrink: the walk


def test_kept_values_and_autograd_through_short_path(fresh_leaf_cache):
    xn = np.array([1.0, -2.0, 3.0, 0.5], np.float32)
    for _ in range(3):
        x = Tensor(xn, requires_grad=True).realize()
        y = (x * x).realize()  # eager op over a leaf; kept value of x * x
        z = (y * x).sum()  # reads y's buffer
        z.backward()
        np.testing.assert_allclose(z.numpy(), (xn ** 3).sum(), rtol=1e-6)
        np.testing.assert_allclose(x.grad.numpy(), 3 * xn ** 2, rtol=1e-6)
    a, b = _t(xn), _t(xn + 1)
    c = a + b
    d = c * 2  # holds c's node
    c.realize()
    assert computed.views() is not None
    np.testing.assert_allclose(d.numpy(), (xn + xn + 1) * 2)
    c1, c2 = a + b, a + b  # one node (hash-consed): two realizes give two buffers, never one aliased
    c1.realize()
    c2.realize()
    assert c1.uop.arg is not c2.uop.arg
    c1.assign(c1 * 0).realize()
    np.testing.assert_allclose(c2.numpy(), xn + xn + 1)


@needs_cc
def test_result_node_lives_on_its_buffer_and_is_still_the_one_node(fresh_leaf_cache):
    """realize_eager's result node (UOp.fresh) has no hash-cons entry: its Buffer refers to it (weakly), and
    UOp() finds it there, so a graph that names the buffer again gets that very node; another dtype's node,
    or one made after it died, goes in the table as before. The result behaves like any realized tensor
    (later graphs, views, device moves, gradients), and its buffer goes back to the reuse cache when it dies."""
    from polygrad import device as device_module
    from polygrad.uop import ops
    from polygrad.uop.ops import UOp
    xn, yn = np.array([1.5, -2.0, 3.0, 0.25], np.float32), np.array([4.0, 0.5, -1.0, 2.0], np.float32)
    a, b = _t(xn), _t(yn)
    for _ in range(2):
        (a + b).realize()
    r = (a + b).realize()  # the short path
    node, buf = r.uop, r.uop.arg
    assert node.op is Ops.BUFFER and buf._node() is node
    assert (Ops.BUFFER, node.dtype, (), buf) not in ops._uop_cache
    assert UOp(Ops.BUFFER, node.dtype, (), buf) is node
    other = UOp(Ops.BUFFER, dtypes.int32, (), buf)  # another dtype: its own node, in the table
    assert other is not node and UOp(Ops.BUFFER, other.dtype, (), buf) is other
    assert (Ops.BUFFER, other.dtype, (), buf) in ops._uop_cache
    del other
    np.testing.assert_array_equal((r * 2 + r).numpy(), (xn + yn) * 3)
    np.testing.assert_array_equal(r.reshape(2, 2).numpy(), (xn + yn).reshape(2, 2))
    np.testing.assert_array_equal(r[1:3].numpy(), (xn + yn)[1:3])
    np.testing.assert_array_equal(Tensor(UOp(Ops.BUFFER, node.dtype, (), buf)).numpy(), xn + yn)
    if "INTERP" in DEVICES:
        np.testing.assert_array_equal(r.to("INTERP").numpy(), xn + yn)
    ga, gb = Tensor(xn, requires_grad=True).realize(), Tensor(yn, requires_grad=True).realize()
    for _ in range(2):
        g = (ga * gb).realize()  # the short path from the second on
        (g * g).sum().backward()
    np.testing.assert_allclose(ga.grad.numpy(), 2 * 2 * xn * yn * yn, rtol=1e-6)  # two backward passes add up
    np.testing.assert_allclose(gb.grad.numpy(), 2 * 2 * xn * xn * yn, rtol=1e-6)
    del node, g
    live, cached = device_module.buffers_live["CPU"], device_module.alloc_cache_bytes["total"]
    del r  # the node dies; the buffer (held here) stays, and a node made for it now goes in the table
    assert buf._node() is None
    again = UOp(Ops.BUFFER, dtypes.float32, (), buf)
    assert (Ops.BUFFER, again.dtype, (), buf) in ops._uop_cache and UOp(Ops.BUFFER, again.dtype, (), buf) is again
    del again, buf  # the buffer goes back to the reuse cache
    assert device_module.buffers_live["CPU"] == live - 1
    assert device_module.alloc_cache_bytes["total"] == cached + xn.nbytes


@needs_cc
def test_entry_picks_the_kernels_buffers_in_its_slot_order(fresh_leaf_cache):
    """realize_eager launches the entry's kernel on entry.pick(table): the table's buffers (inputs, then the
    output) in the kernel's slot order (Step.args, output first here), as a tuple for any number of slots.
    Operands in both orders and one used twice give NumPy's values through it."""
    xn, yn = np.array([1.5, -2.0, 3.0], np.float32), np.array([4.0, 0.5, -1.0], np.float32)
    x, y = _t(xn), _t(yn)
    (x < y).realize()  # one node (x - y is two: x + -y)
    (entry,) = fresh_leaf_cache.leaf_cache.values()
    args = entry.kernel.args
    assert sorted(args) == [0, 1, 2] and list(args) != [0, 1, 2]  # an order other than the table's
    table = ["x", "y", "out"]
    assert entry.pick(table) == tuple(table[i] for i in args)
    one_slot = template.Step("kernel", "CPU", (0,), entry.kernel.ast)
    one = template.LeafTemplate(entry.template, one_slot, None, False)
    assert one.pick(["only"]) == ("only",)  # (an itemgetter of one index would give "only")
    for _ in range(2):  # the second of each from the entry
        np.testing.assert_array_equal((x < y).realize().numpy(), xn < yn)
        np.testing.assert_array_equal((y < x).realize().numpy(), yn < xn)
        np.testing.assert_array_equal((x < x).realize().numpy(), xn < xn)


def test_variables_captures_and_contexts(fresh_leaf_cache):
    v = Variable("n", 1, 16)
    for n in (4, 9, 4):
        xn = np.arange(n * 2, dtype=np.float32).reshape(n, 2)
        x = _t(xn.reshape(-1)).reshape(v.bind(n), 2)
        np.testing.assert_array_equal((x + x).numpy(), xn * 2)
    a, b = _t(np.arange(4, dtype=np.float32)), _t(np.ones(4, np.float32))
    (a + b).realize()  # seen: a capture must still record the kernel, not take the short path
    add = jit(lambda x, y: (x + y).realize())
    for k in range(4):
        x = _t(np.full(4, float(k), np.float32))
        np.testing.assert_array_equal(add(x, b).numpy(), np.full(4, k + 1.0))
    for settings in ({"NOOPT": 1}, {"POLY_THREADS": 1}, {"DEBUG": 0}):
        with Context(**settings):
            np.testing.assert_array_equal((a + b).numpy(), np.arange(4) + 1.0)


def test_threads_share_the_cache(fresh_leaf_cache):
    errors: list[str] = []
    shapes = [(8,), (2, 4), (4, 2), (8,)]

    def work(k: int) -> None:
        rng = np.random.default_rng(k)
        for i in range(40):
            shape = shapes[(k + i) % len(shapes)]
            xn = rng.standard_normal(shape).astype(np.float32)
            yn = rng.standard_normal(shape).astype(np.float32)
            x, y = _t(xn), _t(yn)
            got = ((x * y) if k % 2 else (x + y)).numpy()
            want = (xn * yn) if k % 2 else (xn + yn)
            if got.shape != want.shape or not np.allclose(got, want, rtol=1e-6):
                errors.append(f"thread {k} step {i} shape {shape}")
    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]


def test_leaf_cache_is_bounded(monkeypatch, fresh_leaf_cache):
    monkeypatch.setattr(template, "LEAF_CACHE_MAX", 4)
    for n in range(1, 12):  # 11 structures (sizes)
        x = _t(np.arange(n, dtype=np.float32))
        np.testing.assert_array_equal((x + x).numpy(), np.arange(n) * 2.0)
        assert len(template.leaf_cache) <= 4
    assert len(template.leaf_cache) >= 1


def test_short_path_only_for_pure_one_node_graphs():
    a = _t(np.arange(4, dtype=np.float32))
    assert leaf_signature((a + a).uop, None) is not None
    assert leaf_signature((a + 1).uop, None) is None  # a constant source: the walk
    assert leaf_signature(((a + a) * a).uop, None) is None  # two levels: the walk
    assert leaf_signature(a.assign(a + a).uop, None) is None  # an effect
    assert leaf_signature(a.sum().uop, None) is None  # arg (reduce op, axes), under a reshape
    assert (a + a).uop.op is Ops.ADD
