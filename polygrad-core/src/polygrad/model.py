"""Model: a captured graph that owns its state, trains with fit(), and saves to a portable .pgb bundle.

Stage: user API over the capture layer. Input: a callable (an object with Tensor attributes, or a
function with explicit `params=`), declared inputs/targets and a loss. Output: a Model whose
entrypoints are lists of device-independent kernels over one buffer table, the same structure that
`save()` writes and `Model.load()` reads (docs/bundle-format.md), so a captured model and a loaded one
run through the same code, on any installed backend.

Construction runs the callable twice under `engine/capture.py` with zero-filled placeholders: once
for evaluation (TRAINING off when there is a loss) and once for training (TRAINING on, loss and
backward realized). The recorded buffers get roles:
  parameter  a trainable Tensor of `params`         state     a non-trainable one (BatchNorm statistics)
  constant   host data the callable created         rng       a (seed, counter) key, refilled per call
  gradient   a parameter's gradient (training)      optimizer optimizer state (moments, lr, beta powers)
  input      a declared input or target             output    an entrypoint result
  temporary  anything else the kernels write before they read it
  cache      a `caches=` buffer the entrypoints keep between calls (zeroed, never saved)
The Model then owns copies of every persistent buffer; the authoring tensors, their gradients, the
TRAINING setting and the global RNG are restored whatever happens. The optimizer graph is recorded on
the first training step (that step is a real update), so construction never runs an optimizer.
Capture is per thread: what other threads compute meanwhile is neither recorded nor guarded, and
their RNG draws and settings do not reach the model (engine/capture.py, random.scoped, config.Context).

Entrypoints: "forward" (evaluation), "loss" (training forward + backward: the loss and the gradients),
"optimizer_step" and "train_step" ("loss" then "optimizer_step") once an optimizer is configured, and
any extra evaluation entrypoints given with `entrypoints=` (a KV-cache "decode", for instance).

>>> from polygrad import Model, Tensor
>>> class Scale:
...     def __init__(self): self.w = Tensor([2.0])
...     def __call__(self, x): return {"y": x * self.w}
>>> m = Model(Scale(), inputs={"x": Tensor.empty(3)})
>>> m.forward(x=[1, 2, 3])["y"].numpy().tolist()
[2.0, 4.0, 6.0]
>>> m2 = Model.load(m.save()); m.dispose()
>>> m2.forward(x=[1, 1, 1])["y"].numpy().tolist()
[2.0, 2.0, 2.0]
>>> m2.dispose()
"""
from __future__ import annotations

import functools
import inspect
import os
import sys
import time
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np

from polygrad import bundle, config, limits, runtime_context
from polygrad.atomicfile import write_file
from polygrad.bundle import BundleError
from polygrad.definitions import bundle as bundle_format
from polygrad.definitions import optimizer as optimizer_table
from polygrad.device import Buffer, canonicalize, note_overwrite
from polygrad.dtype import DType, dtypes
from polygrad.engine import realize
from polygrad.engine.capture import CaptureError, capture
from polygrad.engine.schedule import capacity_buffers
from polygrad.errors import PolygradError
from polygrad.uop import serialize, sint
from polygrad.uop.ops import Ops, UOp

__all__ = ["BundleError", "Model", "ModelCaptureError", "ModelError", "ModelInputError", "ModelSummary"]

ROLES = tuple(bundle_format.ROLES)  # a buffer's role in the bundle (polygrad/definitions/bundle.py)
STORED = bundle_format.STORED  # roles whose contents a bundle keeps
OPTIMIZERS = optimizer_table.NAMES


def _dtname(dt: DType) -> str:
    """The dtype's name as the bundle and error messages spell it (float32, bfloat16, ...)."""
    return serialize.DTYPE_NAMES[dt]


class ModelError(PolygradError, ValueError):
    """A Model used in a way it cannot serve: disposed, no loss for training, bad fit() arguments."""


class ModelInputError(ModelError):
    """An input or target with a wrong name, shape or dtype (the message says which and what was expected)."""


class ModelCaptureError(CaptureError):
    """The callable did something a captured graph cannot hold (an effectful read, an assignment to a
    parameter or input, a Tensor that is not among the parameters)."""


# ---------------------------------------------------------------------------------------------------
# the program: what a bundle stores and a Model runs


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
    # input/target name -> [(classes, ignore_index)]: the loss reads it as class labels (noted at capture,
    # checked on the host data of every call; not stored in bundles)
    labels: dict[str, list[tuple[int, int]]] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------------
# capture


class _Guard:
    """Guards this thread's host reads and assignments while the user's callable runs (tensor_common.guarded)."""

    def __init__(self, protected: dict[int, str]):
        self.protected = protected  # id(Buffer) -> "parameter 'w'" / "input 'x'"
        self.labels: dict[int, set[tuple[int, int]]] = {}  # id(Buffer) -> {(classes, ignore_index)}

    def class_labels(self, t: Any, n_classes: int, ignore_index: int) -> None:
        """A loss reads `t` as class labels (tensor_losses.py); remember it when `t` is an input."""
        from polygrad.uop.movement import strip_reshapes
        u = strip_reshapes(t.uop)
        if u.op is Ops.BUFFER:
            self.labels.setdefault(id(u.arg), set()).add((n_classes, ignore_index))

    def read(self, t: Any, call: str) -> None:
        raise ModelCaptureError(f"Tensor.{call}() was called during Model capture; a captured graph cannot read "
                                "data back to Python or write host data into a tensor. Keep the computation in "
                                f"Tensor ops and return tensors instead of calling .{call}()")

    def assign(self, t: Any) -> None:
        from polygrad.uop.movement import strip_reshapes
        u = strip_reshapes(t.uop)
        what = self.protected.get(id(u.arg)) if u.op is Ops.BUFFER else None
        if what is not None:
            raise ModelCaptureError(f"Tensor.assign() to {what} during Model capture; a Model owns its parameters "
                                    "and inputs and only the optimizer updates them. Compute a new tensor instead")


def _declare(var: UOp, variables: dict[str, tuple[int, int]]) -> str:
    """Record a Variable's bounds under its name (one name, one pair of bounds) and return the name."""
    vname, lo, hi = var.arg
    if variables.setdefault(vname, (lo, hi)) != (lo, hi):
        raise ModelError(f"Variable {vname!r} is declared with bounds {variables[vname]} and {(lo, hi)}")
    return vname


def _is_variable(v: Any) -> bool:
    return isinstance(v, UOp) and v.op in (Ops.DEFINE_VAR, Ops.BIND) and \
        (v.op is Ops.DEFINE_VAR or v.src[0].op is Ops.DEFINE_VAR)


def _spec_of(name: Any, t: Any, what: str, variables: dict[str, tuple[int, int]]) -> Spec:
    from polygrad.tensor import Tensor
    if not isinstance(name, str) or not name.isidentifier():
        raise ModelError(f"{what} names must be identifiers (they become keyword arguments), got {name!r}")
    if not isinstance(t, Tensor):
        raise ModelError(f"{what}[{name!r}] must be a Tensor declaring shape and dtype, e.g. Tensor.empty(32, 784), "
                         f"or a Variable passed as an int; got {type(t).__name__}")
    shape: list[int | str] = []
    for d in t.shape:
        if isinstance(d, UOp):
            if not _is_variable(d):
                raise ModelError(f"{what}[{name!r}] shape {t.shape}: a variable dimension must be a Variable itself, "
                                 "not an expression (e.g. Tensor.empty(Variable('batch', 1, 64), 784))")
            shape.append(_declare(d if d.op is Ops.DEFINE_VAR else d.src[0], variables))
        else:
            shape.append(int(d))
    return Spec(name, t.dtype, tuple(shape))


