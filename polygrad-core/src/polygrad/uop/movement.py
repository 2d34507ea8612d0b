"""Movement-op builders for tensor graphs; each folds trivial cases so graphs stay small."""
from __future__ import annotations

from polygrad.uop.ops import Ops, UOp, provided
from polygrad.uop.shape import ShapeError
from polygrad.uop.sint import INT_TYPES, canon, is_sym, resolve, sym_str, vmax, vmin


def _dims(xs) -> tuple:
    """ints stay ints; symbolic sizes are put in canonical form (so equal sizes are one UOp)."""
    if INT_TYPES.issuperset(map(type, xs)):  # plain ints, checked in C (the common case)
        return tuple(xs)
    return tuple(canon(x) for x in xs)


def _le(a, b) -> bool:
    """a <= b for every value the sizes' variables can take (their bound values when both are bound)."""
    if a is b:
        return True
    ra, rb = resolve(a), resolve(b)
    if ra is not None and rb is not None and not (is_sym(a) and not is_sym(b)):
        return ra <= rb
    # a symbolic bound against a fixed size must hold for every value (one program serves them all)
    return vmax(a) <= vmin(b) and (ra is None or rb is None or ra <= rb)


def reshape(u: UOp, shape: tuple[int, ...]) -> UOp:
    shape = _dims(shape)
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
    shape = _dims(shape)
    if len(shape) != len(u.shape) or any(a != b and a != 1 for a, b in zip(u.shape, shape)):
        raise ShapeError(f"cannot expand {u.shape} to {shape}")
    if shape == u.shape:
        return u
    return UOp(Ops.EXPAND, u.dtype, (u,), shape)


def pad(u: UOp, padding: tuple[tuple[int, int], ...]) -> UOp:
    padding = tuple((canon(b), canon(a)) for b, a in padding)
    if all(b == 0 and a == 0 for b, a in padding):
        return u
    if any(not _le(0, b) or not _le(0, a) for b, a in padding):
        raise ShapeError(f"pad amounts must be >= 0, got {padding}; use shrink to cut")
    return UOp(Ops.PAD, u.dtype, (u,), padding)


def shrink(u: UOp, bounds: tuple[tuple[int, int], ...]) -> UOp:
    bounds = tuple((canon(b), canon(e)) for b, e in bounds)
    if any(not (_le(0, b) and _le(b, e) and _le(e, s)) for (b, e), s in zip(bounds, u.shape)):
        shown = ", ".join(f"({sym_str(b)}, {sym_str(e)})" for b, e in bounds)
        raise ShapeError(f"shrink ({shown}) is out of range for shape ({', '.join(map(sym_str, u.shape))}); a "
                         "Variable in a bound must stay in range for every value up to its max, so give it "
                         "max <= the size it cuts")
    if all(b == 0 and e == s for (b, e), s in zip(bounds, u.shape)):
        return u
    return UOp(Ops.SHRINK, u.dtype, (u,), bounds)


def flip(u: UOp, axes: tuple[bool, ...]) -> UOp:
    axes = tuple(bool(a) and (is_sym(s) or s > 1) for a, s in zip(axes, u.shape))
    if not any(axes):
        return u
    return UOp(Ops.FLIP, u.dtype, (u,), axes)


provided.update(reshape=reshape)  # for UOp.flatten
