"""Capture: a Python callable, run under engine/capture.py, becomes a Program.

Stage: capture. Input: the callable (an object with Tensor attributes, or a function with explicit
`params=`), declared inputs/targets (signature.py), a loss, caches and extra entrypoints. Output:
(Program, {slot: initial contents}, device): the recorded launches of "forward", of each extra
entrypoint and, with a loss, of "loss" (forward + backward), over one slot table (table.py).

The callable runs with zero-filled placeholders, once for evaluation (TRAINING off when there is a
loss) and once for training (TRAINING on, loss and backward realized); a Variable is bound to its
smallest positive value so those runs are cheap (the recorded kernels serve every value alike). The
authoring tensors, their gradients, the TRAINING setting and the global RNG are restored whatever
happens. Capture is per thread: what other threads compute meanwhile is neither recorded nor guarded,
and their RNG draws and settings do not reach the model (engine/capture.py, random.scoped,
config.Context). A host read or an assignment to a parameter or input inside the callable is a
`ModelCaptureError` (`CaptureGuard`, through tensor_common.guarded).
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, Mapping

import numpy as np

from polygrad import config, random, runtime_context
from polygrad.config import Context
from polygrad.device import Buffer
from polygrad.dtype import dtypes
from polygrad.engine import realize
from polygrad.engine.capture import capture
from polygrad.model.errors import ModelCaptureError, ModelError
from polygrad.model.program import Entry, Program, Spec
from polygrad.model.signature import caches_of, extra_entrypoints, out_shape, params_of, spec_of, split_inputs
from polygrad.model.table import SlotTable, entry_of
from polygrad.schedule.normalize import capacity_buffers
from polygrad.tensor import Tensor, _buffer_uop
from polygrad.tensor_common import guarded
from polygrad.uop import sint
from polygrad.uop.movement import strip_reshapes
from polygrad.uop.ops import Ops, UOp


class CaptureGuard:
    """Guards this thread's host reads and assignments while the user's callable runs (tensor_common.guarded)."""

    def __init__(self, protected: dict[int, str]):
        self.protected = protected  # id(Buffer) -> "parameter 'w'" / "input 'x'"
        self.labels: dict[int, set[tuple[int, int]]] = {}  # id(Buffer) -> {(classes, ignore_index)}

    def class_labels(self, t: Any, n_classes: int, ignore_index: int) -> None:
        """A loss reads `t` as class labels (tensor_losses.py); remember it when `t` is an input."""
        u = strip_reshapes(t.uop)
        if u.op is Ops.BUFFER:
            self.labels.setdefault(id(u.arg), set()).add((n_classes, ignore_index))

    def read(self, t: Any, call: str) -> None:
        raise ModelCaptureError(f"Tensor.{call}() was called during Model capture; a captured graph cannot read "
                                "data back to Python or write host data into a tensor. Keep the computation in "
                                f"Tensor ops and return tensors instead of calling .{call}()")

    def assign(self, t: Any) -> None:
        u = strip_reshapes(t.uop)
        what = self.protected.get(id(u.arg)) if u.op is Ops.BUFFER else None
        if what is not None:
            raise ModelCaptureError(f"Tensor.assign() to {what} during Model capture; a Model owns its parameters "
                                    "and inputs and only the optimizer updates them. Compute a new tensor instead")


def capture_value(lo: int, hi: int) -> int:
    """The value a Variable is bound to while capturing: the smallest positive one its bounds allow, so the
    capture run is cheap (the recorded kernels are value-free and serve every value alike)."""
    return min(hi, max(lo, 1))


def outputs_dict(result: Any) -> dict[str, Any]:
    """{output name: Tensor} of what the callable returned (a Tensor is named "output")."""
    if isinstance(result, Tensor):
        return {"output": result}
    if isinstance(result, Mapping) and result and all(isinstance(v, Tensor) for v in result.values()):
        for k in result:
            if not isinstance(k, str) or not k.isidentifier():
                raise ModelError(f"output names must be identifiers, got {k!r}")
        return dict(result)
    raise ModelError("the model callable must return a Tensor or a non-empty dict of name -> Tensor, got "
                     f"{type(result).__name__}")


def call_loss(loss: Callable, outputs: dict, targets: dict) -> Any:
    """loss(outputs, **targets) when its parameters name the targets, else loss(outputs, *targets)."""
    try:
        sig = inspect.signature(loss)
        names = [p.name for p in sig.parameters.values()][1:]
        by_name = set(targets) <= set(names) or any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
    except (TypeError, ValueError):
        by_name = False
    return loss(outputs, **targets) if by_name else loss(outputs, *targets.values())


def capture_program(obj: Any, inputs: Mapping, targets: Mapping, loss: Callable | None, params: Any, runtime: Any,
                    caches: Mapping | None = None,
                    entrypoints: Mapping | None = None) -> tuple[Program, dict[int, Any], str]:
    """(Program, {slot: initial contents (host array or Buffer)}, device) of a callable: see the module
    docstring. The arguments are Model's."""
    if not callable(obj):
        raise ModelError(f"Model needs a callable (an object with __call__ or a function), got {type(obj).__name__}")
    if not isinstance(inputs, Mapping) or not inputs:
        raise ModelError("Model needs inputs={name: Tensor.empty(shape)} declaring at least one input")
    if targets and loss is None:
        raise ModelError("targets= were given without loss=; pass loss=lambda outputs, **targets: ...")
    if loss is not None and not callable(loss):
        raise ModelError(f"loss must be callable as loss(outputs, **targets), got {type(loss).__name__}")
    variables: dict[str, tuple[int, int]] = {}
    in_specs, in_args = split_inputs(inputs, "inputs", variables)
    tgt_specs = [spec_of(k, t, "targets", variables) for k, t in (targets or {}).items()]
    if {s.name for s in in_specs} & {s.name for s in tgt_specs}:
        raise ModelError("an input and a target share a name; names must be distinct")
    if loss is not None and in_args:
        raise ModelError(f"Variable arguments {in_args} cannot feed a model with a loss; declare them on an extra "
                         "evaluation entrypoint (entrypoints=)")
    extra = extra_entrypoints(entrypoints, variables)
    decls = [inputs, targets or {}] + [d for _, d, _, _ in extra.values()]
    devices = {t.device for d in decls for t in d.values() if isinstance(t, Tensor)}
    named = params_of(obj, params)
    cache_named = caches_of(caches)
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
    # every weight at once); a read-only buffer (adopted memory: a mapped weight file) cannot change, and
    # the Model shares it instead of copying it (Executor)
    values = {bid: b.numpy() for bid, (_, _, b) in owned.items() if bid not in trainable and not b.readonly}
    rng_before = random.get_state()
    training_before = config.get("TRAINING")

    def placeholder(spec: Spec) -> Any:
        shape = []
        for d in spec.shape:
            if isinstance(d, str):
                lo, hi = variables[d]
                shape.append(sint.Variable(d, lo, hi).bind(capture_value(lo, hi)))
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
        return {v: sint.Variable(v, *variables[v]).bind(capture_value(*variables[v])) for v in names}

    ph = {s.name: placeholder(s) for s in in_specs}
    th = {s.name: placeholder(s) for s in tgt_specs}
    eh = {e: {s.name: placeholder(s) for s in specs} for e, (_, _, specs, _) in extra.items()}
    protected = {id(b): f"input {k!r}" for k, (_, b) in {**ph, **th}.items()}
    protected.update({id(b): f"input {k!r} of entrypoint {e!r}" for e, h in eh.items() for k, (_, b) in h.items()})
    protected.update({bid: f"parameter {unique[bid][0]!r}" for bid in trainable})
    guard = CaptureGuard(protected)
    start_serial = Buffer(device, 0, dtypes.float32).serial
    graphs: dict[str, Any] = {}
    outs_of: dict[str, dict[str, Buffer]] = {}
    shapes_of: dict[str, dict[str, tuple]] = {}
    grad_bufs: dict[int, Buffer] = {}

    def capture_eval(ename: str, fn: Callable, holders: dict, args: list[str]) -> None:
        out_bufs, out_shapes = {}, {}
        with capture() as cap:
            outs = outputs_dict(fn(**{k: t for k, (t, _) in holders.items()}, **bound_args(args)))
            for k, t in outs.items():
                out_shapes[k] = t.shape
                # an output the graph already makes contiguous (a quantized matvec's kernel of its own: the
                # logits) is that kernel's buffer; CONTIGUOUS again copied it (a launch a decode step)
                out_bufs[k] = (t if t.uop.op is Ops.CONTIGUOUS else t.contiguous())._buffer()
        for k, b in out_bufs.items():
            if not cap.created(b):
                raise ModelCaptureError(f"output {k!r} is an input or parameter itself; return a computed "
                                        "tensor (for example x * 1) so the Model can hand out a copy")
        graphs[ename] = (cap, list(out_bufs.values()))
        outs_of[ename], shapes_of[ename] = out_bufs, out_shapes

    try:
        # the capture runs draw from this thread's copy of the RNG state (dropped afterwards), under this
        # thread's guard: other threads neither see these settings nor get recorded
        # deferred: the capture run's results are discarded, so its kernels are only recorded; each
        # entrypoint compiles its own on its first call (a first prompt waits for the prompt's alone)
        with guarded(guard), random.scoped(), runtime_context.using(runtime), realize.deferred():
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
                        touts = outputs_dict(obj(**{k: t for k, (t, _) in ph.items()}))
                        lv = call_loss(loss, touts, {k: t for k, (t, _) in th.items()})
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
            if bid in values:
                b.copyin(values[bid])  # the placeholder run's state and cache writes are not the model's

    # ---- the slot table
    tb = SlotTable()
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
            shape = out_shape(k, shapes_of[ename][k], variables)
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
        entries[ename] = entry_of(ename, cap, tb, kernels, start_serial, variables)
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

