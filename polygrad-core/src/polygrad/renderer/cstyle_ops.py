"""The C-family renderer's op tables: one row per op, its C expression for scalars and for lanes.

Stage: rendering (used by renderer/cstyle.py). Input: an op, its result dtype `dt`, its first
operand's dtype `sdt`, the operands' C expressions `a` and the lane count `n`. Output: a C expression.

A row is a format string over the operands (`"({0}+{1})"`) or a function `(renderer, dt, sdt, a, n)`
that may ask the renderer for its dialect's pieces (`ctype`, `math_fn`, `select`, `mask_of`...). A
dialect changes an op by replacing its row: `{**SCALAR_RULES, Ops.BITCAST: cuda_bitcast}` (the CUDA
renderer does). In the vector tables a row giving None means "no lane-wise form": the renderer runs
the scalar row on one lane at a time. See renderer/cstyle.py for the semantics these implement
(wrapping integers, NaN-propagating MAX, one rounding for FMA, bool masks 0 / -1 in lanes).
"""
from __future__ import annotations

from typing import Any, Callable, Union

from polygrad.dtype import DType, dtypes
from polygrad.uop.ops import Ops

Rule = Union[str, Callable[..., Any]]  # a format string over the operands, or fn(renderer, dt, sdt, a, n)
SIGNED_OF_SIZE = {1: dtypes.int8, 2: dtypes.int16, 4: dtypes.int32, 8: dtypes.int64}


def apply_rule(table: dict[Ops, Rule], op: Ops, r: Any, dt: DType, sdt: DType, a: list[str], n: int,
               missing: str) -> Any:
    """The C text table's row for op gives (or None); `missing` is the error when there is no row."""
    rule = table.get(op)
    if rule is None:
        raise NotImplementedError(missing)
    if isinstance(rule, str):
        return rule.format(*a)
    return rule(r, dt, sdt, a, n)


def libm(name: str, arity: int) -> Callable[..., str]:
    """A libm call (`expf`, `exp2`, ...: the renderer's math_fn picks the float or double name)."""
    return lambda r, dt, sdt, a, n: f"{r.math_fn(name, dt)}({','.join(a[:arity])})"


def float_or(name: str, arity: int, other: Callable[[list[str]], Any]) -> Callable[..., Any]:
    """libm's `name` on floats, `other(a)` on integers and bools."""
    call = libm(name, arity)
    return lambda r, dt, sdt, a, n: call(r, dt, sdt, a, n) if dt.is_float else other(a)


def _scalar_max(r: Any, dt: DType, sdt: DType, a: list[str], n: int) -> str:
    if dt.is_float:  # NaN wins, as in NumPy
        return f"(({a[0]}!={a[0]}||{a[0]}>{a[1]})?{a[0]}:{a[1]})"
    return f"(({a[0]}>{a[1]})?{a[0]}:{a[1]})"


def _scalar_cast(r: Any, dt: DType, sdt: DType, a: list[str], n: int) -> str:
    if dt is dtypes.bool:
        return f"({a[0]}!=0)"
    return r.round_half(dt, f"(({r.ctype(dt)})({a[0]}))")


def _scalar_bitcast(r: Any, dt: DType, sdt: DType, a: list[str], n: int) -> str:
    src = r.to_storage(sdt, a[0])
    bits = f"({{union {{{r.storage_ctype(sdt)} i; {r.storage_ctype(dt)} o;}} u_; u_.i = {src}; u_.o;}})"
    return r.from_storage(dt, bits)


# scalar C: one expression per op (dt the result dtype, sdt the first operand's)
SCALAR_RULES: dict[Ops, Rule] = {
    Ops.ADD: "({0}+{1})",
    Ops.MUL: "({0}*{1})",
    Ops.NEG: lambda r, dt, sdt, a, n: f"(!{a[0]})" if dt is dtypes.bool else f"(-{a[0]})",
    Ops.FDIV: "({0}/{1})",
    Ops.IDIV: "({0}/{1})",
    Ops.MOD: float_or("fmod", 2, lambda a: f"({a[0]}%{a[1]})"),
    Ops.MAX: _scalar_max,
    Ops.CMPLT: "({0}<{1})",
    Ops.CMPNE: "({0}!={1})",
    Ops.CMPEQ: "({0}=={1})",
    Ops.AND: "({0}&{1})",
    Ops.OR: "({0}|{1})",
    Ops.XOR: "({0}^{1})",
    Ops.SHL: "({0}<<{1})",
    Ops.SHR: "({0}>>{1})",
    Ops.WHERE: "({0}?{1}:{2})",
    # one rounding: libm's fma is correctly rounded (a single instruction with FMA hardware)
    Ops.FMA: float_or("fma", 3, lambda a: f"({a[0]}*{a[1]}+{a[2]})"),
    Ops.EXP2: libm("exp2", 1),
    Ops.LOG2: libm("log2", 1),
    Ops.SIN: libm("sin", 1),
    Ops.SQRT: libm("sqrt", 1),
    Ops.TRUNC: float_or("trunc", 1, lambda a: a[0]),
    Ops.POW: libm("pow", 2),
    Ops.RECIPROCAL: lambda r, dt, sdt, a, n: f"(({r.ctype(dt)})1/{a[0]})",
    Ops.CAST: _scalar_cast,
    Ops.BITCAST: _scalar_bitcast,
}


