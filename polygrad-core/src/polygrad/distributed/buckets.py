"""Gradient averaging in few MPI calls: small gradients packed into buckets, each bucket one allreduce.

Stage: distributed training. Input: a list of realized buffers (the gradients, and a Model's loss) that
has the same layout on every rank. Output: every buffer (or a target buffer beside it) holding the mean
over the ranks. `Averager.average` does it with one MPI call per bucket:

- A buffer of at least POLY_DIST_BUCKET_MB is a bucket of its own, reduced in its own memory where the
  device is the host (hostview.py): MPI reads and writes the buffer, no copy.
- Smaller buffers are packed, in order, into host buckets of up to that size (one copy in, one copy out
  that also divides by the number of ranks), since one call per bias vector would cost a message
  latency each.
- float16 and bfloat16 gradients travel in float32 buckets (MPI has no sum of either).

All buckets are started before the first is waited for, so MPI moves them together. The layout is
compared across ranks the first time it is seen (a DistributedError names the ranks that differ); later
steps with the same layout cost one call per bucket and nothing else.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import numpy as np

from polygrad.config import get as get_setting
from polygrad.device import Buffer
from polygrad.distributed.hostview import readable, writable, write_back
from polygrad.distributed.comm import World
from polygrad.dtype import DType, dtypes

WIDENED = (dtypes.float16, dtypes.bfloat16)  # carried as float32


@dataclass
class Bucket:
    """Buffers reduced by one MPI call: one alone (`packed` None) or several packed into `packed`."""

    members: list[int]  # indices into the averaged list
    offsets: list[int] = field(default_factory=list)
    packed: np.ndarray | None = None


def plan_buckets(layout: list[tuple[DType, int]], bucket_bytes: int) -> list[Bucket]:
    """Buckets of a layout [(dtype, size)]: big buffers alone, the rest packed per dtype in order."""
    out: list[Bucket] = []
    open_: dict[str, Bucket] = {}
    filled: dict[str, int] = {}
    for i, (dt, size) in enumerate(layout):
        carried = np.dtype(np.float32) if dt in WIDENED else np.dtype(dt.np)
        nbytes = size * carried.itemsize
        if nbytes >= bucket_bytes and dt not in WIDENED:
            out.append(Bucket([i]))
            continue
        key = carried.str
        b = open_.get(key)
        if b is None or (filled[key] + size) * carried.itemsize > bucket_bytes:
            b = open_[key] = Bucket([], packed=np.empty(0, dtype=carried))
            filled[key] = 0
            out.append(b)
        b.members.append(i)
        b.offsets.append(filled[key])
        filled[key] += size
    for b in out:
        if b.packed is not None:
            b.packed = np.empty(b.offsets[-1] + layout[b.members[-1]][1], dtype=b.packed.dtype)
    return out


def _to_carried(arr: np.ndarray, dt: DType) -> np.ndarray:
    if dt is dtypes.bfloat16:  # bfloat16 is stored as its upper 16 bits of a float32
        return (arr.astype(np.uint32) << 16).view(np.float32)
    return arr


def _from_carried(values: np.ndarray, scale: float, dt: DType, out: np.ndarray) -> None:
    """out = values * scale in dtype dt, in one pass over the memory."""
    if dt is dtypes.bfloat16:  # round to nearest even, as the kernels' casts do
        bits = (values * np.float32(scale)).view(np.uint32)
        out[:] = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    else:
        np.multiply(values, values.dtype.type(scale), out=out, casting="unsafe")


class Averager:
    """Averages same-layout buffer lists across the ranks, one MPI call per bucket; plans are kept."""

    def __init__(self, world: World, bucket_bytes: int | None = None):
        self.world = world
        self.bucket_bytes = bucket_bytes or get_setting("POLY_DIST_BUCKET_MB") << 20
        self.plans: dict[tuple, list[Bucket]] = {}

    def average(self, sources: list[Buffer], targets: list[Buffer] | None = None, what: str = "gradient averaging",
                defer: bool = False, sums: bool = False) -> list[float]:
        """Write the mean over the ranks of each source into its target (default: into the source itself).

        Returns each target's pending factor: 1.0 (it holds the mean), or with `defer` 1/N for a buffer reduced
        in its own memory, which then holds the sum: the caller folds the factor into the kernel that reads
        it (DistributedOptimizer: the optimizer step), saving a pass over the biggest buffers. Packed and
        widened buffers are scaled while they are unpacked, where it costs nothing. With `sums` every target
        holds the sum (factor 1/N for all): Model.fit's optimizer step scales every gradient by one slot."""
        w = self.world
        targets = sources if targets is None else targets
        key = tuple((b.dtype, b.size) for b in sources)
        plan = self.plans.get(key)
        if plan is None:
            text = ",".join(f"{dt.name}[{n}]" for dt, n in key)
            w.check_same(what, f"{len(key)} buffers of {sum(n for _, n in key)} elements, layout crc "
                               f"{zlib.crc32(text.encode()):08x}")
            plan = self.plans[key] = plan_buckets(list(key), self.bucket_bytes)
        ins = [readable(b) for b in sources]
        outs = [writable(t) if t is not s else ins[i] for i, (s, t) in enumerate(zip(sources, targets))]
        scale = 1.0 / w.size
        factors = [1.0] * len(sources)
        requests = []
        for b in plan:
            if b.packed is None:
                i = b.members[0]
                requests.append(self._start(ins[i], outs[i]))
                continue
            for i, off in zip(b.members, b.offsets):
                b.packed[off:off + ins[i].size] = _to_carried(ins[i], key[i][0])
            requests.append(self._start(b.packed, b.packed))
        for r in requests:
            if r is not None:
                w.wait(r, what)
        for b in plan:
            if b.packed is None:
                i = b.members[0]
                if w.size == 1:
                    continue
                if defer or sums:
                    factors[i] = scale
                else:
                    np.multiply(outs[i], scale, out=outs[i], casting="unsafe")
                continue
            for i, off in zip(b.members, b.offsets):
                _from_carried(b.packed[off:off + outs[i].size], 1.0 if sums else scale, key[i][0], outs[i])
                if sums and w.size > 1:
                    factors[i] = scale
        for t, arr in zip(targets, outs):
            write_back(t, arr)
        w.stats.steps += 1
        w.stats.step_calls = [len(plan)] if w.comm is not None else [0]
        return factors

    def _start(self, send: np.ndarray, recv: np.ndarray):
        """Start the sum of `send` over the ranks into `recv` (None in a world of one: a copy)."""
        w = self.world
        if w.comm is None:
            if recv is not send:
                recv[:] = send
            return None
        w.stats.calls += 1
        w.stats.bytes += send.nbytes
        inplace = recv is send or np.shares_memory(recv, send)
        return w.comm.Iallreduce(w.mpi.IN_PLACE if inplace else send, recv, op=w.mpi.SUM)


