"""Normalise a tensor graph into the schedule cache's key: `normalize(targets) -> (key, input buffers)`.

Stage: scheduling (first step). Input: tensor-graph UOps to realize. Output: the same graph with every
realized buffer replaced by a numbered `SlotRef` (and the buffers, in slot order), bound variables by
their bare DEFINE_VARs (their values into `var_vals`), effects that already ran by the buffers they left
(`becomes`). A graph with the same structure and new data gives the same key, so it hits the schedule
cache (schedule/template.py) and never reaches the Python compiler again; a graph over `batch` serves
every value of it. `denormalize` turns a cached template's output views back into real buffers.
"""
from __future__ import annotations

import weakref
from typing import Any, NamedTuple

from polygrad.device import Buffer, note_overwrite
from polygrad.errors import VariableError
from polygrad.uop import sint
from polygrad.uop.movement import strip_reshapes
from polygrad.uop.ops import SELF_KEYED_ARGS, Ops, UOp

# effectful nodes that already ran (ASSIGN, AFTER) -> the buffer view they left behind, so a graph that
# still holds one never runs it twice. Pure values a realize computed are kept apart, in
# schedule/computed.py, only until a buffer is written (normalize's `reuse`).
becomes: "weakref.WeakKeyDictionary[UOp, UOp]" = weakref.WeakKeyDictionary()
EFFECT_OPS = (Ops.ASSIGN, Ops.AFTER)
UNIQUE_OPS = (Ops.ASSIGN, Ops.AFTER)
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


def normalize(targets: list[UOp], effects: list[UOp] | None = None,
              var_vals: dict[UOp, int] | None = None, reuse: dict[weakref.ref, UOp] | None = None,
              walked: dict[UOp, UOp] | None = None) -> tuple[tuple[UOp, ...], list[Any]]:
    """Replace realized subgraphs by their buffers and buffers by numbered SlotRefs; the effects
    (ASSIGN/AFTER) that have not run yet are appended to `effects` when given. BINDs become their
    variables, whose values go into `var_vals` (VariableError for a variable with no value).
    `reuse` holds values computed before (schedule/computed.py): a node found there is read from its
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
_BUFFER, _RESHAPE = Ops.BUFFER, Ops.RESHAPE
_INT_TYPES = frozenset((int,))


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


def leaf_signature(target: UOp, reuse: dict[weakref.ref, UOp] | None) -> tuple[tuple, list[Any]] | None:
    """The schedule key of an eager op, computed without normalize's walk: for a target that is one pure
    node (arg None) whose sources are realized buffers or int-shaped reshapes of them, a tuple that
    determines normalize()'s key (op, dtype, and per source its dtypes, buffer size and device, shape and
    slot), and the input buffers in normalize()'s slot order; None for any other graph. Holds no Buffer,
    so a cache keyed by it pins no memory (schedule/template.py `leaf_cache`)."""
    if target.arg is not None or target.op not in _PLAIN_NORMALIZE or not target.src:
        return None  # (a node without sources has no buffer below: computed.remember keeps nothing of it)
    srcs = target.src
    if len(srcs) == 2:  # the common eager op, x + y over two whole buffers: a flat tuple, no loop
        x, y = srcs
        if x.op is _BUFFER and y.op is _BUFFER:
            bx, by = x.arg, y.arg
            if type(bx) is Buffer and type(by) is Buffer:
                if bx is by:  # one slot; 7 entries, while the general form below holds tuples from [2] on
                    return (target.op, target.dtype, x.dtype, bx.size, bx.device, y.dtype, 0), [bx]
                return (target.op, target.dtype, x.dtype, bx.size, bx.device, y.dtype, by.size, by.device), [bx, by]
    sig: list[Any] = [target.op, target.dtype]
    inputs: list[Any] = []
    for src in target.src:
        node = src
        if src.op is not _BUFFER:
            node = src.src[0] if src.op is _RESHAPE else src
            if node.op is not _BUFFER or not _INT_TYPES.issuperset(map(type, src.arg)):
                return None  # another op below, or a symbolic shape (normalize's second walk)
            if reuse is not None and weakref.ref(src) in reuse:  # normalize would read its kept value
                return None
        buf = node.arg
        if type(buf) is not Buffer:
            return None
        if buf in inputs:  # slots by first appearance, as normalize numbers them (Buffers compare by identity)
            slot = inputs.index(buf)
        else:
            slot = len(inputs)
            inputs.append(buf)
        if node is src:
            sig.append((node.dtype, buf.size, buf.device, slot))
        else:
            sig.append((node.dtype, buf.size, buf.device, slot, src.dtype, src.arg))
    return tuple(sig), inputs


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


def record_effects(effects: list[UOp]) -> None:
    """Effects that ran: a later graph holding one reads the buffer it left (`becomes`), and values
    kept from before the writes are stale (schedule/computed.py)."""
    note_overwrite()
    for node in effects:
        becomes[node] = node.src[0]


def clear_slot_nodes() -> None:
    """Forget the held slot BUFFER nodes (clear_schedule_cache)."""
    _slot_nodes.clear()
