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
from polygrad.renderer.linearize import RangeDeps, top_level_reduces
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

    def alu(self, u: UOp, a: list[str]) -> str:
        op, dt = u.op, u.dtype
        sdt = u.src[0].dtype
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
    def signature(self, spec: ProgramSpec) -> str:
        params = []
        for g in spec.globals:
            const = "" if g.written else "const "
            params.append(f"{const}{self.storage_ctype(g.dtype)}* {self.restrict} data{g.slot}")
        params += self.var_params(spec)
        params += ["long long core_start", "long long core_end"]
        return f"void {spec.name}({', '.join(params)})"

    def var_params(self, spec: ProgramSpec) -> list[str]:
        """One integer parameter per symbolic-size Variable (spec.vars order, after the buffers); the IR's
        DEFINE_VAR renders as its name."""
        return [f"const {self.ctype(v.dtype)} {v.arg[0]}" for v in getattr(spec, "vars", ())]

    def render(self, spec: ProgramSpec) -> str:
        return _Emitter(self, spec).run()


def _flat_upcast(ranges: list[UOp], names) -> str:
    if not ranges:
        return "0"
    parts = names(ranges[0])
    for r in ranges[1:]:
        parts = f"({parts})*{r.src[0].arg}+{names(r)}"
    return parts


