"""Losses, Resize and attention: the operators with the most rules, one function each.

Stage: operator implementations (graph.py runs them). Input: a Node, its data inputs as Tensors and its
load-time inputs (Resize's scales and sizes) as NumPy arrays. Output: Tensors. Resize builds, per resized
axis, a dense (out, in) interpolation matrix on the host from ONNX's coordinate rules and applies it as a
matmul, so every mode (nearest, linear, cubic) is the same kernel shape.
"""
from __future__ import annotations

import math

import numpy as np

from polygrad import Tensor, dtypes

from polygrad_onnx.node import Node, ints_of, op
from polygrad_onnx.ops_shape import _axis


# ---- losses
def _nll(node: Node, logp: Tensor, target: Tensor, weight: Tensor | None) -> Tensor:
    reduction = node.only("reduction", ("none", "sum", "mean"), "mean")
    ignore = node.attr("ignore_index", None)
    c = logp.shape[1]
    target = target.cast(dtypes.int32)
    keep = (target != ignore) if ignore is not None else None
    safe = keep.where(target, 0) if keep is not None else target
    picked = -logp.gather(1, safe.unsqueeze(1)).squeeze(1)
    if weight is not None:
        w = weight.index_select(0, safe.reshape(-1).clip(0, c - 1)).reshape(target.shape)
    else:
        w = Tensor.ones(*target.shape, dtype=logp.dtype)
    if keep is not None:
        w = keep.where(w, 0)
    loss = picked * w
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    if weight is None and keep is None:
        return loss.mean()
    return loss.sum() / w.sum()


@op("NegativeLogLikelihoodLoss")
def nll_loss(node: Node, x: Tensor, target: Tensor, weight: Tensor | None = None) -> Tensor:
    return _nll(node, x, target, weight)


@op("SoftmaxCrossEntropyLoss")
def softmax_cross_entropy(node: Node, scores: Tensor, labels: Tensor, weight: Tensor | None = None):
    logp = scores.log_softmax(1)
    return _nll(node, logp, labels, weight), logp


