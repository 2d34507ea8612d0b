"""Group a tensor graph into kernels: `schedule(targets) -> Schedule`.

Stage: scheduling. Input: tensor-graph UOps to realize. Output: a list of steps (kernel IR ASTs,
copies) over a buffer table. Elementwise chains fuse into each other and into the inputs and outputs
of reductions; a reduction gets its own buffer when it is read inside another reduction or by several
kernels, and an expression read through an expand (each value read many times) or a pad gets one when
fusing it would recompute a reduction or real work per read (see RECOMPUTE_MIN_COST).

Graphs are first normalised (real buffers replaced by numbered slots) so that a graph with the same
structure and new data hits the schedule cache and never reaches the Python compiler again. Bound
variables (symbolic sizes) are normalised too: every BIND becomes its bare DEFINE_VAR and the values
are returned beside the key as `var_vals`, so a graph over `batch` serves every value of it.
"""
from __future__ import annotations

import heapq
import weakref
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from polygrad.device import note_overwrite
from polygrad.dtype import DType
from polygrad.errors import PolygradError, VariableError
from polygrad.engine import computed
from polygrad.engine.indexing import KernelBuilder, address, build_with_index_width, flat_index, index_width
from polygrad.uop.movement import strip_reshapes
from polygrad.uop import sint
from polygrad.uop.names import plain_name
from polygrad.uop.ops import ELEMENTWISE, MOVEMENT, SELF_KEYED_ARGS, AxisKind, KernelInfo, Ops, UOp

# effectful nodes that already ran (ASSIGN, AFTER) -> the buffer view they left behind, so a graph that
# still holds one never runs it twice. Pure values a realize computed are kept apart, in
# engine/computed.py, only until a buffer is written (normalize's `reuse`).
becomes: "weakref.WeakKeyDictionary[UOp, UOp]" = weakref.WeakKeyDictionary()
EFFECT_OPS = (Ops.ASSIGN, Ops.AFTER)
UNIQUE_OPS = (Ops.ASSIGN, Ops.AFTER)

BOUNDARY_OPS = {Ops.BUFFER, Ops.COPY, Ops.CONTIGUOUS, Ops.ASSIGN, Ops.CUSTOM, Ops.AFTER, Ops.SCATTER}
SIZED_OPS = (Ops.RESHAPE, Ops.EXPAND, Ops.SHRINK, Ops.PAD)  # ops whose arg holds sizes (maybe symbolic)
# Buffers allocated for the largest values of their symbolic size (the results of kernels over a
# Variable): a symbolic view of one covers a prefix, and its slot keeps the fixed allocation size.
capacity_buffers: "weakref.WeakSet[Any]" = weakref.WeakSet()


class SlotRef(NamedTuple):
    """Stands for the k-th input buffer of a normalised graph."""

    index: int
    size: Any  # int, or a symbolic size (over DEFINE_VARs) for a buffer viewed through a Variable
    device: str


SELF_KEYED_ARGS.add(SlotRef)  # ints, sizes and a device name: its own hash-cons key


@dataclass(frozen=True)
class Step:
    """One thing to run: a kernel AST over table entries, a device copy, or a custom kernel."""

    kind: str  # "kernel" | "copy"
    device: str
    args: tuple[int, ...]  # buffer-table indices in the kernel's slot order
    ast: UOp | None = None


@dataclass
class Template:
    """A cached schedule: steps over a table of n_inputs inputs followed by new buffers."""

    n_inputs: int
    new_buffers: list[tuple[int, DType, str]] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    outputs: list[UOp] = field(default_factory=list)  # normalised views over table slots
    # normalised nodes whose whole value a new table entry holds once the steps ran (the pure realize
    # points and targets) -> (entry, the shape to view it at, None for the flat buffer itself):
    # engine/computed.py keeps those values for later realizes
    kept: dict[UOp, tuple[int, tuple | None]] = field(default_factory=dict)
    prepared: bool = False  # its programs were compiled together once (run_template; a hint only)
    unwritten: tuple[bool, ...] | None = None  # per new buffer: not provably written before read (run_template)


schedule_cache: dict[tuple[UOp, ...], Template] = {}


def is_buffer_view(u: UOp) -> bool:
    """A whole contiguous buffer, possibly reshaped."""
    return strip_reshapes(u).op is Ops.BUFFER


