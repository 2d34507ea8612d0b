"""Deterministic guards for CPU kernel speed (issue 17): no timings, only the structure that makes the
kernels fast. A matmul's register tile is sized from the device's lanes and registers and unrolled into
named vector accumulators (no accumulator array a compiler could keep in memory); a device declaring
FMA gets its reductions' multiply-adds contracted (and INTERP gives the same bits for that IR); a big
matmul stages its column panels (OUTER + STAGE, a contiguous local array) for every layout of B; THREAD
kernels launch on the persistent C pool.
"""
import re

import numpy as np
import pytest

from polygrad import Tensor
from polygrad.backend_api import KERNEL_SYMBOL, Capabilities
from polygrad.codegen.lower import lower
from polygrad.codegen.opts import OptKind
from polygrad.device import Buffer, open_device
from polygrad.engine import programs
from polygrad.renderer.cstyle import CStyleRenderer
from polygrad.renderer.linearize import L, linearize
from polygrad.schedule.template import schedule
from polygrad.uop.ops import Ops
from polygrad_backend_cpu.renderer import CPURenderer
from polygrad_backend_interp.evaluator import InterpProgram

AVX512 = Capabilities(threads=2, vector_width=16, registers=32, fma=True, stage_bytes=512 * 1024)
AVX512_4 = Capabilities(threads=2, vector_width=16, registers=32, fma=True, stage_bytes=512 * 1024, tile_vectors=4)
AVX2 = Capabilities(threads=2, vector_width=8, registers=16, fma=True, stage_bytes=512 * 1024)
SSE = Capabilities(threads=1, vector_width=4, registers=16)
SCALAR_FMA = Capabilities(threads=1, vector_width=1, fma=True)


def kernel(t):
    tpl, _ = schedule([t.uop])
    (ast,) = [s.ast for s in tpl.steps if s.kind == "kernel"]
    return ast


def src_of(spec):
    return CStyleRenderer().render(spec)


@pytest.mark.parametrize("caps,tile", [(AVX512, [8, 32]), (AVX512_4, [4, 64]), (AVX2, [4, 16]), (SSE, [4, 8])])
def test_register_tile_comes_from_lanes_and_registers(caps, tile):
    spec = lower(kernel(Tensor.empty(64, 96) @ Tensor.empty(96, 64)), caps)
    ups = sorted(o.amount for o in spec.opts if o.kind is OptKind.UPCAST)
    assert ups == tile
    rows, vecs = tile[0], tile[1] // caps.vector_width
    assert rows * vecs + vecs + 1 <= caps.registers  # accumulators + B vectors + A broadcast
    src = src_of(spec)
    # one named vector accumulator per (row, vector), no array, no loop over rows or vectors
    accs = re.findall(rf"pg_f32x{caps.vector_width} acc\d+ = ", src)
    assert len(accs) == rows * vecs and not re.search(r"acc\d+\[", src) and "uidx" not in src, src


def test_fma_contraction_only_where_declared():
    ast = kernel(Tensor.empty(64, 96) @ Tensor.empty(96, 64))
    fused = lower(ast, AVX512)
    assert any(n.op is Ops.REDUCE and n.arg is Ops.FMA for n in fused.ast.toposort())
    prog = linearize(fused, vector_width=16)
    assert sum(x.op is L.UPDATE and x.arg is Ops.FMA for x in prog.insts) == 16
    assert "pg_fma_f32x16(" in src_of(fused)
    plain = lower(ast, Capabilities(threads=2, vector_width=16, registers=32))
    assert not any(n.op is Ops.REDUCE and n.arg is Ops.FMA for n in plain.ast.toposort())
    assert "fma" not in src_of(plain)
    # integer sums and sums that are not of products are never contracted
    for t in (Tensor.empty(64, 96, dtype="int32").sum(1), Tensor.empty(64, 96).sum(1)):
        assert not any(n.op is Ops.REDUCE and n.arg is Ops.FMA for n in lower(kernel(t), AVX512).ast.toposort())


