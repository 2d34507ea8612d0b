"""Collectives on Tensors across the ranks: all_reduce, broadcast, all_gather, barrier.

Stage: distributed runtime (user API). Input: a Tensor on every rank, of the same shape and dtype
(checked: a DistributedError names the ranks that differ). Output: a new realized Tensor on the same
device; the operand is not changed. Each call is one MPI collective on the operand's memory (hostview.py:
no copy on a host device, a host copy on CUDA) plus one small call that compares the ranks' operands.

`all_reduce(t, op)` has the value of stacking every rank's `t` on a new leading axis and reducing it
with the Tensor method of that name, dtypes included: "sum" of bools and small ints gives int32 as
`Tensor.sum` does, "mean" of ints the default float; float16 and bfloat16 are reduced in float32 and
rounded once. `all_gather(t)` concatenates along the leading axis, in rank order (a 0-d tensor gives
shape (world_size,)).
"""
from __future__ import annotations

from math import prod
from typing import Any

import numpy as np

from polygrad.device import Buffer
from polygrad.distributed.hostview import readable, writable, write_back
from polygrad.distributed.comm import World, world
from polygrad.dtype import dtypes, least_upper_float
from polygrad.errors import DistributedError
from polygrad.tensor import Tensor, _buffer_uop
from polygrad.tensor_common import _sum_dtype
from polygrad.uop import movement as mv
from polygrad.uop import sint
from polygrad.uop.ops import Ops
from polygrad.uop.serialize import DTYPE_NAMES

OPS = ("sum", "mean", "max", "min")
WIDENED = (dtypes.float16, dtypes.bfloat16)  # no MPI arithmetic on them: reduced as float32


def _shape(t: Any, what: str) -> tuple[int, ...]:
    """The operand's concrete shape (nothing computed yet); DistributedError for a non-Tensor."""
    if not isinstance(t, Tensor):
        raise DistributedError(f"{what} takes a Tensor, got {type(t).__name__}")
    return tuple(sint.concrete_shape(t.shape))


def _source(t: Tensor) -> Buffer:
    """The operand's values in a realized contiguous buffer: its own when it has one (no copy), else a
    contiguous copy (the operand itself is left as it is)."""
    t.realize()
    u = mv.strip_reshapes(t.uop)
    if u.op is Ops.BUFFER and u.arg.size == prod(sint.concrete_shape(t.shape)):
        return u.arg
    return t.contiguous()._buffer()


def _describe(t: Tensor, shape: tuple[int, ...], extra: str = "") -> str:
    return f"{DTYPE_NAMES[t.dtype]}{list(shape)}{extra}"


def _result(t: Tensor, buf: Buffer, shape: tuple[int, ...]) -> Tensor:
    return Tensor(_buffer_uop(buf, shape), _runtime=t._runtime)


def _mpi_op(w: World, op: str, is_bool: bool) -> Any:
    if is_bool:
        return {"max": w.mpi.LOR, "min": w.mpi.LAND}[op]
    return {"sum": w.mpi.SUM, "max": w.mpi.MAX, "min": w.mpi.MIN}[op]


def _exchange(t: Tensor, ranks: int, start: Any, what: str) -> Buffer:
    """A new Buffer of `ranks` times t's elements that `start(comm, send, recv)` (a nonblocking MPI call from
    this rank's t into it) fills; in a world of one, a copy of t."""
    w = world()
    src = _source(t)
    out = Buffer(t.device, src.size * ranks, src.dtype)
    send, recv = readable(src), writable(out)
    if w.comm is None:
        recv[:] = send
    else:
        w.stats.calls += 1
        w.stats.bytes += send.nbytes
        w.wait(start(w.comm, send, recv), what)
    write_back(out, recv)
    return out


def _reduce(t: Tensor, shape: tuple[int, ...], op: str) -> Tensor:
    """The elementwise `op` ("sum", "max", "min") of every rank's t, in t's dtype (not a half type)."""
    w = world()
    mpi_op = _mpi_op(w, op, t.dtype is dtypes.bool) if w.comm is not None else None
    out = _exchange(t, 1, lambda comm, send, recv: comm.Iallreduce(send, recv, op=mpi_op),
                    f"all_reduce({op})")
    return _result(t, out, shape)


def all_reduce(t: Tensor, op: str = "sum") -> Tensor:
    """The reduction over the ranks of every rank's `t`, elementwise: "sum", "mean", "max" or "min".

    >>> import polygrad.distributed as dist
    >>> from polygrad import Tensor
    >>> dist.all_reduce(Tensor([1.0, 2.0]), op="mean").tolist()  # a world of one
    [1.0, 2.0]
    """
    if op not in OPS:
        raise DistributedError(f"all_reduce op must be one of {list(OPS)}, got {op!r}")
    shape = _shape(t, "all_reduce")
    w = world()
    w.check_same("all_reduce", _describe(t, shape, f" op={op}"))
    if op == "mean":
        out_dtype = least_upper_float(t.dtype)
        acc = _sum_dtype(out_dtype)
        total = _reduce(t.cast(acc), shape, "sum")
        return (total * (1.0 / w.size)).cast(out_dtype).realize()
    if op == "sum":
        out_dtype = t.dtype if t.dtype in WIDENED else _sum_dtype(t.dtype)  # as Tensor.sum
        acc = dtypes.float32 if t.dtype in WIDENED else out_dtype
        return _reduce(t.cast(acc), shape, "sum").cast(out_dtype).realize()
    if t.dtype in WIDENED:  # max and min are exact in float32
        return _reduce(t.cast(dtypes.float32), shape, op).cast(t.dtype).realize()
    return _reduce(t, shape, op)


def broadcast(t: Tensor, root: int = 0) -> Tensor:
    """Rank `root`'s `t` on every rank (each rank passes a tensor of the same shape and dtype)."""
    w = world()
    if not isinstance(root, int) or isinstance(root, bool) or not 0 <= root < w.size:
        raise DistributedError(f"broadcast root must be a rank in 0..{w.size - 1}, got {root!r}")
    shape = _shape(t, "broadcast")
    w.check_same("broadcast", _describe(t, shape, f" root={root}"))
    src = _source(t)
    out = Buffer(t.device, src.size, src.dtype)
    data = writable(out)
    data[:] = readable(src)
    if w.comm is not None:
        w.stats.calls += 1
        w.stats.bytes += data.nbytes if w.rank == root else 0
        w.wait(w.comm.Ibcast(data.view(np.uint8), root=root), "broadcast")
    write_back(out, data)
    return _result(t, out, shape)


def all_gather(t: Tensor) -> Tensor:
    """Every rank's `t`, concatenated along the leading axis in rank order (0-d: stacked)."""
    w = world()
    shape = _shape(t, "all_gather")
    w.check_same("all_gather", _describe(t, shape))
    out_shape = (w.size * shape[0], *shape[1:]) if shape else (w.size,)
    out = _exchange(t, w.size,
                    lambda comm, send, recv: comm.Iallgather(send.view(np.uint8), recv.view(np.uint8)), "all_gather")
    return _result(t, out, out_shape)


def barrier() -> None:
    """Wait until every rank reaches this call (DistributedError after POLY_DIST_TIMEOUT seconds)."""
    w = world()
    if w.comm is not None:
        w.stats.calls += 1
        w.wait(w.comm.Ibarrier(), "barrier")
