"""Prepare a linear program for machine code: the shared passes, then x86's own rewrites.

Stage: x86 code generation, first pass. Input: a `LinearProgram` (polygrad.renderer.linearize).
Output: an `XProgram`, a flat list of `XInst` in execution order (LOOP/ENDLOOP, IF/ENDIF markers and
values) that the register allocator and the emitter walk.

The device-independent work is core's `simplify_linear` (renderer/linear_passes.py) with everything on
(`PASSES`): upcast loops (and small unroll loops) unrolled, so accumulator arrays become separate
accumulators that live in registers; integer constants folded with the IR's wrapping rules and moved
outward; equal values shared per loop nest (loads until the next store); pure arithmetic hoisted in
front of the loops it does not depend on; dead values dropped; reduce loops with a constant trip
count running 2 or 4 points a turn; constant offsets split off memory indices, so `i + c` is the
addressing mode `[buf + i*size + c*size]`. What is x86's own stays here:

- the `XInst` records the register allocator and the emitter fill in (scalar constants, parameters
  and the thread index are operands, not instructions of the list);
- a broadcast of a load becomes one broadcasting load (`vbroadcastss m32`), or the `{1to16}` memory
  operand of the float32 add or multiply that uses it right away.

Every instruction kind the emitter has code for is accepted; anything else raises `CompileError`
naming it.
"""
from __future__ import annotations

from typing import Any

from polygrad.backend_api import (CompileError, DType, L, LinearPasses, LinearProgram, Ops, dtypes,
                                  simplify_linear)

# what the X86 emitter asks of the shared passes: everything (no C compiler does it after us)
PASSES = LinearPasses(unroll=True, unroll_limit=2048, reduce_unroll=((4, 64), (2, 160)), offsets=True)
MEMORY_KINDS = {L.LOAD: (None, "contiguous", "gather"), L.STORE: (None, "contiguous", "scatter")}
HEAD = (L.PARAM, L.VAR, L.SPECIAL)  # operands of the kernel's code, not instructions of its list
EMITTED = frozenset({L.PARAM, L.VAR, L.SPECIAL, L.LOOP, L.ENDLOOP, L.IF, L.ENDIF, L.CONST, L.BCAST, L.ALU,
                     L.ACC, L.UPDATE, L.ACC_READ, L.LOAD, L.STORE})


class XInst:
    """One instruction of the expanded program. Values carry their register-allocation results."""

    __slots__ = ("op", "dtype", "lanes", "src", "arg", "uses", "start", "end", "loc", "num", "alias", "step")

    def __init__(self, op: L, dtype: DType | None, src: tuple = (), arg: Any = None, lanes: int = 1):
        self.op, self.dtype, self.src, self.arg, self.lanes = op, dtype, src, arg, lanes
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


def check_emittable(prog: LinearProgram) -> None:
    """Raise CompileError at the first instruction the emitter has no code for (block-shared memory,
    barriers, local arrays, a memory access of another kind), before any work is done."""
    for x in prog.insts:
        if x.op not in EMITTED:
            raise CompileError(f"X86 backend: no code for linear-program instruction {x.op.name} ({x}); "
                               "run this kernel on CPU or INTERP")
        if x.op in MEMORY_KINDS and x.arg not in MEMORY_KINDS[x.op]:
            raise CompileError(f"X86 backend: no code for a {x.op.name} of kind {x.arg!r} ({x}); "
                               "run this kernel on CPU or INTERP")


def to_x86(prog: LinearProgram) -> XProgram:
    """The XInst program of a simplified linear program (offsets split, accumulators separate), with
    every value's `uses` counted."""
    env: dict[int, Any] = {}
    params: list[XInst] = []
    vars_: list[XInst] = []
    tid: XInst | None = None
    insts: list[XInst] = []
    for x in prog.insts:
        op = x.op
        if op is L.CONST and x.lanes == 1:  # an operand (an immediate or a constant-pool entry), no code
            env[id(x)] = XInst(L.CONST, x.dtype, (), x.arg)
            continue
        if op in HEAD:
            head = env[id(x)] = XInst(op, x.dtype, (), x.arg)
            if op is L.PARAM:
                params.append(head)
            elif op is L.VAR:
                vars_.append(head)
            else:
                tid = head
            continue
        src = tuple([None if s is None else env[id(s)] for s in x.src])
        arg = x.arg
        if op is L.LOOP:
            src = src[:2]
        elif op is L.ACC:
            arg = x.arg[0]  # one accumulator (the passes split arrays): the reduce op
        out = env[id(x)] = XInst(op, x.dtype, src, arg, x.lanes)
        for s in src:
            if s is not None:
                s.uses += 1
        if op is L.LOOP and len(x.src) > 2:
            out.step = int(x.src[2].arg)  # a partially unrolled reduce loop runs `step` points a turn
        elif op is L.ACC_READ:
            out.alias = src[0]
        insts.append(out)
    return XProgram(prog.name, fuse_broadcast_loads(insts), params, vars_, tid, prog.threads)


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
    check_emittable(prog)
    return to_x86(simplify_linear(prog, PASSES))
