"""Reductions (sum, prod, max, mean, var...), cumulative scans and ordering on Tensor (a mixin of Tensor).

Stage: graph construction. Input: tensors. Output: tensor graphs of REDUCE_AXIS and elementwise ops.
Scans compare every pair of positions along the axis (an n x n mask reduced in-kernel, never
materialised), and sorting ranks each element by counting the elements that sort before it, then
places it with a one-hot reduce: O(n^2) work per row, O(n) memory, no host round trip, and the
values stay differentiable (the gradient flows back to the element's original position).
"""
from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Any, NamedTuple

from polygrad.dtype import dtypes, least_upper_float, to_dtype
from polygrad.errors import InvalidArgumentError
from polygrad.tensor_common import _resolve_axis, _sum_dtype, size_tensor
from polygrad.tensor_math import HALF_TYPES, float_math
from polygrad.uop import sint
from polygrad.uop.ops import Ops, UOp

if TYPE_CHECKING:
    from polygrad.tensor import Tensor


def accepts_dim(fn):
    """Let a reduction take torch's `dim=` keyword as well as tinygrad's `axis=`."""
    @functools.wraps(fn)
    def wrapper(self, *args: Any, **kw: Any):
        if "dim" in kw:
            if "axis" in kw or args:
                raise TypeError(f"{fn.__name__}() got both dim and axis; pass one of them")
            kw["axis"] = kw.pop("dim")
        return fn(self, *args, **kw)
    return wrapper


def _axes_of(x, axis: Any) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(x.ndim))
    items = axis if isinstance(axis, (tuple, list)) else (axis,)
    return tuple(sorted({_resolve_axis(a, x.ndim) for a in items}))


def _out_shape(x, axes: tuple[int, ...], keepdim: bool) -> tuple[int, ...]:
    if keepdim:
        return tuple(1 if i in axes else s for i, s in enumerate(x.shape))
    return tuple(s for i, s in enumerate(x.shape) if i not in axes)


def _lowest(dt):
    return -math.inf if dt.is_float else dtypes.min(dt)


def _highest(dt):
    return math.inf if dt.is_float else dtypes.max(dt)


class ValuesIndices(NamedTuple):
    """(values, indices) of cummax/cummin: a tuple (tinygrad) with torch's field names."""

    values: Any
    indices: Any


def _scan_indices(x, values, axis: int):
    """For each position i along axis, the latest j <= i whose x[j] is values[i] (NaN matches NaN); int32."""
    if x.ndim == 0:
        return type(x)(0, device=x.device, dtype=dtypes.int32, _runtime=x._runtime)
    ax = _resolve_axis(axis, x.ndim)
    if x.shape[ax] == 0:
        return x.cast(dtypes.int32)
    xt, vt = x.transpose(ax, -1), values.transpose(ax, -1)
    n = xt.shape[-1]
    xj, vi = xt.unsqueeze(-2), vt.unsqueeze(-1)  # [..., 1, j] and [..., i, 1]
    hit = xj.eq(vi)
    if x.dtype.is_float:
        hit = hit | (xj.isnan() & vi.isnan())
    idx = type(x).arange(n, device=x.device, dtype=dtypes.int32, _runtime=x._runtime)
    hit = hit & (idx.reshape(1, n) <= idx.reshape(n, 1))
    return hit.where(idx.reshape(1, n), -1).max(-1).transpose(ax, -1)


