"""What this processor can run: cpuid and xgetbv, read by a few instructions of our own machine code.

Stage: device probe. Input: the host (`POLY_X86_ISA` may force a lower tier for testing). Output: an
`Isa`: the tier (`avx512`, `avx2` or `sse2`), its vector register width and count, and the extras used
(FMA, F16C). The minimum is x86-64 with SSE2 (every x86-64 processor); AVX2 needs AVX, AVX2 and FMA
with the OS saving the YMM state; AVX-512 needs F, BW, DQ and VL with the ZMM state saved.
"""
from __future__ import annotations

import os
import platform
import sys
from dataclasses import dataclass
from functools import lru_cache

from polygrad.backend_api import setting

TIERS = ("sse2", "avx2", "avx512")


@dataclass(frozen=True)
class Isa:
    tier: str          # "sse2" (scalar code), "avx2" (VEX, ymm) or "avx512" (EVEX, zmm)
    fma: bool          # FMA3 (vfmadd): the IR's FMA in one instruction, else libm fma
    features: tuple    # the cpuid feature names found, sorted (part of the code-cache key)

    @property
    def vex(self) -> bool:
        return self.tier != "sse2"

    @property
    def vec_bits(self) -> int:
        return {"sse2": 128, "avx2": 256, "avx512": 512}[self.tier]

    @property
    def vec_regs(self) -> int:
        """Vector registers the allocator may use: 0..11; 12..15 are scratch (VEX reaches only 16)."""
        return 12

    @property
    def high_vec_regs(self) -> int:
        """xmm/ymm/zmm16..31 (EVEX only, AVX-512 with VL): given to vector values of every width, so register
        tiles of 8-lane accumulators can grow past 12 as 16-lane ones do."""
        return 16 if self.tier == "avx512" else 0

    @property
    def lanes(self) -> int:
        """float32 lanes of a vector (1: the scalar tier declares no vectors)."""
        return {"sse2": 1, "avx2": 8, "avx512": 16}[self.tier]


def host_is_x86_64() -> str | None:
    """None when this is a 64-bit x86 process with a System V calling convention, else why not."""
    machine = platform.machine().lower()
    if machine not in ("x86_64", "amd64", "x64"):
        return f"this machine is {platform.machine() or 'unknown'}, not x86-64"
    if sys.maxsize < 2**32:
        return "this is a 32-bit Python; the X86 backend emits x86-64 code"
    if os.name == "nt":
        return "Windows uses another calling convention than the System V one the X86 backend emits"
    return None


def _cpuid_stub() -> bytes:
    """void f(int64_t *a): a[2..5] = cpuid(a[0], a[1]); a[6] = xgetbv(0) when OSXSAVE is set."""
    # the assembler (iced-x86) is imported when the stub is built, not at registration (which imports this module)
    from polygrad_backend_x86.asm import RAX, RBX, RCX, RDI, RDX, Assembler, Imm, Mem, gp
    a = Assembler()
    a.op("PUSH_R64", gp(RBX))
    a.op("MOV_R64_RM64", gp(RAX), Mem(RDI, disp=0))
    a.op("MOV_R64_RM64", gp(RCX), Mem(RDI, disp=8))
    a.op("CPUID")
    for k, r in enumerate((RAX, RBX, RCX, RDX)):
        a.op("MOV_RM32_R32", Mem(RDI, disp=16 + 8 * k), gp(r, 32))
    # xgetbv only where cpuid(1).ecx has OSXSAVE (bit 27); otherwise it faults
    a.op("MOV_RM64_IMM32", Mem(RDI, disp=48), Imm(0))
    done = a.label()
    a.op("CMP_RM64_IMM8", Mem(RDI, disp=0), Imm(1))
    a.jump("JNE", done)
    a.op("BT_RM32_IMM8", gp(RCX, 32), Imm(27))
    a.jump("JAE", done)
    a.op("XOR_R32_RM32", gp(RCX, 32), gp(RCX, 32))
    a.op("XGETBV")
    a.op("MOV_RM32_R32", Mem(RDI, disp=48), gp(RAX, 32))
    a.bind(done)
    a.op("POP_R64", gp(RBX))
    a.op("RETNQ")
    return a.encode()


@lru_cache(maxsize=None)
def features() -> tuple[str, ...]:
    """cpuid feature names this process can use (OS-enabled state checked for AVX and AVX-512)."""
    # imported when first asked (not by registration, which imports this module): mapping.py opens libc
    from polygrad_backend_x86.mapping import FFI, CodeMapping
    stub = CodeMapping(_cpuid_stub())

    def cpuid(leaf: int, sub: int = 0) -> tuple[int, int, int, int, int]:
        buf = FFI.new("int64_t[]", [leaf, sub, 0, 0, 0, 0, 0])
        stub.fn(buf)
        return tuple(int(buf[i]) & 0xFFFFFFFF for i in range(2, 7))  # type: ignore[return-value]

    top = cpuid(0)[0]
    _, _, ecx1, edx1, xcr0 = cpuid(1)
    found = set()
    for bit, name in ((26, "sse2"),):
        if edx1 >> bit & 1:
            found.add(name)
    for bit, name in ((0, "sse3"), (9, "ssse3"), (12, "fma"), (19, "sse4_1"), (20, "sse4_2"), (23, "popcnt"),
                      (28, "avx"), (29, "f16c")):
        if ecx1 >> bit & 1:
            found.add(name)
    ymm_ok = (xcr0 & 0b110) == 0b110
    zmm_ok = ymm_ok and (xcr0 & 0b11100000) == 0b11100000
    if top >= 7:
        _, ebx7, _, _, _ = cpuid(7, 0)
        for bit, name in ((3, "bmi1"), (5, "avx2"), (8, "bmi2"), (16, "avx512f"), (17, "avx512dq"), (30, "avx512bw"),
                          (31, "avx512vl")):
            if ebx7 >> bit & 1:
                found.add(name)
    if not ymm_ok:
        found -= {"avx", "avx2", "fma", "f16c"}
    if not zmm_ok:
        found -= {"avx512f", "avx512dq", "avx512bw", "avx512vl"}
    return tuple(sorted(found))


def choose_isa() -> Isa:
    """The best tier this CPU runs, or the one POLY_X86_ISA asks for (never above what the CPU has)."""
    feats = set(features())
    best = "sse2"
    if {"avx", "avx2", "fma"} <= feats:
        best = "avx2"
    if best == "avx2" and {"avx512f", "avx512dq", "avx512bw", "avx512vl"} <= feats:
        best = "avx512"
    forced = setting("POLY_X86_ISA")  # checked: one of TIERS, or "" (SettingError, a ValueError, if not)
    if forced:
        if TIERS.index(forced) < TIERS.index(best):
            best = forced
    return Isa(best, fma="fma" in feats and best != "sse2", features=tuple(sorted(feats)))
