"""Helpers Tensor and its mixins share: axis and shape arguments, broadcasting, default devices and runtimes,
the capture guards, the accumulation dtype of sums.

Stage: graph construction. Input: Python arguments and tensors. Output: normalised axes and shapes, checked
runtimes. Imports nothing from polygrad.tensor, so tensor.py and every tensor_* mixin can use it.
"""
from __future__ import annotations

import contextlib
import numbers
import threading
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Sequence

import numpy as np

from polygrad.dtype import DType, dtype_max, dtype_min, dtypes
from polygrad.errors import DimensionError, DTypeError, RuntimeOwnershipError, ShapeError
from polygrad.uop import movement as mv
from polygrad.uop import sint
from polygrad.uop.ops import MOVEMENT, Ops, UOp
from polygrad import runtime_context

if TYPE_CHECKING:
    from polygrad.tensor import Tensor



class _CaptureGuards(threading.local):
    """Model capture (polygrad/model/capture.py) and TinyJit push a guard on `stack` (`guarded(guard)`): it rejects
    effectful reads (numpy, item, tolist) and assignments to parameters or inputs while the user's callable
    is being recorded. Per thread, as captures are: another thread's reads are not the callable's."""

    def __init__(self) -> None:
        self.stack: list[Any] = []


capture_guards = _CaptureGuards()


@contextlib.contextmanager
def guarded(guard: Any) -> Iterator[None]:
    """`guard` checks this thread's host reads and assignments in the block."""
    capture_guards.stack.append(guard)
    try:
        yield
    finally:
        capture_guards.stack.remove(guard)


def check_writable(u: UOp, what: str) -> None:
    """ReadOnlyBufferError when `u` is a view of a buffer that adopted read-only host memory (a
    memory-mapped weight: Tensor.from_host_view), which `what` (an assign, a custom kernel) would write."""
    while u.op in MOVEMENT:
        u = u.src[0]
    if u.op is Ops.BUFFER and getattr(u.arg, "readonly", False):
        u.arg.check_writable(what)


def _buffer_uop(buf: Any, shape: tuple[int, ...]) -> UOp:
    """A device Buffer as a tensor-graph node of this shape."""
    u = UOp(Ops.BUFFER, buf.dtype, (), buf)
    return mv.reshape(u, shape) if shape != (buf.size,) else u


def _prod(xs: Iterable[int]) -> int:
    return sint.sprod(xs)  # an int, or a symbolic size when a dimension is one


def _resolve_axis(axis: int, ndim: int) -> int:
    if not -max(ndim, 1) <= axis < max(ndim, 1):
        raise DimensionError(f"axis {axis} is out of range for a tensor with {ndim} dimensions")
    return axis % max(ndim, 1)


def _fits(lo: int, hi: int, dt: DType) -> bool:
    return dtype_min(dt) <= lo and hi <= dtype_max(dt)


def _shape_arg(shape: Any, allow_neg: bool = False) -> tuple[int, ...]:
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    out = []
    for s in shape:
        if isinstance(s, UOp):  # a symbolic size: a bound Variable (v.bind(n)) or an expression of them
            out.append(sint.canon(s))
            continue
        if hasattr(s, "uop") and hasattr(s, "item"):  # a 0-d tensor holding a size
            s = s.item()
        if not isinstance(s, (int, np.integer)):
            raise TypeError(f"shape entries must be integers, got {s!r}")
        if s < 0 and not (allow_neg and s == -1 or allow_neg):
            raise ShapeError(f"negative dimension {s} in shape {tuple(shape)}")
        out.append(int(s))
    return tuple(out)


def broadcast_shape(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    if len(shapes) == 2 and shapes[0] == shapes[1]:
        return tuple(shapes[0])  # the common case, on every elementwise op
    n = max(len(s) for s in shapes)
    padded = [(1,) * (n - len(s)) + tuple(s) for s in shapes]
    out = []
    for dims in zip(*padded):
        sizes = {d for d in dims if d != 1}
        if len(sizes) > 1:
            raise ShapeError(f"shapes {list(shapes)} cannot be broadcast together")
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


def _default_device(runtime: Any) -> str | None:
    if runtime is not None:
        return runtime.device
    current = runtime_context.current()
    return current.device if current is not None else None


def _check_runtimes(tensors: Sequence["Tensor"]) -> Any:
    """Reject operands of different owners; returns the owner (an explicit Runtime, or None: the default).

    A tensor of the default runtime that holds no device memory (a constant, an arange: what polygrad
    makes internally next to a runtime's tensors) belongs to nobody and takes the other operands' owner.
    One that holds memory (Tensor(data), a realized result) is the default runtime's, and mixing it with
    an explicit runtime's tensor is rejected, as the spec says, even on the same device."""
    owners = {id(t._runtime): t._runtime for t in tensors if t._runtime is not None}
    if owners and len(owners) < len(tensors):  # defaults next to an explicit runtime: they count if they hold memory
        if any(t._runtime is None and _holds_memory(t.uop) for t in tensors):
            owners[0] = None
    if len(owners) > 1:
        raise RuntimeOwnershipError(
            f"operands belong to different runtimes ({', '.join(map(_owner_name, owners.values()))}); create "
            "tensors and layers through the same runtime (rt.Tensor, rt.nn) or use the default API consistently")
    for rt in owners.values():
        if getattr(rt, "disposed", False):
            raise RuntimeOwnershipError(f"runtime {rt!r} was disposed; create a new one with polygrad.create()")
    return next(iter(owners.values()), None)


def _holds_memory(u: UOp) -> bool:
    return any(n.op is Ops.BUFFER and n.arg.size for n in u.toposort())


def _owner_name(runtime: Any) -> str:
    return "the default runtime (polygrad.Tensor)" if runtime is None else repr(runtime)


def is_tensor(x: Any) -> bool:
    """x is a Tensor (what the mixins test without importing the Tensor class)."""
    return hasattr(x, "uop") and hasattr(x, "_runtime")


def _check_operand(value: Any) -> None:
    """A DTypeError (a TypeError, as torch raises) for an operand that is not a number: x + "a", x * None."""
    if isinstance(value, (numbers.Real, np.bool_, UOp)):
        return
    kind = "complex numbers (polygrad has no complex dtype)" if isinstance(value, complex) else type(value).__name__
    raise DTypeError(f"unsupported operand for a tensor operation: {kind}; use a number or a Tensor")


def _sum_dtype(dt: DType) -> DType:
    if dt is dtypes.bool or (dt.is_int and dt.itemsize < 4):
        return dtypes.uint32 if dt.is_unsigned else dtypes.int32
    if dt in (dtypes.float16, dtypes.bfloat16):
        return dtypes.float32
    return dt


def size_tensor(n: Any, like: "Tensor") -> "Tensor":
    """A 0-d tensor (like's dtype and device) holding the size n, which may be symbolic: the kernel reads
    the variable's value, so one program serves every binding."""
    if not sint.is_sym(n):
        return like._new(UOp.const(like.dtype, n, like.device))
    zero = UOp.const(like.dtype, 0, like.device)  # carries the device
    return like._new(UOp(Ops.ADD, like.dtype, (zero, n.cast(like.dtype))))
