"""Prepare a linear program for machine code: unroll lane loops, fold constants, share values, hoist.

Stage: x86 code generation, first pass. Input: a `LinearProgram` (polygrad.renderer.linearize).
Output: an `XProgram`, a flat list of `XInst` in execution order (LOOP/ENDLOOP, IF/ENDIF markers and
values) that the register allocator and the emitter walk:

- upcast loops (and small unroll loops) with constant bounds are unrolled: their variable becomes a
  constant in each copy, so accumulator arrays (`ACC` with k lanes) become k separate accumulators
  that live in registers, and index arithmetic on the lane folds away;
- integer constants fold with the kernel IR's wrapping semantics (the C renderer's results);
- equal pure values are computed once per loop nest (loads too, until the next store);
- a load or store index `i + c` becomes the addressing mode `[buf + i*size + c*size]`;
- pure arithmetic whose operands are all defined outside a loop moves in front of that loop (it
  never traps: division guards its divisor), and values nobody uses are dropped.

Every instruction kind of the linear program is handled; anything else raises `CompileError` naming it.
"""
from __future__ import annotations

from typing import Any, Generator

from polygrad.backend_api import CompileError, DType, Inst, L, LinearProgram, Ops, dtypes, run_steps

UNROLL_LIMIT = 2048  # instructions an unroll-kind loop may grow to when unrolled (upcast loops always are)
REDUCE_UNROLL = ((4, 64), (2, 160))  # (copies, largest body in linear instructions) for reduce loops
MEMORY_KINDS = {L.LOAD: (None, "contiguous", "gather"), L.STORE: (None, "contiguous", "scatter")}
COMMUTATIVE = frozenset({Ops.ADD, Ops.MUL, Ops.AND, Ops.OR, Ops.XOR, Ops.CMPEQ, Ops.CMPNE})


class XInst:
    """One instruction of the expanded program. Values carry their register-allocation results."""

    __slots__ = ("op", "dtype", "lanes", "src", "arg", "level", "uses", "start", "end", "loc", "num", "alias",
                 "step")

    def __init__(self, op: L, dtype: DType | None, src: tuple = (), arg: Any = None, lanes: int = 1):
        self.op, self.dtype, self.src, self.arg, self.lanes = op, dtype, src, arg, lanes
        self.level = 0
        self.uses = 0
        self.start = self.end = -1
        self.loc: Any = None
        self.num = -1
        self.alias: XInst | None = None  # ACC_READ: the accumulator it reads
        self.step = 1  # LOOP: the variable's increment (a partially unrolled reduce loop runs `step` points a turn)

    def __repr__(self) -> str:
        arg = self.arg.name if isinstance(self.arg, Ops) else self.arg
        return f"X({self.op.name} {self.dtype} x{self.lanes} {arg})"

    @property
    def is_const(self) -> bool:
        return self.op is L.CONST and self.lanes == 1


class XProgram:
    def __init__(self, name: str, insts: list[XInst], params: list[XInst], vars_: list[XInst],
                 tid: XInst | None, threads: int):
        self.name, self.insts, self.params, self.vars, self.tid, self.threads = name, insts, params, vars_, tid, threads


def wrap(v: int, dt: DType) -> Any:
    """An integer wrapped to dt (two's complement), bool as x != 0."""
    if dt is dtypes.bool:
        return bool(v)
    bits = dt.itemsize * 8
    v &= (1 << bits) - 1
    if not dt.is_unsigned and v >= 1 << (bits - 1):
        v -= 1 << bits
    return v


