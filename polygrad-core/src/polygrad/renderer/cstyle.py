"""The C-family renderer base: kernel IR -> C source. CUDA and other C dialects subclass it.

Stage: rendering. Input: ProgramSpec. Output: source text with one function, KERNEL_SYMBOL.
The structure comes from the linear program (renderer/linearize.py, then the shared linear passes a
dialect asks for, `passes`: none for C, whose compiler does them): one statement per instruction.

A dialect is tables first: `statements` (instruction kind -> the method writing its statement) and
the op tables `scalar_rules`, `vector_rules`, `mask_rules` (op -> C expression, renderer/cstyle_ops.py).
A dialect replaces rows (`{**VECTOR_RULES, Ops.CAST: ...}`) rather than methods; what is left as
methods are the pieces rows ask for (`ctype`, `select`, `mask_of`, `vtype`...) and the hooks of the
signature (`declaration`, `buffer_param`, `var_param`) and of GPU launches (`special`, `define_local`,
`barrier`, `launch`).

Names: every identifier in the source is the renderer's own. No name from the kernel (its KernelInfo
name, a Variable's name), which a bundle or a user chose, reaches the text, not even in a comment: a
Variable is the parameter `v<k>`, k its position in spec.vars, and the function is KERNEL_SYMBOL
(compile_many makes it unique in a shared object; loaders look it up under that name). So a Variable
named after a C macro or keyword (`HUGE_VALF`, `for`) is as harmless as `batch`. The names stay
metadata: ProgramSpec.name, DEBUG lines, errors.

Vector lanes (when `vectorize` and the spec's vector_width > 1): GCC/clang vector extension types,
`typedef float pg_f32x8 __attribute__((vector_size(32)))`, one per element type and lane count the
kernel uses. Lane-wise arithmetic and comparisons are the C operators (no contraction: the build
uses -ffp-contract=off, and FMA is per lane fma/fmaf like the scalar path); a bool vector is an
int32 mask (0 / -1), converted with __builtin_convertvector where a select or a comparison needs
another width; WHERE and MAX are bitwise selects on the mask (both compilers accept no vector `?:`
in C). Contiguous loads and stores are __builtin_memcpy (unaligned); gathers, scatters, masked
accesses and ops without a vector operator (sqrt, trunc, fmod, pow, fma, transcendentals) run one
lane at a time over the vector's elements (`v[pl]`); a dialect may give the FMA and gated-load helpers
faster bodies (the CPU's vector builtins). Conversions are __builtin_convertvector,
reinterpretations vector casts.

Integer division wraps (docs/kernel-ir.md): `INT_MIN / -1` is INT_MIN and `INT_MIN % -1` is 0, as in
NumPy. x86's idiv traps on that pair (SIGFPE), so a signed 32/64-bit IDIV or MOD whose divisor is not
a constant other than -1 tests the divisor first (`trapping_division`), one lane at a time in vectors.
"""
from __future__ import annotations

import copy
import math
from typing import Any, Callable

import numpy as np

