"""Recorded launches to a Program's buffer table and calls.

Stage: capture -> program, for the entrypoints capture.py records and for the optimizer step that
optim.py records on the first training step. Input: a `CapturedGraph` (engine/capture.py: launches over
Buffers) and the `SlotTable` built so far. Output: an `Entry` whose calls name kernels (deduplicated
across entrypoints) and slots; buffers the table does not know yet become rng keys, temporaries or
constants, and a Tensor the callable reads without declaring it is a `ModelCaptureError`.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from polygrad.device import Buffer
from polygrad.dtype import DType
from polygrad.model.errors import ModelCaptureError
from polygrad.model.program import Call, Entry, Slot, dtype_name
from polygrad.uop.ops import Ops, UOp


class SlotTable:
    """Builds the slot table from captured graphs (authoring buffers -> Model slots)."""

    def __init__(self) -> None:
        self.slots: list[Slot] = []
        self.data: dict[int, np.ndarray | Buffer] = {}  # a slot's initial contents
        self.bufs: list[Buffer | None] = []  # the Buffer a slot starts from (None: allocate)
        self.slot_of: dict[int, int] = {}

    def add(self, name: str, role: str, dtype: DType, shape: tuple, size: int, buf: Buffer | None = None,
            data: np.ndarray | Buffer | None = None) -> int:
        s = len(self.slots)
        self.slots.append(Slot(name, role, dtype, tuple(shape), int(size)))
        self.bufs.append(None)
        if buf is not None:
            self.slot_of[id(buf)] = s
            self.bufs[s] = buf
        if data is not None:
            self.data[s] = data
        return s


def entry_of(name: str, cap: Any, tb: SlotTable, kernels: dict[UOp, int], start_serial: int,
             variables: dict[str, tuple[int, int]]) -> Entry:
    """The calls of one captured graph over the table, adding its rng keys, constants and temporaries."""
    rng_ids = set()
    for t in cap.rng_keys:
        u = t.uop.src[0] if t.uop.op is Ops.RESHAPE else t.uop
        if u.op is Ops.BUFFER:
            rng_ids.add(id(u.arg))
    calls: list[Call] = []
    rng: list[int] = []
    n_tmp = n_const = 0
    for launch in cap.launches:
        args = []
        for b in launch.buffers:
            s = tb.slot_of.get(id(b))
            if s is None:
                if id(b) in rng_ids:
                    s = tb.add(f"rng.{name}.{len(rng)}", "rng", b.dtype, (b.size,), b.size, b)
                    rng.append(s)
                elif cap.created(b):
                    s = tb.add(f"temp.{name}.{n_tmp}", "temporary", b.dtype, (b.size,), b.size, b)
                    n_tmp += 1
                elif b.serial > start_serial:
                    s = tb.add(f"const.{name}.{n_const}", "constant", b.dtype, (b.size,), b.size, b, b.numpy())
                    n_const += 1
                else:
                    raise ModelCaptureError(
                        f"the callable reads a Tensor ({b.size} x {dtype_name(b.dtype)}) that is neither an input nor "
                        "one of "
                        "its parameters; a plain function's closure state must be passed explicitly, e.g. "
                        "Model(f, inputs=..., params={'w': w}), and an object's tensors must be its attributes")
            args.append(s)
        if launch.kind == "copy":
            calls.append(Call(-1, tuple(args)))
            continue
        for v in (n for n in launch.ast.toposort() if n.op is Ops.DEFINE_VAR):
            if variables.get(v.arg[0]) != tuple(v.arg[1:]):
                raise ModelCaptureError(f"a kernel uses Variable {v.arg[0]!r} {v.arg[1:]}, which is not the declared "
                                        "leading dimension of an input; bind such sizes outside the model")
        ast, args = merge_aliases(launch.ast, args, [b.size for b in launch.buffers])
        k = kernels.setdefault(ast, len(kernels))
        calls.append(Call(k, tuple(args)))
    return Entry({}, {}, calls, rng)


def merge_aliases(ast: UOp, args: list[int], sizes: list[int]) -> tuple[UOp, list[int]]:
    """A kernel given one buffer as several parameters (a custom kernel called with one tensor twice)
    rewritten to reach it through one parameter, the first: a bundle's calls take distinct buffers
    (docs/bundle-format.md section 4), and through one pointer the reads and writes keep their order."""
    if len(set(args)) == len(args):
        return ast, args
    kept: list[int] = []
    position: list[int] = []  # old parameter -> new one
    for s in args:
        if s not in kept:
            kept.append(s)
        position.append(kept.index(s))
    shared = {p for p in position if position.count(p) > 1}
    new: dict[UOp, UOp] = {}
    for n in ast.toposort():
        if n.op is Ops.DEFINE_GLOBAL:
            p = position[n.arg[0]]
            new[n] = UOp(Ops.DEFINE_GLOBAL, n.dtype, (), (p, (sizes[n.arg[0]],) if p in shared else n.arg[1]))
        else:
            src = tuple(new[x] for x in n.src)
            new[n] = n if src == n.src else n.replace(src=src)
    return new[ast], kept
