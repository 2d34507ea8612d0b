"""Quantization operators and the remaining small ones: (De)QuantizeLinear, integer matmul/conv, BitCast,
windows, CenterCropPad, RotaryEmbedding, SwiGLU, Det.

Stage: operator implementations (graph.py runs them). Input: a Node, its inputs as Tensors (window sizes and
crop shapes as NumPy arrays). Output: Tensors. Quantized values are 8- and 16-bit integers (float8, int4 and
int2 element types are refused where the file is read); rounding is half to even and results saturate to
the type's range, as ONNX specifies.
"""
from __future__ import annotations

import math

import numpy as np

from polygrad import Tensor, dtypes

from polygrad_onnx.node import Node, ints_of, op, pg_dtype
from polygrad_onnx.ops_nn import conv
from polygrad_onnx.ops_shape import _axis


def _per_axis(node: Node, scale: Tensor, x: Tensor) -> Tensor:
    """A scale or zero point shaped to broadcast against x: scalar, per-axis vector, or blocked."""
    if scale.ndim == 0 or (scale.ndim == 1 and scale.shape[0] == 1 and x.ndim and x.shape[0] != 1):
        node.attr("axis", 1)
        node.attr("block_size", 0)
        return scale.reshape(())
    axis = _axis(node.attr("axis", 1), x.ndim, node)
    block = node.attr("block_size", 0)
    if block:
        return scale.repeat_interleave(block, dim=axis).shrink(
            tuple((0, x.shape[axis]) if i == axis else None for i in range(x.ndim)))
    shape = [1] * x.ndim
    shape[axis] = x.shape[axis]
    return scale.reshape(*shape)


def _saturate(y: Tensor, to) -> Tensor:
    return y.clip(dtypes.min(to), dtypes.max(to)).cast(to)


@op("QuantizeLinear")
def quantize(node: Node, x: Tensor, scale: Tensor, zero: Tensor | None = None) -> Tensor:
    node.attr("saturate", 1)
    node.attr("precision", 0)
    out = node.attr("output_dtype", 0)
    to = zero.dtype if zero is not None else (pg_dtype(out, node) if out else dtypes.uint8)
    y = (x.float() / _per_axis(node, scale, x).float()).round()
    if zero is not None:
        y = y + _per_axis(node, zero, x).float()
    return _saturate(y, to)


@op("DequantizeLinear")
def dequantize(node: Node, x: Tensor, scale: Tensor, zero: Tensor | None = None) -> Tensor:
    out = node.attr("output_dtype", 0)
    to = pg_dtype(out, node) if out else scale.dtype
    y = x.float()
    if zero is not None:
        y = y - _per_axis(node, zero, x).float()
    return (y * _per_axis(node, scale, x).float()).cast(to)


@op("DynamicQuantizeLinear")
def dynamic_quantize(node: Node, x: Tensor):
    lo, hi = x.min().minimum(0), x.max().maximum(0)
    scale = (hi - lo) / 255
    zero = _saturate((-lo / scale).round(), dtypes.uint8)
    y = _saturate((x / scale).round() + zero.float(), dtypes.uint8)
    return y, scale, zero


def _centered(t: Tensor, zero: Tensor | None, rows: bool) -> Tensor:
    t = t.cast(dtypes.int32)
    if zero is None:
        return t
    z = zero.cast(dtypes.int32)
    if rows and z.ndim == 1 and z.shape[0] > 1:
        z = z.reshape(-1, 1)  # a per-row zero point of A
    return t - z


@op("MatMulInteger")
def matmul_integer(node: Node, a: Tensor, b: Tensor, a_zero: Tensor | None = None,
                   b_zero: Tensor | None = None) -> Tensor:
    return _centered(a, a_zero, True).matmul(_centered(b, b_zero, False))


@op("QLinearMatMul")
def qlinear_matmul(node: Node, a: Tensor, a_scale: Tensor, a_zero: Tensor, b: Tensor, b_scale: Tensor,
                   b_zero: Tensor, y_scale: Tensor, y_zero: Tensor) -> Tensor:
    acc = _centered(a, a_zero, True).matmul(_centered(b, b_zero, False)).float()
    y = (acc * (a_scale.float() * b_scale.float() / y_scale.float())).round() + y_zero.float()
    return _saturate(y, y_zero.dtype)


@op("ConvInteger")
def conv_integer(node: Node, x: Tensor, w: Tensor, x_zero: Tensor | None = None,
                 w_zero: Tensor | None = None) -> Tensor:
    xs = x.float() - (x_zero.float() if x_zero is not None else 0)
    ws = w.float() - (w_zero.float().reshape(-1, *([1] * (w.ndim - 1))) if w_zero is not None and w_zero.ndim
                      else (w_zero.float() if w_zero is not None else 0))
    return conv(node, xs, ws).round().cast(dtypes.int32)  # exact: small integers in float32


