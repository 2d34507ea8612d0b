"""Autograd: one gradient rule per primitive op, micrograd style, over tensor-graph UOps.

Stage: graph construction. Input: a scalar root UOp, its incoming gradient and the targets.
Output: {target: gradient UOp}. Each rule maps (node, grad) to one gradient per source (None = no
gradient flows there). Derived ops (exp, softmax, matmul...) are built from these primitives.

A composite op may register a vector-Jacobian product on the node it builds (`with_vjp`): the
gradient then goes from that node straight to the op's inputs, computed by the op, instead of down
the chain of its primitives' rules. Convolution uses it: the chain's input gradient sums a window
view's copies back (col2im, a 9x larger intermediate and div/mod index arithmetic), while the op
knows it is a transposed convolution of the gradient. The value is unchanged; only the gradient's
graph differs (same mathematics).
"""
from __future__ import annotations

import math
import weakref
from typing import Callable

from polygrad.dtype import dtypes
from polygrad.uop import movement as mv
from polygrad.uop.sint import sadd, ssub
from polygrad.uop.ops import Ops, UOp


def full_like(u: UOp, value: float) -> UOp:
    c = UOp.const(u.dtype, value, u.device)
    return mv.expand(mv.reshape(c, (1,) * len(u.shape)), u.shape) if u.shape else c


def alu(op: Ops, *srcs: UOp) -> UOp:
    return srcs[0].alu(op, *srcs[1:])


def _cos(x: UOp) -> UOp:
    """cos(x) = 1 - 2 sin(x/2)^2 in float64 (exact halving keeps the argument reduction accurate; sin(pi/2 - x)
    would round pi/2 - x first and lose cos near its zeros), rounded to x's dtype."""
    x64 = x.cast(dtypes.float64)
    s = alu(Ops.SIN, alu(Ops.MUL, x64, full_like(x64, 0.5)))
    one = full_like(x64, 1.0)
    return alu(Ops.ADD, one, alu(Ops.NEG, alu(Ops.MUL, full_like(x64, 2.0), alu(Ops.MUL, s, s)))).cast(x.dtype)


def _reduce_grad(node: UOp, g: UOp) -> tuple:
    src = node.src[0]
    rop, axes = node.arg
    if rop is Ops.ADD:
        return (mv.expand(g, src.shape),)
    if rop is Ops.MAX:
        hit = alu(Ops.CMPEQ, src, mv.expand(node, src.shape))
        count = UOp(Ops.REDUCE_AXIS, src.dtype, (hit.cast(src.dtype),), (Ops.ADD, axes))
        share = alu(Ops.FDIV, mv.expand(g, src.shape), mv.expand(count, src.shape))
        return (alu(Ops.WHERE, hit, share, full_like(share, 0.0)),)
    if rop is Ops.MUL:
        return (_prod_grad(node, g),)
    raise NotImplementedError(f"no gradient for reduce {rop}")


def _prod_grad(node: UOp, g: UOp) -> UOp:
    """d prod / d x_i = product of the others: prod / x_i without zeros; with one zero, the zero's slot
    gets the product of the non-zeros and the rest 0; with two or more zeros everything is 0 (torch)."""
    src = node.src[0]
    axes = node.arg[1]
    zero = alu(Ops.CMPEQ, src, full_like(src, 0.0))
    safe = alu(Ops.WHERE, zero, full_like(src, 1.0), src)
    n_zero = UOp(Ops.REDUCE_AXIS, src.dtype, (zero.cast(src.dtype),), (Ops.ADD, axes))
    others = UOp(Ops.REDUCE_AXIS, src.dtype, (safe,), (Ops.MUL, axes))
    ge = mv.expand(g, src.shape)
    one_zero = alu(Ops.CMPEQ, mv.expand(n_zero, src.shape), full_like(src, 1.0))
    at_zero = alu(Ops.WHERE, one_zero, alu(Ops.MUL, ge, mv.expand(others, src.shape)), full_like(src, 0.0))
    elsewhere = alu(Ops.FDIV, alu(Ops.MUL, ge, mv.expand(node, src.shape)), safe)
    return alu(Ops.WHERE, zero, at_zero, elsewhere)


