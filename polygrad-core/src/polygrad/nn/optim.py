"""Optimizers: SGD, Adam, AdamW, LAMB and OptimizerGroup.

Stage: training. Input: parameters whose `.grad` was filled by `backward()`. Output: parameters and
optimizer state updated in place (lazy `assign`s realized together by `step()`).

A step runs in two realizations. The first materialises every gradient (and pending buffer updates
such as BatchNorm's running statistics), so that no update kernel reads a parameter another update
kernel writes. The second realizes all updates at once: one kernel per written parameter plus one
per flat state buffer (momentum / Adam moments of up to 16 parameters live in one buffer), and no
host work per parameter. The learning rate is a one-element buffer read by those kernels, so changing
`opt.lr` between steps reuses the compiled kernels.
"""
from __future__ import annotations

import math
import numbers
from typing import Any, Iterable, Mapping

import numpy as np

from polygrad.config import get as get_setting
from polygrad.definitions import optimizer as optimizer_table
from polygrad.errors import InvalidArgumentError, TrainingModeError
from polygrad.schedule.overwrites import buffer_ids, readers_of
from polygrad.tensor import Tensor, lazy_values, realize_outside_captures

__all__ = ["LAMB", "SGD", "Adam", "AdamW", "Optimizer", "OptimizerGroup", "check_hyperparameters"]

TRAINING_HINT = ("TRAINING must be enabled to run an optimizer step: wrap the training loop in "
                 "`with Context(TRAINING=1):` (from polygrad import Context), or set Tensor.training = True")


def _require_training() -> None:
    if not get_setting("TRAINING"):
        raise TrainingModeError(TRAINING_HINT)


FLOAT32_MAX = optimizer_table.FLOAT32_MAX


def _real(v: Any) -> bool:
    """A number that stays finite as the float32 the update kernels compute with."""
    if not isinstance(v, numbers.Real) or isinstance(v, (bool, np.bool_)):
        return False
    try:
        return math.isfinite(float(v)) and abs(float(v)) <= FLOAT32_MAX
    except OverflowError:  # float() of an int of 400 digits
        return False


def _within(rule: optimizer_table.Rule, v: Any) -> bool:
    """v is a real number inside the rule's bounds."""
    if not _real(v):
        return False
    if rule.low is not None and (v <= rule.low if rule.low_open else v < rule.low):
        return False
    return rule.high is None or (v < rule.high if rule.high_open else v <= rule.high)


def _rule(name: str, v: Any) -> str | None:
    """What is wrong with hyperparameter `name` = v (None when nothing), by the rule table of
    polygrad/definitions/optimizer.py: rates, decays and momentum are numbers >= 0 that are finite as
    float32, eps is > 0, betas lie in [0, 1) (a pair of them for `betas`), flags are bools."""
    rule = optimizer_table.RULES.get(name)
    if rule is None:
        return None
    if rule.kind == optimizer_table.FLAG:
        ok = isinstance(v, (bool, np.bool_))
    elif rule.kind == optimizer_table.PAIR_OF_REALS:
        ok = isinstance(v, (tuple, list)) and len(v) == 2 and all(_within(rule, b) for b in v)
    else:
        ok = _within(rule, v)
    return None if ok else rule.want


def check_hyperparameters(values: Mapping[str, Any], error: type[Exception] = InvalidArgumentError) -> None:
    """Raise `error` naming the first hyperparameter an optimizer cannot use: a negative or non-finite
    rate (it trains to NaN), a beta outside [0, 1), a string where a number belongs, nesterov without
    momentum. Model.fit checks the same rules when it configures an optimizer, and polygrad-js's
    optimizerConfigOf mirrors them."""
    for name, v in values.items():
        want = _rule(name, v)
        if want is not None:
            raise error(f"optimizer hyperparameter {name} must be {want}, got {v!r:.60}")
    for flag, number, message in optimizer_table.REQUIRES:
        if values.get(flag) and not values.get(number, 0) > 0:
            raise error(message)


# the defaults of Model.fit's optimizers, which bundles and polygrad-js share (polygrad/definitions/optimizer.py)
_SGD, _ADAM, _ADAMW, _LAMB = (optimizer_table.DEFAULTS[k] for k in ("sgd", "adam", "adamw", "lamb"))
_LAMB_EXTRA = optimizer_table.LAMB_EXTRA