from polygrad.dtype import DType, dtypes
from polygrad.contract import ProgramSpec
from polygrad.renderer.cstyle_ops import MASK_RULES, SCALAR_RULES, SIGNED_OF_SIZE, VECTOR_RULES, Rule, apply_rule
from polygrad.renderer.int8_dot import DOT4, DOT4_BCAST, DOT4_NIBBLES, STREAM, contract_int8_dots
from polygrad.renderer.linear_passes import LinearPasses, simplify_linear
from polygrad.renderer.linearize import Inst, L, LinearProgram, linearize, var_name
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
# half -> float is one instruction where clang has the hardware conversion (x86 F16C, AArch64): exact
# for every value, as the bit-level fallback (a signalling NaN comes back quiet), and the dequantization
# of a block format reads one scale per block through it.
HALF_HELPERS = """
#if defined(__clang__) && (defined(__F16C__) || defined(__aarch64__))
static inline float pg_h2f(unsigned short h) {
  union { unsigned short u; __fp16 f; } x;
  x.u = h;
  return (float)x.f;
}
#else
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
#endif
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
        with np.errstate(over="ignore"):  # past the range: inf, as the kernel's own rounding gives
            return float(np.float16(value))
    bits = int(np.array(value, dtype=np.float32).view(np.uint32))
    if math.isnan(value):
        return value
    bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return float(np.array(bits & 0xFFFFFFFF, dtype=np.uint32).view(np.float32))


# short names of element types for vector typedefs (pg_f32x8: 8 floats)
VEC_NAMES = {
    dtypes.int8: "i8", dtypes.uint8: "u8", dtypes.int16: "i16", dtypes.uint16: "u16", dtypes.int32: "i32",
    dtypes.uint32: "u32", dtypes.int64: "i64", dtypes.uint64: "u64", dtypes.float32: "f32", dtypes.float64: "f64",
}
# the function every C-family renderer defines, whatever the kernel's name (see the module docstring)
KERNEL_SYMBOL = "pg_kernel"
# loop variables' names by range kind (gidx3, ridx5: readable dumps)
LOOP_NAMES = {"global": "gidx", "reduce": "ridx", "upcast": "uidx", "thread": "gidx"}


class CStyleRenderer:
    """The C family's renderer. A dialect (CPU, CUDA, a plugin's) subclasses it and changes data first:
    the prelude, the types, the op tables (`scalar_rules`, `vector_rules`, `mask_rules`: one row per op,
    renderer/cstyle_ops.py) and the statement table (`statements`: one row per instruction kind), then
    hooks: `declaration` (qualifiers before the name), `special` / `define_local` / `barrier` (GPU
    launch indices and shared memory), `launch`, the vector helpers' bodies."""

    prelude = "#include <math.h>\n#include <stdint.h>\n"
    types = C_TYPES
    restrict = "restrict"
    emulate_half = True  # False where the compiler has native half/bfloat16 arithmetic
    vectorize = True  # render vector lanes (GCC/clang vector extensions) up to the spec's vector_width
    strided_loads = False  # lanes 2 elements apart are "strided" loads (strided_vload), not gathers
    half_helpers = HALF_HELPERS  # pg_h2f / pg_f2h / pg_b2f / pg_f2b / pg_rh / pg_rb for emulated halves
    # the shared linear passes (renderer/linear_passes.py) run before rendering; None: the C compiler folds,
    # shares and hoists itself, so the program is rendered as linearized
    passes: LinearPasses | None = None
    # contract 4-turn loops of 8-bit products into DOT4 updates (renderer/int8_dot.py) and render them with
    # the pg_dot4 helper (dot4_body); set by a dialect whose device declares Capabilities.int8_dot
    int8_dot = False

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
            if self.emulate_half and dt in HALF_TYPES:
                v = round_half_value(float(v), dt)  # first: a value past the type's range rounds to inf
            if math.isnan(v):
                return f"(({self.ctype(dt)})NAN)"
            if math.isinf(v):
                return f"(({self.ctype(dt)}){'-' if v < 0 else ''}INFINITY)"
            if self.emulate_half and dt in HALF_TYPES:
                return repr(float(v)) + "f"
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

    def wrapping_division(self, op: Ops, dt: DType, a: list[str]) -> str:
        """IDIV / MOD of signed ints that never traps: a divisor of -1 negates (wrapping, through the
        unsigned type) or gives 0, the only case where C's `/` and `%` overflow."""
        if op is Ops.MOD:
            return f"(({a[1]})==-1?({self.ctype(dt)})0:({a[0]})%({a[1]}))"
        unsigned = f"unsigned {self.ctype(dt)}"
        return f"(({a[1]})==-1?({self.ctype(dt)})(({unsigned})0-({unsigned})({a[0]})):({a[0]})/({a[1]}))"

    def math_fn(self, name: str, dt: DType) -> str:
        return name + ("f" if dt is not dtypes.float64 else "")

    def alu(self, op: Ops, dt: DType, sdt: DType, a: list[str]) -> str:
        """C for op on operand expressions a; dt is the result dtype, sdt the first operand's (the
        dialect's `scalar_rules` row)."""
        return apply_rule(self.scalar_rules, op, self, dt, sdt, a, 1, f"C renderer has no rule for {op.name}")

    # ---- structure
    def special(self, x: Inst, i: int, lines: list[str], pad: str) -> str:
        """The name of a SPECIAL launch index (a host thread index in C); GPU dialects declare it."""
        if x.arg[0] != "thread":
            raise NotImplementedError(f"{type(self).__name__} has no launch index {x.arg[0]}")
        return "tid"

    def define_local(self, x: Inst) -> str:
        raise NotImplementedError(f"{type(self).__name__} has no block-shared memory")

    def barrier(self) -> str:
        raise NotImplementedError(f"{type(self).__name__} has no block barrier")

    def shuffle(self, value: str, lane_mask: int) -> str:
        """The value of `value` in lane (this lane XOR lane_mask) of the warp (L.SHUFFLE); GPU dialects only."""
        raise NotImplementedError(f"{type(self).__name__} has no warp shuffle")

    def buffer_param(self, slot: int, dt: DType, written: bool) -> str:
        """The parameter of the buffer in `slot` (read-only buffers are const)."""
        return f"{'' if written else 'const '}{self.storage_ctype(dt)}* {self.restrict} data{slot}"

    def var_param(self, k: int, dt: DType) -> str:
        """The parameter of the k-th Variable: `v<k>`, never its name (module docstring)."""
        return f"const {self.ctype(dt)} {var_name(k)}"

    def parameters(self, prog: LinearProgram) -> list[str]:
        """The launch contract's parameters: buffers in slot order, Variables, the host thread index."""
        params = [self.buffer_param(p.arg[0], p.dtype, p.arg[1]) for p in prog.params]
        params += [self.var_param(k, v.dtype) for k, v in enumerate(prog.vars)]
        if prog.threads > 1:
            params.append("int tid")
        return params

    def declaration(self, prog: LinearProgram) -> str:
        """What precedes the function's name: its return type and the dialect's qualifiers."""
        return "void"

    def signature(self, prog: LinearProgram) -> str:
        return f"{self.declaration(prog)} {KERNEL_SYMBOL}({', '.join(self.parameters(prog))})"

    def render(self, spec: ProgramSpec) -> str:
        width = getattr(spec, "vector_width", 1) if self.vectorize else 1
        prog = linearize(spec, vector_width=width, launch=self.launch(spec), strided=self.strided_loads)
        if self.passes is not None:
            prog = simplify_linear(prog, self.passes)
        if self.int8_dot:
            prog = contract_int8_dots(prog)
        return self.render_program(prog, self.stream_slots(spec))

    def stream_slots(self, spec: ProgramSpec) -> frozenset[int]:
        """Buffers (slots) whose contiguous vector stores are non-temporal; none in the base dialect."""
        return frozenset()

    def launch(self, spec: ProgramSpec) -> Any:
        """The GPU launch mapping (renderer/launch.py) of a dialect with launch indices; None in C."""
        return None

    # ---- vector lanes
    def vtype(self, dt: DType, n: int) -> str:
        """The C vector type of n lanes of dt (bool lanes: the int32 mask); registered for the prelude."""
        elem = dtypes.int32 if dt is dtypes.bool else dt
        name = f"pg_{VEC_NAMES[elem]}x{n}"
        self._vtypes[name] = self.vector_typedef(elem, n, name)
        return name

    def vector_typedef(self, elem: DType, n: int, name: str) -> str:
        """The prelude line declaring vector type `name`: n lanes of elem (a GCC/clang vector type)."""
        return f"typedef {self.types[elem]} {name} __attribute__((vector_size({n * elem.itemsize})));"

    def mask_of(self, expr: str, size: int, n: int) -> str:
        """A comparison of size-byte lanes (a signed mask of that width) as the int32 bool mask."""
        if size == 4:
            return f"(({self.vtype(dtypes.int32, n)})({expr}))"
        return f"__builtin_convertvector({expr}, {self.vtype(dtypes.bool, n)})"

    def select(self, mask: str, a: str, b: str, dt: DType, n: int) -> str:
        """Lane-wise mask ? a : b, mask being a signed mask of dt's width (bitwise: portable C)."""
        if dt is dtypes.bool:
            return f"(({mask}&{a})|(~{mask}&{b}))"
        it, vt = self.vtype(SIGNED_OF_SIZE[dt.itemsize], n), self.vtype(dt, n)
        return f"(({vt})((({it})({mask})&({it})({a}))|(~({it})({mask})&({it})({b}))))"

    def splat(self, dt: DType, n: int, expr: str) -> str:
        return f"(({self.vtype(dt, n)}){{{', '.join([expr] * n)}}})"

    def lane(self, x: str, dt: DType) -> str:
        """Lane pl of vector x as a scalar C value (bool masks as 0 / 1)."""
        return f"({x}[pl]!=0)" if dt is dtypes.bool else f"{x}[pl]"

    def valu(self, op: Ops, dt: DType, sdt: DType, a: list[str], n: int) -> str | None:
        """A lane-wise C expression for op on n-lane operands, or None where it goes one lane at a time
        (the dialect's `mask_rules` row for logic on bool masks, else its `vector_rules` row)."""
        if dt is dtypes.bool and sdt is dtypes.bool and op is not Ops.CAST:  # logic on masks (false 0, true -1)
            return apply_rule(self.mask_rules, op, self, dt, sdt, a, n,
                              f"C renderer has no vector rule for {op.name} on bool")
        return apply_rule(self.vector_rules, op, self, dt, sdt, a, n, f"C renderer has no vector rule for {op.name}")

    def vfma(self, dt: DType, n: int, a: str, b: str, c: str) -> str:
        """A lane-wise fused multiply-add of n-lane float vectors: a helper that applies the scalar fma
        to each lane (clang and gcc compile it to one vector FMA instruction where the CPU has one)."""
        vt = self.vtype(dt, n)
        name = f"pg_fma_{vt[3:]}"
        self._helpers[name] = f"static inline {vt} {name}({vt} a, {vt} b, {vt} c) {{\n{self.vfma_body(dt, n)}\n}}"
        return f"{name}({a}, {b}, {c})"

    def vfma_body(self, dt: DType, n: int) -> str:
        """The body of the pg_fma helper for n lanes of dt (a, b, c in scope): the scalar fma per lane."""
        lane = f"r[pl] = {self.math_fn('fma', dt)}(a[pl], b[pl], c[pl]);"
        return f"  {self.vtype(dt, n)} r; for (int pl = 0; pl < {n}; pl++) {lane} return r;"

    def dot4(self, n: int, acc: str, a: str, b: str) -> str:
        """acc (n int32 lanes) plus, in lane l, the products a[l + n k] * b[l + n k] for k < 4 (a and b: 4n
        int8 lanes; renderer/int8_dot.py's DOT4): a helper whose body is the dialect's (dot4_body)."""
        vt, bt = self.vtype(dtypes.int32, n), self.vtype(dtypes.int8, 4 * n)
        name = f"pg_dot4_{bt[3:]}"
        self._helpers[name] = f"static inline {vt} {name}({vt} acc, {bt} a, {bt} b) {{\n{self.dot4_body(n)}\n}}"
        return f"{name}({acc}, {a}, {b})"

    def dot4_body(self, n: int) -> str:
        """The body of the pg_dot4 helper for n lanes (acc, a, b in scope): the products lane by lane."""
        step = f"acc[pl] += (int)a[pl + {n} * k] * (int)b[pl + {n} * k];"
        return f"  for (int k = 0; k < 4; k++) for (int pl = 0; pl < {n}; pl++) {step}\n  return acc;"

    def dot4_bcast(self, n: int, acc: str, x: Inst, b: Inst) -> str:
        """acc (n int32 lanes) plus, in lane l, x[k] * b[4 l + k] for k < 4 (x: 4 int8 or uint8 values, b: 4n
        int8 or uint8 values; renderer/int8_dot.py's DOT4_BCAST): a helper whose body is the dialect's
        (dot4_bcast_body)."""
        xd, bd = x.dtype, b.dtype
        vt, xt, bt = self.vtype(dtypes.int32, n), self.vtype(xd, 4), self.vtype(bd, 4 * n)
        name = f"pg_dot4p_{xt[3:]}_{bt[3:]}"
        body = self.dot4_bcast_body(n, xd, bd)
        self._helpers[name] = f"static inline {vt} {name}({vt} acc, {xt} x, {bt} b) {{\n{body}\n}}"
        return f"{name}({acc}, {self.name_of(x)}, {self.name_of(b)})"

    def dot4_bcast_body(self, n: int, xd: DType, bd: DType) -> str:
        """The body of the pg_dot4p helper for n lanes (acc, x, b in scope): the products lane by lane."""
        step = "acc[pl] += (int)x[k] * (int)b[4 * pl + k];"
        return f"  for (int k = 0; k < 4; k++) for (int pl = 0; pl < {n}; pl++) {step}\n  return acc;"

    def dot4_nibbles(self, n: int, acc: str, a: str, q: str) -> str:
        """acc (n int32 lanes) plus, in lane l, a[l + n k] * (nibble k - 8) for k < 4, nibble k the low (k < 2)
        or high half of byte q[l + n (k % 2)] (a: 4n int8 lanes, q: 2n uint8 lanes of Q4_0 weights;
        renderer/int8_dot.py's DOT4_NIBBLES): a helper whose body is the dialect's (dot4_nibbles_body)."""
        vt, bt, qt = self.vtype(dtypes.int32, n), self.vtype(dtypes.int8, 4 * n), self.vtype(dtypes.uint8, 2 * n)
        name = f"pg_dot4n_{bt[3:]}"
        body = self.dot4_nibbles_body(n)
        self._helpers[name] = f"static inline {vt} {name}({vt} acc, {bt} a, {qt} q) {{\n{body}\n}}"
        return f"{name}({acc}, {a}, {q})"

    def dot4_nibbles_body(self, n: int) -> str:
        """The body of the pg_dot4n helper for n lanes (acc, a, q in scope): the products lane by lane."""
        nibble = f"((q[pl + {n} * (k & 1)] >> (4 * (k >> 1))) & 15)"
        step = f"acc[pl] += (int)a[pl + {n} * k] * ((int){nibble} - 8);"
        return f"  for (int k = 0; k < 4; k++) for (int pl = 0; pl < {n}; pl++) {step}\n  return acc;"

    def count_lanes(self, gate: str, lanes: int) -> str:
        """A C expression: how many lanes of the bool mask `gate` are true (a movemask and popcount)."""
        return f"({{ int on_ = 0; for (int pl = 0; pl < {lanes}; pl++) on_ += ({gate}[pl]!=0); on_; }})"

    def lane_load_loop(self, x: Inst, name: str, n: Any) -> str:
        """A loop loading LOAD x's lanes one at a time into vector `name` (gathers, gated lanes)."""
        buf, idx = n(x.src[0]), n(x.src[1])
        gate = x.src[2] if len(x.src) > 2 else None
        steps = {"contiguous": f"{idx} + pl", "strided": f"{idx} + 2*pl", "quads": f"{idx} + 4*pl"}
        at = steps.get(x.arg, f"{idx}[pl]")
        elem = f"{buf}[{at}]"
        if x.dtype is dtypes.bool:
            elem = f"({elem} ? -1 : 0)"
        if gate is not None:
            g = self.lane(n(gate), dtypes.bool) if gate.lanes > 1 else n(gate)
            elem = f"({g} ? {elem} : 0)"
        return f"for (int pl = 0; pl < {x.lanes}; pl++) {name}[pl] = {elem};"

    def lane_store_loop(self, x: Inst, n: Any) -> str:
        """A loop storing STORE x's lanes one at a time (scatters, gated lanes)."""
        buf, idx, value = x.src[0], x.src[1], x.src[2]
        gate = x.src[3] if len(x.src) > 3 else None
        at = f"{n(idx)} + pl" if x.arg == "contiguous" else f"{n(idx)}[pl]"
        st = f"{n(buf)}[{at}] = {self.lane(n(value), buf.dtype)};"
        if gate is not None:
            st = f"if ({self.lane(n(gate), dtypes.bool)}) {st}"
        return f"for (int pl = 0; pl < {x.lanes}; pl++) {st}"

    def vload(self, x: Inst, name: str, n: Any, pad: str) -> list[str]:
        """Statements defining vector `name` from LOAD x (contiguous or gathered, optionally gated)."""
        dt, buf, idx = x.dtype, n(x.src[0]), n(x.src[1])
        gate = x.src[2] if len(x.src) > 2 else None
        vt = self.vtype(dt, x.lanes)
        if x.arg == STREAM and gate is None:  # contiguous, one of several streams (renderer/int8_dot.py)
            ahead = self.stream_prefetch(f"{buf} + {idx}", dt)
            return [f"{pad}{vt} {name};", f"{pad}{self.vector_copy(dt, x.lanes, name, f'{buf} + {idx}')}",
                    *([f"{pad}{ahead}"] if ahead else [])]
        if x.arg == "contiguous":
            if gate is None:
                return [f"{pad}{vt} {name};", f"{pad}{self.vector_copy(dt, x.lanes, name, f'{buf} + {idx}')}"]
            if gate.lanes == 1:
                copy = self.vector_copy(dt, x.lanes, name, f"{buf} + {idx}")
                return [f"{pad}{vt} {name} = {{0}};", f"{pad}if ({n(gate)}) {copy}"]
            # a lane gate (padding): see gated_vload
            return [f"{pad}{vt} {name} = {self.gated_vload(dt, x.lanes, f'{buf} + {idx}', n(gate))};"]
        if x.arg == "strided" and (gate is None or gate.lanes > 1):
            on = self.splat(dtypes.int32, x.lanes, "-1") if gate is None else n(gate)
            return [f"{pad}{vt} {name} = {self.strided_vload(dt, x.lanes, f'{buf} + {idx}', on)};"]
        if x.arg != "quads" and (gate is None or gate.lanes > 1):  # (a scalar gate: the lane loop skips all)
            gathered = self.masked_gather(dt, x.lanes, buf, idx, None if gate is None else n(gate))
            if gathered is not None:
                return [f"{pad}{vt} {name} = {gathered};"]
        return [f"{pad}{vt} {name};", f"{pad}{self.lane_load_loop(x, name, n)}"]

    def stream_prefetch(self, ptr: str, dt: DType) -> str | None:
        """A statement prefetching memory ahead of ptr along a stream of contiguous loads (a STREAM load of
        renderer/int8_dot.py, one of a tile's weight rows), or None (the base dialect: no prefetch)."""
        return None

    def masked_gather(self, dt: DType, lanes: int, buf: str, idx: str, gate: str | None) -> str | None:
        """A C expression gathering buf[idx[lane]] for each lane (0 where `gate`, int lanes, is off) with one
        hardware gather, or None where the dialect has none (the lanes are then loaded one at a time)."""
        return None

    def strided_vload(self, dt: DType, lanes: int, ptr: str, gate: str) -> str:
        """A C expression: lane k is ptr[2k] where `gate` (int lanes) is on, else 0 (nothing read);
        through a helper per vector type (`pg_sload_<type>(p, m)`, body: strided_vload_body)."""
        return self._masked_load_call("pg_sload", dt, lanes, ptr, gate, self.strided_vload_body)

    def strided_vload_body(self, dt: DType, lanes: int) -> str:
        """The strided load helper's body over pointer p and mask m: each lane that is on read alone."""
        return (f"  {self.vtype(dt, lanes)} r = {{0}};\n"
                f"  for (int pl = 0; pl < {lanes}; pl++) r[pl] = (m[pl]!=0) ? p[2*pl] : 0;\n  return r;")

    def vector_copy(self, dt: DType, lanes: int, name: str, ptr: str) -> str:
        """A statement setting vector `name` from `lanes` contiguous elements at ptr (bools: bytes to a mask)."""
        if dt is not dtypes.bool:
            return f"__builtin_memcpy(&{name}, {ptr}, sizeof({name}));"
        vt, bt, zero = self.vtype(dt, lanes), self.vtype(dtypes.uint8, lanes), self.splat(dtypes.int32, lanes, "0")
        words = f"__builtin_convertvector(b_, {vt})!={zero}"
        return f"{{ {bt} b_; __builtin_memcpy(&b_, {ptr}, sizeof(b_)); {name} = {self.mask_of(words, 4, lanes)}; }}"

    def gated_vload(self, dt: DType, lanes: int, ptr: str, gate: str) -> str:
        """A C expression: `lanes` contiguous elements at ptr, lanes whose gate is off reading nothing and
        giving 0; through a helper per vector type (`pg_gload_<type>(p, m)`, body: gated_vload_body)."""
        return self._masked_load_call("pg_gload", dt, lanes, ptr, gate, self.gated_vload_body)

    def _masked_load_call(self, prefix: str, dt: DType, lanes: int, ptr: str, gate: str, body) -> str:
        """`<prefix>_<type>(ptr, gate)`, defining the helper once per vector type: it takes the element
        pointer p and the int-lane mask m, and `body(dt, lanes)` is its body."""
        vt = self.vtype(dt, lanes)
        name = f"{prefix}_{vt[3:]}"
        self._helpers[name] = (f"static inline {vt} {name}(const {self.storage_ctype(dt)}* p, "
                               f"{self.vtype(dtypes.bool, lanes)} m) {{\n{body(dt, lanes)}\n}}")
        return f"{name}({ptr}, {gate})"

    def gated_vload_body(self, dt: DType, lanes: int) -> str:
        """The gated load helper's body over pointer p and mask m: one vector load where every lane is on
        (padding interiors), else each lane that is on read alone."""
        elem = "(p[pl] ? -1 : 0)" if dt is dtypes.bool else "p[pl]"
        return (f"  {self.vtype(dt, lanes)} r = {{0}}; int on = {self.count_lanes('m', lanes)};\n"
                f"  if (on == {lanes}) {self.vector_copy(dt, lanes, 'r', 'p')}\n"
                f"  else if (on) for (int pl = 0; pl < {lanes}; pl++) r[pl] = (m[pl]!=0) ? {elem} : 0;\n"
                f"  return r;")

    def vstore(self, x: Inst, n: Any, pad: str) -> list[str]:
        """Statements for a STORE of lanes (contiguous or scattered, optionally with a lane gate)."""
        buf, idx, value = x.src[0], x.src[1], x.src[2]
        gate = x.src[3] if len(x.src) > 3 else None
        dt = buf.dtype
        if x.arg == "contiguous":
            size = x.lanes * dt.itemsize
            if dt is dtypes.bool:
                bt = self.vtype(dtypes.uint8, x.lanes)
                full = (f"{{ {bt} b_ = __builtin_convertvector(-{n(value)}, {bt}); "
                        f"__builtin_memcpy({n(buf)} + {n(idx)}, &b_, sizeof(b_)); }}")
            elif gate is None and buf.op is L.PARAM and buf.arg[0] in self._stream and size in STREAM_SIZES:
                self._helpers["pg_stream_fence"] = STREAM_FENCE
                self._helpers[f"pg_stream{size}"] = stream_helper(size)
                return [f"{pad}pg_stream{size}({n(buf)} + {n(idx)}, (pg_nt{size})({n(value)}));"]
            else:
                full = f"__builtin_memcpy({n(buf)} + {n(idx)}, &{n(value)}, sizeof({n(value)}));"
            if gate is None:
                return [f"{pad}{full}"]
        lane_loop = self.lane_store_loop(x, n)
        masked = self.masked_vstore(dt, x.lanes, f"{n(buf)} + {n(idx)}", n(value), n(gate)) \
            if x.arg == "contiguous" else None
        if masked is not None:  # the dialect's one masked store (a padded row's last vector)
            return [f"{pad}{masked}"]
        if x.arg == "contiguous":  # a lane gate: one vector store where every lane is on
            return [f"{pad}if ({self.count_lanes(n(gate), x.lanes)} == {x.lanes}) {full}", f"{pad}else {lane_loop}"]
        return [f"{pad}{lane_loop}"]

    def masked_vstore(self, dt: DType, lanes: int, ptr: str, value: str, gate: str) -> str | None:
        """A statement storing the lanes of `value` whose gate is on at ptr with one masked store, or None
        where the dialect has none (the lanes are then stored one at a time)."""
        return None

    # clang turns scalar gated loads into masked vector loads whose masked-off lanes may point outside
    # the buffer (a concatenation's other slices): measured 17x slower than scalar code on Zen 4 (an
    # Adam step's fused update). The innermost loops that hold such loads stay scalar; gcc ignores this.
    no_vectorize_pragma = "#pragma clang loop vectorize(disable)"

    @staticmethod
    def gated_loops(prog: LinearProgram) -> set[int]:
        """ids of innermost LOOPs that directly hold a scalar gated LOAD."""
        out: set[int] = set()
        stack: list[list[Any]] = []
        for x in prog.insts:
            if x.op is L.LOOP:
                if stack:
                    stack[-1][1] = False  # not innermost
                stack.append([x, True, False])
            elif x.op is L.ENDLOOP and stack:
                loop, innermost, gated = stack.pop()
                if innermost and gated:
                    out.add(id(loop))
            elif x.op is L.LOAD and x.lanes == 1 and len(x.src) > 2 and stack:
                stack[-1][2] = True
        return out

    # a dialect's pragma that keeps the compiler from unrolling a loop (None: no such pragma); see
    # elementwise_variable_loops
    no_unroll_pragma: str | None = None

    @staticmethod
    def elementwise_variable_loops(prog: LinearProgram) -> set[int]:
        """ids of the LOOPs of a kernel without a reduction whose bounds depend on a kernel Variable (the
        prompt's tokens). clang unrolls such a loop at run time, with a remainder loop, around a body the
        opts already unrolled (UPCAST); for a memory-bound elementwise kernel that only costs compile
        time (GPT-2's prompt: 5 such kernels took about 0.1 s of clang -O3 each, 0.03 s without)."""
        if any(x.op is L.ACC for x in prog.insts):
            return set()
        varying: set[int] = set()
        out: set[int] = set()
        for x in prog.insts:
            if x.op is L.LOOP:
                if any(id(s) in varying for s in x.src):
                    out.add(id(x))
                    varying.add(id(x))
            elif x.op is L.VAR or any(id(s) in varying for s in x.src):
                varying.add(id(x))
        return out

    def render_program(self, prog: LinearProgram, stream: frozenset[int] = frozenset()) -> str:
        """C source for a linearized kernel: one statement per instruction, in order (the dialect's
        `statements` row for its kind). Contiguous vector stores into the buffers in `stream` (slots) are
        non-temporal (stream_helper), fenced at the end. One renderer serves every thread (a device's
        `render`), so the statements write this render's names, lines and helpers into a copy of it."""
        return copy.copy(self)._render_program(prog, stream)

    def _render_program(self, prog: LinearProgram, stream: frozenset[int]) -> str:
        self._stream = stream
        self._names: dict[int, str] = {id(v): var_name(k) for k, v in enumerate(prog.vars)}
        self._lines: list[str] = []
        self._depth = 1
        self._vtypes: dict[str, str] = {}
        self._helpers: dict[str, str] = {}
        self._transposed: dict[tuple[int, ...], list[str]] = {}  # a TRANSPOSE square's sources: its rows
        self._no_vectorize = self.gated_loops(prog)
        self._no_unroll = self.elementwise_variable_loops(prog) if self.no_unroll_pragma else set()
        uses_half = False
        for i, x in enumerate(prog.insts):
            if x.dtype in HALF_TYPES:
                uses_half = True
            rule = self.statements.get(x.op)
            if rule is None:
                raise NotImplementedError(f"C renderer has no rule for {x.op.name}")
            rule(self, x, i)
        lines = self._lines
        prelude = self.prelude + (self.half_helpers if self.emulate_half and uses_half else "")
        if self._vtypes:
            prelude += "\n".join(self._vtypes[k] for k in sorted(self._vtypes)) + "\n"
        if self._helpers:
            prelude += "\n".join(self._helpers[k] for k in sorted(self._helpers)) + "\n"
        if "pg_stream_fence" in self._helpers:  # non-temporal stores are weakly ordered: drain them
            lines.append("  pg_stream_fence();")
        body = "\n".join(lines)
        return f"{prelude}\n{self.signature(prog)} {{\n{body}\n}}\n"

    # ---- one statement per instruction kind (the `statements` table below)
    def name_of(self, x: Inst) -> str:
        """The C expression naming x's value (a variable, a literal, an accumulator element)."""
        return self._names[id(x)]

    def emit(self, *stmts: str) -> None:
        """Append statements at the current depth."""
        self._lines.extend(f"{self.pad}{s}" for s in stmts)

    @property
    def pad(self) -> str:
        return "  " * self._depth

    def param_stmt(self, x: Inst, i: int) -> None:
        self._names[id(x)] = f"data{x.arg[0]}"

    def var_stmt(self, x: Inst, i: int) -> None:
        pass  # named with the parameters (render_program)

    def special_stmt(self, x: Inst, i: int) -> None:
        self._names[id(x)] = self.special(x, i, self._lines, self.pad)

    def local_stmt(self, x: Inst, i: int) -> None:  # on the launch's stack: every thread has its own
        name = self._names[id(x)] = f"local{i}"
        self.emit(f"{self.storage_ctype(x.dtype)} {name}[{x.arg}] __attribute__((aligned(64)));")

    def define_local_stmt(self, x: Inst, i: int) -> None:
        self._names[id(x)] = x.arg[0]
        self.emit(self.define_local(x))

    def barrier_stmt(self, x: Inst, i: int) -> None:
        self.emit(self.barrier())

    def shuffle_stmt(self, x: Inst, i: int) -> None:
        name = self._names[id(x)] = f"shfl{i}"
        self.emit(f"{self.ctype(x.dtype)} {name} = {self.shuffle(self.name_of(x.src[0]), x.arg)};")

    def const_stmt(self, x: Inst, i: int) -> None:
        if x.lanes == 1:
            self._names[id(x)] = self.literal(UOp.const(x.dtype, x.arg))
            return
        name = self._names[id(x)] = f"cvec{i}"
        vals = ", ".join(self.literal(UOp.const(x.dtype, v)) for v in x.arg)
        self.emit(f"{self.vtype(x.dtype, x.lanes)} {name} = {{{vals}}};")

    def bcast_stmt(self, x: Inst, i: int) -> None:
        name = self._names[id(x)] = f"bc{i}"
        e = f"-(int)({self.name_of(x.src[0])})" if x.dtype is dtypes.bool else self.name_of(x.src[0])
        self.emit(f"{self.vtype(x.dtype, x.lanes)} {name} = {{{', '.join([e] * x.lanes)}}};")

    def transpose_stmt(self, x: Inst, i: int) -> None:
        """Row x.arg of the transposed square of x.src (n vectors of n lanes): the first row of a square
        emits all n rows, log2(n) rounds of two-source lane shuffles (transpose_rounds), or with a compiler
        that has no __builtin_shufflevector each row from its sources' lanes."""
        key = tuple(id(s) for s in x.src)
        rows = self._transposed.get(key)
        if rows is None:
            n, vt = x.lanes, self.vtype(x.dtype, x.lanes)
            srcs = [self.name_of(s) for s in x.src]
            rows = [f"tr{i}_{k}" for k in range(n)]
            self.emit(f"{vt} {', '.join(rows)};", "#if defined(__clang__)")
            rounds = transpose_rounds(n)
            names = srcs
            for step, shuffles in enumerate(rounds):
                last = step == len(rounds) - 1
                out = rows if last else [f"tt{i}_{step}_{k}" for k in range(n)]
                for k, (a, b, lanes) in enumerate(shuffles):
                    decl = "" if last else f"{vt} "
                    self.emit(f"{decl}{out[k]} = __builtin_shufflevector({names[a]}, {names[b]}, {lanes});")
                names = out
            self.emit("#else")
            for k in range(n):
                self.emit(f"{rows[k]} = ({vt}){{{', '.join(f'{src}[{k}]' for src in srcs)}}};")
            self.emit("#endif")
            self._transposed[key] = rows
        self._names[id(x)] = rows[x.arg]

    def loop_stmt(self, x: Inst, i: int) -> None:
        name = self._names[id(x)] = f"{LOOP_NAMES.get(x.arg[1], 'idx')}{x.arg[0]}"
        start, end = self.name_of(x.src[0]), self.name_of(x.src[1])
        step = f"{name} += {self.name_of(x.src[2])}" if len(x.src) > 2 else f"{name}++"  # partially unrolled
        if id(x) in self._no_vectorize:
            self.emit(self.no_vectorize_pragma)
        if id(x) in self._no_unroll:
            self.emit(self.no_unroll_pragma)  # type: ignore[arg-type]
        self.emit(f"for ({self.ctype(x.dtype)} {name} = {start}; {name} < {end}; {step}) {{")
        self._depth += 1

    def end_stmt(self, x: Inst, i: int) -> None:
        self._depth -= 1
        self.emit("}")

    def if_stmt(self, x: Inst, i: int) -> None:
        self.emit(f"if ({self.name_of(x.src[0])}) {{")
        self._depth += 1

    def acc_stmt(self, x: Inst, i: int) -> None:
        name = self._names[id(x)] = f"acc{i}"
        lanes = x.arg[1]
        ct = self.ctype(x.dtype) if x.lanes == 1 else self.vtype(x.dtype, x.lanes)
        init = self.name_of(x.src[0])
        if lanes > 1:
            self.emit(f"{ct} {name}[{lanes}];", f"for (int i = 0; i < {lanes}; i++) {name}[i] = {init};")
        else:
            self.emit(f"{ct} {name} = {init};")

    def update_stmt(self, x: Inst, i: int) -> None:
        n = self.name_of
        acc = x.src[0]
        if x.arg is Ops.FMA:  # acc = fma(a, b, acc), one rounding
            a, b = n(x.src[1]), n(x.src[2])
            ref = f"{n(acc)}[{n(x.src[3])}]" if len(x.src) > 3 else n(acc)
            if acc.lanes > 1:
                self.emit(f"{ref} = {self.vfma(acc.dtype, acc.lanes, a, b, ref)};")
            else:
                self.emit(f"{ref} = {self.alu(Ops.FMA, acc.dtype, acc.dtype, [a, b, ref])};")
            return
        if x.arg == DOT4:  # acc += the 4 products per lane of two byte vectors (renderer/int8_dot.py)
            self.emit(f"{n(acc)} = {self.dot4(acc.lanes, n(acc), n(x.src[1]), n(x.src[2]))};")
            return
        if x.arg == DOT4_BCAST:  # acc += 4 shared bytes times each lane's 4 bytes (renderer/int8_dot.py)
            self.emit(f"{n(acc)} = {self.dot4_bcast(acc.lanes, n(acc), x.src[1], x.src[2])};")
            return
        if x.arg == DOT4_NIBBLES:  # acc += 4 products per lane of int8 and Q4_0 nibbles (renderer/int8_dot.py)
            self.emit(f"{n(acc)} = {self.dot4_nibbles(acc.lanes, n(acc), n(x.src[1]), n(x.src[2]))};")
            return
        value = x.src[1]
        ref = f"{n(acc)}[{n(x.src[2])}]" if len(x.src) > 2 else n(acc)
        if acc.lanes == 1 and value.lanes > 1:  # fold the lanes in order (horizontal reduce)
            step = self.alu(x.arg, acc.dtype, acc.dtype, [ref, self.lane(n(value), value.dtype)])
            self.emit(f"for (int pl = 0; pl < {value.lanes}; pl++) {ref} = {step};")
        elif acc.lanes > 1:
            self.emit(f"{ref} = {self.valu(x.arg, acc.dtype, acc.dtype, [ref, n(value)], acc.lanes)};")
        else:
            self.emit(f"{ref} = {self.alu(x.arg, acc.dtype, acc.dtype, [ref, n(value)])};")

    def acc_read_stmt(self, x: Inst, i: int) -> None:
        acc = self.name_of(x.src[0])
        self._names[id(x)] = f"{acc}[{self.name_of(x.src[1])}]" if len(x.src) > 1 else acc

    def load_stmt(self, x: Inst, i: int) -> None:
        n = self.name_of
        if x.lanes > 1:
            self._lines.extend(self.vload(x, self._names.setdefault(id(x), f"val{i}"), n, self.pad))
            return
        expr = self.from_storage(x.dtype, f"{n(x.src[0])}[{n(x.src[1])}]")
        if len(x.src) > 2:
            expr = f"({n(x.src[2])}?{expr}:0)"
        name = self._names[id(x)] = f"val{i}"
        self.emit(f"{self.ctype(x.dtype)} {name} = {expr};")

    def store_stmt(self, x: Inst, i: int) -> None:
        if x.lanes > 1:
            self._lines.extend(self.vstore(x, self.name_of, self.pad))
            return
        buf, idx, value = x.src
        if isinstance(x.arg, tuple) and x.arg[0] == "atomic":
            self.emit(self.atomic_store(x.arg[1], f"{self.name_of(buf)} + {self.name_of(idx)}", self.name_of(value)))
            return
        self.emit(f"{self.name_of(buf)}[{self.name_of(idx)}] = {self.to_storage(buf.dtype, self.name_of(value))};")

    def atomic_store(self, op: Ops, address: str, value: str) -> str:
        """The statement folding `value` into *address atomically (a GPU scatter-add); C has none."""
        raise NotImplementedError(f"{type(self).__name__} has no atomic {op.name} store")

    def alu_stmt(self, x: Inst, i: int) -> None:
        dt = x.dtype
        name = self._names[id(x)] = f"alu{i}"
        args = [self.name_of(s) for s in x.src]
        traps = trapping_division(x)
        if x.lanes == 1:
            sdt = x.src[0].dtype if x.src else dt
            expr = self.wrapping_division(x.arg, dt, args) if traps else self.alu(x.arg, dt, sdt, args)
            if x.arg not in (Ops.CAST, Ops.BITCAST):
                expr = self.round_half(dt, expr)
            self.emit(f"{self.ctype(dt)} {name} = {expr};")
            return
        sdt = x.src[0].dtype
        vt = self.vtype(dt, x.lanes)
        expr = None if traps else self.valu(x.arg, dt, sdt, args, x.lanes)
        if x.arg is Ops.FMA and dt.is_float:
            expr = self.vfma(dt, x.lanes, *args)
        if expr is not None:
            self.emit(f"{vt} {name} = {expr};")
            return
        # one lane at a time, the scalar rule on each lane
        lane_args = [self.lane(self.name_of(s), s.dtype) for s in x.src]
        scalar = self.wrapping_division(x.arg, dt, lane_args) if traps else self.alu(x.arg, dt, sdt, lane_args)
        self.emit(f"{vt} {name};", f"for (int pl = 0; pl < {x.lanes}; pl++) {name}[pl] = {scalar};")

    # the dialect's tables: a subclass replaces rows (`{**CStyleRenderer.vector_rules, Ops.X: ...}`)
    statements: dict[L, Callable[[Any, Inst, int], None]] = {
        L.PARAM: param_stmt, L.VAR: var_stmt, L.SPECIAL: special_stmt, L.LOCAL: local_stmt,
        L.DEFINE_LOCAL: define_local_stmt, L.BARRIER: barrier_stmt, L.CONST: const_stmt, L.BCAST: bcast_stmt,
        L.LOOP: loop_stmt, L.ENDLOOP: end_stmt, L.ENDIF: end_stmt, L.IF: if_stmt, L.ACC: acc_stmt,
        L.UPDATE: update_stmt, L.ACC_READ: acc_read_stmt, L.LOAD: load_stmt, L.STORE: store_stmt, L.ALU: alu_stmt,
        L.TRANSPOSE: transpose_stmt, L.SHUFFLE: shuffle_stmt,
    }
    scalar_rules: dict[Ops, Rule] = SCALAR_RULES
    vector_rules: dict[Ops, Rule] = VECTOR_RULES
    mask_rules: dict[Ops, Rule] = MASK_RULES


