"""The optimisation space of a kernel: `Opt` kinds, and `apply_opts(ast, opts)` which splits its ranges.

Stage: lowering (device optimisation). Input: a simplified kernel AST and a list of Opts (chosen by the
heuristics, host_opts.py or gpu_opts.py, or by BEAM, search.py). Output: the AST with its ranges split,
retagged or padded as the Opts say. The heuristics and the pass list build on this module; it imports
none of them. The optimisations (`OptKind`) and what they make of a range (`AxisKind`):
  UPCAST        global range -> outer global + inner UPCAST lanes (register tiles, vectors)
  SPLIT_REDUCE  reduce range -> outer reduce + inner UPCAST lanes, one partial accumulator per lane
  UNROLL        reduce range -> outer reduce + inner UNROLL range (one accumulator, unrolled body)
  THREAD        the outermost global range of a single-block kernel -> THREAD: its points are shared
                among `amount` host threads (ProgramSpec.threads launches, each given its index)
  OUTER         a global range of a single-block kernel becomes its outermost loop (loop order for
                the cache: a matmul's column panels outside its row tiles); `amount` is unused (0)
  STAGE         `axis` a global range, `amount` a buffer slot: each time that range's loop advances,
                the kernel copies what its one load of the buffer reads inside the loop into a local
                array in the order its inner loops read it (packing: a strided or transposed operand
                becomes contiguous and stays in cache), or, when a reduction reads the buffer through a
                computed product operand (a dequantized weight), that operand's values; the IR is
                unchanged, the linearizer does it
  LOCAL, GROUP  for GPU-style targets: a global range -> outer global + inner LOCAL (threads of a
                block), a reduce range -> outer reduce + inner GROUP (a reduction shared by a block's
                threads; thread g reads points g, g + amount, ...: coalesced along a row). A GROUP
                amount that does not divide the range (or a symbolic range) pads its last pass: the
                points past the end read the last real point and add the reduction's identity (sums
                and maxima only). renderer/launch.py maps them to launch indices. The host heuristics
                never choose them and the C renderer rejects them
  PADTO         a global range of n points -> a range of n rounded up to a multiple of `amount` whose
                points past n are gated off (every load whose address depends on it and every store
                of its block gets the gate `r < n`): an UPCAST by `amount` then divides it. For a
                device whose code generator masks vector lanes cheaply (`caps.masked_lanes`): an
                elementwise kernel of a size the vector width does not divide still gets lanes.
                A reduce range (sums and maxima) is padded the same way, each reduction adding its
                identity at the added points: a SPLIT_REDUCE then divides it (a conv weight gradient
                over 14-pixel rows in 16 lanes)
  TC            a matmul on tensor cores (amount: the reduce tile; gpu_opts.WGMMA_DEPTH: warpgroup wgmma,
                a shared-memory stage's depth); ranges are left as they are and
                the GPU renderer emits the tile instructions (gpu_opts.py decides when)
  TILE          a float32 matmul or implicit GEMM (a convolution) staged through shared memory (axis: its
                first reduce range; amount: the block tile's rows, a key of
                gpu_opts.MATMUL_TILES); a marker like TC: the ranges stay, the GPU renderer emits the
                tiled kernel
The capabilities decide which a device gets: no vector lanes (vector_width <= 1) means no
UPCAST/SPLIT_REDUCE, one thread means no THREAD, PADTO only where `masked_lanes` says lanes can be gated
cheaply, LOCAL/GROUP/TC/TILE only for devices with local memory. A range whose end is symbolic (a Variable's
expression) is split by UPCAST alone (a register tile's rows over a Variable batch): its last tile is
padded, with loads clamped to the last real point and stores gated (`_split_symbolic`).
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from polygrad.codegen.analysis import address_nodes, range_size, ranges_of, thread_axis
from polygrad.dtype import dtypes
from polygrad.uop.ops import AxisKind, Ops, UOp, reduce_identity
from polygrad.uop.symbolic import bounds


class OptKind(str, Enum):
    """An optimisation. A str enum: its value is its name, as stored in BEAM's cache files."""

    UPCAST = "UPCAST"
    SPLIT_REDUCE = "SPLIT_REDUCE"
    UNROLL = "UNROLL"
    THREAD = "THREAD"
    OUTER = "OUTER"
    STAGE = "STAGE"
    LOCAL = "LOCAL"
    GROUP = "GROUP"
    TC = "TC"
    TILE = "TILE"
    PADTO = "PADTO"

    def __repr__(self) -> str:
        return f"OptKind.{self.name}"

    __str__ = __repr__


