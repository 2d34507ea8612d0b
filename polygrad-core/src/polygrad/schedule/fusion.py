"""Decide the kernel boundaries: `find_realize_points(targets)` -> the nodes that get a kernel and a buffer.

Stage: scheduling (the fusion policy). Input: a normalised tensor graph. Output: its realize points in
the order their kernels run. Elementwise chains fuse into each other and into the inputs and outputs of
reductions; a reduction gets its own buffer when it is read inside another reduction or by several
kernels, and an expression read through an expand (each value read many times) or a pad gets one when
fusing it would recompute a reduction or real work per read (see RECOMPUTE_MIN_COST), unless it only
decompresses (dequantizes) the data it reads (see DECOMPRESS_RATIO). Contractions (matmuls, convolutions)
side by side get a kernel each (SIBLING_CONTRACTIONS). A step that reads
a buffer's old value runs before the assign or custom kernel that overwrites it (`order_points`).
"""
from __future__ import annotations

import heapq

from polygrad.dtype import dtypes
from polygrad.errors import PolygradError
from polygrad.uop import sint
from polygrad.uop.movement import strip_reshapes
from polygrad.uop.ops import ELEMENTWISE, MOVEMENT, Ops, UOp

BOUNDARY_OPS = {Ops.BUFFER, Ops.COPY, Ops.CONTIGUOUS, Ops.ASSIGN, Ops.CUSTOM, Ops.AFTER, Ops.SCATTER}


def is_buffer_view(u: UOp) -> bool:
    """A whole contiguous buffer, possibly reshaped."""
    return strip_reshapes(u).op is Ops.BUFFER


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
# Except a decompression: an expression whose value takes more than DECOMPRESS_RATIO times the bytes of the
# buffers it reads, at DECOMPRESS_MAX_COST operations per value or less, always fuses. Dequantizing a 4- or
# 8-bit weight (0.56 or 1.06 bytes read per float32 value) read through a matmul's expand is one: its
# buffer would multiply the memory the weight takes and the bytes every reader loads, which is what storing
# it compressed is for. The block formats cost 9 (Q8_0) to 56 (Q5_K, whose 6-bit sub-block scales and
# mins are unpacked per value) operations; a costlier expression (random bits from a small key, 117) still
# gets its buffer.
DECOMPRESS_RATIO = 2
DECOMPRESS_MAX_COST = 64
# how far the cost walk looks below an expand before it calls the expression expensive
_COST_WALK_LIMIT = 256
_VIEW_OPS = MOVEMENT | {Ops.DETACH}
# a reduction doing this many operations per element it reads is a contraction (see _is_contraction)
CONTRACTION_REUSE = 4
# an int32 sum over this many values or fewer per output is a block sum (_is_contraction)
BLOCK_SUM_VALUES = 32
# SIBLING_CONTRACTIONS: an expression over two or more contractions that are not nested in each other
# (SwiGLU's `silu(x @ gate) * (x @ up)`, an RNN cell's `x @ Wx + h @ Wh`) gets one kernel per contraction:
# the first one found fuses with the expression, the others get buffers. One kernel computing both would
# share its output ranges between two reductions, which the register tiles and staging (codegen/host_opts.py)
# plan for one: on a Qwen2-shaped prompt such a kernel ran 15-20x slower than the two matmuls alone.


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


def _expression_cost(below: UOp, points: set[UOp]) -> tuple[int, int] | None:
    """(operations one evaluation of `below` costs down to the kernel's boundaries, bytes of the boundary
    buffers it reads, each counted whole); None when it holds a reduction (or is too large to look through)."""
    cost, read, stack, seen = 0, 0, [below], {below}
    while stack:
        node = stack.pop()
        if node.op is Ops.REDUCE_AXIS or len(seen) > _COST_WALK_LIMIT:
            return None
        cost += _op_cost(node)
        for s in node.src:
            if s in seen:
                continue
            seen.add(s)
            if s in points or s.op in BOUNDARY_OPS:
                read += _numel(s) * s.dtype.itemsize if s.dtype is not None and s.shape is not None else 0
            else:
                stack.append(s)
    return cost, read


