"""Keep lazy values true to the moment they were built: find the live graphs a pending write would change.

Stage: scheduling (which targets a realize needs). Input: the tensor-graph UOps about to be realized
and the live, unrealized graphs of the program. Output: the live graphs that read a buffer one of
the pending effects (ASSIGN, a custom kernel's AFTER) overwrites, and so must be computed in the same
schedule, where `order_points` runs every read of a buffer's old value before its write.

A lazy tensor reads the values its inputs had when it was built, as in PyTorch's eager evaluation:
`loss = (w * w).sum(); loss.backward(); opt.step(); loss.item()` is the loss before the step. Pure
views of a buffer (reshape, permute, shrink, flip, expand) are excepted: as PyTorch views they alias
the buffer and show what was written. A graph that holds a pending effect and also reads the buffer
outside it (`y = a + x.assign(...)` with `a` computed from x before) is split: its parts that read
the buffer without the effect (`mixed_frontier`) are computed first, into their own buffers, and the
graph is rewritten to use them; the effect itself then runs with the rest.

The cost is bounded: only pending effects trigger the search, realized tensors are skipped at once,
and each candidate graph is walked through its cached topological order.
"""
from __future__ import annotations

from typing import Callable, Iterable, TypeVar

from polygrad.schedule.normalize import EFFECT_OPS, becomes
from polygrad.uop.ops import MOVEMENT, Ops, UOp

T = TypeVar("T")


def written_buffers(targets: Iterable[UOp]) -> set[int]:
    """ids of the Buffers that the pending effects among `targets` overwrite."""
    out: set[int] = set()
    for t in targets:
        for n in t.toposort():  # its pending (not yet run) ASSIGN/AFTER nodes
            if n.op not in EFFECT_OPS or becomes.get(n) is not None:
                continue
            base = n.src[0]
            while base.op is not Ops.BUFFER and base.src:
                base = base.src[0]
            if base.op is Ops.BUFFER:
                out.add(id(base.arg))
    return out


def is_view(u: UOp) -> bool:
    """Movement ops down to a buffer: an alias of its memory, not a value computed from it."""
    while u.op in MOVEMENT:
        u = u.src[0]
    return u.op is Ops.BUFFER


def mixed_frontier(u: UOp, written: set[int]) -> list[UOp]:
    """For a graph that holds a pending effect and also reads a written buffer outside it (values built
    before the write next to the write itself: `y = old_lazy_of_x + x.assign(...)`), the largest
    subgraphs that read a written buffer without holding a pending effect: the parts to compute before
    the write. Empty for a graph without pending effects (it is a plain reader) or without such reads.
    Effects are opaque: what an assign reads to compute its own value is its own business."""
    order: list[UOp] = []
    seen: set[UOp] = set()
    stack: list[tuple[UOp, bool]] = [(u, False)]
    while stack:  # sources first, never entering an effect or a node standing for a buffer
        node, expanded = stack.pop()
        if expanded:
            order.append(node)
            continue
        if node in seen:
            continue
        seen.add(node)
        stack.append((node, True))
        if not _stands_for_buffer(node) and node.op not in EFFECT_OPS:
            stack.extend((s, False) for s in node.src if s not in seen)
    reads: dict[UOp, bool] = {}
    holds: dict[UOp, bool] = {}
    for n in order:
        if n.op in EFFECT_OPS and becomes.get(n) is None:
            reads[n], holds[n] = False, True
        elif _stands_for_buffer(n):
            reads[n], holds[n] = bool(buffer_ids([becomes.get(n, n)]) & written), False
        else:
            reads[n] = any(reads[s] for s in n.src)
            holds[n] = any(holds[s] for s in n.src)
    if not holds[u]:
        return []
    out: list[UOp] = []
    for p in order:
        if holds[p] and p.op not in EFFECT_OPS:
            out.extend(s for s in p.src if reads[s] and not holds[s] and s not in out)
    return out


def _stands_for_buffer(n: UOp) -> bool:
    done = becomes.get(n)
    return n.op is Ops.BUFFER or (done is not None and done is not n)


def buffer_ids(views: Iterable[UOp]) -> set[int]:
    """ids of the Buffers under buffer views (a realized tensor's uop); other graphs are skipped."""
    out = set()
    for u in views:
        while u.op in MOVEMENT:
            u = u.src[0]
        if u.op is Ops.BUFFER:
            out.add(id(u.arg))
    return out


def readers_of(written: set[int], candidates: Callable[[], Iterable[tuple[T, UOp]]],
               exclude: Iterable[UOp] = ()) -> list[T]:
    """The candidates (objects with their graphs; the callable is only called when something is written)
    that compute a value from a buffer in `written`."""
    if not written:
        return []
    skip = set(exclude)
    out = []
    for obj, u in candidates():
        if u in skip or is_view(u):
            continue
        reads = False
        for n in u.toposort():
            if n.op in EFFECT_OPS and becomes.get(n) is None:
                reads = False  # it holds a pending effect of its own: left alone
                break
            if n.op is Ops.BUFFER and id(n.arg) in written:
                reads = True
        if reads:
            out.append(obj)
    return out
