"""Facts about a kernel AST that the passes and the heuristics read.

Stage: lowering (analysis: nothing is rewritten). Input: a kernel AST. Output: its ranges and their trip
counts, the range a THREAD opt may take, the nodes that compute addresses and validity gates, the work
it does (`estimate`: operations and bytes, for GlobalCounters and the heuristics), whether a STORE
accumulates, and its parameters (`parameters_of`: pointers in slot order, Variables by name).
"""
from __future__ import annotations

import math

from polygrad.contract import GlobalArg
from polygrad.uop.ops import ALU, AxisKind, Ops, UOp
from polygrad.uop.sint import sprod, sym_vars, vmax


def ranges_of(ast: UOp) -> list[UOp]:
    return sorted({n for n in ast.toposort() if n.op is Ops.RANGE}, key=lambda r: r.arg[0])


def range_size(r: UOp) -> int | None:
    """A range's trip count; None when it is symbolic (such ranges are left unsplit)."""
    return int(r.src[0].arg) if r.src[0].op is Ops.CONST else None


def range_max(r: UOp) -> int:
    """A range's trip count, at its variables' largest values when symbolic."""
    return int(r.src[0].arg) if r.src[0].op is Ops.CONST else vmax(r.src[0])


def divides(r: UOp, amount: int) -> bool:
    size = range_size(r)
    return size is not None and size % amount == 0


# the most work the busiest THREAD part may have, as a multiple of an even share, before a range inside
# is split instead: with 3 channel tiles in 2 parts one thread does 2 (4/3 of an even share) while the
# other waits; 11 tiles (12/11) stay
THREAD_IMBALANCE = 1.1


