"""A thin assembler over iced-x86: instructions by mnemonic name, labels, a constant pool, disassembly.

Stage: encoding. Input: calls such as `a.op("ADD_R64_RM64", RAX, rbx)` (iced `Code` names, operands
as registers, `Mem` or `Imm`). Output: position-independent machine code bytes (`Assembler.encode`):
branches and constant-pool references are RIP-relative and resolved by iced's BlockEncoder; the pool
(floats, masks, vectors) follows the code in the same block.
"""
from __future__ import annotations

import struct
from typing import Any

import iced_x86 as iced
from iced_x86 import Code, Instruction, MemoryOperand, Register

GP64 = [Register.RAX, Register.RCX, Register.RDX, Register.RBX, Register.RSP, Register.RBP, Register.RSI,
        Register.RDI] + [getattr(Register, f"R{i}") for i in range(8, 16)]
GP32 = [Register.EAX, Register.ECX, Register.EDX, Register.EBX, Register.ESP, Register.EBP, Register.ESI,
        Register.EDI] + [getattr(Register, f"R{i}D") for i in range(8, 16)]
GP16 = [Register.AX, Register.CX, Register.DX, Register.BX, Register.SP, Register.BP, Register.SI,
        Register.DI] + [getattr(Register, f"R{i}W") for i in range(8, 16)]
GP8 = [Register.AL, Register.CL, Register.DL, Register.BL, Register.SPL, Register.BPL, Register.SIL,
       Register.DIL] + [getattr(Register, f"R{i}L") for i in range(8, 16)]
XMM = [getattr(Register, f"XMM{i}") for i in range(32)]
YMM = [getattr(Register, f"YMM{i}") for i in range(32)]
ZMM = [getattr(Register, f"ZMM{i}") for i in range(32)]
KREG = [getattr(Register, f"K{i}") for i in range(8)]
RAX, RCX, RDX, RBX, RSP, RBP, RSI, RDI = range(8)  # register numbers (index into the tables above)
R8 = 8


def gp(n: int, bits: int = 64) -> int:
    return {64: GP64, 32: GP32, 16: GP16, 8: GP8}[bits][n]


def vreg(n: int, bits: int = 128) -> int:
    return {128: XMM, 256: YMM, 512: ZMM}[bits][n]


class Imm(int):
    """An immediate operand (a plain int is a register)."""


class Mem:
    """A memory operand: [base + index*scale + disp], or a constant-pool label (RIP-relative)."""

    __slots__ = ("base", "index", "scale", "disp", "label", "bcst")

    def __init__(self, base: int | None = None, index: int | None = None, scale: int = 1, disp: int = 0,
                 label: int | None = None, bcst: bool = False):
        self.base, self.index, self.scale, self.disp, self.label, self.bcst = base, index, scale, disp, label, bcst

    def offset(self, extra: int) -> "Mem":
        return Mem(self.base, self.index, self.scale, self.disp + extra, self.label, self.bcst)

    def iced(self) -> MemoryOperand:
        if self.label is not None:
            return MemoryOperand(Register.RIP, displ=self.label + self.disp, displ_size=8, is_broadcast=self.bcst)
        base = GP64[self.base] if self.base is not None else Register.NONE
        index = GP64[self.index] if self.index is not None else Register.NONE
        return MemoryOperand(base, index, self.scale, self.disp, 1 if self.disp else 0, is_broadcast=self.bcst)


_CREATE: dict[str, Any] = {}


def _create(kinds: tuple[str, ...]) -> Any:
    name = "create_" + "_".join(kinds) if kinds else "create"
    fn = _CREATE.get(name)
    if fn is None:
        fn = _CREATE[name] = getattr(Instruction, name)
    return fn


