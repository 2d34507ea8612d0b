"""Warpgroup tensor cores of the CUDA backend (wgmma.py, opt-in POLY_CUDA_WGMMA=1 on sm_90), checked without a
GPU: the kernels run on the CPU by cpu_check (wgmma's descriptors, 128-byte swizzle, accumulator layout, fences
and groups emulated from the PTX ISA) against NumPy on odd sizes, and compile with NVRTC for sm_90a; the
default and sm_80 stay on mma.sync.
"""
from __future__ import annotations

import numpy as np
import pytest

from polygrad import Context, Tensor, dtypes
from polygrad.codegen.opts import OptKind

cuda = pytest.importorskip("polygrad_backend_cuda")
from polygrad_backend_cuda import capabilities, cpu_check  # noqa: E402
from polygrad_backend_cuda.compiler import compile_arch  # noqa: E402
from test_cuda_cpu_check import cuda_kernels, on_interp, run  # noqa: E402
from test_cuda_cpu_check import pytestmark as needs_cxx  # noqa: E402

rng = np.random.default_rng(90)
WGMMA = capabilities("sm_90", wgmma=True)


def bf16_words(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 words, to nearest even (the values the kernels read)."""
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_values(w: np.ndarray) -> np.ndarray:
    return (w.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def wgmma_kernel(fn):
    (k,) = cuda_kernels(fn, "sm_90", WGMMA)
    assert any(o.kind is OptKind.TC and o.amount == 64 for o in k[0].opts)
    assert "wgmma.mma_async.sync.aligned.m64n" in k[1] and "__cvta_generic_to_shared" in k[1]
    return k


@needs_cxx
@pytest.mark.parametrize("m, k, n, b_layout", [(17, 33, 17, "rows"), (70, 90, 40, "cols"), (64, 128, 130, "rows"),
                                               (100, 17, 24, "cols"), (16, 200, 136, "rows")])
def test_float16_matmul_odd_sizes_against_numpy(m, k, n, b_layout):
    """C = A @ B of float16 with B row major (x @ W: 16-byte loads scattered into the K-major stage) or stored
    transposed (x @ W.T: cp.async straight into it), sizes no tile divides (guards on rows, columns and k),
    against NumPy's float64 product of the same halves rounded to float16 (products exact, sums float32)."""
    a = rng.standard_normal((m, k)).astype(np.float16)
    b = rng.standard_normal((k, n)).astype(np.float16)
    ta = on_interp(a)
    if b_layout == "rows":
        tb, b_in = on_interp(b), b
    else:
        b_in = np.ascontiguousarray(b.T)
        tb = on_interp(b_in).T
    kern = wgmma_kernel(lambda: (ta @ tb).realize())
    (got,) = run(kern, a, b_in)
    want = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(got.reshape(m, n).astype(np.float64), want.astype(np.float16).astype(np.float64),
                               rtol=2e-3, atol=2e-3)


@needs_cxx
def test_bfloat16_batched_with_a_cast_output():
    """bfloat16 operands, a batch on grid z, the bfloat16 product cast on to float32 in the same kernel (the
    sum rounded to bfloat16, then widened)."""
    a = bf16_words(rng.standard_normal((3, 40, 72)).astype(np.float32))
    b = bf16_words(rng.standard_normal((72, 48)).astype(np.float32))
    ta = Tensor(a, device="INTERP").bitcast(dtypes.bfloat16).realize()
    tb = Tensor(b, device="INTERP").bitcast(dtypes.bfloat16).realize()
    kern = wgmma_kernel(lambda: (ta @ tb).cast(dtypes.float32).realize())
    assert "m64n64k16.f32.bf16.bf16" in kern[1] and kern[2].grid[2] == 3
    (got,) = run(kern, a, b)
    want = bf16_values(bf16_words(bf16_values(a) @ bf16_values(b)))
    assert (bf16_values(bf16_words(got)) == got).all()
    np.testing.assert_allclose(got.reshape(3, 40, 48), want, rtol=8e-3, atol=1e-6)
    assert (got.reshape(3, 40, 48) == want).mean() > 0.99


@needs_cxx
def test_emulation_refuses_a_missing_fence(monkeypatch):
    """The CPU check is strict about wgmma's ordering rules: without fence.proxy.async the tensor cores would
    read cp.async's writes unordered, without wgmma.fence the accumulators, and a group never waited for is
    lost; each is a CheckError naming the rule, not numbers that happen to agree."""
    monkeypatch.setattr(cpu_check, "BARRIER_TIMEOUT_S", 2)
    a = rng.standard_normal((64, 64)).astype(np.float16)
    b = np.ascontiguousarray(rng.standard_normal((64, 64)).astype(np.float16).T)
    spec, src, launch = wgmma_kernel(lambda: (on_interp(a) @ on_interp(b).T).realize())
    for line, rule in [("    pg_fence_proxy_async();", "fence.proxy.async"), ("    pg_wgmma_fence();", "wgmma.fence"),
                       ("    pg_wgmma_wait<0>();", "never waited")]:
        assert line in src
        with pytest.raises(cpu_check.CheckError, match=rule):
            run((spec, src.replace(line, ""), launch), a, b)


def test_default_and_sm80_stay_on_mma_sync():
    """wgmma only where asked (POLY_CUDA_WGMMA=1, read when capabilities are made) and only from sm_90; a matmul
    of sizes mma.sync's tile divides keeps today's kernel otherwise; a kernel lowered for wgmma is refused by a
    sm_80 renderer rather than rendered wrongly."""
    a = on_interp(rng.standard_normal((64, 32)).astype(np.float16))
    b = on_interp(rng.standard_normal((32, 64)).astype(np.float16))
    assert "wgmma_f16" not in capabilities("sm_90").tensor_cores
    with Context(POLY_CUDA_WGMMA=1):
        assert "wgmma_f16" in capabilities("sm_90").tensor_cores
        assert "wgmma_f16" not in capabilities("sm_80").tensor_cores
    for arch in ("sm_80", "sm_90"):
        (k,) = cuda_kernels(lambda: (a @ b).realize(), arch)
        assert "mma.sync.aligned.m16n8k16" in k[1] and "wgmma" not in k[1]
    (k,) = cuda_kernels(lambda: (a @ b).realize(), "sm_90", WGMMA)
    with pytest.raises(NotImplementedError, match="wgmma"):
        cuda.renderer.CUDARenderer("sm_80").render(k[0])
    assert compile_arch(k[1], "sm_90") == "sm_90a" and compile_arch(k[1], "sm_80") == "sm_80"


def test_wgmma_kernels_compile_for_sm_90a():
    """NVRTC (or nvcc) compiles every shape here for sm_90a, with the wgmma instructions in its PTX and the
    accumulators in registers (no local memory)."""
    from test_cuda_compile import _compiler

    from polygrad_backend_cuda.compile_check import compile_all
    from polygrad_backend_cuda.compiler import nvrtc_compile
    compile_fn = _compiler()
    sources = []
    for m, k, n in [(17, 33, 17), (70, 90, 40), (128, 256, 128), (64, 64, 30)]:
        a = on_interp(rng.standard_normal((m, k)).astype(np.float16))
        b = on_interp(rng.standard_normal((k, n)).astype(np.float16))
        a16 = a.cast(dtypes.bfloat16).realize()
        b16 = b.T.contiguous().cast(dtypes.bfloat16).realize().T  # x @ W.T: B K-major in global memory
        sources.append(wgmma_kernel(lambda: (a @ b).realize())[1])
        sources.append(wgmma_kernel(lambda: (a16 @ b16).realize())[1])
    compile_all(sources, "sm_90", compile_fn)
    try:
        ptx = nvrtc_compile(sources[4], "sm_90", ptx=True).decode()
    except Exception as e:  # no NVRTC library: nvcc compiled the cubins above
        pytest.skip(f"no NVRTC for the PTX check: {e}")
    assert ".target sm_90a" in ptx and "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16" in ptx
    assert "ld.local" not in ptx and "st.local" not in ptx


def test_ptxas_keeps_the_wgmma_pipeline():
    """ptxas (nvcc, sm_90a) neither serializes the wgmma instructions nor injects warpgroup waits (what it
    does when the accumulators are touched while an mma is in flight, or the registers do not fit: C7511,
    C7517, C7519) and spills nothing, for each block width: the instruction-level speed guard here, with no GPU
    to time it."""
    import shutil
    import subprocess
    import tempfile
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not installed (ptxas's report)")
    for n in (16, 64, 128):
        a = on_interp(rng.standard_normal((128, 128)).astype(np.float16))
        b = on_interp(rng.standard_normal((128, n)).astype(np.float16))
        src = wgmma_kernel(lambda: (a @ b).realize())[1]
        assert f"m64n{n}k16" in src
        with tempfile.TemporaryDirectory() as tmp:
            path = f"{tmp}/k.cu"
            with open(path, "w") as f:
                f.write(src)
            proc = subprocess.run([nvcc, "-cubin", "-arch=sm_90a", "-std=c++17", "--fmad=false", "--resource-usage",
                                   "-diag-suppress=177,550", "-o", f"{tmp}/k.cubin", path],
                                  capture_output=True, text=True, timeout=300)
        report = proc.stdout + proc.stderr
        assert proc.returncode == 0, report[-3000:]
        assert "0 bytes spill stores, 0 bytes spill loads" in report, report[-3000:]
        assert "serialized" not in report and "is injected" not in report, report[-3000:]