# Non-temporal stores (the CPU dialect, for outputs larger than the last-level cache): a vector written
# straight to memory skips the read-for-ownership of its cache line and leaves the cache to the inputs.
# Compiler builtins, no intrinsics header (immintrin.h costs ~0.4 s of compile time): clang's
# __builtin_nontemporal_store on any target, gcc's x86 movnt builtins; an address that is not aligned
# to the vector's size (a view into a buffer) or another compiler stores normally.
STREAM_SIZES = (16, 32, 64)
_STREAM_GCC = {64: ("__AVX512F__", "__builtin_ia32_movntps512"), 32: ("__AVX__", "__builtin_ia32_movntps256"),
               16: ("__SSE__", "__builtin_ia32_movntps")}
STREAM_FENCE = ("static inline void pg_stream_fence(void) {\n#if defined(__x86_64__) || defined(__i386__)\n"
                "  __builtin_ia32_sfence();\n#endif\n}")


def stream_helper(size: int) -> str:
    """`pg_stream<size>(void* p, pg_nt<size> v)`: a non-temporal store of a size-byte vector (any lane type,
    reinterpreted as floats) where p is aligned, else a plain store."""
    macro, builtin = _STREAM_GCC[size]
    t, aligned = f"pg_nt{size}", f"(((uintptr_t)p & {size - 1}) == 0)"
    return (f"typedef float {t} __attribute__((vector_size({size})));\n"
            f"static inline void pg_stream{size}(void* p, {t} v) {{\n"
            f"#if defined(__clang__)\n  if ({aligned}) {{ __builtin_nontemporal_store(v, ({t}*)p); return; }}\n"
            f"#elif defined({macro})\n  if ({aligned}) {{ {builtin}((float*)p, v); return; }}\n#endif\n"
            f"  __builtin_memcpy(p, &v, sizeof(v));\n}}")


