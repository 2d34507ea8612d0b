"""Device-independent lowering and device optimisation: `lower(ast, caps) -> ProgramSpec`.

Stage: lowering. Input: kernel IR from the scheduler (global and reduce ranges) and the device's
`Capabilities`. Output: a ProgramSpec whose index arithmetic is simplified and whose ranges are split
for that device. The optimisations (`OptKind`) and what they make of a range (`AxisKind`):
  UPCAST        global range -> outer global + inner UPCAST lanes (register tiles, vectors)
  SPLIT_REDUCE  reduce range -> outer reduce + inner UPCAST lanes, one partial accumulator per lane
  UNROLL        reduce range -> outer reduce + inner UNROLL range (one accumulator, unrolled body)
  THREAD        the outermost global range of a single-block kernel -> THREAD: its points are shared
                among `amount` host threads (ProgramSpec.threads launches, each given its index)
  LOCAL, GROUP  for GPU-style targets: a global range -> outer global + inner LOCAL (threads of a
                block), a reduce range -> outer reduce + inner GROUP (a reduction shared by a block's
                threads); renderer/launch.py maps them to launch indices. The host heuristics never
                choose them and the C renderer rejects them
  TC            a matmul on tensor cores (amount: the reduce tile); ranges are left as they are and
                the GPU renderer emits the tile instructions (engine/gpu_opts.py decides when)
The capabilities decide: a device with local memory (a GPU) gets engine/gpu_opts.py instead of the
host heuristics; no vector lanes (vector_width <= 1) means no UPCAST/SPLIT_REDUCE, one thread
means no THREAD. Passes, in order:
  1. simplify_indices (symbolic_rules)
  2. choose_opts (heuristics from caps, or BEAM search when BEAM > 0)
  3. apply_opts, then simplify_indices again
  4. decompose_transcendentals (EXP2/LOG2/SIN as IR arithmetic: same bits on every backend)
A range whose end is symbolic (a Variable's expression) is never split; counts use its max bound.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

from polygrad import config
from polygrad.backend_api import Capabilities
from polygrad.engine.program import GlobalArg, ProgramSpec
from polygrad.uop.ops import ALU, AxisKind, Ops, UOp
from polygrad.uop.rewrite import graph_rewrite
from polygrad.uop.sint import sprod, sym_vars, vmax
from polygrad.uop.symbolic import range_coeff, symbolic_rules
from polygrad.uop.transcendental import decompose_transcendentals


class OptKind(str, Enum):
    """An optimisation. A str enum: its value is its name, as stored in BEAM's cache files."""

    UPCAST = "UPCAST"
    SPLIT_REDUCE = "SPLIT_REDUCE"
    UNROLL = "UNROLL"
    THREAD = "THREAD"
    LOCAL = "LOCAL"
    GROUP = "GROUP"
    TC = "TC"

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


# below this much work (operations + stores) a thread handoff costs more than it saves (measured on
# the CPU backend: about 20 us per launch to wake a worker)
THREAD_MIN_WORK = 1 << 17


def simplify_indices(ast: UOp) -> UOp:
    """Fold constants and simplify index arithmetic."""
    return graph_rewrite(ast, symbolic_rules, name="simplify_indices")


def ranges_of(ast: UOp) -> list[UOp]:
    return sorted({n for n in ast.toposort() if n.op is Ops.RANGE}, key=lambda r: r.arg[0])


def _size(r: UOp) -> int | None:
    """A range's trip count; None when it is symbolic (such ranges are left unsplit)."""
    return int(r.src[0].arg) if r.src[0].op is Ops.CONST else None


def _max_size(r: UOp) -> int:
    """A range's trip count, at its variables' largest values when symbolic."""
    return int(r.src[0].arg) if r.src[0].op is Ops.CONST else vmax(r.src[0])


def _divides(r: UOp, amount: int) -> bool:
    size = _size(r)
    return size is not None and size % amount == 0


