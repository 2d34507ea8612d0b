"""The linearize pass: a lowered kernel (ProgramSpec) -> the ordered program every emitter walks.

Stage: linearizing, between lowering and rendering. Input: a ProgramSpec (kernel IR after device
optimisation). Output: a `LinearProgram`, a flat list of `Inst`s in execution order:

    PARAM VAR SPECIAL CONST          kernel parameters, the thread index, constants (all first)
    LOOP ... ENDLOOP                 explicit loop begin and end, properly nested
    ACC  UPDATE ... ACC_READ         an accumulator: defined once, updated inside its loops, read after
    IF ... ENDIF                     a gated region (gated stores)
    LOAD STORE ALU                   memory and arithmetic

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

Values are numbered by definition; common subexpressions are shared within a loop nest (a value
computed in an inner loop is recomputed, not reused, after that loop has closed).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum, auto
from typing import Any

from polygrad.dtype import DType, dtypes
from polygrad.uop.ops import AxisKind, Ops, UOp


class L(Enum):
    PARAM = auto()     # buffer pointer; dtype: element dtype; arg: (slot, written)
    VAR = auto()       # integer kernel parameter; arg: (name, min, max)
    SPECIAL = auto()   # launch index; arg: ("thread", count)
    CONST = auto()     # arg: the value (already wrapped to dtype)
    LOOP = auto()      # src: (start, end); arg: (axis id, kind); its value is the loop variable
    ENDLOOP = auto()   # src: (loop,)
    ACC = auto()       # accumulator; src: (init,); arg: (reduce op, lanes); lanes > 1 is an array
    UPDATE = auto()    # src: (acc, value[, lane]); arg: reduce op: acc[lane] = op(acc[lane], value)
    ACC_READ = auto()  # src: (acc[, lane]): the accumulator's value
    LOAD = auto()      # src: (param, index[, gate]); with a gate, 0 where false (memory not read)
    STORE = auto()     # src: (param, index, value); value already has the buffer's dtype
    ALU = auto()       # arg: the Ops (ADD, CAST, WHERE...); src: operands
    IF = auto()        # src: (cond,)
    ENDIF = auto()     # src: (if,)

    def __repr__(self) -> str:
        return f"L.{self.name}"


@dataclass(eq=False)
class Inst:
    """One instruction. Identity matters (two equal-looking loads in different loops are different)."""

    op: L
    dtype: DType | None
    src: tuple["Inst", ...] = ()
    arg: Any = None

    def __repr__(self) -> str:
        return f"Inst({self.op.name}, {self.dtype}, arg={self.arg!r})"


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
        out, depth = [], 0
        for i, x in enumerate(self.insts):
            if x.op in (L.ENDLOOP, L.ENDIF):
                depth -= 1
            srcs = ", ".join(f"%{num[id(s)]}" for s in x.src)
            dt = x.dtype.name if x.dtype is not None else "-"
            arg = x.arg.name if isinstance(x.arg, Ops) else x.arg
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


def reduce_identity(op: Ops, dt: DType) -> Any:
    if op is Ops.ADD:
        return 0
    if op is Ops.MUL:
        return 1
    if op is Ops.MAX:
        return -math.inf if dt.is_float else (dtypes.min(dt) if dt is not dtypes.bool else False)
    raise NotImplementedError(f"no identity for reduce {op}")


def _kind(r: UOp) -> str:
    return r.arg[1]


class _Pending:
    """A reduce whose accumulator is complete, not yet read in the current loop nest."""

    __slots__ = ("acc", "ups")

    def __init__(self, acc: Inst, ups: list[UOp]):
        self.acc, self.ups = acc, ups


class _Linearizer:
    def __init__(self, spec: Any):
        self.spec = spec
        self.head: list[Inst] = []
        self.body: list[Inst] = []
        self.scopes: list[dict[UOp, Inst]] = [{}]
        self.consts: dict[tuple, Inst] = {}
        self.open: dict[UOp, Inst] = {}
        self.deps = RangeDeps()
        self.params: dict[int, Inst] = {}
        self.vars: dict[str, Inst] = {}
        self.tid: Inst | None = None

    # ---- building blocks
    def add(self, op: L, dtype: DType | None, src: tuple = (), arg: Any = None) -> Inst:
        x = Inst(op, dtype, src, arg)
        self.body.append(x)
        return x

    def const(self, dtype: DType, value: Any) -> Inst:
        key = (dtype, type(value), value if not (isinstance(value, float) and value != value) else "nan",
               math.copysign(1, value) if isinstance(value, float) else 0)
        hit = self.consts.get(key)
        if hit is None:
            hit = self.consts[key] = Inst(L.CONST, dtype, (), value)
            self.head.append(hit)
        return hit

    def lookup(self, u: UOp) -> Inst | None:
        for scope in reversed(self.scopes):
            hit = scope.get(u)
            if hit is None:
                continue
            if isinstance(hit, _Pending):  # a finished reduce: read it here, inside the lane loops
                lane = self.flat_lane(hit.ups)
                hit = self.add(L.ACC_READ, hit.acc.dtype, (hit.acc,) + ((lane,) if lane is not None else ()))
                self.scopes[-1][u] = hit
            return hit
        return None

    def open_loop(self, r: UOp) -> None:
        if _kind(r) == AxisKind.THREAD:
            n = self.value(r.src[0])
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
            start, end = self.const(r.dtype, 0), self.value(r.src[0])
        loop = self.add(L.LOOP, r.dtype, (start, end), r.arg)
        self.scopes.append({})
        self.open[r] = loop

    def close_loop(self, r: UOp) -> None:
        self.add(L.ENDLOOP, None, (self.open.pop(r),))
        self.scopes.pop()

    def tid_inst(self, dt: DType) -> Inst:
        if self.tid is None:
            self.tid = Inst(L.SPECIAL, dt, (), ("thread", self.spec.threads))
            self.head.append(self.tid)
        return self.tid

    # ---- values
    def value(self, u: UOp) -> Inst:
        hit = self.lookup(u)
        if hit is not None:
            return hit
        op = u.op
        if op is Ops.CONST:
            return self.const(u.dtype, u.arg)
        if op is Ops.RANGE:
            loop = self.open.get(u)
            if loop is None:
                raise RuntimeError(f"range {u.arg} used outside its loop")
            return loop
        if op is Ops.DEFINE_GLOBAL:
            return self.params[u.arg[0]]
        if op is Ops.DEFINE_VAR:
            hit = self.vars.get(u.arg[0])
            if hit is None:
                hit = self.vars[u.arg[0]] = Inst(L.VAR, u.dtype, (), u.arg)
                self.head.append(hit)
            return hit
        if op is Ops.REDUCE:
            self.reduce(u)
            return self.lookup(u)
        if op is Ops.LOAD:
            index = u.src[0]
            src = (self.value(index.src[0]), self.value(index.src[1]))
            if len(index.src) > 2:
                src += (self.value(index.src[2]),)
            x = self.add(L.LOAD, u.dtype, src)
        else:
            x = self.add(L.ALU, u.dtype, tuple(self.value(s) for s in u.src), op)
        self.scopes[-1][u] = x
        return x

    def flat_lane(self, ups: list[UOp]) -> Inst | None:
        if not ups:
            return None
        lane = self.value(ups[0])
        for r in ups[1:]:
            lane = self.add(L.ALU, r.dtype, (self.add(L.ALU, r.dtype, (lane, self.const(r.dtype, int(r.src[0].arg))),
                                                      Ops.MUL), self.value(r)), Ops.ADD)
        return lane

    def reduce(self, red: UOp) -> None:
        """Emit red's accumulator and loops; its value is read (ACC_READ) where it is used."""
        if self.lookup_pending(red):
            return
        body, ranges = red.src[0], list(red.src[1:])
        ups = sorted((r for r in self.deps(red) if _kind(r) == AxisKind.UPCAST and r not in self.open),
                     key=lambda r: r.arg[0])
        lanes = math.prod(int(r.src[0].arg) for r in ups)
        acc = self.add(L.ACC, red.dtype, (self.const(red.dtype, reduce_identity(red.arg, red.dtype)),),
                       (red.arg, lanes))
        if any(_kind(r) == AxisKind.UPCAST for r in ranges):
            # a reduce over upcast lanes (a split reduction's final sum): run the partial reduces
            # first, with one accumulator per lane, so their loops stay outside the lane loop
            for inner in top_level_reduces(body):
                self.reduce(inner)
        for r in ranges:
            self.open_loop(r)
        for r in ups:
            self.open_loop(r)
        v = self.value(body)
        lane = self.flat_lane(ups)
        self.add(L.UPDATE, None, (acc, v) + ((lane,) if lane is not None else ()), red.arg)
        for r in reversed(ups):
            self.close_loop(r)
        for r in reversed(ranges):
            self.close_loop(r)
        # read where the reduce is used: inside the lane loops the caller opens next
        self.scopes[-1][red] = _Pending(acc, ups)

    def lookup_pending(self, u: UOp) -> bool:
        return any(u in scope for scope in self.scopes)

    # ---- blocks
    def store(self, st: UOp) -> None:
        index, value = st.src
        v = self.value(value)
        if value.dtype != index.dtype:
            v = self.add(L.ALU, index.dtype, (v,), Ops.CAST)
        buf, idx = self.value(index.src[0]), self.value(index.src[1])
        if len(index.src) > 2:
            gate = self.add(L.IF, None, (self.value(index.src[2]),))
            self.scopes.append({})
            self.add(L.STORE, None, (buf, idx, v))
            self.scopes.pop()
            self.add(L.ENDIF, None, (gate,))
        else:
            self.add(L.STORE, None, (buf, idx, v))

    def block(self, node: UOp) -> None:
        if node.op is Ops.STORE:
            self.store(node)
            return
        if node.op is not Ops.END:
            raise RuntimeError(f"kernel body must be STORE or END, got {node.op.name}")
        inner, ranges = node.src[0], list(node.src[1:])
        loops = [r for r in ranges if _kind(r) != AxisKind.UPCAST]
        ups = [r for r in ranges if _kind(r) == AxisKind.UPCAST]
        for r in loops:
            self.open_loop(r)
        if inner.op is Ops.STORE:
            for red in top_level_reduces(inner):
                self.reduce(red)
        for r in ups:
            self.open_loop(r)
        self.block(inner)
        for r in reversed(ups):
            self.close_loop(r)
        for r in reversed(loops):
            self.close_loop(r)

    def run(self) -> LinearProgram:
        for g in self.spec.globals:
            self.params[g.slot] = Inst(L.PARAM, g.dtype, (), (g.slot, g.written))
        for v in getattr(self.spec, "vars", ()):  # every parameter, even one simplification removed
            self.vars[v.arg[0]] = Inst(L.VAR, v.dtype, (), v.arg)
        for node in self.spec.ast.src:
            self.block(node)
        params = tuple(self.params[g.slot] for g in self.spec.globals)
        order = [v.arg[0] for v in getattr(self.spec, "vars", ())]
        var_list = tuple(self.vars[n] for n in order) + tuple(
            x for n, x in sorted(self.vars.items()) if n not in order)
        head = [*params, *var_list, *(x for x in self.head if x.op not in (L.VAR,))]
        return LinearProgram(getattr(self.spec, "name", "kernel"), tuple(head + self.body), params, var_list,
                             self.spec.threads if self.tid is not None else 1)


def linearize(spec: Any) -> LinearProgram:
    """The ordered program of a lowered kernel (see the module docstring)."""
    return _Linearizer(spec).run()