def normalize(targets: list[UOp], effects: list[UOp] | None = None,
              var_vals: dict[UOp, int] | None = None, reuse: dict[weakref.ref, UOp] | None = None,
              walked: dict[UOp, UOp] | None = None) -> tuple[tuple[UOp, ...], list[Any]]:
    """Replace realized subgraphs by their buffers and buffers by numbered SlotRefs; the effects
    (ASSIGN/AFTER) that have not run yet are appended to `effects` when given. BINDs become their
    variables, whose values go into `var_vals` (VariableError for a variable with no value).
    `reuse` holds values computed before (engine/computed.py): a node found there is read from its
    buffer and the walk stops there, unless the graph holds an effect still to run or symbolic sizes,
    or the node is a target's (_target_nodes). `walked`, when given, receives each walked node's
    normalised form.
    One walk over the graph; it runs on every realize, so the common nodes take the shortest path. A
    graph with symbolic sizes is walked again once its buffers' symbolic sizes are known."""
    keep = _target_nodes(targets) if reuse else None
    # with kept values, walk only what they leave to compute (not the whole graph below them); the
    # values the walk stopped at are taken into `hits` at once, since another thread may drop kept
    # values (an overwrite) between this walk and the next
    hits: dict[UOp, UOp] | None = {} if reuse else None
    live = _live_order(targets, reuse, keep, hits) if reuse else None
    pruned = live is not None
    if live is None:  # nothing kept, or a pending effect: the whole graph, as its cached toposort
        hits = None
        order = targets[0].toposort() if len(targets) == 1 else UOp(Ops.SINK, None, tuple(targets)).toposort()[:-1]
    else:
        order = live
    binds: dict[UOp, int] = {} if var_vals is None else var_vals
    n_effects = len(effects) if effects is not None else 0
    saved_binds = dict(binds) if binds else None
    sym_sizes: dict[int, Any] | None = None
    memo: dict[UOp, UOp] = {} if walked is None else walked
    while True:  # a walk that meets one of the rare cases below starts over, knowing it
        try:
            return _normalize_walk(order, targets, effects, binds, sym_sizes, pruned, memo, hits)
        except _RanEffect:  # what only fed an effect that already ran gets no slot
            order = _live_order(targets, None, None) or []
            pruned = True
        except _SymbolicSizes:
            if hits is not None:  # symbolic graphs reuse nothing: walk below kept values again
                hits = None
                order = _live_order(targets, None, None) or []
            sym_sizes = _symbolic_buffer_sizes(order)
        if effects is not None:
            del effects[n_effects:]
        binds.clear()
        binds.update(saved_binds or {})
        memo.clear()


def _target_nodes(targets: list[UOp]) -> set[UOp]:
    """The targets and the nodes under their reshapes: never read from a kept value, whose buffer
    the result would then alias."""
    out: set[UOp] = set()
    for t in targets:
        out.add(t)
        while t.op is Ops.RESHAPE:
            t = t.src[0]
            out.add(t)
    return out


class _SymbolicSizes(Exception):
    """The graph views a buffer through a symbolic size: its slots need `_symbolic_buffer_sizes`."""


class _RanEffect(Exception):
    """The graph holds an effect that already ran: the walk must skip what only fed it (`_live_order`)."""


def _normalize_walk(order: list[UOp], targets: list[UOp], effects: list[UOp] | None, binds: dict[UOp, int],
                    sym_sizes: dict[int, Any] | None, pruned: bool, memo: dict[UOp, UOp],
                    hits: dict[UOp, UOp] | None) -> tuple[tuple[UOp, ...], list[Any]]:
    inputs: list[Any] = []
    slot_of: dict[Any, int] = {}  # Buffer -> its slot (Buffers hash by identity)
    seen_vars: set[UOp] = set()
    for node in order:
        op = node.op
        if hits is not None and op is not Ops.BUFFER:  # the order (_live_order) stops at kept values
            view = hits.get(node)
            if view is not None:
                memo[node] = _normalize_view(view, inputs, slot_of, memo)
                continue
        if op is Ops.BUFFER:
            buf = node.arg
            if sym_sizes or type(buf) is SlotRef:
                memo[node] = _slot(node, inputs, slot_of, sym_sizes)
                continue
            k = slot_of.get(buf)
            if k is None:
                k = slot_of[buf] = len(inputs)
                inputs.append(buf)
            key = (k, buf.size, buf.device, node.dtype)
            hit = _slot_nodes.get(key)
            memo[node] = hit if hit is not None else _slot(node, inputs, slot_of)
            continue
        sized = op in SIZED_OPS and sint.has_sym(node.arg)
        if sized and sym_sizes is None:
            raise _SymbolicSizes
        if op in _PLAIN_NORMALIZE and not sized:
            src = node.src
            n_src = len(src)
            if n_src == 1:
                s0 = memo[src[0]]
                memo[node] = node if s0 is src[0] else UOp(op, node.dtype, (s0,), node.arg)
                continue
            new_src = (memo[src[0]], memo[src[1]]) if n_src == 2 else tuple([memo[x] for x in src])
            memo[node] = node if new_src == src else UOp(op, node.dtype, new_src, node.arg)
            continue
        if op in EFFECT_OPS:
            done = becomes.get(node)
            if done is not None and done is not node:
                if not pruned:
                    raise _RanEffect
                memo[node] = _normalize_view(done, inputs, slot_of, memo)
                continue
            if effects is not None:
                effects.append(node)
        if op is Ops.BIND:
            var, val = node.unbind()
            sint.record(binds, var, val)
            memo[node] = var
            continue
        if op is Ops.DEFINE_VAR:
            seen_vars.add(node)
        new_src = tuple(memo[s] for s in node.src)
        if op in UNIQUE_OPS and node.arg is not None:
            # effects carry a unique id so two assigns never hash-cons together; the key drops it
            memo[node] = node.replace(src=new_src, arg=None)
            continue
        if sized:
            arg = sint.strip_binds(node.arg, binds)
            seen_vars |= sint.sym_vars(arg)
            base = strip_reshapes(node.src[0])
            if op is Ops.RESHAPE and base.op is Ops.BUFFER and base in memo:
                new_src = (memo[base],)  # x.reshape(n, 16).reshape(v.bind(n), 16): the n drops out of the key
            memo[node] = UOp(op, node.dtype, new_src, arg)
            continue
        memo[node] = node if new_src == node.src else node.replace(src=new_src)
    if seen_vars:
        unbound = sorted(v.arg[0] for v in seen_vars if v not in binds)
        if unbound:
            raise VariableError(f"Variable {unbound[0]!r} is used unbound in a tensor being realized; bind it to "
                                f"this call's value with v.bind(n) (e.g. x.shrink(((0, v.bind(n)), None)))")
    if binds:
        names: dict[str, UOp] = {}
        for v in binds:
            if names.setdefault(v.arg[0], v) is not v:
                raise VariableError(f"two different Variables are named {v.arg[0]!r} (bounds "
                                    f"{names[v.arg[0]].arg[1:]} and {v.arg[1:]}) in one computation; give them "
                                    "distinct names")
    return (memo[targets[0]],) if len(targets) == 1 else tuple(memo[t] for t in targets), inputs


