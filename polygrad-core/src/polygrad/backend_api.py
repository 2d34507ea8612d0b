"""The one module backends import: the plugin hook, the frozen contract types and shared helpers.

Stage: the plugin boundary. It defines nothing of its own: it gathers in one place what backends use
(the contract types of polygrad/contract.py, settings, caches, host memory and threads, the shared C-family
renderer and linear program), so core may move its modules without breaking a backend. Nothing in core
imports it.

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
# the contract types (polygrad/contract.py: lowering and the device registry import them from there)
from polygrad.contract import (ENTRY_POINT_GROUP, PLUGIN_API, PROJECT, Allocator, BackendHooks,  # noqa: F401
                               BackendSpec, Capabilities, DeviceImpl, GlobalArg, ProbeResult, Program,
                               ProgramSpec, hookimpl, hookspec)
# the host's processor (vector width, caches, FMA units) and the Capabilities fields host backends take from it
from polygrad.hostcpu import CpuDescription, describe_cpu, host_fields  # noqa: F401
from polygrad.hostlaunch import launch_threads, run_split  # noqa: F401  (THREAD kernels on host threads)
from polygrad.hostmemory import HOST_ALIGN, HostAllocator, HostMemory  # noqa: F401  (host backends' memory)
from polygrad.errors import CompileError, DeviceUnavailableError, SettingError  # noqa: F401
from polygrad.renderer.cstyle import KERNEL_SYMBOL, CStyleRenderer  # noqa: F401
# the C family's op tables, one row per op: a dialect replaces rows ({**VECTOR_RULES, Ops.CAST: ...})
from polygrad.renderer.cstyle_ops import MASK_RULES, SCALAR_RULES, VECTOR_RULES  # noqa: F401
# the linearized program that machine-code emitters (X86) walk, as the C renderer does
from polygrad.renderer.linearize import Inst, L, LinearProgram, linearize, run_steps, var_name  # noqa: F401
# the passes over it that every emitter shares (unroll, fold, share, hoist, drop dead values, offsets)
from polygrad.renderer.linear_passes import LinearPasses, simplify_linear  # noqa: F401
from polygrad.codegen.gpu_opts import (MATMUL_TILES, TC_FAMILIES, WGMMA_DEPTH, GemmShape, MatmulTile,  # noqa: F401
                                       implicit_gemm, matmul_ranges, matmul_shape, matmul_with_epilogue,
                                       tensor_core_dtype, wgmma_dtype)
from polygrad.renderer.launch import LaunchDims, launch_dims  # noqa: F401
from polygrad.uop.ops import Ops, UOp  # noqa: F401
from polygrad.uop.symbolic import range_coeff  # noqa: F401  (contiguity of an index along a range)
