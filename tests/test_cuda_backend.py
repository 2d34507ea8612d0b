"""polygrad-backend-cuda without a GPU: probe and typed errors, the CUDA renderer's launch mapping
(grid/block indices, shared memory and barriers for grouped reductions, vector accesses, half types,
mma.sync for the tensor-core opt), CPU kernels unchanged by the GPU lowering, and the driver-API
call sequence against a stub libcuda built here with cc (tests/fixtures/cuda_stub.c).

On a machine with a GPU, the availability tests flip: they check the device works instead.
"""
from __future__ import annotations

import os
import shutil
import subprocess

import numpy as np
import pytest

from polygrad import Device, Tensor, dtypes
from polygrad.codegen.lower import lower
from polygrad.codegen.opts import OptKind
from polygrad.errors import DeviceError, DeviceUnavailableError
from polygrad.renderer.launch import launch_dims
from polygrad.renderer.linearize import L, linearize

cuda = pytest.importorskip("polygrad_backend_cuda")
from polygrad_backend_cuda import capabilities  # noqa: E402
from polygrad_backend_cuda.launch import launch_of  # noqa: E402
from polygrad_backend_cuda.renderer import CUDARenderer  # noqa: E402
from conftest import kernels_of  # noqa: E402

HERE = os.path.dirname(__file__)
GPU = Device.cuda_available()




def rand(*shape, dtype=dtypes.float32):
    t = Tensor(np.random.default_rng(0).standard_normal(shape).astype(np.float32), device="INTERP")
    return (t.cast(dtype) if dtype is not dtypes.float32 else t).realize()


def cuda_spec(ast, arch="sm_90"):
    return lower(ast, capabilities(arch))


# ---- availability and typed errors -----------------------------------------------------------------

def test_registered_and_probe_names_the_reason():
    assert "CUDA" in Device.installed()
    probe = cuda.probe()
    if GPU:
        assert probe.ok and "device" in probe.reason
    else:
        assert not probe.ok and ("libcuda" in probe.reason or "device" in probe.reason or "nvrtc" in probe.reason)
        assert Device.cuda_available() is False


@pytest.mark.skipif(GPU, reason="a GPU is usable here")
def test_unusable_cuda_raises_typed_errors(run_python):
    with pytest.raises(DeviceUnavailableError, match="CUDA.*(libcuda|device|nvrtc)"):
        (Tensor([1.0, 2.0]) * 2).to("cuda").numpy()
    with pytest.raises(DeviceUnavailableError):
        Tensor([1.0], device="CUDA:1")
    proc = run_python("""
        from polygrad import Tensor
        from polygrad.errors import DeviceUnavailableError
        try:
            Tensor([1.0]).numpy()
        except DeviceUnavailableError as e:
            print("typed:", e)
        """, env={"DEV": "CUDA"})
    assert proc.returncode == 0, proc.stderr
    assert "typed: device CUDA is installed but unusable" in proc.stdout


def test_ordinal_above_max_is_rejected():
    with pytest.raises(DeviceError, match="valid ordinals are 0..15"):
        Tensor([1.0], device="cuda:16")


def test_spec_example_falls_back_to_cpu():
    x = Tensor.rand(4)
    y = (x * 2).to("cuda") if Device.cuda_available() else (x * 2).to("cpu")
    np.testing.assert_allclose(y.numpy(), x.numpy() * 2, rtol=1e-6)


# ---- renderer: launch mapping ----------------------------------------------------------------------

def test_elementwise_maps_to_grid_and_block_with_vector_access():
    (ast,) = kernels_of(lambda: (rand(64, 512) * 2 + 1).realize())
    spec = cuda_spec(ast)
    kinds = {o.kind for o in spec.opts}
    assert OptKind.LOCAL in kinds and OptKind.UPCAST in kinds
    launch = launch_of(spec)
    assert launch.grid[0] * launch.grid[1] * launch.block[0] * launch.block[1] * 4 == 64 * 512
    assert launch.threads >= 128
    src = CUDARenderer("sm_90").render(spec)
    assert 'extern "C" __global__ void __launch_bounds__(' in src
    assert "blockIdx.x" in src and "threadIdx.x" in src
    assert "pg_vload<float, 4>" in src and "pg_vstore<float, 4>" in src
    body = src.split('extern "C"')[1]
    assert "for (" not in body  # no loops: one point (four lanes) per thread


def test_grouped_reduction_uses_shared_memory_and_barriers():
    (ast,) = kernels_of(lambda: rand(16384).sum().realize())
    spec = cuda_spec(ast)
    assert [o.kind for o in spec.opts] == [OptKind.GROUP]
    launch = launch_of(spec)
    assert launch.block == (256, 1, 1) and launch.warp == 32
    src = CUDARenderer("sm_90").render(spec)
    # each warp's 32 partials by a butterfly of shuffles, then the 8 warps' values through shared memory
    assert src.count("__shfl_xor_sync(0xffffffffu, ") == 5
    assert "__shared__ float smem0[8];" in src
    assert src.count("__syncthreads();") == 2
    assert "if (" in src  # each warp's lane 0 writes its value, one thread stores the result
    prog = linearize(spec, launch=launch)
    ops = [x.op for x in prog.insts]
    assert ops.count(L.BARRIER) == 2 and L.DEFINE_LOCAL in ops and ops.count(L.SHUFFLE) == 5
    # without shuffles (a launch with no warp): every thread's partial through shared memory
    prog = linearize(spec, launch=launch_dims(spec))
    ops = [x.op for x in prog.insts]
    assert ops.count(L.BARRIER) == 2 and L.SHUFFLE not in ops
    assert next(x for x in prog.insts if x.op is L.DEFINE_LOCAL).arg[1] == 256