def _scalar(value: float, device: str) -> Tensor:
    t = Tensor(np.array(value, dtype=np.float32), device=device)
    t.requires_grad = False
    return t


class Optimizer:
    """Base class: holds the parameters, the learning-rate buffer, zero_grad() and step()."""

    def __init__(self, params: Iterable[Tensor], lr: float):
        check_hyperparameters({"lr": lr})
        unique: dict[int, Tensor] = {}
        for p in params:
            if not isinstance(p, Tensor):
                raise TypeError(f"optimizer parameters must be Tensors, got {type(p).__name__}; pass "
                                "get_parameters(model)")
            unique.setdefault(id(p), p)
        for p in unique.values():
            if p.requires_grad is None:
                p.requires_grad = True
        self.params = [p for p in unique.values() if p.requires_grad]
        self.buffers = [p for p in unique.values() if not p.requires_grad]
        if not self.params:
            raise ValueError("the optimizer got no parameters that require gradients; pass get_parameters(model)")
        self.device = self.params[0].device
        self._lr = _scalar(lr, self.device)
        Tensor.realize_all(*self.params, *self.buffers)

    @property
    def lr(self) -> Tensor:
        """The learning rate, a 0-d float32 buffer. Assign a float (or Tensor) to change it between steps."""
        return self._lr

    @lr.setter
    def lr(self, value: Any) -> None:
        if isinstance(value, Tensor):
            self._lr.assign(value.reshape(()).to(self._lr.device)).realize()
        else:
            check_hyperparameters({"lr": value})
            self._lr.copy_from(np.array(float(value), dtype=np.float32))

    def _lr_on(self, device: str) -> Tensor:
        return self._lr if device == self.device else self._lr.to(device)

    def zero_grad(self) -> None:
        """Forget the gradients; call it before each backward() (they accumulate otherwise, as in torch)."""
        for p in self.params:
            p.grad = None

    def step(self, *realize_with: Tensor) -> None:
        """Update every parameter that has a gradient. Needs training mode (`Context(TRAINING=1)`).

        `realize_with` (e.g. the loss) is realized together with the gradients, sharing their kernels,
        before any parameter changes. So is every other live lazy value computed from the parameters
        or the optimizer's state (an unread loss): it keeps the value it had when it was built, as in
        PyTorch (schedule/overwrites.py).
        """
        Tensor.realize_all(*self.schedule_step(*realize_with))

    def schedule_step(self, *realize_with: Tensor) -> list[Tensor]:
        """Realize the gradients and pending buffer updates; return the (lazy) updated tensors."""
        _require_training()
        inputs = [*self._step_inputs(), *realize_with]
        Tensor.realize_all(*inputs, *_stale_readers(self.params + self.buffers, inputs))
        return self._updates()

    def _step_inputs(self) -> list[Tensor]:
        """What the first realization computes: the gradients and the buffers' pending updates."""
        live = [p for p in self.params if p.grad is not None]
        if not live:
            raise RuntimeError("optimizer step without gradients: call loss.backward() before opt.step()")
        for p in live:
            if p.grad.shape != p.shape:
                raise ValueError(f"gradient shape {p.grad.shape} does not match parameter shape {p.shape}")
        return [p.grad for p in live] + self.buffers

    def _updates(self) -> list[Tensor]:
        raise NotImplementedError


class OptimizerGroup(Optimizer):
    """Several optimizers stepped as one (e.g. different learning rates for parts of a model)."""

    def __init__(self, *optimizers: Optimizer):
        if not optimizers:
            raise ValueError("OptimizerGroup needs at least one optimizer")
        self.optimizers = list(optimizers)
        self.params = [p for o in self.optimizers for p in o.params]
        self.buffers = [b for o in self.optimizers for b in o.buffers]

    def __getitem__(self, i: int) -> Optimizer:
        return self.optimizers[i]

    @property
    def lr(self) -> list[Tensor]:  # type: ignore[override]
        return [o.lr for o in self.optimizers]

    def zero_grad(self) -> None:
        for o in self.optimizers:
            o.zero_grad()

    def schedule_step(self, *realize_with: Tensor) -> list[Tensor]:
        _require_training()
        inputs = [*[t for o in self.optimizers for t in o._step_inputs()], *realize_with]
        Tensor.realize_all(*inputs, *_stale_readers(self.params + self.buffers, inputs))
        return [t for o in self.optimizers for t in o._updates()]


