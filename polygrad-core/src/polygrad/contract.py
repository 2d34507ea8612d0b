"""The contract between core and backends: the frozen types that cross the package boundary.

Stage: none (the types every stage from lowering to running shares). Input: nothing. Output:
`ProgramSpec` (a lowered kernel ready for a renderer), `Capabilities` (what a device can run, which
lowering reads), `DeviceImpl` and `BackendSpec` (what a plugin offers), `ProbeResult`, the pluggy hook
specification and the plugin API version. It imports nothing from the stages that use it (only the IR
and dtypes below them), so lowering, the device registry and `backend_api` all import it and none of
them imports another to reach these types. Backends reach them through `polygrad.backend_api`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import pluggy

from polygrad.dtype import ALL_DTYPES, DType
from polygrad.uop.ops import Ops, UOp
from polygrad.uop.sint import sym_eval, vmax

PLUGIN_API = 1
PROJECT = "polygrad"
ENTRY_POINT_GROUP = "polygrad.backends"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


class BackendHooks:
    """The hook specification every backend plugin implements."""

    @hookspec
    def polygrad_register_backends(self) -> "list[BackendSpec]":
        """Return the BackendSpecs this plugin provides (one per device family). Must not touch hardware."""


@dataclass(frozen=True)
class ProbeResult:
    ok: bool
    reason: str = ""


@dataclass(frozen=True)
class Capabilities:
    """What a device can run; can_run() answers from this alone."""

    dtypes: frozenset = field(default_factory=lambda: frozenset(d.name for d in ALL_DTYPES))
    max_buffer_bytes: int = 1 << 40
    max_dims: int = 16
    threads: int = 1            # host threads a kernel may be split across (THREAD axis); 1: none
    vector_width: int = 1       # float32 lanes of the device's vectors (UPCAST lanes); 1: no vectors
    registers: int = 0          # vector registers (sizes register tiles); 0: unknown
    fma: bool = False           # fused multiply-add in hardware: reductions' multiply-adds are contracted
    stage_bytes: int = 0        # launch-private scratch (L.LOCAL) a kernel may stage an operand in; 0: none
    tile_vectors: int = 2       # vectors per row of a register tile the code generator handles best (1, 2 or 4)
    l1_bytes: int = 0           # host devices: L1 data cache per core; 0: unknown
    l2_bytes: int = 0           # host devices: L2 cache per core (stages panels, sizes cache blocking); 0: unknown
    l3_bytes: int = 0           # host devices: the largest cache, shared (a re-read operand stays in it?); 0: unknown
    fma_units: int = 0          # vector FMAs a core issues per cycle at vector_width; 0: unknown
    fma_latency: int = 0        # cycles of one FMA: a register tile wants fma_units x fma_latency accumulators
    read_gbs: float = 0.0       # host devices: one core's streaming read rate from memory, GB/s; 0: unknown
    thread_handoff_ns: int = 0  # host devices: what splitting a launch among threads costs beyond its parts'
                                # work (a waiting worker starts and the launcher learns its part ended); 0: unknown
    tuning: str = ""            # where tile_vectors and stage_bytes came from: "heuristic" or "calibrated"
    masked_lanes: bool = False  # lane-gated contiguous loads/stores are single masked moves: an elementwise
                                # range the vector width does not divide is padded (PADTO) and gets lanes
    masked_vectors: bool = False  # the renderer loads and stores a float32 vector whose last lanes are gated off
                                  # as one masked move: a register tile's columns may be padded (host_opts)
    strided_lanes: bool = False  # lanes 2 elements apart are read with contiguous loads and a shuffle, not a
                                 # gather: a stride-2 window (depthwise conv, pooling) gets lanes on its row
    int8_dot: bool = False      # 8-bit integer dot products into int32 lanes in hardware (x86 VNNI): a quantized
                                # decode matvec rounds its activation to 8 bits (nn/quant.py) and the renderer
                                # contracts each 8-bit block sum (renderer/int8_dot.py)
    has_local_memory: bool = False
    shared_memory_bytes: int = 0
    warp_size: int = 0          # GPU devices: threads that run in lockstep and exchange registers (warp shuffles);
                                # 0: none (grouped row reductions need it: gpu_opts.row_group_opts)
    atomic_add: bool = False    # GPU devices: an accumulating ADD store of float32/int32 is one atomic add, so a
                                # scatter-add spreads over the launch (LOCAL opts, launch indices) instead of
                                # running as one thread; float sums then come in no fixed order
    supports_beam: bool = True
    tensor_cores: tuple = ()    # tensor-core instruction families the renderer emits (e.g. "mma_f16")
    arch: str = ""              # the device's architecture name (e.g. "sm_90"), for renderers and caches
    unsupported_ops: frozenset = frozenset()


@dataclass(frozen=True)
class GlobalArg:
    """One pointer argument of a kernel: slot number, element dtype, element count, written or not.
    `size` is an int, or a symbolic size over the kernel's variables (`spec.eval_int(size, var_vals)`)."""

    slot: int
    dtype: DType
    size: Any
    written: bool


