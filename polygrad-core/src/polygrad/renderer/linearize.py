"""The linearize pass: a lowered kernel (ProgramSpec) -> the ordered program every emitter walks.

Stage: linearizing, between lowering and rendering. Input: a ProgramSpec (kernel IR after device
optimisation). Output: a `LinearProgram`, a flat list of `Inst`s in execution order:

    PARAM VAR SPECIAL CONST LOCAL    kernel parameters, the thread index, constants, local arrays (all first)
    LOOP ... ENDLOOP                 explicit loop begin and end, properly nested (after the linear
                                     passes' partial unrolling, LOOP's third source is its step)
    ACC  UPDATE ... ACC_READ         an accumulator: defined once, updated inside its loops, read after
    IF ... ENDIF                     a gated region (gated stores)
    LOAD STORE ALU                   memory and arithmetic

A VAR's arg keeps the Variable's (name, min, max), the name as metadata only: emitters call the k-th
VAR `var_name(k)` (`v<k>`), never by the name a user or a file chose, and `text()` lists it that way.

Every value is defined before it is used and is used only inside the loop nest it was defined in
(values cross loops only through accumulators), so an emitter can declare values where they appear
(C, JavaScript, WebAssembly locals) or allocate registers in one pass (X86). The loop structure is
decided here, once, for every target:

- an END's loops open in the order of its ranges; its upcast ranges open innermost, after the
  reduces the store needs, so a reduce whose value depends on upcast lanes keeps one accumulator per
  lane (an array ACC) and its loop sits outside the lane loop: the lane loop vectorises;
- a reduce over upcast lanes (the final sum of a split reduction) computes its partial reduces first;
- a THREAD range becomes a LOOP over this thread's share of the range: [tid*chunk, min(n, (tid+1)*chunk))
  where tid is the SPECIAL thread index (0 <= tid < spec.threads) and chunk = ceil(n / threads).

GPU launches (`linearize(spec, launch=launch_dims(spec))`, renderer/launch.py; only emitters for
devices with local memory pass it): a range the launch maps is a SPECIAL launch index (arg ("gidx" |
"lidx", dimension, size)) instead of a LOOP. A reduce over a mapped GROUP range writes each thread's
partial value to a DEFINE_LOCAL array, waits at a BARRIER, and folds the array in index order in
every thread; the store after it is gated to the thread with group index 0. Where the launch says its
warps shuffle (LaunchDims.warp), the partials first combine across each warp by SHUFFLE (a butterfly:
lane XOR 16, 8, .., 1) and only a group of several warps goes through the array, one value per warp.
A block holding several groups (LOCAL rows beside the GROUP) gives each its own run of the array. Without `launch` the
program is exactly what it was before (CPU, X86, WebAssembly never see these instructions).

Values are numbered by definition; common subexpressions are shared within a loop nest (a value
computed in an inner loop is recomputed, not reused, after that loop has closed).

Unrolled register tiles: a block's upcast and unroll ranges (all but the vector lanes, below) are not
loops when they have at most MAX_UNROLL points together: each point gets its own instructions, with
the range replaced by its value (index expressions are re-simplified per point), and a reduce that
depends on them gets one accumulator per point (separate ACCs, never an array: compilers keep them
in registers). Values that do not depend on a range are shared by its points (a matmul's B vector is
loaded once per reduce step for every row of the tile). Points run in the order of the loops they
replace, so results are bit-identical to the looped form. A block with more points keeps the loops
and array accumulators described below (arg (op, k), k > 1).

Contracted sums: a REDUCE with arg FMA (lowered for a device with FMA, body MUL(a, b)) updates with
`UPDATE(acc, a, b[, lane])`, arg FMA: acc = fma(a, b, acc), rounded once; its ACC's arg is (FMA, k)
and starts at 0.

Staging (the STAGE opt, `spec.opts`): when the loop of the named global range opens, the block's one
load of the named buffer is copied, for every point of the loops still to open that it depends on,
into a LOCAL array (reduce ranges first, upcast ranges next, the vector lanes last): plain LOOPs with
a LOAD from the PARAM and a STORE into the LOCAL. The load then reads the LOCAL at the matching
position (contiguous along the lanes). LOAD and STORE take a LOCAL wherever they take a PARAM; a
LOCAL is private to each launch (the C renderer puts it on the stack). When the buffer is read through a
computed operand of a reduction's product (a weight dequantized from its blocks' bytes: several loads, or
one integer load), that operand's values are staged instead (`stage_value`), so a prompt's row tiles read
float values computed once per panel. Where the tile's vector lanes are weight rows (an outer-product
tile), the copy computes 16 rows' values as vectors along their blocks' contiguous bytes and transposes
that square in registers (TRANSPOSE, `copy_plans`) before storing each row of it contiguously.

Vector lanes (`linearize(spec, vector_width=w)`, w > 1; emitters that handle vectors pass the
device's width, `spec.vector_width`; the default 1 keeps every upcast range a scalar loop). In each
END block one upcast range V becomes vector lanes instead of a loop: the END's last upcast range if
some load or the store is contiguous in it (coefficient 1), or the last range of a split
reduction's final sum that is, whichever gets more lanes (the END's range on a tie). Its lanes
are w when w divides its size (a bigger range is split first: V = Vo*w + Vl, Vo an upcast loop
and Vl the lanes, in V's place, so the points keep their order; a 16-column tile on an 8-lane
device is two vectors), or its size when that divides w and is at least 4; otherwise no lanes.
Every instruction has a lane count `lanes` (1: scalar); its
dtype stays the scalar element dtype, so an instruction with lanes n > 1 is a vector of n values of
`dtype`, lane k being the scalar path's value at V = k. Everything that depends on V has V's lanes;
the rest stays scalar and is broadcast where it meets a vector:

    CONST with lanes n      arg is a tuple of the n lane values (V itself is the CONST (0, 1, .., n-1))
    BCAST                   src (scalar,): the scalar in every lane (constants' broadcasts sit in the head)
    LOAD, lanes n           arg "contiguous": index is lane 0's element, lane k reads index + k;
                            arg "gather": index has n lanes; arg "strided" (only from
                            `linearize(..., strided=True)`, never bools): index is lane 0's element,
                            lane k reads index + 2k (a stride-2 window's input row: the emitter reads the
                            2n elements and keeps the even ones, not n gathered lanes); arg "quads" (only
                            from a staged array of 8-bit weights): lane k reads index + 4k. A gate (scalar
                            or n lanes) reads nothing and gives 0 where false. A load whose index does
                            not depend on V is scalar.
    STORE of n lanes        arg "contiguous" or "scatter" as for LOAD (lanes written in order, so the
                            last lane wins where two write one element); a gate with lanes is a 4th
                            src (per-lane mask, no IF); a scalar gate still opens an IF block
                            (an accumulating kernel-IR STORE, arg ADD/MUL/MAX, is always scalar:
                            LOAD, the ALU op, STORE, inside the gate's IF; where the launch maps
                            ranges (a GPU scatter-add, renderer/launch.py) one STORE of arg
                            ("atomic", op) with the value to fold in)
    ALU, lanes n            lane-wise; every operand has n lanes (WHERE's condition too); bool lanes
                            are a mask the emitter chooses (the C renderer: int32 0 / -1)
    ACC, lanes n            arg (op, k): an array of k vectors (k = the other, looped upcast lanes), or one
    UPDATE                  lane-wise into a vector accumulator (FMA: a and b have its lanes); an UPDATE
                            whose value has lanes and
                            whose accumulator has none folds the lanes into it in order 0..n-1 (the
                            reduce over V itself: the final sum of a split reduction)
    ACC_READ                has its accumulator's lanes

Loops opened inside the lanes (reduces inside the lane range, other upcast ranges after V) run the
lanes in lockstep: each lane sees the same operations in the same order as the scalar loop, so the
results are bit-identical. What cannot be vectorised (16-bit float types, division and remainder of
integers narrower than 32 bits and their shifts by an amount not bounded below their width, ops outside
VECTOR_OPS, a reduce over V that is not its last range) makes the whole kernel fall back to scalar lane
loops.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from enum import Enum, auto
from types import GeneratorType
from typing import Any, Callable, Generator

from polygrad.codegen.analysis import product_operand
from polygrad.dtype import DType, dtypes
from polygrad.uop.ops import AxisKind, Ops, UOp, reduce_identity
from polygrad.uop.rewrite import graph_rewrite
from polygrad.uop.symbolic import bounds, range_coeff, symbolic_rules

Steps = Generator[Any, Any, Any]  # a step generator run by run_steps

# what a warp shuffle (L.SHUFFLE) exchanges: 32- and 64-bit words (__shfl_xor_sync's overloads)
SHUFFLE_DTYPES = frozenset({dtypes.float32, dtypes.float64, dtypes.int32, dtypes.uint32, dtypes.int64, dtypes.uint64})


def run_steps(steps: Steps, request: Callable[[Any], Any] | None = None) -> Any:
    """Run a step generator to its end and return its return value, with nested work on an explicit
    stack instead of Python's: a generator the steps yield runs next, to its end, and its return value
    is sent back; anything else yielded goes to `request`, which answers with a value to send back or
    with a generator to run first. So a walk written as recursion (a value needs its sources' values,
    a block its inner blocks) goes as deep as memory allows. An exception ends the whole run.

    >>> def count(n):
    ...     return (yield count(n - 1)) + 1 if n else 0
    >>> run_steps(count(100_000))
    100000
    """
    stack = [steps]
    reply = None
    while True:
        try:
            asked = stack[-1].send(reply)
        except StopIteration as done:
            stack.pop()
            if not stack:
                return done.value
            reply = done.value
            continue
        if request is not None and not isinstance(asked, GeneratorType):
            asked = request(asked)
            if not isinstance(asked, GeneratorType):
                reply = asked
                continue
        stack.append(asked)
        reply = None


class L(Enum):
    PARAM = auto()     # buffer pointer; dtype: element dtype; arg: (slot, written)
    VAR = auto()       # integer kernel parameter; arg: (name, min, max)
    SPECIAL = auto()   # launch index; arg: ("thread", count)
    CONST = auto()     # arg: the value (already wrapped to dtype); with lanes > 1 a tuple of lane values
    LOOP = auto()      # src: (start, end[, step]); arg: (axis id, kind); its value is the loop variable
                       # (a step, a CONST, only from linear_passes' partial unrolling: the variable grows by it)
    ENDLOOP = auto()   # src: (loop,)
    ACC = auto()       # accumulator; src: (init,); arg: (reduce op, lanes); lanes > 1 is an array
    UPDATE = auto()    # src: (acc, value[, lane]); arg: reduce op: acc[lane] = op(acc[lane], value)
    ACC_READ = auto()  # src: (acc[, lane]): the accumulator's value
    LOAD = auto()      # src: (param or local, index[, gate]); with a gate, 0 where false (memory not read);
                       # arg: None (scalar), "contiguous", "strided" or "gather" (lanes > 1)
    STORE = auto()     # src: (param or local, index, value[, gate]); value already has the buffer's dtype;
                       # arg as LOAD's; a gate only on a lane store whose gate has lanes
    BCAST = auto()     # src: (scalar,): the scalar in each of `lanes` lanes
    ALU = auto()       # arg: the Ops (ADD, CAST, WHERE...); src: operands
    LOCAL = auto()     # a scratch array of `arg` elements of dtype, private to each launch (in the head)
    IF = auto()        # src: (cond,)
    ENDIF = auto()     # src: (if,)
    DEFINE_LOCAL = auto()  # block-shared memory (GPU launches only); dtype: element dtype; arg: (name, size)
    BARRIER = auto()   # every thread of the block waits here (GPU launches only)
    SHUFFLE = auto()   # src: (value,); arg: k: the value of lane (this lane XOR k) of the warp, every lane of the
                       # warp exchanging at once (GPU launches whose LaunchDims.warp is set; scalars of
                       # SHUFFLE_DTYPES only)
    TRANSPOSE = auto()  # src: n vectors of n lanes; arg: i: the vector of each source's lane i, in order
                        # (row i of the transposed n x n block; only in a staged copy, stage_value)

    def __repr__(self) -> str:
        return f"L.{self.name}"


@dataclass(eq=False)
class Inst:
    """One instruction. Identity matters (two equal-looking loads in different loops are different)."""

    op: L
    dtype: DType | None
    src: tuple["Inst", ...] = ()
    arg: Any = None
    lanes: int = 1  # > 1: a vector of `lanes` values of dtype (see the module docstring)

    def __repr__(self) -> str:
        lanes = f", lanes={self.lanes}" if self.lanes > 1 else ""
        return f"Inst({self.op.name}, {self.dtype}{lanes}, arg={self.arg!r})"


def var_name(k: int) -> str:
    """The identifier emitters give the kernel's k-th Variable parameter (LinearProgram.vars order, which
    starts with spec.vars): `v<k>`."""
    return f"v{k}"


@dataclass(frozen=True)
class LinearProgram:
    name: str
    insts: tuple[Inst, ...]
    params: tuple[Inst, ...]   # PARAM insts in slot order (the kernel's pointer arguments)
    vars: tuple[Inst, ...]     # VAR insts in parameter order
    threads: int               # launches of the kernel, SPECIAL thread index 0..threads-1 (1: none)

    def text(self) -> str:
        """A readable listing (DEBUG output and tests)."""
        num = {id(x): i for i, x in enumerate(self.insts)}
        var_of = {id(v): k for k, v in enumerate(self.vars)}
        out, depth = [], 0
        for i, x in enumerate(self.insts):
            if x.op in (L.ENDLOOP, L.ENDIF):
                depth -= 1
            srcs = ", ".join("-" if s is None else f"%{num[id(s)]}" for s in x.src)  # None: linear_passes' offsets
            dt = x.dtype.name if x.dtype is not None else "-"
            if x.lanes > 1:
                dt += f"x{x.lanes}"
            arg = x.arg.name if isinstance(x.arg, Ops) else x.arg
            if x.op is L.VAR:  # the emitters' name, not the user's (the listing keys X86's code cache)
                arg = (var_name(var_of[id(x)]), *x.arg[1:])
            out.append(f"{'  ' * depth}%{i} = {x.op.name} {dt} ({srcs}) {arg if arg is not None else ''}".rstrip())
            if x.op in (L.LOOP, L.IF):
                depth += 1
        return "\n".join(out)


class RangeDeps:
    """deps(u): the RANGE nodes a value depends on (a REDUCE binds its own ranges)."""

    def __init__(self) -> None:
        self.memo: dict[UOp, frozenset[UOp]] = {}

    def __call__(self, u: UOp) -> frozenset[UOp]:
        hit = self.memo.get(u)
        if hit is not None:
            return hit
        for node in u.toposort():
            if node in self.memo:
                continue
            if node.op is Ops.RANGE:
                self.memo[node] = frozenset((node,))
                continue
            acc: frozenset[UOp] = frozenset()
            for s in node.src:
                acc = acc | self.memo[s]
            if node.op is Ops.REDUCE:
                acc = acc - frozenset(node.src[1:])
            self.memo[node] = acc
        return self.memo[u]


def top_level_reduces(u: UOp) -> list[UOp]:
    """REDUCE nodes reachable from u without passing through another REDUCE, sources first."""
    out: list[UOp] = []
    seen: set[UOp] = set()
    stack = [u]
    while stack:
        x = stack.pop()
        if x in seen:
            continue
        seen.add(x)
        if x.op is Ops.REDUCE:
            out.append(x)
            continue
        stack.extend(x.src)
    order = {n: i for i, n in enumerate(u.toposort())}
    return sorted(out, key=lambda n: order[n])


def _kind(r: UOp) -> str:
    return r.arg[1]


class _Pending:
    """A reduce whose accumulator is complete, not yet read in the current loop nest."""

    __slots__ = ("acc", "ups")

    def __init__(self, acc: Inst, ups: list[UOp]):
        self.acc, self.ups = acc, ups


# ops an instruction with lanes may have (every emitter that takes vector_width > 1 renders them all)
VECTOR_OPS = frozenset({Ops.ADD, Ops.MUL, Ops.NEG, Ops.FDIV, Ops.IDIV, Ops.MOD, Ops.MAX, Ops.CMPLT, Ops.CMPNE,
                        Ops.CMPEQ, Ops.AND, Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR, Ops.WHERE, Ops.FMA, Ops.EXP2,
                        Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.TRUNC, Ops.POW, Ops.RECIPROCAL, Ops.CAST, Ops.BITCAST})
BOOL_VECTOR_OPS = frozenset({Ops.ADD, Ops.MUL, Ops.NEG, Ops.MAX, Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ, Ops.AND, Ops.OR,
                             Ops.XOR, Ops.WHERE, Ops.CAST})
HALF_DTYPES = (dtypes.float16, dtypes.bfloat16)


# the most points a block's upcast and unroll ranges may have for them to be unrolled (each point its own
# instructions and named accumulators); a block with more keeps them as loops over accumulator arrays
MAX_UNROLL = 64
# lanes this many elements apart in a staged array of 8-bit weights are one "quads" load (stage_layout)
QUAD = 4
# the largest local array a STAGE opt may fill (it lives on the launch's stack)
STAGE_MAX_BYTES = 512 * 1024


def _narrow_shift_fits(u: UOp | None) -> bool:
    """Whether a shift of 8- or 16-bit lanes is the scalar path's value: its amount stays below the lane
    width. A scalar C shift computes in int, then the result is cut to the narrow type; lanes shift in
    their own width, which agrees for every amount below it and is undefined from it on."""
    if u is None or u.src[1].dtype is None or not u.src[1].dtype.is_int:
        return False
    lo, hi = bounds(u.src[1])
    return 0 <= lo and hi < 8 * u.dtype.itemsize


class NoVector(Exception):
    """Raised while linearizing with lanes when an instruction cannot be vectorised: the kernel is
    linearized again with scalar lane loops."""


def _is_int_const(x: Inst) -> bool:
    """Whether x is a scalar integer CONST."""
    return x.op is L.CONST and x.lanes == 1 and isinstance(x.arg, int) and not isinstance(x.arg, bool)


def _at_lane0(expr: UOp, r: UOp) -> UOp:
    """expr with the range r replaced by 0 (lane 0's index of a contiguous access), simplified."""
    zero = UOp.const(r.dtype, 0)
    memo: dict[UOp, UOp] = {r: zero}
    for node in expr.toposort():
        if node in memo:
            continue
        new_src = tuple(memo.get(x, x) for x in node.src)
        memo[node] = node if new_src == node.src else node.replace(src=new_src)
    return graph_rewrite(memo[expr], symbolic_rules, name="lane0_index")


_LANES = Inst(L.CONST, None)  # marks the vector range as open (its lanes, not a loop)


def _substituted(expr: UOp, memo: dict[UOp, UOp]) -> UOp:
    """expr with the nodes of memo replaced (not simplified)."""
    memo = dict(memo)
    for node in expr.toposort():
        if node in memo:
            continue
        new_src = tuple(memo.get(x, x) for x in node.src)
        memo[node] = node if new_src == node.src else node.replace(src=new_src)
    return memo[expr]


@dataclass(frozen=True)
class CopyPlan:
    """How stage_value computes a staged operand into its array: `value` at every point of `inner` (the
    array's order) into position `flat`, with `lanes` (a range of inner, or None) as vector lanes and,
    with `across`, a square of lanes x across transposed in registers (stage_copy)."""

    value: UOp
    inner: list[UOp]
    flat: UOp
    lanes: UOp | None
    across: UOp | None = None


class _Linearizer:
    def __init__(self, spec: Any, vector_width: int = 1, launch: Any = None, strided: bool = False):
        self.spec = spec
        self.strided = strided  # loads whose lanes are 2 elements apart may be "strided" (else gathers)
        self.launch = launch  # LaunchDims (renderer/launch.py): ranges that are launch indices, not loops
        self.group_ids: list[Inst] = []  # block indices of grouped reductions: only thread 0 of them stores
        self.width = vector_width
        self.vec: UOp | None = None  # the current END block's vector range
        self.head: list[Inst] = []
        self.body: list[Inst] = []
        self.scopes: list[dict[Any, Inst]] = [{}]
        self.consts: dict[tuple, Inst] = {}
        self.open: dict[UOp, Inst] = {}
        self.deps = RangeDeps()
        self.params: dict[int, Inst] = {}
        self.vars: dict[str, Inst] = {}
        self.tid: Inst | None = None
        self.unrolled: set[UOp] = set()  # upcast / unroll ranges of the current block that are unrolled
        self.bind: dict[UOp, int] = {}  # their values at the point being emitted
        self.folded: dict[tuple, UOp] = {}
        # STAGE opts: {range axis id: buffer slot}; staged loads: {LOAD: (local array, its index)}
        self.stage_at: dict[int, int] = {o.axis: o.amount for o in getattr(spec, "opts", ())
                                         if getattr(o.kind, "value", o.kind) == "STAGE"}
        self.staged: dict[UOp, tuple[Inst, UOp]] = {}
        self.next_axis = 1 + max((r.arg[0] for r in spec.ast.toposort() if r.op is Ops.RANGE), default=0)

    # ---- building blocks
    def add(self, op: L, dtype: DType | None, src: tuple = (), arg: Any = None, lanes: int = 1) -> Inst:
        x = Inst(op, dtype, src, arg, lanes)
        self.body.append(x)
        return x

    def const(self, dtype: DType, value: Any) -> Inst:
        if dtype.is_float and type(value) is int:  # 0 and 0.0 are one constant (and one broadcast)
            value = float(value)
        key = (dtype, type(value), value if not (isinstance(value, float) and value != value) else "nan",
               math.copysign(1, value) if isinstance(value, float) else 0)
        hit = self.consts.get(key)
        if hit is None:
            hit = self.consts[key] = Inst(L.CONST, dtype, (), value)
            self.head.append(hit)
        return hit

    def lane_ids(self, dtype: DType, n: int) -> Inst:
        """The vector range's value: the CONST (0, 1, ..., n-1)."""
        key = ("lanes", dtype, n)
        hit = self.consts.get(key)
        if hit is None:
            hit = self.consts[key] = Inst(L.CONST, dtype, (), tuple(range(n)), n)
            self.head.append(hit)
        return hit

    def bcast(self, x: Inst, n: int) -> Inst:
        """x in n lanes (x itself when it has them)."""
        if x.lanes == n:
            return x
        if x.lanes != 1:
            raise NoVector(f"{x} has {x.lanes} lanes, {n} needed")
        if x.dtype in HALF_DTYPES:
            raise NoVector("16-bit float lanes")
        if x.op is L.CONST:  # defined once, in the head
            key = ("bcast", id(x), n)
            hit = self.consts.get(key)
            if hit is None:
                hit = self.consts[key] = Inst(L.BCAST, x.dtype, (x,), None, n)
                self.head.append(hit)
            return hit
        key = ("bcast", id(x), n)
        for scope in reversed(self.scopes):
            hit = scope.get(key)
            if hit is not None:
                return hit
        hit = self.scopes[-1][key] = self.add(L.BCAST, x.dtype, (x,), None, n)
        return hit

    def lanes_open(self) -> bool:
        return self.vec is not None and self.vec in self.open

    def vec_size(self) -> int:
        return int(self.vec.src[0].arg) if self.vec is not None else 1

    def key(self, u: UOp) -> Any:
        """Where u's value is cached: u itself, or u with the values of the unrolled ranges it depends on."""
        if not self.bind:
            return u
        deps = self.deps(u)
        bound = tuple(sorted((r.arg[0], v) for r, v in self.bind.items() if r in deps))
        return (u, bound) if bound else u

    def lookup(self, u: UOp) -> Inst | None:
        k = self.key(u)
        for scope in reversed(self.scopes):
            hit = scope.get(k)
            if hit is None:
                continue
            if isinstance(hit, _Pending):  # a finished reduce: read it here, inside the lane loops
                if hit.acc.lanes > 1 and not self.lanes_open():
                    raise NoVector("a vector accumulator read outside its lanes")
                lane = self.flat_lane([r for r in hit.ups if r is not self.vec])
                hit = self.add(L.ACC_READ, hit.acc.dtype, (hit.acc,) + ((lane,) if lane is not None else ()),
                               lanes=hit.acc.lanes)
                self.scopes[-1][k] = hit
            return hit
        return None

    def launch_index(self, r: UOp) -> Inst | None:
        """The SPECIAL launch index of a range the launch maps (gidx / lidx), None for a loop."""
        where = self.launch.index_of(r.arg[0]) if self.launch is not None else None
        if where is None:
            return None
        key = ("launch", r.arg[0])
        hit = self.consts.get(key)
        if hit is None:
            hit = self.consts[key] = Inst(L.SPECIAL, r.dtype, (), where)
            self.head.append(hit)
        return hit

    def open_loop(self, r: UOp) -> Steps:
        special = self.launch_index(r)
        if special is not None:  # one launch index per point: no loop
            self.open[r] = special
            self.scopes.append({})
            return
        if r is self.vec:  # vector lanes, not a loop: its value (when used) is the lane index vector
            self.open[r] = _LANES
            self.scopes.append({})
            return
        if _kind(r) == AxisKind.THREAD:
            n = yield r.src[0]
            t = self.spec.threads
            chunk = self.const(r.dtype, -(-int(r.src[0].arg) // t)) if r.src[0].op is Ops.CONST else None
            if chunk is None:  # symbolic size: ceil(n / t) at run time
                tm1 = self.const(r.dtype, t - 1)
                chunk = self.add(L.ALU, r.dtype, (self.add(L.ALU, r.dtype, (n, tm1), Ops.ADD), self.const(r.dtype, t)),
                                 Ops.IDIV)
            tid = self.tid_inst(r.dtype)
            start = self.add(L.ALU, r.dtype, (tid, chunk), Ops.MUL)
            end = self.add(L.ALU, r.dtype, (start, chunk), Ops.ADD)
            if not (r.src[0].op is Ops.CONST and int(r.src[0].arg) % t == 0):
                # the last share is shorter (a clamp only here: clang optimises the loop nest worse
                # when the trip count goes through a select, measured 25% on a 512 matmul)
                less = self.add(L.ALU, dtypes.bool, (end, n), Ops.CMPLT)
                end = self.add(L.ALU, r.dtype, (less, end, n), Ops.WHERE)
        else:
            start, end = self.const(r.dtype, 0), (yield r.src[0])
        loop = self.add(L.LOOP, r.dtype, (start, end), r.arg)
        self.scopes.append({})
        self.open[r] = loop

    def close_loop(self, r: UOp) -> None:
        x = self.open.pop(r)
        if r is not self.vec and x.op is not L.SPECIAL:
            self.add(L.ENDLOOP, None, (x,))
        self.scopes.pop()

    def tid_inst(self, dt: DType) -> Inst:
        if self.tid is None:
            self.tid = Inst(L.SPECIAL, dt, (), ("thread", self.spec.threads))
            self.head.append(self.tid)
        return self.tid

    # ---- values
    def value(self, u: UOp) -> Inst:
        """u's instruction here: the cached one, else emitted now (with whatever it needs first)."""
        hit = self.lookup(u)
        if hit is not None:
            return hit
        return run_steps(self.emit_value(u), self.request)

    def request(self, u: UOp) -> Inst | Steps:
        """What `yield u` in a step generator gives: u's cached instruction, or the steps that emit it."""
        hit = self.lookup(u)
        return hit if hit is not None else self.emit_value(u)

    def emit_value(self, u: UOp) -> Steps:
        """Emit u (not cached here), its sources first, in order; returns its instruction."""
        op = u.op
        if op is Ops.CONST:
            return self.const(u.dtype, u.arg)
        if op is Ops.RANGE:
            if u in self.bind:
                return self.const(u.dtype, self.bind[u])
            loop = self.open.get(u)
            if loop is None:
                raise RuntimeError(f"range {u.arg} used outside its loop")
            return self.lane_ids(u.dtype, int(u.src[0].arg)) if loop is _LANES else loop
        if op is Ops.DEFINE_GLOBAL:
            return self.params[u.arg[0]]
        if op is Ops.DEFINE_VAR:
            hit = self.vars.get(u.arg[0])
            if hit is None:
                hit = self.vars[u.arg[0]] = Inst(L.VAR, u.dtype, (), u.arg)
                self.head.append(hit)
            return hit
        if op is Ops.REDUCE:
            yield self.reduce(u)
            return self.lookup(u)
        if op is Ops.LOAD:
            x = yield from self.load(u)
        elif u in self.staged:  # a staged value (a dequantized weight): read from its local array
            local, flat = self.staged[u]
            idx, _, kind, n = yield from self.access(None, flat, quads=u.dtype in (dtypes.int8, dtypes.uint8))
            x = self.add(L.LOAD, u.dtype, (local, idx), kind, n)
        else:
            src = []
            for s in u.src:
                src.append((yield s))
            x = self.alu(u.dtype, tuple(src), op, u)
        self.scopes[-1][self.key(u)] = x
        return x

    def bound_expr(self, e: UOp) -> UOp:
        """An index expression with the unrolled ranges' current values substituted and simplified
        (so an unrolled point's address is one folded expression, not arithmetic on constants)."""
        if not self.bind:
            return e
        deps = self.deps(e)
        hit = sorted((r for r in self.bind if r in deps), key=lambda r: r.arg[0])
        if not hit:
            return e
        k = (e, tuple(self.bind[r] for r in hit), tuple(hit))
        out = self.folded.get(k)
        if out is None:
            memo: dict[UOp, UOp] = {r: UOp.const(r.dtype, self.bind[r]) for r in hit}
            for node in e.toposort():
                if node in memo:
                    continue
                src = tuple(memo.get(x, x) for x in node.src)
                memo[node] = node if src == node.src else node.replace(src=src)
            out = self.folded[k] = graph_rewrite(memo[e], symbolic_rules, name="unrolled_index")
        return out

    def alu(self, dtype: DType, src: tuple[Inst, ...], op: Ops, u: UOp | None = None) -> Inst:
        """An ALU instruction; with lanes when a source has them (NoVector where lanes cannot hold it).
        `u` is the kernel's node when there is one (a narrow shift's amount bounds its lanes)."""
        n = max((s.lanes for s in src), default=1)
        if n > 1:
            if op not in VECTOR_OPS or (dtype is dtypes.bool and op not in BOOL_VECTOR_OPS):
                raise NoVector(f"no lanes for {op.name} on {dtype.name}")
            if dtype in HALF_DTYPES or any(s.dtype in HALF_DTYPES for s in src):
                raise NoVector("16-bit float lanes")
            if op in (Ops.IDIV, Ops.MOD) and dtype.is_int and dtype.itemsize < 4:
                raise NoVector(f"{op.name} lanes on {dtype.name} (C computes it in int)")
            if op in (Ops.SHL, Ops.SHR) and dtype.is_int and dtype.itemsize < 4 and not _narrow_shift_fits(u):
                raise NoVector(f"{op.name} lanes on {dtype.name} by an amount that may reach its width")
            if op is Ops.BITCAST and (dtype is dtypes.bool or src[0].dtype is dtypes.bool
                                      or dtype.itemsize != src[0].dtype.itemsize):
                raise NoVector("BITCAST lanes between widths")
            src = tuple(self.bcast(s, n) for s in src)
        return self.add(L.ALU, dtype, src, op, n)

    def access(self, index: UOp | None, at: UOp | None = None, strided: bool = False,
               quads: bool = False) -> Steps:
        """(index, gate, kind, lanes) of a memory access: kind None (scalar), "contiguous" (the index
        is lane 0's), "strided" (where `strided` and the lanes are 2 elements apart: the index is lane
        0's), "quads" (where `quads` and the lanes are 4 elements apart: a staged array of 8-bit weights,
        each lane's 4 turns together) or "gather" (one index per lane). `at` replaces the index expression
        (a staged load or value reads its local array there; a staged value has no INDEX: `index` None)."""
        gate = (yield self.bound_expr(index.src[2])) if index is not None and len(index.src) > 2 else None
        expr, offset = self.bound_split(index.src[1] if at is None else at)

        def at_offset(x: Inst) -> Inst:  # the unrolled point's constant part, one add
            if offset == 0:
                return x
            # (e + c) + offset as e + (c + offset): clang kept (e + 1) + 504 apart, in 64-bit arithmetic, so a
            # tile of rows lost the 16-bit load of each row's two scale bytes (and spilled)
            if x.op is L.ALU and x.arg is Ops.ADD and x.lanes == 1 and _is_int_const(x.src[1]) \
                    and dtypes.min(x.dtype) <= x.src[1].arg + offset <= dtypes.max(x.dtype):
                return self.alu(x.dtype, (x.src[0], self.const(x.dtype, x.src[1].arg + offset)), Ops.ADD)
            return self.alu(x.dtype, (x, self.const(x.dtype, offset)), Ops.ADD)
        if not self.lanes_open():
            return at_offset((yield expr)), gate, None, 1
        n = self.vec_size()
        c = range_coeff(expr, self.vec)
        if c == 1:
            return at_offset((yield _at_lane0(expr, self.vec))), gate, "contiguous", n
        if c == 2 and strided:
            return at_offset((yield _at_lane0(expr, self.vec))), gate, "strided", n
        if c == QUAD and quads:
            return at_offset((yield _at_lane0(expr, self.vec))), gate, "quads", n
        idx = at_offset((yield expr))
        if idx.lanes == 1 and (gate is None or gate.lanes == 1):
            return idx, gate, None, 1
        return self.bcast(idx, n), gate, "gather", n

    def bound_split(self, e: UOp) -> tuple[UOp, int]:
        """(expression, constant) equal to e at the current unrolled point: for an index linear in the
        bound ranges, e with them at 0 (simplified once per expression) and the point's offset; else
        bound_expr(e) and 0."""
        if not self.bind:
            return e, 0
        deps = self.deps(e)
        hit = sorted((r for r in self.bind if r in deps), key=lambda r: r.arg[0])
        if not hit:
            return e, 0
        coeffs = [range_coeff(e, r) for r in hit]
        if any(c is None for c in coeffs):
            return self.bound_expr(e), 0
        k = (e, "zero", tuple(hit))
        base = self.folded.get(k)
        if base is None:
            memo: dict[UOp, UOp] = {r: UOp.const(r.dtype, 0) for r in hit}
            for node in e.toposort():
                if node in memo:
                    continue
                src = tuple(memo.get(x, x) for x in node.src)
                memo[node] = node if src == node.src else node.replace(src=src)
            base = self.folded[k] = graph_rewrite(memo[e], symbolic_rules, name="unrolled_index")
        return base, sum(c * self.bind[r] for c, r in zip(coeffs, hit))

    def load(self, u: UOp) -> Steps:
        index = u.src[0]
        staged = self.staged.get(u)
        buf = (yield index.src[0]) if staged is None else staged[0]
        strided = self.strided and staged is None and u.dtype is not dtypes.bool
        idx, gate, kind, n = yield from self.access(index, None if staged is None else staged[1], strided)
        if n > 1 and u.dtype in HALF_DTYPES:
            raise NoVector("16-bit float lanes")
        return self.add(L.LOAD, u.dtype, (buf, idx) + ((gate,) if gate is not None else ()), kind, n)

    def flat_lane(self, ups: list[UOp]) -> Inst | None:
        if not ups:
            return None
        lane = self.value(ups[0])
        for r in ups[1:]:
            lane = self.add(L.ALU, r.dtype, (self.add(L.ALU, r.dtype, (lane, self.const(r.dtype, int(r.src[0].arg))),
                                                      Ops.MUL), self.value(r)), Ops.ADD)
        return lane

    def each_point(self, ranges: list[UOp], emit: Callable[[], Steps]) -> Steps:
        """Run emit()'s steps at every point of ranges, in order: an unrolled range binds each of its
        values in turn (no loop), any other opens a loop (or, for the vector range, its lanes)."""
        if not ranges:
            yield emit()
            return
        r, rest = ranges[0], ranges[1:]
        if r in self.unrolled:
            for v in range(int(r.src[0].arg)):
                self.bind[r] = v
                yield self.each_point(rest, emit)
            del self.bind[r]
            return
        yield from self.open_loop(r)
        yield self.each_point(rest, emit)
        self.close_loop(r)

    def reduce(self, red: UOp) -> Steps:
        """Emit red's accumulators and loops; its value is read (ACC_READ) where it is used."""
        if self.lookup_pending(red):
            return
        body, ranges = red.src[0], list(red.src[1:])
        if len(ranges) == 1 and _kind(ranges[0]) == AxisKind.GROUP and self.launch_index(ranges[0]) is not None:
            yield self.group_reduce(red)
            return
        ups = sorted((r for r in self.deps(red) if _kind(r) == AxisKind.UPCAST and r not in self.open
                      and r not in self.bind), key=lambda r: r.arg[0])
        vec = self.vec
        n = self.vec_size() if vec is not None and vec in self.deps(red) else 1
        over_lanes = vec is not None and vec in ranges
        if over_lanes and (ranges[-1] is not vec or red.arg is Ops.FMA):
            raise NoVector("a reduce over the lanes and later ranges (the lanes would change its order)")
        if (n > 1 or over_lanes) and red.dtype in HALF_DTYPES:
            raise NoVector("16-bit float lanes")
        unrolled = [r for r in ups if r in self.unrolled]
        looped = [r for r in ups if r not in self.unrolled]
        array = [r for r in looped if r is not vec]
        count = math.prod(int(r.src[0].arg) for r in array)
        init = self.const(red.dtype, reduce_identity(Ops.ADD if red.arg is Ops.FMA else red.arg, red.dtype))
        points = list(itertools.product(*(range(int(r.src[0].arg)) for r in unrolled)))
        accs = [self.add(L.ACC, red.dtype, (self.bcast(init, n),), (red.arg, count), n) for _ in points]
        if any(_kind(r) == AxisKind.UPCAST for r in ranges):
            # a reduce over upcast lanes (a split reduction's final sum): run the partial reduces
            # first, with one accumulator per lane, so their loops stay outside the lane loop
            for inner in top_level_reduces(body):
                yield self.reduce(inner)

        def update() -> Steps:
            acc = accs[points.index(tuple(self.bind[r] for r in unrolled))]
            lane = self.flat_lane(array)
            lane_src = (lane,) if lane is not None else ()
            if red.arg is Ops.FMA:  # acc = fma(a, b, acc): the body is MUL(a, b), rounded once with the add
                a = yield body.src[0]
                b = yield body.src[1]
                width = max(a.lanes, b.lanes, n)
                self.add(L.UPDATE, None, (acc, self.bcast(a, width), self.bcast(b, width)) + lane_src, Ops.FMA,
                         width)
                return
            v = yield body
            if n > 1 or over_lanes:
                v = self.bcast(v, self.vec_size())
            self.add(L.UPDATE, None, (acc, v) + lane_src, red.arg, v.lanes)

        shared = self.shared_reduces(red, unrolled, array) if unrolled else []
        if shared:
            def points_sharing() -> Steps:  # the nested sums first, all points in one loop nest
                for inner in shared:
                    yield self.reduce(inner)
                yield self.each_point(looped + unrolled, update)
            yield self.each_point(ranges, points_sharing)
        else:
            yield self.each_point(ranges + looped + unrolled, update)
        # read where the reduce is used: inside the lane loops (or at the unrolled point) the caller opens next
        for point, acc in zip(points, accs):
            self.bind.update(zip(unrolled, point))
            self.scopes[-1][self.key(red)] = _Pending(acc, array)
        for r in unrolled:
            del self.bind[r]

    def shared_reduces(self, red: UOp, unrolled: list[UOp], array: list[UOp]) -> list[UOp]:
        """The reduces nested in red's body whose loops the unrolled points of red can share: each runs once
        per step of red's loops, for every point at once (one accumulator a point; an int8 prompt tile's
        block sums, renderer/int8_dot.py), where evaluating red's body point by point would repeat their
        loops per point. Only plain reduce loops that depend on an unrolled range and on no lane, array
        or later range."""
        if any(_kind(r) != AxisKind.REDUCE for r in red.src[1:]):
            return []
        out = []
        for inner in top_level_reduces(red.src[0]):
            deps = self.deps(inner)
            if inner.dtype != dtypes.int32 or not any(r in deps for r in unrolled):
                continue
            if any(_kind(r) != AxisKind.REDUCE for r in inner.src[1:]) or self.vec in inner.src[1:] \
                    or any(r in deps for r in array):
                continue
            out.append(inner)
        return out

    def group_reduce(self, red: UOp) -> Steps:
        """A reduce over a GROUP range mapped to a block index: each thread computes its partial value
        (the inner reduce), writes it to shared memory, and after a barrier every thread folds its
        group's values in index order (the order of the loop it replaces: the same bits). With warp
        shuffles (launch.warp) the partials combine across each warp first (warp_combine). A block may
        hold several groups (LOCAL rows beside the GROUP): each has its own run of the shared array."""
        g = red.src[1]
        size = int(g.src[0].arg)
        yield from self.open_loop(g)
        lid = self.open[g]
        v = yield red.src[0]
        if lid not in self.group_ids:
            self.group_ids.append(lid)
        if getattr(self.launch, "warp", 0) and red.dtype in SHUFFLE_DTYPES and v.lanes == 1:
            acc = yield self.warp_combine(red, g, lid, v, size, self.launch.warp)
        else:
            acc = yield self.fold_shared(red, g, lid, v, size)
        self.close_loop(g)
        self.scopes[-1][red] = _Pending(acc, [])

    def group_slot(self, g: UOp) -> tuple[Inst | None, int]:
        """(this thread's group among its block's groups: the linear index of the block's other lidx
        indices, None when there are none; how many groups a block holds)."""
        slot, count = None, 1
        for axis, kind, dim, size in sorted(self.launch.axes, key=lambda a: a[2]):
            if kind != "lidx" or axis == g.arg[0]:
                continue
            key = ("launch", axis)
            index = self.consts.get(key)
            if index is None:
                index = self.consts[key] = Inst(L.SPECIAL, g.dtype, (), (kind, dim, size))
                self.head.append(index)
            term = index if count == 1 else self.alu(g.dtype, (index, self.const(g.dtype, count)), Ops.MUL)
            slot = term if slot is None else self.alu(g.dtype, (slot, term), Ops.ADD)
            count *= size
        return slot, count

    def fold_shared(self, red: UOp, g: UOp, at: Inst, v: Inst, size: int, first: Inst | None = None) -> Steps:
        """Every thread (where `first`, a bool, holds) writes `v` at `at` in its group's run of `size`
        entries of a new shared array; after a barrier every thread folds its group's run in index order
        into a new accumulator (returned), then waits again before the array can be reused."""
        slot, count = self.group_slot(g)
        smem = self.shared(red.dtype, size * count)
        base = None if slot is None else self.alu(g.dtype, (slot, self.const(g.dtype, size)), Ops.MUL)
        where = at if base is None else self.alu(g.dtype, (base, at), Ops.ADD)
        gate = self.add(L.IF, None, (first,)) if first is not None else None
        self.scopes.append({})
        self.add(L.STORE, None, (smem, where, v))
        self.scopes.pop()
        if gate is not None:
            self.add(L.ENDIF, None, (gate,))
        self.add(L.BARRIER, None)
        init = self.const(red.dtype, reduce_identity(red.arg, red.dtype))
        acc = self.add(L.ACC, red.dtype, (init,), (red.arg, 1))
        j = UOp(Ops.RANGE, g.dtype, (UOp.const(g.dtype, size),), (self.next_axis, AxisKind.REDUCE))
        self.next_axis += 1
        yield from self.open_loop(j)
        k = self.open[j] if base is None else self.alu(g.dtype, (base, self.open[j]), Ops.ADD)
        self.add(L.UPDATE, None, (acc, self.add(L.LOAD, red.dtype, (smem, k))), red.arg)
        self.close_loop(j)
        self.add(L.BARRIER, None)  # the next use of the shared memory (an outer loop's next point) waits
        return acc

    def shared(self, dtype: DType, size: int) -> Inst:
        """A new block-shared array (DEFINE_LOCAL, in the head) of `size` elements."""
        smem = Inst(L.DEFINE_LOCAL, dtype, (), (f"smem{sum(x.op is L.DEFINE_LOCAL for x in self.head)}", size))
        self.head.append(smem)
        return smem

    def warp_combine(self, red: UOp, g: UOp, lid: Inst, v: Inst, size: int, warp: int) -> Steps:
        """The accumulator holding the group's reduction of every thread's partial value `v`: a butterfly
        over the warp (each lane folds in the value of lane XOR k, k = min(size, warp) / 2, ..., 1: every lane
        ends with the same bits, the warp's lanes combined in pairs); a group of several warps then has each
        warp's lane 0 write its value to shared memory and every thread folds its group's warps in order
        (fold_shared)."""
        init = self.const(red.dtype, reduce_identity(red.arg, red.dtype))
        acc = self.add(L.ACC, red.dtype, (init,), (red.arg, 1))
        self.add(L.UPDATE, None, (acc, v), red.arg)
        k = min(size, warp) // 2
        while k:
            other = self.add(L.SHUFFLE, red.dtype, (self.add(L.ACC_READ, red.dtype, (acc,)),), k)
            self.add(L.UPDATE, None, (acc, other), red.arg)
            k //= 2
        if size <= warp:
            return acc
        w = self.const(lid.dtype, warp)
        lane0 = self.alu(dtypes.bool, (self.alu(lid.dtype, (lid, w), Ops.MOD), self.const(lid.dtype, 0)), Ops.CMPEQ)
        total = yield self.fold_shared(red, g, self.alu(lid.dtype, (lid, w), Ops.IDIV),
                                       self.add(L.ACC_READ, red.dtype, (acc,)), size // warp, lane0)
        return total

    def lookup_pending(self, u: UOp) -> bool:
        k = self.key(u)
        return any(k in scope for scope in self.scopes)

    # ---- blocks
    def store(self, st: UOp) -> Steps:
        index, value = st.src
        v = yield value
        if value.dtype != index.dtype:
            v = self.alu(index.dtype, (v,), Ops.CAST)
        buf = yield index.src[0]
        idx, gate, kind, n = yield from self.access(index)
        for lid in self.group_ids:  # every thread of a grouped reduction holds the value: thread 0 stores
            first = self.add(L.ALU, dtypes.bool, (lid, self.const(lid.dtype, 0)), Ops.CMPEQ)
            gate = first if gate is None else self.alu(dtypes.bool, (gate, first), Ops.AND)
        if st.arg is not None:  # accumulating store: load, fold, store back, one point at a time
            if n > 1 or v.lanes > 1:
                raise NoVector("an accumulating store in lanes")
            self.scopes.append({})
            gate_if = self.add(L.IF, None, (gate,)) if gate is not None else None
            if self.launch is not None and self.launch.axes:  # points run concurrently: one atomic fold
                self.add(L.STORE, None, (buf, idx, v), ("atomic", st.arg))
            else:
                old = self.add(L.LOAD, index.dtype, (buf, idx))
                self.add(L.STORE, None, (buf, idx, self.alu(index.dtype, (old, v), st.arg)))
            if gate_if is not None:
                self.add(L.ENDIF, None, (gate_if,))
            self.scopes.pop()
            return
        if kind is None and v.lanes > 1:  # one element, every lane writes it: the last lane wins
            idx, kind, n = self.bcast(idx, v.lanes), "scatter", v.lanes
        if kind == "gather":
            kind = "scatter"
        if n > 1:
            if index.dtype in HALF_DTYPES:
                raise NoVector("16-bit float lanes")
            v = self.bcast(v, n)
        if gate is not None and gate.lanes > 1:  # per-lane mask: no IF block
            self.add(L.STORE, None, (buf, idx, v, gate), kind, n)
        elif gate is not None:
            gate_if = self.add(L.IF, None, (gate,))
            self.scopes.append({})
            self.add(L.STORE, None, (buf, idx, v), kind, n)
            self.scopes.pop()
            self.add(L.ENDIF, None, (gate_if,))
        else:
            self.add(L.STORE, None, (buf, idx, v), kind, n)

    def lanes_for(self, r: UOp) -> int:
        """The lanes range r can have: the device's width when it divides r's size (a bigger range is
        split: an outer lane loop around vectors of the width), r's size when it divides the width
        (4 lanes or more), else 0."""
        if r.src[0].op is not Ops.CONST:
            return 0
        size = int(r.src[0].arg)
        if size % self.width == 0:
            return self.width
        if self.width % size == 0 and size >= 4:
            return size
        return 0

    def choose_vector(self, node: UOp) -> UOp | None:
        """The END block's vector range (module docstring), or None."""
        store = node.src[0]
        if self.width <= 1 or store.op is not Ops.STORE or store.arg is not None:
            return None
        indexes = [store.src[0].src[1]] + [x.src[0].src[1] for x in store.toposort() if x.op is Ops.LOAD]

        def contiguous(r: UOp) -> bool:
            return any(range_coeff(ix, r) == 1 for ix in indexes)

        ups = [r for r in node.src[1:] if _kind(r) == AxisKind.UPCAST]
        found = [ups[-1]] if ups and self.lanes_for(ups[-1]) and contiguous(ups[-1]) else []
        for red in store.toposort():
            if red.op is Ops.REDUCE and _kind(red.src[-1]) == AxisKind.UPCAST:
                r = red.src[-1]
                if self.lanes_for(r) and contiguous(r):
                    found.append(r)
                    break
        # the wider of the two (the END's range on a tie): a 4-column upcast of a tile of dot products
        # would leave the 16-lane split reduction a loop and gather the other operand lane by lane
        return max(found, key=self.lanes_for) if found else None

    def split_lanes(self, node: UOp, v: UOp, lanes: int) -> tuple[UOp, UOp]:
        """node with range v replaced by vo*lanes + vl: vo an upcast loop, vl the lanes (in END and
        REDUCE range lists vo, vl take v's place, so every point keeps its order)."""
        outer = UOp.const(v.dtype, int(v.src[0].arg) // lanes)
        vo = UOp(Ops.RANGE, v.dtype, (outer,), (self.next_axis, AxisKind.UPCAST))
        vl = UOp(Ops.RANGE, v.dtype, (UOp.const(v.dtype, lanes),), (self.next_axis + 1, AxisKind.UPCAST))
        self.next_axis += 2
        memo: dict[UOp, UOp] = {v: vo * lanes + vl}
        for x in node.toposort():
            if x in memo:
                continue
            src = tuple(memo.get(s, s) for s in x.src)
            if x.op in (Ops.END, Ops.REDUCE) and v in x.src[1:]:
                rs: list[UOp] = []
                for old, new in zip(x.src[1:], src[1:]):
                    rs += [vo, vl] if old is v else [new]
                memo[x] = UOp(x.op, x.dtype, (src[0], *rs), x.arg)
            else:
                memo[x] = x if src == x.src else x.replace(src=src)
        return memo[node], vl

    def block(self, node: UOp) -> Steps:
        if node.op is Ops.STORE:
            yield self.store(node)
            return
        if node.op is not Ops.END:
            raise RuntimeError(f"kernel body must be STORE or END, got {node.op.name}")
        chosen = self.choose_vector(node) if self.vec is None else None
        if chosen is not None:
            lanes = self.lanes_for(chosen)
            if lanes < int(chosen.src[0].arg):
                node, chosen = self.split_lanes(node, chosen, lanes)
            self.vec = chosen
        inner, ranges = node.src[0], list(node.src[1:])
        unroll = self.unroll_set(node) if not self.unrolled else set()
        self.unrolled |= unroll
        loops = [r for r in ranges if _kind(r) != AxisKind.UPCAST]
        ups = [r for r in ranges if _kind(r) == AxisKind.UPCAST]
        for r in loops:
            yield from self.open_loop(r)
            if r.arg[0] in self.stage_at:
                yield self.stage(node, self.stage_at[r.arg[0]])
        if inner.op is Ops.STORE:
            for red in top_level_reduces(inner):
                yield self.reduce(red)
        yield self.each_point([r for r in ups if r not in self.unrolled] + [r for r in ups if r in self.unrolled],
                              lambda: self.block(inner))
        for r in reversed(loops):
            self.close_loop(r)
        self.unrolled -= unroll
        if chosen is not None:
            self.vec = None

    def stage(self, node: UOp, slot: int) -> Steps:
        """STAGE: copy what the block's one load of buffer `slot` reads inside the loops still to open
        into a LOCAL array, in their order (reduce ranges, then upcast ranges, the vector lanes last,
        so the lanes read it contiguously), and make that load read the array; a product operand
        computed from the buffer's loads (a dequantized weight) is staged by stage_value instead. Skipped
        (the load stays as it is) when the buffer has several loads, a gated one, symbolic inner sizes,
        16-bit floats, or more than STAGE_MAX_BYTES to copy."""
        loads = {x for x in node.toposort() if x.op is Ops.LOAD and x.src[0].src[0].arg[0] == slot}
        value = product_operand(node, slot)
        if value is not None and value.op is Ops.CAST and value.dtype == dtypes.int32 \
                and value.src[0].dtype in (dtypes.int8, dtypes.uint8) and value.src[0].op is not Ops.LOAD:
            value = value.src[0]  # an 8-bit weight widened for its product: staged as bytes (renderer/int8_dot.py)
        if value is not None and value.op is not Ops.LOAD and (len(loads) != 1 or not next(iter(loads)).dtype.is_float):
            yield self.stage_value(value)
            return
        if len(loads) != 1:
            return
        ld = next(iter(loads))
        index = ld.src[0]
        layout = None if len(index.src) > 2 else self.stage_layout(index.src[1], ld.dtype)
        if layout is None:
            return
        inner, size, flat = layout
        local = Inst(L.LOCAL, ld.dtype, (), size)
        self.head.append(local)
        saved = self.vec, self.unrolled
        self.vec, self.unrolled = None, set()  # the copy is plain loops
        for r in inner:
            yield from self.open_loop(r)
        buf = yield index.src[0]
        at = yield self.bound_expr(index.src[1])
        v = self.add(L.LOAD, ld.dtype, (buf, at))
        self.add(L.STORE, None, (local, (yield flat), v))
        for r in reversed(inner):
            self.close_loop(r)
        self.vec, self.unrolled = saved
        self.staged[ld] = (local, flat)

    def stage_value(self, u: UOp) -> Steps:
        """STAGE of a computed operand (a weight dequantized from integer loads): its values at every point
        of the loops still to open that it depends on are computed once into a LOCAL array, ordered as
        stage() orders a load's (the vector lanes last), and the reduction reads them from there at each
        of its points (rows of a prompt) instead of computing them again. The copy keeps the block's
        vector lanes where the value has them; where its arithmetic has no lanes (uint8 shifts: Q4_K's
        scales) it alone runs as scalar loops, and the reduction reading the array keeps its lanes.
        Skipped like stage(). A range of one point not yet open (an upcast's outer range when the upcast
        takes a whole range: an int8 prompt tile's 8 lanes) is its point 0 in the copy."""
        value = u
        single = {r: UOp.const(r.dtype, 0) for r in self.deps(u) if r not in self.open and r not in self.bind
                  and r.src[0].op is Ops.CONST and r.src[0].arg == 1 and _kind(r) == AxisKind.GLOBAL}
        if single:
            value = _substituted(u, single)
        layout = self.stage_layout(value, u.dtype)
        if layout is None:
            return
        inner, size, flat = layout
        local = Inst(L.LOCAL, u.dtype, (), size)
        self.head.append(local)
        saved = self.vec, self.unrolled
        for plan in self.copy_plans(value, inner, flat):
            mark = self.mark()
            try:  # a nested run, so a NoVector ends the copy alone (the value is a few dozen nodes deep)
                run_steps(self.stage_copy(local, plan), self.request)
                break
            except NoVector:
                if plan.lanes is None:
                    raise
                self.rewind(mark)
        self.vec, self.unrolled = saved
        self.staged[u] = (local, flat)
        yield from ()

    def copy_plans(self, u: UOp, inner: list[UOp], flat: UOp) -> list[CopyPlan]:
        """The ways stage_value may copy u, best first: where the block's vector range is contiguous in the
        blocks' bytes (a tile of dot products), its lanes; where it would gather a weight's bytes from
        rows a block apart (an outer-product tile's columns are weight rows), lanes along the blocks'
        contiguous bytes (copy_lanes) with the block's vector range `across`: a square of vectors
        transposed in registers (TRANSPOSE) and stored contiguously; then the block's lanes, gathering;
        lanes along the bytes stored as a scatter; plain loops last."""
        own = [CopyPlan(u, inner, flat, self.vec)] if self.vec in inner else []
        along = self.copy_lanes(u, inner)
        if along is None or along is self.vec:
            return own + [CopyPlan(u, inner, flat, None)]
        plans = []
        n = self.lanes_for(along)
        whole = (u, inner, flat)
        if n < int(along.src[0].arg):  # a run longer than a vector (Q4_K's 32 bytes): split in two ranges
            u, inner, flat, along = self.split_copy_range(u, inner, flat, along, n)
        if self.vec in inner and int(self.vec.src[0].arg) == n and n & (n - 1) == 0 \
                and range_coeff(flat, self.vec) == 1:
            plans.append(CopyPlan(u, inner, flat, along, self.vec))
        if range_coeff(flat, along) == 1 and range_coeff(flat, self.vec) != 1:
            plans.append(CopyPlan(u, inner, flat, along))  # contiguous in the array too (stage_layout's quads)
        # the block's own lanes gather bytes (Q8_K: its float32 scale gives them no other obstacle)
        return plans + own + [CopyPlan(u, inner, flat, along), CopyPlan(*whole, None)]

    def copy_lanes(self, u: UOp, inner: list[UOp]) -> UOp | None:
        """Lanes for stage_value's copy when the block's own vector range gives none (its lanes gather a
        weight's bytes from rows a block apart, and its scales are per lane 16-bit floats): the innermost
        range of `inner` along which an integer load of u is contiguous and that makes whole vectors
        (a Q4_0 block's 16 bytes; a longer run is split, split_copy_range), so each vector reads
        consecutive bytes and a block's scale is one scalar. A GELU-fused prompt projection's copy ran as
        scalar loops (about 15 operations per weight) before."""
        indexes = [x.src[0].src[1] for x in u.toposort() if x.op is Ops.LOAD and x.dtype.is_int]
        for r in reversed(inner):
            if self.lanes_for(r) and any(range_coeff(ix, r) == 1 for ix in indexes):
                return r
        return None

    def split_copy_range(self, u: UOp, inner: list[UOp], flat: UOp, r: UOp,
                         lanes: int) -> tuple[UOp, list[UOp], UOp, UOp]:
        """(u, inner, flat, the lanes range) with range r of the copy split as ro * lanes + rl (ro a loop in
        r's place, rl the lanes after it): the same points in the same array positions."""
        ro = UOp(Ops.RANGE, r.dtype, (UOp.const(r.dtype, int(r.src[0].arg) // lanes),), (self.next_axis, _kind(r)))
        rl = UOp(Ops.RANGE, r.dtype, (UOp.const(r.dtype, lanes),), (self.next_axis + 1, _kind(r)))
        self.next_axis += 2
        split = {r: ro * lanes + rl}
        at = inner.index(r)
        return (_substituted(u, split), inner[:at] + [ro, rl] + inner[at + 1:],
                graph_rewrite(_substituted(flat, split), symbolic_rules, name="stage_index"), rl)

    def stage_layout(self, expr: UOp, dtype: DType) -> tuple[list[UOp], int, UOp] | None:
        """(the loops still to open that expr depends on, in the staged array's order: reduce ranges, then
        upcast ranges, the vector lanes last; the array's size; the index into it) for stage() and
        stage_value(), or None where staging is skipped: no such loop, a symbolic or other kind of one,
        16-bit floats, or more than STAGE_MAX_BYTES."""
        inner = [r for r in self.deps(expr) if r not in self.open and r not in self.bind]
        if not inner or dtype in HALF_DTYPES or any(r.src[0].op is not Ops.CONST for r in inner) \
                or any(_kind(r) not in (AxisKind.REDUCE, AxisKind.UPCAST, AxisKind.UNROLL) for r in inner):
            return None
        inner.sort(key=lambda r: (r is self.vec, _kind(r) == AxisKind.UPCAST, r.arg[0]))
        if dtype in (dtypes.int8, dtypes.uint8) and self.vec in inner and len(inner) > 1 \
                and _kind(inner[-2]) == AxisKind.REDUCE and int(inner[-2].src[0].arg) == QUAD:
            # 8-bit weights (an int8 prompt matmul's): each lane's 4 turns of a byte dot product together,
            # as vpdpbusd reads them (LOAD "quads"; renderer/int8_dot.py), copied 4 bytes at a time
            inner[-2], inner[-1] = inner[-1], inner[-2]
        size = math.prod(int(r.src[0].arg) for r in inner)
        if size * dtype.itemsize > STAGE_MAX_BYTES:
            return None
        flat, stride = UOp.const(inner[0].dtype, 0), 1
        for r in reversed(inner):
            flat = r * stride + flat if stride > 1 else r + flat
            stride *= int(r.src[0].arg)
        return inner, size, graph_rewrite(flat, symbolic_rules, name="stage_index")

    def stage_copy(self, local: Inst, plan: CopyPlan) -> Steps:
        """The loops that compute plan.value at every point of plan.inner into `local` at plan.flat: plain
        loops, with plan.lanes (a range of inner, or None) as vector lanes; with plan.across (another
        range of inner, as many points as lanes, contiguous in flat) the value is computed at each of its
        points (one vector along the lanes each), the square transposed (TRANSPOSE) and each row stored
        along `across`."""
        u, flat, across = plan.value, plan.flat, plan.across
        self.vec, self.unrolled = plan.lanes, set()
        loops = [r for r in plan.inner if r is not across]
        for r in loops:
            yield from self.open_loop(r)
        if across is None:
            v = yield u
            idx, _, kind, n = yield from self.access(None, flat)
            self.add(L.STORE, None, (local, idx, self.bcast(v, n) if n > 1 else v), kind, n)
        else:
            yield self.store_transposed(u, local, flat, plan.lanes, across)
        for r in reversed(loops):
            self.close_loop(r)

    def store_transposed(self, u: UOp, local: Inst, flat: UOp, lanes: UOp, across: UOp) -> Steps:
        """stage_copy's square: u at each point of `across` as a vector along `lanes`, then row i of the
        transposed square (each point's lane i) stored at `flat` with `lanes` at i, contiguous along
        `across`."""
        n = int(across.src[0].arg)
        rows = []
        for j in range(n):
            self.bind[across] = j
            rows.append(self.bcast((yield u), n))
        del self.bind[across]
        self.vec = across
        yield from self.open_loop(across)
        for i in range(n):
            self.bind[lanes] = i
            idx, _, kind, width = yield from self.access(None, flat)
            if kind != "contiguous" or width != n:
                raise NoVector("a transposed row that is not contiguous")
            self.add(L.STORE, None, (local, idx, self.add(L.TRANSPOSE, u.dtype, tuple(rows), i, n)), kind, n)
        del self.bind[lanes]
        self.close_loop(across)
        self.vec = lanes

    def mark(self) -> tuple:
        """What rewind() restores: the emitted instructions and every cache an emission may add to."""
        return (len(self.body), len(self.head), dict(self.consts), [dict(s) for s in self.scopes], dict(self.open),
                dict(self.vars), self.tid)

    def rewind(self, mark: tuple) -> None:
        """Drop what was emitted since mark() (a copy abandoned for NoVector)."""
        body, head, consts, scopes, opened, variables, tid = mark
        del self.body[body:]
        del self.head[head:]
        self.consts, self.scopes, self.open, self.vars, self.tid = consts, scopes, opened, variables, tid

    def unroll_set(self, node: UOp) -> set[UOp]:
        """The block's upcast and unroll ranges (all but the vector lanes) when they have at most
        MAX_UNROLL points together: each point then gets its own instructions and accumulators."""
        rs = {r for r in node.toposort() if r.op is Ops.RANGE and _kind(r) in (AxisKind.UPCAST, AxisKind.UNROLL)
              and r is not self.vec}
        if not rs or any(r.src[0].op is not Ops.CONST for r in rs):
            return set()
        return rs if math.prod(int(r.src[0].arg) for r in rs) <= MAX_UNROLL else set()

    def run(self) -> LinearProgram:
        for g in self.spec.globals:
            self.params[g.slot] = Inst(L.PARAM, g.dtype, (), (g.slot, g.written))
        for v in getattr(self.spec, "vars", ()):  # every parameter, even one simplification removed
            self.vars[v.arg[0]] = Inst(L.VAR, v.dtype, (), v.arg)
        for node in self.spec.ast.src:
            run_steps(self.block(node), self.request)
        params = tuple(self.params[g.slot] for g in self.spec.globals)
        order = [v.arg[0] for v in getattr(self.spec, "vars", ())]
        var_list = tuple(self.vars[n] for n in order) + tuple(
            x for n, x in sorted(self.vars.items()) if n not in order)
        head = [*params, *var_list, *(x for x in self.head if x.op not in (L.VAR,))]
        return LinearProgram(getattr(self.spec, "name", "kernel"), tuple(head + self.body), params, var_list,
                             self.spec.threads if self.tid is not None else 1)


def linearize(spec: Any, vector_width: int = 1, launch: Any = None, strided: bool = False) -> LinearProgram:
    """The ordered program of a lowered kernel (see the module docstring). vector_width > 1 turns one
    upcast range per END block into vector lanes of that many float32 lanes or a multiple (emitters
    that render vectors pass `spec.vector_width`); a kernel that cannot be vectorised keeps its lane loops.
    `strided`: the emitter reads loads whose lanes are 2 elements apart as "strided" (else "gather")."""
    if vector_width > 1:
        try:
            return _Linearizer(spec, vector_width, launch, strided).run()
        except NoVector:
            pass
    return _Linearizer(spec, launch=launch).run()
