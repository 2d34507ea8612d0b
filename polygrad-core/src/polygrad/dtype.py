"""Data types: the scalar types tensors hold (polygrad/definitions/dtypes.py), their promotion lattice and NumPy/C
names."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from polygrad.definitions import dtypes as dtype_table
from polygrad.errors import DTypeError, InvalidArgumentError


@dataclass(frozen=True, eq=False)
class DType:
    """A scalar type. `priority` orders promotion within a kind; `itemsize` is in bytes."""

    priority: int
    itemsize: int
    name: str
    fmt: str | None  # numpy dtype string
    kind: str  # "bool", "int", "uint", "float"

    def __repr__(self) -> str:
        return f"dtypes.{self.name}"

    def __reduce__(self):
        return (getattr, (dtypes, self.name))

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def is_int(self) -> bool:
        return self.kind in ("int", "uint")

    @property
    def is_unsigned(self) -> bool:
        return self.kind == "uint"

    @property
    def np(self):
        """The NumPy dtype used to hold this type on the host (bfloat16 is held as uint16 bits)."""
        return np.dtype(self.fmt)

    @property
    def bitsize(self) -> int:
        return 8 * self.itemsize

    @property
    def min(self):
        """The lowest value (-inf for floats, False for bool), as tinygrad's `dt.min`."""
        return dtype_min(self)

    @property
    def max(self):
        """The highest value (inf for floats, True for bool), as tinygrad's `dt.max`."""
        return dtype_max(self)

    @property
    def count(self) -> int:
        return 1  # scalar types only (tinygrad counts vector lanes here)

    @property
    def base(self) -> "DType":
        return self

    def scalar(self) -> "DType":
        return self


def _from_table(name: str) -> DType:
    """The DType of a row of polygrad/definitions/dtypes.py; its priority is the row's position."""
    row = dtype_table.BY_NAME[name]
    return DType(dtype_table.NAMES.index(name), row.itemsize, row.c_name, row.numpy, row.kind)


class dtypes:
    """Namespace of every supported dtype, in the manner of tinygrad's `dtypes`."""

    bool = _from_table("bool")
    int8 = _from_table("int8")
    uint8 = _from_table("uint8")
    int16 = _from_table("int16")
    uint16 = _from_table("uint16")
    int32 = _from_table("int32")
    uint32 = _from_table("uint32")
    int64 = _from_table("int64")
    uint64 = _from_table("uint64")
    float16 = _from_table("float16")
    bfloat16 = _from_table("bfloat16")
    float32 = _from_table("float32")
    float64 = _from_table("float64")
    # aliases
    half = float16
    float = float32
    double = float64
    char = int8
    uchar = uint8
    short = int16
    ushort = uint16
    int = int32
    uint = uint32
    long = int64
    ulong = uint64
    default_float = float32
    default_int = int32

    @staticmethod
    def is_float(dt: DType) -> bool:
        return dt.is_float

    @staticmethod
    def is_int(dt: DType) -> bool:
        return dt.is_int

    @staticmethod
    def is_unsigned(dt: DType) -> bool:
        return dt.is_unsigned

    @staticmethod
    def from_np(npdt) -> DType:
        return from_numpy(npdt)

    @staticmethod
    def min(dt: DType):
        return dtype_min(to_dtype(dt))

    @staticmethod
    def max(dt: DType):
        return dtype_max(to_dtype(dt))

    @staticmethod
    def is_bool(dt: DType) -> bool:
        return to_dtype(dt) is dtypes.bool

    @staticmethod
    def from_py(x) -> DType:
        """The dtype a Python value (or nested list) becomes: bool, the default int (int64 when needed) or
        the default float."""
        if isinstance(x, (list, tuple)):
            return max((dtypes.from_py(v) for v in x), key=lambda d: d.priority) if x else dtypes.default_float
        return dtype_of_python(x)

    @staticmethod
    def as_const(x, dt: DType):
        """x as a Python value of dtype dt (wrapped to the width of an integer type)."""
        return normalize_const(x, to_dtype(dt))

    @staticmethod
    def finfo(dt: DType) -> tuple[int, int]:
        """(exponent bits, mantissa bits) of a float dtype."""
        bits = {2: (5, 10), 4: (8, 23), 8: (11, 52)}
        dt = to_dtype(dt)
        if not dt.is_float:
            raise DTypeError(f"finfo needs a float dtype, got {dt}")
        return (8, 7) if dt is dtypes.bfloat16 else bits[dt.itemsize]

    @staticmethod
    def fields() -> dict[str, DType]:
        """Every dtype by its tinygrad name (aliases included)."""
        return {k: v for k, v in vars(dtypes).items() if isinstance(v, DType)}


ALL_DTYPES: tuple[DType, ...] = tuple(getattr(dtypes, name) for name in dtype_table.NAMES)  # priority order
_INT_RANGES = {getattr(dtypes, name): bounds for name, bounds in dtype_table.INT_RANGES.items()}

