"""polygrad's CUDA backend: CUDA C from the shared C-family renderer, compiled by NVRTC to a cubin
(cached on disk), launched through the driver API; both libraries reached through cffi (ABI mode).

Registration touches nothing; `probe()` opens libcuda and libnvrtc and counts devices, and says why
when it cannot (no driver, no device, no NVRTC). `open(ordinal)` creates the device's context.
"""
from __future__ import annotations

from polygrad.backend_api import (BackendSpec, Capabilities, DeviceImpl, DeviceUnavailableError, ProbeResult,
                                  Setting, hookimpl, register_setting, setting)

__version__ = "0.1.0"
# declared when the package is imported, before any of its code reads them (backend_api.setting)
register_setting(Setting("POLY_CUDA_LIB", str, "", "the driver library (libcuda) to open instead of searching",
                         live=True, owner="polygrad-backend-cuda"))
register_setting(Setting("POLY_CUDA_WGMMA", int, 0, "1: float16/bfloat16 matmuls on sm_90 use warpgroup tensor cores "
                         "(wgmma, compiled for sm_90a; not yet run on a GPU), read when a device opens", minimum=0,
                         owner="polygrad-backend-cuda"))
register_setting(Setting("POLY_NVRTC_LIB", str, "", "the NVRTC library to open instead of searching", live=True,
                         owner="polygrad-backend-cuda"))
register_setting(Setting("POLY_CUDA_GRAPH", int, 1, "1: a Model call's or a JIT replay's kernels launch as one CUDA "
                         "graph; 0: one driver launch per kernel", minimum=0, live=True, owner="polygrad-backend-cuda"))
MAX_ORDINAL = 15  # static: registration never asks the driver; open() checks the real count


def probe() -> ProbeResult:
    """Can CUDA kernels run here? ok, or the reason they cannot (never raises)."""
    # imported when probed or opened, not when the entry point registers the backend (registration stays cheap)
    from polygrad_backend_cuda import libs
    try:
        lib = libs.cuda()
    except libs.LibraryMissing as e:
        return ProbeResult(False, f"{e}; use DEV=CPU")
    status = lib.cuInit(0)
    if status == libs.CUDA_ERROR_NO_DEVICE:
        return ProbeResult(False, "libcuda loaded but cuInit found no CUDA-capable device; use DEV=CPU")
    if status != 0:
        return ProbeResult(False, f"cuInit failed with CUDA error {status}; check the NVIDIA driver, or use DEV=CPU")
    count = libs.ffi.new("int *")
    if lib.cuDeviceGetCount(count) != 0 or count[0] == 0:
        return ProbeResult(False, "no CUDA device found; use DEV=CPU")
    try:
        libs.nvrtc()
    except libs.LibraryMissing as e:
        return ProbeResult(False, f"{count[0]} CUDA device(s) but {e}")
    from polygrad_backend_cuda.compiler import nvrtc_version
    version = libs.ffi.new("int *")
    lib.cuDriverGetVersion(version)
    major, minor = nvrtc_version()
    return ProbeResult(True, f"{count[0]} device(s), driver API {version[0] // 1000}.{version[0] % 1000 // 10}, "
                             f"NVRTC {major}.{minor}")


def capabilities(arch: str, shared_memory: int = 48 * 1024, wgmma: bool | None = None) -> Capabilities:
    """What a device of compute capability `arch` ("sm_90") runs: grid/block launches with shared
    memory, 4-lane vector accesses, fused multiply-adds (lowering contracts sums of products into
    fmaf, as on a CPU with FMA: one rounding a step, and the FP32 units' full rate), atomic adds
    (scatter-adds over the grid), mma.sync tensor cores from sm_80 (float16, bfloat16, and TF32 for
    float32 matmuls where POLY_ALLOW_TF32=1), and from sm_90, where `wgmma` (default: the setting
    POLY_CUDA_WGMMA) says so, warpgroup tensor cores for float16 and bfloat16 (wgmma.py); warps of 32 threads
    (grouped row reductions).
    BEAM searches the GPU opts (codegen/gpu_search.py), its winners cached per architecture."""
    # imported when probed or opened, not when the entry point registers the backend (registration stays cheap)
    from polygrad_backend_cuda.launch import WARP_SIZE
    from polygrad_backend_cuda.renderer import arch_number
    cores = ("mma_f16", "mma_bf16", "mma_tf32") if arch_number(arch) >= 80 else ()
    if wgmma is None:
        wgmma = bool(setting("POLY_CUDA_WGMMA"))
    if wgmma and arch_number(arch) >= 90:
        cores += ("wgmma_f16", "wgmma_bf16")
    return Capabilities(threads=1, vector_width=4, fma=True, has_local_memory=True, shared_memory_bytes=shared_memory,
                        atomic_add=True, tensor_cores=cores, arch=arch, warp_size=WARP_SIZE)


def open_cuda(ordinal: int) -> DeviceImpl:
    # imported when probed or opened, not when the entry point registers the backend (registration stays cheap)
    from polygrad_backend_cuda.compiler import NVRTCCompiler
    from polygrad_backend_cuda.launch import launch_of
    from polygrad_backend_cuda.libs import CUDAError
    from polygrad_backend_cuda.renderer import CUDARenderer
    from polygrad_backend_cuda.runtime import CUDAAllocator, CUDAContext, CUDAProgram
    try:
        ctx = CUDAContext(ordinal)
    except CUDAError as e:
        raise DeviceUnavailableError(f"CUDA:{ordinal} cannot be opened: {e}") from e
    renderer = CUDARenderer(ctx.arch)
    compiler = NVRTCCompiler(ctx.arch)

    def load(spec, binary):
        return CUDAProgram(ctx, spec, binary, launch_of(spec))

    return DeviceImpl(name="CUDA" if ordinal == 0 else f"CUDA:{ordinal}", allocator=CUDAAllocator(ctx),
                      render=renderer.render, compile=compiler.compile, load=load,
                      capabilities=capabilities(ctx.arch, ctx.shared_memory), host_memory=False,
                      synchronize=ctx.synchronize)


@hookimpl
def polygrad_register_backends() -> list[BackendSpec]:
    return [BackendSpec(name="CUDA", probe=probe, open=open_cuda, priority=50, aliases=("GPU", "NV"),
                        package="polygrad-backend-cuda", version=__version__, max_ordinal=MAX_ORDINAL,
                        pip_name="polygrad-backend-cuda")]
