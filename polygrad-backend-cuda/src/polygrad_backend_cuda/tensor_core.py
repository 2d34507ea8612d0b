"""Tensor-core matmul kernels: a kernel lowered with Opt(TC) rendered with mma.sync (sm_80 and newer).

Stage: rendering. Input: a ProgramSpec whose opts hold Opt(TC) (codegen/gpu_opts.py chose it for
C[.., i, j] = sum_k A[.., i, k] * B[.., k, j] over float16 or bfloat16 A and B, or float32 ones with
POLY_ALLOW_TF32=1). Output: CUDA C where each warp owns a TM x TN tile of C and issues one mma.sync per
step of k (FAMILIES: m16n8k16 .f16 or .bf16, 16 deep; m16n8k8 .tf32, 8 deep, its operands rounded by
cvt.rna.tf32.f32 as they leave shared memory), plus the launch: one warp per tile, WY x WX warps per
block, batch ranges on grid z.

The operands are read through their index expressions (any strides the kernel IR has: transposes,
broadcasts, batch offsets) and packed into the f16x2 registers of the fragment layout in the PTX ISA.
Tensor cores are used from sm_80 (Capabilities.tensor_cores), which has cp.async: the block's A and B
tiles (16-bit operands: BM x 32 and 32 x BN; 16 deep where k is not a multiple of 32; float32: 16 or
8 deep) are copied into shared memory by cp.async, 16 bytes at a time where 8 halves (4 floats) lie
contiguous and aligned (element by element where they do not), with STAGES tiles in flight, and the
warps read their fragments from there. Products are exact and summed in float32 (the IR's
half-precision product rounding does not happen; TF32 products are of operands rounded to 10
mantissa bits), then the kernel's casts apply to the sum: results agree with the scalar kernel to
float16 (bfloat16, TF32) tolerance, not bit for bit.
"""
from __future__ import annotations

from typing import Any

from dataclasses import dataclass

from polygrad.backend_api import (KERNEL_SYMBOL, LaunchDims, Ops, UOp, dtypes, matmul_shape,
                                  tensor_core_dtype, var_name)

M, N = 16, 8  # rows and columns of one mma.sync tile
STAGES = 3  # tiles in flight: the one computed on and two being copied


@dataclass(frozen=True)
class Family:
    """One mma.sync family: its instruction, depth of k per mma, the shared-memory element type and how
    many of them a 16-byte cp.async moves, the deepest block tile along k (static shared memory stays
    under 48 KiB at 3 stages)."""

    instruction: str
    depth: int
    element: str
    chunk: int
    block_depth: int


FAMILIES = {
    "half": Family("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32", 16, "unsigned short", 8, 32),
    "bfloat16": Family("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32", 16, "unsigned short", 8, 32),
    "float": Family("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32", 8, "float", 4, 16),
}
# float32 -> TF32 (10 mantissa bits, to nearest, ties away from zero) in a 32-bit register, as the
# m16n8k8 .tf32 mma reads it; cpu_check.py swaps it for integer C++
TF32_CVT = r"""__device__ __forceinline__ unsigned int pg_tf32(float x) {
  unsigned int r; asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x)); return r;
}
"""

# cp.async of 16 bytes global -> shared, its commit and its wait; cpu_check.py swaps this block for
# synchronous copies (the kernel's __syncthreads after each wait orders them as on the GPU)
CP_ASYNC = r"""__device__ __forceinline__ void pg_cp_async16(void* dst, const void* src) {
  unsigned int d = (unsigned int)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(d), "l"(src));
}
__device__ __forceinline__ void pg_cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int N> __device__ __forceinline__ void pg_cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" :: "n"(N));
}
"""


def uses_tensor_cores(spec: Any) -> bool:
    return any(getattr(o.kind, "value", o.kind) == "TC" for o in spec.opts)


def _size(r: UOp) -> int:
    return int(r.src[0].arg)


def family_of(spec: Any) -> Family:
    """The mma family of a kernel lowered with Opt(TC), by its operands' dtype."""
    name = tensor_core_dtype(spec.ast)
    if name is None:
        raise NotImplementedError(f"kernel {spec.name} was lowered with Opt(TC) but is not a float16, bfloat16 "
                                  "or float32 matmul whose sizes fit the mma tile")
    return FAMILIES[name]


