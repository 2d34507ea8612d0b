"""Turn one kernel's tensor graph into kernel IR by computing each node's value at an index.

Stage: scheduling. Input: a realize root (tensor-graph UOp) and the set of nodes realized elsewhere.
Output: a kernel-IR SINK. Movement ops never move data: they become index arithmetic and gates.
GATHER is an indexed load: the index tensor's value at the point replaces one coordinate, gated to
the axis (0 outside it). SCATTER's kernel stores at such a computed coordinate with an accumulating
STORE (arg ADD, MUL or MAX), dropping the points whose index is outside the axis.
"""
from __future__ import annotations

import threading

from polygrad.dtype import dtypes
from polygrad.uop.ops import COMPARISONS, ELEMENTWISE, AxisKind, KernelInfo, Ops, UOp, reduce_identity
from polygrad.uop.sint import canon, is_sym, sadd, smul, sprod, ssub, sym_equal, vmax

TRUE = UOp.const(dtypes.bool, True)


INT32_MAX = 2**31 - 1


class _IndexWidth(threading.local):
    """The index dtype of the kernel being built: int32, unless a size, offset or buffer of the kernel does
    not fit (then `wide_needed` is set and the scheduler builds the kernel again with int64). Per thread:
    two threads scheduling at once each build their own kernel at their own width."""

    def __init__(self) -> None:
        self.dtype = dtypes.int32
        self.wide_needed = False


index_width = _IndexWidth()


def _note_size(v: "int | UOp") -> None:
    if is_sym(v):  # a symbolic size counts at its largest value
        v = vmax(v)
    if not -INT32_MAX - 1 <= v <= INT32_MAX:
        index_width.wide_needed = True


def _c(v: "int | UOp") -> UOp:
    _note_size(v)
    if is_sym(v):
        return _retype(v, index_width.dtype)
    return UOp.const(index_width.dtype, v)


def _retype(v: UOp, dt) -> UOp:
    """A symbolic size (over DEFINE_VARs, which stay int32 kernel parameters) computed in the index dtype."""
    if v.dtype is dt:
        return v
    out: dict[UOp, UOp] = {}
    for n in v.toposort():
        if n.op is Ops.CONST:
            out[n] = UOp.const(dt, n.arg) if n.dtype.is_int else n
        elif n.op is Ops.DEFINE_VAR:
            out[n] = n.cast(dt)
        else:
            src = tuple(out[x] for x in n.src)
            out[n] = n.replace(src=src, dtype=n.dtype if n.op in COMPARISONS else dt)
    return out[v]


def build_with_index_width(build):
    """Run `build()` with int32 indices; again with int64 when any size or offset exceeded int32."""
    index_width.dtype, index_width.wide_needed = dtypes.int32, False
    try:
        out = build()
        if not index_width.wide_needed:
            return out
        index_width.dtype = dtypes.int64
        return build()
    finally:
        index_width.dtype, index_width.wide_needed = dtypes.int32, False


def strides_for(shape: tuple[int, ...]) -> tuple[int, ...]:
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc = smul(acc, s)
    return tuple(reversed(out))


def flat_index(idx: tuple[UOp, ...], shape: tuple[int, ...]) -> UOp:
    _note_size(sprod(shape))  # the flat index reaches the element count
    flat = _c(0)
    for i, st, s in zip(idx, strides_for(shape), shape):
        if s != 1:
            flat = flat + i * _c(st)
    return flat


def checked_index(raw: UOp, n: "int | UOp") -> tuple[UOp, UOp]:
    """(gate, index) for a computed index value `raw` (any integer dtype) that must lie in [0, n): the
    gate is `-1 < v & v < n`, compared in a dtype that holds raw's values, and the index is
    `gate ? v : 0` in the kernel's index dtype, so the arithmetic built on it cannot overflow for any
    loaded value (and uop/validate.py can prove the access in bounds)."""
    it = index_width.dtype
    _note_size(n)
    wide = raw.dtype.itemsize > it.itemsize or (raw.dtype.is_unsigned and raw.dtype.itemsize >= it.itemsize)
    v = raw if wide or raw.dtype is it else raw.cast(it)
    size = _retype(n, v.dtype) if is_sym(n) else UOp.const(v.dtype, n)
    gate = v < size
    if not v.dtype.is_unsigned:
        gate = (UOp.const(v.dtype, -1) < v) & gate
    safe = gate.where(v, UOp.const(v.dtype, 0))
    return gate, safe if safe.dtype is it else safe.cast(it)


