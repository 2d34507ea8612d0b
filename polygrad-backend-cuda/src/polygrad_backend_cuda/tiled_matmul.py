"""Shared-memory tiled float32 matmuls and convolutions: a kernel lowered with Opt(TILE) rendered as a block-tile
template.

Stage: rendering. Input: a ProgramSpec whose opts hold Opt(TILE, k, block rows) (codegen/gpu_opts.py
chose it, and the tile, from Capabilities.shared_memory_bytes for C[.., i, j] = f(sum_k A[.., i, k] *
B[.., k, j]) over float32 A and B, f elementwise). Output: CUDA C and its launch: one block of MatmulTile.threads
threads per bm x bn tile of C, batch ranges on grid z.

- Staging: each bk-deep step, every thread loads 4 elements of A and 4 of B from global memory into
  registers, then into shared memory (As[k][i], Bs[k][j]); two shared buffers, so the loads of step
  t + 1 are issued before step t's arithmetic and stored after it, with one __syncthreads() a step.
- Loads run along the operand's contiguous range (index coefficient 1: k for a row-major A, i for a
  transposed one; j or k for B) and are one 16-byte vector load when all 4 are in bounds and the
  address is aligned (pg_vload checks at run time); other layouts load element by element.
- Register tile: each thread keeps tm x tn sums and reads tm values of A and tn of B from shared
  memory per k; products are summed in k order with the IR's step (fmaf where lowering contracted
  the sum, Capabilities.fma; else a multiply and an add, --fmad=false), so every output is the
  scalar kernel's float sum, bit for bit.
- Edges: any sizes. Elements past M, N or K load as 0 and outputs past M or N are not stored.
- Epilogue: what the kernel does to the sum before storing it (a bias, an activation, a mask, a
  cast: gpu_opts.matmul_with_epilogue) is computed per output with the renderer's scalar rules.
- Implicit GEMMs: a kernel lowered with Opt(TILE) that is not a plain matmul (a convolution forward,
  input or weight gradient: gpu_opts.implicit_gemm, its rows, columns and reduce each made of several
  ranges, its loads gated) runs on the same tiles and inner loop; each thread gathers its operand points
  one by one (_gather_loads: one tile row a thread, its ranges decomposed once; the reduce point
  decomposed per element), the load's gate (the padding) and the edges evaluated there, 0 outside, and
  the output point decomposed from its flat row and column before the epilogue.
Shared rows are padded by MatmulTile.pad floats (16-byte aligned rows for vector reads); a thread's
register tile is made of runs of 4 rows (columns) spread over the block tile (_owned).
"""
from __future__ import annotations

from typing import Any

from polygrad.backend_api import (KERNEL_SYMBOL, MATMUL_TILES, GemmShape, LaunchDims, MatmulTile, Ops, UOp,
                                  implicit_gemm, matmul_with_epilogue, range_coeff, var_name)

from polygrad_backend_cuda.tensor_core import index_expr

LANES = 4  # elements of A and of B each thread loads per stage (one float4)


def uses_tiles(spec: Any) -> bool:
    """Lowered with Opt(TILE), and still a matmul or implicit GEMM after lowering's later passes (the
    opt is chosen before transcendentals are decomposed); otherwise the generic renderer and launch take it."""
    if not any(getattr(o.kind, "value", o.kind) == "TILE" for o in spec.opts):
        return False
    return matmul_with_epilogue(spec.ast) is not None or implicit_gemm(spec.ast) is not None


def _size(r: UOp) -> int:
    return int(r.src[0].arg)


def tile_plan(spec: Any) -> tuple[UOp, UOp, UOp, UOp, list[UOp], MatmulTile]:
    """(i, j, k, the REDUCE, batch ranges, the tile) of a kernel lowered with Opt(TILE)."""
    shape = matmul_with_epilogue(spec.ast)
    amount = next(o.amount for o in spec.opts if getattr(o.kind, "value", o.kind) == "TILE")
    if shape is None or amount not in MATMUL_TILES:
        raise NotImplementedError(f"kernel {spec.name} was lowered with Opt(TILE, amount={amount}) but is not a "
                                  f"float32 matmul with one of the tiles {sorted(MATMUL_TILES)}")
    i, j, k, reduce = shape
    end = spec.ast.src[0]
    batch = [r for r in end.src[1:] if r is not i and r is not j]
    return i, j, k, reduce, batch, MATMUL_TILES[amount]