dtypes.floats = (dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64)
dtypes.uints = (dtypes.uint8, dtypes.uint16, dtypes.uint32, dtypes.uint64)
dtypes.sints = (dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64)
dtypes.ints = dtypes.uints + dtypes.sints

_BY_NAME = {d.name: d for d in ALL_DTYPES}
_BY_NAME.update({
    "float32": dtypes.float32, "float64": dtypes.float64, "float16": dtypes.float16,
    "int8": dtypes.int8, "int16": dtypes.int16, "int32": dtypes.int32, "int64": dtypes.int64,
    "uint8": dtypes.uint8, "uint16": dtypes.uint16, "uint32": dtypes.uint32, "uint64": dtypes.uint64,
    "bf16": dtypes.bfloat16, "f32": dtypes.float32, "f16": dtypes.float16, "f64": dtypes.float64,
})


def to_dtype(x) -> DType:
    """Accept a DType, a name ('float32'), a NumPy dtype or a Python type and return the DType."""
    if isinstance(x, DType):
        return x
    if isinstance(x, str):
        if x in _BY_NAME:
            return _BY_NAME[x]
        raise DTypeError(f"unknown dtype {x!r}; use one of {sorted(set(_BY_NAME))}")
    if x is float:
        return dtypes.default_float
    if x is int:
        return dtypes.default_int
    if x is bool:
        return dtypes.bool
    try:
        return from_numpy(np.dtype(x))
    except TypeError as e:
        raise DTypeError(f"cannot interpret {x!r} as a dtype") from e


def from_numpy(npdt) -> DType:
    npdt = np.dtype(npdt)
    for d in ALL_DTYPES:
        if d is not dtypes.bfloat16 and np.dtype(d.fmt) == npdt:
            return d
    raise DTypeError(f"NumPy dtype {npdt} has no polygrad dtype; cast it to a supported type first")


def dtype_min(dt: DType):
    if dt.is_float:
        return -float("inf")
    if dt is dtypes.bool:
        return False
    return _INT_RANGES[dt][0]


def dtype_max(dt: DType):
    if dt.is_float:
        return float("inf")
    if dt is dtypes.bool:
        return True
    return _INT_RANGES[dt][1]


# Promotion lattice (tinygrad's): each type lists the types it may promote to directly.
_PROMO: dict[DType, tuple[DType, ...]] = {
    dtypes.bool: (dtypes.int8, dtypes.uint8),
    dtypes.int8: (dtypes.int16,), dtypes.int16: (dtypes.int32,), dtypes.int32: (dtypes.int64,),
    dtypes.int64: (dtypes.float16, dtypes.bfloat16),
    dtypes.uint8: (dtypes.int16, dtypes.uint16), dtypes.uint16: (dtypes.int32, dtypes.uint32),
    dtypes.uint32: (dtypes.int64, dtypes.uint64), dtypes.uint64: (dtypes.float16, dtypes.bfloat16),
    dtypes.float16: (dtypes.float32,), dtypes.bfloat16: (dtypes.float32,),
    dtypes.float32: (dtypes.float64,), dtypes.float64: (),
}


def _upward(dt: DType) -> frozenset[DType]:
    out = {dt}
    for nxt in _PROMO[dt]:
        out |= _upward(nxt)
    return frozenset(out)


_UPWARD = {d: _upward(d) for d in ALL_DTYPES}
_LUB_CACHE: dict[tuple[DType, ...], DType] = {}


def least_upper_dtype(*ds: DType) -> DType:
    """The smallest dtype every argument promotes to (tinygrad's lattice)."""
    hit = _LUB_CACHE.get(ds)
    if hit is None:
        common = frozenset.intersection(*[_UPWARD[d] for d in ds])
        hit = _LUB_CACHE[ds] = min(common, key=lambda d: d.priority)
    return hit


def least_upper_float(dt: DType) -> DType:
    return dt if dt.is_float else least_upper_dtype(dt, dtypes.default_float)


def dtype_of_python(x) -> DType:
    """bool, the default int (int64 when the value needs it, as torch), or the default float."""
    if isinstance(x, bool):
        return dtypes.bool
    if isinstance(x, int):
        return dtypes.default_int if -2**31 <= x < 2**31 else dtypes.int64 if -2**63 <= x < 2**63 else _too_big(x)
    return dtypes.default_float


def _too_big(x: int) -> DType:
    raise InvalidArgumentError(f"the integer {x} does not fit in int64; pass a float or dtype=dtypes.uint64 with "
                               "values below 2**64")


def normalize_const(value: Any, dtype: DType) -> Any:
    """value as a Python constant of dtype: bool, an int wrapped to the dtype's width, or a float."""
    if dtype is dtypes.bool:
        return bool(value)
    if dtype.is_int:
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"cannot store {value} in an integer dtype {dtype}")
        # wrap to the dtype's width (two's complement), as C and NumPy arithmetic do
        bits = 8 * dtype.itemsize
        v = int(value) & ((1 << bits) - 1)
        return v - (1 << bits) if dtype.kind == "int" and v >= 1 << (bits - 1) else v
    return float(value)
