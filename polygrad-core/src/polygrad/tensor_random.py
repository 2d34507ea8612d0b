"""Random tensors (a mixin): rand, randn, randint, drawn with Threefry-2x32 (20 rounds) inside kernels.

Stage: graph construction. Input: a shape, a dtype, a device, and the next key of the generator
(polygrad/random.py holds its state: seed and counter). Output: lazy tensors whose bits are Threefry of
(element index, key), so a draw of any size is never built on the host, the same seed gives the same
numbers on every backend, and every draw has the same graph structure (the key is a 2-element buffer):
the compiled kernels are reused. A capture running now is told of each key (engine/capture.py
`note_rng_key`) and refills it before every replay, so replays draw new numbers.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from polygrad import random
from polygrad.dtype import dtypes, to_dtype
from polygrad.engine.capture import note_rng_key
from polygrad.errors import InvalidArgumentError
from polygrad.tensor_common import _shape_arg

if TYPE_CHECKING:
    from polygrad.tensor import Tensor

ROTATIONS = (13, 15, 26, 6, 17, 29, 16, 24)
PARITY = 0x1BD11BDA


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


def _next_key(cls: type, device: str | None, runtime: Any) -> "Tensor":
    """The generator's next (seed, counter) as a 2-element uint32 tensor of class `cls`."""
    t = cls(random.next_key_values(), device=device, dtype=dtypes.uint32, _runtime=runtime)
    note_rng_key(t)  # a JIT capturing now refills this key on every replay, so replays draw new numbers
    return t


def _bits(cls: type, shape: tuple[int, ...], device: str | None, runtime: Any):
    """Two uint32 tensors of math.prod(shape) random words each."""
    n = math.prod(shape)
    key = _next_key(cls, device, runtime)
    counter = cls.arange(n, device=device, dtype=dtypes.uint32, _runtime=runtime)
    k0, k1 = key[0:1].reshape(()), key[1:2].reshape(())
    zero = cls.full((n,), 0, dtype=dtypes.uint32, device=counter.device, _runtime=runtime)
    return threefry2x32(counter, zero, k0, k1)


def _to_unit(bits):
    # top 24 bits -> [0, 1)
    return (bits >> 8).cast(dtypes.float32) * (1.0 / (1 << 24))


def _leaf(out, kw: dict):
    out.requires_grad = kw.get("requires_grad")
    out._leaf = True
    return out


class RandomMixin:
    """The generator's draws as Tensor constructors."""

    __slots__ = ()

    @staticmethod
    def manual_seed(seed: int = 0) -> None:
        """Seed the generator (inside random.scoped(), this thread's own) and restart its counter."""
        random.manual_seed(seed)

    @classmethod
    def rand(cls, *shape: Any, dtype: Any = None, device: str | None = None, **kw: Any) -> "Tensor":
        """Uniform samples in [0, 1)."""
        shape = _shape_arg(shape)
        dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
        runtime = kw.get("_runtime")
        if math.prod(shape) == 0:
            return cls.empty(*shape, dtype=dt, device=device, _runtime=runtime)
        x0, _ = _bits(cls, shape, device, runtime)
        return _leaf(_to_unit(x0).reshape(shape).cast(dt), kw)

    @classmethod
    def randn(cls, *shape: Any, dtype: Any = None, device: str | None = None, **kw: Any) -> "Tensor":
        """Standard normal samples (Box-Muller over two uniform draws)."""
        shape = _shape_arg(shape)
        dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
        runtime = kw.get("_runtime")
        if math.prod(shape) == 0:
            return cls.empty(*shape, dtype=dt, device=device, _runtime=runtime)
        x0, x1 = _bits(cls, shape, device, runtime)
        u1 = ((x0 >> 8).cast(dtypes.float32) + 1.0) * (1.0 / (1 << 24))
        u2 = _to_unit(x1)
        z = (u1.log() * -2.0).sqrt() * (u2 * (2 * math.pi)).cos()
        return _leaf(z.reshape(shape).cast(dt), kw)

    @classmethod
    def randint(cls, *shape: Any, low: int = 0, high: int = 10, dtype: Any = None, device: str | None = None,
                **kw: Any) -> "Tensor":
        """Uniform integers in [low, high) from 32 random bits (modulo bias below span / 2**32)."""
        shape = _shape_arg(shape)
        if not isinstance(low, int) or not isinstance(high, int):
            raise TypeError(f"randint: low and high must be Python ints, got {low!r} and {high!r}")
        if high <= low:
            raise InvalidArgumentError(f"randint: high ({high}) must be greater than low ({low})")
        if high - low > 1 << 32:
            raise InvalidArgumentError(f"randint: the range {high - low} is wider than 2**32; split it into two draws")
        dt = to_dtype(dtype) if dtype is not None else dtypes.int32
        runtime = kw.get("_runtime")
        if math.prod(shape) == 0:
            return cls.empty(*shape, dtype=dt, device=device, _runtime=runtime)
        x0, _ = _bits(cls, shape, device, runtime)
        span = high - low
        picked = x0 if span == 1 << 32 else x0.fmod(span)
        return _leaf((picked.cast(dtypes.int64) + low).reshape(shape).cast(dt), kw)
