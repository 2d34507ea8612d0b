"""Vector instructions: AVX2 (VEX, xmm/ymm) and AVX-512 (EVEX, zmm) code for instructions with lanes.

Stage: x86 code generation, last pass (the vector half of emit.py). Input and output as emit.py's.
A vector of n lanes of a 4-byte type (float32, int32, uint32; bool lanes are int32 masks 0 / -1,
as in the C renderer) is one register: xmm for 4 lanes, ymm for 8, zmm for 16. Contiguous loads and
stores are single unaligned moves, lane-gated ones single masked moves (AVX-512 write mask k1, AVX2
vmaskmovps: masked-off lanes are neither read nor written and cannot fault); gathers, scatters and
bool accesses go one lane at a time through a stack area. On zmm, comparisons write a mask register
(k1) that `vpmovm2d` widens to the int32 mask, and selects use `vpmovd2m` + `vblendmps`. Lane-wise
results are the scalar path's bit for bit (`tests/test_x86_backend.py` compares both). Anything else
(float64 or narrow-int lanes, integer division, unsigned comparisons without AVX-512, libm calls)
raises `VectorUnsupported` and the kernel is emitted from its scalar linearization.

iced-x86 names every encoding (`VEX_VADDPS_YMM_YMM_YMMM256`); `resolve` picks the one matching an
instruction's mnemonic and operands, preferring VEX and using EVEX where a zmm or mask register needs it.
"""
from __future__ import annotations

import re
import struct
from typing import Any

import iced_x86

from polygrad.backend_api import CompileError, DType, L, Ops, dtypes

from polygrad_backend_x86.asm import RAX, RCX, RDX, RSP, Imm, Mem, gp, vreg
from polygrad_backend_x86.emit import Emitter, VectorUnsupported
from polygrad_backend_x86.expand import XInst
from polygrad_backend_x86.regalloc import is_gp

FOUR = (dtypes.float32, dtypes.int32, dtypes.uint32, dtypes.bool)
WIDTH_NAME = {128: "XMM", 256: "YMM", 512: "ZMM"}


class VR:
    """A vector register operand of a given width."""

    __slots__ = ("n", "bits")

    def __init__(self, n: int, bits: int):
        self.n, self.bits = n, bits


class KR:
    """An AVX-512 mask register operand."""

    __slots__ = ("n",)

    def __init__(self, n: int):
        self.n = n


class GR:
    """A general-purpose register operand of a given width."""

    __slots__ = ("n", "bits")

    def __init__(self, n: int, bits: int = 32):
        self.n, self.bits = n, bits


_NAMES: dict[str, list[str]] = {}  # mnemonic -> iced Code names of its VEX/EVEX encodings
_INDEX: dict[str, list[tuple[str, tuple[str, ...], str]]] = {}  # mnemonic -> (prefix, operand tokens, name)
_RESOLVED: dict[tuple, str] = {}


def _encodings(mn: str) -> list[tuple[str, tuple[str, ...], str]]:
    """The VEX/EVEX encodings of mnemonic mn as (prefix, operand tokens, iced name). Names are grouped by
    mnemonic once (a split per name); tokens are parsed only for the mnemonics a kernel uses, so a first
    kernel in a fresh process does not pay for the 2,700 encodings it never needs."""
    hit = _INDEX.get(mn)
    if hit is not None:
        return hit
    if not _NAMES:
        for name in vars(iced_x86.Code):  # a module of constants: vars() spares dir()'s sort
            if name.startswith(("VEX_", "EVEX_")):
                _NAMES.setdefault(name.split("_", 2)[1], []).append(name)
    hit = _INDEX[mn] = []
    for name in _NAMES.get(mn, ()):
        parts = name.split("_")
        tokens = tuple(t[:-3] if t.endswith(("B32", "B64")) else t for t in parts[2:]
                       if t not in ("K1Z", "K1", "ER", "SAE"))
        hit.append((parts[0], tokens, name))
    return hit


