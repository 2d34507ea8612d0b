"""Layers with parameters: Linear, Embedding, Dropout, LSTMCell and the convolutions.

Stage: model construction and forward graphs. Input: constructor arguments as torch.nn takes them,
then input Tensors. Output: Tensor graphs (lazy) built from Tensor methods, so autograd is automatic.

Layers are plain classes with Tensor attributes and `__call__` (tinygrad style); parameter names,
shapes and initial distributions match torch.nn so that state dicts move across unchanged.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

from polygrad.config import get as get_setting
from polygrad.nn import init
from polygrad.nn.quant import QuantWeight
from polygrad.dtype import dtypes
from polygrad.tensor import Tensor
from polygrad.tensor_movement import _tuple
from polygrad.tensor_indexing import check_host_index, take


def is_training() -> bool:
    """True inside `with Context(TRAINING=1):` (or after `Tensor.training = True`)."""
    return bool(get_setting("TRAINING"))




class Linear:
    """y = x @ weight.T + bias, weight (out_features, in_features); both U(-1/sqrt(in), 1/sqrt(in)).

    >>> Linear(3, 2)(Tensor.ones(4, 3)).shape
    (4, 2)
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device: str | None = None,
                 dtype: Any = None):
        bound = init.fan_in_bound(in_features)
        self.weight = init.uniform((out_features, in_features), bound, device, dtype)
        self.bias = init.uniform((out_features,), bound, device, dtype) if bias else None

    def __call__(self, x: Tensor) -> Tensor:
        if isinstance(self.weight, QuantWeight):  # polygrad.quantize: dequantized inside the matmul's kernel
            y = self.weight.matmul_t(x)
        else:
            y = x.matmul(self.weight.T)
        return y + self.bias if self.bias is not None else y


class Embedding:
    """Rows of `weight` (num_embeddings, embedding_dim), initialised N(0, 1) like torch.

    `padding_idx` starts as a zero row and never receives a gradient.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None,
                 device: str | None = None, dtype: Any = None):
        if padding_idx is not None and not -num_embeddings <= padding_idx < num_embeddings:
            raise ValueError(f"padding_idx {padding_idx} must lie in [-{num_embeddings}, {num_embeddings})")
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.padding_idx = None if padding_idx is None else padding_idx % num_embeddings
        self.weight = init.normal((num_embeddings, embedding_dim), device, dtype)
        if self.padding_idx is not None:
            keep = Tensor.arange(num_embeddings, device=self.weight.device).ne(self.padding_idx)
            self.weight = init._as_parameter(keep.reshape(-1, 1).where(self.weight, 0).contiguous().realize())

    def __call__(self, idx: Tensor) -> Tensor:
        if idx.dtype.is_float:
            raise TypeError(f"Embedding indices must be integers, got {idx.dtype}; cast with .int()")
        check_host_index(idx, self.num_embeddings, 0)
        if isinstance(self.weight, QuantWeight):  # polygrad.quantize: only the rows looked up are dequantized
            return self.weight.rows(idx)
        weight = self.weight
        if self.padding_idx is not None:  # evaluated only at the rows looked up
            rows = Tensor.arange(self.num_embeddings, device=self.weight.device, dtype=dtypes.int32)
            weight = rows.ne(self.padding_idx).reshape(-1, 1).where(weight, weight.detach())
        # one indexed load per output element; the weight's gradient is a scatter-add of the rows.
        # A lazy index outside [0, num_embeddings) reads a zero row (docs/tensor-semantics.md).
        return take(weight, 0, idx)


class Dropout:
    """Zero each element with probability p in training mode and scale the rest by 1/(1-p)."""

    def __init__(self, p: float = 0.5):
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability must be in [0, 1], got {p}")
        self.p = p

    def __call__(self, x: Tensor) -> Tensor:
        return x.dropout(self.p) if is_training() else x


class LSTMCell:
    """One LSTM step, torch's gate order (input, forget, cell, output); all weights U(-1/sqrt(h), 1/sqrt(h)).

    `cell(x, (h, c)) -> (h', c')`; the state defaults to zeros.
    """

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, device: str | None = None,
                 dtype: Any = None):
        bound = init.fan_in_bound(hidden_size)
        self.hidden_size = hidden_size
        self.weight_ih = init.uniform((4 * hidden_size, input_size), bound, device, dtype)
        self.weight_hh = init.uniform((4 * hidden_size, hidden_size), bound, device, dtype)
        self.bias_ih = init.uniform((4 * hidden_size,), bound, device, dtype) if bias else None
        self.bias_hh = init.uniform((4 * hidden_size,), bound, device, dtype) if bias else None

    def __call__(self, x: Tensor, hc: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor]:
        batched = x.ndim == 2
        if not batched:
            x = x.unsqueeze(0)
        if hc is None:
            zeros = Tensor.zeros(x.shape[0], self.hidden_size, device=x.device, dtype=x.dtype)
            h, c = zeros, zeros
        else:
            h, c = (s if batched else s.unsqueeze(0) for s in hc)
        gates = x.matmul(self.weight_ih.T) + h.matmul(self.weight_hh.T)
        if self.bias_ih is not None:
            gates = gates + self.bias_ih + self.bias_hh
        n = self.hidden_size
        i, f, g, o = (gates.shrink((None, (k * n, (k + 1) * n))) for k in range(4))
        c_new = f.sigmoid() * c + i.sigmoid() * g.tanh()
        h_new = o.sigmoid() * c_new.tanh()
        if not batched:
            return h_new.squeeze(0), c_new.squeeze(0)
        return h_new, c_new


# -------------------------------------------------------------------------------------------------
# convolutions


class _ConvNd:
    """Shared construction for Conv1d/Conv2d (weight (out, in/groups, *kernel))."""

    dims = 2

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int | Sequence[int], stride: Any = 1,
                 padding: Any = 0, dilation: Any = 1, groups: int = 1, bias: bool = True,
                 padding_mode: str = "zeros", device: str | None = None, dtype: Any = None):
        if in_channels % groups or out_channels % groups:
            raise ValueError(f"in_channels ({in_channels}) and out_channels ({out_channels}) must both be "
                             f"divisible by groups ({groups})")
        if padding_mode not in ("zeros", "reflect", "replicate", "circular"):
            raise ValueError(f"padding_mode must be 'zeros', 'reflect', 'replicate' or 'circular', got "
                             f"{padding_mode!r}")
        self.kernel_size = _tuple(kernel_size, self.dims, "kernel_size")
        self.stride = _tuple(stride, self.dims, "stride")
        self.dilation = _tuple(dilation, self.dims, "dilation")
        self.padding = padding if isinstance(padding, str) else _tuple(padding, self.dims, "padding")
        if self.padding == "same" and any(s != 1 for s in self.stride):
            raise ValueError("padding='same' needs stride 1 (as in torch); pass explicit padding instead")
        if isinstance(self.padding, str) and self.padding not in ("same", "valid"):
            raise ValueError(f"padding must be ints, 'same' or 'valid', got {padding!r}")
        self.groups, self.padding_mode = groups, padding_mode
        bound = init.fan_in_bound(in_channels // groups * math.prod(self.kernel_size))
        self.weight = init.uniform((out_channels, in_channels // groups, *self.kernel_size), bound, device, dtype)
        self.bias = init.uniform((out_channels,), bound, device, dtype) if bias else None

    def _pad_pairs(self) -> list[tuple[int, int]]:
        if self.padding == "valid":
            return [(0, 0)] * self.dims
        if self.padding == "same":
            totals = [d * (k - 1) for d, k in zip(self.dilation, self.kernel_size)]
            return [(t // 2, t - t // 2) for t in totals]
        return [(p, p) for p in self.padding]

    def __call__(self, x: Tensor) -> Tensor:
        pairs = self._pad_pairs()
        symmetric = all(a == b for a, b in pairs)
        if self.padding_mode != "zeros" or not symmetric:
            mode = "constant" if self.padding_mode == "zeros" else self.padding_mode
            x = x.pad([(0, 0)] * (x.ndim - self.dims) + pairs, mode=mode)
            pad: Any = 0
        else:
            pad = tuple(a for a, _ in pairs)
        return x.conv2d(self.weight, self.bias, groups=self.groups, stride=self.stride, dilation=self.dilation,
                        padding=pad)


class Conv1d(_ConvNd):
    """1-D convolution over (N, C, L), torch.nn.Conv1d's arguments and initialisation."""

    dims = 1


