"""The CUDA driver API through cffi: a context per device ordinal, an allocator, program launches.

Stage: running. Input: cubins from compiler.py and device buffers. Output: launched kernels and
host <-> device copies. The call sequence: cuInit, cuDeviceGet, cuCtxCreate (made current in every
calling thread), cuMemAlloc / cuMemFree, cuMemcpyHtoD / cuMemcpyDtoH, cuModuleLoadData,
cuModuleGetFunction, cuLaunchKernel, cuCtxSynchronize. Launches go to the default stream, so a copy
back to the host (synchronous) sees every kernel before it. A Model call's or a JIT replay's kernels
between two copies run as one CUDA graph instead (`CUDAProgram.launch_plan`, graph.py).
"""
from __future__ import annotations

import threading
import time
from typing import Any

from polygrad.backend_api import KERNEL_SYMBOL

from polygrad_backend_cuda import libs
from polygrad_backend_cuda.graph import GraphPlan, graphs_enabled
from polygrad_backend_cuda.libs import check, ffi


class CUDAContext:
    """One device ordinal: its driver context, name and compute capability."""

    def __init__(self, ordinal: int):
        self.lib = libs.cuda()
        check(self.lib, self.lib.cuInit(0), "cuInit")
        count = ffi.new("int *")
        check(self.lib, self.lib.cuDeviceGetCount(count), "cuDeviceGetCount")
        if ordinal >= count[0]:
            raise libs.CUDAError(f"CUDA device {ordinal} does not exist: this machine has {count[0]} "
                                 f"(valid ordinals 0..{count[0] - 1})")
        dev = ffi.new("CUdevice *")
        check(self.lib, self.lib.cuDeviceGet(dev, ordinal), "cuDeviceGet")
        self.device = dev[0]
        self.ordinal = ordinal
        major, minor = self.attribute(libs.ATTR_COMPUTE_CAPABILITY_MAJOR), self.attribute(
            libs.ATTR_COMPUTE_CAPABILITY_MINOR)
        self.arch = f"sm_{major}{minor}"
        self.shared_memory = self.attribute(libs.ATTR_MAX_SHARED_MEMORY_PER_BLOCK)
        name = ffi.new("char[]", 256)
        check(self.lib, self.lib.cuDeviceGetName(name, 256, self.device), "cuDeviceGetName")
        self.name = ffi.string(name).decode(errors="replace")
        ctx = ffi.new("CUcontext *")
        check(self.lib, self.lib.cuCtxCreate_v2(ctx, 0, self.device), "cuCtxCreate")
        self.ctx = ctx[0]
        self._local = threading.local()
        self._local.current = True

    def attribute(self, attr: int) -> int:
        out = ffi.new("int *")
        check(self.lib, self.lib.cuDeviceGetAttribute(out, attr, self.device), "cuDeviceGetAttribute")
        return int(out[0])

    def current(self) -> Any:
        """The driver library, with this context current in the calling thread."""
        if not getattr(self._local, "current", False):
            check(self.lib, self.lib.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")
            self._local.current = True
        return self.lib

    def synchronize(self) -> None:
        check(self.lib, self.current().cuCtxSynchronize(), "cuCtxSynchronize")


class DeviceMemory:
    """A device allocation: its address (CUdeviceptr) and size."""

    __slots__ = ("ptr", "nbytes")

    def __init__(self, ptr: int, nbytes: int):
        self.ptr, self.nbytes = ptr, nbytes

    def __repr__(self) -> str:
        return f"<DeviceMemory 0x{self.ptr:x} {self.nbytes} bytes>"


class CUDAAllocator:
    """cuMemAlloc / cuMemFree and synchronous copies (a shorter source fills a prefix)."""

    def __init__(self, ctx: CUDAContext):
        self.ctx = ctx

    def alloc(self, nbytes: int) -> DeviceMemory:
        ptr = ffi.new("CUdeviceptr *")
        lib = self.ctx.current()
        check(lib, lib.cuMemAlloc_v2(ptr, max(nbytes, 1)), f"cuMemAlloc({nbytes} bytes)")
        return DeviceMemory(int(ptr[0]), nbytes)

    def free(self, handle: DeviceMemory, nbytes: int) -> None:
        lib = self.ctx.current()
        check(lib, lib.cuMemFree_v2(handle.ptr), "cuMemFree")

    def copyin(self, handle: DeviceMemory, src: memoryview) -> None:
        if src.nbytes > handle.nbytes:
            raise ValueError(f"copy of {src.nbytes} bytes into a device buffer of {handle.nbytes} bytes")
        if src.nbytes:
            lib = self.ctx.current()
            check(lib, lib.cuMemcpyHtoD_v2(handle.ptr, ffi.from_buffer(src), src.nbytes), "cuMemcpyHtoD")

    def copyout(self, dest: memoryview, handle: DeviceMemory) -> None:
        if dest.nbytes > handle.nbytes:
            raise ValueError(f"copy of {dest.nbytes} bytes out of a device buffer of {handle.nbytes} bytes")
        if dest.nbytes:
            lib = self.ctx.current()
            check(lib, lib.cuMemcpyDtoH_v2(ffi.from_buffer(dest), handle.ptr, dest.nbytes), "cuMemcpyDtoH")


class CUDAProgram:
    """A kernel in a loaded module; call with DeviceMemory handles and the variables' values."""

    def __init__(self, ctx: CUDAContext, spec: Any, cubin: bytes, launch: Any):
        self.ctx, self.spec = ctx, spec
        lib = ctx.current()
        self._image = ffi.from_buffer(cubin)
        module = ffi.new("CUmodule *")
        check(lib, lib.cuModuleLoadData(module, self._image), f"cuModuleLoadData({spec.name})")
        self.module = module[0]
        fn = ffi.new("CUfunction *")
        check(lib, lib.cuModuleGetFunction(fn, self.module, KERNEL_SYMBOL.encode()),
              f"cuModuleGetFunction({spec.name})")
        self.fn = fn[0]
        self.grid, self.block = tuple(launch.grid), tuple(launch.block)
        self.var_types = tuple("long long *" if v.dtype.itemsize == 8 else "int *" for v in spec.vars)

    def __call__(self, buffers: list[Any], var_vals: tuple[int, ...] = (), timing: bool = False) -> float | None:
        lib = self.ctx.current()
        values = [ffi.new("CUdeviceptr *", b.ptr) for b in buffers]
        values += [ffi.new(t, v) for t, v in zip(self.var_types, var_vals)]
        params = ffi.new("void *[]", [ffi.cast("void *", v) for v in values]) if values else ffi.NULL
        if timing:
            self.ctx.synchronize()
        t0 = time.perf_counter()
        status = lib.cuLaunchKernel(self.fn, *self.grid, *self.block, 0, ffi.NULL, params, ffi.NULL)
        check(lib, status, f"cuLaunchKernel({self.spec.name}, grid {self.grid}, block {self.block})")
        if timing:
            self.ctx.synchronize()
            return time.perf_counter() - t0
        return None

    @property
    def launch_plan(self) -> Any:
        """`graph_plan`, which makes launches of this context's programs one CUDA graph, or None where they
        run as plain launches (POLY_CUDA_GRAPH=0, a driver without graphs): core then never asks again."""
        return graph_plan if graphs_enabled(self.ctx) else None


def graph_plan(launches: list[tuple[CUDAProgram, list[Any], tuple[int, ...]]]) -> Any:
    """The launches (program, DeviceMemory handles, Variable values) as one CUDA graph (graph.GraphPlan), or
    None for programs of two contexts (plain launches)."""
    if not launches:
        return None
    ctx = launches[0][0].ctx
    if any(p.ctx is not ctx for p, _, _ in launches):
        return None
    return GraphPlan(ctx, launches)
