"""Emit x86-64 machine code for an expanded, register-allocated kernel.

Stage: x86 code generation, last pass. Input: an `XProgram` whose values have locations
(regalloc.py) and the `Isa`. Output: `Kernel(code, pool, externs)`: position-independent bytes
with the signature `void kernel(const int64_t *args)` (runtime.py lays out `args`).

This module holds the frame (prologue, epilogue, spill slots), loops and IF blocks, loads and stores
(index arithmetic in the addressing mode), accumulators, and the helpers that put a value where an
instruction needs it. The ALU lives in arith.py (scalars), halves.py (float16/bfloat16 rounding) and
vector.py (lanes). An integer or bool lives in a 64-bit register sign-extended (signed types) or
zero-extended (unsigned, bool 0/1) from its width, so comparisons and addressing use 64-bit forms and
an int32 index is an index register as it is. rax, rcx, rdx and vector registers 12-15 are scratch;
everything else is the allocator's. The kernel-IR semantics (docs/kernel-ir.md) hold bit for bit.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from polygrad.backend_api import CompileError, DType, L, Ops, dtypes

from polygrad_backend_x86.arith import CALLER_SAVED_GP, SIZE_BITS, ScalarArithmetic, VectorUnsupported
from polygrad_backend_x86.asm import RAX, RCX, RDI, RDX, RSP, Assembler, Imm, Mem, gp, vreg
from polygrad_backend_x86.cpu import Isa
from polygrad_backend_x86.expand import XInst, XProgram
from polygrad_backend_x86.halves import HALVES, HalfRoutines, round_half_value
from polygrad_backend_x86.regalloc import CALLEE_SAVED, Frame, is_gp

__all__ = ["Emitter", "Kernel", "VectorUnsupported", "round_half_value"]


@dataclass(frozen=True)
class Kernel:
    code: bytes
    pool: int                # bytes of constant data at the end of code
    externs: tuple           # libm functions the kernel calls, in args order after the thread index




class Emitter(ScalarArithmetic, HalfRoutines):
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
        # 32- and 64-byte spills (the register allocator's, before the emitter's own slots) get a frame aligned to
        # 64: at the caller's 16 a 512-bit spill or reload crossed two cache lines in 3 of 4 processes (a 3x3 conv
        # weight gradient's 24-accumulator tile ran 28 or 137 ms by where the worker's stack happened to sit)
        self.aligned = frame.align > 16
        self.rsp_slot = frame.slot(8) if self.aligned else 0
        self.args_slot = frame.slot(8)
        self.tmp_slot = frame.slot(64)  # staging for libm arguments and lane folds
        if self.has_calls:
            self.save_slot = frame.slot(8 * len(CALLER_SAVED_GP) + vec_bytes * (16 + isa.high_vec_regs))

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
        acc, value = x.src[0], x.src[1]
        red = x.arg
        if acc.lanes > 1 or value.lanes > 1:
            self.vec_update(x)
            return
        dt = acc.dtype
        if red is Ops.FMA:  # acc = fma(a, b, acc): a float accumulator on a CPU with FMA3 (lowering's rule)
            self.float_op(Ops.FMA, dt, [value, x.src[2], acc], self.T0)
            self.round_to(dt, self.T0)
            self.fdone(acc, self.T0)
            return
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
        if self.aligned:  # rsp rounded down to 64, the caller's kept in a slot for the epilogue
            self.frame_size = size
            self.op("MOV_R64_RM64", gp(RAX), gp(RSP))
            self.op("SUB_RM64_IMM32", gp(RSP), Imm(size))
            self.op("AND_RM64_IMM8", gp(RSP), Imm(-64))
            self.op("MOV_RM64_R64", self.slot(self.rsp_slot), gp(RAX))
        else:
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
        if self.aligned:
            self.op("MOV_R64_RM64", gp(RSP), self.slot(self.rsp_slot))
        elif self.frame_size:
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
