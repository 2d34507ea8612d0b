"""The passes over a linear program that every emitter shares: unroll, fold, share, hoist, drop.

Stage: linearizing, right after `linearize` (renderer/linearize.py). Input: a `LinearProgram` and the
`LinearPasses` its emitter asks for. Output: a `LinearProgram` with the same meaning, bit for bit.

An emitter declares what it wants as data (`LinearPasses`) and calls `simplify_linear(prog, passes)`; the
pass list is fixed and runs in one walk over the program, because each rewrite feeds the next (an
unrolled lane index folds to a constant, which makes two loads equal, which makes their users equal):

- **unroll** (`unroll=True`): an upcast loop with constant bounds is replaced by its points in order,
  the loop variable a constant in each; an unroll-kind loop too when its copies stay within
  `unroll_limit` instructions. An accumulator array (`ACC` arg (op, k)) then becomes k separate
  accumulators (arg (op, 1)) that an emitter can keep in registers.
- **partial unroll** (`reduce_unroll`): a reduce loop with a constant trip count runs `copies`
  points a turn, in order (so sums keep their order): LOOP gets a third source, its step, and the
  body holds the points `i, i+1, ..`.
- **fold**: integer and bool operations on constants are computed with the kernel IR's wrapping
  semantics (`fold_int`); `x + 0`, `x * 1`, `x * 0` simplify; integer constants move outward,
  `(x + c) + y -> (x + y) + c` and `(x + c) * k -> x*k + c*k`, so the variable part is shared and
  the constant ends in an offset. A gate that is constant drops its IF block (or the block's guard)
  and a load gated by a constant false is the constant 0.
- **share**: equal pure values (ALU, BCAST, vector CONST; integer commutative operands in either
  order) are computed once per loop nest; loads too, until the next STORE or BARRIER.
- **hoist**: a pure value whose operands are all defined outside a loop or IF moves in front of it,
  so an invariant is computed once (even for a loop that runs no turn: pure arithmetic must not
  trap, which X86 ensures by guarding the divisor of an integer division).
- **drop**: values (and loads) that nothing uses are removed.
- **offsets** (`offsets=True`, for machine code with addressing modes): a memory index `i + c` (c a
  constant, the byte offset within a signed 32-bit displacement) becomes index `i` and offset `c`:
  LOAD and STORE then have arg `(kind, offset)`, and an index that is a constant altogether is
  `None` in `src`.

The output lists PARAMs, VARs and SPECIALs first, then the scalar constants it uses, then the rest
in execution order (LOCAL and DEFINE_LOCAL stay in the head). Values stay defined before use and
used only inside the loop nest that defined them, as `linearize` promises. The C renderer renders
any simplified program without offsets (`tests/test_linear_passes.py` runs them against the
linearized program's C and INTERP).
The walk keeps loop and IF nesting on an explicit stack (`run_steps`): any depth linearizes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generator

from polygrad.dtype import DType, dtypes
from polygrad.errors import CompileError
from polygrad.renderer.linearize import Inst, L, LinearProgram, run_steps
from polygrad.uop.ops import Ops

COMMUTATIVE = frozenset({Ops.ADD, Ops.MUL, Ops.AND, Ops.OR, Ops.XOR, Ops.CMPEQ, Ops.CMPNE})
DROPPABLE = (L.ALU, L.BCAST, L.CONST, L.LOAD, L.ACC_READ, L.TRANSPOSE)  # removed when nothing uses them
HEAD = (L.PARAM, L.VAR, L.SPECIAL)
MAX_OFFSET_BYTES = 1 << 31  # an offset's bytes fit a signed 32-bit displacement


@dataclass(frozen=True)
class LinearPasses:
    """What an emitter asks of `simplify_linear` beyond folding, sharing, hoisting and dropping dead values
    (module docstring). X86 asks for everything; the C family for nothing (its compiler does it)."""

    unroll: bool = False                               # unroll constant upcast loops (and small unroll loops)
    unroll_limit: int = 2048                           # instructions an unroll-kind loop may grow to
    reduce_unroll: tuple[tuple[int, int], ...] = ()    # (copies, largest body in instructions), first fit
    offsets: bool = False                              # split constant offsets off memory indices


def is_const(x: Inst | None) -> bool:
    """x is a scalar constant."""
    return x is not None and x.op is L.CONST and x.lanes == 1


def wrap(v: int, dt: DType) -> Any:
    """An integer wrapped to dt (two's complement), bool as x != 0."""
    if dt is dtypes.bool:
        return bool(v)
    bits = dt.itemsize * 8
    v &= (1 << bits) - 1
    if not dt.is_unsigned and v >= 1 << (bits - 1):
        v -= 1 << bits
    return v


def _int_div(op: Ops, a: int, b: int) -> int:
    """IDIV / MOD truncating toward zero; a zero divisor divides by 1 (emitters guard it the same way)."""
    b = b if b != 0 else 1
    q = abs(a) // abs(b) * (1 if (a < 0) == (b < 0) else -1)
    return q if op is Ops.IDIV else a - q * b


def _shift(op: Ops, a: int, b: int) -> int | None:
    if not 0 <= b < 64:
        return None
    return a << b if op is Ops.SHL else a >> b


# integer / bool ops on constants (kernel-IR semantics): the raw result, wrapped to the dtype after
INT_FOLDS = {
    Ops.ADD: lambda dt, a: a[0] + a[1],
    Ops.MUL: lambda dt, a: a[0] * a[1],
    Ops.NEG: lambda dt, a: (not a[0]) if dt is dtypes.bool else -a[0],
    Ops.IDIV: lambda dt, a: _int_div(Ops.IDIV, a[0], a[1]),
    Ops.MOD: lambda dt, a: _int_div(Ops.MOD, a[0], a[1]),
    Ops.MAX: lambda dt, a: max(a[0], a[1]),
    Ops.AND: lambda dt, a: a[0] & a[1],
    Ops.OR: lambda dt, a: a[0] | a[1],
    Ops.XOR: lambda dt, a: a[0] ^ a[1],
    Ops.SHL: lambda dt, a: _shift(Ops.SHL, a[0], a[1]),
    Ops.SHR: lambda dt, a: _shift(Ops.SHR, a[0], a[1]),
    Ops.WHERE: lambda dt, a: a[1] if a[0] else a[2],
    Ops.CAST: lambda dt, a: a[0],
}
# comparisons give a bool as it is (no wrapping)
INT_COMPARES = {
    Ops.CMPLT: lambda a: a[0] < a[1],
    Ops.CMPNE: lambda a: a[0] != a[1],
    Ops.CMPEQ: lambda a: a[0] == a[1],
}


def fold_int(op: Ops, dt: DType, vals: list[Any]) -> Any:
    """The value of an integer/bool op on constants (kernel-IR semantics), or None when not folded.

    >>> fold_int(Ops.ADD, dtypes.int8, [127, 1])
    -128
    >>> fold_int(Ops.IDIV, dtypes.int32, [-7, 2])
    -3
    """
    a = [int(v) for v in vals]
    if op in INT_COMPARES:
        return INT_COMPARES[op](a)
    rule = INT_FOLDS.get(op)
    r = rule(dt, a) if rule is not None else None
    return None if r is None else wrap(r, dt)


class _Frame:
    """One open loop or IF: the instructions placed at its level, a preheader for hoisted values
    (emitted just before the loop), and the values visible inside it (common subexpressions)."""

    __slots__ = ("items", "pre", "seen")

    def __init__(self) -> None:
        self.items: list[Any] = []
        self.pre: list[Inst] = []
        self.seen: dict[Any, Inst] = {}


class _Simplifier:
    def __init__(self, prog: LinearProgram, passes: LinearPasses):
        self.prog, self.passes = prog, passes
        self.insts = prog.insts
        self.match: dict[int, int] = {}
        stack = []
        for i, x in enumerate(self.insts):
            if x.op in (L.LOOP, L.IF):
                stack.append(i)
            elif x.op in (L.ENDLOOP, L.ENDIF):
                self.match[stack.pop()] = i
        self.env: dict[int, Any] = {}
        self.frames = [_Frame()]
        self.level: dict[int, int] = {}  # id(value) -> the loop/IF depth it is defined at
        self.consts: dict[tuple, Inst] = {}
        self.epoch = 0  # bumped by every store and barrier: loads are shared only within one epoch
        self.head: list[Inst] = []  # PARAM, VAR, SPECIAL in program order

    # ---- values
    def const(self, dt: DType, v: Any) -> Inst:
        key = (dt, repr(v))
        hit = self.consts.get(key)
        if hit is None:
            hit = self.consts[key] = Inst(L.CONST, dt, (), v)
        return hit

    def place(self, x: Inst, level: int | None = None) -> Inst:
        cur = len(self.frames) - 1
        lv = cur if level is None else min(level, cur)
        self.level[id(x)] = lv
        if lv == cur:
            self.frames[-1].items.append(x)
        else:
            self.frames[lv + 1].pre.append(x)
        return x

    def shared(self, key: Any) -> Inst | None:
        for f in reversed(self.frames):
            hit = f.seen.get(key)
            if hit is not None:
                return hit
        return None

    def pure(self, op: L, dt: DType | None, src: tuple, arg: Any, lanes: int) -> Inst:
        """A hoistable, shareable value (ALU, BCAST, vector CONST)."""
        ids = tuple(id(s) for s in src)
        if op is L.ALU and arg in COMMUTATIVE and dt is not None and not dt.is_float:
            ids = tuple(sorted(ids))  # a+b and b+a are one value (floats keep their order: with two NaNs
            # the first one's payload is the result)
        key = (op, dt, lanes, arg if not isinstance(arg, float) else repr(arg), ids)
        hit = self.shared(key)
        if hit is not None:
            return hit
        level = max((self.level.get(id(s), 0) for s in src), default=0)
        x = self.place(Inst(op, dt, src, arg, lanes), level)
        self.frames[self.level[id(x)]].seen[key] = x
        return x

    def alu(self, dt: DType, src: tuple, op: Ops, lanes: int) -> Inst:
        if lanes == 1 and all(is_const(s) for s in src) and (dt.is_int or dt is dtypes.bool) \
                and all(s.dtype.is_int or s.dtype is dtypes.bool for s in src):
            v = fold_int(op, dt, [s.arg for s in src])
            if v is not None:
                return self.const(dt, v)
        if lanes == 1 and dt.is_int and op in (Ops.ADD, Ops.MUL) and len(src) == 2:
            a, b = src
            if is_const(a) and not is_const(b):
                a, b = b, a
            if is_const(b) and ((op is Ops.ADD and b.arg == 0) or (op is Ops.MUL and b.arg == 1)):
                return a
            if is_const(b) and op is Ops.MUL and b.arg == 0:
                return self.const(dt, 0)
            # constants move outward (exact in wrapping arithmetic), so they end in an offset and the
            # variable part is shared: (x + c) + y -> (x + y) + c, (x + c) * k -> x*k + c*k
            if op is Ops.ADD and not is_const(b) and self.plus_const(b, dt) and not self.plus_const(a, dt):
                a, b = b, a
            if op is Ops.ADD and not is_const(b) and self.plus_const(a, dt):
                return self.alu(dt, (self.alu(dt, (a.src[0], b), Ops.ADD, 1), a.src[1]), Ops.ADD, 1)
            if op is Ops.MUL and is_const(b) and self.plus_const(a, dt):
                return self.alu(dt, (self.alu(dt, (a.src[0], b), Ops.MUL, 1),
                                     self.const(dt, wrap(int(a.src[1].arg) * int(b.arg), dt))), Ops.ADD, 1)
            src = (a, b)
        return self.pure(L.ALU, dt, src, op, lanes)

    @staticmethod
    def plus_const(x: Inst, dt: DType) -> bool:
        """x is `y + constant` of dtype dt."""
        return x.op is L.ALU and x.arg is Ops.ADD and x.lanes == 1 and x.dtype is dt and is_const(x.src[1])

    def address(self, idx: Inst, size: int) -> tuple[Inst | None, int]:
        """(index value or None, element offset) of a memory index: with `offsets`, constant additions
        leave the index for the offset."""
        if not self.passes.offsets:
            return idx, 0
        disp = 0
        index: Inst | None = idx
        while index is not None and index.lanes == 1:
            if is_const(index):
                disp += int(index.arg)
                index = None
                break
            if index.op is L.ALU and index.arg is Ops.ADD and is_const(index.src[1]) \
                    and abs((disp + int(index.src[1].arg)) * size) < MAX_OFFSET_BYTES:
                disp += int(index.src[1].arg)
                index = index.src[0]
                continue
            break
        return index, disp

    def memory_arg(self, kind: Any, disp: int) -> Any:
        return (kind, disp) if self.passes.offsets else kind

    # ---- walking
    def v(self, x: Inst) -> Any:
        return self.env[id(x)]

    def walk(self, lo: int, hi: int) -> Generator[Any, None, None]:
        """Simplify instructions lo..hi-1; a nested loop or IF body is yielded as its own walk (run_steps
        runs it on an explicit stack: nesting depth is not bounded by Python's recursion limit)."""
        i = lo
        while i < hi:
            x = self.insts[i]
            if x.op is L.LOOP:
                yield from self.loop(x, i, self.match[i])
                i = self.match[i] + 1
            elif x.op is L.IF:
                yield from self.gate(x, i, self.match[i])
                i = self.match[i] + 1
            else:
                self.env[id(x)] = self.one(x)
                i += 1

    def loop(self, x: Inst, i: int, j: int) -> Generator[Any, None, None]:
        start, end = self.v(x.src[0]), self.v(x.src[1])
        kind = getattr(x.arg[1], "value", x.arg[1])
        consts = is_const(start) and is_const(end)
        body = (j - i) * max(0, int(end.arg) - int(start.arg)) if consts else 0
        if self.passes.unroll and kind == "upcast" and not consts:
            raise CompileError(f"upcast loop with a run-time bound ({x}); cannot unroll it")
        if self.passes.unroll and consts and (kind == "upcast" or (kind == "unroll"
                                                                  and body <= self.passes.unroll_limit)):
            for k in range(int(start.arg), int(end.arg)):
                self.env[id(x)] = self.const(x.dtype, k)
                yield self.walk(i + 1, j)
            return
        trips = int(end.arg) - int(start.arg) if consts else 0
        step = next((u for u, size in self.passes.reduce_unroll if kind == "reduce" and trips % u == 0
                     and trips >= 2 * u and j - i <= size), 1)
        loop = Inst(L.LOOP, x.dtype, (start, end) + ((self.const(x.dtype, step),) if step > 1 else ()), x.arg)
        frame = _Frame()
        self.frames[-1].items.append(frame.pre)  # the preheader sits in front of the loop
        self.frames[-1].items.append(loop)
        self.frames.append(frame)
        self.level[id(loop)] = len(self.frames) - 1  # its value, the loop variable, lives inside
        for k in range(step):  # the points run in order: reductions keep their order
            self.env[id(x)] = loop if k == 0 else self.alu(x.dtype, (loop, self.const(x.dtype, k)), Ops.ADD, 1)
            yield self.walk(i + 1, j)
        self.close(Inst(L.ENDLOOP, None, (loop,)), frame)

    def gate(self, x: Inst, i: int, j: int) -> Generator[Any, None, None]:
        cond = self.v(x.src[0])
        if is_const(cond):  # a constant gate: the block runs always or never
            if cond.arg:
                yield self.walk(i + 1, j)
            return
        frame = _Frame()
        self.frames[-1].items.append(frame.pre)  # values hoisted out of the IF go in front of it
        opener = self.place(Inst(L.IF, None, (cond,)))
        self.frames.append(frame)
        yield self.walk(i + 1, j)
        self.close(Inst(L.ENDIF, None, (opener,)), frame)

    def close(self, end: Inst, frame: _Frame) -> None:
        """Close the innermost loop or IF: its body goes into its parent, then `end`."""
        self.frames.pop()
        self.frames[-1].items.append(frame.items)
        self.level[id(end)] = len(self.frames) - 1
        self.frames[-1].items.append(end)

    def one(self, x: Inst) -> Any:
        op = x.op
        if op in HEAD:
            p = Inst(op, x.dtype, (), x.arg)
            self.head.append(p)
            return p
        if op is L.CONST:
            if x.lanes > 1:
                return self.pure(L.CONST, x.dtype, (), tuple(x.arg), x.lanes)
            return self.const(x.dtype, x.arg)
        if op is L.BCAST:
            return self.pure(L.BCAST, x.dtype, (self.v(x.src[0]),), None, x.lanes)
        if op is L.ALU:
            return self.alu(x.dtype, tuple(self.v(s) for s in x.src), x.arg, x.lanes)
        if op is L.TRANSPOSE:
            return self.pure(L.TRANSPOSE, x.dtype, tuple(self.v(s) for s in x.src), x.arg, x.lanes)
        if op in (L.LOCAL, L.DEFINE_LOCAL):
            return self.place(Inst(op, x.dtype, (), x.arg, x.lanes))
        if op is L.BARRIER:
            self.place(Inst(op, None))
            self.epoch += 1
            return None
        if op is L.ACC:
            init = self.v(x.src[0])
            red, count = x.arg
            if self.passes.unroll:  # every lane index is a constant now: one accumulator per lane
                return [self.place(Inst(L.ACC, x.dtype, (init,), (red, 1), x.lanes)) for _ in range(count)]
            return self.place(Inst(L.ACC, x.dtype, (init,), x.arg, x.lanes))
        if op is L.UPDATE and x.arg is Ops.FMA:  # acc = fma(a, b, acc), rounded once
            acc, lane = self.lane_of(x)
            a, b = self.v(x.src[1]), self.v(x.src[2])
            self.place(Inst(L.UPDATE, acc.dtype, (acc, a, b) + lane, Ops.FMA, max(a.lanes, b.lanes)))
            return None
        if op is L.UPDATE:
            acc, lane = self.lane_of(x)
            value = self.v(x.src[1])
            self.place(Inst(L.UPDATE, acc.dtype, (acc, value) + lane, x.arg, value.lanes))
            return None
        if op is L.ACC_READ:
            acc, lane = self.lane_of(x)
            return self.place(Inst(L.ACC_READ, acc.dtype, (acc,) + lane, None, acc.lanes))
        if op is L.LOAD:
            return self.load(x)
        if op is L.STORE:
            buf, idx, value = self.v(x.src[0]), self.v(x.src[1]), self.v(x.src[2])
            gate = self.v(x.src[3]) if len(x.src) > 3 else None
            index, disp = self.address(idx, buf.dtype.itemsize)
            src = (buf, index, value) + ((gate,) if gate is not None else ())
            self.place(Inst(L.STORE, None, src, self.memory_arg(x.arg, disp), x.lanes))
            self.epoch += 1
            return None
        raise CompileError(f"linear passes: no rule for instruction {op.name} ({x})")

    def load(self, x: Inst) -> Inst:
        buf, idx = self.v(x.src[0]), self.v(x.src[1])
        gate = self.v(x.src[2]) if len(x.src) > 2 else None
        if is_const(gate):
            if not gate.arg:
                return self.const(x.dtype, 0) if x.lanes == 1 else \
                    self.pure(L.BCAST, x.dtype, (self.const(x.dtype, 0),), None, x.lanes)
            gate = None
        index, disp = self.address(idx, x.dtype.itemsize)
        key = (L.LOAD, id(buf), id(index), disp, id(gate), x.arg, x.dtype, x.lanes, self.epoch)
        hit = self.shared(key)
        if hit is not None:
            return hit
        src = (buf, index, gate) if gate is not None else (buf, index)
        ld = self.place(Inst(L.LOAD, x.dtype, src, self.memory_arg(x.arg, disp), x.lanes))
        self.frames[-1].seen[key] = ld
        return ld

    def lane_of(self, x: Inst) -> tuple[Inst, tuple[Inst, ...]]:
        """The accumulator an UPDATE / ACC_READ uses, and the lane source it keeps (none once split)."""
        accs = self.v(x.src[0])
        at = (3 if x.arg is Ops.FMA else 2) if x.op is L.UPDATE else 1  # where the lane index sits
        lane = self.v(x.src[at]) if len(x.src) > at else None
        if not isinstance(accs, list):
            return accs, (lane,) if lane is not None else ()
        if lane is None:
            return accs[0], ()
        if not is_const(lane):
            raise CompileError("linear passes: an accumulator lane index that is not constant after unrolling")
        return accs[int(lane.arg)], ()

    def run(self) -> LinearProgram:
        run_steps(self.walk(0, len(self.insts)))
        body = eliminate_dead(flatten(self.frames[0].items))
        used = {id(s) for x in body for s in x.src if s is not None}
        consts = [c for c in self.consts.values() if id(c) in used]
        params = tuple(x for x in self.head if x.op is L.PARAM)
        var_list = tuple(x for x in self.head if x.op is L.VAR)
        return LinearProgram(self.prog.name, tuple(self.head + consts + body), params, var_list,
                             self.prog.threads)


def flatten(items: list) -> list[Inst]:
    """The instructions of nested item lists (a loop's body is a list in its parent's), in order."""
    flat: list[Inst] = []
    stack = [iter(items)]
    while stack:
        it = next(stack[-1], stack)  # the stack itself marks an exhausted list
        if it is stack:
            stack.pop()
        elif isinstance(it, list):
            stack.append(iter(it))
        else:
            flat.append(it)
    return flat


def use_counts(insts: list[Inst]) -> dict[int, int]:
    """id(value) -> how many sources in insts refer to it."""
    uses: dict[int, int] = {}
    for x in insts:
        for s in x.src:
            if s is not None:
                uses[id(s)] = uses.get(id(s), 0) + 1
    return uses


def eliminate_dead(insts: list[Inst]) -> list[Inst]:
    """Drop pure values (and loads) that nothing uses, last first (so their operands may go too)."""
    uses = use_counts(insts)
    keep = [True] * len(insts)
    for i in range(len(insts) - 1, -1, -1):
        x = insts[i]
        if x.op in DROPPABLE and uses.get(id(x), 0) == 0:
            keep[i] = False
            for s in x.src:
                if s is not None:
                    uses[id(s)] -= 1
    return [x for x, k in zip(insts, keep) if k]


def simplify_linear(prog: LinearProgram, passes: LinearPasses = LinearPasses()) -> LinearProgram:
    """The linear program with the shared passes applied (see the module docstring)."""
    return _Simplifier(prog, passes).run()
