"""Indexing of Tensor (a mixin): basic `__getitem__` (ints, slices, None, ...), indexing with integer tensors,
`__setitem__`, gather, scatter, masked_select, nonzero and take_along_axis.

Stage: graph construction. Input: a Tensor and indices (ints, slices, None, Ellipsis, integer or
boolean tensors/lists/arrays). Output: Tensors built on the two indexed-access primitives, GATHER (a
load at a computed index) and SCATTER (an accumulating store at one), so every lookup costs O(number
of indices), not O(indices x axis size), and gradients flow through a scatter-add.

Out-of-range indices (docs/tensor-semantics.md): indices whose values are known on the host (Python
lists, NumPy arrays, and realized tensors in host memory, which are read without running anything)
are checked and raise IndexError, as in torch. Indices computed lazily cannot be checked without a
device sync: a lookup reads 0 there and a scatter writes nothing there, as in tinygrad.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from polygrad import runtime_context
from polygrad.dtype import dtype_min, dtypes
from polygrad.errors import DeviceError, DimensionError, DTypeError, InvalidArgumentError
from polygrad.tensor_common import _check_runtimes, broadcast_shape, capture_guards, check_writable, is_tensor
from polygrad.uop import sint
from polygrad.uop.ops import Ops, UOp
from polygrad.uop.shape import ShapeError
from polygrad.uop.movement import strip_reshapes

if TYPE_CHECKING:
    from polygrad.tensor import Tensor


class _Index:
    """One advanced index: an integer tensor plus its host copy when it came from host data."""

    __slots__ = ("tensor", "host")

    def __init__(self, tensor: "Tensor", host: np.ndarray | None):
        self.tensor, self.host = tensor, host


def _axis(axis: int, ndim: int) -> int:
    n = max(ndim, 1)
    if not -n <= axis < n:
        raise DimensionError(f"dimension {axis} is out of range for a tensor with {ndim} dimensions")
    return axis % n


def host_values(t: "Tensor") -> np.ndarray | None:
    """The values of a realized tensor whose buffer is host memory, read without running a kernel (None
    for a lazy tensor, device memory, or while a Model is being captured: example values say nothing
    about later calls)."""
    u = strip_reshapes(t.uop)
    if capture_guards.stack or u.op is not Ops.BUFFER or not u.arg.is_allocated or t.dtype is dtypes.bfloat16:
        return None
    if u.arg.size != t.numel() or not getattr(u.arg.impl(), "host_memory", False):
        return None
    return u.arg.numpy().reshape(t.shape)


def _to_indices(item: Any, like: "Tensor") -> list[_Index]:
    """An index item as integer indices: a boolean mask of k dims becomes k integer indices."""
    host, device = None, like.device
    if is_tensor(item):
        if item.dtype is dtypes.bool:
            host = item.numpy()
        elif not item.dtype.is_int:
            raise IndexError(f"tensors used as indices must be integer or bool tensors, got {item.dtype}")
        else:
            return [_Index(item.to(device), host_values(item))]
    else:
        host = np.asarray(item)
        if host.dtype == object or not (host.dtype.kind in "biu" or host.size == 0):
            raise IndexError(f"index lists must hold integers or bools, got {item!r}")
    if host.dtype == np.bool_:
        if host.ndim == 0:
            raise IndexError("0-d boolean indices are not supported; use a 1-element boolean list")
        # the result's shape depends on the mask's values, so they are read on the host (like PyTorch)
        return [_Index(type(like)(nz.astype(np.int32), device=device), nz) for nz in np.nonzero(host)]
    host = host.astype(np.int64)
    return [_Index(type(like)(host.astype(np.int32), device=device), host)]


def _check_one_ellipsis(items: list) -> None:
    """IndexError for x[..., ...], as NumPy and tinygrad (torch's answer depends on the other items)."""
    if sum(1 for it in items if it is Ellipsis) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")


def _expand_items(x: "Tensor", items: list) -> list:
    """Replace Ellipsis by full slices and append trailing full slices; check the index count."""
    consumes = [0 if (it is None or it is Ellipsis) else (
        max(np.ndim(it) if not is_tensor(it) else it.ndim, 1)
        if _is_bool_index(it) else 1) for it in items]
    n_real = sum(consumes)
    if n_real > x.ndim:
        raise IndexError(f"too many indices ({n_real}) for a tensor with {x.ndim} dimensions")
    _check_one_ellipsis(items)
    fill = [slice(None)] * (x.ndim - n_real)
    if any(it is Ellipsis for it in items):
        at = next(i for i, it in enumerate(items) if it is Ellipsis)
        return items[:at] + fill + items[at + 1:]
    return items + fill


def _is_bool_index(it: Any) -> bool:
    if is_tensor(it):
        return it.dtype is dtypes.bool
    if isinstance(it, (list, tuple, np.ndarray)):
        return np.asarray(it).dtype == np.bool_
    return False


def _is_advanced(it: Any) -> bool:
    return is_tensor(it) or isinstance(it, (list, tuple, np.ndarray))  # a tuple inside the index: x[(0, 1),]


def _check_host_bounds(idx: _Index, size: int, dim: int) -> None:
    if idx.host is None or idx.host.size == 0:
        return
    lo, hi = int(idx.host.min()), int(idx.host.max())
    if lo < -size or hi >= size:
        bad = lo if lo < -size else hi
        raise IndexError(f"index {bad} is out of bounds for dimension {dim} with size {size}")


def advanced_getitem(x: "Tensor", items: list) -> "Tensor":
    """x[items] where some items are integer/bool tensors or lists (PyTorch semantics)."""
    items = _expand_items(x, items)
    basic: list = []
    index_of_dim: list[tuple[int, _Index]] = []  # (position in the basic result, index)
    out_dim, src_dim = 0, 0
    for it in items:
        if it is None:
            basic.append(None)
            out_dim += 1
        elif _is_advanced(it):
            with runtime_context.using(x._runtime or runtime_context.current()):  # index tensors are x's owner's
                indices = _to_indices(it, x)
            for idx in indices:
                _check_host_bounds(idx, x.shape[src_dim], src_dim)
                basic.append(slice(None))
                index_of_dim.append((out_dim, idx))
                out_dim += 1
                src_dim += 1
        else:
            basic.append(it)
            src_dim += 1
            if not isinstance(it, (int, np.integer)):
                out_dim += 1
    y = x[tuple(basic)] if basic else x
    positions = [p for p, _ in index_of_dim]
    sizes = [y.shape[p] for p in positions]
    bshape = broadcast_shape(*[idx.tensor.shape for _, idx in index_of_dim])
    rest = [i for i in range(y.ndim) if i not in positions]
    flat_size = math.prod(sizes)
    wide = flat_size > INT32_MAX or any(idx.tensor.dtype.itemsize == 8 for _, idx in index_of_dim)
    it = dtypes.int64 if wide else dtypes.int32
    y = y.permute(rest + positions).reshape(tuple(y.shape[i] for i in rest) + (flat_size,))
    flat, ok = None, None
    for (_, idx), s, stride in zip(index_of_dim, sizes, _strides(sizes)):
        t = _wrap_negative(idx.tensor, s)
        if len(sizes) > 1:  # an index outside its own axis must not land inside another one
            inside = (t >= 0) & (t < s) if not t.dtype.is_unsigned else t < s
            ok = inside if ok is None else ok & inside
        term = t.cast(it)._broadcast_to(bshape) * stride
        flat = term if flat is None else flat + term
    if ok is not None:
        flat = ok._broadcast_to(bshape).where(flat, -1)
    out = take(y, y.ndim - 1, flat)
    if len(rest):  # take put the index dims at the end of rest; the result wants them first
        nb, nr = len(bshape), len(rest)
        out = out.permute(list(range(nr, nr + nb)) + list(range(nr)))
    adjacent = positions == list(range(positions[0], positions[0] + len(positions)))
    if adjacent and positions[0] > 0:
        nb, first = len(bshape), positions[0]
        before = list(range(nb, nb + first))
        out = out.permute(before + list(range(nb)) + list(range(nb + first, out.ndim)))
    return out


def _strides(sizes: list[int]) -> list[int]:
    out, acc = [], 1
    for s in reversed(sizes):
        out.append(acc)
        acc *= s
    return out[::-1]


INT32_MAX = 2**31 - 1


def _wrap_negative(t: "Tensor", size: int) -> "Tensor":
    """Python-style negative indices: -size..-1 count from the end (others stay out of range)."""
    return t if t.dtype.is_unsigned else (t < 0).where(t + size, t)


def _prim(x: "Tensor", op: Ops, srcs: tuple["Tensor", ...], arg: Any) -> "Tensor":
    """A GATHER/SCATTER node over x and srcs (same device and runtime, integer index)."""
    _check_runtimes([x, *srcs])
    devs = {t.device for t in (x, *srcs)}
    if len(devs) > 1:
        raise DeviceError(f"operands are on different devices {sorted(devs)}; move them with .to(device)")
    return x._new(UOp(op, x.dtype, (x.uop, *(t.uop for t in srcs)), arg))


def gather_prim(x: "Tensor", axis: int, index: "Tensor") -> "Tensor":
    """GATHER: out[i] = x[i with i[axis] := index[i]], 0 where index[i] is outside [0, x.shape[axis]).
    x has index's shape outside axis, or 1 (read at 0 for every index point); the result has index's
    shape. Differentiable in x (its gradient is a scatter-add into x's shape)."""
    return _prim(x, Ops.GATHER, (index,), axis)


def scatter_prim(base: "Tensor", axis: int, index: "Tensor", value: "Tensor", op: Ops) -> "Tensor":
    """SCATTER: base with each value[i] folded (op ADD, MUL or MAX) into the element index[i] names
    along axis; points whose index is outside the axis are dropped. index and value have one shape,
    base's outside axis, where base may also have 1 (those points fold into its one element)."""
    return _prim(base, Ops.SCATTER, (index, value.cast(base.dtype)), (axis, op))


def take(x: "Tensor", axis: int, index: "Tensor") -> "Tensor":
    """numpy.take without wrapping: x.shape[:axis] + index.shape + x.shape[axis+1:] (0 out of range).
    One GATHER over x itself (the index flattened and broadcast over the other axes), so the gradient
    is a scatter-add straight into x's shape."""
    pre, post = x.shape[:axis], x.shape[axis + 1:]
    n = index.numel()
    ib = index.reshape((1,) * len(pre) + (n,) + (1,) * len(post)).expand(pre + (n,) + post)
    return gather_prim(x, axis, ib).reshape(pre + index.shape + post)


def check_host_index(index: "Tensor", size: int, dim: int, allow_negative: bool = False) -> None:
    """IndexError when index's values are known on the host (host_values) and some is out of range."""
    host = host_values(index)
    if host is None or host.size == 0:
        return
    lo, hi = int(host.min()), int(host.max())
    low = -size if allow_negative else 0
    if lo < low or hi >= size:
        bad = lo if lo < low else hi
        raise IndexError(f"index {bad} is out of bounds for dimension {dim} with size {size}")


def _fill(x: "Tensor", value: Any, dtype: Any = None) -> "Tensor":
    return type(x).full(x.shape, value, dtype=dtype or x.dtype, device=x.device, _runtime=x._runtime)


def _scatter_parts(x: "Tensor", dim: int, index: "Tensor", src: "Tensor") -> tuple[int, "Tensor", "Tensor"]:
    """torch's scatter shapes -> SCATTER's: index may be smaller than self outside dim (padded with -1,
    which writes nothing) and src larger than index (cut to it, then padded alike)."""
    d = _axis(dim, x.ndim)
    if index.ndim != x.ndim or src.ndim != x.ndim:
        raise ShapeError(f"scatter: index {index.shape}, src {src.shape} and self {x.shape} need the same "
                         "number of dimensions")
    if not index.dtype.is_int:
        raise TypeError(f"scatter: index must be an integer tensor, got {index.dtype}")
    for i, (a, b, c) in enumerate(zip(index.shape, src.shape, x.shape)):
        if a > b or (i != d and a > c):
            raise ShapeError(f"scatter: index shape {index.shape} must not exceed src {src.shape} in any "
                             f"dimension nor self {x.shape} outside dimension {d}")
    check_host_index(index, x.shape[d], d)
    src = src.shrink(tuple((0, a) for a in index.shape))
    grow = tuple((0, 0) if i == d else (0, c - a) for i, (a, c) in enumerate(zip(index.shape, x.shape)))
    if any(a for _, a in grow):
        index = index.cast(dtypes.int32 if index.dtype.itemsize < 8 else dtypes.int64).pad(grow, value=-1)
        src = src.pad(grow)
    return d, index, src


def _hit(x: "Tensor", d: int, index: "Tensor") -> "Tensor":
    """Bool of x's shape: the elements some index points at."""
    ones = _fill(index, 1, dtypes.int32)
    return scatter_prim(_fill(x, 0, dtypes.int32), d, index, ones, Ops.MAX).cast(dtypes.bool)


def scatter_last(x: "Tensor", d: int, index: "Tensor", src: "Tensor") -> "Tensor":
    """x with src written at index along d; where several points name one element the last one (in
    row-major order of index) wins. The winner of each element is found first (a MAX of point
    numbers), then each element receives exactly one value."""
    pid = type(x).arange(max(index.numel(), 1), device=x.device, dtype=dtypes.int32, _runtime=x._runtime)
    pid = pid.shrink(((0, index.numel()),)).reshape(index.shape)
    win = scatter_prim(_fill(x, -1, dtypes.int32), d, index, pid, Ops.MAX)
    idx_won = gather_prim(win, d, index).eq(pid).where(index, -1)
    hit = win >= 0
    if x.dtype is dtypes.bool:
        placed = scatter_prim(_fill(x, 0, dtypes.uint8), d, idx_won, src.cast(dtypes.uint8), Ops.ADD)
        return hit.where(placed.cast(dtypes.bool), x)
    # -0.0 + v is v exactly for every v (signed zeros included): the one value lands unchanged
    start = hit.where(-0.0 if x.dtype.is_float else 0, x)
    return scatter_prim(start, d, idx_won, src, Ops.ADD)


_REDUCE_IDENTITY = {"sum": 0, "mean": 0, "prod": 1}


def _order_flip(x: "Tensor") -> "Tensor":
    """An order-reversing bijection (amin through MAX): -x for floats, ~x for integers, not x for bool."""
    if x.dtype is dtypes.bool:
        return x.logical_not()
    return -x if x.dtype.is_float else x ^ -1 if not x.dtype.is_unsigned else x ^ int(2**(8 * x.dtype.itemsize) - 1)


class IndexingMixin:
    __slots__ = ()

    def __getitem__(self, index: Any) -> "Tensor":
        """Basic indexing: ints, slices (any step), None and Ellipsis; tensors go to tensor_ext."""
        items = list(index) if isinstance(index, tuple) else [index]
        if any(isinstance(i, (type(self), list, tuple, np.ndarray)) for i in items):
            return self._advanced_getitem(items)
        _check_one_ellipsis(items)
        n_real = sum(1 for i in items if i is not None and i is not Ellipsis)
        if n_real > self.ndim:
            raise IndexError(f"too many indices ({n_real}) for a tensor with {self.ndim} dimensions")
        if Ellipsis in items:
            at = items.index(Ellipsis)
            items = items[:at] + [slice(None)] * (self.ndim - n_real) + items[at + 1:]
        else:
            items = items + [slice(None)] * (self.ndim - n_real)
        x, dim, out_shape = self, 0, []
        bounds, flips, steps = [], [], []
        for it in items:
            if it is None:
                out_shape.append(("new", None))
                continue
            size = self.shape[dim]
            if isinstance(it, slice) and (sint.is_sym(size) or isinstance(it.start, UOp) or isinstance(it.stop, UOp)):
                bounds.append(_symbolic_slice(it, size))  # cache[:pos] with pos a bound Variable
                flips.append(False)
                steps.append(1)
                out_shape.append(("keep", dim))
                dim += 1
                continue
            if isinstance(it, (int, np.integer)) and not isinstance(it, bool):
                i = int(it)
                if not -size <= i < size:
                    raise IndexError(f"index {i} is out of bounds for dimension {dim} with size {size}")
                i %= size
                bounds.append((i, i + 1))
                flips.append(False)
                steps.append(1)
                out_shape.append(("drop", dim))
            elif isinstance(it, slice):
                start, stop, step = it.indices(size)
                if step == 0:
                    raise InvalidArgumentError("slice step cannot be zero")
                if step > 0:
                    n = max(0, -(-(stop - start) // step))
                    bounds.append((start, start + max(n - 1, 0) * step + (1 if n else 0)))
                    flips.append(False)
                else:
                    n = max(0, -(-(start - stop) // -step))
                    lo = start - (n - 1) * -step if n else 0
                    bounds.append((lo, start + 1 if n else 0))
                    flips.append(True)
                steps.append(abs(step))
                out_shape.append(("keep", dim))
            else:
                raise TypeError(f"unsupported index {it!r}; use ints, slices, None, Ellipsis or integer tensors")
            dim += 1
        x = x.shrink(tuple(bounds))
        if any(flips):
            x = x.flip(*[i for i, f in enumerate(flips) if f])
        if any(s != 1 for s in steps):
            x = x._strided(steps)
        final = []
        for kind, d in out_shape:
            if kind == "new":
                final.append(1)
            elif kind == "keep":
                final.append(x.shape[d])
        return x.reshape(tuple(final))

    def _strided(self, steps: list[int]) -> "Tensor":
        x = self
        for d, st in enumerate(steps):
            if st == 1 or x.shape[d] == 0:
                continue
            n = x.shape[d]
            m = -(-n // st)
            x = x.pad(tuple((0, m * st - n) if i == d else (0, 0) for i in range(x.ndim)))
            x = x.reshape(x.shape[:d] + (m, st) + x.shape[d + 1:])
            x = x.shrink(tuple((0, 1) if i == d + 1 else (0, s) for i, s in enumerate(x.shape)))
            x = x.reshape(x.shape[:d + 1] + x.shape[d + 2:])
        return x

    def __delitem__(self, index: Any) -> None:
        raise TypeError("tensors do not support deleting items; build the rest with indexing or masked_select")

    def _advanced_getitem(self: "Tensor", items: list) -> "Tensor":
        return advanced_getitem(self, items)

    def index_select(self: "Tensor", dim: int, index: Any) -> "Tensor":
        """Entries of `index` (1-d integers) along `dim` (torch.index_select)."""
        d = _axis(dim, self.ndim)
        # a tensor's own ndim: np.ndim(tensor) would go through __array_function__ and read it back (which a
        # Model capture refuses)
        if (index.ndim if isinstance(index, type(self)) else np.ndim(index)) > 1:
            raise ShapeError("index_select: index must be 0-d or 1-d")
        if self.ndim == 0:
            return self.reshape(1)[index].reshape(())
        return self[(slice(None),) * d + (index if not isinstance(index, type(self)) else index.reshape(-1),)]

    def __setitem__(self: "Tensor", index: Any, value: Any) -> None:
        """In-place write into a realized tensor: x[1:3] = 0, x[idx] = t (last write wins on duplicates)."""
        if self.requires_grad:
            raise RuntimeError("setitem on a tensor that requires grad is not supported; write into a "
                               "detached tensor or build the result with where()/pad()")
        if not isinstance(value, type(self)):
            value = type(self)(value, device=self.device, dtype=self.dtype, _runtime=self._runtime)
        self.realize()
        base = _buffer_of(self.uop)
        if base is None:
            raise RuntimeError("setitem needs a tensor backed by its own buffer; call .contiguous().realize()")
        check_writable(base, "setitem")
        items = list(index) if isinstance(index, tuple) else [index]
        value = value.cast(self.dtype)
        if base in value.uop.toposort():  # the value reads this buffer: snapshot it first
            value = value.contiguous().realize()
        if _is_plain_view(items):
            view = self[index]
            value = _fit(value, view.shape)
            type(self)(UOp(Ops.ASSIGN, self.dtype, (view.uop, value.uop)), _runtime=self._runtime).realize()
            return
        # the flat position (+1, so a lazy out-of-range index reads 0 and becomes -1: no write) of
        # every element the index selects, then one scatter in which the last duplicate wins
        n = self.numel()
        pos = type(self).arange(1, max(n, 1) + 1, device=self.device, dtype=dtypes.int32,
                                _runtime=self._runtime)
        pos = pos.shrink(((0, n),)).reshape(self.shape)[index]
        value = _fit(value, pos.shape).reshape(-1)
        if pos.numel() == 0:
            return
        new = scatter_last(self.reshape(-1), 0, pos.reshape(-1) - 1, value)
        self.assign(new.reshape(self.shape)).realize()

    def gather(self: "Tensor", dim: int, index: "Tensor") -> "Tensor":
        """torch.gather: out[i][j][k] = self[index[i][j][k]][j][k] (dim=0); index may be smaller than self
        outside dim. One indexed load per output element."""
        d = _axis(dim, self.ndim)
        if index.ndim != self.ndim:
            raise ShapeError(f"gather: index has {index.ndim} dims, input has {self.ndim}")
        if not index.dtype.is_int:
            raise TypeError(f"gather: index must be an integer tensor, got {index.dtype}")
        if any(i > s for k, (i, s) in enumerate(zip(index.shape, self.shape)) if k != d):
            raise ShapeError(f"gather: index shape {index.shape} exceeds input {self.shape} outside dim {d}")
        check_host_index(index, self.shape[d] if self.ndim else 1, d)
        x = self.shrink(tuple((0, i) if k != d else None for k, i in enumerate(index.shape)))
        return gather_prim(x, d, index)

    def scatter(self: "Tensor", dim: int, index: "Tensor", src: Any, reduce: str | None = None) -> "Tensor":
        """Out-of-place torch.scatter: out[..., index[i], ...] = src[i] along dim (the last duplicate wins)."""
        if not isinstance(src, type(self)):
            src = type(self).full(index.shape, src, dtype=self.dtype, device=self.device)
        if reduce is not None:
            table = {"add": "sum", "multiply": "prod"}
            if reduce not in table:
                raise InvalidArgumentError(f"scatter: reduce must be 'add' or 'multiply', got {reduce!r}")
            return self.scatter_reduce(dim, index, src, table[reduce], include_self=True)
        d, index, src = _scatter_parts(self, dim, index, src.cast(self.dtype))
        return scatter_last(self, d, index, src)

    def scatter_add(self: "Tensor", dim: int, index: "Tensor", src: "Tensor") -> "Tensor":
        """torch.scatter_add: sums src into self at index along dim."""
        return self.scatter_reduce(dim, index, src, "sum", include_self=True)

    def scatter_reduce(self: "Tensor", dim: int, index: "Tensor", src: "Tensor", reduce: str,
                       include_self: bool = True) -> "Tensor":
        """torch.scatter_reduce with reduce in 'sum', 'prod', 'mean', 'amax', 'amin'."""
        if reduce not in ("sum", "prod", "mean", "amax", "amin"):
            raise InvalidArgumentError(f"scatter_reduce: reduce must be 'sum', 'prod', 'mean', 'amax' or 'amin', "
                             f"got {reduce!r}")
        d, index, src = _scatter_parts(self, dim, index, src.cast(self.dtype))
        hit = _hit(self, d, index) if (not include_self or reduce == "mean") else None
        if reduce in ("amax", "amin"):
            flip = reduce == "amin"
            base, vals = (_order_flip(self), _order_flip(src)) if flip else (self, src)
            if not include_self:
                base = hit.where(dtype_min(base.dtype), base)
            out = scatter_prim(base, d, index, vals, Ops.MAX)
            return _order_flip(out) if flip else out
        acc = self.dtype if self.dtype is not dtypes.bool else dtypes.uint8
        base = self.cast(acc)
        if not include_self:
            base = hit.where(_REDUCE_IDENTITY[reduce], base)
        total = scatter_prim(base, d, index, src.cast(acc), Ops.MUL if reduce == "prod" else Ops.ADD)
        if reduce != "mean":
            return total.cast(self.dtype)
        count = scatter_prim(_fill(self, 1 if include_self else 0, acc), d, index, _fill(src, 1, acc), Ops.ADD)
        count = hit.where(count, 1)
        mean = total.div(count, rounding_mode="floor") if not self.dtype.is_float else total / count
        return hit.where(mean.cast(self.dtype), self)

    def masked_select(self: "Tensor", mask: Any, size: int | None = None, fill_value: Any = 0) -> "Tensor":
        """The elements where mask (broadcast to self) is True, as a 1-d tensor in row-major order.

        Without size= the length depends on the mask's values, so they are read on the host (a sync, as
        in torch). With size= nothing is read: the result has exactly `size` elements, the first
        min(count, size) selected ones followed by fill_value (as jax.numpy.extract(size=, fill_value=)).

        >>> Tensor([1, 2, 3]).masked_select(Tensor([True, False, True]), size=3).tolist()
        [1, 3, 0]
        """
        mask = mask if isinstance(mask, type(self)) else type(self)(mask, device=self.device, _runtime=self._runtime)
        if mask.dtype is not dtypes.bool:
            raise DTypeError(f"masked_select needs a bool mask, got {mask.dtype}; compare it (mask != 0) first")
        flat_mask = mask._broadcast_to(self.shape).reshape(-1)
        if size is None:
            flat = np.flatnonzero(flat_mask.numpy()).astype(np.int32)
            return take(self.reshape(-1), 0, type(self)(flat, device=self.device, _runtime=self._runtime))
        where = flat_mask.nonzero(size=size).reshape(-1)  # -1 past the last selected element
        return (where >= 0).where(take(self.reshape(-1), 0, where), fill_value).cast(self.dtype)

    def nonzero(self: "Tensor", as_tuple: bool = False, size: int | None = None, fill_value: int = -1) -> Any:
        """Coordinates of the non-zero elements, one row per element in row-major order: (count, ndim) int32.
        Without size= the count is read on the host (a sync). With size= nothing is read: the result has
        exactly `size` rows, the first min(count, size) filled and the rest set to fill_value (as
        jax.numpy.nonzero and torch.nonzero_static). as_tuple=True gives one 1-d tensor per dimension."""
        x = self.reshape(1) if self.ndim == 0 else self
        n = x.numel()
        it = dtypes.int64 if n > INT32_MAX else dtypes.int32
        hit = x.ne(0).reshape(-1)
        if size is None:
            size = int(hit.cast(it).sum().item())
        if size < 0:
            raise InvalidArgumentError(f"nonzero: size must be non-negative, got {size}")
        coords = [type(self).arange(s, device=x.device, dtype=it, _runtime=x._runtime).reshape(
            tuple(s if i == d else 1 for i, s in enumerate(x.shape)))._broadcast_to(x.shape).reshape(-1, 1)
            for d, s in enumerate(x.shape)]
        coords = coords[0].cat(*coords[1:], dim=1) if len(coords) > 1 else coords[0]
        rank = hit.cast(it).cumsum(0) - 1
        slot = (hit & (rank < size)).where(rank, -1).reshape(-1, 1)._broadcast_to(coords.shape)
        base = type(self).full((size, x.ndim), fill_value, dtype=it, device=x.device, _runtime=x._runtime)
        out = base.scatter(0, slot, coords) if n else base
        if self.ndim == 0:
            out = out[:, :0]
        return tuple(out[:, d] for d in range(out.shape[1])) if as_tuple else out

    def masked_scatter(self: "Tensor", mask: Any, source: "Tensor") -> "Tensor":
        """self with its masked positions (row-major) filled by the first elements of source (torch)."""
        mask = mask if isinstance(mask, type(self)) else type(self)(mask, device=self.device, _runtime=self._runtime)
        if mask.dtype is not dtypes.bool:
            raise TypeError(f"masked_scatter needs a bool mask, got {mask.dtype}")
        m = mask._broadcast_to(self.shape).reshape(-1)
        rank = m.cast(dtypes.int32).cumsum(0) - 1
        picked = take(source.reshape(-1).cast(self.dtype), 0, m.where(rank, -1))
        return m.where(picked, self.reshape(-1)).reshape(self.shape)

    def masked_fill_(self: "Tensor", mask: Any, value: Any) -> "Tensor":
        """In-place masked_fill (torch): writes into this tensor's buffer and returns it."""
        return self.assign(self.masked_fill(mask, value))

    def take_along_axis(self: "Tensor", indices: "Tensor", axis: int) -> "Tensor":
        """numpy.take_along_axis / torch.take_along_dim: gather with broadcasting outside `axis`."""
        if indices.ndim != self.ndim:
            raise ShapeError(f"take_along_axis: indices {indices.shape} and input {self.shape} need the same "
                             "number of dimensions")
        d = _axis(axis, self.ndim)
        shape = broadcast_shape(tuple(1 if i == d else s for i, s in enumerate(self.shape)),
                                tuple(1 if i == d else s for i, s in enumerate(indices.shape)))
        x = self.expand(tuple(self.shape[d] if i == d else s for i, s in enumerate(shape)))
        idx = indices.expand(tuple(indices.shape[d] if i == d else s for i, s in enumerate(shape)))
        idx = (idx < 0).where(idx + self.shape[d], idx) if not idx.dtype.is_unsigned else idx
        return x.gather(d, idx)

    take_along_dim = take_along_axis


def _fit(value: "Tensor", shape: tuple[int, ...]) -> "Tensor":
    """Broadcast a setitem value to the target shape; leading 1s beyond it are dropped (as in PyTorch)."""
    while value.ndim > len(shape) and value.shape[0] == 1:
        value = value.reshape(value.shape[1:])
    try:
        return value._broadcast_to(shape)
    except ValueError as e:
        raise ShapeError(f"setitem: a value of shape {value.shape} cannot fill a slot of shape {shape}") from e


def _is_plain_view(items: list) -> bool:
    """Ints, None, Ellipsis and slices of step +-1 map onto the buffer without padding."""
    for it in items:
        if isinstance(it, slice):
            if it.step not in (None, 1, -1):
                return False
        elif not (it is None or it is Ellipsis or (isinstance(it, (int, np.integer)) and not isinstance(it, bool))):
            return False
    return True


def _buffer_of(u: UOp) -> UOp | None:
    if u.op is Ops.RESHAPE:
        u = u.src[0]
    return u if u.op is Ops.BUFFER else None


def _symbolic_slice(it: slice, size: Any) -> tuple[Any, Any]:
    """(start, stop) of a step-1 slice whose size or endpoints are symbolic (no negative indices)."""
    if it.step not in (None, 1):
        raise InvalidArgumentError(f"a slice with a symbolic size or endpoint needs step 1, got step {it.step}")
    start = 0 if it.start is None else it.start
    stop = size if it.stop is None else it.stop
    for v in (start, stop):
        if not isinstance(v, UOp) and int(v) < 0:
            raise IndexError(f"negative slice index {v} next to a symbolic size; count from the start instead")
    return start, stop
