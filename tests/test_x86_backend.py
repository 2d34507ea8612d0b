"""The X86 backend (issue 14): machine code without a compiler, every ISA tier bit-identical to INTERP's
reference semantics, integer edge cases that must not trap, spills, W^X mapping, the code cache, the
disassembly dump, the probe, typed errors, transcendental accuracy over the float32 range, and a
bundle saved on CPU run on X86. The op, nn and JIT suites run on X86 through conftest's DEVICES."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from polygrad import Device, Tensor, dtypes

from conftest import run_python

pytestmark = pytest.mark.skipif(not Device.available("X86"), reason="X86 backend not usable on this machine")


def tiers() -> list[str]:
    from polygrad_backend_x86.cpu import TIERS, choose_isa
    best = choose_isa().tier if not os.environ.get("POLY_X86_ISA") else "avx512"
    return [t for t in TIERS if TIERS.index(t) <= TIERS.index(best)]


# one script computes a matrix of elementwise results (every op and dtype, special values) on a device
MATRIX = r'''
import sys, numpy as np
from polygrad import Tensor, dtypes
dev, out = sys.argv[1], sys.argv[2]
rng = np.random.default_rng(0)
F = np.array([0.0, -0.0, 1.0, -1.5, 2.5, 3.7, -3.7, 1e-40, -1e-40, 3.4e38, -3.4e38, np.inf, -np.inf, np.nan, 0.5,
              1e20, -7.0, 8388609.0, 123.456, 1e-7] * 4, np.float32)
I = np.array([0, 1, -1, 7, -7, 2, -2, 2**31 - 1, -2**31, 100, -100, 3, 5, 13, -13, 255, 256, 65535, 1 << 20, 42] * 4,
             np.int64)
res = {}
def put(name, t):
    res[name] = t.numpy()
for dt in ("float32", "float64", "float16", "bfloat16"):
    a = Tensor(F, device=dev).cast(dt)
    b = Tensor(F[::-1].copy(), device=dev).cast(dt)
    for op in ("add", "sub", "mul", "div", "maximum", "minimum", "lt", "eq", "ne"):
        put(f"{dt}.{op}", getattr(a, op if op not in ("lt", "eq", "ne") else "__" + op + "__")(b))
    for op in ("neg", "sqrt", "trunc", "reciprocal", "exp2", "log2", "sin", "abs", "relu"):
        put(f"{dt}.{op}", getattr(a, op)())
    put(f"{dt}.where", (a < b).where(a, b))
    for to in ("bool", "int8", "uint8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64"):
        src = a if to in ("float16", "bfloat16", "float32", "float64", "bool") else \
            Tensor(np.clip(np.nan_to_num(F), -100, 100), device=dev).cast(dt)
        put(f"{dt}.cast.{to}", src.cast(to))
for dt in ("int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "bool"):
    a = Tensor(I, device=dev).cast(dt)
    b = Tensor(I[::-1].copy(), device=dev).cast(dt)
    ops = ["add", "mul", "maximum", "lt", "eq", "ne", "bitwise_and", "bitwise_or", "bitwise_xor"]
    if dt != "bool":
        ops += ["sub", "idiv", "mod"]
    for op in ops:
        if op in ("lt", "eq", "ne"):
            put(f"{dt}.{op}", getattr(a, "__" + op + "__")(b))
        elif op == "idiv":
            put(f"{dt}.{op}", a // b)
        elif op == "mod":
            put(f"{dt}.{op}", a % b)
        else:
            put(f"{dt}.{op}", getattr(a, op)(b))
    put(f"{dt}.where", (a < b).where(a, b))
    if dt != "bool":
        sh = Tensor((np.abs(I) % 7), device=dev).cast(dt)
        put(f"{dt}.shl", a << sh)
        put(f"{dt}.shr", a >> sh)
        put(f"{dt}.neg", -a)
    for to in ("float32", "float64", "float16", "bfloat16", "int32", "uint8", "bool"):
        put(f"{dt}.cast.{to}", a.cast(to))
    put(f"{dt}.bitcast", a.bitcast({1: "uint8", 2: "int16", 4: "float32", 8: "float64"}[a.dtype.itemsize])
        if dt != "bool" else a)
big = Tensor(rng.standard_normal(4096).astype(np.float32), device=dev)
put("reduce.sum", big.reshape(64, 64).sum(1))
put("reduce.max", big.reshape(64, 64).max(0))
put("matmul", big.reshape(64, 64) @ big.reshape(64, 64))
np.savez(out, **res)
'''


def run_matrix(tmp_path, dev: str, env: dict | None = None) -> dict:
    out = str(tmp_path / f"{dev}-{(env or {}).get('POLY_X86_ISA', 'best')}.npz")
    p = run_python(f"import sys; sys.argv = ['m', {dev!r}, {out!r}]\n" + MATRIX,
                   env={"POLY_CACHE_DIR": str(tmp_path / "cache"), **(env or {})}, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    with np.load(out) as f:
        return {k: f[k] for k in f.files}


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    if a.dtype.kind == "f":
        return a.shape == b.shape and bool(np.all((a.view(f"u{a.itemsize}") == b.view(f"u{b.itemsize}"))
                                                  | (np.isnan(a) & np.isnan(b))))
    return a.shape == b.shape and bool(np.array_equal(a, b))


def test_every_tier_matches_interp_bit_for_bit(tmp_path):
    """Scalar SSE2, AVX2 and AVX-512 code agree with INTERP (the reference semantics) on every elementwise
    op and cast of every dtype, special values included; reductions agree to rounding (summation order)."""
    ref = run_matrix(tmp_path, "INTERP")
    for tier in tiers():
        got = run_matrix(tmp_path, "X86", {"POLY_X86_ISA": tier})
        bad = []
        for name, want in ref.items():
            if name.startswith(("reduce", "matmul")):
                if not np.allclose(got[name], want, rtol=1e-5, atol=1e-4):
                    bad.append(name)
            elif not same_bits(got[name], want):
                bad.append(name)
        assert not bad, f"{tier}: {bad}"


def test_integer_division_edges_do_not_trap():
    """Integer division of every sign combination, a zero divisor taken as 1, and INT_MIN // -1 wrapping
    (as NumPy does) instead of trapping; Tensor // and % floor like NumPy on top of the IR's truncation."""
    for dt, lo in (("int32", -2**31), ("int64", -2**63)):
        a = np.array([7, -7, 7, -7, lo, lo, 5, 0, lo + 1, -1], dt)
        b = np.array([2, 2, -2, -2, -1, 1, 0, 0, -1, 3], dt)
        one = np.where(b == 0, 1, b).astype(dt)
        with np.errstate(all="ignore"):
            want_q, want_r = np.floor_divide(a, one), np.mod(a, one)
        q = (Tensor(a, device="X86") // Tensor(b, device="X86")).numpy()
        r = (Tensor(a, device="X86") % Tensor(b, device="X86")).numpy()
        assert q.tolist() == want_q.tolist() and r.tolist() == want_r.tolist(), (dt, q, r)


def test_many_live_values_spill_correctly():
    """More live values than registers: the allocator spills to the stack and the sums are still right."""
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal(37).astype(np.float32) for _ in range(40)]
    ts = [Tensor(x, device="X86") for x in xs]
    prods = [ts[i] * ts[(i + 1) % 40] for i in range(40)]  # 40 values, all live until the sums below
    total = prods[0]
    for i in range(1, 40):
        total = total + prods[i] * prods[39 - i]
    ref = xs[0] * xs[1]
    refs = [xs[i] * xs[(i + 1) % 40] for i in range(40)]
    ref = refs[0]
    for i in range(1, 40):
        ref = ref + refs[i] * refs[39 - i]
    np.testing.assert_allclose(total.numpy(), ref, rtol=1e-5, atol=1e-5)
    ints = [Tensor(np.arange(i, i + 19, dtype=np.int32), device="X86") for i in range(30)]
    acc = ints[0]
    for i in range(1, 30):
        acc = acc * 3 + ints[i] * ints[29 - i]
    want = np.arange(0, 19, dtype=np.int64)
    for i in range(1, 30):
        want = (want * 3 + np.arange(i, i + 19) * np.arange(29 - i, 48 - i)).astype(np.int32).astype(np.int64)
    assert acc.numpy().tolist() == want.tolist()


