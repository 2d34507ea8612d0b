"""Group a tensor graph into kernels: `schedule(targets) -> (Template, input buffers)`, cached by structure.

Stage: scheduling. Input: tensor-graph UOps to realize. Output: a `Template`, a list of steps (kernel IR
ASTs, copies) over a buffer table (inputs, then new buffers). The steps of the stage, in order:
  normalize            (schedule/normalize.py)  buffers -> numbered slots; the result is the cache key
  find_realize_points  (schedule/fusion.py)     which nodes get their own kernel and buffer, in run order
  build_template       (here, with schedule/indexing.py)  one kernel-IR SINK per realize point
A graph with the same structure and new data hits `schedule_cache` and never reaches this module's
builder again.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any, Callable

from polygrad.dtype import DType
from polygrad.errors import PolygradError
from polygrad.schedule import computed
from polygrad.schedule.fusion import find_realize_points, is_buffer_view
from polygrad.schedule.indexing import KernelBuilder, address, build_with_index_width, flat_index, index_width
from polygrad.schedule.indexing import TRUE as _TRUE
from polygrad.schedule.normalize import SlotRef, clear_slot_nodes, normalize
from polygrad.uop import sint
from polygrad.uop.movement import strip_reshapes
from polygrad.uop.names import plain_name
from polygrad.uop.ops import AxisKind, KernelInfo, Ops, UOp


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
    # schedule/computed.py keeps those values for later realizes
    kept: dict[UOp, tuple[int, tuple | None]] = field(default_factory=dict)
    prepared: bool = False  # its programs were compiled together once (run_template; a hint only)
    unwritten: tuple[bool, ...] | None = None  # per new buffer: not provably written before read (run_template)


schedule_cache: dict[tuple[UOp, ...], Template] = {}


@dataclass(frozen=True)
class LeafTemplate:
    """A cached template of an eager op (normalize.leaf_signature) that is one kernel writing every
    element of its one new buffer, the output, with what realize needs ready (engine/realize.realize_eager)."""

    template: Template
    kernel: Step  # the template's one step
    out_shape: tuple[int, ...] | None  # the output's view shape; None: the flat buffer itself
    keep: bool  # the target's value is kept (computed.remember: Template.kept holds the output for it)
    # the kernel's buffers in its slot order, picked from the buffer table (inputs, then the output) in one
    # C call: (table[i] for i in kernel.args), without a bound method and a map per launch
    pick: Callable[[list[Any]], tuple[Any, ...]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        args = self.kernel.args  # (itemgetter of one index returns the item itself, not a 1-tuple)
        object.__setattr__(self, "pick", itemgetter(*args) if len(args) > 1 else lambda table: (table[args[0]],))


# leaf_signature -> LeafTemplate: an eager op whose structure was seen skips normalize's walk. Its keys
# hold no Buffer; cleared with the schedule cache, and when it reaches LEAF_CACHE_MAX entries.
leaf_cache: dict[tuple, LeafTemplate] = {}
LEAF_CACHE_MAX = 1 << 12


def remember_leaf(signature: tuple, tpl: Template, key: tuple[UOp, ...], normalized: list[UOp]) -> None:
    """Cache `tpl` (the template of `key`, whose graph's nodes normalised to `normalized`) under an eager
    op's leaf_signature, when the short path serves it (leaf_template)."""
    entry = leaf_template(tpl, key, normalized)
    if entry is not None:
        if len(leaf_cache) >= LEAF_CACHE_MAX:
            leaf_cache.clear()
        leaf_cache[signature] = entry


def leaf_template(tpl: Template, key: tuple[UOp, ...], normalized: list[UOp]) -> LeafTemplate | None:
    """The LeafTemplate of `tpl` (cached under `key`, the graph's `normalized` nodes), or None where the
    short path would differ from run_template and computed.remember: anything but one kernel that writes
    every element of the one new buffer (run_template's unwritten check, already run), a symbolic size, an
    output that is not a plain view of that buffer, a kept value other than the target's output."""
    if len(tpl.steps) != 1 or tpl.steps[0].kind != "kernel" or len(tpl.outputs) != 1:
        return None
    if len(tpl.new_buffers) != 1 or type(tpl.new_buffers[0][0]) is not int or tpl.unwritten != (False,):
        return None
    out, shape = tpl.outputs[0], None
    if out.op is Ops.RESHAPE and all(type(d) is int for d in out.arg):
        out, shape = out.src[0], out.arg
    if out.op is not Ops.BUFFER or type(out.arg) is not SlotRef or out.arg.index != tpl.n_inputs:
        return None
    if any(n in tpl.kept for n in normalized if n is not key[0]):
        return None
    kept = tpl.kept.get(key[0])
    if kept is not None and kept != (tpl.n_inputs, shape):
        return None
    return LeafTemplate(tpl, tpl.steps[0], shape, kept is not None)


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
    leaf_cache.clear()
    clear_slot_nodes()
    computed.forget()
