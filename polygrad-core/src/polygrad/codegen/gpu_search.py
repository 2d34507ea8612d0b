"""BEAM's candidate space on GPU-style devices (Capabilities.has_local_memory): the opts gpu_opts.py chooses from.

Stage: lowering (device optimisation). Input: a kernel AST (kernel_for_opts' form), the opts chosen so
far and the device's Capabilities. Output: every opt list that extends them by one step; search.py
times them on the device and keeps the fastest (the host devices' space is in search.py itself).

A step is one of:
  TC     tensor cores (Opt(TC, reduce axis, mma depth)) for a matmul tensor_core_opts accepts (float16,
         bfloat16; float32 only with POLY_ALLOW_TF32=1, so BEAM never rounds to TF32 unasked);
  TILE   a float32 matmul staged through shared memory, one candidate per block tile of
         gpu_opts.MATMUL_TILES whose shared memory fits the device;
  GROUP  the innermost reduce range of a kernel's one reduction shared by a block's threads (GROUP_AMOUNTS);
  UPCAST a global range split into a register tile or vector lanes (UPCAST_AMOUNTS, at most MAX_UPCAST
         outputs a thread);
  LOCAL  a global range split into a block's threads (the largest LOCAL_CHOICES amounts of LOCAL_AMOUNTS
         that divide it and keep a block at most MAX_BLOCK_THREADS threads).
TC and TILE are whole-kernel templates: they start a list and end it. UPCAST comes before LOCAL, and
GROUP before both, as gpu_opts orders them (a later split names ranges the earlier ones made).
"""
from __future__ import annotations

import math
from typing import Any

from polygrad.codegen.analysis import range_size, ranges_of
from polygrad.codegen.gpu_opts import (GROUP_AMOUNTS, LOCAL_AMOUNTS, MATMUL_TILES, matmul_with_epilogue,
                                       tensor_core_opts)
from polygrad.codegen.opts import Opt, OptKind, apply_opts
from polygrad.uop.ops import AxisKind, Ops, UOp

UPCAST_AMOUNTS = (2, 4, 8)
MAX_UPCAST = 64          # outputs a thread computes (registers)
MAX_BLOCK_THREADS = 1024  # CUDA's limit on a block's threads
LOCAL_CHOICES = 4        # LOCAL amounts tried per range: the largest that fit
TEMPLATES = (OptKind.TC, OptKind.TILE)
MAX_DEPTH = 3            # steps past the start (none, or the heuristics' list): UPCAST, LOCAL, LOCAL


def gpu_candidates(ast: UOp, opts: list[Opt], caps: Any) -> list[list[Opt]]:
    """Every opt list that extends `opts` by one step of the GPU space (module docstring)."""
    if any(o.kind in TEMPLATES for o in opts):
        return []
    out: list[list[Opt]] = []
    if not opts:
        out += [tc for tc in [tensor_core_opts(ast, caps)] if tc]
        out += [[Opt(OptKind.TILE, axis, rows)] for axis, rows in _tiles(ast, caps)]
    current = apply_opts(ast, opts) if opts else ast
    kinds = {o.kind for o in opts}
    threads = math.prod(o.amount for o in opts if o.kind in (OptKind.LOCAL, OptKind.GROUP))
    if not kinds & {OptKind.GROUP, OptKind.LOCAL, OptKind.UPCAST}:
        reduce = _one_reduce_range(current)
        if reduce is not None:
            size = range_size(reduce)
            out += [opts + [Opt(OptKind.GROUP, reduce.arg[0], a)] for a in GROUP_AMOUNTS
                    if size % a == 0 and size > a and a <= MAX_BLOCK_THREADS]
    glob = [r for r in ranges_of(current) if r.arg[1] == AxisKind.GLOBAL and range_size(r) is not None]
    if OptKind.LOCAL not in kinds:
        budget = MAX_UPCAST // math.prod(o.amount for o in opts if o.kind is OptKind.UPCAST)
        for r in glob:
            size = range_size(r)
            out += [opts + [Opt(OptKind.UPCAST, r.arg[0], a)] for a in UPCAST_AMOUNTS
                    if a <= budget and size % a == 0 and size > a]
    for r in glob:
        size = range_size(r)
        fits = [a for a in LOCAL_AMOUNTS if threads * a <= MAX_BLOCK_THREADS and size % a == 0 and size >= a]
        out += [opts + [Opt(OptKind.LOCAL, r.arg[0], a)] for a in fits[:LOCAL_CHOICES]]
    return out


def _tiles(ast: UOp, caps: Any) -> list[tuple[int, int]]:
    """(reduce axis, block rows) of each shared-memory tile a float32 matmul fits in."""
    shape = matmul_with_epilogue(ast)
    if shape is None:
        return []
    memory = int(getattr(caps, "shared_memory_bytes", 0) or 0)
    return [(shape[2].arg[0], rows) for rows, t in sorted(MATMUL_TILES.items()) if t.shared_bytes <= memory]


def _one_reduce_range(ast: UOp) -> UOp | None:
    """The innermost reduce range of the kernel's one reduction, if it has exactly one."""
    reduces = [n for n in ast.toposort() if n.op is Ops.REDUCE]
    if len(reduces) != 1:
        return None
    inner = reduces[0].src[-1]
    if inner.op is not Ops.RANGE or inner.arg[1] != AxisKind.REDUCE or range_size(inner) is None:
        return None
    return inner
