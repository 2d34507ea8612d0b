"""Neural-network operators: Gemm/MatMul, Conv/ConvTranspose, pools, normalizations, softmax, reductions.

Stage: operator implementations (graph.py runs them). Input: a Node, its data inputs as Tensors and its
load-time inputs (axes, k) as NumPy arrays. Output: Tensors. Padding is applied explicitly (ONNX pads may
differ at the two ends), and pooled output sizes follow ONNX's formula (ceil_mode included), so no
operator depends on another framework's padding conventions.
"""
from __future__ import annotations

import math

import numpy as np

from polygrad import Tensor, dtypes

from polygrad_onnx.node import Node, ints_of, op
from polygrad_onnx.ops_shape import _axis


# ---- matrix products
@op("MatMul")
def matmul(node: Node, a: Tensor, b: Tensor) -> Tensor:
    return a.matmul(b)


@op("Gemm")
def gemm(node: Node, a: Tensor, b: Tensor, c: Tensor | None = None) -> Tensor:
    alpha, beta = node.attr("alpha", 1.0), node.attr("beta", 1.0)
    a = a.T if node.attr("transA", 0) else a
    b = b.T if node.attr("transB", 0) else b
    y = a.matmul(b)
    y = y * alpha if alpha != 1.0 else y
    if c is not None:
        y = y + (c * beta if beta != 1.0 else c)
    return y


@op("Einsum")
def einsum(node: Node, *xs: Tensor) -> Tensor:
    return Tensor.einsum(node.attr("equation").replace(" ", ""), *xs)


