"""Keep lazy values true to the moment they were built: find the live graphs a pending write would change.

Stage: scheduling (which targets a realize needs). Input: the tensor-graph UOps about to be realized
and the live, unrealized graphs of the program. Output: the live graphs that read a buffer one of
the pending effects (ASSIGN, a custom kernel's AFTER) overwrites, and so must be computed in the same
schedule, where `order_points` runs every read of a buffer's old value before its write.

A lazy tensor reads the values its inputs had when it was built, as in PyTorch's eager evaluation:
`loss = (w * w).sum(); loss.backward(); opt.step(); loss.item()` is the loss before the step. Pure
views of a buffer (reshape, permute, shrink, flip, expand) are excepted: as PyTorch views they alias
the buffer and show what was written. A live graph that itself holds a pending effect is left alone
(realizing it would run that effect early; it reads after its own writes by construction).

The cost is bounded: only pending effects trigger the search, realized tensors are skipped at once,
and each candidate graph is walked through its cached topological order.
"""
from __future__ import annotations

from typing import Callable, Iterable, TypeVar

from polygrad.engine.schedule import EFFECT_OPS, becomes
from polygrad.uop.ops import MOVEMENT, Ops, UOp

T = TypeVar("T")


def pending_effects(u: UOp) -> list[UOp]:
    """The ASSIGN/AFTER nodes in u's graph that have not run yet."""
    return [n for n in u.toposort() if n.op in EFFECT_OPS and becomes.get(n) is None]


def written_buffers(targets: Iterable[UOp]) -> set[int]:
    """ids of the Buffers that the pending effects among `targets` overwrite."""
    out: set[int] = set()
    for t in targets:
        for n in pending_effects(t):
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
