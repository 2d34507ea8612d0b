"""Settings, read from the environment in this one place, and `Context` to change them in a block.

| name              | meaning                                                        | default |
|-------------------|----------------------------------------------------------------|---------|
| DEV, POLY_DEV     | default device (POLY_DEV wins); explicit device= beats both    | auto    |
| BEAM              | search width for kernel optimisations (0 = heuristics only)    | 0       |
| DEBUG             | 1: kernel names, 2: timings, 3: kernel IR, 4: source          | 0       |
| POLY_DUMP_KERNELS | print every kernel's source when it is compiled                | 0       |
| TRAINING          | training mode (Dropout, BatchNorm, optimizer steps)            | 0       |
| NOOPT             | disable kernel optimisations                                   | 0       |
| POLY_CACHE_DIR    | on-disk cache of compiled programs and BEAM results            | ~/.cache/polygrad |
| POLY_THREADS      | worker threads for CPU kernels                                 | cores   |
| POLY_DEBUG_ALLOC  | poison new/freed memory, guard zones checked after launches    | 0       |

`set_value` changes a setting for the whole process; `Context` changes it in its block for the thread
that entered it alone (each thread reads `get`: the process-wide values, or its innermost Context's),
so a Model capture's TRAINING=1 or another thread's `with Context(...)` never leaks across threads.
"""
from __future__ import annotations

import os
import threading
from typing import Any

_DEFAULTS: dict[str, Any] = {
    "BEAM": 0, "DEBUG": 0, "POLY_DUMP_KERNELS": 0, "TRAINING": 0, "NOOPT": 0, "POLY_DEBUG_ALLOC": 0,
    "POLY_THREADS": os.cpu_count() or 1,
}
_values: dict[str, Any] = {}


def _from_env(name: str, default: Any) -> Any:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    if isinstance(default, int):
        try:
            return int(raw)
        except ValueError:
            return default
    return raw


def reload_from_env() -> None:
    _values.clear()
    for name, default in _DEFAULTS.items():
        _values[name] = _from_env(name, default)


reload_from_env()


class _ThreadSettings(threading.local):
    """What the running thread reads: `values` is the process-wide dict, or inside a Context the copy it
    made; `frames` holds (that copy, the keys the Context restores) per open Context, innermost last."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = _values
        self.frames: list[tuple[dict[str, Any], frozenset[str]]] = []


current = _ThreadSettings()  # hot paths read current.values.get(name, 0) per launch, without a call


def get(name: str) -> Any:
    return current.values.get(name, 0)


def set_value(name: str, value: Any) -> None:
    """Change a setting for the rest of the process (or until the enclosing Context exits, when one of
    this thread's open Contexts sets the same name)."""
    if name not in _DEFAULTS:
        raise KeyError(f"unknown setting {name!r}; known settings are {sorted(_DEFAULTS)}")
    for values, keys in reversed(current.frames):
        values[name] = value
        if name in keys:
            return  # that Context restores the name when it exits: the change ends with it
    _values[name] = value


def env_device() -> str | None:
    """POLY_DEV beats DEV; read at each call so tests can set them."""
    return os.environ.get("POLY_DEV") or os.environ.get("DEV") or None


def cache_dir() -> str:
    base = os.environ.get("POLY_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "polygrad")
    return base


class Context:
    """Temporarily change settings: `with Context(TRAINING=1, BEAM=2): ...`; nests, restores on error.
    The change is seen by the thread that entered the block alone; one Context object may be entered
    by several threads (as a decorator) at once."""

    def __init__(self, **kwargs: Any):
        for k in kwargs:
            if k not in _DEFAULTS:
                raise KeyError(f"unknown setting {k!r}; known settings are {sorted(_DEFAULTS)}")
        self.kwargs = kwargs

    def __enter__(self) -> "Context":
        values = {**current.values, **self.kwargs}
        current.frames.append((values, frozenset(self.kwargs)))
        current.values = values
        return self

    def __exit__(self, *exc: Any) -> None:
        frames = current.frames
        frames.pop()
        current.values = frames[-1][0] if frames else _values