class Assembler:
    """Collects instructions; labels are integers (an instruction's ip before encoding)."""

    LABEL_BASE = 1 << 40  # label ids live far above any real code offset

    def __init__(self) -> None:
        self.insts: list[Instruction] = []
        self.next_label = self.LABEL_BASE
        self.pending: list[int] = []  # labels to attach to the next instruction
        self.pool: dict[bytes, int] = {}
        self._alias: dict[int, int] = {}  # a second label bound to the same spot -> the first

    # ---- labels and branches
    def label(self) -> int:
        self.next_label += 1
        return self.next_label

    def bind(self, label: int) -> None:
        self.pending.append(label)

    def _add(self, ins: Instruction) -> None:
        if self.pending:
            # several labels on one spot: an instruction carries one, the others are aliases of it
            ins.ip = self.pending[0]
            for extra in self.pending[1:]:
                self._alias[extra] = self.pending[0]
            self.pending = []
        self.insts.append(ins)

    def jump(self, cond: str, label: int) -> None:
        """cond: an iced Jcc mnemonic stem ('JMP', 'JE', 'JNE', 'JL', ...)."""
        self._add(Instruction.create_branch(getattr(Code, f"{cond}_REL32_64"), label))

    def call_label(self, label: int) -> None:
        self._add(Instruction.create_branch(Code.CALL_REL32_64, label))

    # ---- instructions
    def op(self, name: str, *operands: Any, mask: int | None = None) -> None:
        """Append the instruction iced names `name`; `mask` is an AVX-512 write mask k1..k7 (merging)."""
        code = getattr(Code, name)
        kinds = []
        args: list[Any] = [code]
        for o in operands:
            if isinstance(o, Mem):
                kinds.append("mem")
                args.append(o.iced())
            elif isinstance(o, Imm):
                kinds.append("i32" if -(1 << 31) <= o < (1 << 31) else "i64")
                args.append(int(o))
            else:
                kinds.append("reg")
                args.append(o)
        ins = _create(tuple(kinds))(*args)
        if mask is not None:
            ins.op_mask = KREG[mask]
        self._add(ins)

    # ---- constant pool
    def const(self, data: bytes) -> Mem:
        """A RIP-relative operand for `data` in the pool (deduplicated)."""
        lab = self.pool.get(data)
        if lab is None:
            lab = self.pool[data] = self.label()
        return Mem(label=lab)

    def f32(self, v: float) -> Mem:
        return self.const(struct.pack("<f", v))

    def f64(self, v: float) -> Mem:
        return self.const(struct.pack("<d", v))

    def pool_size(self) -> int:
        return sum(len(d) for d in self.pool)

    def encode(self) -> bytes:
        """The code and its constant pool (last, pool_size() bytes) as one position-independent block."""
        out = list(self.insts)
        if self.pending:  # labels at the very end: bind them to a trailing int3
            self._add(Instruction.create(Code.INT3))
            out = list(self.insts)
        for data, lab in self.pool.items():
            first = True
            for i in range(0, len(data), 16):
                chunk = data[i:i + 16]
                d = getattr(Instruction, f"create_declare_byte_{len(chunk)}")(*chunk)
                if first:
                    d.ip = lab
                    first = False
                out.append(d)
        if self._alias:  # branches to an aliased label go to the instruction that carries its twin
            for ins in out:
                if ins.is_jcc_short_or_near or ins.is_jmp_short_or_near or ins.is_call_near:
                    t = ins.near_branch_target
                    if t in self._alias:
                        ins.near_branch64 = self._alias[t]
        enc = iced.BlockEncoder(64)
        enc.add_many(out)
        return enc.encode(0)


def disassemble(code: bytes, pool: int = 0) -> str:
    """Intel-syntax listing of machine code (POLY_DUMP_KERNELS / DEBUG=4); the last `pool` bytes are data."""
    fmt = iced.Formatter(iced.FormatterSyntax.INTEL)
    lines = []
    for ins in iced.Decoder(64, code[:len(code) - pool], ip=0):
        lines.append(f"{ins.ip:05x}  {fmt.format(ins)}")
    if pool:
        lines.append(f"; constant pool: {pool} bytes")
    return "\n".join(lines)
