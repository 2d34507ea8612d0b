"""Kernels over a Variable (a batch, a prompt's tokens) get the host opts of constant ones.

A matmul whose rows are a Variable used to get no register-tile rows and no THREAD: heuristics skipped
symbolic ranges and THREAD took only the outermost range. Now the rows are tiled with the last tile
padded (loads clamped to the last real row, stores gated: codegen/opts._split_symbolic) and THREAD
takes the first constant range inside the symbolic ones. Results are checked against NumPy at every
row count around the tile size, on each host backend.
"""
from __future__ import annotations

import numpy as np
import pytest
from conftest import DEVICES

from polygrad import Tensor, Variable
from polygrad.codegen.analysis import thread_axis
from polygrad.codegen.host_opts import SYMBOLIC_TILE_ROWS
from polygrad.codegen.opts import Opt, OptKind
from polygrad.dtype import dtypes
from polygrad.engine.programs import get_program
from polygrad.schedule.template import schedule
from polygrad.uop.ops import AxisKind, Ops, UOp

HOST = [d for d in ("CPU", "X86") if d in DEVICES]
SIZES = (1, 2, 3, 4, 5, 7, 8, 9, 31, 64)


def _data(device: str, k: int = 96, n: int = 80, rows: int = 64):
    rng = np.random.default_rng(3)
    xs = rng.standard_normal((rows, k)).astype(np.float32)
    w = rng.standard_normal((n, k)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    return xs, w, b, (Tensor(xs, device=device).realize(), Tensor(w, device=device).realize(),
                      Tensor(b, device=device).realize())


@pytest.mark.parametrize("device", HOST)
def test_linear_over_a_variable_batch_matches_numpy_at_every_size(device):
    xs, w, b, (X, W, B) = _data(device)
    batch = Variable("batch", 1, 64)
    for n in SIZES:
        got = (X[:batch.bind(n)] @ W.T + B).relu().numpy()
        want = np.maximum(xs[:n] @ w.T + b, 0)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=f"{device} batch {n}")


@pytest.mark.parametrize("device", HOST)
def test_matmul_and_its_gradient_over_a_variable_batch(device):
    xs, w, _, (X, W, _) = _data(device, k=64, n=48)
    batch = Variable("batch", 1, 64)
    for n in (1, 5, 64):
        x = X[:batch.bind(n)]
        w_t = Tensor(w.T.copy(), device=device, requires_grad=True)
        y = x @ w_t
        np.testing.assert_allclose(y.numpy(), xs[:n] @ w.T, rtol=1e-4, atol=1e-4)
        y.sum().backward()
        np.testing.assert_allclose(w_t.grad.numpy(), np.repeat(xs[:n].sum(0)[:, None], 48, 1), rtol=1e-4,
                                   atol=1e-4)


def _opts(t: Tensor, device: str = "CPU"):
    tpl, _ = schedule([t.uop])
    return [get_program(step.ast, device).spec.opts for step in tpl.steps if step.kind == "kernel"]


@pytest.mark.parametrize("layout", ["x @ W.T", "x @ W"])
def test_a_variable_batch_matmul_gets_the_tile_of_a_constant_batch_and_threads(layout):
    """The same register tile as a batch of 8, with 4 rows (SYMBOLIC_TILE_ROWS), and a THREAD opt (the
    outermost range is the Variable's, so THREAD takes the first constant one inside it)."""
    from polygrad.device import open_device
    _, _, _, (X, W, _) = _data("CPU")
    B = W.T if layout == "x @ W.T" else W.T.contiguous().realize()
    (opts,) = _opts(X[:Variable("batch", 1, 64).bind(5)] @ B)
    (fixed,) = _opts(X[:8] @ B)
    tile = sorted((o.axis, o.amount) for o in opts if o.kind in ("UPCAST", "SPLIT_REDUCE") and o.axis != 0)
    assert tile == sorted((o.axis, o.amount) for o in fixed if o.kind in ("UPCAST", "SPLIT_REDUCE") and o.axis != 0)
    assert Opt(OptKind.UPCAST, 0, SYMBOLIC_TILE_ROWS) in opts  # the batch rows, at most 4 of them
    if open_device("CPU").capabilities.threads > 1:
        assert any(o.kind == "THREAD" for o in opts), opts


@pytest.mark.parametrize("device", HOST)
def test_a_wide_matmul_over_a_prompts_tokens_stages_where_its_weight_outgrows_the_l3(device):
    """x @ W with a Variable token count and a 35 MB W (896 x 9728, a joined gate/up) stages W's column
    panels (OUTER + STAGE) as the same product over 64 constant rows does, on a CPU whose last-level cache
    holds less than twice W (unstaged, each row tile read W from memory again: 4x slower at 64 tokens);
    with an L3 that holds it, the rows being unknown, it stays unstaged. Results checked at a few token
    counts on the device, 1 included."""
    from dataclasses import replace

    from polygrad.backend_api import Capabilities
    from polygrad.codegen.lower import lower
    rng = np.random.default_rng(5)
    xs = rng.standard_normal((64, 896)).astype(np.float32)
    ws = rng.standard_normal((896, 9728)).astype(np.float32)
    X, W = Tensor(xs).realize(), Tensor(ws).realize()
    tokens = Variable("tokens", 1, 64)
    ast_of = lambda t: [s.ast for s in schedule([t.uop])[0].steps if s.kind == "kernel"][0]  # noqa: E731
    caps = Capabilities(threads=2, vector_width=16, registers=32, fma=True, stage_bytes=512 * 1024,
                        l2_bytes=1 << 20, l3_bytes=32 << 20)
    fixed = lower(ast_of(X @ W), caps).opts
    staged = [o for o in fixed if o.kind in (OptKind.OUTER, OptKind.STAGE)]
    symbolic = ast_of(X[:tokens.bind(64)] @ W)
    assert staged and all(o in lower(symbolic, caps).opts for o in staged), (lower(symbolic, caps).opts, fixed)
    big_l3 = lower(symbolic, replace(caps, l3_bytes=128 << 20)).opts
    assert not any(o.kind in (OptKind.OUTER, OptKind.STAGE) for o in big_l3), big_l3
    Xd, Wd = Tensor(xs, device=device).realize(), Tensor(ws, device=device).realize()
    for n in (1, 5, 64):
        got = (Xd[:tokens.bind(n)] @ Wd).numpy()
        np.testing.assert_allclose(got, xs[:n] @ ws, rtol=1e-4, atol=1e-3)


