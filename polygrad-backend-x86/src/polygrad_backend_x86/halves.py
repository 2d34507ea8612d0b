"""float16 and bfloat16 for the x86 emitter: values live as float32 and are rounded to their format.

Stage: x86 code generation (a mixin of emit.Emitter). The conversions are the C renderer's exact
routines (pg_f2h, pg_h2f, pg_f2b: round to nearest even, NaN kept quiet), emitted once per kernel as
subroutines (`call`): eax in, eax out, clobbering ecx, edx and the TS vector register, so every backend
rounds bit for bit alike.
"""
from __future__ import annotations

import math
import struct
from typing import Any

import numpy as np

from polygrad.backend_api import DType, dtypes

from polygrad_backend_x86.asm import RAX, RCX, RDX, Imm, gp

HALVES = (dtypes.float16, dtypes.bfloat16)


def round_half_value(v: float, dt: DType) -> float:
    """v rounded to float16 / bfloat16 (nearest even), as the C renderer writes its literals."""
    if math.isnan(v) or math.isinf(v):
        return v
    if dt is dtypes.float16:
        return float(np.float16(v))
    bits = struct.unpack("<I", struct.pack("<f", v))[0]
    bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return struct.unpack("<f", struct.pack("<I", bits & 0xFFFFFFFF))[0]


class HalfRoutines:
    """Emitter methods: call the conversion subroutines, and emit them after the kernel's code."""

    a: Any
    subs: dict

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