def _pow_grad(node: UOp, g: UOp) -> tuple:
    """torch's rules: no base gradient where the exponent is 0, no exponent gradient where the base is 0
    and the exponent is non-negative (0 ** b is flat there; log(0) would make it NaN)."""
    a, b = node.src
    zero, one = full_like(g, 0.0), full_like(g, 1.0)
    da = alu(Ops.MUL, g, alu(Ops.MUL, b, alu(Ops.POW, a, alu(Ops.ADD, b, alu(Ops.NEG, one)))))
    da = alu(Ops.WHERE, alu(Ops.CMPEQ, b, zero), zero, da)
    db = alu(Ops.MUL, g, alu(Ops.MUL, node, alu(Ops.MUL, alu(Ops.LOG2, a), full_like(g, LN2))))
    b_negative = alu(Ops.CMPLT, b, zero)
    flat = alu(Ops.AND, alu(Ops.CMPEQ, a, zero), alu(Ops.CMPNE, b_negative, full_like(b_negative, True)))
    return da, alu(Ops.WHERE, flat, zero, db)


def _mod_grad(node: UOp, g: UOp) -> tuple:
    """fmod(a, b) = a - trunc(a / b) * b."""
    a, b = node.src
    return g, alu(Ops.NEG, alu(Ops.MUL, g, alu(Ops.TRUNC, alu(Ops.FDIV, a, b))))


def _max_grad(node: UOp, g: UOp) -> tuple:
    """torch's rule: the larger operand gets g, a tie splits it, NaN passes g to both. Selected with WHERE, not
    multiplied by 0/1 weights, so an infinite g never turns into inf * 0 = NaN for the operand that lost."""
    a, b = node.src
    zero, half = full_like(g, 0.0), alu(Ops.MUL, g, full_like(g, 0.5))
    tie = alu(Ops.CMPEQ, a, b)
    share = alu(Ops.WHERE, tie, half, g)
    return alu(Ops.WHERE, alu(Ops.CMPLT, a, b), zero, share), alu(Ops.WHERE, alu(Ops.CMPLT, b, a), zero, share)


def _where_grad(node: UOp, g: UOp) -> tuple:
    """g to the selected operand. A clamp from below, `WHERE(x <= k, k, x)` (relu, with k a constant),
    selects by its output instead: `x <= k` holds exactly where the output equals k (above k the output is
    x > k, a NaN is neither), and the output is what the forward kept (schedule/computed.py), while `x` (the
    pre-activation, fused into the output's kernel) would be computed again."""
    cond, a, b = node.src
    zero = full_like(g, 0.0)
    if _clamps_below(cond, a, b):
        return None, None, alu(Ops.WHERE, alu(Ops.CMPEQ, node, a), zero, g)
    return None, alu(Ops.WHERE, cond, g, zero), alu(Ops.WHERE, cond, zero, g)


def _const_value(u: UOp) -> object:
    """The value of a constant under reshapes and expands, else None."""
    while u.op in (Ops.RESHAPE, Ops.EXPAND):
        u = u.src[0]
    return u.arg if u.op is Ops.CONST else None


def _clamps_below(cond: UOp, k: UOp, x: UOp) -> bool:
    """cond is `x < k | x == k` (Tensor.__le__ on floats) with k the constant the WHERE selects."""
    value = _const_value(k)
    if value is None or not x.dtype.is_float or cond.op is not Ops.OR:
        return False
    ops = {c.op: c for c in cond.src}
    lt, eq = ops.get(Ops.CMPLT), ops.get(Ops.CMPEQ)
    return (lt is not None and eq is not None and lt.src[0] is x and eq.src[0] is x
            and _const_value(lt.src[1]) == value and _const_value(eq.src[1]) == value)


def _pad_grad(node: UOp, g: UOp) -> tuple:
    return (mv.shrink(g, tuple((b, sadd(b, s)) for (b, _), s in zip(node.arg, node.src[0].shape))),)


def _shrink_grad(node: UOp, g: UOp) -> tuple:
    return (mv.pad(g, tuple((b, ssub(s, e)) for (b, e), s in zip(node.arg, node.src[0].shape))),)


def _expand_grad(node: UOp, g: UOp) -> tuple:
    src = node.src[0]
    axes = tuple(i for i, (a, b) in enumerate(zip(src.shape, node.shape)) if a != b)
    acc_dt = g.dtype
    return (UOp(Ops.REDUCE_AXIS, acc_dt, (g,), (Ops.ADD, axes)),)


def _permute_grad(node: UOp, g: UOp) -> tuple:
    inverse = tuple(sorted(range(len(node.arg)), key=lambda i: node.arg[i]))
    return (mv.permute(g, inverse),)


