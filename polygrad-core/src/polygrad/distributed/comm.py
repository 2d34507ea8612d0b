"""The world of processes: MPI found and started (or a world of one), waits with a deadline, counters.

Stage: distributed runtime. Input: the launcher's environment (mpiexec / srun set PMI_*, OMPI_*, PMIX_*
variables) and the settings POLY_DIST_TIMEOUT. Output: the `World` every collective runs in: rank, size,
the mpi4py communicator (None in a world of one), `wait` (a request completed within the deadline, else
DistributedError), `check_same` (every rank holds the same description, else DistributedError naming the
ranks) and the counters `stats()` reports.

mpi4py is imported only when the environment says this process was launched as one rank of several, so a
plain `python train.py` needs neither mpi4py nor an MPI library. In a world of several ranks an uncaught
exception on one rank aborts the whole job (MPI_Abort), so the other ranks never wait for it forever.
"""
from __future__ import annotations

import os
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from polygrad.config import get as get_setting
from polygrad.errors import DistributedError

INSTALL_HINT = ("pip install 'polygrad[distributed]' (mpi4py and an MPICH build), or pip install mpi4py "
                "against your cluster's MPI (docs/distributed.md)")
# launcher variables that give the number of ranks: MPICH/Hydra, Intel MPI and srun --mpi=pmi2 (PMI_SIZE), Open MPI
SIZE_VARIABLES = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE")
# after this long waiting, poll every POLL_SLEEP seconds instead of spinning (a straggler, not a transfer)
SPIN_SECONDS = 0.5
POLL_SLEEP = 0.001
ABORT_GRACE = 0.25  # seconds between printing a rank's traceback and MPI_Abort
SIGNATURE_BYTES = 240  # a rank's description of a collective's operand, padded to a fixed size


@dataclass
class Stats:
    """Counters of this process's collectives (see `polygrad.distributed.stats`)."""

    calls: int = 0      # collectives that move data (one MPI call each)
    checks: int = 0     # collectives that compare the ranks' shapes and dtypes
    bytes: int = 0      # bytes this rank contributed to data collectives
    seconds: float = 0.0  # wall time spent waiting for collectives to complete
    steps: int = 0      # gradient-averaging steps (DistributedOptimizer.step, Model.fit steps)
    step_calls: list[int] = field(default_factory=list)  # data calls of the last step


def launched_size() -> int:
    """The number of ranks the launcher started (1 when none did)."""
    for name in SIZE_VARIABLES:
        value = os.environ.get(name, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    return 1


class World:
    """This process's place among the ranks, and the MPI communicator (None in a world of one)."""

    def __init__(self, comm: Any, mpi: Any):
        self.comm, self.mpi = comm, mpi
        self.rank = comm.Get_rank() if comm is not None else 0
        self.size = comm.Get_size() if comm is not None else 1
        self.stats = Stats()

    def wait(self, request: Any, what: str) -> None:
        """Complete a nonblocking MPI request, or raise DistributedError after POLY_DIST_TIMEOUT seconds."""
        timeout = get_setting("POLY_DIST_TIMEOUT")
        start = time.perf_counter()
        while not request.Test():
            waited = time.perf_counter() - start
            if timeout and waited > timeout:
                self.stats.seconds += waited
                raise DistributedError(
                    f"rank {self.rank}: {what} did not complete within {timeout} s: another rank died, hangs, or "
                    "skipped this collective (every rank must call the same collectives in the same order). "
                    "Raise POLY_DIST_TIMEOUT if a rank is just slow")
            if waited > SPIN_SECONDS:
                time.sleep(POLL_SLEEP)
        self.stats.seconds += time.perf_counter() - start

    def check_same(self, what: str, description: str) -> None:
        """Raise DistributedError, on every rank, unless every rank passed the same description."""
        if self.comm is None:
            return
        mine = np.zeros(SIGNATURE_BYTES, dtype=np.uint8)
        raw = description.encode()[:SIGNATURE_BYTES]
        mine[:len(raw)] = np.frombuffer(raw, dtype=np.uint8)
        everyone = np.empty((self.size, SIGNATURE_BYTES), dtype=np.uint8)
        self.stats.checks += 1
        self.wait(self.comm.Iallgather(mine, everyone), f"{what} (comparing the ranks' operands)")
        seen = [bytes(row).rstrip(b"\0").decode(errors="replace") for row in everyone]
        if len(set(seen)) > 1:
            groups: dict[str, list[int]] = {}
            for r, d in enumerate(seen):
                groups.setdefault(d, []).append(r)
            parts = "; ".join(f"rank{'s' if len(rs) > 1 else ''} {', '.join(map(str, rs))}: {d}"
                              for d, rs in groups.items())
            raise DistributedError(f"{what}: the ranks disagree ({parts}); every rank must pass a tensor of the same "
                                   "shape and dtype (and the same op and root)")

    def abort_on_uncaught(self) -> None:
        """An uncaught exception on this rank prints its traceback, then aborts every rank (MPI_Abort)."""
        previous = sys.excepthook
        comm, rank = self.comm, self.rank

        def hook(kind: Any, value: Any, tb: Any) -> None:
            try:
                traceback.print_exception(kind, value, tb)
                print(f"polygrad.distributed: rank {rank} raised {kind.__name__}; aborting all ranks",
                      file=sys.stderr, flush=True)
                sys.stdout.flush()
                time.sleep(ABORT_GRACE)  # the launcher forwards output asynchronously: let it pass first
            finally:
                comm.Abort(1)
            previous(kind, value, tb)  # not reached: Abort ends the process
        sys.excepthook = hook


_world: World | None = None


def init() -> World:
    """Join the world the launcher started (idempotent); a world of one without a launcher."""
    global _world
    if _world is not None:
        return _world
    size = launched_size()
    if size == 1:
        _world = World(None, None)
        return _world
    try:
        from mpi4py import MPI  # optional dependency: only multi-rank runs need it
    except ImportError:
        raise DistributedError(f"this process is one of {size} ranks started by an MPI launcher, but mpi4py is not "
                               f"installed: {INSTALL_HINT}") from None
    comm = MPI.COMM_WORLD
    comm.Set_errhandler(MPI.ERRORS_RETURN)  # MPI failures become Python exceptions, not silent aborts
    _world = World(comm, MPI)
    if _world.size > 1:
        _world.abort_on_uncaught()
    return _world


def world() -> World:
    """The world, joined on first use."""
    return _world if _world is not None else init()
