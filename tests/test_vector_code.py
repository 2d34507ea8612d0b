"""Vector code (issue 9, item 4): one upcast range per loop nest becomes vector lanes that the C
renderer emits as GCC/clang vector extension types instead of leaving it to the auto-vectorizer.

The guards are deterministic (no timings): the source of a matmul, a long row reduction and a big
elementwise kernel on a device with 8 lanes has vector types and vector loads and no loop over the
vectorised range; a device with 1 lane gets none. Correctness is differential: every kernel runs as
vector C and as scalar C from the same lowered spec (the same opts) and must match bit for bit
(the lanes run each lane's operations in the scalar order); kernels without a reduction must also
match INTERP bit for bit, any NaN matching any NaN.
"""
import re
import shutil

import numpy as np
import pytest

from polygrad import Device, Tensor, dtypes
from polygrad.backend_api import Capabilities
from polygrad.codegen.lower import lower
from polygrad.codegen.opts import Opt, OptKind
from polygrad.device import Buffer, open_device
from polygrad.engine import programs
from polygrad.renderer.cstyle import CStyleRenderer
from polygrad.renderer.linearize import L, linearize
from polygrad.schedule.template import schedule
from polygrad.uop.ops import AxisKind, KernelInfo, Ops, UOp
from polygrad_backend_cpu.compiler import ClangCompiler
from polygrad_backend_cpu.renderer import CPURenderer

from test_linearize import check_structure

if not Device.available("CPU"):  # these test the C renderer's vector code, which needs a C compiler
    pytest.skip("the CPU backend (a C compiler) is not available", allow_module_level=True)

LANES8 = Capabilities(threads=2, vector_width=8, registers=16)
LANES8_ONE_THREAD = Capabilities(threads=1, vector_width=8, registers=16)
NO_LANES = Capabilities(threads=2, vector_width=1)
CPU = open_device("CPU")
_compilers: dict[str, ClangCompiler] = {}


def compiler(cc: str | None = None) -> ClangCompiler:
    """clang (the default compiler) or a named one (gcc), skipping when it is not installed."""
    key = cc or ""
    if key not in _compilers:
        if cc is not None:
            if shutil.which(cc) is None:
                pytest.skip(f"{cc} not installed")
            mp = pytest.MonkeyPatch()
            mp.setenv("POLY_CC", cc)
            try:
                _compilers[key] = ClangCompiler()
            finally:
                mp.undo()
        else:
            _compilers[key] = ClangCompiler()
    return _compilers[key]


def kernels(*tensors):
    tpl, _ = schedule([t.uop for t in tensors])
    return [s.ast for s in tpl.steps if s.kind == "kernel"]


def source(spec, width):
    return CStyleRenderer().render_program(linearize(spec, vector_width=width))


def has_vectors(src: str) -> bool:
    return "vector_size(" in src


def lane_loop_axes(src: str) -> set[int]:
    return {int(a) for a in re.findall(r"for \(\w[\w ]* uidx(\d+) =", src)}


def vector_axis(spec):
    """The axis id of the range the linear program turns into lanes (None: no vector code)."""
    from polygrad.renderer.linearize import _Linearizer
    if not any(x.lanes > 1 for x in linearize(spec, vector_width=spec.vector_width).insts):
        return None
    end = next(n for n in spec.ast.src if n.op is Ops.END)
    r = _Linearizer(spec, spec.vector_width).choose_vector(end)
    return None if r is None else r.arg[0]


# ---- running one kernel on given inputs

