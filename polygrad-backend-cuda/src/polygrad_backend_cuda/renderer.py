"""The CUDA dialect of the C-family renderer: kernel IR -> CUDA C (C++ for NVRTC, no headers).

Stage: rendering. Input: a ProgramSpec lowered for CUDA's Capabilities. Output: the source of one
`extern "C" __global__` function named KERNEL_SYMBOL (every identifier is the renderer's own, as in the
C renderer: Variables are `v<k>`), and its launch (grid and block sizes).

- Launch: renderer/launch.py maps GLOBAL ranges to blockIdx and LOCAL/GROUP ranges to threadIdx;
  grouped reductions combine across each warp by `__shfl_xor_sync` butterflies and across a block's
  warps through `__shared__` arrays and `__syncthreads()` (linearize emits them; launch_of asks for
  shuffles with warp=32).
- Vector lanes: NVRTC has no GCC vector extensions, so a vector is `pg_v<T, N>`, a small aligned
  struct with lane-wise operators; contiguous loads and stores of an aligned address are one
  vector access (ld.global.v4 for four floats), other addresses go lane by lane.
- float16 / bfloat16: stored as 16-bit words and computed in float, rounded after every operation
  (the same bits as the CPU and INTERP backends); the conversions are the hardware's cvt
  instructions (bfloat16 from sm_80 on).
- Scatter-adds: an accumulating ADD store into float32/int32 is `atomicAdd` and the kernel spreads
  over the grid (launch_of, Capabilities.atomic_add); float sums then come in no fixed order.
- Tensor cores: a kernel lowered with Opt(TC) is rendered by tensor_core.py (mma.sync), or by wgmma.py
  (warpgroup wgmma.mma_async, sm_90a) where its amount is WGMMA_DEPTH.
- Shared-memory tiles: a float32 matmul or implicit GEMM (a convolution) lowered with Opt(TILE) is rendered
  by tiled_matmul.py.
- No contraction: compiled with --fmad=false, FMA only where the IR says FMA (fmaf; lowering
  contracts sums of products into FMA because Capabilities.fma is set, as on a CPU with FMA).
"""
from __future__ import annotations

from typing import Any

from polygrad.backend_api import (SCALAR_RULES, VECTOR_RULES, CStyleRenderer, L, Ops, ProgramSpec,
                                  dtypes)

from polygrad_backend_cuda.launch import launch_of

CUDA_PRELUDE = r"""#define INFINITY __int_as_float(0x7f800000)
#define NAN __int_as_float(0x7fffffff)
template <class To, class From> __device__ __forceinline__ To pg_bitcast(From x) {
  union { From f; To t; } u; u.f = x; return u.t;
}
"""

VECTOR_PRELUDE = r"""template <class T, int N> struct alignas(sizeof(T) * N < 16 ? sizeof(T) * N : 16) pg_v {
  T v[N];
  __device__ __forceinline__ T& operator[](int i) { return v[i]; }
  __device__ __forceinline__ const T& operator[](int i) const { return v[i]; }
};
#define PG_LANES(expr) _Pragma("unroll") for (int i = 0; i < N; i++) r.v[i] = (expr); return r;
#define PG_BIN(OP) template <class T, int N> __device__ __forceinline__ pg_v<T, N> operator OP( \
  const pg_v<T, N>& a, const pg_v<T, N>& b) { pg_v<T, N> r; PG_LANES((T)(a.v[i] OP b.v[i])) }
#define PG_CMP(OP) template <class T, int N> __device__ __forceinline__ pg_v<int, N> operator OP( \
  const pg_v<T, N>& a, const pg_v<T, N>& b) { pg_v<int, N> r; PG_LANES((a.v[i] OP b.v[i]) ? -1 : 0) }
PG_BIN(+) PG_BIN(-) PG_BIN(*) PG_BIN(/) PG_BIN(%) PG_BIN(&) PG_BIN(|) PG_BIN(^) PG_BIN(<<) PG_BIN(>>)
PG_CMP(<) PG_CMP(>) PG_CMP(!=) PG_CMP(==)
template <class T, int N> __device__ __forceinline__ pg_v<T, N> operator-(const pg_v<T, N>& a) {
  pg_v<T, N> r; PG_LANES((T)(-a.v[i])) }
template <class T, int N> __device__ __forceinline__ pg_v<T, N> operator~(const pg_v<T, N>& a) {
  pg_v<T, N> r; PG_LANES((T)(~a.v[i])) }
template <class To, class T, int N> __device__ __forceinline__ pg_v<To, N> pg_cvt(const pg_v<T, N>& a) {
  pg_v<To, N> r; PG_LANES((To)a.v[i]) }
template <class To, class T, int N> __device__ __forceinline__ pg_v<To, N> pg_vbitcast(const pg_v<T, N>& a) {
  pg_v<To, N> r; PG_LANES(pg_bitcast<To>(a.v[i])) }
template <class M, class T, int N> __device__ __forceinline__ pg_v<T, N> pg_sel(const pg_v<M, N>& m,
  const pg_v<T, N>& a, const pg_v<T, N>& b) { pg_v<T, N> r; PG_LANES(m.v[i] ? a.v[i] : b.v[i]) }
template <class T, int N> __device__ __forceinline__ pg_v<T, N> pg_vload(const T* p) {
  if (((unsigned long long)p) % alignof(pg_v<T, N>) == 0) return *(const pg_v<T, N>*)p;
  pg_v<T, N> r; PG_LANES(p[i]) }
template <class T, int N> __device__ __forceinline__ void pg_vstore(T* p, const pg_v<T, N>& x) {
  if (((unsigned long long)p) % alignof(pg_v<T, N>) == 0) { *(pg_v<T, N>*)p = x; return; }
  _Pragma("unroll") for (int i = 0; i < N; i++) p[i] = x.v[i];
}
"""

