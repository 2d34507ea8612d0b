"""Neural-network functions on Tensor: convolution, pooling, interpolation, normalisation, attention.

Stage: graph construction. Input: Tensors. Output: Tensors composed from primitive ops, so gradients
come for free. Convolution and pooling use one sliding-window view (`_pool`: pad + repeat + shrink +
reshape, no im2col copy) followed by a broadcasted multiply and a reduce, which the scheduler fuses
into a single kernel. Signatures follow tinygrad (`x.conv2d(w, bias, groups, stride, dilation,
padding)`, any number of spatial dimensions); values follow PyTorch. Losses are mixed in from
`tensor_losses.py`.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from polygrad import config
from polygrad.dtype import dtype_min, dtypes, least_upper_float
from polygrad.errors import DTypeError, InvalidArgumentError
from polygrad.gradient import with_vjp
from polygrad.tensor_indexing import host_values
from polygrad.tensor_losses import LossMixin
from polygrad.uop import sint
from polygrad.tensor_math import HALF_TYPES, float_math
from polygrad.tensor_movement import _tuple
from polygrad.uop.shape import ShapeError

if TYPE_CHECKING:
    from polygrad.tensor import Tensor


def _flat_pads(padding: Any, dims: int) -> list[int]:
    """Padding as a flat torch-order list (last axis first): int, per-dim tuple or flat tuple."""
    if isinstance(padding, int):
        return [padding] * (2 * dims)
    padding = [int(p) for p in padding]
    if len(padding) == dims:
        return [p for p in reversed(padding) for _ in range(2)]
    if len(padding) == 2 * dims:
        return padding
    raise InvalidArgumentError(f"padding {padding} needs 1, {dims} or {2 * dims} entries")


def _grouped(pads: Sequence[int]) -> list[tuple[int, int]]:
    """Flat torch-order pads -> [(before, after)] in axis order."""
    return list(zip(pads[-2::-2], pads[::-2]))


def _ceil_pads(shape: tuple[int, ...], pads: list[int], k_: tuple[int, ...], s_: tuple[int, ...],
               d_: tuple[int, ...]) -> list[int]:
    """Extra end padding so the last partial window counts (ceil_mode), never starting in padding."""
    i_ = shape[-len(k_):]
    pads = list(pads)
    for dim, (i, s, k, d, (pb, pa)) in enumerate(zip(i_, s_, k_, d_, _grouped(pads))):
        o = -(-(i + pb + pa - (d * (k - 1) + 1)) // s) + 1
        extra = s * (o - 1) + (d * (k - 1) + 1) - (i + pb + pa) - max(s * (o - 1) - (pb + i - 1), 0)
        pads[len(pads) - 1 - 2 * dim] += extra
    return pads


# a padded stride-1 conv's weight gradient reads its input from a padded copy (one more kernel, a copy of
# the input) from this many multiply-adds on, and where each copied value serves at least
# WEIGHT_GRAD_PAD_COPY_MIN_USES of them (output channels per group x kernel points: not a depthwise 3x3's
# 9, never measured): below that the launch and the copy cost more than the validity gates they take
# out of its innermost loop
WEIGHT_GRAD_PAD_COPY_MIN_WORK = 1 << 24
WEIGHT_GRAD_PAD_COPY_MIN_USES = 16


def _conv_windows(padded: "Tensor", kernel: tuple, stride: Any, dilation: Any, groups: int, rcout: int) -> "Tensor":
    """The view a convolution sums over: (bs, groups, rcout, *out, *kernel, cin) windows of its (padded)
    input, summed over (*kernel, cin), the channels innermost: a padded input's validity gates depend on
    the kernel offsets, not the channel, so they stay outside the innermost loop."""
    bs, cin = padded.shape[0], padded.shape[1] // groups
    x = padded._pool(kernel, stride, dilation)  # (bs, cin_all, *out, *kernel)
    nd = len(kernel)
    oyx = x.shape[2:2 + nd]
    x = x.reshape(bs, groups, cin, 1, *oyx, *kernel).expand(bs, groups, cin, rcout, *oyx, *kernel)
    return x.permute(0, 1, 3, *[4 + i for i in range(nd)], *[4 + nd + i for i in range(nd)], 2)


def _conv_vjp(out: "Tensor", x: "Tensor", weight: "Tensor", windows: "Tensor", groups: int, dilation: tuple,
              pads: list[int]) -> None:
    """Give a stride-1 convolution's output its own gradient rule (gradient.with_vjp): the input gradient
    is the transposed convolution of the output gradient (one kernel like the forward one), instead of
    the window view's chain rule, which sums the 9x larger per-window products back with div/mod index
    arithmetic (col2im). The weight gradient is the chain rule's own: the output gradient times the
    window view `windows` (bs, groups, cout/groups, *out, *kernel, cin), summed over the batch and the
    output positions; for a big padded conv, windows of a padded copy of the input instead (realized
    once), so its kernel reads every window without a validity gate: its innermost loop walks the pixels
    of a row, and the gate of each vector of them cost 1.4x the kernel's time."""
    cls, rt = type(out), out._runtime
    x_uop, w_uop, view, w_shape = x.uop, weight.uop, windows.uop, weight.shape
    bs, nd = x.shape[0], len(w_shape) - 2
    oyx = out.shape[2:]

    def vjp(g: Any, wanted: set) -> dict:
        grads = {}
        gt = cls(g, _runtime=rt)
        if x_uop in wanted:
            wt = cls(w_uop, _runtime=rt)
            grads[x_uop] = gt.conv_transpose2d(wt, groups=groups, dilation=dilation, padding=pads).uop
        if w_uop in wanted:
            rcout = w_shape[0] // groups
            gv = gt.reshape(bs, groups, rcout, *oyx, *[1] * (nd + 1))
            windows = cls(view, _runtime=rt)
            uses = rcout * math.prod(w_shape[2:])
            # a Variable batch counts at its bound: the kernel is compiled once for every value up to it
            if any(pads) and math.prod(sint.vmax(d) for d in view.shape) >= WEIGHT_GRAD_PAD_COPY_MIN_WORK \
                    and uses >= WEIGHT_GRAD_PAD_COPY_MIN_USES:
                padded = cls(x_uop, _runtime=rt).pad(pads).contiguous()
                windows = _conv_windows(padded, tuple(w_shape[2:]), 1, dilation, groups, rcout)
            dw = (gv * windows).sum((0, *range(3, 3 + nd)))  # (groups, rcout, *kernel, cin)
            grads[w_uop] = dw.permute(0, 1, 2 + nd, *range(2, 2 + nd)).reshape(w_shape).uop
        return grads
    with_vjp(out.uop, (x_uop, w_uop), vjp)


