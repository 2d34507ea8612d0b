"""Normalisation layers: LayerNorm, LayerNorm2d, RMSNorm, GroupNorm, InstanceNorm, BatchNorm.

Stage: model construction and forward graphs. Input: constructor arguments as torch.nn takes them,
then input Tensors. Output: lazy Tensor graphs. BatchNorm also queues (lazy `assign`) updates of its
running statistics in training mode; the optimizer step realizes them with the parameters.
"""
from __future__ import annotations

from typing import Any, Sequence

from polygrad.dtype import dtypes, least_upper_dtype, least_upper_float
from polygrad.nn import init
from polygrad.nn.layers import is_training
from polygrad.tensor import Tensor


def normalize(x: Tensor, axes: tuple[int, ...], eps: float) -> Tensor:
    """(x - mean) / sqrt(biased var + eps) over `axes`."""
    mean = x.mean(axes, keepdim=True)
    centered = x - mean
    var = centered.square().mean(axes, keepdim=True)
    return centered * (var + eps).rsqrt()


# float16/bfloat16 inputs are normalised in float32 and rounded once at the end, as torch's CPU kernels do:
# in half precision the squares overflow from |x| = 256 and every intermediate rounding adds an error
def _wide(x: Tensor) -> Tensor:
    """x in the dtype the statistics are computed in: float32 for float16/bfloat16, else its float type."""
    dt = least_upper_float(x.dtype)
    return x.cast(dtypes.float32 if dt in (dtypes.float16, dtypes.bfloat16) else dt)


def _affine(x: Tensor, y: Tensor, weight: Tensor | None, bias: Tensor | None, shape: tuple[int, ...] | None = None):
    """y * weight + bias (y computed from _wide(x)), rounded once to the dtype the layer returns."""
    params = [p for p in (weight, bias) if p is not None]
    if weight is not None:
        y = y * (weight if shape is None else weight.reshape(shape))
    if bias is not None:
        y = y + (bias if shape is None else bias.reshape(shape))
    return y.cast(least_upper_dtype(least_upper_float(x.dtype), *(p.dtype for p in params)))


def _channel_shape(x: Tensor) -> tuple[int, ...]:
    """Broadcast shape of a per-channel (axis 1) vector against x."""
    return (1, x.shape[1]) + (1,) * (x.ndim - 2)


class LayerNorm:
    """Normalise over the trailing `normalized_shape` dims; weight ones, bias zeros (torch defaults)."""

    def __init__(self, normalized_shape: int | Sequence[int], eps: float = 1e-5, elementwise_affine: bool = True,
                 bias: bool = True, device: str | None = None, dtype: Any = None):
        self.normalized_shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        self.eps = eps
        affine = elementwise_affine
        self.weight = init.constant(self.normalized_shape, 1.0, device, dtype) if affine else None
        self.bias = init.constant(self.normalized_shape, 0.0, device, dtype) if affine and bias else None

    def __call__(self, x: Tensor) -> Tensor:
        n = len(self.normalized_shape)
        if x.shape[x.ndim - n:] != self.normalized_shape:
            raise ValueError(f"LayerNorm{self.normalized_shape} got input of shape {x.shape}; its trailing dims "
                             "must equal normalized_shape")
        y = normalize(_wide(x), tuple(range(x.ndim - n, x.ndim)), self.eps)
        return _affine(x, y, self.weight, self.bias)


class LayerNorm2d(LayerNorm):
    """LayerNorm over the channel axis of (N, C, H, W) input (as in tinygrad / SAM)."""

    def __init__(self, channels: int, eps: float = 1e-5, elementwise_affine: bool = True, device: str | None = None,
                 dtype: Any = None):
        super().__init__(channels, eps, elementwise_affine, device=device, dtype=dtype)

    def __call__(self, x: Tensor) -> Tensor:
        return super().__call__(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class RMSNorm:
    """x / sqrt(mean(x^2) + eps) * weight over the trailing dims; eps=None means the epsilon of the dtype it is
    computed in (float32 for float16/bfloat16 input, as torch)."""

    def __init__(self, normalized_shape: int | Sequence[int], eps: float | None = None,
                 elementwise_affine: bool = True, device: str | None = None, dtype: Any = None):
        self.normalized_shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        self.eps = eps
        self.weight = init.constant(self.normalized_shape, 1.0, device, dtype) if elementwise_affine else None

    def __call__(self, x: Tensor) -> Tensor:
        n = len(self.normalized_shape)
        if x.shape[x.ndim - n:] != self.normalized_shape:
            raise ValueError(f"RMSNorm{self.normalized_shape} got input of shape {x.shape}; its trailing dims "
                             "must equal normalized_shape")
        axes = tuple(range(x.ndim - n, x.ndim))
        w = _wide(x)
        eps = self.eps if self.eps is not None else _finfo_eps(w.dtype)  # float32's for a half input (torch)
        y = (w * (w.square().mean(axes, keepdim=True) + eps).rsqrt()).cast(least_upper_float(x.dtype))
        return y * self.weight if self.weight is not None else y  # torch rounds before the weight


def _finfo_eps(dtype: Any) -> float:
    return {dtypes.float16: 2.0 ** -10, dtypes.bfloat16: 2.0 ** -7, dtypes.float64: 2.0 ** -52}.get(dtype, 2.0 ** -23)


class GroupNorm:
    """Normalise (N, C, *) over groups of C/num_groups channels; per-channel weight ones, bias zeros."""

    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True,
                 device: str | None = None, dtype: Any = None):
        if num_channels % num_groups:
            raise ValueError(f"num_channels ({num_channels}) must be divisible by num_groups ({num_groups})")
        self.num_groups, self.num_channels, self.eps = num_groups, num_channels, eps
        self.weight = init.constant((num_channels,), 1.0, device, dtype) if affine else None
        self.bias = init.constant((num_channels,), 0.0, device, dtype) if affine else None

    def __call__(self, x: Tensor) -> Tensor:
        if x.ndim < 2 or x.shape[1] != self.num_channels:
            raise ValueError(f"GroupNorm expects (N, {self.num_channels}, ...) input, got {x.shape}")
        grouped = _wide(x).reshape(x.shape[0], self.num_groups, -1)
        y = normalize(grouped, (2,), self.eps).reshape(x.shape)
        return _affine(x, y, self.weight, self.bias, _channel_shape(x))