# nodes normalize only rebuilds over their normalised sources (everything but buffers, effects, variables)
_PLAIN_NORMALIZE = frozenset(Ops) - {Ops.BUFFER, Ops.BIND, Ops.DEFINE_VAR, *EFFECT_OPS, *UNIQUE_OPS}


def _live_order(targets: list[UOp], reuse: dict[weakref.ref, UOp] | None,
                keep: set[UOp] | None, hits: dict[UOp, UOp] | None = None) -> list[UOp] | None:
    """The nodes the normalised graph keeps, sources first: everything reachable from the targets
    without passing below an effect that already ran (it stands for its buffer now, `becomes`) or a
    value in `reuse` (read from its buffer). The inputs are exactly the buffers of these nodes, so the
    key alone determines the buffer table: a buffer that only fed a finished assign must not take a
    slot (it shifted every new buffer's table index, and a template cached under the same key then
    wrote into that unrelated input). Linear in the nodes kept. With `reuse`, a graph holding an
    effect still to run gives None at once: such a graph reuses nothing. Each kept value the walk stops
    at goes into `hits` (node -> its buffer view)."""
    order: list[UOp] = []
    seen: set[UOp] = set()
    stack: list[tuple[UOp, bool]] = [(t, False) for t in reversed(targets)]
    ref = weakref.ref
    while stack:
        node, finished = stack.pop()
        if finished:
            order.append(node)
            continue
        if node in seen:
            continue
        seen.add(node)
        if node.op in EFFECT_OPS:
            done = becomes.get(node)
            if done is not None and done is not node:
                order.append(node)
                continue
            if reuse is not None:
                return None
        elif reuse is not None and node not in keep:  # type: ignore[operator]
            view = reuse.get(ref(node))
            if view is not None:
                hits[node] = view  # type: ignore[index]
                order.append(node)
                continue
        stack.append((node, True))
        for s in reversed(node.src):
            if s not in seen:
                stack.append((s, False))
    return order


def _symbolic_buffer_sizes(order: list[UOp]) -> dict[int, Any]:
    """id(Buffer) -> symbolic size (over DEFINE_VARs) for the buffers the graph views through a
    Variable at their exact size (x.reshape(v.bind(n), 16) of an n*16 buffer): their slot gets the
    symbolic size, so a new n keeps the schedule and the compiled programs."""
    out: dict[int, Any] = {}
    for node in order:
        if node.op is not Ops.RESHAPE or not sint.has_sym(node.arg):
            continue
        base = strip_reshapes(node.src[0])
        if base.op is not Ops.BUFFER or isinstance(base.arg, SlotRef) or base.arg in capacity_buffers:
            continue
        total = sint.sprod(node.arg)
        if sint.resolve(total) == base.arg.size:
            out[id(base.arg)] = sint.strip_binds(total, {})
    return out


# (slot, size, device, dtype) -> its BUFFER node: every realize builds the same few (held here, so
# hash-consing them is a dict hit); cleared when it grows past _SLOT_NODES_MAX
_slot_nodes: dict[tuple, UOp] = {}
_SLOT_NODES_MAX = 1 << 14


def _slot(node: UOp, inputs: list[Any], slot_of: dict[Any, int], sym_sizes: dict[int, Any] | None = None) -> UOp:
    buf = node.arg
    if isinstance(buf, SlotRef):
        return node
    k = slot_of.get(buf)
    if k is None:
        k = slot_of[buf] = len(inputs)
        inputs.append(buf)
    size = sym_sizes.get(id(buf), buf.size) if sym_sizes else buf.size
    key = (k, size, buf.device, node.dtype)
    hit = _slot_nodes.get(key)
    if hit is None:
        if len(_slot_nodes) >= _SLOT_NODES_MAX:
            _slot_nodes.clear()
        hit = _slot_nodes[key] = UOp(Ops.BUFFER, node.dtype, (), SlotRef(k, size, buf.device))
    return hit


def _normalize_view(view: UOp, inputs: list[Any], slot_of: dict[Any, int], memo: dict[UOp, UOp]) -> UOp:
    out: dict[UOp, UOp] = {}
    for node in view.toposort():
        if node.op is Ops.BUFFER:
            out[node] = _slot(node, inputs, slot_of)
        else:
            new_src = tuple(out[s] for s in node.src)
            out[node] = node if new_src == node.src else node.replace(src=new_src)
    return out[view]


def denormalize(u: UOp, table: list[Any], var_vals: dict[UOp, int] | None = None) -> UOp:
    """A normalised output view over real buffers, its variables bound to var_vals again."""
    if u.op is Ops.BUFFER and isinstance(u.arg, SlotRef):  # the common case: a whole new buffer
        return UOp(Ops.BUFFER, u.dtype, (), table[u.arg.index])
    out: dict[UOp, UOp] = {}
    for node in u.toposort():
        if node.op is Ops.BUFFER and isinstance(node.arg, SlotRef):
            out[node] = UOp(Ops.BUFFER, node.dtype, (), table[node.arg.index])
        elif var_vals and node.op in SIZED_OPS and sint.has_sym(node.arg):
            out[node] = UOp(node.op, node.dtype, tuple(out[s] for s in node.src), sint.attach_binds(node.arg, var_vals))
        else:
            new_src = tuple(out[s] for s in node.src)
            out[node] = node if new_src == node.src else node.replace(src=new_src)
    return out[u]