@op("QLinearConv")
def qlinear_conv(node: Node, x: Tensor, x_scale: Tensor, x_zero: Tensor, w: Tensor, w_scale: Tensor,
                 w_zero: Tensor, y_scale: Tensor, y_zero: Tensor, bias: Tensor | None = None) -> Tensor:
    per_channel = (-1, *([1] * (w.ndim - 1)))
    ws = w.float() - (w_zero.float().reshape(per_channel) if w_zero.ndim else w_zero.float())
    acc = conv(node, x.float() - x_zero.float(), ws)
    if bias is not None:
        acc = acc + bias.float().reshape(1, -1, *([1] * (x.ndim - 2)))
    scale = (x_scale.float() * (w_scale.float().reshape(1, -1, *([1] * (x.ndim - 2))) if w_scale.ndim
                                else w_scale.float())) / y_scale.float()
    return _saturate((acc * scale).round() + y_zero.float(), y_zero.dtype)


@op("BitCast")
def bit_cast(node: Node, x: Tensor) -> Tensor:
    to = pg_dtype(node.attr("to"), node)
    if to.itemsize != x.dtype.itemsize:
        raise node.fail(f"BitCast between sizes {x.dtype.itemsize} and {to.itemsize} is not supported")
    if to == dtypes.bool or x.dtype == dtypes.bool:
        return (x != 0) if to == dtypes.bool else x.cast(to)
    return x.bitcast(to)


def _window(kind: str):
    def run(node: Node, size: np.ndarray) -> Tensor:
        n = int(np.asarray(size).reshape(-1)[0])
        periodic = node.attr("periodic", 1)
        denom = n if periodic else n - 1
        i = np.arange(n, dtype=np.float64)
        if kind == "hann":
            y = 0.5 - 0.5 * np.cos(2 * math.pi * i / denom)
        elif kind == "hamming":
            y = 25 / 46 - (1 - 25 / 46) * np.cos(2 * math.pi * i / denom)
        else:
            y = 0.42 - 0.5 * np.cos(2 * math.pi * i / denom) + 0.08 * np.cos(4 * math.pi * i / denom)
        return Tensor(y.astype(np.float32)).cast(pg_dtype(node.attr("output_datatype", 1), node))
    return run


op("HannWindow", static=(0,))(_window("hann"))
op("HammingWindow", static=(0,))(_window("hamming"))
op("BlackmanWindow", static=(0,))(_window("blackman"))


@op("CenterCropPad", static=(1,))
def center_crop_pad(node: Node, x: Tensor, shape: np.ndarray) -> Tensor:
    axes = node.ints("axes")
    axes = list(range(x.ndim)) if axes is None else [_axis(a, x.ndim, node) for a in axes]
    pairs = [(0, 0)] * x.ndim
    for a, size in zip(axes, ints_of(shape)):
        diff = size - x.shape[a]  # > 0: pad, < 0: crop (a negative pad); the odd one at the end
        half = abs(diff) // 2
        pairs[a] = (half, abs(diff) - half) if diff > 0 else (-half, -(abs(diff) - half))
    return x.pad(tuple(pairs))


@op("RotaryEmbedding")
def rotary_embedding(node: Node, x: Tensor, cos: Tensor, sin: Tensor, positions: Tensor | None = None) -> Tensor:
    four_d = x.ndim == 4
    shape = x.shape
    if four_d:
        x = x.permute(0, 2, 1, 3)
    else:
        heads = node.attr("num_heads")
        x = x.reshape(shape[0], shape[1], heads, shape[2] // heads)
    node.attr("num_heads")
    dim = node.attr("rotary_embedding_dim", 0) or x.shape[3]
    rot, rest = x[..., :dim], x[..., dim:]
    if positions is not None:
        cos = cos.index_select(0, positions.reshape(-1).cast(dtypes.int32)).reshape(*positions.shape, -1)
        sin = sin.index_select(0, positions.reshape(-1).cast(dtypes.int32)).reshape(*positions.shape, -1)
    cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)
    if node.attr("interleaved", 0):
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
        real, imag = cos * x1 - sin * x2, sin * x1 + cos * x2
        rot = real.unsqueeze(-1).cat(imag.unsqueeze(-1), dim=-1).reshape(rot.shape)
    else:
        x1, x2 = rot[..., :dim // 2], rot[..., dim // 2:]
        rot = (cos * x1 - sin * x2).cat(sin * x1 + cos * x2, dim=-1)
    out = rot.cat(rest, dim=-1) if rest.shape[-1] else rot
    return out.permute(0, 2, 1, 3) if four_d else out.reshape(shape)


@op("SwiGLU")
def swiglu(node: Node, a: Tensor, b: Tensor) -> Tensor:
    return a * (a * node.attr("alpha", 1.0)).sigmoid() * b


@op("Det")
def det(node: Node, x: Tensor) -> Tensor:
    return x.det()
