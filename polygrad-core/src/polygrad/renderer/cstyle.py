"""The C-family renderer base: kernel IR -> C source. CUDA and other C dialects subclass it.

Stage: rendering. Input: ProgramSpec. Output: source text with one function named spec.name.
Loops: global ranges outermost (the thread range split by [core_start, core_end)), then each
reduce with its accumulator (an array when it depends on upcast ranges, so the upcast loops sit
inside the reduce loop and vectorise), then upcast loops around the store.
"""
from __future__ import annotations

import math

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


class CStyleRenderer:
    """Subclasses change the prelude, the function signature and how global loops are opened."""

    prelude = "#include <math.h>\n#include <stdint.h>\n"
    types = C_TYPES
    restrict = "restrict"

    def ctype(self, dt: DType) -> str:
        return self.types[dt]

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
            text = repr(float(v))
            return text + "f" if dt is dtypes.float32 else (text if dt is dtypes.float64 else f"(({self.ctype(dt)}){text}f)")
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
            return f"(({self.ctype(dt)})({a[0]}))"
        if op is Ops.BITCAST:
            return (f"({{union {{{self.ctype(sdt)} i; {self.ctype(dt)} o;}} u_; u_.i = {a[0]}; u_.o;}})")
        raise NotImplementedError(f"C renderer has no rule for {op.name}")

    # ---- structure
    def signature(self, spec: ProgramSpec) -> str:
        params = []
        for g in spec.globals:
            const = "" if g.written else "const "
            params.append(f"{const}{self.ctype(g.dtype)}* {self.restrict} data{g.slot}")
        params += ["int core_start", "int core_end"]
        return f"void {spec.name}({', '.join(params)})"

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
        if thread:
            self.line(f"for (int {name} = core_start; {name} < core_end; {name}++) {{")
        else:
            self.line(f"for (int {name} = 0; {name} < {self.emit(r.src[0])}; {name}++) {{")
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
            expr = f"{buf}[{idx}]"
            if len(index.src) > 2:
                expr = f"({self.emit(index.src[2])}?{expr}:0)"
            name = self.var("val")
            self.line(f"{self.r.ctype(u.dtype)} {name} = {expr};")
            self.scopes[-1][u] = name
            return name
        args = [self.emit(s) for s in u.src]
        expr = self.r.alu(u, args)
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
        self.line(f"{buf}[{idx}] = {v};")

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
        return f"{self.r.prelude}\n{self.r.signature(self.spec)} {{\n{body}\n}}\n"


def _identity(op: Ops, dt: DType):
    if op is Ops.ADD:
        return 0
    if op is Ops.MUL:
        return 1
    if op is Ops.MAX:
        return -math.inf if dt.is_float else (dtypes.min(dt) if dt is not dtypes.bool else False)
    raise NotImplementedError(f"no identity for reduce {op}")
