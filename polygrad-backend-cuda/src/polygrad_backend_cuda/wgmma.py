"""Warpgroup tensor-core matmul kernels for sm_90 (wgmma.mma_async, compiled for sm_90a).

Stage: rendering. Input: a ProgramSpec whose opts hold Opt(TC, k, WGMMA_DEPTH) (codegen/gpu_opts.py chose
it for C[.., i, j] = sum_k A[.., i, k] * B[.., k, j] over float16 or bfloat16 on a device declaring
`wgmma_f16` / `wgmma_bf16`: CUDA sm_90 with POLY_CUDA_WGMMA=1). Output: CUDA C and its launch.

One block is one warpgroup (128 threads) owning a BM x BN tile of C (BM = 64, BN from tile_plan), as the
accumulator of `wgmma.mma_async.sync.aligned.m64n{BN}k16.f32.{f16|bf16}` (BN / 2 floats a thread, the PTX
ISA's fragment layout: warp w holds rows 16w + g and 16w + g + 8, columns 8i + 2t and 8i + 2t + 1 of each
8-column piece i, g = lane / 4, t = lane % 4). Both operands are read by the tensor cores from shared
memory through matrix descriptors, K-major (A as BM rows of k, B as BN rows of k, so trans-a = trans-b = 0)
in the 128-byte swizzle: each row holds WGMMA_DEPTH = 64 halves (128 bytes), 8 rows make a 1024-byte
atom, and the 16-byte chunk c of row r lies at chunk c ^ (r % 8) (bits 4-6 of the address XOR bits 7-9:
consecutive rows of one k chunk fall in different banks, no padding). Stages are 1024-byte aligned, so
the descriptor's base offset is 0; the four k16 slices of a stage are its start address plus 32 bytes each.

Loads: STAGES tiles in flight, copied by cp.async in 16-byte chunks where 8 halves lie contiguous and
aligned along k, by 16-byte loads scattered into the K-major layout where they lie contiguous along the
column (B of `x @ W` with W row major), else element by element; rows, columns and k past the matrix
are zeros (any sizes: the edges are guarded, the stores too). Each step: wait for the tile, make the
thread's shared writes visible to the tensor cores' async proxy (fence.proxy.async), barrier, start the
copy of a later tile, wgmma.fence, four wgmma.mma_async, commit, wait for the group.

Not TMA: a tensor map (cuTensorMapEncodeTiled) needs each operand as a dense box of a strided tensor with
its base address known on the host at launch, while these kernels read operands through any index
expression of the IR (broadcasts, transposes, batch offsets), and the launch path passes plain pointers;
the 128-byte tensor map is the driver's opaque format, so nothing about it could be checked without a GPU.
cpu_check.py emulates what is used here (the descriptors, the swizzle, the fragment layout, the fences
and groups), and tests/test_cuda_compile.py compiles it with NVRTC for sm_90a.
"""
from __future__ import annotations

from typing import Any

from polygrad.backend_api import (KERNEL_SYMBOL, WGMMA_DEPTH, LaunchDims, UOp, dtypes, matmul_ranges,
                                  range_coeff, wgmma_dtype)

from polygrad_backend_cuda.tensor_core import CP_ASYNC, index_expr, tile_parts

BM = 64  # rows of one warpgroup's wgmma (m64)
THREADS = 128  # one warpgroup
ROW_BYTES = 128  # one K-major row of a stage: WGMMA_DEPTH halves, the 128-byte swizzle's width
SHARED_BYTES = 48 * 1024  # static shared memory of a block
WIDTHS = (16, 32, 64, 128)  # block columns (the wgmma's n) by matrix width
INSTRUCTIONS = {"half": "f32.f16.f16", "bfloat16": "f32.bf16.bf16"}