class _FlatState:
    """One flat state buffer (momentum, Adam moments) shared by up to GROUP_SIZE parameters of one
    device and dtype, so a state update is one kernel per group instead of one per parameter."""

    def __init__(self, params: list[Tensor], indices: list[int]):
        self.indices = indices
        self.shapes = [params[i].shape for i in indices]
        self.sizes = [params[i].numel() for i in indices]
        self.offsets = [sum(self.sizes[:k]) for k in range(len(indices))]
        self.device, self.dtype = params[indices[0]].device, params[indices[0]].dtype

    def zeros(self) -> Tensor:
        return Tensor(np.zeros(sum(self.sizes), dtype=np.float32), device=self.device, dtype=self.dtype,
                      requires_grad=False)

    def join(self, parts: list[Tensor]) -> Tensor:
        """Per-parameter tensors -> one flat tensor in this group's layout."""
        flat = [t.reshape(-1) for t in parts]
        return flat[0] if len(flat) == 1 else flat[0].cat(*flat[1:])

    def part(self, flat: Tensor, k: int) -> Tensor:
        """The k-th parameter's slice of a flat tensor, in the parameter's shape."""
        begin = self.offsets[k]
        return flat.shrink(((begin, begin + self.sizes[k]),)).reshape(self.shapes[k])


# parameters per flat state buffer, and the size from which a parameter keeps a buffer of its own
# (polygrad/definitions/optimizer.py says why; polygrad-js's optim.js lays out the same groups)
GROUP_SIZE = optimizer_table.GROUP_SIZE
SOLO_NUMEL = optimizer_table.SOLO_NUMEL


def _flat_groups(params: list[Tensor]) -> list[_FlatState]:
    """State groups: per (device, dtype), in order of first appearance, each big parameter alone and the
    small ones in runs of up to GROUP_SIZE, ordered by their first parameter (polygrad-js's optim.js
    lays out the same groups)."""
    by_kind: dict[tuple[str, Any], list[int]] = {}
    for i, p in enumerate(params):
        by_kind.setdefault((p.device, p.dtype), []).append(i)
    out: list[list[int]] = []
    for idx in by_kind.values():
        small = [i for i in idx if params[i].numel() <= SOLO_NUMEL]
        groups = [[i] for i in idx if params[i].numel() > SOLO_NUMEL]
        groups += [small[k:k + GROUP_SIZE] for k in range(0, len(small), GROUP_SIZE)]
        out += sorted(groups)
    return [_FlatState(params, g) for g in out]


def _stale_readers(state: list[Tensor], inputs: list[Tensor]) -> list[Tensor]:
    """Live lazy values computed from the tensors a step overwrites (the loss, say): realized with the
    gradients, sharing their kernels, so they keep the values they had when built."""
    # those made before an active capture (TinyJit, Model) began are not the step's work: not recorded
    return realize_outside_captures(readers_of(buffer_ids(t.uop for t in state), lambda: lazy_values(inputs)))


def _grad(p: Tensor) -> Tensor:
    """The gradient (zeros for a parameter that got none this step: it then keeps its value)."""
    return p.grad.cast(p.dtype) if p.grad is not None else p.zeros_like()


class SGD(Optimizer):
    """torch.optim.SGD: p -= lr * g, with optional L2 weight_decay, momentum and nesterov momentum."""

    def __init__(self, params: Iterable[Tensor], lr: float = _SGD["lr"], momentum: float = _SGD["momentum"],
                 weight_decay: float = _SGD["weight_decay"], nesterov: bool = _SGD["nesterov"]):
        check_hyperparameters({"lr": lr, "momentum": momentum, "weight_decay": weight_decay, "nesterov": nesterov})
        super().__init__(params, lr)
        self.momentum, self.weight_decay, self.nesterov = momentum, weight_decay, nesterov
        self.groups = _flat_groups(self.params)
        self.b = [g.zeros() for g in self.groups] if momentum else []

    def _decayed_grad(self, p: Tensor) -> Tensor:
        g = _grad(p)
        return g + self.weight_decay * p.detach() if self.weight_decay else g

    def _updates(self) -> list[Tensor]:
        if not self.momentum:
            return [p.assign(p.detach() - self._lr_on(p.device) * self._decayed_grad(p))
                    for p in self.params if p.grad is not None]
        out = []
        for group, buf in zip(self.groups, self.b):
            params = [self.params[i] for i in group.indices]
            grads = [self._decayed_grad(p) for p in params]
            buf = buf.assign(self.momentum * buf + group.join(grads))
            out.append(buf)
            for k, (p, g) in enumerate(zip(params, grads)):
                if p.grad is None:
                    continue
                step = g + self.momentum * group.part(buf, k) if self.nesterov else group.part(buf, k)
                out.append(p.assign(p.detach() - self._lr_on(p.device) * step))
        return out


