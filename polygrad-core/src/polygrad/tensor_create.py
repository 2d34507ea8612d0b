"""Tensor creation beyond buffers and constants: ranges, grids, random tensors and initialisers.

Stage: graph construction. Input: shapes and parameters. Output: lazy tensors computed in-kernel
(IOTA for ranges, Threefry for random bits), so nothing of the output's size is built on the host.
"""
from __future__ import annotations

import math
from typing import Any

from polygrad.errors import InvalidArgumentError
from polygrad.dtype import dtypes, to_dtype


def _shape(shape: tuple) -> tuple[int, ...]:
    from polygrad.tensor import _shape_arg
    return _shape_arg(shape)


def _leaf(t, requires_grad: bool | None):
    t.requires_grad = requires_grad
    t._leaf = True
    return t


class CreationMixin:
    """Static constructors (and *_like methods) for Tensor."""

    __slots__ = ()

    @staticmethod
    def linspace(start: float, stop: float, steps: int, **kw: Any):
        """steps evenly spaced values from start to stop inclusive (torch's symmetric formula)."""
        from polygrad.tensor import Tensor
        if not isinstance(steps, int) or steps < 0:
            raise InvalidArgumentError(f"linspace: steps must be a non-negative integer, got {steps!r}")
        dt = to_dtype(kw.pop("dtype", None) or dtypes.default_float)
        requires_grad = kw.pop("requires_grad", None)
        if steps <= 1:
            return _leaf(Tensor.full((steps,), start, dtype=dt, **kw), requires_grad)
        step = (stop - start) / (steps - 1)
        work = dtypes.float64 if dt is dtypes.float64 or not dt.is_float else dtypes.float32
        i = Tensor.arange(steps, dtype=work, **kw)
        low = i * step + start
        high = stop - (steps - 1 - i) * step
        return _leaf((i < steps // 2).where(low, high).cast(dt), requires_grad)

    @staticmethod
    def eye(n: int, m: int | None = None, **kw: Any):
        """The n x m identity matrix (m defaults to n)."""
        from polygrad.tensor import Tensor
        m = n if m is None else m
        if n < 0 or m < 0:
            raise InvalidArgumentError(f"eye: sizes must be non-negative, got n={n}, m={m}")
        dt = to_dtype(kw.pop("dtype", None) or dtypes.default_float)
        requires_grad = kw.pop("requires_grad", None)
        if n == 0 or m == 0:
            return _leaf(Tensor.zeros(n, m, dtype=dt, **kw), requires_grad)
        rows = Tensor.arange(n, dtype=dtypes.int32, **kw).reshape(n, 1)
        cols = Tensor.arange(m, dtype=dtypes.int32, **kw).reshape(1, m)
        return _leaf(rows.eq(cols).cast(dt), requires_grad)

    def meshgrid(self, *others: Any, indexing: str = "ij") -> tuple:
        """Coordinate grids from 1-d tensors: indexing 'ij' (matrix) or 'xy' (Cartesian)."""
        if indexing not in ("ij", "xy"):
            raise InvalidArgumentError(f"meshgrid indexing must be 'ij' or 'xy', got {indexing!r}")
        ts = [self, *others]
        if any(t.ndim > 1 for t in ts):
            raise InvalidArgumentError(f"meshgrid takes 0-d or 1-d tensors, got shapes {[t.shape for t in ts]}")
        ts = [t.reshape(-1) for t in ts]
        shape = [t.shape[0] for t in ts]
        if indexing == "xy" and len(ts) >= 2:
            shape[0], shape[1] = shape[1], shape[0]
        out = []
        for i, t in enumerate(ts):
            axis = i
            if indexing == "xy" and i < 2 and len(ts) >= 2:
                axis = 1 - i
            view = [1] * len(ts)
            view[axis] = t.shape[0]
            out.append(t.reshape(view).expand(shape))
        return tuple(out)

    # ---- random
    @staticmethod
    def randint(*shape: Any, low: int = 0, high: int = 10, **kw: Any):
        """Uniform integers in [low, high)."""
        from polygrad import random
        return random.randint(_shape(shape), low, high, **kw)

    @staticmethod
    def normal(*shape: Any, mean: float = 0.0, std: float = 1.0, **kw: Any):
        """Normal samples with the given mean and standard deviation (std >= 0)."""
        from polygrad.tensor import Tensor
        if std < 0:
            raise InvalidArgumentError(f"normal: std must be non-negative, got {std}")
        requires_grad = kw.pop("requires_grad", None)
        return _leaf(Tensor.randn(*shape, **kw) * std + mean, requires_grad)

    @staticmethod
    def uniform(*shape: Any, low: float = 0.0, high: float = 1.0, **kw: Any):
        """Uniform samples in [low, high) (low < high)."""
        from polygrad.tensor import Tensor
        if not low < high:
            raise InvalidArgumentError(f"uniform: low ({low}) must be below high ({high})")
        requires_grad = kw.pop("requires_grad", None)
        dt = kw.pop("dtype", None)
        out = Tensor.rand(*shape, **kw) * (high - low) + low
        return _leaf(out.cast(dt) if dt is not None else out, requires_grad)

    @staticmethod
    def randperm(n: int, **kw: Any):
        """A random permutation of 0..n-1 (int32)."""
        from polygrad.tensor import Tensor
        if n < 0:
            raise InvalidArgumentError(f"randperm: n must be non-negative, got {n}")
        dt = to_dtype(kw.pop("dtype", None) or dtypes.int32)
        if n == 0:
            return Tensor.empty(0, dtype=dt, **kw)
        return Tensor.rand(n, **kw).argsort().cast(dt)

    def multinomial(self, num_samples: int = 1, replacement: bool = False):
        """Indices sampled from the categorical distribution each row of weights (1-d or 2-d) defines; int32.
        With replacement: inverse-CDF sampling; without: the num_samples largest log(u)/w keys (Efraimidis-
        Spirakis), each index at most once."""
        from polygrad.tensor import Tensor
        if not 1 <= self.ndim <= 2 or num_samples < 1:
            raise InvalidArgumentError(f"multinomial: weights must be 1-d or 2-d and num_samples >= 1, got shape "
                                       f"{self.shape} and {num_samples}")
        w = (self.reshape(1, -1) if self.ndim == 1 else self).cast(dtypes.float32)
        rows, n = w.shape
        if not replacement and num_samples > n:
            raise InvalidArgumentError(f"multinomial: {num_samples} samples without replacement from {n} categories")
        if replacement or num_samples == 1:
            cdf = w.cumsum(1)
            cdf = cdf / cdf[:, -1:]
            u = Tensor.rand(num_samples, rows, 1, device=self.device, _runtime=self._runtime)
            idx = (u >= cdf.reshape(1, rows, n)).sum(-1, dtype=dtypes.int32).minimum(n - 1).permute(1, 0)
        else:
            u = Tensor.rand(rows, n, device=self.device, _runtime=self._runtime)
            idx = (u.log() / w).topk(num_samples, dim=1)[1].cast(dtypes.int32)
        return idx.reshape(-1) if self.ndim == 1 else idx

    def rand_like(self, **kw: Any):
        from polygrad.tensor import Tensor
        dt = kw.pop("dtype", self.dtype if self.dtype.is_float else dtypes.default_float)
        return Tensor.rand(*self.shape, dtype=dt, device=kw.pop("device", self.device), _runtime=self._runtime, **kw)

    def randn_like(self, **kw: Any):
        from polygrad.tensor import Tensor
        dt = kw.pop("dtype", self.dtype if self.dtype.is_float else dtypes.default_float)
        return Tensor.randn(*self.shape, dtype=dt, device=kw.pop("device", self.device), _runtime=self._runtime, **kw)

    def empty_like(self, **kw: Any):
        from polygrad.tensor import Tensor
        return Tensor.empty(*self.shape, dtype=kw.pop("dtype", self.dtype), device=kw.pop("device", self.device),
                            _runtime=self._runtime, **kw)

    # ---- initialisers (tinygrad's formulas)
    @staticmethod
    def scaled_uniform(*shape: Any, **kw: Any):
        """Uniform in [-1, 1) scaled by 1/sqrt(numel)."""
        from polygrad.tensor import Tensor
        shp = _shape(shape)
        return Tensor.uniform(*shp, low=-1.0, high=1.0, **kw) * (math.prod(shp) ** -0.5)

    @staticmethod
    def glorot_uniform(*shape: Any, **kw: Any):
        """Glorot/Xavier uniform: bound sqrt(6 / (fan_in + fan_out))."""
        from polygrad.tensor import Tensor
        shp = _shape(shape)
        bound = math.sqrt(6 / (shp[0] + math.prod(shp[1:])))
        return Tensor.uniform(*shp, low=-bound, high=bound, **kw)

    @staticmethod
    def kaiming_uniform(*shape: Any, a: float = 0.01, **kw: Any):
        """He uniform for a leaky ReLU of slope a: bound sqrt(3) * gain / sqrt(fan_in)."""
        from polygrad.tensor import Tensor
        shp = _shape(shape)
        bound = math.sqrt(3.0) * math.sqrt(2.0 / (1 + a ** 2)) / math.sqrt(math.prod(shp[1:]))
        return Tensor.uniform(*shp, low=-bound, high=bound, **kw)

    @staticmethod
    def kaiming_normal(*shape: Any, a: float = 0.01, **kw: Any):
        """He normal for a leaky ReLU of slope a: std gain / sqrt(fan_in)."""
        from polygrad.tensor import Tensor
        shp = _shape(shape)
        std = math.sqrt(2.0 / (1 + a ** 2)) / math.sqrt(math.prod(shp[1:]))
        return Tensor.normal(*shp, mean=0.0, std=std, **kw)
