"""The compile stage and the program cache: a kernel AST and a device -> a loaded, callable program.

Stage: compiling. Input: a device-independent kernel AST (a scheduled step) and a device name. Output:
a `CompiledProgram` (the lowered ProgramSpec, the source, the loaded program), kept in `program_cache`
by (AST, device), or (AST, device, "tf32") while POLY_ALLOW_TF32 is on: the setting changes what a
float32 matmul lowers to, so flipping it never reuses the other precision's program. On a miss the
kernel's opts are chosen (codegen/search.py: heuristics, or BEAM), it is lowered (codegen/lower.py)
and rendered by the device, or both are read from the on-disk render cache (engine/rendercache.py); a
schedule's new kernels then compile in one compiler run where the device offers `compile_many`.
`CompiledProgram.launch` runs one and keeps GlobalCounters and `runtime_stats`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from operator import attrgetter
from time import perf_counter
from typing import Any

from polygrad import config
from polygrad.codegen.lower import lower
from polygrad.codegen.search import choose_opts
from polygrad.config import current as settings
from polygrad.contract import ProgramSpec
from polygrad.device import Buffer, counts, debug_alloc, open_device
from polygrad.engine import rendercache
from polygrad.errors import VariableError
from polygrad.schedule.template import Template
from polygrad.uop.ops import UOp


@dataclass
class CompiledProgram:
    spec: ProgramSpec
    device: str
    program: Any
    source: str
    # the backend program's `pointer_call` (backend_api.py): one C call taking the handles' `ptr`s, for a
    # kernel without Variables; launch() takes it when there is one (no backend frame, no argument list)
    direct: Any = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.direct is None and not self.spec.vars:
            self.direct = getattr(self.program, "pointer_call", None)

    def var_args(self, var_vals: dict[UOp, int] | None) -> tuple[int, ...]:
        """The values of this kernel's variables, in the order of its parameters (spec.vars)."""
        if not self.spec.vars:
            return ()
        try:
            return tuple(var_vals[v] for v in self.spec.vars)  # type: ignore[index]
        except (KeyError, TypeError):
            missing = [v.arg[0] for v in self.spec.vars if not var_vals or v not in var_vals]
            raise VariableError(f"kernel {self.spec.name} needs a value for Variable {missing[0]!r}; bind it "
                                "(v.bind(n)) in the tensors being realized") from None

    def __call__(self, buffers: list[Buffer], var_vals: dict[UOp, int] | None = None) -> None:
        self.launch([b._handle if b._handle is not None else b.handle for b in buffers], var_vals, buffers)

    def launch(self, handles: list[Any], var_vals: dict[UOp, int] | None = None,
               buffers: list[Buffer] | None = None) -> None:
        """Run with the buffers' handles already taken (run_template); `buffers` is for POLY_DEBUG_ALLOC's check."""
        spec = self.spec
        debug = settings.values.get("DEBUG", 0)
        direct = self.direct
        if direct is not None and debug < 2:
            t0 = perf_counter()
            try:
                direct(*map(_ptr_of, handles))
            except (TypeError, AttributeError):  # checked before the call, so nothing ran: a pointer not
                self.program(handles, (), False)  # made yet (None), or a handle of another kind
            dt = perf_counter() - t0
        else:
            args = self.var_args(var_vals) if spec.vars else ()
            t0 = perf_counter()
            self.program(handles, args, debug >= 2)
            dt = perf_counter() - t0
        if debug_alloc.on and buffers is not None:
            debug_alloc.check(buffers, f"kernel {spec.name}")
        counts.kernel_count += 1
        counts.global_ops += spec.ops
        counts.global_mem += spec.mem_bytes
        counts.time_sum_s += dt
        runtime_stats["kernels_run"] += 1
        if debug >= 1:
            extra = f" {dt * 1e6:9.1f} us" if debug >= 2 else ""
            print(f"*** {self.device:6s} {spec.name:30s} ops={spec.ops}{extra}")


