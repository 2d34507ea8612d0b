"""The passes over the linear program that every emitter shares (issue 29, section 5):
renderer/linear_passes.py unrolls, folds, shares, hoists and drops dead values once, in core; X86
runs them before its own rewrites, a C-family dialect may ask for them (`CStyleRenderer.passes`).

What holds, checked against references: integer folding follows NumPy's / PyTorch's wrapping and
truncating semantics; a simplified program keeps the linear program's structure (defined before use,
used only in its loop nest), has no upcast loop, accumulator array or constant-only integer ALU left,
and computes the same bits as the program it came from (C from both, run on the same inputs, and
INTERP for kernels without a reduction). The C-family op tables are data a dialect replaces by rows.
"""
import re

import numpy as np
import pytest
import torch

from polygrad import Tensor, Variable, dtypes
from polygrad.backend_api import (SCALAR_RULES, VECTOR_RULES, Capabilities, CStyleRenderer, LinearPasses,
                                  simplify_linear)
from polygrad.codegen.lower import lower
from polygrad.renderer.linear_passes import fold_int, is_const
from polygrad.renderer.linearize import L, linearize
from polygrad.uop.ops import AxisKind, Ops

from test_linearize import check_structure, kernels
from test_vector_code import LANES8, assert_bits_equal, inputs_for, run_c, run_interp

# everything but the machine-code offsets (a C source indexes with the whole expression)
ALL = LinearPasses(unroll=True, reduce_unroll=((4, 64), (2, 160)))
NO_LANES_ONE_THREAD = Capabilities(threads=1, vector_width=1, registers=16)

INT_CASES = [(dtypes.int8, np.int8, torch.int8), (dtypes.uint8, np.uint8, torch.uint8),
             (dtypes.int32, np.int32, torch.int32), (dtypes.int64, np.int64, torch.int64)]


@pytest.mark.parametrize("dt,np_dt,torch_dt", INT_CASES, ids=lambda c: getattr(c, "name", None))
def test_integer_folding_wraps_and_truncates_like_numpy_and_torch(dt, np_dt, torch_dt):
    rng = np.random.default_rng(0)
    info = np.iinfo(np_dt)
    a = np.concatenate([[info.min, info.max, -1, 0, 1], rng.integers(info.min, info.max, 60, endpoint=True)])
    b = np.concatenate([[-1, -1, info.min, 7, info.max], rng.integers(info.min, info.max, 60, endpoint=True)])
    a, b = a.astype(np_dt), b.astype(np_dt)
    b = np.where(b == 0, np_dt(3), b)
    if not dt.is_unsigned:  # INT_MIN // -1 traps in PyTorch (SIGFPE): the next test checks it
        b = np.where((a == info.min) & (b == -1), np_dt(2), b)
    with np.errstate(over="ignore"):
        refs = {Ops.ADD: a + b, Ops.MUL: a * b, Ops.MAX: np.maximum(a, b), Ops.AND: a & b, Ops.OR: a | b,
                Ops.XOR: a ^ b, Ops.CMPLT: a < b, Ops.CMPNE: a != b, Ops.CMPEQ: a == b}
    ta, tb = torch.from_numpy(a.copy()).to(torch_dt), torch.from_numpy(b.copy()).to(torch_dt)
    if dt.is_unsigned:  # floor and truncation agree on non-negative values
        refs[Ops.IDIV], refs[Ops.MOD] = a // b, a % b
    else:  # C's truncating division and remainder
        refs[Ops.IDIV] = torch.div(ta, tb, rounding_mode="trunc").numpy()
        refs[Ops.MOD] = torch.fmod(ta, tb).numpy()
    for op, want in refs.items():
        got = [fold_int(op, dtypes.bool if op in (Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ) else dt, [x, y])
               for x, y in zip(a.tolist(), b.tolist())]
        np.testing.assert_array_equal(np.array(got, dtype=want.dtype), want, err_msg=op.name)
    neg = [fold_int(Ops.NEG, dt, [x]) for x in a.tolist()]
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(np.array(neg, dtype=np_dt), (np_dt(0) - a).astype(np_dt))
    shifted = [fold_int(Ops.SHL, dt, [x, 3]) for x in a.tolist()]
    np.testing.assert_array_equal(np.array(shifted, dtype=np_dt), (a.astype(np.int64) << 3).astype(np_dt))