def broadcast_buffers(world: World, bufs: list[Buffer], root: int = 0, what: str = "broadcast of the parameters",
                      bucket_bytes: int | None = None) -> None:
    """Overwrite every buffer with rank `root`'s contents: bytes packed into buckets of up to
    POLY_DIST_BUCKET_MB (a bigger buffer travels alone, in its own memory on a host device)."""
    if world.comm is None:
        return
    limit = bucket_bytes or get_setting("POLY_DIST_BUCKET_MB") << 20
    text = ",".join(f"{b.dtype.name}[{b.size}]" for b in bufs)
    world.check_same(what, f"{len(bufs)} buffers of {sum(b.nbytes for b in bufs)} bytes, layout crc "
                           f"{zlib.crc32(text.encode()):08x}")
    groups: list[list[int]] = []
    filled = 0
    for i, b in enumerate(bufs):
        if b.nbytes >= limit:
            groups.append([i])
            filled = limit  # closed: the next buffer starts a new group
            continue
        if not groups or filled + b.nbytes > limit:
            groups.append([])
            filled = 0
        groups[-1].append(i)
        filled += b.nbytes
    for group in groups:
        arrays = [readable(bufs[i]) for i in group]
        data = arrays[0].view(np.uint8) if len(group) == 1 else np.concatenate([a.view(np.uint8) for a in arrays])
        world.stats.calls += 1
        world.stats.bytes += data.nbytes if world.rank == root else 0
        world.wait(world.comm.Ibcast(data, root=root), what)
        start = 0
        for i, a in zip(group, arrays):
            if len(group) > 1:
                a.view(np.uint8)[:] = data[start:start + a.nbytes]
            start += a.nbytes
            write_back(bufs[i], a)