def transpose_rounds(n: int) -> list[list[tuple[int, int, str]]]:
    """An n x n transpose (n a power of two) as log2(n) rounds of two-source lane shuffles: per round and
    output row k, (row a, row b, the shuffle's lane list over a's lanes 0..n-1 and b's n..2n-1) of the
    round's input. The round with block size s pairs rows j and j + s (j & s == 0): row j takes j's lane
    i where i & s == 0 and j + s's lane i - s elsewhere; row j + s takes j's lane i + s and j + s's lane i.
    After the last round row k holds every input row's lane k, in row order.

    >>> transpose_rounds(4)[0][0]
    (0, 1, '0, 4, 2, 6')
    """
    rounds = []
    s = 1
    while s < n:
        rows = []
        for k in range(n):
            low = k & ~s
            lanes = [i if not i & s else n + i - s for i in range(n)] if k == low else \
                [i + s if not i & s else n + i for i in range(n)]
            rows.append((low, low + s, ", ".join(map(str, lanes))))
        rounds.append(rows)
        s *= 2
    return rounds


def trapping_division(x: Inst) -> bool:
    """A signed IDIV/MOD that C may compute with a trapping instruction (INT_MIN / -1 raises SIGFPE on
    x86): 32 or 64 bits (narrower types are promoted to int, where the quotient fits), and a divisor that
    is not a constant other than -1 (index arithmetic divides by positive constants and stays plain)."""
    if x.arg not in (Ops.IDIV, Ops.MOD) or x.dtype is None or x.dtype.kind != "int" or x.dtype.itemsize < 4:
        return False
    d = x.src[1]
    while d.op is L.BCAST:
        d = d.src[0]
    if d.op is not L.CONST:
        return True
    values = d.arg if isinstance(d.arg, tuple) else (d.arg,)
    return any(int(v) == -1 for v in values)