def gemm_plan(spec: Any) -> tuple[GemmShape, MatmulTile]:
    """The implicit GEMM (gpu_opts.implicit_gemm) and the tile of a kernel lowered with Opt(TILE) that
    is not a plain matmul (a convolution)."""
    shape = implicit_gemm(spec.ast)
    amount = next(o.amount for o in spec.opts if getattr(o.kind, "value", o.kind) == "TILE")
    if shape is None or amount not in MATMUL_TILES:
        raise NotImplementedError(f"kernel {spec.name} was lowered with Opt(TILE, amount={amount}) but is not a "
                                  f"float32 implicit GEMM with one of the tiles {sorted(MATMUL_TILES)}")
    return shape, MATMUL_TILES[amount]


def _prod(ranges: tuple[UOp, ...] | list[UOp]) -> int:
    n = 1
    for r in ranges:
        n *= _size(r)
    return n


def tiled_launch(spec: Any) -> LaunchDims:
    if matmul_with_epilogue(spec.ast) is None:
        g, tile = gemm_plan(spec)
        rows, cols, batch = _prod(g.rows), _prod(g.cols), g.batch
    else:
        i, j, _, _, batch, tile = tile_plan(spec)
        rows, cols = _size(i), _size(j)
    return LaunchDims((-(-cols // tile.bn), -(-rows // tile.bm), _prod(batch)), (tile.threads, 1, 1), ())


def _operands(reduce: UOp, j: UOp) -> tuple[UOp, UOp]:
    """The LOAD nodes of A (no j in its index) and B: the sources of the product the REDUCE sums
    (tile_plan checked the shape: no casts between them)."""
    a, b = reduce.src[0].src
    if range_coeff(a.src[0].src[1], j) != 0:
        a, b = b, a
    return a, b


def _stage_loads(name: str, load: UOp, outer: UOp, k: UOp, outer_size: str, tile_outer: int, bk: int,
                 buf: str, index: str, idt: str) -> list[str]:
    """Lines defining ld_<name>(outer0, k0) (4 elements into r<name>[]) and st_<name>(stage) (into
    shared memory) for operand `name` ("a": outer is i; "b": outer is j), along its contiguous range."""
    along_outer = range_coeff(load.src[0].src[1], outer) == 1 and range_coeff(load.src[0].src[1], k) != 1
    contiguous = along_outer or range_coeff(load.src[0].src[1], k) == 1
    per_row = (tile_outer if along_outer else bk) // LANES
    # thread t loads 4 elements starting at (o, c) of the tile: along o (outer) or along c (k)
    o_first = f"(threadIdx.x % {per_row}) * {LANES}" if along_outer else f"threadIdx.x / {per_row}"
    c_first = f"threadIdx.x / {per_row}" if along_outer else f"(threadIdx.x % {per_row}) * {LANES}"
    o_lane, c_lane = ("e", "0") if along_outer else ("0", "e")
    last_ok = (f"o + {LANES - 1} < {outer_size} && c < {_size(k)}" if along_outer
               else f"o < {outer_size} && c + {LANES - 1} < {_size(k)}")
    ro, rk = ("ri", "rk") if name == "a" else ("rj", "rk")
    smem = "As" if name == "a" else "Bs"
    lines = [
        f"  const int {name}_o = {o_first}, {name}_c = {c_first};",
        f"  auto ld_{name} = [&]({idt} o0, {idt} k0) {{",
        f"    const {idt} o = o0 + {name}_o, c = k0 + {name}_c;",
    ]
    if contiguous:
        lines += [
            f"    if ({last_ok}) {{",
            f"      const {idt} {ro} = o, {rk} = c;",
            f"      pg_v<float, {LANES}> v = pg_vload<float, {LANES}>({buf} + ({index}));",
            f"      for (int e = 0; e < {LANES}; e++) r{name}[e] = v[e];",
            "      return;",
            "    }",
        ]
    lines += [
        f"    for (int e = 0; e < {LANES}; e++) {{",
        f"      const {idt} {ro} = o + {o_lane}, {rk} = c + {c_lane};",
        f"      r{name}[e] = ({ro} < {outer_size} && {rk} < {_size(k)}) ? {buf}[{index}] : 0.0f;",
        "    }",
        "  };",
        f"  auto st_{name} = [&](int s) {{",
        f"    for (int e = 0; e < {LANES}; e++) {smem}[s][{name}_c + {c_lane}][{name}_o + {o_lane}] = r{name}[e];",
        "  };",
    ]
    return lines


def unflatten(flat: str, ranges: tuple[UOp, ...], names: dict[UOp, str], idt: str, pad: str) -> list[str]:
    """Statements defining each range's name (names[r]) from `flat`, their row-major flat index (the
    last range innermost)."""
    lines, inner = [], 1
    for n, r in reversed(list(enumerate(ranges))):
        value = flat if inner == 1 else f"{flat} / {inner}"
        if n:
            value = f"{value} % {_size(r)}"
        lines.append(f"{pad}const {idt} {names[r]} = {value};")
        inner *= _size(r)
    return lines


def _gather_loads(name: str, load: UOp, outer: tuple[UOp, ...], reduce: tuple[UOp, ...], tile_outer: int,
                  t: MatmulTile, origin: str, names: dict[UOp, str], renderer: Any, idt: str) -> list[str]:
    """Lines defining ld_<name>(o0, k0) and st_<name>(stage) for an operand of an implicit GEMM: each
    thread keeps one tile row (`outer`'s ranges, decomposed once) and gathers LANES reduce points of
    it, threads / tile_outer apart (consecutive threads: consecutive rows), each from its own address;
    the load's gate (a convolution's padding) and the edges are evaluated here, a point outside them
    is stored as 0, so the inner loop reads shared memory only."""
    across = t.threads // tile_outer
    assert t.threads % tile_outer == 0 and across * LANES == t.bk, (t, tile_outer)
    own = dict(names)
    own.update((r, f"{name}_o{n}") for n, r in enumerate(outer))
    own.update((r, f"{name}_k{n}") for n, r in enumerate(reduce))
    index = load.src[0]
    addr = index_expr(index.src[1], own, renderer)
    guard = f"{name}_m < {_prod(outer)} && kf < {_prod(reduce)}"
    if len(index.src) > 2:
        guard += f" && ({index_expr(index.src[2], own, renderer)})"
    smem = "As" if name == "a" else "Bs"
    return [
        f"  const int {name}_r = threadIdx.x % {tile_outer}, {name}_c = threadIdx.x / {tile_outer};",
        f"  const {idt} {name}_m = {origin} + {name}_r;",
        *unflatten(f"{name}_m", outer, own, idt, "  "),
        f"  auto ld_{name} = [&]({idt} o0, {idt} k0) {{",
        f"    for (int e = 0; e < {LANES}; e++) {{",
        f"      const {idt} kf = k0 + {name}_c + e * {across};",
        *unflatten("kf", reduce, own, idt, "      "),
        f"      r{name}[e] = ({guard}) ? data{index.src[0].arg[0]}[{addr}] : 0.0f;",
        "    }",
        "  };",
        f"  auto st_{name} = [&](int s) {{",
        f"    for (int e = 0; e < {LANES}; e++) {smem}[s][{name}_c + e * {across}][{name}_r] = r{name}[e];",
        "  };",
    ]


def _owned(e: str, thread: str, side: int, per_thread: int) -> str:
    """The tile row (column) of a thread's e-th register-tile row (column): runs of 4 consecutive
    ones, the runs side * 4 / per_thread apart, so the 16-byte shared reads of neighbouring threads
    are neighbours (no bank conflicts for 8 x 8 register tiles, whose rows would be 32 bytes apart)."""
    if per_thread == 4:
        return f"{thread} * 4 + {e}"
    return f"({e} / 4) * {side * 4 // per_thread} + {thread} * 4 + {e} % 4"


def epilogue_lines(value: UOp, reduce: UOp, names: dict[UOp, str], renderer: Any, pad: str) -> tuple[list[str], str]:
    """Statements computing the stored value from the sum `acc[m][n]` (the REDUCE), one constant per
    node (sources first, shared nodes once), with the renderer's own scalar rules and half rounding,
    as the scalar kernel computes them; and the name of the value."""
    text: dict[UOp, str] = {reduce: "acc[m][n]"}
    text.update(names)
    order, stack = [], [(value, False)]
    while stack:  # sources first, without entering the sum or a load's index
        n, ready = stack.pop()
        if n in text and not ready:
            continue
        if ready or n.op in (Ops.LOAD, Ops.CONST) or n is reduce:
            if n not in text:
                order.append(n)
                text[n] = ""
            continue
        stack.append((n, True))
        stack.extend((s, False) for s in n.src if s not in text)
    lines = []
    for e, n in enumerate(order):
        if n.op is Ops.CONST:
            text[n] = renderer.literal(n)
            continue
        if n.op is Ops.LOAD:
            index = index_expr(n.src[0].src[1], names, renderer)
            expr = renderer.from_storage(n.dtype, f"data{n.src[0].src[0].arg[0]}[{index}]")
        elif n.op in (Ops.IDIV, Ops.MOD) and n.dtype.kind == "int" and n.dtype.itemsize >= 4:
            expr = renderer.wrapping_division(n.op, n.dtype, [text[s] for s in n.src])  # as the scalar path
        else:
            expr = renderer.alu(n.op, n.dtype, n.src[0].dtype, [text[s] for s in n.src])
            if n.op not in (Ops.CAST, Ops.BITCAST):
                expr = renderer.round_half(n.dtype, expr)
        lines.append(f"{pad}const {renderer.ctype(n.dtype)} e{e} = {expr};")
        text[n] = f"e{e}"
    return lines, text[value]


def render_tiled_matmul(spec: Any, renderer: Any) -> str:
    """A plain matmul (matmul_with_epilogue) loads its operands along their contiguous ranges
    (_stage_loads); any other implicit GEMM (a convolution) gathers them point by point (_gather_loads)."""
    end = spec.ast.src[0]
    store = end.src[0]
    out_index, value = store.src[0], store.src[1]
    names: dict[UOp, str] = {}
    names.update((v, var_name(n)) for n, v in enumerate(spec.vars))  # the renderer's names, never the user's
    gemm = matmul_with_epilogue(spec.ast) is None
    if gemm:
        g, t = gemm_plan(spec)
        reduce, batch = g.sum, list(g.batch)
        rows, cols = _prod(g.rows), _prod(g.cols)
        idt = renderer.ctype(g.rows[0].dtype)
        names.update((r, f"ri{n}") for n, r in enumerate(g.rows))
        names.update((r, f"rj{n}") for n, r in enumerate(g.cols))
    else:
        i, j, k, reduce, batch, t = tile_plan(spec)
        load_a, load_b = _operands(reduce, j)
        idt = renderer.ctype(i.dtype)
        names.update({i: "ri", j: "rj", k: "rk"})
        rows, cols = _size(i), _size(j)
    for n, r in enumerate(batch):
        names[r] = f"rb{n}"
    out_buf = f"data{out_index.src[0].arg[0]}"
    ic = index_expr(out_index.src[1], names, renderer)
    tx = t.bn // t.tn
    # the IR's step: a fused multiply-add where lowering contracted the sum (caps.fma), else two roundings
    step = "fmaf(a[m], b[n], acc[m][n])" if reduce.arg is Ops.FMA else "acc[m][n] + a[m] * b[n]"
    lines = [
        f"  alignas(16) __shared__ float As[2][{t.bk}][{t.bm + t.pad}];",
        f"  alignas(16) __shared__ float Bs[2][{t.bk}][{t.bn + t.pad}];",
        f"  const int tx = threadIdx.x % {tx}, ty = threadIdx.x / {tx};",
        f"  const {idt} row0 = (({idt})blockIdx.y) * {t.bm}, col0 = (({idt})blockIdx.x) * {t.bn};",
    ]
    if batch:
        lines.append(f"  {idt} bz = blockIdx.z;")
    for n, r in reversed(list(enumerate(batch))):
        lines.append(f"  const {idt} rb{n} = bz % {_size(r)}; bz /= {_size(r)};")
    lines += [f"  float ra[{LANES}], rb[{LANES}];"]
    if gemm:
        lines += _gather_loads("a", g.a, g.rows, g.reduce, t.bm, t, "row0", names, renderer, idt)
        lines += _gather_loads("b", g.b, g.cols, g.reduce, t.bn, t, "col0", names, renderer, idt)
        steps = -(-_prod(g.reduce) // t.bk)
    else:
        buf_a, buf_b = (f"data{x.src[0].src[0].arg[0]}" for x in (load_a, load_b))
        ia = index_expr(load_a.src[0].src[1], names, renderer)
        ib = index_expr(load_b.src[0].src[1], names, renderer)
        lines += _stage_loads("a", load_a, i, k, str(rows), t.bm, t.bk, buf_a, ia, idt)
        lines += _stage_loads("b", load_b, j, k, str(cols), t.bn, t.bk, buf_b, ib, idt)
        steps = -(-_size(k) // t.bk)
    lines += [
        f"  float acc[{t.tm}][{t.tn}];",
        f"  for (int m = 0; m < {t.tm}; m++) for (int n = 0; n < {t.tn}; n++) acc[m][n] = 0.0f;",
        "  ld_a(row0, 0); ld_b(col0, 0); st_a(0); st_b(0);",
        "  __syncthreads();",
        f"  const int steps = {steps};",
        "  for (int step = 0; step < steps; step++) {",
        "    const int s = step & 1;",
        f"    if (step + 1 < steps) {{ ld_a(row0, (step + 1) * {t.bk}); ld_b(col0, (step + 1) * {t.bk}); }}",
        "    #pragma unroll",
        f"    for (int kk = 0; kk < {t.bk}; kk++) {{",
        f"      float a[{t.tm}], b[{t.tn}];",
        f"      for (int m = 0; m < {t.tm}; m++) a[m] = As[s][kk][{_owned('m', 'ty', t.bm, t.tm)}];",
        f"      for (int n = 0; n < {t.tn}; n++) b[n] = Bs[s][kk][{_owned('n', 'tx', t.bn, t.tn)}];",
        "      #pragma unroll",
        f"      for (int m = 0; m < {t.tm}; m++)",
        "        #pragma unroll",
        f"        for (int n = 0; n < {t.tn}; n++) acc[m][n] = {step};",
        "    }",
        "    if (step + 1 < steps) { st_a(s ^ 1); st_b(s ^ 1); }",
        "    __syncthreads();",
        "  }",
    ]
    slot = {g.slot: g for g in spec.globals}
    out_dt = slot[out_index.src[0].arg[0]].dtype
    epilogue, v = epilogue_lines(value, reduce, names, renderer, "      ")
    pad = "      "
    split = unflatten("ri", g.rows, names, idt, pad) + unflatten("rj", g.cols, names, idt, pad) if gemm else []
    lines += [
        f"  for (int m = 0; m < {t.tm}; m++) for (int n = 0; n < {t.tn}; n++) {{",
        f"    const {idt} ri = row0 + {_owned('m', 'ty', t.bm, t.tm)}, rj = col0 + {_owned('n', 'tx', t.bn, t.tn)};",
        f"    if (ri < {rows} && rj < {cols}) {{",
        *split,
        *epilogue,
        f"      {out_buf}[{ic}] = {renderer.to_storage(out_dt, v)};",
        "    }",
        "  }",
    ]
    params = [renderer.buffer_param(g.slot, g.dtype, g.written) for g in spec.globals]
    params += [renderer.var_param(n, x.dtype) for n, x in enumerate(spec.vars)]
    body = "\n".join(lines)
    uses_half = any(f"pg_{h}" in body for h in ("f2h", "h2f", "f2b", "b2f", "rh", "rb"))
    prelude = renderer.prelude + renderer.vector_prelude + (renderer.half_helpers if uses_half else "")
    declaration = renderer.kernel_declaration(t.threads)
    return f"{prelude}\n{declaration} {KERNEL_SYMBOL}({', '.join(params)}) {{\n{body}\n}}\n"
