"""What kernels read and write, which elements a write provably covers, and reads before writes.

Stage: loading and scheduling, before lowering. Input: kernel SINKs (the scheduler's, custom ones, or
a bundle's after `uop/validate.py` checked them) and the order in which calls run them over a table of
buffers. Output: `kernel_access(ast)`, what one kernel does to each of its buffer parameters, and
`trace(calls, ...)`, a walk over calls in order that finds the first read of a buffer nothing wrote
yet and the buffers whose unwritten bytes a read (or the caller) could see. The bundle loader rejects
the first (`model/format.py`); the runtime zeroes the second (`model/executor.py`,
`engine/realize.py`), so a program never sees another computation's bytes.

A block `END(STORE(INDEX(buf, idx), value), loops...)` provably writes every element of [0, n) when
the store has no gate and no accumulate op, idx is a dense mixed radix of loops of the block
(idx = sum(stride_k * r_k) with stride_1 = 1 and stride_{k+1} = stride_k * end_k, equal as
polynomials over the Variables; then n = stride_m * end_m), every such end is >= 0 and every loop of the
block that idx leaves out runs at least once. Sizes are polynomials over the Variables (`Poly`: all
Variables are >= 0, so a polynomial with non-negative coefficients is >= 0 for every binding). A
write of anything else (a gate, a division, a loaded index) counts as a write but not as a full one.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from polygrad.uop.ops import Ops, UOp

# a polynomial: monomial (sorted tuple of symbols) -> coefficient; a symbol is ("v", name, min, max) for
# a Variable, ("r", id(RANGE)) for a loop variable. Zero coefficients are never stored.
Poly = dict
ONE: Poly = {(): 1}
MAX_TERMS = 64  # beyond these a size is "not proven" rather than slow to compare
MAX_DEGREE = 8
MAX_COEFF = 1 << 96


def _bounded(p: Poly) -> Poly | None:
    ok = len(p) <= MAX_TERMS and all(len(m) <= MAX_DEGREE and abs(c) <= MAX_COEFF for m, c in p.items())
    return p if ok else None


def _collect(terms: Any) -> Poly | None:
    """The polynomial sum of (monomial, coefficient) terms."""
    out: Poly = {}
    for m, c in terms:
        v = out.get(m, 0) + c
        if v:
            out[m] = v
        else:
            out.pop(m, None)
    return _bounded(out)


def poly_add(a: Poly, b: Poly, sign: int = 1) -> Poly | None:
    return _collect([*a.items(), *((m, sign * c) for m, c in b.items())])


def poly_mul(a: Poly, b: Poly) -> Poly | None:
    if len(a) * len(b) > MAX_TERMS * MAX_TERMS:
        return None
    return _collect((tuple(sorted(ma + mb)), ca * cb) for ma, ca in a.items() for mb, cb in b.items())


def nonnegative(p: Poly, at_least: int = 0) -> bool:
    """p >= at_least for every binding: its constant is >= at_least and no other coefficient is negative."""
    return p.get((), 0) >= at_least and all(c >= 0 for c in p.values())


def covers(written: Poly | None, need: Poly | None) -> bool:
    """written >= need for every binding of the Variables (a sufficient test)."""
    if written is None or need is None:
        return False
    diff = poly_add(written, need, -1)
    return diff is not None and nonnegative(diff)


def variable_poly(name: str, lo: int, hi: int) -> Poly:
    return {(("v", name, lo, hi),): 1}


def size_poly(u: Any) -> Poly | None:
    """An int, or an integer UOp over CONST, DEFINE_VAR (BIND), RANGE, ADD, MUL, NEG and widening CASTs,
    as a polynomial; None for anything else (a division, a MAX, a load)."""
    if type(u) is int:
        return {(): u} if u else {}
    if not isinstance(u, UOp):
        return None
    val: dict[UOp, Poly] = {}
    for n in u.toposort():
        p = _node_poly(n, val)
        if p is None:
            return None
        val[n] = p
    return val[u]


def _node_poly(n: UOp, val: dict[UOp, Poly]) -> Poly | None:
    op = n.op
    if n.dtype is None or not n.dtype.is_int:
        return None
    if op is Ops.CONST:
        return {(): n.arg} if n.arg else {}
    if op is Ops.BIND:
        return val.get(n.src[0])
    if op is Ops.DEFINE_VAR:
        arg = n.arg
        ok = type(arg) is tuple and len(arg) == 3 and type(arg[1]) is int and type(arg[2]) is int and 0 <= arg[1]
        return variable_poly(*arg) if ok else None  # Variables are >= 0: what nonnegative() relies on
    if op is Ops.RANGE:
        return {(("r", id(n)),): 1}
    if op is Ops.ADD:
        return poly_add(val[n.src[0]], val[n.src[1]])
    if op is Ops.MUL:
        return poly_mul(val[n.src[0]], val[n.src[1]])
    if op is Ops.NEG:
        return {m: -c for m, c in val[n.src[0]].items()}
    if op is Ops.CAST and n.src[0].dtype is not None and n.src[0].dtype.is_int \
            and n.dtype.itemsize >= n.src[0].dtype.itemsize:  # a widening cast keeps the value
        return val[n.src[0]]
    return None


# ---------------------------------------------------------------------------------------------------
# one kernel


@dataclass(frozen=True)
class Access:
    """What one kernel does to its buffer parameters; blocks are numbered in the SINK's order."""

    reads: dict[int, int]  # parameter -> the first block that reads it (a LOAD or an accumulating STORE)
    writes: dict[int, list[tuple[int, Poly | None]]]  # parameter -> (block, elements it writes, or None)