# the asm of sm_90a that cpu_check.py swaps for its emulation (WGMMA_CPP); the shared window is one
# 1024-byte aligned array holding every stage
WGMMA_PRELUDE = r"""#define PG_SHARED_WINDOW(name, bytes) __shared__ __align__(1024) unsigned char name[bytes]
__device__ __forceinline__ unsigned int pg_shared_addr(const void* p) {
  return (unsigned int)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void pg_fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
__device__ __forceinline__ void pg_wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void pg_wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N> __device__ __forceinline__ void pg_wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" :: "n"(N) : "memory");
}
template <int N> __device__ __forceinline__ void pg_fence_operands(float* d) {
  #pragma unroll
  for (int i = 0; i < N; i++) asm volatile("" : "+f"(d[i]) :: "memory");
}
"""
# plain C, the same on the GPU and in the CPU check: a shared-memory matrix descriptor of the PTX ISA for a
# K-major operand in the 128-byte swizzle: start address >> 4 in bits 0-13, leading byte offset >> 4 in
# bits 16-29 (unused by swizzled K-major operands whose k16 slice lies within one row: 1), stride byte
# offset >> 4 in bits 32-45 (1024: from one 8-row atom to the next), base offset 0 in bits 49-51, the
# swizzle mode in bits 62-63 (1: 128 bytes)
WGMMA_DESC = r"""__device__ __forceinline__ unsigned long long pg_wgmma_desc(unsigned int addr) {
  return (unsigned long long)((addr & 0x3ffffu) >> 4) | (1ull << 16) | ((unsigned long long)(1024 >> 4) << 32) |
         (1ull << 62);
}
"""


def uses_wgmma(spec: Any) -> bool:
    return any(getattr(o.kind, "value", o.kind) == "TC" and o.amount == WGMMA_DEPTH for o in spec.opts)


def _size(r: UOp) -> int:
    return int(r.src[0].arg)


