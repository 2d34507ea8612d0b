"""GPU launch mapping: which ranges of a lowered kernel become grid (block) and block (thread) indices.

Stage: rendering, shared by the linearize pass and GPU runtimes. Input: a ProgramSpec lowered for a
device whose Capabilities say it has local memory. Output: a `LaunchDims`: the grid and block sizes of
the launch and, per mapped range, its launch index.

- GLOBAL ranges of the kernel's one END block -> grid indices (`gidx`): x is the range with the
  smallest stride in the store's index (neighbouring blocks write neighbouring memory), then y, z.
  A range that does not fit its dimension's limit, or whose size is symbolic, and every range past
  the third, stays a loop inside each thread.
- GROUP ranges (GROUP opts: a reduction shared by the threads of a block, combined through shared
  memory) and LOCAL ranges (LOCAL opts: a global range split into blocks of threads) -> block
  indices (`lidx`): GROUP first (consecutive threads read consecutive elements), then LOCAL by
  stride as above, while the block has at most MAX_BLOCK_THREADS threads.
- A GROUP range is only mapped when every reduction of the kernel either runs over it alone (one, or
  siblings over the same row: softmax-style max and sum, a mean and a variance) or is the per-thread
  partial inside one, and no UPCAST range exists (the combine keeps one value per thread); otherwise it
  stays a loop.
- `warp` (launch_dims(spec, warp=32), CUDA): the threads that exchange registers (warp shuffles). A group
  mapped to x whose size is a multiple of the warp or divides it, in a block of whole warps, combines
  across each warp by shuffles (LaunchDims.warp says so to the linearizer); 0: shared memory only.
- A kernel of several blocks runs as one thread: blocks must run in order, which a launch grid does
  not give. So does a kernel with an accumulating STORE (a scatter: several points may fold into one
  element, and the load-fold-store sequence is not atomic), unless the emitter adds atomically
  (`launch_dims(spec, atomic_add=True)`, CUDA) and every such store is an ADD into float32/int32:
  the linearizer then emits it as one atomic STORE. A single STORE without ranges (a full
  reduction) can still have a GROUP block.

Every mapped size divides exactly (the opts only split ranges by divisors; a range they pad, PADTO or a
GROUP over a row it does not divide, carries its own gates or identity), so no bounds check is added here.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from polygrad.codegen.analysis import atomic_stores_only
from polygrad.uop.ops import AxisKind, Ops, UOp
from polygrad.uop.symbolic import range_coeff

MAX_GRID = (2**31 - 1, 65535, 65535)
MAX_BLOCK = (1024, 1024, 64)
MAX_BLOCK_THREADS = 1024


@dataclass(frozen=True)
class LaunchDims:
    """grid and block sizes (x, y, z) and `axes`: (axis id, "gidx" or "lidx", dimension, size) per range."""

    grid: tuple[int, int, int] = (1, 1, 1)
    block: tuple[int, int, int] = (1, 1, 1)
    axes: tuple[tuple[int, str, int, int], ...] = ()
    warp: int = 0  # threads a shuffle spans (the launch's groups combine through them); 0: no shuffles

    def index_of(self, axis: int) -> tuple[str, int, int] | None:
        """("gidx" | "lidx", dimension, size) of a mapped range's axis id, None for a loop."""
        for a, kind, dim, size in self.axes:
            if a == axis:
                return kind, dim, size
        return None

    @property
    def threads(self) -> int:
        return math.prod(self.block)


def _const_size(r: UOp) -> int | None:
    return int(r.src[0].arg) if r.src[0].op is Ops.CONST else None