def _store_of(block: UOp) -> tuple[UOp | None, list[UOp]]:
    loops: list[UOp] = []
    while block.op is Ops.END and block.src:
        loops.extend(block.src[1:])
        block = block.src[0]
    return (block if block.op is Ops.STORE else None), loops


def _param(index: UOp) -> int | None:
    g = index.src[0] if index.op is Ops.INDEX and index.src else None
    ok = g is not None and g.op is Ops.DEFINE_GLOBAL and type(g.arg) is tuple and g.arg and type(g.arg[0]) is int
    return g.arg[0] if ok else None


def block_coverage(block: UOp) -> Poly | None:
    """The n for which the block provably writes every element [0, n) of its buffer (module docstring)."""
    store, loops = _store_of(block)
    if store is None or store.arg is not None or len(store.src) != 2 or len(store.src[0].src) != 2:
        return None
    terms = size_poly(store.src[0].src[1])
    if terms is None:
        return None
    by_range = {id(r): r for r in loops if r.op is Ops.RANGE}
    strides: dict[UOp, Poly] = {}
    for m, c in terms.items():
        rs = [s for s in m if s[0] == "r"]
        if len(rs) != 1 or rs[0][1] not in by_range:
            return None  # a constant offset, a product of loops, or a loop of another block
        r = by_range[rs[0][1]]
        strides.setdefault(r, {})[tuple(s for s in m if s[0] != "r")] = c
    ends = {r: size_poly(r.src[0]) for r in loops if r.op is Ops.RANGE and r.src}
    if len(ends) != len(loops) or any(e is None for e in ends.values()):
        return None
    if any(not nonnegative(ends[r], 0 if r in strides else 1) for r in ends):
        return None  # a loop the index skips must run at least once, or nothing at all may be written
    n: Poly | None = ONE
    while strides:
        # the loop whose stride is the elements below it; one of end 1 first (it may share its stride)
        hits = [r for r, s in strides.items() if s == n]
        if not hits:
            return None
        r = min(hits, key=lambda h: ends[h] != ONE)
        del strides[r]
        n = poly_mul(n, ends[r])  # type: ignore[arg-type]
        if n is None:
            return None
    return n


