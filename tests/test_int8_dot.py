"""Integer dot products for a quantized decode step (issue 30): 8-bit activations, int8 x int8 block sums.

- quantize_activations rounds each 32-value block as NumPy does with d = max|x| / 127 (bit for bit).
- A one-row Q8_0 or Q4_0 matvec on a device declaring Capabilities.int8_dot (the CPU backend with VNNI)
  equals a NumPy model of its arithmetic (exact int32 block sums, one float32 scale per block) within
  float32 summation, and the float path within the activations' rounding bound.
- The CPU renderer contracts the block sums to its pg_dot4 / pg_dot4n helpers (vpdpbusd) when the
  capability is on, and not when it is off; the helpers are exact for every pair of int8 values (-128
  included) and every nibble x int8 pair.
- INTERP and X86 declare no int8_dot: their matvec stays the float path. POLY_INT8_DOT=0 turns the route off.
"""
from __future__ import annotations

import dataclasses
import functools
import re
import shutil
import subprocess

import numpy as np
import pytest

from polygrad import Context, Tensor, dtypes
from polygrad.codegen.lower import lower
from polygrad.codegen.opts import OptKind
from polygrad.device import open_device
from conftest import programs_of
from polygrad.nn.quant import QuantWeight, _int8_matmul_t, _q4_0_block_sums, int8_dot_enabled, quantize_activations
from polygrad.uop.ops import Ops

ROWS, COLS = 24, 96  # 3 blocks a row
CHAINED_COLS = 896  # 28 blocks a row (Qwen2-0.5B's): two float chains (renderer/int8_dot.py split_chains)
DOT_HELPER = {"Q8_0": "pg_dot4_i8x32(", "Q4_0": "pg_dot4n_i8x32("}  # the CPU renderer's contracted block sums


