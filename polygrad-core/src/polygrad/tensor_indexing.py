"""Indexing with integer tensors, `__setitem__`, scatter and take_along_axis (a mixin of Tensor).

Stage: graph construction. Input: a Tensor and indices (ints, slices, None, Ellipsis, integer or
boolean tensors/lists/arrays). Output: Tensors built from one-hot comparisons against IOTA plus
WHERE and reductions, so they fuse into the consumer and stay differentiable in the data operand.
Out-of-range values inside a lazy index *tensor* cannot be checked without a device sync; they
select nothing (zeros), as in tinygrad. Lists and NumPy arrays are checked on the host.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from polygrad import runtime_context
from polygrad.dtype import dtypes
from polygrad.uop.ops import Ops, UOp
from polygrad.uop.shape import ShapeError

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
        raise IndexError(f"dimension {axis} is out of range for a tensor with {ndim} dimensions")
    return axis % n


def _to_indices(item: Any, device: str) -> list[_Index]:
    """An index item as integer indices: a boolean mask of k dims becomes k integer indices."""
    from polygrad.tensor import Tensor
    host = None
    if isinstance(item, Tensor):
        if item.dtype is dtypes.bool:
            host = item.numpy()
        elif not item.dtype.is_int:
            raise IndexError(f"tensors used as indices must be integer or bool tensors, got {item.dtype}")
        else:
            return [_Index(item.to(device), None)]
    else:
        host = np.asarray(item)
        if host.dtype == object or not (host.dtype.kind in "biu" or host.size == 0):
            raise IndexError(f"index lists must hold integers or bools, got {item!r}")
    if host.dtype == np.bool_:
        if host.ndim == 0:
            raise IndexError("0-d boolean indices are not supported; use a 1-element boolean list")
        # the result's shape depends on the mask's values, so they are read on the host (like PyTorch)
        return [_Index(Tensor(nz.astype(np.int32), device=device), nz) for nz in np.nonzero(host)]
    host = host.astype(np.int64)
    return [_Index(Tensor(host.astype(np.int32), device=device), host)]


def _expand_items(x: "Tensor", items: list) -> list:
    """Replace Ellipsis by full slices and append trailing full slices; check the index count."""
    from polygrad.tensor import Tensor
    consumes = [0 if (it is None or it is Ellipsis) else (
        max(np.ndim(it) if not isinstance(it, Tensor) else it.ndim, 1)
        if _is_bool_index(it) else 1) for it in items]
    n_real = sum(consumes)
    if n_real > x.ndim:
        raise IndexError(f"too many indices ({n_real}) for a tensor with {x.ndim} dimensions")
    if sum(1 for it in items if it is Ellipsis) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    fill = [slice(None)] * (x.ndim - n_real)
    if any(it is Ellipsis for it in items):
        at = next(i for i, it in enumerate(items) if it is Ellipsis)
        return items[:at] + fill + items[at + 1:]
    return items + fill


def _is_bool_index(it: Any) -> bool:
    from polygrad.tensor import Tensor
    if isinstance(it, Tensor):
        return it.dtype is dtypes.bool
    if isinstance(it, (list, np.ndarray)):
        return np.asarray(it).dtype == np.bool_
    return False


def _is_advanced(it: Any) -> bool:
    from polygrad.tensor import Tensor
    return isinstance(it, (Tensor, list, np.ndarray))


def _check_host_bounds(idx: _Index, size: int, dim: int) -> None:
    if idx.host is None or idx.host.size == 0:
        return
    lo, hi = int(idx.host.min()), int(idx.host.max())
    if lo < -size or hi >= size:
        bad = lo if lo < -size else hi
        raise IndexError(f"index {bad} is out of bounds for dimension {dim} with size {size}")


def advanced_getitem(x: "Tensor", items: list) -> "Tensor":
    """x[items] where some items are integer/bool tensors or lists (PyTorch semantics)."""
    from polygrad.tensor import broadcast_shape
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
                indices = _to_indices(it, x.device)
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
    idxs = []
    for (p, idx), s in zip(index_of_dim, sizes):
        t = idx.tensor
        idxs.append((t < 0).where(t + s, t) if not t.dtype.is_unsigned else t)
    bshape = broadcast_shape(*[t.shape for t in idxs])
    rest = [i for i in range(y.ndim) if i not in positions]
    flat_size = math.prod(sizes)
    y = y.permute(rest + positions).reshape(tuple(y.shape[i] for i in rest) + (flat_size,))
    flat = None
    for t, stride in zip(idxs, _strides(sizes)):
        term = t.cast(dtypes.int32)._broadcast_to(bshape) * stride
        flat = term if flat is None else flat + term
    out = _select(y, flat, len(rest))
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


def _select(y: "Tensor", flat: "Tensor", n_rest: int) -> "Tensor":
    """y: (*rest, S); flat: integer positions of shape B -> (*B, *rest) holding y[..., flat]."""
    from polygrad.tensor import Tensor
    s = y.shape[-1]
    bshape = flat.shape
    onehot = flat.unsqueeze(-1).eq(Tensor.arange(s, device=y.device, dtype=dtypes.int32))  # (*B, S)
    onehot = onehot.reshape(bshape + (1,) * n_rest + (s,))
    yb = y.reshape((1,) * len(bshape) + y.shape)
    picked = onehot.where(yb, yb.zeros_like() if y.dtype is not dtypes.bool else False)
    return _sum_exact(picked, -1)


def _any(x: "Tensor", axis: int) -> "Tensor":
    """Logical or along one axis."""
    return x.cast(dtypes.uint8).max(axis).cast(dtypes.bool)


def _sum_exact(x: "Tensor", axis: int) -> "Tensor":
    """Sum where at most one element is non-zero, keeping the dtype (bool included)."""
    if x.dtype is dtypes.bool:
        return x.cast(dtypes.uint8).sum(axis, dtype=dtypes.uint8).cast(dtypes.bool)
    return x.sum(axis, dtype=x.dtype)


# -------------------------------------------------------------------------------------------------
# scatter helpers

def _scatter_parts(x: "Tensor", dim: int, index: "Tensor", src: "Tensor"):
    """One-hot mask (index.shape + (n,)) plus the source cut to index.shape, for scatter ops."""
    from polygrad.tensor import Tensor
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
    n = x.shape[d]
    src = src.shrink(tuple((0, a) for a in index.shape))
    mask = index.unsqueeze(-1).eq(Tensor.arange(n, device=x.device, dtype=index.dtype))
    return d, mask, src.unsqueeze(-1)


def _place(x: "Tensor", reduced: "Tensor", d: int) -> "Tensor":
    """(index dims without d, n) -> x's shape: axis n moves to d, the rest pads to x's sizes."""
    from polygrad.tensor_movement import move_axis
    r = move_axis(reduced, reduced.ndim - 1, d)
    return r.pad(tuple((0, s - a) for a, s in zip(r.shape, x.shape)))


def _last_hit(mask: "Tensor", d: int) -> "Tensor":
    """Keep only the last True along d of the one-hot mask (duplicate indices: the last write wins)."""
    from polygrad.tensor import Tensor
    k = mask.shape[d]
    pos = Tensor.arange(k, device=mask.device, dtype=dtypes.int32).reshape(
        tuple(k if i == d else 1 for i in range(mask.ndim)))
    last = mask.where(pos, -1).max(d, keepdim=True)
    return mask & pos.eq(last)


_REDUCE_IDENTITY = {"sum": 0, "mean": 0, "prod": 1}


def _extreme(dt: Any, reduce: str) -> Any:
    from polygrad.dtype import dtype_max, dtype_min
    return dtype_min(dt) if reduce == "amax" else dtype_max(dt)


class IndexingMixin:
    __slots__ = ()

    def _advanced_getitem(self: "Tensor", items: list) -> "Tensor":
        return advanced_getitem(self, items)

    def index_select(self: "Tensor", dim: int, index: Any) -> "Tensor":
        """Entries of `index` (1-d integers) along `dim` (torch.index_select)."""
        from polygrad.tensor import Tensor
        d = _axis(dim, self.ndim)
        if isinstance(index, Tensor) and index.ndim > 1 or np.ndim(index) > 1:
            raise ShapeError("index_select: index must be 0-d or 1-d")
        if self.ndim == 0:
            return self.reshape(1)[index].reshape(())
        return self[(slice(None),) * d + (index if not isinstance(index, Tensor) else index.reshape(-1),)]

    def __setitem__(self: "Tensor", index: Any, value: Any) -> None:
        """In-place write into a realized tensor: x[1:3] = 0, x[idx] = t (last write wins on duplicates)."""
        from polygrad.tensor import Tensor
        if self.requires_grad:
            raise RuntimeError("setitem on a tensor that requires grad is not supported; write into a "
                               "detached tensor or build the result with where()/pad()")
        if not isinstance(value, Tensor):
            value = Tensor(value, device=self.device, dtype=self.dtype, _runtime=self._runtime)
        self.realize()
        base = _buffer_of(self.uop)
        if base is None:
            raise RuntimeError("setitem needs a tensor backed by its own buffer; call .contiguous().realize()")
        items = list(index) if isinstance(index, tuple) else [index]
        value = value.cast(self.dtype)
        if base in value.uop.toposort():  # the value reads this buffer: snapshot it first
            value = value.contiguous().realize()
        if _is_plain_view(items):
            view = self[index]
            value = _fit(value, view.shape)
            Tensor(UOp(Ops.ASSIGN, self.dtype, (view.uop, value.uop)), _runtime=self._runtime).realize()
            return
        pos = Tensor.arange(max(self.numel(), 1), device=self.device, dtype=dtypes.int32, _runtime=self._runtime)
        pos = pos.shrink(((0, self.numel()),)).reshape(self.shape)[index]
        value = _fit(value, pos.shape).reshape(1, -1)
        mask = pos.reshape(-1, 1).eq(Tensor.arange(max(self.numel(), 1), device=self.device,
                                                   dtype=dtypes.int32).shrink(((0, self.numel()),)))
        mask = _last_hit(mask, 0)
        picked = mask.where(value.reshape(-1, 1), value.zeros_like().reshape(-1, 1))
        new = _any(mask, 0).where(_sum_exact(picked, 0), self.reshape(-1)) if mask.shape[0] else self.reshape(-1)
        self.assign(new.reshape(self.shape)).realize()

    def scatter(self: "Tensor", dim: int, index: "Tensor", src: Any, reduce: str | None = None) -> "Tensor":
        """Out-of-place torch.scatter: out[..., index[i], ...] = src[i] along dim (the last duplicate wins)."""
        from polygrad.tensor import Tensor
        if not isinstance(src, Tensor):
            src = Tensor.full(index.shape, src, dtype=self.dtype, device=self.device)
        if reduce is not None:
            table = {"add": "sum", "multiply": "prod"}
            if reduce not in table:
                raise ValueError(f"scatter: reduce must be 'add' or 'multiply', got {reduce!r}")
            return self.scatter_reduce(dim, index, src, table[reduce], include_self=True)
        d, mask, src = _scatter_parts(self, dim, index, src.cast(self.dtype))
        mask = _last_hit(mask, d)
        zero = src.zeros_like() if self.dtype is not dtypes.bool else False
        values = _sum_exact(mask.where(src, zero), d)
        hit = _place(self, _any(mask, d), d)
        return hit.where(_place(self, values, d), self)

    def scatter_add(self: "Tensor", dim: int, index: "Tensor", src: "Tensor") -> "Tensor":
        """torch.scatter_add: sums src into self at index along dim."""
        return self.scatter_reduce(dim, index, src, "sum", include_self=True)

    def scatter_reduce(self: "Tensor", dim: int, index: "Tensor", src: "Tensor", reduce: str,
                       include_self: bool = True) -> "Tensor":
        """torch.scatter_reduce with reduce in 'sum', 'prod', 'mean', 'amax', 'amin'."""
        if reduce not in ("sum", "prod", "mean", "amax", "amin"):
            raise ValueError(f"scatter_reduce: reduce must be 'sum', 'prod', 'mean', 'amax' or 'amin', "
                             f"got {reduce!r}")
        d, mask, src = _scatter_parts(self, dim, index, src.cast(self.dtype))
        hit = _place(self, _any(mask, d), d)
        if reduce in ("amax", "amin"):
            fill = _extreme(self.dtype, reduce)
            vals = mask.where(src, fill)
            part = vals.max(d) if reduce == "amax" else vals.min(d)
            part = _place(self, part, d)
            combined = self.maximum(part) if reduce == "amax" else self.minimum(part)
            return hit.where(combined if include_self else part, self)
        identity = _REDUCE_IDENTITY[reduce]
        vals = mask.where(src, identity)
        part = _place(self, vals.prod(d) if reduce == "prod" else vals.sum(d, dtype=self.dtype), d)
        base = self if include_self else hit.where(identity, self)
        if reduce == "prod":
            return base * hit.where(part, 1)
        total = base + part
        if reduce == "sum":
            return total
        count = _place(self, mask.cast(self.dtype).sum(d, dtype=self.dtype), d) + (1 if include_self else 0)
        count = hit.where(count, 1)
        mean = total.div(count, rounding_mode="floor") if not self.dtype.is_float else total / count
        return hit.where(mean.cast(self.dtype), self)

    def take_along_axis(self: "Tensor", indices: "Tensor", axis: int) -> "Tensor":
        """numpy.take_along_axis / torch.take_along_dim: gather with broadcasting outside `axis`."""
        from polygrad.tensor import broadcast_shape
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