def test_a_zero_divisor_and_an_overlong_shift_fold_as_emitters_compute_them():
    """Division by 0 divides by 1 (emitters guard the divisor the same way); INT_MIN // -1 wraps; a shift
    by 64 or more is not folded (the emitter's instruction decides)."""
    assert fold_int(Ops.IDIV, dtypes.int32, [7, 0]) == 7 and fold_int(Ops.MOD, dtypes.int32, [7, 0]) == 0
    assert fold_int(Ops.IDIV, dtypes.int32, [-2**31, -1]) == -2**31
    assert fold_int(Ops.SHL, dtypes.int64, [1, 64]) is None
    assert fold_int(Ops.EXP2, dtypes.int32, [1]) is None


def simplified(spec, passes=ALL):
    prog = linearize(spec, vector_width=spec.vector_width)
    return prog, simplify_linear(prog, passes)


def run_program(spec, prog, inputs):
    """Render prog as C (the base dialect), compile, run on inputs; the written buffers by slot."""
    return run_c(spec, None, inputs, src=CStyleRenderer().render_program(prog))


def _int_index_math():
    x = Tensor.empty(48, 40, dtype=dtypes.int32)
    return (x * 1000003 + 7) // 5 % 1024


KERNELS = {
    "matmul": lambda: Tensor.empty(64, 48) @ Tensor.empty(48, 40),
    "row_sum": lambda: Tensor.empty(16, 4096).sum(1),
    "col_max": lambda: Tensor.empty(96, 33).max(0),
    "elementwise": lambda: (Tensor.empty(50, 40) * 2 + 1).relu() * Tensor.empty(50, 40),
    "padded": lambda: Tensor.empty(30, 30).pad(((2, 3), (1, 4))) * 3 - 1,
    "int_math": _int_index_math,
    "where_compare": lambda: (Tensor.empty(37, 29) < 0.5).where(Tensor.empty(37, 29), 2.0) + (Tensor.empty(37, 29)
                                                                                     > 1).cast(dtypes.float32),
}


@pytest.mark.parametrize("caps", [LANES8, NO_LANES_ONE_THREAD], ids=["lanes8", "scalar"])
@pytest.mark.parametrize("name", sorted(KERNELS))
def test_simplified_program_computes_the_same_bits(name, caps):
    (ast,) = kernels(KERNELS[name]())
    spec = lower(ast, caps)
    prog, simple = simplified(spec)
    check_structure(simple)
    assert not [x for x in simple.insts if x.op is L.LOOP and x.arg[1] in (AxisKind.UPCAST, "upcast")]
    assert all(x.arg[1] == 1 for x in simple.insts if x.op is L.ACC), "accumulator arrays are split"
    folded = [x for x in simple.insts if x.op is L.ALU and x.lanes == 1 and x.src and all(map(is_const, x.src))
              and (x.dtype.is_int or x.dtype is dtypes.bool)]
    assert not folded, folded
    assert [p.arg for p in simple.params] == [p.arg for p in prog.params]
    assert len(simple.vars) == len(prog.vars) and simple.threads == prog.threads
    inputs = inputs_for(spec.globals, np.random.default_rng(1), specials="sparse")
    want = run_program(spec, prog, inputs)
    got = run_program(spec, simple, inputs)
    for slot in want:
        assert_bits_equal(got[slot], want[slot], f"{name} slot {slot}: simplified vs linearized C")
    if not any(n.op is Ops.REDUCE for n in ast.toposort()):
        ref = run_interp(ast, spec.globals, inputs)
        for slot in want:
            assert_bits_equal(got[slot], ref[slot], f"{name} slot {slot}: simplified C vs INTERP")