def gather(x: UOp, index: UOp, axis: int) -> UOp:
    """x read at index along axis (0 where the index is outside it): the GATHER primitive."""
    return UOp(Ops.GATHER, x.dtype, (x, index), axis)


def scatter(base: UOp, index: UOp, value: UOp, axis: int, op: Ops) -> UOp:
    """base with each value folded in (op: ADD, MUL or MAX) at index along axis: the SCATTER primitive."""
    return UOp(Ops.SCATTER, base.dtype, (base, index, value), (axis, op))


def _gather_grad(node: UOp, g: UOp) -> tuple:
    x, index = node.src
    return scatter(full_like(x, 0.0), index, g, node.arg, Ops.ADD), None


def _scatter_grad(node: UOp, g: UOp) -> tuple:
    """ADD: the gradient passes to base and is gathered for the values. MAX: shared evenly among the
    elements equal to the result (torch's amax rule). MUL: the product of the others, with torch's
    handling of zeros (as for prod)."""
    base, index, value = node.src
    axis, op = node.arg
    if op is Ops.ADD:
        return g, None, gather(g, index, axis)
    zero, one = full_like(base, 0.0), full_like(base, 1.0)
    vzero, vone = full_like(value, 0.0), full_like(value, 1.0)
    if op is Ops.MAX:
        at_base = alu(Ops.CMPEQ, base, node).cast(g.dtype)
        at_value = alu(Ops.CMPEQ, value, gather(node, index, axis)).cast(g.dtype)
        share = alu(Ops.FDIV, g, scatter(at_base, index, at_value, axis, Ops.ADD))
        return alu(Ops.MUL, at_base, share), None, alu(Ops.MUL, at_value, gather(share, index, axis))
    if op is Ops.MUL:
        bz, vz = alu(Ops.CMPEQ, base, zero), alu(Ops.CMPEQ, value, vzero)
        zeros = scatter(bz.cast(base.dtype), index, vz.cast(value.dtype), axis, Ops.ADD)
        safe_b, safe_v = alu(Ops.WHERE, bz, one, base), alu(Ops.WHERE, vz, vone, value)
        others = scatter(safe_b, index, safe_v, axis, Ops.MUL)  # product of the non-zero factors
        gp = alu(Ops.MUL, g, others)

        def share(is_zero: UOp, safe: UOp, n_zero: UOp, gp_at: UOp, z: UOp, o: UOp) -> UOp:
            lone_zero = alu(Ops.WHERE, alu(Ops.CMPEQ, n_zero, o), gp_at, z)
            no_zero = alu(Ops.WHERE, alu(Ops.CMPEQ, n_zero, z), alu(Ops.FDIV, gp_at, safe), z)
            return alu(Ops.WHERE, is_zero, lone_zero, no_zero)
        db = share(bz, safe_b, zeros, gp, zero, one)
        dv = share(vz, safe_v, gather(zeros, index, axis), gather(gp, index, axis), vzero, vone)
        return db, None, dv
    raise NotImplementedError(f"no gradient for a scatter with {op}")


LN2 = math.log(2)

GRADIENT_RULES = {
    Ops.ADD: lambda n, g: (g, g),
    Ops.MUL: lambda n, g: (alu(Ops.MUL, g, n.src[1]), alu(Ops.MUL, g, n.src[0])),
    Ops.NEG: lambda n, g: (alu(Ops.NEG, g),),
    # d(a/b)/db = -(a/b)/b: never b*b, which overflows long before a/b does (exp(x)/(1+exp(x)) at x=50)
    Ops.FDIV: lambda n, g: (alu(Ops.FDIV, g, n.src[1]), alu(Ops.NEG, alu(Ops.MUL, g, alu(Ops.FDIV, n, n.src[1])))),
    Ops.MAX: _max_grad,
    Ops.EXP2: lambda n, g: (alu(Ops.MUL, alu(Ops.MUL, g, n), full_like(g, LN2)),),
    Ops.LOG2: lambda n, g: (alu(Ops.FDIV, g, alu(Ops.MUL, n.src[0], full_like(g, LN2))),),
    Ops.SIN: lambda n, g: (alu(Ops.MUL, g, _cos(n.src[0])),),
    Ops.SQRT: lambda n, g: (alu(Ops.FDIV, g, alu(Ops.MUL, n, full_like(g, 2.0))),),
    Ops.RECIPROCAL: lambda n, g: (alu(Ops.NEG, alu(Ops.MUL, g, alu(Ops.MUL, n, n))),),
    Ops.POW: _pow_grad,
    Ops.MOD: _mod_grad,
    Ops.WHERE: _where_grad,
    Ops.TRUNC: lambda n, g: (full_like(g, 0.0),),
    Ops.CAST: lambda n, g: (g.cast(n.src[0].dtype) if n.src[0].dtype.is_float else None,),
    Ops.REDUCE_AXIS: _reduce_grad,
    Ops.RESHAPE: lambda n, g: (mv.reshape(g, n.src[0].shape),),
    Ops.PERMUTE: _permute_grad,
    Ops.EXPAND: _expand_grad,
    Ops.PAD: _pad_grad,
    Ops.SHRINK: _shrink_grad,
    Ops.FLIP: lambda n, g: (mv.flip(g, n.arg),),
    Ops.CONTIGUOUS: lambda n, g: (g,),
    Ops.COPY: lambda n, g: (UOp(Ops.COPY, g.dtype, (g,), n.src[0].device),),
    Ops.GATHER: _gather_grad,
    Ops.SCATTER: _scatter_grad,
}
NO_GRADIENT = {Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ, Ops.AND, Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR, Ops.IDIV,
               Ops.BITCAST, Ops.DETACH, Ops.CONST, Ops.IOTA, Ops.BUFFER, Ops.DEVICE, Ops.ASSIGN, Ops.BIND}