# ---- Resize
def _source_coords(node: Node, mode: str, n: int, m: int, scale: float, roi: tuple[float, float]) -> np.ndarray:
    """ONNX's coordinate transformation: each output index -> a (fractional) input coordinate."""
    i = np.arange(m, dtype=np.float64)
    width = scale * n  # the output width before rounding, as ONNX's formulas use it
    if mode == "half_pixel":
        return (i + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        adj = m / (scale * n)
        return n / 2 * (1 - adj) + (i + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (i + 0.5) / scale - 0.5 if width > 1 else np.zeros(m)
    if mode == "align_corners":
        return i * (n - 1) / (width - 1) if width != 1 else np.zeros(m)
    if mode == "asymmetric":
        return i / scale
    if mode == "tf_crop_and_resize":
        lo, hi = roi
        if m > 1:
            return lo * (n - 1) + i * (hi - lo) * (n - 1) / (m - 1)
        return np.full(m, 0.5 * (lo + hi) * (n - 1))
    raise node.unsupported("coordinate_transformation_mode", mode)


def _nearest(node: Node, x: np.ndarray) -> np.ndarray:
    rule = node.only("nearest_mode", ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil"),
                     "round_prefer_floor")
    if rule == "floor":
        return np.floor(x)
    if rule == "ceil":
        return np.ceil(x)
    half = np.floor(x) + 0.5
    if rule == "round_prefer_floor":
        return np.where(x == half, np.floor(x), np.round(x))
    return np.where(x == half, np.ceil(x), np.round(x))


def _cubic_coeffs(t: np.ndarray, a: float) -> np.ndarray:
    """(m, 4) weights of the points floor-1 .. floor+2 for fractional parts t."""
    def w(d):
        d = np.abs(d)
        return np.where(d <= 1, ((a + 2) * d - (a + 3)) * d * d + 1,
                        np.where(d < 2, ((a * d - 5 * a) * d + 8 * a) * d - 4 * a, 0.0))
    return np.stack([w(t + 1), w(t), w(1 - t), w(2 - t)], axis=1)


def _resize_matrix(node: Node, mode: str, n: int, m: int, scale: float, roi: tuple[float, float]) -> np.ndarray:
    """(m, n) matrix whose rows interpolate one output position from the input positions."""
    ctm = node.attr("coordinate_transformation_mode", "half_pixel")
    x = _source_coords(node, ctm, n, m, scale, roi)
    mat = np.zeros((m, n), dtype=np.float64)
    rows = np.arange(m)
    if mode == "nearest":
        mat[rows, np.clip(_nearest(node, x), 0, n - 1).astype(np.int64)] = 1.0
        return mat
    base = np.floor(x)
    t = x - base
    if mode == "linear":
        offsets, coeffs = [0, 1], np.stack([1 - t, t], axis=1)
    else:
        offsets, coeffs = [-1, 0, 1, 2], _cubic_coeffs(t, node.attr("cubic_coeff_a", -0.75))
    idx = base[:, None].astype(np.int64) + np.array(offsets)[None, :]
    if mode == "cubic" and node.attr("exclude_outside", 0):
        coeffs = np.where((idx >= 0) & (idx < n), coeffs, 0.0)
        coeffs = coeffs / coeffs.sum(axis=1, keepdims=True)
    for k in range(len(offsets)):
        np.add.at(mat, (rows, np.clip(idx[:, k], 0, n - 1)), coeffs[:, k])
    return mat


@op("Resize", "Upsample", static=(1, 2, 3))
def resize(node: Node, x: Tensor, roi=None, scales=None, sizes=None) -> Tensor:
    if node.op == "Upsample":
        scales, roi = roi, None
    mode = node.only("mode", ("nearest", "linear", "cubic"), "nearest")
    node.only("antialias", (0,), 0)
    node.only("keep_aspect_ratio_policy", ("stretch", "not_larger", "not_smaller"), "stretch")
    extrapolation = node.attr("extrapolation_value", 0.0)
    node.attr("coordinate_transformation_mode", "half_pixel")
    node.attr("nearest_mode", "round_prefer_floor")
    node.attr("cubic_coeff_a", -0.75)
    node.attr("exclude_outside", 0)
    axes = [_axis(a, x.ndim, node) for a in (node.ints("axes") or range(x.ndim))]
    scales = [float(s) for s in np.asarray(scales).reshape(-1)] if scales is not None and np.size(scales) else None
    sizes = ints_of(sizes) if sizes is not None and np.size(sizes) else None
    roi_v = [float(r) for r in np.asarray(roi).reshape(-1)] if roi is not None and np.size(roi) else None
    policy = node.attr("keep_aspect_ratio_policy", "stretch")
    if sizes is not None and policy != "stretch":
        ratios = [sizes[i] / x.shape[a] for i, a in enumerate(axes)]
        r = min(ratios) if policy == "not_larger" else max(ratios)
        scales = [r] * len(axes)
        sizes = [int(math.floor(r * x.shape[a] + 0.5)) for a in axes]
    elif sizes is not None:
        scales = [sizes[i] / x.shape[a] for i, a in enumerate(axes)]
    elif scales is not None:
        sizes = [int(math.floor(x.shape[a] * scales[i])) for i, a in enumerate(axes)]
    else:
        raise node.fail("needs scales or sizes")
    y = x.float() if not dtypes.is_float(x.dtype) else x
    valid = None
    for i, a in enumerate(axes):
        n, m = x.shape[a], sizes[i]
        roi_a = (roi_v[i], roi_v[i + len(axes)]) if roi_v is not None else (0.0, 1.0)
        if n == m and scales[i] == 1.0 and node.attr("coordinate_transformation_mode") != "tf_crop_and_resize":
            continue
        mat = _resize_matrix(node, mode, n, m, scales[i], roi_a)
        y = y.transpose(a, -1).matmul(Tensor(mat.T.astype(np.float32)).cast(y.dtype)).transpose(a, -1)
        if node.attr("coordinate_transformation_mode") == "tf_crop_and_resize":
            coords = _source_coords(node, "tf_crop_and_resize", n, m, scales[i], roi_a)
            inside = (coords >= 0) & (coords <= n - 1)
            shape = [1] * x.ndim
            shape[a] = m
            mask = inside.reshape(shape)
            valid = mask if valid is None else valid & mask
    if valid is not None:
        y = Tensor(valid).where(y, extrapolation)
    return y.cast(x.dtype) if y.dtype != x.dtype else y


# ---- small composites
@op("CumProd", static=(1,))
def cumprod(node: Node, x: Tensor, axis: np.ndarray) -> Tensor:
    a = _axis(int(np.asarray(axis).reshape(-1)[0]), x.ndim, node)
    reverse, exclusive = node.attr("reverse", 0), node.attr("exclusive", 0)
    if reverse:
        x = x.flip(a)
    if exclusive:
        pads = [(0, 0)] * x.ndim
        pads[a] = (1, -1)
        x = x.pad(tuple(pads), value=1)
    y = x.cumprod(a)
    return y.flip(a) if reverse else y


# ---- attention (opset 23+)
def _heads(t: Tensor, heads: int) -> Tensor:
    b, s, hidden = t.shape
    return t.reshape(b, s, heads, hidden // heads).permute(0, 2, 1, 3)


def _allowed_bias(allowed: np.ndarray) -> np.ndarray:
    return np.where(allowed, 0.0, -np.inf).astype(np.float32)


@op("Attention", static=(6,))
def attention(node: Node, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, past_k: Tensor | None = None,
              past_v: Tensor | None = None, nonpad: np.ndarray | None = None):
    three_d = q.ndim == 3
    if three_d:
        qh, kvh = node.attr("q_num_heads"), node.attr("kv_num_heads")
        q, k, v = _heads(q, qh), _heads(k, kvh), _heads(v, kvh)
    else:
        node.attr("q_num_heads")
        node.attr("kv_num_heads")
    scale = node.attr("scale", None)
    scale = 1 / math.sqrt(q.shape[3]) if scale is None else scale
    if past_k is not None:
        k, v = past_k.cat(k, dim=2), past_v.cat(v, dim=2)
    present_k, present_v = k, v
    sq, skv = q.shape[2], k.shape[2]
    left, right = node.attr("left_window_size", -1), node.attr("right_window_size", -1)
    causal = bool(node.attr("is_causal", 0))
    if nonpad is not None and past_k is None:
        offset = np.asarray(nonpad).reshape(-1, 1, 1).astype(np.int64) - sq
    else:
        offset = np.array(past_k.shape[2] if past_k is not None else 0).reshape(1, 1, 1)
    i = np.arange(sq).reshape(1, sq, 1)
    j = np.arange(skv).reshape(1, 1, skv)
    allowed = np.ones((offset.shape[0], sq, skv), dtype=bool)
    if causal:
        allowed &= j <= i + offset
    if left >= 0:
        allowed &= (i + offset) - j <= left
    if right >= 0:
        allowed &= j - (i + offset) <= right
    if nonpad is not None:
        allowed &= j < np.asarray(nonpad).reshape(-1, 1, 1)
    bias = Tensor(_allowed_bias(allowed).reshape(offset.shape[0], 1, sq, skv)).cast(q.dtype)
    if mask is not None:
        if mask.shape[-1] < skv:
            fill = False if mask.dtype == dtypes.bool else -math.inf
            mask = mask.pad(tuple([(0, 0)] * (mask.ndim - 1) + [(0, skv - mask.shape[-1])]), value=fill)
        bias = bias + (mask.where(0.0, -math.inf).cast(q.dtype) if mask.dtype == dtypes.bool else mask)
    qh, kvh = q.shape[1], k.shape[1]
    if qh != kvh:
        k, v = k.repeat_interleave(qh // kvh, dim=1), v.repeat_interleave(qh // kvh, dim=1)
    root = math.sqrt(scale)
    qk = (q * root).matmul((k * root).transpose(-1, -2))
    softcap = node.attr("softcap", None)
    if softcap is not None and softcap > 0:
        qk = (qk / softcap).tanh() * softcap
    with_bias = qk + bias
    mode = node.only("qk_matmul_output_mode", (0, 1, 2, 3), 0)
    precision = node.attr("softmax_precision", None)
    scores = with_bias.float() if precision is not None else with_bias
    top = scores.max(axis=-1, keepdim=True)
    masked_row = top == -math.inf
    probs = (scores - masked_row.where(0, top)).exp()
    total = probs.sum(axis=-1, keepdim=True)
    probs = probs / (total == 0).where(1, total)
    row_all_masked = bias.max(axis=-1, keepdim=True) == -math.inf
    probs = row_all_masked.where(0, probs).cast(q.dtype)
    out = probs.matmul(v)
    if three_d:
        out = out.permute(0, 2, 1, 3)
        out = out.reshape(out.shape[0], out.shape[1], -1)
    qk_out = {0: qk, 1: qk, 2: with_bias, 3: probs}[mode]
    return out, present_k, present_v, qk_out
