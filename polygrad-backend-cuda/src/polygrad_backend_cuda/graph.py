"""CUDA graphs: the kernels of a Model call or a JIT replay recorded once and launched by one driver call.

Stage: running. Input: the launches between two copies (each a CUDAProgram, its device buffers and its
Variables' values), as model/executor.py and engine/capture.py hand them to `CUDAProgram.launch_plan`.
Output: a `GraphPlan`, which core runs like the CPU backend's launch plans (`n`, `set_handle`,
`set_vars`, a call).

The graph is built explicitly (cuGraphCreate, one cuGraphAddKernelNode per kernel, each node depending
on the one before, so they run in the order they had on the stream) and instantiated once
(cuGraphInstantiateWithFlags). A call launches it with cuGraphLaunch on the default stream, where the
backend's plain launches and synchronous copies also go, so a host copy before or after the plan is
ordered as it was. The driver copies a kernel node's arguments when they are set, so a rebound buffer
(`set_handle`) or a Variable's new value (`set_vars`) marks its node, and the next call first writes
the marked nodes' arguments into the instantiated graph (cuGraphExecKernelNodeSetParams): a call that
changes nothing is one driver call, however many kernels it runs.
POLY_CUDA_GRAPH=0, or a driver without the graph calls (before CUDA 11.4), leaves the kernels to plain
launches (`launch_plan` gives None).
"""
from __future__ import annotations

import weakref
from typing import Any

from polygrad.backend_api import setting

from polygrad_backend_cuda import libs
from polygrad_backend_cuda.libs import check, ffi


def graphs_enabled(ctx: Any) -> bool:
    """May a plan of this context's kernels be a CUDA graph? (POLY_CUDA_GRAPH on, the driver has graphs)"""
    return bool(setting("POLY_CUDA_GRAPH")) and libs.has_graphs(ctx.lib)


class GraphPlan:
    """Kernels launched in order as one instantiated CUDA graph (module docstring). Launch i keeps its
    argument cells (a CUdeviceptr per buffer, then its Variables' values) and the node parameters that
    point at them; `set_handle` and `set_vars` write the cells and mark the node for the next call."""

    def __init__(self, ctx: Any, launches: list[tuple[Any, list[Any], tuple[int, ...]]]):
        self.ctx = ctx
        self.n = len(launches)
        self.programs = [p for p, _, _ in launches]  # their modules stay loaded while the graph lives
        self.cells: list[list[Any]] = []
        self.params: list[Any] = []
        self._keep: list[Any] = []  # the argument arrays the node parameters point at
        self.nodes: list[Any] = []
        self.dirty: set[int] = set()
        lib = ctx.current()
        graph = ffi.new("CUgraph *")
        check(lib, lib.cuGraphCreate(graph, 0), "cuGraphCreate")
        self.graph = graph[0]
        try:
            for prog, buffers, var_vals in launches:
                self._add_node(lib, prog, buffers, var_vals)
            exec_ = ffi.new("CUgraphExec *")
            status = lib.cuGraphInstantiateWithFlags(exec_, self.graph, 0)
            check(lib, status, f"cuGraphInstantiate({self.n} kernels)")
        except BaseException:
            lib.cuGraphDestroy(self.graph)
            raise
        self.exec = exec_[0]
        weakref.finalize(self, _destroy, ctx, self.graph, self.exec).atexit = False  # exit releases them anyway

    def _add_node(self, lib: Any, prog: Any, buffers: list[Any], var_vals: tuple[int, ...]) -> None:
        """A kernel node for one launch, after the last node added."""
        cells = [ffi.new("CUdeviceptr *", b.ptr) for b in buffers]
        cells += [ffi.new(t, v) for t, v in zip(prog.var_types, var_vals)]
        args = ffi.new("void *[]", [ffi.cast("void *", c) for c in cells]) if cells else ffi.NULL
        params = ffi.new("CUDA_KERNEL_NODE_PARAMS *")
        params.func = prog.fn
        params.gridDimX, params.gridDimY, params.gridDimZ = prog.grid
        params.blockDimX, params.blockDimY, params.blockDimZ = prog.block
        params.sharedMemBytes = 0
        params.kernelParams = args
        params.extra = ffi.NULL
        node = ffi.new("CUgraphNode *")
        after = self.nodes[-1] if self.nodes else ffi.NULL
        status = lib.cuGraphAddKernelNode(node, self.graph, after, 1 if self.nodes else 0, params)
        check(lib, status, f"cuGraphAddKernelNode({prog.spec.name}, grid {prog.grid}, block {prog.block})")
        self.cells.append(cells)
        self.params.append(params)
        self._keep.append(args)
        self.nodes.append(node)

    def set_handle(self, i: int, pos: int, handle: Any) -> None:
        """Launch i's buffer argument `pos` is now `handle` (a DeviceMemory)."""
        cell = self.cells[i][pos]
        if cell[0] != handle.ptr:
            cell[0] = handle.ptr
            self.dirty.add(i)

    def set_vars(self, i: int, var_vals: tuple[int, ...]) -> None:
        """Launch i's Variables now have these values (in the order of its spec.vars)."""
        cells = self.cells[i]
        first = len(cells) - len(var_vals)
        for k, v in enumerate(var_vals):
            cell = cells[first + k]
            if cell[0] != v:
                cell[0] = v
                self.dirty.add(i)

    def __call__(self) -> None:
        lib = self.ctx.current()
        if self.dirty:
            for i in sorted(self.dirty):
                status = lib.cuGraphExecKernelNodeSetParams(self.exec, self.nodes[i][0], self.params[i])
                check(lib, status, f"cuGraphExecKernelNodeSetParams({self.programs[i].spec.name})")
            self.dirty.clear()
        check(lib, lib.cuGraphLaunch(self.exec, ffi.NULL), f"cuGraphLaunch({self.n} kernels)")


def _destroy(ctx: Any, graph: Any, exec_: Any) -> None:
    lib = ctx.current()
    lib.cuGraphExecDestroy(exec_)
    lib.cuGraphDestroy(graph)