class _Emitter:
    def __init__(self, renderer: CStyleRenderer, spec: ProgramSpec):
        self.r, self.spec = renderer, spec
        self.lines: list[str] = []
        self.depth = 1
        self.scopes: list[dict[UOp, str]] = [{}]
        self.open: set[UOp] = set()
        self.deps = RangeDeps()
        self.count = 0

    def line(self, text: str) -> None:
        self.lines.append("  " * self.depth + text)

    def var(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def lookup(self, u: UOp) -> str | None:
        for scope in reversed(self.scopes):
            if u in scope:
                return scope[u]
        return None

    def range_name(self, r: UOp) -> str:
        kind = r.arg[1]
        return {"global": "gidx", "reduce": "ridx", "upcast": "uidx"}.get(kind, "idx") + str(r.arg[0])

    def open_loop(self, r: UOp, thread: bool = False) -> None:
        name = self.range_name(r)
        ct = self.r.ctype(r.dtype)  # int, or long long in kernels whose sizes exceed int32
        if thread:
            self.line(f"for ({ct} {name} = core_start; {name} < core_end; {name}++) {{")
        else:
            self.line(f"for ({ct} {name} = 0; {name} < {self.emit(r.src[0])}; {name}++) {{")
        self.depth += 1
        self.scopes.append({})
        self.open.add(r)

    def close_loop(self, r: UOp) -> None:
        self.depth -= 1
        self.scopes.pop()
        self.open.discard(r)
        self.line("}")

    def emit(self, u: UOp) -> str:
        hit = self.lookup(u)
        if hit is not None:
            return hit
        op = u.op
        if op is Ops.CONST:
            return self.r.literal(u)
        if op is Ops.RANGE:
            if u not in self.open:
                raise RuntimeError(f"range {self.range_name(u)} used outside its loop")
            return self.range_name(u)
        if op is Ops.DEFINE_GLOBAL:
            return f"data{u.arg[0]}"
        if op is Ops.DEFINE_VAR:
            return u.arg[0]
        if op is Ops.REDUCE:
            return self.emit_reduce(u)
        if op is Ops.LOAD:
            index = u.src[0]
            buf, idx = self.emit(index.src[0]), self.emit(index.src[1])
            expr = self.r.from_storage(u.dtype, f"{buf}[{idx}]")
            if len(index.src) > 2:
                expr = f"({self.emit(index.src[2])}?{expr}:0)"
            name = self.var("val")
            self.line(f"{self.r.ctype(u.dtype)} {name} = {expr};")
            self.scopes[-1][u] = name
            return name
        args = [self.emit(s) for s in u.src]
        expr = self.r.alu(u, args)
        if u.op not in (Ops.CAST, Ops.BITCAST):
            expr = self.r.round_half(u.dtype, expr)
        name = self.var("alu")
        self.line(f"{self.r.ctype(u.dtype)} {name} = {expr};")
        self.scopes[-1][u] = name
        return name

    def emit_reduce(self, red: UOp) -> str:
        body, ranges = red.src[0], list(red.src[1:])
        ups = sorted((r for r in self.deps(red) if r.arg[1] == "upcast" and r not in self.open),
                     key=lambda r: r.arg[0])
        n = math.prod(r.src[0].arg for r in ups)
        acc = self.var("acc")
        ct = self.r.ctype(red.dtype)
        init = self.r.literal(UOp.const(red.dtype, _identity(red.arg, red.dtype)))
        if ups:
            self.line(f"{ct} {acc}[{n}];")
            self.line(f"for (int i = 0; i < {n}; i++) {acc}[i] = {init};")
            ref = f"{acc}[{_flat_upcast(ups, self.range_name)}]"
        else:
            self.line(f"{ct} {acc} = {init};")
            ref = acc
        if any(r.arg[1] == "upcast" for r in ranges):
            # a reduce over upcast lanes (a split reduction's final sum): run the partial reduces
            # first, with one accumulator per lane, so their loops stay outside the lane loop
            for inner in top_level_reduces(body):
                self.emit(inner)
        for r in ranges:
            self.open_loop(r)
        for r in ups:
            self.open_loop(r)
        value = self.emit(body)
        combine = self.r.alu(UOp(red.arg, red.dtype, (red, red)), [ref, value])
        self.line(f"{ref} = {combine};")
        for r in reversed(ups):
            self.close_loop(r)
        for r in reversed(ranges):
            self.close_loop(r)
        self.scopes[-1][red] = ref
        return ref

    def emit_store(self, store: UOp) -> None:
        index, value = store.src
        v = self.emit(value)
        buf, idx = self.emit(index.src[0]), self.emit(index.src[1])
        if value.dtype != index.dtype:
            v = self.r.alu(UOp(Ops.CAST, index.dtype, (value,)), [v])
        self.line(f"{buf}[{idx}] = {self.r.to_storage(index.dtype, v)};")

    def emit_block(self, node: UOp) -> None:
        if node.op is Ops.STORE:
            self.emit_store(node)
            return
        if node.op is not Ops.END:
            raise RuntimeError(f"kernel body must be STORE or END, got {node.op.name}")
        inner, ranges = node.src[0], list(node.src[1:])
        loops = [r for r in ranges if r.arg[1] != "upcast"]
        ups = [r for r in ranges if r.arg[1] == "upcast"]
        for r in loops:
            self.open_loop(r, thread=r is self.spec.thread_range)
        if inner.op is Ops.STORE:
            for red in top_level_reduces(inner):
                self.emit(red)
        for r in ups:
            self.open_loop(r)
        self.emit_block(inner)
        for r in reversed(ups):
            self.close_loop(r)
        for r in reversed(loops):
            self.close_loop(r)

    def run(self) -> str:
        for node in self.spec.ast.src:
            self.emit_block(node)
        body = "\n".join(self.lines)
        prelude = self.r.prelude
        if self.r.emulate_half and any(n.dtype in HALF_TYPES for n in self.spec.ast.toposort()):
            prelude += HALF_HELPERS
        return f"{prelude}\n{self.r.signature(self.spec)} {{\n{body}\n}}\n"


def _identity(op: Ops, dt: DType):
    if op is Ops.ADD:
        return 0
    if op is Ops.MUL:
        return 1
    if op is Ops.MAX:
        return -math.inf if dt.is_float else (dtypes.min(dt) if dt is not dtypes.bool else False)
    raise NotImplementedError(f"no identity for reduce {op}")