def _and(a: UOp, b: UOp) -> UOp:
    if a is TRUE:
        return b
    if b is TRUE:
        return a
    return a & b


class KernelBuilder:
    """Builds the kernel IR for one realize root. `slots` maps Buffers/slot refs to DEFINE_GLOBALs."""

    def __init__(self, inputs: dict[UOp, int]):
        self.inputs = inputs  # realized nodes (BUFFER or other kernels' roots) -> slot
        self.globals: dict[int, UOp] = {}
        self.memo: dict[tuple, UOp] = {}
        self.next_axis = 0

    def new_range(self, size: int, kind: str) -> UOp:
        r = UOp(Ops.RANGE, index_width.dtype, (_c(size),), (self.next_axis, kind))
        self.next_axis += 1
        return r

    def define_global(self, slot: int, node: UOp) -> UOp:
        if slot not in self.globals:
            size = sprod(node.shape) if node.op is not Ops.BUFFER else node.arg.size
            _note_size(size)  # flat offsets into it may not fit int32
            self.globals[slot] = UOp(Ops.DEFINE_GLOBAL, node.dtype, (), (slot, (size,)))
        return self.globals[slot]

    def value(self, u: UOp, idx: tuple[UOp, ...], valid: UOp) -> UOp:
        """The kernel-IR value of tensor node u at index idx. Iterative: each node's rule (`_steps`) is a
        generator that yields the (node, idx, valid) requests it needs and receives their values, and this
        loop runs them off an explicit stack, so graph depth is not limited by Python's recursion limit."""
        key = (u, idx, valid)
        hit = self.memo.get(key)
        if hit is not None:
            return hit
        memo = self.memo
        stack = [(key, self._steps(u, idx, valid))]
        result = None
        while stack:
            k, gen = stack[-1]
            try:
                req = gen.send(result)
            except StopIteration as stop:
                stack.pop()
                result = memo[k] = stop.value
                continue
            hit = memo.get(req)
            if hit is not None:
                result = hit
                continue
            stack.append((req, self._steps(*req)))
            result = None
        return result

    def _steps(self, u: UOp, idx: tuple[UOp, ...], valid: UOp):
        slot = self.inputs.get(u)
        if slot is not None:
            buf = self.define_global(slot, u)
            flat = idx[0] if u.op is Ops.BUFFER else flat_index(idx, u.shape)
            src = (buf, flat) if valid is TRUE else (buf, flat, valid)
            return UOp(Ops.LOAD, u.dtype, (UOp(Ops.INDEX, u.dtype, src),))
        op = u.op
        if op is Ops.CONST:
            return UOp.const(u.dtype, u.arg)
        if op is Ops.IOTA:
            return idx[0] if idx[0].dtype is u.dtype else idx[0].cast(u.dtype)
        if op in ELEMENTWISE:
            return UOp(op, u.dtype, (yield from self._all(u.src, idx, valid)), u.arg)
        if op in (Ops.DETACH, Ops.CONTIGUOUS, Ops.AFTER):
            return (yield (u.src[0], idx, valid))
        if op is Ops.BIND:
            return u.src[0]
        if op is Ops.DEFINE_VAR:  # a symbolic size used as a value (x.mean() over a symbolic axis)
            return u
        src = u.src[0] if u.src else None
        if op is Ops.RESHAPE:
            return (yield (src, reshape_index(idx, u.shape, src.shape), valid))
        if op is Ops.PERMUTE:
            new = [_c(0)] * len(idx)
            for i, p in enumerate(u.arg):
                new[p] = idx[i]
            return (yield (src, tuple(new), valid))
        if op is Ops.EXPAND:
            return (yield (src, tuple(_c(0) if s == 1 else i for i, s in zip(idx, src.shape)), valid))
        if op is Ops.SHRINK:
            return (yield (src, tuple(i + _c(b) if b else i for i, (b, _) in zip(idx, u.arg)), valid))
        if op is Ops.FLIP:
            return (yield (src, tuple(_c(ssub(s, 1)) - i if f else i for i, f, s in zip(idx, u.arg, src.shape)),
                           valid))
        if op is Ops.PAD:
            cond, new = TRUE, []
            for i, (b, a), s in zip(idx, u.arg, src.shape):
                if b or a:
                    if b:
                        cond = _and(cond, _c(ssub(b, 1)) < i)
                    if a:
                        cond = _and(cond, i < _c(sadd(b, s)))
                new.append(i - _c(b) if b else i)
            inner = yield (src, tuple(new), _and(valid, cond))
            return cond.where(inner, UOp.const(u.dtype, 0)) if cond is not TRUE else inner
        if op is Ops.GATHER:  # an indexed load: the index's value at this point picks the coordinate
            axis = u.arg
            gate, iv = checked_index((yield (u.src[1], idx, valid)), src.shape[axis])
            at = tuple(iv if k == axis else (_c(0) if s == 1 else i) for k, (i, s) in enumerate(zip(idx, src.shape)))
            inner = yield (src, at, _and(valid, gate))
            return gate.where(inner, UOp.const(u.dtype, 0))
        if op is Ops.REDUCE_AXIS:
            rop, axes = u.arg
            if any(src.shape[ax] == 0 for ax in axes):  # nothing to fold: no loop of 0 points (bundles refuse them)
                return UOp.const(u.dtype, reduce_identity(rop, u.dtype))
            new, ranges = list(idx), []
            for ax in axes:
                if src.shape[ax] != 1:
                    r = self.new_range(src.shape[ax], AxisKind.REDUCE)
                    ranges.append(r)
                new[ax] = ranges[-1] if src.shape[ax] != 1 else _c(0)
            body = yield (src, tuple(new), valid)
            if not ranges:
                return body
            return UOp(Ops.REDUCE, u.dtype, (body, *ranges), rop)
        raise NotImplementedError(f"cannot lower {op.name} inside a kernel")

    @staticmethod
    def _all(srcs, idx, valid):
        out = []
        for s in srcs:
            out.append((yield (s, idx, valid)))
        return tuple(out)

    def build(self, root: UOp, out_slot: int, out_node: UOp, name: str) -> UOp:
        shape = root.shape
        ranges = [self.new_range(s, AxisKind.GLOBAL) if s != 1 else None for s in shape]
        idx = tuple(r if r is not None else _c(0) for r in ranges)
        value = self.value(root, idx, TRUE)
        out = self.define_global(out_slot, out_node)
        store = UOp(Ops.STORE, None, (UOp(Ops.INDEX, out.dtype, (out, flat_index(idx, shape))), value.cast(out.dtype)))
        live = tuple(r for r in ranges if r is not None)
        body = UOp(Ops.END, None, (store,) + live) if live else store
        return UOp(Ops.SINK, None, (body,), KernelInfo(name=name))


    def build_scatter(self, point: UOp, out_slot: int, name: str) -> UOp:
        """The accumulate kernel of SCATTER(base, index, value): one point per index element, each
        folding its value into the output (already holding base) at the coordinate the index gives,
        with an accumulating STORE; out-of-range indices store nothing. Where the output has size 1
        and the index does not, those points fold into the one element (flat_index skips the axis)."""
        _, index, value = point.src
        axis, rop = point.arg
        ranges = [self.new_range(s, AxisKind.GLOBAL) if s != 1 else None for s in index.shape]
        idx = tuple(r if r is not None else _c(0) for r in ranges)
        gate, iv = checked_index(self.value(index, idx, TRUE), point.shape[axis])
        val = self.value(value, idx, TRUE)
        out = self.define_global(out_slot, point)
        dest = flat_index(idx[:axis] + (iv,) + idx[axis + 1:], point.shape)
        store = UOp(Ops.STORE, None, (UOp(Ops.INDEX, out.dtype, (out, dest, gate)), val.cast(out.dtype)), rop)
        live = tuple(r for r in ranges if r is not None)
        body = UOp(Ops.END, None, (store,) + live) if live else store
        return UOp(Ops.SINK, None, (body,), KernelInfo(name=name))