def _groupable(ast: UOp) -> bool:
    """Every grouped reduce runs over one GROUP range alone, all over the same one, none inside another;
    every other reduce is a partial inside one of them; no UPCAST or UNROLL range."""
    nodes = ast.toposort()
    reduces = [n for n in nodes if n.op is Ops.REDUCE]
    grouped = [n for n in reduces if any(r.arg[1] == AxisKind.GROUP for r in n.src[1:])]
    if not grouped or any(len(n.src) != 2 or n.src[1] is not grouped[0].src[1] for n in grouped):
        return False
    inside = [set(n.src[0].toposort()) for n in grouped]
    if any(g in body for g in grouped for body in inside):
        return False
    if any(n not in grouped and not any(n in body for body in inside) for n in reduces):
        return False
    return not any(n.op is Ops.RANGE and n.arg[1] in (AxisKind.UPCAST, AxisKind.UNROLL) for n in nodes)


def _stride(store_index: UOp | None, r: UOp) -> float:
    """|coefficient| of r in the store's index (inf when not affine or absent): x gets the smallest."""
    if store_index is None:
        return math.inf
    c = range_coeff(store_index, r)
    return math.inf if not c else abs(c)


def _map(ranges: list[UOp], limits: tuple[int, int, int], kind: str,
         total: int | None) -> tuple[list[int], list[tuple[int, str, int, int]]] | None:
    """Sizes and axes for ranges in dimension order (x first); None when a GROUP range does not fit."""
    sizes, axes, dim = [1, 1, 1], [], 0
    for r in ranges:
        size = _const_size(r)
        fits = dim <= 2 and size is not None and size <= limits[dim]
        if fits and total is not None:
            fits = math.prod(sizes) * size <= total
        if not fits:
            if r.arg[1] == AxisKind.GROUP:
                return None
            continue  # stays a loop inside the thread
        sizes[dim] = size
        axes.append((r.arg[0], kind, dim, size))
        dim += 1
    return sizes, axes


def launch_dims(spec: Any, atomic_add: bool = False, warp: int = 0) -> LaunchDims:
    """The launch of a lowered kernel on a GPU-style device (see the module docstring); with
    `atomic_add` (the emitter renders an accumulating ADD store as an atomic add), a scatter-add into
    float32 or int32 is mapped like any other kernel; with `warp` (the emitter has warp shuffles), a
    grouped reduction combines by shuffles where its group and block allow."""
    ast = spec.ast
    if len(ast.src) != 1 or ast.src[0].op not in (Ops.END, Ops.STORE):
        return LaunchDims()
    block_node = ast.src[0]
    store = block_node.src[0] if block_node.op is Ops.END else block_node
    if store.op is Ops.STORE and store.arg is not None and not (atomic_add and atomic_stores_only(ast)):
        return LaunchDims()
    index = store.src[0].src[1] if store.op is Ops.STORE else None
    ranges = list(block_node.src[1:]) if block_node.op is Ops.END else []
    by_stride = lambda rs: sorted(rs, key=lambda r: _stride(index, r))  # noqa: E731
    local = by_stride([r for r in ranges if r.arg[1] == AxisKind.LOCAL])
    groups = sorted({r for n in ast.toposort() if n.op is Ops.REDUCE for r in n.src[1:] if r.arg[1] == AxisKind.GROUP},
                    key=lambda r: r.arg[0]) if _groupable(ast) else []
    mapped = _map(groups + local, MAX_BLOCK, "lidx", MAX_BLOCK_THREADS) or _map(local, MAX_BLOCK, "lidx",
                                                                                   MAX_BLOCK_THREADS)
    block, block_axes = mapped if mapped is not None else ([1, 1, 1], [])
    glob = by_stride([r for r in ranges if r.arg[1] == AxisKind.GLOBAL])
    grid, grid_axes = _map(glob, MAX_GRID, "gidx", None)  # type: ignore[misc]
    group = next((a for a in block_axes if groups and a[0] == groups[0].arg[0]), None)
    shuffles = warp > 0 and group is not None and group[2] == 0 and (group[3] % warp == 0 or warp % group[3] == 0) \
        and math.prod(block) % warp == 0
    return LaunchDims(tuple(grid), tuple(block), tuple(block_axes + grid_axes),  # type: ignore[arg-type]
                      warp if shuffles else 0)