# ---------------------------------------------------------------------------------------------------
# deciding kernel boundaries


def find_realize_points(targets: tuple[UOp, ...]) -> list[UOp]:
    """Every node that gets its own kernel (and buffer), in dependency order."""
    points: set[UOp] = set()
    for t in targets:
        if t.op is Ops.ASSIGN or not (is_buffer_view(t) or t.op is Ops.AFTER):
            points.add(t)
    sink = UOp(Ops.SINK, None, targets)
    for node in sink.toposort():
        if node.op in (Ops.CONTIGUOUS, Ops.COPY, Ops.ASSIGN, Ops.CUSTOM, Ops.AFTER, Ops.SCATTER):
            points.add(node)
        if node.op is Ops.COPY and not is_buffer_view(node.src[0]):
            points.add(node.src[0])
        if node.op is Ops.CUSTOM:
            points.update(s for s in node.src if not is_buffer_view(s))
    order = {n: i for i, n in enumerate(sink.toposort())}
    _add_reduce_points(points, order)
    if _split_deep_chains(sink, points):  # new roots can make more reductions shared
        _add_reduce_points(points, order)
    return order_points(points, order)


def _base_buffer(view: UOp) -> UOp | None:
    while view.op is not Ops.BUFFER:
        if not view.src:
            return None
        view = view.src[0]
    return view


def _reads(point: UOp, points: set[UOp]) -> set[UOp]:
    """Boundary nodes (other points, buffers) the step for `point` reads."""
    if point.op is Ops.AFTER:
        return {point.src[1]}  # it aliases src[0]'s buffer once the custom kernel ran
    if point.op in (Ops.CUSTOM, Ops.COPY):
        return set(point.src)
    start = point.src[1] if point.op is Ops.ASSIGN else (point.src[0] if point.op is Ops.CONTIGUOUS else point)
    found: set[UOp] = set()
    stack, seen = [start], set()
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        if node is not point and (node in points or node.op in BOUNDARY_OPS):
            found.add(node)
            continue
        stack.extend(node.src)
    return found


def order_points(points: set[UOp], order: dict[UOp, int]) -> list[UOp]:
    """Dependency order, plus: a step that reads a buffer's old value runs before the step that
    overwrites it (assign, custom kernel)."""
    reads = {p: _reads(p, points) for p in points}
    after: dict[UOp, set[UOp]] = {p: {q for q in reads[p] if q in points} for p in points}
    writes: dict[UOp, set[UOp]] = {}  # the writing points (assigns, custom kernels) -> buffers written
    for p in points:
        if p.op is Ops.ASSIGN or p.op is Ops.CUSTOM:
            targets = [p.src[0]] if p.op is Ops.ASSIGN else list(p.src)
            writes[p] = {b for b in (_base_buffer(t) for t in targets) if b is not None}
    for w, bufs in writes.items():
        for r in points:
            if r is not w and reads[r] & bufs:
                after[w].add(r)
    # each time, the first point in graph order whose dependencies are placed (a heap of the ready ones)
    users: dict[UOp, list[UOp]] = {p: [] for p in points}
    waiting = {p: len(after[p]) for p in points}
    for p in points:
        for q in after[p]:
            users[q].append(p)
    ready = [(order[p], p) for p in points if not waiting[p]]  # graph positions are distinct: no ties
    heapq.heapify(ready)
    done: list[UOp] = []
    while ready:
        p = heapq.heappop(ready)[1]
        done.append(p)
        for u in users[p]:
            waiting[u] -= 1
            if not waiting[u]:
                heapq.heappush(ready, (order[u], u))
    if len(done) < len(points):
        raise PolygradError("these assigns read each other's buffers in a cycle; realize one of them first "
                            "(e.g. a.realize() before b.assign(a))")
    return done


# A fused kernel's expression is at most this many tensor-graph nodes deep; a deeper elementwise chain
# (e.g. 100k lazy `x = x + 1`) is cut into several kernels. The C renderer and the interpreter walk a
# kernel's expression recursively, so this also keeps them well inside Python's recursion limit.
MAX_FUSED_DEPTH = 256
# ops that the lowering expands into long expressions (transcendental approximations) count for more
_DEPTH_WEIGHT = {Ops.EXP2: 16, Ops.LOG2: 16, Ops.SIN: 16, Ops.POW: 24}
_SPLITTABLE = ELEMENTWISE | MOVEMENT | {Ops.REDUCE_AXIS}


def _split_deep_chains(sink: UOp, points: set[UOp]) -> bool:
    """Add a realize point wherever the fused expression above the nearest boundary gets too deep;
    True when it added any."""
    added = False
    depth: dict[UOp, int] = {}  # depth as seen by a user: 0 for boundaries (a load there)
    for node in sink.toposort():
        if node.op in BOUNDARY_OPS:
            depth[node] = 0
            continue
        inner = _DEPTH_WEIGHT.get(node.op, 1) + max((depth[s] for s in node.src), default=0)
        if node in points:
            depth[node] = 0
        elif inner >= MAX_FUSED_DEPTH and node.op in _SPLITTABLE and node.dtype is not None \
                and node.device is not None:
            points.add(node)
            depth[node] = 0
            added = True
        else:
            depth[node] = inner
    return added


