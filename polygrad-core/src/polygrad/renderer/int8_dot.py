"""Integer dot products of 8-bit lanes: `contract_int8_dots(prog) -> prog`, a rewrite of the linear program.

Stage: linearizing, after `linearize` and before a C dialect renders the program, for a dialect that asks
for it (`CStyleRenderer.int8_dot`: the CPU backend on a CPU with VNNI). Input: a LinearProgram. Output: the
same program with each loop of the shape below replaced by one UPDATE with arg DOT4.

The loop: 4 turns (0 to 4, step 1) whose body is scalar int index arithmetic, two contiguous n-lane loads of
int8 (an unsigned byte load read through a BITCAST to int8 counts), their CASTs to int32, the product, and
an UPDATE (ADD) of an int32 accumulator of n lanes defined outside the loop; each load's index grows by n a
turn. That is lane l of the accumulator gaining a[l + n k] * b[l + n k] for k < 4 over the 4n bytes at
each load's index at turn 0, which the loop becomes: its index arithmetic at turn 0, two 4n-lane loads and
`UPDATE(acc, a, b)` with arg DOT4, which the dialect renders as one call of its helper (the CPU's: a byte
shuffle and vpdpbusd). Integer sums are exact, so the values are the loop's bit for bit. nn/quant.py writes
a decode matvec's 32-weight block as 4 x 8 such products (`QuantWeight.matmul_t`).
"""
from __future__ import annotations

import dataclasses

from polygrad.dtype import dtypes
from polygrad.renderer.linearize import Inst, L, LinearProgram
from polygrad.uop.ops import Ops

DOT4 = "dot4"  # UPDATE arg: acc lane l += sum over k < 4 of a[l + n k] * b[l + n k] (a, b: 4n int8 lanes)
TURNS = 4


def contract_int8_dots(prog: LinearProgram) -> LinearProgram:
    """The program with every 4-turn loop of 8-bit products into an int32 accumulator as one DOT4 UPDATE."""
    insts = list(prog.insts)
    end_of = {id(x.src[0]): j for j, x in enumerate(insts) if x.op is L.ENDLOOP}
    out: list[Inst] = []
    i = 0
    while i < len(insts):
        x = insts[i]
        if x.op is L.LOOP:
            j = end_of[id(x)]
            contracted = _contracted(x, insts[i + 1:j])
            if contracted is not None:
                out.extend(contracted)
                i = j + 1
                continue
        out.append(x)
        i += 1
    return prog if len(out) == len(insts) else dataclasses.replace(prog, insts=tuple(out))


def _is_int_const(x: Inst, value: int) -> bool:
    return x.op is L.CONST and x.lanes == 1 and x.arg == value


def _byte_operand(x: Inst, lanes: int) -> tuple[Inst, Inst | None] | None:
    """(the load, its BITCAST or None) when x is int32 lanes CAST from a contiguous int8 load."""
    if not (x.op is L.ALU and x.arg is Ops.CAST and x.dtype is dtypes.int32 and x.lanes == lanes):
        return None
    v = x.src[0]
    cast = None
    if v.op is L.ALU and v.arg is Ops.BITCAST and v.dtype is dtypes.int8 and v.src[0].dtype is dtypes.uint8:
        cast, v = v, v.src[0]
    ok = v.op is L.LOAD and v.arg == "contiguous" and len(v.src) == 2 and v.lanes == lanes
    if not ok or v.dtype is not (dtypes.int8 if cast is None else dtypes.uint8):
        return None
    return v, cast


def _turn_step(x: Inst, loop: Inst, body: set[int]) -> int | None:
    """How much x grows a turn of `loop` when it is affine in the loop variable; None when it is not."""
    if x is loop:
        return 1
    if id(x) not in body:
        return 0
    if not (x.op is L.ALU and x.lanes == 1 and x.dtype is dtypes.int32):
        return None
    found = [_turn_step(s, loop, body) for s in x.src]
    steps = [s for s in found if s is not None]
    if len(steps) < len(found):
        return None
    if not any(steps):
        return 0
    if x.arg is Ops.ADD:
        return sum(steps)
    if x.arg is Ops.MUL:
        a, b = x.src
        if b.op is L.CONST and steps[1] == 0:
            return steps[0] * b.arg
        if a.op is L.CONST and steps[0] == 0:
            return steps[1] * a.arg
    return None


def _contracted(loop: Inst, body: list[Inst]) -> list[Inst] | None:
    """The instructions replacing `loop` (whose body is `body`), or None when it is not a 4-turn byte dot."""
    if len(loop.src) != 2 or not _is_int_const(loop.src[0], 0) or not _is_int_const(loop.src[1], TURNS):
        return None
    updates = [x for x in body if x.op is L.UPDATE]
    if len(updates) != 1 or updates[0].arg is not Ops.ADD or len(updates[0].src) != 2:
        return None
    update = updates[0]
    acc, mul = update.src
    lanes = acc.lanes
    inside = {id(x) for x in body}
    if acc.op is not L.ACC or acc.dtype is not dtypes.int32 or acc.arg != (Ops.ADD, 1) or id(acc) in inside:
        return None
    if not (mul.op is L.ALU and mul.arg is Ops.MUL and mul.dtype is dtypes.int32 and mul.lanes == lanes > 1):
        return None
    found = [_byte_operand(s, lanes) for s in mul.src]
    operands = [o for o in found if o is not None]
    if len(operands) < len(found):
        return None
    vector = {id(update), id(mul)} | {id(s) for s in mul.src}
    for load, cast in operands:
        vector |= {id(load)} | ({id(cast)} if cast is not None else set())
        if _turn_step(load.src[1], loop, inside) != lanes:
            return None
    # everything else in the body is the loads' scalar index arithmetic
    index = [x for x in body if id(x) not in vector]
    if any(not (x.op is L.ALU and x.lanes == 1 and x.dtype is dtypes.int32) for x in index):
        return None
    # the index arithmetic at turn 0 (the loop's start stands for the variable), then the wide loads
    new: dict[int, Inst] = {id(loop): loop.src[0]}

    def at_start(x: Inst) -> Inst:
        return new.get(id(x), x)

    out = []
    for x in index:
        y = Inst(x.op, x.dtype, tuple(at_start(s) for s in x.src), x.arg, x.lanes)
        new[id(x)] = y
        out.append(y)
    wide = []
    for load, cast in operands:
        w = Inst(L.LOAD, load.dtype, (load.src[0], at_start(load.src[1])), "contiguous", TURNS * lanes)
        out.append(w)
        if cast is not None:
            w = Inst(L.ALU, dtypes.int8, (w,), Ops.BITCAST, TURNS * lanes)
            out.append(w)
        wide.append(w)
    out.append(Inst(L.UPDATE, update.dtype, (acc, *wide), DOT4, update.lanes))
    return out
