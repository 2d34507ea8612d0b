"""Run schedules: compile (cached) and launch kernels, copy between devices, keep the counters.

Stage: execution. Input: a Template and its input buffers from the scheduler. Output: filled
buffers and the tensors' new buffer views. `engine/capture.py` listens here (`capture_hooks`) to record
what ran; the JIT, linalg and exports build on it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

from polygrad import config
from polygrad.device import Buffer, GlobalCounters, open_device
from polygrad.engine.lower import lower
from polygrad.engine.program import ProgramSpec
from polygrad.engine.schedule import Template, denormalize, record_effects, schedule
from polygrad.uop.ops import UOp


@dataclass
class CompiledProgram:
    spec: ProgramSpec
    device: str
    program: Any
    source: str

    def __call__(self, buffers: list[Buffer]) -> None:
        handles = [b.handle for b in buffers]
        timing = config.get("DEBUG") >= 2
        t0 = time.perf_counter()
        self.program(handles, (), timing)
        dt = time.perf_counter() - t0
        GlobalCounters.kernel_count += 1
        GlobalCounters.global_ops += self.spec.ops
        GlobalCounters.global_mem += self.spec.mem_bytes
        GlobalCounters.time_sum_s += dt
        runtime_stats["kernels_run"] += 1
        if config.get("DEBUG") >= 1:
            extra = f" {dt * 1e6:9.1f} us" if timing else ""
            print(f"*** {self.device:6s} {self.spec.name:30s} ops={self.spec.ops}{extra}")


program_cache: dict[tuple[UOp, str], CompiledProgram] = {}
runtime_stats: dict[str, int] = {"programs_compiled": 0, "program_cache_hits": 0, "kernels_run": 0,
                                 "schedules_built": 0, "copies": 0}
# hook(step, program or None, buffers, n_inputs) after each step; args >= n_inputs are new buffers.
# Installed only by engine/capture.py (use `with capture():` instead of appending here).
capture_hooks: list[Callable[[Any, Any, list[Buffer], int], None]] = []


def get_program(ast: UOp, device: str) -> CompiledProgram:
    key = (ast, device)
    hit = program_cache.get(key)
    if hit is not None:
        runtime_stats["program_cache_hits"] += 1
        return hit
    impl = open_device(device)
    from polygrad.engine.search import choose_opts
    spec = lower(ast, impl.capabilities, choose_opts(ast, device))
    source = impl.render(spec)
    if config.get("DEBUG") >= 3:  # each level adds to the one below: 4 shows the IR and the source
        print(spec.ast)
    if config.get("POLY_DUMP_KERNELS") or config.get("DEBUG") >= 4:
        print(f"// ---- {device} kernel {spec.name} (opts {list(spec.opts)})\n{source}")
    binary = impl.compile(source)
    prog = CompiledProgram(spec, device, impl.load(spec, binary), source)
    runtime_stats["programs_compiled"] += 1
    program_cache[key] = prog
    return prog


def copy_buffer(dst: Buffer, src: Buffer) -> None:
    dst.copyin(src.numpy())
    runtime_stats["copies"] += 1


def run_template(tpl: Template, inputs: list[Any]) -> list[Any]:
    table: list[Any] = list(inputs)
    for size, dtype, device in tpl.new_buffers:
        table.append(Buffer(device, size, dtype))
    for step in tpl.steps:
        args = [table[i] for i in step.args]
        if step.kind == "copy":
            copy_buffer(args[0], args[1])
            for hook in capture_hooks:
                hook(step, None, args, tpl.n_inputs)
            continue
        prog = get_program(step.ast, step.device)
        prog(args)
        for hook in capture_hooks:
            hook(step, prog, args, tpl.n_inputs)
    return table


def realize_uops(targets: list[UOp]) -> list[UOp]:
    """Realize tensor-graph nodes; returns their buffer views (BUFFER or RESHAPE(BUFFER))."""
    effects: list[UOp] = []
    tpl, inputs = schedule(targets, effects)
    table = run_template(tpl, inputs)
    record_effects(effects)
    return [denormalize(out, table) for out in tpl.outputs]
