"""Tensor constructors (a mixin): empty buffers, constants, ranges, grids, random tensors and initialisers.

Stage: graph construction. Input: shapes and parameters. Output: lazy tensors computed in-kernel
(IOTA for ranges; random ones from the draws of tensor_random.py), so nothing of the output's size is
built on the host.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from polygrad.device import Buffer, adopt_host_array, canonicalize
from polygrad.dtype import DType, dtype_of_python, dtypes, from_numpy, to_dtype
from polygrad.errors import InvalidArgumentError
from polygrad.tensor_common import _buffer_uop, _default_device, _fits, _prod, _shape_arg
from polygrad.uop import movement as mv
from polygrad.uop import sint
from polygrad.uop.ops import Ops, UOp

if TYPE_CHECKING:
    from polygrad.tensor import Tensor


def _shape(shape: tuple) -> tuple[int, ...]:
    return _shape_arg(shape)


def _leaf(t, requires_grad: bool | None):
    t.requires_grad = requires_grad
    t._leaf = True
    return t


class CreationMixin:
    """Static constructors (and *_like methods) for Tensor."""

    __slots__ = ()

    # creation
    @classmethod
    def empty(cls, *shape: Any, dtype: Any = None, device: str | None = None, **kw: Any) -> "Tensor":
        shape = _shape_arg(shape)
        dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
        dev = canonicalize(device if device is not None else _default_device(kw.get("_runtime")))
        # a symbolic dimension allocates for its bound value (x.shape keeps the Variable); an unbound
        # Variable declares a size (Model inputs) and allocates for its maximum
        total = _prod(shape)
        bound = sint.resolve(total)
        buf = Buffer(dev, sint.vmax(total) if bound is None else bound, dt)
        return cls(_buffer_uop(buf, shape), requires_grad=kw.get("requires_grad"),
                   _runtime=kw.get("_runtime"))._as_leaf()

    @classmethod
    def from_host_view(cls, arr: Any, device: str | None = None, **kw: Any) -> "Tensor":
        """A tensor over `arr`'s own memory, with no copy: `arr` is a read-only, C-contiguous NumPy array
        (a view of a read-only memory map, or one with `arr.flags.writeable = False`) and `device` a host
        device (CPU, X86, INTERP; another device raises DeviceError: copy with Tensor(arr) there). The
        pages stay the file's: a mapped weight costs no second copy, and is read from disk when a kernel
        first touches it. The tensor is read-only: an assign, setitem or custom kernel writing into it
        raises ReadOnlyBufferError; computing from it is free. It keeps `arr` (and its map) alive.

        >>> a = np.arange(4, dtype=np.float32); a.flags.writeable = False
        >>> (Tensor.from_host_view(a, device="CPU") * 2).tolist()  # doctest: +SKIP
        [0.0, 2.0, 4.0, 6.0]
        """
        if not isinstance(arr, np.ndarray):
            raise InvalidArgumentError(f"from_host_view needs a numpy array, got {type(arr).__name__}")
        dev = canonicalize(device if device is not None else _default_device(kw.get("_runtime")))
        buf = adopt_host_array(dev, arr, from_numpy(arr.dtype))
        return cls(_buffer_uop(buf, tuple(arr.shape)), requires_grad=kw.get("requires_grad"),
                   _runtime=kw.get("_runtime"))._as_leaf()

    def _as_leaf(self) -> "Tensor":
        self._leaf = True
        return self

    @classmethod
    def full(cls, shape: Any, fill_value: Any, dtype: Any = None, device: str | None = None, **kw: Any) -> "Tensor":
        shape = _shape_arg((shape,) if isinstance(shape, int) else tuple(shape))
        dt = to_dtype(dtype) if dtype is not None else dtype_of_python(fill_value)
        dev = canonicalize(device if device is not None else _default_device(kw.get("_runtime")))
        c = UOp.const(dt, fill_value, dev)
        u = mv.expand(mv.reshape(c, (1,) * len(shape)), shape) if shape else c
        return cls(u, requires_grad=kw.get("requires_grad"), _runtime=kw.get("_runtime"))._as_leaf()

    @classmethod
    def zeros(cls, *shape: Any, **kw: Any) -> "Tensor":
        return cls.full(_shape_arg(shape), 0.0, dtype=kw.pop("dtype", None) or dtypes.default_float, **kw)

    @classmethod
    def ones(cls, *shape: Any, **kw: Any) -> "Tensor":
        return cls.full(_shape_arg(shape), 1.0, dtype=kw.pop("dtype", None) or dtypes.default_float, **kw)

    @classmethod
    def arange(cls, start: Any, stop: Any = None, step: Any = 1, **kw: Any) -> "Tensor":
        if stop is None:
            start, stop = 0, start
        if step == 0:
            raise InvalidArgumentError("arange: step must be non-zero")
        n = max(0, math.ceil((stop - start) / step))
        is_float = any(isinstance(v, float) for v in (start, stop, step))
        given = kw.pop("dtype", None)
        dt = to_dtype(given or (dtypes.default_float if is_float else dtypes.default_int))
        if not is_float and not dt.is_float and n:
            last = start + (n - 1) * step
            if given is None and dt is dtypes.default_int and not _fits(min(start, last), max(start, last), dt):
                dt = dtypes.int64  # as torch: a range past int32 is int64 (never a silent wrap)
            if not _fits(min(start, last), max(start, last), dt):
                raise InvalidArgumentError(f"arange({start}, {stop}, {step}) is not representable in {dt}; "
                                           "pass a wider dtype (dtype=dtypes.int64)")
        if n == 0:
            return cls.empty(0, dtype=dt, **kw)
        idx = _iota(cls, n, dt, kw)
        return (idx * step + start).cast(dt) if (step != 1 or start != 0) else idx

    def full_like(self, fill_value: Any, **kw: Any) -> "Tensor":
        return type(self).full(self.shape, fill_value, dtype=kw.pop("dtype", self.dtype),
                               device=kw.pop("device", self.device), _runtime=self._runtime, **kw)

    def zeros_like(self, **kw: Any) -> "Tensor":
        return self.full_like(0, **kw)

    def ones_like(self, **kw: Any) -> "Tensor":
        return self.full_like(1, **kw)

    @classmethod
    def linspace(cls, start: float, stop: float, steps: int, **kw: Any):
        """steps evenly spaced values from start to stop inclusive (torch's symmetric formula)."""
        if not isinstance(steps, int) or steps < 0:
            raise InvalidArgumentError(f"linspace: steps must be a non-negative integer, got {steps!r}")
        dt = to_dtype(kw.pop("dtype", None) or dtypes.default_float)
        requires_grad = kw.pop("requires_grad", None)
        if steps <= 1:
            return _leaf(cls.full((steps,), start, dtype=dt, **kw), requires_grad)
        if dt is dtypes.bool:  # torch: not implemented for bool; tinygrad: ValueError
            raise InvalidArgumentError("linspace: a bool dtype cannot hold evenly spaced values; use an integer or "
                                       "float dtype and compare the result")
        step = (stop - start) / (steps - 1)
        work = dtypes.float64 if dt is dtypes.float64 or not dt.is_float else dtypes.float32
        i = cls.arange(steps, dtype=work, **kw)
        low = i * step + start
        high = stop - (steps - 1 - i) * step
        return _leaf((i < steps // 2).where(low, high).cast(dt), requires_grad)

    @classmethod
    def eye(cls, n: int, m: int | None = None, **kw: Any):
        """The n x m identity matrix (m defaults to n)."""
        m = n if m is None else m
        if n < 0 or m < 0:
            raise InvalidArgumentError(f"eye: sizes must be non-negative, got n={n}, m={m}")
        dt = to_dtype(kw.pop("dtype", None) or dtypes.default_float)
        requires_grad = kw.pop("requires_grad", None)
        if n == 0 or m == 0:
            return _leaf(cls.zeros(n, m, dtype=dt, **kw), requires_grad)
        rows = cls.arange(n, dtype=dtypes.int32, **kw).reshape(n, 1)
        cols = cls.arange(m, dtype=dtypes.int32, **kw).reshape(1, m)
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

    # ---- random (the draws themselves: tensor_random.py)
    @classmethod
    def normal(cls, *shape: Any, mean: float = 0.0, std: float = 1.0, **kw: Any):
        """Normal samples with the given mean and standard deviation (std >= 0)."""
        if std < 0:
            raise InvalidArgumentError(f"normal: std must be non-negative, got {std}")
        requires_grad = kw.pop("requires_grad", None)
        return _leaf(cls.randn(*shape, **kw) * std + mean, requires_grad)

    @classmethod
    def uniform(cls, *shape: Any, low: float = 0.0, high: float = 1.0, **kw: Any):
        """Uniform samples in [low, high) (low < high)."""
        if not low < high:
            raise InvalidArgumentError(f"uniform: low ({low}) must be below high ({high})")
        requires_grad = kw.pop("requires_grad", None)
        dt = kw.pop("dtype", None)
        out = cls.rand(*shape, **kw) * (high - low) + low
        return _leaf(out.cast(dt) if dt is not None else out, requires_grad)

    @classmethod
    def randperm(cls, n: int, **kw: Any):
        """A random permutation of 0..n-1 (int32)."""
        if n < 0:
            raise InvalidArgumentError(f"randperm: n must be non-negative, got {n}")
        dt = to_dtype(kw.pop("dtype", None) or dtypes.int32)
        if n == 0:
            return cls.empty(0, dtype=dt, **kw)
        return cls.rand(n, **kw).argsort().cast(dt)

    def multinomial(self, num_samples: int = 1, replacement: bool = False):
        """Indices sampled from the categorical distribution each row of weights (1-d or 2-d) defines; int32.
        With replacement: inverse-CDF sampling; without: the num_samples largest log(u)/w keys (Efraimidis-
        Spirakis), each index at most once."""
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
            u = type(self).rand(num_samples, rows, 1, device=self.device, _runtime=self._runtime)
            idx = (u >= cdf.reshape(1, rows, n)).sum(-1, dtype=dtypes.int32).minimum(n - 1).permute(1, 0)
        else:
            u = type(self).rand(rows, n, device=self.device, _runtime=self._runtime)
            idx = (u.log() / w).topk(num_samples, dim=1)[1].cast(dtypes.int32)
        return idx.reshape(-1) if self.ndim == 1 else idx

    def rand_like(self, **kw: Any):
        dt = kw.pop("dtype", self.dtype if self.dtype.is_float else dtypes.default_float)
        return type(self).rand(*self.shape, dtype=dt, device=kw.pop("device", self.device), _runtime=self._runtime,
                               **kw)

    def randn_like(self, **kw: Any):
        dt = kw.pop("dtype", self.dtype if self.dtype.is_float else dtypes.default_float)
        return type(self).randn(*self.shape, dtype=dt, device=kw.pop("device", self.device), _runtime=self._runtime,
                                **kw)

    def empty_like(self, **kw: Any):
        return type(self).empty(*self.shape, dtype=kw.pop("dtype", self.dtype), device=kw.pop("device", self.device),
                                _runtime=self._runtime, **kw)

    # ---- initialisers (tinygrad's formulas)
    @classmethod
    def scaled_uniform(cls, *shape: Any, **kw: Any):
        """Uniform in [-1, 1) scaled by 1/sqrt(numel)."""
        shp = _shape(shape)
        return cls.uniform(*shp, low=-1.0, high=1.0, **kw) * (math.prod(shp) ** -0.5)

    @classmethod
    def glorot_uniform(cls, *shape: Any, **kw: Any):
        """Glorot/Xavier uniform: bound sqrt(6 / (fan_in + fan_out))."""
        shp = _shape(shape)
        bound = math.sqrt(6 / (shp[0] + math.prod(shp[1:])))
        return cls.uniform(*shp, low=-bound, high=bound, **kw)

    @classmethod
    def kaiming_uniform(cls, *shape: Any, a: float = 0.01, **kw: Any):
        """He uniform for a leaky ReLU of slope a: bound sqrt(3) * gain / sqrt(fan_in)."""
        shp = _shape(shape)
        bound = math.sqrt(3.0) * math.sqrt(2.0 / (1 + a ** 2)) / math.sqrt(math.prod(shp[1:]))
        return cls.uniform(*shp, low=-bound, high=bound, **kw)

    @classmethod
    def kaiming_normal(cls, *shape: Any, a: float = 0.01, **kw: Any):
        """He normal for a leaky ReLU of slope a: std gain / sqrt(fan_in)."""
        shp = _shape(shape)
        std = math.sqrt(2.0 / (1 + a ** 2)) / math.sqrt(math.prod(shp[1:]))
        return cls.normal(*shp, mean=0.0, std=std, **kw)


def _iota(cls: type, n: int, dt: DType, kw: dict) -> "Tensor":
    """0..n-1 computed in-kernel from the loop index (never materialised on the host)."""
    dev = canonicalize(kw.get("device") or _default_device(kw.get("_runtime")))
    it = dtypes.int64 if n > 2**31 - 1 else dtypes.int32
    u = UOp(Ops.IOTA, it, (UOp(Ops.DEVICE, None, (), dev),), n)
    return cls(u, _runtime=kw.get("_runtime")).cast(dt)
