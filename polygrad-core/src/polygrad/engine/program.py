"""`ProgramSpec`: a lowered kernel ready for a renderer (the contract between core and backends)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from polygrad.dtype import DType
from polygrad.uop.ops import Ops, UOp


@dataclass(frozen=True)
class GlobalArg:
    """One pointer argument of a kernel: slot number, element dtype, element count, written or not.
    `size` is an int, or a symbolic size over the kernel's variables (`spec.eval_int(size, var_vals)`)."""

    slot: int
    dtype: DType
    size: Any
    written: bool


@dataclass(frozen=True)
class ProgramSpec:
    """A kernel after device-independent lowering and device optimisation.

    `ast` is kernel IR: SINK(END(STORE(INDEX(DEFINE_GLOBAL, idx), value), *ranges), ...).
    The launch contract every backend follows: the kernel takes one pointer per `globals` entry, then
    one integer per `vars` entry (DEFINE_VAR, in this order), and, when `threads` > 1, the thread
    index; it is launched `threads` times, with index 0..threads-1, in any order or concurrently.
    `vars` are the kernel's symbolic-size Variables (DEFINE_VAR UOps, arg (name, min, max), sorted by
    name), valued per launch (`var_vals`, in this order). A RANGE's end (and a global's size) may be an
    expression over them: read it with `eval_int`. `ops` and `mem_bytes` count symbolic sizes at their
    variables' maxima.
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

    def eval_int(self, x: Any, var_vals: tuple[int, ...] = ()) -> int:
        """An int, or a size over this kernel's variables, at the launch's var_vals (spec.vars order)."""
        if not isinstance(x, UOp):
            return int(x)
        if x.op is Ops.CONST:
            return int(x.arg)
        from polygrad.uop.sint import sym_eval
        return sym_eval(x, dict(zip(self.vars, var_vals)))

    def max_int(self, x: Any) -> int:
        """An int, or a size over this kernel's variables at their largest values."""
        if not isinstance(x, UOp):
            return int(x)
        if x.op is Ops.CONST:
            return int(x.arg)
        from polygrad.uop.sint import vmax
        return vmax(x)
