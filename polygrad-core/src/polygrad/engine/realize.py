"""Run schedules: compile (cached) and launch kernels, copy between devices, keep the counters.

Stage: execution. Input: a Template and its input buffers from the scheduler. Output: filled
buffers and the tensors' new buffer views. `engine/capture.py` listens here (`capture_hooks()`, the
running thread's hooks: a capture never sees another thread's launches) to record what ran; the JIT,
linalg and exports build on it. The values of bound variables (`var_vals`,
{DEFINE_VAR: int}) come from the scheduler and go to every launch: a program receives them as extra
integer arguments, in the order of its `spec.vars`.
"""
from __future__ import annotations

import sys
import threading
from dataclasses import dataclass
from time import perf_counter
from typing import Any, Callable

from polygrad import config
from polygrad.config import current as settings
from polygrad.device import Buffer, GlobalCounters, counts, debug_alloc, open_device  # noqa: F401 (re-exported)
from polygrad.engine import computed, rendercache
from polygrad.engine.lower import lower
from polygrad.contract import ProgramSpec
from polygrad.engine.search import choose_opts
from polygrad.engine.schedule import (SlotRef, Template, capacity_buffers, denormalize, normalize, record_effects,
                                      template_for)
from polygrad.errors import VariableError
from polygrad.uop import dataflow, sint
from polygrad.uop.ops import Ops, UOp


@dataclass
class CompiledProgram:
    spec: ProgramSpec
    device: str
    program: Any
    source: str

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
        args = self.var_args(var_vals) if spec.vars else ()
        debug = settings.values.get("DEBUG", 0)
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


program_cache: dict[tuple[UOp, str], CompiledProgram] = {}
runtime_stats: dict[str, int] = {"programs_compiled": 0, "program_cache_hits": 0, "kernels_run": 0,
                                 "schedules_built": 0, "copies": 0}


class _ThreadHooks(threading.local):
    """hook(step, program or None, buffers, n_inputs, var_vals) after each step of this thread's
    realizes; args >= n_inputs are new buffers. Per thread: work other threads do meanwhile is theirs."""

    def __init__(self) -> None:
        self.hooks: list[Callable[[Any, Any, list[Buffer], int, dict], None]] = []


_thread_hooks = _ThreadHooks()


def capture_hooks() -> list[Callable[[Any, Any, list[Buffer], int, dict], None]]:
    """The running thread's hook list. Installed only by engine/capture.py (use `with capture():`
    instead of appending here)."""
    return _thread_hooks.hooks


def count_kernels(n: int, ops: int, mem_bytes: int, seconds: float) -> None:
    """Add launched kernels to GlobalCounters and runtime_stats (for replays that launch many at once)."""
    counts.kernel_count += n
    counts.global_ops += ops
    counts.global_mem += mem_bytes
    counts.time_sum_s += seconds
    runtime_stats["kernels_run"] += n


def get_program(ast: UOp, device: str) -> CompiledProgram:
    key = (ast, device)
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
    got = {a: hit for a in asts if (hit := program_cache.get((a, device))) is not None}
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
            got[ast] = program_cache[(ast, device)] = CompiledProgram(spec, device, impl.load(spec, binary), source)
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
        if step.kind == "kernel" and (step.ast, step.device) not in program_cache:
            by_device.setdefault(step.device, []).append(step.ast)
    for device, asts in by_device.items():
        get_programs(asts, device)
    tpl.prepared = True


def copy_buffer(dst: Buffer, src: Buffer) -> None:
    data = src.numpy()
    if data.size != dst.size:  # symbolic sizes: one side is sized for the variables' maxima
        full = dst.numpy()
        n = min(full.size, data.size)
        full[:n] = data[:n]
        data = full
    dst.copyin(data)
    if debug_alloc.on:
        debug_alloc.check((dst, src), "a device copy")
    runtime_stats["copies"] += 1