def reshape_index(idx: tuple[UOp, ...], new_shape: tuple[int, ...], old_shape: tuple[int, ...]) -> tuple[UOp, ...]:
    """Index into old_shape for an index into new_shape (same element count, row-major)."""
    # fast path: only size-1 dims added or removed
    if [s for s in new_shape if s != 1] == [s for s in old_shape if s != 1]:
        it = iter(i for i, s in zip(idx, new_shape) if s != 1)
        return tuple(next(it) if s != 1 else _c(0) for s in old_shape)
    out: list[UOp] = []
    cuts = _reshape_cuts(new_shape, old_shape)
    for (i0, j0), (i1, j1) in zip(cuts, cuts[1:]):
        out += _regroup(idx[i0:i1], new_shape[i0:i1], old_shape[j0:j1])
    return tuple(out)


def _reshape_cuts(new_shape: tuple, old_shape: tuple) -> list[tuple[int, int]]:
    """The points (i, j) where new_shape[:i] and old_shape[:j] hold the same number of elements, the
    ends included: each group of dims between two cuts is reshaped alone, so an index is divided only
    by its own group's sizes (constants where those are, when a symbolic axis lies elsewhere: heads
    regrouped beside a Variable sequence length, h // g instead of divisions by multiples of it)."""
    def prefixes(shape: tuple) -> list:
        out = [1]
        for s in shape:
            out.append(canon(smul(out[-1], s)))
        return out
    pn, po = prefixes(new_shape), prefixes(old_shape)
    cuts = [(0, 0)]
    for i in range(1, len(new_shape)):
        j = next((j for j in range(cuts[-1][1] + 1, len(old_shape)) if _same_size(pn[i], po[j])), None)
        if j is not None:
            cuts.append((i, j))
    return cuts + [(len(new_shape), len(old_shape))]


