"""`ProgramSpec`: a lowered kernel ready for a renderer (the contract between core and backends)."""
from __future__ import annotations

from dataclasses import dataclass

from polygrad.dtype import DType
from polygrad.uop.ops import UOp


@dataclass(frozen=True)
class GlobalArg:
    """One pointer argument of a kernel: slot number, element dtype, element count, written or not."""

    slot: int
    dtype: DType
    size: int
    written: bool


@dataclass(frozen=True)
class ProgramSpec:
    """A kernel after device-independent lowering and device optimisation.

    `ast` is kernel IR: SINK(END(STORE(INDEX(DEFINE_GLOBAL, idx), value), *ranges), ...).
    `thread_range` is the RANGE a host backend may split across threads (None when unsafe).
    """

    name: str
    ast: UOp
    globals: tuple[GlobalArg, ...]
    thread_range: UOp | None
    ops: int
    mem_bytes: int
    opts: tuple = ()

    @property
    def thread_size(self) -> int:
        return int(self.thread_range.src[0].arg) if self.thread_range is not None else 0
