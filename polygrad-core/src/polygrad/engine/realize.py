"""Run schedules: launch each step's kernel (compiled through engine/programs.py), copy between devices.

Stage: execution. Input: a Template and its input buffers from the scheduler. Output: filled
buffers and the tensors' new buffer views. `engine/capture.py` listens here (`capture_hooks()`, the
running thread's hooks: a capture never sees another thread's launches) to record what ran; the JIT,
linalg and exports build on it. The values of bound variables (`var_vals`,
{DEFINE_VAR: int}) come from the scheduler and go to every launch: a program receives them as extra
integer arguments, in the order of its `spec.vars`.
"""
from __future__ import annotations

import contextlib
import sys
import threading
import weakref
from operator import attrgetter
from time import perf_counter
from typing import Any, Callable, Iterator

from polygrad.config import current as settings
from polygrad.device import Buffer, counts, debug_alloc, host_access
from polygrad.engine import programs  # programs.get_program looked up per call: tests and tools wrap it
from polygrad.engine.programs import prepare, runtime_stats
from polygrad.schedule import computed
from polygrad.schedule.normalize import (SlotRef, capacity_buffers, denormalize, leaf_signature, normalize,
                                         record_effects)
from polygrad.schedule import template as schedule_template  # leaf_cache looked up per call: tests swap it
from polygrad.schedule.template import Template, remember_leaf, template_for
from polygrad.uop import dataflow, sint
from polygrad.uop.ops import Ops, UOp


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


class _Deferred(threading.local):
    """This thread's launches held back by `deferred()`: (step, buffers, var_vals) in launch order, or
    None when launches run as they come."""

    def __init__(self) -> None:
        self.pending: list[tuple[Any, list[Buffer], dict]] | None = None