def _same_size(a: "int | UOp", b: "int | UOp") -> bool:
    """Equal for every value of the Variables (not merely under their present bindings)."""
    return a == b if not is_sym(a) and not is_sym(b) else a is b


def _regroup(idx: tuple[UOp, ...], new_shape: tuple, old_shape: tuple) -> list[UOp]:
    """Index into old_shape for an index into new_shape, through the flat index of the group."""
    flat = flat_index(idx, new_shape)
    out = []
    total = sprod(old_shape)
    for st, s in zip(strides_for(old_shape), old_shape):
        if s == 1:
            out.append(_c(0))
            continue
        e = flat // _c(st) if st != 1 else flat
        out.append(e if sym_equal(smul(st, s), total) else e % _c(s))
    return out


def address(u: UOp, idx: tuple[UOp, ...]) -> tuple[UOp, UOp]:
    """(BUFFER node, flat index) that a view of a buffer reads at `idx`; for assigning into views."""
    while u.op is not Ops.BUFFER:
        src = u.src[0]
        if u.op is Ops.RESHAPE:
            idx = reshape_index(idx, u.shape, src.shape)
        elif u.op is Ops.PERMUTE:
            new = [_c(0)] * len(idx)
            for i, p in enumerate(u.arg):
                new[p] = idx[i]
            idx = tuple(new)
        elif u.op is Ops.SHRINK:
            idx = tuple(i + _c(b) if b else i for i, (b, _) in zip(idx, u.arg))
        elif u.op is Ops.FLIP:
            idx = tuple(_c(ssub(s, 1)) - i if f else i for i, f, s in zip(idx, u.arg, src.shape))
        elif u.op in (Ops.DETACH, Ops.CONTIGUOUS):
            pass
        else:
            raise ValueError(f"cannot assign through {u.op.name}; assign into a realized tensor or a slice of one")
        u = src
    return u, idx[0]
