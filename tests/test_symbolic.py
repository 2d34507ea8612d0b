"""Symbolic sizes end to end: bounded Variables bound per call, one compiled program for every value.

A tensor carries a symbolic leading dimension (x.reshape(v.bind(n), 16), cache[:pos]); the scheduler
strips the values out of its cache key, lowering passes the variables to the kernels as integer
parameters, and the JIT replays one capture for every binding. Checked against NumPy and torch on
every usable backend (CPU and INTERP at least).
"""
import numpy as np
import pytest
import torch

from polygrad import JitError, Tensor, TinyJit, Variable
from polygrad.codegen.lower import lower
from polygrad.engine import programs
from polygrad.errors import PolygradError, VariableError
from polygrad.schedule.template import schedule
from polygrad.uop.ops import Ops
from polygrad.uop.shape import ShapeError


def _compiled() -> int:
    return programs.runtime_stats["programs_compiled"]


def _t(arr, device):
    return Tensor(np.asarray(arr, dtype=np.float32), device=device).realize()


# ---------------------------------------------------------------------------------------------------
# an MLP over a symbolic batch, forward and backward


def test_mlp_forward_backward_symbolic_batch_matches_torch(device):
    rng = np.random.default_rng(0)
    w1n = rng.standard_normal((16, 32)).astype(np.float32)
    b1n = rng.standard_normal(32).astype(np.float32)
    w2n = rng.standard_normal((32, 4)).astype(np.float32)
    batch = Variable("batch", 1, 64)
    counts = []
    for n in (3, 7, 20, 64, 1):
        xn, yn = rng.standard_normal((n, 16)).astype(np.float32), rng.standard_normal((n, 4)).astype(np.float32)
        w1, b1, w2 = (Tensor(a, device=device, requires_grad=True) for a in (w1n, b1n, w2n))
        nb = batch.bind(n)
        x, y = _t(xn, device).reshape(nb, 16), _t(yn, device).reshape(nb, 4)
        assert x.shape == (nb, 16)
        out = (x @ w1 + b1).relu() @ w2
        loss = ((out - y) ** 2).mean()
        loss.backward()
        Tensor.realize_all(out, loss, w1.grad, b1.grad, w2.grad)

        tw1, tb1, tw2 = (torch.tensor(a, requires_grad=True) for a in (w1n, b1n, w2n))
        tout = torch.relu(torch.tensor(xn) @ tw1 + tb1) @ tw2
        tloss = ((tout - torch.tensor(yn)) ** 2).mean()
        tloss.backward()
        assert out.numpy().shape == (n, 4)
        np.testing.assert_allclose(out.numpy(), tout.detach().numpy(), rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(loss.numpy(), tloss.detach().numpy(), rtol=1e-4, atol=1e-5)
        for g, tg in ((w1.grad, tw1.grad), (b1.grad, tb1.grad), (w2.grad, tw2.grad)):
            np.testing.assert_allclose(g.numpy(), tg.numpy(), rtol=1e-4, atol=1e-4)
        counts.append(_compiled())
    assert len(set(counts)) == 1, f"programs were compiled after the first batch size: {counts}"


def test_training_steps_over_symbolic_batches_match_torch(device):
    """A few SGD steps with a new batch size each; weights stay in lockstep with torch's."""
    rng = np.random.default_rng(1)
    wn = rng.standard_normal((8, 3)).astype(np.float32) * 0.3
    w = Tensor(wn, device=device).realize()
    tw = torch.tensor(wn, requires_grad=True)
    batch = Variable("batch", 1, 32)
    counts = []
    for n in (5, 9, 2, 32, 11):
        xn, yn = rng.standard_normal((n, 8)).astype(np.float32), rng.standard_normal((n, 3)).astype(np.float32)
        w.requires_grad = True
        x, y = _t(xn, device).reshape(batch.bind(n), 8), _t(yn, device).reshape(batch.bind(n), 3)
        loss = ((x @ w).tanh() - y).square().sum()
        loss.backward()
        w = (w - w.grad * 0.01).detach().realize()
        tloss = ((torch.tensor(xn) @ tw).tanh() - torch.tensor(yn)).square().sum()
        tloss.backward()
        with torch.no_grad():
            tw = (tw - tw.grad * 0.01).detach().requires_grad_(True)
        np.testing.assert_allclose(w.numpy(), tw.detach().numpy(), rtol=1e-4, atol=1e-5)
        counts.append(_compiled())
    assert len(set(counts[1:])) == 1, counts


def test_movement_and_reductions_keep_working(device):
    rng = np.random.default_rng(2)
    v = Variable("rows", 1, 40)
    for n in (4, 13, 40):
        an = rng.standard_normal((n, 16)).astype(np.float32)
        a = _t(an, device).reshape(v.bind(n), 16)
        r = a.reshape(v.bind(n), 4, 4)
        assert r.shape == (v.bind(n), 4, 4)
        np.testing.assert_allclose(r.sum(2).numpy(), an.reshape(n, 4, 4).sum(2), rtol=1e-5, atol=1e-5)
        e = a.reshape(v.bind(n), 1, 16).expand(v.bind(n), 3, 16)
        np.testing.assert_allclose(e.numpy(), np.broadcast_to(an[:, None], (n, 3, 16)))
        np.testing.assert_allclose(a.shrink((None, (2, 10))).numpy(), an[:, 2:10])
        np.testing.assert_allclose(a[:, 1:5].numpy(), an[:, 1:5])
        np.testing.assert_allclose(a.permute(1, 0).numpy(), an.T)
        np.testing.assert_allclose(a.sum(1).numpy(), an.sum(1), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(a.sum(0).numpy(), an.sum(0), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(a.max(0).numpy(), an.max(0))
        np.testing.assert_allclose(a.mean(0).numpy(), an.mean(0), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(a.sum().numpy(), an.sum(), rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(a.softmax(1).numpy(), torch.tensor(an).softmax(1).numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(a.flip(0).numpy(), an[::-1])
        np.testing.assert_allclose(a.pad(((1, 2), None)).numpy(), np.pad(an, ((1, 2), (0, 0))))


def test_empty_and_full_with_symbolic_size(device):
    v = Variable("n", 1, 10)
    e = Tensor.empty(v.bind(3), 16, device=device)
    assert e.shape == (v.bind(3), 16) and e.numpy().shape == (3, 16)
    f = Tensor.full((v.bind(4), 2), 7.0, device=device)
    assert f.numpy().tolist() == [[7.0, 7.0]] * 4
    assert (Tensor.ones(v.bind(5), 3, device=device) * 2).sum().item() == 30.0


def test_large_symbolic_kernel_splits_across_threads(device):
    """A symbolic thread range: each launch splits the bound value's rows, not the max's."""
    v = Variable("rows", 1, 4096)
    rng = np.random.default_rng(3)
    for n in (3000, 517):
        an = rng.standard_normal((n, 256)).astype(np.float32)
        out = (_t(an, device).reshape(v.bind(n), 256).exp() * 2).numpy()
        np.testing.assert_allclose(out, np.exp(an) * 2, rtol=1e-5)


def test_one_program_serves_every_value_and_has_the_variable_parameter(device):
    v = Variable("batch", 1, 64)
    x = _t(np.ones((3, 16)), device).reshape(v.bind(3), 16)
    var_vals: dict = {}
    tpl, _ = schedule([(x * 2).sum(1).uop], [], var_vals)
    assert var_vals == {v: 3}
    var_vals5: dict = {}
    tpl5, _ = schedule([(_t(np.ones((5, 16)), device).reshape(v.bind(5), 16) * 2).sum(1).uop], [], var_vals5)
    assert tpl5 is tpl and var_vals5 == {v: 5}  # the value is not part of the schedule cache key
    ast = tpl.steps[0].ast
    assert not any(n.op is Ops.BIND for n in ast.toposort())
    spec = lower(ast)
    assert spec.vars == (v,)
    if device == "CPU":
        src = programs.get_program(ast, device).source
        assert "const int v0" in src and "batch" not in src  # the renderer's name, never the user's


# ---------------------------------------------------------------------------------------------------
# a KV-cache read up to a bound position


def _attention_ref(cache: np.ndarray, q: np.ndarray, pos: int) -> tuple[np.ndarray, np.ndarray]:
    k = cache[:pos]
    s = k @ q / np.sqrt(q.shape[0])
    p = np.exp(s - s.max())
    p /= p.sum()
    return s, (p[:, None] * k).sum(0)


def test_kv_cache_shrink_to_bound_position(device):
    rng = np.random.default_rng(4)
    L, D = 32, 8
    cache_n, qn = rng.standard_normal((L, D)).astype(np.float32), rng.standard_normal(D).astype(np.float32)
    cache, q = _t(cache_n, device), _t(qn, device)
    pos_var = Variable("pos", 1, L)
    counts = []
    for pos in (1, 5, 12, 32, 7):
        p = pos_var.bind(pos)
        keys = cache[:p]  # cache[:pos], the same view as cache.shrink(((0, p), None))
        assert keys.shape == (p, D) and cache.shrink(((0, p), None)).shape == (p, D)
        scores = (keys @ q) * (1 / np.sqrt(D))
        out = (scores.softmax(0).reshape(p, 1) * keys).sum(0)
        Tensor.realize_all(scores, out)
        ref_s, ref_o = _attention_ref(cache_n, qn, pos)
        assert scores.numpy().shape == (pos,)
        np.testing.assert_allclose(scores.numpy(), ref_s, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(out.numpy(), ref_o, rtol=1e-5, atol=1e-5)
        counts.append(_compiled())
    assert len(set(counts)) == 1, f"programs were compiled after the first position: {counts}"


def test_kv_cache_shrink_past_the_cache_is_rejected():
    cache = Tensor.zeros(16, 4)
    too_far = Variable("pos", 1, 20)  # its max would read past the cache in a later call
    with pytest.raises(ShapeError, match="max"):
        cache.shrink(((0, too_far.bind(3)), None))


# ---------------------------------------------------------------------------------------------------
# the JIT replays one capture for every binding


def test_jit_replays_symbolic_batch_without_recapture(device):
    rng = np.random.default_rng(5)
    wn = rng.standard_normal((16, 8)).astype(np.float32)
    w = _t(wn, device)

    @TinyJit
    def f(x):
        return ((x @ w).relu() + 1).realize()

    v = Variable("batch", 1, 64)
    counts = []
    for i, n in enumerate((3, 5, 9, 2, 64, 7)):
        xn = rng.standard_normal((n, 16)).astype(np.float32)
        out = f(_t(xn, device).reshape(v.bind(n), 16))
        assert out.shape == (v.bind(n), 8)
        np.testing.assert_allclose(out.numpy(), np.maximum(xn @ wn, 0) + 1, rtol=1e-5, atol=1e-5)
        counts.append(_compiled())
    stats = f.stats()
    assert stats["captures"] == 1 and stats["replays"] == 4
    assert len(set(counts)) == 1


def test_jit_replays_kv_cache_with_bound_variable_argument(device):
    rng = np.random.default_rng(6)
    L, D = 24, 8
    cache_n, qn = rng.standard_normal((L, D)).astype(np.float32), rng.standard_normal(D).astype(np.float32)
    cache = _t(cache_n, device)
    pos_var = Variable("pos", 1, L)

    @TinyJit
    def attend(q, pos):
        keys = cache.shrink(((0, pos), None))
        p = ((keys @ q) * (1 / np.sqrt(D))).softmax(0)
        return (p.reshape(pos, 1) * keys).sum(0).realize()

    for pos in (1, 4, 9, 24, 17, 2):
        out = attend(_t(qn, device), pos_var.bind(pos))
        np.testing.assert_allclose(out.numpy(), _attention_ref(cache_n, qn, pos)[1], rtol=1e-5, atol=1e-5)
    assert attend.stats()["captures"] == 1 and attend.replays == 4


def test_jit_training_step_over_symbolic_batch(device):
    """Forward, backward and an in-place SGD update, replayed for several batch sizes."""
    rng = np.random.default_rng(7)
    wn = rng.standard_normal((6, 2)).astype(np.float32) * 0.5
    w = Tensor(wn, device=device, requires_grad=True).realize()
    batch = Variable("batch", 1, 16)

    @TinyJit
    def step(x, y):
        loss = ((x @ w) - y).square().mean()
        loss.backward()
        w.assign(w.detach() - w.grad * 0.1)
        w.grad = None
        return loss.realize(), w.realize()

    ref = wn.copy()
    for n in (4, 7, 16, 3, 9):
        xn, yn = rng.standard_normal((n, 6)).astype(np.float32), rng.standard_normal((n, 2)).astype(np.float32)
        loss, _ = step(_t(xn, device).reshape(batch.bind(n), 6), _t(yn, device).reshape(batch.bind(n), 2))
        err = xn @ ref - yn
        np.testing.assert_allclose(loss.numpy(), (err ** 2).mean(), rtol=1e-4, atol=1e-6)
        ref = ref - 0.1 * (2 / err.size) * xn.T @ err
        np.testing.assert_allclose(w.numpy(), ref, rtol=1e-4, atol=1e-5)
    assert step.stats()["captures"] == 1


def test_jit_rejects_another_variable_after_capture():
    f = TinyJit(lambda x: (x * 2).realize())
    a, b = Variable("a", 1, 8), Variable("b", 1, 8)
    for n in (2, 3):
        f(_t(np.ones((n, 4)), "CPU").reshape(a.bind(n), 4))
    with pytest.raises(JitError, match="changed"):
        f(_t(np.ones((3, 4)), "CPU").reshape(b.bind(3), 4))


# ---------------------------------------------------------------------------------------------------
# bad binds raise typed errors that say what to do


@pytest.mark.parametrize("value", [0, 9, -1])
def test_bind_outside_bounds(value):
    with pytest.raises(VariableError, match=r"outside its bounds \[1, 8\]"):
        Variable("b", 1, 8).bind(value)


@pytest.mark.parametrize("value", [3.0, "3", True, None])
def test_bind_non_int(value):
    with pytest.raises(VariableError, match="must be bound to an int"):
        Variable("b", 1, 8).bind(value)


def test_bind_accepts_numpy_ints():
    assert Variable("b", 1, 8).bind(np.int64(5)).unbind()[1] == 5


def test_unbound_variable_realized_says_to_bind(device):
    v = Variable("b", 1, 8)
    with pytest.raises(VariableError, match=r"bind\(n\)"):
        Tensor.ones(8, 4, device=device).shrink(((0, v), None)).realize()
    declared = Tensor.empty(v, 4, device=device)  # a declaration (Model inputs), sized for the maximum
    assert declared.shape == (v, 4)
    with pytest.raises(VariableError, match="not bound"):
        declared.numpy()
    with pytest.raises(VariableError, match="not bound"):
        _t(np.ones((3, 4)), device).reshape(v, 4)


def test_conflicting_binds_and_shared_names():
    v = Variable("b", 1, 8)
    a = _t(np.ones((3, 4)), "CPU").reshape(v.bind(3), 4).sum()
    b = _t(np.ones((5, 4)), "CPU").reshape(v.bind(5), 4).sum()
    with pytest.raises(VariableError, match="both 3 and 5"):
        (a + b).realize()
    w = Variable("b", 1, 16)
    c = _t(np.ones((5, 4)), "CPU").reshape(w.bind(5), 4).sum()
    with pytest.raises(VariableError, match="distinct names"):
        (a + c).realize()


@pytest.mark.parametrize("name,lo,hi", [("", 1, 4), ("1x", 1, 4), ("a b", 1, 4), ("x", 5, 3), ("x", -1, 3),
                                        ("x", 1, 2**31), ("x", 1.5, 3)])
def test_bad_variable_definitions(name, lo, hi):
    with pytest.raises(VariableError):
        Variable(name, lo, hi)


def test_variable_errors_are_polygrad_errors():
    assert issubclass(VariableError, PolygradError) and issubclass(VariableError, ValueError)


def test_reshape_to_a_wrong_bound_value_is_a_shape_error():
    v = Variable("b", 1, 8)
    with pytest.raises(ShapeError, match="cannot reshape"):
        _t(np.ones((3, 4)), "CPU").reshape(v.bind(4), 4)


def test_jit_kv_cache_write_then_read(device):
    """A decoder-style step: write the new key at pos, attend over cache[:pos + 1], one capture."""
    L, D = 16, 4
    rng = np.random.default_rng(8)
    cache = Tensor.zeros(L, D, device=device).contiguous().realize()
    qn = rng.standard_normal(D).astype(np.float32)
    q = _t(qn, device)
    pos_var = Variable("pos", 0, L - 1)

    @TinyJit
    def step(k, pos):
        cache[pos:pos + 1].assign(k.reshape(1, D)).realize()
        return (cache[:pos + 1] @ q).softmax(0).realize()

    ref = np.zeros((L, D), np.float32)
    for p in range(7):
        kn = rng.standard_normal(D).astype(np.float32)
        out = step(_t(kn, device), pos_var.bind(p))
        ref[p] = kn
        s = ref[:p + 1] @ qn
        e = np.exp(s - s.max())
        np.testing.assert_allclose(out.numpy(), e / e.sum(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(cache.numpy(), ref)
    assert step.stats()["captures"] == 1 and step.replays == 5


def test_a_term_and_its_negation_cancel_in_a_sum():
    """n + (64 - n) is 64 for a Variable and for each binding (the shape PAD gives a slice's gradient)."""
    from polygrad.uop import sint
    v = Variable("n", 1, 64)
    for x in (v, v.bind(1), v.bind(5)):
        assert sint.sadd(x, sint.ssub(64, x)) == 64
        assert sint.sadd(sint.ssub(64, x), x) == 64
    assert sint.sadd(v, sint.ssub(64, v.bind(3))) != 64  # another node: not cancelled


def test_gradient_through_a_variable_slice_accumulates_across_bindings():
    """The gradient reaching a realized tensor through x[:n.bind(k)] has the tensor's own shape for every k,
    so it accumulates across steps of different batch sizes (ShapeError before)."""
    rng = np.random.default_rng(0)
    xs = rng.standard_normal((64, 8)).astype(np.float32)
    x = Tensor(xs, requires_grad=True)
    batch = Variable("batch", 1, 64)
    for n in (1, 5):
        w = Tensor(np.ones((8, 3), np.float32), requires_grad=True)
        (x[:batch.bind(n)] @ w).sum().backward()
        x.grad.realize()  # one binding per computation: each step's gradient is realized, as an optimizer does
        np.testing.assert_allclose(w.grad.numpy(), np.repeat(xs[:n].sum(0)[:, None], 3, 1), rtol=1e-5)
    want = np.zeros_like(xs)
    want[:1] += 3
    want[:5] += 3
    np.testing.assert_allclose(x.grad.numpy(), want)


def test_reshape_minus_one_over_a_symbolic_batch_infers_the_plain_size():
    """x.reshape(batch, -1) of (batch, 6, 16) infers 96, not (batch*96)//batch: the size must compare
    equal to 96 so a Linear(96, k) accepts it (factors common to both sides of a division cancel)."""
    v = Variable("batch", 1, 8)
    b = v.bind(3)
    x = Tensor.empty(b, 6, 16)
    assert x.reshape(b, -1).shape == (b, 96)
    s = Variable("seq", 1, 16).bind(5)
    y = Tensor.empty(b, s, 64).reshape(b, s, -1, 16)  # heads inferred over two symbolic sizes
    assert y.shape == (b, s, 4, 16)
    assert Tensor.empty(b, s, 64).reshape(-1, 64).shape[0] is Tensor.empty(b, s).reshape(-1).shape[0]