class Conv2d(_ConvNd):
    """2-D convolution over (N, C, H, W), torch.nn.Conv2d's arguments and initialisation.

    >>> Conv2d(1, 2, 3)(Tensor.ones(1, 1, 5, 5)).shape
    (1, 2, 3, 3)
    """

    dims = 2


class _ConvTransposeNd:
    """Shared construction for ConvTranspose1d/2d (weight (in, out/groups, *kernel))."""

    dims = 2

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int | Sequence[int], stride: Any = 1,
                 padding: Any = 0, output_padding: Any = 0, groups: int = 1, bias: bool = True, dilation: Any = 1,
                 device: str | None = None, dtype: Any = None):
        if in_channels % groups or out_channels % groups:
            raise ValueError(f"in_channels ({in_channels}) and out_channels ({out_channels}) must both be "
                             f"divisible by groups ({groups})")
        self.kernel_size = _tuple(kernel_size, self.dims, "kernel_size")
        self.stride = _tuple(stride, self.dims, "stride")
        self.padding = _tuple(padding, self.dims, "padding")
        self.output_padding = _tuple(output_padding, self.dims, "output_padding")
        self.dilation = _tuple(dilation, self.dims, "dilation")
        if any(op >= max(s, d) for op, s, d in zip(self.output_padding, self.stride, self.dilation)):
            raise ValueError(f"output_padding {self.output_padding} must be smaller than stride or dilation")
        self.groups = groups
        # torch computes fan_in from weight.shape[1] (out/groups) times the kernel size
        bound = init.fan_in_bound(out_channels // groups * math.prod(self.kernel_size))
        self.weight = init.uniform((in_channels, out_channels // groups, *self.kernel_size), bound, device, dtype)
        self.bias = init.uniform((out_channels,), bound, device, dtype) if bias else None

    def __call__(self, x: Tensor) -> Tensor:
        return x.conv_transpose2d(self.weight, self.bias, groups=self.groups, stride=self.stride,
                                  dilation=self.dilation, padding=self.padding, output_padding=self.output_padding)


class ConvTranspose1d(_ConvTransposeNd):
    """1-D transposed convolution, torch.nn.ConvTranspose1d's arguments and initialisation."""

    dims = 1


class ConvTranspose2d(_ConvTransposeNd):
    """2-D transposed convolution, torch.nn.ConvTranspose2d's arguments and initialisation."""

    dims = 2

