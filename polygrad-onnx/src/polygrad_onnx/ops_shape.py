"""Shape and data-movement operators: Shape, Reshape, Transpose, Concat, Slice, Gather, Pad, Expand, ...

Stage: operator implementations (graph.py runs them). Input: a Node, its data inputs as Tensors (or NumPy
arrays, host versions) and its load-time inputs (shapes, axes, pads, starts) as NumPy arrays. Output:
Tensors or arrays. Shapes may hold symbolic sizes (a Variable's dimension): they pass through Shape,
Gather, Concat, arithmetic and Reshape unchanged.
"""
from __future__ import annotations

import numpy as np

from polygrad import Tensor, dtypes
from polygrad.uop import sint

from polygrad_onnx.node import Node, as_tensor, ints_of, op, pg_dtype, size_tensor
from polygrad_onnx.reader import tensor_array


def _axis(axis: int, rank: int, node: Node) -> int:
    if not -rank <= axis < max(rank, 1):
        raise node.fail(f"axis {axis} is out of range for rank {rank}")
    return axis % rank if rank else 0


def _shape_array(dims: tuple) -> np.ndarray:
    if all(isinstance(d, int) for d in dims):
        return np.array(dims, dtype=np.int64)
    return np.array(list(dims), dtype=object)


# ---- shapes and constants
@op("Shape", any_input=True)
def shape(node: Node, x) -> np.ndarray:
    dims = tuple(x.shape)
    start, end = node.attr("start", 0), node.attr("end", None)
    return _shape_array(dims[slice(start, end)])


@op("Size", any_input=True)
def size(node: Node, x) -> np.ndarray:
    n = sint.sprod(x.shape)
    return np.array(n, dtype=np.int64) if isinstance(n, int) else np.array(n, dtype=object)


def _constant(node: Node) -> np.ndarray:
    for name in ("value", "value_float", "value_floats", "value_int", "value_ints"):
        if name in node.attrs:
            v = node.attr(name)
            if name == "value":
                return tensor_array(v)
            return np.array(v, dtype=np.float32 if "float" in name else np.int64)
    raise node.fail(f"only value/value_float(s)/value_int(s) constants are supported, got {sorted(node.attrs)}")


op("Constant", host=_constant)(_constant)


def _constant_of_shape(node: Node, dims: np.ndarray) -> np.ndarray:
    v = node.attr("value")
    fill = tensor_array(v).reshape(-1) if v is not None else np.zeros(1, np.float32)
    return np.full(tuple(ints_of(dims)), fill[0], dtype=fill.dtype)


def constant_of_shape(node: Node, dims: np.ndarray):
    """A host array for a fixed shape; a Tensor when the shape holds a symbolic size (torch's zero initial
    state of an LSTM, shaped by the batch), which NumPy cannot hold."""
    out = tuple(ints_of(dims))
    if all(isinstance(d, int) for d in out):
        return _constant_of_shape(node, dims)
    v = node.attr("value")
    fill = tensor_array(v).reshape(-1) if v is not None else np.zeros(1, np.float32)
    return Tensor.full(out, fill[0].item(), dtype=dtypes.from_np(fill.dtype))


op("ConstantOfShape", static=(0,), host=constant_of_shape)(constant_of_shape)


def _range_host(node: Node, start, limit, delta) -> np.ndarray:
    s, lim, d = (np.asarray(v).reshape(()).item() for v in (start, limit, delta))
    n = max(int(np.ceil((lim - s) / d)), 0)
    return (np.asarray(start).reshape(()) + np.arange(n, dtype=np.asarray(start).dtype) * np.asarray(delta)).astype(
        np.asarray(start).dtype)


def _range_host_or_symbolic(node: Node, start, limit, delta):
    if any(sint.is_sym(v) for v in ints_of(start) + ints_of(limit) + ints_of(delta)):
        return range_(node, start, limit, delta)
    return _range_host(node, start, limit, delta)


@op("Range", static=(0, 1, 2), host=_range_host_or_symbolic)
def range_(node: Node, start, limit, delta):
    """Range; a symbolic limit (arange(seq)) is the range up to its largest value, cut to its length."""
    (s,), (lim,), (d,) = ints_of(start), ints_of(limit), ints_of(delta)
    if not any(sint.is_sym(v) for v in (s, lim, d)):
        return _range_host(node, start, limit, delta)
    if sint.is_sym(s) or sint.is_sym(d) or d <= 0:
        raise node.fail(f"a Range with a symbolic bound needs a constant start and a positive constant delta, got "
                        f"start {sint.sym_str(s)}, delta {sint.sym_str(d)}")
    count = sint.sdiv(sint.sadd(lim, d - 1 - s), d)
    if sint.vmin(count) < 0:
        raise node.fail(f"a Range from {s} to {sint.sym_str(lim)} can be empty or negative for some sizes; "
                        "raise the lower bound of its dimension")
    dtype = np.asarray(start).dtype
    full = Tensor.arange(sint.vmax(count), dtype=dtypes.from_np(dtype)) * d + s
    return full.shrink(((0, count),))


