"""Symbolic sizes: bounded integer Variables, their per-call values, and shape arithmetic over them.

Stage: shared. `Variable("batch", 1, 64)` is a DEFINE_VAR UOp, dtype int32, arg (name, min, max).
`v.bind(n)` is BIND(DEFINE_VAR, CONST n): the variable with this call's value. A shape entry is an
int or a *symbolic size*: an int32 UOp expression over BIND nodes (tensor graphs, so each size still
knows its value) or over bare DEFINE_VAR nodes (after the scheduler strips the values out, so one
schedule and one compiled program serve every value; the values travel beside it as `var_vals`).

Arithmetic on sizes goes through the helpers here (sadd, smul, sprod, ...): ints stay ints, and a
symbolic result is simplified with the index rules, so equal sizes are the same hash-consed UOp and
shapes compare with `==`.
"""
from __future__ import annotations

import re
from typing import Any, Callable, Iterable

import numpy as np

from polygrad.dtype import dtypes
from polygrad.errors import VariableError
from polygrad.uop.names import NAME_RULE, is_plain_name
from polygrad.uop.ops import Ops, UOp, provided
from polygrad.uop.rewrite import graph_rewrite
from polygrad.uop.symbolic import bounds, symbolic_rules

MAX_BOUND = 2**31 - 1  # variables are int32 kernel parameters


# ---------------------------------------------------------------------------------------------------
# variables and binding


def Variable(name: str, min_val: int, max_val: int) -> UOp:  # noqa: N802 (tinygrad's spelling)
    """A bounded integer size, `min_val <= v <= max_val`; bind it per call with `v.bind(n)`.

    >>> from polygrad import Variable
    >>> v = Variable("batch", 1, 64)
    >>> v.bind(8).unbind()[1]
    8
    """
    if not is_plain_name(name):  # the one rule for names (uop/names.py): no name reaches generated source
        raise VariableError(f"Variable name {name!r:.80} must be {NAME_RULE}; e.g. Variable('batch', 1, 64)")
    for what, v in (("min", min_val), ("max", max_val)):
        if not _is_int(v):
            raise VariableError(f"Variable {name!r}: {what} bound must be an int, got {v!r}")
    min_val, max_val = int(min_val), int(max_val)
    if not 0 <= min_val <= max_val <= MAX_BOUND:
        raise VariableError(f"Variable {name!r}: bounds must satisfy 0 <= min <= max <= {MAX_BOUND} "
                            f"(sizes are non-negative int32), got min={min_val}, max={max_val}")
    return UOp(Ops.DEFINE_VAR, dtypes.int32, (), (name, min_val, max_val))


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def bind(var: UOp, value: Any) -> UOp:
    """BIND(var, value), after checking that value is an int inside var's bounds."""
    if var.op is not Ops.DEFINE_VAR:
        raise VariableError(f"bind() is called on a Variable (a DEFINE_VAR), not on {var.op.name}; "
                            "make one with polygrad.Variable(name, min, max)")
    name, lo, hi = var.arg
    if not _is_int(value):
        raise VariableError(f"Variable {name!r} must be bound to an int, got {type(value).__name__} {value!r}; "
                            f"pass int(n)")
    value = int(value)
    if not lo <= value <= hi:
        raise VariableError(f"Variable {name!r} bound to {value}, outside its bounds [{lo}, {hi}]; bind a value in "
                            f"range or make the Variable with wider bounds (one compiled program serves them all)")
    return UOp(Ops.BIND, var.dtype, (var, UOp.const(var.dtype, value)))


def unbind(b: UOp) -> tuple[UOp, int]:
    """(variable, value) of a BIND."""
    if b.op is not Ops.BIND:
        raise VariableError(f"unbind() needs a bound variable (v.bind(n)), got {b.op.name}")
    return b.src[0], int(b.src[1].arg)


# ---------------------------------------------------------------------------------------------------
# size arithmetic


def is_sym(x: Any) -> bool:
    return isinstance(x, UOp)


_simplified: dict[UOp, Any] = {}