@dataclass(frozen=True)
class Opt:
    """One optimisation: `kind` applied to range `axis` (its axis id) with `amount`."""

    kind: OptKind
    axis: int
    amount: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", OptKind(self.kind))


SPLIT_KINDS = {OptKind.UPCAST: AxisKind.UPCAST, OptKind.SPLIT_REDUCE: AxisKind.UPCAST, OptKind.UNROLL: AxisKind.UNROLL,
               OptKind.LOCAL: AxisKind.LOCAL, OptKind.GROUP: AxisKind.GROUP}


# the kind of range each optimisation applies to
OPT_TARGET = {OptKind.UPCAST: AxisKind.GLOBAL, OptKind.SPLIT_REDUCE: AxisKind.REDUCE, OptKind.UNROLL: AxisKind.REDUCE,
              OptKind.THREAD: AxisKind.GLOBAL, OptKind.LOCAL: AxisKind.GLOBAL, OptKind.GROUP: AxisKind.REDUCE,
              OptKind.OUTER: AxisKind.GLOBAL, OptKind.STAGE: AxisKind.GLOBAL, OptKind.TC: AxisKind.REDUCE,
              OptKind.TILE: AxisKind.REDUCE, OptKind.PADTO: AxisKind.GLOBAL}
# PADTO also pads a reduce range (a sum or maximum): _pad_range gives the points past the end the identity
PADTO_TARGETS = (AxisKind.GLOBAL, AxisKind.REDUCE)


