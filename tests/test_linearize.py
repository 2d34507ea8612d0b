"""The linearize pass (issue 9, item 1) and device-driven lowering (item 4): the ordered program every
emitter walks, its loops, accumulators and gates, and the optimisations each device's capabilities allow."""
import numpy as np
import pytest

from polygrad import Tensor, dtypes
from polygrad.backend_api import Capabilities
from polygrad.codegen.lower import lower
from polygrad.codegen.opts import Opt, OptKind
from polygrad.codegen.passes import simplify_indices
from polygrad.device import Buffer, open_device
from polygrad.engine import programs
from polygrad.renderer.cstyle import CStyleRenderer
from polygrad.renderer.linearize import L, linearize
from polygrad.schedule.template import schedule
from polygrad.uop.ops import AxisKind, KernelInfo, Ops, UOp

HOST = Capabilities(threads=4, vector_width=8, registers=16)
PLAIN = Capabilities(threads=1, vector_width=1)


def kernels(*tensors):
    tpl, _ = schedule([t.uop for t in tensors])
    return [s.ast for s in tpl.steps if s.kind == "kernel"]


def check_structure(prog):
    """Loops and IFs nest; every value is defined before use and used only while its scope is open."""
    depth_of, open_scopes, stack = {}, [0], []
    scope_id = 0
    for x in prog.insts:
        for s in x.src:
            assert id(s) in depth_of, f"{x} uses a value defined later"
            assert depth_of[id(s)] in open_scopes, f"{x} uses {s} outside the loop nest that defined it"
        if x.op in (L.ENDLOOP, L.ENDIF):
            opener = stack.pop()
            assert x.src[0] is opener, "a loop or IF closed out of order"
            open_scopes.pop()
        depth_of[id(x)] = open_scopes[-1]
        if x.op in (L.LOOP, L.IF):
            scope_id += 1
            stack.append(x)
            open_scopes.append(scope_id)
            depth_of[id(x)] = scope_id  # the loop variable lives inside its loop
    assert not stack, "unclosed loops"


def ops_of(prog):
    return [x.op for x in prog.insts]


def test_elementwise_kernel_is_one_loop_around_load_alu_store():
    (ast,) = kernels(Tensor.empty(64) * 2 + 1)
    prog = linearize(lower(ast, PLAIN))
    check_structure(prog)
    body = [op for op in ops_of(prog) if op not in (L.PARAM, L.CONST)]
    assert body[0] is L.LOOP and body[-1] is L.ENDLOOP
    assert body.count(L.LOOP) == 1 and body.count(L.STORE) == 1 and L.ACC not in body
    assert body.index(L.LOAD) < body.index(L.ALU) < body.index(L.STORE)
    assert prog.threads == 1 and not prog.vars


def test_reduction_defines_updates_then_reads_its_accumulator():
    (ast,) = kernels(Tensor.empty(4, 32).sum(1))
    prog = linearize(lower(ast, PLAIN))
    check_structure(prog)
    ins = prog.insts
    acc = next(x for x in ins if x.op is L.ACC)
    upd = next(x for x in ins if x.op is L.UPDATE)
    read = next(x for x in ins if x.op is L.ACC_READ)
    store = next(x for x in ins if x.op is L.STORE)
    loops = [i for i, x in enumerate(ins) if x.op is L.LOOP]
    ends = [i for i, x in enumerate(ins) if x.op is L.ENDLOOP]
    # output loop, then the accumulator, the reduce loop with the update inside, then the read and store
    assert loops[0] < ins.index(acc) < loops[1] < ins.index(upd) < ends[0] < ins.index(read) < ins.index(store)
    assert acc.arg == (Ops.ADD, 1) and upd.src[0] is acc and read.src[0] is acc and store.src[2] is read
    assert ins[loops[1]].arg[1] == AxisKind.REDUCE