def test_matmul_tile_is_unrolled_shared_and_hoisted():
    """A register-tiled matmul: the reduce loop runs several points a turn, B's vectors are loaded once
    per point for every row, and no arithmetic that does not depend on the reduce loop stays in it."""
    (ast,) = kernels(Tensor.empty(64, 64) @ Tensor.empty(64, 64))
    spec = lower(ast, LANES8)
    prog, simple = simplified(spec)
    loops = [x for x in simple.insts if x.op is L.LOOP]
    reduce_loop = next(x for x in loops if x.arg[1] in (AxisKind.REDUCE, "reduce"))
    assert len(reduce_loop.src) == 3 and reduce_loop.src[2].arg in (2, 4), "a partially unrolled reduce loop"
    inner = simple.insts[simple.insts.index(reduce_loop):]
    inner = inner[:next(i for i, x in enumerate(inner) if x.op is L.ENDLOOP and x.src[0] is reduce_loop)]
    loads = [x for x in inner if x.op is L.LOAD]
    keys = [(id(x.src[0]), id(x.src[1]), x.arg, x.lanes) for x in loads]
    assert len(keys) == len(set(keys)), "no load is repeated inside one turn"
    defined_inside = {id(x) for x in inner}
    for x in inner:
        if x.op in (L.ALU, L.BCAST):
            assert any(id(s) in defined_inside for s in x.src), f"{x} is loop-invariant but not hoisted"
    # the index arithmetic per point: less than the linearized loop body's (its invariant part moved out)
    body = prog.insts[next(i for i, x in enumerate(prog.insts) if x.op is L.LOOP
                           and x.arg[1] in (AxisKind.REDUCE, "reduce")):]
    body = body[:next(i for i, x in enumerate(body) if x.op is L.ENDLOOP)]

    def int_alus(xs):
        return sum(x.op is L.ALU and x.dtype.is_int for x in xs)
    assert int_alus(inner) < reduce_loop.src[2].arg * int_alus(body)
    assert not [x for x in inner if x.op is L.ALU and x.arg is Ops.MUL and x.src[0].op is L.LOOP
                and x.src[0] is not reduce_loop], "an outer loop's row offset is computed outside the reduce loop"


def test_offsets_leave_constant_additions_for_the_address():
    """With offsets (machine code), an index `i + c` is index i with offset c; a constant index is None."""
    (ast,) = kernels(Tensor.empty(8, 4).pad(((0, 0), (1, 1))))
    spec = lower(ast, NO_LANES_ONE_THREAD)
    _, simple = simplified(spec, LinearPasses(unroll=True, offsets=True))
    mem = [x for x in simple.insts if x.op in (L.LOAD, L.STORE)]
    assert mem and all(isinstance(x.arg, tuple) and len(x.arg) == 2 for x in mem)
    for x in mem:
        index = x.src[1]
        assert index is None or not (index.op is L.ALU and index.arg is Ops.ADD and is_const(index.src[1]))
    assert any(x.arg[1] != 0 for x in mem), "the unrolled columns' constant parts are offsets"


def test_passes_off_leave_the_c_source_as_it_was():
    """The C family leaves the passes to its compiler (`passes` None): its source is the linearized
    program's, and a dialect that asks for them renders the simplified program."""
    (ast,) = kernels(Tensor.empty(32, 32) @ Tensor.empty(32, 32))
    spec = lower(ast, LANES8)
    plain = CStyleRenderer().render(spec)
    assert CStyleRenderer.passes is None
    assert plain == CStyleRenderer().render_program(linearize(spec, vector_width=spec.vector_width))

    class Simplifying(CStyleRenderer):
        passes = ALL
    src = Simplifying().render(spec)
    assert src == CStyleRenderer().render_program(simplified(spec)[1]) and src != plain
    assert "+= 4)" in src or "+= 2)" in src  # the reduce loop's step


# ---- the C family's tables