def _split_inputs(decl: Any, what: str, variables: dict[str, tuple[int, int]]) -> tuple[list[Spec], list[str]]:
    """(tensor input specs, Variable argument names) of one entrypoint's declared inputs."""
    if not isinstance(decl, Mapping) or not decl:
        raise ModelError(f"{what} must be a dict {{name: Tensor.empty(shape)}} declaring at least one input")
    specs, args = [], []
    for k, v in decl.items():
        if _is_variable(v):
            var = v if v.op is Ops.DEFINE_VAR else v.src[0]
            if k != var.arg[0]:
                raise ModelError(f"{what}[{k!r}] is Variable {var.arg[0]!r}; a Variable argument is passed under "
                                 f"its own name: {{{var.arg[0]!r}: Variable({var.arg[0]!r}, ...)}}")
            args.append(_declare(var, variables))
        else:
            specs.append(_spec_of(k, v, what, variables))
    return specs, args


def _capture_value(lo: int, hi: int) -> int:
    """The value a Variable is bound to while capturing: the smallest positive one its bounds allow, so the
    capture run is cheap (the recorded kernels are value-free and serve every value alike)."""
    return min(hi, max(lo, 1))


def _outputs_dict(result: Any) -> dict[str, Any]:
    from polygrad.tensor import Tensor
    if isinstance(result, Tensor):
        return {"output": result}
    if isinstance(result, Mapping) and result and all(isinstance(v, Tensor) for v in result.values()):
        for k in result:
            if not isinstance(k, str) or not k.isidentifier():
                raise ModelError(f"output names must be identifiers, got {k!r}")
        return dict(result)
    raise ModelError("the model callable must return a Tensor or a non-empty dict of name -> Tensor, got "
                     f"{type(result).__name__}")


def _params_of(obj: Any, params: Any) -> dict[str, Any]:
    from polygrad.nn.state import get_state_dict
    from polygrad.tensor import Tensor
    if params is None:
        if isinstance(obj, types.MethodType):
            return get_state_dict(obj.__self__)
        if isinstance(obj, (types.FunctionType, types.BuiltinFunctionType, functools.partial)):
            return {}  # a plain function: its closure state must come as params=
        return get_state_dict(obj)
    if isinstance(params, Mapping):
        named = dict(params)
    elif isinstance(params, (list, tuple)):
        named = {f"p{i}": t for i, t in enumerate(params)}
    else:
        named = get_state_dict(params)
    for k, t in named.items():
        if not isinstance(t, Tensor):
            raise ModelError(f"params[{k!r}] must be a Tensor, got {type(t).__name__}")
    return named


def _call_loss(loss: Callable, outputs: dict, targets: dict) -> Any:
    try:
        sig = inspect.signature(loss)
        names = [p.name for p in sig.parameters.values()][1:]
        by_name = set(targets) <= set(names) or any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
    except (TypeError, ValueError):
        by_name = False
    return loss(outputs, **targets) if by_name else loss(outputs, *targets.values())


class _Table:
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