def test_thread_axis_skips_symbolic_outer_ranges():
    i32 = dtypes.int32
    v = UOp(Ops.DEFINE_VAR, i32, (), ("n", 1, 64))
    sym = UOp(Ops.RANGE, i32, (v,), (0, AxisKind.GLOBAL))
    const = UOp(Ops.RANGE, i32, (UOp.const(i32, 32),), (1, AxisKind.GLOBAL))
    one = UOp(Ops.RANGE, i32, (UOp.const(i32, 1),), (2, AxisKind.GLOBAL))
    buf = UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), (0, (64 * 32,)))

    def kernel(*ranges):
        idx = UOp(Ops.INDEX, dtypes.float32, (buf, ranges[0] * 32 + ranges[-1]))
        return UOp(Ops.SINK, None, (UOp(Ops.END, None, (UOp(Ops.STORE, None, (idx, UOp.const(dtypes.float32, 1.0))),
                                                        *ranges)),))
    assert thread_axis(kernel(sym, const)) is const
    assert thread_axis(kernel(const, sym)) is const
    assert thread_axis(kernel(sym, one)) is None
    assert thread_axis(kernel(sym)) is None


@pytest.mark.parametrize("device", HOST)
def test_sums_and_maxima_over_a_variable_match_numpy_at_every_length(device):
    """A reduction over a Variable gets vector lanes, the last vector padded with the identity (0 for a sum,
    -inf for a max): negative values, so a padded 0 would win a max; softmax as in attention."""
    rng = np.random.default_rng(5)
    xs = -np.abs(rng.standard_normal((6, 80)).astype(np.float32)) - 1
    X = Tensor(xs, device=device).realize()
    length = Variable("length", 1, 80)
    for n in (1, 2, 7, 8, 9, 15, 17, 63, 64, 80):
        x = X[:, :length.bind(n)]
        np.testing.assert_allclose(x.max(-1).numpy(), xs[:, :n].max(-1), rtol=1e-6, err_msg=f"max {n}")
        np.testing.assert_allclose(x.sum(-1).numpy(), xs[:, :n].sum(-1), rtol=1e-5, err_msg=f"sum {n}")
        e = np.exp(xs[:, :n] - xs[:, :n].max(-1, keepdims=True))
        np.testing.assert_allclose(x.softmax(-1).numpy(), e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-7)


def test_a_sum_over_a_variable_gets_lanes():
    from polygrad.device import open_device
    _, _, _, (X, _, _) = _data("CPU", k=96)
    (opts,) = _opts(X[:, :Variable("length", 1, 96).bind(70)].sum(-1))
    if open_device("CPU").capabilities.vector_width > 1:
        assert any(o.kind == "SPLIT_REDUCE" for o in opts), opts


def test_every_reduction_of_a_prompt_gets_lanes_or_a_tile(tmp_path):
    """A GPT-2 prompt (12 heads of 64, the prompt's tokens a Variable): each kernel with a reduction gets vector
    lanes or a register tile, and one with 16 or more outputs along a constant range a tile on them. Before:
    the attention product, fused with the heads' interleave, had none (div/mod output indices), nor did
    the softmax's sums and maxima over the tokens."""
    pytest.importorskip("transformers")
    import hf_checkpoints as hc
    from polygrad.device import open_device
    from polygrad.hf import load_hf
    if open_device("CPU").capabilities.vector_width <= 1:
        pytest.skip("the CPU has no vector lanes")
    hc.make("gpt2", tmp_path, overrides=dict(n_embd=768, n_head=12, n_layer=1))
    model = load_hf(tmp_path, max_seq_len=64)
    try:
        bare = []
        for prog, _, _ in model._x.plan("forward"):
            if prog is None or not any(n.op is Ops.REDUCE for n in prog.spec.ast.toposort()):
                continue
            kinds = {o.kind for o in prog.spec.opts}
            wide = any(r.op is Ops.RANGE and r.arg[1] in (AxisKind.GLOBAL, AxisKind.THREAD) and r.src[0].op is Ops.CONST
                       and int(r.src[0].arg) >= 16 for r in prog.spec.ast.toposort())
            if not kinds & {"UPCAST", "SPLIT_REDUCE"} or (wide and "UPCAST" not in kinds):
                bare.append((prog.spec.name, prog.spec.opts))
        assert not bare, bare
    finally:
        model.dispose()