def _add_reduce_points(points: set[UOp], order: dict[UOp, int]) -> None:
    """Add reductions (and expressions over them) needing their own buffer until none is left (a fixed
    point). Each round walks only the roots that are new or whose walk touched a point added in the round
    before (found through `visitors`): every other walk is unchanged, since points only matter where a
    walk reaches them. What the walks ask for is counted as they change, so a round costs what it
    re-walks: linear in the graph, even when a deep chain of nested reductions takes a round per level.
    Then `_drop_cheap_epilogues`."""
    tally = _WalkTally(points)
    firm: set[UOp] = set(points)  # points for a reason other than an expand or pad reading them
    todo: set[UOp] = set(points)
    while True:
        for root in todo:
            tally.replace(root, _walk_root(root, points))
        # the expands' and pads' points first: a reduction that several kernels, or another reduction,
        # read only through such an expression is then read by that expression's kernel alone
        added = set(tally.open_view)
        if not added:
            added = set(tally.open_nested) or set(tally.open_shared)
            firm |= added
            if not added:
                break
        points |= added
        todo = set(added)
        for n in added:
            tally.open_view.discard(n)
            tally.open_nested.discard(n)
            tally.open_shared.discard(n)
            todo.update(tally.visitors.get(n, ()))
    _drop_cheap_epilogues(points, firm, tally.views, order)


class _WalkTally:
    """What the current walks of _add_reduce_points ask for, kept up to date one walk at a time: the
    nodes each walk visited (and the roots that visited each node), and the nodes not yet points that
    some walk wants a buffer for through an expand or pad (`open_view`), as a nested reduction
    (`open_nested`), or that several kernels reach (`open_shared`)."""

    def __init__(self, points: set[UOp]):
        self.points = points
        self.walks: dict[UOp, tuple[set[UOp], dict[UOp, UOp | None], set[UOp]]] = {}  # root -> its walk
        self.visitors: dict[UOp, set[UOp]] = {}
        self.views: dict[UOp, set[UOp]] = {}  # node -> every expand/pad that asked for it (only grows)
        self.by_view: dict[UOp, int] = {}  # node -> walks asking for it through an expand or pad
        self.nested: dict[UOp, int] = {}  # node -> walks finding it nested in a reduction
        self.reached_by: dict[UOp, int] = {}  # reduction -> walks reaching it
        self.open_view: set[UOp] = set()
        self.open_nested: set[UOp] = set()
        self.open_shared: set[UOp] = set()

    def replace(self, root: UOp, walk: tuple[set[UOp], dict[UOp, UOp | None], set[UOp]]) -> None:
        old = self.walks.get(root)
        if old is not None:
            self._count(root, old, -1)
        self.walks[root] = walk
        self._count(root, walk, 1)

    def _count(self, root: UOp, walk: tuple[set[UOp], dict[UOp, UOp | None], set[UOp]], step: int) -> None:
        visited, must, reached = walk
        for n in visited:
            if step > 0:
                self.visitors.setdefault(n, set()).add(root)
            else:
                self.visitors[n].discard(root)
        for n, view in must.items():
            if view is None:
                self._bump(self.nested, self.open_nested, n, step, 1)
            else:
                self._bump(self.by_view, self.open_view, n, step, 1)
                if step > 0:
                    self.views.setdefault(n, set()).add(view)
        for n in reached:
            self._bump(self.reached_by, self.open_shared, n, step, 2)

    def _bump(self, counts: dict[UOp, int], open_set: set[UOp], n: UOp, step: int, least: int) -> None:
        """Count one walk more or less for n; n is open while at least `least` walks count and it is
        not a point yet."""
        k = counts.get(n, 0) + step
        counts[n] = k
        if k >= least and n not in self.points:
            open_set.add(n)
        elif k < least:
            open_set.discard(n)


def _drop_cheap_epilogues(points: set[UOp], firm: set[UOp], views: dict[UOp, set[UOp]],
                          order: dict[UOp, int]) -> None:
    """An expression over a reduction became a point because an expand read it; when that reduction got a
    buffer of its own anyway (several kernels read it), what is left of the expression may be cheap
    enough to fuse into its readers (the loss's `sum * (1/n)`): drop those points again. Dropping one
    only inlines elementwise work between points, so no other rule changes its verdict."""
    for p in sorted((p for p in views if p not in firm and p.op is not Ops.REDUCE_AXIS), key=order.__getitem__):
        points.discard(p)
        if any(_needs_buffer(v, points) is not None for v in views[p]):
            points.add(p)


# An expression read through an expand is evaluated once per read, not once per element. It gets a buffer
# of its own when it holds a reduction (always), or when the recompute would cost more than loading a
# stored value: at least RECOMPUTE_MIN_COST operations per read (a one-op expression, e.g. a compare or a
# cast, is no dearer than the load that would replace it), adding at least RECOMPUTE_MIN_OPS operations
# in all (below that, an extra kernel launch costs more than it saves). A one-element expression is
# loop-invariant: compilers and the interpreter evaluate it once, so it always fuses.
RECOMPUTE_MIN_COST = 2
RECOMPUTE_MIN_OPS = 1 << 14
# how far the cost walk looks below an expand before it calls the expression expensive
_COST_WALK_LIMIT = 256
_VIEW_OPS = MOVEMENT | {Ops.DETACH}
# a reduction doing this many operations per element it reads is a contraction (see _is_contraction)
CONTRACTION_REUSE = 4


def _under_views(u: UOp) -> UOp:
    """The first node below a chain of movement ops (the value an expand reads)."""
    while u.op in _VIEW_OPS:
        u = u.src[0]
    return u


def _op_cost(node: UOp) -> int:
    """Operations one evaluation of a tensor-graph node costs (transcendentals expand into many)."""
    if node.op in ELEMENTWISE:
        return _DEPTH_WEIGHT.get(node.op, 1)
    return 0


