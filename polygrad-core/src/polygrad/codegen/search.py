"""BEAM search over kernel optimisations, timed on the device; winners cached on disk.

Stage: lowering (device optimisation). Input: a scheduled kernel AST and a device. Output: the list
of Opts to apply (None: let the heuristics in `lower` decide, as with BEAM=0).

With BEAM=N the search starts from no opts and the heuristic choice, and at each depth extends
every kept candidate by one more UPCAST (a global range), SPLIT_REDUCE (a reduce range) or THREAD
(the outermost range, on a device with threads); on a GPU-style device (local memory) by one more
LOCAL, GROUP or UPCAST, or a tensor-core or shared-memory tile template (gpu_search.py). Each candidate
is lowered, rendered, compiled and timed on scratch buffers; the N fastest survive. The winner is
stored under POLY_CACHE_DIR/beam/<device>/<hash of the kernel>.opts (JSON in a checked entry of
polygrad.diskcache; the hash covers the device's architecture, Capabilities.arch, where it names one,
and POLY_ALLOW_TF32 where the device has TF32 tensor cores, whose candidates it decides),
so a second process (or the same one after `collect()`) pays nothing; a winner an older polygrad kept
as plain `<hash>.json` there is still used, and moved into the new entry. DEBUG>=1 and
POLY_DUMP_KERNELS print the choice.
Custom kernels (no "generated" in their KernelInfo opts: the scheduler did not make them) and kernels
over symbolic sizes are never searched.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from polygrad import config
from polygrad.codegen import gpu_search
from polygrad.codegen.analysis import ranges_of, thread_axis
from polygrad.codegen.lower import default_opts, lower
from polygrad.codegen.opts import Opt, OptKind, apply_opts
from polygrad.codegen.passes import kernel_for_opts
from polygrad.device import Buffer, open_device
from polygrad.diskcache import cache_dir, read_entry, write_entry
from polygrad.errors import CompileError
from polygrad.uop.ops import KernelInfo, Ops, UOp

AMOUNTS = (2, 4, 8, 16)
MAX_DEPTH = 2
MAX_UNROLL = 512  # product of all split amounts: bigger bodies compile slowly and rarely win
TIMING_RUNS = 3
COMPILE_WORKERS = max(1, min(8, os.cpu_count() or 1))
MIN_GAIN = 0.97  # a deeper level must beat the best so far by 3% to continue
SEARCH_VERSION = 4  # 2: THREAD is part of the searched space; 3: OUTER + STAGE too; 4: opts name the
# ranges of kernel_for_opts (merged ranges split), not those of the simplified kernel
SPLITS = (OptKind.UPCAST, OptKind.SPLIT_REDUCE, OptKind.UNROLL)

beam_cache: dict[tuple[str, str], list[Opt]] = {}


def choose_opts(ast: UOp, device: str) -> list[Opt] | None:
    """The opts to lower `ast` with on `device`: None (heuristics) unless BEAM > 0."""
    width = config.get("BEAM")
    if width <= 0 or config.get("NOOPT") or not _searchable(ast):
        return None
    impl = open_device(device)
    if not getattr(impl.capabilities, "supports_beam", True):
        return None
    key = kernel_key(ast, device, width, search_variant(impl.capabilities))
    hit = beam_cache.get((device, key))
    if hit is None:
        hit = _load(device, key)
        if hit is not None:
            _report(ast, device, hit, "disk cache", None, 0)
    if hit is None:
        hit, best_s, tried = beam_search(ast, impl, width)
        _report(ast, device, hit, "searched", best_s, tried)
        _store(device, key, hit, best_s, tried)
    beam_cache[(device, key)] = hit
    return list(hit)


def _searchable(ast: UOp) -> bool:
    info = ast.arg
    if not (isinstance(info, KernelInfo) and "generated" in info.opts):
        return False
    if any(n.op is Ops.STORE and n.arg is not None for n in ast.toposort()):
        return False  # an accumulating store (scatter) runs without opts
    # kernels over symbolic sizes keep the heuristics: timings would hold for one binding only
    return not any(n.op is Ops.DEFINE_VAR for n in ast.toposort())


# ---------------------------------------------------------------------------------------------------
# the search


def candidate_opts(ast: UOp, opts: list[Opt], caps: Any = None) -> list[list[Opt]]:
    """Every opt list that extends `opts` by one valid UPCAST, SPLIT_REDUCE, (on a device with masked
    lanes, for a range the width does not divide) PADTO + UPCAST, (on a device with threads) THREAD,
    or cache blocking (OUTER + STAGE of a loaded buffer at a global range, for a
    kernel with a reduction): the same space the heuristics choose from. A GPU-style device (local
    memory) has a space of its own (gpu_search.gpu_candidates)."""
    if getattr(caps, "has_local_memory", False):
        return gpu_search.gpu_candidates(ast, opts, caps)
    current = apply_opts(ast, opts) if opts else ast
    budget = MAX_UNROLL // math.prod(o.amount for o in opts if o.kind in SPLITS)
    out: list[list[Opt]] = []
    threads = getattr(caps, "threads", 1)
    if threads > 1 and not any(o.kind is OptKind.THREAD for o in opts):
        r = thread_axis(current, threads)
        if r is not None:
            out.append(opts + [Opt(OptKind.THREAD, r.arg[0], min(threads, int(r.src[0].arg)))])
    lanes = caps is None or caps.vector_width > 1
    if lanes and not any(o.kind is OptKind.STAGE for o in opts) and len(current.src) == 1 \
            and current.src[0].op is Ops.END and any(n.op is Ops.REDUCE for n in current.toposort()):
        slots = sorted({n.src[0].src[0].arg[0] for n in current.toposort() if n.op is Ops.LOAD})
        for r in current.src[0].src[1:]:
            if r.arg[1] == "global":
                out += [opts + [Opt(OptKind.OUTER, r.arg[0], 0), Opt(OptKind.STAGE, r.arg[0], s)] for s in slots]
    for r in ranges_of(current):
        kind = {"global": OptKind.UPCAST, "reduce": OptKind.SPLIT_REDUCE}.get(r.arg[1]) if lanes else None
        size = int(r.src[0].arg)
        if kind is None:
            continue
        for amount in AMOUNTS:
            if amount > budget:
                break
            if size % amount == 0 and size > amount:
                out.append(opts + [Opt(kind, r.arg[0], amount)])
            elif size == amount and kind is OptKind.UPCAST:
                out.append(opts + [Opt(kind, r.arg[0], amount)])
        width = getattr(caps, "vector_width", 1)
        if kind is OptKind.UPCAST and getattr(caps, "masked_lanes", False) and size % width and width <= budget:
            # a size the lanes do not divide: padded, the last vector masked (as the heuristics do)
            out.append(opts + [Opt(OptKind.PADTO, r.arg[0], width), Opt(kind, r.arg[0], width)])
    return out


def beam_search(ast: UOp, impl: Any, width: int) -> tuple[list[Opt], float, int]:
    """(best opts, best time in seconds, candidates timed) for `ast` on the opened device `impl`."""
    base = kernel_for_opts(ast)
    timer = CandidateTimer(ast, impl)
    seen: dict[tuple[Opt, ...], float] = {}

    def time_all(cands: list[list[Opt]]) -> list[tuple[float, list[Opt]]]:
        fresh = list({tuple(c): c for c in cands if tuple(c) not in seen}.values())
        for c, program in zip(fresh, timer.build_all(fresh)):
            seen[tuple(c)] = timer.measure(program)
        timed = []
        for c in cands:
            k = tuple(c)
            if seen[k] < float("inf"):
                timed.append((seen[k], c))
        return timed

    caps = impl.capabilities
    beam = sorted(time_all([[], default_opts(base, caps)]), key=lambda x: x[0])[:width]
    best_time, best = beam[0] if beam else (float("inf"), [])
    for _ in range(gpu_search.MAX_DEPTH if getattr(caps, "has_local_memory", False) else MAX_DEPTH):
        cands = [c for _, opts in beam for c in candidate_opts(base, opts, caps)]
        timed = sorted(time_all(cands), key=lambda x: x[0])
        if not timed or timed[0][0] >= best_time * MIN_GAIN:
            break
        best_time, best = timed[0]
        beam = timed[:width]
    return best, best_time, len(seen)


class CandidateTimer:
    """Compiles and times candidates of one kernel on scratch buffers."""

    def __init__(self, ast: UOp, impl: Any):
        self.ast, self.impl = ast, impl
        spec = lower(ast, None, [])
        self.buffers = []
        for g in spec.globals:
            buf = Buffer(impl.name, g.size, g.dtype)
            buf.copyin(np.zeros(g.size, dtype=g.dtype.np))
            self.buffers.append(buf)

    def build(self, opts: list[Opt]) -> Any:
        """The loaded program for one candidate, or None when it fails to lower, render or compile."""
        try:
            spec = lower(self.ast, self.impl.capabilities, list(opts))
            return self.impl.load(spec, self.impl.compile(self.impl.render(spec)))
        except (CompileError, NotImplementedError, RuntimeError, ValueError):
            return None

    def build_all(self, cands: list[list[Opt]]) -> list[Any]:
        """Compile candidates concurrently (compilers run as subprocesses, outside the GIL)."""
        if len(cands) <= 1:
            return [self.build(c) for c in cands]
        with ThreadPoolExecutor(max_workers=min(COMPILE_WORKERS, len(cands))) as pool:
            return list(pool.map(self.build, cands))

    def measure(self, program: Any) -> float:
        """Best of a few timed runs in seconds; inf when the candidate failed to build or run."""
        if program is None:
            return float("inf")
        handles = [b.handle for b in self.buffers]
        times = []
        try:
            for _ in range(TIMING_RUNS):
                t = program(handles, (), True)
                times.append(t if t is not None else float("inf"))
        except (RuntimeError, ValueError, IndexError):
            return float("inf")
        return min(times)


# ---------------------------------------------------------------------------------------------------
# the on-disk cache


def search_variant(caps: Any) -> str:
    """What besides the device's name decides a search's result: its architecture (Capabilities.arch,
    "sm_80": one CUDA device name covers every GPU), and TF32 allowed where TF32 tensor cores are among
    the candidates. Empty for host devices, whose keys stay as they were."""
    parts = [getattr(caps, "arch", "") or ""]
    if "mma_tf32" in getattr(caps, "tensor_cores", ()) and config.get("POLY_ALLOW_TF32"):
        parts.append("tf32")
    return "|".join(p for p in parts if p)


def kernel_key(ast: UOp, device: str, width: int, variant: str = "") -> str:
    """A stable hash of the kernel's full structure, the device, the beam width and `variant`
    (search_variant: the architecture and the like)."""
    head = f"v{SEARCH_VERSION}|{device}|{width}" + (f"|{variant}" if variant else "")
    h = hashlib.sha256(f"{head}\n".encode())
    names: dict[UOp, int] = {}
    for i, node in enumerate(ast.toposort()):
        names[node] = i
        srcs = ",".join(str(names[s]) for s in node.src)
        h.update(f"{node.op.name}|{node.dtype!r}|{srcs}|{node.arg!r}\n".encode())
    return h.hexdigest()[:32]


def _path(device: str, key: str) -> str:
    return os.path.join(cache_dir("beam", _folder_name(device)), f"{key}.opts")


def _legacy_path(device: str, key: str) -> str:
    """Where polygrad before the checked entries kept a winner: plain JSON, beside the new entries."""
    return os.path.join(cache_dir("beam", _folder_name(device)), f"{key}.json")


def _folder_name(device: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in device)


def _load(device: str, key: str) -> list[Opt] | None:
    """The stored winner: a checked entry (diskcache), else a legacy JSON file, which is moved into a
    checked entry so the searches it saved stay saved."""
    data = read_entry(_path(device, key))
    legacy = _legacy_path(device, key) if data is None else None
    if legacy is not None:
        try:
            with open(legacy, "rb") as f:
                data = f.read()
        except OSError:
            return None
    try:
        obj = json.loads(data)
        opts = [Opt(OptKind(k), int(a), int(n)) for k, a, n in obj["opts"]]
    except (ValueError, KeyError, TypeError):
        return None  # an entry of another layout: searched again and overwritten
    if legacy is not None:
        _store(device, key, opts, obj.get("time_s"), obj.get("candidates"))
        with contextlib.suppress(OSError):
            os.unlink(legacy)
    return opts


def _store(device: str, key: str, opts: list[Opt], best_s: float | None, tried: int | None) -> None:
    data = {"opts": [[o.kind.value, o.axis, o.amount] for o in opts], "time_s": best_s, "candidates": tried}
    try:
        write_entry(_path(device, key), json.dumps(data).encode())
    except OSError:
        pass  # a read-only cache only costs a search next time


def _report(ast: UOp, device: str, opts: list[Opt], how: str, best_s: float | None, tried: int) -> None:
    if not (config.get("DEBUG") >= 1 or config.get("POLY_DUMP_KERNELS")):
        return
    name = getattr(ast.arg, "name", "kernel")
    chosen = ", ".join(f"{o.kind.value}({o.axis},{o.amount})" for o in opts) or "no opts"
    timing = f" {best_s * 1e6:.1f} us over {tried} candidates" if best_s is not None else ""
    print(f"BEAM {device} {name}: {chosen} ({how}{timing})")

