"""Shape and device inference for tensor-graph UOps (each op's rule in one table)."""
from __future__ import annotations

from polygrad.errors import ShapeError
from polygrad.uop.ops import ELEMENTWISE, Ops, UOp, provided
from polygrad.uop.sint import has_sym, sadd, sprod, ssub, sym_equal, vmax

__all__ = ["ShapeError", "infer_shape", "infer_device"]  # ShapeError lives in polygrad.errors


def _broadcast_same(u: UOp) -> tuple[int, ...]:
    shapes = [s.shape for s in u.src]
    if any(s != shapes[0] for s in shapes):
        raise ShapeError(f"{u.op.name} needs equal shapes after broadcasting, got {shapes}")
    return shapes[0]


def _reshape(u: UOp) -> tuple[int, ...]:
    old, new = sprod(u.src[0].shape), sprod(u.arg)
    if not sym_equal(old, new):
        # a symbolic view of a buffer allocated for the variables' largest values (a realized
        # symbolic result) covers a prefix of it
        src = u.src[0]
        prefix = src.op is Ops.BUFFER and has_sym(u.arg) and not has_sym(old) and vmax(new) <= old
        if not prefix:
            raise ShapeError(f"cannot reshape {u.src[0].shape} to {u.arg}: sizes differ")
    return tuple(u.arg)


def _reduce(u: UOp) -> tuple[int, ...]:
    axes = u.arg[1]
    return tuple(1 if i in axes else s for i, s in enumerate(u.src[0].shape))


def _fits(outer: tuple, index: tuple, axis: int) -> bool:
    """outer's shape matches index's outside axis, or is 1 there (broadcast over those index points)."""
    return len(outer) == len(index) and all(a == b or a == 1 for i, (a, b) in enumerate(zip(outer, index))
                                            if i != axis)


def _gather(u: UOp) -> tuple[int, ...]:
    x, index = u.src
    if not _fits(x.shape, index.shape, u.arg):
        raise ShapeError(f"GATHER along axis {u.arg} needs the source's shape {x.shape} to equal the index's "
                         f"{index.shape} (or be 1) outside that axis")
    return index.shape


def _scatter(u: UOp) -> tuple[int, ...]:
    base, index, value = u.src
    if index.shape != value.shape or not _fits(base.shape, index.shape, u.arg[0]):
        raise ShapeError(f"SCATTER along axis {u.arg[0]} needs index {index.shape} and value {value.shape} of one "
                         f"shape, and the base's {base.shape} equal to it (or 1) outside that axis")
    return base.shape


SHAPE_RULES = {
    Ops.BUFFER: lambda u: (u.arg.size,),
    Ops.CONST: lambda u: (),
    Ops.DEVICE: lambda u: (),
    Ops.RESHAPE: _reshape,
    Ops.PERMUTE: lambda u: tuple(u.src[0].shape[i] for i in u.arg),
    Ops.EXPAND: lambda u: tuple(u.arg),
    Ops.PAD: lambda u: tuple(sadd(sadd(s, b), a) for s, (b, a) in zip(u.src[0].shape, u.arg)),
    Ops.SHRINK: lambda u: tuple(ssub(e, b) for b, e in u.arg),
    Ops.FLIP: lambda u: u.src[0].shape,
    Ops.REDUCE_AXIS: _reduce,
    Ops.COPY: lambda u: u.src[0].shape,
    Ops.CONTIGUOUS: lambda u: u.src[0].shape,
    Ops.DETACH: lambda u: u.src[0].shape,
    Ops.ASSIGN: lambda u: u.src[0].shape,
    Ops.AFTER: lambda u: u.src[0].shape,
    Ops.BIND: lambda u: (),
    Ops.DEFINE_VAR: lambda u: (),
    Ops.CUSTOM: lambda u: (),
    Ops.IOTA: lambda u: (u.arg,),
    Ops.GATHER: _gather,
    Ops.SCATTER: _scatter,
}


def infer_shape(u: UOp) -> tuple[int, ...]:
    rule = SHAPE_RULES.get(u.op)
    if rule is not None:
        return rule(u)
    if u.op in ELEMENTWISE:
        return _broadcast_same(u)
    raise ShapeError(f"{u.op.name} has no shape (it is a kernel-IR node)")


def infer_device(u: UOp) -> str:
    """The device a tensor-graph node lives on; '' when it is device-free (a bare constant)."""
    if u.op is Ops.BUFFER:
        return u.arg.device
    if u.op is Ops.DEVICE:
        return u.arg or ""
    if u.op is Ops.COPY:
        return u.arg
    for s in u.src:
        d = s.device
        if d:
            return d
    return ""


provided.update(infer_shape=infer_shape, infer_device=infer_device)  # for UOp.shape / .device