class ReduceMixin:
    """Reductions built on REDUCE_AXIS (ADD/MAX/MUL) and elementwise ops."""

    __slots__ = ()

    # reductions
    def _reduce(self, op: Ops, axis: Any = None, keepdim: bool = False) -> "Tensor":
        axes = tuple(range(self.ndim)) if axis is None else tuple(
            _resolve_axis(a, self.ndim) for a in (axis if isinstance(axis, (tuple, list)) else (axis,)))
        axes = tuple(sorted(set(axes)))
        if self.ndim == 0:
            return self
        if any(self.shape[a] == 0 for a in axes) and op is Ops.MAX:
            raise RuntimeError("max() of an empty dimension has no identity; pass a non-empty tensor")
        x = self
        out = x._new(UOp(Ops.REDUCE_AXIS, x.dtype, (x.uop,), (op, axes)))
        return out if keepdim else out.reshape(tuple(s for i, s in enumerate(self.shape) if i not in axes))

    def sum(self, axis: Any = None, keepdim: bool = False, dtype: Any = None) -> "Tensor":
        """Sum over axis; floats longer than BLOCKED_SUM_MIN are summed in blocks (see _blocked_sum)."""
        x = self.cast(dtype) if dtype is not None else self.cast(_sum_dtype(self.dtype))
        out = _blocked_sum(x, axis, keepdim) if x.dtype.is_float else x._reduce(Ops.ADD, axis, keepdim)
        return out.cast(self.dtype) if dtype is None and self.dtype in (dtypes.float16, dtypes.bfloat16) else out

    def prod(self, axis: Any = None, keepdim: bool = False, dtype: Any = None) -> "Tensor":
        x = self.cast(dtype) if dtype is not None else self.cast(_sum_dtype(self.dtype))
        out = x._reduce(Ops.MUL, axis, keepdim)
        return out.cast(self.dtype) if dtype is None and self.dtype in (dtypes.float16, dtypes.bfloat16) else out

    def squeeze_axes(self, axis: Any) -> "Tensor":
        if axis is None:
            return self.reshape(())
        axes = {_resolve_axis(a, self.ndim) for a in (axis if isinstance(axis, (tuple, list)) else (axis,))}
        return self.reshape(tuple(s for i, s in enumerate(self.shape) if i not in axes))

    def _empty_reduce(self, axis: Any) -> bool:
        return self.ndim > 0 and any(self.shape[a] == 0 for a in _axes_of(self, axis))

    def _require_nonempty(self, name: str, axis: Any) -> None:
        if self._empty_reduce(axis):
            raise IndexError(f"{name}() of an empty dimension has no identity; pass a non-empty tensor or "
                             f"reduce over another axis (shape {self.shape}, axis {axis})")

    # ---- max / min
    def max(self, axis: Any = None, keepdim: bool = False):
        """The largest value along axis (values only, like tinygrad; NaN propagates)."""
        self._require_nonempty("max", axis)
        return self._reduce(Ops.MAX, axis, keepdim)

    amax = max

    def min(self, axis: Any = None, keepdim: bool = False):
        """The smallest value along axis (values only, like tinygrad; NaN propagates)."""
        self._require_nonempty("min", axis)
        if self.dtype is dtypes.bool:
            return self.logical_not().max(axis, keepdim).logical_not()
        if not self.dtype.is_float:
            return ~((~self).max(axis, keepdim))  # ~ reverses the order without overflow
        return -((-self).max(axis, keepdim))

    amin = min

    # ---- mean / var / std
    # float16/bfloat16 inputs are summed, divided and squared in float32 and rounded once at the end, as
    # torch does: mean(ones(70000, float16)) is 1, not inf (the sum alone exceeds float16's range)
    def mean(self, axis: Any = None, keepdim: bool = False, dtype: Any = None):
        """The arithmetic mean (integers are averaged in the default float type, or in `dtype`); empty gives NaN."""
        out_dtype = to_dtype(dtype) if dtype is not None else least_upper_float(self.dtype)
        x = self.cast(out_dtype)
        n = sint.sprod(self.shape[a] for a in _axes_of(self, axis)) if self.ndim else 1
        total = x.sum(axis, keepdim, dtype=_sum_dtype(out_dtype))
        if sint.is_sym(n):  # a symbolic count: divided in-kernel by the variable's value
            return (total / size_tensor(n, total)).cast(out_dtype)
        return (total * (1.0 / n) if n else total * math.nan).cast(out_dtype)

    def _var_wide(self, axis: Any, keepdim: bool, correction: float, unbiased: bool | None):
        """(variance in the accumulation dtype, the dtype to round it to)."""
        if unbiased is not None:
            correction = 1 if unbiased else 0
        dt = least_upper_float(self.dtype)
        x = self.cast(dt).cast(_sum_dtype(dt))
        n = math.prod(self.shape[a] for a in _axes_of(self, axis)) if self.ndim else 1
        sq = (x - x.mean(axis, keepdim=True)).square().sum(axis, keepdim)
        return sq / max(n - correction, 0), dt

    def var(self, axis: Any = None, keepdim: bool = False, correction: float = 1, unbiased: bool | None = None):
        """Variance with Bessel's correction by default (torch's `correction`/`unbiased`)."""
        wide, dt = self._var_wide(axis, keepdim, correction, unbiased)
        return wide.cast(dt)

    def std(self, axis: Any = None, keepdim: bool = False, correction: float = 1, unbiased: bool | None = None):
        wide, dt = self._var_wide(axis, keepdim, correction, unbiased)
        return wide.sqrt().cast(dt)

    def var_mean(self, axis: Any = None, keepdim: bool = False, correction: float = 1):
        return self.var(axis, keepdim, correction), self.mean(axis, keepdim)

    def std_mean(self, axis: Any = None, keepdim: bool = False, correction: float = 1):
        return self.std(axis, keepdim, correction), self.mean(axis, keepdim)

    # ---- arg reductions
    def argmax(self, axis: Any = None, keepdim: bool = False):
        """Index of the first maximum (NaN counts as the maximum, like torch); int32 indices."""
        if axis is None:
            out = self.flatten().argmax(0)
            return out.reshape((1,) * self.ndim) if keepdim else out
        ax = _resolve_axis(axis, self.ndim)
        if self.ndim == 0:
            return type(self)(0, device=self.device, dtype=dtypes.int32, _runtime=self._runtime)
        n = self.shape[ax]
        self._require_nonempty("argmax", ax)
        hit = self.eq(self.max(ax, keepdim=True))
        if self.dtype.is_float:
            hit = hit | self.isnan()
        shape = [1] * self.ndim
        shape[ax] = n
        rev = type(self).arange(n, 0, -1, device=self.device, dtype=dtypes.int32, _runtime=self._runtime).reshape(shape)
        return n - hit.where(rev, 0).max(ax, keepdim)

    def argmin(self, axis: Any = None, keepdim: bool = False):
        """Index of the first minimum (NaN counts as the minimum, like torch); int32 indices."""
        if self.dtype is dtypes.bool:
            return self.logical_not().argmax(axis, keepdim)
        return (-self if self.dtype.is_float else ~self).argmax(axis, keepdim)

    # ---- boolean reductions
    def any(self, axis: Any = None, keepdim: bool = False):
        x = self.bool()
        if self._empty_reduce(axis):
            return _full(self, _out_shape(self, _axes_of(self, axis), keepdim), False)
        return x._reduce(Ops.MAX, axis, keepdim)

    def all(self, axis: Any = None, keepdim: bool = False):
        return self.logical_not().any(axis, keepdim).logical_not()

    # ---- softmax family
    @float_math
    def logsumexp(self, axis: Any = None, keepdim: bool = False):
        """log(sum(exp(x))) computed around the maximum; all -inf gives -inf, empty gives -inf."""
        if self._empty_reduce(axis):
            return _full(self, _out_shape(self, _axes_of(self, axis), keepdim), -math.inf)
        m = self.max(axis, keepdim=True).detach()
        m = m.isinf().where(0, m)
        out = (self - m).exp().sum(axis, keepdim=True).log() + m
        return out.reshape(_out_shape(self, _axes_of(self, axis), keepdim))

    def softmax(self, axis: int = -1, dtype: Any = None):
        x = self.cast(dtype) if dtype is not None else self
        return x._softmax(axis)

    @float_math
    def _softmax(self, axis: int):
        m = self.max(axis, keepdim=True).detach() if not self._empty_reduce(axis) else 0
        e = (self - m).exp()
        return e / e.sum(axis, keepdim=True)

    def log_softmax(self, axis: int = -1, dtype: Any = None):
        x = self.cast(dtype) if dtype is not None else self
        return x._log_softmax(axis)

    @float_math
    def _log_softmax(self, axis: int):
        m = self.max(axis, keepdim=True).detach() if not self._empty_reduce(axis) else 0
        shifted = self - m
        return shifted - shifted.exp().sum(axis, keepdim=True).log()

    def softmin(self, axis: int = -1, dtype: Any = None):
        return (-self).softmax(axis, dtype)

    # ---- cumulative scans
    def _scan(self, axis: int, kind: str):
        """Inclusive scan along axis; kind is a row of SCANS. Sums and products of float16/bfloat16
        accumulate in float32 and round once, as torch's (the blocked scan would round three times)."""
        ax = _resolve_axis(axis, self.ndim)  # a 0-d tensor takes dim 0 or -1, as torch
        if kind in ("sum", "prod", "logsumexp") and self.dtype in HALF_TYPES:
            return self.cast(dtypes.float32)._scan(ax, kind).cast(self.dtype)
        if self.ndim == 0:
            return self.reshape(1)._scan(0, kind).reshape(())
        if self.shape[ax] == 0 and kind in ("max", "min"):
            return self  # an empty running max is empty (torch); max() itself would refuse the empty axis
        return self.transpose(ax, -1)._scan_last(kind).transpose(ax, -1)

    def _scan_last(self, kind: str):
        """Scan the last axis: directly up to SCAN_BLOCK, else in blocks plus a scan of block totals."""
        n = self.shape[-1]
        if n <= SCAN_BLOCK:
            return self._scan_direct(kind)
        identity, _, merge = SCANS[kind]
        ident = identity(self.dtype)
        lead = ((0, 0),) * (self.ndim - 1)
        m = -(-n // SCAN_BLOCK)
        padded = self.pad(lead + ((0, m * SCAN_BLOCK - n),), value=ident)
        inner = padded.reshape(*self.shape[:-1], m, SCAN_BLOCK)._scan_direct(kind)
        last = tuple((0, s) for s in inner.shape[:-1]) + ((SCAN_BLOCK - 1, SCAN_BLOCK),)
        totals = inner.shrink(last).reshape(*self.shape[:-1], m)
        before = totals._scan_last(kind).pad(lead + ((1, 0),), value=ident)
        before = before.shrink(tuple((0, s) for s in self.shape[:-1]) + ((0, m),))
        out = merge(inner, before.unsqueeze(-1)).reshape(*self.shape[:-1], m * SCAN_BLOCK)
        return out.shrink(tuple((0, s) for s in self.shape[:-1]) + ((0, n),))

    def _scan_direct(self, kind: str):
        """rows[..., i, j] = x[..., j] masked to j <= i, then reduced over j: O(n^2) work, in-kernel."""
        n = self.shape[-1]
        identity, reduce, _ = SCANS[kind]
        rows = self.unsqueeze(-2).expand(*self.shape[:-1], n, n)
        idx = type(self).arange(n, device=self.device, dtype=dtypes.int32, _runtime=self._runtime)
        mask = idx.reshape(1, n) <= idx.reshape(n, 1)
        return reduce(mask.where(rows, identity(self.dtype)))

    def cumsum(self, axis: int = 0):
        return self._scan(axis, "sum")

    def cumprod(self, axis: int = 0):
        return self._scan(axis, "prod")

    def cummax(self, axis: int = 0) -> "ValuesIndices":
        """Running maximum and where it was reached: (values, indices), as tinygrad and torch. Among equal
        values the latest index wins; a NaN stays and its latest index is reported (torch)."""
        values = self._scan(axis, "max")
        return ValuesIndices(values, _scan_indices(self, values, axis))

    def cummin(self, axis: int = 0) -> "ValuesIndices":
        """Running minimum and where it was reached: (values, indices) (see cummax)."""
        values = self._scan(axis, "min")
        return ValuesIndices(values, _scan_indices(self, values, axis))

    def logcumsumexp(self, axis: int = 0):
        return self.cast(least_upper_float(self.dtype))._scan(axis, "logsumexp")

    # ---- ordering
    def _ranks(self, ax: int, descending: bool):
        """For each element, how many elements of its row sort before it (stable; NaN sorts as largest)."""
        n = self.shape[ax]
        x = self.transpose(ax, -1)
        xi, xj = x.unsqueeze(-1), x.unsqueeze(-2)  # [..., i, 1] and [..., 1, j]
        idx = type(self).arange(n, device=self.device, dtype=dtypes.int32, _runtime=self._runtime)
        j_first = idx.reshape(1, n) < idx.reshape(n, 1)  # [i, j]: j < i
        if descending:
            ahead = xj > xi
        else:
            ahead = xj < xi
        same = xj.eq(xi)
        if x.dtype.is_float:
            nan_i, nan_j = xi.isnan(), xj.isnan()
            ahead = ahead | ((nan_j & nan_i.logical_not()) if descending else (nan_i & nan_j.logical_not()))
            same = same | (nan_i & nan_j)
        before = ahead | (same & j_first)
        return before.sum(-1, dtype=dtypes.int32), x  # ranks [..., i] along the last axis

    def sort(self, dim: int = -1, descending: bool = False):
        """(values, indices) sorted along dim; stable, NaN last (first when descending); int32 indices."""
        if self.ndim == 0:
            return self, type(self)(0, device=self.device, dtype=dtypes.int32, _runtime=self._runtime)
        ax = _resolve_axis(dim, self.ndim)
        n = self.shape[ax]
        if n == 0:
            return self, self.cast(dtypes.int32)
        ranks, x = self._ranks(ax, descending)
        ranks = ranks.contiguous()
        idx = type(self).arange(n, device=self.device, dtype=dtypes.int32, _runtime=self._runtime)
        place = ranks.unsqueeze(-2).eq(idx.reshape(n, 1))  # [..., r, i]: element i goes to slot r
        xv = x.int() if x.dtype is dtypes.bool else x
        values = place.where(xv.unsqueeze(-2), 0).sum(-1, dtype=xv.dtype).cast(x.dtype)
        indices = place.where(idx.reshape(1, n), 0).sum(-1, dtype=dtypes.int32)
        return values.transpose(ax, -1), indices.transpose(ax, -1)

    def argsort(self, dim: int = -1, descending: bool = False):
        return self.sort(dim, descending)[1]

    def topk(self, k: int, dim: int = -1, largest: bool = True, sorted: bool = True, sorted_: bool | None = None):
        """(values, indices) of the k largest (or smallest) along dim, in sorted order (`sorted_` is tinygrad's
        name for `sorted`)."""
        ax = _resolve_axis(dim, self.ndim)
        n = self.shape[ax] if self.ndim else 1
        if not 0 <= k <= n:  # torch: RuntimeError, tinygrad: ValueError
            raise InvalidArgumentError(f"topk: k={k} is out of range for dimension {dim} of size {n}; pick k in "
                                       f"[0, {n}]")
        values, indices = self.sort(ax, descending=largest)
        if self.ndim == 0:
            return values, indices
        bounds = tuple((0, k) if i == ax else (0, s) for i, s in enumerate(self.shape))
        return values.shrink(bounds), indices.shrink(bounds)


DIM_METHODS = ("sum", "prod", "max", "amax", "min", "amin", "mean", "var", "std", "var_mean", "std_mean", "argmax",
               "argmin", "any", "all", "logsumexp", "softmax", "log_softmax", "softmin", "cumsum", "cumprod", "cummax",
               "cummin", "logcumsumexp")
for _name in DIM_METHODS:
    setattr(ReduceMixin, _name, accepts_dim(getattr(ReduceMixin, _name)))

SCAN_BLOCK = 256  # longer axes scan in two levels: O(n * 256 + (n / 256)^2) instead of O(n^2)
# kind -> (identity for a dtype, reduce over the last axis, merge a block prefix into a scan)
SCANS = {
    "sum": (lambda dt: 0, lambda r: r.sum(-1), lambda a, b: a + b),
    "prod": (lambda dt: 1, lambda r: r.prod(-1), lambda a, b: a * b),
    "max": (_lowest, lambda r: r.max(-1), lambda a, b: a.maximum(b)),
    "min": (_highest, lambda r: r.min(-1), lambda a, b: a.minimum(b)),
    "logsumexp": (lambda dt: -math.inf, lambda r: r.logsumexp(-1), lambda a, b: a.logaddexp(b)),
}


def _full(like, shape: tuple[int, ...], value: Any):
    dt = dtypes.bool if isinstance(value, bool) else least_upper_float(like.dtype)
    return type(like).full(shape, value, dtype=dt, device=like.device, _runtime=like._runtime)


# A float sum over more elements than this is computed in blocks of SUM_BLOCK (one axis at a time, each long
# axis cut into blocks whose partial sums are summed again), so no accumulator adds more than SUM_BLOCK terms:
# the rounding error grows like the number of levels, as NumPy's pairwise sum, not like the element count
# (one float32 accumulator stops growing at 2**24: ones(2**24 + 3).sum() would give 16777216).
BLOCKED_SUM_MIN = 1 << 16


SUM_BLOCK = 128  # NumPy's pairwise sum also adds runs of 128 elements before it pairs them


def _blocked_sum(x: "Tensor", axis: Any, keepdim: bool) -> "Tensor":
    axes = tuple(range(x.ndim)) if axis is None else tuple(
        _resolve_axis(a, x.ndim) for a in (axis if isinstance(axis, (tuple, list)) else (axis,)))
    axes = tuple(sorted(set(axes))) if x.ndim else ()
    sizes = [x.shape[a] for a in axes]
    if sint.has_sym(tuple(sizes)) or math.prod(sizes) <= BLOCKED_SUM_MIN:
        return x._reduce(Ops.ADD, axis, keepdim)
    out = x
    for a in reversed(axes):
        out = _blocked_axis_sum(out, a)
    return out if keepdim else out.reshape(tuple(s for i, s in enumerate(x.shape) if i not in axes))


def _blocked_axis_sum(x: "Tensor", a: int) -> "Tensor":
    """x summed over axis a (kept as size 1), at most SUM_BLOCK terms per accumulator."""
    n = x.shape[a]
    if n <= SUM_BLOCK:
        return x._reduce(Ops.ADD, a, True)
    m = -(-n // SUM_BLOCK)
    x = x.pad(tuple((0, m * SUM_BLOCK - n) if i == a else (0, 0) for i in range(x.ndim)))
    parts = x.reshape(x.shape[:a] + (m, SUM_BLOCK) + x.shape[a + 1:])._reduce(Ops.ADD, a + 1, False)
    return _blocked_axis_sum(parts, a)