class NNMixin(LossMixin):
    __slots__ = ()

    # ---------------------------------------------------------------------------------------------
    # convolution
    def conv2d(self: "Tensor", weight: "Tensor", bias: "Tensor | None" = None, groups: int = 1, stride: Any = 1,
               dilation: Any = 1, padding: Any = 0, dtype: Any = None) -> "Tensor":
        """N-d convolution (cross-correlation) of (bs, cin, *spatial) with weight (cout, cin/groups, *kernel).

        padding: int, one per spatial dim, flat torch order (last dim first), 'same' or 'valid'.
        """
        hw = weight.shape[2:]
        if self.ndim != len(hw) + 2:
            raise ShapeError(f"conv: input {self.shape} needs {len(hw) + 2} dims for a weight {weight.shape}")
        (bs, cin_all), (cout, cin) = self.shape[:2], weight.shape[:2]
        if groups <= 0 or cin * groups != cin_all or cout % groups:
            raise ShapeError(f"conv: input channels {cin_all} must equal groups ({groups}) x weight in-channels "
                             f"({cin}) and out-channels {cout} must divide by groups")
        d_ = _tuple(dilation, len(hw), "dilation")
        if isinstance(padding, str):
            padding = _string_padding(padding, hw, d_, _tuple(stride, len(hw), "stride"))
        pads = _flat_pads(padding, len(hw))
        rcout = cout // groups
        x = _conv_windows(self.pad(pads), tuple(hw), stride, dilation, groups, rcout)
        oyx = x.shape[3:3 + len(hw)]
        nd = len(oyx)
        w = weight.permute(0, *range(2, 2 + len(hw)), 1).reshape(1, groups, rcout, *[1] * nd, *hw, cin)
        out = (x * w).sum([-1 - i for i in range(1 + len(hw))], dtype=dtype).reshape(bs, cout, *oyx)
        if dtype is None and all(s == 1 for s in _tuple(stride, nd, "stride")) and \
                all(p <= d * (k - 1) for (pb, pa), k, d in zip(_grouped(pads), hw, d_) for p in (pb, pa)):
            _conv_vjp(out, self, weight, x, groups, d_, pads)
        return out if bias is None else out + bias.reshape(1, -1, *[1] * nd)

    def conv_transpose2d(self: "Tensor", weight: "Tensor", bias: "Tensor | None" = None, groups: int = 1,
                         stride: Any = 1, dilation: Any = 1, padding: Any = 0, output_padding: Any = 0) -> "Tensor":
        """N-d transposed convolution; weight is (cin, cout/groups, *kernel) as in PyTorch."""
        hw = weight.shape[2:]
        if self.ndim != len(hw) + 2 or self.shape[1] != weight.shape[0] or weight.shape[0] % groups:
            raise ShapeError(f"conv_transpose: input {self.shape} does not fit weight {weight.shape} "
                             f"with groups={groups}")
        n = len(hw)
        s_, d_, op_ = (_tuple(v, n, name) for v, name in ((stride, "stride"), (dilation, "dilation"),
                                                          (output_padding, "output_padding")))
        if any(o >= max(s, d) for o, s, d in zip(op_, s_, d_)):
            raise InvalidArgumentError(f"output_padding {op_} must be smaller than stride {s_} or dilation {d_}")
        w = weight.unflatten(0, (groups, -1)).transpose(1, 2).flip(*range(3, weight.ndim + 1))
        x = self
        if any(s > 1 for s in s_):
            # insert s-1 zeros between input elements: (k) -> (k, 1) -> pad (k, s) -> (k*s) -> shrink
            x = x.reshape(*x.shape[:2], *[v for k in x.shape[2:] for v in (k, 1)])
            x = x.pad(((0, 0), (0, 0), *[p for s in s_ for p in ((0, 0), (0, s - 1))]))
            x = x.reshape(*x.shape[:2], *[k * s for k, s in zip(x.shape[2::2], s_)])
            x = x.shrink((None, None, *[(0, k - (s - 1)) for k, s in zip(x.shape[2:], s_)]))
        pads = _grouped(_flat_pads(padding, n))
        flat = [p for k, d, (pb, pa), o in reversed(list(zip(hw, d_, pads, op_)))
                for p in ((k - 1) * d - pb, (k - 1) * d - pa + o)]
        return x.conv2d(w.flatten(end_dim=1), bias=bias, groups=groups, dilation=dilation, padding=flat)

    # ---------------------------------------------------------------------------------------------
    # pooling
    def max_pool2d(self: "Tensor", kernel_size: Any = (2, 2), stride: Any = None, dilation: Any = 1,
                   padding: Any = 0, ceil_mode: bool = False, return_indices: bool = False) -> Any:
        """Max over windows of the last len(kernel_size) axes; indices are flat per spatial plane."""
        k_ = _tuple(kernel_size, 2, "kernel_size") if isinstance(kernel_size, int) else tuple(kernel_size)
        s_ = _tuple(stride if stride is not None else k_, len(k_), "stride")
        d_ = _tuple(dilation, len(k_), "dilation")
        pads = _flat_pads(padding, len(k_))
        if any(2 * p > k for p, k in zip(pads, [k for k in reversed(k_) for _ in range(2)])):
            raise InvalidArgumentError(f"max_pool: padding {padding} must be at most half the kernel {k_}")
        if ceil_mode:
            pads = _ceil_pads(self.shape, pads, k_, s_, d_)
        axis = tuple(range(-len(k_), 0))
        pooled = self.pad(pads, value=dtype_min(self.dtype))._pool(k_, s_, d_)
        out = pooled.max(axis)
        if not return_indices:
            return out
        spatial = self.shape[-len(k_):]
        size = math.prod(spatial)
        # count down so that max() picks the first (lowest) index among ties, as PyTorch does
        idx = type(self).arange(size, 0, -1, device=self.device).reshape(spatial)
        idx = idx.pad(pads, value=0)._pool(k_, s_, d_)
        hit = pooled.eq(pooled.max(axis, keepdim=True))
        return out, (size - hit.where(idx, 0).max(axis)).cast(dtypes.default_int)  # int32 indices (tinygrad)

    def avg_pool2d(self: "Tensor", kernel_size: Any = (2, 2), stride: Any = None, dilation: Any = 1,
                   padding: Any = 0, ceil_mode: bool = False, count_include_pad: bool = True) -> "Tensor":
        """Mean over windows of the last len(kernel_size) axes (PyTorch avg_pool semantics)."""
        k_ = _tuple(kernel_size, 2, "kernel_size") if isinstance(kernel_size, int) else tuple(kernel_size)
        s_ = _tuple(stride if stride is not None else k_, len(k_), "stride")
        d_ = _tuple(dilation, len(k_), "dilation")
        axis = tuple(range(-len(k_), 0))
        reg = _flat_pads(padding, len(k_))
        ceil = _ceil_pads(self.shape, reg, k_, s_, d_)

        def pool(x: "Tensor", pads: list[int]) -> "Tensor":
            return x.pad(pads)._pool(k_, s_, d_)
        if not count_include_pad:
            pads = ceil if ceil_mode else reg
            return pool(self, pads).sum(axis) / pool(self.ones_like(), pads).sum(axis)
        if not ceil_mode:
            return pool(self, reg).mean(axis)
        ones = self.ones_like().pad(reg, value=1.0)
        return pool(self, ceil).sum(axis) / pool(ones, [c - r for c, r in zip(ceil, reg)]).sum(axis)

    def max_unpool2d(self: "Tensor", indices: "Tensor", kernel_size: Any = (2, 2), stride: Any = None,
                     dilation: Any = 1, padding: Any = 0, output_size: Any = None) -> "Tensor":
        """Inverse of max_pool2d(return_indices=True): values go back to their flat positions."""
        bs, c, *spatial = self.shape
        if indices.shape != self.shape:
            raise ShapeError(f"max_unpool: indices {indices.shape} must have the input's shape {self.shape}")
        if output_size is None:
            n = len(spatial)
            k_ = _tuple(kernel_size, n, "kernel_size")
            s_ = _tuple(stride if stride is not None else k_, n, "stride")
            d_ = _tuple(dilation, n, "dilation")
            p_ = _grouped(_flat_pads(padding, n))
            output_size = tuple((i - 1) * s - (pb + pa) + (d * (k - 1) + 1)
                                for i, k, d, s, (pb, pa) in zip(spatial, k_, d_, s_, p_))
        else:
            output_size = tuple(output_size)[-len(spatial):]
        size = math.prod(output_size)
        onehot = indices.reshape(bs, c, -1, 1).eq(type(self).arange(size, device=self.device, dtype=indices.dtype))
        vals = onehot.where(self.reshape(bs, c, -1, 1), 0).sum(2, dtype=self.dtype)
        # overlapping windows can report one position several times, always with the same value
        count = onehot.cast(self.dtype).sum(2, dtype=self.dtype).maximum(1)
        return (vals / count).reshape(bs, c, *output_size)

    # ---------------------------------------------------------------------------------------------
    def interpolate(self: "Tensor", size: Any = None, mode: str = "linear", align_corners: bool = False,
                    scale_factor: Any = None) -> "Tensor":
        """Resize the last len(size) axes; mode 'nearest', 'nearest-exact' or 'linear' (bi/trilinear)."""
        mode = {"bilinear": "linear", "trilinear": "linear"}.get(mode, mode)
        if mode not in ("linear", "nearest", "nearest-exact"):
            raise InvalidArgumentError(f"interpolate: mode must be 'nearest', 'nearest-exact' or 'linear', got "
                                       f"{mode!r}")
        if align_corners and mode != "linear":
            raise InvalidArgumentError("interpolate: align_corners only applies to linear modes")
        if size is None:
            if scale_factor is None:
                raise InvalidArgumentError("interpolate: give size or scale_factor")
            n = self.ndim - 2 if isinstance(scale_factor, (int, float)) else len(scale_factor)
            sf = (scale_factor,) * n if isinstance(scale_factor, (int, float)) else tuple(scale_factor)
            size = tuple(int(math.floor(s * f)) for s, f in zip(self.shape[-n:], sf))
        size = (size,) * (self.ndim - 2) if isinstance(size, int) else tuple(size)
        if not 0 < len(size) <= self.ndim:
            raise InvalidArgumentError(f"interpolate: size {size} must name between 1 and {self.ndim} trailing axes")
        if mode == "linear" and self.dtype is dtypes.uint8:  # torch's separable integer path, bit for bit
            x = self
            for i in range(-1, -len(size) - 1, -1):
                x = _uint8_linear_pass(x, x.ndim + i, size[i], align_corners)
            return x
        x, expand = self.cast(dtypes.float32) if not self.dtype.is_float else self, list(self.shape)
        for i in range(-1, -len(size) - 1, -1):
            n_in, n_out = self.shape[i], size[i]
            scale = (n_in - 1) / (n_out - 1) if align_corners and n_out > 1 else (0.0 if align_corners else
                                                                                   n_in / n_out)
            arr = type(self).arange(n_out, dtype=dtypes.float32, device=self.device)
            shape = [1] * self.ndim
            shape[i] = expand[i] = n_out
            if mode == "linear":
                pos = scale * arr if align_corners else (scale * (arr + 0.5) - 0.5)
                pos = pos.maximum(0).minimum(n_in - 1)
                low = pos.floor()
                high = (low + 1).minimum(n_in - 1)
                frac = (pos - low).reshape(shape).expand(expand)
                lo_i = low.cast(dtypes.int32).reshape(shape).expand(expand)
                hi_i = high.cast(dtypes.int32).reshape(shape).expand(expand)
                a, b = x.gather(i, lo_i), x.gather(i, hi_i)
                x = a + (b - a) * frac.cast(x.dtype)
            else:
                pos = scale * (arr + 0.5) if mode == "nearest-exact" else scale * arr
                idx = pos.floor().minimum(n_in - 1).cast(dtypes.int32).reshape(shape).expand(expand)
                x = x.gather(i, idx)
        return x.cast(self.dtype)

    # ---------------------------------------------------------------------------------------------
    # layers as functions
    def linear(self: "Tensor", weight: "Tensor", bias: "Tensor | None" = None, dtype: Any = None) -> "Tensor":
        """x @ weight + bias with weight (in, out) as in tinygrad (torch's F.linear takes weight.T); with dtype,
        everything is cast to it first (tinygrad)."""
        if dtype is not None:
            return self.cast(dtype).linear(weight.cast(dtype), bias.cast(dtype) if bias is not None else None)
        x = self * weight if weight.ndim == 1 else self.matmul(weight)
        return x if bias is None else x + bias

    def newton_schulz(self: "Tensor", steps: int, params: Sequence[float], eps: float = 1e-7) -> "Tensor":
        """The Newton-Schulz iteration for an odd matrix polynomial over the last two axes (tinygrad, Muon):
        G = X / (||X|| + eps), then `steps` times G = sum_i params[i] * (G G^T)^i G."""
        if self.ndim < 2:
            raise ShapeError(f"newton_schulz needs a matrix (at least 2 dims), got shape {self.shape}")
        if self.shape[-2] > self.shape[-1]:
            return self.transpose(-2, -1).newton_schulz(steps, params, eps).transpose(-2, -1)
        g = self / (self.square().sum(axis=(-2, -1), keepdim=True).sqrt() + eps)
        for _ in range(steps):
            gram = g @ g.transpose(-2, -1)
            term, acc = g, None
            for i, c in enumerate(params):
                if i:
                    term = gram @ term
                acc = term * c if acc is None else acc + term * c
            g = acc
        return g

    def normalize(self: "Tensor", p: float = 2.0, dim: int = 1, eps: float = 1e-12) -> "Tensor":
        """x / max(||x||_p along dim, eps) (torch.nn.functional.normalize; tinygrad's type(self).normalize).
        The norm of float16/bfloat16 input is computed in float32 and rounded once, as torch's."""
        if p == 0:
            norm = self.ne(0).sum(dim, keepdim=True).cast(least_upper_float(self.dtype))
        elif p == float("inf"):
            norm = self.abs().max(dim, keepdim=True)
        else:
            wide = self.cast(dtypes.float32) if self.dtype in HALF_TYPES else self
            norm = wide.abs().pow(p).sum(dim, keepdim=True).pow(1.0 / p).cast(least_upper_float(self.dtype))
        return self / norm.maximum(eps)

    @float_math
    def layernorm(self: "Tensor", axis: Any = -1, eps: float = 1e-5) -> "Tensor":
        """Normalise to zero mean and unit variance over `axis` (no affine part); float16/bfloat16 in float32."""
        y = self - self.mean(axis, keepdim=True)
        return y * (y * y).mean(axis, keepdim=True).add(eps).rsqrt()

    def batchnorm(self: "Tensor", weight: "Tensor | None", bias: "Tensor | None", mean: "Tensor",
                  invstd: "Tensor", axis: Any = 1) -> "Tensor":
        """(x - mean) * weight * invstd + bias with per-channel statistics along `axis` (tinygrad)."""
        axes = (axis,) if isinstance(axis, int) else tuple(axis)
        axes = tuple(a % self.ndim for a in axes)
        shape = tuple(s if i in axes else 1 for i, s in enumerate(self.shape))
        x = self - mean.reshape(shape)
        if weight is not None:
            x = x * weight.reshape(shape)
        out = x * (invstd.reshape(shape) if invstd.ndim == len(axes) else invstd)
        return out + bias.reshape(shape) if bias is not None else out

    def dropout(self: "Tensor", p: float = 0.5) -> "Tensor":
        """Zero elements with probability p and scale the rest by 1/(1-p), only in training mode."""
        if not 0.0 <= p <= 1.0:
            raise InvalidArgumentError(f"dropout probability must be in [0, 1], got {p}")
        if not (type(self).training or config.get("TRAINING")) or p == 0:
            return self
        if p == 1:
            return self * 0
        keep = type(self).rand(*self.shape, device=self.device, _runtime=self._runtime) >= p
        return keep.where(self, 0) * (1.0 / (1.0 - p))

    def scaled_dot_product_attention(self: "Tensor", key: "Tensor", value: "Tensor", attn_mask: Any = None,
                                     dropout_p: float = 0.0, is_causal: bool = False,
                                     scale: float | None = None, enable_gqa: bool = False) -> "Tensor":
        """softmax(q @ k^T * scale + mask) @ v; a bool mask keeps True; is_causal masks the future. With
        enable_gqa, key/value heads (dim -3) are repeated to the query's head count (grouped-query attention).
        attn_mask together with is_causal is an error, as in torch and tinygrad: fold the causal part into
        the mask (mask & type(self).ones(L, S, dtype=dtypes.bool).tril())."""
        if is_causal and attn_mask is not None:
            raise InvalidArgumentError("scaled_dot_product_attention: pass attn_mask or is_causal, not both (fold "
                                       "the causal mask into attn_mask)")
        if enable_gqa and key.ndim >= 3 and key.shape[-3] != self.shape[-3]:
            heads, kv = self.shape[-3], key.shape[-3]
            if heads % kv:
                raise ShapeError(f"enable_gqa: {heads} query heads are not a multiple of {kv} key/value heads")
            key = key.repeat_interleave(heads // kv, dim=-3)
            value = value.repeat_interleave(heads // kv, dim=-3)
        q_len, k_len = self.shape[-2], key.shape[-2]
        if is_causal:
            attn_mask = type(self).ones(q_len, k_len, dtype=dtypes.bool, device=self.device).tril(0)
        scale = 1.0 / math.sqrt(self.shape[-1]) if scale is None else scale
        scores = self.matmul(key.transpose(-2, -1)) * scale
        if attn_mask is not None:
            if attn_mask.dtype is dtypes.bool:
                scores = attn_mask.where(scores, float("-inf"))
            else:
                scores = scores + attn_mask
        return scores.softmax(-1).dropout(dropout_p).matmul(value)

    def one_hot(self, num_classes: int = -1) -> "Tensor":
        """Integer classes -> int32 one-hot along a new last axis; num_classes=-1 reads max()+1 (a sync).

        A class outside [0, num_classes) raises InvalidArgumentError (torch's RuntimeError) when the values
        are on the host (docs/tensor-semantics.md); a lazy one gives an all-zero row."""
        if self.dtype.is_float:
            raise DTypeError(f"one_hot needs integer classes, got {self.dtype}; cast with .int() first")
        if num_classes < -1:
            raise InvalidArgumentError(f"one_hot: num_classes must be non-negative (or -1 to infer it), got "
                                       f"{num_classes}")
        host = host_values(self)
        bounds = None if host is None or host.size == 0 else (int(host.min()), int(host.max()))
        if num_classes == -1:
            if self.numel() == 0:
                raise InvalidArgumentError("one_hot: cannot infer the number of classes of an empty tensor; pass "
                                           "num_classes")
            if bounds is None:
                bounds = tuple(int(v) for v in type(self).stack(self.min(), self.max()).tolist())
            num_classes = bounds[1] + 1
        if bounds is not None and (bounds[0] < 0 or bounds[1] >= num_classes):
            bad = bounds[0] if bounds[0] < 0 else bounds[1]
            raise InvalidArgumentError(f"one_hot: class value {bad} is outside [0, {num_classes}); class values "
                                       "must be non-negative and smaller than num_classes")
        return self.unsqueeze(-1).eq(type(self).arange(num_classes, device=self.device, dtype=self.dtype)).cast(
            dtypes.int32)

    def sequential(self, layers: Sequence[Any]) -> "Tensor":
        """Apply callables in order: x.sequential([f, g]) is g(f(x))."""
        x = self
        for f in layers:
            x = f(x)
        return x


def _uint8_taps(n_in: int, n_out: int, align_corners: bool) -> tuple[list[int], list[list[int]], int]:
    """Linear-interpolation taps for one axis as torch computes them for uint8 images: per output the first
    input index and up to two weights (triangle filter, normalised, then int16 fixed point with `bits`
    fractional bits, the most that keeps the largest weight below 2**15)."""
    if align_corners:
        scale = (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
    else:
        scale = n_in / n_out
    starts, weights = [], []
    for i in range(n_out):
        center = scale * i + 0.5 if align_corners else scale * (i + 0.5)
        lo, hi = max(int(center - 0.5), 0), min(int(center + 1.5), n_in)
        w = [max(0.0, 1.0 - abs(j + lo - center + 0.5)) for j in range(hi - lo)]
        total = sum(w)
        starts.append(lo)
        weights.append([v / total if total else 0.0 for v in w])
    top = max(max(w) for w in weights)
    bits = 0
    while bits < 22 and int(0.5 + top * (1 << (bits + 1))) < (1 << 15):
        bits += 1
    return starts, [[int(v * (1 << bits) + 0.5) for v in w] for w in weights], bits


def _uint8_linear_pass(x: "Tensor", axis: int, n_out: int, align_corners: bool) -> "Tensor":
    """Resize one axis of a uint8 tensor: sum of taps * int weights, rounded half up, clamped to [0, 255]."""

    starts, weights, bits = _uint8_taps(x.shape[axis], n_out, align_corners)
    shape = [1] * x.ndim
    shape[axis] = n_out
    out_shape = tuple(n_out if d == axis else s for d, s in enumerate(x.shape))
    acc = None
    for k in range(2):
        idx = np.array([s + min(k, len(w) - 1) for s, w in zip(starts, weights)], np.int32)
        wk = np.array([w[k] if k < len(w) else 0 for w in weights], np.int32)
        idx_t = type(x)(idx, device=x.device, _runtime=x._runtime).reshape(shape).expand(out_shape)
        w_t = type(x)(wk, device=x.device, _runtime=x._runtime).reshape(shape)
        term = x.gather(axis, idx_t).cast(dtypes.int32) * w_t
        acc = term if acc is None else acc + term
    return ((acc + (1 << (bits - 1))) >> bits).clip(0, 255).cast(dtypes.uint8)


def _string_padding(padding: str, hw: tuple[int, ...], d_: tuple[int, ...], s_: tuple[int, ...]) -> list[int]:
    if padding == "valid":
        return [0] * (2 * len(hw))
    if padding != "same":
        raise InvalidArgumentError(f"padding string must be 'same' or 'valid', got {padding!r}")
    if any(s != 1 for s in s_):
        raise InvalidArgumentError("padding='same' needs stride 1 (as in PyTorch)")
    flat = []
    for k, d in reversed(list(zip(hw, d_))):
        total = d * (k - 1)
        flat += [total // 2, total - total // 2]
    return flat
