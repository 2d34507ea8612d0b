"""A fake CUDA driver for tests without a GPU: the driver API calls polygrad-backend-cuda makes, as a
Python object put in place of libcuda (`install`), backed by host memory, logging every call.

Kernels really run: a launch (cuLaunchKernel, or a graph's kernel node at cuGraphLaunch) evaluates the
program's lowered kernel with the INTERP backend over the fake device memory, with the arguments the
driver holds at that moment, so a graph node whose arguments were not updated after a rebind computes
from the old buffers, as on a GPU. The graph calls keep the driver's semantics that matter here: a
node's arguments are copied when the node is added or set (cuGraphExecKernelNodeSetParams on the
instantiated graph), never read through the caller's pointers later; nodes run in dependency order.
`FakeDriver` is a driver without the graph calls (older than CUDA 11.4), `FakeGraphDriver` one with them.

Use in a fresh process (the device registry keeps the opened device):
    from cuda_fake_driver import install
    driver = install()            # then Tensor(..., device="CUDA") runs here (install(graphs=False): none)
    driver.calls                  # [(call name, details), ...]
"""
from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from polygrad_backend_cuda import libs
from polygrad_backend_cuda.libs import ffi

ATTRIBUTES = {libs.ATTR_COMPUTE_CAPABILITY_MAJOR: 8, libs.ATTR_COMPUTE_CAPABILITY_MINOR: 0,
              libs.ATTR_MAX_SHARED_MEMORY_PER_BLOCK: 48 * 1024}


def _id(handle: Any) -> int:
    return int(ffi.cast("uintptr_t", handle))


class _View:
    """An INTERP buffer handle over fake device memory."""

    def __init__(self, arr: np.ndarray):
        self.arr = arr


class FakeDriver:
    """libcuda's calls (libs.CUDA_CDEF) over host memory; kernels run on INTERP (module docstring)."""

    def __init__(self):
        self.calls: list[tuple[str, Any]] = []
        self.memory: dict[int, Any] = {}  # device pointer -> its host allocation (char[])
        self.programs: dict[int, Any] = {}  # CUfunction -> its CUDAProgram (install() registers them)
        self._ids = itertools.count(0x1000, 0x10)
        self._error = ffi.new("char[]", b"fake driver error")
        self.graphs: dict[int, dict[int, tuple]] = {}  # graph -> node -> (dependencies, arguments)
        self.execs: dict[int, dict[int, tuple]] = {}

    def log(self, name: str, detail: Any = None) -> None:
        self.calls.append((name, detail))

    def names(self) -> list[str]:
        return [c[0] for c in self.calls]

    # ---- device and context
    def cuInit(self, flags):  # noqa: N802 (the driver's names)
        return 0

    def cuDriverGetVersion(self, out):  # noqa: N802
        out[0] = 12040
        return 0

    def cuGetErrorString(self, status, text):  # noqa: N802
        text[0] = self._error
        return 0

    def cuDeviceGetCount(self, out):  # noqa: N802
        out[0] = 1
        return 0

    def cuDeviceGet(self, out, ordinal):  # noqa: N802
        out[0] = ordinal
        return 0

    def cuDeviceGetName(self, out, size, device):  # noqa: N802
        ffi.memmove(out, b"Fake GPU\0", 9)
        return 0

    def cuDeviceGetAttribute(self, out, attr, device):  # noqa: N802
        out[0] = ATTRIBUTES.get(attr, 1)
        return 0

    def cuDeviceTotalMem_v2(self, out, device):  # noqa: N802
        out[0] = 1 << 30
        return 0

    def cuCtxCreate_v2(self, out, flags, device):  # noqa: N802
        out[0] = ffi.cast("CUcontext", next(self._ids))
        return 0

    def cuCtxSetCurrent(self, ctx):  # noqa: N802
        return 0

    def cuCtxSynchronize(self):  # noqa: N802
        self.log("cuCtxSynchronize")
        return 0

    def cuMemGetInfo_v2(self, free, total):  # noqa: N802
        free[0] = total[0] = 1 << 30
        return 0

    # ---- memory
    def cuMemAlloc_v2(self, out, nbytes):  # noqa: N802
        mem = ffi.new("char[]", nbytes)
        ptr = _id(mem)
        self.memory[ptr] = mem
        out[0] = ptr
        return 0

    def cuMemFree_v2(self, ptr):  # noqa: N802
        return 0 if self.memory.pop(int(ptr), None) is not None else 1

    def cuMemcpyHtoD_v2(self, dst, src, nbytes):  # noqa: N802
        self.log("cuMemcpyHtoD", int(dst))
        ffi.memmove(ffi.cast("char *", dst), src, nbytes)
        return 0

    def cuMemcpyDtoH_v2(self, dst, src, nbytes):  # noqa: N802
        self.log("cuMemcpyDtoH", int(src))
        ffi.memmove(dst, ffi.cast("char *", src), nbytes)
        return 0

    # ---- modules and launches
    def cuModuleLoadData(self, out, image):  # noqa: N802
        out[0] = ffi.cast("CUmodule", next(self._ids))
        return 0

    def cuModuleGetFunction(self, out, module, name):  # noqa: N802
        out[0] = ffi.cast("CUfunction", next(self._ids))
        return 0

    def cuModuleUnload(self, module):  # noqa: N802
        return 0

    def cuFuncSetAttribute(self, fn, attr, value):  # noqa: N802
        return 0

    def arguments(self, fn: Any, params: Any) -> tuple[Any, tuple[int, ...], tuple[int, ...]]:
        """(program, buffer pointers, Variable values) read through a kernel's parameter array now."""
        prog = self.programs[_id(fn)]
        n = len(prog.spec.globals)
        ptrs = tuple(int(ffi.cast("CUdeviceptr *", params[k])[0]) for k in range(n))
        values = tuple(int(ffi.cast(t, params[n + k])[0]) for k, t in enumerate(prog.var_types))
        return prog, ptrs, values

    def execute(self, prog: Any, ptrs: tuple[int, ...], values: tuple[int, ...]) -> None:
        """Run one kernel on INTERP over the device memory at `ptrs`."""
        views = []
        for ptr in ptrs:
            if ptr not in self.memory:
                raise AssertionError(f"kernel {prog.spec.name} launched over 0x{ptr:x}, which is not an allocation")
            mem = self.memory[ptr]
            views.append(_View(np.frombuffer(ffi.buffer(mem), dtype=np.uint8)))
        prog.interp(views, values)

    def cuLaunchKernel(self, fn, gx, gy, gz, bx, by, bz, shared, stream, params, extra):  # noqa: N802
        prog, ptrs, values = self.arguments(fn, params)
        self.log("cuLaunchKernel", (prog.spec.name, ptrs, values))
        self.execute(prog, ptrs, values)
        return 0