def _run_spec(spec, device, inputs):
    prog = InterpProgram(spec) if device == "INTERP" else \
        open_device("CPU").load(spec, open_device("CPU").compile(open_device("CPU").render(spec)))
    bufs = []
    for g in spec.globals:
        b = Buffer(device, g.size, g.dtype)
        b.copyin(inputs[g.slot] if not g.written else np.zeros(g.size, np.float32))
        bufs.append(b)
    prog([b.handle for b in bufs], ())
    return [b.numpy() for b, g in zip(bufs, spec.globals) if g.written][0]


def test_contracted_sum_gives_the_same_bits_on_cpu_and_interp():
    """REDUCE(FMA) is one correctly rounded fma per step; INTERP folds it in the compiled loop's
    order, so the two agree bit for bit, and the result differs from the uncontracted sum."""
    ast = kernel(Tensor.empty(24, 200) @ Tensor.empty(200, 40))
    spec = lower(ast, SCALAR_FMA)  # no lanes, no threads: one sequential loop per element
    assert spec.opts == () and any(n.op is Ops.REDUCE and n.arg is Ops.FMA for n in spec.ast.toposort())
    rng = np.random.default_rng(0)
    inputs = {g.slot: rng.standard_normal(g.size).astype(np.float32) for g in spec.globals if not g.written}
    cpu, interp = _run_spec(spec, "CPU", inputs), _run_spec(spec, "INTERP", inputs)
    np.testing.assert_array_equal(cpu.view(np.uint32), interp.view(np.uint32))
    unfused = _run_spec(lower(ast, Capabilities(threads=1, vector_width=1)), "CPU", inputs)
    assert (unfused != cpu).any() and np.allclose(unfused, cpu, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("layout", ["nn", "tn", "nt"])
def test_big_matmul_stages_its_column_panels(layout):
    """OUTER + STAGE: the column panels are the outermost (thread-shared) loop and B, whatever its
    layout, is copied per panel into a contiguous local array that the tile reads as vectors."""
    n = 512
    a, b = Tensor.empty(n, n), Tensor.empty(n, n)
    t = {"nn": lambda: a @ b, "tn": lambda: a.T @ b, "nt": lambda: a @ b.T}[layout]()
    spec = lower(kernel(t), AVX512)
    kinds = [o.kind for o in spec.opts]
    assert kinds == [OptKind.UPCAST, OptKind.UPCAST, OptKind.OUTER, OptKind.STAGE, OptKind.THREAD]
    panel = next(o.axis for o in spec.opts if o.kind is OptKind.OUTER)
    assert spec.ast.src[0].src[1].arg[0] == panel and spec.threads == 2
    prog = linearize(spec, vector_width=16)
    local = [x for x in prog.insts if x.op is L.LOCAL]
    assert len(local) == 1 and local[0].arg == n * 32
    reads = [x for x in prog.insts if x.op is L.LOAD and x.src[0] is local[0]]
    assert len(reads) == 2 and all(x.arg == "contiguous" and x.lanes == 16 for x in reads)


@pytest.mark.parametrize("layout", ["nn", "tn", "nt"])
def test_no_staging_without_scratch(layout):
    a, b = Tensor.empty(512, 512), Tensor.empty(512, 512)
    t = {"nn": lambda: a @ b, "tn": lambda: a.T @ b, "nt": lambda: a @ b.T}[layout]()
    spec = lower(kernel(t), Capabilities(threads=2, vector_width=16, registers=32, fma=True))
    assert not {OptKind.OUTER, OptKind.STAGE} & {o.kind for o in spec.opts}
    assert not any(x.op is L.LOCAL for x in linearize(spec, vector_width=16).insts)


@pytest.mark.parametrize("layout", ["nn", "tn", "nt"])
def test_staged_matmuls_equal_numpy_on_this_cpu(layout):
    rng = np.random.default_rng(1)
    an, bn = rng.random((384, 384), dtype=np.float32), rng.random((384, 384), dtype=np.float32)
    a, b = Tensor(an, device="CPU"), Tensor(bn, device="CPU")
    t = {"nn": lambda: a @ b, "tn": lambda: a.T @ b, "nt": lambda: a @ b.T}[layout]()
    assert OptKind.STAGE in [o.kind for o in lower(kernel(t), open_device("CPU").capabilities).opts] or \
        open_device("CPU").capabilities.vector_width < 8  # staged on this machine's lanes
    ref = {"nn": an @ bn, "tn": an.T @ bn, "nt": an @ bn.T}[layout]
    np.testing.assert_allclose(t.numpy(), ref, rtol=1e-4)


def test_thread_kernels_launch_on_the_c_pool():
    from polygrad_backend_cpu import runtime
    caps = open_device("CPU").capabilities
    if caps.threads < 2:
        pytest.skip("one core")
    x = Tensor(np.ones((512, 512), np.float32), device="CPU")
    assert runtime.c_pool(wait=True) is not None
    programs.program_cache.clear()
    out = (x @ x).numpy()
    progs = [p for (_, d), p in programs.program_cache.items() if d == "CPU" and p.spec.threads > 1]
    assert progs and runtime.c_pool() is not None and all(p.program.task is not None for p in progs)
    assert "_task(void** a, int tid)" in progs[0].source
    np.testing.assert_array_equal(out, np.full((512, 512), 512, np.float32))


def test_div_mod_recombine_into_the_index():
    """(x // c) * c + x % c is x for C's truncating division, whatever the sign: a flattened
    concatenation then reads its slices contiguously (affine indices the compilers vectorise)."""
    from polygrad.dtype import dtypes
    from polygrad.uop.ops import UOp
    from polygrad.uop.rewrite import graph_rewrite
    from polygrad.uop.symbolic import symbolic_rules
    r = UOp(Ops.RANGE, dtypes.int32, (UOp.const(dtypes.int32, 1000),), (0, "global"))
    x = r - 400  # negative for part of the range
    for expr in ((x // 7) * 7 + x % 7, x % 7 + (x // 7) * 7):
        assert graph_rewrite(expr, symbolic_rules) is graph_rewrite(x, symbolic_rules)
    vals = np.arange(1000) - 400
    assert (np.trunc(vals / 7) * 7 + np.fmod(vals, 7) == vals).all()  # the C identity the rule relies on


def test_a_slice_past_a_split_axis_reads_contiguously():
    """A slice at an offset of a buffer whose last axis was split (a (tokens, 1216, 8) output read as
    (tokens, 9728), its second half: a joined gate/up projection's up) divides (16*g + lane + 4864) by 8:
    the multiples of 8 leave the division even where the rest (the lane, 0..15) reaches past 8, so the
    division and the remainder join again and the load is a vector load, not a gather."""
    from polygrad.dtype import dtypes
    from polygrad.uop.ops import UOp
    from polygrad.uop.rewrite import graph_rewrite
    from polygrad.uop.symbolic import symbolic_rules
    g = UOp(Ops.RANGE, dtypes.int32, (UOp.const(dtypes.int32, 304),), (0, "global"))
    lane = UOp(Ops.RANGE, dtypes.int32, (UOp.const(dtypes.int32, 16),), (1, "upcast"))
    idx = g * 16 + lane + 4864
    joined = graph_rewrite((idx // 8) * 8 + lane % 8, symbolic_rules)
    assert not {u.op for u in joined.toposort()} & {Ops.IDIV, Ops.MOD}, joined
    gv, lv = np.meshgrid(np.arange(304), np.arange(16))
    assert ((gv * 16 + lv + 4864) // 8 * 8 + lv % 8 == gv * 16 + lv + 4864).all()
    F = 4864
    b = np.random.default_rng(0).standard_normal((1, 8, F * 2 // 8, 8)).astype(np.float32)
    a = Tensor(b).realize().reshape(1, 8, 2 * F)
    (ast,) = [kernel(a[..., :F] * a[..., F:])]
    src = src_of(lower(ast, AVX512))
    assert "gather" not in src, src
    flat = b.reshape(1, 8, 2 * F)
    np.testing.assert_array_equal((a[..., :F] * a[..., F:]).numpy(), flat[..., :F] * flat[..., F:])


def test_scalar_gated_loads_are_kept_from_clangs_masked_vectorisation():
    a, b = Tensor.empty(1000), Tensor.empty(337)
    (ast,) = [kernel(a.cat(b) * 2)]
    src = src_of(lower(ast, AVX512))
    assert "#pragma clang loop vectorize(disable)" in src, src
    assert "#pragma" not in src_of(lower(kernel(Tensor.empty(1024) * 2), AVX512))
    out = (Tensor(np.arange(5, dtype=np.float32)).cat(Tensor(np.ones(3, np.float32))) * 2).numpy()
    np.testing.assert_array_equal(out, [0, 2, 4, 6, 8, 2, 2, 2])


def _conv_kernels():
    x = Tensor.empty(8, 64, 56, 56, requires_grad=True)
    w = Tensor.empty(64, 64, 3, 3, requires_grad=True)
    out = x.conv2d(w, padding=1)
    (out * Tensor.empty(8, 64, 56, 56)).sum().backward()
    tpl, _ = schedule([out.uop, x.grad.uop, w.grad.uop])
    return [s.ast for s in tpl.steps if s.kind == "kernel"]


def test_conv_kernels_get_vector_tiles():
    """conv2d 3x3 64->64 on 56x56: the forward tiles output channels x 8-pixel vectors (56 is not a
    multiple of 16 lanes: half-width vectors), the weight gradient is a tile of dot products along the
    pixel rows, and no kernel doing the convolution's multiply-adds is left without vectors."""
    kinds = {}
    for ast in _conv_kernels():
        spec = lower(ast, AVX512)
        if spec.ops < 1e9:
            continue
        src = src_of(spec)
        assert "pg_f32x8" in src, spec.name
        kinds[spec.name] = [(o.kind, o.amount) for o in spec.opts if o.kind is not OptKind.THREAD]
    assert (OptKind.UPCAST, 8) in kinds["r_8_64_56_56"]  # forward: 8 output channels x one vector of 8 pixels
    # the weight gradient: 4 x 2 channels x the 3 kernel columns (tests/test_conv_kernels.py), lanes along a row
    assert kinds["r_64_64_3_3"] == [(OptKind.UPCAST, 4), (OptKind.UPCAST, 2), (OptKind.UPCAST, 3),
                                    (OptKind.SPLIT_REDUCE, 8)]


def test_conv_padded_loads_and_fmas_are_single_vector_operations_on_the_cpu():
    """The padded (gated) loads of conv2d's kernels go through one helper call each, whose x86 build is a
    masked vector load, and their multiply-adds through the FMA helper, whose build is one vector FMA: no
    lane-by-lane load, FMA or lane count left in the kernels (gcc spilled the register tile around them)."""
    for ast in _conv_kernels():
        spec = lower(ast, AVX512)
        if spec.ops < 1e9:
            continue
        src = CPURenderer().render(spec)
        body = src[src.index(f"void {KERNEL_SYMBOL}("):]
        # (the one lane loop left is the split reduction's final horizontal sum, after the loops)
        assert "pg_fma_f32x" in body and not re.search(r"\w\[pl\] =", body) and "on_" not in body, spec.name
        if spec.name == "r_8_64_56_56":  # the forward and the input gradient read padded images
            assert "pg_gload_f32x8(" in body and "__builtin_ia32_maskloadps256(" in src
            assert "__builtin_ia32_vfmaddps256(a, b, c)" in src
        else:  # the weight gradient reads a padded copy (tests/test_conv_kernels.py): no gated load
            assert "pg_gload" not in body, spec.name


def test_conv_input_gradient_is_a_transposed_convolution():
    """A stride-1 conv's input gradient is one convolution of the output gradient (gradient.with_vjp), not
    the window view's chain rule (a 9x larger per-window product summed back with div/mod indices): four
    kernels (forward, input gradient, the padded input's copy the weight gradient reads, weight gradient),
    no buffer larger than the padded input, no division in any index."""
    asts = _conv_kernels()
    assert len(asts) == 4
    for ast in asts:
        assert max(g.arg[1][0] for g in ast.toposort() if g.op is Ops.DEFINE_GLOBAL) <= 8 * 64 * 58 * 58
        assert not any(n.op in (Ops.IDIV, Ops.MOD) for n in lower(ast, AVX512).ast.toposort()), ast.arg


def test_host_buffers_start_on_a_cache_line():
    """NumPy puts big arrays 16 bytes past a page: every 64-byte vector access would straddle two lines."""
    for n in (3, 1000, 1 << 20):
        assert Buffer("CPU", n, Tensor.empty(1).dtype).ensure_allocated()._handle.addr % 64 == 0


def test_big_outputs_are_streamed_past_the_cache():
    """An elementwise output larger than the last-level cache gets non-temporal vector stores (no
    read-for-ownership of every line), fenced at the end; a small output, or one the kernel also reads
    (an in-place update), keeps plain stores. The streamed kernel computes the same values."""
    from polygrad_backend_cpu.renderer import CPURenderer
    big, small = Tensor.empty(1 << 20), Tensor.empty(1 << 10)
    r = CPURenderer(stream_bytes=1 << 20)
    src = r.render(lower(kernel((big * 2 + 1).relu()), AVX512))
    assert "pg_stream64(data0 + " in src and "pg_stream_fence();\n}" in src and "immintrin" not in src
    assert "pg_stream" not in r.render(lower(kernel(small * 2), AVX512))
    x = Tensor.empty(1 << 20)
    (ast,) = [s.ast for s in schedule([x.assign(x * 2).uop])[0].steps if s.kind == "kernel"]
    assert "pg_stream" not in r.render(lower(ast, AVX512))
    assert "pg_stream" not in CPURenderer(stream_bytes=0).render(lower(kernel((big * 2 + 1).relu()), AVX512))
    impl = open_device("CPU")
    saved, impl.render.__self__.stream_bytes = impl.render.__self__.stream_bytes, 4096
    try:
        programs.program_cache.clear()
        data = np.linspace(-3, 3, 40000, dtype=np.float32)
        out = (Tensor(data) * 2 + 1).relu() * 0.5
        np.testing.assert_array_equal(out.numpy(), np.maximum(data * 2 + 1, 0) * 0.5)
        assert any("pg_stream" in p.source for p in programs.program_cache.values())
    finally:
        impl.render.__self__.stream_bytes = saved
        programs.program_cache.clear()


def test_four_vector_rows_narrow_where_their_panel_does_not_fit():
    """A device asking for 4-vector tile rows (clang with AVX-512) gets 4 x 64 tiles with 64-column
    panels staged; where such a panel would not fit the staging scratch (a 3072-long reduction), the tile
    narrows to 8 x 32 and stays staged rather than losing the staging."""
    def tile(m, k, n):
        spec = lower(kernel(Tensor.empty(m, k) @ Tensor.empty(k, n)), AVX512_4)
        return sorted(o.amount for o in spec.opts if o.kind is OptKind.UPCAST), \
            any(o.kind is OptKind.STAGE for o in spec.opts)
    assert tile(128, 768, 3072) == ([4, 64], True)
    assert tile(128, 3072, 768) == ([8, 32], True)
    assert tile(1024, 1024, 1024) == ([4, 64], True)


def test_tile_vectors_follow_the_compiler():
    from polygrad_backend_cpu import tile_vectors
    assert tile_vectors("Debian clang version 14.0.6", 32) == 4
    assert tile_vectors("gcc (Debian 12.2.0-14) 12.2.0", 32) == 2
    assert tile_vectors("Ubuntu clang version 18.1.3", 16) == 2  # AVX2: 16 registers


def _native_macros(cc):
    import subprocess
    out = subprocess.run([cc, "-march=native", "-dM", "-E", "-x", "c", "/dev/null"], capture_output=True, text=True)
    return out.stdout


@pytest.mark.parametrize("cc", ["clang", "gcc"])
def test_vector_fma_is_one_packed_instruction(cc, tmp_path):
    """A tile of dot products (x @ W.T, too small to stage) multiply-adds whole vectors: the compiled
    inner loop has packed vfmadd on ymm/zmm registers and no scalar fma (clang 14 scalarized the per-lane
    helper and re-vectorized it across the tile: 2 GFLOP/s a core)."""
    import shutil
    import subprocess
    from polygrad_backend_cpu.compiler import FLAGS
    from polygrad_backend_cpu.renderer import CPURenderer
    if shutil.which(cc) is None or "__FMA__" not in _native_macros(cc):
        pytest.skip(f"{cc} missing or this CPU has no FMA")
    spec = lower(kernel(Tensor.empty(128, 784) @ Tensor.empty(256, 784).T), AVX512)
    assert any(o.kind is OptKind.SPLIT_REDUCE for o in spec.opts)  # the dot tile, not a staged outer tile
    src = tmp_path / "k.c"
    src.write_text(CPURenderer().render(spec))
    flags = [f for f in FLAGS if f not in ("-shared", "-fPIC", "-lm")]
    subprocess.run([cc, *flags, "-S", str(src), "-o", str(tmp_path / "k.s")], check=True)
    asm = (tmp_path / "k.s").read_text()
    assert re.search(r"vfmadd\w*ps\s+[^\n]*%[yz]mm", asm), asm[:2000]
    assert not re.search(r"vfmadd\w*ss|call\s+fmaf", asm)


def test_dot_tile_matmul_equals_numpy_on_this_cpu():
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((128, 784), dtype=np.float32), rng.standard_normal((256, 784), dtype=np.float32)
    out = (Tensor(x) @ Tensor(w).T).numpy()
    np.testing.assert_allclose(out, x @ w.T, rtol=1e-4, atol=1e-3)


def test_dot_tile_lanes_are_the_split_reduction():
    """With 16 registers a tile of dot products upcasts one 4-wide output range beside a 16-lane split
    reduction: the lanes must be the reduction's (contiguous loads of both operands), not the 4 output
    columns (which gathered W lane by lane: the X86 MLP's x @ W.T ran 10x slower)."""
    caps = Capabilities(threads=1, vector_width=16, registers=16)
    spec = lower(kernel(Tensor.empty(128, 784) @ Tensor.empty(256, 784).T), caps)
    assert sorted(o.kind.name for o in spec.opts) == ["SPLIT_REDUCE", "UPCAST"]
    prog = linearize(spec, vector_width=16)
    loads = [x for x in prog.insts if x.op is L.LOAD]
    assert loads and all(x.lanes == 16 and x.arg == "contiguous" for x in loads)


def test_an_elementwise_loop_over_a_variable_is_not_unrolled_by_clang():
    """issue 30's cold first token: clang unrolled an elementwise kernel's loop over the prompt's tokens at run
    time (with a remainder loop) around a body the opts already unrolled, about 0.1 s of clang -O3 for each of
    GPT-2's 5 such prompt kernels (0.03 s without). The CPU renderer asks it not to; a reduction's loops, and
    constant ones, keep clang's unrolling. The kernel still computes x * 2 + 1."""
    from polygrad import Variable
    n = Variable("n", 1, 64)
    x = Tensor(np.arange(64 * 48, dtype=np.float32).reshape(64, 48), device="CPU").realize()
    caps = open_device("CPU").capabilities
    src = CPURenderer().render(lower(kernel(x[:n.bind(5)] * 2 + 1), caps))
    pragma = "#pragma clang loop unroll(disable)\n"
    assert src.count(pragma) == 1 and re.search(re.escape(pragma) + r"\s*for \(int \w+ = 0; \w+ < v0;", src), src
    assert pragma not in CPURenderer().render(lower(kernel(x[:n.bind(5)].sum(1)), caps))
    assert pragma not in CPURenderer().render(lower(kernel(x * 2 + 1), caps))
    assert pragma not in CStyleRenderer().render(lower(kernel(x[:n.bind(5)] * 2 + 1), caps))  # other dialects
    got = (x[:n.bind(5)] * 2 + 1).numpy()
    np.testing.assert_array_equal(got, np.arange(5 * 48, dtype=np.float32).reshape(5, 48) * 2 + 1)