def test_a_dialect_replaces_one_op_row():
    """Rows are data: a dialect with its own ADD row renders every scalar add with it and nothing else
    differently; a vector row likewise."""
    (ast,) = kernels(Tensor.empty(40, 40, dtype=dtypes.int32) * 3 + Tensor.empty(40, 40, dtype=dtypes.int32))
    spec = lower(ast, NO_LANES_ONE_THREAD)

    class Dialect(CStyleRenderer):
        scalar_rules = {**SCALAR_RULES, Ops.ADD: "pg_add({0}, {1})"}
    base, mine = CStyleRenderer().render(spec), Dialect().render(spec)
    assert "pg_add(" in mine and "pg_add(" not in base
    assert mine == re.sub(r"\((\w+)\+(\w+)\)", r"pg_add(\1, \2)", base)
    spec8 = lower(ast, LANES8)

    class VectorDialect(CStyleRenderer):
        vector_rules = {**VECTOR_RULES, Ops.MUL: "pg_vmul({0}, {1})"}
    vsrc = VectorDialect().render(spec8)
    assert "pg_vmul(" in vsrc and "pg_vmul(" not in CStyleRenderer().render(spec8)


def test_an_op_without_a_row_names_the_op():
    class NoSqrt(CStyleRenderer):
        scalar_rules = {k: v for k, v in SCALAR_RULES.items() if k is not Ops.SQRT}
    (ast,) = kernels(Tensor.empty(16).sqrt())
    with pytest.raises(NotImplementedError, match="SQRT"):
        NoSqrt().render(lower(ast, NO_LANES_ONE_THREAD))


def test_one_renderer_renders_in_several_threads_at_once():
    """A device's render is one renderer shared by every thread: two renders that are both half done
    (each waits inside the vector-type hook until the other got there) give the sources of two renders
    one after the other, each with its own names, lines, vector types and helpers."""
    import threading
    (floats,) = kernels(Tensor.empty(64, 64) @ Tensor.empty(64, 64))
    (ints,) = kernels(Tensor.empty(40, 64, dtype=dtypes.int32) * 3 + 1)
    specs = [lower(floats, LANES8), lower(ints, LANES8)]
    want = [CStyleRenderer().render(s) for s in specs]
    both_inside = threading.Barrier(2, timeout=20)
    waited = threading.local()

    class Meeting(CStyleRenderer):
        def vector_typedef(self, elem, n, name):
            if not getattr(waited, "done", False):
                waited.done = True
                both_inside.wait()
            return super().vector_typedef(elem, n, name)
    shared, got = Meeting(), [None, None]

    def render(k):
        got[k] = shared.render(specs[k])
    threads = [threading.Thread(target=render, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == want


def test_cuda_extends_the_c_signature():
    """CUDA's signature is the C family's parameters (buffers, then Variables `v<k>`) after its own
    declaration; it does not copy the parameter list."""
    from polygrad_backend_cuda.renderer import CUDARenderer
    x = Tensor.empty(64).shrink(((0, Variable("n", 1, 64).bind(9)),)) * 2
    (ast,) = kernels(x)
    spec = lower(ast, Capabilities(threads=1, vector_width=1, has_local_memory=True))
    assert "signature" not in CUDARenderer.__dict__ and "parameters" not in CUDARenderer.__dict__
    src = CUDARenderer("sm_90").render(spec)
    line = next(ln for ln in src.splitlines() if "pg_kernel(" in ln)
    assert line.startswith('extern "C" __global__ void __launch_bounds__(')
    params = line[line.index("(", line.index("pg_kernel")) + 1:line.rindex(")")]
    assert params.split(", ") == [CUDARenderer("sm_90").buffer_param(g.slot, g.dtype, g.written)
                                  for g in spec.globals] + ["const int v0"]
    assert "float* __restrict__ data0" in params and "const float* __restrict__ data1" in params


def test_x86_code_cache_key_covers_the_core_passes(tmp_path, monkeypatch):
    """X86's machine code depends on core's linear passes: a changed linear_passes.py changes the
    emitter version in every code-cache key, so no stale code is read from POLY_CACHE_DIR/x86."""
    import inspect

    from polygrad.renderer import linear_passes
    from polygrad_backend_x86 import compiler
    edited = tmp_path / "linear_passes.py"
    edited.write_text(inspect.getsource(linear_passes) + "\n# a change\n")
    real, getfile = compiler._emitter_version(), inspect.getfile
    monkeypatch.setattr(compiler.inspect, "getfile",
                        lambda obj: str(edited) if obj is compiler.simplify_linear else getfile(obj))
    assert compiler._emitter_version() != real
