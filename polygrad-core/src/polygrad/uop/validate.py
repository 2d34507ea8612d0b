"""A static safety check for untrusted kernel IR: `check_kernel(ast, arg_sizes, arg_dtypes)`.

Stage: loading, before lowering. Input: a kernel SINK read from a file (a model bundle, a cache) and
the element counts (and dtypes) of the buffers it will be given, in slot order. Output: nothing, or a
`KernelFormatError` naming the kernel, the node and what could not be proven. A kernel that passes
cannot read or write outside its buffers for any value of its Variables within their bounds:

1. `check_structure`: every op is one the kernel IR allows (docs/kernel-ir.md), with a plausible
   dtype, src count and arg; the kernel's and the Variables' names follow the one name rule
   (uop/names.py: plain identifiers, metadata only, never in generated source); the DEFINE_GLOBAL
   slots are exactly 0..len(arg_sizes)-1, each with one dtype and a declared size that fits its
   buffer; RANGE ends are size expressions over Variables, bounded by MAX_RANGE, never negative and
   not 0 for every value of the Variables (`check_indices` proves these with the intervals below);
   every RANGE a STORE uses is one of its END's loops (or a REDUCE's inside it).
2. `check_indices`: an interval analysis over the graph proves each INDEX's element in
   [0, declared size - 1]. The index arithmetic may not overflow its dtype anywhere (C's signed
   overflow is undefined). Gates narrow it: an INDEX's gate, and a WHERE's condition for its two
   arms, are split into AND-ed comparisons whose linear sides tighten the intervals of their terms
   (a RANGE, a Variable, a loaded value or a whole sub-expression) before the index is evaluated.

The analysis never recurses on the graph (each walk is over a cached toposort), memoizes each node
once per set of assumptions, and gives up on kernels above MAX_NODES nodes or MAX_STEPS steps.
A block (a SINK source) may unroll at most MAX_UPCAST points of upcast RANGEs, and its nodes counted
once per point may total at most MAX_NODES over the kernel (what a renderer emits stays bounded); each
RANGE is one loop (of one REDUCE, or of ENDs). `kernel_work(ast)` bounds the node evaluations of one run,
for a caller that caps total work.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Dict, Optional, Sequence, Tuple, Union

from polygrad.definitions import ops as op_table
from polygrad.dtype import DType, dtypes
from polygrad.errors import VariableError
from polygrad.limits import MAX_NARROW_DEPTH, MAX_NODES, MAX_RANGE, MAX_STEPS, MAX_UPCAST
from polygrad.uop import sint
from polygrad.uop.names import NAME_RULE, is_plain_name
from polygrad.uop.ops import AxisKind, KernelInfo, Ops, UOp
from polygrad.uop.serialize import DTYPE_NAMES, KernelFormatError

# MAX_RANGE (a loop's largest trip count), MAX_NODES (nodes in one kernel), MAX_STEPS (node evaluations of
# the interval analysis), MAX_NARROW_DEPTH (WHEREs nested in an index that still narrow their arms) and
# MAX_UPCAST (the unrolled points of a block) are shared with polygrad-js: polygrad/limits.py

Interval = Tuple[int, int]  # inclusive bounds of an integer or bool (0/1) value
INF = 1 << 256  # "unbounded" on one side of a linear fact (larger than any int64 arithmetic here)


class _Mark:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


EMPTY = _Mark("EMPTY")  # the node takes no value under these assumptions: that code never runs
UNTRACKED = _Mark("UNTRACKED")  # a float value (never part of an index; its ints come from CAST)
Value = Union[Interval, _Mark]

def _ops(names: tuple) -> frozenset:
    return frozenset(Ops[n] for n in names)


# the op table's classes (polygrad/definitions/ops.py; polygrad-js's validate.js reads the same table)
COMPARE = _ops(op_table.COMPARISONS)
FLOAT_ONLY = _ops(op_table.FLOAT_ONLY)
INT_ONLY = _ops(op_table.INT_ONLY)
INT_OR_BOOL = _ops(op_table.INT_OR_BOOL_ONLY)
ELEMENTWISE = _ops(op_table.KERNEL_ELEMENTWISE)  # the elementwise ops a stored kernel may hold
ARITY = {Ops[op.name]: op.src for op in op_table.OPS if isinstance(op.src, int)}
SIZE_OPS = _ops(op_table.SIZE_OPS)
RANGE_KINDS = {AxisKind(k) for k in op_table.STORED_AXIS_KINDS}  # what a device-independent kernel has
REDUCE_OPS = _ops(op_table.REDUCE_OPS)


def _fail(where: str, msg: str) -> KernelFormatError:
    return KernelFormatError(f"{where}: {msg}")


def _describe(n: UOp) -> str:
    dt = DTYPE_NAMES.get(n.dtype, str(n.dtype)) if n.dtype is not None else "no dtype"
    return f"{n.op.name} ({dt}, {len(n.src)} src, arg {n.arg!r:.60})"


# ---------------------------------------------------------------------------------------------------
# 1. structure


def _is_int(x: Any) -> bool:
    return type(x) is int


def _check_name(where: str, name: Any, what: str) -> None:
    if not is_plain_name(name):
        raise _fail(where, f"{what} {name!r:.60} must be {NAME_RULE}")


def _check_var(where: str, n: UOp, seen: dict[str, UOp]) -> None:
    arg = n.arg
    if n.dtype is not dtypes.int32 or n.src or type(arg) is not tuple or len(arg) != 3:
        raise _fail(where, f"DEFINE_VAR must be int32 with no src and arg (name, min, max), got {_describe(n)}")
    name, lo, hi = arg
    _check_name(where, name, "Variable name")
    if not (_is_int(lo) and _is_int(hi)):
        raise _fail(where, f"Variable {name!r} needs int bounds, got {lo!r:.20}, {hi!r:.20}")
    try:
        sint.Variable(name, lo, hi)  # the same rules as a Variable made in Python
    except VariableError as e:
        raise _fail(where, f"bad Variable: {e}") from None
    other = seen.setdefault(name, n)
    if other is not n:
        raise _fail(where, f"Variable {name!r} appears with bounds {other.arg[1:]} and {arg[1:]}; one name is "
                           "one kernel parameter")


def _check_const(where: str, n: UOp) -> None:
    dt, v = n.dtype, n.arg
    if dt is None or n.src:
        raise _fail(where, f"CONST needs a dtype and no src, got {_describe(n)}")
    if dt is dtypes.bool:
        ok = type(v) is bool
    elif dt.is_int:
        ok = _is_int(v) and dtypes.min(dt) <= v <= dtypes.max(dt)
    else:
        ok = type(v) is float
    if not ok:
        raise _fail(where, f"CONST {v!r:.40} is not a {DTYPE_NAMES[dt]} value (constants are wrapped to their "
                           "dtype when built)")


def _same(where: str, n: UOp, dts: list[Optional[DType]]) -> None:
    if any(d is None or d != dts[0] for d in dts):
        raise _fail(where, f"{n.op.name} needs operands of one dtype, got "
                           f"{[DTYPE_NAMES.get(d, None) for d in dts]}")


def _check_alu(where: str, n: UOp) -> None:
    op, dt, src = n.op, n.dtype, n.src
    want = ARITY[op]
    if len(src) != want or dt is None or n.arg is not None:
        raise _fail(where, f"{op.name} takes {want} src, a dtype and no arg, got {_describe(n)}")
    if op is Ops.CAST:
        _same(where, n, [src[0].dtype])
        return
    if op is Ops.BITCAST:
        if src[0].dtype is None or src[0].dtype.itemsize != dt.itemsize or dtypes.bool in (dt, src[0].dtype):
            raise _fail(where, f"BITCAST between types of different widths: {_describe(n)}")
        return
    if op in COMPARE:
        _same(where, n, [s.dtype for s in src])
        if dt is not dtypes.bool:
            raise _fail(where, f"{op.name} gives a bool, got {DTYPE_NAMES[dt]}")
        return
    if op is Ops.WHERE:
        if src[0].dtype is not dtypes.bool:
            raise _fail(where, f"WHERE's condition must be a bool, got {_describe(src[0])}")
        _same(where, n, [dt, src[1].dtype, src[2].dtype])
        return
    _same(where, n, [dt, *(s.dtype for s in src)])
    if (op in FLOAT_ONLY and not dt.is_float) or (op in INT_ONLY and not dt.is_int) or \
            (op in INT_OR_BOOL and dt.is_float):
        raise _fail(where, f"{op.name} is not defined on {DTYPE_NAMES[dt]}")


def _check_node(where: str, n: UOp, seen_vars: dict[str, UOp]) -> None:
    """The op, dtype, src and arg of one node are ones the kernel IR allows."""
    op = n.op
    if op is Ops.CONST:
        return _check_const(where, n)
    if op is Ops.DEFINE_VAR:
        return _check_var(where, n, seen_vars)
    if op is Ops.DEFINE_GLOBAL:
        arg = n.arg
        if n.dtype is None or n.src or type(arg) is not tuple or len(arg) != 2 or not _is_int(arg[0]) \
                or type(arg[1]) is not tuple:
            raise _fail(where, f"DEFINE_GLOBAL needs a dtype, no src and arg (slot, shape), got {_describe(n)}")
        return None
    if op is Ops.RANGE:
        arg = n.arg
        if n.dtype not in (dtypes.int32, dtypes.int64) or len(n.src) != 1 or n.src[0].dtype is not n.dtype:
            raise _fail(where, f"RANGE is int32 or int64 with one end of its dtype, got {_describe(n)}")
        if type(arg) is not tuple or len(arg) != 2 or not _is_int(arg[0]) or not 0 <= arg[0] <= MAX_RANGE \
                or arg[1] not in RANGE_KINDS:
            raise _fail(where, f"RANGE arg must be (axis id >= 0, global|reduce|upcast), got {arg!r:.60}")
        if arg[1] == AxisKind.UPCAST and n.src[0].op is not Ops.CONST:
            raise _fail(where, "an upcast RANGE needs a constant end")
        return None
    if op is Ops.INDEX:
        ok = len(n.src) in (2, 3) and n.src[0].op is Ops.DEFINE_GLOBAL and n.dtype is n.src[0].dtype \
            and n.src[1].dtype is not None and n.src[1].dtype.is_int and n.arg is None \
            and (len(n.src) == 2 or n.src[2].dtype is dtypes.bool)
        if not ok:
            raise _fail(where, f"INDEX is (DEFINE_GLOBAL, int index[, bool gate]) with the buffer's dtype, got "
                               f"{_describe(n)}")
        return None
    if op is Ops.LOAD:
        if len(n.src) != 1 or n.src[0].op is not Ops.INDEX or n.dtype is not n.src[0].dtype or n.arg is not None:
            raise _fail(where, f"LOAD reads one INDEX of its dtype, got {_describe(n)}")
        return None
    if op is Ops.STORE:
        if len(n.src) != 2 or n.src[0].op is not Ops.INDEX or n.dtype is not None or n.src[1].dtype is None \
                or (n.arg is not None and n.arg not in REDUCE_OPS) or n.src[1].op is Ops.VECTORIZE:
            raise _fail(where, f"STORE is (INDEX, scalar value) with no dtype and arg None, ADD, MUL or MAX, got "
                               f"{_describe(n)}")
        return None
    if op is Ops.REDUCE:
        if len(n.src) < 2 or n.arg not in REDUCE_OPS or n.dtype is None or n.dtype is not n.src[0].dtype or \
                any(r.op is not Ops.RANGE for r in n.src[1:]) or len(set(n.src[1:])) != len(n.src) - 1:
            raise _fail(where, f"REDUCE is (body, RANGE, ...) with arg ADD, MUL or MAX, got {_describe(n)}")
        return None
    if op is Ops.END:
        if len(n.src) < 1 or n.dtype is not None or n.src[0].op not in (Ops.STORE, Ops.END) or n.arg is not None \
                or any(r.op is not Ops.RANGE for r in n.src[1:]) or len(set(n.src[1:])) != len(n.src) - 1:
            raise _fail(where, f"END is (STORE or END, distinct RANGEs...), got {_describe(n)}")
        return None
    if op is Ops.SINK:
        raise _fail(where, "a SINK inside a kernel; only the root is a SINK")
    if op in ELEMENTWISE:
        return _check_alu(where, n)
    hint = " (vector values are devectorized before a kernel is scheduled)" if op is Ops.VECTORIZE else \
        " (a tensor-graph op: store scheduled kernels, not tensor graphs)"
    raise _fail(where, f"op {op.name} is not allowed in a stored kernel{hint}")


def _check_size_expr(where: str, u: UOp, what: str, seen_vars: dict[str, UOp]) -> None:
    """u is an integer expression over constants and Variables only (a RANGE end, a buffer size)."""
    for n in u.toposort():
        if n.op not in SIZE_OPS or n.dtype is None or not n.dtype.is_int:
            raise _fail(where, f"{what} may only use constants, Variables and integer arithmetic, found "
                               f"{_describe(n)}")
        _check_node(where, n, seen_vars)


def _free_ranges(ast: UOp) -> dict[UOp, frozenset]:
    """The RANGEs each node's value depends on, less those a REDUCE inside it folds."""
    free: dict[UOp, frozenset] = {}
    none: frozenset = frozenset()
    for n in ast.toposort():
        if n.op is Ops.RANGE:
            free[n] = frozenset((n,))
        elif n.op is Ops.REDUCE:
            free[n] = free[n.src[0]] - frozenset(n.src[1:])
        elif n.op in (Ops.END, Ops.SINK):
            free[n] = none
        else:
            out = none
            for s in n.src:
                out = out | free[s] if free[s] else out
            free[n] = out
    return free