def _decompresses(below: UOp, cost: int, read: int) -> bool:
    """Whether `below` only widens the data it reads (see DECOMPRESS_RATIO)."""
    written = _numel(below) * below.dtype.itemsize
    return 0 < read and DECOMPRESS_RATIO * read < written and cost <= DECOMPRESS_MAX_COST


def _needs_buffer(view: UOp, points: set[UOp]) -> UOp | None:
    """The expression below an EXPAND or PAD that must get its own buffer, if any. Through an expand
    every value is read many times (see RECOMPUTE_MIN_COST); through a pad a reduction would also run
    at the padded points, where kernels gate loads but not loops."""
    below = _under_views(view.src[0])
    if below in points or below.op in BOUNDARY_OPS or below.dtype is None or below.device is None:
        return None
    if below.op not in ELEMENTWISE and below.op is not Ops.REDUCE_AXIS:
        return None
    walked = _expression_cost(below, points)
    if walked is None:
        return below
    if view.op is Ops.PAD:
        return None
    cost, read = walked
    n = _numel(below)
    if n <= 1 or cost < RECOMPUTE_MIN_COST or _decompresses(below, cost, read):
        return None
    return below if cost * (_numel(view) - n) >= RECOMPUTE_MIN_OPS else None


def _numel(u: UOp) -> int:
    return sint.vmax(sint.sprod(u.shape))


def _is_contraction(reduce: UOp, points: set[UOp]) -> bool:
    """A reduction that reads its data many times over (a matmul, a convolution: an expanded product doing
    CONTRACTION_REUSE or more times as many operations as the elements it reads). Nested in another reduction
    (`(a @ b).sum()`) it would lose its output axes (no threads, no tiling) and run as one serial loop nest:
    it gets its own kernel. A nested sum that reads each element once (a blocked sum's partials, `(m * w)`
    summed) stays fused, and so does an exact integer sum over at most BLOCK_SUM_VALUES values per output
    (the int8 route's 32-value block sums, nn/quant.py: the outer sum over blocks keeps the output axes)."""
    work = _numel(reduce.src[0])
    if reduce.dtype == dtypes.int32 and work <= BLOCK_SUM_VALUES * _numel(reduce):
        return False
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
    reductions inside another reduction, contractions beside the first one found (SIBLING_CONTRACTIONS),
    expressions an expand or pad should not fuse (_needs_buffer), reductions reached)."""
    visited: set[UOp] = set()
    must: dict[UOp, UOp | None] = {}  # node -> the expand/pad that asked for it (None: a nested reduction)
    reached: set[UOp] = set()
    if root.op in (Ops.CUSTOM, Ops.AFTER, Ops.COPY):
        return visited, must, reached
    start = root.src[1] if root.op is Ops.ASSIGN else (root.src[0] if root.op is Ops.CONTIGUOUS else root)
    if start is not root and start in points:
        # the value is another point's (a captured output's contiguous() over a contiguous matvec): this
        # kernel copies that buffer, and what is below it is that point's walk, not this one's
        return {start}, must, reached
    # a reshape of the kernel's own reduction (a full sum's scalar) does not make that reduction "another"
    # one: the kernel is that reduction (it may hold one nested reduction, as any reducing kernel)
    while start.op is Ops.RESHAPE and start.src[0] not in points and start.src[0].op not in BOUNDARY_OPS:
        start = start.src[0]
    stack = [(start, False, False)]
    seen: set[tuple[UOp, bool, bool]] = set()
    siblings: list[UOp] = []  # contractions this kernel computes side by side, in the order found
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
            if node is not start and not in_reduce and _is_contraction(node, points):
                siblings.append(node)
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
    for node in siblings[1:]:  # see SIBLING_CONTRACTIONS
        must[node] = None
    return visited, must, reached