class _GraphCalls:
    """The CUDA graph calls (libs.GRAPH_CDEF)."""

    def node_args(self, params: Any) -> tuple:
        prog, ptrs, values = self.arguments(params.func, params.kernelParams)
        grid = (params.gridDimX, params.gridDimY, params.gridDimZ)
        block = (params.blockDimX, params.blockDimY, params.blockDimZ)
        assert (grid, block) == (prog.grid, prog.block), (prog.spec.name, grid, block)
        return prog, ptrs, values

    def cuGraphCreate(self, out, flags):  # noqa: N802
        g = next(self._ids)
        self.graphs[g] = {}
        out[0] = ffi.cast("CUgraph", g)
        self.log("cuGraphCreate", g)
        return 0

    def cuGraphAddKernelNode(self, out, graph, deps, count, params):  # noqa: N802
        nodes = self.graphs[_id(graph)]
        after = tuple(_id(deps[k]) for k in range(count))
        if any(d not in nodes for d in after):
            return 1  # CUDA_ERROR_INVALID_VALUE
        node = next(self._ids)
        nodes[node] = (after, self.node_args(params))  # copied now, as the driver does
        out[0] = ffi.cast("CUgraphNode", node)
        self.log("cuGraphAddKernelNode", (nodes[node][1][0].spec.name, after))
        return 0

    def cuGraphInstantiateWithFlags(self, out, graph, flags):  # noqa: N802
        e = next(self._ids)
        self.execs[e] = dict(self.graphs[_id(graph)])
        out[0] = ffi.cast("CUgraphExec", e)
        self.log("cuGraphInstantiate", (e, len(self.execs[e])))
        return 0

    def cuGraphExecKernelNodeSetParams(self, exec_, node, params):  # noqa: N802
        nodes = self.execs[_id(exec_)]
        if _id(node) not in nodes:
            return 1
        deps = nodes[_id(node)][0]
        nodes[_id(node)] = (deps, self.node_args(params))
        self.log("cuGraphExecKernelNodeSetParams", (_id(exec_), nodes[_id(node)][1][0].spec.name))
        return 0

    def cuGraphLaunch(self, exec_, stream):  # noqa: N802
        nodes = self.execs[_id(exec_)]
        done: list[int] = []
        while len(done) < len(nodes):  # dependency order (each ready node in the order it was added)
            ready = [n for n, (deps, _) in nodes.items() if n not in done and all(d in done for d in deps)]
            if not ready:
                raise AssertionError("the graph has a cycle")
            done.append(ready[0])
        self.log("cuGraphLaunch", (_id(exec_), [nodes[n][1][0].spec.name for n in done]))
        for n in done:
            self.execute(*nodes[n][1])
        return 0

    def cuGraphExecDestroy(self, exec_):  # noqa: N802
        self.log("cuGraphExecDestroy", _id(exec_))
        return 0 if self.execs.pop(_id(exec_), None) is not None else 1

    def cuGraphDestroy(self, graph):  # noqa: N802
        self.log("cuGraphDestroy", _id(graph))
        return 0 if self.graphs.pop(_id(graph), None) is not None else 1


class FakeGraphDriver(_GraphCalls, FakeDriver):
    """The fake driver with CUDA graphs."""


def install(graphs: bool = True) -> FakeDriver:
    """Put a fake driver in place of libcuda in this process, and make CUDA programs run on INTERP and
    skip NVRTC (their cubins are never read). Returns the driver; open the device after this."""
    from polygrad_backend_cuda import compiler, runtime
    from polygrad_backend_interp.evaluator import InterpProgram
    driver = FakeGraphDriver() if graphs else FakeDriver()
    libs.forget()
    libs._cache["cuda"] = driver
    libs._cache["nvrtc"] = object()
    compiler.nvrtc_version = lambda: (12, 4)
    compiler.NVRTCCompiler.compile = lambda self, src: b"\x7fELF fake cubin"
    init = runtime.CUDAProgram.__init__

    def registered(self, ctx, spec, cubin, launch):
        init(self, ctx, spec, cubin, launch)
        self.interp = InterpProgram(spec)
        driver.programs[_id(self.fn)] = self

    runtime.CUDAProgram.__init__ = registered
    return driver