def heuristic_opts(ast: UOp, caps: Capabilities | None = None) -> list[Opt]:
    """Register-tile matmul-like kernels; give long reductions several accumulators (vector lanes)."""
    if caps is not None and caps.vector_width <= 1:
        return []
    ends = [n for n in ast.src if n.op is Ops.END]
    if len(ends) != 1 or not isinstance(ends[0].src[0], UOp) or ends[0].src[0].op is not Ops.STORE:
        return []
    reduces = [n for n in ast.toposort() if n.op is Ops.REDUCE]
    if not reduces:
        return []
    glob = [r for r in ends[0].src[1:] if r.arg[1] == AxisKind.GLOBAL]
    loads = [n.src[0] for n in ast.toposort() if n.op is Ops.LOAD]
    store_index = ends[0].src[0].src[0]
    opts: list[Opt] = []
    if glob:
        last = glob[-1]
        # a contiguous output counts too: x @ W.T (both operands strided along the output column)
        # still gains from the register tile
        contiguous = any(range_coeff(ix.src[1], last) == 1 for ix in [*loads, store_index])
        # a tile only pays when some operand is reused across it (does not depend on `last`);
        # a plain row reduction gets partial accumulators instead
        reused = any(range_coeff(ix.src[1], last) == 0 for ix in loads)
        if contiguous and reused:
            # the row tile is split first so its upcast loop sits outside the contiguous one
            amt = next((a for a in (16, 8) if _divides(last, a)), 0)
            if amt:
                # 8 rows when both operands stream (B along the tile's columns, A along the reduce);
                # with a strided operand the extra registers cost more than they save (measured)
                inner = reduces[0].src[-1]
                streams = any(range_coeff(ld.src[1], last) == 1 for ld in loads) and all(
                    range_coeff(ld.src[1], inner) == 1 for ld in loads if range_coeff(ld.src[1], last) == 0)
                rows = next((r for r in ((8, 4) if streams else (4,)) if len(glob) >= 2 and _divides(glob[-2], r)), 0)
                if rows:
                    opts.append(Opt(OptKind.UPCAST, glob[-2].arg[0], rows))
                opts.append(Opt(OptKind.UPCAST, last.arg[0], amt))
                return opts
    red = reduces[0]
    inner = red.src[-1]
    if inner.arg[1] == AxisKind.REDUCE and _divides(inner, 8) and _size(inner) >= 64:
        opts.append(Opt(OptKind.SPLIT_REDUCE, inner.arg[0], 8))
    return opts


def thread_axis(ast: UOp) -> UOp | None:
    """The range a THREAD opt may take: the outermost global range of a kernel with one END block
    (blocks run in order, so a kernel of several blocks would need a barrier between them)."""
    if len(ast.src) != 1 or ast.src[0].op is not Ops.END:
        return None
    first = ast.src[0].src[1]
    return first if first.arg[1] == AxisKind.GLOBAL and first.src[0].op is Ops.CONST and _size(first) > 1 else None


def thread_opt(ast: UOp, caps: Capabilities | None) -> list[Opt]:
    """THREAD on the outermost global range when the device has threads and the work pays for them."""
    if caps is None or caps.threads <= 1:
        return []
    r = thread_axis(ast)
    if r is None:
        return []
    ops, _ = estimate(ast)
    if ops + stores_of(ast) < THREAD_MIN_WORK:
        return []
    return [Opt(OptKind.THREAD, r.arg[0], min(caps.threads, _size(r)))]


def stores_of(ast: UOp) -> int:
    total = 0
    for block in ast.src:
        total += math.prod(_max_size(r) for r in block.src[1:]) if block.op is Ops.END else 1
    return total


SPLIT_KINDS = {OptKind.UPCAST: AxisKind.UPCAST, OptKind.SPLIT_REDUCE: AxisKind.UPCAST, OptKind.UNROLL: AxisKind.UNROLL,
               OptKind.LOCAL: AxisKind.LOCAL, OptKind.GROUP: AxisKind.GROUP}
