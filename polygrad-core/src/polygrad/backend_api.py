"""The one module backends import: the plugin hook, the frozen contract types and shared helpers.

A backend distribution declares an entry point in the group `polygrad.backends` that points at a
module (or object) with a `polygrad_register_backends` hook implementation returning BackendSpecs.
Registration must be cheap and must not touch hardware: `probe()` and `open()` do that later.

Settings: a backend reads polygrad's settings (POLY_THREADS, DEBUG, ...) with `setting(name)` (the
running thread's value: a Context applies) or `process_setting(name)` (the process-wide value, for
what a device fixes when it opens), never from `os.environ`. Its own settings it declares with
`register_setting(Setting(...))` at the top of its package (imported before any of its modules, and
when the entry point loads), and reads them the same way: they are typed, checked and listed like
core's, while core knows nothing of them. Caches live in `cache_dir(<backend>)`, entries written with
`write_entry` and read with `read_entry` / `valid_entry` (polygrad/diskcache.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import pluggy

from polygrad.config import Setting  # noqa: F401  (re-exported for backends)
# the running thread's values: `thread_settings.values[name]` is setting(name) without a call, for a
# per-launch read (a setting read once only; never write to it: use Context or set_value)
from polygrad.config import current as thread_settings  # noqa: F401
from polygrad.config import get as setting  # noqa: F401
from polygrad.config import process_value as process_setting  # noqa: F401
from polygrad.config import register as register_setting  # noqa: F401
from polygrad.diskcache import (CacheWarning, cache_dir, read_entry, temp_path,  # noqa: F401
                                valid_entry, write_entry)
from polygrad.dtype import ALL_DTYPES, DType, dtypes  # noqa: F401  (re-exported for backends)
from polygrad.engine.program import ProgramSpec  # noqa: F401
from polygrad.hostlaunch import launch_threads, run_split  # noqa: F401  (THREAD kernels on host threads)
from polygrad.errors import CompileError, DeviceUnavailableError, SettingError  # noqa: F401
from polygrad.renderer.cstyle import KERNEL_SYMBOL, CStyleRenderer  # noqa: F401
# the C family's op tables, one row per op: a dialect replaces rows ({**VECTOR_RULES, Ops.CAST: ...})
from polygrad.renderer.cstyle_ops import MASK_RULES, SCALAR_RULES, VECTOR_RULES  # noqa: F401
# the linearized program that machine-code emitters (X86) walk, as the C renderer does
from polygrad.renderer.linearize import Inst, L, LinearProgram, linearize, run_steps, var_name  # noqa: F401
# the passes over it that every emitter shares (unroll, fold, share, hoist, drop dead values, offsets)
from polygrad.renderer.linear_passes import LinearPasses, simplify_linear  # noqa: F401
from polygrad.engine.gpu_opts import matmul_shape  # noqa: F401
from polygrad.renderer.launch import LaunchDims, launch_dims  # noqa: F401
from polygrad.uop.ops import Ops, UOp  # noqa: F401

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
    masked_lanes: bool = False  # lane-gated contiguous loads/stores are single masked moves: an elementwise
                                # range the vector width does not divide is padded (PADTO) and gets lanes
    has_local_memory: bool = False
    shared_memory_bytes: int = 0
    supports_beam: bool = True
    tensor_cores: tuple = ()    # tensor-core instruction families the renderer emits (e.g. "mma_f16")
    arch: str = ""              # the device's architecture name (e.g. "sm_90"), for renderers and caches
    unsupported_ops: frozenset = frozenset()


class Allocator(Protocol):
    def alloc(self, nbytes: int) -> Any: ...
    def free(self, handle: Any, nbytes: int) -> None: ...
    def copyin(self, handle: Any, src: memoryview) -> None: ...  # src may be shorter: fills a prefix
    def copyout(self, dest: memoryview, handle: Any) -> None: ...
    # optional: `zero(handle, nbytes)` fills with zero bytes (else device.zero_fill copies zeros in)


class Program(Protocol):
    """A loaded kernel: call it with buffer handles (slot order) and the variables' values. A program may
    also offer `bind(handles, var_vals) -> launcher`, a zero-argument callable with the arguments fixed:
    JIT replays keep one per launch (and make one again when an input's handle changes), so a replay
    converts nothing per kernel. Without it they call the program with the same arguments each time."""

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


class HostMemory:
    """A host allocation: the NumPy byte array, its address, and a slot backends may cache a
    foreign-function pointer in (so launching a kernel costs no per-call address lookups)."""

    __slots__ = ("arr", "addr", "ptr")

    def __init__(self, arr: Any):
        self.arr = arr
        self.addr = int(arr.ctypes.data)
        self.ptr: Any = None


# host buffers start on a cache line: NumPy puts a large array 16 bytes past a page, so every 64-byte vector
# access of a kernel would straddle two lines, and aligned (non-temporal) stores would be impossible
HOST_ALIGN = 64


class HostAllocator:
    """Memory from NumPy arrays, aligned to HOST_ALIGN bytes: shared by host backends (CPU, INTERP, X86)."""

    def alloc(self, nbytes: int) -> HostMemory:
        import numpy as np
        n = max(nbytes, 1)
        raw = np.empty(n + HOST_ALIGN, dtype=np.uint8)
        skip = -int(raw.ctypes.data) % HOST_ALIGN
        return HostMemory(raw[skip:skip + n])  # the view keeps the allocation alive

    def free(self, handle: Any, nbytes: int) -> None:
        pass

    def zero(self, handle: HostMemory, nbytes: int) -> None:
        handle.arr[:nbytes] = 0

    def copyin(self, handle: HostMemory, src: memoryview) -> None:
        import numpy as np
        handle.arr[: src.nbytes] = np.frombuffer(src, dtype=np.uint8)

    def copyout(self, dest: memoryview, handle: HostMemory) -> None:
        import numpy as np
        np.frombuffer(dest, dtype=np.uint8)[:] = handle.arr[: dest.nbytes]
