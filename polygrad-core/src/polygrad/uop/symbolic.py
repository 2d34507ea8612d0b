"""Symbolic simplification of integer index arithmetic and constant folding.

Stage: lowering. Input: kernel-IR index expressions. Output: the same values, cheaper. Rules use
value bounds (`bounds`) so that, e.g., (i*4+j)//4 becomes i when 0 <= j < 4.
"""
from __future__ import annotations

import math
import operator

from polygrad.dtype import dtypes
from polygrad.uop.ops import Ops, UOp
from polygrad.uop.rewrite import PatternMatcher, UPat

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
    """(sum of terms)//c: pull out the terms that are multiples of c when the rest stays in [0, c)."""
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
        if rlo < 0 or rhi >= c.arg:
            return None
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


symbolic_rules = PatternMatcher([
    # constant folding
    (UPat((Ops.ADD, Ops.MUL, Ops.MAX, Ops.IDIV, Ops.MOD, Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ, Ops.AND, Ops.OR,
           Ops.XOR), name="x", src=(UPat(Ops.CONST), UPat(Ops.CONST))), _fold_binary),
    (UPat(Ops.NEG, name="x", src=(UPat(Ops.CONST, name="c"),)),
     lambda x, c: UOp.const(x.dtype, -c.arg) if x.dtype is not dtypes.bool else None),  # exact for floats too
    # constants go on the right of commutative ops
    (UPat((Ops.ADD, Ops.MUL), name="x", src=(UPat(Ops.CONST, name="c"), UPat(name="y"))),
     lambda x, c, y: x.replace(src=(y, c)) if y.op is not Ops.CONST else None),
    # identities
    (UPat(Ops.ADD, src=(UPat(name="y"), UPat(Ops.CONST, arg=0))), lambda y: y if _is_int(y) else None),
    # y * 1 is y in every dtype (exact for floats too: -0.0, infinities and NaN keep their value)
    (UPat(Ops.MUL, src=(UPat(name="y"), UPat(Ops.CONST, arg=1))), lambda y: y if y.dtype is not None else None),
    (UPat(Ops.MUL, name="x", src=(UPat(name="y"), UPat(Ops.CONST, arg=0))),
     lambda x, y: x.const_like(0) if _is_int(y) else None),
    (UPat(Ops.IDIV, src=(UPat(name="y"), UPat(Ops.CONST, arg=1))), lambda y: y if _is_int(y) else None),
    # reassociate constants: (y + c1) + c2, (y * c1) * c2, (y + c1) * c2
    (UPat(Ops.ADD, src=(UPat(Ops.ADD, src=(UPat(name="y"), UPat(Ops.CONST, name="c1"))), UPat(Ops.CONST, name="c2"))),
     lambda y, c1, c2: y + (c1.arg + c2.arg) if _is_int(y) else None),
    (UPat(Ops.MUL, src=(UPat(Ops.MUL, src=(UPat(name="y"), UPat(Ops.CONST, name="c1"))), UPat(Ops.CONST, name="c2"))),
     lambda y, c1, c2: y * (c1.arg * c2.arg) if _is_int(y) else None),
    (UPat(Ops.MUL, src=(UPat(Ops.ADD, src=(UPat(name="y"), UPat(name="z"))), UPat(Ops.CONST, name="c"))),
     lambda y, z, c: y * c + z * c if _is_int(y) else None),
    # move constants outward in sums: (y + c) + z -> (y + z) + c
    (UPat(Ops.ADD, src=(UPat(Ops.ADD, src=(UPat(name="y"), UPat(Ops.CONST, name="c"))), UPat(name="z"))),
     lambda y, c, z: (y + z) + c if _is_int(y) and z.op is not Ops.CONST else None),
    # (a//c)*c + a%c -> a
    (UPat(Ops.ADD, name="x"), _divmod_fold),
    # division and modulo by bounds
    (UPat(Ops.IDIV, src=(UPat(name="x"), UPat(Ops.CONST, name="c"))), _div_simplify),
    (UPat(Ops.MOD, src=(UPat(name="x"), UPat(Ops.CONST, name="c"))), _mod_simplify),
    # (x // a) // b -> x // (a*b) for non-negative x
    (UPat(Ops.IDIV, src=(UPat(Ops.IDIV, src=(UPat(name="x"), UPat(Ops.CONST, name="a"))), UPat(Ops.CONST, name="b"))),
     lambda x, a, b: x // (a.arg * b.arg) if _is_int(x) and bounds(x)[0] >= 0 and a.arg > 0 and b.arg > 0 else None),
    # (x % (a*b)) // a stays; (x % a) % b when a % b == 0 -> x % b
    (UPat(Ops.MOD, src=(UPat(Ops.MOD, src=(UPat(name="x"), UPat(Ops.CONST, name="a"))), UPat(Ops.CONST, name="b"))),
     lambda x, a, b: x % b.arg if _is_int(x) and bounds(x)[0] >= 0 and b.arg > 0 and a.arg % b.arg == 0 else None),
    # (x // c) * c + x % c -> x: C's truncating division and remainder recombine for any sign
    (UPat(Ops.ADD, src=(UPat(Ops.MUL, src=(UPat(Ops.IDIV, src=(UPat(name="x"), UPat(Ops.CONST, name="c1"))),
                                           UPat(Ops.CONST, name="c2"))),
                        UPat(Ops.MOD, src=(UPat(name="x"), UPat(Ops.CONST, name="c3"))))),
     lambda x, c1, c2, c3: x if _is_int(x) and c1.arg == c2.arg == c3.arg != 0 else None),
    (UPat(Ops.ADD, src=(UPat(Ops.MOD, src=(UPat(name="x"), UPat(Ops.CONST, name="c3"))),
                        UPat(Ops.MUL, src=(UPat(Ops.IDIV, src=(UPat(name="x"), UPat(Ops.CONST, name="c1"))),
                                           UPat(Ops.CONST, name="c2"))))),
     lambda x, c1, c2, c3: x if _is_int(x) and c1.arg == c2.arg == c3.arg != 0 else None),
    # comparisons decided by bounds
    (UPat((Ops.CMPLT,), name="x", src=(UPat(name="a"), UPat(name="b"))), _cmp_fold),
    # boolean algebra on constants
    (UPat(Ops.AND, src=(UPat(name="y"), UPat(Ops.CONST, arg=True))), lambda y: y if y.dtype is dtypes.bool else None),
    (UPat(Ops.AND, src=(UPat(Ops.CONST, arg=True), UPat(name="y"))), lambda y: y if y.dtype is dtypes.bool else None),
    (UPat(Ops.WHERE, src=(UPat(Ops.CONST, name="c"), UPat(name="a"), UPat(name="b"))),
     lambda c, a, b: a if c.arg else b),
    (UPat(Ops.WHERE, src=(UPat(), UPat(name="a"), UPat(name="b"))), lambda a, b: a if a is b else None),
    # a load gated by g gives 0 where g is false (kernel IR): selecting it by g against 0 changes nothing
    (UPat(Ops.WHERE, src=(UPat(name="g"), UPat(Ops.LOAD, name="ld"), UPat(Ops.CONST, name="c"))), _gated_load_select),
    (UPat(Ops.CAST, name="x", src=(UPat(Ops.CONST, name="c"),)),
     lambda x, c: UOp.const(x.dtype, c.arg) if x.dtype.is_int and c.dtype.is_int else None),
], name="symbolic_rules")


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
