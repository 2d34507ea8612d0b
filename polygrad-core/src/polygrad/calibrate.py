"""`python -m polygrad calibrate`: time the register-tile and staging choices on this processor, keep the winners.

Stage: tuning (run by hand, once per machine; opt-in). Input: a host device (CPU or X86), its
Capabilities (from polygrad/hostcpu.py's description) and a few canonical kernels: a square matmul,
`x @ W.T` with a 3072-wide weight and a 3x3 convolution. Output: a calibration entry
(`hostcpu.store_calibration`, under POLY_CACHE_DIR/calibration) keyed by the processor model, its
flags and the code generator (the C compiler's version; the X86 backend's version and tier). The
device reads it when it opens: its `tile_vectors` and `stage_bytes` replace the derived ones for every
kernel, so every matmul-like kernel follows the winners. Another processor model, other flags or
another compiler find no entry and keep the heuristics.

The space is small on purpose (vectors per tile row x staging budget, a dozen variants, each kernel
compiled once per distinct opt list): it picks among tiles the heuristics already know how to build,
which a BEAM search per kernel (BEAM=n) explores much more widely and slowly. A variant must beat the
heuristic choice by MIN_GAIN over the canonical kernels (geometric mean) to replace it, so timing noise
on a busy machine keeps the heuristics.
"""
from __future__ import annotations

import dataclasses
import math
import statistics
import time
from typing import Any, Callable

from polygrad.codegen.lower import default_opts
from polygrad.codegen.passes import kernel_for_opts
from polygrad.codegen.search import CandidateTimer
from polygrad.device import open_device
from polygrad.hostcpu import STAGE_MAX_BYTES, code_generator_of, describe_cpu, store_calibration
from polygrad.schedule.template import schedule
from polygrad.tensor import Tensor
from polygrad.uop.ops import Ops, UOp

MIN_GAIN = 0.97  # a variant replaces the heuristics only when 3% faster over the canonical kernels
ROUNDS = 9       # timing rounds, the variants alternating within each (each a best of search.TIMING_RUNS)

# the kernels timed: (name, a function of the device that builds the expression)
CANONICAL: tuple[tuple[str, Callable[[str], Tensor]], ...] = (
    ("matmul 512x512 @ 512x512", lambda d: Tensor.empty(512, 512, device=d) @ Tensor.empty(512, 512, device=d)),
    ("x @ W.T 128x768 -> 3072", lambda d: Tensor.empty(128, 768, device=d) @ Tensor.empty(3072, 768, device=d).T),
    ("conv 3x3 64->64 2x56x56", lambda d: Tensor.empty(2, 64, 56, 56, device=d).conv2d(
        Tensor.empty(64, 64, 3, 3, device=d), padding=1)),
)


def canonical_kernels(device: str) -> list[tuple[str, UOp]]:
    """(name, kernel AST) of each canonical expression's reduction kernel."""
    out = []
    for name, build in CANONICAL:
        tpl, _ = schedule([build(device).uop])
        asts = [s.ast for s in tpl.steps if s.kind == "kernel"]
        reducing = [a for a in asts if any(n.op is Ops.REDUCE for n in a.toposort())]
        out.append((name, reducing[-1]))
    return out


def variants(caps: Any) -> list[dict[str, int]]:
    """The tile choices tried: vectors per tile row that fit the registers with their accumulators,
    times staging budgets (none, a quarter, half or all of the L2, within the stack's limit) where the
    device stages."""
    regs = caps.registers or 16
    vectors = [v for v in (1, 2, 4) if 2 * v + 1 <= regs]
    stages = [0]
    if caps.stage_bytes:
        l2 = caps.l2_bytes or 2 * caps.stage_bytes
        stages = sorted({0, *(min(b, STAGE_MAX_BYTES) for b in (l2 // 4, l2 // 2, l2))})
    return [{"tile_vectors": v, "stage_bytes": s} for v in vectors for s in stages]


def calibrate(device: str = "CPU", log: Callable[[str], None] = print) -> dict[str, Any]:
    """Time every variant on the canonical kernels of `device`, store the winner for this processor,
    and return the stored entry."""
    impl = open_device(device)
    caps = impl.capabilities
    heuristic = {"tile_vectors": caps.tile_vectors, "stage_bytes": caps.stage_bytes}
    tried = variants(caps)
    if heuristic not in tried:
        tried.append(heuristic)
    base = tried.index(heuristic)
    start = time.perf_counter()
    ratios: list[list[float]] = [[] for _ in tried]
    for name, ast in canonical_kernels(device):
        rounds = _time_kernel(ast, impl, tried)
        for i, times in enumerate(rounds):
            # each round's time over the heuristic's in the same round: load that comes and goes on a shared
            # machine slows both alike; the median over rounds drops the round a burst hit
            ratios[i].append(statistics.median(t / h for t, h in zip(times, rounds[base])))
        log(f"  {name}: " + ", ".join(f"{_label(v)} {min(t) * 1e3:.2f} ms" for v, t in zip(tried, rounds)))
    score = [math.exp(sum(math.log(r) for r in rs) / len(rs)) for rs in ratios]
    best = min(range(len(tried)), key=lambda i: score[i])
    chosen = tried[best] if score[best] < MIN_GAIN else heuristic
    entry = {**chosen, "heuristic": heuristic, "seconds": round(time.perf_counter() - start, 1),
             "relative_time": {_label(v): round(score[i], 4) for i, v in enumerate(tried)}}
    path = store_calibration(describe_cpu(), device, code_generator_of(device), entry)
    log(f"chosen {_label(chosen)} (heuristic {_label(heuristic)}); stored in {path}")
    return entry


def _label(v: dict[str, int]) -> str:
    return f"{v['tile_vectors']} vectors/row, stage {v['stage_bytes'] >> 10} KiB"


def _time_kernel(ast: UOp, impl: Any, tried: list[dict[str, int]]) -> list[list[float]]:
    """Per variant, the seconds of `ast` lowered with that variant's heuristic opts in each of ROUNDS
    rounds that alternate between the distinct opt lists (each compiled once)."""
    base = kernel_for_opts(ast)
    opts_of = [default_opts(base, dataclasses.replace(impl.capabilities, **v)) for v in tried]
    distinct = list({tuple(o): o for o in opts_of}.values())
    programs = []
    for opts in distinct:
        caps = dataclasses.replace(impl.capabilities, **tried[opts_of.index(opts)])
        timer = CandidateTimer(ast, dataclasses.replace(impl, capabilities=caps))
        programs.append((timer, timer.build(opts)))
    rounds: list[list[float]] = [[] for _ in distinct]
    for _ in range(ROUNDS):
        for k, (timer, program) in enumerate(programs):
            rounds[k].append(timer.measure(program))
    return [rounds[distinct.index(o)] for o in opts_of]
