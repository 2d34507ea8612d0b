"""The Program: what a bundle stores and a Model runs.

Stage: the data model every other module of polygrad.model reads and writes (capture builds it,
the executor runs it, training extends it, format.py writes and reads it). Input: nothing (plain
dataclasses; this module imports nothing else from polygrad.model). Output: `Program` (a buffer table
of `Slot`s, device-independent kernels, `Entry`s whose `Call`s name kernels and slots, the signature's
`Spec`s, Variables, RNG and training state), the slot roles, `compact` (renumbering after slots are
dropped) and `program_flow` (what each entrypoint's calls read before writing).

Slot roles:
  parameter  a trainable Tensor of `params`         state     a non-trainable one (BatchNorm statistics)
  constant   host data the callable created         rng       a (seed, counter) key, refilled per call
  gradient   a parameter's gradient (training)      optimizer optimizer state (moments, lr, beta powers)
  input      a declared input or target             output    an entrypoint result
  temporary  anything else the kernels write before they read it
  cache      a `caches=` buffer the entrypoints keep between calls (zeroed, never saved)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from polygrad.definitions import bundle as bundle_format
from polygrad.dtype import DType
from polygrad.uop import dataflow, serialize
from polygrad.uop.ops import UOp

ROLES = tuple(bundle_format.ROLES)  # a buffer's role in the bundle (polygrad/definitions/bundle.py)
STORED = bundle_format.STORED  # roles whose contents a bundle keeps
TRACKED = bundle_format.TRACKED  # roles that hold nothing until a call of the entrypoint writes them


def dtype_name(dt: DType) -> str:
    """The dtype's name as the bundle and error messages spell it (float32, bfloat16, ...)."""
    return serialize.DTYPE_NAMES[dt]


@dataclass
class Spec:
    """A declared input, target or output: name, dtype and shape (a str entry is a Variable's name)."""

    name: str
    dtype: DType
    shape: tuple[int | str, ...]

    def concrete(self, env: Mapping[str, int]) -> tuple[int, ...]:
        return tuple(env[d] if isinstance(d, str) else d for d in self.shape)


@dataclass
class Slot:
    """One entry of the buffer table."""

    name: str
    role: str
    dtype: DType
    shape: tuple[int | str, ...]
    size: int  # elements allocated (a Variable dimension at its maximum)


@dataclass
class Call:
    kernel: int  # index into Program.kernels; -1 for a copy (args = dst, src)
    args: tuple[int, ...]


@dataclass
class Entry:
    inputs: dict[str, int]
    outputs: dict[str, int]
    calls: list[Call]
    rng: list[int] = field(default_factory=list)  # key slots refilled (seed, counter++) before each call
    args: list[str] = field(default_factory=list)  # Variables the caller passes as ints (by their names)


@dataclass
class Program:
    slots: list[Slot]
    kernels: list[UOp]
    entries: dict[str, Entry]
    inputs: list[Spec]
    targets: list[Spec]
    outputs: list[Spec]
    variables: dict[str, tuple[int, int]]
    rng: list[int]  # [seed, counter]
    gradients: dict[int, int] = field(default_factory=dict)  # parameter slot -> gradient slot
    optimizer: dict | None = None  # {"name": ..., hyperparameters}
    lr_slot: int | None = None
    grad_scale_slot: int | None = None  # one-element optimizer slot the update multiplies the gradients by
    # input/target name -> [(classes, ignore_index)]: the loss reads it as class labels (noted at capture,
    # checked on the host data of every call; not stored in bundles)
    labels: dict[str, list[tuple[int, int]]] = field(default_factory=dict)


def compact(p: Program, keep: list[int]) -> None:
    """Keep only these slots (in order) and the kernels some call still runs, renumbering every reference."""
    new = {s: i for i, s in enumerate(keep)}
    p.slots = [p.slots[s] for s in keep]
    for e in p.entries.values():
        e.inputs = {k: new[s] for k, s in e.inputs.items()}
        e.outputs = {k: new[s] for k, s in e.outputs.items()}
        e.calls = [Call(c.kernel, tuple(new[a] for a in c.args)) for c in e.calls]
        e.rng = [new[s] for s in e.rng]
    p.gradients = {new[a]: new[g] for a, g in p.gradients.items()}
    used = sorted({c.kernel for e in p.entries.values() for c in e.calls if c.kernel >= 0})
    knew = {k: i for i, k in enumerate(used)}
    p.kernels = [p.kernels[k] for k in used]
    for e in p.entries.values():
        e.calls = [Call(knew[c.kernel] if c.kernel >= 0 else -1, c.args) for c in e.calls]


def program_flow(slots: list, kernels: list[UOp], entries: dict, variables: dict[str, tuple[int, int]]) -> dict:
    """{entrypoint: dataflow.Flow} of a program: its calls in order over the temporaries and outputs
    (every other role holds data when a call starts: stored, fed, refilled or zeroed at load)."""
    access: dict[int, dataflow.Access] = {}

    def access_of(k: int) -> dataflow.Access:
        hit = access.get(k)
        if hit is None:
            hit = access[k] = dataflow.kernel_access(kernels[k])
        return hit

    def elements(s: int) -> dataflow.Poly | None:  # what a caller reads of an output: its shape at the call's values
        slot = slots[s]
        if slot.role != "output":
            return None
        n: dataflow.Poly | None = dataflow.ONE
        for d in slot.shape:
            dim = dataflow.variable_poly(d, *variables[d]) if isinstance(d, str) else dataflow.size_poly(d)
            n = dataflow.poly_mul(n, dim) if n is not None and dim is not None else None
        return n

    tracked = {s for s, slot in enumerate(slots) if slot.role in TRACKED}
    inputs = {s for s, slot in enumerate(slots) if slot.role == "input"}  # may be the caller's own tensors
    return {name: dataflow.trace([(None if c.kernel < 0 else c.kernel, c.args) for c in e.calls], access_of,
                                 tracked, list(e.outputs.values()), lambda s: slots[s].size, elements, inputs)
            for name, e in entries.items()}