def _capture(obj: Any, inputs: Mapping, targets: Mapping, loss: Callable | None, params: Any, runtime: Any,
             caches: Mapping | None = None,
             entrypoints: Mapping | None = None) -> tuple[Program, dict[int, Any], str]:
    from polygrad import random
    from polygrad.config import Context
    from polygrad.tensor import Tensor, _buffer_uop
    from polygrad.tensor_common import guarded
    if not callable(obj):
        raise ModelError(f"Model needs a callable (an object with __call__ or a function), got {type(obj).__name__}")
    if not isinstance(inputs, Mapping) or not inputs:
        raise ModelError("Model needs inputs={name: Tensor.empty(shape)} declaring at least one input")
    if targets and loss is None:
        raise ModelError("targets= were given without loss=; pass loss=lambda outputs, **targets: ...")
    if loss is not None and not callable(loss):
        raise ModelError(f"loss must be callable as loss(outputs, **targets), got {type(loss).__name__}")
    variables: dict[str, tuple[int, int]] = {}
    in_specs, in_args = _split_inputs(inputs, "inputs", variables)
    tgt_specs = [_spec_of(k, t, "targets", variables) for k, t in (targets or {}).items()]
    if {s.name for s in in_specs} & {s.name for s in tgt_specs}:
        raise ModelError("an input and a target share a name; names must be distinct")
    if loss is not None and in_args:
        raise ModelError(f"Variable arguments {in_args} cannot feed a model with a loss; declare them on an extra "
                         "evaluation entrypoint (entrypoints=)")
    extra = _extra_entrypoints(entrypoints, variables)
    decls = [inputs, targets or {}] + [d for _, d, _, _ in extra.values()]
    devices = {t.device for d in decls for t in d.values() if isinstance(t, Tensor)}
    named = _params_of(obj, params)
    cache_named = _caches_of(caches)
    cache_ids = {id(t._buffer()) for t in cache_named.values()}
    named = {k: t for k, t in named.items() if id(t._buffer()) not in cache_ids}  # caches are not parameters
    devices |= {t.device for t in list(named.values()) + list(cache_named.values())}
    if len(devices) != 1:
        raise ModelError(f"a Model lives on one device; its tensors are on {sorted(devices)}")
    device = devices.pop()

    Tensor.realize_all(*named.values())
    unique: dict[int, tuple[str, Any, Buffer]] = {}
    for name, t in named.items():
        b = t._buffer()
        unique.setdefault(id(b), (name, t, b))
    cache_bufs: dict[int, tuple[str, Any, Buffer]] = {}
    for name, t in cache_named.items():
        b = t._buffer()
        cache_bufs.setdefault(id(b), (name, t, b))
    owned = {**unique, **cache_bufs}
    saved = {id(t): (t, t.uop, t.grad, t.requires_grad) for _, t, _ in owned.values()}
    # in parameter order (a dict, not a set of ids): the gradient slots, and so the bundle, are the same on
    # every build
    trainable = {bid: None for bid, (_, t, b) in unique.items()
                 if t.requires_grad is not False and dtypes.is_float(t.dtype)}
    # what the capture run may change (state, caches) is saved to restore it; parameters are guarded
    # against assignment, so the Model copies them from their own buffers afterwards (no host copy of
    # every weight at once)
    values = {bid: b.numpy() for bid, (_, _, b) in owned.items() if bid not in trainable}
    rng_before = random.get_state()
    training_before = config.get("TRAINING")

    def placeholder(spec: Spec) -> Any:
        shape = []
        for d in spec.shape:
            if isinstance(d, str):
                lo, hi = variables[d]
                shape.append(sint.Variable(d, lo, hi).bind(_capture_value(lo, hi)))
            else:
                shape.append(d)
        size = int(np.prod([variables[d][1] if isinstance(d, str) else d for d in spec.shape], dtype=np.int64))
        buf = Buffer(device, size, spec.dtype)
        buf.copyin(np.zeros(size, dtype=spec.dtype.np))
        symbolic = any(isinstance(d, UOp) for d in shape)
        if symbolic:
            capacity_buffers.add(buf)
        u = UOp(Ops.RESHAPE, buf.dtype, (UOp(Ops.BUFFER, buf.dtype, (), buf),), tuple(shape)) if symbolic else \
            _buffer_uop(buf, tuple(shape))
        return Tensor(u, _runtime=runtime)._as_leaf(), buf

    def bound_args(names: list[str]) -> dict[str, UOp]:
        return {v: sint.Variable(v, *variables[v]).bind(_capture_value(*variables[v])) for v in names}

    ph = {s.name: placeholder(s) for s in in_specs}
    th = {s.name: placeholder(s) for s in tgt_specs}
    eh = {e: {s.name: placeholder(s) for s in specs} for e, (_, _, specs, _) in extra.items()}
    protected = {id(b): f"input {k!r}" for k, (_, b) in {**ph, **th}.items()}
    protected.update({id(b): f"input {k!r} of entrypoint {e!r}" for e, h in eh.items() for k, (_, b) in h.items()})
    protected.update({bid: f"parameter {unique[bid][0]!r}" for bid in trainable})
    guard = _Guard(protected)
    start_serial = Buffer(device, 0, dtypes.float32).serial
    graphs: dict[str, Any] = {}
    outs_of: dict[str, dict[str, Buffer]] = {}
    shapes_of: dict[str, dict[str, tuple]] = {}
    grad_bufs: dict[int, Buffer] = {}

    def capture_eval(ename: str, fn: Callable, holders: dict, args: list[str]) -> None:
        out_bufs, out_shapes = {}, {}
        with capture() as cap:
            outs = _outputs_dict(fn(**{k: t for k, (t, _) in holders.items()}, **bound_args(args)))
            for k, t in outs.items():
                out_shapes[k] = t.shape
                out_bufs[k] = t.contiguous()._buffer()
        for k, b in out_bufs.items():
            if not cap.created(b):
                raise ModelCaptureError(f"output {k!r} is an input or parameter itself; return a computed "
                                        "tensor (for example x * 1) so the Model can hand out a copy")
        graphs[ename] = (cap, list(out_bufs.values()))
        outs_of[ename], shapes_of[ename] = out_bufs, out_shapes

    try:
        # the capture runs draw from this thread's copy of the RNG state (dropped afterwards), under this
        # thread's guard: other threads neither see these settings nor get recorded
        with guarded(guard), random.scoped(), runtime_context.using(runtime):
            with Context(TRAINING=0 if loss is not None else training_before):
                capture_eval("forward", obj, ph, in_args)
                for ename, (fn, _, _, args) in extra.items():
                    capture_eval(ename, fn, eh[ename], args)
            if loss is not None:
                with Context(TRAINING=1):
                    for bid in trainable:
                        t = unique[bid][1]
                        t.requires_grad, t.grad = True, None
                    with capture() as cap:
                        touts = _outputs_dict(obj(**{k: t for k, (t, _) in ph.items()}))
                        lv = _call_loss(loss, touts, {k: t for k, (t, _) in th.items()})
                        if not isinstance(lv, Tensor) or lv.numel() != 1 or not dtypes.is_float(lv.dtype):
                            raise ModelError("loss must return a one-element float Tensor (e.g. a .mean()), got "
                                             f"{getattr(lv, 'shape', type(lv).__name__)}")
                        lv = lv.reshape(())
                        lv.backward()
                        grads = {bid: unique[bid][1].grad for bid in trainable if unique[bid][1].grad is not None}
                        Tensor.realize_all(lv, *grads.values(), *[t for _, t, _ in unique.values()])
                        loss_buf = lv._buffer()
                        grad_bufs = {bid: g._buffer() for bid, g in grads.items()}
                    graphs["loss"] = (cap, [loss_buf])
    finally:
        for t, uop, grad, req in saved.values():
            t.uop, t.grad, t.requires_grad = uop, grad, req
        for bid, (_, t, b) in owned.items():
            if bid not in trainable:
                b.copyin(values[bid])  # the placeholder run's state and cache writes are not the model's

    # ---- the slot table
    tb = _Table()
    for spec, (_, b) in list(zip(in_specs, ph.values())) + list(zip(tgt_specs, th.values())):
        tb.add(f"input.{spec.name}", "input", spec.dtype, spec.shape, b.size, b)
    for ename, h in eh.items():
        for spec, (_, b) in zip(extra[ename][2], h.values()):
            tb.add(f"input.{ename}.{spec.name}", "input", spec.dtype, spec.shape, b.size, b)
    for bid, (name, t, b) in unique.items():
        tb.add(name, "parameter" if bid in trainable else "state", b.dtype, tuple(int(d) for d in t.shape),
               b.size, b, values.get(bid, b))
    for bid, (name, t, b) in cache_bufs.items():
        tb.add(name, "cache", b.dtype, tuple(int(d) for d in t.shape), b.size, b)
    kernels: dict[UOp, int] = {}
    out_specs: list[Spec] = []
    out_slots: dict[str, dict[str, int]] = {}
    for ename, out_bufs in outs_of.items():
        out_slots[ename] = {}
        for k, b in out_bufs.items():
            shape = _out_shape(k, shapes_of[ename][k], variables)
            if ename == "forward":
                out_specs.append(Spec(k, b.dtype, shape))
            slot_name = f"output.{k}" if ename == "forward" else f"output.{ename}.{k}"
            out_slots[ename][k] = tb.add(slot_name, "output", b.dtype, shape, b.size, b)
    loss_slot = None
    if "loss" in graphs:
        loss_slot = tb.add("output.loss", "output", graphs["loss"][1][0].dtype, (), graphs["loss"][1][0].size,
                           graphs["loss"][1][0])
        for bid, g in grad_bufs.items():
            tb.add(f"grad.{unique[bid][0]}", "gradient", g.dtype, tb.slots[tb.slot_of[bid]].shape, g.size, g)
    entries: dict[str, Entry] = {}
    for ename, (cap, outs_b) in graphs.items():
        entries[ename] = _entry_of(ename, cap, tb, kernels, start_serial, variables)
        if ename in eh:
            holders, args = eh[ename], extra[ename][3]
        else:
            holders = {**ph, **th} if ename == "loss" else ph
            args = in_args if ename == "forward" else []
        entries[ename].inputs = {n: tb.slot_of[id(b)] for n, (_, b) in holders.items()}
        entries[ename].outputs = out_slots[ename] if ename in out_slots else {"loss": loss_slot}
        entries[ename].args = list(args)
    labels = {k: sorted(guard.labels[id(b)]) for k, (_, b) in {**ph, **th}.items() if id(b) in guard.labels}
    prog = Program(tb.slots, list(kernels), entries, in_specs, tgt_specs, out_specs, variables,
                   [int(rng_before["seed"]), int(rng_before["counter"])],
                   gradients={tb.slot_of[bid]: tb.slot_of[id(g)] for bid, g in grad_bufs.items()}, labels=labels)
    return prog, tb.data, device


BUILTIN_ENTRYPOINTS = tuple(bundle_format.ENTRYPOINTS)


def _extra_entrypoints(entrypoints: Any, variables: dict[str, tuple[int, int]]) -> dict[str, tuple]:
    """{name: (callable, declared inputs, tensor input specs, Variable argument names)} of the extra
    evaluation entrypoints, checked."""
    if entrypoints is None:
        return {}
    if not isinstance(entrypoints, Mapping):
        raise ModelError("entrypoints must be a dict {name: (callable, {input name: Tensor.empty(...) or Variable})}")
    out = {}
    for name, pair in entrypoints.items():
        if not isinstance(name, str) or not name.isidentifier() or name in BUILTIN_ENTRYPOINTS:
            raise ModelError(f"entrypoint name {name!r} must be an identifier other than {list(BUILTIN_ENTRYPOINTS)}")
        if not isinstance(pair, (tuple, list)) or len(pair) != 2 or not callable(pair[0]):
            raise ModelError(f"entrypoints[{name!r}] must be (callable, {{input name: Tensor.empty(...)}})")
        specs, args = _split_inputs(pair[1], f"entrypoints[{name!r}] inputs", variables)
        out[name] = (pair[0], pair[1], specs, args)
    return out