def canon(x: Any) -> Any:
    """An int, or the simplified (canonical) form of a symbolic size."""
    if not isinstance(x, UOp):
        return int(x)
    hit = _simplified.get(x)
    if hit is not None:
        return hit
    if x.dtype is None or not (x.dtype.is_int):
        raise TypeError(f"a size must be an int or an integer symbolic expression, got {x.op.name} {x.dtype}")
    out = graph_rewrite(x, symbolic_rules)
    res: Any = int(out.arg) if out.op is Ops.CONST else out
    if len(_simplified) > 100000:
        _simplified.clear()
    _simplified[x] = res
    if isinstance(res, UOp):
        _simplified[res] = res
    return res


def _lift(x: Any) -> UOp:
    return x if isinstance(x, UOp) else UOp.const(dtypes.int32, int(x))


def _sym_binary(op: Ops, a: Any, b: Any, fn: Callable[[int, int], int]) -> Any:
    if not isinstance(a, UOp) and not isinstance(b, UOp):
        return fn(int(a), int(b))
    a, b = _lift(a), _lift(b)
    return canon(UOp(op, a.dtype, (a, b)))


def sadd(a: Any, b: Any) -> Any:
    """a + b; a term and its negation cancel, so n + (64 - n) is 64 (the padded shape of a Variable slice's
    gradient), whatever the binding of n."""
    if not isinstance(a, UOp) and not isinstance(b, UOp):
        return int(a) + int(b)
    terms, const = _terms(canon(a))
    more, bconst = _terms(canon(b))
    if not any((t.src[0] if t.op is Ops.NEG else UOp(Ops.NEG, t.dtype, (t,))) in terms for t in more):
        return _sym_binary(Ops.ADD, a, b, lambda x, y: x + y)
    const += bconst
    for t in more:
        negated = t.src[0] if t.op is Ops.NEG else UOp(Ops.NEG, t.dtype, (t,))
        if negated in terms:
            terms.remove(negated)
        else:
            terms.append(t)
    return _from_terms(terms, const)


def ssub(a: Any, b: Any) -> Any:
    """a - b; terms of b found in a cancel, so (pos + 1) - pos is 1 (the length of cache[pos:pos+1])."""
    if not isinstance(a, UOp) and not isinstance(b, UOp):
        return int(a) - int(b)
    if a is b:
        return 0
    if not isinstance(b, UOp):
        return sadd(a, -int(b))
    terms, const = _terms(canon(a))
    neg, bconst = _terms(canon(b))
    const -= bconst
    for t in neg:
        if t in terms:
            terms.remove(t)
        else:
            terms.append(UOp(Ops.NEG, t.dtype, (t,)))
    return _from_terms(terms, const)


def _from_terms(terms: list[UOp], const: int) -> Any:
    """The canonical sum of `terms` and `const`."""
    out: Any = const
    for t in terms:
        out = t if out == 0 and not isinstance(out, UOp) else UOp(Ops.ADD, t.dtype, (_lift(out), t))
    return canon(out)


def _operands(x: Any, op: Ops, unit: int, fold: Callable[[int, int], int]) -> tuple[list[UOp], int]:
    """The non-constant operands of a chain of `op` (a sum, a product) and its constants folded."""
    if not isinstance(x, UOp):
        return [], int(x)
    if x.op is Ops.CONST:
        return [], int(x.arg)
    if x.op is op:
        (la, ca), (lb, cb) = (_operands(s, op, unit, fold) for s in x.src)
        return la + lb, fold(ca, cb)
    return [x], unit


def _terms(x: Any) -> tuple[list[UOp], int]:
    """The non-constant terms of a sum and its constant part."""
    return _operands(x, Ops.ADD, 0, lambda a, b: a + b)


def smul(a: Any, b: Any) -> Any:
    return _sym_binary(Ops.MUL, a, b, lambda x, y: x * y)


def _factors(x: Any) -> tuple[list[UOp], int]:
    """The non-constant factors of a product and its constant part."""
    return _operands(x, Ops.MUL, 1, lambda a, b: a * b)