def check_structure(ast: UOp, arg_sizes: Sequence[int], arg_dtypes: Sequence[DType] | None = None,
                    where: str = "kernel") -> dict[int, list[UOp]]:
    """The structural half of `check_kernel`; returns {slot: its DEFINE_GLOBAL nodes}."""
    if not isinstance(ast, UOp) or ast.op is not Ops.SINK:
        raise _fail(where, f"a kernel is a SINK, got {type(ast).__name__ if not isinstance(ast, UOp) else ast.op}")
    if ast.arg is not None and not isinstance(ast.arg, KernelInfo):
        raise _fail(where, f"the kernel SINK's arg must be KernelInfo, got {ast.arg!r:.60}")
    if isinstance(ast.arg, KernelInfo):
        _check_name(where, ast.arg.name, "kernel name")
    if ast.dtype is not None or any(b.op not in (Ops.STORE, Ops.END) for b in ast.src):
        raise _fail(where, "the kernel SINK holds blocks: STORE or END(STORE, RANGE...) nodes")
    nodes = ast.toposort()
    if len(nodes) > MAX_NODES:
        raise _fail(where, f"{len(nodes)} nodes; kernels of more than {MAX_NODES} are not checked")
    sizes = list(arg_sizes)
    if any(not _is_int(s) or s < 0 for s in sizes):
        raise _fail(where, f"buffer sizes must be non-negative ints, got {sizes!r:.80}")
    seen_vars: dict[str, UOp] = {}
    axes: dict[int, UOp] = {}
    globals_: dict[int, list[UOp]] = {}
    for i, n in enumerate(nodes[:-1]):
        at = f"{where}, node #{i}"
        _check_node(at, n, seen_vars)
        if any(s.op is Ops.INDEX for s in n.src) and n.op not in (Ops.LOAD, Ops.STORE):
            raise _fail(at, f"{n.op.name} uses an INDEX; only LOAD and STORE (its first src) may")
        if any(s.op is Ops.DEFINE_GLOBAL and (n.op is not Ops.INDEX or k) for k, s in enumerate(n.src)):
            raise _fail(at, f"{n.op.name} uses a DEFINE_GLOBAL (a buffer) as a value; only an INDEX's first src may")
        if n.op is Ops.STORE and n.src[1].op is Ops.INDEX:
            raise _fail(at, "STORE's value is an INDEX (an address); load it first")
        if n.op is Ops.RANGE:
            other = axes.setdefault(n.arg[0], n)
            if other is not n:
                raise _fail(at, f"two different RANGEs share axis id {n.arg[0]} (their loop variables would share "
                                "one name)")
            _check_size_expr(at, n.src[0], f"RANGE {n.arg[0]}'s end", seen_vars)
        if n.op is Ops.DEFINE_GLOBAL:
            globals_.setdefault(n.arg[0], []).append(n)
    if sorted(globals_) != list(range(len(sizes))):
        raise _fail(where, f"the kernel's buffer slots are {sorted(globals_)}, but {len(sizes)} buffers are passed "
                           f"(slots must be exactly 0..{len(sizes) - 1})")
    for slot, gs in sorted(globals_.items()):
        _check_globals(where, slot, gs, sizes[slot], None if arg_dtypes is None else arg_dtypes[slot], seen_vars)
    _check_scopes(where, ast)
    _check_loops(where, ast)
    _blocks(where, ast)
    return globals_


