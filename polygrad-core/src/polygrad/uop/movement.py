"""Movement-op builders for tensor graphs; each folds trivial cases so graphs stay small."""
from __future__ import annotations

from polygrad.uop.ops import Ops, UOp
from polygrad.uop.shape import ShapeError


def reshape(u: UOp, shape: tuple[int, ...]) -> UOp:
    shape = tuple(int(s) for s in shape)
    if shape == u.shape:
        return u
    # a reshaped BUFFER is a tensor's own identity (autograd targets match it), so it is not folded
    if u.op is Ops.RESHAPE and u.src[0].op is not Ops.BUFFER:
        u = u.src[0]
        if shape == u.shape:
            return u
    return UOp(Ops.RESHAPE, u.dtype, (u,), shape)


def strip_reshapes(u: UOp) -> UOp:
    """The node under any chain of RESHAPEs (a reshaped buffer is still that buffer)."""
    while u.op is Ops.RESHAPE:
        u = u.src[0]
    return u


def permute(u: UOp, order: tuple[int, ...]) -> UOp:
    order = tuple(order)
    if sorted(order) != list(range(len(u.shape))):
        raise ShapeError(f"permute order {order} is not a permutation of {len(u.shape)} axes")
    if order == tuple(range(len(order))):
        return u
    return UOp(Ops.PERMUTE, u.dtype, (u,), order)


def expand(u: UOp, shape: tuple[int, ...]) -> UOp:
    shape = tuple(int(s) for s in shape)
    if len(shape) != len(u.shape) or any(a != b and a != 1 for a, b in zip(u.shape, shape)):
        raise ShapeError(f"cannot expand {u.shape} to {shape}")
    if shape == u.shape:
        return u
    return UOp(Ops.EXPAND, u.dtype, (u,), shape)


def pad(u: UOp, padding: tuple[tuple[int, int], ...]) -> UOp:
    padding = tuple((int(b), int(a)) for b, a in padding)
    if all(b == 0 and a == 0 for b, a in padding):
        return u
    if any(b < 0 or a < 0 for b, a in padding):
        raise ShapeError(f"pad amounts must be >= 0, got {padding}; use shrink to cut")
    return UOp(Ops.PAD, u.dtype, (u,), padding)


def shrink(u: UOp, bounds: tuple[tuple[int, int], ...]) -> UOp:
    bounds = tuple((int(b), int(e)) for b, e in bounds)
    if any(not (0 <= b <= e <= s) for (b, e), s in zip(bounds, u.shape)):
        raise ShapeError(f"shrink {bounds} is out of range for shape {u.shape}")
    if all(b == 0 and e == s for (b, e), s in zip(bounds, u.shape)):
        return u
    return UOp(Ops.SHRINK, u.dtype, (u,), bounds)


def flip(u: UOp, axes: tuple[bool, ...]) -> UOp:
    axes = tuple(bool(a) and s > 1 for a, s in zip(axes, u.shape))
    if not any(axes):
        return u
    return UOp(Ops.FLIP, u.dtype, (u,), axes)
