"""Compile many rendered kernels at once (the compile-only check that runs without a GPU).

Stage: compiling, for tests and CI. Input: CUDA C sources from CUDARenderer. Output: nothing, or a
CompileError naming the first kernel that does not compile. Kernels are joined into translation
units of `batch` kernels (the shared prelude once, each kernel renamed k<i>), so NVRTC starts once
per batch instead of once per kernel; a failing batch is compiled kernel by kernel to name the culprit.
"""
from __future__ import annotations

import re

from polygrad.backend_api import CompileError

from polygrad_backend_cuda import renderer as r
from polygrad_backend_cuda.tensor_core import CP_ASYNC, TF32_CVT
from polygrad_backend_cuda.wgmma import WGMMA_DESC, WGMMA_PRELUDE

PRELUDE_BLOCKS = (r.CUDA_PRELUDE, r.VECTOR_PRELUDE, r.BF16_NATIVE, r.BF16_SOFT, r.HALF_PRELUDE, CP_ASYNC, TF32_CVT,
                  WGMMA_PRELUDE, WGMMA_DESC)
_SIGNATURE = re.compile(r'(extern "C" __global__ void __launch_bounds__\(\d+\) )(\w+)\(')
# a helper the renderer emits beside a kernel that uses it (cstyle's pg_fma_f32x4, pg_dot4_...): one
# definition per translation unit
_HELPER = re.compile(r"static inline [^\n]*? (pg_\w+)\([^\n]*\{\n.*?\n\}\n", re.S)


def kernel_part(src: str) -> str:
    """A rendered kernel without the shared prelude blocks (typedefs stay: C++ allows repeating them)."""
    for block in PRELUDE_BLOCKS:
        src = src.replace(block, "")
    return src


def batch_source(sources: list[str], arch: str) -> str:
    """One translation unit holding every kernel of `sources`, renamed k0, k1, ..."""
    bf16 = r.BF16_NATIVE if r.arch_number(arch) >= 80 else r.BF16_SOFT
    parts = [r.CUDA_PRELUDE, r.VECTOR_PRELUDE, bf16, r.HALF_PRELUDE]
    if r.arch_number(arch) >= 80:  # cp.async and cvt.rna.tf32: tensor-core kernels, only sm_80 and newer get
        parts += [CP_ASYNC, TF32_CVT]
    if any("wgmma." in src for src in sources):  # wgmma kernels: sm_90 only, compiled for sm_90a (compile_arch)
        parts += [WGMMA_PRELUDE, WGMMA_DESC]
    helpers: set[str] = set()

    def once(m: re.Match) -> str:
        if m.group(1) in helpers:
            return ""
        helpers.add(m.group(1))
        return m.group(0)

    for i, src in enumerate(sources):
        part = _HELPER.sub(once, kernel_part(src))
        parts.append(_SIGNATURE.sub(lambda m, i=i: f"{m.group(1)}k{i}(", part, count=1))
    return "\n".join(parts)


def compile_all(sources: list[str], arch: str, compile_fn, batch: int = 80) -> int:
    """Compile every source for `arch` with compile_fn(source, arch); returns the batches compiled."""
    batches = 0
    for start in range(0, len(sources), batch):
        chunk = sources[start:start + batch]
        batches += 1
        try:
            compile_fn(batch_source(chunk, arch), arch)
        except CompileError:
            for src in chunk:  # name the kernel that fails on its own
                compile_fn(src, arch)
            raise
    return batches
