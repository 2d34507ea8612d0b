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
"""
from __future__ import annotations

import os
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


def get(name: str) -> Any:
    return _values.get(name, 0)


values = _values  # the current settings, for hot paths that read one per launch without a call (values.get)


def set_value(name: str, value: Any) -> None:
    """Change a setting for the rest of the process (or until the enclosing Context exits)."""
    if name not in _DEFAULTS:
        raise KeyError(f"unknown setting {name!r}; known settings are {sorted(_DEFAULTS)}")
    _values[name] = value


def env_device() -> str | None:
    """POLY_DEV beats DEV; read at each call so tests can set them."""
    return os.environ.get("POLY_DEV") or os.environ.get("DEV") or None


def cache_dir() -> str:
    base = os.environ.get("POLY_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "polygrad")
    return base


class Context:
    """Temporarily change settings: `with Context(TRAINING=1, BEAM=2): ...`; nests, restores on error."""

    def __init__(self, **kwargs: Any):
        for k in kwargs:
            if k not in _DEFAULTS:
                raise KeyError(f"unknown setting {k!r}; known settings are {sorted(_DEFAULTS)}")
        self.kwargs = kwargs
        self.saved: list[dict[str, Any]] = []

    def __enter__(self) -> "Context":
        self.saved.append({k: _values[k] for k in self.kwargs})
        _values.update(self.kwargs)
        return self

    def __exit__(self, *exc: Any) -> None:
        _values.update(self.saved.pop())