_ptr_of = attrgetter("ptr")
program_cache: dict[tuple, CompiledProgram] = {}  # cache_key -> program
runtime_stats: dict[str, int] = {"programs_compiled": 0, "program_cache_hits": 0, "kernels_run": 0,
                                 "schedules_built": 0, "copies": 0}


def count_kernels(n: int, ops: int, mem_bytes: int, seconds: float) -> None:
    """Add launched kernels to GlobalCounters and runtime_stats (for replays that launch many at once)."""
    counts.kernel_count += n
    counts.global_ops += ops
    counts.global_mem += mem_bytes
    counts.time_sum_s += seconds
    runtime_stats["kernels_run"] += n


def cache_key(ast: UOp, device: str) -> tuple:
    """The program_cache key of `ast` on `device` under this thread's settings (module docstring)."""
    return (ast, device, "tf32") if settings.values.get("POLY_ALLOW_TF32", 0) else (ast, device)


def get_program(ast: UOp, device: str) -> CompiledProgram:
    # cache_key inlined: one call less per launch
    key = (ast, device, "tf32") if settings.values.get("POLY_ALLOW_TF32", 0) else (ast, device)
    hit = program_cache.get(key)
    if hit is not None:
        runtime_stats["program_cache_hits"] += 1
        return hit
    return get_programs([ast], device)[0]


def get_programs(asts: list[UOp], device: str) -> list[CompiledProgram]:
    """Programs for several kernels of one device. The missing ones are lowered and rendered, then
    compiled in one go when the device offers `compile_many` (one compiler process for a schedule)."""
    # the programs are taken from this call's own table, not the cache, which collect() may empty meanwhile
    # from another thread (two threads missing at once compile twice, and either result serves)
    got = {a: hit for a in asts if (hit := program_cache.get(cache_key(a, device))) is not None}
    todo = list(dict.fromkeys(a for a in asts if a not in got))
    if todo:
        impl = open_device(device)
        specs, sources = [], []
        for ast in todo:
            spec, source = lower_and_render(ast, device, impl)
            specs.append(spec)
            sources.append(source)
        for spec, source in zip(specs, sources):
            if config.get("DEBUG") >= 3:  # each level adds to the one below: 4 shows the IR and the source
                print(spec.ast)
            if config.get("POLY_DUMP_KERNELS") or config.get("DEBUG") >= 4:
                print(f"// ---- {device} kernel {spec.name} (opts {list(spec.opts)})\n{source}")
        if impl.compile_many is not None and len(sources) > 1:
            binaries = impl.compile_many(sources)
        else:
            binaries = [impl.compile(source) for source in sources]
        for ast, spec, source, binary in zip(todo, specs, sources, binaries):
            program = CompiledProgram(spec, device, impl.load(spec, binary), source)
            got[ast] = program_cache[cache_key(ast, device)] = program
            runtime_stats["programs_compiled"] += 1
    return [got[a] for a in asts]


def lower_and_render(ast: UOp, device: str, impl: Any) -> tuple[ProgramSpec, Any]:
    """The lowered spec and the device's source for a kernel: from the on-disk render cache when the
    device allows it and an earlier process made them (engine/rendercache.py), else made now (and stored)."""
    opts = choose_opts(ast, device)
    if not impl.render_cacheable:
        spec = lower(ast, impl.capabilities, opts)
        return spec, impl.render(spec)
    name = rendercache.key(ast, device, impl, opts)
    hit = rendercache.load(device, name)
    if hit is not None:
        return hit
    spec = lower(ast, impl.capabilities, opts)
    source = impl.render(spec)
    rendercache.store(device, name, spec, source)
    return spec, source


def prepare(tpl: Template) -> None:
    """Compile a template's missing programs before its first run, each device's together."""
    by_device: dict[str, list[UOp]] = {}
    for step in tpl.steps:
        if step.kind == "kernel" and cache_key(step.ast, step.device) not in program_cache:
            by_device.setdefault(step.device, []).append(step.ast)
    for device, asts in by_device.items():
        get_programs(asts, device)
    tpl.prepared = True
