"""The C-family renderer base: kernel IR -> C source. CUDA and other C dialects subclass it.

Stage: rendering. Input: ProgramSpec. Output: source text with one function named spec.name.
Loops: global ranges outermost (the thread range split by [core_start, core_end)), then each
reduce with its accumulator (an array when it depends on upcast ranges, so the upcast loops sit
inside the reduce loop and vectorise), then upcast loops around the store.
"""
from __future__ import annotations

import math

import numpy as np

from polygrad.dtype import DType, dtypes
from polygrad.engine.program import ProgramSpec
from polygrad.renderer.linearize import Inst, L, LinearProgram, linearize
from polygrad.uop.ops import Ops, UOp

C_TYPES = {
    dtypes.bool: "_Bool", dtypes.int8: "signed char", dtypes.uint8: "unsigned char", dtypes.int16: "short",
    dtypes.uint16: "unsigned short", dtypes.int32: "int", dtypes.uint32: "unsigned int",
    dtypes.int64: "long long", dtypes.uint64: "unsigned long long", dtypes.float32: "float",
    dtypes.float64: "double", dtypes.float16: "_Float16", dtypes.bfloat16: "__bf16",
}
HALF_TYPES = (dtypes.float16, dtypes.bfloat16)
# Half and bfloat16 are stored as uint16 bits and computed in float: many C compilers (clang 14 on
# x86) have no arithmetic on _Float16/__bf16. Conversions round to nearest even, as hardware does.
HALF_HELPERS = """
static inline float pg_h2f(unsigned short h) {
  union { unsigned int u; float f; } o, magic;
  magic.u = 113u << 23;
  o.u = (unsigned int)(h & 0x7fffu) << 13;
  unsigned int e = o.u & (0x7c00u << 13);
  o.u += (127u - 15u) << 23;
  if (e == (0x7c00u << 13)) o.u += (128u - 16u) << 23;
  else if (e == 0) { o.u += 1u << 23; o.f -= magic.f; }
  o.u |= (unsigned int)(h & 0x8000u) << 16;
  return o.f;
}
static inline unsigned short pg_f2h(float x) {
  union { float f; unsigned int u; } f, magic;
  f.f = x;
  magic.u = 126u << 23;
  unsigned int sign = f.u & 0x80000000u;
  unsigned short o;
  f.u ^= sign;
  if (f.u >= (143u << 23)) o = (f.u > (255u << 23)) ? 0x7e00 : 0x7c00;
  else if (f.u < (113u << 23)) { f.f += magic.f; o = (unsigned short)(f.u - magic.u); }
  else { unsigned int odd = (f.u >> 13) & 1u; f.u += 0xc8000fffu + odd; o = (unsigned short)(f.u >> 13); }
  return (unsigned short)(o | (sign >> 16));
}
static inline float pg_b2f(unsigned short h) {
  union { unsigned int u; float f; } o;
  o.u = (unsigned int)h << 16;
  return o.f;
}
static inline unsigned short pg_f2b(float x) {
  union { float f; unsigned int u; } f;
  f.f = x;
  if ((f.u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((f.u >> 16) | 0x40u);
  return (unsigned short)((f.u + 0x7fffu + ((f.u >> 16) & 1u)) >> 16);
}
static inline float pg_rh(float x) { return pg_h2f(pg_f2h(x)); }
static inline float pg_rb(float x) { return pg_b2f(pg_f2b(x)); }
"""


def round_half_value(value: float, dt: DType) -> float:
    """A Python float rounded to float16/bfloat16 precision (round to nearest even)."""
    if dt is dtypes.float16:
        return float(np.float16(value))
    bits = int(np.array(value, dtype=np.float32).view(np.uint32))
    if math.isnan(value):
        return value
    bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return float(np.array(bits & 0xFFFFFFFF, dtype=np.uint32).view(np.float32))