def _compare(sym: str) -> Callable[..., str]:
    """A lane-wise comparison, as the int32 bool mask."""
    return lambda r, dt, sdt, a, n: r.mask_of(f"{a[0]}{sym}{a[1]}", sdt.itemsize, n)


def _vector_max(r: Any, dt: DType, sdt: DType, a: list[str], n: int) -> str:
    mask = f"(({a[0]}!={a[0]})|({a[0]}>{a[1]}))" if dt.is_float else f"({a[0]}>{a[1]})"
    return r.select(mask, a[0], a[1], dt, n)


def _vector_where(r: Any, dt: DType, sdt: DType, a: list[str], n: int) -> str:
    mask = a[0] if dt.itemsize == 4 else \
        f"__builtin_convertvector({a[0]}, {r.vtype(SIGNED_OF_SIZE[dt.itemsize], n)})"
    return r.select(mask, a[1], a[2], dt, n)


def _vector_cast(r: Any, dt: DType, sdt: DType, a: list[str], n: int) -> str:
    if dt is dtypes.bool:
        return r.mask_of(f"{a[0]}!={r.splat(sdt, n, '0')}", sdt.itemsize, n)
    if sdt is dtypes.bool:
        return f"__builtin_convertvector(-{a[0]}, {r.vtype(dt, n)})"
    return f"__builtin_convertvector({a[0]}, {r.vtype(dt, n)})"


def per_lane(r: Any, dt: DType, sdt: DType, a: list[str], n: int) -> None:
    """No vector operator in C: the renderer applies the scalar row one lane at a time."""
    return None


def integer_only(rule: str) -> Callable[..., str | None]:
    """The lane-wise `rule` on integer lanes; floats go one lane at a time."""
    return lambda r, dt, sdt, a, n: None if dt.is_float else rule.format(*a)


# n-lane vectors (GCC/clang vector extensions), operands already vectors of n lanes
VECTOR_RULES: dict[Ops, Rule] = {
    Ops.ADD: "({0}+{1})",
    Ops.MUL: "({0}*{1})",
    Ops.FDIV: "({0}/{1})",
    Ops.IDIV: "({0}/{1})",
    Ops.AND: "({0}&{1})",
    Ops.OR: "({0}|{1})",
    Ops.XOR: "({0}^{1})",
    Ops.SHL: "({0}<<{1})",
    Ops.SHR: "({0}>>{1})",
    Ops.NEG: "(-{0})",
    Ops.MOD: integer_only("({0}%{1})"),
    Ops.CMPLT: _compare("<"),
    Ops.CMPNE: _compare("!="),
    Ops.CMPEQ: _compare("=="),
    Ops.MAX: _vector_max,
    Ops.WHERE: _vector_where,
    Ops.FMA: integer_only("({0}*{1}+{2})"),
    Ops.TRUNC: lambda r, dt, sdt, a, n: None if dt.is_float else a[0],
    Ops.RECIPROCAL: lambda r, dt, sdt, a, n: f"({r.splat(dt, n, '1')}/{a[0]})",
    Ops.CAST: _vector_cast,
    Ops.BITCAST: lambda r, dt, sdt, a, n: f"(({r.vtype(dt, n)})({a[0]}))",
    Ops.SQRT: per_lane,
    Ops.POW: per_lane,
    Ops.EXP2: per_lane,
    Ops.LOG2: per_lane,
    Ops.SIN: per_lane,
}

# logic on bool lanes (int32 masks: false 0, true -1), where the result and the operands are bools
MASK_RULES: dict[Ops, Rule] = {
    Ops.ADD: "({0}|{1})",
    Ops.OR: "({0}|{1})",
    Ops.MAX: "({0}|{1})",
    Ops.MUL: "({0}&{1})",
    Ops.AND: "({0}&{1})",
    Ops.XOR: "({0}^{1})",
    Ops.CMPNE: "({0}^{1})",
    Ops.CMPEQ: "(~({0}^{1}))",
    Ops.CMPLT: "(~{0}&{1})",  # false < true
    Ops.NEG: "(~{0})",
    Ops.WHERE: lambda r, dt, sdt, a, n: r.select(a[0], a[1], a[2], dt, n),
}