def _blocks(where: str, ast: UOp) -> list[tuple[int, list[UOp]]]:
    """(node count, RANGEs) of each block (SINK source). A block's upcast RANGEs (unrolled by the renderers) span
    at most MAX_UPCAST points, and the blocks' node counts, each times its points, total at most MAX_NODES; the
    walk stops as soon as that total is passed, so it is bounded too (blocks may share nodes)."""
    total, out = 0, []
    for block in ast.src:
        seen: set[UOp] = set()
        stack, ranges = [block], []
        while stack:
            n = stack.pop()
            if n in seen:
                continue
            seen.add(n)
            if total + len(seen) > MAX_NODES:
                raise _fail(where, f"the blocks hold more than {MAX_NODES} nodes together (counted per block)")
            if n.op is Ops.RANGE:
                ranges.append(n)
            stack.extend(n.src)
        points = 1
        for r in ranges:
            if r.arg[1] == AxisKind.UPCAST:
                points *= max(r.src[0].arg, 1)
        if points > MAX_UPCAST:
            raise _fail(where, f"a block unrolls {points} points of upcast RANGEs; the limit is {MAX_UPCAST}")
        total += len(seen) * points
        if total > MAX_NODES:
            raise _fail(where, f"the blocks hold more than {MAX_NODES} nodes once their upcast RANGEs are unrolled")
        out.append((len(seen), ranges))
    return out