def _caches_of(caches: Any) -> dict[str, Any]:
    from polygrad.tensor import Tensor
    if caches is None:
        return {}
    if not isinstance(caches, Mapping):
        raise ModelError("caches must be a dict {name: Tensor} of buffers the entrypoints keep between calls")
    for k, t in caches.items():
        if not isinstance(k, str) or not k:
            raise ModelError(f"cache names must be non-empty strings, got {k!r}")
        if not isinstance(t, Tensor):
            raise ModelError(f"caches[{k!r}] must be a Tensor, got {type(t).__name__}")
        if any(isinstance(d, UOp) for d in t.shape):
            raise ModelError(f"caches[{k!r}] has a symbolic shape {t.shape}; a cache is allocated at a fixed size")
    return dict(caches)


def _out_shape(name: str, shape: tuple, variables: dict[str, tuple[int, int]]) -> tuple[int | str, ...]:
    out: list[int | str] = []
    for d in shape:
        if isinstance(d, UOp):
            var = d.src[0] if d.op is Ops.BIND else d
            if var.op is not Ops.DEFINE_VAR or var.arg[0] not in variables:
                raise ModelCaptureError(f"output {name!r} has shape {shape}; an output dimension must be fixed or be "
                                        "one of the inputs' Variables itself (not an expression of them)")
            out.append(var.arg[0])
        else:
            out.append(int(d))
    return tuple(out)


