"""Run a rendered CUDA kernel on the CPU (a check for tests, not a backend: no GPU needed).

Stage: testing. Input: a ProgramSpec lowered for CUDA, its CUDA C from CUDARenderer, its LaunchDims,
and NumPy arrays for its buffers (slot order). Output: the arrays the kernel writes, written in place.

The CUDA C is compiled as C++ by clang++ with a shim (SHIM below) in front of it:
- `threadIdx` and `blockIdx` are thread-local values, `blockDim` and `gridDim` globals;
- blocks run one after another; a kernel with `__syncthreads()`, atomics or mma.sync runs each
  thread of a block as its own OS thread and the barrier is a real one across them (a thread that
  never arrives, one that returned early say, is a CheckError after BARRIER_TIMEOUT_S, not a hang);
  other kernels run their threads in a loop;
- `__shared__` arrays are `static`: one copy, shared by the threads of the block that is running;
- the vector type pg_v<T, N> is the renderer's own (plain C++); float16 and bfloat16 conversions are
  integer C++ with the cvt instructions' rounding (to nearest even) instead of the prelude's PTX asm;
- atomicAdd / atomicMax on float and int words are compare-and-swap loops on the host's atomics;
- -ffp-contract=off as NVRTC's --fmad=false: a*b+c is never fused, so float results are the GPU's
  wherever the kernel's order of operations decides them (math functions are the host's libm, not
  CUDA's: transcendentals may differ in the last bits).

What it checks: the launch mapping (grid and block sizes against the indices the kernel reads), index
arithmetic and edge guards, what shared memory holds between barriers (a missing barrier between a
write and another thread's read gives wrong values when the threads interleave, though not always),
the order of accumulation, vector loads and stores, half/bfloat16 rounding, the register packing of
tensor-core kernels: `mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32` (and its .bf16 twin, and
`mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32`: tensor_core.py's one asm statement) becomes a call
that gathers the warp's fragments as the PTX ISA lays them out (MMA_CPP; products exact, summed in
float32 in k order), and cvt.rna.tf32.f32 the integer rounding in TF32_CPP; the staged kernels' cp.async
copies are synchronous memcpy and their waits no-ops (CP_ASYNC_CPP), their barriers real; wgmma.py's sm_90a
kernels (WGMMA_CPP): the shared window and its addresses, matrix descriptors decoded field by field, the
128-byte swizzle, wgmma.mma_async in the accumulator's fragment layout, run when its group is waited for,
and the ordering rules (wgmma.fence, fence.proxy.async after cp.async, commit before wait) as CheckErrors.
`__shfl_xor_sync` (grouped row reductions) is a rendezvous of the warp's lanes named in its mask (one per
warp of the block, real threads as for barriers): each publishes its value and reads its partner's; a mask
that leaves out the calling or source lane, names lanes the block lacks, or differs between lanes is a
CheckError, as it is undefined on a GPU.
What it cannot check: anything else about warps (no warp-synchronous execution beyond the shuffles; no
timing, coalescing, bank conflicts or occupancy), other inline PTX (refused with a CheckError),
device limits (registers, the real shared-memory size: the caller checks the bytes against
Capabilities), races that only show under a GPU's scheduling, and NVRTC's own acceptance of the
source (tests/test_cuda_compile.py compiles every kernel with NVRTC for that).
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from typing import Any

import numpy as np

from polygrad_backend_cuda import renderer as r

BARRIER_TIMEOUT_S = 20

SHIM = r"""#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
struct pg_dim3 { unsigned int x, y, z; };
static thread_local pg_dim3 threadIdx, blockIdx;
static pg_dim3 blockDim, gridDim;
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(n)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define __restrict__ __restrict
struct pg_barrier_timeout {};
static struct {
  pthread_mutex_t m; pthread_cond_t cv; unsigned count, expected, generation;
} pg_barrier = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 1, 0};
static inline void __syncthreads() {
  pthread_mutex_lock(&pg_barrier.m);
  const unsigned gen = pg_barrier.generation;
  if (++pg_barrier.count == pg_barrier.expected) {
    pg_barrier.count = 0;
    pg_barrier.generation++;
    pthread_cond_broadcast(&pg_barrier.cv);
    pthread_mutex_unlock(&pg_barrier.m);
    return;
  }
  struct timespec deadline;
  clock_gettime(CLOCK_REALTIME, &deadline);
  deadline.tv_sec += PG_TIMEOUT_S;
  while (pg_barrier.generation == gen) {
    if (pthread_cond_timedwait(&pg_barrier.cv, &pg_barrier.m, &deadline) == ETIMEDOUT && pg_barrier.generation == gen) {
      pthread_mutex_unlock(&pg_barrier.m);
      throw pg_barrier_timeout();
    }
  }
  pthread_mutex_unlock(&pg_barrier.m);
}
static inline float __int_as_float(int x) { float f; memcpy(&f, &x, 4); return f; }
static inline float __uint_as_float(unsigned int x) { float f; memcpy(&f, &x, 4); return f; }
static inline unsigned int __float_as_uint(float x) { unsigned int u; memcpy(&u, &x, 4); return u; }
static inline int __float_as_int(float x) { int u; memcpy(&u, &x, 4); return u; }
// __shfl_xor_sync: the lanes named in `mask` meet at their warp's rendezvous (one per warp of the block): each
// publishes its value, all wait, each reads lane (lane XOR lane_mask)'s, all wait again (so no value is
// overwritten before it is read). As the CUDA Programming Guide asks, every lane of the mask calls it with the
// same mask and the source lane is in the mask; a lane outside it, a mask naming lanes the block lacks, another
// width than 32, or masks that differ are a pg_shuffle_error (undefined on a GPU), not a value.
struct pg_shuffle_error {};
struct pg_rendezvous { pthread_mutex_t m; pthread_cond_t cv; unsigned count, generation; };
static pg_rendezvous pg_warps[32] = {
#define PG_R {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0}
#define PG_R4 PG_R, PG_R, PG_R, PG_R
  PG_R4, PG_R4, PG_R4, PG_R4, PG_R4, PG_R4, PG_R4, PG_R4};