def tile_plan(spec: Any) -> tuple[str, UOp, UOp, UOp, list[UOp], int, int]:
    """(dtype name, i, j, k, batch ranges, block columns BN, stages)."""
    name = wgmma_dtype(spec.ast)
    if name is None:
        raise NotImplementedError(f"kernel {spec.name} was lowered for wgmma but is not a float16 or bfloat16 "
                                  "matmul")
    i, j, k = matmul_ranges(spec.ast, name)
    cols = _size(j)
    bn = next((w for w in WIDTHS if w >= cols), WIDTHS[-1])
    stages = min(4, SHARED_BYTES // ((BM + bn) * ROW_BYTES))
    end = spec.ast.src[0]
    batch = [r for r in end.src[1:] if r is not i and r is not j]
    return name, i, j, k, batch, bn, stages


def wgmma_launch(spec: Any) -> LaunchDims:
    _, i, j, _, batch, bn, _ = tile_plan(spec)
    z = 1
    for r in batch:
        z *= _size(r)
    return LaunchDims((-(-_size(j) // bn), -(-_size(i) // BM), z), (THREADS, 1, 1), ())


def wgmma_asm(bn: int, name: str) -> list[str]:
    """One wgmma.mma_async m64n{bn}k16 on the accumulators acc[0 .. bn/2) from the descriptors da, db (scale-d
    1: accumulate; A and B as they are, K-major)."""
    regs = bn // 2
    outs = ", ".join(f"%{n}" for n in range(regs))
    text = (f"{{.reg .pred p; setp.ne.b32 p, %{regs + 2}, 0; wgmma.mma_async.sync.aligned.m64n{bn}k16."
            f"{INSTRUCTIONS[name]} {{{outs}}}, %{regs}, %{regs + 1}, p, 1, 1, 0, 0;}}")
    acc = ", ".join(f'"+f"(acc[{n}])' for n in range(regs))
    return [f'        asm volatile("{text}"', f"                     : {acc}",
            '                     : "l"(da), "l"(db), "r"(1));']


def _fill_k_major(tile: str, rows: int, index: str, buf: str, row_end: str, row0: str, depth: int) -> list[str]:
    """Copy rows x 64 halves of an operand (row r: global row row0 + r, columns k0 ..) into the swizzled
    K-major stage at `tile`: a cp.async per 16-byte chunk where its 8 halves lie contiguous and aligned,
    else element by element, zeros past row_end and past k = depth."""
    return [
        f"    for (int c = threadIdx.x; c < {rows * 8}; c += {THREADS}) {{",
        "      const int r = c >> 3, q = c & 7;",
        f"      unsigned short* const dst = (unsigned short*)({tile} + r * {ROW_BYTES} + ((q ^ (r & 7)) << 4));",
        f"      const auto at = {index};",
        f"      const auto row = {row0} + r, kq = k0 + q * 8;",
        f"      bool whole = row < {row_end} && kq + 8 <= {depth};",
        f"      if (whole) whole = (((unsigned long long)({buf} + at(row, kq))) & 15) == 0;",
        "      for (int e = 1; e < 8 && whole; e++) whole = at(row, kq + e) == at(row, kq) + e;",
        f"      if (whole) pg_cp_async16(dst, {buf} + at(row, kq));",
        "      else for (int e = 0; e < 8; e++)",
        f"        dst[e] = row < {row_end} && kq + e < {depth} ? {buf}[at(row, kq + e)] : 0;",
        "    }",
    ]


def _fill_b_rows(bn: int, buf: str, cols: int, depth: int) -> list[str]:
    """B contiguous along its columns (x @ W, W row major): 16-byte loads of 8 columns at one k, each half
    stored into its column's K-major row of the stage (element by element where a load would not be one
    aligned run; zeros past the matrix). Consecutive threads take consecutive k: a warp's 2-byte stores for
    one column then fill 64 bytes of its row (no two in one bank but pairs in one word), where consecutive
    columns would all fall 128 bytes apart, in one bank."""
    per = bn // 8
    return [
        f"    for (int c = threadIdx.x; c < {64 * per}; c += {THREADS}) {{",
        "      const int r = c & 63, q = c >> 6;",
        "      const auto kk = k0 + r, col = bcol + q * 8;",
        "      unsigned short v[8];",
        f"      bool whole = kk < {depth} && col + 8 <= {cols};",
        f"      if (whole) whole = (((unsigned long long)({buf} + ix_b(kk, col))) & 15) == 0;",
        "      for (int e = 1; e < 8 && whole; e++) whole = ix_b(kk, col + e) == ix_b(kk, col) + e;",
        "      if (whole) {",
        f"        const uint4 w = *(const uint4*)({buf} + ix_b(kk, col));",
        "        const unsigned int words[4] = {w.x, w.y, w.z, w.w};",
        "        for (int e = 0; e < 8; e++) v[e] = (unsigned short)(words[e >> 1] >> ((e & 1) * 16));",
        "      } else for (int e = 0; e < 8; e++)",
        f"        v[e] = kk < {depth} && col + e < {cols} ? {buf}[ix_b(kk, col + e)] : 0;",
        "      for (int e = 0; e < 8; e++) {",
        "        const int n = q * 8 + e;",
        f"        *(unsigned short*)(sb + n * {ROW_BYTES} + (((r >> 3) ^ (n & 7)) << 4) + (r & 7) * 2) = v[e];",
        "      }",
        "    }",
    ]


def render_wgmma(spec: Any, renderer: Any) -> str:
    name, i, j, k, batch, bn, stages = tile_plan(spec)
    rows, cols, depth = _size(i), _size(j), _size(k)
    stage_bytes = (BM + bn) * ROW_BYTES
    out_index, casts, load_a, load_b, idt, names, slot = tile_parts(spec, renderer, i, j, k, batch)
    buf_a, buf_b = (f"data{x.src[0].src[0].arg[0]}" for x in (load_a, load_b))
    out_buf = f"data{out_index.src[0].arg[0]}"
    ib = load_b.src[0].src[1]
    b_by_rows = range_coeff(ib, j) == 1 and range_coeff(ib, k) != 1  # B contiguous along j: x @ W
    lines = [
        "  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;",
        f"  const {idt} brow = (({idt})blockIdx.y) * {BM}, bcol = (({idt})blockIdx.x) * {bn};",
        f"  {idt} bz = blockIdx.z;",
    ]
    for n, r in reversed(list(enumerate(batch))):
        lines.append(f"  const {idt} rb{n} = bz % {_size(r)}; bz /= {_size(r)};")
    ia = index_expr(load_a.src[0].src[1], names, renderer)
    ic = index_expr(out_index.src[1], names, renderer)
    lines += [
        f"  auto ix_a = [&]({idt} ri, {idt} rk) -> {idt} {{ return {ia}; }};",
        f"  auto ix_b = [&]({idt} rk, {idt} rj) -> {idt} {{ return {index_expr(ib, names, renderer)}; }};",
        f"  float acc[{bn // 2}];",
        f"  for (int n = 0; n < {bn // 2}; n++) acc[n] = 0.0f;",
        f"  PG_SHARED_WINDOW(pg_smem, {stages * stage_bytes});",
        "  const unsigned int smem0 = pg_shared_addr(pg_smem);",
        f"  auto fill = [&](int s, {idt} k0) {{",
        f"    unsigned char* const sa = pg_smem + s * {stage_bytes};",
        f"    unsigned char* const sb = sa + {BM * ROW_BYTES};",
        *_fill_k_major("sa", BM, f"[&]({idt} m, {idt} kk) -> {idt} {{ return ix_a(m, kk); }}", buf_a, str(rows),
                       "brow", depth),
        *(_fill_b_rows(bn, buf_b, cols, depth) if b_by_rows else
          _fill_k_major("sb", bn, f"[&]({idt} n, {idt} kk) -> {idt} {{ return ix_b(kk, n); }}", buf_b, str(cols),
                        "bcol", depth)),
        "  };",
        f"  const {idt} steps = {-(-depth // WGMMA_DEPTH)};",
        f"  for (int s = 0; s < {stages - 1}; s++) {{",
        f"    if (s < steps) fill(s, s * {WGMMA_DEPTH});",
        "    pg_cp_async_commit();",
        "  }",
        f"  for ({idt} kt = 0; kt < steps; kt++) {{",
        f"    pg_cp_async_wait<{stages - 2}>();  // tile kt has landed (this thread's copies)",
        "    pg_fence_proxy_async();  // this thread's shared writes, visible to the tensor cores",
        "    __syncthreads();  // ... every thread's, and every wgmma of tile kt - 1 is done",
        f"    if (kt + {stages - 1} < steps)",
        f"      fill((kt + {stages - 1}) % {stages}, (kt + {stages - 1}) * {WGMMA_DEPTH});",
        "    pg_cp_async_commit();  // an empty group past the end keeps the wait's count",
        f"    const unsigned int sa = smem0 + (unsigned int)(kt % {stages}) * {stage_bytes};",
        f"    const unsigned int sb = sa + {BM * ROW_BYTES};",
        "    pg_wgmma_fence();",
        "    #pragma unroll",
        f"    for (int kk = 0; kk < {WGMMA_DEPTH // 16}; kk++) {{",
        "      const unsigned long long da = pg_wgmma_desc(sa + kk * 32), db = pg_wgmma_desc(sb + kk * 32);",
        *wgmma_asm(bn, name),
        "    }",
        "    pg_wgmma_commit();",
        "    pg_wgmma_wait<0>();",
        f"    pg_fence_operands<{bn // 2}>(acc);",
        "  }",
    ]
    v = "acc[n]"
    for dt in reversed(casts):
        v = renderer.round_half(dt, v) if dt in (dtypes.float16, dtypes.bfloat16) else f"(({renderer.ctype(dt)}){v})"
    out_dt = slot[out_index.src[0].arg[0]].dtype
    lines += [
        "  #pragma unroll",
        f"  for (int n = 0; n < {bn // 2}; n++) {{  // the accumulator's fragment layout",
        f"    const {idt} ri = brow + warp * 16 + g + ((n >> 1) & 1) * 8, rj = bcol + (n >> 2) * 8 + t * 2 + (n & 1);",
        f"    if (ri < {rows} && rj < {cols}) {out_buf}[{ic}] = {renderer.to_storage(out_dt, v)};",
        "  }",
    ]
    params = [renderer.buffer_param(g.slot, g.dtype, g.written) for g in spec.globals]
    params += [renderer.var_param(n, x.dtype) for n, x in enumerate(spec.vars)]
    uses_half = any(dt in (dtypes.float16, dtypes.bfloat16) for dt in [out_dt, *casts])
    prelude = renderer.prelude + (renderer.half_helpers if uses_half else "") + CP_ASYNC + WGMMA_PRELUDE + WGMMA_DESC
    body = "\n".join(lines)
    return f"{prelude}\n{renderer.kernel_declaration(THREADS)} {KERNEL_SYMBOL}({', '.join(params)}) {{\n{body}\n}}\n"