def random_input(dt, size, rng, specials=True):
    """Random values; floats with NaN, +-inf, +-0 and subnormals (specials=True: 1 in 16 of each;
    "sparse": 2 of each, so most rows of a reduction stay finite)."""
    if dt is dtypes.bool:
        return rng.random(size) < 0.5
    if dt.is_float:
        x = (rng.standard_normal(size) * 4).astype(np.float64)
        if specials:
            k = 2 if specials == "sparse" else max(1, size // 16)
            pos = rng.choice(size, min(size, 6 * k), replace=False)
            x[pos[:k]] = np.nan
            x[pos[k:2 * k]] = np.inf
            x[pos[2 * k:3 * k]] = -np.inf
            x[pos[3 * k:4 * k]] = -0.0
            x[pos[4 * k:5 * k]] = 0.0
            x[pos[5 * k:]] = 1e-40  # subnormal in float32
        return x.astype(dt.np)
    info = np.iinfo(dt.np)
    lo, hi = max(info.min, -60), min(info.max, 60)
    return rng.integers(lo, hi + 1, size).astype(dt.np)


def inputs_for(spec_globals, rng, specials=True):
    return {g.slot: random_input(g.dtype, g.size, rng, specials) for g in spec_globals if not g.written}


def run_c(spec, width, inputs, cc=None, src=None):
    """Run spec as C (its source with `width` lanes, or `src`) on inputs: the written buffers by slot."""
    prog = CPU.load(spec, compiler(cc).compile(source(spec, width) if src is None else src))
    bufs = {}
    for g in spec.globals:
        b = Buffer("CPU", g.size, g.dtype)
        b.copyin(inputs[g.slot] if not g.written else np.zeros(g.size, dtype=b.numpy().dtype))
        bufs[g.slot] = b
    prog([bufs[g.slot].handle for g in spec.globals], (), False)
    return {g.slot: bufs[g.slot].numpy().copy() for g in spec.globals if g.written}


def run_interp(ast, spec_globals, inputs):
    prog = programs.get_program(ast, "INTERP")
    bufs = {}
    for g in spec_globals:
        b = Buffer("INTERP", g.size, g.dtype)
        b.copyin(inputs[g.slot] if not g.written else np.zeros(g.size, dtype=b.numpy().dtype))
        bufs[g.slot] = b
    prog([bufs[g.slot] for g in spec_globals])
    return {g.slot: bufs[g.slot].numpy().copy() for g in spec_globals if g.written}


def assert_bits_equal(a, b, what):
    """Bit for bit (so -0.0 != 0.0), any NaN matching any NaN."""
    assert a.dtype == b.dtype and a.shape == b.shape, what
    if a.dtype.kind == "f":
        nan_a, nan_b = np.isnan(a), np.isnan(b)
        np.testing.assert_array_equal(nan_a, nan_b, err_msg=f"{what}: NaN positions differ")
        bits = {2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize]
        a, b = np.where(nan_a, 0, a).view(bits), np.where(nan_b, 0, b).view(bits)
    bad = np.flatnonzero(a != b)
    first = bad[:5]
    assert bad.size == 0, f"{what}: {bad.size} differ, first at {first}: {a.ravel()[first]} vs {b.ravel()[first]}"


def check_kernel(ast, caps=LANES8, opts=None, specials=True, seed=0, expect_vectors=None, interp=None, cc=None):
    """Vector C == scalar C (same spec) bit for bit; without reductions also == INTERP. Returns the spec."""
    spec = lower(ast, caps, opts)
    src = source(spec, spec.vector_width)
    if expect_vectors is not None:
        assert has_vectors(src) == expect_vectors, src
    check_structure(linearize(spec, vector_width=spec.vector_width))
    inputs = inputs_for(spec.globals, np.random.default_rng(seed), specials)
    vec = run_c(spec, spec.vector_width, inputs, cc)
    scalar = run_c(spec, 1, inputs, cc)
    for slot in vec:
        assert_bits_equal(vec[slot], scalar[slot], f"{spec.name} slot {slot}: vector vs scalar C")
    reduces = any(n.op is Ops.REDUCE for n in ast.toposort())
    if interp if interp is not None else not reduces:
        ref = run_interp(ast, spec.globals, inputs)
        for slot in vec:
            assert_bits_equal(vec[slot], ref[slot], f"{spec.name} slot {slot}: vector C vs INTERP")
    return spec


# ---- the source: vectors where the device has lanes, none where it has not

def test_matmul_is_vector_code_without_a_lane_loop():
    """The register tile is unrolled: one named vector accumulator per (row, column vector), no loop
    over rows or column vectors and no accumulator array; B's vectors are loaded once per reduce step
    and shared by the rows, A's element broadcast once and shared by the vectors."""
    (ast,) = kernels(Tensor.empty(64, 64) @ Tensor.empty(64, 64))
    spec = lower(ast, LANES8)
    assert spec.vector_width == 8
    # 8 lanes, 16 registers: 4 rows x 2 vectors = 8 accumulators + 2 B vectors + 1 broadcast
    assert sorted(o.amount for o in spec.opts if o.kind is OptKind.UPCAST) == [4, 16]
    src = source(spec, 8)
    # the 16 tile columns are two vectors of the device's 8 lanes (gcc makes poor code of wider ones)
    assert "typedef float pg_f32x8 __attribute__((vector_size(32)));" in src and "x16" not in src
    assert len(re.findall(r"pg_f32x8 val\d+;\s*__builtin_memcpy\(&val\d+, data\d \+", src)) == 2, src  # B: 2 vectors
    assert len(re.findall(r"pg_f32x8 bc\d+ = \{val\d+,", src)) == 4, src  # A: one broadcast per row
    assert len(re.findall(r"pg_f32x8 acc\d+ = bc\d+;", src)) == 8 and "acc[" not in src, src
    assert "[8];" not in src and not re.search(r"acc\d+\[", src), src
    assert vector_axis(spec) is not None
    prog = linearize(spec, vector_width=8)
    assert not [x for x in prog.insts if x.op is L.LOOP and x.arg[1] == AxisKind.UPCAST]
    assert sum(x.op is L.UPDATE for x in prog.insts) == 8 and not lane_loop_axes(src)
    out = check_kernel(ast, interp=False)
    assert out.opts == spec.opts
    a = np.random.rand(64, 64).astype(np.float32)
    np.testing.assert_allclose((Tensor(a) @ Tensor(a)).numpy(), a @ a, rtol=1e-4)


def test_lanes_follow_the_device_width():
    """A range wider than the width becomes vectors of the width; a narrower one (4 lanes or more,
    dividing the width) becomes vectors of its size."""
    (ast,) = kernels(Tensor.empty(16, 4096).sum(1))  # SPLIT_REDUCE by 8
    spec = lower(ast, LANES8)
    assert "pg_f32x8" in source(spec, 16) and "pg_f32x4" in source(spec, 4)
    assert "pg_f32x4" in source(spec, 4) and not has_vectors(source(spec, 3))
    for width in (4, 16):
        check_structure(linearize(spec, vector_width=width))


@pytest.mark.parametrize("width", [4, 16])
def test_other_device_widths_are_bit_identical(width):
    """SSE/NEON (4 float32 lanes) and AVX-512 (16) devices: their own tiles, splits and lanes."""
    caps = Capabilities(threads=2, vector_width=width, registers=32 if width == 16 else 16)
    for make in (REDUCTIONS["matmul"], REDUCTIONS["row_sum"], REDUCTIONS["bool_any_all"],
                 ELEMENTWISE["pad_last_axis"], ELEMENTWISE["where_f64_on_f32_cond"], ELEMENTWISE["int8"]):
        for i, ast in enumerate(kernels(make())):
            spec = check_kernel(ast, caps=caps, seed=i, specials="sparse")
            assert spec.vector_width == width

def test_long_row_reduction_is_a_vector_accumulator_and_a_horizontal_sum():
    (ast,) = kernels(Tensor.empty(16, 4096).sum(1))
    spec = lower(ast, LANES8)
    assert [o.kind for o in spec.opts][:1] == [OptKind.SPLIT_REDUCE]
    src = source(spec, 8)
    assert "typedef float pg_f32x8 __attribute__((vector_size(32)));" in src
    assert re.search(r"pg_f32x8 acc\d+ = bc\d+;", src)  # one vector of 8 partial sums
    assert re.search(r"for \(int pl = 0; pl < 8; pl\+\+\) acc\d+ = \(acc\d+\+acc\d+\[pl\]\);", src), src
    assert not lane_loop_axes(src)
    prog = linearize(spec, vector_width=8)
    assert any(x.op is L.UPDATE and x.src[0].lanes == 1 and x.lanes == 8 for x in prog.insts)  # horizontal
    check_kernel(ast, interp=False)
    x = np.random.rand(16, 4096).astype(np.float32)
    np.testing.assert_allclose(Tensor(x).sum(1).numpy(), x.sum(1), rtol=1e-5)


def test_column_reduction_is_lanes_across_outputs():
    """A sum along a strided axis with contiguous outputs (a bias gradient: (128, 512).sum(0)) keeps one
    vector accumulator per group of columns and loads rows contiguously, instead of partial sums of
    each strided column (those walk the columns one by one, every load of a 2 KB-stride column in the
    same few cache sets: 143 us against 10 us in an MLP step here)."""
    (ast,) = kernels(Tensor.empty(128, 512).sum(0))
    spec = lower(ast, LANES8)
    assert [o.kind for o in spec.opts if o.kind is not OptKind.THREAD] == [OptKind.UPCAST]
    assert OptKind.SPLIT_REDUCE not in [o.kind for o in spec.opts]
    src = source(spec, 8)
    assert re.search(r"pg_f32x8 acc\d+ = bc\d+;", src) and "for (int pl" not in src
    check_kernel(ast, expect_vectors=True)
    x = np.random.rand(128, 512).astype(np.float32)
    np.testing.assert_allclose(Tensor(x).sum(0).numpy(), x.sum(0), rtol=1e-5)
    for shape in ((100, 37), (3, 48), (128, 8)):  # widths the lanes do not divide, short columns
        y = np.random.rand(*shape).astype(np.float32)
        np.testing.assert_allclose(Tensor(y).sum(0).numpy(), y.sum(0), rtol=1e-5)
        np.testing.assert_allclose(Tensor(y).mean(0).numpy(), y.mean(0), rtol=1e-5)
    # a row reduction (contiguous along the reduction) keeps its split accumulators
    (row,) = kernels(Tensor.empty(16, 4096).sum(1))
    assert OptKind.SPLIT_REDUCE in [o.kind for o in lower(row, LANES8).opts]


def test_big_elementwise_kernel_is_vector_loads_and_stores():
    (ast,) = kernels(Tensor.empty(1 << 16) * 2 + Tensor.empty(1 << 16))
    spec = lower(ast, LANES8)
    assert [o.kind for o in spec.opts if o.kind is not OptKind.THREAD] == [OptKind.UPCAST]
    src = source(spec, 8)
    assert src.count("__builtin_memcpy") == 3  # two loads and the store
    assert not lane_loop_axes(src) and "for (int pl" not in src
    check_kernel(ast, expect_vectors=True)


def test_a_device_without_lanes_gets_no_vectors():
    for ast in kernels(Tensor.empty(64, 64) @ Tensor.empty(64, 64)) + kernels(Tensor.empty(1 << 16) + 1):
        spec = lower(ast, NO_LANES)
        assert spec.vector_width == 1
        assert not has_vectors(CStyleRenderer().render(spec))
        # explicit lane opts on a device without lanes: scalar lane loops
        ranges = [r for r in ast.toposort() if r.op is Ops.RANGE and r.arg[1] == AxisKind.GLOBAL]
        split = lower(ast, NO_LANES, [Opt(OptKind.UPCAST, max(r.arg[0] for r in ranges), 8)])
        assert any(o.kind is OptKind.UPCAST for o in split.opts)
        assert not has_vectors(CStyleRenderer().render(split))
    # linearize without a width (emitters that do not render vectors) keeps lane loops
    (ast,) = kernels(Tensor.empty(16, 4096).sum(1))
    prog = linearize(lower(ast, LANES8))
    assert all(x.lanes == 1 for x in prog.insts)
    # and INTERP, which declares 1 lane, never sees any
    assert open_device("INTERP").capabilities.vector_width == 1
    x = Tensor(np.ones((64, 64), np.float32), device="INTERP")
    programs.program_cache.clear()
    (x @ x + 1).realize()
    specs = [p.spec for (a, d), p in programs.program_cache.items() if d == "INTERP"]
    assert specs and all(s.vector_width == 1 and s.opts == () for s in specs)


def test_default_cpu_device_results_equal_numpy():
    """On this machine's own lanes (8 with AVX2, 16 with AVX-512, 4 otherwise)."""
    rng = np.random.default_rng(1)
    a, b = rng.random((128, 96), dtype=np.float32), rng.random((96, 80), dtype=np.float32)
    np.testing.assert_allclose((Tensor(a) @ Tensor(b)).numpy(), a @ b, rtol=1e-4)
    x = rng.random((33, 2048), dtype=np.float32)
    np.testing.assert_allclose(Tensor(x).sum(1).numpy(), x.sum(1), rtol=1e-5)
    np.testing.assert_array_equal(Tensor(x).max(1).numpy(), x.max(1))
    e = rng.standard_normal(1 << 15).astype(np.float32)
    np.testing.assert_array_equal((Tensor(e) * 3 + 1).numpy(), e * np.float32(3) + np.float32(1))


# ---- differential: vector C == scalar C (and == INTERP without reductions)

f32, i32 = dtypes.float32, dtypes.int32
E = Tensor.empty
ELEMENTWISE = {
    "arith": lambda: (E(64, 96) * E(64, 96) + E(64, 96) / E(64, 96)) - 1.5,
    "max_nan": lambda: E(64, 96).maximum(E(64, 96)),
    "relu_neg_recip": lambda: (-E(4096)).relu() + E(4096).reciprocal(),
    "where_cmp": lambda: (E(64, 96) < E(64, 96)).where(E(64, 96), 3.0),
    "eq_ne": lambda: ((E(2048) == E(2048)) | (E(2048) != 0.5)).where(1.0, -1.0),
    "sqrt_trunc": lambda: E(2048).sqrt() + E(2048).trunc(),
    "exp_log_sin": lambda: E(2048).exp() + E(2048).log2() + E(2048).sin(),  # decomposed: int bit tricks
    "fmod": lambda: E(2048) % E(2048),
    "float64": lambda: E(1024, dtype=dtypes.float64) * 2 - E(1024, dtype=dtypes.float64).maximum(0.0),
    "int_arith": lambda: E(64, 96, dtype=i32) * 3 + E(64, 96, dtype=i32) - 7,
    "int_div_mod": lambda: E(4096, dtype=i32) // 7 + E(4096, dtype=i32) % 5,
    "int_bits": lambda: (E(4096, dtype=i32) ^ E(4096, dtype=i32)) & 255 | (E(4096, dtype=i32) << 2),
    "int_max_cmp": lambda: E(4096, dtype=i32).maximum(E(4096, dtype=i32)) + (E(4096, dtype=i32) < 3).cast(i32),
    "int64": lambda: E(1024, dtype=dtypes.int64) * 1000003 + E(1024, dtype=dtypes.int64),
    "int8": lambda: E(1024, dtype=dtypes.int8) * 3 + E(1024, dtype=dtypes.int8),
    "uint8_max": lambda: E(1024, dtype=dtypes.uint8).maximum(E(1024, dtype=dtypes.uint8)) + 250,
    "bool_logic": lambda: ((E(2048) > 0) & (E(2048) < 1)) ^ ~(E(2048) != 0),
    "bool_store_from_bool_load": lambda: E(2048, dtype=dtypes.bool).logical_not() | E(2048, dtype=dtypes.bool),
    "bool_cmp_mixed_widths": lambda: (E(1024, dtype=dtypes.float64) > 0) & (E(1024, dtype=dtypes.int8) < 0),
    "where_f64_on_f32_cond": lambda: (E(1024) > 0).where(E(1024, dtype=dtypes.float64), -1.0),
    "where_int8": lambda: (E(1024, dtype=dtypes.int8) > 0).where(E(1024, dtype=dtypes.int8), 5),
    "cast_bool_float": lambda: (E(2048) > 0).cast(f32) + E(2048).cast(dtypes.bool).cast(f32),
    "cast_int_float": lambda: E(2048, dtype=i32).cast(f32) * 0.5 + E(2048, dtype=dtypes.uint8).cast(f32),
    "cast_widths": lambda: E(2048, dtype=dtypes.int8).cast(i32) + E(2048, dtype=dtypes.int64).cast(i32),
    "cast_f64_f32": lambda: E(2048, dtype=dtypes.float64).cast(f32) + E(2048).cast(dtypes.float64).cast(f32),
    "bitcast": lambda: E(2048).bitcast(i32) ^ E(2048, dtype=i32),
    "pad_last_axis": lambda: E(64, 40).pad(((0, 0), (8, 16))) + 1,  # gate per lane
    "pad_first_axis": lambda: E(40, 64).pad(((8, 16), (0, 0))) * 2,  # gate per row: scalar
    "concat": lambda: E(32, 24).cat(E(32, 40), dim=1) * 3,
    "transpose": lambda: E(64, 96).T + 1,  # gather
    "stride2": lambda: E(64, 192)[:, ::2] * 2,  # gather, coefficient 2
    "flip": lambda: E(32, 64).flip(1) - 1,  # coefficient -1
    "broadcast_row": lambda: E(64, 1).expand(64, 96) + E(1, 96),  # scalar load + broadcast
    "odd_sizes": lambda: E(37, 13) * E(37, 13) + 1,  # no lanes fit: scalar fallback
    "half": lambda: E(1024, dtype=dtypes.float16) * 3 + 1,  # 16-bit floats: scalar fallback
}
REDUCTIONS = {
    "row_sum": lambda: E(16, 4096).sum(1),
    "row_max_nan": lambda: E(16, 2048).max(1),
    "col_sum": lambda: E(256, 64).sum(0),
    "mean_var": lambda: (E(8, 1024) - E(8, 1024).mean(1, keepdim=True)).square().mean(1),
    "softmax": lambda: E(8, 512).softmax(-1),
    "int_sum": lambda: E(16, 1024, dtype=i32).sum(1),
    "int_max": lambda: E(16, 1024, dtype=i32).max(1),
    "bool_any_all": lambda: (E(16, 1024) > 0.5).any(1) & (E(16, 1024) > -3).all(1),
    "matmul": lambda: E(64, 48) @ E(48, 80),
    "matmul_transposed": lambda: E(48, 64).T @ E(48, 96),
    "matvec": lambda: E(128, 256) @ E(256),
    "conv2d": lambda: E(2, 3, 16, 16).conv2d(E(8, 3, 3, 3), padding=1),
    "cumsum": lambda: E(8, 256).cumsum(1),
    "half_sum": lambda: E(4, 1024, dtype=dtypes.float16).sum(1),
}


@pytest.mark.parametrize("name", sorted(ELEMENTWISE))
def test_elementwise_vector_code_is_bit_identical(name):
    asts = kernels(ELEMENTWISE[name]())
    specials = not name.startswith("cast_int") and name not in ("cast_widths", "bitcast")
    vectorised = []
    for i, ast in enumerate(asts):
        spec = check_kernel(ast, seed=i, specials=specials)
        vectorised.append(has_vectors(source(spec, spec.vector_width)))
    if name in ("odd_sizes", "half"):
        assert not any(vectorised)
    elif name not in ("pad_first_axis", "concat", "stride2"):
        assert any(vectorised), name


@pytest.mark.parametrize("name", sorted(REDUCTIONS))
def test_reduction_vector_code_is_bit_identical_to_scalar_code(name):
    vectorised = []
    for i, ast in enumerate(kernels(REDUCTIONS[name]())):
        for caps in (LANES8, LANES8_ONE_THREAD):
            spec = check_kernel(ast, caps=caps, seed=i, specials="sparse")
            vectorised.append(has_vectors(source(spec, spec.vector_width)))
    if name == "half_sum":
        assert not any(vectorised)
    elif name in ("row_sum", "row_max_nan", "matmul", "int_sum", "int_max", "softmax"):
        assert any(vectorised), name


def test_reductions_equal_numpy_with_lanes():
    rng = np.random.default_rng(3)
    a, b = rng.random((64, 48), dtype=np.float32), rng.random((48, 80), dtype=np.float32)
    (ast,) = kernels(E(64, 48) @ E(48, 80))
    spec = lower(ast, LANES8)
    slots = [g for g in spec.globals if not g.written]
    # which input slot is which operand: the one of 64*48 elements is a
    inputs = {g.slot: (a if g.size == a.size else b).ravel() for g in slots}
    out = next(iter(run_c(spec, 8, inputs).values()))
    np.testing.assert_allclose(out.reshape(64, 80), a @ b, rtol=1e-5)


# ---- hand-built kernels: every kind of vector access

def _kernel(n, body, name, dtype=dtypes.float32, out_dtype=None, inputs=1, gate=None):
    out = UOp.placeholder((n,), out_dtype or dtype, 0)
    ins = [UOp.placeholder((n * 2,), dtype, i + 1) for i in range(inputs)]
    r = UOp.range(None, n, 0)
    value = body(r, ins)
    index = out[r] if gate is None else UOp(Ops.INDEX, out_dtype or dtype, (out, r, gate(r)))
    return UOp(Ops.STORE, None, (index, value)).end(r).sink(arg=KernelInfo(name=f"k_{name}")), r


def _upcast(ast, amount):
    last = max(r.arg[0] for r in ast.toposort() if r.op is Ops.RANGE)
    return [Opt(OptKind.UPCAST, last, amount)]


@pytest.mark.parametrize("amount", [8, 16])
@pytest.mark.parametrize("case", ["masked_store", "if_store", "scatter", "gather", "masked_gather",
                                  "gated_contiguous", "fma", "mod", "where_lane_index"])
def test_hand_built_accesses(case, amount):
    """amount 8: the upcast range is one vector; 16: two vectors of 8 (unrolled, no loop)."""
    n = 64
    if case == "masked_store":  # a gate that depends on the lanes: per-lane store, no IF
        ast, _ = _kernel(n, lambda r, a: a[0][r].load() * 2.0, case, gate=lambda r: (r % 3) < 2)
    elif case == "if_store":  # a gate that does not (it depends on the row only): an IF around the vector store
        out, a = UOp.placeholder((8, 16), dtypes.float32, 0), UOp.placeholder((8, 16), dtypes.float32, 1)
        row, col = UOp.range(None, 8, 0), UOp.range(None, 16, 1)
        index = UOp(Ops.INDEX, dtypes.float32, (out, row * 16 + col, row < 5))
        ast = UOp(Ops.STORE, None, (index, a[row, col].load() + 1.0)).end(row, col).sink(
            arg=KernelInfo(name=f"k_{case}"))
    elif case == "scatter":
        out = UOp.placeholder((2 * n,), dtypes.float32, 0)
        a = UOp.placeholder((n,), dtypes.float32, 1)
        r = UOp.range(None, n, 0)
        ast = out[r * 2].store(a[r].load() - 1.0).end(r).sink(arg=KernelInfo(name=f"k_{case}"))
    elif case == "gather":
        ast, _ = _kernel(n, lambda r, a: a[0][r * 2 + 1].load(), case)
    elif case == "masked_gather":
        ast, _ = _kernel(n, lambda r, a: UOp(Ops.INDEX, dtypes.float32, (a[0].src[0] if a[0].op is Ops.INDEX else a[0],
                                                                          r * 2, r < 40)).load() + 1.0, case)
    elif case == "gated_contiguous":
        ast, _ = _kernel(n, lambda r, a: UOp(Ops.INDEX, dtypes.float32, (a[0], r + 3, r < 50)).load() * 3.0, case)
    elif case == "fma":
        ast, _ = _kernel(n, lambda r, a: UOp(Ops.FMA, dtypes.float32, (a[0][r].load(), a[1][r].load(),
                                                                        a[0][r + 1].load())), case, inputs=2)
    elif case == "mod":
        ast, _ = _kernel(n, lambda r, a: UOp(Ops.MOD, dtypes.float32, (a[0][r].load(), a[1][r].load())), case,
                         inputs=2)
    else:  # the lane index itself as a value
        ast, _ = _kernel(n, lambda r, a: ((r % 4) < 2).where(a[0][r].load(), r.cast(dtypes.float32)), case)
    spec = check_kernel(ast, caps=LANES8_ONE_THREAD, opts=_upcast(ast, amount), expect_vectors=True)
    src = source(spec, 8)
    assert not lane_loop_axes(src), src
    if case == "masked_store":  # a lane mask: one vector store when every lane is on, else lane by lane
        assert re.search(r"if \(\(\{ int on_ = 0;.*\) == 8\) __builtin_memcpy\(data0", src), src
        assert re.search(r"else for \(int pl = 0; pl < 8; pl\+\+\) if \(\(alu\d+\[pl\]!=0\)\) data0", src), src
    if case == "if_store":
        assert re.search(r"if \(alu\d+\) \{\n\s*__builtin_memcpy\(data0", src), src


@pytest.mark.parametrize("cc", ["clang", "gcc"])
def test_both_compilers_build_the_same_vector_code(cc):
    """The vector source is plain GNU C: clang (the default) and gcc compile it to the same results."""
    for make in (ELEMENTWISE["where_f64_on_f32_cond"], ELEMENTWISE["bool_cmp_mixed_widths"],
                 ELEMENTWISE["int_max_cmp"], ELEMENTWISE["pad_last_axis"], ELEMENTWISE["max_nan"],
                 ELEMENTWISE["cast_f64_f32"], REDUCTIONS["row_max_nan"], REDUCTIONS["matmul"],
                 REDUCTIONS["bool_any_all"]):
        for i, ast in enumerate(kernels(make())):
            check_kernel(ast, seed=i, cc=cc)


@pytest.mark.parametrize("cc", ["clang", "gcc"])
@pytest.mark.parametrize("lanes", [4, 8, 16])
def test_cpu_dialect_x86_builtins_match_the_portable_loops(cc, lanes):
    """The CPU dialect's gated loads (masked loads: a padded row whose masked lanes lie past the buffer's
    end) and lane FMAs go through x86 builtins where the compiler targets AVX / FMA / AVX-512, and through
    the base renderer's lane loops elsewhere (-mno-avx here): both builds equal the scalar C bit for bit."""
    n = 64
    out, a, b = (UOp.placeholder((n,), dtypes.float32, 0), UOp.placeholder((n - 13,), dtypes.float32, 1),
                 UOp.placeholder((n,), dtypes.float32, 2))
    r = UOp.range(None, n, 0)
    gated = UOp(Ops.INDEX, dtypes.float32, (a, r + 3, r < n - 16)).load()
    value = UOp(Ops.FMA, dtypes.float32, (gated, b[r].load(), b[(r + 1) % n].load()))
    ast = out[r].store(value).end(r).sink(arg=KernelInfo(name="k_x86_builtins"))
    caps = Capabilities(threads=1, vector_width=lanes, registers=16)
    spec = lower(ast, caps, [Opt(OptKind.UPCAST, 0, lanes)])
    src = CPURenderer().render_program(linearize(spec, vector_width=lanes))
    vt = f"pg_f32x{lanes}"
    assert f"pg_fma_{vt[3:]}(" in src and f"pg_gload_{vt[3:]}(data1 + " in src, src
    fast = {4: "__builtin_ia32_maskloadps(", 8: "__builtin_ia32_maskloadps256("}
    if lanes in fast:
        assert "#if defined(__AVX__)\n  return " + fast[lanes] in src, src
    inputs = inputs_for(spec.globals, np.random.default_rng(lanes), True)
    scalar = run_c(spec, 1, inputs, cc)
    for extra in ((), ("-mno-avx",)):
        prog = CPU.load(spec, compiler(cc).compile(src, extra))
        bufs = {}
        for g in spec.globals:
            bufs[g.slot] = Buffer("CPU", g.size, g.dtype)
            bufs[g.slot].copyin(inputs[g.slot] if not g.written else np.zeros(g.size, np.float32))
        prog([bufs[g.slot].handle for g in spec.globals], (), False)
        assert_bits_equal(bufs[0].numpy(), scalar[0], f"{cc} {extra} lanes {lanes}")


def test_unvectorisable_kernels_fall_back_to_lane_loops():
    (ast,) = kernels(E(4, 1024, dtype=dtypes.float16).sum(1))
    spec = lower(ast, LANES8)
    assert any(o.kind is OptKind.SPLIT_REDUCE for o in spec.opts)
    src = source(spec, 8)
    assert not has_vectors(src) and not lane_loop_axes(src)  # 8 scalar lanes, unrolled
    prog = linearize(spec, vector_width=8)
    assert all(x.lanes == 1 for x in prog.insts) and sum(x.op is L.ACC for x in prog.insts) == 9
    # a shift of narrow ints by a loaded amount, which may reach the lane width, is computed in int by C (a
    # constant amount below the width gets lanes: test_lowering_opts.py's narrow shift test)
    (ast,) = kernels(E(1024, dtype=dtypes.int8) << E(1024, dtype=dtypes.int8))
    spec = lower(ast, LANES8)
    assert not has_vectors(source(spec, 8))
    check_kernel(ast)


def test_half_to_float_is_exact_for_every_bit_pattern():
    """pg_h2f (hardware conversion under clang with F16C or on AArch64, else bit arithmetic) gives NumPy's
    float32 for all 65,536 float16 patterns (NaN for NaN: a signalling NaN may come back quiet)."""
    bits = np.arange(1 << 16, dtype=np.uint16)
    got = Tensor(bits, device="CPU").bitcast(dtypes.float16).cast(dtypes.float32).numpy()
    want = bits.view(np.float16).astype(np.float32)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))


@pytest.mark.skipif(shutil.which("clang") is None, reason="needs clang")
def test_half_to_float_is_one_instruction_where_clang_has_f16c():
    """The dequantization of a block format reads a float16 scale per block: with clang on a CPU with F16C
    the conversion is vcvtph2ps, not the 10-operation bit arithmetic (kept for gcc and other CPUs)."""
    import subprocess
    import tempfile
    from polygrad.renderer.cstyle import HALF_HELPERS
    with open("/proc/cpuinfo") as f:
        if " f16c" not in f.read():
            pytest.skip("this CPU has no F16C")
    src = HALF_HELPERS + "\nfloat pg_probe(const unsigned short* p) { return pg_h2f(p[0]); }\n"
    with tempfile.NamedTemporaryFile("w", suffix=".c") as f:
        f.write(src)
        f.flush()
        asm = subprocess.run(["clang", "-O3", "-march=native", "-S", "-o", "-", f.name], capture_output=True,
                             text=True, check=True).stdout
    assert "vcvtph2ps" in asm, asm