def fold_int(op: Ops, dt: DType, vals: list[Any]) -> Any:
    """The value of an integer/bool op on constants (kernel-IR semantics), or None when not folded."""
    a = [int(v) for v in vals]
    if op is Ops.ADD:
        r = a[0] + a[1]
    elif op is Ops.MUL:
        r = a[0] * a[1]
    elif op is Ops.NEG:
        r = (not a[0]) if dt is dtypes.bool else -a[0]
    elif op in (Ops.IDIV, Ops.MOD):
        b = a[1] if a[1] != 0 else 1
        q = abs(a[0]) // abs(b) * (1 if (a[0] < 0) == (b < 0) else -1)
        r = q if op is Ops.IDIV else a[0] - q * b
    elif op is Ops.MAX:
        r = max(a[0], a[1])
    elif op is Ops.CMPLT:
        return a[0] < a[1]
    elif op is Ops.CMPNE:
        return a[0] != a[1]
    elif op is Ops.CMPEQ:
        return a[0] == a[1]
    elif op is Ops.AND:
        r = a[0] & a[1]
    elif op is Ops.OR:
        r = a[0] | a[1]
    elif op is Ops.XOR:
        r = a[0] ^ a[1]
    elif op is Ops.SHL:
        r = a[0] << a[1] if 0 <= a[1] < 64 else None
    elif op is Ops.SHR:
        r = a[0] >> a[1] if 0 <= a[1] < 64 else None
    elif op is Ops.WHERE:
        r = a[1] if a[0] else a[2]
    elif op is Ops.CAST:
        r = a[0]
    else:
        return None
    return None if r is None else wrap(r, dt)


class _Frame:
    """One open loop or IF: the instructions placed at its level, a preheader for hoisted values
    (emitted just before the loop), and the values visible inside it (common subexpressions)."""

    __slots__ = ("items", "pre", "seen")

    def __init__(self) -> None:
        self.items: list[Any] = []
        self.pre: list[XInst] = []
        self.seen: dict[Any, XInst] = {}


