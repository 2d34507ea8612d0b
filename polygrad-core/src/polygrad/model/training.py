"""Training a Model: train_step() and fit(), the optimizer configured and its graph recorded on first use.

Stage: user API over the executor (polygrad-js: Model.trainStep/fit in model.js). Input: batches
(train_step) or a dataset with samples on the leading axis (fit), an optimizer name, lr and
hyperparameters; for fit(distributed=True) the ranks of an MPI job (polygrad.distributed). Output: one
loss per step, each computed before that step's update; the Program's optimizer configuration, its
state slots and the "optimizer_step"/"train_step" entrypoints (optim.py).
`TrainingMixin` holds the methods; Model (core.py) inherits them and provides `_p` (the Program), `_x`
(the Executor), `_runtime`, `device` and `_alive()`.

The optimizer graph is recorded on the first training step (that step is a real update, run eagerly
under capture), so construction never runs an optimizer. fit() visits samples in order, `batch_size`
at a time, slicing host arrays on the host and Tensor datasets on the device.

fit(distributed=True) runs each step as the two captured pieces the Program already has, "loss" (loss and
gradients) and "optimizer_step", with one bucketed allreduce of the gradients and the loss between them:
a captured entrypoint is a list of kernel launches, with no place for an MPI call inside it.
"""
from __future__ import annotations

import sys
from typing import Any, Callable, Mapping

import numpy as np

from polygrad.distributed import Averager, broadcast_buffers, world
from polygrad.model.data import check_labels, feeds, host_column
from polygrad.model.errors import ModelError, ModelInputError
from polygrad.model.executor import Executor
from polygrad.model.optim import drop_optimizer, optimizer_config, record_optimizer
from polygrad.model.program import Program, Spec, dtype_name
from polygrad.nn.optim import check_hyperparameters
from polygrad.tensor import Tensor
from polygrad.uop import sint