def test_row_reduction_groups_and_maps_rows_to_blocks():
    (ast,) = kernels_of(lambda: rand(8, 4096).max(1).realize())
    spec = cuda_spec(ast)
    launch = launch_of(spec)
    assert launch.grid[0] * launch.grid[1] * launch.grid[2] == 8 and launch.block[0] == 256


def test_matmul_register_tile_and_blocks():
    (ast,) = kernels_of(lambda: (rand(128, 64) @ rand(64, 128)).realize())
    assert [o.kind for o in cuda_spec(ast).opts] == [OptKind.TILE]  # shared-memory tiles (test_cuda_tiled_matmul)
    spec = lower(ast, capabilities("sm_90", shared_memory=8 * 1024))  # too little shared memory for a tile
    assert [o.kind for o in spec.opts].count(OptKind.UPCAST) == 2
    launch = launch_of(spec)
    assert launch.threads == 256
    assert launch.grid[0] * launch.grid[1] * launch.threads * 16 == 128 * 128  # 4 x 4 outputs per thread


def test_tensor_core_opt_renders_mma_for_half_matmul():
    a, b = rand(64, 32, dtype=dtypes.float16), rand(32, 64, dtype=dtypes.float16)
    (ast,) = kernels_of(lambda: (a @ b).realize())
    spec = cuda_spec(ast)
    assert [o.kind for o in spec.opts] == [OptKind.TC]
    src = CUDARenderer("sm_90").render(spec)
    assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in src
    assert launch_of(spec).block[0] % 32 == 0
    # no tensor cores before sm_80, and none for float32
    assert OptKind.TC not in [o.kind for o in cuda_spec(ast, "sm_75").opts]
    (ast32,) = kernels_of(lambda: (rand(64, 32) @ rand(32, 64)).realize())
    assert OptKind.TC not in [o.kind for o in cuda_spec(ast32).opts]


def test_half_and_bfloat16_use_hardware_conversions():
    h = rand(256, dtype=dtypes.float16)
    (ast,) = kernels_of(lambda: (h * 3).cast(dtypes.bfloat16).realize())
    src90 = CUDARenderer("sm_90").render(cuda_spec(ast))
    assert "cvt.rn.f16.f32" in src90 and "cvt.rn.bf16.f32" in src90 and "unsigned short*" in src90
    src75 = CUDARenderer("sm_75").render(cuda_spec(ast, "sm_75"))
    assert "cvt.rn.f16.f32" in src75 and "cvt.rn.bf16.f32" not in src75


def test_cpu_lowering_and_source_unchanged_by_gpu_mapping():
    (ast,) = kernels_of(lambda: rand(16384).sum().realize())
    cpu = Device["CPU"]
    spec = lower(ast, cpu.capabilities)
    assert not {OptKind.LOCAL, OptKind.GROUP, OptKind.TC} & {o.kind for o in spec.opts}
    src = cpu.render(spec)
    assert "__shared__" not in src and "blockIdx" not in src
    assert linearize(spec).text() == linearize(spec, launch=None).text()


# ---- the driver API call sequence against a stub libcuda --------------------------------------------

@pytest.fixture(scope="module")
def stub_lib(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("clang") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the stub driver")
    out = str(tmp_path_factory.mktemp("stub") / "libcuda_stub.so")
    subprocess.run([cc, "-shared", "-fPIC", "-O1", os.path.join(HERE, "fixtures", "cuda_stub.c"), "-o", out],
                   check=True, capture_output=True)
    return out


def test_driver_call_sequence_with_stub(stub_lib, tmp_path, run_python):
    from polygrad_backend_cuda import libs
    try:
        libs.nvrtc()
    except libs.LibraryMissing:
        pytest.skip("libnvrtc is not installed (pip install nvidia-cuda-nvrtc-cu12)")
    log = tmp_path / "calls.log"
    proc = run_python("""
        import numpy as np
        from polygrad import Device, Tensor
        assert Device.cuda_available()
        x = Tensor(np.arange(512, dtype=np.float32)).to("cuda:1")
        back = x.numpy()
        assert (back == np.arange(512)).all(), back[:4]
        y = (x * 2).numpy()   # the stub writes grid.x * block.x into element 0
        print("first", y[0])
        """, env={"POLY_CUDA_LIB": stub_lib, "POLY_STUB_LOG": str(log), "POLY_CACHE_DIR": str(tmp_path / "cache")})
    assert proc.returncode == 0, proc.stderr + proc.stdout
    calls = log.read_text().splitlines()
    names = [c.split()[0] for c in calls]
    assert names[0] == "cuInit", names
    assert "cuDeviceGet 1" in calls and "cuCtxCreate 1" in calls
    order = ["cuMemAlloc", "cuMemcpyHtoD", "cuMemcpyDtoH", "cuModuleLoadData", "cuModuleGetFunction",
             "cuLaunchKernel"]
    assert all(n in names for n in order), names
    assert names.index("cuModuleLoadData") < names.index("cuLaunchKernel") < len(names) - 1
    assert "cuModuleLoadData 1" in calls  # a real cubin (ELF) from NVRTC reached the driver
    assert names[-1] == "cuMemcpyDtoH"
    launch = next(c for c in calls if c.startswith("cuLaunchKernel"))
    grid, block = int(launch.split()[2]), int(launch.split()[4])
    assert grid * block * 4 == 512  # x*2 on 512 floats: float4 lanes, one point per thread
    assert f"first {float(grid_x_block(calls))}" in proc.stdout


def grid_x_block(calls: list[str]) -> int:
    launch = next(c for c in calls if c.startswith("cuLaunchKernel"))
    return int(launch.split()[2]) * int(launch.split()[4])