def test_runs_with_no_compiler_on_path(tmp_path):
    """DEV=X86 works with PATH holding only the Python interpreter (no clang, gcc or cc); CPU reports why not."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    os.symlink(sys.executable, bin_dir / "python")
    p = run_python('''
        import shutil
        from polygrad import Device, Tensor
        assert not any(shutil.which(c) for c in ("clang", "gcc", "cc"))
        assert not Device.available("CPU")
        y = ((Tensor([1.0, 2.0, 3.0]) * 2 + 1) @ Tensor([[1.0], [1.0], [1.0]])).realize()
        print(y.numpy().tolist(), y.device)
    ''', env={"PATH": str(bin_dir), "DEV": "X86", "POLY_CACHE_DIR": str(tmp_path / "cache")})
    assert p.returncode == 0, p.stderr
    assert "[15.0] X86" in p.stdout


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs /proc (Linux)")
def test_code_is_mapped_read_execute_never_writable():
    from polygrad_backend_x86.mapping import CodeMapping
    m = CodeMapping(b"\xc3" * 100)
    # the range holding the code (the kernel merges adjacent anonymous mappings of the same protection,
    # such as other kernels' or the thread pool's, into one line)
    with open("/proc/self/maps") as f:
        line = next(ln for ln in f if int(ln.split("-")[0], 16) <= m.addr < int(ln.split()[0].split("-")[1], 16))
    assert line.split()[1].startswith("r-x"), line


def test_code_cache_on_disk_is_reused_and_survives_damage(tmp_path):
    code = '''
        import numpy as np
        from polygrad import Tensor
        from polygrad_backend_x86 import compiler
        x = Tensor(np.arange(64, dtype=np.float32), device="X86")
        print(((x * 3 + 1).relu().sum()).item(), compiler.stats["emitted"], compiler.stats["disk_hits"])
    '''
    env = {"POLY_CACHE_DIR": str(tmp_path)}
    first = run_python(code, env=env)
    assert first.returncode == 0, first.stderr
    value, emitted, hits = first.stdout.split()
    assert int(emitted) > 0 and int(hits) == 0
    files = list((tmp_path / "x86").glob("*.bin"))
    assert files
    second = run_python(code, env=env).stdout.split()
    assert second == [value, "0", emitted]  # every kernel read back, none emitted
    for f in files:
        f.write_bytes(b"garbage")
    third = run_python(code, env=env).stdout.split()
    assert third == [value, emitted, "0"]  # damaged entries are emitted again, results unchanged


def test_dump_kernels_prints_the_disassembly():
    p = run_python('''
        from polygrad import Tensor
        print((Tensor([1.0, 2.0, 3.0, 4.0] * 8) * 3 - 1).relu().numpy()[:2])
    ''', env={"DEV": "X86", "POLY_DUMP_KERNELS": "1"})
    assert p.returncode == 0, p.stderr
    assert "x86-64" in p.stdout and "ret" in p.stdout
    from polygrad_backend_x86.cpu import choose_isa
    if choose_isa().tier != "sse2":  # float32 elementwise code is vector code
        assert "vmulps" in p.stdout or "vaddps" in p.stdout


def test_elementwise_float_kernels_are_vector_code():
    from polygrad.engine import programs
    from polygrad_backend_x86.cpu import choose_isa
    x = Tensor(np.arange(4096, dtype=np.float32), device="X86")
    (x * 5 + 2).sqrt().realize()
    srcs = [p.source for (ast, dev), p in programs.program_cache.items() if dev == "X86"]
    assert srcs
    if choose_isa().tier != "sse2":
        assert not srcs[-1].scalar and any(w in str(srcs[-1]) for w in ("ymm", "zmm"))


def test_probe_explains_an_unsupported_machine(monkeypatch):
    import platform

    import polygrad_backend_x86
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    result = polygrad_backend_x86.probe()
    assert not result.ok and "x86-64" in result.reason and "DEV=" in result.reason
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    assert polygrad_backend_x86.probe().ok


def test_an_instruction_without_code_is_a_typed_error():
    """An op the emitter has no code for (EXP2 reaches it only if lowering stopped decomposing it)
    raises CompileError naming it, never wrong code."""
    from polygrad.backend_api import CompileError, Inst, L, LinearProgram, Ops
    from polygrad_backend_x86.compiler import emit_program
    from polygrad_backend_x86.cpu import choose_isa
    p = Inst(L.PARAM, dtypes.float32, (), (0, True))
    i = Inst(L.CONST, dtypes.int32, (), 0)
    v = Inst(L.LOAD, dtypes.float32, (p, i))
    e = Inst(L.ALU, dtypes.float32, (v,), Ops.EXP2)
    s = Inst(L.STORE, None, (p, i, e))
    with pytest.raises(CompileError, match="EXP2"):
        emit_program(LinearProgram("k", (p, i, v, e, s), (p,), (), 1), choose_isa())
    odd = Inst(L.LOAD, dtypes.float32, (p, i), "strided", 8)  # a memory access kind it does not know
    s2 = Inst(L.STORE, None, (p, i, Inst(L.ALU, dtypes.float32, (odd,), Ops.ADD)))
    with pytest.raises(CompileError, match="strided"):
        emit_program(LinearProgram("k", (p, i, odd, s2), (p,), (), 1), choose_isa())


def ulps(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """float32 ulp distance (0 where both are NaN or equal infinities)."""
    def key(x):
        b = x.view(np.int32).astype(np.int64)
        return np.where(b < 0, -(b & 0x7FFFFFFF), b)
    d = np.abs(key(got) - key(want))
    return np.where(np.isnan(got) & np.isnan(want), 0, d)


def test_transcendentals_over_the_float32_range():
    """exp2, log2, sin and sqrt on X86 against NumPy (float64, rounded) over 2**18 float32 values spread over
    every exponent, specials included: exp2 within 2 ulp, log2 within 3, sin within 1, sqrt exact."""
    bits = np.linspace(0, 0x7F800000, 1 << 17, dtype=np.int64).astype(np.uint32)
    pos = bits.view(np.float32)
    x = np.concatenate([pos, -pos, np.array([np.inf, -np.inf, np.nan, 0.0, -0.0], np.float32)])
    t = Tensor(x, device="X86")
    with np.errstate(all="ignore"):
        x64 = x.astype(np.float64)
        cases = {"exp2": (t.exp2(), np.exp2(x64), 2), "log2": (t.log2(), np.log2(x64), 3),
                 "sqrt": (t.sqrt(), np.sqrt(x64), 0)}
        small = np.abs(x) < 1e6  # sin's reference in float64 is exact enough only for moderate arguments
        cases["sin"] = (t.sin(), np.where(small, np.sin(x64), np.nan), 1)
        for name, (got_t, want64, bound) in cases.items():
            got, want = got_t.numpy(), want64.astype(np.float32)
            if name == "sin":
                got, want = got[small], want[small]
            err = ulps(got, want)
            assert err.max() <= bound, f"{name}: {err.max()} ulp at {x[np.argmax(err)] if name != 'sin' else ''}"


def test_bundle_saved_on_cpu_runs_on_x86():
    if not Device.available("CPU"):
        pytest.skip("needs the CPU backend to save the bundle")
    from polygrad import Model, nn

    class MLP:
        def __init__(self):
            self.l1, self.l2 = nn.Linear(4, 16), nn.Linear(16, 3)

        def __call__(self, x):
            return {"logits": self.l2(self.l1(x).relu())}

    x = np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32)
    model = Model(MLP(), inputs={"x": Tensor.empty(8, 4, device="CPU")})
    try:
        want = model.forward(x=x)["logits"].numpy().copy()
        blob = model.save()
    finally:
        model.dispose()
    again = Model.load(blob, device="X86")
    try:
        got = again.forward(x=x)["logits"]
        assert got.device == "X86"
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-6, atol=1e-6)
    finally:
        again.dispose()



def test_mismatched_store_dtype_converts_as_cpu_does():
    """A custom kernel storing float32 values into an int32 buffer: converted (truncated) exactly as CPU and
    INTERP do, never stored as raw float bits."""
    from polygrad.uop.ops import KernelInfo, UOp

    def mixed(out, a):
        i = UOp.range(out.ctx, out.numel(), 0)
        return out[i].store(a[i] * 2.5).end(i).sink(arg=KernelInfo(name="mixed_store"))

    got = Tensor.empty(4, dtype="int32", device="X86").custom_kernel(
        Tensor([1.0, 2.0, 3.0, -3.0], device="X86"), fxn=mixed)[0].numpy()
    ref = Tensor.empty(4, dtype="int32", device="INTERP").custom_kernel(
        Tensor([1.0, 2.0, 3.0, -3.0], device="INTERP"), fxn=mixed)[0].numpy()
    assert got.tolist() == ref.tolist() == [2, 5, 7, -7]


def test_thread_axis_runs_across_launches():
    """A big kernel is split over POLY_THREADS launches (the THREAD axis), each its own share, results exact."""
    p = run_python('''
        import numpy as np
        from polygrad import Tensor
        from polygrad.engine import programs, realize
        x = Tensor(np.arange(1 << 20, dtype=np.float32), device="X86")
        y = (x * 2 + 1).numpy()
        assert np.array_equal(y, np.arange(1 << 20, dtype=np.float32) * 2 + 1)
        print(max(p.spec.threads for (ast, dev), p in programs.program_cache.items() if dev == "X86"))
    ''', env={"POLY_THREADS": "4"})
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["4"]


@pytest.mark.parametrize("shape", [(24, 200, 40, "nn"), (32, 208, 64, "nt")])
@pytest.mark.parametrize("lanes", [1, 0])  # 0: the tier's own vector lanes
def test_contracted_matmul_gives_the_same_bits(monkeypatch, shape, lanes):
    """On a CPU with FMA3 the X86 device declares fma, so matmuls' multiply-adds are contracted: each
    step is one vfmadd (scalar, or lane-wise into a vector accumulator, as in a tile of dot products),
    rounded once. Scalar code gives INTERP's bits; vector code gives the CPU backend's bits for the same
    lowered kernel (INTERP folds a split reduction's lanes in another order: equal to rounding)."""
    from polygrad.backend_api import Capabilities
    from polygrad.codegen.lower import lower
    from polygrad.device import Buffer, open_device
    from polygrad.schedule.template import schedule
    from polygrad.uop.ops import Ops
    from polygrad_backend_interp.evaluator import InterpProgram
    from polygrad_backend_x86.compiler import X86Source, compile_source
    from polygrad_backend_x86.cpu import choose_isa
    from polygrad_backend_x86.runtime import X86Program
    m, k, n, layout = shape
    for tier in [t for t in tiers() if t != "sse2"]:
        monkeypatch.setenv("POLY_X86_ISA", tier)
        isa = choose_isa()
        assert isa.fma
        a, b = Tensor.empty(m, k), (Tensor.empty(k, n) if layout == "nn" else Tensor.empty(n, k).T)
        tpl, _ = schedule([(a @ b).uop])
        (ast,) = [s.ast for s in tpl.steps if s.kind == "kernel"]
        spec = lower(ast, Capabilities(threads=1, vector_width=lanes or isa.lanes, registers=16, fma=True))
        assert any(u.op is Ops.REDUCE and u.arg is Ops.FMA for u in spec.ast.toposort())
        kern = compile_source(X86Source(spec, isa))
        progs = {"X86": X86Program(spec, kern.code, kern.externs)}
        if lanes == 1:
            progs["INTERP"] = InterpProgram(spec)
        elif Device.available("CPU"):
            cpu = open_device("CPU")
            progs["CPU"] = cpu.load(spec, cpu.compile(cpu.render(spec)))
        rng = np.random.default_rng(0)
        inputs = {g.slot: rng.standard_normal(g.size).astype(np.float32) for g in spec.globals if not g.written}
        outs = {}
        for dev, prog in progs.items():
            bufs = [Buffer(dev, g.size, g.dtype) for g in spec.globals]
            for buf, g in zip(bufs, spec.globals):
                buf.copyin(inputs[g.slot] if not g.written else np.zeros(g.size, np.float32))
            prog([buf.handle for buf in bufs], ())
            outs[dev] = [buf.numpy() for buf, g in zip(bufs, spec.globals) if g.written][0]
        x, w = (inputs[g.slot] for g in spec.globals if not g.written)
        w = w.reshape(k, n) if layout == "nn" else w.reshape(n, k).T
        np.testing.assert_allclose(outs["X86"].reshape(m, n), x.reshape(m, k) @ w, rtol=1e-4, atol=1e-4)
        for dev, out in outs.items():
            assert same_bits(outs["X86"], out), (tier, dev)


def test_device_declares_fma_where_the_cpu_has_it():
    from polygrad.device import open_device
    from polygrad_backend_x86.cpu import choose_isa
    assert open_device("X86").capabilities.fma == choose_isa().fma


def test_avx512_tiles_use_the_upper_sixteen_registers():
    """On AVX-512 the device declares 32 vector registers: a matmul gets an 8-row register tile whose
    512-bit accumulators live in zmm16..31 (EVEX-only), and still equals NumPy."""
    import re

    from polygrad.codegen.lower import lower
    from polygrad.codegen.opts import OptKind
    from polygrad.device import open_device
    from polygrad.schedule.template import schedule
    from polygrad_backend_x86.cpu import choose_isa
    if choose_isa().tier != "avx512":
        pytest.skip("needs AVX-512")
    dev = open_device("X86")
    assert dev.capabilities.registers == 32
    a, b = Tensor.empty(64, 96), Tensor.empty(96, 64)
    tpl, _ = schedule([(a @ b).uop])
    (ast,) = [s.ast for s in tpl.steps if s.kind == "kernel"]
    spec = lower(ast, dev.capabilities)
    assert 8 in [o.amount for o in spec.opts if o.kind is OptKind.UPCAST]
    assert re.search(r"zmm(1[6-9]|2\d|3[01])\b", str(dev.render(spec)))
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((64, 96), dtype=np.float32), rng.standard_normal((96, 64), dtype=np.float32)
    out = (Tensor(x, device="X86") @ Tensor(w, device="X86")).numpy()
    np.testing.assert_allclose(out, x @ w, rtol=1e-4, atol=1e-4)


def test_avx512_padded_rows_load_with_one_masked_move():
    """A contiguous vector load gated per lane (a padded row's edge) is one AVX-512 masked move, not a
    lane-at-a-time copy through the stack; the masked-off lanes (past the row, past the buffer) read
    nothing and give 0."""
    from polygrad.codegen.lower import lower
    from polygrad.device import open_device
    from polygrad.schedule.template import schedule
    from polygrad_backend_x86.cpu import choose_isa
    if choose_isa().tier != "avx512":
        pytest.skip("needs AVX-512")
    x = np.arange(64 * 30, dtype=np.float32).reshape(64, 30)
    t = Tensor(x, device="X86").pad(((0, 0), (1, 1))) * 2
    tpl, _ = schedule([t.uop])
    (ast,) = [s.ast for s in tpl.steps if s.kind == "kernel"]
    dev = open_device("X86")
    text = str(dev.render(lower(ast, dev.capabilities)))
    import re
    assert re.search(r"vmovups [xyz]mm\d+\{k1\},\[", text), text
    np.testing.assert_array_equal(t.numpy(), np.pad(x, ((0, 0), (1, 1))) * 2)


def test_thread_pool_is_our_machine_code_and_survives_fork_and_exit():
    """THREAD launches go through pool.py's machine-code workers (one foreign call per launch): more
    workers than cores (they and the launcher sleep on futexes), hundreds of launches of an
    in-place update that a share run twice or skipped would show, a forked child with a pool of its
    own, and a process that exits promptly with its workers still parked."""
    p = run_python('''
        import os
        import numpy as np
        from polygrad import Tensor, TinyJit
        from polygrad_backend_x86 import pool
        n = 203530
        w = Tensor(np.zeros(n, dtype=np.float32), device="X86").realize()
        for _ in range(300):
            w.assign(w + 1).realize()
        assert np.array_equal(w.numpy(), np.full(n, 300, dtype=np.float32))
        first = pool.shared_pool()
        assert first is not None and first.workers == 4, first
        step = TinyJit(lambda x: (x * 2 + 1).realize())  # replays launch through bound launchers
        x = Tensor(np.arange(n, dtype=np.float32), device="X86").realize()
        want = np.arange(n, dtype=np.float32) * 2 + 1
        for _ in range(4):
            assert np.array_equal(step(x).numpy(), want)
        pid = os.fork()
        if pid == 0:
            w.assign(w * 2).realize()
            ok = np.array_equal(w.numpy(), np.full(n, 600, dtype=np.float32))
            ok = ok and np.array_equal(step(x).numpy(), want)
            os._exit(0 if ok and pool.shared_pool() is not first else 3)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, status
        print("ok")
    ''', env={"POLY_THREADS": "5"}, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["ok"]


def test_thread_pool_runs_the_indices_itself_when_no_worker_starts(monkeypatch):
    """Where no thread can be started, the launcher runs every index itself, in order."""
    import threading
    from polygrad.codegen.lower import lower
    from polygrad.device import open_device
    from polygrad_backend_x86 import pool
    from polygrad_backend_x86.mapping import FFI
    from test_padded_lanes import padded_kernel, inputs, GUARD, SENTINEL
    dev = open_device("X86")
    spec = lower(padded_kernel(203530), dev.capabilities)
    prog = dev.load(spec, dev.compile(dev.render(spec)))
    a, b, want = inputs(203530)
    out = np.full(203530 + GUARD, SENTINEL, dtype=np.float32)
    arrays = [FFI.new("int64_t[]", [out.ctypes.data, a.ctypes.data, b.ctypes.data, t] + prog.externs)
              for t in range(spec.threads)]

    def refuse(self):
        raise RuntimeError("can't start new thread")
    monkeypatch.setattr(threading.Thread, "start", refuse)
    p = pool.Pool()
    p.launch(prog.fn, prog.mapping.addr, arrays)
    assert p.workers == 0
    np.testing.assert_array_equal(out[:203530], want)
    assert (out[203530:] == SENTINEL).all()


def test_wide_spills_get_a_frame_aligned_to_64_bytes():
    """A kernel whose register allocator spills 512-bit values (a 3x3 conv weight gradient's tile of 24 zmm
    accumulators over 28-pixel rows) rounds rsp down to 64 (`and rsp, -64`, the caller's rsp kept in a slot), so
    no spill or reload straddles two cache lines whatever stack it is called on (at the caller's 16-byte
    alignment that kernel ran 28 or 137 ms by process on Zen 4); a kernel with no such spill keeps its plain frame.
    The weight gradient equals NumPy's: dw[o, i, kh, kw] = sum of g[n, o, h, w] * xpad[n, i, h + kh, w + kw]."""
    from polygrad.codegen.lower import lower
    from polygrad.device import open_device
    from polygrad.schedule.template import schedule
    from polygrad_backend_x86.cpu import choose_isa
    if choose_isa().tier != "avx512":
        pytest.skip("needs AVX-512")
    dev = open_device("X86")
    align_rsp = bytes.fromhex("4883e4c0")  # and rsp, -64
    rng = np.random.default_rng(3)
    xn = rng.standard_normal((2, 16, 28, 28)).astype(np.float32)
    gn = rng.standard_normal((2, 16, 28, 28)).astype(np.float32)
    x, g = Tensor(xn, device="X86"), Tensor(gn, device="X86")
    w = Tensor(np.zeros((16, 16, 3, 3), np.float32), device="X86", requires_grad=True)
    (x.conv2d(w, padding=1) * g).sum().backward()
    tpl, _ = schedule([w.grad.uop])
    kernels = [lower(s.ast, dev.capabilities) for s in tpl.steps if s.kind == "kernel"]
    (spec,) = [s for s in kernels if s.name.startswith("r_16_16_3_3")]
    assert align_rsp in dev.compile(dev.render(spec)).code
    xp = np.pad(xn, ((0, 0), (0, 0), (1, 1), (1, 1)))
    want = np.zeros((16, 16, 3, 3), np.float32)
    for kh in range(3):
        for kw in range(3):
            want[:, :, kh, kw] = np.einsum("nohw,nihw->oi", gn, xp[:, :, kh:kh + 28, kw:kw + 28])
    np.testing.assert_allclose(w.grad.numpy(), want, rtol=1e-4, atol=1e-3)
    (tiny,) = [s.ast for s in schedule([(Tensor.empty(10) + 1).uop])[0].steps if s.kind == "kernel"]
    assert align_rsp not in dev.compile(dev.render(lower(tiny, dev.capabilities))).code


def _conv_weight_gradient_kernel(dev, xn, gn):
    from polygrad.codegen.lower import lower
    from polygrad.schedule.template import schedule
    c = xn.shape[1]
    x, g = Tensor(xn, device="X86"), Tensor(gn, device="X86")
    w = Tensor(np.zeros((c, c, 3, 3), np.float32), device="X86", requires_grad=True)
    (x.conv2d(w, padding=1) * g).sum().backward()
    tpl, _ = schedule([w.grad.uop])
    kernels = [lower(s.ast, dev.capabilities) for s in tpl.steps if s.kind == "kernel"]
    (spec,) = [s for s in kernels if s.name.startswith(f"r_{c}_{c}_3_3")]
    return spec, w.grad.numpy()


def test_avx512_eight_lane_tiles_use_ymm16_to_31(monkeypatch):
    """On AVX-512 (with VL) 8-lane values take ymm16..31 once ymm0..11 are taken: a 3x3 conv weight gradient
    over 7-pixel rows (rows padded to one 8-lane vector, a tile of 8-lane accumulators) uses them and moves
    fewer vectors through the stack than with 512-bit values alone in the high registers, and equals NumPy's
    dw[o, i, kh, kw] = sum of g[n, o, h, w] * xpad[n, i, h + kh, w + kw]."""
    import re

    from polygrad.device import open_device
    from polygrad_backend_x86 import regalloc
    from polygrad_backend_x86.asm import disassemble
    from polygrad_backend_x86.cpu import choose_isa
    if choose_isa().tier != "avx512":
        pytest.skip("needs AVX-512")
    dev = open_device("X86")
    rng = np.random.default_rng(7)
    xn = rng.standard_normal((2, 32, 7, 7)).astype(np.float32)
    gn = rng.standard_normal((2, 32, 7, 7)).astype(np.float32)
    spec, got = _conv_weight_gradient_kernel(dev, xn, gn)

    def stack_moves(text: str) -> int:
        return sum(1 for line in text.splitlines() if re.search(r"vmov\w+ .*mm\d+.*\[rsp|\[rsp.*mm\d+", line))

    def emitted() -> str:  # emitted now, not from the code cache
        k = dev.render(spec).emit()
        return disassemble(k.code, k.pool)

    text = emitted()
    assert re.search(r"ymm(1[6-9]|2\d|3[01])\b", text)
    monkeypatch.setattr(regalloc, "wide", lambda v: not regalloc.is_gp(v) and v.lanes == 16)
    low_only = emitted()
    assert not re.search(r"ymm(1[6-9]|2\d|3[01])\b", low_only)
    assert stack_moves(text) < stack_moves(low_only)
    xp = np.pad(xn, ((0, 0), (0, 0), (1, 1), (1, 1)))
    want = np.zeros((32, 32, 3, 3), np.float32)
    for kh in range(3):
        for kw in range(3):
            want[:, :, kh, kw] = np.einsum("nohw,nihw->oi", gn, xp[:, :, kh:kh + 7, kw:kw + 7])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)


def test_vex_only_instructions_on_ymm16_to_31_go_through_low_scratch():
    """vblendvps, vcmpps into a ymm and vpxor have no EVEX form: on a ymm/xmm16..31 operand the emitter copies
    those operands into scratch registers 12..15 the instruction does not use (kept in a stack slot around it: one
    may hold a live value), runs the VEX form there and copies the destination back. The bytes equal GNU as's."""
    import shutil
    import subprocess
    import types

    from polygrad_backend_x86.asm import Imm
    from polygrad_backend_x86.cpu import Isa
    from polygrad_backend_x86.regalloc import Frame
    from polygrad_backend_x86.vector import VR, VectorEmitter
    if not (shutil.which("as") and shutil.which("objcopy")):
        pytest.skip("needs GNU as and objcopy")
    isa = Isa("avx512", fma=True, features=())
    frame = Frame(used_vec={3, 12, *range(17, 26)})
    e = VectorEmitter(types.SimpleNamespace(params=[], vars=[], insts=[]), isa, frame, 64)
    s0, s1, s2 = (e.low_save + 32 * i for i in range(3))  # where the borrowed registers are kept
    e.vop("VBLENDVPS", VR(17, 256), VR(18, 256), VR(3, 256), VR(19, 256))
    e.vop("VCMPPS", VR(20, 128), VR(12, 128), VR(21, 128), Imm(1))
    e.vop("VPXOR", VR(22, 256), VR(22, 256), VR(22, 256))
    e.vop("VFMADD231PS", VR(23, 256), VR(24, 256), VR(25, 256))  # has an EVEX form: no moves
    e.zero(VR(26, 256))  # a zeroed accumulator: the EVEX vpxord, no moves
    src = f""".intel_syntax noprefix
vmovups [rsp+{s0}], ymm12
vmovups [rsp+{s1}], ymm13
vmovups [rsp+{s2}], ymm14
vmovaps ymm12, ymm17
vmovaps ymm13, ymm18
vmovaps ymm14, ymm19
vblendvps ymm12, ymm13, ymm3, ymm14
vmovaps ymm17, ymm12
vmovups ymm12, [rsp+{s0}]
vmovups ymm13, [rsp+{s1}]
vmovups ymm14, [rsp+{s2}]
vmovups [rsp+{s0}], ymm13
vmovups [rsp+{s1}], ymm14
vmovaps xmm13, xmm20
vmovaps xmm14, xmm21
vcmpltps xmm13, xmm12, xmm14
vmovaps xmm20, xmm13
vmovups ymm13, [rsp+{s0}]
vmovups ymm14, [rsp+{s1}]
vmovups [rsp+{s0}], ymm12
vmovaps ymm12, ymm22
vpxor ymm12, ymm12, ymm12
vmovaps ymm22, ymm12
vmovups ymm12, [rsp+{s0}]
vfmadd231ps ymm23, ymm24, ymm25
vpxord ymm26, ymm26, ymm26
"""
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        with open(f"{d}/a.s", "w") as f:
            f.write(src)
        subprocess.run(["as", "--64", "-o", f"{d}/a.o", f"{d}/a.s"], check=True)
        subprocess.run(["objcopy", "-O", "binary", "-j", ".text", f"{d}/a.o", f"{d}/a.bin"], check=True)
        with open(f"{d}/a.bin", "rb") as f:
            want = f.read()
    assert e.a.encode() == want


def test_eight_lane_selects_and_compares_in_ymm16_to_31_equal_numpy(monkeypatch):
    """With only vector registers 0..1 for values (the rest of 0..15 scratch), an 8-lane elementwise kernel of
    float and int32 comparisons, bool logic, max and selects puts its values in ymm16..31, so vblendvps, vcmpps
    and vpcmpgtd (VEX only) run through borrowed scratch registers; the result equals NumPy's."""
    import re

    from polygrad.codegen.lower import lower
    from polygrad.codegen.opts import Opt, OptKind
    from polygrad.device import Buffer, open_device
    from polygrad.schedule.template import schedule
    from polygrad_backend_x86.asm import disassemble
    from polygrad_backend_x86.cpu import Isa, choose_isa
    if choose_isa().tier != "avx512":
        pytest.skip("needs AVX-512")
    monkeypatch.setattr(Isa, "vec_regs", property(lambda self: 2))
    dev = open_device("X86")
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((2, 40, 24)).astype(np.float32)
    i, j = rng.integers(-50, 50, (2, 40, 24)).astype(np.int32)
    a[0, :4] = np.nan

    def f(a, b, i, j):
        m = (a < b) & (i != j) | (a > 1.0)
        return m.where(a * 2 + b, b.maximum(a)) + ((i ^ j) & 7).cast(dtypes.float32) + (i < j).where(1.0, -1.0)

    t = f(Tensor.empty(40, 24), Tensor.empty(40, 24), Tensor.empty(40, 24, dtype=dtypes.int32),
          Tensor.empty(40, 24, dtype=dtypes.int32))
    tpl, _ = schedule([t.uop])
    (ast,) = [s.ast for s in tpl.steps if s.kind == "kernel"]
    spec = lower(ast, dev.capabilities, [Opt(OptKind.UPCAST, 1, 8)])
    kernel = dev.render(spec).emit()  # emitted now, not from the code cache
    assert re.search(r"ymm(1[6-9]|2\d|3[01])\b", disassemble(kernel.code, kernel.pool))
    bufs = [Buffer("X86", g.size, g.dtype) for g in spec.globals]
    for buf, x in zip(bufs[1:], (a, b, i, j)):
        buf.copyin(x.reshape(-1))
    dev.load(spec, kernel)([buf.handle for buf in bufs], (), False)
    m = (a < b) & (i != j) | (a > 1.0)
    want = np.where(m, a * 2 + b, np.maximum(b, a)) + ((i ^ j) & 7).astype(np.float32) + np.where(i < j, 1.0, -1.0)
    np.testing.assert_allclose(bufs[0].numpy().reshape(40, 24), want, rtol=1e-6)