class _Expander:
    def __init__(self, prog: LinearProgram):
        self.prog = prog
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
        self.consts: dict[tuple, XInst] = {}
        self.epoch = 0  # bumped by every store: loads are shared only within one epoch
        self.params: list[XInst] = []
        self.vars: list[XInst] = []
        self.tid: XInst | None = None

    # ---- values
    def const(self, dt: DType, v: Any) -> XInst:
        key = (dt, repr(v))
        hit = self.consts.get(key)
        if hit is None:
            hit = self.consts[key] = XInst(L.CONST, dt, (), v)
        return hit

    def place(self, x: XInst, level: int | None = None) -> XInst:
        cur = len(self.frames) - 1
        lv = cur if level is None else min(level, cur)
        x.level = lv
        if lv == cur:
            self.frames[-1].items.append(x)
        else:
            self.frames[lv + 1].pre.append(x)
        return x

    def shared(self, key: Any) -> XInst | None:
        for f in reversed(self.frames):
            hit = f.seen.get(key)
            if hit is not None:
                return hit
        return None

    def pure(self, op: L, dt: DType | None, src: tuple, arg: Any, lanes: int) -> XInst:
        """A hoistable, shareable value (ALU, BCAST, vector CONST)."""
        ids = tuple(id(s) for s in src)
        if op is L.ALU and arg in COMMUTATIVE and not dt.is_float:  # a+b and b+a are one value (floats keep
            # their order: with two NaNs the first one's payload is the result)
            ids = tuple(sorted(ids))
        key = (op, dt, lanes, arg if not isinstance(arg, float) else repr(arg), ids)
        hit = self.shared(key)
        if hit is not None:
            return hit
        level = max((s.level for s in src), default=0)
        x = self.place(XInst(op, dt, src, arg, lanes), level)
        self.frames[x.level].seen[key] = x
        return x

    def alu(self, dt: DType, src: tuple, op: Ops, lanes: int) -> XInst:
        if lanes == 1 and all(s.is_const for s in src) and (dt.is_int or dt is dtypes.bool) \
                and all(s.dtype.is_int or s.dtype is dtypes.bool for s in src):
            v = fold_int(op, dt, [s.arg for s in src])
            if v is not None:
                return self.const(dt, v)
        if lanes == 1 and dt.is_int and op in (Ops.ADD, Ops.MUL) and len(src) == 2:
            a, b = src
            if a.is_const and not b.is_const:
                a, b = b, a
            if b.is_const and ((op is Ops.ADD and b.arg == 0) or (op is Ops.MUL and b.arg == 1)):
                return a
            if b.is_const and op is Ops.MUL and b.arg == 0:
                return self.const(dt, 0)
            # constants move outward (exact in wrapping arithmetic), so they end in the addressing mode
            # and the variable part is shared: (x + c) + y -> (x + y) + c, (x + c) * k -> x*k + c*k
            if op is Ops.ADD and not b.is_const and self.plus_const(b, dt) and not self.plus_const(a, dt):
                a, b = b, a
            if op is Ops.ADD and not b.is_const and self.plus_const(a, dt):
                return self.alu(dt, (self.alu(dt, (a.src[0], b), Ops.ADD, 1), a.src[1]), Ops.ADD, 1)
            if op is Ops.MUL and b.is_const and self.plus_const(a, dt):
                return self.alu(dt, (self.alu(dt, (a.src[0], b), Ops.MUL, 1),
                                     self.const(dt, wrap(int(a.src[1].arg) * int(b.arg), dt))), Ops.ADD, 1)
            src = (a, b)
        return self.pure(L.ALU, dt, src, op, lanes)

    @staticmethod
    def plus_const(x: XInst, dt: DType) -> bool:
        """x is `y + constant` of dtype dt."""
        return x.op is L.ALU and x.arg is Ops.ADD and x.lanes == 1 and x.dtype is dt and x.src[1].is_const

    def address(self, idx: XInst, size: int) -> tuple[XInst | None, int]:
        """(index value or None, element displacement): constant additions fold into the address."""
        disp = 0
        while idx.lanes == 1:
            if idx.is_const:
                disp += int(idx.arg)
                idx = None
                break
            if idx.op is L.ALU and idx.arg is Ops.ADD and idx.src[1].is_const \
                    and abs((disp + int(idx.src[1].arg)) * size) < (1 << 31):
                disp += int(idx.src[1].arg)
                idx = idx.src[0]
                continue
            break
        return idx, disp

    # ---- walking
    def v(self, x: Inst) -> Any:
        return self.env[id(x)]

    def walk(self, lo: int, hi: int) -> Generator[Any, None, None]:
        """Expand instructions lo..hi-1; a nested loop or IF body is yielded as its own walk (run_steps
        runs it on an explicit stack: nesting depth is not bounded by Python's recursion limit)."""
        i = lo
        while i < hi:
            x = self.insts[i]
            if x.op is L.LOOP:
                j = self.match[i]
                start, end = self.v(x.src[0]), self.v(x.src[1])
                kind = x.arg[1]
                kind = getattr(kind, "value", kind)
                consts = start.is_const and end.is_const
                body = (j - i) * max(0, int(end.arg) - int(start.arg)) if consts else 0
                if kind == "upcast" and not consts:
                    raise CompileError(f"X86: upcast loop with a run-time bound ({x}); cannot unroll it")
                if consts and (kind == "upcast" or (kind == "unroll" and body <= UNROLL_LIMIT)):
                    for k in range(int(start.arg), int(end.arg)):
                        self.env[id(x)] = self.const(x.dtype, k)
                        yield self.walk(i + 1, j)
                else:
                    loop = XInst(L.LOOP, x.dtype, (start, end), x.arg)
                    frame = _Frame()
                    self.frames[-1].items.append(frame.pre)  # the preheader sits in front of the loop
                    self.frames[-1].items.append(loop)
                    self.frames.append(frame)
                    loop.level = len(self.frames) - 1  # its value, the loop variable, lives inside
                    trips = int(end.arg) - int(start.arg) if consts else 0
                    loop.step = next((u for u, size in REDUCE_UNROLL if kind == "reduce" and trips % u == 0
                                      and trips >= 2 * u and j - i <= size), 1)
                    for k in range(loop.step):  # the points run in order: reductions keep their order
                        self.env[id(x)] = loop if k == 0 else self.alu(x.dtype, (loop, self.const(x.dtype, k)),
                                                                       Ops.ADD, 1)
                        yield self.walk(i + 1, j)
                    self.frames.pop()
                    self.frames[-1].items.append(frame.items)
                    end_x = XInst(L.ENDLOOP, None, (loop,))
                    end_x.level = len(self.frames) - 1
                    self.frames[-1].items.append(end_x)
                i = j + 1
                continue
            if x.op is L.IF:
                j = self.match[i]
                cond = self.v(x.src[0])
                if cond.is_const:  # a constant gate: the block runs always or never
                    if cond.arg:
                        yield self.walk(i + 1, j)
                    i = j + 1
                    continue
                frame = _Frame()
                self.frames[-1].items.append(frame.pre)  # values hoisted out of the IF go in front of it
                opener = self.place(XInst(L.IF, None, (cond,)))
                self.frames.append(frame)
                yield self.walk(i + 1, j)
                self.frames.pop()
                self.frames[-1].items.append(frame.items)
                close = XInst(L.ENDIF, None, (opener,))
                close.level = len(self.frames) - 1
                self.frames[-1].items.append(close)
                i = j + 1
                continue
            self.env[id(x)] = self.one(x)
            i += 1

    def one(self, x: Inst) -> Any:
        op = x.op
        if op is L.PARAM:
            p = XInst(L.PARAM, x.dtype, (), x.arg)
            self.params.append(p)
            return p
        if op is L.VAR:
            p = XInst(L.VAR, x.dtype, (), x.arg)
            self.vars.append(p)
            return p
        if op is L.SPECIAL:
            self.tid = XInst(L.SPECIAL, x.dtype, (), x.arg)
            return self.tid
        if op is L.CONST:
            if x.lanes > 1:
                return self.pure(L.CONST, x.dtype, (), tuple(x.arg), x.lanes)
            return self.const(x.dtype, x.arg)
        if op is L.BCAST:
            return self.pure(L.BCAST, x.dtype, (self.v(x.src[0]),), None, x.lanes)
        if op is L.ALU:
            return self.alu(x.dtype, tuple(self.v(s) for s in x.src), x.arg, x.lanes)
        if op is L.ACC:
            init = self.v(x.src[0])
            red, count = x.arg
            return [self.place(XInst(L.ACC, x.dtype, (init,), red, x.lanes)) for _ in range(count)]
        if op is L.UPDATE and x.arg is Ops.FMA:  # acc = fma(a, b, acc), rounded once
            acc = self.lane_of(x)
            a, b = self.v(x.src[1]), self.v(x.src[2])
            self.place(XInst(L.UPDATE, acc.dtype, (acc, a, b), Ops.FMA, max(a.lanes, b.lanes)))
            return None
        if op is L.UPDATE:
            acc = self.lane_of(x)
            value = self.v(x.src[1])
            self.place(XInst(L.UPDATE, acc.dtype, (acc, value), x.arg, value.lanes))
            return None
        if op is L.ACC_READ:
            acc = self.lane_of(x)
            r = self.place(XInst(L.ACC_READ, acc.dtype, (acc,), None, acc.lanes))
            r.alias = acc
            return r
        if op in (L.LOAD, L.STORE) and x.arg not in MEMORY_KINDS[op]:
            raise CompileError(f"X86 backend: no code for a {op.name} of kind {x.arg!r} ({x}); "
                               "run this kernel on CPU or INTERP")
        if op is L.LOAD:
            buf, idx = self.v(x.src[0]), self.v(x.src[1])
            gate = self.v(x.src[2]) if len(x.src) > 2 else None
            if gate is not None and gate.is_const:
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
            ld = self.place(XInst(L.LOAD, x.dtype, src, (x.arg, disp), x.lanes))
            self.frames[-1].seen[key] = ld
            return ld
        if op is L.STORE:
            buf, idx, value = self.v(x.src[0]), self.v(x.src[1]), self.v(x.src[2])
            gate = self.v(x.src[3]) if len(x.src) > 3 else None
            index, disp = self.address(idx, buf.dtype.itemsize)
            src = (buf, index, value) + ((gate,) if gate is not None else ())
            self.place(XInst(L.STORE, None, src, (x.arg, disp), x.lanes))
            self.epoch += 1
            return None
        raise CompileError(f"X86 backend: no code for linear-program instruction {op.name} ({x}); "
                           "run this kernel on CPU or INTERP")

    def lane_of(self, x: Inst) -> XInst:
        accs = self.v(x.src[0])
        at = (3 if x.arg is Ops.FMA else 2) if x.op is L.UPDATE else 1  # where the lane index sits
        if len(x.src) > at:
            lane = self.v(x.src[at])
            if not lane.is_const:
                raise CompileError("X86 backend: an accumulator lane index that is not constant after unrolling")
            return accs[int(lane.arg)]
        return accs[0]

    def run(self) -> XProgram:
        run_steps(self.walk(0, len(self.insts)))
        flat = fuse_broadcast_loads(eliminate_dead(flatten(self.frames[0].items)))
        return XProgram(self.prog.name, flat, self.params, self.vars, self.tid, self.prog.threads)