def unwritten_new_buffers(tpl: Template) -> tuple[bool, ...]:
    """Per new buffer of a template: True unless its steps provably write every element before anything
    reads it (uop/dataflow.py); such buffers start zeroed, never holding an earlier computation's bytes.
    The scheduler's own kernels store densely, so this is normally all False."""
    n = tpl.n_inputs
    new = range(n, n + len(tpl.new_buffers))
    calls = [(step.ast if step.kind == "kernel" else None, step.args) for step in tpl.steps]

    def size(i: int) -> int:  # a copy's source holds at least the elements of its destination
        return int(sint.vmax(tpl.new_buffers[i - n][0])) if i >= n else sys.maxsize

    flow = dataflow.trace(calls, dataflow.kernel_access, set(new), list(new), size,
                          lambda i: dataflow.size_poly(tpl.new_buffers[i - n][0]))
    return tuple(i in flow.exposed for i in new)


def run_template(tpl: Template, inputs: list[Any], var_vals: dict[UOp, int] | None = None) -> list[Any]:
    table: list[Any] = list(inputs)
    if tpl.unwritten is None:
        tpl.unwritten = unwritten_new_buffers(tpl)
    for (size, dtype, device), unwritten in zip(tpl.new_buffers, tpl.unwritten):
        if type(size) is not int and sint.is_sym(size):
            # sized for the variables' largest values, so the buffer serves every binding (JIT replay)
            buf = Buffer(device, sint.vmax(size), dtype)
            capacity_buffers.add(buf)
            table.append(buf.ensure_allocated(written=not unwritten))
        else:
            table.append(Buffer(device, size, dtype).ensure_allocated(written=not unwritten))
    if not tpl.prepared:
        prepare(tpl)
    vals = var_vals or {}
    hooks = _thread_hooks.hooks
    for step in tpl.steps:
        if step.kind == "kernel" and not hooks and not debug_alloc.on:  # nothing wants the Buffers: handles only
            prog = get_program(step.ast, step.device)
            handles = [table[i]._handle for i in step.args]
            if None in handles:  # an input never allocated (an empty tensor's)
                handles = [table[i].handle for i in step.args]
            prog.launch(handles, vals)
            continue
        args = [table[i] for i in step.args]
        if step.kind == "copy":
            copy_buffer(args[0], args[1])
            for hook in hooks:
                hook(step, None, args, tpl.n_inputs, vals)
            continue
        prog = get_program(step.ast, step.device)
        prog(args, vals)
        for hook in hooks:
            hook(step, prog, args, tpl.n_inputs, vals)
    return table


def realize_uops(targets: list[UOp], effect_free: bool = False) -> list[UOp] | None:
    """Realize tensor-graph nodes; returns their buffer views (BUFFER or RESHAPE(BUFFER)). With
    `effect_free`, a graph holding a pending effect (ASSIGN/AFTER not yet run) is left alone and None comes
    back: the caller must first order its reads and writes (Tensor's _realize_tensors)."""
    effects: list[UOp] = []
    var_vals: dict[UOp, int] = {}
    # values computed before are read, and this realize's are kept (engine/computed.py), unless a
    # capture records: it must see every kernel its work needs
    capturing = bool(_thread_hooks.hooks)  # this thread's capture_hooks(), inline
    walked: dict[UOp, UOp] | None = None if capturing else {}
    since = computed._generation[0]  # computed.generation(), inline
    key, inputs = normalize(targets, effects, var_vals, None if capturing else computed.views(), walked)
    if effects and effect_free:
        return None
    tpl = template_for(key, len(inputs))
    table = run_template(tpl, inputs, var_vals)
    if effects:
        record_effects(effects)
    elif walked is not None and not var_vals and tpl.kept:
        computed.remember(walked, tpl.kept, table, since)
    out = []
    for u in tpl.outputs:
        if u.op is Ops.BUFFER and type(u.arg) is SlotRef:  # a whole new buffer: denormalize, inline
            out.append(UOp(Ops.BUFFER, u.dtype, (), table[u.arg.index]))
        else:
            out.append(denormalize(u, table, var_vals))
    return out
