"""dtype conversions of Tensor (a mixin): cast, bitcast (between sizes too) and the named casts.

Stage: graph construction. Input: a Tensor and a dtype. Output: CAST/BITCAST tensor-graph nodes (bitcasts
between item sizes are built from shifts of unsigned words, little-endian, as torch's view(dtype)).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from polygrad.dtype import DType, dtypes, to_dtype
from polygrad.errors import ShapeError
from polygrad.uop.ops import Ops, UOp

if TYPE_CHECKING:
    from polygrad.tensor import Tensor


class DTypeMixin:
    """Casts between dtypes."""

    __slots__ = ()

    def cast(self, dtype: Any) -> "Tensor":
        dt = to_dtype(dtype)
        return self if dt == self.dtype else self._new(self.uop.cast(dt))

    def bitcast(self, dtype: Any) -> "Tensor":
        """Reinterpret the bits (torch's view(dtype)); between sizes the last axis grows or shrinks,
        little-endian, as in torch."""
        dt = to_dtype(dtype)
        if dt.itemsize == self.dtype.itemsize:
            return self if dt is self.dtype else self._new(UOp(Ops.BITCAST, dt, (self.uop,)))
        if dt is dtypes.bool or self.dtype is dtypes.bool:
            raise TypeError("bitcast to or from bool between sizes is not supported; cast to uint8 first")
        if self.ndim == 0:
            raise TypeError(f"bitcast from {self.dtype} to {dt} changes the element count; it needs at least 1 dim")
        return _bitcast_resize(self, dt)

    def float(self) -> "Tensor":
        return self.cast(dtypes.float32)

    def half(self) -> "Tensor":
        return self.cast(dtypes.float16)

    def int(self) -> "Tensor":
        return self.cast(dtypes.int32)

    def long(self) -> "Tensor":
        return self.cast(dtypes.int64)

    def bool(self) -> "Tensor":
        return self.cast(dtypes.bool)

    def double(self) -> "Tensor":
        return self.cast(dtypes.float64)

    def short(self) -> "Tensor":
        return self.cast(dtypes.int16)

    def bfloat16(self) -> "Tensor":
        return self.cast(dtypes.bfloat16)

    def is_floating_point(self) -> bool:
        return self.dtype.is_float


_UINT_OF_SIZE = {1: dtypes.uint8, 2: dtypes.uint16, 4: dtypes.uint32, 8: dtypes.uint64}


def _bitcast_resize(x: "Tensor", dt: DType) -> "Tensor":
    """Bitcast between item sizes by splitting or joining unsigned words with shifts."""
    small, big = sorted((x.dtype.itemsize, dt.itemsize))
    k = big // small
    lead = x.shape[:-1]
    if dt.itemsize < x.dtype.itemsize:
        words = x.bitcast(_UINT_OF_SIZE[big])
        out = None
        for i in range(k):
            part = (words >> (8 * small * i)).cast(_UINT_OF_SIZE[small]).unsqueeze(-1)
            part = part.pad(((0, 0),) * (part.ndim - 1) + ((i, k - 1 - i),))
            out = part if out is None else out + part
        return out.reshape(*lead, x.shape[-1] * k).bitcast(dt)
    if x.shape[-1] % k:
        raise ShapeError(f"bitcast from {x.dtype} to {dt} needs the last dimension ({x.shape[-1]}) to be a "
                         f"multiple of {k}")
    words = x.bitcast(_UINT_OF_SIZE[small]).reshape(*lead, x.shape[-1] // k, k).cast(_UINT_OF_SIZE[big])
    shifts = type(x).arange(k, device=x.device, dtype=_UINT_OF_SIZE[big], _runtime=x._runtime) * (8 * small)
    return (words << shifts).sum(-1, dtype=_UINT_OF_SIZE[big]).bitcast(dt)