def _numpy_quantize(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    blocks = x.reshape(-1, 32)
    d = np.abs(blocks).max(1) / np.float32(127)
    inverse = np.where(d != 0, np.float32(1) / np.where(d != 0, d, 1), np.float32(0)).astype(np.float32)
    return np.rint(blocks * inverse[:, None]).astype(np.int8), d.astype(np.float32)


def _blocks(seed: int = 0, fmt: str = "Q8_0", cols: int = COLS) -> np.ndarray:
    """Q8_0 blocks (ROWS, COLS // 32, 34) with random float16 scales and every int8 quant, -128 included, or
    Q4_0 blocks (ROWS, COLS // 32, 18) with random scales and random bytes (every nibble)."""
    rng = np.random.default_rng(seed)
    nbytes = 34 if fmt == "Q8_0" else 18
    blocks = rng.integers(0, 256, (ROWS, cols // 32, nbytes), dtype=np.uint8)
    blocks[..., :2] = rng.uniform(1e-3, 1e-1, (ROWS, cols // 32)).astype(np.float16)[..., None].view(np.uint8)
    blocks[0, 0, 2:4] = [128, 127]  # Q8_0: -128 and 127; Q4_0: nibbles 0, 8, 15 and 7
    return blocks


def _weight_quants(blocks: np.ndarray, fmt: str) -> np.ndarray:
    """The int64 quants (rows, nb, 32) of Q8_0 or Q4_0 blocks, as the gguf package orders them (Q4_0: byte j's
    low nibble is value j, its high nibble value j + 16, each less 8)."""
    if fmt == "Q8_0":
        return blocks[..., 2:].view(np.int8).astype(np.int64)
    q = blocks[..., 2:].astype(np.int64)
    return np.concatenate([q & 15, q >> 4], axis=-1) - 8


def test_quantize_activations_matches_numpy():
    x = np.random.default_rng(1).standard_normal(COLS).astype(np.float32) * 3
    x[32:64] = 0.0  # a block of zeros: d = 0 and q = 0
    x[64] = -x[65:96].__abs__().max() * 2  # the block's largest magnitude negative: q = -127
    q, d = quantize_activations(Tensor(x))
    want_q, want_d = _numpy_quantize(x)
    assert q.dtype is dtypes.int8 and np.array_equal(q.numpy().reshape(-1, 32), want_q)
    assert np.array_equal(d.numpy(), want_d)
    assert q.numpy().min() >= -127


def test_block_maxima_of_a_decode_row_take_vector_lanes():
    """A decode row's max|x| per 32-value block (Qwen2-0.5B's 896 columns: 28 blocks) runs in 8 lanes (host_opts
    _lanes_from), not one chain of NaN-aware compares per block, with NumPy's values bit for bit (a NaN block
    included: lanes keep it)."""
    x = np.random.default_rng(2).standard_normal(CHAINED_COLS).astype(np.float32)
    x[32:64] = 0.0
    x[64:96] = -0.0  # signed zeros: d = +0 either way
    x[100] = -40.0  # the largest magnitude in the last lane of its block
    x[200] = np.nan
    got: list = []
    progs = programs_of(lambda: got.extend(t.numpy() for t in quantize_activations(Tensor(x, device="CPU"))))
    maxima = [p for p in progs if any(u.op is Ops.REDUCE and u.arg is Ops.MAX for u in p.spec.ast.toposort())]
    assert maxima and all(OptKind.SPLIT_REDUCE in [o.kind for o in p.spec.opts] for p in maxima), \
        [(p.spec.name, p.spec.opts) for p in maxima]
    want_q, want_d = _numpy_quantize(np.where(np.isnan(x), 0, x).astype(np.float32))
    nan_block = 200 // 32
    want_d[nan_block] = np.nan
    assert np.array_equal(got[1], want_d, equal_nan=True) and np.signbit(got[1][2]) == np.False_
    rows = [b for b in range(CHAINED_COLS // 32) if b != nan_block]
    assert np.array_equal(got[0].reshape(-1, 32)[rows], want_q[rows])


def _require_int8_dot():
    if not int8_dot_enabled("CPU"):
        pytest.skip("the CPU device does not declare int8_dot (no VNNI or no clang)")


@pytest.mark.parametrize("cols", [COLS, CHAINED_COLS])
@pytest.mark.parametrize("fmt", ["Q8_0", "Q4_0"])
def test_int8_matvec_matches_numpy_model_and_the_float_path(fmt, cols):
    _require_int8_dot()
    blocks = _blocks(fmt=fmt, cols=cols)
    x = np.random.default_rng(2).standard_normal((1, cols)).astype(np.float32)
    qw = QuantWeight(Tensor(blocks), fmt, (ROWS, cols))
    got = []
    new = programs_of(lambda: got.append(qw.matmul_t(Tensor(x)).numpy()[0]))
    assert any(DOT_HELPER[fmt] in p.source for p in new), [p.spec.name for p in new]
    with Context(POLY_INT8_DOT=0):
        floats = qw.matmul_t(Tensor(x)).numpy()[0]
    xq, dx = _numpy_quantize(x)
    dw = blocks[..., :2].copy().view(np.float16)[..., 0].astype(np.float32)
    wq = _weight_quants(blocks, fmt)
    sums = np.einsum("bi,rbi->rb", xq.astype(np.int64), wq)  # exact
    terms = sums.astype(np.float32) * (dw * dx[None, :])
    assert np.all(np.abs(got[0] - terms.sum(1, dtype=np.float64)) <= 1e-6 * np.abs(terms).sum(1))
    # the rounding moves each activation by at most d_x / 2
    w = (wq * dw[..., None]).reshape(ROWS, cols)
    bound = np.abs(w).reshape(ROWS, -1, 32).sum(2) @ (dx / 2) + 1e-5 * np.abs(floats).max()
    assert np.all(np.abs(got[0] - floats) <= bound)


@functools.lru_cache(maxsize=None)
def _int8_dot_ast(fmt: str, cols: int = COLS):
    """The kernel IR of the 8-bit route's one-row matvec."""
    qw = QuantWeight(Tensor(_blocks(5, fmt, cols)), fmt, (ROWS, cols))
    x = Tensor(np.ones((1, cols), np.float32))
    new = programs_of(lambda: _int8_matmul_t(qw.blocks, x, fmt).realize())
    return next(p.spec.ast for p in new if p.spec.name == f"r_1_{ROWS}")


def _int8_dot_kernel(caps_on: bool, fmt: str, cols: int = COLS):
    """The 8-bit route's matvec kernel lowered and rendered for the CPU with Capabilities.int8_dot on or off
    (whatever this CPU has: rendering needs no VNNI)."""
    pytest.importorskip("polygrad_backend_cpu")
    from polygrad_backend_cpu.renderer import CPURenderer
    ast = _int8_dot_ast(fmt, cols)
    caps = dataclasses.replace(open_device("CPU").capabilities, int8_dot=caps_on)
    spec = lower(ast, caps)
    return spec, CPURenderer(int8_dot=caps_on).render(spec)


@pytest.mark.parametrize("fmt", ["Q8_0", "Q4_0"])
def test_rendered_kernel_has_dot_products_only_with_the_capability(fmt):
    spec, source = _int8_dot_kernel(True, fmt)
    assert DOT_HELPER[fmt] in source and "__builtin_ia32_vpdpbusd256" in source
    _, plain = _int8_dot_kernel(False, fmt)
    assert "pg_dot4" not in plain and "vpdpbusd" not in plain
    cc = shutil.which("clang")
    if cc is None or not int8_dot_enabled("CPU"):
        pytest.skip("no clang, or no VNNI here to compile the instruction for")
    flags = ["-O3", "-march=native", "-ffp-contract=off", "-S", "-x", "c", "-", "-o", "-"]
    asm = subprocess.run([cc, *flags], input=source, capture_output=True, text=True, check=True).stdout
    assert "vpdpbusd" in asm
    # the block's bytes are read as vectors: no byte-sized scalar loads or sign extensions in the kernel
    kernel = asm[asm.index("pg_kernel:"):]
    kernel = kernel[:kernel.index(".cfi_endproc")]
    assert not re.search(r"\b(movsbl|movzbl|movsbw|movzbw|movsbq|movzbq)\b", kernel), kernel
    plain_asm = subprocess.run([cc, *flags], input=plain, capture_output=True, text=True, check=True).stdout
    assert "vpdpbusd" not in plain_asm


def _vector_register(operand: str) -> str | None:
    """The ymm name of an x/y/zmm register operand (the same register file), None for anything else."""
    m = re.fullmatch(r"%[xyz]mm(\d+)", operand.strip())
    return f"ymm{m.group(1)}" if m else None


def _fma_chain(kernel: str) -> tuple[int, int]:
    """(the longest run of vfmadd*ps in which each one's addend is the last one's result, the number of
    vfmadd*ps) in AT&T assembly: the float chain through a row's blocks as the CPU runs it. An FMA's
    addend is its second operand in the 132 form, its first in 213 and its destination in 231; a
    register copy keeps the chain, any other write to a register starts a new one."""
    depth: dict[str, int] = {}
    longest = count = 0
    for line in kernel.splitlines():
        m = re.match(r"\s*(v\w+)\s+([^#]*)", line)
        if not m:
            continue
        ops = [o.strip() for o in re.split(r",(?![^(]*\))", m.group(2))]
        dest = _vector_register(ops[-1])
        if dest is None:
            continue
        form = re.fullmatch(r"vfmadd(132|213|231)ps", m.group(1))
        if form:
            addend = _vector_register(ops[{"132": 1, "213": 0, "231": 2}[form.group(1)]])
            depth[dest] = depth.get(addend, 0) + 1
            longest, count = max(longest, depth[dest]), count + 1
        elif m.group(1) in ("vmovaps", "vmovups") and len(ops) == 2:
            depth[dest] = depth.get(_vector_register(ops[0]), 0)
        else:
            depth[dest] = 0
    return longest, count


def _compiled_kernel(source: str) -> str:
    """The assembly of pg_kernel in a kernel's C source, as clang compiles it for this CPU (skips without clang
    or VNNI)."""
    cc = shutil.which("clang")
    if cc is None or not int8_dot_enabled("CPU"):
        pytest.skip("no clang, or no VNNI here to compile the instruction for")
    flags = ["-O3", "-march=native", "-fno-math-errno", "-ffp-contract=off", "-S", "-x", "c", "-", "-o", "-"]
    asm = subprocess.run([cc, *flags], input=source, capture_output=True, text=True, check=True).stdout
    kernel = asm[asm.index("pg_kernel:"):]
    return kernel[:kernel.index(".cfi_endproc")]


@pytest.mark.parametrize("fmt", ["Q8_0", "Q4_0"])
def test_block_loop_runs_two_float_chains(fmt):
    """A row's blocks alternate between two float accumulators (renderer/int8_dot.py split_chains): in the
    compiled kernel no vfmadd waits on more than half the others, and the loop spills nothing to the stack."""
    _, source = _int8_dot_kernel(True, fmt, CHAINED_COLS)
    kernel = _compiled_kernel(source)
    longest, count = _fma_chain(kernel)
    assert count >= 2 and 2 * longest <= count, (longest, count, kernel)
    assert not re.search(r"\(%rsp\)|\(%rbp\)", kernel), kernel


def _matvec_kernel(fmt: str, cols: int):
    """(spec, source) of the 8-bit route's one-row matvec of ROWS rows as the CPU device lowers and renders it."""
    _require_int8_dot()
    qw = QuantWeight(Tensor(_blocks(12, fmt, cols)), fmt, (ROWS, cols))
    new = programs_of(lambda: qw.matmul_t(Tensor(np.ones((1, cols), np.float32))).realize())
    p = next(p for p in new if p.spec.name == f"r_1_{ROWS}")
    return p.spec, p.source


def _kernel_body(source: str) -> str:
    return source[source.index("void pg_kernel("):]


def test_a_turn_computes_several_weight_rows_from_one_activation_load():
    """Q4_0: The decode matvec takes INT8_DOT_ROWS weight rows a turn (host_opts.int8_dot_rows): each block's 32
    activations are loaded once for them, one dot product per row, every row's float terms still run in
    split_chains' two chains (an IF pair per row), and each row's bytes are prefetched ahead (a STREAM load)."""
    from polygrad.codegen.host_opts import INT8_DOT_ROWS
    fmt = "Q4_0"
    spec, source = _matvec_kernel(fmt, CHAINED_COLS)
    assert any(o.kind is OptKind.UPCAST and o.amount == INT8_DOT_ROWS for o in spec.opts), spec.opts
    body = _kernel_body(source)
    assert body.count(DOT_HELPER[fmt]) == INT8_DOT_ROWS, body
    assert len(re.findall(r"pg_i8x32 val\d+;", body)) == 1, body  # the activation's 32 bytes
    assert body.count("pg_fma_f32x8(") == 2 * INT8_DOT_ROWS, body
    # each weight row is a stream of its own, prefetched ahead (the CPU's prefetcher fell behind 4 of them)
    assert body.count("__builtin_prefetch(") == INT8_DOT_ROWS, body


def test_rows_of_a_turn_share_the_activation_work_in_the_compiled_kernel():
    """Compiled, each Q4_0 block takes one vpdpbusd per weight row and one for the activation's 8 x sum, shared
    by the turn's rows, where one row a turn took two per row."""
    from polygrad.codegen.host_opts import INT8_DOT_ROWS
    _, source = _matvec_kernel("Q4_0", CHAINED_COLS)
    kernel = _compiled_kernel(source)
    dots = len(re.findall(r"\bvpdpbusd\b", kernel))
    scales = len(re.findall(r"\bvcvtph2ps\b", kernel))  # one a block and weight row
    assert scales and dots * INT8_DOT_ROWS == scales * (INT8_DOT_ROWS + 1), (dots, scales)


def test_rows_of_a_turn_give_the_bits_of_one_row_a_turn():
    """24 Q4_0 weight rows (6 turns of 4) equal, bit for bit, the same rows of a 26-row weight, which 4 does not
    divide (one row a turn): every row's sum runs in the same order (split_chains splits each row's chain)."""
    _require_int8_dot()
    fmt = "Q4_0"
    blocks = np.concatenate([_blocks(9, fmt, CHAINED_COLS), _blocks(10, fmt, CHAINED_COLS)[:2]])
    x = Tensor(np.random.default_rng(11).standard_normal((1, CHAINED_COLS)).astype(np.float32))
    got = {}
    for rows in (ROWS, ROWS + 2):
        qw = QuantWeight(Tensor(blocks[:rows]), fmt, (rows, CHAINED_COLS))
        new = programs_of(lambda: got.setdefault(rows, qw.matmul_t(x).numpy()[0]))
        tiled = [any(o.kind is OptKind.UPCAST for o in p.spec.opts) for p in new if p.spec.name == f"r_1_{rows}"]
        assert tiled == [rows == ROWS], (rows, [p.spec.opts for p in new])
    assert got[ROWS].tobytes() == got[ROWS + 2][:ROWS].tobytes(), np.abs(got[ROWS] - got[ROWS + 2][:ROWS]).max()


@pytest.mark.parametrize("fmt, cols", [("Q8_0", CHAINED_COLS), ("Q4_0", 1536)])
def test_q8_0_and_long_rows_keep_one_row_a_turn(fmt, cols):
    """Rows read from memory several at a time were slower for Q8_0 and for Q4_0 rows longer than
    host_opts.INT8_DOT_ROW_BYTES (here 864 bytes): those matvecs keep one row a turn, still contracted."""
    spec, source = _matvec_kernel(fmt, cols)
    assert not any(o.kind is OptKind.UPCAST for o in spec.opts), spec.opts
    body = _kernel_body(source)
    assert body.count(DOT_HELPER[fmt]) == 1 and "__builtin_prefetch(" not in body, body


def test_split_chains_takes_a_power_of_two():
    from polygrad.renderer.int8_dot import split_chains
    from polygrad.renderer.linearize import LinearProgram
    with pytest.raises(ValueError, match="power of two"):
        split_chains(LinearProgram("k", (), (), (), 1), 3)


def test_fma_chain_reads_each_form_of_the_addend():
    one = "vfmadd231ps %ymm1, %ymm2, %ymm0\nvfmadd213ps %ymm0, %ymm3, %ymm4\nvfmadd132ps %ymm5, %ymm4, %ymm6"
    assert _fma_chain(one) == (3, 3)
    two = "vfmadd231ps %ymm1, %ymm2, %ymm0\nvfmadd231ps %ymm1, %ymm2, %ymm7\nvmovaps %ymm0, %ymm8\n" \
          "vfmadd213ps %ymm8, %ymm3, %ymm4\nvfmadd231ps (%rdi), %ymm2, %ymm7\nvxorps %ymm4, %ymm4, %ymm4"
    assert _fma_chain(two) == (2, 4)


def test_dot_products_are_exact_for_every_byte_value():
    """Every int8 pair, -128 x -128 included, through the contracted kernel: the exact integer sums (scales
    of 1, sums below 2**24 so float32 holds them), as INTERP computes the same kernel IR."""
    _require_int8_dot()
    rng = np.random.default_rng(3)
    a = rng.integers(-128, 128, (1, 3, 4, 8), dtype=np.int8)
    b = rng.integers(-128, 128, (ROWS, 3, 4, 8), dtype=np.int8)
    a[0, 0], b[0, 0] = -128, -128
    b[1, 0] = 127

    def matvec(device: str) -> Tensor:
        sums = (Tensor(a, device=device).cast(dtypes.int32) * Tensor(b, device=device).cast(dtypes.int32)).sum(-2)
        return (sums.cast(dtypes.float32) * Tensor.ones(ROWS, 3, 8, device=device)).sum((-2, -1))

    got = []
    new = programs_of(lambda: got.append(matvec("CPU").numpy()))
    assert any("pg_dot4_i8x32(" in p.source for p in new), [p.spec.name for p in new]
    want = np.einsum("xkl,rxkl->r", a[0].astype(np.int64), b.astype(np.int64))
    assert np.array_equal(got[0], want.astype(np.float32))
    assert np.array_equal(matvec("INTERP").numpy(), got[0])


def test_nibble_dot_products_are_exact_for_every_value():
    """Every byte (both its nibbles) against every int8 value, -128 included, through the contracted Q4_0
    block sums: the exact integer sums (scales of 1, sums below 2**24 so float32 holds them), as INTERP
    computes the same kernel IR."""
    _require_int8_dot()
    rng = np.random.default_rng(6)
    blocks = _blocks(8, "Q4_0")
    blocks[:16, :, 2:] = np.arange(256, dtype=np.uint8).reshape(16, 1, 16)  # rows 0-15: bytes 0..255
    xq = rng.integers(-128, 128, (1, 1, 3, 2, 2, 8), dtype=np.int8)
    xq[0, 0, 0] = -128
    xq[0, 0, 1] = 127

    def matvec(device: str) -> Tensor:
        sums = _q4_0_block_sums(Tensor(blocks, device=device), Tensor(xq, device=device))
        return (sums.cast(dtypes.float32) * Tensor.ones(ROWS, 3, 8, device=device)).sum((-2, -1))

    got = []
    new = programs_of(lambda: got.append(matvec("CPU").numpy()))
    assert any(DOT_HELPER["Q4_0"] in p.source for p in new), [p.spec.name for p in new]
    want = np.einsum("xbi,rbi->r", xq.reshape(1, 3, 32).astype(np.int64), _weight_quants(blocks, "Q4_0"))
    assert np.array_equal(got[0].reshape(-1), want.astype(np.float32))
    assert np.array_equal(matvec("INTERP").numpy(), got[0])


@pytest.mark.parametrize("fmt", ["Q8_0", "Q4_0"])
@pytest.mark.parametrize("device", ["INTERP", "X86"])
def test_other_backends_keep_the_float_path(device, fmt):
    try:
        caps = open_device(device).capabilities
    except Exception as e:  # noqa: BLE001 - a backend not installed here
        pytest.skip(f"{device}: {e}")
    assert not caps.int8_dot and not int8_dot_enabled(device)
    blocks = _blocks(fmt=fmt)
    x = np.random.default_rng(4).standard_normal((1, COLS)).astype(np.float32)
    qw = QuantWeight(Tensor(blocks, device=device), fmt, (ROWS, COLS))
    new = programs_of(lambda: qw.matmul_t(Tensor(x, device=device)).realize())
    assert [p.spec.name for p in new] == [f"r_1_{ROWS}"]  # one kernel: no 8-bit activations


@pytest.mark.parametrize("fmt", ["Q8_0", "Q4_0"])
def test_setting_turns_the_route_off(fmt):
    _require_int8_dot()
    with Context(POLY_INT8_DOT=0):
        assert not int8_dot_enabled("CPU")
        qw = QuantWeight(Tensor(_blocks(fmt=fmt)), fmt, (ROWS, COLS))
        new = programs_of(lambda: qw.matmul_t(Tensor(np.ones((1, COLS), np.float32))).realize())
    assert [p.spec.name for p in new] == [f"r_1_{ROWS}"]
    assert all("pg_dot4" not in p.source for p in new)


@pytest.mark.parametrize("fmt", ["Q8_0", "Q4_0"])
def test_a_saved_int8_route_runs_in_node_as_in_python(tmp_path, fmt):
    """A Model captured with the 8-bit route saves its kernels (the activation rounding, the int8 block sums)
    into the bundle, and polygrad-js computes them as Python does: with the same input to round, the same
    8-bit values (a sign-extension or rounding slip would move the result by whole steps of d_x)."""
    _require_int8_dot()
    from test_js import forward_in_node

    from polygrad import Model
    rng = np.random.default_rng(3)
    qw = QuantWeight(Tensor(_blocks(7, fmt)), fmt, (ROWS, COLS))

    class MatVec:
        def __init__(self) -> None:
            self.blocks = qw.blocks

        def __call__(self, x):
            return {"y": qw.matmul_t(x)}
    m = Model(MatVec(), inputs={"x": Tensor.empty(1, COLS)})
    assert any(DOT_HELPER[fmt] in p.source for p in programs_of(lambda: m.forward(x=np.zeros((1, COLS), np.float32))))
    x = rng.standard_normal((1, COLS)).astype(np.float32)
    want = m.forward(x=x)["y"].numpy()
    path = tmp_path / "matvec.pgb"
    m.save(str(path))
    for backend, out in forward_in_node(path.read_bytes(), {"x": x}, tmp_path).items():
        assert np.abs(out["y"] - want).max() <= 1e-5 * np.abs(want).max(), backend
