"""A Model's optimizer: its configuration, and its update recorded into the Program as kernels.

Stage: training setup (polygrad-js: optim.js). Input: an optimizer name, lr and hyperparameters; a
Program with a "loss" entrypoint and the buffers of its slots (executor.py). Output: a checked configuration
(`optimizer_config`: the defaults of nn/optim.py filled in, values checked by
`nn.optim.check_hyperparameters`, plain JSON values for the bundle); the Program extended by
`record_optimizer` with the optimizer's state slots (role "optimizer", in nn/optim.py's order), an
"optimizer_step" entrypoint captured from one real eager step and "train_step" = "loss" +
"optimizer_step"; or the Program without them again (`drop_optimizer`).
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from polygrad import runtime_context
from polygrad.config import Context
from polygrad.device import Buffer
from polygrad.definitions import optimizer as optimizer_table
from polygrad.dtype import dtypes
from polygrad.engine.capture import capture
from polygrad.model.errors import ModelError
from polygrad.model.program import STORED, Entry, Program, compact
from polygrad.model.table import SlotTable, entry_of
from polygrad.nn import optim
from polygrad.nn.state import get_state_dict
from polygrad.tensor import Tensor, _buffer_uop

OPTIMIZERS = optimizer_table.NAMES
CLASSES = {"sgd": optim.SGD, "adam": optim.Adam, "adamw": optim.AdamW, "lamb": optim.LAMB}


def optimizer_config(name: Any, lr: float | None, hyper: dict) -> dict:
    """{"name": ..., every hyperparameter} of an optimizer, defaults filled in; ModelError if it cannot run."""
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


def make_optimizer(cfg: dict, params: list) -> Any:
    """The eager nn.optim optimizer of a configuration over these parameter Tensors."""
    kw = {k: (tuple(v) if isinstance(v, list) else v) for k, v in cfg.items() if k != "name"}
    return CLASSES[cfg["name"]](params, **kw)


def optimizer_buffers(opt: Any, known: Mapping[int, int]) -> list[Buffer]:
    """The optimizer's own state buffers (not the parameters'), in attribute order."""
    out: list[Buffer] = []
    for t in get_state_dict(opt).values():
        b = t._buffer()
        if id(b) not in known and all(b is not o for o in out):
            out.append(b)
    return out


def param_tensors(p: Program, bufs: list[Buffer], runtime: Any, with_grads: bool) -> list[Any]:
    """Tensors over the parameter buffers (with .grad over the gradient buffers), in slot order."""
    out = []
    for s, slot in enumerate(p.slots):
        if slot.role != "parameter":
            continue
        t = Tensor(_buffer_uop(bufs[s], slot.shape), requires_grad=True, _runtime=runtime)._as_leaf()
        g = p.gradients.get(s)
        if with_grads and g is not None:
            t.grad = Tensor(_buffer_uop(bufs[g], slot.shape), _runtime=runtime)
        out.append(t)
    return out


def record_optimizer(p: Program, bufs: list[Buffer], device: str, runtime: Any, cfg: dict,
                     grad_scale: float | None = None) -> list[Buffer]:
    """The first step's update, run eagerly under capture: its launches become "optimizer_step". Returns
    the buffers of the extended slot table (the optimizer's own state buffers join `bufs`).

    With `grad_scale` (Model.fit(distributed=True): the gradient slots hold sums over N ranks, this is 1/N)
    the update reads every gradient times a one-element optimizer slot holding it (`p.grad_scale_slot`,
    bundle field training.grad_scale_buffer): the 1/N rides in the update's kernels, which read the
    gradients anyway, instead of a pass of its own. The slot holds 1.0 outside distributed fits."""
    slot_of = {id(b): s for s, b in enumerate(bufs)}
    with runtime_context.using(runtime):
        params = param_tensors(p, bufs, runtime, with_grads=True)
        scale_buf = None
        if grad_scale is not None:
            scale_buf = Buffer(device, 1, dtypes.float32).copyin(np.array([grad_scale], dtype=np.float32))
            scale = Tensor(_buffer_uop(scale_buf, (1,)), _runtime=runtime).reshape(())
            for t in params:
                if t.grad is not None:
                    t.grad = t.grad * scale
        opt = make_optimizer(cfg, params)
        opt_bufs = optimizer_buffers(opt, slot_of)
        start_serial = Buffer(device, 0, dtypes.float32).serial
        tb = SlotTable()
        tb.slots, tb.bufs = list(p.slots), list(bufs)
        tb.slot_of = dict(slot_of)
        for i, b in enumerate(opt_bufs):
            tb.add(f"optimizer.{i}", "optimizer", b.dtype, (b.size,), b.size, b)
        if scale_buf is not None:
            tb.add("optimizer.grad_scale", "optimizer", dtypes.float32, (1,), 1, scale_buf)
        lr_slot = tb.slot_of[id(opt.lr._buffer())]
        with Context(TRAINING=1), capture() as cap:
            opt.step()
    kernels = {k: i for i, k in enumerate(p.kernels)}
    entry = entry_of("optimizer_step", cap, tb, kernels, start_serial, p.variables)
    p.slots, new_bufs = tb.slots, [b for b in tb.bufs if b is not None]
    assert len(new_bufs) == len(p.slots)
    p.kernels = list(kernels)
    p.lr_slot = lr_slot
    p.grad_scale_slot = tb.slot_of[id(scale_buf)] if scale_buf is not None else None
    loss = p.entries["loss"]
    p.entries["optimizer_step"] = entry
    p.entries["train_step"] = Entry(dict(loss.inputs), dict(loss.outputs), loss.calls + entry.calls, list(loss.rng))
    return new_bufs


def drop_optimizer(p: Program) -> list[int] | None:
    """The Program without its optimizer: no training step entrypoints and no optimizer slots. Returns the
    old numbers of the slots kept when some were dropped (the caller's buffers follow), else None."""
    for k in ("optimizer_step", "train_step"):
        p.entries.pop(k, None)
    keep = [s for s, slot in enumerate(p.slots) if slot.role != "optimizer"]
    used = {a for e in p.entries.values() for c in e.calls for a in c.args}
    used |= {s for e in p.entries.values() for s in (*e.inputs.values(), *e.outputs.values())}
    keep = [s for s in keep if s in used or p.slots[s].role in STORED]
    p.optimizer, p.lr_slot, p.grad_scale_slot = None, None, None
    if len(keep) == len(p.slots):
        return None
    compact(p, keep)
    return keep


def initial_optimizer_values(p: Program, bufs: list[Buffer], runtime: Any) -> dict[int, np.ndarray]:
    """{optimizer slot: its value before any step} (what save(include_optimizer=False) stores): a fresh
    optimizer of the same configuration over the parameters lays out the same buffers in the same order."""
    with runtime_context.using(runtime):
        opt = make_optimizer(p.optimizer, param_tensors(p, bufs, runtime, with_grads=False))
        fresh = optimizer_buffers(opt, {id(b): s for s, b in enumerate(bufs)})
    slots = [s for s, slot in enumerate(p.slots) if slot.role == "optimizer" and s != p.grad_scale_slot]
    if len(slots) != len(fresh):
        raise ModelError(f"internal: {len(fresh)} fresh optimizer buffers for {len(slots)} optimizer slots")
    initial = {s: b.numpy() for s, b in zip(slots, fresh)}
    if p.grad_scale_slot is not None:
        initial[p.grad_scale_slot] = np.ones(1, np.float32)
    return initial