@op("EyeLike")
def eye_like(node: Node, x: Tensor) -> Tensor:
    k = node.attr("k", 0)
    dt = pg_dtype(node.attr("dtype"), node) if node.attr("dtype") is not None else x.dtype
    n, m = x.shape
    rows, cols = Tensor.arange(n).reshape(n, 1), Tensor.arange(m).reshape(1, m)
    return (cols - rows == k).cast(dt)


# ---- reshaping
def _reshape_dims(node: Node, in_shape: tuple, target: list) -> list:
    """The Reshape target with its 0 entries copied from the input (unless allowzero); a -1 stays for the
    reshape to infer (Tensor.reshape and NumPy both do, symbolic sizes too)."""
    allowzero = node.attr("allowzero", 0)
    dims = [in_shape[i] if isinstance(d, int) and d == 0 and not allowzero else d for i, d in enumerate(target)]
    if sum(1 for d in dims if isinstance(d, int) and d == -1) > 1:
        raise node.fail(f"shape {target} has more than one -1")
    return dims


@op("Reshape", static=(1,), host=lambda node, x, s: x.reshape(tuple(_reshape_dims(node, x.shape, ints_of(s)))))
def reshape(node: Node, x: Tensor, target: np.ndarray) -> Tensor:
    return x.reshape(tuple(_reshape_dims(node, x.shape, ints_of(target))))


def _flatten_dims(node: Node, dims: tuple) -> tuple:
    axis = node.attr("axis", 1)
    axis = axis + len(dims) if axis < 0 else axis
    return (sint.sprod(dims[:axis]), sint.sprod(dims[axis:]))


op("Flatten", host=lambda node, x: x.reshape(_flatten_dims(node, x.shape)))(
    lambda node, x: x.reshape(_flatten_dims(node, x.shape)))


def _perm(node: Node, rank: int) -> list[int]:
    perm = node.ints("perm")
    return list(range(rank))[::-1] if perm is None else [p % rank for p in perm]


@op("Transpose", host=lambda node, x: np.transpose(x, _perm(node, x.ndim)))
def transpose(node: Node, x: Tensor) -> Tensor:
    return x.permute(*_perm(node, x.ndim))


def _axes_arg(node: Node, given, attr_name: str = "axes") -> list[int] | None:
    if given is not None:
        return ints_of(given)
    return node.ints(attr_name)


def _squeeze_axes(node: Node, x, axes) -> tuple:
    axes = _axes_arg(node, axes)
    shape_ = tuple(x.shape)
    if axes is None:
        return tuple(d for d in shape_ if not (isinstance(d, int) and d == 1))
    axes = {_axis(a, len(shape_), node) for a in axes}
    return tuple(d for i, d in enumerate(shape_) if i not in axes)


op("Squeeze", static=(1,), host=lambda node, x, axes=None: x.reshape(_squeeze_axes(node, x, axes)))(
    lambda node, x, axes=None: x.reshape(_squeeze_axes(node, x, axes)))


def _unsqueeze_shape(node: Node, x, axes) -> tuple:
    axes = _axes_arg(node, axes)
    rank = x.ndim + len(axes)
    axes = sorted(_axis(a, rank, node) for a in axes)
    dims = list(x.shape)
    for a in axes:
        dims.insert(a, 1)
    return tuple(dims)


op("Unsqueeze", static=(1,), host=lambda node, x, axes=None: x.reshape(_unsqueeze_shape(node, x, axes)))(
    lambda node, x, axes=None: x.reshape(_unsqueeze_shape(node, x, axes)))


def _concat_host(node: Node, *xs: np.ndarray) -> np.ndarray:
    axis = node.attr("axis")
    xs = [x for x in xs if x is not None]
    return np.concatenate(xs, axis=_axis(axis, xs[0].ndim, node))


@op("Concat", host=_concat_host)
def concat(node: Node, *xs: Tensor) -> Tensor:
    xs = [x for x in xs if x is not None]
    axis = _axis(node.attr("axis"), xs[0].ndim, node)
    nonempty = [x for x in xs if not (isinstance(x.shape[axis], int) and x.shape[axis] == 0)]
    if not nonempty:
        return xs[0]
    return nonempty[0].cat(*nonempty[1:], dim=axis) if len(nonempty) > 1 else nonempty[0]


