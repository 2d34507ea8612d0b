"""Emit x86-64 machine code for an expanded, register-allocated kernel.

Stage: x86 code generation, last pass. Input: an `XProgram` whose values have locations
(regalloc.py) and the `Isa`. Output: `Kernel(code, pool, externs)`: position-independent bytes
with the signature `void kernel(const int64_t *args)` (runtime.py lays out `args`).

Value conventions: an integer or bool lives in a 64-bit register sign-extended (signed types) or
zero-extended (unsigned, bool 0/1) from its width, so comparisons and addressing use 64-bit forms and
an int32 index is an index register as it is; after arithmetic that can leave the type's range the
result is extended again (two's complement wrap, as C stores it). float32 and float64 are scalars in
xmm registers; float16 and bfloat16 are held as float32 and rounded to their format after every op
(the C renderer's `pg_rh`/`pg_rb`), with the C renderer's exact conversion routines as subroutines in
the kernel. The kernel-IR semantics (docs/kernel-ir.md) hold: IEEE ops with no contraction, MAX
propagating NaN from either side, truncating integer division by a divisor of 0 taken as 1 and
INT_MIN // -1 wrapping (never a trap), arithmetic SHR on signed types, float-to-int truncation.
fmod, pow and (without FMA3) fma call libm, saving the live registers around the call. rax, rcx, rdx
and the last vector registers are scratch; everything else is the allocator's.
"""
from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Any

from polygrad.backend_api import CompileError, DType, L, Ops, dtypes

from polygrad_backend_x86.asm import RAX, RCX, RDI, RDX, RSP, Assembler, Imm, Mem, gp, vreg
from polygrad_backend_x86.cpu import Isa
from polygrad_backend_x86.expand import XInst, XProgram
from polygrad_backend_x86.regalloc import CALLEE_SAVED, Frame, is_gp

HALVES = (dtypes.float16, dtypes.bfloat16)
CALLER_SAVED_GP = (6, 7, 8, 9, 10, 11)  # rsi rdi r8-r11 (rax rcx rdx are scratch)
SIZE_BITS = {1: 8, 2: 16, 4: 32, 8: 64}


@dataclass(frozen=True)
class Kernel:
    code: bytes
    pool: int                # bytes of constant data at the end of code
    externs: tuple           # libm functions the kernel calls, in args order after the thread index


class VectorUnsupported(Exception):
    """A vector instruction this emitter has no code for: the kernel is emitted again with scalar lanes."""


def round_half_value(v: float, dt: DType) -> float:
    """v rounded to float16 / bfloat16 (nearest even), as the C renderer writes its literals."""
    if math.isnan(v) or math.isinf(v):
        return v
    if dt is dtypes.float16:
        import numpy as np
        return float(np.float16(v))
    bits = struct.unpack("<I", struct.pack("<f", v))[0]
    bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return struct.unpack("<f", struct.pack("<I", bits & 0xFFFFFFFF))[0]


