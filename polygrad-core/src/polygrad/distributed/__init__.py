"""Data-parallel training across processes on MPI (mpi4py): collectives, DistributedOptimizer, Model.fit.

Stage: distributed runtime, above Tensor and nn, below Model (which uses it for fit(distributed=True)).
Input: processes started by an MPI launcher (`mpiexec -n 2 python train.py`), or a plain `python
train.py`, a world of one that needs no MPI at all. Output: the rank and size, collectives on Tensors,
gradient averaging in few MPI calls and its counters. Design, sharding order and scaling arithmetic:
docs/distributed.md.

>>> import polygrad.distributed as dist
>>> dist.init(); dist.rank(), dist.world_size()
(0, 1)
>>> from polygrad import Tensor
>>> dist.all_gather(Tensor([1, 2])).tolist()
[1, 2]
"""
from __future__ import annotations

from polygrad.distributed.buckets import Averager, broadcast_buffers
from polygrad.distributed.collectives import all_gather, all_reduce, barrier, broadcast
from polygrad.distributed.optimizer import DistributedOptimizer
from polygrad.distributed.comm import World, world
from polygrad.distributed.comm import init as _init
from polygrad.errors import DistributedError

__all__ = ["Averager", "DistributedError", "DistributedOptimizer", "World", "all_gather", "all_reduce", "barrier",
           "broadcast", "broadcast_buffers", "init", "is_main", "rank", "reset_stats", "stats", "world",
           "world_size"]


def init() -> None:
    """Join the ranks the MPI launcher started (idempotent). Without a launcher: a world of one, no MPI.
    An uncaught exception on any rank then aborts every rank, so none waits for it forever."""
    _init()


def rank() -> int:
    """This process's rank, 0..world_size()-1."""
    return world().rank


def world_size() -> int:
    """The number of ranks."""
    return world().size


def is_main() -> bool:
    """True on rank 0 (the rank that saves files and prints)."""
    return world().rank == 0


def stats() -> dict:
    """This rank's collectives so far: `calls` (MPI calls that move data), `checks` (small calls that
    compare the ranks' operands: one per user collective, one per new gradient layout), `bytes` it sent,
    `seconds` spent waiting, `steps` of gradient averaging and `calls_per_step` (data calls of the last
    step: the number of buckets)."""
    s = world().stats
    return {"world_size": world().size, "calls": s.calls, "checks": s.checks, "bytes": s.bytes,
            "seconds": s.seconds, "steps": s.steps, "calls_per_step": sum(s.step_calls)}


def reset_stats() -> None:
    """Zero the counters of stats()."""
    w = world()
    w.stats = type(w.stats)()