HALF_PRELUDE = r"""__device__ __forceinline__ float pg_h2f(unsigned short h) {
  float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f;
}
__device__ __forceinline__ unsigned short pg_f2h(float x) {
  unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x)); return h;
}
__device__ __forceinline__ float pg_b2f(unsigned short h) { return __uint_as_float(((unsigned int)h) << 16); }
__device__ __forceinline__ float pg_rh(float x) { return pg_h2f(pg_f2h(x)); }
__device__ __forceinline__ float pg_rb(float x) { return pg_b2f(pg_f2b(x)); }
"""
# bfloat16 rounding: the cvt instruction from sm_80, the same round-to-nearest-even in integer ops before
BF16_NATIVE = r"""__device__ __forceinline__ unsigned short pg_f2b(float x) {
  unsigned short h; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(x)); return h;
}
"""
BF16_SOFT = r"""__device__ __forceinline__ unsigned short pg_f2b(float x) {
  unsigned int u = __float_as_uint(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
  return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
"""

CUDA_TYPES = dict(CStyleRenderer.types)
CUDA_TYPES[dtypes.bool] = "bool"
LAUNCH_NAMES = {"gidx": "blockIdx", "lidx": "threadIdx"}


def arch_number(arch: str) -> int:
    """"sm_90" -> 90."""
    digits = "".join(c for c in arch if c.isdigit())
    return int(digits) if digits else 0


def block_threads(prog: Any) -> int:
    """Threads per block of a linear program: the product of its lidx launch indices' sizes."""
    threads = 1
    for x in prog.insts:
        if x.op is L.SPECIAL and x.arg[0] == "lidx":
            threads *= x.arg[2]
    return threads


def _bitcast(r: Any, dt: Any, sdt: Any, a: list[str], n: int) -> str:
    """A scalar reinterpretation: pg_bitcast, a union in a device function (C's statement expression is
    not C++)."""
    return r.from_storage(dt, f"pg_bitcast<{r.storage_ctype(dt)}>({r.to_storage(sdt, a[0])})")


def _vector_cast(r: Any, dt: Any, sdt: Any, a: list[str], n: int) -> str:
    """pg_cvt converts lane by lane (bool lanes are int32 masks: -mask is 0 / 1); to bool as in C."""
    if dt is dtypes.bool:
        return VECTOR_RULES[Ops.CAST](r, dt, sdt, a, n)
    src = f"-{a[0]}" if sdt is dtypes.bool else a[0]
    return f"pg_cvt<{r.types[dt]}>({src})"