# node -> (its inputs, vjp(gradient, inputs wanted) -> {input: gradient}); weak keys: an entry goes with its node
Vjp = Callable[[UOp, "set[UOp]"], "dict[UOp, UOp]"]
_custom_vjps: "weakref.WeakKeyDictionary[UOp, tuple[tuple[UOp, ...], Vjp]]" = weakref.WeakKeyDictionary()


def with_vjp(node: UOp, inputs: tuple[UOp, ...], vjp: Vjp) -> UOp:
    """Register `vjp` as node's gradient rule: given the gradient of node and the set of `inputs` that
    need one, it returns {input: gradient}. Used by composite ops (conv2d) whose primitive chain has a
    costly gradient. Returns node."""
    _custom_vjps[node] = (inputs, vjp)
    return node


def _custom_vjp(node: UOp, targets: set[UOp]) -> tuple[tuple[UOp, ...], Vjp] | None:
    """node's registered vjp, unless a target lies strictly inside its graph (above its inputs): that
    target's gradient needs the primitive chain."""
    entry = _custom_vjps.get(node)
    if entry is None:
        return None
    stop = set(entry[0])
    stack, seen = list(node.src), set()
    while stack:
        x = stack.pop()
        if x in stop or x in seen:
            continue
        if x in targets:
            return None
        seen.add(x)
        stack.extend(x.src)
    return entry


def compute_gradient(root: UOp, root_grad: UOp, targets: set[UOp]) -> dict[UOp, UOp]:
    """Reverse-mode accumulation from root to every target it depends on."""
    order = root.toposort()
    on_path: set[UOp] = set()
    for node in order:  # sources first: a node is on a path if it is a target or feeds one
        if node in targets or any(s in on_path for s in node.src):
            on_path.add(node)
    grads: dict[UOp, UOp] = {root: root_grad}
    for node in reversed(order):
        g = grads.get(node)
        if g is None or node.op in NO_GRADIENT:
            continue
        custom = _custom_vjp(node, targets) if _custom_vjps else None
        if custom is not None:
            wanted = {s for s in custom[0] if s in on_path and s.dtype is not None and s.dtype.is_float}
            for src, sg in (custom[1](g, wanted) if wanted else {}).items():
                if src not in wanted:
                    continue
                if sg.dtype != src.dtype:
                    sg = sg.cast(src.dtype)
                prev = grads.get(src)
                grads[src] = sg if prev is None else alu(Ops.ADD, prev, sg)
            continue
        rule = GRADIENT_RULES.get(node.op)
        if rule is None:
            if any(s in on_path for s in node.src):
                raise NotImplementedError(f"no gradient rule for {node.op.name}")
            continue
        for src, sg in zip(node.src, rule(node, g)):
            if sg is None or src not in on_path or src.dtype is None or not src.dtype.is_float:
                continue
            if sg.dtype != src.dtype:
                sg = sg.cast(src.dtype)
            prev = grads.get(src)
            grads[src] = sg if prev is None else alu(Ops.ADD, prev, sg)
    return {t: grads[t] for t in targets if t in grads}


__all__ = ["compute_gradient", "GRADIENT_RULES", "dtypes", "with_vjp"]