def _entry_of(name: str, cap: Any, tb: _Table, kernels: dict[UOp, int], start_serial: int,
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
                        f"the callable reads a Tensor ({b.size} x {_dtname(b.dtype)}) that is neither an input nor "
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
        ast, args = _merge_aliases(launch.ast, args, [b.size for b in launch.buffers])
        k = kernels.setdefault(ast, len(kernels))
        calls.append(Call(k, tuple(args)))
    return Entry({}, {}, calls, rng)


def _merge_aliases(ast: UOp, args: list[int], sizes: list[int]) -> tuple[UOp, list[int]]:
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


# ---------------------------------------------------------------------------------------------------
# the Model


@dataclass
class ModelSummary:
    """What summary() returns: metadata only (nothing executed, no weights read)."""

    inputs: list[dict]
    targets: list[dict]
    outputs: list[dict]
    entrypoints: list[str]
    parameters: list[dict]
    state: list[dict]
    parameter_count: int
    bytes: dict[str, int]
    device: str
    optimizer: dict | None

    def __str__(self) -> str:
        def sig(rows: list[dict]) -> str:
            return ", ".join(f"{r['name']}: {r['dtype']}{list(r['shape'])}" for r in rows) or "-"
        lines = [f"Model on {self.device}", f"  inputs:      {sig(self.inputs)}", f"  targets:     {sig(self.targets)}",
                 f"  outputs:     {sig(self.outputs)}", f"  entrypoints: {', '.join(self.entrypoints)}",
                 f"  parameters:  {self.parameter_count:,} in {len(self.parameters)} tensors"]
        lines += [f"    {p['name']:32s} {p['dtype']:9s} {str(list(p['shape'])):18s} {p['count']:>10,}"
                  for p in self.parameters + self.state]
        lines.append("  bytes:       " + ", ".join(f"{k} {v:,}" for k, v in self.bytes.items() if v))
        if self.optimizer:
            lines.append(f"  optimizer:   {self.optimizer}")
        return "\n".join(lines)

    __repr__ = __str__


class Model:
    """A captured graph with its own state: forward/call/train_step/fit, summary, save/load, dispose.

    Besides `inputs`/`targets`/`loss`/`params`:
      caches       {name: Tensor} buffers the entrypoints write and read, kept between calls (a KV cache);
                   the Model's copies start zeroed, and a bundle does not store them.
      entrypoints  {name: (callable, inputs)} more evaluation entrypoints over the same parameters and
                   caches, run with `model.call(name, {...})`.
    An input declared as a Variable (inputs={"pos": Variable("pos", 0, 127)}) is an integer argument:
    the callable receives it bound, and each call passes its value (`model.call("decode", {"pos": 5, ...})`).
    Any dimension of an input may be a Variable; its value comes from the data's shape.
    """

    def __init__(self, obj: Any, inputs: Mapping[str, Any], targets: Mapping[str, Any] | None = None,
                 loss: Callable | None = None, params: Any = None, runtime: Any = None,
                 caches: Mapping[str, Any] | None = None, entrypoints: Mapping[str, Any] | None = None):
        runtime = runtime if runtime is not None else runtime_context.current()
        if runtime is not None:
            runtime.check_alive()
        prog, data, device = _capture(obj, inputs, targets or {}, loss, params, runtime, caches, entrypoints)
        self._setup(prog, data, runtime, device)

    # ---- building from a program (capture or bundle)
    def _setup(self, prog: Program, data: dict[int, Any], runtime: Any, device: str) -> None:
        self._p = prog
        self._runtime = runtime
        self.device = canonicalize(device)
        self._bufs: list[Buffer] | None = [Buffer(self.device, s.size, s.dtype) for s in prog.slots]
        for s, arr in data.items():
            if isinstance(arr, Buffer):
                realize.copy_buffer(self._bufs[s], arr)
            else:
                self._bufs[s].copyin(arr)
        for s, slot in enumerate(prog.slots):
            if slot.role == "cache":
                self._bufs[s].copyin(np.zeros(slot.size, dtype=slot.dtype.np))
        self._programs: dict[int, Any] = {}
        self._plans: dict[str, list] = {}
        self._refs: dict[int, list[tuple[list, int]]] = {}
        self._unwritten: set[int] | None = None  # outputs a call may leave partly unwritten (_unwritten_outputs)
        self._opt_pending: dict | None = None
        self._disposed = False

    @classmethod
    def _from_program(cls, prog: Program, data: dict[int, np.ndarray], runtime: Any, device: str) -> "Model":
        m = cls.__new__(cls)
        m._setup(prog, data, runtime, device)
        return m

    # ---- state checks
    def _alive(self) -> None:
        if self._disposed:
            raise ModelError("this Model was disposed; build it again or Model.load() the bundle")
        if self._runtime is not None:
            self._runtime.check_alive()

    @property
    def entrypoints(self) -> list[str]:
        return list(self._p.entries)

    @property
    def variables(self) -> dict[str, tuple[int, int]]:
        return dict(self._p.variables)

    # ---- execution
    def _program(self, k: int) -> Any:
        prog = self._programs.get(k)
        if prog is None:
            prog = self._programs[k] = realize.get_program(self._p.kernels[k], self.device)
        return prog

    def _plan(self, name: str) -> list:
        plan = self._plans.get(name)
        if plan is not None:
            return plan
        plan = []
        for call in self._p.entries[name].calls:
            if call.kernel < 0:
                plan.append((None, call.args, ()))
                continue
            prog = self._program(call.kernel)
            hs = [self._bufs[s].handle for s in call.args]
            for pos, s in enumerate(call.args):
                self._refs.setdefault(s, []).append((hs, pos))
            plan.append((prog, hs, tuple(v.arg[0] for v in prog.spec.vars)))
        self._plans[name] = plan
        return plan

    def _rebind(self, s: int, buf: Buffer) -> None:
        h = buf.handle
        for hs, pos in self._refs.get(s, ()):
            hs[pos] = h

    def _run(self, name: str, feeds: dict[int, Any], env: dict[str, int]) -> None:
        entry = self._p.entries[name]
        plan = self._plan(name)
        patched = []
        for s, value in feeds.items():
            if isinstance(value, Buffer) and value.size >= self._bufs[s].size:  # the caller's own buffer, bound
                self._rebind(s, value)
                patched.append(s)
            elif isinstance(value, Buffer):  # fewer rows than the slot: a kernel may read up to its capacity
                realize.copy_buffer(self._bufs[s], value)
            else:
                self._bufs[s].copyin_prefix(value)
        for s in entry.rng:
            self._bufs[s].copyin(np.array(self._p.rng, dtype=np.uint32))
            self._p.rng[1] = (self._p.rng[1] + 1) & 0xFFFFFFFF
        n = ops = mem = 0
        note_overwrite()  # its programs write into buffers that may hold values (engine/computed.py)
        t0 = time.perf_counter()
        try:
            for prog, hs, names in plan:
                if prog is None:
                    dst, src = (feeds[s] if s in patched else self._bufs[s] for s in hs)
                    realize.copy_buffer(dst, src)
                    continue
                prog.program(hs, tuple(env[v] for v in names), False)
                n, ops, mem = n + 1, ops + prog.spec.ops, mem + prog.spec.mem_bytes
        finally:
            for s in patched:
                self._rebind(s, self._bufs[s])
        realize.count_kernels(n, ops, mem, time.perf_counter() - t0)

    def _unwritten_outputs(self) -> set[int]:
        """Output slots that some entrypoint reads, or returns, without a proven full write before
        (uop/dataflow.py): their fresh buffers start zeroed. Temporaries and the rest start zeroed once,
        when first allocated, so a program only ever sees its own data."""
        if self._unwritten is None:
            from polygrad.modelformat import program_flow
            p = self._p
            flows = program_flow(p.slots, p.kernels, p.entries, p.variables)
            self._unwritten = {s for f in flows.values() for s in f.exposed if p.slots[s].role == "output"}
        return self._unwritten

    def _take(self, s: int, shape: tuple[int | str, ...], env: dict[str, int]) -> Any:
        """The output buffer of slot s as a Tensor the caller keeps; the slot gets a fresh buffer."""
        from polygrad.tensor import Tensor, _buffer_uop
        buf = self._bufs[s]
        fresh = Buffer(self.device, buf.size, buf.dtype).ensure_allocated(written=s not in self._unwritten_outputs())
        self._bufs[s] = fresh
        self._rebind(s, fresh)
        full = tuple(self._p.variables[d][1] if isinstance(d, str) else d for d in shape)
        now = tuple(env[d] if isinstance(d, str) else d for d in shape)
        if now == full:
            return Tensor(_buffer_uop(buf, full), _runtime=self._runtime)._as_leaf()
        # the buffer holds the Variables' maxima; this call's result is its first prod(now) elements, row-major
        t = Tensor(_buffer_uop(buf, (buf.size,)), _runtime=self._runtime)._as_leaf()
        return t.shrink(((0, int(np.prod(now, dtype=np.int64))),)).reshape(now)

    # ---- inputs
    def _entry_specs(self, entry: str) -> dict[str, Spec]:
        """{input name: Spec} of an entrypoint's tensor inputs (their buffers carry dtype and shape)."""
        return {k: Spec(k, self._p.slots[s].dtype, self._p.slots[s].shape)
                for k, s in self._p.entries[entry].inputs.items()}

    def _feeds(self, entry: str, given: Mapping[str, Any]) -> tuple[dict[int, Any], dict[str, int]]:
        e = self._p.entries[entry]
        specs = self._entry_specs(entry)
        names = list(specs) + list(e.args)
        unknown = sorted(set(given) - set(names))
        missing = [k for k in names if k not in given]
        if unknown or missing:
            raise ModelInputError(f"entrypoint {entry!r} takes {names}; " +
                                  (f"unknown {unknown}" if unknown else "") + ("; " if unknown and missing else "") +
                                  (f"missing {missing}" if missing else ""))
        env: dict[str, int] = {}
        for v in e.args:
            env[v] = self._argument(v, given[v])
        feeds: dict[int, Any] = {}
        for k, spec in specs.items():
            value, dims = self._convert(spec, given[k])
            for var, n in dims.items():
                if env.setdefault(var, n) != n:
                    raise ModelInputError(f"input {k!r} gives Variable {var!r} the value {n}, while another input "
                                          f"or argument gives it {env[var]}")
            feeds[e.inputs[k]] = value
        for v, (lo, hi) in self._p.variables.items():
            env.setdefault(v, hi)
        return feeds, env

    def _argument(self, name: str, value: Any) -> int:
        lo, hi = self._p.variables[name]
        if not isinstance(value, (int, np.integer)) or isinstance(value, (bool, np.bool_)):
            raise ModelInputError(f"argument {name!r} is a Variable and takes an int in {lo}..{hi}, "
                                  f"got {type(value).__name__}")
        if not lo <= int(value) <= hi:
            raise ModelInputError(f"argument {name!r} = {int(value)} is outside Variable {name!r} bounds {lo}..{hi}")
        return int(value)

    def _convert(self, spec: Spec, value: Any) -> tuple[Any, dict[str, int]]:
        """(a Buffer or a flat host array, {Variable: value} read off its shape) for one input."""
        from polygrad.tensor import Tensor, _np_cast
        sym = [k for k, d in enumerate(spec.shape) if isinstance(d, str)]
        want = "[" + ", ".join(str(d) for d in spec.shape) + "]"
        if isinstance(value, Tensor):
            if value.dtype != spec.dtype:
                raise ModelInputError(f"input {spec.name!r} is a {_dtname(value.dtype)} Tensor; "
                                      f"expected {_dtname(spec.dtype)}")
            if value.device != self.device:
                raise ModelInputError(f"input {spec.name!r} is on {value.device}, the model on {self.device}; "
                                      "use .to() first")
            dims = self._dims(spec, sint.concrete_shape(value.shape), want)
            self._check_labels(spec.name, value, "input")
            return value.contiguous()._buffer(), dims
        if isinstance(value, np.ndarray):
            arr = value
            if arr.dtype != spec.dtype.np and not np.can_cast(arr.dtype, spec.dtype.np, "same_kind") and \
                    spec.dtype is not dtypes.bfloat16:
                raise ModelInputError(f"input {spec.name!r} has dtype {arr.dtype}; expected {_dtname(spec.dtype)} "
                                      "(cast it with .astype)")
        else:
            try:
                arr = np.asarray(value, dtype=np.float32 if spec.dtype is dtypes.bfloat16 else spec.dtype.np)
            except (TypeError, ValueError) as e:
                raise ModelInputError(f"input {spec.name!r}: cannot read {type(value).__name__} as "
                                      f"{_dtname(spec.dtype)}: {e}") from None
        if arr.ndim <= 1 and len(spec.shape) != 1:  # flat data: the signature gives the shape
            fixed = int(np.prod([d for d in spec.shape if isinstance(d, int)], dtype=np.int64))
            if len(sym) > 1:
                raise ModelInputError(f"input {spec.name!r} has {len(sym)} Variable dimensions {want}; pass an array "
                                      "of that shape, not flat data")
            if sym:
                if fixed == 0 or arr.size % fixed:
                    raise ModelInputError(f"input {spec.name!r} has {arr.size} values; expected a multiple of "
                                          f"{fixed} for shape {want}")
                shape = tuple(arr.size // fixed if isinstance(d, str) else d for d in spec.shape)
                dims = self._dims(spec, shape, want)
            else:
                dims = {}
                if arr.size != fixed:
                    raise ModelInputError(f"input {spec.name!r} has {arr.size} values; expected {fixed} for "
                                          f"shape {want}")
        else:
            dims = self._dims(spec, arr.shape, want)
        flat = _np_cast(np.ascontiguousarray(arr).reshape(-1), spec.dtype)
        self._check_labels(spec.name, flat, "input")
        return flat, dims

    def _check_labels(self, name: str, values: Any, what: str) -> None:
        """ModelInputError for a class label the loss cannot take (eager cross_entropy's IndexError; the
        captured loss would turn it into a NaN). Checks host data: a Tensor only when its buffer is in host
        memory (no device read), as eager cross_entropy does."""
        from polygrad.tensor import Tensor
        from polygrad.tensor_indexing import host_values
        from polygrad.tensor_losses import bad_label
        rules = self._p.labels.get(name, [])
        host = host_values(values) if rules and isinstance(values, Tensor) else values
        for n_classes, ignore in rules if host is not None else []:
            label = bad_label(np.asarray(host), n_classes, ignore)
            if label is not None:
                raise ModelInputError(f"{what} {name!r} holds the class label {label}; the loss takes labels in "
                                      f"[0, {n_classes}) (or {ignore}, which skips a sample)")

    def _dims(self, spec: Spec, shape: tuple[int, ...], want: str) -> dict[str, int]:
        """{Variable: value} of a shape that matches the spec (fixed dims equal, Variables within bounds)."""
        if len(shape) != len(spec.shape) or any(a != b for a, b in zip(shape, spec.shape) if isinstance(b, int)):
            raise ModelInputError(f"input {spec.name!r} has shape {list(shape)}; expected {want}")
        dims: dict[str, int] = {}
        for n, d in zip(shape, spec.shape):
            if isinstance(d, str):
                lo, hi = self._p.variables[d]
                if not lo <= n <= hi:
                    raise ModelInputError(f"input {spec.name!r} has shape {list(shape)}; Variable {d!r} allows "
                                          f"{lo}..{hi}")
                if dims.setdefault(d, int(n)) != n:
                    raise ModelInputError(f"input {spec.name!r} has shape {list(shape)}: the dimensions named "
                                          f"{d!r} differ")
        return dims

    # ---- public calls
    def call(self, entrypoint: str, inputs: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Run one entrypoint; returns its outputs as Tensors that keep this call's values."""
        self._alive()
        if entrypoint not in self._p.entries:
            raise ModelError(f"no entrypoint {entrypoint!r}; this model has {self.entrypoints}")
        feeds, env = self._feeds(entrypoint, inputs or {})
        if entrypoint == "train_step" and self._opt_pending:
            raise ModelError("the optimizer graph is recorded on the first train_step(); call train_step() or fit()")
        self._run(entrypoint, feeds, env)
        return {k: self._take(s, self._p.slots[s].shape, env) for k, s in self._p.entries[entrypoint].outputs.items()}

    def forward(self, **inputs: Any) -> dict[str, Any]:
        """The evaluation forward: `model.forward(x=...)` -> {output name: Tensor}."""
        return self.call("forward", inputs)

    __call__ = forward

    def train_step(self, inputs: Mapping[str, Any], targets: Mapping[str, Any], optimizer: str | None = None,
                   lr: float | None = None, **hyper: Any) -> float:
        """One optimizer step on one batch; returns that step's loss (computed before the update)."""
        self._alive()
        self._need_training()
        self._configure(optimizer, lr, hyper)
        feeds, env = self._feeds("loss", {**inputs, **targets})
        return self._step(feeds, env)

    def _need_training(self) -> None:
        if "loss" not in self._p.entries:
            raise ModelError("this model has no training entrypoint: construct it with targets= and loss=")

    def _step(self, feeds: dict[int, Any], env: dict[str, int]) -> float:
        if self._opt_pending is not None:
            self._run("loss", feeds, env)
            value = float(self._bufs[self._p.entries["loss"].outputs["loss"]].numpy()[0])
            self._record_optimizer(self._opt_pending)
            return value
        self._run("train_step", feeds, env)
        return float(self._bufs[self._p.entries["train_step"].outputs["loss"]].numpy()[0])

    # ---- optimizer
    def _configure(self, name: str | None, lr: float | None, hyper: dict) -> None:
        from polygrad.nn.optim import check_hyperparameters
        current = self._p.optimizer
        if name is None and not hyper:
            if current is not None:
                if lr is not None:
                    check_hyperparameters({"lr": lr}, ModelError)
                if lr is not None and lr != current["lr"]:
                    self._set_lr(lr)
                return
            name = "sgd"
        cfg = _optimizer_config(name, lr, hyper)
        if current is not None and {k: v for k, v in cfg.items() if k != "lr"} == \
                {k: v for k, v in current.items() if k != "lr"}:
            if cfg["lr"] != current["lr"]:
                self._set_lr(cfg["lr"])
            return
        self._drop_optimizer()
        self._p.optimizer = cfg
        self._opt_pending = cfg

    def _set_lr(self, lr: float) -> None:
        self._p.optimizer["lr"] = float(lr)  # type: ignore[index]
        if self._opt_pending is not None:
            self._opt_pending["lr"] = float(lr)
        elif self._p.lr_slot is not None:
            self._bufs[self._p.lr_slot].copyin(np.array([lr], dtype=np.float32))

    def _drop_optimizer(self) -> None:
        for k in ("optimizer_step", "train_step"):
            self._p.entries.pop(k, None)
        keep = [s for s, slot in enumerate(self._p.slots) if slot.role != "optimizer"]
        used = {a for e in self._p.entries.values() for c in e.calls for a in c.args}
        used |= {s for e in self._p.entries.values() for s in (*e.inputs.values(), *e.outputs.values())}
        keep = [s for s in keep if s in used or self._p.slots[s].role in STORED]
        self._compact(keep)
        self._p.optimizer, self._p.lr_slot = None, None

    def _compact(self, keep: list[int]) -> None:
        """Keep only these slots (in order), renumbering every reference."""
        if len(keep) == len(self._p.slots):
            return
        new = {s: i for i, s in enumerate(keep)}
        self._p.slots = [self._p.slots[s] for s in keep]
        self._bufs = [self._bufs[s] for s in keep]
        for e in self._p.entries.values():
            e.inputs = {k: new[s] for k, s in e.inputs.items()}
            e.outputs = {k: new[s] for k, s in e.outputs.items()}
            e.calls = [Call(c.kernel, tuple(new[a] for a in c.args)) for c in e.calls]
            e.rng = [new[s] for s in e.rng]
        self._p.gradients = {new[p]: new[g] for p, g in self._p.gradients.items()}
        used = sorted({c.kernel for e in self._p.entries.values() for c in e.calls if c.kernel >= 0})
        knew = {k: i for i, k in enumerate(used)}
        self._p.kernels = [self._p.kernels[k] for k in used]
        for e in self._p.entries.values():
            e.calls = [Call(knew[c.kernel] if c.kernel >= 0 else -1, c.args) for c in e.calls]
        self._programs, self._plans, self._refs, self._unwritten = {}, {}, {}, None

    def _record_optimizer(self, cfg: dict) -> None:
        """The first step's update, run eagerly under capture: its launches become "optimizer_step"."""
        from polygrad.config import Context
        p = self._p
        slot_of = {id(b): s for s, b in enumerate(self._bufs)}
        with runtime_context.using(self._runtime):
            params = self._param_tensors(with_grads=True)
            opt = _make_optimizer(cfg, params)
            opt_bufs = _optimizer_buffers(opt, slot_of)
            start_serial = Buffer(self.device, 0, dtypes.float32).serial
            tb = _Table()
            tb.slots, tb.bufs = list(p.slots), list(self._bufs)
            tb.slot_of = dict(slot_of)
            for i, b in enumerate(opt_bufs):
                tb.add(f"optimizer.{i}", "optimizer", b.dtype, (b.size,), b.size, b)
            lr_slot = tb.slot_of[id(opt.lr._buffer())]
            with Context(TRAINING=1), capture() as cap:
                opt.step()
        kernels = {k: i for i, k in enumerate(p.kernels)}
        entry = _entry_of("optimizer_step", cap, tb, kernels, start_serial, p.variables)
        p.slots, self._bufs = tb.slots, [b for b in tb.bufs if b is not None]  # the optimizer's own buffers join
        assert len(self._bufs) == len(p.slots)
        p.kernels = list(kernels)
        p.lr_slot = lr_slot
        loss = p.entries["loss"]
        p.entries["optimizer_step"] = entry
        p.entries["train_step"] = Entry(dict(loss.inputs), dict(loss.outputs), loss.calls + entry.calls, list(loss.rng))
        self._opt_pending = None
        self._plans.clear()
        self._unwritten = None

    def _param_tensors(self, with_grads: bool) -> list[Any]:
        """Tensors over the parameter buffers (with .grad over the gradient buffers), in slot order."""
        from polygrad.tensor import Tensor, _buffer_uop
        out = []
        for s, slot in enumerate(self._p.slots):
            if slot.role != "parameter":
                continue
            t = Tensor(_buffer_uop(self._bufs[s], slot.shape), requires_grad=True, _runtime=self._runtime)._as_leaf()
            g = self._p.gradients.get(s)
            if with_grads and g is not None:
                t.grad = Tensor(_buffer_uop(self._bufs[g], slot.shape), _runtime=self._runtime)
            out.append(t)
        return out

    def _initial_optimizer_values(self) -> dict[int, np.ndarray]:
        """{optimizer slot: its value before any step} (what save(include_optimizer=False) stores): a fresh
        optimizer of the same configuration over the parameters lays out the same buffers in the same order."""
        with runtime_context.using(self._runtime):
            opt = _make_optimizer(self._p.optimizer, self._param_tensors(with_grads=False))
            fresh = _optimizer_buffers(opt, {id(b): s for s, b in enumerate(self._bufs)})
        slots = [s for s, slot in enumerate(self._p.slots) if slot.role == "optimizer"]
        if len(slots) != len(fresh):
            raise ModelError(f"internal: {len(fresh)} fresh optimizer buffers for {len(slots)} optimizer slots")
        return {s: b.numpy() for s, b in zip(slots, fresh)}

    # ---- fit
    def fit(self, data: Mapping[str, Any], epochs: int = 1, batch_size: int | None = None,
            remainder: str | None = None, optimizer: str | None = None, lr: float | None = None,
            verbose: bool | None = None, **hyper: Any) -> list[float]:
        """Train on `data` ({input/target name: array or Tensor}, samples on the leading axis).

        Samples are visited in order, `batch_size` at a time (default: all of them as one batch); an
        incomplete final batch is an error unless remainder="drop" (skip it) or "keep" (run the smaller
        batch, which every input's bounds must admit). Returns one loss per step, each computed before
        that step's update.
        """
        from polygrad.tensor import Tensor
        self._alive()
        self._need_training()
        if not isinstance(epochs, int) or isinstance(epochs, bool) or epochs < 0:
            raise ModelError(f"epochs must be a non-negative int, got {epochs!r}")
        if remainder not in (None, "drop", "keep"):
            raise ModelError(f"remainder must be None, 'drop' or 'keep', got {remainder!r}")
        if not isinstance(data, Mapping):
            raise ModelError("fit(data) takes a dict {name: array or Tensor} of every input and target")
        specs = {s.name: s for s in self._p.inputs + self._p.targets}
        inner = [k for k, s in specs.items() if any(isinstance(d, str) for d in s.shape[1:])]
        if inner:
            raise ModelError(f"fit() slices samples on the leading axis; inputs {inner} have a Variable in another "
                             "dimension. Call train_step() per batch instead")
        unknown, missing = sorted(set(data) - set(specs)), [k for k in specs if k not in data]
        if unknown or missing:
            raise ModelInputError(f"fit data needs {list(specs)}; " + (f"unknown {unknown} " if unknown else "") +
                                  (f"missing {missing}" if missing else ""))
        columns: dict[str, Any] = {}
        count = None
        for k, spec in specs.items():
            col = data[k]
            if not isinstance(col, Tensor):
                col = self._host_column(spec, col)
                rows = col.shape[0]
            else:
                if col.dtype != spec.dtype:
                    raise ModelInputError(f"fit data {k!r} is a {_dtname(col.dtype)} Tensor; "
                                          f"expected {_dtname(spec.dtype)}")
                rows = sint.concrete_shape(col.shape)[0] if col.ndim else 0
                if tuple(sint.concrete_shape(col.shape)[1:]) != tuple(spec.shape[1:]):
                    raise ModelInputError(f"fit data {k!r} has shape {list(sint.concrete_shape(col.shape))}; "
                                          f"expected [samples, {', '.join(str(d) for d in spec.shape[1:])}]")
            self._check_labels(k, col, "fit data")
            if count is None:
                count = rows
            elif rows != count:
                raise ModelInputError(f"fit data {k!r} has {rows} samples, others have {count}")
            columns[k] = col
        assert count is not None
        bs = count if batch_size is None else batch_size
        if not isinstance(bs, int) or isinstance(bs, bool) or bs < 1:
            raise ModelError(f"batch_size must be a positive int, got {batch_size!r}")
        self._admits(specs, bs, "batch_size")
        full, rest = divmod(count, bs)
        batches = [(i * bs, bs) for i in range(full)]
        if rest:
            if remainder is None:
                raise ModelInputError(f"{count} samples do not split into batches of {bs}: the last batch would "
                                      f"have {rest}. Pass remainder='drop' to skip it or remainder='keep' "
                                      "to run it smaller")
            if remainder == "keep":
                self._admits(specs, rest, "the final batch (remainder='keep')")
                batches.append((full * bs, rest))
        self._configure(optimizer, lr, hyper)
        leading = {s.shape[0] for s in specs.values() if s.shape and isinstance(s.shape[0], str)}
        bar = _progress(epochs * len(batches), verbose)
        losses: list[float] = []
        e = self._p.entries["loss"]
        try:
            for _ in range(epochs):
                for start, size in batches:
                    feeds: dict[int, Any] = {}
                    for k, col in columns.items():
                        part = col[start:start + size]
                        on_device = isinstance(col, Tensor)
                        feeds[e.inputs[k]] = part.contiguous()._buffer() if on_device else part.reshape(-1)
                    env = {v: size if v in leading else hi for v, (_, hi) in self._p.variables.items()}
                    losses.append(self._step(feeds, env))
                    if bar is not None:
                        bar.update(1)
                        bar.set_postfix(loss=f"{losses[-1]:.4g}", refresh=False)
        finally:
            if bar is not None:
                bar.close()
        return losses

    def _host_column(self, spec: Spec, col: Any) -> np.ndarray:
        from polygrad.tensor import _np_cast
        try:
            arr = np.asarray(col) if isinstance(col, np.ndarray) else \
                np.asarray(col, dtype=np.float32 if spec.dtype is dtypes.bfloat16 else spec.dtype.np)
        except (TypeError, ValueError) as e:
            raise ModelInputError(f"fit data {spec.name!r}: cannot read it as {_dtname(spec.dtype)}: {e}") from None
        if isinstance(col, np.ndarray) and arr.dtype != spec.dtype.np and \
                not np.can_cast(arr.dtype, spec.dtype.np, "same_kind"):
            raise ModelInputError(f"fit data {spec.name!r} has dtype {arr.dtype}; expected {_dtname(spec.dtype)}")
        trailing = tuple(spec.shape[1:])
        per = int(np.prod(trailing, dtype=np.int64))
        if arr.ndim == 1 and trailing and per and arr.size % per == 0:
            arr = arr.reshape(-1, *trailing)  # flat samples: the signature gives the trailing shape
        if arr.ndim == 0 or tuple(arr.shape[1:]) != trailing:
            raise ModelInputError(f"fit data {spec.name!r} has shape {list(arr.shape)}; expected [samples"
                                  + "".join(f", {d}" for d in trailing) + "]")
        return _np_cast(np.ascontiguousarray(arr), spec.dtype).reshape(arr.shape)

    def _admits(self, specs: Mapping[str, Spec], n: int, what: str) -> None:
        for spec in specs.values():
            if not spec.shape:
                raise ModelInputError(f"input {spec.name!r} is a scalar; fit() needs a leading sample axis")
            d = spec.shape[0]
            if isinstance(d, str):
                lo, hi = self._p.variables[d]
                if not lo <= n <= hi:
                    raise ModelInputError(f"{what} {n} is outside Variable {d!r} bounds {lo}..{hi} "
                                          f"of input {spec.name!r}")
            elif d != n:
                raise ModelInputError(f"{what} {n} does not fit input {spec.name!r}, whose leading dimension is "
                                      f"fixed at {d}; use batch_size={d} or declare "
                                      f"Tensor.empty(Variable('batch', 1, {max(d, n)}), ...)")

    # ---- metadata
    def summary(self) -> ModelSummary:
        """Inputs, outputs, entrypoints, parameters and bytes; executes nothing and reads no weights."""
        self._alive()

        def rows(specs: list[Spec]) -> list[dict]:
            return [{"name": s.name, "dtype": _dtname(s.dtype), "shape": s.shape} for s in specs]

        def tensors(role: str) -> list[dict]:
            return [{"name": s.name, "dtype": _dtname(s.dtype), "shape": s.shape, "count": s.size}
                    for s in self._p.slots if s.role == role]
        nbytes = {r: 0 for r in ROLES}
        for s in self._p.slots:
            nbytes[s.role] += s.size * s.dtype.itemsize
        params = tensors("parameter")
        return ModelSummary(rows(self._p.inputs), rows(self._p.targets), rows(self._p.outputs), self.entrypoints,
                            params, tensors("state"), sum(p["count"] for p in params), nbytes, self.device,
                            dict(self._p.optimizer) if self._p.optimizer else None)

    def parameters(self) -> dict[str, Any]:
        """{name: Tensor} views of the parameters and state (they change as the model trains)."""
        from polygrad.tensor import Tensor, _buffer_uop
        self._alive()
        return {s.name: Tensor(_buffer_uop(self._bufs[k], s.shape), _runtime=self._runtime)
                for k, s in enumerate(self._p.slots) if s.role in ("parameter", "state")}

    # ---- save / load
    def save(self, path: str | os.PathLike | None = None, include_optimizer: bool = True) -> bytes | None:
        """Write the bundle to `path`, or return its bytes when no path is given.

        include_optimizer=False stores the optimizer's initial state instead of its current one (the
        training entrypoints stay); reapply an optimizer configuration after loading to resume.
        """
        self._alive()
        from polygrad import __version__
        from polygrad.modelformat import to_manifest
        manifest, blobs = to_manifest(self, include_optimizer, __version__)
        data = bundle.write(manifest, blobs)
        if path is None:
            return data
        write_file(path, data)  # next to the target, then renamed: no half-written bundle (atomicfile.py)
        return None

    @classmethod
    def load(cls, source: str | os.PathLike | bytes | bytearray | memoryview, runtime: Any = None,
             device: str | None = None, *, max_bytes: int | None = None, max_work: int | None = None) -> "Model":
        """A Model from a bundle path or its bytes, on `runtime` (default: the default runtime) or `device`.

        A bundle may ask for at most `max_bytes` of buffers and `max_work` node evaluations per entrypoint
        call; by default max(256 MiB, 16 x the file's size) and max(2**36, 2**16 x the file's size)
        (polygrad/limits.py, the same in polygrad-js). Raise them for a file you trust that needs more.
        """
        from polygrad.modelformat import from_manifest
        if isinstance(source, (bytes, bytearray, memoryview)):
            data = source
        elif isinstance(source, (str, os.PathLike)):
            try:
                with open(source, "rb") as f:
                    data = f.read()
            except OSError as e:
                raise BundleError(f"cannot read bundle {os.fspath(source)!r}: {e.strerror}") from None
        else:
            raise TypeError(f"Model.load takes a path or bytes, got {type(source).__name__}")
        runtime = runtime if runtime is not None else runtime_context.current()
        if runtime is not None:
            runtime.check_alive()
        dev = canonicalize(device if device is not None else (runtime.device if runtime is not None else None))
        manifest, body = bundle.read(data)
        size = len(memoryview(data).cast("B"))
        max_bytes = limits.default_max_bytes(size) if max_bytes is None else _cap(max_bytes, "max_bytes")
        max_work = limits.default_max_work(size) if max_work is None else _cap(max_work, "max_work")
        prog, stored = from_manifest(manifest, body, max_bytes, max_work)
        return cls._from_program(prog, stored, runtime, dev)

    # ---- lifetime
    def dispose(self) -> None:
        """Free the model's buffers and programs; later calls raise. Idempotent; returned Tensors stay valid."""
        if self._disposed:
            return
        self._disposed = True
        self._bufs = None
        self._plans, self._refs, self._programs = {}, {}, {}

    def __enter__(self) -> "Model":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.dispose()

    def __repr__(self) -> str:
        state = " disposed" if self._disposed else ""
        ins = ", ".join(f"{s.name}{list(s.shape)}" for s in self._p.inputs)
        return f"<Model ({ins}) -> ({', '.join(s.name for s in self._p.outputs)}) on {self.device}{state}>"


def _cap(value: Any, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ModelError(f"Model.load({name}=...) takes a non-negative int, got {value!r:.40}")
    return value


def _optimizer_buffers(opt: Any, known: Mapping[int, int]) -> list[Buffer]:
    """The optimizer's own state buffers (not the parameters'), in attribute order."""
    from polygrad.nn.state import get_state_dict
    out: list[Buffer] = []
    for t in get_state_dict(opt).values():
        b = t._buffer()
        if id(b) not in known and all(b is not o for o in out):
            out.append(b)
    return out


def _optimizer_config(name: Any, lr: float | None, hyper: dict) -> dict:
    from polygrad.nn import optim
    if not isinstance(name, str) or name.lower() not in OPTIMIZERS:
        raise ModelError(f"optimizer must be one of {list(OPTIMIZERS)}, got {name!r}")
    name = name.lower()
    allowed = optimizer_table.DEFAULTS[name]
    bad = sorted(set(hyper) - set(allowed))
    if bad:
        raise ModelError(f"optimizer {name!r} takes {sorted(allowed)}; unknown {bad}")
    cfg: dict[str, Any] = {"name": name}
    for k, default in allowed.items():
        cfg[k] = lr if k == "lr" and lr is not None else hyper.get(k, default)
    optim.check_hyperparameters(cfg, ModelError)
    for k, v in cfg.items():  # plain JSON values for the bundle (a NumPy float, a tuple of betas)
        if isinstance(v, (tuple, list)):
            cfg[k] = [float(b) for b in v]
        elif isinstance(v, (bool, np.bool_)):
            cfg[k] = bool(v)
        elif k != "name":
            cfg[k] = float(v)
    return cfg


def _make_optimizer(cfg: dict, params: list) -> Any:
    from polygrad.nn import optim
    cls = {"sgd": optim.SGD, "adam": optim.Adam, "adamw": optim.AdamW, "lamb": optim.LAMB}[cfg["name"]]
    kw = {k: (tuple(v) if isinstance(v, list) else v) for k, v in cfg.items() if k != "name"}
    return cls(params, **kw)


def _progress(total: int, verbose: bool | None) -> Any:
    if verbose is False or (verbose is None and not (sys.stderr.isatty() and total > 1)):
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, unit="step", leave=False)