@op("Split", static=(1,))
def split(node: Node, x: Tensor, sizes: np.ndarray | None = None) -> tuple:
    axis = _axis(node.attr("axis", 0), x.ndim, node)
    dim = x.shape[axis]
    parts = ints_of(sizes) if sizes is not None else node.ints("split")
    count = node.attr("num_outputs", None)
    if parts is None:
        n = count if count is not None else len(node.proto.output)
        step = -(-dim // n)
        parts = [min(step, dim - i * step) for i in range(n)]
    out, start = [], 0
    for p in parts:
        out.append(x.shrink(tuple((start, start + p) if i == axis else None for i in range(x.ndim))))
        start += p
    return tuple(out)


def _symbolic_slice(node: Node, dim, s, e, st) -> slice:
    """A step-1 slice whose size or bounds are symbolic; ends that reach or pass the axis's end are open.

    A symbolic bound must stay inside the axis for every value of its variables (ONNX clamps, a symbolic
    size cannot be clamped), e.g. positions[:, :seq] of a table of max_position_embeddings rows."""
    if isinstance(e, int) and e >= 2 ** 31 - 1 or sint.is_sym(e) and sint.sym_equal(e, dim):
        e = None
    if st != 1 or any(isinstance(v, int) and v < 0 for v in (s, e)):
        raise node.fail(f"slicing {dim} from {s} to {e} needs step 1 and non-negative bounds (a symbolic size "
                        f"cannot be counted from the end), got step {st}")
    for v in (s, e):
        if sint.is_sym(v) and not sint.is_sym(dim) and sint.vmax(v) > dim:
            raise node.fail(f"the slice bound {sint.sym_str(v)} can reach {sint.vmax(v)}, past this axis's size "
                            f"{dim}; load the model with a smaller bound for its dimension (<= {dim})")
    return slice(s if s != 0 else None, e)


def _slices(node: Node, shape_: tuple, starts, ends, axes, steps) -> tuple:
    starts, ends = ints_of(starts), ints_of(ends)
    axes = ints_of(axes) if axes is not None else list(range(len(starts)))
    steps = ints_of(steps) if steps is not None else [1] * len(starts)
    out = [slice(None)] * len(shape_)
    for s, e, a, st in zip(starts, ends, axes, steps):
        a = _axis(a, len(shape_), node)
        if st == 0:
            raise node.fail("a Slice step is 0")
        dim = shape_[a]
        if any(sint.is_sym(v) for v in (dim, s, e)):
            out[a] = _symbolic_slice(node, dim, s, e, st)
            continue
        lo, hi, stp = slice(s, e, st).indices(dim)
        out[a] = slice(lo, None if hi < 0 else hi, stp)
    return tuple(out)


def _slice_host(node: Node, x: np.ndarray, starts, ends, axes=None, steps=None):
    """Slice of a value known at load; symbolic bounds make it a Tensor (its length is a symbolic size)."""
    if any(sint.is_sym(v) for v in ints_of(starts) + ints_of(ends)):
        return slice_(node, as_tensor(x, node), starts, ends, axes, steps)
    return x[_slices(node, x.shape, starts, ends, axes, steps)]


@op("Slice", static=(1, 2, 3, 4), host=_slice_host)
def slice_(node: Node, x: Tensor, starts, ends, axes=None, steps=None) -> Tensor:
    idx = _slices(node, x.shape, starts, ends, axes, steps)
    for a, sl in enumerate(idx):
        dim = x.shape[a]
        if isinstance(dim, int) and all(not sint.is_sym(v) for v in (sl.start, sl.stop)) and \
                len(range(*sl.indices(dim))) == 0:
            return x.shrink(tuple((0, 0) if i == a else None for i in range(x.ndim)))
    return x[idx]


def _gather_host(node: Node, x: np.ndarray, idx: np.ndarray) -> np.ndarray:
    axis = _axis(node.attr("axis", 0), x.ndim, node)
    return np.take(x, idx.astype(np.int64), axis=axis)


def _wrap_negative(idx: Tensor, n) -> Tensor:
    """int32 indices into an axis of size n (symbolic too), negative ones counted from its end.

    They are clamped to [-n-1, n] first (for a symbolic n, its largest value), which keeps an index out of
    range out of range and the index arithmetic free of overflow, as polygrad-js's validator must prove."""
    top = sint.vmax(n)
    if dtypes.is_unsigned(idx.dtype):
        return idx.minimum(top).cast(dtypes.int32)
    idx = idx.clip(-top - 1, top).cast(dtypes.int32)
    size = size_tensor(n).reshape(()).cast(dtypes.int32) if sint.is_sym(n) else n
    return (idx < 0).where(idx + size, idx)


@op("Gather", host=_gather_host)
def gather(node: Node, x: Tensor, idx: Tensor) -> Tensor:
    axis = _axis(node.attr("axis", 0), x.ndim, node)
    idx = _wrap_negative(idx, x.shape[axis])
    # one torch-style gather with the index broadcast over the other axes (as index_select, but the axis
    # may be symbolic: negative indices are wrapped above)
    pre, post = tuple(x.shape[:axis]), tuple(x.shape[axis + 1:])
    n = sint.sprod(idx.shape)
    flat = idx.reshape(n).reshape((1,) * len(pre) + (n,) + (1,) * len(post))
    out = x.gather(axis, flat.expand(*pre, n, *post))
    return out.reshape(pre + tuple(idx.shape) + post)


@op("GatherElements")
def gather_elements(node: Node, x: Tensor, idx: Tensor) -> Tensor:
    axis = _axis(node.attr("axis", 0), x.ndim, node)
    return x.gather(axis, _wrap_negative(idx, x.shape[axis]))


@op("GatherND")
def gather_nd(node: Node, x: Tensor, idx: Tensor) -> Tensor:
    b = node.attr("batch_dims", 0)
    k = idx.shape[-1]
    batch = tuple(x.shape[:b])
    nb = int(np.prod(batch)) if batch else 1
    rest = tuple(x.shape[b + k:])
    flat_x = x.reshape(nb * int(np.prod(x.shape[b:b + k])), *rest) if rest else x.reshape(-1)
    strides = [int(np.prod(x.shape[b + i + 1:b + k])) for i in range(k)]
    dims = Tensor(np.array(x.shape[b:b + k], dtype=np.int64))
    idx = idx.cast(dtypes.int64)
    idx = (idx < 0).where(idx + dims, idx)
    lin = (idx * Tensor(np.array(strides, dtype=np.int64))).sum(-1)
    batch_idx = idx.shape[b:-1]
    offset = Tensor.arange(nb, dtype=dtypes.int64).reshape(nb, *([1] * len(batch_idx))) * int(
        np.prod(x.shape[b:b + k]))
    lin = lin.reshape(nb, *batch_idx) + offset
    out = flat_x.index_select(0, lin.reshape(-1).cast(dtypes.int32))
    return out.reshape(*idx.shape[:-1], *rest)


def _expand_shape(node: Node, shape_: tuple, target: list) -> tuple:
    rank = max(len(shape_), len(target))
    a = [1] * (rank - len(shape_)) + list(shape_)
    b = [1] * (rank - len(target)) + list(target)
    out = []
    for da, db in zip(a, b):
        if isinstance(db, int) and db == 1:
            out.append(da)
        elif isinstance(da, int) and da == 1:
            out.append(db)
        elif da is db or (isinstance(da, int) and isinstance(db, int) and da == db):
            out.append(da)
        else:
            raise node.fail(f"cannot expand shape {tuple(shape_)} to {tuple(target)}")
    return tuple(out)


@op("Expand", static=(1,), host=lambda node, x, s: np.broadcast_to(x, _expand_shape(node, x.shape, ints_of(s))))
def expand(node: Node, x: Tensor, target: np.ndarray) -> Tensor:
    out = _expand_shape(node, x.shape, ints_of(target))
    return x.reshape((1,) * (len(out) - x.ndim) + tuple(x.shape)).expand(*out)


@op("Tile", static=(1,), host=lambda node, x, r: np.tile(x, ints_of(r)))
def tile(node: Node, x: Tensor, repeats: np.ndarray) -> Tensor:
    return x.repeat(*ints_of(repeats))


PAD_MODES = {"constant": "constant", "reflect": "reflect", "edge": "replicate", "wrap": "circular"}


@op("Pad", static=(1, 2, 3))
def pad(node: Node, x: Tensor, pads: np.ndarray, value: np.ndarray | None = None, axes: np.ndarray | None = None):
    mode = PAD_MODES[node.only("mode", tuple(PAD_MODES), "constant")]
    pads = ints_of(pads)
    axes = [_axis(a, x.ndim, node) for a in ints_of(axes)] if axes is not None else list(range(x.ndim))
    if len(pads) != 2 * len(axes):
        raise node.fail(f"pads has {len(pads)} entries for {len(axes)} axes")
    pairs = [(0, 0)] * x.ndim
    for i, a in enumerate(axes):
        pairs[a] = (pads[i], pads[i + len(axes)])
    fill = np.asarray(value).reshape(-1)[0].item() if value is not None and np.asarray(value).size else 0
    if mode == "constant":
        return x.pad(tuple(pairs), value=fill)
    return x.pad(tuple(pairs), mode=mode)


@op("Trilu", static=(1,))
def trilu(node: Node, x: Tensor, k: np.ndarray | None = None) -> Tensor:
    diag = int(np.asarray(k).reshape(-1)[0]) if k is not None else 0
    return x.triu(diag) if node.attr("upper", 1) else x.tril(diag)


@op("DepthToSpace")
def depth_to_space(node: Node, x: Tensor) -> Tensor:
    b = node.attr("blocksize")
    mode = node.only("mode", ("DCR", "CRD"), "DCR")
    n, c, h, w = x.shape
    if mode == "DCR":
        y = x.reshape(n, b, b, c // (b * b), h, w).permute(0, 3, 4, 1, 5, 2)
    else:
        y = x.reshape(n, c // (b * b), b, b, h, w).permute(0, 1, 4, 2, 5, 3)
    return y.reshape(n, c // (b * b), h * b, w * b)


@op("SpaceToDepth")
def space_to_depth(node: Node, x: Tensor) -> Tensor:
    b = node.attr("blocksize")
    mode = node.only("mode", ("DCR", "CRD"), "DCR")
    n, c, h, w = x.shape
    y = x.reshape(n, c, h // b, b, w // b, b)
    y = y.permute(0, 3, 5, 1, 2, 4) if mode == "DCR" else y.permute(0, 1, 3, 5, 2, 4)
    return y.reshape(n, c * b * b, h // b, w // b)


@op("OneHot", static=(1,))
def one_hot(node: Node, idx: Tensor, depth: np.ndarray, values: Tensor) -> Tensor:
    d = int(np.asarray(depth).reshape(-1)[0])
    axis = node.attr("axis", -1)
    rank = idx.ndim + 1
    axis = _axis(axis, rank, node)
    idx = idx.cast(dtypes.int64)
    idx = (idx < 0).where(idx + d, idx)
    shape_ = [1] * rank
    shape_[axis] = d
    classes = Tensor.arange(d, dtype=dtypes.int64).reshape(*shape_)
    hot = idx.unsqueeze(axis) == classes
    return hot.where(values[1], values[0])


@op("ScatterElements", "Scatter")
def scatter_elements(node: Node, x: Tensor, idx: Tensor, upd: Tensor) -> Tensor:
    axis = _axis(node.attr("axis", 0), x.ndim, node)
    reduction = node.only("reduction", ("none", "add", "mul", "max", "min"), "none")
    idx = _wrap_negative(idx, x.shape[axis])
    if reduction == "none":
        return x.scatter(axis, idx, upd)
    return x.scatter_reduce(axis, idx, upd, {"add": "sum", "mul": "prod", "max": "amax", "min": "amin"}[reduction])


@op("ScatterND")
def scatter_nd(node: Node, x: Tensor, idx: Tensor, upd: Tensor) -> Tensor:
    reduction = node.only("reduction", ("none", "add", "mul", "max", "min"), "none")
    k = idx.shape[-1]
    rest = tuple(x.shape[k:])
    inner = int(np.prod(rest)) if rest else 1
    strides = [int(np.prod(x.shape[i + 1:k])) for i in range(k)]
    lin = (idx.cast(dtypes.int64) * Tensor(np.array(strides, dtype=np.int64))).sum(-1).reshape(-1)
    flat = x.reshape(-1, inner)
    u = upd.reshape(-1, inner)
    index = lin.reshape(-1, 1).expand(lin.shape[0], inner).cast(dtypes.int32)
    if reduction == "none":
        out = flat.scatter(0, index, u)
    else:
        out = flat.scatter_reduce(0, index, u, {"add": "sum", "mul": "prod", "max": "amax", "min": "amin"}[reduction])
    return out.reshape(x.shape)


@op("Compress", static=(1,))
def compress(node: Node, x: Tensor, cond: np.ndarray) -> Tensor:
    axis = node.attr("axis", None)
    keep = np.nonzero(np.asarray(cond).reshape(-1))[0]
    if axis is None:
        x, axis = x.reshape(-1), 0
    axis = _axis(axis, x.ndim, node)
    return x.index_select(axis, Tensor(keep.astype(np.int32)))