def flatten(items: list) -> list[XInst]:
    """The instructions of nested item lists (a loop's body is a list in its parent's), in order."""
    flat: list[XInst] = []
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


def eliminate_dead(insts: list[XInst]) -> list[XInst]:
    """Drop pure values (and loads) that nothing uses."""
    for x in insts:
        x.uses = 0
    for x in insts:
        for s in x.src:
            if s is not None:
                s.uses += 1
    keep = [True] * len(insts)
    for i in range(len(insts) - 1, -1, -1):
        x = insts[i]
        if x.op in (L.ALU, L.BCAST, L.CONST, L.LOAD, L.ACC_READ) and x.uses == 0:
            keep[i] = False
            for s in x.src:
                if s is not None:
                    s.uses -= 1
    return [x for x, k in zip(insts, keep) if k]


def fuse_broadcast_loads(insts: list[XInst]) -> list[XInst]:
    """BCAST(LOAD x) with no other use of the load becomes one broadcasting load (`vbroadcastss m32`),
    when no store comes between them."""
    pos = {id(x): i for i, x in enumerate(insts)}
    stores = [i for i, x in enumerate(insts) if x.op is L.STORE]
    drop: set[int] = set()
    for i, x in enumerate(insts):
        if x.op is not L.BCAST:
            continue
        ld = x.src[0]
        if ld.op is not L.LOAD or ld.uses != 1 or len(ld.src) > 2 or ld.dtype.itemsize != 4 or id(ld) not in pos:
            continue
        j = pos[id(ld)]
        if any(j < s < i for s in stores):
            continue
        x.op, x.src, x.arg = L.LOAD, ld.src, ("broadcast", ld.arg[1])
        drop.add(id(ld))
    out = [x for x in insts if id(x) not in drop]
    # a broadcast load used once, right away, by a float32 add or multiply becomes its memory operand
    for prev, x in zip(out, out[1:]):
        if x.op is L.ALU and x.lanes > 1 and x.arg in (Ops.ADD, Ops.MUL) and x.dtype is dtypes.float32 \
                and prev.op is L.LOAD and prev.arg[0] == "broadcast" and prev.uses == 1 and prev in x.src:
            prev.arg = ("folded", prev.arg[1])
    return [x for x in out if not (x.op is L.LOAD and x.arg[0] == "folded")]


def expand(prog: LinearProgram) -> XProgram:
    """The expanded program of a linearized kernel (see the module docstring)."""
    return _Expander(prog).run()
