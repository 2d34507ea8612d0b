"""Elementwise arithmetic, comparisons, logic, shifts and in-place operators of Tensor (a mixin).

Stage: graph construction. Input: tensors and Python scalars (broadcast and promoted by Tensor._broadcasted).
Output: tensor-graph ALU nodes (ADD MUL FDIV IDIV MAX CMP* AND OR XOR SHL SHR WHERE EXP2 LOG2 SQRT SIN
RECIPROCAL NEG); the functions built from them live in tensor_math.py and tensor_activation.py.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from polygrad.dtype import DType, dtypes, least_upper_float
from polygrad.errors import DTypeError, InvalidArgumentError, ShapeError
from polygrad.tensor_common import broadcast_shape
from polygrad.uop.ops import Ops

if TYPE_CHECKING:
    from polygrad.tensor import Tensor


class ElementwiseMixin:
    """The operators and primitive elementwise functions."""

    __slots__ = ()

    def idiv(self, x: Any, reverse: bool = False) -> "Tensor":
        """Integer division truncating toward zero (tinygrad's idiv; C's /)."""
        a, b = self._broadcasted(x, reverse)
        return a.div(b, rounding_mode="trunc")

    # elementwise math
    # binary ops take tinygrad's `reverse` flag: x.sub(y, reverse=True) is y - x
    def add(self, x: Any, reverse: bool = False) -> "Tensor":
        return self._binop(Ops.ADD, x, reverse)

    def sub(self, x: Any, reverse: bool = False) -> "Tensor":
        a, b = self._broadcasted(x, reverse)
        return a._alu(Ops.ADD, b._alu(Ops.NEG))

    def mul(self, x: Any, reverse: bool = False) -> "Tensor":
        return self._binop(Ops.MUL, x, reverse)

    def div(self, x: Any, reverse: bool = False, rounding_mode: str | None = None) -> "Tensor":
        """True division, or rounding_mode 'trunc'/'floor' (torch); reverse=True divides x by self (tinygrad)."""
        a, b = self._broadcasted(x, reverse)
        if rounding_mode is None:
            a, b = a.cast(least_upper_float(a.dtype)), b.cast(least_upper_float(b.dtype))
            return a._alu(Ops.FDIV, b)
        if rounding_mode not in ("trunc", "floor"):
            raise InvalidArgumentError(f"rounding_mode must be None, 'trunc' or 'floor', got {rounding_mode!r}")
        if a.dtype is dtypes.bool:
            a, b = a.cast(dtypes.default_int), b.cast(dtypes.default_int)
        if a.dtype.is_int:
            b = b.eq(0).where(1, b)  # integer division by zero traps in C; torch raises, we divide by 1
        if rounding_mode == "trunc":
            return a._alu(Ops.IDIV, b) if a.dtype.is_int else a._alu(Ops.FDIV, b).trunc()
        if rounding_mode == "floor":
            if a.dtype.is_int:
                q = a._alu(Ops.IDIV, b)
                fix = ((q * b).ne(a)) & ((a < 0).ne(b < 0))
                return fix.where(q - 1, q)
            return a._alu(Ops.FDIV, b).floor()
        raise InvalidArgumentError(f"rounding_mode must be None, 'trunc' or 'floor', got {rounding_mode!r}")

    def neg(self) -> "Tensor":
        return self.logical_not() if self.dtype is dtypes.bool else self._alu(Ops.NEG)

    def maximum(self, x: Any) -> "Tensor":
        return self._binop(Ops.MAX, x)

    def where(self, x: Any, y: Any) -> "Tensor":
        cond = self if self.dtype is dtypes.bool else self.ne(0)
        if not isinstance(x, type(self)) and isinstance(y, type(self)):
            y2, x2 = y._broadcasted(x)
        elif isinstance(x, type(self)):
            x2, y2 = x._broadcasted(y)
        else:
            x2 = type(self)(x, device=self.device, _runtime=self._runtime)
            x2, y2 = x2._broadcasted(y)
        shape = broadcast_shape(cond.shape, x2.shape)
        cond, x2, y2 = cond._broadcast_to(shape), x2._broadcast_to(shape), y2._broadcast_to(shape)
        return cond._alu(Ops.WHERE, x2, y2)

    def exp2(self) -> "Tensor":
        return self.cast(least_upper_float(self.dtype))._alu(Ops.EXP2)

    def log2(self) -> "Tensor":
        return self.cast(least_upper_float(self.dtype))._alu(Ops.LOG2)

    def sqrt(self) -> "Tensor":
        return self.cast(least_upper_float(self.dtype))._alu(Ops.SQRT)

    def rsqrt(self) -> "Tensor":
        return self.sqrt().reciprocal()

    def reciprocal(self) -> "Tensor":
        return self.cast(least_upper_float(self.dtype))._alu(Ops.RECIPROCAL)

    def sin(self) -> "Tensor":
        return self.cast(least_upper_float(self.dtype))._alu(Ops.SIN)

    # comparisons
    def __lt__(self, x: Any) -> "Tensor":
        return self._binop(Ops.CMPLT, x)

    def __gt__(self, x: Any) -> "Tensor":
        return self._binop(Ops.CMPLT, x, reverse=True)

    def ne(self, x: Any) -> "Tensor":
        return self._binop(Ops.CMPNE, x)

    def eq(self, x: Any) -> "Tensor":
        return self._binop(Ops.CMPEQ, x)

    def __eq__(self, x: Any) -> "Tensor":  # type: ignore[override]
        return self.eq(x)

    def __ne__(self, x: Any) -> "Tensor":  # type: ignore[override]
        return self.ne(x)

    def logical_not(self) -> "Tensor":
        return self.cast(dtypes.bool)._binop(Ops.CMPNE, True)

    def __and__(self, x: Any) -> "Tensor":
        return self._binop(Ops.AND, x)

    def __or__(self, x: Any) -> "Tensor":
        return self._binop(Ops.OR, x)

    def __xor__(self, x: Any) -> "Tensor":
        return self._binop(Ops.XOR, x)

    __add__ = add

    __mul__ = mul

    __sub__ = sub

    __truediv__ = div

    def __radd__(self, x: Any) -> "Tensor":
        return self._binop(Ops.ADD, x, reverse=True)

    def __rmul__(self, x: Any) -> "Tensor":
        return self._binop(Ops.MUL, x, reverse=True)

    def __rsub__(self, x: Any) -> "Tensor":
        a, b = self._broadcasted(x, reverse=True)
        return a._alu(Ops.ADD, b._alu(Ops.NEG))

    def __rtruediv__(self, x: Any) -> "Tensor":
        a, b = self._broadcasted(x, reverse=True)
        return a.div(b)

    def __neg__(self) -> "Tensor":
        return self.neg()

    # in-place operators write the result into this tensor's buffer (assign), as tinygrad and torch do: every
    # reference to the tensor sees the new value. A tensor that requires grad may be updated too (tinygrad's
    # rule; torch refuses for leaves): the write is not differentiated, later graphs read the new value.
    def _inplace(self, value: "Tensor") -> "Tensor":
        if value.dtype != self.dtype and not _can_cast_inplace(value.dtype, self.dtype):
            raise DTypeError(f"in-place result of dtype {value.dtype} cannot be stored in a {self.dtype} tensor; "
                             f"write x = x op y instead, or cast first")
        if value.shape != self.shape:
            raise ShapeError(f"in-place result of shape {value.shape} does not fit the tensor's shape {self.shape}")
        return self.assign(value)

    def __iadd__(self, x: Any) -> "Tensor":
        return self._inplace(self + x)

    def __isub__(self, x: Any) -> "Tensor":
        return self._inplace(self - x)

    def __imul__(self, x: Any) -> "Tensor":
        return self._inplace(self * x)

    def __itruediv__(self, x: Any) -> "Tensor":
        return self._inplace(self / x)

    def __ifloordiv__(self, x: Any) -> "Tensor":
        return self._inplace(self // x)

    def __imod__(self, x: Any) -> "Tensor":
        return self._inplace(self % x)

    def __ipow__(self, x: Any) -> "Tensor":
        return self._inplace(self ** x)

    def __imatmul__(self, x: Any) -> "Tensor":
        return self._inplace(self @ x)

    def __iand__(self, x: Any) -> "Tensor":
        return self._inplace(self & x)

    def __ior__(self, x: Any) -> "Tensor":
        return self._inplace(self | x)

    def __ixor__(self, x: Any) -> "Tensor":
        return self._inplace(self ^ x)

    def __ilshift__(self, x: Any) -> "Tensor":
        return self._inplace(self << x)

    def __irshift__(self, x: Any) -> "Tensor":
        return self._inplace(self >> x)

    def _shift(self, op: Ops, x: Any, reverse: bool = False) -> "Tensor":
        """Bit shifts of integer tensors. A negative Python shift amount is an error; a shift amount outside
        [0, bits) held in a tensor gives 0 (right shifts of negative values: -1), as torch, instead of the
        C shift's undefined behaviour."""
        if isinstance(x, (int, np.integer)) and not isinstance(x, bool) and not reverse and x < 0:
            raise InvalidArgumentError(f"shift amount must be non-negative, got {x}")
        a, b = self._broadcasted(x, reverse)
        if not a.dtype.is_int:
            raise DTypeError(f"bit shifts need integer tensors, got {a.dtype}")
        bits = 8 * a.dtype.itemsize
        if not reverse and isinstance(x, (int, np.integer)) and 0 <= x < bits:
            return a._alu(op, b)
        ok = (b < bits) if b.dtype.is_unsigned else (b >= 0) & (b < bits)
        out = a._alu(op, ok.where(b, 0))
        over = (a < 0).where(-1, 0) if op is Ops.SHR and not a.dtype.is_unsigned else 0
        return ok.where(out, over)

    def __lshift__(self, x: Any) -> "Tensor":
        return self._shift(Ops.SHL, x)

    def __rshift__(self, x: Any) -> "Tensor":
        return self._shift(Ops.SHR, x)

    def __rlshift__(self, x: Any) -> "Tensor":
        return self._shift(Ops.SHL, x, reverse=True)

    def __rrshift__(self, x: Any) -> "Tensor":
        return self._shift(Ops.SHR, x, reverse=True)

    def lshift(self, x: Any, reverse: bool = False) -> "Tensor":
        return self._shift(Ops.SHL, x, reverse)

    def rshift(self, x: Any, reverse: bool = False) -> "Tensor":
        return self._shift(Ops.SHR, x, reverse)


def _can_cast_inplace(src: DType, dst: DType) -> bool:
    """torch's rule for in-place results: within a kind (or to a wider kind) only: no float into an int
    tensor, nothing but bool into a bool tensor."""
    if dst is dtypes.bool:
        return src is dtypes.bool
    if dst.is_int:
        return not src.is_float
    return True