class CUDARenderer(CStyleRenderer):
    types = CUDA_TYPES
    vector_prelude = VECTOR_PRELUDE  # pg_v<T, N>, for the templates that render whole kernels (tiled_matmul.py)
    restrict = "__restrict__"
    vectorize = True
    # the C rows, except where C++ on pg_v<T, N> differs: no statement expressions, no vector extensions
    scalar_rules = {**SCALAR_RULES, Ops.BITCAST: _bitcast}
    vector_rules = {
        **VECTOR_RULES,
        Ops.WHERE: lambda r, dt, sdt, a, n: r.select(a[0], a[1], a[2], dt, n),  # pg_sel takes any mask width
        Ops.CAST: _vector_cast,
        Ops.BITCAST: lambda r, dt, sdt, a, n: f"pg_vbitcast<{r.types[dt]}>({a[0]})",
    }

    def __init__(self, arch: str = "sm_90"):
        self.arch = arch
        bf16 = BF16_NATIVE if arch_number(arch) >= 80 else BF16_SOFT
        self.half_helpers = bf16 + HALF_PRELUDE
        self.prelude = CUDA_PRELUDE

    def launch(self, spec: ProgramSpec) -> Any:
        return launch_of(spec)

    def render(self, spec: ProgramSpec) -> str:
        from polygrad_backend_cuda.tensor_core import render_tensor_core, uses_tensor_cores
        from polygrad_backend_cuda.tiled_matmul import render_tiled_matmul, uses_tiles
        from polygrad_backend_cuda.wgmma import render_wgmma, uses_wgmma
        if uses_wgmma(spec):
            if arch_number(self.arch) < 90:
                raise NotImplementedError(f"kernel {spec.name} was lowered for wgmma (sm_90), not for {self.arch}: "
                                          "lower it with this device's capabilities")
            return render_wgmma(spec, self)
        if uses_tensor_cores(spec):
            return render_tensor_core(spec, self)
        if uses_tiles(spec):
            return render_tiled_matmul(spec, self)
        src = super().render(spec)
        return src.replace(self.prelude, self.prelude + (VECTOR_PRELUDE if "pg_v<" in src else ""), 1)

    # ---- structure
    def declaration(self, prog: Any) -> str:
        return self.kernel_declaration(block_threads(prog))

    @staticmethod
    def kernel_declaration(threads: int) -> str:
        """What precedes the kernel's name: an unmangled global function for blocks of `threads` threads."""
        return f'extern "C" __global__ void __launch_bounds__({threads})'

    def special(self, x: Any, i: int, lines: list[str], pad: str) -> str:
        kind, dim, _size = x.arg
        if kind not in LAUNCH_NAMES:
            raise NotImplementedError(f"CUDA kernels have no {kind} index (host THREAD axes are a CPU opt)")
        name = f"{kind}_{'xyz'[dim]}"
        lines.append(f"{pad}const {self.ctype(x.dtype)} {name} = {LAUNCH_NAMES[kind]}.{'xyz'[dim]};")
        return name

    def define_local(self, x: Any) -> str:
        return f"__shared__ {self.storage_ctype(x.dtype)} {x.arg[0]}[{x.arg[1]}];"

    def barrier(self) -> str:
        return "__syncthreads();"

    def shuffle(self, value: str, lane_mask: int) -> str:
        return f"__shfl_xor_sync(0xffffffffu, {value}, {lane_mask})"  # the launch's blocks are whole warps

    def atomic_store(self, op: Any, address: str, value: str) -> str:
        if op is not Ops.ADD:
            raise NotImplementedError(f"CUDA kernels have no atomic {op.name} store (launch_of keeps it one thread)")
        return f"atomicAdd({address}, {value});"

    # ---- vector lanes: pg_v<T, N> instead of GCC vector types
    def vector_typedef(self, elem: Any, n: int, name: str) -> str:
        return f"typedef pg_v<{self.types[elem]}, {n}> {name};"

    def mask_of(self, expr: str, size: int, n: int) -> str:
        return f"({expr})"  # comparisons of pg_v already give int32 masks

    def select(self, mask: str, a: str, b: str, dt: Any, n: int) -> str:
        return f"pg_sel({mask}, {a}, {b})"

    def splat(self, dt: Any, n: int, expr: str) -> str:
        return f"{self.vtype(dt, n)}{{{', '.join([expr] * n)}}}"

    def vload(self, x: Any, name: str, n: Any, pad: str) -> list[str]:
        dt, buf, idx = x.dtype, n(x.src[0]), n(x.src[1])
        gate = x.src[2] if len(x.src) > 2 else None
        vt = self.vtype(dt, x.lanes)
        if x.arg == "contiguous" and dt is not dtypes.bool and (gate is None or gate.lanes == 1):
            load = f"pg_vload<{self.types[dt]}, {x.lanes}>({buf} + {idx})"
            if gate is None:
                return [f"{pad}{vt} {name} = {load};"]
            return [f"{pad}{vt} {name} = {{0}};", f"{pad}if ({n(gate)}) {name} = {load};"]
        return [f"{pad}{vt} {name};", f"{pad}{self.lane_load_loop(x, name, n)}"]

    def vstore(self, x: Any, n: Any, pad: str) -> list[str]:
        buf, idx, value = x.src[0], x.src[1], x.src[2]
        gate = x.src[3] if len(x.src) > 3 else None
        dt = buf.dtype
        if x.arg == "contiguous" and gate is None and dt is not dtypes.bool:
            return [f"{pad}pg_vstore<{self.types[dt]}, {x.lanes}>({n(buf)} + {n(idx)}, {n(value)});"]
        return [f"{pad}{self.lane_store_loop(x, n)}"]