def _fits(tok: str, o: Any) -> bool:
    if isinstance(o, VR):
        w = WIDTH_NAME[o.bits]
        return tok == w or (tok.startswith(w + "M") and tok[len(w) + 1:].isdigit())
    if isinstance(o, Mem):
        return re.fullmatch(r"(XMM|YMM|ZMM|R32|R64)?M\d+", tok) is not None
    if isinstance(o, GR):
        return tok in (f"R{o.bits}", f"RM{o.bits}")
    if isinstance(o, KR):
        return tok == "KR"
    if isinstance(o, Imm):
        return tok == "IMM8"
    return False


def resolve(mn: str, ops: tuple, masked: bool) -> str:
    """The iced Code name of mnemonic mn with these operands (VEX unless EVEX is needed)."""
    key = (mn, masked) + tuple((type(o).__name__, getattr(o, "bits", 0), isinstance(o, VR) and o.n >= 16) for o in ops)
    hit = _RESOLVED.get(key)
    if hit is not None:
        return hit
    need_evex = masked or any(isinstance(o, KR) or (isinstance(o, VR) and (o.bits == 512 or o.n >= 16)) for o in ops)
    for prefix in (("EVEX",) if need_evex else ("VEX", "EVEX")):
        for pre, tokens, name in _encodings(mn):
            if pre == prefix and len(tokens) == len(ops) and all(_fits(t, o) for t, o in zip(tokens, ops)):
                _RESOLVED[key] = name
                return name
    raise VectorUnsupported(f"no encoding of {mn} for {[type(o).__name__ for o in ops]}")


