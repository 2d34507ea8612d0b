"""Counter-based random numbers (Threefry-2x32, 20 rounds) evaluated inside kernels.

The key (seed, call counter) lives in a small buffer, so every call has the same graph structure and
reuses the compiled kernel; the counter is the element index. Same seed -> same numbers on every
backend, and a rand() of any size is never materialised on the host.

One (seed, counter) serves the whole process, as torch's default generator does: each draw takes a
counter value no other draw, in any thread, takes. Inside `scoped()` a thread draws from its own copy
instead (Model capture and a seeded `models.Sequential` build run there), so what other threads draw
meanwhile neither moves nor is moved by it.
"""
from __future__ import annotations

import contextlib
import math
import threading
from typing import Any, Iterator

import numpy as np

from polygrad.errors import InvalidArgumentError
from polygrad.dtype import dtypes, to_dtype

_state = {"seed": 0, "counter": 0}  # the process-wide generator
_lock = threading.Lock()  # a key is read and the counter advanced as one step
ROTATIONS = (13, 15, 26, 6, 17, 29, 16, 24)
PARITY = 0x1BD11BDA


class _Scoped(threading.local):
    """The state this thread draws from inside scoped() (None: the process-wide one)."""

    state: dict | None = None


_scoped = _Scoped()


def _current() -> dict:
    return _scoped.state or _state


def manual_seed(seed: int = 0) -> None:
    """Seed the generator (inside scoped(), this thread's own) and restart its counter."""
    state = _current()
    with _lock:
        state["seed"] = int(seed) & 0xFFFFFFFF
        state["counter"] = 0


def get_state() -> dict[str, int]:
    """A copy of the (seed, counter) this thread draws from now."""
    state = _current()
    with _lock:
        return dict(state)


@contextlib.contextmanager
def scoped(seed: int | None = None) -> Iterator[None]:
    """In the block, this thread draws from its own copy of the current state (reseeded to `seed` with
    counter 0 when given); the state outside is as it was before. Other threads are not affected.

    >>> from polygrad import Tensor
    >>> Tensor.manual_seed(3)
    >>> with scoped(7):
    ...     a = Tensor.rand(2).numpy()
    >>> with scoped(7):
    ...     b = Tensor.rand(2).numpy()
    >>> bool((a == b).all()), get_state()["counter"]
    (True, 0)
    """
    saved = _scoped.state
    _scoped.state = get_state() if seed is None else {"seed": int(seed) & 0xFFFFFFFF, "counter": 0}
    try:
        yield
    finally:
        _scoped.state = saved


def next_key_values() -> np.ndarray:
    """The next (seed, counter) key, advancing the counter (used by JIT replays)."""
    state = _current()
    with _lock:
        key = np.array([state["seed"], state["counter"]], dtype=np.uint32)
        state["counter"] += 1
    return key


def _next_key(device: str | None, runtime: Any):
    from polygrad.tensor import Tensor
    key = next_key_values()
    t = Tensor(key, device=device, dtype=dtypes.uint32, _runtime=runtime)
    from polygrad.engine.jit import note_rng_key
    note_rng_key(t)  # a JIT capturing now refills this key on every replay, so replays draw new numbers
    return t


def _rotl(x, r: int):
    return (x << r) | (x >> (32 - r))


def threefry2x32(c0, c1, k0, k1):
    """Random123's Threefry-2x32 on uint32 tensors (broadcasting)."""
    ks = (k0, k1, k0 ^ k1 ^ PARITY)
    x0, x1 = c0 + ks[0], c1 + ks[1]
    for i in range(20):
        x0 = x0 + x1
        x1 = _rotl(x1, ROTATIONS[i % 8]) ^ x0
        if i % 4 == 3:
            s = i // 4 + 1
            x0 = x0 + ks[s % 3]
            x1 = x1 + ks[(s + 1) % 3] + s
    return x0, x1


def _bits(shape: tuple[int, ...], device: str | None, runtime: Any):
    from polygrad.tensor import Tensor
    n = math.prod(shape)
    key = _next_key(device, runtime)
    counter = Tensor.arange(n, device=device, dtype=dtypes.uint32, _runtime=runtime)
    k0, k1 = key[0:1].reshape(()), key[1:2].reshape(())
    zero = Tensor.full((n,), 0, dtype=dtypes.uint32, device=counter.device, _runtime=runtime)
    return threefry2x32(counter, zero, k0, k1)


def _to_unit(bits):
    # top 24 bits -> [0, 1)
    return (bits >> 8).cast(dtypes.float32) * (1.0 / (1 << 24))


def rand(shape: tuple[int, ...], dtype: Any = None, device: str | None = None, **kw: Any):
    from polygrad.tensor import Tensor
    dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
    runtime = kw.get("_runtime")
    if math.prod(shape) == 0:
        return Tensor.empty(*shape, dtype=dt, device=device, _runtime=runtime)
    x0, _ = _bits(shape, device, runtime)
    out = _to_unit(x0).reshape(shape).cast(dt)
    out.requires_grad = kw.get("requires_grad")
    out._leaf = True
    return out


def randn(shape: tuple[int, ...], dtype: Any = None, device: str | None = None, **kw: Any):
    from polygrad.tensor import Tensor
    dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
    runtime = kw.get("_runtime")
    if math.prod(shape) == 0:
        return Tensor.empty(*shape, dtype=dt, device=device, _runtime=runtime)
    x0, x1 = _bits(shape, device, runtime)
    u1 = ((x0 >> 8).cast(dtypes.float32) + 1.0) * (1.0 / (1 << 24))
    u2 = _to_unit(x1)
    z = (u1.log() * -2.0).sqrt() * (u2 * (2 * math.pi)).cos()
    out = z.reshape(shape).cast(dt)
    out.requires_grad = kw.get("requires_grad")
    out._leaf = True
    return out


def randint(shape: tuple[int, ...], low: int = 0, high: int = 10, dtype: Any = None, device: str | None = None,
            **kw: Any):
    """Uniform integers in [low, high) from 32 random bits (modulo bias below span / 2**32)."""
    from polygrad.tensor import Tensor
    if not isinstance(low, int) or not isinstance(high, int):
        raise TypeError(f"randint: low and high must be Python ints, got {low!r} and {high!r}")
    if high <= low:
        raise InvalidArgumentError(f"randint: high ({high}) must be greater than low ({low})")
    if high - low > 1 << 32:
        raise InvalidArgumentError(f"randint: the range {high - low} is wider than 2**32; split it into two draws")
    dt = to_dtype(dtype) if dtype is not None else dtypes.int32
    runtime = kw.get("_runtime")
    if math.prod(shape) == 0:
        return Tensor.empty(*shape, dtype=dt, device=device, _runtime=runtime)
    x0, _ = _bits(shape, device, runtime)
    span = high - low
    picked = x0 if span == 1 << 32 else x0.fmod(span)
    out = (picked.cast(dtypes.int64) + low).reshape(shape).cast(dt)
    out.requires_grad = kw.get("requires_grad")
    out._leaf = True
    return out
