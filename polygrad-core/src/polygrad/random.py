"""The random generator's state: a seed and a counter, from which every draw takes its key.

Stage: graph construction (state). Input: seeds (`manual_seed`, `scoped(seed)`). Output: keys
(`next_key_values`: the (seed, counter) of the next draw, advancing the counter). The draws themselves
(Threefry-2x32 evaluated inside kernels, with the key in a small buffer and the element index as the
counter) are Tensor constructors: tensor_random.py. This module builds no tensor, so everything below
Tensor (a capture refilling its keys before a replay) may read it.

One (seed, counter) serves the whole process, as torch's default generator does: each draw takes a
counter value no other draw, in any thread, takes. Inside `scoped()` a thread draws from its own copy
instead (Model capture and a seeded `models.Sequential` build run there), so what other threads draw
meanwhile neither moves nor is moved by it.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Iterator

import numpy as np

_state = {"seed": 0, "counter": 0}  # the process-wide generator
_lock = threading.Lock()  # a key is read and the counter advanced as one step


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
