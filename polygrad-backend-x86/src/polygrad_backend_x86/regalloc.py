"""Register allocation by linear scan, with spills to the stack frame.

Stage: x86 code generation, second pass. Input: an `XProgram` (expand.py). Output: every value's
`loc`: `("r", n)` a register (general-purpose n for integers, bools and pointers; vector register n
for floats and every vector), `("s", offset)` a stack slot, or `None` for scalar constants (the
emitter uses them as immediates or constant-pool operands). Returns the frame layout.

Live intervals run from a value's definition to its last use (an `ACC_READ` is a use of its
accumulator); a value used inside a loop that began after its definition stays live to the loop's
end, so loop-carried values (loop variables, bounds, accumulators, hoisted invariants) keep their
register for every iteration. The scan (Poletto and Sarkar) assigns registers by start; when none is
free it spills the interval that ends last. A register is never shared by an instruction's operand and
its result, so the emitter may write its result before it has read every operand.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from polygrad.backend_api import L, dtypes

from polygrad_backend_x86.asm import R8, RBP, RBX, RDI, RSI
from polygrad_backend_x86.expand import XInst, XProgram

GP_ALLOC = [RBX, RBP, RSI, RDI] + list(range(R8, 16))  # rax, rcx, rdx: scratch; rsp: the stack
CALLEE_SAVED = {RBX, RBP, 12, 13, 14, 15}
VALUES = (L.PARAM, L.VAR, L.SPECIAL, L.CONST, L.LOOP, L.ACC, L.LOAD, L.ALU, L.BCAST)


def is_gp(x: XInst) -> bool:
    """Integers, bools and pointers live in general-purpose registers; floats and vectors do not."""
    if x.op is L.PARAM:
        return True
    return x.lanes == 1 and (x.dtype.is_int or x.dtype is dtypes.bool)


@dataclass
class Frame:
    slots: int = 0                      # bytes of spill slots at [rsp + 0 ..)
    used_gp: set = field(default_factory=set)
    used_vec: set = field(default_factory=set)
    align: int = 16                     # the widest alignment a slot asked for (the stack gives 16)

    def slot(self, size: int) -> int:
        align = min(size, 64)
        self.align = max(self.align, align)
        self.slots = (self.slots + align - 1) // align * align
        off = self.slots
        self.slots += size
        return off


def wide(v: XInst) -> bool:
    """A vector value (4, 8 or 16 lanes of a 4-byte type): it may live in xmm/ymm/zmm16..31, which exist only
    with AVX-512 (VL gives the 128- and 256-bit EVEX forms; the allocator is given high registers only then)."""
    return not is_gp(v) and v.lanes > 1


def allocate(prog: XProgram, vec_regs: int, vec_bytes: int, high_regs: int = 0) -> Frame:
    """Assign `loc` to every value of prog; vector registers 0..vec_regs-1 may be used, and for vector
    values also 16..16+high_regs-1 (EVEX-only registers: 512-bit values take them first, narrower ones last)."""
    insts = prog.insts
    for i, x in enumerate(insts):
        x.num = i
    heads = list(prog.params) + list(prog.vars) + ([prog.tid] if prog.tid is not None else [])
    for x in heads:
        x.start = x.end = -1
    # loops: (start, end) positions, and for each position the loops around it (outermost first)
    loops_at: list[list[tuple[int, int]]] = []
    stack: list[int] = []
    ends: dict[int, int] = {}
    for i, x in enumerate(insts):
        if x.op is L.ENDLOOP:
            ends[stack.pop()] = i
        elif x.op is L.LOOP:
            stack.append(i)
    stack2: list[tuple[int, int]] = []
    for i, x in enumerate(insts):
        if x.op is L.LOOP:
            stack2.append((i, ends[i]))
        loops_at.append(list(stack2))
        if x.op is L.ENDLOOP:
            stack2.pop()

    values: list[XInst] = list(heads)
    for x in insts:
        if x.op in VALUES and not x.is_const:
            x.start = x.end = x.num
            values.append(x)

    weight: dict[int, float] = {}

    def use(v: XInst, at: int) -> None:
        if v is None or v.is_const:
            return
        if v.alias is not None:
            v = v.alias
        weight[id(v)] = weight.get(id(v), 0.0) + 8.0 ** min(len(loops_at[at]), 6)
        end = at
        for s, e in loops_at[at]:  # outermost loop around this use that began after v's definition
            if v.start < s < at:
                end = max(end, e)
                break
        v.end = max(v.end, end)

    for x in insts:
        for s in x.src:
            if s is not None and s.op is L.LOAD and s.arg[0] == "folded":  # a memory operand of x
                for t in s.src:
                    use(t, x.num)
            else:
                use(s, x.num)
        if x.op is L.ENDLOOP:
            use(x.src[0], x.num)
            use(x.src[0].src[1], x.num)
    frame = Frame()
    high = list(range(16, 16 + high_regs))
    free = {True: list(GP_ALLOC), False: list(range(vec_regs))}
    active: list[XInst] = []
    for v in sorted(values, key=lambda x: (x.start, x.num)):
        gp_class = is_gp(v)
        for a in [a for a in active if a.end < v.start]:
            active.remove(a)
            (high if a.loc[1] >= 16 and not is_gp(a) else free[is_gp(a)]).append(a.loc[1])
        # a 512-bit value takes a high register first (the low ones stay for the rest); a 128/256-bit one only
        # once the low ones are taken, so kernels that fit in 0..11 keep their VEX code (vblendvps, vcmpps into
        # a ymm, vpxor have no EVEX form on high registers and go through scratch moves: vector.py's vop_low)
        if wide(v) and high and (v.lanes == 16 or not free[gp_class]):
            v.loc = ("r", high.pop(0))
            active.append(v)
            continue
        if free[gp_class]:
            reg = free[gp_class].pop(0)
            v.loc = ("r", reg)
            active.append(v)
            continue
        # spill the value whose uses weigh least (a use in a loop nest of depth d weighs 8**d); only a
        # vector value may take a high register
        same = [a for a in active if is_gp(a) == gp_class and (wide(v) or gp_class or a.loc[1] < 16)]
        victim = min(same, key=lambda a: (weight.get(id(a), 0.0), -a.end))
        if (weight.get(id(victim), 0.0), -victim.end) < (weight.get(id(v), 0.0), -v.end):
            v.loc = victim.loc
            victim.loc = ("s", frame.slot(8 if gp_class else vec_bytes))
            active.remove(victim)
            active.append(v)
        else:
            v.loc = ("s", frame.slot(8 if gp_class else vec_bytes))
    for v in values:
        if v.loc[0] == "r":
            (frame.used_gp if is_gp(v) else frame.used_vec).add(v.loc[1])
    return frame