class LAMB(Optimizer):
    """LAMB (You et al. 2019); with adam=True it is Adam/AdamW (decoupled weight decay), as in tinygrad.

    The bias corrections use (b1**t, b2**t) kept in a two-element buffer, so every step reuses the same
    kernels; the moments live in flat buffers (see _FlatState).
    """

    def __init__(self, params: Iterable[Tensor], lr: float = _LAMB["lr"], b1: float = _LAMB["b1"],
                 b2: float = _LAMB["b2"], eps: float = _LAMB["eps"], weight_decay: float = _LAMB["weight_decay"],
                 adam: bool = _LAMB_EXTRA["adam"], l2_decay: float = _LAMB_EXTRA["l2_decay"]):
        check_hyperparameters({"lr": lr, "b1": b1, "b2": b2, "eps": eps, "weight_decay": weight_decay, "adam": adam,
                               "l2_decay": l2_decay})
        super().__init__(params, lr)
        self.b1, self.b2, self.eps, self.weight_decay, self.adam = b1, b2, eps, weight_decay, adam
        self.l2_decay = l2_decay
        self.beta_t = Tensor(np.ones(2, dtype=np.float32), device=self.device, requires_grad=False)
        self._betas = Tensor(np.array([b1, b2], dtype=np.float32), device=self.device, requires_grad=False)
        self.groups = _flat_groups(self.params)
        self.m = [g.zeros() for g in self.groups]
        self.v = [g.zeros() for g in self.groups]

    def _updates(self) -> list[Tensor]:
        beta_t = self.beta_t.assign(self.beta_t * self._betas)
        out = [beta_t]
        for group, m, v in zip(self.groups, self.m, self.v):
            params = [self.params[i] for i in group.indices]
            grads = [_grad(p) for p in params]
            if self.l2_decay:
                grads = [g + self.l2_decay * p.detach() for g, p in zip(grads, params)]
            g = group.join(grads)
            m = m.assign(self.b1 * m + (1.0 - self.b1) * g)
            v = v.assign(self.b2 * v + (1.0 - self.b2) * g.square())
            bt = beta_t if group.device == self.device else beta_t.to(group.device)
            up_flat = (m / (1.0 - bt[0])) / ((v / (1.0 - bt[1])).sqrt() + self.eps)
            out.extend([m, v])
            for k, p in enumerate(params):
                if p.grad is not None:
                    out.append(p.assign(p.detach() - self._lr_on(p.device) * self._step_of(p, group.part(up_flat, k))))
        return out

    def _step_of(self, p: Tensor, up: Tensor) -> Tensor:
        if self.weight_decay:
            up = up + self.weight_decay * p.detach()
        if self.adam:
            return up
        r1 = p.detach().square().sum().sqrt()
        r2 = up.square().sum().sqrt()
        return up * (r1 > 0).where((r2 > 0).where(r1 / r2, 1.0), 1.0)


class Adam(LAMB):
    """torch.optim.Adam (betas, eps, L2 weight_decay added to the gradient)."""

    def __init__(self, params: Iterable[Tensor], lr: float = _ADAM["lr"], betas: tuple[float, float] = _ADAM["betas"],
                 eps: float = _ADAM["eps"], weight_decay: float = _ADAM["weight_decay"]):
        check_hyperparameters({"betas": betas})
        super().__init__(params, lr, betas[0], betas[1], eps, adam=True, l2_decay=weight_decay)


class AdamW(LAMB):
    """torch.optim.AdamW (decoupled weight decay, default 0.01)."""

    def __init__(self, params: Iterable[Tensor], lr: float = _ADAMW["lr"], betas: tuple[float, float] = _ADAMW["betas"],
                 eps: float = _ADAMW["eps"], weight_decay: float = _ADAMW["weight_decay"]):
        check_hyperparameters({"betas": betas})
        super().__init__(params, lr, betas[0], betas[1], eps, weight_decay=weight_decay, adam=True)