class TrainingMixin:
    """train_step, fit and the optimizer's configuration, over a Model's Program and Executor."""

    _p: Program
    _x: Executor
    _runtime: Any
    _opt_pending: dict | None  # a configuration whose graph the next step records
    _distributed: bool  # trained by fit(distributed=True) in a world of several ranks: rank 0 alone saves
    device: str
    _alive: Callable[[], None]  # ModelError once disposed

    def train_step(self, inputs: Mapping[str, Any], targets: Mapping[str, Any], optimizer: str | None = None,
                   lr: float | None = None, **hyper: Any) -> float:
        """One optimizer step on one batch; returns that step's loss (computed before the update)."""
        self._alive()
        self._need_training()
        self._configure(optimizer, lr, hyper)
        fed, env = feeds(self._p, "loss", {**inputs, **targets}, self.device)
        return self._step(fed, env)

    def _need_training(self) -> None:
        if "loss" not in self._p.entries:
            raise ModelError("this model has no training entrypoint: construct it with targets= and loss=")

    def _step(self, fed: dict[int, Any], env: dict[str, int], averager: Any = None) -> float:
        if averager is not None:
            return self._averaged_step(fed, env, averager)
        if self._opt_pending is not None:
            self._x.run("loss", fed, env)
            value = float(self._x.bufs[self._p.entries["loss"].outputs["loss"]].numpy()[0])
            self._x.bufs = record_optimizer(self._p, self._x.bufs, self.device, self._runtime, self._opt_pending)
            self._opt_pending = None
            self._x.replan()
            return value
        self._x.run("train_step", fed, env)
        return float(self._x.bufs[self._p.entries["train_step"].outputs["loss"]].numpy()[0])

    def _averaged_step(self, fed: dict[int, Any], env: dict[str, int], averager: Any) -> float:
        """One data-parallel step: "loss" (this rank's loss and gradients), their sums or means over the ranks
        in one bucketed allreduce, then "optimizer_step" (recorded on the first step, as in _step).

        An update recorded here reads the gradients times its grad-scale slot (model/optim.record_optimizer),
        which holds 1/N while a distributed fit runs: the gradients stay sums, with no pass over them to
        divide. One recorded without that slot (a train_step came first) gets the means."""
        ranks = averager.world.size
        self._x.run("loss", fed, env)
        loss_slot = self._p.entries["loss"].outputs["loss"]
        shared = [self._p.gradients[s] for s in sorted(self._p.gradients)] + [loss_slot]
        sums = ranks > 1 and (self._opt_pending is not None or self._p.grad_scale_slot is not None)
        averager.average([self._x.bufs[s] for s in shared], what="Model.fit (gradient averaging)", sums=sums)
        value = float(self._x.bufs[loss_slot].numpy()[0]) / (ranks if sums else 1)
        if self._opt_pending is not None:
            self._x.bufs = record_optimizer(self._p, self._x.bufs, self.device, self._runtime, self._opt_pending,
                                            grad_scale=1.0 / ranks if sums else None)
            self._opt_pending = None
            self._x.replan()
        else:
            self._x.run("optimizer_step", {}, env)
        return value

    def _set_grad_scale(self, value: float) -> None:
        if self._p.grad_scale_slot is not None:
            self._x.bufs[self._p.grad_scale_slot].copyin(np.array([value], dtype=np.float32))

    def _start_distributed(self, count: int, batch: int, epochs: int) -> Any:
        """Check that every rank fits the same data the same way, give every rank rank 0's parameters, state
        and optimizer state; returns the gradient averager (distributed/buckets.py)."""
        w = world()
        w.check_same("Model.fit(distributed=True)", f"{count} samples, batch_size {batch}, {epochs} epochs, "
                     f"{len(self._p.slots)} slots, optimizer {self._p.optimizer}")
        kept = [b for b, slot in zip(self._x.bufs, self._p.slots) if slot.role in ("parameter", "state", "optimizer")]
        broadcast_buffers(w, kept, 0, "Model.fit(distributed=True): broadcast of the parameters and state")
        self._distributed = w.size > 1
        return Averager(w)

    # ---- optimizer
    def _configure(self, name: str | None, lr: float | None, hyper: dict) -> None:
        current = self._p.optimizer
        if name is None and not hyper:
            if current is not None:
                if lr is not None:
                    check_hyperparameters({"lr": lr}, ModelError)
                if lr is not None and lr != current["lr"]:
                    self._set_lr(lr)
                return
            name = "sgd"
        cfg = optimizer_config(name, lr, hyper)
        if current is not None and {k: v for k, v in cfg.items() if k != "lr"} == \
                {k: v for k, v in current.items() if k != "lr"}:
            if cfg["lr"] != current["lr"]:
                self._set_lr(cfg["lr"])
            return
        keep = drop_optimizer(self._p)
        if keep is not None:
            self._x.bufs = [self._x.bufs[s] for s in keep]
            self._x.reset()
        self._p.optimizer = cfg
        self._opt_pending = cfg

    def _set_lr(self, lr: float) -> None:
        self._p.optimizer["lr"] = float(lr)  # type: ignore[index]
        if self._opt_pending is not None:
            self._opt_pending["lr"] = float(lr)
        elif self._p.lr_slot is not None:
            self._x.bufs[self._p.lr_slot].copyin(np.array([lr], dtype=np.float32))

    # ---- fit
    def fit(self, data: Mapping[str, Any], epochs: int = 1, batch_size: int | None = None,
            remainder: str | None = None, optimizer: str | None = None, lr: float | None = None,
            verbose: bool | None = None, distributed: bool = False, **hyper: Any) -> list[float]:
        """Train on `data` ({input/target name: array or Tensor}, samples on the leading axis).

        Samples are visited in order, `batch_size` at a time (default: all of them as one batch); an
        incomplete final batch is an error unless remainder="drop" (skip it) or "keep" (run the smaller
        batch, which every input's bounds must admit). Returns one loss per step, each computed before
        that step's update.

        distributed=True (every rank of an MPI job calls fit with the same data): parameters and
        optimizer state start as rank 0's; `batch_size` is the global batch, each rank running the r-th
        contiguous slice of batch_size / world_size samples of it; gradients and losses are averaged
        across the ranks, so every rank takes the steps one process would with the same arguments and
        returns the same global mean losses (docs/distributed.md).
        """
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
                col = host_column(spec, col)
                rows = col.shape[0]
            else:
                if col.dtype != spec.dtype:
                    raise ModelInputError(f"fit data {k!r} is a {dtype_name(col.dtype)} Tensor; "
                                          f"expected {dtype_name(spec.dtype)}")
                rows = sint.concrete_shape(col.shape)[0] if col.ndim else 0
                if tuple(sint.concrete_shape(col.shape)[1:]) != tuple(spec.shape[1:]):
                    raise ModelInputError(f"fit data {k!r} has shape {list(sint.concrete_shape(col.shape))}; "
                                          f"expected [samples, {', '.join(str(d) for d in spec.shape[1:])}]")
            check_labels(self._p, k, col, "fit data")
            if count is None:
                count = rows
            elif rows != count:
                raise ModelInputError(f"fit data {k!r} has {rows} samples, others have {count}")
            columns[k] = col
        assert count is not None
        bs = count if batch_size is None else batch_size
        if not isinstance(bs, int) or isinstance(bs, bool) or bs < 1:
            raise ModelError(f"batch_size must be a positive int, got {batch_size!r}")
        ranks, me = 1, 0
        if distributed:
            ranks, me = world().size, world().rank
            if bs % ranks:
                raise ModelError(f"fit(distributed=True) splits each batch of {bs} samples evenly across {ranks} "
                                 f"ranks; use a batch_size that is a multiple of {ranks}")
        self._admits(specs, bs // ranks, "batch_size" if ranks == 1 else f"the per-rank batch ({bs} / {ranks})")
        full, rest = divmod(count, bs)
        batches = [(i * bs, bs) for i in range(full)]
        if rest:
            if remainder is None:
                raise ModelInputError(f"{count} samples do not split into batches of {bs}: the last batch would "
                                      f"have {rest}. Pass remainder='drop' to skip it or remainder='keep' "
                                      "to run it smaller")
            if remainder == "keep" and rest % ranks:
                raise ModelError(f"the final batch of {rest} samples does not split evenly across {ranks} ranks; "
                                 "pass remainder='drop'")
            if remainder == "keep":
                self._admits(specs, rest // ranks, "the final batch (remainder='keep')")
                batches.append((full * bs, rest))
        self._configure(optimizer, lr, hyper)
        averager = self._start_distributed(count, bs, epochs) if distributed else None
        if averager is not None and averager.world.size > 1:
            self._set_grad_scale(1.0 / averager.world.size)  # the gradients arrive as sums (_averaged_step)
        leading = {s.shape[0] for s in specs.values() if s.shape and isinstance(s.shape[0], str)}
        bar = progress(epochs * len(batches), verbose)
        losses: list[float] = []
        e = self._p.entries["loss"]
        try:
            for _ in range(epochs):
                for start, size in batches:
                    start, size = start + me * (size // ranks), size // ranks  # this rank's slice
                    fed: dict[int, Any] = {}
                    for k, col in columns.items():
                        part = col[start:start + size]
                        on_device = isinstance(col, Tensor)
                        fed[e.inputs[k]] = part.contiguous()._buffer() if on_device else part.reshape(-1)
                    env = {v: size if v in leading else hi for v, (_, hi) in self._p.variables.items()}
                    losses.append(self._step(fed, env, averager))
                    if bar is not None:
                        bar.update(1)
                        bar.set_postfix(loss=f"{losses[-1]:.4g}", refresh=False)
        finally:
            if averager is not None:
                self._set_grad_scale(1.0)  # train_step and other processes read plain gradients
            if bar is not None:
                bar.close()
        return losses

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


def progress(total: int, verbose: bool | None) -> Any:
    """A tqdm bar over `total` steps when asked for (verbose=True) or on a terminal; None otherwise."""
    if verbose is False or (verbose is None and not (sys.stderr.isatty() and total > 1)):
        return None
    try:
        from tqdm import tqdm  # optional: no bar without it
    except ImportError:
        return None
    return tqdm(total=total, unit="step", leave=False)