def kernel_access(ast: UOp) -> Access:
    """The parameters each block of `ast` reads and writes, and how much of each a write covers.

    >>> from polygrad.uop.ops import KernelInfo, UOp
    >>> from polygrad.dtype import dtypes
    >>> out, a = UOp.placeholder((4, 3), dtypes.float32, 0), UOp.placeholder((4, 3), dtypes.float32, 1)
    >>> i, j = UOp.range(None, 4, 0), UOp.range(None, 3, 1)
    >>> acc = kernel_access(out[i, j].store(a[i, j] + 1).end(i, j).sink(arg=KernelInfo("inc")))
    >>> acc.reads, acc.writes
    ({1: 0}, {0: [(0, {(): 12})]})
    """
    first: dict[UOp, int] = {}  # node -> the first block it belongs to
    for b, block in enumerate(ast.src):
        stack = [block]
        while stack:
            n = stack.pop()
            if n not in first:
                first[n] = b
                stack.extend(n.src)
    reads: dict[int, int] = {}
    for n, b in first.items():
        if (n.op is Ops.LOAD or (n.op is Ops.STORE and n.arg is not None)) and n.src:
            p = _param(n.src[0])
            if p is not None and b < reads.get(p, b + 1):
                reads[p] = b
    writes: dict[int, list[tuple[int, Poly | None]]] = {}
    for b, block in enumerate(ast.src):
        store, _ = _store_of(block)
        p = _param(store.src[0]) if store is not None and store.src else None
        if p is not None:
            writes.setdefault(p, []).append((b, block_coverage(block)))
    return Access(reads, writes)


# ---------------------------------------------------------------------------------------------------
# calls in order

UNWRITTEN, PARTIAL, FULL = 0, 1, 2


@dataclass
class Flow:
    """What `trace` found."""

    unwritten_read: tuple[int, int, int] | None = None  # (call, parameter or -1 for a copy, buffer): the first
    #                                                      read of a tracked buffer that nothing wrote before
    unwritten_outputs: list[int] = field(default_factory=list)  # outputs no call writes
    readonly_write: tuple[int, int, int] | None = None  # (call, parameter or -1, buffer): the first write of a
    #                                                     buffer in `readonly`
    exposed: set[int] = field(default_factory=set)  # tracked buffers read, or left at the end, not fully written


def trace(calls: Sequence[tuple[Any, Sequence[int]]], access: Callable[[Any], Access], tracked: set[int],
          outputs: Sequence[int], sizes: Callable[[int], int], need: Callable[[int], Poly | None],
          readonly: set[int] | frozenset = frozenset()) -> Flow:
    """Walk calls in order. A call is (kernel, buffer numbers in parameter order), or (None, (dst, src)) for
    a copy of src's first sizes(src) elements into dst. Buffers outside `tracked` hold data before the first
    call; a tracked buffer is written by a call's STORE, fully when the store covers `need(buffer)` elements
    (a copy: when its source was full and at least as large). Reads within one call come block by block,
    each block's reads before its write. No call should write a `readonly` buffer."""
    state: dict[int, int] = {}
    flow = Flow()

    def wrote(i: int, p: int, s: int) -> None:
        if s in readonly and flow.readonly_write is None:
            flow.readonly_write = (i, p, s)

    def read(i: int, p: int, s: int) -> None:
        if s in tracked:
            st = state.get(s, UNWRITTEN)
            if st == UNWRITTEN and flow.unwritten_read is None:
                flow.unwritten_read = (i, p, s)
            if st != FULL:
                flow.exposed.add(s)

    for i, (kernel, args) in enumerate(calls):
        if kernel is None:
            dst, src = args
            read(i, -1, src)
            wrote(i, -1, dst)
            if dst in tracked:
                full = sizes(src) >= sizes(dst) and (src not in tracked or state.get(src) == FULL)
                state[dst] = max(state.get(dst, UNWRITTEN), FULL if full else PARTIAL)
            continue
        acc = access(kernel)
        events = [(b, 0, p, None) for p, b in acc.reads.items()]
        events += [(b, 1, p, n) for p, ws in acc.writes.items() for b, n in ws]
        for _, is_write, p, n in sorted(events, key=lambda e: (e[0], e[1], e[2])):
            s = args[p] if p < len(args) else -1
            if not is_write:
                read(i, p, s)
                continue
            wrote(i, p, s)
            if s in tracked:
                state[s] = max(state.get(s, UNWRITTEN), FULL if covers(n, need(s)) else PARTIAL)
    for s in outputs:
        st = state.get(s, UNWRITTEN) if s in tracked else FULL
        if st == UNWRITTEN:
            flow.unwritten_outputs.append(s)
        if st != FULL:
            flow.exposed.add(s)
    return flow


__all__ = ["Access", "Flow", "Poly", "block_coverage", "covers", "kernel_access", "size_poly", "trace",
           "variable_poly"]