# ---- convolution and pooling geometry
def _spatial(node: Node, in_sizes: tuple, kernel: list[int], strides: list[int], dil: list[int],
             ceil_mode: bool = False) -> tuple[list[tuple[int, int]], list[int]]:
    """((begin, end) pads, output sizes) per spatial axis by ONNX's rules."""
    nd = len(kernel)
    auto = node.only("auto_pad", ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"), "NOTSET")
    given = node.ints("pads") or [0] * (2 * nd)
    pads, outs = [], []
    for i in range(nd):
        n, dk, s = in_sizes[i], (kernel[i] - 1) * dil[i] + 1, strides[i]
        if auto in ("SAME_UPPER", "SAME_LOWER"):
            out = -(-n // s)
            total = max((out - 1) * s + dk - n, 0)
            small, big = total // 2, total - total // 2
            pads.append((small, big) if auto == "SAME_UPPER" else (big, small))
            outs.append(out)
            continue
        b, e = (0, 0) if auto == "VALID" else (given[i], given[i + nd])
        span = n + b + e - dk
        out = (-(-span // s) if ceil_mode else span // s) + 1
        if ceil_mode and (out - 1) * s >= n + b:
            out -= 1
        pads.append((b, e))
        outs.append(out)
    return pads, outs


def _geometry(node: Node, x: Tensor, kernel: list[int]) -> tuple[list[int], list[int]]:
    nd = len(kernel)
    return node.ints("strides") or [1] * nd, node.ints("dilations") or [1] * nd


@op("Conv")
def conv(node: Node, x: Tensor, w: Tensor, b: Tensor | None = None) -> Tensor:
    kernel = list(w.shape[2:])
    declared = node.ints("kernel_shape")
    if declared is not None and declared != kernel:
        raise node.fail(f"kernel_shape {declared} does not match the weight's {kernel}")
    strides, dil = _geometry(node, x, kernel)
    pads, _ = _spatial(node, x.shape[2:], kernel, strides, dil)
    if any(p != (0, 0) for p in pads):
        x = x.pad(((0, 0), (0, 0), *pads))
    return x.conv2d(w, b, groups=node.attr("group", 1), stride=tuple(strides), dilation=tuple(dil))


@op("ConvTranspose")
def conv_transpose(node: Node, x: Tensor, w: Tensor, b: Tensor | None = None) -> Tensor:
    kernel = list(w.shape[2:])
    nd = len(kernel)
    node.ints("kernel_shape")
    strides, dil = _geometry(node, x, kernel)
    out_pad = node.ints("output_padding") or [0] * nd
    full = [(x.shape[2 + i] - 1) * strides[i] + (kernel[i] - 1) * dil[i] + 1 for i in range(nd)]
    auto = node.only("auto_pad", ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"), "NOTSET")
    target = node.ints("output_shape")
    pads = node.ints("pads") or [0] * (2 * nd)
    pairs = [(pads[i], pads[i + nd]) for i in range(nd)]
    if target is not None or auto in ("SAME_UPPER", "SAME_LOWER"):
        want = target[-nd:] if target is not None else [x.shape[2 + i] * strides[i] for i in range(nd)]
        pairs = []
        for i in range(nd):
            total = full[i] + out_pad[i] - want[i]
            pairs.append((total // 2, total - total // 2) if auto == "SAME_UPPER" else
                         (total - total // 2, total // 2))
    y = x.conv_transpose2d(w, None, groups=node.attr("group", 1), stride=tuple(strides), dilation=tuple(dil))
    # output_padding adds rows at the end (bias only), then the pads are cut from both ends
    y = y.pad(((0, 0), (0, 0), *[(-pairs[i][0], out_pad[i] - pairs[i][1]) for i in range(nd)]))
    if b is not None:
        y = y + b.reshape(1, -1, *([1] * nd))
    return y


def _pool_input(node: Node, x: Tensor, fill: float, kernel: list[int], strides: list[int],
                dil: list[int]) -> tuple[Tensor, list[tuple[int, int]], list[tuple[int, int]]]:
    """(x padded by the ONNX pads plus what ceil_mode's last window needs, those pairs, the ONNX pads)."""
    ceil_mode = bool(node.attr("ceil_mode", 0))
    pads, outs = _spatial(node, x.shape[2:], kernel, strides, dil, ceil_mode)
    pairs = []
    for i, ((b, e), out) in enumerate(zip(pads, outs)):
        need = (out - 1) * strides[i] + (kernel[i] - 1) * dil[i] + 1
        pairs.append((b, need - x.shape[2 + i] - b))
    lead = [(0, 0)] * (x.ndim - len(kernel))
    return x.pad((*lead, *pairs), value=fill), pairs, pads


def _window_sum(x: Tensor, kernel: list[int], strides: list[int], dil: list[int]) -> Tensor:
    return x.avg_pool2d(tuple(kernel), stride=tuple(strides), dilation=tuple(dil)) * float(np.prod(kernel))


@op("MaxPool")
def max_pool(node: Node, x: Tensor):
    kernel = node.ints("kernel_shape")
    strides, dil = _geometry(node, x, kernel)
    node.only("storage_order", (0,), 0)
    if len(node.proto.output) > 1 and node.proto.output[1]:
        pads, _ = _spatial(node, x.shape[2:], kernel, strides, dil, bool(node.attr("ceil_mode", 0)))
        if any(p != (0, 0) for p in pads) or node.attr("ceil_mode", 0):
            raise node.fail("the Indices output is supported without padding or ceil_mode only")
        y, idx = x.max_pool2d(tuple(kernel), stride=tuple(strides), dilation=tuple(dil), return_indices=True)
        plane = int(np.prod(x.shape[2:]))
        lead = int(np.prod(x.shape[:2]))
        base = Tensor.arange(lead, dtype=dtypes.int64).reshape(*x.shape[:2], *([1] * len(kernel))) * plane
        return y, idx.cast(dtypes.int64) + base
    fill = -math.inf if dtypes.is_float(x.dtype) else dtypes.min(x.dtype)
    xp, _, _ = _pool_input(node, x, fill, kernel, strides, dil)
    return xp.max_pool2d(tuple(kernel), stride=tuple(strides), dilation=tuple(dil))


@op("AveragePool")
def average_pool(node: Node, x: Tensor) -> Tensor:
    kernel = node.ints("kernel_shape")
    strides, dil = _geometry(node, x, kernel)
    xp, pairs, pads = _pool_input(node, x, 0.0, kernel, strides, dil)
    spatial = x.shape[2:]
    if node.attr("count_include_pad", 0):  # the divisor counts the explicit pads, not what ceil_mode adds
        region = [n + b + e for n, (b, e) in zip(spatial, pads)]
        count = Tensor.ones(*region, dtype=x.dtype).pad(tuple((0, p[0] + n + p[1] - r) for n, p, r in
                                                              zip(spatial, pairs, region)))
    else:
        count = Tensor.ones(*spatial, dtype=x.dtype).pad(tuple(pairs))
    return _window_sum(xp, kernel, strides, dil) / _window_sum(count, kernel, strides, dil)


@op("LpPool")
def lp_pool(node: Node, x: Tensor) -> Tensor:
    kernel = node.ints("kernel_shape")
    p = node.attr("p", 2)
    strides, dil = _geometry(node, x, kernel)
    xp, _, _ = _pool_input(node, x.abs().pow(p), 0.0, kernel, strides, dil)
    return _window_sum(xp, kernel, strides, dil).pow(1.0 / p)


@op("GlobalAveragePool")
def global_average_pool(node: Node, x: Tensor) -> Tensor:
    return x.mean(axis=tuple(range(2, x.ndim)), keepdim=True)


@op("GlobalMaxPool")
def global_max_pool(node: Node, x: Tensor) -> Tensor:
    return x.max(axis=tuple(range(2, x.ndim)), keepdim=True)


# ---- normalizations
def _channel(t: Tensor, rank: int) -> Tensor:
    return t.reshape(1, -1, *([1] * (rank - 2)))


@op("BatchNormalization")
def batch_norm(node: Node, x: Tensor, scale: Tensor, bias: Tensor, mean: Tensor, var: Tensor):
    eps, momentum = node.attr("epsilon", 1e-5), node.attr("momentum", 0.9)
    if node.attr("training_mode", 0):
        axes = tuple(i for i in range(x.ndim) if i != 1)
        cur_mean, cur_var = x.mean(axis=axes), x.var(axis=axes, correction=0)
        y = (x - _channel(cur_mean, x.ndim)) * _channel((cur_var + eps).rsqrt() * scale, x.ndim) + \
            _channel(bias, x.ndim)
        return y, mean * momentum + cur_mean * (1 - momentum), var * momentum + cur_var * (1 - momentum)
    return (x - _channel(mean, x.ndim)) * _channel(scale * (var + eps).rsqrt(), x.ndim) + _channel(bias, x.ndim)


@op("InstanceNormalization")
def instance_norm(node: Node, x: Tensor, scale: Tensor, bias: Tensor) -> Tensor:
    axes = tuple(range(2, x.ndim))
    mean = x.mean(axis=axes, keepdim=True)
    var = (x - mean).square().mean(axis=axes, keepdim=True)
    y = (x - mean) * (var + node.attr("epsilon", 1e-5)).rsqrt()
    return y * _channel(scale, x.ndim) + _channel(bias, x.ndim)


@op("LayerNormalization")
def layer_norm(node: Node, x: Tensor, scale: Tensor, bias: Tensor | None = None):
    axis = _axis(node.attr("axis", -1), x.ndim, node)
    node.only("stash_type", (1,), 1)
    axes = tuple(range(axis, x.ndim))
    mean = x.mean(axis=axes, keepdim=True)
    var = (x - mean).square().mean(axis=axes, keepdim=True)
    inv = (var + node.attr("epsilon", 1e-5)).rsqrt()
    y = (x - mean) * inv * scale
    return (y + bias if bias is not None else y), mean, inv


@op("RMSNormalization")
def rms_norm(node: Node, x: Tensor, scale: Tensor) -> Tensor:
    axis = _axis(node.attr("axis", -1), x.ndim, node)
    node.only("stash_type", (1,), 1)
    axes = tuple(range(axis, x.ndim))
    return x * (x.square().mean(axis=axes, keepdim=True) + node.attr("epsilon", 1e-5)).rsqrt() * scale


@op("GroupNormalization")
def group_norm(node: Node, x: Tensor, scale: Tensor, bias: Tensor) -> Tensor:
    g = node.attr("num_groups")
    node.only("stash_type", (1,), 1)
    n, c = x.shape[:2]
    grouped = x.reshape(n, g, -1)
    mean = grouped.mean(axis=-1, keepdim=True)
    var = (grouped - mean).square().mean(axis=-1, keepdim=True)
    y = ((grouped - mean) * (var + node.attr("epsilon", 1e-5)).rsqrt()).reshape(x.shape)
    if scale.shape[0] != c:  # opset 18: one scale and bias per group
        scale = scale.reshape(g, 1).expand(g, c // g).reshape(c)
        bias = bias.reshape(g, 1).expand(g, c // g).reshape(c)
    return y * _channel(scale, x.ndim) + _channel(bias, x.ndim)


@op("LpNormalization")
def lp_norm(node: Node, x: Tensor) -> Tensor:
    axis = _axis(node.attr("axis", -1), x.ndim, node)
    p = node.only("p", (1, 2), 2)
    norm = x.abs().sum(axis=axis, keepdim=True) if p == 1 else x.square().sum(axis=axis, keepdim=True).sqrt()
    return x / (norm == 0).where(1, norm)  # a zero vector stays zero


@op("MeanVarianceNormalization")
def mean_variance_norm(node: Node, x: Tensor) -> Tensor:
    axes = tuple(_axis(a, x.ndim, node) for a in (node.ints("axes") or [0, 2, 3]))
    mean = x.mean(axis=axes, keepdim=True)
    var = (x - mean).square().mean(axis=axes, keepdim=True)
    return (x - mean) / (var.sqrt() + 1e-9)


@op("LRN")
def lrn(node: Node, x: Tensor) -> Tensor:
    size = node.attr("size")
    alpha, beta, bias = node.attr("alpha", 1e-4), node.attr("beta", 0.75), node.attr("bias", 1.0)
    before, after = (size - 1) // 2, size - 1 - (size - 1) // 2
    sq = x.square().pad(((0, 0), (before, after), *[(0, 0)] * (x.ndim - 2)))
    c = x.shape[1]
    window = sq.shrink(tuple((0, c) if i == 1 else None for i in range(x.ndim)))
    for k in range(1, size):
        window = window + sq.shrink(tuple((k, k + c) if i == 1 else None for i in range(x.ndim)))
    return x / (bias + alpha / size * window).pow(beta)


# ---- softmax family
def _softmax_axis(node: Node, x: Tensor) -> int:
    return _axis(node.attr("axis", -1), x.ndim, node)


op("Softmax")(lambda node, x: x.softmax(_softmax_axis(node, x)))
op("LogSoftmax")(lambda node, x: x.log_softmax(_softmax_axis(node, x)))


@op("Hardmax")
def hardmax(node: Node, x: Tensor) -> Tensor:
    axis = _softmax_axis(node, x)
    idx = x.argmax(axis=axis, keepdim=True)
    shape_ = [1] * x.ndim
    shape_[axis] = x.shape[axis]
    return (Tensor.arange(x.shape[axis]).reshape(*shape_) == idx).cast(x.dtype)


# ---- reductions
def _reduce_axes(node: Node, x: Tensor, axes) -> tuple[int, ...] | None:
    """The axes to reduce; None when the node is a no-op (empty axes with noop_with_empty_axes)."""
    given = ints_of(axes) if axes is not None else node.ints("axes")
    if not given:
        return None if node.attr("noop_with_empty_axes", 0) else tuple(range(x.ndim))
    node.attr("noop_with_empty_axes", 0)
    return tuple(sorted({_axis(a, x.ndim, node) for a in given}))


REDUCE = {
    "ReduceSum": lambda x, ax, k: x.sum(axis=ax, keepdim=k),
    "ReduceMean": lambda x, ax, k: x.mean(axis=ax, keepdim=k),
    "ReduceMax": lambda x, ax, k: x.max(axis=ax, keepdim=k),
    "ReduceMin": lambda x, ax, k: x.min(axis=ax, keepdim=k),
    "ReduceProd": lambda x, ax, k: x.prod(axis=ax, keepdim=k),
    "ReduceL1": lambda x, ax, k: x.abs().sum(axis=ax, keepdim=k),
    "ReduceL2": lambda x, ax, k: x.square().sum(axis=ax, keepdim=k).sqrt(),
    "ReduceSumSquare": lambda x, ax, k: x.square().sum(axis=ax, keepdim=k),
    "ReduceLogSum": lambda x, ax, k: x.sum(axis=ax, keepdim=k).log(),
    "ReduceLogSumExp": lambda x, ax, k: x.logsumexp(axis=ax, keepdim=k),
}


def _reduce_host(fn):
    def run(node: Node, x: np.ndarray, axes=None) -> np.ndarray:
        ax = _reduce_axes(node, x, axes)
        keep = bool(node.attr("keepdims", 1))
        return x if ax is None else np.asarray(fn(x, axis=ax, keepdims=keep))
    return run


def _reduce(fn):
    def run(node: Node, x: Tensor, axes=None) -> Tensor:
        ax = _reduce_axes(node, x, axes)
        keep = bool(node.attr("keepdims", 1))
        if ax is None:
            return x
        if node.op in ("ReduceMax", "ReduceMin") and any(x.shape[a] == 0 for a in ax):
            out = [1 if a in ax else d for a, d in enumerate(x.shape)] if keep else \
                [d for a, d in enumerate(x.shape) if a not in ax]
            big = True if x.dtype == dtypes.bool else (math.inf if dtypes.is_float(x.dtype) else dtypes.max(x.dtype))
            small = False if x.dtype == dtypes.bool else (-math.inf if dtypes.is_float(x.dtype)
                                                          else dtypes.min(x.dtype))
            return Tensor.full(tuple(out), small if node.op == "ReduceMax" else big, dtype=x.dtype)
        if x.dtype == dtypes.bool or (node.op in ("ReduceSum", "ReduceProd", "ReduceSumSquare")
                                      and dtypes.is_int(x.dtype)):
            return fn(x, ax, keep).cast(x.dtype)
        return fn(x, ax, keep)
    return run


for _name, _fn in REDUCE.items():
    _host = {"ReduceProd": np.prod, "ReduceSum": np.sum, "ReduceMax": np.max, "ReduceMin": np.min}.get(_name)
    op(_name, static=(1,), host=None if _host is None else _reduce_host(_host))(_reduce(_fn))


def _arg(largest: bool):
    def run(node: Node, x: Tensor) -> Tensor:
        axis = _axis(node.attr("axis", 0), x.ndim, node)
        keep = bool(node.attr("keepdims", 1))
        if node.attr("select_last_index", 0):
            flipped = x.flip(axis)
            idx = flipped.argmax(axis=axis, keepdim=keep) if largest else flipped.argmin(axis=axis, keepdim=keep)
            return (x.shape[axis] - 1 - idx).cast(dtypes.int64)
        idx = x.argmax(axis=axis, keepdim=keep) if largest else x.argmin(axis=axis, keepdim=keep)
        return idx.cast(dtypes.int64)
    return run


op("ArgMax")(_arg(True))
op("ArgMin")(_arg(False))


@op("CumSum", static=(1,))
def cumsum(node: Node, x: Tensor, axis: np.ndarray) -> Tensor:
    a = _axis(int(np.asarray(axis).reshape(-1)[0]), x.ndim, node)
    if node.attr("reverse", 0):
        x = x.flip(a)
    y = x.cumsum(a)
    if node.attr("exclusive", 0):
        y = y - x
    return y.flip(a) if node.attr("reverse", 0) else y


@op("TopK", static=(1,))
def topk(node: Node, x: Tensor, k: np.ndarray):
    axis = _axis(node.attr("axis", -1), x.ndim, node)
    largest = bool(node.attr("largest", 1))
    node.only("sorted", (1,), 1)
    values, idx = x.topk(int(np.asarray(k).reshape(-1)[0]), dim=axis, largest=largest)
    return values, idx.cast(dtypes.int64)


@op("Dropout", static=(1, 2))
def dropout(node: Node, x: Tensor, ratio=None, training=None):
    node.attr("seed", None)
    if training is not None and bool(np.asarray(training).reshape(-1)[0]):
        raise node.fail("training_mode=True Dropout is not supported; export the model in evaluation mode")
    return x, Tensor.ones(*x.shape, dtype=dtypes.bool)
