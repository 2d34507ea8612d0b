"""Contractions of Tensor (a mixin): matmul / dot (and @) and einsum.

Stage: graph construction. Input: tensors. Output: broadcast multiplies reduced by REDUCE_AXIS(ADD), which the
scheduler turns into one kernel per product (register-tiled on devices with vector lanes).
"""
from __future__ import annotations

import string
from typing import TYPE_CHECKING, Any, Sequence

from polygrad.dtype import least_upper_dtype, to_dtype
from polygrad.errors import InvalidArgumentError, ShapeError
from polygrad.tensor_common import _sum_dtype

if TYPE_CHECKING:
    from polygrad.tensor import Tensor


class ContractionMixin:
    """Products that reduce over shared axes."""

    __slots__ = ()

    # linear algebra and indexing
    def dot(self, w: "Tensor", dtype: Any = None) -> "Tensor":
        return self.matmul(w, dtype=dtype)

    def matmul(self, w: Any, reverse: bool = False, dtype: Any = None) -> "Tensor":
        """self @ w (w @ self with reverse=True); dtype: the accumulation and result dtype (tinygrad)."""
        if reverse:
            other = w if isinstance(w, type(self)) else type(self)(w, device=self.device, _runtime=self._runtime)
            return other.matmul(self, dtype=dtype)
        if not isinstance(w, type(self)):
            w = type(self)(w, device=self.device, _runtime=self._runtime)
        x = self
        if x.ndim == 0 or w.ndim == 0:
            raise ShapeError(f"matmul needs at least 1-d operands, got {x.shape} and {w.shape}")
        squeeze_x, squeeze_w = x.ndim == 1, w.ndim == 1
        if squeeze_x:
            x = x.reshape(1, x.shape[0])
        if squeeze_w:
            w = w.reshape(w.shape[0], 1)
        if x.shape[-1] != w.shape[-2]:
            raise ShapeError(f"matmul shapes {self.shape} and {w.shape} do not align ({x.shape[-1]} != {w.shape[-2]})")
        dt = least_upper_dtype(x.dtype, w.dtype)
        x, w = x.cast(dt), w.cast(dt)
        xs = x.reshape(*x.shape[:-1], 1, x.shape[-1])
        ws = w.transpose(-1, -2).reshape(*w.shape[:-2], 1, w.shape[-1], w.shape[-2])
        a, b = xs._broadcasted(ws)
        acc = to_dtype(dtype) if dtype is not None else (_sum_dtype(dt) if not dt.is_float else None)
        out = (a * b).sum(-1, dtype=acc)
        if dtype is not None:
            out = out.cast(acc)
        if squeeze_x:
            out = out.squeeze(-2)
        if squeeze_w:
            out = out.squeeze(-1)
        return out

    def __matmul__(self, x: "Tensor") -> "Tensor":
        return self.matmul(x)

    def __rmatmul__(self, x: "Tensor") -> "Tensor":
        return type(self)(x).matmul(self) if not isinstance(x, type(self)) else x.matmul(self)

    @classmethod
    def einsum(cls, formula: str, *operands: Any, dtype: Any = None) -> "Tensor":
        """Einstein summation, e.g. cls.einsum('ij,jk->ik', a, b); supports '...' and repeated letters."""
        xs = list(operands[0]) if len(operands) == 1 and isinstance(operands[0], (list, tuple)) else list(operands)
        inputs, output = _parse_einsum(formula, xs)
        if len(inputs) != len(xs):
            raise InvalidArgumentError(f"einsum: formula {formula!r} names {len(inputs)} operands, got {len(xs)}")
        sizes: dict[str, int] = {}
        prepared = []
        for letters, x in zip(inputs, xs):
            letters, x = _take_diagonals(letters, x)
            if len(letters) != x.ndim:
                raise ShapeError(f"einsum: subscripts {letters!r} do not match operand shape {x.shape}")
            for c, s in zip(letters, x.shape):
                if sizes.get(c, 1) != 1 and s != 1 and sizes[c] != s:
                    raise ShapeError(f"einsum: letter {c!r} has sizes {sizes[c]} and {s}")
                sizes[c] = s if sizes.get(c, 1) == 1 else sizes[c]
            prepared.append((letters, x))
        for c in output:
            if c not in sizes:
                raise InvalidArgumentError(f"einsum: output letter {c!r} does not appear in the inputs")
        alphabet = sorted(sizes)
        full = tuple(sizes[c] for c in alphabet)
        product = None
        for letters, x in prepared:
            order = sorted(range(len(letters)), key=lambda i: letters[i])
            x = x.permute(order) if order else x
            x = x.reshape(tuple(x.shape[sorted(letters).index(c)] if c in letters else 1 for c in alphabet))
            x = x.expand(full)
            product = x if product is None else product * x
        summed = [i for i, c in enumerate(alphabet) if c not in output]
        out = product.sum(summed, dtype=dtype) if summed else (product.cast(dtype) if dtype else product)
        kept = [c for c in alphabet if c in output]
        return out.permute([kept.index(c) for c in output]) if output else out


def _parse_einsum(formula: str, xs: Sequence["Tensor"]) -> tuple[list[str], str]:
    formula = formula.replace(" ", "")
    lhs, arrow, rhs = formula.partition("->")
    inputs = lhs.split(",")
    if "..." in formula:
        free = [c for c in string.ascii_letters if c not in formula]
        longest = 0
        for i, inp in enumerate(inputs):
            if "..." in inp and i < len(xs):
                count = xs[i].ndim - (len(inp) - 3)
                if count < 0:
                    raise ShapeError(f"einsum: subscripts {inp!r} name more axes than operand {i} has")
                longest = max(longest, count)
                inputs[i] = inp.replace("...", "".join(free[len(free) - count:]))
        ell = "".join(free[len(free) - longest:]) if longest else ""
        if arrow:
            return inputs, rhs.replace("...", ell)
        joined = "".join(inputs)
        return inputs, ell + "".join(sorted(c for c in set(joined) if joined.count(c) == 1 and c not in ell))
    for part in inputs + [rhs]:
        if any(not c.isalpha() for c in part):
            raise InvalidArgumentError(f"einsum: subscripts must be letters, got {part!r} in {formula!r}")
    if arrow:
        if len(set(rhs)) != len(rhs):
            raise InvalidArgumentError(f"einsum: output subscripts {rhs!r} repeat a letter")
        return inputs, rhs
    joined = "".join(inputs)
    return inputs, "".join(sorted(c for c in set(joined) if joined.count(c) == 1))


def _take_diagonals(letters: str, x: "Tensor") -> tuple[str, "Tensor"]:
    """A letter repeated within one operand ('ii') selects that operand's diagonal."""
    while len(set(letters)) != len(letters):
        c = next(c for c in letters if letters.count(c) > 1)
        a = letters.index(c)
        b = letters.index(c, a + 1)
        if x.shape[a] != x.shape[b]:
            raise ShapeError(f"einsum: repeated letter {c!r} needs equal sizes, got {x.shape[a]} and {x.shape[b]}")
        x = x.diagonal(0, a, b)
        letters = "".join(ch for i, ch in enumerate(letters) if i not in (a, b)) + c
    return letters, x