_deferred = _Deferred()


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Inside the block the launches this thread's captures record (the capture hooks see each, with no
    program) are neither compiled nor run until something needs their results: a host read or write of
    any buffer (`Buffer.numpy`, `copyin`), an unrecorded realize, a graph replay or a Model call runs
    everything pending first, in order (`flush_deferred`). What is still pending when the block ends is dropped. For a
    capture whose run only records (Model's): it compiles nothing, and each entrypoint compiles its own
    kernels when first called. Nested blocks share the outer one's queue."""
    if _deferred.pending is not None:
        yield
        return
    _deferred.pending = []
    host_access.before = flush_deferred
    try:
        yield
    finally:
        _deferred.pending = None
        host_access.before = None


def flush_deferred() -> None:
    """Compile (a device's kernels together) and run this thread's deferred launches, in order."""
    pending = _deferred.pending
    if not pending:
        return
    _deferred.pending = []
    host_access.before = None  # the copies below read and write buffers themselves
    try:
        by_device: dict[str, list[UOp]] = {}
        for step, _, _ in pending:
            if step.kind == "kernel" and programs.cache_key(step.ast, step.device) not in programs.program_cache:
                by_device.setdefault(step.device, []).append(step.ast)
        for device, asts in by_device.items():
            programs.get_programs(asts, device)
        for step, args, vals in pending:
            if step.kind == "copy":
                copy_buffer(args[0], args[1])
            else:
                programs.get_program(step.ast, step.device)(args, vals)
    finally:
        host_access.before = flush_deferred


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
    vals = var_vals or {}
    hooks = _thread_hooks.hooks
    pending = _deferred.pending
    if pending is not None:
        if hooks:  # deferred() and recorded: compiled and run when a result is needed
            for step in tpl.steps:
                args = [table[i] for i in step.args]
                pending.append((step, args, vals))
                for hook in hooks:
                    hook(step, None, args, tpl.n_inputs, vals)
            return table
        flush_deferred()  # unrecorded work (capture.paused()) runs now, after what it may read
    if not tpl.prepared:
        prepare(tpl)
    for step in tpl.steps:
        if step.kind == "kernel" and not hooks and not debug_alloc.on:  # nothing wants the Buffers: handles only
            prog = programs.get_program(step.ast, step.device)
            handles = list(map(_handle_of, map(table.__getitem__, step.args)))  # no Python frame per call
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
        prog = programs.get_program(step.ast, step.device)
        prog(args, vals)
        for hook in hooks:
            hook(step, prog, args, tpl.n_inputs, vals)
    return table


def realize_eager(target: UOp) -> UOp | None:
    """realize_uops([target]) for an eager op whose structure was seen (template.leaf_cache): its buffer
    view, or None where it takes realize_uops' walk (another graph, a structure not seen yet, a capture
    recording, POLY_DEBUG_ALLOC). Tensor.realize tries it first. What run_template and computed.remember
    would do for the entry's one kernel, without their general loops: one buffer from the reuse cache
    (the kernel writes every element), the launch, the output's view, the target's kept value."""
    if _thread_hooks.hooks or debug_alloc.on:
        return None
    since = computed._generation[0]
    leaf = leaf_signature(target, computed._views or None)
    if leaf is None:
        return None
    hit = schedule_template.leaf_cache.get(leaf[0])
    if hit is None:
        return None
    step = hit.kernel
    inputs = leaf[1]
    size, dtype, device = hit.template.new_buffers[0]
    result = _written_buffer(device, size, dtype)  # no zero fill: the kernel writes it all
    inputs.append(result)
    prog = programs.get_program(step.ast, device)
    direct = prog.direct
    debug = settings.values.get("DEBUG", 0)
    if direct is not None and not debug:  # CompiledProgram.launch's direct path, inline (one frame less)
        t0 = perf_counter()
        try:
            direct(*map(_ptr_of_buffer, hit.pick(inputs)))
        except (TypeError, AttributeError):  # checked before the call, so nothing ran: a pointer not made
            direct = None  # yet, or an input never allocated (its handle None): launch() below handles both
        else:
            dt = perf_counter() - t0
            spec = prog.spec
            counts.kernel_count += 1
            counts.global_ops += spec.ops
            counts.global_mem += spec.mem_bytes
            counts.time_sum_s += dt
            runtime_stats["kernels_run"] += 1
    if direct is None or debug:
        handles = list(map(_handle_of, hit.pick(inputs)))  # no Python frame per handle
        if None in handles:  # an input never allocated (an empty tensor's)
            handles = [buf.handle for buf in hit.pick(inputs)]
        prog.launch(handles)
    out = _fresh_uop(_BUFFER, target.dtype, result)
    if hit.out_shape is not None:
        out = UOp(Ops.RESHAPE, target.dtype, (out,), hit.out_shape)
    if hit.keep and since == computed._generation[0]:  # computed.remember for the target alone, inline
        if result.serial > computed._newest[0]:  # the new buffer is the newest of the table
            computed._newest[0] = result.serial
        computed._views[weakref.ref(target, computed._drop)] = out
    return out


_handle_of = attrgetter("_handle")
_ptr_of_buffer = attrgetter("_handle.ptr")  # a Buffer's pointer for a direct launch, in one C call
_written_buffer, _fresh_uop, _BUFFER = Buffer.written, UOp.fresh, Ops.BUFFER  # no class attribute read per call


def realize_uops(targets: list[UOp], effect_free: bool = False) -> list[UOp] | None:
    """Realize tensor-graph nodes; returns their buffer views (BUFFER or RESHAPE(BUFFER)). With
    `effect_free`, a graph holding a pending effect (ASSIGN/AFTER not yet run) is left alone and None comes
    back: the caller must first order its reads and writes (Tensor's _realize_tensors)."""
    # values computed before are read, and this realize's are kept (schedule/computed.py), unless a
    # capture records: it must see every kernel its work needs
    capturing = bool(_thread_hooks.hooks)  # this thread's capture_hooks(), inline
    reuse = None if capturing else (computed._views or None)  # computed.views(), inline
    leaf = None
    if len(targets) == 1 and not capturing and not debug_alloc.on:  # an eager op seen before: no walk
        out = realize_eager(targets[0])
        if out is not None:
            return [out]
        leaf = leaf_signature(targets[0], reuse)  # remembered below, once the walk made its template
    effects: list[UOp] = []
    var_vals: dict[UOp, int] = {}
    walked: dict[UOp, UOp] | None = None if capturing else {}
    since = computed._generation[0]  # computed.generation(), inline
    key, inputs = normalize(targets, effects, var_vals, reuse, walked)
    if effects and effect_free:
        return None
    tpl = template_for(key, len(inputs))
    table = run_template(tpl, inputs, var_vals)
    if leaf is not None and walked is not None and not effects and not var_vals and len(leaf[1]) == len(inputs) \
            and all(a is b for a, b in zip(leaf[1], inputs)):
        remember_leaf(leaf[0], tpl, key, list(walked.values()))
    out = []
    for u in tpl.outputs:
        if u.op is Ops.BUFFER and type(u.arg) is SlotRef:  # a whole new buffer: denormalize, inline
            out.append(UOp(Ops.BUFFER, u.dtype, (), table[u.arg.index]))
        else:
            out.append(denormalize(u, table, var_vals))
    if effects:
        record_effects(effects)
    elif walked is not None and not var_vals and tpl.kept:
        # after the outputs: a target's kept view is the output's node (a hash-cons hit, not a new node)
        computed.remember(walked, tpl.kept, table, since)
    return out