@dataclass(frozen=True)
class ProgramSpec:
    """A kernel after device-independent lowering and device optimisation.

    `ast` is kernel IR: SINK(END(STORE(INDEX(DEFINE_GLOBAL, idx), value), *ranges), ...).
    The launch contract every backend follows: the kernel takes one pointer per `globals` entry, then
    one integer per `vars` entry (DEFINE_VAR, in this order), and, when `threads` > 1, the thread
    index; it is launched `threads` times, with index 0..threads-1, in any order or concurrently.
    `vars` are the kernel's symbolic-size Variables (DEFINE_VAR UOps, arg (name, min, max), sorted by
    name), valued per launch (`var_vals`, in this order). A RANGE's end (and a global's size) may be an
    expression over them: read it with `eval_int`. `ops` and `mem_bytes` count symbolic sizes at their
    variables' maxima.
    """

    name: str
    ast: UOp
    globals: tuple[GlobalArg, ...]
    ops: int
    mem_bytes: int
    opts: tuple = ()
    vars: tuple[UOp, ...] = ()
    threads: int = 1
    vector_width: int = 1  # the device's float32 lanes: renderers emit one upcast range as vectors of it

    def eval_int(self, x: Any, var_vals: tuple[int, ...] = ()) -> int:
        """An int, or a size over this kernel's variables, at the launch's var_vals (spec.vars order)."""
        if not isinstance(x, UOp):
            return int(x)
        if x.op is Ops.CONST:
            return int(x.arg)
        return sym_eval(x, dict(zip(self.vars, var_vals)))

    def max_int(self, x: Any) -> int:
        """An int, or a size over this kernel's variables at their largest values."""
        if not isinstance(x, UOp):
            return int(x)
        if x.op is Ops.CONST:
            return int(x.arg)
        return vmax(x)


class Allocator(Protocol):
    def alloc(self, nbytes: int) -> Any: ...
    def free(self, handle: Any, nbytes: int) -> None: ...
    def copyin(self, handle: Any, src: memoryview) -> None: ...  # src may be shorter: fills a prefix
    def copyout(self, dest: memoryview, handle: Any) -> None: ...  # dest may be shorter: reads a prefix
    # optional: `zero(handle, nbytes)` fills with zero bytes (else device.zero_fill copies zeros in)


class Program(Protocol):
    """A loaded kernel: call it with buffer handles (slot order) and the variables' values. A program may
    also offer `bind(handles, var_vals) -> launcher`, a zero-argument callable with the arguments fixed:
    JIT replays keep one per launch (and make one again when an input's handle changes), so a replay
    converts nothing per kernel. Without it they call the program with the same arguments each time.
    A kernel without variables may also offer `pointer_call`, a callable taking each handle's `ptr` as one
    positional argument (a one-thread kernel's cffi function): a launch calls it directly (no frame of the
    backend's), and calls the program as above when it raises TypeError or AttributeError before running
    (a handle whose `ptr` is not made yet)."""

    def __call__(self, buffers: list[Any], var_vals: tuple[int, ...], timing: bool = False) -> float | None: ...


@dataclass(frozen=True)
class DeviceImpl:
    """An opened device: how to hold memory, turn kernels into source, compile and run them."""

    name: str
    allocator: Any
    render: Callable[[ProgramSpec], str]
    compile: Callable[[str], Any]
    load: Callable[[ProgramSpec, Any], Any]
    capabilities: Capabilities = Capabilities()
    host_memory: bool = True  # buffers are host memory that NumPy can view without a copy
    synchronize: Callable[[], None] = lambda: None
    # optional: compile several sources at once (one compiler run for a schedule's new kernels)
    compile_many: Callable[[list[str]], list[Any]] | None = None
    # render(spec) depends on the spec and the backend's code alone: the lowered spec and its source may
    # be kept on disk and reused by later processes without lowering or rendering (engine/rendercache.py)
    render_cacheable: bool = False


@dataclass(frozen=True)
class BackendSpec:
    """One device family a plugin offers. `open(ordinal)` is only called once the device is used."""

    name: str
    probe: Callable[[], ProbeResult]
    open: Callable[[int], DeviceImpl]
    priority: int = 0
    aliases: tuple[str, ...] = ()
    api_version: int = PLUGIN_API
    package: str = ""
    version: str = ""
    max_ordinal: int = 0
    pip_name: str = ""
