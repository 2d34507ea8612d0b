"""Symbolic simplification of integer index arithmetic and constant folding.

Stage: lowering. Input: kernel-IR index expressions. Output: the same values, cheaper. Rules use
value bounds (`bounds`) so that, e.g., (i*4+j)//4 becomes i when 0 <= j < 4.

The rule rows are data, polygrad/definitions/symbolic_rules.py, which polygrad-js interprets too
(src/simplify.js); this module implements the table's named conditions and its code rows (the
rewrites that walk a sum's terms or split cases on bounds), and builds `symbolic_rules` from it.
"""
from __future__ import annotations

import math
import operator

from typing import Callable

from polygrad.definitions.symbolic_rules import RULES
from polygrad.dtype import dtypes
from polygrad.uop.ops import Ops, UOp
from polygrad.uop.rule_table import compile_rules

INT_RANGE_MAX = 2**62


def _cdiv(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _cmod(a: int, b: int) -> int:
    return a - b * _cdiv(a, b)


_bounds_cache: dict[UOp, tuple[int, int]] = {}


def bounds(u: UOp) -> tuple[int, int]:
    """Inclusive (min, max) an integer expression can take (conservative). The operands' bounds are
    filled in first, sources before users, with an explicit stack: an index may be a long sum."""
    hit = _bounds_cache.get(u)
    if hit is not None:
        return hit
    if len(_bounds_cache) > 200000:
        _bounds_cache.clear()
    stack = [(u, False)]
    while stack:
        node, ready = stack.pop()
        if node in _bounds_cache:
            continue
        if ready:  # its operands are cached: _bounds looks one level down only
            _bounds_cache[node] = _bounds(node)
            continue
        stack.append((node, True))
        stack.extend((s, False) for s in _bound_operands(node) if s not in _bounds_cache)
    return _bounds_cache[u]


def _bound_operands(u: UOp) -> tuple[UOp, ...]:
    """The sources whose bounds _bounds(u) reads."""
    op = u.op
    if op in (Ops.RANGE, Ops.BIND):
        return u.src[:1]
    if u.dtype is dtypes.bool or op in (Ops.CONST, Ops.DEFINE_VAR):
        return ()
    if op in (Ops.ADD, Ops.NEG, Ops.MUL, Ops.MAX):
        return u.src
    if op in (Ops.IDIV, Ops.MOD) and u.src[1].op is Ops.CONST and u.src[1].arg > 0:
        return u.src[:1]
    if op is Ops.WHERE:
        return u.src[1:]
    if op is Ops.CAST and u.src[0].dtype is not None and u.src[0].dtype.is_int:
        return u.src[:1]
    return ()


def _bounds(u: UOp) -> tuple[int, int]:
    big = (-INT_RANGE_MAX, INT_RANGE_MAX)
    if u.op is Ops.CONST:
        v = int(u.arg)
        return v, v
    if u.op is Ops.RANGE:
        lo, hi = bounds(u.src[0])
        return 0, max(hi - 1, 0)
    if u.op is Ops.DEFINE_VAR:
        return u.arg[1], u.arg[2]
    if u.op is Ops.BIND:  # a bound variable in a tensor-graph size: still ranges over its bounds
        return bounds(u.src[0])
    if u.dtype is dtypes.bool:
        return 0, 1
    if u.op is Ops.ADD:
        (a, b), (c, d) = bounds(u.src[0]), bounds(u.src[1])
        return a + c, b + d
    if u.op is Ops.NEG:
        a, b = bounds(u.src[0])
        return -b, -a
    if u.op is Ops.MUL:
        (a, b), (c, d) = bounds(u.src[0]), bounds(u.src[1])
        prods = [a * c, a * d, b * c, b * d]
        return min(prods), max(prods)
    if u.op is Ops.IDIV and u.src[1].op is Ops.CONST and u.src[1].arg > 0:
        a, b = bounds(u.src[0])
        c = u.src[1].arg
        return _cdiv(a, c), _cdiv(b, c)
    if u.op is Ops.MOD and u.src[1].op is Ops.CONST and u.src[1].arg > 0:
        a, b = bounds(u.src[0])
        c = u.src[1].arg
        if a >= 0:
            return (a, b) if b < c else (0, c - 1)
        return -(c - 1), c - 1
    if u.op is Ops.MAX:
        (a, b), (c, d) = bounds(u.src[0]), bounds(u.src[1])
        return max(a, c), max(b, d)
    if u.op is Ops.WHERE:
        (a, b), (c, d) = bounds(u.src[1]), bounds(u.src[2])
        return min(a, c), max(b, d)
    if u.op is Ops.CAST and u.src[0].dtype is not None and u.src[0].dtype.is_int:
        return bounds(u.src[0])
    return big


_FOLD = {
    Ops.ADD: operator.add, Ops.MUL: operator.mul, Ops.MAX: max,
    Ops.CMPLT: operator.lt, Ops.CMPNE: operator.ne, Ops.CMPEQ: operator.eq,
    Ops.AND: operator.and_, Ops.OR: operator.or_, Ops.XOR: operator.xor,
}


def _fold_binary(x: UOp) -> UOp | None:
    a, b = x.src
    if x.dtype is None or not (a.dtype.is_int or a.dtype is dtypes.bool):
        return None  # float folding is left to the compiler, which knows the rounding rules
    fn = _FOLD.get(x.op)
    if fn is not None:
        return UOp.const(x.dtype, fn(a.arg, b.arg))
    if x.op is Ops.IDIV and b.arg != 0:
        return UOp.const(x.dtype, _cdiv(a.arg, b.arg))
    if x.op is Ops.MOD and b.arg != 0:
        return UOp.const(x.dtype, _cmod(a.arg, b.arg))
    return None


def _gated_load_select(g: UOp, ld: UOp, c: UOp) -> UOp | None:
    if c.arg != 0 or (isinstance(c.arg, float) and math.copysign(1.0, c.arg) < 0):  # +0 only: a gated load gives +0
        return None
    ix = ld.src[0]
    return ld if ix.op is Ops.INDEX and len(ix.src) > 2 and ix.src[2] is g else None


def _is_int(u: UOp) -> bool:
    return u.dtype is not None and u.dtype.is_int


def _div_simplify(x: UOp, c: UOp) -> UOp | None:
    """(sum of terms)//c: pull out the terms that are multiples of c when the rest is non-negative (gone when it
    stays below c)."""
    if not _is_int(x) or c.arg <= 0:
        return None
    lo, hi = bounds(x)
    if lo >= 0 and hi < c.arg:
        return x.const_like(0)
    if lo < 0:
        return None
    terms = _split_sum(x)
    whole, rest = [], []
    for t in terms:
        k = _const_factor(t)
        (whole if k % c.arg == 0 and k != 0 else rest).append(t)
    if not whole:
        g = math.gcd(*[_const_factor(t) for t in terms]) if terms else 1
        if g > 1 and c.arg % g == 0 and all(_const_factor(t) != 0 for t in terms):
            # (a*g + b*g) // (c) = (a + b) // (c/g)
            inner = _sum([_divide_term(t, g) for t in terms])
            return inner // (c.arg // g) if c.arg // g != 1 else inner
        return None
    rest_sum = _sum(rest) if rest else None
    if rest_sum is not None:
        rlo, rhi = bounds(rest_sum)
        if rlo < 0:
            return None
        if rhi >= c.arg:  # x and the rest non-negative: C's x/c is the floor, and floor(c*k + r, c) = k + r//c
            return _sum([*(_divide_term(t, c.arg) for t in whole), rest_sum // c.arg])
    return _sum([_divide_term(t, c.arg) for t in whole])


def _mod_simplify(x: UOp, c: UOp) -> UOp | None:
    if not _is_int(x) or c.arg <= 0:
        return None
    lo, hi = bounds(x)
    if lo >= 0 and hi < c.arg:
        return x
    if c.arg == 1:
        return x.const_like(0)
    if lo < 0:
        return None
    terms = _split_sum(x)
    keep = [t for t in terms if _const_factor(t) % c.arg != 0]
    if len(keep) == len(terms):
        return _mod_reduce_factors(terms, c.arg)
    if not keep:
        return x.const_like(0)
    rest = _sum(keep)
    if bounds(rest)[0] < 0:
        return None  # C's % truncates: dropping a multiple of c is only exact if the sign is kept
    return rest % c.arg


def _mod_reduce_factors(terms: list[UOp], c: int) -> UOp | None:
    """(a*k + b) % c -> (a*(k % c) + b) % c when every term stays non-negative (sliding-window indices)."""
    out, changed = [], False
    for t in terms:
        k = _const_factor(t)
        if t.op is Ops.MUL and t.src[1].op is Ops.CONST and k >= c and bounds(t.src[0])[0] >= 0:
            t = t.src[0] if k % c == 1 else t.src[0] * (k % c)
            changed = True
        elif t.op is Ops.CONST and t.arg >= c:
            t = t.const_like(t.arg % c)
            changed = True
        out.append(t)
    if not changed or any(bounds(t)[0] < 0 for t in out):
        return None
    return _sum(out) % c


def _split_sum(x: UOp) -> list[UOp]:
    """The terms of a tree of ADDs, left to right (an explicit stack: a kernel's index may be a long sum)."""
    out: list[UOp] = []
    stack = [x]
    while stack:
        t = stack.pop()
        if t.op is Ops.ADD:
            stack += (t.src[1], t.src[0])
        else:
            out.append(t)
    return out


def _sum(terms: list[UOp]) -> UOp:
    out = terms[0]
    for t in terms[1:]:
        out = out + t
    return out


def _const_factor(t: UOp) -> int:
    if t.op is Ops.CONST:
        return int(t.arg)
    if t.op is Ops.MUL and t.src[1].op is Ops.CONST:
        return int(t.src[1].arg)
    return 1


def _divide_term(t: UOp, c: int) -> UOp:
    if t.op is Ops.CONST:
        return t.const_like(t.arg // c)
    if t.op is Ops.MUL and t.src[1].op is Ops.CONST:
        k = t.src[1].arg // c
        return t.src[0] if k == 1 else t.src[0] * k
    raise ValueError("term has no constant factor")


def _divmod_fold(x: UOp) -> UOp | None:
    """(a//c)*c + a%c + rest -> a + rest: C's truncating division and remainder satisfy
    (a/c)*c + a%c == a for every a (a flat index split into two axes and joined again)."""
    if not _is_int(x):
        return None
    terms = _split_sum(x)
    mods = {(t.src[0], t.src[1].arg): i for i, t in enumerate(terms)
            if t.op is Ops.MOD and t.src[1].op is Ops.CONST and t.src[1].arg != 0}
    if not mods:
        return None
    for i, t in enumerate(terms):
        if t.op is Ops.MUL and t.src[1].op is Ops.CONST and t.src[0].op is Ops.IDIV \
                and t.src[0].src[1].op is Ops.CONST and t.src[0].src[1].arg == t.src[1].arg:
            j = mods.get((t.src[0].src[0], t.src[1].arg))
            if j is not None:
                rest = [u for k, u in enumerate(terms) if k not in (i, j)]
                return _sum([t.src[0].src[0], *rest])
    return None


def _cmp_fold(x: UOp, a: UOp, b: UOp) -> UOp | None:
    if not (_is_int(a) and _is_int(b)):
        return None
    (alo, ahi), (blo, bhi) = bounds(a), bounds(b)
    if x.op is Ops.CMPLT:
        if ahi < blo:
            return UOp.const(dtypes.bool, True)
        if alo >= bhi:
            return UOp.const(dtypes.bool, False)
    return None


# the named conditions and code functions of definitions/symbolic_rules.py (polygrad-js: simplify.js)
CONDITIONS: dict[str, Callable[..., bool]] = {
    "is_int": _is_int,
    "is_bool": lambda u: u.dtype is dtypes.bool,
    "has_dtype": lambda u: u.dtype is not None,
    "not_bool": lambda u: u.dtype is not None and u.dtype is not dtypes.bool,
    "not_const": lambda u: u.op is not Ops.CONST,
    "nonneg": lambda u: bounds(u)[0] >= 0,
    "positive": lambda c: c.arg > 0,
    "nonzero": lambda c: c.arg != 0,
    "divides": lambda b, a: a.arg % b.arg == 0,
    "same": lambda a, b: a is b,
    "equal": lambda *cs: all(c.arg == cs[0].arg for c in cs),
}
CODE: dict[str, Callable[..., "UOp | None"]] = {
    "fold_binary": _fold_binary,
    "divmod_fold": _divmod_fold,
    "div_simplify": _div_simplify,
    "mod_simplify": _mod_simplify,
    "cmp_fold": _cmp_fold,
    "gated_load_select": _gated_load_select,
}
symbolic_rules = compile_rules(RULES, CONDITIONS, CODE, name="symbolic_rules")


def range_coeff(expr: UOp, r: UOp) -> int | None:
    """The constant c such that expr = c*r + (terms without r), or None if r appears otherwise.
    One walk over expr's nodes (sources first), not one per sub-expression."""
    if expr is r:
        return 1
    coeff: dict[UOp, int | None] = {r: 1}
    for node in expr.toposort():
        if node in coeff:
            continue
        cs = [coeff.get(s, 0) for s in node.src]
        if all(c == 0 for c in cs):
            coeff[node] = 0
        elif any(c is None for c in cs):
            coeff[node] = None
        elif node.op is Ops.ADD:
            coeff[node] = cs[0] + cs[1]
        elif node.op is Ops.MUL and node.src[1].op is Ops.CONST and cs[1] == 0:
            coeff[node] = cs[0] * int(node.src[1].arg)
        else:
            coeff[node] = None
    return coeff[expr]