def _check_loops(where: str, ast: UOp) -> None:
    """Each RANGE is one loop: the loop of one REDUCE, or of blocks' END chains (each chain naming it once)."""
    owner: dict[UOp, Any] = {}
    for n in ast.toposort():
        if n.op is Ops.REDUCE:
            for r in n.src[1:]:
                if owner.setdefault(r, n) is not n:
                    raise _fail(where, f"RANGE {r.arg[0]} is reduced by two REDUCEs; each loop has one owner")
    for block in ast.src:
        node, chain = block, set()
        while node.op is Ops.END:
            for r in node.src[1:]:
                if r in chain or owner.setdefault(r, Ops.END) is not Ops.END:
                    raise _fail(where, f"RANGE {r.arg[0]} is looped twice (by a REDUCE or twice by one block's ENDs)")
                chain.add(r)
            node = node.src[0]


def _check_globals(where: str, slot: int, gs: list[UOp], size: int, dtype: DType | None,
                   seen_vars: dict[str, UOp]) -> None:
    if len({g.dtype for g in gs}) != 1:
        raise _fail(where, f"buffer {slot} is declared with dtypes {sorted(DTYPE_NAMES[g.dtype] for g in gs)}")
    if dtype is not None and gs[0].dtype is not dtype:
        raise _fail(where, f"buffer {slot} is {DTYPE_NAMES[gs[0].dtype]} in the kernel but the buffer passed is "
                           f"{DTYPE_NAMES.get(dtype, dtype)}")
    for g in gs:
        count = declared_count(g, where, seen_vars)
        if count > size:
            raise _fail(where, f"buffer {slot} is declared with shape {g.arg[1]!r:.60} ({count} elements at the "
                               f"Variables' maxima) but the buffer passed holds {size}")


def declared_count(g: UOp, where: str = "kernel", seen_vars: dict[str, UOp] | None = None) -> int:
    """A DEFINE_GLOBAL's element count at its Variables' maxima."""
    count = 1
    for d in g.arg[1]:
        if isinstance(d, UOp):
            _check_size_expr(where, d, f"buffer {g.arg[0]}'s shape", {} if seen_vars is None else seen_vars)
            analysis = _Analysis(where)
            lo, hi = analysis.root.of(d)
            if analysis.overflows:
                raise _fail(where, f"buffer {g.arg[0]}'s shape entry {d!r:.40} overflows its dtype")
        elif _is_int(d):
            lo = hi = d
        else:
            raise _fail(where, f"buffer {g.arg[0]}'s shape entry {d!r:.40} is not an int or a size expression")
        if lo < 0:
            raise _fail(where, f"buffer {g.arg[0]}'s shape entry {d!r:.40} can be negative")
        count *= hi
    return count


def _check_scopes(where: str, ast: UOp) -> None:
    """Every RANGE a block's STORE uses is a loop of that block (or folded by a REDUCE inside it)."""
    free = _free_ranges(ast)
    for block in ast.src:
        loops: set[UOp] = set()
        node = block
        while node.op is Ops.END:
            loops.update(node.src[1:])
            node = node.src[0]
        outside = free[node] - loops
        if outside:
            axes = sorted(r.arg[0] for r in outside)
            raise _fail(where, f"a STORE uses RANGE {axes} outside any loop over it (add it to the block's END or "
                               "a REDUCE)")


# ---------------------------------------------------------------------------------------------------
# 2. intervals


def dtype_interval(dt: DType) -> Interval:
    if dt is dtypes.bool:
        return (0, 1)
    return (int(dtypes.min(dt)), int(dtypes.max(dt)))