class Emitter:
    def __init__(self, prog: XProgram, isa: Isa, frame: Frame, vec_bytes: int):
        self.prog, self.isa, self.frame = prog, isa, frame
        self.a = Assembler()
        self.vs = isa.vec_regs  # first scratch vector register; vs+3 is the subroutines' own
        self.T0, self.T1, self.T2, self.TS = self.vs, self.vs + 1, self.vs + 2, self.vs + 3
        self.vec_bytes = vec_bytes
        self.externs: list[str] = []
        self.subs: dict[str, int] = {}
        self.loops: dict[int, tuple[int, int]] = {}
        self.ifs: dict[int, int] = {}
        n_fixed = len(prog.params) + len(prog.vars)
        self.extern_base = 8 * (n_fixed + 1)
        self.has_calls = any(x.op is L.ALU and self.calls_libm(x) for x in prog.insts)
        self.args_slot = frame.slot(8)
        self.tmp_slot = frame.slot(64)  # staging for libm arguments and lane folds
        if self.has_calls:
            self.save_slot = frame.slot(8 * len(CALLER_SAVED_GP) + vec_bytes * (self.vs + 4))

    # ---- small helpers
    def op(self, name: str, *ops: Any) -> None:
        self.a.op(name, *ops)

    def x(self, n: int) -> int:
        return vreg(n, 128)

    def slot(self, off: int) -> Mem:
        return Mem(RSP, disp=off)

    def sd(self, dt: DType) -> str:
        return "SD" if dt is dtypes.float64 else "SS"

    def calls_libm(self, x: XInst) -> bool:
        return x.lanes == 1 and x.dtype is not None and x.dtype.is_float and (
            x.arg in (Ops.POW,) or (x.arg is Ops.MOD) or (x.arg is Ops.FMA and not self.isa.fma))

    # ---- general-purpose values
    def gload(self, v: XInst, scratch: int) -> int:
        """A register holding v (64-bit, extended): its own, or scratch loaded with it."""
        if v.is_const:
            self.gmov_imm(scratch, int(v.arg))
            return scratch
        if v.alias is not None:
            v = v.alias
        if v.loc[0] == "r":
            return v.loc[1]
        self.op("MOV_R64_RM64", gp(scratch), self.slot(v.loc[1]))
        return scratch

    def gmov_imm(self, reg: int, value: int) -> None:
        value = value & ((1 << 64) - 1)
        if value >= 1 << 63:
            value -= 1 << 64
        if value == 0:
            self.op("XOR_R32_RM32", gp(reg, 32), gp(reg, 32))
        elif 0 < value < (1 << 32):
            self.op("MOV_R32_IMM32", gp(reg, 32), Imm(value))
        elif -(1 << 31) <= value < 0:
            self.op("MOV_RM64_IMM32", gp(reg), Imm(value))
        else:
            self.op("MOV_R64_IMM64", gp(reg), Imm(value))

    def gmov(self, reg: int, v: XInst) -> None:
        """Load v into exactly this register."""
        if v.is_const:
            self.gmov_imm(reg, int(v.arg))
            return
        src = self.gload(v, reg)
        if src != reg:
            self.op("MOV_R64_RM64", gp(reg), gp(src))

    def goperand(self, v: XInst, scratch: int, imm: bool = True) -> Any:
        """v as a second operand: an imm32, a stack slot, or a register."""
        if v.is_const:
            val = int(v.arg)
            if imm and -(1 << 31) <= val < (1 << 31):
                return Imm(val)
            self.gmov_imm(scratch, val)
            return scratch
        if v.alias is not None:
            v = v.alias
        if v.loc[0] == "s":
            return self.slot(v.loc[1])
        return v.loc[1]

    def rr(self, name: str, dst: int, src: Any) -> None:
        """A 64-bit two-operand op `name` (ADD, SUB, AND, OR, XOR, CMP, IMUL, MOV, TEST) on dst and src."""
        if isinstance(src, Imm):
            form = {"IMUL": None, "MOV": None, "TEST": "TEST_RM64_IMM32"}.get(name, f"{name}_RM64_IMM32")
            if name == "IMUL":
                self.op("IMUL_R64_RM64_IMM32", gp(dst), gp(dst), src)
            elif name == "MOV":
                self.gmov_imm(dst, int(src))
            else:
                self.op(form, gp(dst), src)
        elif isinstance(src, Mem):
            self.op(f"{name}_R64_RM64", gp(dst), src)
        else:
            self.op(f"{name}_R64_RM64" if name != "TEST" else "TEST_RM64_R64", gp(dst), gp(src))

    def gdst(self, x: XInst) -> int:
        return x.loc[1] if x.loc[0] == "r" else RAX

    def gdone(self, x: XInst, reg: int) -> None:
        if x.loc[0] == "s":
            self.op("MOV_RM64_R64", self.slot(x.loc[1]), gp(reg))
        elif x.loc[1] != reg:
            self.op("MOV_R64_RM64", gp(x.loc[1]), gp(reg))

    def normalize(self, reg: int, dt: DType) -> None:
        """Extend the low bits of reg to 64 (sign for signed types, zero for unsigned and bool)."""
        size = dt.itemsize
        if size == 8:
            return
        if dt is dtypes.bool:
            return
        if size == 4:
            if dt.is_unsigned:
                self.op("MOV_R32_RM32", gp(reg, 32), gp(reg, 32))
            else:
                self.op("MOVSXD_R64_RM32", gp(reg), gp(reg, 32))
        elif size == 2:
            self.op("MOVZX_R32_RM16" if dt.is_unsigned else "MOVSX_R64_RM16", gp(reg, 32 if dt.is_unsigned else 64),
                    gp(reg, 16))
        else:
            self.op("MOVZX_R32_RM8" if dt.is_unsigned else "MOVSX_R64_RM8", gp(reg, 32 if dt.is_unsigned else 64),
                    gp(reg, 8))

    def setcc(self, cc: str, reg: int) -> None:
        self.op(f"SET{cc}_RM8", gp(reg, 8))
        self.op("MOVZX_R32_RM8", gp(reg, 32), gp(reg, 8))

    # ---- vector-register scalars (floats)
    def fload(self, v: XInst, scratch: int) -> int:
        """A vector register holding float v: its own, or scratch loaded with it."""
        if v.is_const:
            self.fmov_mem(scratch, self.fconst(v.dtype, v.arg), v.dtype)
            return scratch
        if v.alias is not None:
            v = v.alias
        if v.loc[0] == "r":
            return v.loc[1]
        self.fmov_mem(scratch, self.slot(v.loc[1]), v.dtype)
        return scratch

    def foperand(self, v: XInst, scratch: int) -> Any:
        """Float v as a second operand: a register number or a 32/64-bit memory operand."""
        if v.is_const:
            return self.fconst(v.dtype, v.arg)
        if v.alias is not None:
            v = v.alias
        if v.loc[0] == "s":
            return self.slot(v.loc[1])
        return v.loc[1]

    def fconst(self, dt: DType, value: Any) -> Mem:
        v = float(value)
        if dt in HALVES:
            v = round_half_value(v, dt)
        return self.a.f64(v) if dt is dtypes.float64 else self.a.f32(v)

    def fmov_mem(self, reg: int, mem: Mem, dt: DType) -> None:
        w = "SD" if dt is dtypes.float64 else "SS"
        size = "M64" if w == "SD" else "M32"
        self.op(f"VEX_VMOV{w}_XMM_{size}" if self.isa.vex else f"MOV{w}_XMM_XMMM{size[1:]}", self.x(reg), mem)

    def fstore_mem(self, mem: Mem, reg: int, dt: DType) -> None:
        w = "SD" if dt is dtypes.float64 else "SS"
        size = "M64" if w == "SD" else "M32"
        self.op(f"VEX_VMOV{w}_{size}_XMM" if self.isa.vex else f"MOV{w}_XMMM{size[1:]}_XMM", mem, self.x(reg))

    def fcopy(self, dst: int, src: int) -> None:
        if dst != src:
            self.op("VEX_VMOVAPS_XMM_XMMM128" if self.isa.vex else "MOVAPS_XMM_XMMM128", self.x(dst), self.x(src))

    def fbin(self, mn: str, dt: DType, dst: int, a: int, b: Any) -> None:
        """dst = a <mn> b for scalar floats (mn: ADD SUB MUL DIV MAX MIN SQRT); dst may be a, never b."""
        w = self.sd(dt)
        m = "XMMM64" if w == "SD" else "XMMM32"
        bop = self.x(b) if isinstance(b, int) else b
        if self.isa.vex:
            self.op(f"VEX_V{mn}{w}_XMM_XMM_{m}", self.x(dst), self.x(a), bop)
        else:
            self.fcopy(dst, a)
            self.op(f"{mn}{w}_XMM_{m}", self.x(dst), bop)

    def flogic(self, mn: str, dst: int, a: int, b: Any) -> None:
        """dst = a <mn> b over the 128-bit register (ANDPS ANDNPS ORPS XORPS); b a register or 16-byte constant."""
        if self.isa.vex:
            self.op(f"VEX_V{mn}_XMM_XMM_XMMM128", self.x(dst), self.x(a), self.x(b) if isinstance(b, int) else b)
            return
        if isinstance(b, Mem):  # legacy SSE needs 16-byte alignment for memory operands: load it first
            if dst == self.TS:  # the constant goes where the result does (the ops used so are commutative)
                if mn == "ANDNPS":
                    raise CompileError("X86 backend: internal error, ANDNPS into the scratch register")
                self.op("MOVUPS_XMM_XMMM128", self.x(dst), b)
                self.op(f"{mn}_XMM_XMMM128", self.x(dst), self.x(a))
                return
            self.op("MOVUPS_XMM_XMMM128", self.x(self.TS), b)
            b = self.TS
        self.fcopy(dst, a)
        self.op(f"{mn}_XMM_XMMM128", self.x(dst), self.x(b))

    def fdst(self, x: XInst) -> int:
        return x.loc[1] if x.loc[0] == "r" else self.T0

    def fdone(self, x: XInst, reg: int) -> None:
        if x.loc[0] == "s":
            self.vstore_slot(x, reg)
        else:
            self.fcopy(x.loc[1], reg)

    def vstore_slot(self, x: XInst, reg: int) -> None:
        if x.lanes == 1:
            self.fstore_mem(self.slot(x.loc[1]), reg, x.dtype)
        else:
            self.vec_store_slot(x, reg)

    def movd_to_gp(self, reg: int, xr: int, bits: int = 32) -> None:
        w = "D" if bits == 32 else "Q"
        name = f"VEX_VMOV{w}_RM{bits}_XMM" if self.isa.vex else f"MOV{w}_RM{bits}_XMM"
        self.op(name, gp(reg, bits), self.x(xr))

    def movd_to_x(self, xr: int, reg: int, bits: int = 32) -> None:
        w = "D" if bits == 32 else "Q"
        name = f"VEX_VMOV{w}_XMM_RM{bits}" if self.isa.vex else f"MOV{w}_XMM_RM{bits}"
        self.op(name, self.x(xr), gp(reg, bits))

    # ---- half-precision helpers (subroutines: eax in, eax out; clobber ecx, edx and the TS register)
    def sub(self, name: str) -> None:
        lab = self.subs.get(name)
        if lab is None:
            lab = self.subs[name] = self.a.label()
        self.a.call_label(lab)

    def round_to(self, dt: DType, reg: int) -> None:
        """Round the float32 in reg to dt's precision (float16/bfloat16), as pg_rh / pg_rb do."""
        if dt not in HALVES:
            return
        self.movd_to_gp(RAX, reg)
        if dt is dtypes.float16:
            self.sub("f2h")
            self.sub("h2f")
        else:
            self.sub("f2b")
            self.op("SHL_RM32_IMM8", gp(RAX, 32), Imm(16))
        self.movd_to_x(reg, RAX)

    def emit_subroutines(self) -> None:
        a, e32 = self.a, (lambda r: gp(r, 32))
        for name, lab in list(self.subs.items()):
            a.bind(lab)
            if name == "f2h":  # eax: float bits -> eax: half bits (pg_f2h)
                big, normal, sign = a.label(), a.label(), a.label()
                self.op("MOV_R32_RM32", e32(RCX), e32(RAX))
                self.op("AND_RM32_IMM32", e32(RCX), Imm(0x80000000 - (1 << 32)))
                self.op("XOR_R32_RM32", e32(RAX), e32(RCX))
                self.op("CMP_RM32_IMM32", e32(RAX), Imm(143 << 23))
                a.jump("JAE", big)
                self.op("CMP_RM32_IMM32", e32(RAX), Imm(113 << 23))
                a.jump("JAE", normal)
                self.movd_to_x(self.TS, RAX)
                self.fbin("ADD", dtypes.float32, self.TS, self.TS, a.f32(0.5))
                self.movd_to_gp(RAX, self.TS)
                self.op("SUB_RM32_IMM32", e32(RAX), Imm(126 << 23))
                a.jump("JMP", sign)
                a.bind(big)
                self.op("CMP_RM32_IMM32", e32(RAX), Imm(255 << 23))
                self.op("MOV_R32_IMM32", e32(RAX), Imm(0x7C00))
                self.op("MOV_R32_IMM32", e32(RDX), Imm(0x7E00))
                self.op("CMOVA_R32_RM32", e32(RAX), e32(RDX))
                a.jump("JMP", sign)
                a.bind(normal)
                self.op("MOV_R32_RM32", e32(RDX), e32(RAX))
                self.op("SHR_RM32_IMM8", e32(RDX), Imm(13))
                self.op("AND_RM32_IMM8", e32(RDX), Imm(1))
                self.op("ADD_RM32_IMM32", e32(RAX), Imm(0xC8000FFF - (1 << 32)))
                self.op("ADD_R32_RM32", e32(RAX), e32(RDX))
                self.op("SHR_RM32_IMM8", e32(RAX), Imm(13))
                a.bind(sign)
                self.op("SHR_RM32_IMM8", e32(RCX), Imm(16))
                self.op("OR_R32_RM32", e32(RAX), e32(RCX))
                self.op("MOVZX_R32_RM16", e32(RAX), gp(RAX, 16))
                self.op("RETNQ")
            elif name == "h2f":  # eax: half bits -> eax: float bits (pg_h2f)
                not_inf, done = a.label(), a.label()
                self.op("MOV_R32_RM32", e32(RCX), e32(RAX))
                self.op("AND_RM32_IMM32", e32(RCX), Imm(0x7FFF))
                self.op("SHL_RM32_IMM8", e32(RCX), Imm(13))
                self.op("MOV_R32_RM32", e32(RDX), e32(RCX))
                self.op("AND_RM32_IMM32", e32(RDX), Imm(0x7C00 << 13))
                self.op("ADD_RM32_IMM32", e32(RCX), Imm((127 - 15) << 23))
                self.op("CMP_RM32_IMM32", e32(RDX), Imm(0x7C00 << 13))
                a.jump("JNE", not_inf)
                self.op("ADD_RM32_IMM32", e32(RCX), Imm((128 - 16) << 23))
                a.jump("JMP", done)
                a.bind(not_inf)
                self.op("TEST_RM32_R32", e32(RDX), e32(RDX))
                a.jump("JNE", done)
                self.op("ADD_RM32_IMM32", e32(RCX), Imm(1 << 23))
                self.movd_to_x(self.TS, RCX)
                self.fbin("SUB", dtypes.float32, self.TS, self.TS, a.const(struct.pack("<I", 113 << 23)))
                self.movd_to_gp(RCX, self.TS)
                a.bind(done)
                self.op("AND_RM32_IMM32", e32(RAX), Imm(0x8000))
                self.op("SHL_RM32_IMM8", e32(RAX), Imm(16))
                self.op("OR_R32_RM32", e32(RAX), e32(RCX))
                self.op("RETNQ")
            elif name == "f2b":  # eax: float bits -> eax: bfloat16 bits (pg_f2b)
                number = a.label()
                self.op("MOV_R32_RM32", e32(RCX), e32(RAX))
                self.op("AND_RM32_IMM32", e32(RCX), Imm(0x7FFFFFFF))
                self.op("CMP_RM32_IMM32", e32(RCX), Imm(0x7F800000))
                a.jump("JBE", number)
                self.op("SHR_RM32_IMM8", e32(RAX), Imm(16))
                self.op("OR_RM32_IMM8", e32(RAX), Imm(0x40))
                self.op("MOVZX_R32_RM16", e32(RAX), gp(RAX, 16))
                self.op("RETNQ")
                a.bind(number)
                self.op("MOV_R32_RM32", e32(RCX), e32(RAX))
                self.op("SHR_RM32_IMM8", e32(RCX), Imm(16))
                self.op("AND_RM32_IMM8", e32(RCX), Imm(1))
                self.op("ADD_RM32_IMM32", e32(RAX), Imm(0x7FFF))
                self.op("ADD_R32_RM32", e32(RAX), e32(RCX))
                self.op("SHR_RM32_IMM8", e32(RAX), Imm(16))
                self.op("RETNQ")

    # ---- memory
    def address(self, x: XInst, base_scratch: int, index_scratch: int) -> Mem:
        buf, idx = x.src[0], x.src[1]
        disp = x.arg[1]
        size = buf.dtype.itemsize
        base = self.gload(buf, base_scratch)
        if idx is None:
            return Mem(base, disp=disp * size)
        index = self.gload(idx, index_scratch)
        return Mem(base, index, size, disp * size)

    def load(self, x: XInst) -> None:
        if x.lanes > 1:
            self.vec_load(x)
            return
        dt = x.dtype
        gate = x.src[2] if len(x.src) > 2 else None
        skip = None
        if is_gp(x):
            r = self.gdst(x)
            if gate is not None:
                self.op("XOR_R32_RM32", gp(r, 32), gp(r, 32))
                skip = self.gate_jump(gate)
            self.load_extended(r, dt, self.address(x, RCX, RDX))
            if skip is not None:
                self.a.bind(skip)
            self.gdone(x, r)
            return
        r = self.fdst(x)
        if gate is not None:
            self.flogic("XORPS", r, r, r)
            skip = self.gate_jump(gate)
        mem = self.address(x, RCX, RDX)
        if dt in HALVES:
            self.op("MOVZX_R32_RM16", gp(RAX, 32), mem)
            if dt is dtypes.float16:
                self.sub("h2f")
            else:
                self.op("SHL_RM32_IMM8", gp(RAX, 32), Imm(16))
            self.movd_to_x(r, RAX)
        else:
            self.fmov_mem(r, mem, dt)
        if skip is not None:
            self.a.bind(skip)
        self.fdone(x, r)

    def load_extended(self, r: int, dt: DType, mem: Mem) -> None:
        """r = the integer or bool at mem, extended to 64 bits by its signedness."""
        bits = SIZE_BITS[dt.itemsize]
        signed = dt.is_int and not dt.is_unsigned
        if bits == 64:
            self.op("MOV_R64_RM64", gp(r), mem)
        elif signed:
            self.op("MOVSXD_R64_RM32" if bits == 32 else f"MOVSX_R64_RM{bits}", gp(r), mem)
        else:
            self.op("MOV_R32_RM32" if bits == 32 else f"MOVZX_R32_RM{bits}", gp(r, 32), mem)

    def gate_jump(self, gate: XInst) -> int:
        """Jump to the returned label when the (scalar) gate is false."""
        skip = self.a.label()
        g = self.goperand(gate, RAX, imm=False)
        if isinstance(g, Mem):
            self.op("CMP_RM64_IMM8", g, Imm(0))
        else:
            self.op("TEST_RM64_R64", gp(g), gp(g))
        self.a.jump("JE", skip)
        return skip

    def store(self, x: XInst) -> None:
        if x.lanes > 1:
            self.vec_store(x)
            return
        buf, value = x.src[0], x.src[2]
        dt = buf.dtype
        if dt in HALVES:
            v = self.fload(value, self.T1)
            self.movd_to_gp(RAX, v)
            if dt is dtypes.float16:
                self.sub("f2h")
            else:
                self.sub("f2b")
            mem = self.address(x, RCX, RDX)
            self.op("MOV_RM16_R16", mem, gp(RAX, 16))
        elif dt.is_float:
            v = self.fload(value, self.T1)
            mem = self.address(x, RCX, RDX)
            self.fstore_mem(mem, v, dt)
        else:
            v = self.gload(value, RAX)
            mem = self.address(x, RCX, RDX)
            bits = SIZE_BITS[dt.itemsize]
            self.op(f"MOV_RM{bits}_R{bits}", mem, gp(v, bits))

    # ---- arithmetic
    def alu(self, x: XInst) -> None:
        if x.lanes > 1:
            self.vec_alu(x)
            return
        op, dt = x.arg, x.dtype
        sdt = x.src[0].dtype if x.src else dt
        if op in (Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ) and sdt.is_float:
            self.fcompare(x)
        elif op is Ops.WHERE and not is_gp(x):
            self.fwhere(x)
        elif op is Ops.CAST or op is Ops.BITCAST:
            self.convert(x)
        elif is_gp(x):
            r = self.gdst(x)
            self.int_op(op, dt, sdt, list(x.src), r)
            self.gdone(x, r)
        else:
            r = self.fdst(x)
            if self.calls_libm(x):
                self.libm_call(x, r)
            else:
                self.float_op(op, dt, list(x.src), r)
            if dt in HALVES:
                self.round_to(dt, r)
            self.fdone(x, r)

    def int_op(self, op: Ops, dt: DType, sdt: DType, src: list[XInst], r: int) -> None:
        """r = op(src) for integers and bools; r differs from every operand's register."""
        if dt is dtypes.bool and op in (Ops.ADD, Ops.MAX):
            op = Ops.OR
        if dt is dtypes.bool and op is Ops.MUL:
            op = Ops.AND
        signed = sdt.is_int and not sdt.is_unsigned
        if op in (Ops.ADD, Ops.AND, Ops.OR, Ops.XOR):
            self.gmov(r, src[0])
            self.rr({Ops.ADD: "ADD", Ops.AND: "AND", Ops.OR: "OR", Ops.XOR: "XOR"}[op], r, self.goperand(src[1], RCX))
            if op is Ops.ADD:
                self.normalize(r, dt)
        elif op is Ops.MUL:
            self.gmov(r, src[0])
            self.rr("IMUL", r, self.goperand(src[1], RCX))
            self.normalize(r, dt)
        elif op is Ops.FMA:
            self.gmov(r, src[0])
            self.rr("IMUL", r, self.goperand(src[1], RCX))
            self.rr("ADD", r, self.goperand(src[2], RCX))
            self.normalize(r, dt)
        elif op is Ops.NEG:
            self.gmov(r, src[0])
            if dt is dtypes.bool:
                self.op("XOR_RM64_IMM8", gp(r), Imm(1))
            else:
                self.op("NEG_RM64", gp(r))
                self.normalize(r, dt)
        elif op is Ops.TRUNC:
            self.gmov(r, src[0])
        elif op in (Ops.SHL, Ops.SHR):
            self.gmov(r, src[0])
            name = "SHL" if op is Ops.SHL else ("SAR" if signed else "SHR")
            if src[1].is_const:
                self.op(f"{name}_RM64_IMM8", gp(r), Imm(int(src[1].arg) & 63))
            else:
                self.gmov(RCX, src[1])
                self.op(f"{name}_RM64_CL", gp(r), gp(RCX, 8))
            self.normalize(r, dt)
        elif op is Ops.MAX:
            self.gmov(r, src[0])
            b = self.goperand(src[1], RCX, imm=False)
            self.rr("CMP", r, b)
            cc = "L" if signed else "B"
            self.op(f"CMOV{cc}_R64_RM64", gp(r), b if isinstance(b, Mem) else gp(b))
        elif op in (Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ):
            a = self.gload(src[0], RDX)
            self.rr("CMP", a, self.goperand(src[1], RCX))
            cc = {Ops.CMPNE: "NE", Ops.CMPEQ: "E"}.get(op, "L" if signed else "B")
            self.setcc(cc, r)
        elif op is Ops.WHERE:
            c = self.gload(src[0], RDX)
            a = self.goperand(src[1], RCX, imm=False)
            self.gmov(r, src[2])
            self.op("TEST_RM64_R64", gp(c), gp(c))
            self.op("CMOVNE_R64_RM64", gp(r), a if isinstance(a, Mem) else gp(a))
        elif op in (Ops.IDIV, Ops.MOD):
            self.divide(op, dt, src, r)
        else:
            raise CompileError(f"X86 backend: no code for {op.name} on {dt.name}")

    def divide(self, op: Ops, dt: DType, src: list[XInst], r: int) -> None:
        """Truncating division: a divisor of 0 divides by 1, and INT64_MIN // -1 wraps instead of trapping."""
        signed = dt.is_int and not dt.is_unsigned
        self.gmov(RCX, src[1])
        self.op("MOV_R32_IMM32", gp(RDX, 32), Imm(1))
        self.op("TEST_RM64_R64", gp(RCX), gp(RCX))
        self.op("CMOVE_R64_RM64", gp(RCX), gp(RDX))
        self.gmov(RAX, src[0])
        done = None
        if signed and dt.itemsize == 8:  # the only width where the quotient can leave 64 bits
            general, done = self.a.label(), self.a.label()
            self.op("CMP_RM64_IMM8", gp(RCX), Imm(-1))
            self.a.jump("JNE", general)
            self.op("NEG_RM64", gp(RAX))
            self.op("XOR_R32_RM32", gp(RDX, 32), gp(RDX, 32))
            self.a.jump("JMP", done)
            self.a.bind(general)
        if signed:
            self.op("CQO")
            self.op("IDIV_RM64", gp(RCX))
        else:
            self.op("XOR_R32_RM32", gp(RDX, 32), gp(RDX, 32))
            self.op("DIV_RM64", gp(RCX))
        if done is not None:
            self.a.bind(done)
        out = RAX if op is Ops.IDIV else RDX
        if r != out:
            self.op("MOV_R64_RM64", gp(r), gp(out))
        self.normalize(r, dt)

    def float_op(self, op: Ops, dt: DType, src: list[XInst], r: int) -> None:
        """r = op(src) for scalar floats (float16/bfloat16 computed in float32); r is no operand's register."""
        if op in (Ops.ADD, Ops.MUL, Ops.FDIV):
            a = self.fload(src[0], self.T1)
            self.fbin({Ops.ADD: "ADD", Ops.MUL: "MUL", Ops.FDIV: "DIV"}[op], dt, r, a, self.foperand(src[1], self.T2))
        elif op is Ops.NEG:
            a = self.fload(src[0], self.T1)
            mask = self.a.const(struct.pack("<Q", 1 << 63) * 2 if dt is dtypes.float64 else
                                struct.pack("<I", 1 << 31) * 4)
            self.flogic("XORPS", r, a, mask)
        elif op is Ops.SQRT:
            a = self.foperand(src[0], self.T1)
            if self.isa.vex:  # the first source supplies the upper lanes: use the operand's register
                self.fbin("SQRT", dt, r, r, a)
            else:
                self.op(f"SQRT{self.sd(dt)}_XMM_XMMM{64 if dt is dtypes.float64 else 32}", self.x(r),
                        self.x(a) if isinstance(a, int) else a)
        elif op is Ops.RECIPROCAL:
            self.fmov_mem(r, self.fconst(dt, 1.0), dt)
            self.fbin("DIV", dt, r, r, self.foperand(src[0], self.T1))
        elif op is Ops.MAX:
            self.fmax(dt, r, self.fload(src[0], self.T1), self.foperand(src[1], self.T2))
        elif op is Ops.TRUNC:
            self.ftrunc(dt, r, self.fload(src[0], self.T1))
        elif op is Ops.FMA:  # FMA3: r = a*b + c rounded once
            w = self.sd(dt)
            m = "XMMM64" if w == "SD" else "XMMM32"
            self.fcopy(r, self.fload(src[0], self.T1))
            b = self.fload(src[1], self.T2)
            c = self.foperand(src[2], self.T0 if r != self.T0 else self.TS)
            self.op(f"VEX_VFMADD213{w}_XMM_XMM_{m}", self.x(r), self.x(b), self.x(c) if isinstance(c, int) else c)
        else:
            raise CompileError(f"X86 backend: no code for {op.name} on {dt.name}")

    def fmax(self, dt: DType, r: int, a: int, b: Any) -> None:
        """r = (a != a || a > b) ? a : b: maxss gives `a > b ? a : b` except for a NaN, which is kept."""
        keep_a, done = self.a.label(), self.a.label()
        self.fbin("MAX", dt, r, a, b)
        self.ucomi(dt, a, a)
        self.a.jump("JP", keep_a)
        self.a.jump("JMP", done)
        self.a.bind(keep_a)
        self.fcopy(r, a)
        self.a.bind(done)

    def ucomi(self, dt: DType, a: int, b: Any) -> None:
        w = self.sd(dt)
        m = "XMMM64" if w == "SD" else "XMMM32"
        self.op(f"VEX_VUCOMI{w}_XMM_{m}" if self.isa.vex else f"UCOMI{w}_XMM_{m}", self.x(a),
                self.x(b) if isinstance(b, int) else b)

    def ftrunc(self, dt: DType, r: int, a: int) -> None:
        """Round toward zero with SSE2 only: |a| below 2**23 (2**52) goes through an integer, the rest is integral
        (or inf/NaN) already; the sign of zero is kept."""
        f64 = dt is dtypes.float64
        big, done = self.a.label(), self.a.label()
        absmask = self.a.const(struct.pack("<Q", (1 << 63) - 1) * 2 if f64 else struct.pack("<I", (1 << 31) - 1) * 4)
        sign = self.a.const(struct.pack("<Q", 1 << 63) * 2 if f64 else struct.pack("<I", 1 << 31) * 4)
        self.flogic("ANDPS", r, a, absmask)
        self.ucomi(dt, r, self.a.f64(2.0 ** 52) if f64 else self.a.f32(2.0 ** 23))
        self.a.jump("JP", big)  # NaN
        self.a.jump("JAE", big)
        w = self.sd(dt)
        pre = "VEX_V" if self.isa.vex else ""
        self.op(f"{pre}CVTT{w}2SI_R64_XMMM{64 if f64 else 32}", gp(RAX), self.x(a))
        self.flogic("XORPS", r, r, r)
        self.cvt_int(dt, r, RAX)
        self.flogic("ANDPS", self.TS, a, sign)
        self.flogic("ORPS", r, r, self.TS)
        self.a.jump("JMP", done)
        self.a.bind(big)
        self.fcopy(r, a)
        self.a.bind(done)

    def cvt_int(self, dt: DType, r: int, reg: int) -> None:
        """r = (float or double) of the signed 64-bit integer in reg (r zeroed by the caller or not)."""
        w = self.sd(dt)
        if self.isa.vex:
            self.op(f"VEX_VCVTSI2{w}_XMM_XMM_RM64", self.x(r), self.x(r), gp(reg))
        else:
            self.op(f"CVTSI2{w}_XMM_RM64", self.x(r), gp(reg))

    def fcompare(self, x: XInst) -> None:
        op, sdt = x.arg, x.src[0].dtype
        r = self.gdst(x)
        if op is Ops.CMPLT:  # a < b is b > a: false when unordered
            b = self.fload(x.src[1], self.T1)
            self.ucomi(sdt, b, self.foperand(x.src[0], self.T2))
            self.setcc("A", r)
        else:
            a = self.fload(x.src[0], self.T1)
            self.ucomi(sdt, a, self.foperand(x.src[1], self.T2))
            if op is Ops.CMPEQ:
                self.op("SETE_RM8", gp(RCX, 8))
                self.op("SETNP_RM8", gp(RDX, 8))
                self.op("AND_R8_RM8", gp(RCX, 8), gp(RDX, 8))
            else:
                self.op("SETNE_RM8", gp(RCX, 8))
                self.op("SETP_RM8", gp(RDX, 8))
                self.op("OR_R8_RM8", gp(RCX, 8), gp(RDX, 8))
            self.op("MOVZX_R32_RM8", gp(r, 32), gp(RCX, 8))
        self.gdone(x, r)

    def fwhere(self, x: XInst) -> None:
        r = self.fdst(x)
        cond, a, b = x.src
        done = self.a.label()
        self.fcopy(r, self.fload(b, self.T1))
        c = self.goperand(cond, RAX, imm=False)
        if isinstance(c, Mem):
            self.op("CMP_RM64_IMM8", c, Imm(0))
        else:
            self.op("TEST_RM64_R64", gp(c), gp(c))
        self.a.jump("JE", done)
        self.fcopy(r, self.fload(a, self.T2))
        self.a.bind(done)
        self.fdone(x, r)

    def convert(self, x: XInst) -> None:
        """CAST and BITCAST between every pair of dtypes (kernel-IR rules; C's where they are the same)."""
        op, dt, s = x.arg, x.dtype, x.src[0]
        sdt = s.dtype
        if op is Ops.BITCAST:
            self.bitcast(x)
            return
        if dt is dtypes.bool:
            r = self.gdst(x)
            if sdt.is_float:  # x != 0, true for NaN
                a = self.fload(s, self.T1)
                self.ucomi(sdt if sdt not in HALVES else dtypes.float32, a, self.fconst(
                    dtypes.float64 if sdt is dtypes.float64 else dtypes.float32, 0.0))
                self.op("SETNE_RM8", gp(RCX, 8))
                self.op("SETP_RM8", gp(RDX, 8))
                self.op("OR_R8_RM8", gp(RCX, 8), gp(RDX, 8))
                self.op("MOVZX_R32_RM8", gp(r, 32), gp(RCX, 8))
            else:
                a = self.gload(s, RCX)
                self.op("TEST_RM64_R64", gp(a), gp(a))
                self.setcc("NE", r)
            self.gdone(x, r)
            return
        if not dt.is_float:
            r = self.gdst(x)
            if sdt.is_float:
                self.float_to_int(x, r)
            else:
                self.gmov(r, s)
                self.normalize(r, dt)
            self.gdone(x, r)
            return
        r = self.fdst(x)
        if sdt.is_float:  # float16/bfloat16 are float32 values here
            a = self.fload(s, self.T1)
            src64, dst64 = sdt is dtypes.float64, dt is dtypes.float64
            if src64 and not dst64:
                self.fcvt("SD2SS", r, a)
            elif dst64 and not src64:
                self.fcvt("SS2SD", r, a)
            else:
                self.fcopy(r, a)
        else:
            self.int_to_float(s, dt, r)
        self.round_to(dt, r)
        self.fdone(x, r)

    def fcvt(self, name: str, r: int, a: int) -> None:
        m = "XMMM64" if name.startswith("SD") else "XMMM32"
        if self.isa.vex:
            self.op(f"VEX_VCVT{name}_XMM_XMM_{m}", self.x(r), self.x(r), self.x(a))
        else:
            self.op(f"CVT{name}_XMM_{m}", self.x(r), self.x(a))

    def int_to_float(self, s: XInst, dt: DType, r: int) -> None:
        fdt = dtypes.float64 if dt is dtypes.float64 else dtypes.float32
        self.gmov(RAX, s)
        self.flogic("XORPS", r, r, r)
        if s.dtype is dtypes.uint64:  # above 2**63: halve keeping the lost bit (round to odd), convert, double
            big, done = self.a.label(), self.a.label()
            self.op("TEST_RM64_R64", gp(RAX), gp(RAX))
            self.a.jump("JS", big)
            self.cvt_int(fdt, r, RAX)
            self.a.jump("JMP", done)
            self.a.bind(big)
            self.op("MOV_R64_RM64", gp(RCX), gp(RAX))
            self.op("SHR_RM64_IMM8", gp(RAX), Imm(1))
            self.op("AND_RM32_IMM8", gp(RCX, 32), Imm(1))
            self.op("OR_R64_RM64", gp(RAX), gp(RCX))
            self.cvt_int(fdt, r, RAX)
            self.fbin("ADD", fdt, r, r, r)
            self.a.bind(done)
        else:
            self.cvt_int(fdt, r, RAX)

    def float_to_int(self, x: XInst, r: int) -> None:
        """Truncation toward zero, as clang compiles C's conversion (out-of-range results are undefined)."""
        s, dt = x.src[0], x.dtype
        sdt = s.dtype
        w = "SD" if sdt is dtypes.float64 else "SS"
        m = "XMMM64" if w == "SD" else "XMMM32"
        a = self.fload(s, self.T1)
        pre = "VEX_V" if self.isa.vex else ""
        if dt is dtypes.uint64:
            big, done = self.a.label(), self.a.label()
            limit = self.a.f64(2.0 ** 63) if w == "SD" else self.a.f32(2.0 ** 63)
            self.ucomi(dtypes.float64 if w == "SD" else dtypes.float32, a, limit)
            self.a.jump("JAE", big)
            self.op(f"{pre}CVTT{w}2SI_R64_{m}", gp(r), self.x(a))
            self.a.jump("JMP", done)
            self.a.bind(big)
            self.fbin("SUB", dtypes.float64 if w == "SD" else dtypes.float32, self.T2, a, limit)
            self.op(f"{pre}CVTT{w}2SI_R64_{m}", gp(r), self.x(self.T2))
            self.op("BTC_RM64_IMM8", gp(r), Imm(63))
            self.a.bind(done)
            return
        if dt.itemsize == 8 or dt is dtypes.uint32:
            self.op(f"{pre}CVTT{w}2SI_R64_{m}", gp(r), self.x(a))
        else:
            self.op(f"{pre}CVTT{w}2SI_R32_{m}", gp(r, 32), self.x(a))
        self.normalize(r, dt)

    def bitcast(self, x: XInst) -> None:
        dt, s = x.dtype, x.src[0]
        sdt = s.dtype
        bits = dt.itemsize * 8
        if sdt.is_float and not dt.is_float:  # float bits into an integer
            r = self.gdst(x)
            a = self.fload(s, self.T1)
            if sdt in HALVES:
                self.movd_to_gp(RAX, a)
                self.sub("f2h" if sdt is dtypes.float16 else "f2b")
                self.op("MOV_R32_RM32", gp(r, 32), gp(RAX, 32))
            else:
                self.movd_to_gp(r, a, 64 if bits == 64 else 32)
            self.normalize(r, dt)
            self.gdone(x, r)
        elif dt.is_float and not sdt.is_float:
            r = self.fdst(x)
            if dt in HALVES:
                self.gmov(RAX, s)
                if dt is dtypes.float16:
                    self.op("MOVZX_R32_RM16", gp(RAX, 32), gp(RAX, 16))
                    self.sub("h2f")
                else:
                    self.op("SHL_RM32_IMM8", gp(RAX, 32), Imm(16))
                self.movd_to_x(r, RAX)
            else:
                a = self.gload(s, RAX)
                self.movd_to_x(r, a, 64 if bits == 64 else 32)
            self.fdone(x, r)
        elif dt.is_float:  # float16 <-> bfloat16 bits
            r = self.fdst(x)
            a = self.fload(s, self.T1)
            self.movd_to_gp(RAX, a)
            self.sub("f2h" if sdt is dtypes.float16 else "f2b")
            if dt is dtypes.float16:
                self.sub("h2f")
            else:
                self.op("SHL_RM32_IMM8", gp(RAX, 32), Imm(16))
            self.movd_to_x(r, RAX)
            self.fdone(x, r)
        else:
            r = self.gdst(x)
            self.gmov(r, s)
            self.normalize(r, dt)
            self.gdone(x, r)

    # ---- libm calls
    def extern(self, name: str) -> int:
        if name not in self.externs:
            self.externs.append(name)
        return self.extern_base + 8 * self.externs.index(name)

    def live_across(self, at: int) -> list[XInst]:
        return [v for v in self.values if v.loc is not None and v.loc[0] == "r" and v.start < at < v.end]

    def libm_call(self, x: XInst, r: int) -> None:
        """r = pow/fmod/fma of the operands, calling libm with every live caller-saved register saved."""
        dt = x.dtype
        f64 = dt is dtypes.float64
        name = {Ops.POW: "pow", Ops.MOD: "fmod", Ops.FMA: "fma"}[x.arg] + ("" if f64 else "f")
        cdt = dtypes.float64 if f64 else dtypes.float32
        for k, s in enumerate(x.src):  # stage the operands in memory (no register shuffle to get wrong)
            self.fstore_mem(self.slot(self.tmp_slot + 8 * k), self.fload(s, self.T1), cdt)
        saved = []
        for v in self.live_across(x.num):
            reg = v.loc[1]
            if is_gp(v):
                if reg in CALLER_SAVED_GP:
                    saved.append((v, self.save_slot + 8 * CALLER_SAVED_GP.index(reg)))
            else:
                saved.append((v, self.save_slot + 8 * len(CALLER_SAVED_GP) + self.vec_bytes * reg))
        for v, off in saved:
            self.save_reg(v, off, store=True)
        for k in range(len(x.src)):
            self.fmov_mem(k, self.slot(self.tmp_slot + 8 * k), cdt)
        if self.isa.vex:
            self.op("VEX_VZEROUPPER")
        self.op("MOV_R64_RM64", gp(RAX), self.slot(self.args_slot))
        self.op("MOV_R64_RM64", gp(RAX), Mem(RAX, disp=self.extern(name)))
        self.op("CALL_RM64", gp(RAX))
        self.fcopy(r, 0)
        for v, off in saved:
            self.save_reg(v, off, store=False)

    def save_reg(self, v: XInst, off: int, store: bool) -> None:
        reg = v.loc[1]
        if is_gp(v):
            if store:
                self.op("MOV_RM64_R64", self.slot(off), gp(reg))
            else:
                self.op("MOV_R64_RM64", gp(reg), self.slot(off))
            return
        bits = self.vec_bytes * 8
        if self.isa.tier == "avx512" and bits == 512:
            name = "EVEX_VMOVUPS_ZMMM512_K1Z_ZMM" if store else "EVEX_VMOVUPS_ZMM_K1Z_ZMMM512"
        elif self.isa.vex and bits == 256:
            name = "VEX_VMOVUPS_YMMM256_YMM" if store else "VEX_VMOVUPS_YMM_YMMM256"
        elif self.isa.tier == "avx512" and reg >= 16:
            name = "EVEX_VMOVUPS_XMMM128_K1Z_XMM" if store else "EVEX_VMOVUPS_XMM_K1Z_XMMM128"
        else:
            name = ("VEX_VMOVUPS_XMMM128_XMM" if store else "VEX_VMOVUPS_XMM_XMMM128") if self.isa.vex else \
                ("MOVUPS_XMMM128_XMM" if store else "MOVUPS_XMM_XMMM128")
        r = vreg(reg, bits if bits > 128 else 128)
        if store:
            self.op(name, self.slot(off), r)
        else:
            self.op(name, r, self.slot(off))

    # ---- accumulators
    def acc_init(self, x: XInst) -> None:
        init = x.src[0]
        if x.lanes > 1:
            self.vec_copy_into(x, init)
        elif is_gp(x):
            r = self.gdst(x)
            self.gmov(r, init)
            self.gdone(x, r)
        else:
            r = self.fdst(x)
            self.fcopy(r, self.fload(init, self.T1))
            self.fdone(x, r)

    def update(self, x: XInst) -> None:
        acc, value = x.src
        red = x.arg
        if acc.lanes > 1 or value.lanes > 1:
            self.vec_update(x)
            return
        dt = acc.dtype
        if is_gp(acc):
            self.int_op(red, dt, dt, [acc, value], RAX)
            self.gdone(acc, RAX)
            return
        if red is Ops.ADD or red is Ops.MUL:
            mn = "ADD" if red is Ops.ADD else "MUL"
            if acc.loc[0] == "r":
                self.fbin(mn, dt, acc.loc[1], acc.loc[1], self.foperand(value, self.T1))
                self.round_to(dt, acc.loc[1])
                return
        self.float_op(red, dt, [acc, value], self.T0)
        self.round_to(dt, self.T0)
        self.fdone(acc, self.T0)

    # ---- structure
    def prologue(self) -> None:
        self.pushed = [r for r in sorted(self.frame.used_gp) if r in CALLEE_SAVED]
        for r in self.pushed:
            self.op("PUSH_R64", gp(r))
        size = (self.frame.slots + 63) // 64 * 64
        if (8 + 8 * len(self.pushed) + size) % 16:
            size += 8
        self.frame_size = size
        if size:
            self.op("SUB_RM64_IMM32", gp(RSP), Imm(size))
        self.op("MOV_R64_RM64", gp(RAX), gp(RDI))
        self.op("MOV_RM64_R64", self.slot(self.args_slot), gp(RAX))
        heads = list(self.prog.params) + list(self.prog.vars)
        slots = list(range(len(heads)))
        if self.prog.tid is not None:
            heads.append(self.prog.tid)
            slots.append(len(self.prog.params) + len(self.prog.vars))
        for v, k in zip(heads, slots):
            if v.loc is None:
                continue
            if v.loc[0] == "r":
                self.op("MOV_R64_RM64", gp(v.loc[1]), Mem(RAX, disp=8 * k))
            else:
                self.op("MOV_R64_RM64", gp(RCX), Mem(RAX, disp=8 * k))
                self.op("MOV_RM64_R64", self.slot(v.loc[1]), gp(RCX))

    def epilogue(self) -> None:
        if self.frame_size:
            self.op("ADD_RM64_IMM32", gp(RSP), Imm(self.frame_size))
        for r in reversed(self.pushed):
            self.op("POP_R64", gp(r))
        if self.isa.vex:
            self.op("VEX_VZEROUPPER")
        self.op("RETNQ")

    def loop_open(self, x: XInst) -> None:
        start, end = x.src
        top, out = self.a.label(), self.a.label()
        self.loops[id(x)] = (top, out)
        if x.loc[0] == "r":
            i = x.loc[1]
            self.gmov(i, start)
            self.rr("CMP", i, self.goperand(end, RCX))
        else:
            self.gmov(RAX, start)
            self.op("MOV_RM64_R64", self.slot(x.loc[1]), gp(RAX))
            self.rr("CMP", RAX, self.goperand(end, RCX))
        self.a.jump("JGE", out)
        self.a.bind(top)

    def loop_close(self, x: XInst) -> None:
        loop = x.src[0]
        top, out = self.loops[id(loop)]
        end = loop.src[1]
        if loop.loc[0] == "r":
            i = loop.loc[1]
            self.op("ADD_RM64_IMM8", gp(i), Imm(loop.step))
            self.rr("CMP", i, self.goperand(end, RCX))
        else:
            self.op("MOV_R64_RM64", gp(RAX), self.slot(loop.loc[1]))
            self.op("ADD_RM64_IMM8", gp(RAX), Imm(loop.step))
            self.op("MOV_RM64_R64", self.slot(loop.loc[1]), gp(RAX))
            self.rr("CMP", RAX, self.goperand(end, RCX))
        self.a.jump("JL", top)
        self.a.bind(out)

    def run(self) -> Kernel:
        heads = list(self.prog.params) + list(self.prog.vars) + ([self.prog.tid] if self.prog.tid else [])
        self.values = [v for v in heads + list(self.prog.insts) if v.loc is not None]
        self.prologue()
        for x in self.prog.insts:
            op = x.op
            if op is L.LOOP:
                self.loop_open(x)
            elif op is L.ENDLOOP:
                self.loop_close(x)
            elif op is L.IF:
                self.ifs[id(x)] = self.gate_jump(x.src[0])
            elif op is L.ENDIF:
                self.a.bind(self.ifs[id(x.src[0])])
            elif op is L.ALU:
                self.alu(x)
            elif op is L.LOAD:
                self.load(x)
            elif op is L.STORE:
                self.store(x)
            elif op is L.ACC:
                self.acc_init(x)
            elif op is L.UPDATE:
                self.update(x)
            elif op is L.ACC_READ:
                pass  # the accumulator's own location
            elif op is L.BCAST:
                self.vec_bcast(x)
            elif op is L.CONST:
                self.vec_const(x)
            else:
                raise CompileError(f"X86 backend: no code for {op.name}")
        self.epilogue()
        self.emit_subroutines()
        code = self.a.encode()
        return Kernel(code, self.a.pool_size(), tuple(self.externs))

    # ---- vectors (vector.py adds these to a subclass)
    def vec_load(self, x: XInst) -> None:
        raise VectorUnsupported("vector load")

    def vec_store(self, x: XInst) -> None:
        raise VectorUnsupported("vector store")

    def vec_alu(self, x: XInst) -> None:
        raise VectorUnsupported(f"vector {x.arg}")

    def vec_update(self, x: XInst) -> None:
        raise VectorUnsupported("vector update")

    def vec_bcast(self, x: XInst) -> None:
        raise VectorUnsupported("broadcast")

    def vec_const(self, x: XInst) -> None:
        raise VectorUnsupported("vector constant")

    def vec_copy_into(self, x: XInst, init: XInst) -> None:
        raise VectorUnsupported("vector accumulator")

    def vec_store_slot(self, x: XInst, reg: int) -> None:
        raise VectorUnsupported("vector spill")
