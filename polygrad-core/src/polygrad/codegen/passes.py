"""The rewrite passes of lowering: index simplification, applying opts, FMA contraction.

Stage: lowering. Input: a kernel AST (and the Opts to apply). Output: the rewritten AST:
`simplify_indices` (constants folded, index arithmetic simplified by symbolic_rules), `kernel_for_opts`
(`affine_kernel`: simplified, then merged ranges split, merged_ranges.py; then sibling reductions put
on shared ranges, `share_reduce_ranges`: the kernel whose ranges the opts name), `split_kernel`
(apply_opts then simplify_indices, memoized: the heuristics, BEAM and lower() ask for the same splits),
`contract_fma` (a float sum of products as fused multiply-adds). lower.py lists their order.
"""
from __future__ import annotations

from polygrad.codegen.analysis import range_size
from polygrad.codegen.merged_ranges import split_merged_ranges
from polygrad.codegen.opts import Opt, OptKind, apply_opts, substitute_nodes
from polygrad.dtype import dtypes
from polygrad.uop.ops import Ops, UOp
from polygrad.uop.rewrite import PatternMatcher, UPat, graph_rewrite
from polygrad.uop.symbolic import symbolic_rules


# Pure results by their inputs (simplified and split ASTs): the heuristics, BEAM and lower() ask for the
# same ones (default_opts splits a kernel to size its THREAD opt, lower() splits it again). Kernel ASTs
# hold no buffers, so keeping them is cheap; the table is emptied when it grows past _MEMO_MAX.
_memo: dict[tuple, UOp] = {}
_MEMO_MAX = 4096


def _memoized(key: tuple, fn) -> UOp:
    hit = _memo.get(key)
    if hit is None:
        if len(_memo) >= _MEMO_MAX:
            _memo.clear()
        hit = _memo[key] = fn()
    return hit


def clear_cache() -> None:
    """Forget the cached simplified and split ASTs (polygrad.collect() calls this)."""
    _memo.clear()


def simplify_indices(ast: UOp) -> UOp:
    """Fold constants and simplify index arithmetic."""
    return _memoized(("simplify", ast), lambda: graph_rewrite(ast, symbolic_rules, name="simplify_indices"))


def affine_kernel(ast: UOp) -> UOp:
    """simplify_indices, then split_merged_ranges: a kernel's device-independent form (what a bundle
    stores, model/format.py), cached."""
    return _memoized(("affine", ast), lambda: split_merged_ranges(simplify_indices(ast)))


def kernel_for_opts(ast: UOp) -> UOp:
    """affine_kernel, then share_reduce_ranges: the kernel the opts are chosen for and applied to (the
    heuristics, BEAM and lower() must name the same ranges), cached."""
    return _memoized(("for_opts", ast), lambda: share_reduce_ranges(affine_kernel(ast)))


def share_reduce_ranges(ast: UOp) -> UOp:
    """Sibling reductions (no reduction inside either) whose ranges have the same constant trip counts
    run over the first one's ranges: the opts the heuristics choose for the first reduction (which
    they plan alone) then split them all. A gated MLP's silu(x @ W_gate.T) * (x @ W_up.T), one kernel:
    its up product had no lanes, one scalar FMA chain per row (a Qwen2-0.5B decode step's Q8_0 gate/up
    kernel ran at a quarter of its projections' bandwidth, 76% of the step). The linearizer still gives
    each reduction its own loop nest; only the ranges, and so their splits, are shared."""
    reduces = [n for n in ast.toposort() if n.op is Ops.REDUCE]
    if len(reduces) < 2:
        return ast
    first = reduces[0]
    sizes = [range_size(r) for r in first.src[1:]]
    if None in sizes or any(n.op is Ops.REDUCE for n in first.src[0].toposort()):
        return ast
    mapping: dict[UOp, UOp] = {}
    for red in reduces[1:]:
        ranges = red.src[1:]
        if [range_size(r) for r in ranges] != sizes or set(ranges) & set(first.src[1:]) \
                or any(n.op is Ops.REDUCE for n in red.src[0].toposort()):
            continue
        mapping.update(zip(ranges, first.src[1:]))
    if not mapping:
        return ast
    return simplify_indices(substitute_nodes(ast, mapping))


def split_kernel(ast: UOp, opts: list[Opt] | tuple[Opt, ...]) -> UOp:
    """simplify_indices(apply_opts(ast, opts)), cached. Trailing THREAD opts only retag a range, which no
    simplification rule looks at, so they are applied to the cached split without them."""
    opts = tuple(opts)
    if not opts:
        return ast
    n = len(opts)
    while n and opts[n - 1].kind is OptKind.THREAD:
        n -= 1
    if n < len(opts):
        base = split_kernel(ast, opts[:n])
        return _memoized(("split", ast, opts), lambda: apply_opts(base, list(opts[n:])))
    return _memoized(("split", ast, opts), lambda: simplify_indices(apply_opts(ast, list(opts))))


def _contract(red: UOp) -> UOp | None:
    """A float sum whose body is a product of its own dtype, as a REDUCE(FMA)."""
    body = red.src[0]
    if body.op is not Ops.MUL or red.dtype not in (dtypes.float32, dtypes.float64) or body.dtype is not red.dtype:
        return None
    return UOp(Ops.REDUCE, red.dtype, red.src, Ops.FMA)


fma_contraction_rules = PatternMatcher([(UPat(Ops.REDUCE, name="red", arg=Ops.ADD), _contract)],
                                       name="fma_contraction_rules")


def contract_fma(ast: UOp) -> UOp:
    """Fuse each float sum of products into fused multiply-adds: REDUCE(ADD, MUL(a, b)) -> REDUCE(FMA,
    MUL(a, b)), whose every step is acc = fma(a, b, acc) (one rounding instead of two)."""
    return graph_rewrite(ast, fma_contraction_rules, name="contract_fma")