class CStyleRenderer:
    """Subclasses change the prelude, the function signature and how global loops are opened."""

    prelude = "#include <math.h>\n#include <stdint.h>\n"
    types = C_TYPES
    restrict = "restrict"
    emulate_half = True  # False where the compiler has native half/bfloat16 arithmetic

    def ctype(self, dt: DType) -> str:
        """The C type of a value of dtype dt (half/bfloat16 values live in float when emulated)."""
        if self.emulate_half and dt in HALF_TYPES:
            return "float"
        return self.types[dt]

    def storage_ctype(self, dt: DType) -> str:
        """The C element type of a buffer of dtype dt."""
        if self.emulate_half and dt in HALF_TYPES:
            return "unsigned short"
        return self.types[dt]

    def from_storage(self, dt: DType, expr: str) -> str:
        if self.emulate_half and dt in HALF_TYPES:
            return f"pg_{'h' if dt is dtypes.float16 else 'b'}2f({expr})"
        return expr

    def to_storage(self, dt: DType, expr: str) -> str:
        if self.emulate_half and dt in HALF_TYPES:
            return f"pg_f2{'h' if dt is dtypes.float16 else 'b'}({expr})"
        return expr

    def round_half(self, dt: DType, expr: str) -> str:
        """Round a float expression to dt's precision (identity unless dt is an emulated half type)."""
        if self.emulate_half and dt in HALF_TYPES:
            return f"pg_r{'h' if dt is dtypes.float16 else 'b'}({expr})"
        return expr

    # ---- literals and expressions
    def literal(self, u: UOp) -> str:
        v, dt = u.arg, u.dtype
        if dt is dtypes.bool:
            return "1" if v else "0"
        if dt.is_float:
            if math.isnan(v):
                return f"(({self.ctype(dt)})NAN)"
            if math.isinf(v):
                return f"(({self.ctype(dt)}){'-' if v < 0 else ''}INFINITY)"
            if self.emulate_half and dt in HALF_TYPES:
                return repr(round_half_value(float(v), dt)) + "f"
            text = repr(float(v))
            if dt is dtypes.float32:
                return text + "f"
            return text if dt is dtypes.float64 else f"(({self.ctype(dt)}){text}f)"
        if dt in (dtypes.int64,):
            return f"{int(v)}LL"
        if dt in (dtypes.uint64,):
            return f"{int(v)}ULL"
        if dt in (dtypes.uint32,):
            return f"{int(v)}u"
        if dt is dtypes.int32 and v == -(2**31):
            return "(-2147483647-1)"
        return f"(({self.ctype(dt)}){int(v)})" if dt.itemsize < 4 else str(int(v))

    def math_fn(self, name: str, dt: DType) -> str:
        return name + ("f" if dt is not dtypes.float64 else "")

    def alu(self, op: Ops, dt: DType, sdt: DType, a: list[str]) -> str:
        """C for op on operand expressions a; dt is the result dtype, sdt the first operand's."""
        if op is Ops.ADD:
            return f"({a[0]}+{a[1]})"
        if op is Ops.MUL:
            return f"({a[0]}*{a[1]})"
        if op is Ops.NEG:
            return f"(!{a[0]})" if dt is dtypes.bool else f"(-{a[0]})"
        if op is Ops.FDIV:
            return f"({a[0]}/{a[1]})"
        if op is Ops.IDIV:
            return f"({a[0]}/{a[1]})"
        if op is Ops.MOD:
            return f"{self.math_fn('fmod', dt)}({a[0]},{a[1]})" if dt.is_float else f"({a[0]}%{a[1]})"
        if op is Ops.MAX:
            if dt.is_float:
                return f"(({a[0]}!={a[0]}||{a[0]}>{a[1]})?{a[0]}:{a[1]})"
            return f"(({a[0]}>{a[1]})?{a[0]}:{a[1]})"
        if op is Ops.CMPLT:
            return f"({a[0]}<{a[1]})"
        if op is Ops.CMPNE:
            return f"({a[0]}!={a[1]})"
        if op is Ops.CMPEQ:
            return f"({a[0]}=={a[1]})"
        if op is Ops.AND:
            return f"({a[0]}&{a[1]})"
        if op is Ops.OR:
            return f"({a[0]}|{a[1]})"
        if op is Ops.XOR:
            return f"({a[0]}^{a[1]})"
        if op is Ops.SHL:
            return f"({a[0]}<<{a[1]})"
        if op is Ops.SHR:
            return f"({a[0]}>>{a[1]})"
        if op is Ops.WHERE:
            return f"({a[0]}?{a[1]}:{a[2]})"
        if op is Ops.FMA:  # one rounding: libm's fma is correctly rounded (a single instruction with FMA hardware)
            return f"{self.math_fn('fma', dt)}({a[0]},{a[1]},{a[2]})" if dt.is_float else f"({a[0]}*{a[1]}+{a[2]})"
        if op is Ops.EXP2:
            return f"{self.math_fn('exp2', dt)}({a[0]})"
        if op is Ops.LOG2:
            return f"{self.math_fn('log2', dt)}({a[0]})"
        if op is Ops.SIN:
            return f"{self.math_fn('sin', dt)}({a[0]})"
        if op is Ops.SQRT:
            return f"{self.math_fn('sqrt', dt)}({a[0]})"
        if op is Ops.TRUNC:
            return f"{self.math_fn('trunc', dt)}({a[0]})" if dt.is_float else a[0]
        if op is Ops.POW:
            return f"{self.math_fn('pow', dt)}({a[0]},{a[1]})"
        if op is Ops.RECIPROCAL:
            return f"(({self.ctype(dt)})1/{a[0]})"
        if op is Ops.CAST:
            if dt is dtypes.bool:
                return f"({a[0]}!=0)"
            return self.round_half(dt, f"(({self.ctype(dt)})({a[0]}))")
        if op is Ops.BITCAST:
            src = self.to_storage(sdt, a[0])
            bits = f"({{union {{{self.storage_ctype(sdt)} i; {self.storage_ctype(dt)} o;}} u_; u_.i = {src}; u_.o;}})"
            return self.from_storage(dt, bits)
        raise NotImplementedError(f"C renderer has no rule for {op.name}")

    # ---- structure
    def signature(self, prog: LinearProgram) -> str:
        params = []
        for p in prog.params:
            const = "" if p.arg[1] else "const "
            params.append(f"{const}{self.storage_ctype(p.dtype)}* {self.restrict} data{p.arg[0]}")
        params += [f"const {self.ctype(v.dtype)} {v.arg[0]}" for v in prog.vars]
        if prog.threads > 1:
            params.append("int tid")
        return f"void {prog.name}({', '.join(params)})"

    def render(self, spec: ProgramSpec) -> str:
        return self.render_program(linearize(spec), spec)

    def render_program(self, prog: LinearProgram, spec: ProgramSpec | None = None) -> str:
        """C source for a linearized kernel: one statement per instruction, in order."""
        names: dict[int, str] = {}
        lines: list[str] = []
        depth = 1
        uses_half = False
        loop_names = {"global": "gidx", "reduce": "ridx", "upcast": "uidx", "thread": "gidx"}

        def n(x: Inst) -> str:
            return names[id(x)]

        for i, x in enumerate(prog.insts):
            op, dt = x.op, x.dtype
            if dt in HALF_TYPES:
                uses_half = True
            pad = "  " * depth
            if op is L.PARAM:
                names[id(x)] = f"data{x.arg[0]}"
            elif op is L.VAR:
                names[id(x)] = x.arg[0]
            elif op is L.SPECIAL:
                names[id(x)] = "tid"
            elif op is L.CONST:
                names[id(x)] = self.literal(UOp.const(dt, x.arg))
            elif op is L.LOOP:
                name = names[id(x)] = f"{loop_names.get(x.arg[1], 'idx')}{x.arg[0]}"
                start, end = x.src
                lines.append(f"{pad}for ({self.ctype(dt)} {name} = {n(start)}; {name} < {n(end)}; {name}++) {{")
                depth += 1
            elif op in (L.ENDLOOP, L.ENDIF):
                depth -= 1
                lines.append("  " * depth + "}")
            elif op is L.IF:
                lines.append(f"{pad}if ({n(x.src[0])}) {{")
                depth += 1
            elif op is L.ACC:
                name = names[id(x)] = f"acc{i}"
                red_op, lanes = x.arg
                ct, init = self.ctype(dt), n(x.src[0])
                if lanes > 1:
                    lines.append(f"{pad}{ct} {name}[{lanes}];")
                    lines.append(f"{pad}for (int i = 0; i < {lanes}; i++) {name}[i] = {init};")
                else:
                    lines.append(f"{pad}{ct} {name} = {init};")
            elif op is L.UPDATE:
                acc, value = x.src[0], x.src[1]
                ref = f"{n(acc)}[{n(x.src[2])}]" if len(x.src) > 2 else n(acc)
                lines.append(f"{pad}{ref} = {self.alu(x.arg, acc.dtype, acc.dtype, [ref, n(value)])};")
            elif op is L.ACC_READ:
                acc = x.src[0]
                names[id(x)] = f"{n(acc)}[{n(x.src[1])}]" if len(x.src) > 1 else n(acc)
            elif op is L.LOAD:
                expr = self.from_storage(dt, f"{n(x.src[0])}[{n(x.src[1])}]")
                if len(x.src) > 2:
                    expr = f"({n(x.src[2])}?{expr}:0)"
                name = names[id(x)] = f"val{i}"
                lines.append(f"{pad}{self.ctype(dt)} {name} = {expr};")
            elif op is L.STORE:
                buf, idx, value = x.src
                lines.append(f"{pad}{n(buf)}[{n(idx)}] = {self.to_storage(buf.dtype, n(value))};")
            elif op is L.ALU:
                sdt = x.src[0].dtype if x.src else dt
                expr = self.alu(x.arg, dt, sdt, [n(s) for s in x.src])
                if x.arg not in (Ops.CAST, Ops.BITCAST):
                    expr = self.round_half(dt, expr)
                name = names[id(x)] = f"alu{i}"
                lines.append(f"{pad}{self.ctype(dt)} {name} = {expr};")
            else:
                raise NotImplementedError(f"C renderer has no rule for {op.name}")
        prelude = self.prelude + (HALF_HELPERS if self.emulate_half and uses_half else "")
        body = "\n".join(lines)
        return f"{prelude}\n{self.signature(prog)} {{\n{body}\n}}\n"