class InstanceNorm:
    """Normalise each (sample, channel) over its spatial dims; like torch, affine=False by default."""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1, affine: bool = False,
                 track_running_stats: bool = False, device: str | None = None, dtype: Any = None):
        if track_running_stats:
            raise ValueError("InstanceNorm(track_running_stats=True) is not supported; use BatchNorm for "
                             "running statistics")
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.weight = init.constant((num_features,), 1.0, device, dtype) if affine else None
        self.bias = init.constant((num_features,), 0.0, device, dtype) if affine else None

    def __call__(self, x: Tensor) -> Tensor:
        if x.ndim < 3 or x.shape[1] != self.num_features:
            raise ValueError(f"InstanceNorm expects (N, {self.num_features}, *spatial) input, got {x.shape}")
        y = normalize(_wide(x), tuple(range(2, x.ndim)), self.eps)
        return _affine(x, y, self.weight, self.bias, _channel_shape(x))


class BatchNorm:
    """Batch normalisation over axis 1 of (N, C, *) input, torch.nn.BatchNorm{1,2,3}d's semantics.

    Training mode normalises with the batch statistics and updates running_mean / running_var (unbiased)
    / num_batches_tracked; evaluation uses the running statistics. `momentum=None` keeps a cumulative
    average, as in torch.
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = True,
                 track_running_stats: bool = True, device: str | None = None, dtype: Any = None):
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.track_running_stats = track_running_stats
        self.weight = init.constant((num_features,), 1.0, device, dtype) if affine else None
        self.bias = init.constant((num_features,), 0.0, device, dtype) if affine else None
        if track_running_stats:
            self.running_mean = init.constant((num_features,), 0.0, device, dtype, requires_grad=False)
            self.running_var = init.constant((num_features,), 1.0, device, dtype, requires_grad=False)
            self.num_batches_tracked = init.constant((), 0, device, dtypes.int64, requires_grad=False)
        else:
            self.running_mean = self.running_var = self.num_batches_tracked = None

    def __call__(self, x: Tensor) -> Tensor:
        if x.ndim < 2 or x.shape[1] != self.num_features:
            raise ValueError(f"BatchNorm expects (N, {self.num_features}, ...) input, got {x.shape}")
        axes = (0,) + tuple(range(2, x.ndim))
        shape = _channel_shape(x)
        w = _wide(x)
        if is_training() or not self.track_running_stats:
            mean = w.mean(axes, keepdim=True)
            centered = w - mean
            var = centered.square().mean(axes, keepdim=True)
            if is_training() and self.track_running_stats:
                self._update_running_stats(mean.reshape(-1), var.reshape(-1), x.numel() // x.shape[1])
            y = centered * (var + self.eps).rsqrt()
        else:
            y = (w - self.running_mean.reshape(shape)) * (self.running_var.reshape(shape) + self.eps).rsqrt()
        return _affine(x, y, self.weight, self.bias, shape)

    def _update_running_stats(self, mean: Tensor, var: Tensor, n: int) -> None:
        count = self.num_batches_tracked + 1
        if self.momentum is None:
            factor: Any = 1.0 / count.cast(self.running_mean.dtype)
        else:
            factor = self.momentum
        unbiased = var.detach() * (n / max(n - 1, 1))
        dt = self.running_mean.dtype
        self.running_mean.assign((self.running_mean * (1 - factor) + mean.detach() * factor).cast(dt))
        self.running_var.assign((self.running_var * (1 - factor) + unbiased * factor).cast(dt))
        self.num_batches_tracked.assign(count)


BatchNorm1d = BatchNorm
BatchNorm2d = BatchNorm
BatchNorm3d = BatchNorm
InstanceNorm1d = InstanceNorm
InstanceNorm2d = InstanceNorm
InstanceNorm3d = InstanceNorm
