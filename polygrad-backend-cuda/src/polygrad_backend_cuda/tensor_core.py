"""Tensor-core matmul kernels: a kernel lowered with Opt(TC) rendered with mma.sync (sm_80 and newer).

Stage: rendering. Input: a ProgramSpec whose opts hold Opt(TC) (engine/gpu_opts.py chose it for
C[.., i, j] = sum_k A[.., i, k] * B[.., k, j] over float16 A and B). Output: CUDA C where each warp
owns a TM x TN tile of C and issues `mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32` per 16-deep
step of k, plus the launch: one warp per tile, WY x WX warps per block, batch ranges on grid z.

The operands are read straight from global memory through their index expressions (any strides the
kernel IR has: transposes, broadcasts, batch offsets), packed into the f16x2 registers of the
fragment layout in the PTX ISA. Products are exact and summed in float32 (the IR's half-precision
product rounding does not happen), then the kernel's casts apply to the sum: results agree with the
scalar kernel to float16 tolerance, not bit for bit.
"""
from __future__ import annotations

from typing import Any

from polygrad.backend_api import KERNEL_SYMBOL, LaunchDims, Ops, UOp, dtypes, matmul_shape, var_name

M, N, K = 16, 8, 16  # one mma.sync tile


def uses_tensor_cores(spec: Any) -> bool:
    return any(getattr(o.kind, "value", o.kind) == "TC" for o in spec.opts)


def _size(r: UOp) -> int:
    return int(r.src[0].arg)


def tile_plan(spec: Any) -> tuple[UOp, UOp, UOp, list[UOp], tuple[int, int, int, int]]:
    """(i, j, k, batch ranges, (tile rows TM, tile cols TN, warps down WY, warps across WX))."""
    shape = matmul_shape(spec.ast)
    if shape is None:
        raise NotImplementedError(f"kernel {spec.name} was lowered with Opt(TC) but is not a float16 matmul")
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


def _operand_loads(spec: Any, i: UOp, j: UOp) -> tuple[UOp, UOp]:
    """The LOAD nodes of A (no j in its index) and B (no i)."""
    loads = [n for n in spec.ast.toposort() if n.op is Ops.LOAD]
    a = next(x for x in loads if j not in x.src[0].src[1].toposort())
    b = next(x for x in loads if x is not a)
    return a, b


def render_tensor_core(spec: Any, renderer: Any) -> str:
    i, j, k, batch, (tm, tn, wy, wx) = tile_plan(spec)
    mt, nt = tm // M, tn // N
    end = spec.ast.src[0]
    store = end.src[0]
    out_index, value = store.src[0], store.src[1]
    casts = []
    while value.op is Ops.CAST:
        casts.append(value.dtype)
        value = value.src[0]
    load_a, load_b = _operand_loads(spec, i, j)
    idt = renderer.ctype(i.dtype)
    names = {i: "ri", j: "rj", k: "rk"}
    names.update((v, var_name(n)) for n, v in enumerate(spec.vars))  # the renderer's names, never the user's
    for n, r in enumerate(batch):
        names[r] = f"rb{n}"
    slot = {g.slot: g for g in spec.globals}
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
        f"  auto ld_a = [&]({idt} ri, {idt} rk) -> unsigned int {{ return {buf[load_a]}[{ia}]; }};",
        f"  auto ld_b = [&]({idt} rk, {idt} rj) -> unsigned int {{ return {buf[load_b]}[{ib}]; }};",
        f"  float acc[{mt}][{nt}][4];",
        f"  for (int m = 0; m < {mt}; m++) for (int n = 0; n < {nt}; n++)",
        "    for (int e = 0; e < 4; e++) acc[m][n][e] = 0.0f;",
        f"  for ({idt} k0 = 0; k0 < {_size(k)}; k0 += {K}) {{",
        f"    unsigned int a[{mt}][4], b[{nt}][2];",
        "    #pragma unroll",
        f"    for (int m = 0; m < {mt}; m++) {{",
        f"      const {idt} r = row0 + m * {M} + g, c = k0 + t * 2;",
        "      a[m][0] = ld_a(r, c) | (ld_a(r, c + 1) << 16);",
        "      a[m][1] = ld_a(r + 8, c) | (ld_a(r + 8, c + 1) << 16);",
        "      a[m][2] = ld_a(r, c + 8) | (ld_a(r, c + 9) << 16);",
        "      a[m][3] = ld_a(r + 8, c + 8) | (ld_a(r + 8, c + 9) << 16);",
        "    }",
        "    #pragma unroll",
        f"    for (int n = 0; n < {nt}; n++) {{",
        f"      const {idt} c = col0 + n * {N} + g, r = k0 + t * 2;",
        "      b[n][0] = ld_b(r, c) | (ld_b(r + 1, c) << 16);",
        "      b[n][1] = ld_b(r + 8, c) | (ld_b(r + 9, c) << 16);",
        "    }",
        "    #pragma unroll",
        f"    for (int m = 0; m < {mt}; m++)",
        "      #pragma unroll",
        f"      for (int n = 0; n < {nt}; n++)",
        '        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, '
        '{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"',
        '                     : "+f"(acc[m][n][0]), "+f"(acc[m][n][1]), "+f"(acc[m][n][2]), "+f"(acc[m][n][3])',
        '                     : "r"(a[m][0]), "r"(a[m][1]), "r"(a[m][2]), "r"(a[m][3]), "r"(b[n][0]), "r"(b[n][1]));',
        "  }",
    ]
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
    prelude = renderer.prelude + (renderer.half_helpers if uses_half else "")
    body = "\n".join(lines)
    return f"{prelude}\n{renderer.kernel_declaration(threads)} {KERNEL_SYMBOL}({', '.join(params)}) {{\n{body}\n}}\n"
