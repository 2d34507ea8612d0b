"""Evaluate kernel IR with NumPy. Every RANGE is an array axis; values broadcast over the axes of
the ranges they depend on; REDUCE sums (or maxes) over its ranges' axes; STORE scatters.

Big kernels are evaluated in chunks of their outermost range so temporaries stay bounded. Symbolic
sizes: a DEFINE_VAR evaluates to its launch value (var_vals, in spec.vars order), and a range whose end
is an expression over variables gets that many elements on its axis.

Why this does not walk the linearized program (renderer/linearize.py) that compiled targets emit, and
why it computes the same thing: the linear program is one schedule of the kernel's points, and the
kernel IR (docs/kernel-ir.md) fixes the results independently of any schedule.
- A block's points are independent (the IR forbids reading what another point of the same block
  writes), so running all points of an END at once, as array lanes, equals running its LOOPs.
- A LOOP of any kind (global, thread, upcast, unroll) is one axis; a THREAD share or an UPCAST lane is
  a sub-range of points, and the union of the shares is the range, so the kind changes nothing here.
- An accumulator (ACC, UPDATE inside the REDUCE's loops, ACC_READ after them) is the REDUCE's fold
  over its ranges' axes; an ACC of several lanes is the same fold kept per value of the upcast axes it
  depends on (keepdims). Only the summation order can differ, which the IR allows for reductions. A
  contracted sum (REDUCE FMA, lowered for a device with FMA) is folded point by point in the loop
  order with a correctly rounded fma, so it matches a compiled scalar loop bit for bit.
- A gated LOAD is a select that never reads the masked addresses; a gated STORE (IF ... ENDIF) is a
  masked scatter. Blocks run in order, as their loop nests do in the linear program.
- An accumulating STORE (arg ADD/MUL/MAX; the linear program's LOAD, op, STORE one point at a time)
  folds every point's value into its element, repeated elements in rounds (`_accumulate`).
- Elementwise ops follow the IR's per-op rules (rounding of half types after each op, truncating
  division, NaN-propagating MAX), the same rules the C renderer implements instruction by instruction.
"""
from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np

from polygrad.backend_api import DType, Ops, ProgramSpec, UOp, dtypes

CHUNK_ELEMENTS = 1 << 22


def describe(spec: ProgramSpec) -> str:
    """The 'source' of an INTERP kernel: its kernel IR, as text."""
    return f"// INTERP kernel {spec.name}\n{spec.ast!r}\n"


HALF_TYPES = (dtypes.float16, dtypes.bfloat16)


def _np_dtype(dt: DType) -> Any:
    if dt in HALF_TYPES:
        return np.float32  # computed in float32, stored as 16-bit patterns (like the C renderer)
    return dt.np


def _round_half(x: Any, dt: DType) -> Any:
    """Round float32 values to float16/bfloat16 precision (nearest even), kept as float32."""
    if dt is dtypes.float16:
        return np.asarray(x, dtype=np.float32).astype(np.float16).astype(np.float32)
    if dt is dtypes.bfloat16:
        return _load_cast(_store_cast(np.asarray(x, dtype=np.float32), dt), ..., dt)
    return x


def _trunc_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        b_safe = np.where(b == 0, 1, b)
        # floor division, then one step toward zero where the signs differ and a remainder is left
        # (no abs(): abs(INT_MIN) overflows)
        q = np.floor_divide(a, b_safe)
        fix = (np.remainder(a, b_safe) != 0) & ((a < 0) != (b_safe < 0))
        return (q + fix).astype(np.result_type(a, b))


