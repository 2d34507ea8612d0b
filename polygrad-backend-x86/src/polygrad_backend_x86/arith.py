"""Scalar arithmetic of the x86 emitter: integer and float ops, comparisons, selects, conversions, libm calls.

Stage: x86 code generation (a mixin of emit.Emitter). Input: one ALU instruction with allocated
operands. Output: its instructions. Integers are 64-bit registers holding the value extended from its
width; results that can leave the type's range are extended again (wrapping as C stores them). Floats
are xmm scalars (float16/bfloat16 as float32, rounded by halves.HalfRoutines after each op).
Division guards a zero divisor and INT64_MIN // -1; MAX keeps a NaN from either side; float-to-int
truncates as clang compiles C; fmod, pow and (without FMA3) fma call libm with the live
caller-saved registers saved around the call.
"""
from __future__ import annotations

import struct
from typing import Any

from polygrad.backend_api import CompileError, DType, Ops, dtypes

from polygrad_backend_x86.asm import RAX, RCX, RDX, Imm, Mem, gp, vreg
from polygrad_backend_x86.expand import XInst
from polygrad_backend_x86.halves import HALVES
from polygrad_backend_x86.regalloc import is_gp

CALLER_SAVED_GP = (6, 7, 8, 9, 10, 11)  # rsi rdi r8-r11 (rax rcx rdx are scratch)
SIZE_BITS = {1: 8, 2: 16, 4: 32, 8: 64}


class VectorUnsupported(Exception):
    """A vector instruction this emitter has no code for: the kernel is emitted again with scalar lanes."""


class ScalarArithmetic:
    """Emitter methods for scalar ALU instructions (they use the location helpers of emit.Emitter)."""

    a: Any
    isa: Any

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
        done = self.a.label()
        self.fbin("MAX", dt, r, a, b)
        self.ucomi(dt, a, a)
        self.a.jump("JNP", done)  # a is a number: maxss was right
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
        self.fcopy(r, self.fload(b, self.T1))
        done = self.gate_jump(cond)
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
