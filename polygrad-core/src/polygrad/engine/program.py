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
    The launch contract every backend follows: the kernel takes one pointer per `globals` entry, then
    one integer per `vars` entry (DEFINE_VAR, in this order), and, when `threads` > 1, the thread
    index; it is launched `threads` times, with index 0..threads-1, in any order or concurrently.
    """

    name: str
    ast: UOp
    globals: tuple[GlobalArg, ...]
    ops: int
    mem_bytes: int
    opts: tuple = ()
    vars: tuple[UOp, ...] = ()
    threads: int = 1
    vector_width: int = 1  # the device's float32 lanes: renderers emit one upcast range as vectors of it