def tile_plan(spec: Any) -> tuple[UOp, UOp, UOp, list[UOp], tuple[int, int, int, int]]:
    """(i, j, k, batch ranges, (tile rows TM, tile cols TN, warps down WY, warps across WX))."""
    name = tensor_core_dtype(spec.ast)
    shape = None if name is None else matmul_shape(spec.ast, name)
    if shape is None:
        family_of(spec)  # raises, naming what the kernel is not
    i, j, k = shape
    rows, cols = _size(i), _size(j)
    tm = next(t for t in (32, 16) if rows % t == 0)
    tn = next(t for t in (32, 16, 8) if cols % t == 0)
    wy = 2 if rows % (tm * 2) == 0 else 1
    wx = 2 if cols % (tn * 2) == 0 else 1
    end = spec.ast.src[0]
    batch = [r for r in end.src[1:] if r is not i and r is not j]
    return i, j, k, batch, (tm, tn, wy, wx)


def tensor_core_launch(spec: Any) -> LaunchDims:
    i, j, _, batch, (tm, tn, wy, wx) = tile_plan(spec)
    z = 1
    for r in batch:
        z *= _size(r)
    return LaunchDims((_size(j) // (tn * wx), _size(i) // (tm * wy), z), (32 * wx * wy, 1, 1), ())


BINARY = {Ops.ADD: "+", Ops.MUL: "*", Ops.IDIV: "/", Ops.MOD: "%", Ops.CMPLT: "<", Ops.CMPNE: "!=",
          Ops.CMPEQ: "==", Ops.AND: "&", Ops.OR: "|", Ops.XOR: "^", Ops.SHL: "<<", Ops.SHR: ">>"}


def index_expr(u: UOp, names: dict[UOp, str], renderer: Any) -> str:
    """C for an index expression over ranges and variables (named in `names`) and constants, built
    sources first over u's toposort (no recursion: any depth)."""
    text = dict(names)
    for n in u.toposort():
        if n in text:
            continue
        a = [text[s] for s in n.src]
        if n.op is Ops.CONST:
            text[n] = renderer.literal(n)
        elif n.op in BINARY:
            text[n] = f"({a[0]}{BINARY[n.op]}{a[1]})"
        elif n.op is Ops.NEG:
            text[n] = f"(-{a[0]})"
        elif n.op is Ops.WHERE:
            text[n] = f"({a[0]}?{a[1]}:{a[2]})"
        elif n.op is Ops.MAX:
            text[n] = f"(({a[0]}>{a[1]})?{a[0]}:{a[1]})"
        elif n.op is Ops.CAST:
            text[n] = f"(({renderer.ctype(n.dtype)}){a[0]})"
        else:
            raise NotImplementedError(f"tensor-core kernels have no index rule for {n.op.name}")
    return text[u]


def tile_parts(spec: Any, renderer: Any, i: UOp, j: UOp, k: UOp, batch: Any) -> tuple:
    """What a matmul tile template reads of its kernel: (the store's index, the casts between the sum and
    the store, outermost first, A's and B's LOADs, the index C type, the C names of the ranges and
    Variables, the globals by slot)."""
    store = spec.ast.src[0].src[0]
    out_index, value = store.src[0], store.src[1]
    casts = []
    while value.op is Ops.CAST:
        casts.append(value.dtype)
        value = value.src[0]
    load_a, load_b = _operand_loads(spec, i, j)
    names = {i: "ri", j: "rj", k: "rk"}
    names.update((v, var_name(n)) for n, v in enumerate(spec.vars))  # the renderer's names, never the user's
    for n, r in enumerate(batch):
        names[r] = f"rb{n}"
    return out_index, casts, load_a, load_b, renderer.ctype(i.dtype), names, {g.slot: g for g in spec.globals}


def _operand_loads(spec: Any, i: UOp, j: UOp) -> tuple[UOp, UOp]:
    """The LOAD nodes of A (no j in its index) and B (no i)."""
    loads = [n for n in spec.ast.toposort() if n.op is Ops.LOAD]
    a = next(x for x in loads if j not in x.src[0].src[1].toposort())
    b = next(x for x in loads if x is not a)
    return a, b


def _mma_lines(mt: int, nt: int, family: Family) -> list[str]:
    """One mma.sync per 16 x 8 piece of the warp's tile, from the fragments a[m] and b[n]."""
    return [
        "    #pragma unroll",
        f"    for (int m = 0; m < {mt}; m++)",
        "      #pragma unroll",
        f"      for (int n = 0; n < {nt}; n++)",
        f'        asm volatile("{family.instruction} {{%0, %1, %2, %3}}, '
        '{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"',
        '                     : "+f"(acc[m][n][0]), "+f"(acc[m][n][1]), "+f"(acc[m][n][2]), "+f"(acc[m][n][3])',
        '                     : "r"(a[m][0]), "r"(a[m][1]), "r"(a[m][2]), "r"(a[m][3]), "r"(b[n][0]), "r"(b[n][1]));',
    ]


def _fill(tile: str, rows: int, cols: int, index: str, buf: str, threads: int, chunk: int) -> list[str]:
    """Copy a rows x cols tile of an operand into shared `tile[s]` in 16-byte chunks (`chunk` elements)
    along its columns: one cp.async where the chunk lies contiguous and 16-byte aligned in global
    memory, else plain copies element by element (any strides: transposes, broadcasts)."""
    per_row = cols // chunk
    return [
        f"    for (int c = threadIdx.x; c < {rows * per_row}; c += {threads}) {{",
        f"      const int r = c / {per_row}, q = c % {per_row} * {chunk};",
        f"      const auto at = {index};",
        f"      bool whole = (((unsigned long long)({buf} + at(r, q))) & 15) == 0;",
        f"      for (int e = 1; e < {chunk}; e++) whole = whole && at(r, q + e) == at(r, q) + e;",
        f"      if (whole) pg_cp_async16(&{tile}[s][r][q], {buf} + at(r, q));",
        f"      else for (int e = 0; e < {chunk}; e++) {tile}[s][r][q + e] = {buf}[at(r, q + e)];",
        "    }",
    ]


def _fragment_lines(mt: int, nt: int, family: Family) -> list[str]:
    """The warp's A fragments a[m] and B fragments b[n] for the k step at kk of shared tile s, in the
    PTX ISA's register layouts: 16-bit operands as pairs along k (A: rows g, g + 8, columns 2t, 2t + 8;
    B: rows 2t, 2t + 8, column g), TF32 one per register, rounded by cvt.rna (A: rows g, g + 8, columns
    t, t + 4; B: rows t, t + 4, column g)."""
    if family.element == "float":
        return [
            "      #pragma unroll",
            f"      for (int m = 0; m < {mt}; m++) {{",
            f"        const int r = wr + m * {M} + g, c = kk + t;",
            "        a[m][0] = pg_tf32(sa[s][r][c]);",
            "        a[m][1] = pg_tf32(sa[s][r + 8][c]);",
            "        a[m][2] = pg_tf32(sa[s][r][c + 4]);",
            "        a[m][3] = pg_tf32(sa[s][r + 8][c + 4]);",
            "      }",
            "      #pragma unroll",
            f"      for (int n = 0; n < {nt}; n++) {{",
            f"        const int c = wc + n * {N} + g, r = kk + t;",
            "        b[n][0] = pg_tf32(sb[s][r][c]);",
            "        b[n][1] = pg_tf32(sb[s][r + 4][c]);",
            "      }",
        ]
    return [
        "      #pragma unroll",
        f"      for (int m = 0; m < {mt}; m++) {{",
        f"        const int r = wr + m * {M} + g, c = kk + t * 2;",
        "        a[m][0] = *(const unsigned int*)&sa[s][r][c];",
        "        a[m][1] = *(const unsigned int*)&sa[s][r + 8][c];",
        "        a[m][2] = *(const unsigned int*)&sa[s][r][c + 8];",
        "        a[m][3] = *(const unsigned int*)&sa[s][r + 8][c + 8];",
        "      }",
        "      #pragma unroll",
        f"      for (int n = 0; n < {nt}; n++) {{",
        f"        const int c = wc + n * {N} + g, r = kk + t * 2;",
        "        b[n][0] = sb[s][r][c] | ((unsigned int)sb[s][r + 1][c] << 16);",
        "        b[n][1] = sb[s][r + 8][c] | ((unsigned int)sb[s][r + 9][c] << 16);",
        "      }",
    ]


def _staged_loop(idt: str, mt: int, nt: int, depth: int, plan: tuple[int, int, int, int],
                 bufs: tuple[str, str], family: Family) -> list[str]:
    """The k loop of sm_80+: the block's A (BM x BK) and B (BK x BN) tiles copied into shared memory by
    cp.async, STAGES of them in flight, and the fragments read from there (_fragment_lines). Rows
    padded by 16 bytes keep each row 16-byte aligned and shift the banks of consecutive rows."""
    tm, tn, wy, wx = plan
    bm, bn, threads = tm * wy, tn * wx, 32 * wx * wy
    bk = next(d for d in (family.block_depth, family.block_depth // 2, family.depth) if depth % d == 0)
    pad, elem, chunk = family.chunk, family.element, family.chunk
    return [
        f"  __shared__ __align__(16) {elem} sa[{STAGES}][{bm}][{bk + pad}];",
        f"  __shared__ __align__(16) {elem} sb[{STAGES}][{bk}][{bn + pad}];",
        f"  const {idt} brow = (({idt})blockIdx.y) * {bm}, bcol = (({idt})blockIdx.x) * {bn};",
        f"  const int wr = warp / {wx} * {tm}, wc = warp % {wx} * {tn};",
        f"  auto fill = [&](int s, {idt} k0) {{",
        *_fill("sa", bm, bk, f"[&](int r, int q) -> {idt} {{ return ix_a(brow + r, k0 + q); }}", bufs[0], threads,
               chunk),
        *_fill("sb", bk, bn, f"[&](int r, int q) -> {idt} {{ return ix_b(k0 + r, bcol + q); }}", bufs[1], threads,
               chunk),
        "  };",
        f"  const {idt} steps = {depth // bk};",
        f"  for (int s = 0; s < {STAGES - 1}; s++) {{",
        f"    if (s < steps) fill(s, s * {bk});",
        "    pg_cp_async_commit();",
        "  }",
        f"  for ({idt} kt = 0; kt < steps; kt++) {{",
        f"    pg_cp_async_wait<{STAGES - 2}>();  // tile kt has landed (this thread's copies)",
        "    __syncthreads();  // ... every thread's, and every warp is done with tile kt - 1",
        f"    const int s = kt % {STAGES};",
        f"    if (kt + {STAGES - 1} < steps) fill((kt + {STAGES - 1}) % {STAGES}, (kt + {STAGES - 1}) * {bk});",
        "    pg_cp_async_commit();  // an empty group past the end keeps the wait's count",
        "    #pragma unroll",
        f"    for (int kk = 0; kk < {bk}; kk += {family.depth}) {{",
        f"      unsigned int a[{mt}][4], b[{nt}][2];",
        *_fragment_lines(mt, nt, family),
        *("  " + line for line in _mma_lines(mt, nt, family)),
        "    }",
        "  }",
    ]


def render_tensor_core(spec: Any, renderer: Any) -> str:
    i, j, k, batch, (tm, tn, wy, wx) = tile_plan(spec)
    family = family_of(spec)
    mt, nt = tm // M, tn // N
    out_index, casts, load_a, load_b, idt, names, slot = tile_parts(spec, renderer, i, j, k, batch)
    buf = {x: f"data{x.src[0].src[0].arg[0]}" for x in (load_a, load_b)}
    out_buf = f"data{out_index.src[0].arg[0]}"
    lines = [
        "  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;",
        f"  const {idt} row0 = ((({idt})blockIdx.y) * {wy} + warp / {wx}) * {tm};",
        f"  const {idt} col0 = ((({idt})blockIdx.x) * {wx} + warp % {wx}) * {tn};",
        f"  {idt} bz = blockIdx.z;",
    ]
    for n, r in reversed(list(enumerate(batch))):
        lines.append(f"  const {idt} rb{n} = bz % {_size(r)}; bz /= {_size(r)};")
    ia = index_expr(load_a.src[0].src[1], names, renderer)
    ib = index_expr(load_b.src[0].src[1], names, renderer)
    ic = index_expr(out_index.src[1], names, renderer)
    lines += [
        f"  auto ix_a = [&]({idt} ri, {idt} rk) -> {idt} {{ return {ia}; }};",
        f"  auto ix_b = [&]({idt} rk, {idt} rj) -> {idt} {{ return {ib}; }};",
        f"  float acc[{mt}][{nt}][4];",
        f"  for (int m = 0; m < {mt}; m++) for (int n = 0; n < {nt}; n++)",
        "    for (int e = 0; e < 4; e++) acc[m][n][e] = 0.0f;",
    ]
    lines += _staged_loop(idt, mt, nt, _size(k), (tm, tn, wy, wx), (buf[load_a], buf[load_b]), family)
    v = "acc[m][n][h * 2 + e]"
    for dt in reversed(casts):
        v = renderer.round_half(dt, v) if dt in (dtypes.float16, dtypes.bfloat16) else f"(({renderer.ctype(dt)}){v})"
    out_dt = slot[out_index.src[0].arg[0]].dtype
    lines += [
        f"  for (int m = 0; m < {mt}; m++) for (int n = 0; n < {nt}; n++) for (int h = 0; h < 2; h++)",
        "    for (int e = 0; e < 2; e++) {",
        f"      const {idt} ri = row0 + m * {M} + g + h * 8, rj = col0 + n * {N} + t * 2 + e;",
        f"      {out_buf}[{ic}] = {renderer.to_storage(out_dt, v)};",
        "    }",
    ]
    params = [renderer.buffer_param(g.slot, g.dtype, g.written) for g in spec.globals]
    params += [renderer.var_param(n, x.dtype) for n, x in enumerate(spec.vars)]
    threads = 32 * wx * wy
    uses_half = any(dt in (dtypes.float16, dtypes.bfloat16) for dt in [out_dt, *casts])
    tf32 = TF32_CVT if family.element == "float" else ""
    prelude = renderer.prelude + (renderer.half_helpers if uses_half else "") + CP_ASYNC + tf32
    body = "\n".join(lines)
    return f"{prelude}\n{renderer.kernel_declaration(threads)} {KERNEL_SYMBOL}({', '.join(params)}) {{\n{body}\n}}\n"