# the kind of range each optimisation applies to
OPT_TARGET = {OptKind.UPCAST: AxisKind.GLOBAL, OptKind.SPLIT_REDUCE: AxisKind.REDUCE, OptKind.UNROLL: AxisKind.REDUCE,
              OptKind.THREAD: AxisKind.GLOBAL, OptKind.LOCAL: AxisKind.GLOBAL, OptKind.GROUP: AxisKind.REDUCE,
              OptKind.TC: AxisKind.REDUCE}


def apply_opts(ast: UOp, opts: list[Opt]) -> UOp:
    """Apply opts in order: split the named ranges (new ranges get fresh axis ids), or retag the
    THREAD range. An opt that does not fit the kernel (unknown axis, wrong range kind, amount not
    dividing the size) is skipped."""
    for opt in opts:
        ranges = {r.arg[0]: r for r in ranges_of(ast)}
        r = ranges.get(opt.axis)
        if r is None or r.src[0].op is not Ops.CONST or r.arg[1] != OPT_TARGET[opt.kind]:
            continue
        if opt.kind is OptKind.TC:  # a marker for the renderer: the ranges stay
            continue
        if opt.kind is OptKind.THREAD:
            if r is not thread_axis(ast) or opt.amount < 2:
                continue
            ast = _substitute(ast, {r: UOp(Ops.RANGE, r.dtype, r.src, (r.arg[0], AxisKind.THREAD))})
            continue
        if _size(r) % opt.amount != 0 or _size(r) < opt.amount:
            continue
        next_id = max(ranges) + 1
        outer = UOp(Ops.RANGE, r.dtype, (UOp.const(r.dtype, _size(r) // opt.amount),), (next_id, r.arg[1]))
        inner = UOp(Ops.RANGE, r.dtype, (UOp.const(r.dtype, opt.amount),), (next_id + 1, SPLIT_KINDS[opt.kind]))
        ast = _substitute_range(ast, r, outer, inner, opt.kind)
    return ast


def threads_of(ast: UOp, opts: list[Opt]) -> int:
    if not any(r.arg[1] == AxisKind.THREAD for r in ranges_of(ast)):
        return 1
    return next(o.amount for o in reversed(opts) if o.kind is OptKind.THREAD)


def _substitute(ast: UOp, mapping: dict[UOp, UOp]) -> UOp:
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
            partial = UOp(Ops.REDUCE, node.dtype, (body, *others, outer), node.arg)
            memo[node] = UOp(Ops.REDUCE, node.dtype, (partial, inner), node.arg)
            continue
        new_src = tuple(memo.get(s, s) for s in node.src)
        memo[node] = node if new_src == node.src else node.replace(src=new_src)
    return memo[ast]


def estimate(ast: UOp) -> tuple[int, int]:
    """(operations, bytes moved) for GlobalCounters."""
    ops = 0
    def count(node: UOp, trips: int, seen: set) -> int:
        total = 0
        stack = [node]
        while stack:
            x = stack.pop()
            if x in seen:
                continue
            seen.add(x)
            if x.op is Ops.REDUCE:
                inner = trips * math.prod(_max_size(r) for r in x.src[1:])
                total += inner + count(x.src[0], inner, set())
                continue
            if x.op is Ops.FMA:
                total += 2 * trips  # a multiply and an add
            elif x.op in ALU and x.dtype is not None and not x.dtype.is_int:
                total += trips
            elif x.op in ALU and x.op not in (Ops.ADD, Ops.MUL, Ops.IDIV, Ops.MOD):
                total += trips
            stack.extend(x.src)
        return total
    for node in ast.src:
        ranges = node.src[1:] if node.op is Ops.END else ()
        trips = math.prod(_max_size(r) for r in ranges if r.op is Ops.RANGE)
        ops += count(node.src[0] if node.op is Ops.END else node, trips, set())
    mem = sum(vmax(g.arg[1][0]) * g.dtype.itemsize for g in ast.toposort() if g.op is Ops.DEFINE_GLOBAL)
    return ops, mem


def globals_of(ast: UOp) -> tuple[GlobalArg, ...]:
    written = {n.src[0].src[0].arg[0] for n in ast.toposort() if n.op is Ops.STORE}
    found = {n.arg[0]: n for n in ast.toposort() if n.op is Ops.DEFINE_GLOBAL}
    return tuple(GlobalArg(slot, g.dtype, sprod(g.arg[1]), slot in written) for slot, g in sorted(found.items()))


def vars_of(ast: UOp, params: tuple[GlobalArg, ...] = ()) -> tuple[UOp, ...]:
    """The kernel's Variables (in its IR and its buffers' sizes), sorted by name: its int parameters."""
    found = {n for n in ast.toposort() if n.op is Ops.DEFINE_VAR}
    for g in params:
        found |= sym_vars(g.size)
    return tuple(sorted(found, key=lambda v: v.arg))


def lower(ast: UOp, caps: Capabilities | None = None, opts: list[Opt] | None = None) -> ProgramSpec:
    """Lower a scheduled kernel for a device with capabilities `caps` (None: no device optimisation
    beyond what `opts` asks). opts None means the heuristics choose (none with NOOPT=1)."""
    # the scheduler passes one buffer per DEFINE_GLOBAL; keep them all even if simplification drops a load
    params = globals_of(ast)
    variables = vars_of(ast, params)  # before simplification, so the parameter list never shrinks
    ast = simplify_indices(ast)
    if opts is None:
        opts = [] if config.get("NOOPT") else default_opts(ast, caps)
    if opts:
        ast = simplify_indices(apply_opts(ast, opts))
    # counted before decomposition: a transcendental counts as one operation, as users expect
    ops, mem = estimate(ast)
    ast = decompose_transcendentals(ast)
    name = getattr(ast.arg, "name", "kernel")
    return ProgramSpec(name=name, ast=ast, globals=params, ops=ops, mem_bytes=mem, opts=tuple(opts),
                       vars=variables, threads=threads_of(ast, opts),
                       vector_width=max(1, int(getattr(caps, "vector_width", 1) or 1)))


def default_opts(ast: UOp, caps: Capabilities | None) -> list[Opt]:
    """The heuristic choice for a simplified kernel: register tiles / lane accumulators, then THREAD
    (GPU-style devices: engine/gpu_opts.py)."""
    if caps is not None and caps.has_local_memory:
        from polygrad.engine.gpu_opts import gpu_opts
        return gpu_opts(ast, caps)
    opts = heuristic_opts(ast, caps) or elementwise_vector_opts(ast, caps)  # vector code (issue 9 item 4)
    split = simplify_indices(apply_opts(ast, opts)) if opts else ast
    return opts + thread_opt(split, caps)


# ---- vector code (issue 9 item 4) ------------------------------------------------------------------
def elementwise_vector_opts(ast: UOp, caps: Capabilities | None) -> list[Opt]:
    """An elementwise kernel (one END, no reduce) whose store is contiguous in its last range gets
    that range split into vector lanes (UPCAST by the device's vector width)."""
    width = int(getattr(caps, "vector_width", 1) or 1)
    if width <= 1 or len(ast.src) != 1 or ast.src[0].op is not Ops.END or ast.src[0].src[0].op is not Ops.STORE:
        return []
    end = ast.src[0]
    if any(n.op is Ops.REDUCE for n in end.toposort()):
        return []
    last = end.src[-1]
    if last.arg[1] != AxisKind.GLOBAL or last.src[0].op is not Ops.CONST or _size(last) % width != 0:
        return []
    if range_coeff(end.src[0].src[0].src[1], last) != 1:
        return []
    return [Opt(OptKind.UPCAST, last.arg[0], width)]
# ---- end vector code ----------------------------------------------------------------------------------