def test_split_reduce_gets_named_lane_accumulators_updated_inside_the_reduce_loop():
    """The 8 partial sums are unrolled: 8 accumulators (one value each, no array to index) defined
    before the reduce loop, each updated once per iteration of it, then folded in lane order."""
    (ast,) = kernels(Tensor.empty(8, 4096).sum(1))
    spec = lower(ast, Capabilities(threads=1, vector_width=8))
    assert [o.kind for o in spec.opts] == [OptKind.SPLIT_REDUCE]
    prog = linearize(spec)
    check_structure(prog)
    ins = list(prog.insts)
    accs = [x for x in ins if x.op is L.ACC]
    assert [a.arg[1] for a in accs] == [1] * 9  # 8 partial sums, then their total
    reduce_loop = next(i for i, x in enumerate(ins) if x.op is L.LOOP and x.arg[1] == AxisKind.REDUCE)
    end = next(i for i, x in enumerate(ins) if x.op is L.ENDLOOP and x.src[0] is ins[reduce_loop])
    assert all(ins.index(a) < reduce_loop for a in accs)
    updates = [x for x in ins[reduce_loop:end] if x.op is L.UPDATE]
    partial = [u.src[0] for u in updates]
    assert len(set(partial)) == 8 and set(partial) < set(accs)  # each lane's accumulator, once each
    total = [x for x in ins[end:] if x.op is L.UPDATE]
    assert len(total) == 8 and {u.src[0] for u in total} == set(accs) - set(partial)  # folded in order
    assert not any(x.op is L.LOOP and x.arg[1] == AxisKind.UPCAST for x in ins)  # no lane loop


def test_too_many_upcast_points_keep_a_lane_loop_and_an_accumulator_array():
    """Past MAX_UNROLL points a block keeps its upcast ranges as loops over accumulator arrays."""
    from polygrad.renderer.linearize import MAX_UNROLL
    (ast,) = kernels(Tensor.empty(8, 4096).sum(1))
    r = next(x for x in ast.toposort() if x.op is Ops.RANGE and x.arg[1] == AxisKind.REDUCE)
    spec = lower(ast, Capabilities(threads=1, vector_width=8), [Opt(OptKind.SPLIT_REDUCE, r.arg[0], 2 * MAX_UNROLL)])
    prog = linearize(spec)
    check_structure(prog)
    accs = [x for x in prog.insts if x.op is L.ACC]
    assert sorted(a.arg[1] for a in accs) == [1, 2 * MAX_UNROLL]
    lane_acc = next(a for a in accs if a.arg[1] == 2 * MAX_UNROLL)
    i = prog.insts.index(lane_acc)
    nxt = [x for x in prog.insts[i:] if x.op is L.LOOP][:2]
    assert [x.arg[1] for x in nxt] == [AxisKind.REDUCE, AxisKind.UPCAST]  # lanes innermost


def test_padded_load_is_gated_and_a_gated_store_is_an_if_block():
    (ast,) = kernels(Tensor.empty(6).pad(((2, 2),)) + 1)
    prog = linearize(lower(ast, PLAIN))
    check_structure(prog)
    assert any(x.op is L.LOAD and len(x.src) == 3 for x in prog.insts)
    out, a = UOp.placeholder((16,), dtypes.float32, 0), UOp.placeholder((16,), dtypes.float32, 1)
    r = UOp.range(None, 16, 0)
    gated = UOp(Ops.INDEX, dtypes.float32, (out, r, r < 10))
    ast = UOp(Ops.STORE, None, (gated, a[r].load() * 2.0)).end(r).sink(arg=KernelInfo(name="gated_store"))
    prog = linearize(lower(ast, PLAIN, []))
    check_structure(prog)
    ops = ops_of(prog)
    assert ops.index(L.IF) < ops.index(L.STORE) < ops.index(L.ENDIF)
    for device in ("CPU", "INTERP"):
        p = programs.get_program(ast, device)
        bo, ba = Buffer(device, 16, dtypes.float32), Buffer(device, 16, dtypes.float32)
        bo.copyin(np.full(16, -1, np.float32))
        ba.copyin(np.arange(16, dtype=np.float32))
        p([bo, ba])
        expect = np.where(np.arange(16) < 10, np.arange(16) * 2, -1).astype(np.float32)
        np.testing.assert_array_equal(bo.numpy(), expect, err_msg=device)


@pytest.mark.parametrize("make", [
    lambda: Tensor.empty(16, 32) @ Tensor.empty(32, 24),
    lambda: (Tensor.empty(8, 64).exp() * 3).max(1),
    lambda: Tensor.empty(3, 8, 8).softmax(-1),
    lambda: Tensor.empty(2, 3, 9, 9).conv2d(Tensor.empty(4, 3, 3, 3), padding=1),
    lambda: Tensor.empty(64, 64).cumsum(1),
    lambda: Tensor.empty(4, 512).sum(1, dtype=dtypes.float16) if False else Tensor.empty(4, 512).half().sum(1),
])
def test_every_program_is_well_formed_on_every_capability(make):
    """Whatever the device allows (no opts, lanes, threads), loops nest and values stay in scope."""
    for ast in kernels(make()):
        for caps in (PLAIN, HOST):
            prog = linearize(lower(ast, caps))
            check_structure(prog)