class VectorEmitter(Emitter):
    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.lane_slot = self.frame.slot(192)  # values, indices, gates of one lane-at-a-time access
        # where vop_low keeps the low scratch registers it borrows (only kernels with values in xmm/ymm16..31)
        self.low_save = self.frame.slot(4 * 32) if any(n >= 16 for n in self.frame.used_vec) else None

    # ---- operands
    def vop(self, mn: str, *ops: Any, mask: int | None = None) -> None:
        try:
            name = resolve(mn, ops, mask is not None)
        except VectorUnsupported:
            if not any(isinstance(o, VR) and o.n >= 16 and o.bits < 512 for o in ops):
                raise
            self.vop_low(mn, ops, mask)
            return
        conv = []
        for o in ops:
            if isinstance(o, VR):
                conv.append(vreg(o.n, o.bits))
            elif isinstance(o, GR):
                conv.append(gp(o.n, o.bits))
            elif isinstance(o, KR):
                conv.append(iced_x86.Register.K1 + o.n - 1)
            else:
                conv.append(o)
        self.a.op(name, *conv, mask=mask)

    def vop_low(self, mn: str, ops: tuple, mask: int | None) -> None:
        """An instruction with only a VEX form (vblendvps, vcmpps into a ymm, vpxor, ...) on a ymm/xmm16..31
        operand: those operands go through low scratch registers the instruction does not use (the first
        operand, the destination, is copied back). A borrowed scratch register may hold a value the caller
        still needs (a spilled result in T0), so it is kept in a stack slot around the instruction."""
        used = {o.n for o in ops if isinstance(o, VR)}
        spare = [n for n in (self.T0, self.T1, self.T2, self.TS) if n not in used]
        moved: dict[int, int] = {}
        for o in ops:
            if isinstance(o, VR) and o.n >= 16 and o.n not in moved:
                if not spare:
                    raise VectorUnsupported(f"{mn} on ymm16..31 with no spare scratch register")
                moved[o.n] = spare.pop(0)
        if self.low_save is None:
            raise CompileError("X86 backend: internal error, a high vector register in a kernel that uses none")
        low = tuple(VR(moved[o.n], o.bits) if isinstance(o, VR) and o.n in moved else o for o in ops)
        saves = [(VR(n, 256), Mem(RSP, disp=self.low_save + 32 * i)) for i, n in enumerate(moved.values())]
        for reg, mem in saves:
            self.vop("VMOVUPS", mem, reg)
        copied: set[int] = set()
        for o in ops:  # every moved operand is read first (the destination too: vfmadd and masked moves read it)
            if isinstance(o, VR) and o.n in moved and o.n not in copied:
                copied.add(o.n)
                self.vop("VMOVAPS", VR(moved[o.n], o.bits), o)
        self.vop(mn, *low, mask=mask)
        if isinstance(ops[0], VR) and ops[0].n in moved:
            self.vop("VMOVAPS", ops[0], low[0])
        for reg, mem in saves:
            self.vop("VMOVUPS", reg, mem)

    def width(self, x: XInst) -> int:
        for d in (x.dtype, *(s.dtype for s in x.src if s is not None and s.lanes > 1)):
            if d not in FOUR:
                raise VectorUnsupported(f"{d.name} lanes")
        bits = x.lanes * 32
        if bits not in WIDTH_NAME or (bits == 512 and self.isa.tier != "avx512"):
            raise VectorUnsupported(f"{x.lanes} lanes")
        return bits

    def vget(self, v: XInst, scratch: int, bits: int) -> VR:
        if v.alias is not None:
            v = v.alias
        if v.lanes == 1:
            raise VectorUnsupported("a scalar where lanes are expected")
        if v.loc[0] == "r":
            return VR(v.loc[1], bits)
        self.vop("VMOVUPS", VR(scratch, bits), self.slot(v.loc[1]))
        return VR(scratch, bits)

    def vdst(self, x: XInst, bits: int) -> VR:
        return VR(x.loc[1] if x.loc[0] == "r" else self.T0, bits)

    def vcopy(self, dst: VR, src: VR) -> None:
        if dst.n != src.n:
            self.vop("VMOVAPS", dst, src)

    def vfinish(self, x: XInst, r: VR) -> None:
        if x.loc[0] == "s":
            self.vop("VMOVUPS", self.slot(x.loc[1]), r)
        else:
            self.vcopy(VR(x.loc[1], r.bits), r)

    def vec_store_slot(self, x: XInst, reg: int) -> None:
        self.vop("VMOVUPS", self.slot(x.loc[1]), VR(reg, x.lanes * 32))

    def pool_vec(self, values: list, dt: DType) -> Mem:
        fmt = "f" if dt is dtypes.float32 else ("I" if dt is dtypes.uint32 else "i")
        if dt is dtypes.bool:
            values = [-1 if v else 0 for v in values]
        return self.a.const(struct.pack(f"<{len(values)}{fmt}", *values))

    def splat(self, value: Any, dt: DType, bits: int) -> Mem:
        return self.pool_vec([value] * (bits // 32), dt)

    def zero(self, r: VR) -> None:
        self.vop("VPXORD" if r.bits == 512 or r.n >= 16 else "VPXOR", r, r, r)

    def ones(self, r: VR) -> None:
        self.vop("VMOVUPS", r, self.splat(-1, dtypes.int32, r.bits))

    def logic(self, mn: str, r: VR, a: VR, b: Any) -> None:
        """Bitwise AND/ANDN/OR/XOR of whole registers (the EVEX D forms on zmm and on registers 16..31)."""
        evex = r.bits == 512 or any(isinstance(o, VR) and o.n >= 16 for o in (r, a, b))
        self.vop(f"VP{mn}D" if evex else f"VP{mn}", r, a, b)

    def fcmp(self, r: VR, a: VR, b: Any, pred: int) -> None:
        if r.bits == 512:
            self.vop("VCMPPS", KR(1), a, b, Imm(pred))
            self.vop("VPMOVM2D", r, KR(1))
        else:
            self.vop("VCMPPS", r, a, b, Imm(pred))

    def icmp(self, r: VR, a: VR, b: VR, kind: str, unsigned: bool) -> None:
        """r = mask of a <kind> b for int32 lanes (kind: EQ, NE, LT)."""
        if r.bits == 512:
            self.vop("VPCMPUD" if unsigned else "VPCMPD", KR(1), a, b, Imm({"EQ": 0, "LT": 1, "NE": 4}[kind]))
            self.vop("VPMOVM2D", r, KR(1))
            return
        if kind == "LT":
            if unsigned:
                raise VectorUnsupported("unsigned comparison lanes without AVX-512")
            self.vop("VPCMPGTD", r, b, a)
            return
        self.vop("VPCMPEQD", r, a, b)
        if kind == "NE":
            self.ones(VR(self.TS, r.bits))
            self.logic("XOR", r, r, VR(self.TS, r.bits))

    def select(self, r: VR, cond: VR, a: VR, b: VR) -> None:
        """r = cond ? a : b lane-wise (cond an int32 mask)."""
        if r.bits == 512:
            self.vop("VPMOVD2M", KR(1), cond)
            self.vop("VBLENDMPS", r, b, a, mask=1)
        else:
            self.vop("VBLENDVPS", r, b, a, cond)

    # ---- arithmetic
    def vec_alu(self, x: XInst) -> None:
        bits = self.width(x)
        op, dt = x.arg, x.dtype
        sdt = x.src[0].dtype
        r = self.vdst(x, bits)
        folded = [s for s in x.src if s.op is L.LOAD and s.arg[0] == "folded"]
        if folded:  # `vmulps r, a, [mem]{1to16}`: the broadcast load is the second operand
            other = x.src[1] if x.src[0] is folded[0] else x.src[0]
            mem = self.address(folded[0], RCX, RDX)
            mn = "VADDPS" if op is Ops.ADD else "VMULPS"
            if bits == 512:
                mem.bcst = True
                self.vop(mn, r, self.vget(other, self.T1, bits), mem)
            else:  # VEX has no embedded broadcast
                self.vop("VBROADCASTSS", VR(self.T2, bits), mem)
                self.vop(mn, r, self.vget(other, self.T1, bits), VR(self.T2, bits))
            self.vfinish(x, r)
            return
        srcs = [self.vget(s, (self.T1, self.T2, self.TS)[i], bits) for i, s in enumerate(x.src)]
        if op is Ops.CAST or op is Ops.BITCAST:
            self.vconvert(op, dt, sdt, r, srcs[0])
        elif op is Ops.WHERE:
            self.select(r, *srcs)
        else:
            self.vbinary(op, dt, sdt, r, srcs)
        self.vfinish(x, r)

    def vbinary(self, op: Ops, dt: DType, sdt: DType, r: VR, s: list[VR]) -> None:
        """r = op(s) lane-wise; r is no operand's register (TS is free when there are fewer than 3)."""
        helper = VR(self.TS, r.bits)
        if dt is dtypes.bool and sdt is dtypes.bool:
            if op in (Ops.ADD, Ops.OR, Ops.MAX):
                self.logic("OR", r, s[0], s[1])
            elif op in (Ops.MUL, Ops.AND):
                self.logic("AND", r, s[0], s[1])
            elif op in (Ops.XOR, Ops.CMPNE):
                self.logic("XOR", r, s[0], s[1])
            elif op is Ops.CMPEQ:
                self.logic("XOR", r, s[0], s[1])
                self.ones(helper)
                self.logic("XOR", r, r, helper)
            elif op is Ops.CMPLT:  # false < true: ~a & b
                self.logic("ANDN", r, s[0], s[1])
            elif op is Ops.NEG:
                self.ones(helper)
                self.logic("XOR", r, s[0], helper)
            else:
                raise VectorUnsupported(f"{op.name} on bool lanes")
            return
        if sdt is dtypes.float32:
            if op in (Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ):  # LT_OQ, NEQ_UQ (true for NaN, as C's !=), EQ_OQ
                self.fcmp(r, s[0], s[1], {Ops.CMPLT: 1, Ops.CMPNE: 4, Ops.CMPEQ: 0}[op])
            elif op in (Ops.ADD, Ops.MUL, Ops.FDIV):
                self.vop({Ops.ADD: "VADDPS", Ops.MUL: "VMULPS", Ops.FDIV: "VDIVPS"}[op], r, s[0], s[1])
            elif op is Ops.NEG:
                self.vop("VXORPS", r, s[0], self.splat(-(1 << 31), dtypes.int32, r.bits))
            elif op is Ops.MAX:  # vmaxps is a > b ? a : b; lanes where a is NaN keep a
                self.vop("VMAXPS", r, s[0], s[1])
                if r.bits == 512:
                    self.vop("VCMPPS", KR(1), s[0], s[0], Imm(3))
                    self.vop("VMOVAPS", r, s[0], mask=1)
                else:
                    self.vop("VCMPPS", helper, s[0], s[0], Imm(3))
                    self.vop("VBLENDVPS", r, r, s[0], helper)
            elif op is Ops.SQRT:
                self.vop("VSQRTPS", r, s[0])
            elif op is Ops.RECIPROCAL:
                self.vop("VMOVUPS", r, self.splat(1.0, dtypes.float32, r.bits))
                self.vop("VDIVPS", r, r, s[0])
            elif op is Ops.TRUNC:
                self.vop("VRNDSCALEPS" if r.bits == 512 else "VROUNDPS", r, s[0], Imm(3))
            elif op is Ops.FMA and self.isa.fma:
                self.vcopy(r, s[0])
                self.vop("VFMADD213PS", r, s[1], s[2])
            else:
                raise VectorUnsupported(f"{op.name} on float32 lanes")
            return
        unsigned = sdt is dtypes.uint32
        if op in (Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ):
            self.icmp(r, s[0], s[1], {Ops.CMPLT: "LT", Ops.CMPNE: "NE", Ops.CMPEQ: "EQ"}[op], unsigned)
        elif op in (Ops.ADD, Ops.MUL):
            self.vop("VPADDD" if op is Ops.ADD else "VPMULLD", r, s[0], s[1])
        elif op in (Ops.AND, Ops.OR, Ops.XOR):
            self.logic(op.name, r, s[0], s[1])
        elif op is Ops.NEG:
            self.zero(helper)
            self.vop("VPSUBD", r, helper, s[0])
        elif op is Ops.SHL:
            self.vop("VPSLLVD", r, s[0], s[1])
        elif op is Ops.SHR:
            self.vop("VPSRLVD" if unsigned else "VPSRAVD", r, s[0], s[1])
        elif op is Ops.MAX:
            self.vop("VPMAXUD" if unsigned else "VPMAXSD", r, s[0], s[1])
        elif op is Ops.FMA:
            self.vop("VPMULLD", r, s[0], s[1])
            self.vop("VPADDD", r, r, s[2])
        elif op is Ops.TRUNC:
            self.vcopy(r, s[0])
        else:
            raise VectorUnsupported(f"{op.name} on {dt.name} lanes")

    def vconvert(self, op: Ops, dt: DType, sdt: DType, r: VR, a: VR) -> None:
        helper = VR(self.TS, r.bits)
        if op is Ops.BITCAST or dt is sdt or {dt, sdt} == {dtypes.int32, dtypes.uint32}:
            self.vcopy(r, a)
        elif dt is dtypes.bool:
            self.zero(helper)
            if sdt is dtypes.float32:
                self.fcmp(r, a, helper, 4)
            else:
                self.icmp(r, a, helper, "NE", False)
        elif sdt is dtypes.bool:
            if dt is dtypes.float32:
                self.vop("VANDPS", r, a, self.splat(1.0, dtypes.float32, r.bits))
            else:
                self.vop("VPSRLD", r, a, Imm(31))
        elif dt is dtypes.int32 and sdt is dtypes.float32:
            self.vop("VCVTTPS2DQ", r, a)
        elif dt is dtypes.float32 and sdt is dtypes.int32:
            self.vop("VCVTDQ2PS", r, a)
        else:
            raise VectorUnsupported(f"CAST lanes {sdt.name} -> {dt.name}")

    # ---- values
    def vec_bcast(self, x: XInst) -> None:
        bits = self.width(x)
        s, dt = x.src[0], x.dtype
        r = self.vdst(x, bits)
        if s.is_const:
            v = s.arg if dt is not dtypes.bool else (-1 if s.arg else 0)
            self.vop("VBROADCASTSS", r, self.pool_vec([v], dt))
        elif not is_gp(s):
            src = s.alias or s
            self.vop("VBROADCASTSS", r, VR(src.loc[1], 128) if src.loc[0] == "r" else self.slot(src.loc[1]))
        else:
            self.gmov(RAX, s)
            if dt is dtypes.bool:
                self.op("NEG_RM32", gp(RAX, 32))
            self.movd_to_x(self.T0, RAX)  # a VEX move: through a low scratch register (r may be zmm16..31)
            self.vop("VPBROADCASTD", r, VR(self.T0, 128))
        self.vfinish(x, r)

    def vec_const(self, x: XInst) -> None:
        bits = self.width(x)
        r = self.vdst(x, bits)
        self.vop("VMOVUPS", r, self.pool_vec(list(x.arg), x.dtype))
        self.vfinish(x, r)

    def vec_copy_into(self, x: XInst, init: XInst) -> None:
        bits = self.width(x)
        r = self.vdst(x, bits)
        self.vcopy(r, self.vget(init, self.T1, bits))
        self.vfinish(x, r)

    # ---- memory
    def vec_load(self, x: XInst) -> None:
        bits = self.width(x)
        gate = x.src[2] if len(x.src) > 2 else None
        r = self.vdst(x, bits)
        if x.arg[0] == "broadcast":  # one element in every lane
            self.vop("VBROADCASTSS", r, self.address(x, RCX, RDX))
        elif x.arg[0] == "contiguous" and (gate is None or gate.lanes == 1):
            skip = None
            if gate is not None:
                self.zero(r)
                skip = self.gate_jump(gate)
            mem = self.address(x, RCX, RDX)
            if x.dtype is dtypes.bool:  # bytes 0/1 -> int32 masks 0/-1
                self.vop("VPMOVZXBD", r, mem)
                self.zero(VR(self.TS, bits))
                self.vop("VPSUBD", r, VR(self.TS, bits), r)
            else:
                self.vop("VMOVUPS", r, mem)
            if skip is not None:
                self.a.bind(skip)
        elif x.arg[0] == "contiguous" and self.isa.tier == "avx512" and x.dtype is not dtypes.bool:
            # lane-gated (a padded row's edge): one masked move; masked-off lanes read nothing (no fault)
            # and keep the zeros
            self.vop("VPMOVD2M", KR(1), self.vget(gate, self.T2, bits))
            self.zero(r)
            self.vop("VMOVUPS", r, self.address(x, RCX, RDX), mask=1)
        elif x.arg[0] == "contiguous" and x.dtype is not dtypes.bool:
            # AVX2: vmaskmovps reads the lanes whose mask sign bit is set (the int32 masks are 0 / -1),
            # zeroes the others and never faults on them
            self.vop("VMASKMOVPS", r, self.vget(gate, self.T2, bits), self.address(x, RCX, RDX))
        elif x.arg[0] in ("gather", "contiguous"):
            self.lanes_access(x, bits, None)
            self.vop("VMOVUPS", r, self.slot(self.lane_slot))
        else:
            raise CompileError(f"X86 backend: no code for a vector load of kind {x.arg[0]!r}")
        self.vfinish(x, r)

    def vec_store(self, x: XInst) -> None:
        value = x.src[2]
        bits = self.width(value) if value.lanes > 1 else x.lanes * 32
        gate = x.src[3] if len(x.src) > 3 else None
        if x.arg[0] == "contiguous" and gate is None and value.dtype is not dtypes.bool:
            v = self.vget(value, self.T1, bits)
            self.vop("VMOVUPS", self.address(x, RCX, RDX), v)
            return
        if x.arg[0] == "contiguous" and gate is not None and gate.lanes > 1 and value.dtype is not dtypes.bool \
                and value.lanes > 1:
            # lane-gated (a padded range's last vector): one masked move that writes only the lanes
            # whose gate is on (AVX-512 write mask k1; AVX2 vmaskmovps by the masks' sign bits)
            g = self.vget(gate, self.T2, bits)
            v = self.vget(value, self.T1, bits)
            if self.isa.tier == "avx512":
                self.vop("VPMOVD2M", KR(1), g)
                self.vop("VMOVUPS", self.address(x, RCX, RDX), v, mask=1)
            else:
                self.vop("VMASKMOVPS", self.address(x, RCX, RDX), g, v)
            return
        if x.arg[0] not in ("scatter", "contiguous"):
            raise CompileError(f"X86 backend: no code for a vector store of kind {x.arg[0]!r}")
        self.lanes_access(x, bits, value)

    def lanes_access(self, x: XInst, bits: int, value: XInst | None) -> None:
        """A gather, scatter, lane-gated or bool access one lane at a time through the stack (lanes in order).
        Loads leave the lanes at lane_slot (0 where the gate is off); stores read them from there."""
        n = bits // 32
        vals, idxs, gates = self.lane_slot, self.lane_slot + 64, self.lane_slot + 128
        idx = x.src[1]
        gate = x.src[3 if value is not None else 2] if len(x.src) > (3 if value is not None else 2) else None
        dt = x.src[0].dtype
        if dt not in FOUR:
            raise VectorUnsupported(f"{dt.name} lanes in memory")
        if value is not None:
            self.vop("VMOVUPS", self.slot(vals), self.vget(value, self.T1, bits))
        else:
            self.zero(VR(self.T1, bits))
            self.vop("VMOVUPS", self.slot(vals), VR(self.T1, bits))
        gather = x.arg[0] != "contiguous"
        if gather:
            if idx.dtype not in (dtypes.int32, dtypes.uint32):
                raise VectorUnsupported("64-bit gather indices")
            self.vop("VMOVUPS", self.slot(idxs), self.vget(idx, self.T1, bits))
        if gate is not None and gate.lanes > 1:
            self.vop("VMOVUPS", self.slot(gates), self.vget(gate, self.T1, bits))
        elif gate is not None:
            raise VectorUnsupported("a scalar gate on a lane-wise access")
        base = self.gload(x.src[0], RCX)
        size = dt.itemsize
        disp = x.arg[1]
        contiguous_index = None if gather or idx is None else self.gload(idx, RDX)
        for k in range(n):
            skip = None
            if gate is not None:
                skip = self.a.label()
                self.op("CMP_RM32_IMM8", Mem(RSP, disp=gates + 4 * k), Imm(0))
                self.a.jump("JE", skip)
            if gather:
                self.op("MOVSXD_R64_RM32", gp(RDX), Mem(RSP, disp=idxs + 4 * k))
                mem = Mem(base, RDX, size, disp * size)
            elif contiguous_index is None:
                mem = Mem(base, disp=(disp + k) * size)
            else:
                mem = Mem(base, contiguous_index, size, (disp + k) * size)
            lane = Mem(RSP, disp=vals + 4 * k)
            if value is None:
                if dt is dtypes.bool:
                    self.op("MOVZX_R32_RM8", gp(RAX, 32), mem)
                    self.op("NEG_RM32", gp(RAX, 32))
                else:
                    self.op("MOV_R32_RM32", gp(RAX, 32), mem)
                self.op("MOV_RM32_R32", lane, gp(RAX, 32))
            else:
                self.op("MOV_R32_RM32", gp(RAX, 32), lane)
                if dt is dtypes.bool:
                    self.op("AND_RM32_IMM8", gp(RAX, 32), Imm(1))
                    self.op("MOV_RM8_R8", mem, gp(RAX, 8))
                else:
                    self.op("MOV_RM32_R32", mem, gp(RAX, 32))
            if skip is not None:
                self.a.bind(skip)

    # ---- accumulators
    def vec_update(self, x: XInst) -> None:
        acc, value = x.src[0], x.src[1]
        red = x.arg
        if red is Ops.FMA:  # acc = fma(a, b, acc) lane-wise: one vfmadd231ps into a register accumulator
            if acc.lanes != value.lanes or acc.lanes != x.src[2].lanes or acc.dtype is not dtypes.float32 \
                    or not self.isa.fma:
                raise VectorUnsupported("an FMA update whose operands and accumulator differ in lanes")
            bits = self.width(acc)
            a, b = self.vget(value, self.T1, bits), self.vget(x.src[2], self.T2, bits)
            r = self.vget(acc, self.T0, bits)  # its register, or its stack slot loaded into T0
            self.vop("VFMADD231PS", r, a, b)
            self.vfinish(acc, r)  # back to the slot (a copy onto itself is no instruction)
            return
        if acc.lanes > 1:
            bits = self.width(acc)
            v = self.vget(value, self.T1, bits)
            if acc.loc[0] == "r" and red in (Ops.ADD, Ops.MUL) and acc.dtype is not dtypes.bool:
                mn = {(True, Ops.ADD): "VADDPS", (True, Ops.MUL): "VMULPS", (False, Ops.ADD): "VPADDD",
                      (False, Ops.MUL): "VPMULLD"}[(acc.dtype is dtypes.float32, red)]
                self.vop(mn, VR(acc.loc[1], bits), VR(acc.loc[1], bits), v)
                return
            a = self.vget(acc, self.T2, bits)
            self.vbinary(red, acc.dtype, acc.dtype, VR(self.T0, bits), [a, v])
            self.vfinish(acc, VR(self.T0, bits))
            return
        # the lanes fold into a scalar accumulator in order 0..n-1 (the final sum of a split reduction)
        bits = self.width(value)
        self.vop("VMOVUPS", self.slot(self.lane_slot), self.vget(value, self.T1, bits))
        dt = acc.dtype
        lanes = [Mem(RSP, disp=self.lane_slot + 4 * k) for k in range(bits // 32)]
        if dt is dtypes.float32:
            a = self.fload(acc, self.T1)
            for m in lanes:
                if red is Ops.MAX:
                    self.fmax(dt, self.T0, a, m)
                    self.fcopy(a, self.T0)
                else:
                    self.fbin("ADD" if red is Ops.ADD else "MUL", dt, a, a, m)
            self.fdone(acc, a)
            return
        self.gmov(RAX, acc)
        for m in lanes:
            if dt is dtypes.bool:
                self.op("MOV_R32_RM32", gp(RCX, 32), m)
                self.op("AND_RM32_IMM8", gp(RCX, 32), Imm(1))
                self.op("OR_R64_RM64" if red in (Ops.ADD, Ops.MAX) else "AND_R64_RM64", gp(RAX), gp(RCX))
                continue
            self.load_extended(RCX, dt, m)
            if red is Ops.MAX:
                self.op("CMP_R64_RM64", gp(RAX), gp(RCX))
                self.op("CMOVB_R64_RM64" if dt.is_unsigned else "CMOVL_R64_RM64", gp(RAX), gp(RCX))
            else:
                self.op("ADD_R64_RM64" if red is Ops.ADD else "IMUL_R64_RM64", gp(RAX), gp(RCX))
                self.normalize(RAX, dt)
        self.gdone(acc, RAX)
