"""DistributedOptimizer: any polygrad optimizer made data-parallel across the ranks.

Stage: distributed training. Input: an nn.optim optimizer (SGD, Adam, AdamW, LAMB, OptimizerGroup) whose
parameters got their gradients from this rank's share of the batch. Output: the same optimizer stepping
every rank identically: its parameters, buffers and state are broadcast from rank 0 when it is wrapped,
and each `step()` first replaces every gradient by its mean over the ranks (buckets.py: one MPI call per
bucket; the 1/N of a big gradient is a lazy multiply that fuses into the step's kernel), then runs the
wrapped step.

With each rank's loss the mean over its equal share of the global batch, the averaged gradient is the
gradient of the global batch's mean loss, so N ranks with batch B/N take the steps of one process with
batch B.
"""
from __future__ import annotations

from typing import Any

from polygrad.device import Buffer
from polygrad.distributed.buckets import Averager, broadcast_buffers
from polygrad.distributed.comm import world
from polygrad.errors import DistributedError
from polygrad.nn.optim import Optimizer
from polygrad.nn.state import get_state_dict
from polygrad.tensor import Tensor, _buffer_uop


class DistributedOptimizer:
    """Wraps `optimizer`: the same start on every rank, gradients averaged across ranks on each step.

    >>> import polygrad.distributed as dist
    >>> from polygrad import Tensor, Context
    >>> from polygrad.nn.optim import SGD
    >>> w = Tensor([1.0, 2.0], requires_grad=True)
    >>> opt = dist.DistributedOptimizer(SGD([w], lr=0.5))
    >>> with Context(TRAINING=1):
    ...     opt.zero_grad()
    ...     _ = (w * w).sum().backward()
    ...     opt.step()
    >>> w.tolist()
    [0.0, 0.0]
    """

    def __init__(self, optimizer: Optimizer, bucket_mb: int | None = None):
        if not isinstance(optimizer, Optimizer):
            raise DistributedError(f"DistributedOptimizer wraps a polygrad.nn.optim optimizer, got "
                                   f"{type(optimizer).__name__}")
        self.optimizer = optimizer
        self.world = world()
        self.averager = Averager(self.world, bucket_mb << 20 if bucket_mb else None)
        self.sync()

    def __getattr__(self, name: str) -> Any:  # lr, params, buffers... of the wrapped optimizer
        if name == "optimizer":
            raise AttributeError(name)
        return getattr(self.optimizer, name)

    def state_buffers(self) -> list[Buffer]:
        """Every buffer of the optimizer's state dict (parameters, buffers, lr, moments), once each, in order."""
        out: list[Buffer] = []
        seen: set[int] = set()
        for t in [*get_state_dict(self.optimizer).values(), *self.optimizer.params, *self.optimizer.buffers]:
            b = t._buffer()
            if id(b) not in seen:
                seen.add(id(b))
                out.append(b)
        return out

    def sync(self, root: int = 0) -> None:
        """Overwrite the parameters, buffers and optimizer state with rank `root`'s (done when wrapped)."""
        broadcast_buffers(self.world, self.state_buffers(), root, "DistributedOptimizer: broadcast of the "
                          "parameters and optimizer state")

    def zero_grad(self) -> None:
        self.optimizer.zero_grad()

    def average_gradients(self, *realize_with: Tensor) -> None:
        """Replace each parameter's gradient by its mean over the ranks (computed with `realize_with`)."""
        live = [p for p in self.optimizer.params if p.grad is not None]
        if not live:
            raise RuntimeError("optimizer step without gradients: call loss.backward() before opt.step()")
        grads = [p.grad for p in live]
        Tensor.realize_all(*grads, *realize_with)
        sources = [g._buffer() for g in grads]
        # fresh targets: a realized gradient may share its buffer with another tensor (the gradient of
        # a*b with respect to a is b itself), which must keep its value
        targets = [Buffer(b.device, b.size, b.dtype) for b in sources]
        # a gradient reduced in its own memory comes back as the sum: its 1/N is folded into the optimizer
        # step's kernel, which reads it anyway, instead of a pass of its own over the memory
        factors = self.averager.average(sources, targets, "DistributedOptimizer.step (gradient averaging)",
                                        defer=True)
        for p, g, b, f in zip(live, grads, targets, factors):
            mean = Tensor(_buffer_uop(b, g.shape), _runtime=g._runtime)
            p.grad = mean if f == 1.0 else mean * f

    def step(self, *realize_with: Tensor) -> None:
        """Average the gradients across the ranks, then take the wrapped optimizer's step."""
        self.average_gradients(*realize_with)
        self.optimizer.step(*realize_with)