#undef PG_R4
#undef PG_R
static unsigned long long pg_shfl_vals[1024];
static unsigned pg_shfl_masks[1024];
static void pg_rendezvous_wait(pg_rendezvous* b, unsigned expected) {
  pthread_mutex_lock(&b->m);
  const unsigned gen = b->generation;
  if (++b->count == expected) {
    b->count = 0;
    b->generation++;
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->m);
    return;
  }
  struct timespec deadline;
  clock_gettime(CLOCK_REALTIME, &deadline);
  deadline.tv_sec += PG_TIMEOUT_S;
  while (b->generation == gen) {
    if (pthread_cond_timedwait(&b->cv, &b->m, &deadline) == ETIMEDOUT && b->generation == gen) {
      pthread_mutex_unlock(&b->m);
      throw pg_barrier_timeout();
    }
  }
  pthread_mutex_unlock(&b->m);
}
template <class T> static inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  static_assert(sizeof(T) <= 8, "a shuffle moves 32- or 64-bit words");
  const unsigned tid = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const unsigned lane = tid & 31u, warp0 = tid & ~31u, threads = blockDim.x * blockDim.y * blockDim.z;
  const unsigned present = threads - warp0 >= 32 ? 0xffffffffu : (1u << (threads - warp0)) - 1u;
  const unsigned src = lane ^ ((unsigned)lane_mask & 31u);
  if (width != 32 || (mask & ~present) || !((mask >> lane) & 1u) || !((mask >> src) & 1u)) throw pg_shuffle_error();
  pg_shfl_vals[tid] = 0;
  memcpy(&pg_shfl_vals[tid], &v, sizeof(T));
  pg_shfl_masks[tid] = mask;
  const unsigned expected = (unsigned)__builtin_popcount(mask);
  pg_rendezvous_wait(&pg_warps[tid >> 5], expected);
  bool same = true;
  for (unsigned l = 0; l < 32; l++) if ((mask >> l) & 1u) same = same && pg_shfl_masks[warp0 + l] == mask;
  T out;
  memcpy(&out, &pg_shfl_vals[warp0 + src], sizeof(T));
  pg_rendezvous_wait(&pg_warps[tid >> 5], expected);
  if (!same) throw pg_shuffle_error();
  return out;
}
template <class T> static inline T atomicAdd(T* p, T v) {
  T old, sum;
  __atomic_load(p, &old, __ATOMIC_RELAXED);
  do { sum = old + v; } while (!__atomic_compare_exchange(p, &old, &sum, false, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED));
  return old;
}
template <class T> static inline T atomicMax(T* p, T v) {
  T old;
  __atomic_load(p, &old, __ATOMIC_RELAXED);
  while (!(old >= v) && !__atomic_compare_exchange(p, &old, &v, false, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED)) {}
  return old;
}
"""
HALF_CPP = r"""__device__ __forceinline__ float pg_h2f(unsigned short h) {
  unsigned int sign = ((unsigned int)h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) return __uint_as_float(sign) + (sign ? -1.0f : 1.0f) * (float)m * 5.9604644775390625e-8f;
  if (e == 31) return __uint_as_float(sign | 0x7f800000u | (m << 13));
  return __uint_as_float(sign | ((e + 112u) << 23) | (m << 13));
}
__device__ __forceinline__ unsigned short pg_f2h(float x) {
  unsigned int u = __float_as_uint(x), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7fffu;
  if (a >= 0x477ff000u) return (unsigned short)(sign | 0x7c00u);
  if (a < 0x38800000u) return (unsigned short)(sign | (unsigned int)nearbyintf(__uint_as_float(a) * 16777216.0f));
  unsigned int b = a - 0x38000000u;
  return (unsigned short)(sign | ((b + 0xfffu + ((b >> 13) & 1u)) >> 13));
}
__device__ __forceinline__ float pg_b2f(unsigned short h) { return __uint_as_float(((unsigned int)h) << 16); }
__device__ __forceinline__ float pg_rh(float x) { return pg_h2f(pg_f2h(x)); }
__device__ __forceinline__ float pg_rb(float x) { return pg_b2f(pg_f2b(x)); }
"""
BF16_CPP = r"""__device__ __forceinline__ unsigned short pg_f2b(float x) {
  unsigned int u = __float_as_uint(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fffu;
  return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
"""
# mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 for a whole warp, from the fragment layouts of the PTX
# ISA (warp-level matrix fragments for .f16 mma.m16n8k16): lane = 4 * group + t (group = lane >> 2, t = lane & 3);
# A (16 x 16, row major) in a0..a3: rows group (a0, a2) and group + 8 (a1, a3), columns 2t, 2t + 1, plus 8 for
# a2, a3 (low half first); B (16 x 8, column major) in b0, b1: rows 2t, 2t + 1 (b1: plus 8), column group;
# C and D (16 x 8 float) in c0..c3: row group (c0, c1) or group + 8 (c2, c3), columns 2t, 2t + 1.
# mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 likewise with one TF32 a register: A (16 x 8) in a0..a3:
# rows group (a0, a2) and group + 8 (a1, a3), column t (a0, a1) or t + 4 (a2, a3); B (8 x 8) in b0, b1: row t
# (b1: t + 4), column group. Every lane publishes its registers, all wait, each computes its four outputs,
# all wait again: the barrier is the block's, so the CPU check runs a tensor-core kernel only if all its
# threads issue the same mma sequence.
MMA_CPP = r"""
static struct { unsigned int a[1024][4], b[1024][2]; } pg_mma_regs;
// operand element e of a 32-bit fragment register: KIND 0 float16 and 1 bfloat16 (two a register, low half
// first), 2 tf32 (one a register, its top 19 bits)
template <int KIND> static inline float pg_mma_operand(unsigned int word, unsigned e) {
  if (KIND == 2) return __uint_as_float(word & 0xffffe000u);
  const unsigned short h = (unsigned short)(e ? word >> 16 : word & 0xffffu);
  return KIND ? pg_b2f(h) : pg_h2f(h);
}
// mma.sync m16n8kK (K 16 for f16/bf16, 8 for tf32): every lane publishes its registers, all wait, each computes
// its four outputs, all wait again. Column (A) or row (B) k of a lane's fragment: lane offset (k mod K/2) / per
// (per: elements a register), register k >= K/2, element k mod per.
template <int K, int KIND>
static inline void pg_mma(float& c0, float& c1, float& c2, float& c3, unsigned int a0, unsigned int a1,
                          unsigned int a2, unsigned int a3, unsigned int b0, unsigned int b1) {
  const unsigned per = KIND == 2 ? 1 : 2, half = K / 2;
  const unsigned tid = threadIdx.x, warp0 = tid & ~31u, lane = tid & 31u;
  const unsigned int mine_a[4] = {a0, a1, a2, a3};
  for (int r = 0; r < 4; r++) pg_mma_regs.a[tid][r] = mine_a[r];
  pg_mma_regs.b[tid][0] = b0;
  pg_mma_regs.b[tid][1] = b1;
  __syncthreads();
  float* out[4] = {&c0, &c1, &c2, &c3};
  float result[4];
  for (int e = 0; e < 4; e++) {
    const unsigned row = (lane >> 2) + (e >= 2 ? 8 : 0), col = (lane & 3) * 2 + (e & 1);
    float sum = *out[e];
    for (unsigned k = 0; k < (unsigned)K; k++) {
      const unsigned off = (k % half) / per, high = k >= half ? 1 : 0;
      const unsigned a_lane = warp0 + (row & 7) * 4 + off, a_reg = (row >= 8 ? 1 : 0) + 2 * high;
      const unsigned b_lane = warp0 + col * 4 + off;
      sum += pg_mma_operand<KIND>(pg_mma_regs.a[a_lane][a_reg], k % per) *
             pg_mma_operand<KIND>(pg_mma_regs.b[b_lane][high], k % per);
    }
    result[e] = sum;
  }
  __syncthreads();
  for (int e = 0; e < 4; e++) *out[e] = result[e];
}
"""
# cvt.rna.tf32.f32 on the host: keep 10 mantissa bits, to nearest with ties away from zero (adding half of
# the dropped unit to the magnitude, which carries into the exponent where it must); Inf and NaN as they are
TF32_CPP = r"""static inline unsigned int pg_tf32(float x) {
  const unsigned int u = __float_as_uint(x);
  if ((u & 0x7f800000u) == 0x7f800000u) return u;
  return (u + 0x1000u) & 0xffffe000u;
}
"""
_MMA_ASM = re.compile(r'asm volatile\("mma\.sync\.aligned\.(m16n8k16|m16n8k8)\.row\.col\.f32\.(f16|bf16|tf32)\.'
                      r'(?:f16|bf16|tf32)\.f32 .*?\);', re.S)
_MMA_FUNCTIONS = {("m16n8k16", "f16"): "pg_mma<16, 0>", ("m16n8k16", "bf16"): "pg_mma<16, 1>",
                  ("m16n8k8", "tf32"): "pg_mma<8, 2>"}


def _mma_call(m: re.Match) -> str:
    """The emulated mma for one asm statement: its "+f" accumulators, then its "r" fragment registers."""
    function = _MMA_FUNCTIONS.get((m.group(1), m.group(2)))
    if function is None:
        raise CheckError(f"the CPU check has no emulation of mma.sync {m.group(1)} .{m.group(2)}")
    acc = re.findall(r'"\+f"\(([^)]*)\)', m.group(0))
    regs = re.findall(r'"r"\(([^)]*)\)', m.group(0))
    return f"{function}({', '.join(acc + regs)});"


# wgmma.py's sm_90a instructions on the host, from the PTX ISA (warpgroup-level matrix multiply-accumulate):
# - shared memory is one window (PG_SHARED_WINDOW: the kernel's 1024-aligned array), and a shared address
#   (pg_shared_addr, cvta.to.shared) the offset into it;
# - a matrix descriptor is decoded field by field: start address (bits 0-13, in 16-byte units), stride byte
#   offset (32-45), base offset (49-51), swizzle mode (62-63); K-major operands in the 128-byte swizzle only
#   (others are refused): row r, k of a k16 slice lies at start + (r / 8) * SBO + (r % 8) * 128 + 2k, with
#   bits 4-6 of that address XOR bits 7-9 (the swizzle acts on the address, hence 1024-byte aligned atoms);
# - wgmma.mma_async m64nNk16 .f32 .f16/.bf16 on the issuing thread's accumulators, in the D fragment layout:
#   warp w = (thread % 128) / 32 of the warpgroup, lane = 4g + t; register i is row 16w + g + 8 ((i / 2) % 2),
#   column 8 (i / 4) + 2t + i % 2; products exact, summed in float32 in k order;
# - asynchrony: an mma_async is only recorded; commit_group closes a group; wait_group N runs every group but
#   the newest N, reading shared memory then (a kernel that overwrites a stage, or reads its accumulators,
#   before the wait gets wrong numbers here as on a GPU). Misuse is a CheckError: an mma_async without a
#   wgmma.fence since the thread last waited, an mma reading 16 bytes that a cp.async wrote and its thread has
#   not yet fenced (fence.proxy.async: the generic proxy's writes made visible to the async proxy; plain
#   stores into shared memory are not tracked), an uncommitted mma at a wait, groups never waited for when
#   the thread ends.
WGMMA_CPP = r"""#include <vector>
struct __attribute__((aligned(16))) uint4 { unsigned int x, y, z, w; };
alignas(1024) static unsigned char pg_shared_window[1 << 18];
#define PG_SHARED_WINDOW(name, bytes) unsigned char* const name = pg_shared_window
static inline unsigned int pg_shared_addr(const void* p) {
  return (unsigned int)((const unsigned char*)p - pg_shared_window);
}
struct pg_ptx_misuse {};
static const char* pg_misuse_what = "";
extern "C" const char* pg_misuse_message() { return pg_misuse_what; }
static inline void pg_misuse(const char* what) { pg_misuse_what = what; throw pg_ptx_misuse(); }
// per 16-byte chunk of the window: 1 + the thread whose cp.async wrote it, until that thread's fence.proxy.async
static unsigned short pg_unfenced[sizeof(pg_shared_window) / 16];
static thread_local std::vector<unsigned> pg_unfenced_mine;
static inline void pg_mark_unfenced(const void* dst) {
  const unsigned char* p = (const unsigned char*)dst;
  if (p < pg_shared_window || p >= pg_shared_window + sizeof(pg_shared_window)) return;  // not the window
  const unsigned chunk = (unsigned)(p - pg_shared_window) / 16;
  pg_unfenced[chunk] = (unsigned short)(threadIdx.x + 1);
  pg_unfenced_mine.push_back(chunk);
}
static inline void pg_fence_proxy_async() {
  for (unsigned chunk : pg_unfenced_mine) pg_unfenced[chunk] = 0;
  pg_unfenced_mine.clear();
}
struct pg_wgmma_op { int n, kind, scale_d; float* d[128]; unsigned long long da, db; };
static thread_local bool pg_wgmma_fenced = false;
static thread_local std::vector<pg_wgmma_op> pg_wgmma_issued;
static thread_local std::vector<std::vector<pg_wgmma_op>> pg_wgmma_groups;
static inline void pg_wgmma_fence() { pg_wgmma_fenced = true; }
template <int N> static inline void pg_fence_operands(float*) {}
static inline float pg_wgmma_operand(int kind, unsigned long long desc, unsigned row, unsigned k) {
  const unsigned start = (unsigned)(desc & 0x3fffu) << 4, sbo = (unsigned)((desc >> 32) & 0x3fffu) << 4;
  if ((desc >> 62) != 1 || ((desc >> 49) & 7) != 0)
    pg_misuse("a wgmma descriptor other than K-major, 128-byte swizzle, base offset 0 (not emulated)");
  unsigned addr = start + (row / 8) * sbo + (row % 8) * 128 + k * 2;
  addr ^= ((addr >> 7) & 7) << 4;
  if (addr + 2 > sizeof(pg_shared_window)) pg_misuse("a wgmma operand outside shared memory");
  if (pg_unfenced[addr / 16]) pg_misuse("wgmma.mma_async read cp.async writes not yet fenced by fence.proxy.async");
  unsigned short h;
  memcpy(&h, pg_shared_window + addr, 2);
  return kind ? pg_b2f(h) : pg_h2f(h);
}
static inline void pg_wgmma_run(const pg_wgmma_op& op) {
  const unsigned tid = threadIdx.x, w = (tid % 128) / 32, g = (tid % 32) / 4, t = tid % 4;
  for (int i = 0; i < op.n / 2; i++) {
    const unsigned row = 16 * w + g + 8 * ((i / 2) % 2), col = 8 * (i / 4) + 2 * t + i % 2;
    float sum = op.scale_d ? *op.d[i] : 0.0f;
    for (unsigned k = 0; k < 16; k++)
      sum += pg_wgmma_operand(op.kind, op.da, row, k) * pg_wgmma_operand(op.kind, op.db, col, k);
    *op.d[i] = sum;
  }
}
template <int KIND> static inline void pg_wgmma_issue(int n, float* const* d, unsigned long long da,
                                                      unsigned long long db, int scale_d) {
  if (!pg_wgmma_fenced) pg_misuse("wgmma.mma_async without a wgmma.fence since the accumulators were waited for");
  pg_wgmma_op op;
  op.n = n; op.kind = KIND; op.scale_d = scale_d; op.da = da; op.db = db;
  for (int i = 0; i < n / 2; i++) op.d[i] = d[i];
  pg_wgmma_issued.push_back(op);
}
static inline void pg_wgmma_commit() {
  pg_wgmma_groups.push_back(pg_wgmma_issued);
  pg_wgmma_issued.clear();
}
template <int N> static inline void pg_wgmma_wait() {
  if (!pg_wgmma_issued.empty()) pg_misuse("wgmma.wait_group with a wgmma.mma_async not committed");
  while (pg_wgmma_groups.size() > (size_t)N) {
    for (const pg_wgmma_op& op : pg_wgmma_groups.front()) pg_wgmma_run(op);
    pg_wgmma_groups.erase(pg_wgmma_groups.begin());
  }
  pg_wgmma_fenced = false;
}
static inline void pg_thread_done() {
  pg_fence_proxy_async();
  if (!pg_wgmma_issued.empty() || !pg_wgmma_groups.empty()) pg_misuse("wgmma groups never waited for");
}
"""
_WGMMA_ASM = re.compile(r'asm volatile\("\{\.reg \.pred p; setp\.ne\.b32 p, %\d+, 0; '
                        r'wgmma\.mma_async\.sync\.aligned\.'
                        r'm64n(\d+)k16\.f32\.(f16|bf16)\.(?:f16|bf16) \{[^}]*\}, %\d+, %\d+, p, (-?1), (-?1), ([01]), '
                        r'([01]);\}"(.*?)\);', re.S)


def _wgmma_call(m: re.Match) -> str:
    """The emulated wgmma for one asm statement: pointers to its "+f" accumulators, its "l" descriptors and
    its "r" scale-d."""
    n, kind, scales, trans = int(m.group(1)), m.group(2), m.group(3, 4), m.group(5, 6)
    if scales != ("1", "1") or trans != ("0", "0"):
        raise CheckError(f"the CPU check emulates wgmma with scale-a = scale-b = 1 and K-major operands, not "
                         f"scales {scales} and transposes {trans}")
    acc = re.findall(r'"\+f"\(([^)]*)\)', m.group(7))
    descs = re.findall(r'"l"\(([^)]*)\)', m.group(7))
    (scale_d,) = re.findall(r'"r"\(([^)]*)\)', m.group(7))
    if len(acc) != n // 2 or len(descs) != 2:
        raise CheckError(f"a wgmma m64n{n}k16 with {len(acc)} accumulators and {len(descs)} descriptors")
    pointers = ", ".join(f"&{a}" for a in acc)
    return (f"{{ float* const pg_d[] = {{{pointers}}}; pg_wgmma_issue<{int(kind == 'bf16')}>({n}, pg_d, "
            f"{descs[0]}, {descs[1]}, {scale_d}); }}")


LAUNCHER = r"""
struct pg_task { unsigned bx, by, bz, t; void** bufs; const long long* vars; const unsigned int* dims; int* failed; };
static void pg_thread(pg_task* k) {
  void** bufs = k->bufs;
  const long long* vars = k->vars;
  blockIdx = {k->bx, k->by, k->bz};
  threadIdx = {k->t % k->dims[3], k->t / k->dims[3] % k->dims[4], k->t / (k->dims[3] * k->dims[4])};
  int zero = 0;
  try { PG_CALL; pg_thread_done(); } catch (pg_barrier_timeout&) {
    __atomic_compare_exchange_n(k->failed, &zero, 1, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  } catch (pg_ptx_misuse&) {
    __atomic_compare_exchange_n(k->failed, &zero, 3, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  } catch (pg_shuffle_error&) {
    __atomic_compare_exchange_n(k->failed, &zero, 4, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  }
}
static void* pg_thread_main(void* k) { pg_thread((pg_task*)k); return 0; }
extern "C" int pg_launch(void** bufs, const long long* vars, const unsigned int* dims) {
  gridDim = {dims[0], dims[1], dims[2]};
  blockDim = {dims[3], dims[4], dims[5]};
  const unsigned threads = dims[3] * dims[4] * dims[5];
  int failed = 0;
  pg_task* tasks = (pg_task*)calloc(threads, sizeof(pg_task));
  pthread_t* pool = (pthread_t*)calloc(threads, sizeof(pthread_t));
  for (unsigned bz = 0; bz < dims[2] && !failed; bz++) for (unsigned by = 0; by < dims[1] && !failed; by++)
    for (unsigned bx = 0; bx < dims[0] && !failed; bx++) {
      for (unsigned t = 0; t < threads; t++) tasks[t] = {bx, by, bz, t, bufs, vars, dims, &failed};
      if (!PG_BARRIERS) {
        for (unsigned t = 0; t < threads; t++) pg_thread(&tasks[t]);
        continue;
      }
      pg_barrier.count = 0;
      pg_barrier.expected = threads;
      for (unsigned w = 0; w < 32; w++) pg_warps[w].count = 0;
      for (unsigned t = 0; t < threads; t++)
        if (pthread_create(&pool[t], 0, pg_thread_main, &tasks[t]) != 0) { failed = 2; pool[t] = 0; }
      for (unsigned t = 0; t < threads; t++) if (pool[t]) pthread_join(pool[t], 0);
    }
  free(tasks);
  free(pool);
  return failed;
}
"""


class CheckError(Exception):
    """A kernel the CPU check cannot run (inline PTX), cannot compile, or that hung at a barrier."""


# tensor_core.CP_ASYNC on the host: the copy happens at once, so a thread's own wait has nothing left to
# wait for, and the kernel's __syncthreads() after it orders the other threads' copies as on the GPU.
# (A missing wait before a barrier goes unnoticed here: the copies are never late.) A copy into the shared
# window of a wgmma kernel marks its 16 bytes unseen by the async proxy until the thread's fence.proxy.async
# (WGMMA_CPP).
CP_ASYNC_CPP = r"""static inline void pg_cp_async_copy(void* dst, const void* src) { memcpy(dst, src, 16); }
static inline void pg_cp_async16(void* dst, const void* src) {
  pg_cp_async_copy(dst, src);
  pg_mark_unfenced(dst);
}
static inline void pg_cp_async_commit() {}
template <int N> static inline void pg_cp_async_wait() {}
"""


def cpu_source(spec: Any, source: str) -> str:
    """The CUDA C of `source` as host C++: the shim, the prelude's asm replaced, and pg_launch."""
    from polygrad_backend_cuda.tensor_core import CP_ASYNC, TF32_CVT
    from polygrad_backend_cuda.wgmma import WGMMA_PRELUDE
    for block in (r.HALF_PRELUDE, r.BF16_NATIVE, r.BF16_SOFT, CP_ASYNC, TF32_CVT, WGMMA_PRELUDE):
        source = source.replace(block, "")
    source = _MMA_ASM.sub(_mma_call, source)
    source = _WGMMA_ASM.sub(_wgmma_call, source)
    if "asm" in source:
        raise CheckError(f"kernel {spec.name} has inline PTX other than mma.sync (f16, bf16, tf32), wgmma "
                         "(wgmma.py's) and cvt.rna.tf32: the CPU check cannot run it")
    cpp = r.CUDARenderer("sm_90")
    args = []
    for k, g in enumerate(spec.globals):
        const = "" if g.written else "const "
        args.append(f"({const}{cpp.storage_ctype(g.dtype)}*)bufs[{k}]")
    args += [f"({cpp.ctype(v.dtype)})vars[{k}]" for k, v in enumerate(spec.vars)]
    call = f"pg_kernel({', '.join(args)})"
    # barriers (and the mma emulation's) need one OS thread per CUDA thread; atomics then race for real
    threaded = any(word in source for word in ("__syncthreads", "atomicAdd", "pg_mma<", "pg_wgmma_issue<",
                                               "__shfl_xor_sync"))
    launcher = LAUNCHER.replace("PG_CALL", call).replace("PG_BARRIERS", "1" if threaded else "0")
    shim = SHIM.replace("PG_TIMEOUT_S", str(BARRIER_TIMEOUT_S))
    return "\n".join([shim, BF16_CPP, HALF_CPP, MMA_CPP, TF32_CPP, WGMMA_CPP, CP_ASYNC_CPP, source, launcher])


_LIBS: dict[str, Any] = {}


def compile_cpu(spec: Any, source: str) -> Any:
    """clang++ the kernel (cached by source in a temp folder); the ctypes library with pg_launch."""
    cxx = shutil.which("clang++") or shutil.which("g++")
    if cxx is None:
        raise CheckError("the CPU check needs clang++ or g++ on PATH")
    text = cpu_source(spec, source)
    key = hashlib.sha256(text.encode()).hexdigest()[:24]
    if key in _LIBS:
        return _LIBS[key]
    folder = os.path.join(tempfile.gettempdir(), f"polygrad-cuda-cpu-{os.getuid()}")
    os.makedirs(folder, exist_ok=True)
    lib_path = os.path.join(folder, f"{key}.so")
    if not os.path.exists(lib_path):
        src_path = os.path.join(folder, f"{key}.cpp")
        with open(src_path, "w") as f:
            f.write(text)
        tmp = f"{lib_path}.{os.getpid()}"
        cmd = [cxx, "-std=c++14", "-O1", "-ffp-contract=off", "-fno-fast-math", "-shared", "-fPIC", "-pthread",
               "-w", src_path, "-o", tmp]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise CheckError(f"kernel {spec.name} does not compile as C++ ({src_path}):\n{proc.stderr[:3000]}")
        os.replace(tmp, lib_path)
    lib = ctypes.CDLL(lib_path)
    lib.pg_launch.restype = ctypes.c_int
    _LIBS[key] = lib
    return lib


def run_on_cpu(spec: Any, source: str, launch: Any, buffers: list[np.ndarray], var_vals: tuple[int, ...] = ()) -> None:
    """Launch the kernel over launch.grid x launch.block on the CPU; buffers (C-contiguous, slot order,
    float16 / bfloat16 as their 16-bit words) are read and written in place."""
    if len(buffers) != len(spec.globals):
        raise CheckError(f"kernel {spec.name} takes {len(spec.globals)} buffers, got {len(buffers)}")
    for g, b in zip(spec.globals, buffers):
        if not b.flags.c_contiguous or b.size < spec.eval_int(g.size, var_vals):
            raise CheckError(f"buffer {g.slot} of {spec.name}: pass a C-contiguous array of at least "
                             f"{spec.eval_int(g.size, var_vals)} elements")
    lib = compile_cpu(spec, source)
    ptrs = (ctypes.c_void_p * max(1, len(buffers)))(*[b.ctypes.data for b in buffers])
    vars_ = (ctypes.c_longlong * max(1, len(var_vals)))(*var_vals)
    dims = (ctypes.c_uint * 6)(*launch.grid, *launch.block)
    status = lib.pg_launch(ptrs, vars_, dims)
    if status == 2:
        raise CheckError(f"kernel {spec.name}: could not start {launch.threads} threads for a block (ulimit -u?)")
    if status == 3:
        lib.pg_misuse_message.restype = ctypes.c_char_p
        message = lib.pg_misuse_message().decode()
        raise CheckError(f"kernel {spec.name} misuses wgmma: {message}")
    if status == 4:
        raise CheckError(f"kernel {spec.name}: a __shfl_xor_sync whose lanes disagree on the mask, or whose mask "
                         "leaves out the calling or the source lane or names lanes the block lacks (undefined in CUDA)")
    if status != 0:
        raise CheckError(f"kernel {spec.name}: a block's threads did not all reach __syncthreads() (or a warp's lanes "
                         f"a __shfl_xor_sync) within {BARRIER_TIMEOUT_S} s (a thread returned early, or a barrier is "
                         "under a condition)")