def _expression_cost(below: UOp, points: set[UOp]) -> int | None:
    """Operations one evaluation of `below` costs down to the kernel's boundaries; None when it holds a
    reduction (or is too large to look through)."""
    cost, stack, seen = 0, [below], {below}
    while stack:
        node = stack.pop()
        if node.op is Ops.REDUCE_AXIS or len(seen) > _COST_WALK_LIMIT:
            return None
        cost += _op_cost(node)
        for s in node.src:
            if s not in seen and s not in points and s.op not in BOUNDARY_OPS:
                seen.add(s)
                stack.append(s)
    return cost


def _needs_buffer(view: UOp, points: set[UOp]) -> UOp | None:
    """The expression below an EXPAND or PAD that must get its own buffer, if any. Through an expand
    every value is read many times (see RECOMPUTE_MIN_COST); through a pad a reduction would also run
    at the padded points, where kernels gate loads but not loops."""
    below = _under_views(view.src[0])
    if below in points or below.op in BOUNDARY_OPS or below.dtype is None or below.device is None:
        return None
    if below.op not in ELEMENTWISE and below.op is not Ops.REDUCE_AXIS:
        return None
    cost = _expression_cost(below, points)
    if cost is None:
        return below
    if view.op is Ops.PAD:
        return None
    n = _numel(below)
    if n <= 1 or cost < RECOMPUTE_MIN_COST:
        return None
    return below if cost * (_numel(view) - n) >= RECOMPUTE_MIN_OPS else None


def _numel(u: UOp) -> int:
    return sint.vmax(sint.sprod(u.shape))


def _is_contraction(reduce: UOp, points: set[UOp]) -> bool:
    """A reduction that reads its data many times over (a matmul, a convolution: an expanded product doing
    CONTRACTION_REUSE or more times as many operations as the elements it reads). Nested in another reduction
    (`(a @ b).sum()`) it would lose its output axes (no threads, no tiling) and run as one serial loop nest:
    it gets its own kernel. A nested sum that reads each element once (a blocked sum's partials, `(m * w)`
    summed) stays fused."""
    work = _numel(reduce.src[0])
    data, stack, seen = 0, [reduce.src[0]], {reduce.src[0]}
    while stack:
        node = stack.pop()
        if len(seen) > _COST_WALK_LIMIT:
            return False
        if node is not reduce.src[0] and (node in points or node.op in BOUNDARY_OPS or node.op is Ops.REDUCE_AXIS):
            data += _numel(node)
            continue
        for s in node.src:
            if s not in seen and s.dtype is not None:
                seen.add(s)
                stack.append(s)
    return work >= CONTRACTION_REUSE * max(data, 1)


def _walk_root(root: UOp, points: set[UOp]) -> tuple[set[UOp], dict[UOp, UOp | None], set[UOp]]:
    """One kernel's walk from its root down to the boundaries: (nodes visited, nodes that must get a buffer:
    reductions inside another reduction, expressions an expand or pad should not fuse (_needs_buffer),
    reductions reached)."""
    visited: set[UOp] = set()
    must: dict[UOp, UOp | None] = {}  # node -> the expand/pad that asked for it (None: a nested reduction)
    reached: set[UOp] = set()
    if root.op in (Ops.CUSTOM, Ops.AFTER, Ops.COPY):
        return visited, must, reached
    start = root.src[1] if root.op is Ops.ASSIGN else (root.src[0] if root.op is Ops.CONTIGUOUS else root)
    # a reshape of the kernel's own reduction (a full sum's scalar) does not make that reduction "another"
    # one: the kernel is that reduction (it may hold one nested reduction, as any reducing kernel)
    while start.op is Ops.RESHAPE and start.src[0] not in points and start.src[0].op not in BOUNDARY_OPS:
        start = start.src[0]
    stack = [(start, False, False)]
    seen: set[tuple[UOp, bool, bool]] = set()
    while stack:
        item = stack.pop()
        if item in seen:
            continue
        seen.add(item)
        node, expanded, in_reduce = item
        visited.add(node)
        if node is not start and (node in points or node.op in BOUNDARY_OPS):
            continue
        if node.op is Ops.REDUCE_AXIS:
            if node is not start and (expanded or in_reduce or (start.op is Ops.REDUCE_AXIS
                                                                 and _is_contraction(node, points))):
                must[node] = None
                continue
            reached.add(node)
            in_reduce = in_reduce or node is not start
        if node.op in (Ops.EXPAND, Ops.PAD):
            below = _needs_buffer(node, points)
            if below is not None:
                must[below] = node
                visited.add(below)
                continue
        if node.op is Ops.EXPAND:
            expanded = True
        for s in node.src:
            stack.append((s, expanded, in_reduce))
    return visited, must, reached


# ---------------------------------------------------------------------------------------------------
# building the template


def _kernel_name(root: UOp, ast: UOp) -> str:
    """'r_<shape>' (a reduction) or 'E_<shape>': a plain name (uop/names.py), cut to its length limit."""
    has_reduce = any(n.op is Ops.REDUCE for n in ast.toposort())
    shape = "_".join(sint.sym_name(s) for s in root.shape) or "1"
    return plain_name(f"{'r' if has_reduce else 'E'}_{shape}")


# a full reduction at least this long is computed in two kernels (partial results over chunks, then
# their total), so the first has an output axis a device can spread over threads, lanes or blocks
SPLIT_REDUCE_MIN = 1 << 18


