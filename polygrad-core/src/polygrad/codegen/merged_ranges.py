"""Split a range that merges two axes back into its factors: `split_merged_ranges(ast) -> ast`.

Stage: lowering (device independent, before the opts are chosen; also at save, model/format.py).
Input: a simplified kernel AST. Output: the same kernel where each range r of n points whose every
division and remainder, once r is written as r = o * c + i (o < n / c, i < c), simplifies away becomes
the two ranges o and i, and the kernel's addresses are affine in them.

Why: a product fused with a reshape that interleaves two of its axes (attention's heads x D, stored as
one row of H * D values) gets one output range of H * D points read as (r // D, r % D). The host and
GPU heuristics look for a range along which an operand is contiguous; they find none in such indices,
so the kernel ran with no tile (a GPT-2 prompt spent 40% of its time there). Written over (o, i), the
same kernel is a batched matmul whose loads and store are affine, and the heuristics tile it.
The divisors tried are the constants a division or remainder of r's own expressions divides by, that
divide n (a symbolic n, a Variable's multiple, counts when n % c simplifies to 0). A split is kept only
when no division or remainder of o or i is left, or of the ranges they are split into in turn (the
heads of heads x D, grouped by key head: (r // D) // g and (r // D) % g), so a range with other uses (a
window's r // 3 next to (r + 1) // 4) or a size c does not divide stays as it is. Elementwise kernels
are left as they are (see split_merged_ranges).
"""
from __future__ import annotations

from polygrad.codegen.analysis import ranges_of
from polygrad.uop.ops import AxisKind, Ops, UOp
from polygrad.uop.rewrite import graph_rewrite
from polygrad.uop.symbolic import symbolic_rules

SPLIT_KINDS = (AxisKind.GLOBAL, AxisKind.REDUCE)  # the scheduler's ranges; opts' ranges are not split
MAX_SPLITS = 8  # ranges split in one kernel: a bound on the passes, far above what a kernel has
MAX_DEPTH = 3  # a range split into at most 2**MAX_DEPTH parts (heads x D: 3, heads grouped: 4 parts)


def split_merged_ranges(ast: UOp) -> UOp:
    """Split every range used only through (r // c, r % c) pairs and affine forms of r into an outer
    range of n // c points and an inner one of c (both of r's kind, the inner one just inside it),
    the parts split again where they are divided in turn (heads x D, the heads grouped by key head).
    Kernels with a reduction only: their register tiles need affine addresses; an elementwise kernel's
    lanes run along its last range, which a split would shorten (r // 8 of 64 points: 8 lanes, not 16)."""
    if not any(n.op is Ops.REDUCE for n in ast.toposort()):
        return ast
    for _ in range(MAX_SPLITS):
        divided, _ = _divisions(ast)
        candidates = [r for r in ranges_of(ast) if r.arg[1] in SPLIT_KINDS and r in divided]
        split = next((s for s in (_split_whole(ast, r, MAX_DEPTH) for r in candidates) if s is not None), None)
        if split is None:
            return ast
        ast = split
    return ast


def _divisions(ast: UOp) -> tuple[set[UOp], dict[UOp, set[int]]]:
    """(the ranges some division or remainder depends on; per range r, the constants c > 1 of the
    divisions and remainders of an expression of r with no division of r inside: r // 8 and r % 8,
    not the 2 of (r // 8) % 2, which is a division of r // 8)."""
    deps: dict[UOp, frozenset] = {}
    below: dict[UOp, frozenset] = {}  # the ranges a division inside the node depends on
    divided: set[UOp] = set()
    divisors: dict[UOp, set[int]] = {}
    for n in ast.toposort():
        deps[n] = frozenset({n}) if n.op is Ops.RANGE else frozenset().union(*(deps[s] for s in n.src))
        below[n] = frozenset().union(*(below[s] for s in n.src))
        if n.op in (Ops.IDIV, Ops.MOD):
            x, c = n.src
            divided |= deps[x]
            if c.op is Ops.CONST and isinstance(c.arg, int) and c.arg > 1:
                for r in deps[x] - below[x]:
                    divisors.setdefault(r, set()).add(c.arg)
            below[n] = below[n] | deps[x]
    return divided, divisors


def _split_whole(ast: UOp, r: UOp, depth: int) -> UOp | None:
    """ast with r split into ranges none of which a division or remainder depends on, or None."""
    _, divisors = _divisions(ast)
    for c in sorted(c for c in divisors.get(r, ()) if _divides(r.src[0], c)):
        split = _split_range(ast, r, c)
        if split is None:
            continue
        out, parts = split
        for part in parts:
            if out is not None and part in _divisions(out)[0]:
                out = _split_whole(out, part, depth - 1) if depth > 0 else None
        if out is not None:
            return out
    return None


def _divides(size: UOp, c: int) -> bool:
    if size.op is Ops.CONST:
        return size.arg % c == 0 and size.arg > c
    rest = _simplify(UOp(Ops.MOD, size.dtype, (size, UOp.const(size.dtype, c))))
    return rest.op is Ops.CONST and rest.arg == 0


def _split_range(ast: UOp, r: UOp, c: int) -> tuple[UOp, tuple[UOp, UOp]] | None:
    """(ast with r = outer * c + inner, simplified; (outer, inner)), None when n // c does not
    simplify to a size without a division."""
    next_id = max(x.arg[0] for x in ranges_of(ast)) + 1
    size = _simplify(UOp(Ops.IDIV, r.dtype, (r.src[0], UOp.const(r.dtype, c))))
    if any(x.op in (Ops.IDIV, Ops.MOD) for x in size.toposort()):
        return None
    outer = UOp(Ops.RANGE, r.dtype, (size,), (next_id, r.arg[1]))
    inner = UOp(Ops.RANGE, r.dtype, (UOp.const(r.dtype, c),), (next_id + 1, r.arg[1]))
    memo: dict[UOp, UOp] = {r: outer * c + inner}
    for node in ast.toposort():
        if node in memo:
            continue
        src = tuple(memo.get(s, s) for s in node.src)
        if node.op in (Ops.END, Ops.REDUCE) and r in node.src[1:]:
            at = node.src.index(r)
            src = (*src[:at], outer, inner, *src[at + 1:])
        memo[node] = node if src == node.src else node.replace(src=src)
    return _simplify(memo[ast]), (outer, inner)


def _simplify(u: UOp) -> UOp:
    return graph_rewrite(u, symbolic_rules, name="split_merged_ranges")