def sdiv(a: Any, b: Any) -> Any:
    """a // b (callers check divisibility first). Factors of b found in a cancel, so the -1 of
    reshape(batch, -1) over (batch, 96) is 96, not (batch*96)//batch (sizes are positive)."""
    if isinstance(a, UOp) or isinstance(b, UOp):
        num, cnum = _factors(canon(a))
        den, cden = _factors(canon(b))
        rest = list(num)
        cancels = cden != 0 and cnum % cden == 0
        for f in den:
            if f not in rest:
                cancels = False
                break
            rest.remove(f)
        if cancels:
            out: Any = cnum // cden
            for f in rest:
                out = smul(out, f)
            return out
    return _sym_binary(Ops.IDIV, a, b, lambda x, y: x // y)


def smod(a: Any, b: Any) -> Any:
    return _sym_binary(Ops.MOD, a, b, lambda x, y: x % y)


def sprod(xs: Iterable[Any]) -> Any:
    xs = tuple(xs)
    out: Any = 1
    for x in xs:
        if isinstance(x, UOp):
            break
        out *= int(x)
    else:
        return out  # all ints: the common case stays plain integer arithmetic
    out = 1
    for x in xs:
        out = smul(out, x)
    return out


# ---------------------------------------------------------------------------------------------------
# values and bounds


class _NotEvaluable(Exception):
    pass


_EVAL = {
    Ops.ADD: lambda a, b: a + b, Ops.MUL: lambda a, b: a * b, Ops.MAX: max,
    Ops.CMPLT: lambda a, b: a < b, Ops.CMPNE: lambda a, b: a != b, Ops.CMPEQ: lambda a, b: a == b,
    Ops.AND: lambda a, b: a & b, Ops.OR: lambda a, b: a | b,
}


def _trunc_div(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def sym_eval(x: Any, env: dict[UOp, int] | None = None) -> int:
    """The int value of a size: BINDs give their bound values, DEFINE_VARs their value in env
    (VariableError when a variable has none). Division and modulo truncate, as in the kernels."""
    if not isinstance(x, UOp):
        return int(x)
    env = env or {}
    vals: dict[UOp, Any] = {}
    unbound: set[UOp] = set()
    for n in x.toposort():
        op = n.op
        if op is Ops.CONST:
            v = n.arg
        elif op is Ops.DEFINE_VAR:
            v = env.get(n, 0)
            if n not in env:
                unbound.add(n)  # fine under a BIND; an error when used bare
        elif op is Ops.BIND:
            v = env.get(n.src[0], vals[n.src[1]])
            vals[n] = v
            continue
        elif unbound and any(s in unbound for s in n.src):
            var = next(s for s in n.src if s in unbound)
            raise VariableError(f"Variable {var.arg[0]!r} is not bound; bind it to this call's value with "
                                f"v.bind(n) (e.g. x.reshape(v.bind(n), ...)) before realizing")
        elif op is Ops.NEG:
            v = -vals[n.src[0]]
        elif op is Ops.CAST:
            v = vals[n.src[0]]
            v = bool(v) if n.dtype is dtypes.bool else int(v)
        elif op is Ops.IDIV:
            v = _trunc_div(vals[n.src[0]], vals[n.src[1]])
        elif op is Ops.MOD:
            a, b = vals[n.src[0]], vals[n.src[1]]
            v = a - b * _trunc_div(a, b)
        elif op is Ops.WHERE:
            v = vals[n.src[1]] if vals[n.src[0]] else vals[n.src[2]]
        elif op in _EVAL:
            v = _EVAL[op](vals[n.src[0]], vals[n.src[1]])
        else:
            raise _NotEvaluable(op.name)
        vals[n] = v
    if x in unbound:
        raise VariableError(f"Variable {x.arg[0]!r} is not bound; bind it to this call's value with "
                            f"v.bind(n) (e.g. x.reshape(v.bind(n), ...)) before realizing")
    return vals[x]


def resolve(x: Any) -> int | None:
    """The value of a size from its BINDs; None when some variable in it is unbound."""
    try:
        return sym_eval(x)
    except (VariableError, _NotEvaluable):
        return None


def value(x: Any) -> int:
    """The value of a size from its BINDs; VariableError naming the unbound variable otherwise."""
    try:
        return sym_eval(x)
    except _NotEvaluable as e:
        raise TypeError(f"a size cannot contain {e}") from None


def vmin(x: Any) -> int:
    if not isinstance(x, UOp):
        return int(x)
    return bounds(x)[0]


def vmax(x: Any) -> int:
    """The largest value a size can take over its variables' bounds (what buffers are allocated for)."""
    if not isinstance(x, UOp):
        return int(x)
    return bounds(x)[1]


def sym_truth(u: UOp) -> bool:
    """bool() of a comparison between sizes: decided from the bound values, else from the bounds."""
    if not any(n.op in (Ops.BIND, Ops.DEFINE_VAR) for n in u.toposort()):
        return True  # kernel IR (loop indices, loads): a node, not a decidable value
    try:
        return bool(sym_eval(u))
    except _NotEvaluable:
        return True
    except VariableError:
        pass
    if u.op is Ops.CMPLT:
        a, b = u.src
        if vmax(a) < vmin(b):
            return True
        if vmin(a) >= vmax(b):
            return False
    raise VariableError(f"cannot decide the size comparison {sym_str(u)} for every value of its unbound "
                        "variables; bind them (v.bind(n)) first")


def sym_equal(a: Any, b: Any) -> bool:
    """Sizes equal: the same canonical expression, or the same value under their bound values."""
    if not isinstance(a, UOp) and not isinstance(b, UOp):
        return int(a) == int(b)
    if canon(a) is canon(b):
        return True
    va, vb = resolve(a), resolve(b)
    return va is not None and va == vb


# ---------------------------------------------------------------------------------------------------
# moving values in and out of sizes


def sym_vars(x: Any) -> set[UOp]:
    """The DEFINE_VARs in a size, or in a tuple (of tuples) of sizes."""
    out: set[UOp] = set()
    for u in _uops_in(x):
        out.update(n for n in u.toposort() if n.op is Ops.DEFINE_VAR)
    return out


def _uops_in(x: Any) -> list[UOp]:
    if isinstance(x, UOp):
        return [x]
    if isinstance(x, tuple):
        return [u for a in x for u in _uops_in(a)]
    return []


INT_TYPES = frozenset((int,))  # `INT_TYPES.issuperset(map(type, sizes))`: plain sizes, checked in C


def has_sym(x: Any) -> bool:
    """Whether a size, or a (nested) tuple of sizes, holds a symbolic one."""
    if isinstance(x, UOp):
        return True
    if not isinstance(x, tuple):
        return False
    if INT_TYPES.issuperset(map(type, x)):  # plain sizes (the common case)
        return False
    for a in x:
        if isinstance(a, UOp) or (isinstance(a, tuple) and has_sym(a)):
            return True
    return False


def map_sizes(x: Any, fn: Callable[[UOp], "UOp | None"]) -> Any:
    """x (a size or nested tuple of sizes) with every node fn maps replaced; results re-simplified."""
    if isinstance(x, tuple) and type(x) is tuple:
        return tuple(map_sizes(a, fn) for a in x)
    if not isinstance(x, UOp):
        return x
    out: dict[UOp, UOp] = {}
    for n in x.toposort():
        hit = fn(n)
        if hit is not None:
            out[n] = hit
            continue
        src = tuple(out[s] for s in n.src)
        out[n] = n if src == n.src else n.replace(src=src)
    return out[x] if out[x] is x else canon(out[x])


def strip_binds(x: Any, var_vals: dict[UOp, int]) -> Any:
    """x with every BIND replaced by its bare variable; the values go into var_vals (one per variable)."""
    def fn(n: UOp) -> UOp | None:
        if n.op is not Ops.BIND:
            return None
        var, val = n.src[0], int(n.src[1].arg)
        record(var_vals, var, val)
        return var
    return map_sizes(x, fn)


def record(var_vals: dict[UOp, int], var: UOp, val: int) -> None:
    prev = var_vals.get(var)
    if prev is not None and prev != val:
        raise VariableError(f"Variable {var.arg[0]!r} is bound to both {prev} and {val} in one computation; "
                            "realize the parts separately, or use two Variables")
    var_vals[var] = val


def attach_binds(x: Any, var_vals: dict[UOp, int]) -> Any:
    """x with every bare variable (and every BIND of it) bound to its value in var_vals."""
    def fn(n: UOp) -> UOp | None:
        if n.op is Ops.DEFINE_VAR and n in var_vals:
            return bind(n, var_vals[n])
        if n.op is Ops.BIND and n.src[0] in var_vals:
            return bind(n.src[0], var_vals[n.src[0]])
        return None
    return map_sizes(x, fn)


def sym_str(x: Any) -> str:
    """A short readable form of a size: 'batch', 'batch*16', '(pos+1)'."""
    if not isinstance(x, UOp):
        return str(x)
    if x.op is Ops.DEFINE_VAR:
        return x.arg[0]
    if x.op is Ops.BIND:
        return f"{x.src[0].arg[0]}={x.src[1].arg}"
    if x.op is Ops.CONST:
        return str(x.arg)
    sym = {Ops.ADD: "+", Ops.MUL: "*", Ops.IDIV: "//", Ops.MOD: "%", Ops.CMPLT: "<", Ops.MAX: " max "}
    if x.op in sym and len(x.src) == 2:
        return f"({sym_str(x.src[0])}{sym[x.op]}{sym_str(x.src[1])})"
    if x.op is Ops.NEG:
        return f"-{sym_str(x.src[0])}"
    if x.op is Ops.CAST:
        return sym_str(x.src[0])
    return x.op.name.lower()


def sym_name(x: Any) -> str:
    """A size as part of a C identifier (kernel names): 'batch', 'batchx16'."""
    if not isinstance(x, UOp):
        return str(x)
    text = sym_str(x).replace("*", "x").replace("=", "")
    return re.sub(r"[^A-Za-z0-9_]", "", text) or "s"


def concrete_shape(shape: tuple) -> tuple[int, ...]:
    """The shape with every symbolic size replaced by its bound value."""
    return tuple(value(s) if isinstance(s, UOp) else int(s) for s in shape)



def collect_binds(u: UOp, var_vals: dict[UOp, int] | None = None) -> dict[UOp, int]:
    """{variable: value} of every BIND in a tensor graph, in its nodes and in its nodes' sizes."""
    out: dict[UOp, int] = {} if var_vals is None else var_vals
    for n in u.toposort():
        if n.op is Ops.BIND:
            record(out, n.src[0], int(n.src[1].arg))
        elif isinstance(n.arg, tuple) and type(n.arg) is tuple and has_sym(n.arg):
            for s in _uops_in(n.arg):
                for m in s.toposort():
                    if m.op is Ops.BIND:
                        record(out, m.src[0], int(m.src[1].arg))
    return out


def rebind(u: UOp, var_vals: dict[UOp, int]) -> UOp:
    """A tensor graph with its BINDs of these variables (in nodes and sizes) set to the new values."""
    out: dict[UOp, UOp] = {}
    for n in u.toposort():
        src = tuple(out[s] for s in n.src)
        if n.op is Ops.BIND and n.src[0] in var_vals:
            out[n] = bind(n.src[0], var_vals[n.src[0]])
        elif isinstance(n.arg, tuple) and type(n.arg) is tuple and has_sym(n.arg):
            out[n] = UOp(n.op, n.dtype, src, attach_binds(n.arg, var_vals))
        else:
            out[n] = n if src == n.src else n.replace(src=src)
    return out[u]


provided.update(sym_str=sym_str, sym_truth=sym_truth, bind=bind, unbind=unbind)  # for UOp's methods