def thread_axis(ast: UOp, parts: int = 0) -> UOp | None:
    """The range a THREAD opt may take, in a kernel with one END block (blocks run in order, so a kernel
    of several blocks would need a barrier between them): its outermost global range when that has a
    constant size above 1. When the outermost global ranges are symbolic (a Variable batch or sequence
    length), the first constant one inside them: every thread runs the symbolic loops whole and its share
    of that range, so the threads split the work whatever the Variables' values (a batch of 1 too). A
    range of one point (the outer part of a range a tile took whole: a 1x1 conv's 32 output channels) is
    no loop and is passed over. With `parts`, where that range splits unevenly (the busiest part more
    than THREAD_IMBALANCE of an even share: 3 channel tiles in 2 parts), the first global range inside
    it that `parts` divides, when there is one (the pixel rows)."""
    if len(ast.src) != 1 or ast.src[0].op is not Ops.END:
        return None
    found: list[UOp] = []
    for r in ast.src[0].src[1:]:
        if r.arg[1] != AxisKind.GLOBAL:
            break
        if r.src[0].op is Ops.CONST and range_size(r) > 1:
            found.append(r)
    if not found:
        return None
    n = range_size(found[0])
    if parts > 1 and -(-n // parts) * parts > THREAD_IMBALANCE * n:
        return next((r for r in found[1:] if range_size(r) % parts == 0), found[0])
    return found[0]


def product_operand(node: UOp, slot: int) -> UOp | None:
    """The operand of a reduction's product that reads buffer `slot` (a load of it, or a value computed from
    its loads: a dequantized weight), None when no product reads it."""
    for red in (x for x in node.toposort() if x.op is Ops.REDUCE and x.src[0].op is Ops.MUL):
        for s in red.src[0].src:
            if any(x.op is Ops.LOAD and x.src[0].src[0].arg[0] == slot for x in s.toposort()):
                return s
    return None


def address_nodes(ast: UOp) -> set[UOp]:
    """The nodes that compute addresses and validity gates (INDEX sources past the buffer), not loads."""
    out: set[UOp] = set()
    stack = [s for n in ast.toposort() if n.op is Ops.INDEX for s in n.src[1:]]
    while stack:
        x = stack.pop()
        if x in out or x.op is Ops.LOAD:
            continue
        out.add(x)
        stack.extend(x.src)
    return out


def stores_of(ast: UOp) -> int:
    total = 0
    for block in ast.src:
        total += math.prod(range_max(r) for r in block.src[1:]) if block.op is Ops.END else 1
    return total


def estimate(ast: UOp) -> tuple[int, int]:
    """(operations, bytes moved) for GlobalCounters. An operation counts once per point of the ranges
    around it (a reduce's body once per point of its reduce ranges too). Index arithmetic is not counted:
    integer ADD/MUL/IDIV/MOD, everything that computes an address or a load's validity gate, and a select
    by such a gate against a constant (the value a gated load gives anyway: a PAD, a mask)."""
    address = address_nodes(ast)

    def counted(x: UOp) -> int:
        if x in address:
            return 0
        if x.op is Ops.FMA:
            return 2  # a multiply and an add
        if x.op is Ops.WHERE and x.src[0] in address and (x.src[1].op is Ops.CONST or x.src[2].op is Ops.CONST):
            return 0
        if x.op in ALU and x.dtype is not None and not x.dtype.is_int:
            return 1
        return 1 if x.op in ALU and x.op not in (Ops.ADD, Ops.MUL, Ops.IDIV, Ops.MOD) else 0

    def count(root: UOp, trips: int) -> int:
        """Operations of root's expression run `trips` times; a REDUCE's body is its own walk (its own
        trips), queued rather than recursed into: reduces may nest deeply."""
        total = 0
        bodies = [(root, trips)]
        while bodies:
            node, trips = bodies.pop()
            stack, seen = [node], {node}
            while stack:
                x = stack.pop()
                if x.op is Ops.REDUCE:
                    inner = trips * math.prod(range_max(r) for r in x.src[1:])
                    total += inner
                    bodies.append((x.src[0], inner))
                    continue
                total += counted(x) * trips
                for s in x.src:
                    if s not in seen:
                        seen.add(s)
                        stack.append(s)
        return total

    ops = 0
    for node in ast.src:
        ranges = node.src[1:] if node.op is Ops.END else ()
        trips = math.prod(range_max(r) for r in ranges if r.op is Ops.RANGE)
        ops += count(node.src[0] if node.op is Ops.END else node, trips)
    mem = sum(vmax(g.arg[1][0]) * g.dtype.itemsize for g in ast.toposort() if g.op is Ops.DEFINE_GLOBAL)
    return ops, mem


def has_accumulating_store(ast: UOp) -> bool:
    """Some STORE folds into memory (arg ADD/MUL/MAX): its block's points may hit one element."""
    return any(n.op is Ops.STORE and n.arg is not None for n in ast.toposort())


ATOMIC_ADD_DTYPES = ("float", "int")  # dtype names an atomic add store takes (float32, int32)


def atomic_stores_only(ast: UOp) -> bool:
    """Every accumulating STORE adds (arg ADD) into float32 or int32: a device with atomic adds may run
    its points concurrently."""
    stores = [n for n in ast.toposort() if n.op is Ops.STORE and n.arg is not None]
    return all(s.arg is Ops.ADD and s.src[0].dtype.name in ATOMIC_ADD_DTYPES for s in stores)


def parameters_of(ast: UOp) -> tuple[tuple[GlobalArg, ...], tuple[UOp, ...]]:
    """The kernel's pointer parameters (one GlobalArg per buffer, in slot order) and its Variables (in
    its IR and its buffers' sizes, sorted by name: its int parameters), in one walk."""
    written: set[int] = set()
    found: dict[int, UOp] = {}
    variables: set[UOp] = set()
    for n in ast.toposort():
        if n.op is Ops.DEFINE_GLOBAL:
            found[n.arg[0]] = n
        elif n.op is Ops.STORE:
            written.add(n.src[0].src[0].arg[0])
        elif n.op is Ops.DEFINE_VAR:
            variables.add(n)
    params = tuple(GlobalArg(slot, g.dtype, sprod(g.arg[1]), slot in written) for slot, g in sorted(found.items()))
    for g in params:
        variables |= sym_vars(g.size)
    return params, tuple(sorted(variables, key=lambda v: v.arg))