def split_long_reductions(targets: tuple[UOp, ...]) -> tuple[UOp, ...]:
    """Rewrite each REDUCE_AXIS that reduces every axis of a long input into two: a reduction over
    chunks into a small buffer, then the reduction of that buffer (same op, same result up to the
    summation order the kernel IR allows)."""
    sink = UOp(Ops.SINK, None, targets)
    memo: dict[UOp, UOp] = {}
    changed = False
    for node in sink.toposort():
        new_src = tuple(memo.get(s, s) for s in node.src)
        out = node if new_src == node.src else node.replace(src=new_src)
        if out.op is Ops.REDUCE_AXIS:
            x = out.src[0]
            op, axes = out.arg
            n = 0 if sint.has_sym(x.shape) else sint.sprod(x.shape)  # symbolic: left in one kernel
            chunk = next((c for c in (1024, 512, 256, 128, 64) if n % c == 0), 0)
            if len(axes) == len(x.shape) and n >= SPLIT_REDUCE_MIN and chunk:
                flat = UOp(Ops.RESHAPE, x.dtype, (x,), (n // chunk, chunk))
                part = UOp(Ops.CONTIGUOUS, x.dtype, (UOp(Ops.REDUCE_AXIS, x.dtype, (flat,), (op, (1,))),))
                full = UOp(Ops.REDUCE_AXIS, out.dtype, (part,), (op, (0,)))
                out = UOp(Ops.RESHAPE, out.dtype, (full,), out.shape) if out.shape != full.shape else full
                changed = True
        memo[node] = out
    return tuple(memo[t] for t in targets) if changed else targets


def build_template(targets: tuple[UOp, ...], n_inputs: int) -> Template:
    targets = split_long_reductions(targets)
    tpl = Template(n_inputs)
    table_of: dict[UOp, int] = {}

    def new_buffer(node: UOp) -> int:
        # a symbolic size stays symbolic here: run_template allocates it for the variables' maxima
        tpl.new_buffers.append((sint.sprod(node.shape), node.dtype, node.device))
        return n_inputs + len(tpl.new_buffers) - 1

    def entry_of(node: UOp) -> int:
        """Table index holding a boundary node's (contiguous) value."""
        node = strip_reshapes(node)
        if node.op is Ops.BUFFER:
            return node.arg.index
        return table_of[node]

    sink = UOp(Ops.SINK, None, targets)
    for node in sink.toposort():
        if node.op is Ops.BUFFER:
            table_of[node] = node.arg.index
    # the entries a kernel may read: table_of without the point being built and the custom kernels
    # (-1); grown one point at a time, since a copy per point made deep graphs quadratic
    ready = dict(table_of)
    prev: UOp | None = None

    for point in find_realize_points(targets):
        if prev is not None and table_of[prev] >= 0:
            ready[prev] = table_of[prev]
        prev = point
        if point.op is Ops.CUSTOM:
            args = tuple(entry_of(s) for s in point.src)
            table_of[point] = -1
            if isinstance(point.arg.arg, KernelInfo):
                tpl.steps.append(Step("kernel", point.src[0].device, args, point.arg))
            continue
        if point.op is Ops.AFTER:
            table_of[point] = entry_of(point.src[0])
            continue
        if point.op is Ops.COPY:
            dst = new_buffer(point)
            table_of[point] = dst
            tpl.steps.append(Step("copy", point.device, (dst, entry_of(point.src[0]))))
            _keep(tpl, point, dst)
            continue
        if point.op is Ops.ASSIGN:
            out_entry = _assign_target_entry(point.src[0])
            table_of[point] = out_entry
        else:
            out_entry = new_buffer(point)
            table_of[point] = out_entry
        if sint.sprod(point.shape) == 0:
            continue
        inputs = ready
        if point.op is Ops.SCATTER:  # the base into the buffer, then the indexed accumulate into it
            for ast, args in _scatter_kernels(point, inputs, out_entry):
                tpl.steps.append(Step("kernel", point.device, args, ast))
            _keep(tpl, point, out_entry)
            continue
        ast, args = _build_kernel(point, inputs, out_entry)
        if point.op is Ops.ASSIGN and _reads_target_elsewhere(ast):
            # the value reads the target at other positions (a.assign(a.flip(0))): compute it into
            # a temporary first, then copy, so no element is overwritten before it is read
            value = point.src[1]
            tmp = new_buffer(value)
            vast, vargs = _build_kernel(value, inputs, tmp)
            tpl.steps.append(Step("kernel", point.device, vargs, vast))
            inputs = {**ready, value: tmp}
            ast, args = _build_kernel(point, inputs, out_entry)
        tpl.steps.append(Step("kernel", point.device, args, ast))
        if point.op is not Ops.ASSIGN:
            _keep(tpl, point, out_entry)

    for t in targets:
        if t.op is Ops.ASSIGN:
            tpl.outputs.append(t.src[0])
        elif is_buffer_view(t):
            tpl.outputs.append(t)
        else:
            e = table_of[t]
            buf = UOp(Ops.BUFFER, t.dtype, (), SlotRef(e, sint.sprod(t.shape), t.device))
            view = len(t.shape) != 1 or sint.has_sym(t.shape)
            tpl.outputs.append(UOp(Ops.RESHAPE, t.dtype, (buf,), t.shape) if view else buf)
    return tpl


def _keep(tpl: Template, point: UOp, entry: int) -> None:
    """Note that table entry `entry` holds point's whole value once the template ran (Template.kept)."""
    shape = point.shape
    tpl.kept[point] = (entry, None if len(shape) == 1 else shape)


def _reads_target_elsewhere(ast: UOp) -> bool:
    """An assign kernel loads its own output (slot 0) at an index other than the one it stores."""
    store = next(n for n in ast.toposort() if n.op is Ops.STORE)
    target = store.src[0]
    for n in ast.toposort():
        if n.op is Ops.INDEX and n is not target and n.src[0].arg[0] == 0 and n.src[1:] != target.src[1:]:
            return True
    return False


def _assign_target_entry(view: UOp) -> int:
    node = view
    while node.op is not Ops.BUFFER:
        node = node.src[0]
    return node.arg.index


class _TableKernelBuilder(KernelBuilder):
    """KernelBuilder whose input slots are numbered in first-use order (output first)."""

    def __init__(self, inputs: dict[UOp, int], out_entry: int):
        super().__init__(inputs)
        self.order: list[int] = [out_entry]

    def local_slot(self, entry: int) -> int:
        if entry not in self.order:
            self.order.append(entry)
        return self.order.index(entry)

    def _steps(self, u: UOp, idx: tuple[UOp, ...], valid: UOp):
        entry = self.inputs.get(u)
        if entry is not None:
            slot = self.local_slot(entry)
            buf = self.define_global(slot, u)
            flat = idx[0] if u.op is Ops.BUFFER else flat_index(idx, u.shape)
            src = (buf, flat) if valid is _TRUE else (buf, flat, valid)
            return UOp(Ops.LOAD, u.dtype, (UOp(Ops.INDEX, u.dtype, src),))
        return (yield from super()._steps(u, idx, valid))


from polygrad.engine.indexing import TRUE as _TRUE  # noqa: E402


def _build_kernel(point: UOp, inputs: dict[UOp, int], out_entry: int) -> tuple[UOp, tuple[int, ...]]:
    return build_with_index_width(lambda: _build_kernel_at_width(point, inputs, out_entry))


def _build_kernel_at_width(point: UOp, inputs: dict[UOp, int], out_entry: int) -> tuple[UOp, tuple[int, ...]]:
    kb = _TableKernelBuilder(inputs, out_entry)
    if point.op is Ops.ASSIGN:
        target, value = point.src
        shape = target.shape
        ranges = [kb.new_range(s, AxisKind.GLOBAL) if s != 1 else None for s in shape]
        idx = tuple(r if r is not None else UOp.const(index_width.dtype, 0) for r in ranges)
        val = kb.value(value, idx, _TRUE)
        buf_node, flat = address(target, idx)
        out = kb.define_global(0, buf_node)
        store = UOp(Ops.STORE, None, (UOp(Ops.INDEX, out.dtype, (out, flat)), val.cast(out.dtype)))
        live = tuple(r for r in ranges if r is not None)
        body = UOp(Ops.END, None, (store,) + live) if live else store
        ast = UOp(Ops.SINK, None, (body,), KernelInfo(name=plain_name("assign_" + "_".join(map(sint.sym_name, shape))),
                                                      opts=("generated",)))
        return ast, tuple(kb.order)
    root = point.src[0] if point.op in (Ops.CONTIGUOUS, Ops.SCATTER) else point
    ast = kb.build(root, 0, point, "kernel")
    ast = ast.replace(arg=KernelInfo(name=_kernel_name(point, ast), opts=("generated",)))
    return ast, tuple(kb.order)


def _scatter_kernels(point: UOp, inputs: dict[UOp, int], out_entry: int) -> list[tuple[UOp, tuple[int, ...]]]:
    """SCATTER's two steps over its buffer: a normal kernel computing the base, then the kernel whose
    accumulating STOREs fold the values in at the computed indices (never searched by BEAM, never
    split into threads or lanes: points may hit one element)."""
    out = [build_with_index_width(lambda: _build_kernel_at_width(point, inputs, out_entry))]
    if sint.sprod(point.src[1].shape) != 0:
        def build() -> tuple[UOp, tuple[int, ...]]:
            kb = _TableKernelBuilder(inputs, out_entry)
            shape = "_".join(map(sint.sym_name, point.src[1].shape))
            name = plain_name(f"scatter_{point.arg[1].name.lower()}_{shape}")
            return kb.build_scatter(point, 0, name), tuple(kb.order)
        out.append(build_with_index_width(build))
    return out


def record_effects(effects: list[UOp]) -> None:
    """Effects that ran: a later graph holding one reads the buffer it left (`becomes`), and values
    kept from before the writes are stale (engine/computed.py)."""
    note_overwrite()
    for node in effects:
        becomes[node] = node.src[0]


def schedule(targets: list[UOp], effects: list[UOp] | None = None,
             var_vals: dict[UOp, int] | None = None) -> tuple[Template, list[Any]]:
    """Normalise, then look the structure up in the cache (building the template on a miss). The
    values of the graph's bound variables go into `var_vals` (pass a dict to run the template)."""
    key, inputs = normalize(targets, effects, var_vals)
    return template_for(key, len(inputs)), inputs


def template_for(key: tuple[UOp, ...], n_inputs: int) -> Template:
    """The cached template of a normalised graph (built on a miss)."""
    tpl = schedule_cache.get(key)
    if tpl is None:
        tpl = schedule_cache[key] = build_template(key, n_inputs)
    if tpl.n_inputs != n_inputs:  # the key must fix the table layout; a mismatch would misplace buffers
        raise PolygradError(f"internal error: a cached schedule expects {tpl.n_inputs} input buffers, the graph "
                            f"has {n_inputs}; please report it (clear_schedule_cache() works around it)")
    return tpl


def clear_schedule_cache() -> None:
    schedule_cache.clear()
    _slot_nodes.clear()
    computed.forget()