def test_a_device_without_threads_or_vectors_gets_neither():
    ast = kernels(Tensor.empty(512, 512) @ Tensor.empty(512, 512))[0]
    spec = lower(ast, PLAIN)
    assert spec.opts == () and spec.threads == 1
    assert all(r.arg[1] in (AxisKind.GLOBAL, AxisKind.REDUCE) for r in spec.ast.toposort() if r.op is Ops.RANGE)
    src = CStyleRenderer().render(spec)
    assert "tid" not in src and "uidx" not in src
    # the same kernel on a host with lanes and threads gets a register tile and a THREAD axis
    host = lower(ast, HOST)
    assert {o.kind for o in host.opts} == {OptKind.UPCAST, OptKind.THREAD} and host.threads == 4
    assert "int tid" in CStyleRenderer().render(host)
    # and the INTERP backend, which declares one thread and no lanes, never sees any of it
    assert open_device("INTERP").capabilities.threads == 1
    assert open_device("INTERP").capabilities.vector_width == 1
    x = Tensor(np.ones((512, 512), np.float32), device="INTERP")
    programs.program_cache.clear()
    (x @ x).realize()
    specs = [p.spec for (a, d), p in programs.program_cache.items() if d == "INTERP"]
    assert specs and all(s.opts == () and s.threads == 1 for s in specs)


def test_small_kernels_stay_on_one_thread():
    (ast,) = kernels(Tensor.empty(1000) + 1)
    assert lower(ast, HOST).threads == 1
    (ast,) = kernels(Tensor.empty(1 << 20) + 1)
    assert lower(ast, HOST).threads == 4


@pytest.mark.parametrize("n,threads", [(1 << 18, 2), ((1 << 18) + 3, 3), (257 * 1031, 4)])
def test_thread_split_covers_every_point_once(n, threads):
    """A THREAD range of any size (divisible or not) is cut into disjoint shares that cover it."""
    x = np.arange(n, dtype=np.float32)
    (ast,) = kernels(Tensor.empty(n) * 2 + 1)
    caps = Capabilities(threads=threads, vector_width=8)
    spec = lower(ast, caps)
    assert spec.threads == threads
    impl = open_device("CPU")
    prog = impl.load(spec, impl.compile(impl.render(spec)))
    out, inp = Buffer("CPU", n, dtypes.float32), Buffer("CPU", n, dtypes.float32)
    out.copyin(np.full(n, np.nan, np.float32))
    inp.copyin(x)
    slots = {g.slot: g for g in spec.globals}
    bufs = [out if slots[s].written else inp for s in sorted(slots)]
    prog([b.handle for b in bufs], (), False)
    np.testing.assert_array_equal(out.numpy(), x * 2 + 1)


def test_explicit_opts_are_applied_and_unfit_ones_skipped():
    (ast,) = kernels(Tensor.empty(16, 32) @ Tensor.empty(32, 24))
    base = simplify_indices(ast)
    glob = sorted(r.arg[0] for r in base.toposort() if r.op is Ops.RANGE and r.arg[1] == AxisKind.GLOBAL)
    spec = lower(ast, PLAIN, [Opt(OptKind.UPCAST, glob[-1], 8), Opt(OptKind.UPCAST, glob[-1], 7)])
    kinds = [r.arg[1] for r in spec.ast.toposort() if r.op is Ops.RANGE]
    assert kinds.count(AxisKind.UPCAST) == 1  # 7 does not divide the remaining 3
    unroll = lower(ast, PLAIN, [Opt(OptKind.UNROLL, next(r.arg[0] for r in base.toposort()
                                                         if r.op is Ops.RANGE and r.arg[1] == AxisKind.REDUCE), 4)])
    assert any(r.arg[1] == AxisKind.UNROLL for r in unroll.ast.toposort() if r.op is Ops.RANGE)
    prog = linearize(unroll)
    check_structure(prog)
    assert sum(1 for x in prog.insts if x.op is L.ACC) == 1  # unrolled: still one accumulator