def _maximum(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.maximum(a, b)  # propagates NaN like the C renderer


BINARY = {
    Ops.ADD: np.add, Ops.MUL: np.multiply, Ops.MAX: _maximum, Ops.CMPLT: np.less, Ops.CMPNE: np.not_equal,
    Ops.CMPEQ: np.equal, Ops.AND: np.bitwise_and, Ops.OR: np.bitwise_or, Ops.XOR: np.bitwise_xor,
    Ops.SHL: np.left_shift, Ops.SHR: np.right_shift, Ops.POW: np.power,
}
UNARY = {Ops.EXP2: np.exp2, Ops.LOG2: np.log2, Ops.SIN: np.sin, Ops.SQRT: np.sqrt, Ops.TRUNC: np.trunc}


class InterpProgram:
    def __init__(self, spec: ProgramSpec):
        self.spec = spec
        self.ranges = sorted({n for n in spec.ast.toposort() if n.op is Ops.RANGE}, key=lambda r: r.arg[0])
        self.axis = {r: i for i, r in enumerate(self.ranges)}
        self.slot_dtype = {g.slot: g.dtype for g in spec.globals}
        self.var_vals: tuple[int, ...] = ()
        self.sizes: dict[UOp, int] = {}

    def size(self, r: UOp) -> int:
        """A range's trip count at this launch's variable values."""
        hit = self.sizes.get(r)
        if hit is None:
            hit = self.sizes[r] = self.spec.eval_int(r.src[0], self.var_vals)
        return hit

    def __call__(self, buffers: list[Any], var_vals: tuple[int, ...] = (), timing: bool = False) -> None:
        self.var_vals, self.sizes = tuple(var_vals), {}
        views = {}
        for g, buf in zip(self.spec.globals, buffers):
            n = self.spec.eval_int(g.size, self.var_vals)
            views[g.slot] = buf.arr[: n * g.dtype.itemsize].view(g.dtype.np)
        with np.errstate(all="ignore"):
            for block in self.spec.ast.src:
                self.run_block(block, views)
        return None

    def run_block(self, block: UOp, views: dict[int, np.ndarray]) -> None:
        store = block.src[0] if block.op is Ops.END else block
        ranges = list(block.src[1:]) if block.op is Ops.END else []
        first = ranges[0] if ranges else None
        total = math.prod(self.size(r) for r in self.ranges) if self.ranges else 1
        if first is not None and total > CHUNK_ELEMENTS:
            n = self.size(first)
            per = max(1, CHUNK_ELEMENTS * n // total)
            for lo in range(0, n, per):
                self.run_store(store, ranges, views, {first: (lo, min(n, lo + per))})
        else:
            self.run_store(store, ranges, views, {})

    def range_value(self, r: UOp, window: dict[UOp, tuple[int, int]]) -> np.ndarray:
        lo, hi = window.get(r, (0, self.size(r)))
        shape = [1] * len(self.ranges)
        shape[self.axis[r]] = hi - lo
        return np.arange(lo, hi, dtype=np.int64).reshape(shape)

    def run_store(self, store: UOp, ranges: list[UOp], views: dict[int, np.ndarray],
                  window: dict[UOp, tuple[int, int]]) -> None:
        memo: dict[UOp, np.ndarray] = {}
        index, value = store.src
        buf = views[index.src[0].arg[0]]
        idx = self.eval(index.src[1], views, window, memo)
        val = self.eval(value, views, window, memo)
        full = [1] * len(self.ranges)
        for r in ranges:
            lo, hi = window.get(r, (0, self.size(r)))
            full[self.axis[r]] = hi - lo
        idx_b = np.broadcast_to(np.asarray(idx), full).reshape(-1)
        val_b = np.broadcast_to(np.asarray(val), full).reshape(-1)
        if len(index.src) > 2:
            gate = np.broadcast_to(np.asarray(self.eval(index.src[2], views, window, memo)), full).reshape(-1)
            idx_b, val_b = idx_b[gate], val_b[gate]
        dt = self.slot_dtype[index.src[0].arg[0]]
        if store.arg is not None:
            _accumulate(buf, idx_b, val_b, store.arg, dt)
            return
        buf[idx_b] = _store_cast(val_b, dt)

    def eval(self, u: UOp, views: dict[int, np.ndarray], window: dict, memo: dict[UOp, np.ndarray]) -> np.ndarray:
        hit = memo.get(u)
        if hit is not None:
            return hit
        for node in u.toposort():
            if node in memo:
                continue
            memo[node] = self.eval_node(node, views, window, memo)
        return memo[u]

    def eval_node(self, u: UOp, views: dict, window: dict, memo: dict) -> Any:
        op = u.op
        if op is Ops.CONST:
            return _round_half(np.array(u.arg, dtype=_np_dtype(u.dtype)), u.dtype)
        if op is Ops.RANGE:
            return self.range_value(u, window)
        if op is Ops.DEFINE_VAR:
            return np.array(self.var_vals[self.spec.vars.index(u)], dtype=_np_dtype(u.dtype))
        if op in (Ops.DEFINE_GLOBAL, Ops.INDEX):
            return np.zeros(())  # consumed by LOAD/STORE
        if op is Ops.LOAD:
            index = u.src[0]
            buf = views[index.src[0].arg[0]]
            idx = memo[index.src[1]]
            if len(index.src) > 2:
                gate = memo[index.src[2]]
                safe = np.where(gate, idx, 0)
                out = np.where(gate, _load_cast(buf, safe, u.dtype), np.zeros((), dtype=_np_dtype(u.dtype)))
                return out
            return _load_cast(buf, idx, u.dtype)
        if op is Ops.REDUCE:
            body = memo[u.src[0]]
            axes = tuple(self.axis[r] for r in u.src[1:])
            shape = list(np.shape(body)) if np.ndim(body) else [1] * len(self.ranges)
            for r in u.src[1:]:
                lo, hi = window.get(r, (0, self.size(r)))
                shape[self.axis[r]] = hi - lo
            body = np.broadcast_to(body, shape)
            if u.arg is Ops.FMA:
                return self.fma_fold(u, shape, memo)
            if u.arg is Ops.ADD:
                return np.sum(body, axis=axes, keepdims=True, dtype=_np_dtype(u.dtype))
            if u.arg is Ops.MUL:
                return np.prod(body, axis=axes, keepdims=True, dtype=_np_dtype(u.dtype))
            if u.arg is Ops.MAX:
                return np.max(body, axis=axes, keepdims=True)
            raise NotImplementedError(f"INTERP reduce {u.arg}")
        out = self.eval_alu(u, [memo[s] for s in u.src])
        return _round_half(out, u.dtype) if u.dtype in HALF_TYPES and op is not Ops.BITCAST else out

    def fma_fold(self, u: UOp, shape: list[int], memo: dict) -> np.ndarray:
        """A contracted sum (REDUCE FMA of MUL(a, b), made by lowering for devices with FMA): one
        correctly rounded acc = fma(a, b, acc) per point, in the order a compiled loop nest runs them
        (the REDUCE's ranges in order, the last innermost), so it gives the compiled scalar loop's bits."""
        a = np.broadcast_to(memo[u.src[0].src[0]], shape)
        b = np.broadcast_to(memo[u.src[0].src[1]], shape)
        axes = [self.axis[r] for r in u.src[1:]]
        out_shape = [1 if i in axes else n for i, n in enumerate(shape)]
        acc = np.zeros(out_shape, dtype=_np_dtype(u.dtype))
        for point in np.ndindex(*[shape[ax] for ax in axes]):
            at: list[Any] = [slice(None)] * len(shape)
            for ax, i in zip(axes, point):
                at[ax] = slice(i, i + 1)
            acc = _fma(a[tuple(at)], b[tuple(at)], acc, u.dtype)
        return acc

    def eval_alu(self, u: UOp, srcs: list) -> Any:
        op = u.op
        out_dt = _np_dtype(u.dtype)
        if op is Ops.CAST:
            return _cast(srcs[0], u.src[0].dtype, u.dtype)
        if op is Ops.BITCAST:
            src = _store_cast(np.asarray(srcs[0], dtype=_np_dtype(u.src[0].dtype)), u.src[0].dtype)
            # ascontiguousarray makes 0-d arrays 1-d: keep the shape so scalar kernels stay scalar
            bits = np.ascontiguousarray(src).view(u.dtype.np).reshape(np.shape(src))
            return _load_cast(bits, ..., u.dtype) if u.dtype in HALF_TYPES else bits
        if op is Ops.WHERE:
            return np.where(srcs[0], srcs[1], srcs[2]).astype(out_dt, copy=False)
        if op is Ops.FMA:
            return _fma(*srcs, u.dtype)
        if op is Ops.NEG:
            return np.logical_not(srcs[0]) if u.dtype is dtypes.bool else np.negative(srcs[0])
        if op is Ops.RECIPROCAL:
            return (np.ones((), dtype=out_dt) / srcs[0]).astype(out_dt, copy=False)
        if op is Ops.FDIV:
            return np.divide(srcs[0], srcs[1]).astype(out_dt, copy=False)
        if op is Ops.IDIV:
            return _trunc_div(srcs[0], srcs[1]).astype(out_dt, copy=False)
        if op is Ops.MOD:
            if u.dtype.is_float:  # C fmod: x % 0.0 is NaN
                return np.fmod(srcs[0], srcs[1]).astype(out_dt, copy=False)
            return np.fmod(srcs[0], np.where(srcs[1] == 0, 1, srcs[1])).astype(out_dt, copy=False)
        if op in UNARY:
            return UNARY[op](srcs[0]).astype(out_dt, copy=False)
        if op in BINARY:
            a, b = srcs
            if op in (Ops.SHL, Ops.SHR):
                b = np.asarray(b).astype(np.asarray(a).dtype)
            res = BINARY[op](a, b)
            return res.astype(out_dt, copy=False)
        raise NotImplementedError(f"INTERP has no rule for {op.name}")


ACCUMULATE = {Ops.ADD: np.add, Ops.MUL: np.multiply, Ops.MAX: _maximum}


def _accumulate(buf: np.ndarray, idx: np.ndarray, val: np.ndarray, op: Ops, dt: DType) -> None:
    """An accumulating STORE: buf[idx[k]] = op(buf[idx[k]], val[k]) for every k, in order. Indices
    that repeat are folded in rounds (the k-th occurrence of each element in round k), so every
    update lands and each is rounded to the buffer's dtype, as the compiled loop does."""
    if idx.size == 0:
        return
    order = np.argsort(idx, kind="stable")
    sidx = idx[order]
    starts = np.r_[0, np.flatnonzero(sidx[1:] != sidx[:-1]) + 1]
    rank = np.arange(sidx.size) - np.repeat(starts, np.diff(np.r_[starts, sidx.size]))
    for k in range(int(rank.max()) + 1):
        pick = order[rank == k]
        at = idx[pick]
        old = _load_cast(buf, at, dt)
        new = ACCUMULATE[op](old, np.asarray(val[pick], dtype=_np_dtype(dt)))
        buf[at] = _store_cast(_round_half(new, dt) if dt in HALF_TYPES else new, dt)


def _fma(a: Any, b: Any, c: Any, dt: DType) -> np.ndarray:
    """a*b+c rounded once, as C's fma. Below float64 (float32, and half types, which the IR defines as
    the float32 fma rounded to half): the float64 product is exact, the float64 sum is rounded to odd
    (TwoSum error, then one ulp toward it when the result is even), and rounding that to float32 is
    correctly rounded (53 >= 24 + 2 bits). float64: exact rational arithmetic, element by element."""
    if not dt.is_float:
        return (np.asarray(a) * b + c).astype(dt.np, copy=False)
    if dt is dtypes.float64:
        return np.frompyfunc(_fma64, 3, 1)(a, b, c).astype(np.float64)
    a64, b64, c64 = (np.asarray(x, dtype=np.float64) for x in (a, b, c))
    p = a64 * b64
    s = p + c64
    bb = s - p
    e = (p - (s - bb)) + (c64 - bb)
    even = (np.asarray(s).view(np.int64) & 1) == 0
    adj = np.isfinite(s) & np.isfinite(e) & (e != 0) & even
    s = np.where(adj, np.nextafter(s, np.where(e > 0, np.inf, -np.inf)), s)
    return s.astype(np.float32)


def _fma64(x: float, y: float, z: float) -> float:
    if not (math.isfinite(x) and math.isfinite(y) and math.isfinite(z)):
        return x * y + z
    exact = Fraction(x) * Fraction(y) + Fraction(z)
    if exact == 0:
        return x * y + z  # the sign of an exact zero follows IEEE addition
    try:
        return float(exact)
    except OverflowError:
        return math.copysign(math.inf, exact)


def _cast(x: np.ndarray, src: DType, dst: DType) -> np.ndarray:
    out = _np_dtype(dst)
    if dst is dtypes.bool:
        return np.asarray(x) != 0
    if src.is_float and dst.is_int:
        with np.errstate(invalid="ignore"):
            return np.asarray(x).astype(np.int64 if not dst.is_unsigned else np.int64).astype(out)
    return np.asarray(x).astype(out)


def _load_cast(buf: np.ndarray, idx: Any, dt: DType) -> np.ndarray:
    vals = buf[idx]
    if dt is dtypes.bfloat16:
        return (np.asarray(vals).astype(np.uint32) << 16).view(np.float32)
    if dt is dtypes.float16:
        return np.asarray(vals).view(np.float16).astype(np.float32)
    return vals


def _store_cast(vals: np.ndarray, dt: DType) -> np.ndarray:
    if dt is dtypes.bfloat16:
        bits = np.ascontiguousarray(vals, dtype=np.float32).view(np.uint32).astype(np.uint64)
        rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
        nan = (bits & 0x7FFFFFFF) > 0x7F800000
        return np.where(nan, ((bits >> 16) | 0x40).astype(np.uint16), rounded)
    if dt is dtypes.float16:
        return np.asarray(vals).astype(np.float16)
    return vals
