"""Parameter initialisers for the nn layers, matching torch.nn's default distributions.

Stage: model construction. Input: a shape and a device/dtype. Output: a fresh Tensor (lazy for
random ones, a host-built buffer for constants) flagged as a parameter or a buffer.

Constants are built from host arrays rather than `Tensor.full`, because constant graphs are
hash-consed: two `ones(4)` parameters would otherwise be the same graph node and share gradients.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from polygrad.dtype import dtypes, to_dtype
from polygrad.tensor import Tensor


def _dtype(dtype: Any):
    return to_dtype(dtype) if dtype is not None else dtypes.default_float


def _as_parameter(t: Tensor, requires_grad: bool = True) -> Tensor:
    t.requires_grad = requires_grad
    t._leaf = True
    return t


def uniform(shape: tuple[int, ...], bound: float, device: str | None = None, dtype: Any = None) -> Tensor:
    """U(-bound, bound): torch's default for Linear/Conv weights and biases (kaiming_uniform, a=sqrt(5))."""
    t = (Tensor.rand(*shape, device=device) * (2.0 * bound) - bound).cast(_dtype(dtype))
    return _as_parameter(t)


def normal(shape: tuple[int, ...], device: str | None = None, dtype: Any = None) -> Tensor:
    """N(0, 1): torch's default for Embedding weights."""
    return _as_parameter(Tensor.randn(*shape, device=device).cast(_dtype(dtype)))


def constant(shape: tuple[int, ...], value: float, device: str | None = None, dtype: Any = None,
             requires_grad: bool = True) -> Tensor:
    """A tensor of `value` in its own buffer (a parameter, or a buffer with requires_grad=False)."""
    dt = _dtype(dtype)
    host = np.full(shape, value, dtype=np.float32 if dt is dtypes.bfloat16 else dt.np)
    return _as_parameter(Tensor(host, device=device, dtype=dt), requires_grad)


def fan_in_bound(fan_in: int) -> float:
    """1/sqrt(fan_in), the bound torch's kaiming_uniform(a=sqrt(5)) and bias init both reduce to."""
    return 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0