def apply_opts(ast: UOp, opts: list[Opt]) -> UOp:
    """Apply opts in order: split the named ranges (new ranges get fresh axis ids), or retag the
    THREAD range, or pad a range (PADTO). An opt that does not fit the kernel (unknown axis, wrong range
    kind, amount not dividing the size; for PADTO, an amount below 2 or one that already divides it) is
    skipped."""
    for opt in opts:
        ranges = {r.arg[0]: r for r in ranges_of(ast)}
        r = ranges.get(opt.axis)
        if r is None or (r.arg[1] != OPT_TARGET[opt.kind]
                         and not (opt.kind is OptKind.PADTO and r.arg[1] in PADTO_TARGETS)):
            continue
        if r.src[0].op is not Ops.CONST:
            if opt.kind is OptKind.UPCAST and opt.amount >= 2:
                ast = _split_symbolic(ast, r, opt.amount, max(ranges) + 1)
            elif opt.kind in (OptKind.SPLIT_REDUCE, OptKind.GROUP) and opt.amount >= 2:
                ast = _split_symbolic_reduce(ast, r, opt.amount, max(ranges) + 1, SPLIT_KINDS[opt.kind])
            continue
        if opt.kind in (OptKind.TC, OptKind.TILE):  # a marker for the renderer: the ranges stay
            continue
        if opt.kind is OptKind.THREAD:
            if r is not thread_axis(ast, opt.amount) or opt.amount < 2:
                continue
            ast = substitute_nodes(ast, {r: UOp(Ops.RANGE, r.dtype, r.src, (r.arg[0], AxisKind.THREAD))})
            continue
        if opt.kind is OptKind.OUTER:
            if len(ast.src) == 1 and ast.src[0].op is Ops.END and r in ast.src[0].src[1:]:
                end = ast.src[0]
                ast = ast.replace(src=(end.replace(src=(end.src[0], r, *(x for x in end.src[1:] if x is not r))),))
            continue
        if opt.kind is OptKind.STAGE:  # a schedule for the linearizer: the IR stays as it is
            continue
        if opt.kind is OptKind.PADTO:
            if opt.amount >= 2 and range_size(r) % opt.amount != 0:
                ast = _pad_range(ast, r, opt.amount)
            continue
        if range_size(r) % opt.amount != 0 or range_size(r) < opt.amount:
            if opt.kind is OptKind.GROUP and opt.amount >= 2:  # a row of any length: the last pass padded
                ast = _split_symbolic_reduce(ast, r, opt.amount, max(ranges) + 1, AxisKind.GROUP)
            continue
        next_id = max(ranges) + 1
        outer = UOp(Ops.RANGE, r.dtype, (UOp.const(r.dtype, range_size(r) // opt.amount),), (next_id, r.arg[1]))
        inner = UOp(Ops.RANGE, r.dtype, (UOp.const(r.dtype, opt.amount),), (next_id + 1, SPLIT_KINDS[opt.kind]))
        ast = _substitute_range(ast, r, outer, inner, opt.kind)
    return ast


def _pad_range(ast: UOp, r: UOp, amount: int) -> UOp:
    """PADTO: range r (n points, a global range) replaced by one of n rounded up to a multiple of
    `amount`, with the same axis id; the points past n do nothing: every INDEX whose address or gate
    depends on the range, and every store index of its block, gets the gate `r < n` (combined with
    its own by AND). A gated load reads nothing and gives 0, a gated store writes nothing, and values
    computed at those points from the index itself never trap (division by zero divides by 1). A kernel
    whose address arithmetic might leave its index dtype at the added points (a range near 2**31, or
    arithmetic on a loaded index whose bounds are unknown) is returned unpadded. A reduce range (a
    conv weight gradient's 14-pixel row, so that a SPLIT_REDUCE by 16 lanes divides it): each REDUCE over it
    adds the identity at the added points, WHERE(r < n, body, identity), where its body there is not already
    the identity (padded_body_is_identity: a sum of products of the gated loads gives 0 at no cost); only
    sums and maxima are padded."""
    n = range_size(r)
    end = -(-n // amount) * amount
    if end > dtypes.max(r.dtype):
        return ast
    reduces = [x for x in ast.toposort() if x.op is Ops.REDUCE and r in x.src[1:]]
    if r.arg[1] == AxisKind.REDUCE and (not reduces or any(x.arg not in SYMBOLIC_LANE_REDUCES for x in reduces)):
        return ast
    padded = UOp(Ops.RANGE, r.dtype, (UOp.const(r.dtype, end),), r.arg)
    valid = UOp(Ops.CMPLT, dtypes.bool, (padded, UOp.const(r.dtype, n)))
    stores = {_store_of(b).src[0] for b in ast.toposort() if b.op is Ops.END and r in b.src[1:]}
    memo: dict[UOp, UOp] = {r: padded}
    depends: set[UOp] = {padded}
    for node in ast.toposort():
        if node in memo:
            continue
        src = tuple(memo.get(s, s) for s in node.src)
        new = node if src == node.src else node.replace(src=src)
        if any(s in depends for s in src):
            depends.add(new)
        if node.op is Ops.INDEX and (new in depends or node in stores):
            gate = valid if len(src) < 3 else UOp(Ops.AND, dtypes.bool, (src[2], valid))
            new = UOp(Ops.INDEX, node.dtype, (src[0], src[1], gate), node.arg)
            depends.add(new)
        if node.op is Ops.REDUCE and r in node.src[1:] and not padded_body_is_identity(node, r):
            identity = UOp.const(node.dtype, reduce_identity(node.arg, node.dtype))
            was = new in depends
            new = new.replace(src=(UOp(Ops.WHERE, node.dtype, (valid, new.src[0], identity)), *new.src[1:]))
            if was:
                depends.add(new)
        memo[node] = new
    out = memo[ast]
    for x in address_nodes(out):
        if x in depends and x.dtype is not None and x.dtype.is_int:
            lo, hi = bounds(x)
            if lo < dtypes.min(x.dtype) or hi > dtypes.max(x.dtype):
                return ast
    return out


def padded_body_is_identity(red: UOp, r: UOp) -> bool:
    """Whether a sum's body is 0 wherever every load whose address depends on range r reads 0 (its gated
    loads past a padded end): the body is such a load, or a product of them (each possibly cast), so a
    padded reduction needs no select per point. Maxima and other bodies get the select."""
    def gated_load(x: UOp) -> bool:
        while x.op is Ops.CAST:
            x = x.src[0]
        return x.op is Ops.LOAD and r in x.src[0].src[1].toposort()
    body = red.src[0]
    if red.arg is not Ops.ADD:
        return False
    if body.op is Ops.MUL:
        return all(gated_load(x) for x in body.src)
    return gated_load(body)


def _padded_split(r: UOp, amount: int, next_id: int,
                  kind: AxisKind = AxisKind.UPCAST) -> tuple[UOp, UOp, UOp, UOp]:
    """(outer range of ceil(n / amount) points, of r's kind; `amount` lanes of `kind` (UPCAST, or GROUP: the
    threads of a block); the gate p < n of the point p = outer * amount + lane; min(p, n - 1), the real point a
    padded lane reads) for r's end n."""
    n = r.src[0]
    outer = UOp(Ops.RANGE, r.dtype, ((n + (amount - 1)) // amount,), (next_id, r.arg[1]))
    inner = UOp(Ops.RANGE, r.dtype, (UOp.const(r.dtype, amount),), (next_id + 1, kind))
    point = outer * amount + inner
    valid = UOp(Ops.CMPLT, dtypes.bool, (point, n))
    return outer, inner, valid, UOp(Ops.WHERE, r.dtype, (valid, point, n - 1))


def _split_symbolic(ast: UOp, r: UOp, amount: int, next_id: int) -> UOp:
    """UPCAST of a global range whose end n is symbolic (a Variable batch or sequence length): an outer
    global range of ceil(n / amount) points and `amount` inner lanes. The point p = outer * amount + lane
    may pass n in the last tile: its loads read at min(p, n - 1), a real point, so they need no gate
    and never leave the buffers, and its block's stores get the gate `p < n` (combined with their own by
    AND). The padded lanes compute a copy of the last real point and write nothing. A kernel whose ranges
    can reach 2**31 at the Variables' maxima is returned unsplit."""
    if bounds(r.src[0])[1] + amount > dtypes.max(r.dtype):
        return ast
    outer, inner, valid, clamped = _padded_split(r, amount, next_id)
    stores = {_store_of(b).src[0] for b in ast.toposort() if b.op is Ops.END and r in b.src[1:]}
    memo: dict[UOp, UOp] = {r: clamped}
    for node in ast.toposort():
        if node in memo:
            continue
        if node.op is Ops.END:
            rs = [outer if x is r else memo.get(x, x) for x in node.src[1:]]
            if r in node.src[1:]:
                rs.append(inner)
            memo[node] = UOp(Ops.END, None, (memo[node.src[0]], *rs))
            continue
        src = tuple(memo.get(x, x) for x in node.src)
        if node in stores:
            gate = valid if len(src) < 3 else UOp(Ops.AND, dtypes.bool, (src[2], valid))
            memo[node] = UOp(Ops.INDEX, node.dtype, (src[0], src[1], gate), node.arg)
            continue
        memo[node] = node if src == node.src else node.replace(src=src)
    return memo[ast]


SYMBOLIC_LANE_REDUCES = (Ops.ADD, Ops.MAX)  # what a padded lane can leave out by giving the identity


def _split_symbolic_reduce(ast: UOp, r: UOp, amount: int, next_id: int, kind: AxisKind = AxisKind.UPCAST) -> UOp:
    """SPLIT_REDUCE of a reduce range whose end n is symbolic (a softmax over a prompt's tokens): an outer
    reduce range of ceil(n / amount) points and `amount` lanes, each lane its own partial result. A point
    p = outer * amount + lane past n reads at min(p, n - 1), a real point, and adds the reduction's
    identity (0 for a sum, -inf for a max) instead of its value. Left unsplit: reductions other than sums
    and maxima (a multiply-add's operand pair), and ranges that can reach 2**31. With `kind` GROUP the
    lanes are a block's threads (a GROUP opt over a row whose length, symbolic or constant, `amount` does
    not divide: softmax and layernorm rows of any length)."""
    reduces = [x for x in ast.toposort() if x.op is Ops.REDUCE and r in x.src[1:]]
    if not reduces or any(x.arg not in SYMBOLIC_LANE_REDUCES for x in reduces) \
            or bounds(r.src[0])[1] + amount > dtypes.max(r.dtype):
        return ast
    outer, inner, valid, clamped = _padded_split(r, amount, next_id, kind)
    memo: dict[UOp, UOp] = {r: clamped}
    for node in ast.toposort():
        if node in memo:
            continue
        if node.op is Ops.REDUCE and r in node.src[1:]:
            identity = UOp.const(node.dtype, reduce_identity(node.arg, node.dtype))
            body = UOp(Ops.WHERE, node.dtype, (valid, memo[node.src[0]], identity))
            memo[node] = _lane_reduce(node, body, tuple(memo.get(x, x) for x in node.src[1:] if x is not r), outer,
                                      inner)
            continue
        src = tuple(memo.get(x, x) for x in node.src)
        memo[node] = node if src == node.src else node.replace(src=src)
    return memo[ast]


def _lane_reduce(node: UOp, body: UOp, others: tuple[UOp, ...], outer: UOp, inner: UOp) -> UOp:
    """REDUCE node split by SPLIT_REDUCE: a partial result per lane of `inner` over the other ranges and
    `outer`, then those lanes reduced."""
    partial = UOp(Ops.REDUCE, node.dtype, (body, *others, outer), node.arg)
    return UOp(Ops.REDUCE, node.dtype, (partial, inner), node.arg)


def _store_of(block: UOp) -> UOp:
    """The STORE at the bottom of a block (END(END(STORE, ...), ...))."""
    while block.op is Ops.END:
        block = block.src[0]
    return block


def threads_of(ast: UOp, opts: list[Opt]) -> int:
    if not any(r.arg[1] == AxisKind.THREAD for r in ranges_of(ast)):
        return 1
    return next(o.amount for o in reversed(opts) if o.kind is OptKind.THREAD)


def substitute_nodes(ast: UOp, mapping: dict[UOp, UOp]) -> UOp:
    """`ast` with each node of `mapping` replaced by its value, the nodes above rebuilt."""
    memo: dict[UOp, UOp] = dict(mapping)
    for node in ast.toposort():
        if node in memo:
            continue
        new_src = tuple(memo.get(s, s) for s in node.src)
        memo[node] = node if new_src == node.src else node.replace(src=new_src)
    return memo[ast]


def _substitute_range(ast: UOp, r: UOp, outer: UOp, inner: UOp, kind: OptKind) -> UOp:
    expr = outer * inner.src[0].arg + inner
    memo: dict[UOp, UOp] = {r: expr}
    for node in ast.toposort():
        if node in memo:
            continue
        if node.op is Ops.END:
            body = memo[node.src[0]]
            rs: list[UOp] = []
            for x in node.src[1:]:
                rs.append(outer if x is r else memo.get(x, x))
            if r in node.src[1:]:
                rs.append(inner)
            memo[node] = UOp(Ops.END, None, (body, *rs))
            continue
        if node.op is Ops.REDUCE and r in node.src[1:]:
            body = memo[node.src[0]]
            others = tuple(x for x in node.src[1:] if x is not r)
            if kind is OptKind.UNROLL:  # one accumulator over both halves
                memo[node] = UOp(Ops.REDUCE, node.dtype, (body, *others, outer, inner), node.arg)
                continue
            memo[node] = _lane_reduce(node, body, others, outer, inner)
            continue
        new_src = tuple(memo.get(s, s) for s in node.src)
        memo[node] = node if new_src == node.src else node.replace(src=new_src)
    return memo[ast]