def _tdiv(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _hull(values: list[int]) -> Interval:
    return (min(values), max(values))


def _divisors(b: Interval) -> list[Interval]:
    """b's interval in sign-definite pieces; a zero divisor divides by 1 (docs/kernel-ir.md)."""
    lo, hi = b
    parts = [(lo, min(hi, -1))] if lo < 0 else []
    if hi > 0:
        parts.append((max(lo, 1), hi))
    if lo <= 0 <= hi:
        parts.append((1, 1))
    return parts


def _idiv(a: Interval, b: Interval) -> Interval:
    out = [_tdiv(x, y) for p in _divisors(b) for x in a for y in p]
    return _hull(out)


def _mod(a: Interval, b: Interval) -> Interval:
    m = max(abs(y) for p in _divisors(b) for y in p) - 1  # |a % b| <= |b| - 1, sign of a
    lo, hi = a
    if lo >= 0 and hi <= min(abs(y) for p in _divisors(b) for y in p) - 1:
        return a
    return (max(lo, -m) if lo < 0 else 0, min(hi, m) if hi > 0 else 0)


def _bits(n: UOp, a: Interval, b: Interval, op: Ops) -> Interval:
    if n.dtype is dtypes.bool:
        if op is Ops.AND:
            return (a[0] & b[0], a[1] & b[1])
        if op is Ops.OR:
            return (a[0] | b[0], a[1] | b[1])
        return (a[0] ^ b[0],) * 2 if a[0] == a[1] and b[0] == b[1] else (0, 1)
    if a[0] >= 0 and b[0] >= 0:
        top = (1 << max(a[1], b[1]).bit_length()) - 1
        if op is Ops.AND:
            return (0, min(a[1], b[1]))
        return (max(a[0], b[0]) if op is Ops.OR else 0, top)
    if op is Ops.AND and (a[0] >= 0 or b[0] >= 0):
        return (0, a[1] if a[0] >= 0 else b[1])
    k = max(abs(x) for x in (*a, *b)).bit_length()
    return (-(1 << k), (1 << k) - 1)  # two's complement values of k+1 bits are closed under & | ^


def _shift(n: UOp, a: Interval, b: Interval, left: bool) -> Interval:
    if b[0] < 0 or b[1] >= 8 * n.dtype.itemsize:  # undefined in C: reported as an overflow
        full = dtype_interval(n.dtype)
        return (full[0] - 1, full[1] + 1)
    if left:
        return _hull([x << y for x in a for y in b])
    return _hull([x >> y for x in a for y in b])


def _cmp(op: Ops, a: Interval, b: Interval) -> Interval:
    if op is Ops.CMPLT:
        return (1, 1) if a[1] < b[0] else (0, 0) if a[0] >= b[1] else (0, 1)
    disjoint = a[1] < b[0] or b[1] < a[0]
    same = a[0] == a[1] == b[0] == b[1]
    if op is Ops.CMPNE:
        return (1, 1) if disjoint else (0, 0) if same else (0, 1)
    return (0, 0) if disjoint else (1, 1) if same else (0, 1)


# interval transfer rules: op -> (node, source intervals) -> interval; a rule sees only tracked sources
_RULES: dict[Ops, Callable[[UOp, list[Interval]], Any]] = {
    Ops.ADD: lambda n, v: (v[0][0] + v[1][0], v[0][1] + v[1][1]),
    Ops.MUL: lambda n, v: _hull([x * y for x in v[0] for y in v[1]]),
    Ops.NEG: lambda n, v: (1 - v[0][1], 1 - v[0][0]) if n.dtype is dtypes.bool else (-v[0][1], -v[0][0]),
    Ops.MAX: lambda n, v: (max(v[0][0], v[1][0]), max(v[0][1], v[1][1])),
    Ops.IDIV: lambda n, v: _idiv(v[0], v[1]),
    Ops.MOD: lambda n, v: _mod(v[0], v[1]),
    Ops.AND: lambda n, v: _bits(n, v[0], v[1], Ops.AND),
    Ops.OR: lambda n, v: _bits(n, v[0], v[1], Ops.OR),
    Ops.XOR: lambda n, v: _bits(n, v[0], v[1], Ops.XOR),
    Ops.SHL: lambda n, v: _shift(n, v[0], v[1], True),
    Ops.SHR: lambda n, v: _shift(n, v[0], v[1], False),
    Ops.CMPLT: lambda n, v: _cmp(Ops.CMPLT, v[0], v[1]),
    Ops.CMPNE: lambda n, v: _cmp(Ops.CMPNE, v[0], v[1]),
    Ops.CMPEQ: lambda n, v: _cmp(Ops.CMPEQ, v[0], v[1]),
    Ops.FMA: lambda n, v: _RULES[Ops.ADD](n, [_RULES[Ops.MUL](n, v[:2]), v[2]]),
}


def _meet(a: Value, b: Value | None) -> Value:
    """The intersection of two intervals (EMPTY if they do not overlap); b None: a as it is."""
    if b is None or not isinstance(a, tuple) or not isinstance(b, tuple):
        return a
    lo, hi = max(a[0], b[0]), min(a[1], b[1])
    return (lo, hi) if lo <= hi else EMPTY


def _traps(n: UOp, srcs: list[Value]) -> bool:
    a, b = srcs
    return isinstance(a, tuple) and isinstance(b, tuple) and a[0] == dtype_interval(n.dtype)[0] and \
        b[0] <= -1 <= b[1]


def _nonzero(u: UOp, env: "_Env") -> bool:
    """u is never 0: by its interval, or a guard such as WHERE(x == 0, 1, x) (how // is scheduled)."""
    v = env.of(u)
    if isinstance(v, tuple) and not v[0] <= 0 <= v[1]:
        return True
    if u.op is not Ops.WHERE:
        return False
    for arm, truth in ((u.src[1], True), (u.src[2], False)):
        literals = _literals(u.src[0], truth)
        if literals is None:
            continue  # this arm is never chosen
        armv = env.of(arm)
        if isinstance(armv, tuple) and not armv[0] <= 0 <= armv[1]:
            continue
        if not any(_says_nonzero(c, t, arm) for c, t in literals):
            return False
    return True


def _says_nonzero(c: UOp, truth: bool, x: UOp) -> bool:
    """The literal `c == truth` is x != 0."""
    if c.op not in (Ops.CMPNE, Ops.CMPEQ) or (c.op is Ops.CMPNE) != truth or x not in c.src:
        return False
    other = c.src[1] if c.src[0] is x else c.src[0]
    return other.op is Ops.CONST and other.arg == 0


def _sum_bounds(terms: dict[UOp, int], env: "_Env") -> Interval | None:
    """The interval of sum(k * t) from the terms' own intervals; None if one is not an integer."""
    lo = hi = 0
    for t, k in terms.items():
        v = env.of(t)
        if not isinstance(v, tuple):
            return None
        lo, hi = lo + min(k * v[0], k * v[1]), hi + max(k * v[0], k * v[1])
    return (lo, hi)


def _tracked(dt: DType | None) -> bool:
    return dt is not None and (dt.is_int or dt is dtypes.bool)


# A fact bounds a node, or a linear form: a frozenset of (term node, coefficient) pairs, its
# coefficients coprime and the first (by `_term_order`) positive (`_linear_key`).
Facts = Dict[Any, Interval]


class _Env:
    """Intervals of nodes under one set of assumptions (`facts`: node or linear form -> its interval).

    A child env adds facts to its parent's; it recomputes only the nodes that depend on a new fact and
    reads every other node from the parent. Linear facts (from a gate such as 0 < r4 + 2*r2 < 8) bound
    any sum whose terms hold a multiple of the form (7*r4 + 14*r2 + r5 - 8)."""

    def __init__(self, analysis: "_Analysis", facts: Facts, parent: "_Env | None", depth: int):
        self.analysis, self.facts, self.parent, self.depth = analysis, facts, parent, depth
        self.new = facts if parent is None else {k: v for k, v in facts.items() if parent.facts.get(k) != v}
        self.linear = sorted(((dict(k), v) for k, v in facts.items() if isinstance(k, frozenset)),
                             key=lambda f: -len(f[0]))
        self.linear_new = any(isinstance(k, frozenset) for k in self.new)
        self.memo: dict[UOp, Value] = {}

    def value(self, n: UOp) -> Value:
        env: _Env | None = self
        while env is not None:
            hit = env.memo.get(n)
            if hit is not None:
                return hit
            env = env.parent
        raise KeyError(n)  # pragma: no cover (callers evaluate with of() first)

    def of(self, u: UOp) -> Value:
        """u's interval under these facts (EMPTY: u is never computed under them)."""
        hit = self.memo.get(u)
        if hit is not None:
            return hit
        if self.parent is not None:
            self.parent.of(u)
        nodes = u.toposort()
        self.analysis.step(len(nodes))
        for n in nodes:
            if n in self.memo:
                continue
            if self.parent is not None and n not in self.new and not any(s in self.memo for s in n.src) \
                    and not (self.linear_new and n.op is Ops.ADD):
                continue  # unchanged from the parent
            self.memo[n] = self._compute(n)
        return self.value(u)

    def _compute(self, n: UOp) -> Value:
        self.analysis.step()
        if not _tracked(n.dtype) or n.op in (Ops.INDEX, Ops.DEFINE_GLOBAL):
            return UNTRACKED
        if n.op is Ops.REDUCE:
            out = self._reduce(n)
        else:
            srcs = [self.value(s) for s in n.src]
            if any(v is EMPTY for v in srcs):
                return EMPTY
            out = self._interval(n, srcs)
            if n.op in (Ops.IDIV, Ops.MOD) and n.dtype.kind == "int" and _traps(n, srcs):
                self.analysis.overflows.add(n)  # INT_MIN / -1 traps like an overflow
        if self.linear and n.op is Ops.ADD and isinstance(out, tuple):
            out = _meet(out, self._linear_bound(n))
        full = dtype_interval(n.dtype)
        if isinstance(out, tuple) and (out[0] < full[0] or out[1] > full[1]):
            self.analysis.overflows.add(n)
            out = full  # the wrapped value, in two's complement; an index that needs it is rejected
        fact = self.facts.get(n)
        return _meet(out, fact) if fact is not None else out

    def _linear_bound(self, n: UOp) -> Value | None:
        """n's bounds from the linear facts: n = sum(alpha_j * form_j) + rest, rest from intervals."""
        terms, const = _linear(n, self)
        lo = hi = const
        for form, (flo, fhi) in self.linear:
            t0 = next(iter(form))
            if terms.get(t0, 0) % form[t0]:
                continue
            alpha = terms.get(t0, 0) // form[t0]
            if alpha == 0 or any(terms.get(t, 0) != alpha * k for t, k in form.items()):
                continue
            span = _sum_bounds(form, self)  # the form's other side may only come from its terms
            if span is None:
                return None
            flo, fhi = max(flo, span[0]), min(fhi, span[1])
            for t in form:
                del terms[t]
            lo, hi = lo + min(alpha * flo, alpha * fhi), hi + max(alpha * flo, alpha * fhi)
        if lo == hi == const:
            return None
        rest = _sum_bounds(terms, self)
        return None if rest is None else (lo + rest[0], hi + rest[1])

    def _interval(self, n: UOp, srcs: list[Value]) -> Value:
        op, full = n.op, dtype_interval(n.dtype)
        if op is Ops.CONST:
            return (int(n.arg), int(n.arg))
        if op is Ops.DEFINE_VAR:
            return (n.arg[1], n.arg[2])
        if op is Ops.RANGE:
            end = srcs[0]
            return (0, end[1] - 1) if end[1] >= 1 else EMPTY
        if op in (Ops.LOAD, Ops.BITCAST):
            return full
        if op is Ops.CAST:
            src = srcs[0]
            if src is UNTRACKED:  # float to int: truncation of any value
                return full
            if n.dtype is dtypes.bool:
                return (0, 0) if src == (0, 0) else (1, 1) if src[0] > 0 or src[1] < 0 else (0, 1)
            return src if full[0] <= src[0] and src[1] <= full[1] else full
        if op is Ops.WHERE:
            return self._where(n, srcs)
        if any(v is UNTRACKED for v in srcs):
            return full  # a comparison of floats
        rule = _RULES.get(op)
        return rule(n, srcs) if rule is not None else full

    def _reduce(self, n: UOp) -> Value:
        body = self.value(n.src[0])
        identity = {Ops.ADD: (0, 0), Ops.MUL: (1, 1)}.get(n.arg, (dtype_interval(n.dtype)[0],) * 2)
        if body is EMPTY:  # the loop never runs (or never reaches the body): the start value
            return identity
        if n.arg is Ops.ADD:
            total = 1
            for r in n.src[1:]:
                end = self.value(r.src[0])
                total *= max(end[1], 0) if isinstance(end, tuple) else 0
            return (min(0, body[0] * total), max(0, body[1] * total))
        if n.arg is Ops.MAX:
            return (identity[0], body[1])
        return dtype_interval(n.dtype)

    def _where(self, n: UOp, srcs: list[Value]) -> Value:
        cond = srcs[0]
        if cond == (1, 1):
            return srcs[1]
        if cond == (0, 0):
            return srcs[2]
        arms = [srcs[1], srcs[2]]
        if self.depth < MAX_NARROW_DEPTH:
            for k, truth in ((0, True), (1, False)):
                env = self.analysis.assume(self, n.src[0], truth)
                arms[k] = EMPTY if env is None else env.of(n.src[1 + k])
        arms = [a for a in arms if a is not EMPTY]
        if not arms:
            return EMPTY
        return (min(a[0] for a in arms), max(a[1] for a in arms))


class _Analysis:
    """One kernel's interval analysis: the env without assumptions, and envs made by assuming gates."""

    def __init__(self, where: str, ranges: Sequence[UOp] = ()):
        self.where = where
        self.steps = 0
        self.overflows: set[UOp] = set()  # nodes whose exact value can leave their dtype
        self.envs: dict[frozenset, _Env] = {}
        self.root = _Env(self, {}, None, 0)
        facts: Facts = {}
        for r in ranges:  # r < end as a linear fact when end is symbolic: (rows - 1 - r) * 16 >= 0
            if r.src[0].op is not Ops.CONST:
                _at_most_linear(r, r.src[0], -1, self.root, facts)
        if facts:
            self.root = _Env(self, facts, None, 0)

    def step(self, count: int = 1) -> None:
        self.steps += count
        if self.steps > MAX_STEPS:
            raise _fail(self.where, f"the interval analysis took more than {MAX_STEPS} steps; the kernel is too "
                                    "large or too deeply gated to check")

    def assume(self, env: _Env, cond: UOp, truth: bool) -> _Env | None:
        """env with `cond == truth` added to its facts; None when that cannot hold."""
        facts = narrow(env, cond, truth)
        if facts is None:
            return None
        if facts is env.facts:
            return env
        key = frozenset(facts.items())
        hit = self.envs.get(key)
        if hit is None:
            hit = self.envs[key] = _Env(self, facts, env, env.depth + 1)
        return hit


# ---- narrowing: what a true (or false) condition says about the intervals of its terms


def _linear(u: UOp, env: _Env, limit: int = 64) -> tuple[dict[UOp, int], int]:
    """u as sum(coefficient * term) + constant; terms are nodes that are not ADD/NEG/MUL-by-constant."""
    terms: dict[UOp, int] = {}
    const = 0
    stack = [(u, 1)]
    while stack:
        n, k = stack.pop()
        limit -= 1
        if n.op is Ops.CONST:
            const += k * int(n.arg)
        elif limit > 0 and n.op is Ops.ADD:
            stack += [(n.src[0], k), (n.src[1], k)]
        elif limit > 0 and n.op is Ops.NEG:
            stack.append((n.src[0], -k))
        elif limit > 0 and n.op is Ops.MUL and n.src[1].op is Ops.CONST:
            stack.append((n.src[0], k * int(n.src[1].arg)))
        elif limit > 0 and n.op is Ops.MUL and n.src[0].op is Ops.CONST:
            stack.append((n.src[1], k * int(n.src[0].arg)))
        elif limit > 0 and n.op is Ops.CAST and _tracked(n.src[0].dtype) and env.of(n) == env.of(n.src[0]):
            stack.append((n.src[0], k))  # a widening cast keeps the value
        else:
            terms[n] = terms.get(n, 0) + k
    return {t: k for t, k in terms.items() if k != 0}, const


def _current(t: UOp, env: _Env, facts: Facts) -> Value:
    """t's interval in env, tightened by the facts found so far."""
    return _meet(env.of(t), facts.get(t))


def _linear_key(terms: dict[UOp, int], bound: int) -> tuple[frozenset, Interval]:
    """sum(k * t) <= bound as (canonical form, its interval): coprime coefficients, the first positive."""
    first = min(terms, key=_term_order)
    g = math.gcd(*terms.values())
    if terms[first] < 0:
        g = -g
    form = frozenset((t, k // g) for t, k in terms.items())
    limit = bound // g if g > 0 else -(-bound // g)  # form <= floor(bound/g); g < 0: form >= ceil(bound/g)
    return form, ((-INF, limit) if g > 0 else (limit, INF))


def _term_order(t: UOp) -> int:
    return id(t)  # any fixed order within one analysis


def _at_most(terms: dict[UOp, int], const: int, bound: int, env: _Env, facts: Facts) -> bool:
    """Tighten facts with sum(k * t) + const <= bound; False when no value satisfies it."""
    ivs: dict[UOp, Interval] = {}
    for t in terms:
        v = _current(t, env, facts)
        if v is EMPTY:
            return False
        if v is UNTRACKED:
            return True
        ivs[t] = v
    lows = {t: min(k * ivs[t][0], k * ivs[t][1]) for t, k in terms.items()}
    total_low = sum(lows.values())
    if total_low + const > bound:
        return False
    for t, k in terms.items():
        room = bound - const - (total_low - lows[t])  # k * t <= room
        lo, hi = ivs[t]
        if k > 0:
            hi = min(hi, room // k)
        else:
            lo = max(lo, -(room // -k))
        if (lo, hi) != ivs[t]:
            facts[t] = (lo, hi)
    if len(terms) > 1 and all(t.op is not Ops.CONST for t in terms):
        form, iv = _linear_key(terms, bound - const)
        known = _meet(iv, facts.get(form))
        if known is EMPTY:
            return False
        facts[form] = known
    return True


def _at_most_linear(x: UOp, y: UOp, slack: int, env: _Env, facts: Facts) -> bool:
    """Facts from x - y <= slack: on the terms of x - y, and on the nodes x and y themselves."""
    tx, cx = _linear(x, env)
    ty, cy = _linear(y, env)
    for t, k in ty.items():
        tx[t] = tx.get(t, 0) - k
    diff = {t: k for t, k in tx.items() if k != 0}
    whole = {x: 1, y: -1} if x is not y else {}
    return _at_most(diff, cx - cy, slack, env, facts) and _at_most(whole, 0, slack, env, facts)


def _constrain(op: Ops, a: UOp, b: UOp, truth: bool, env: _Env, facts: Facts) -> bool:
    """Facts from the integer comparison `op(a, b) == truth`; False when it cannot hold."""
    if op is Ops.CMPLT:
        return _at_most_linear(a, b, -1, env, facts) if truth else _at_most_linear(b, a, 0, env, facts)
    if (op is Ops.CMPEQ) == truth:  # a == b
        return _at_most_linear(a, b, 0, env, facts) and _at_most_linear(b, a, 0, env, facts)
    for x, y in ((a, b), (b, a)):  # a != b: trim an endpoint equal to y's single value
        vx, vy = _current(x, env, facts), _current(y, env, facts)
        if vx is EMPTY or vy is EMPTY:
            return False
        if isinstance(vx, tuple) and isinstance(vy, tuple) and vy[0] == vy[1]:
            lo, hi = vx[0] + (vx[0] == vy[0]), vx[1] - (vx[1] == vy[0])
            if lo > hi:
                return False
            facts[x] = (lo, hi)
    return True


def _literals(cond: UOp, truth: bool) -> list[tuple[UOp, bool]] | None:
    """`cond == truth` as conjuncts (node, truth) of comparisons and opaque bools; None if it is false."""
    out: list[tuple[UOp, bool]] = []
    stack = [(cond, truth)]
    while stack and len(out) < 64:  # further conjuncts are left out: fewer facts, still sound
        c, t = stack.pop()
        if c.op is Ops.CONST:
            if bool(c.arg) != t:
                return None
            continue
        out.append((c, t))  # the node itself is known, wherever it appears again
        if c.op is Ops.AND and t or c.op is Ops.OR and not t:
            stack += [(c.src[0], t), (c.src[1], t)]
        elif c.op is Ops.NEG:
            stack.append((c.src[0], not t))
        elif c.op in (Ops.CMPNE, Ops.CMPEQ, Ops.XOR) and c.src[0].dtype is dtypes.bool:
            x, y = c.src if c.src[1].op is Ops.CONST else c.src[::-1]
            if y.op is Ops.CONST:  # x op const: x's own truth follows
                stack.append((x, bool(y.arg) == (t if c.op is Ops.CMPEQ else not t)))
    return out


def narrow(env: _Env, cond: UOp, truth: bool) -> Facts | None:
    """env's facts plus what `cond == truth` implies (conjuncts of comparisons); None if impossible."""
    literals = _literals(cond, truth)
    if literals is None:
        return None
    facts = dict(env.facts)
    for _ in range(2):  # twice: a fact found late can tighten an earlier comparison
        for c, t in literals:
            v = _current(c, env, facts)
            if v is EMPTY or not v[0] <= int(t) <= v[1]:
                return None
            facts[c] = (int(t), int(t))
            if c.op in COMPARE and c.src[0].dtype is not dtypes.bool and _tracked(c.src[0].dtype):
                if not _constrain(c.op, c.src[0], c.src[1], t, env, facts):
                    return None
    return env.facts if facts == env.facts else facts


# ---------------------------------------------------------------------------------------------------
# 3. the checks


def check_indices(ast: UOp, globals_: dict[int, list[UOp]], where: str = "kernel") -> None:
    """Every INDEX is proven inside its buffer; no index, gate or loop-size arithmetic can overflow."""
    analysis = _Analysis(where, [n for n in ast.toposort() if n.op is Ops.RANGE])
    root = analysis.root
    root.of(ast)
    unassumed = _Analysis(where).root  # the Variables' bounds alone
    counts = {g: declared_count(g, where) for gs in globals_.values() for g in gs}
    checked: set[UOp] = set()
    for i, n in enumerate(ast.toposort()):
        if n.op is Ops.RANGE:
            end = root.value(n.src[0])
            if end[1] > MAX_RANGE:
                raise _fail(where, f"RANGE {n.arg[0]} (node #{i}) runs up to {end[1]} times; the limit is {MAX_RANGE}")
            lo, hi = unassumed.of(n.src[0])  # (root assumes every loop runs: r < end)
            if lo < 0 or hi <= 0:  # a loop of no points would make its block's STORE look like a write
                raise _fail(where, f"RANGE {n.arg[0]} (node #{i}) has an end in [{lo}, {hi}]; a loop size must be "
                                   ">= 0 for every value of the Variables, and not 0 for all of them")
        if n.op in (Ops.IDIV, Ops.MOD) and n.dtype.is_int and not _nonzero(n.src[1], root):
            raise _fail(where, f"{n.op.name} node #{i} can divide by 0 (a trap in C); guard the divisor, e.g. "
                               "WHERE(b == 0, 1, b)")
        if n.op not in (Ops.INDEX, Ops.RANGE):
            continue
        for s in (u for top in (n.src[1:] if n.op is Ops.INDEX else n.src) for u in top.toposort()):
            if s in checked:
                continue
            checked.add(s)
            if s in analysis.overflows:
                what = "index" if n.op is Ops.INDEX else "loop size"
                raise _fail(where, f"{_describe(s)} in the {what} arithmetic of node #{i} can overflow "
                                   f"{DTYPE_NAMES[s.dtype]} (its exact value is not bounded by the dtype)")
        if n.op is Ops.RANGE:
            continue
        g = n.src[0]
        env = root if len(n.src) == 2 else analysis.assume(root, n.src[2], True)
        if env is None:
            continue  # the gate is never true: nothing is read or written
        v = env.of(n.src[1])
        if v is EMPTY:
            continue
        size = counts[g]
        if v[0] < 0 or v[1] > size - 1:
            gate = " under its gate" if len(n.src) == 3 else ""
            raise _fail(where, f"INDEX node #{i} into buffer {g.arg[0]} ({DTYPE_NAMES[g.dtype]}, {size} elements) "
                               f"can reach element {v[0]}..{v[1]}{gate}, outside [0, {size - 1}]")


def check_kernel(ast: UOp, arg_sizes: Sequence[int], arg_dtypes: Sequence[DType] | None = None,
                 where: str = "kernel") -> None:
    """Raise KernelFormatError unless `ast` provably stays inside buffers of these sizes (and dtypes).

    arg_sizes[slot] is the element count of the buffer passed for DEFINE_GLOBAL `slot`.

    >>> from polygrad.uop.ops import KernelInfo, UOp
    >>> from polygrad.dtype import dtypes
    >>> out, a = UOp.placeholder((4,), dtypes.float32, 0), UOp.placeholder((4,), dtypes.float32, 1)
    >>> i = UOp.range(None, 4)
    >>> k = out[i].store(a[i] * 2).end(i).sink(arg=KernelInfo("double"))
    >>> check_kernel(k, [4, 4])
    >>> check_kernel(k, [4, 3])
    Traceback (most recent call last):
    ...
    polygrad.uop.serialize.KernelFormatError: kernel 'double': buffer 1 is declared with shape (4,) \
(4 elements at the Variables' maxima) but the buffer passed holds 3
    """
    name = getattr(ast.arg, "name", None) if isinstance(ast, UOp) else None
    label = f"{where} {name!r}" if is_plain_name(name) else where
    if arg_dtypes is not None and len(arg_dtypes) != len(arg_sizes):
        raise _fail(label, f"{len(arg_sizes)} buffer sizes but {len(arg_dtypes)} dtypes")
    globals_ = check_structure(ast, arg_sizes, arg_dtypes, label)
    check_indices(ast, globals_, label)


def kernel_work(ast: UOp) -> int:
    """Node evaluations of one run at the Variables' maxima: each block (a SINK source) evaluates each of its
    nodes at most once per point of all its RANGEs (max(1, trip count) each, multiplied), and the blocks add
    up. It bounds the work of any renderer, whatever it hoists, and does not depend on how a loop's body is
    written (one node per iteration or many). For a structurally checked kernel.

    >>> from polygrad.uop.ops import UOp
    >>> from polygrad.dtype import dtypes
    >>> out = UOp.placeholder((3, 5), dtypes.float32, 0)
    >>> i, j = UOp.range(None, 3, 0), UOp.range(None, 5, 1)
    >>> kernel_work(out[i, j].store(1.0).end(i, j).sink())  # 15 points x 14 nodes (constants, index arithmetic)
    210
    """
    root = _Analysis("kernel").root
    trips: dict[UOp, int] = {}
    work = 0
    for nodes, ranges in _blocks("kernel", ast):
        block = nodes
        for r in ranges:
            if r not in trips:
                _check_size_expr("kernel", r.src[0], f"RANGE {r.arg!r:.20}'s end", {})
                trips[r] = max(root.of(r.src[0])[1], 1)
            block *= trips[r]
        work += block
    return work


__all__ = ["check_kernel", "check_structure", "check_indices", "kernel_work", "declared_count", "MAX_RANGE",
           "MAX_NODES", "MAX_STEPS", "MAX_UPCAST"]
