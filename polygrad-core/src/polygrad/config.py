"""Settings: each declared once with its type and default, read from the environment here alone, and
`Context` to change them in a block.

Stage: runtime support. Input: the process environment, `Context(...)` and `set_value`. Output: typed
values for core (`get`) and for backends (`backend_api.setting`).

| name                | meaning                                                        | default |
|---------------------|----------------------------------------------------------------|---------|
| DEV, POLY_DEV       | default device (POLY_DEV wins); explicit device= beats both    | auto    |
| BEAM                | search width for kernel optimisations (0 = heuristics only)    | 0       |
| DEBUG               | 1: kernel names, 2: timings, 3: kernel IR, 4: source          | 0       |
| POLY_DUMP_KERNELS   | print every kernel's source when it is compiled                | 0       |
| TRAINING            | training mode (Dropout, BatchNorm, optimizer steps)            | 0       |
| NOOPT               | disable kernel optimisations                                   | 0       |
| POLY_CACHE_DIR      | on-disk cache of compiled programs and BEAM results            | ~/.cache/polygrad |
| POLY_THREADS        | host threads for CPU and X86 kernels (split at open, used per launch) | cores |
| POLY_DEBUG_ALLOC    | poison new/freed memory, guard zones checked after launches    | 0       |
| POLY_ALLOC_CACHE_MB | freed memory kept for reuse, per process                       | 1024    |
| POLY_DIST_TIMEOUT   | seconds a distributed collective waits for the other ranks (0: forever) | 300 |
| POLY_DIST_BUCKET_MB | gradient bucket size of distributed training, MiB              | 1       |
| POLY_CPU            | declared CPU description fields (JSON or a JSON file) over the detected ones | detected |
| POLY_INT8_DOT       | 0: quantized (Q8_0, Q4_0) decode matvecs stay in float, no 8-bit activations | 1 |
| POLY_INT8_PROMPTS   | 0: quantized prompt matmuls (several rows) stay in float; decode as POLY_INT8_DOT says | 1 |
| POLY_JOIN_PROJ      | 0: load_hf keeps q/k/v and gate/up apart, not joined into qkv_proj and gate_up_proj | 1 |
| POLY_ALLOW_TF32     | 1: float32 matmuls may use TF32 tensor cores (CUDA sm_80+), as torch's allow_tf32 | 0 |

Backends declare their own settings (the CPU backend's POLY_CC, the X86 backend's POLY_X86_ISA, ...)
with `backend_api.register_setting` when their package is imported: core knows nothing of them, yet
they are typed and checked like these and listed by `settings()` (and `python -m polygrad doctor`).

Names are checked: an unknown one (DEBGU, in `get`, `set_value` or a `Context`) raises
UnknownSettingError (a KeyError) that lists the known names and suggests the closest. Values are
checked: one that does not parse or is out of range (`POLY_THREADS=abc`, `Context(BEAM=-1)`) raises
SettingError naming the variable. Most settings are read from the environment once, when polygrad is
imported (or a backend declares them), so a bad value fails at once; the `live` ones (DEV, POLY_DEV,
POLY_CACHE_DIR and the backends' library and compiler paths) are read again at each use, so changing
the environment meanwhile takes effect.

`set_value` changes a setting for the whole process; `Context` changes it in its block for the thread
that entered it alone (each thread reads `get`: the process-wide values, or its innermost Context's),
so a Model capture's TRAINING=1 or another thread's `with Context(...)` never leaks across threads.
"""
from __future__ import annotations

import difflib
import os
import threading
from dataclasses import dataclass
from typing import Any

from polygrad.errors import PluginError, SettingError, UnknownSettingError


@dataclass(frozen=True)
class Setting:
    """One setting: its environment variable `name`, type (`int` or `str`), default and meaning.
    `minimum` bounds an int, `choices` lists the values a str may take (compared in lower case);
    `live` settings are read from the environment at each use instead of once."""

    name: str
    kind: type
    default: Any
    doc: str
    minimum: int | None = None
    choices: tuple[str, ...] = ()
    live: bool = False
    owner: str = "polygrad-core"

    def parse(self, raw: str, where: str) -> Any:
        """The value of the text `raw` (from `where`: the environment, a Context); SettingError if bad."""
        text = raw.strip()
        if self.kind is not int:
            return self._checked(text.lower() if self.choices else raw, raw, where)
        try:
            value = int(text)
        except ValueError:
            raise self._bad(raw, where, "is not a whole number") from None
        return self._checked(value, raw, where)

    def check(self, value: Any, where: str) -> Any:
        """`value` when this setting can take it (a string is parsed first), else SettingError."""
        if isinstance(value, str) and self.kind is not str:
            return self.parse(value, where)
        if not isinstance(value, self.kind):
            raise self._bad(value, where, f"is a {type(value).__name__}")
        return self._checked(value, value, where)

    def _checked(self, value: Any, shown: Any, where: str) -> Any:
        if self.minimum is not None and value < self.minimum:
            raise self._bad(shown, where, f"is below {self.minimum}")
        if self.choices and value and value not in self.choices:
            raise self._bad(shown, where, f"is not one of {', '.join(self.choices)}")
        return value

    def _bad(self, shown: Any, where: str, problem: str) -> SettingError:
        return SettingError(f"{self.name}={shown!r} ({where}) {problem}; {self._hint()}")

    def from_env(self) -> Any:
        raw = os.environ.get(self.name)
        if raw is None or raw.strip() == "":
            return self.default
        return self.parse(raw, "from the environment")

    def _hint(self) -> str:
        if self.choices:
            want = f"one of {', '.join(self.choices)}"
        elif self.kind is int:
            want = "a whole number" + (f" >= {self.minimum}" if self.minimum is not None else "")
        else:
            want = "a text"
        return f"set it to {want} ({self.doc}), or unset it for the default ({self.default!r})"


_CORE = (
    Setting("DEV", str, "", "default device", live=True),
    Setting("POLY_DEV", str, "", "default device, beats DEV", live=True),
    Setting("BEAM", int, 0, "search width for kernel optimisations, 0: heuristics only", minimum=0),
    Setting("DEBUG", int, 0, "1: kernel names, 2: timings, 3: kernel IR, 4: source", minimum=0),
    Setting("POLY_DUMP_KERNELS", int, 0, "print every kernel's source when it is compiled", minimum=0),
    Setting("TRAINING", int, 0, "training mode", minimum=0),
    Setting("NOOPT", int, 0, "disable kernel optimisations", minimum=0),
    Setting("POLY_CACHE_DIR", str, "", "on-disk cache folder", live=True),
    Setting("POLY_THREADS", int, os.cpu_count() or 1, "host threads for CPU and X86 kernels", minimum=1),
    Setting("POLY_DEBUG_ALLOC", int, 0, "poison memory and check guard zones", minimum=0),
    Setting("POLY_ALLOC_CACHE_MB", int, 1024, "megabytes of freed memory kept for reuse", minimum=0),
    Setting("POLY_DIST_TIMEOUT", int, 300, "seconds a distributed collective waits for the other ranks, 0: forever",
            minimum=0),
    Setting("POLY_CPU", str, "", "the host CPU's description, field by field (JSON, or a JSON file's path)"),
    Setting("POLY_DIST_BUCKET_MB", int, 1, "MiB per gradient bucket of distributed training", minimum=1),
    Setting("POLY_INT8_DOT", int, 1, "0: quantized decode matvecs keep float activations (no int8 dot products)",
            minimum=0),
    Setting("POLY_INT8_PROMPTS", int, 1, "0: quantized prompt matmuls (several rows) keep float activations",
            minimum=0),
    Setting("POLY_JOIN_PROJ", int, 1, "0: load_hf keeps q/k/v and gate/up projections apart (not joined)",
            minimum=0),
    Setting("POLY_ALLOW_TF32", int, 0, "1: float32 matmuls may round their operands to TF32 for tensor cores",
            minimum=0),
)
_registry: dict[str, Setting] = {s.name: s for s in _CORE}
_values: dict[str, Any] = {}  # process-wide values of the settings read once (and of set_value's)


def reload_from_env() -> None:
    """Read every setting that is read once from the environment again (set_value's changes are lost)."""
    _values.clear()
    for setting in _registry.values():
        if not setting.live:
            _values[setting.name] = setting.from_env()


def register(setting: Setting) -> Setting:
    """Declare a setting (backends: `backend_api.register_setting`, when their package is imported). A
    second declaration of the same setting is a no-op; one with another meaning raises PluginError."""
    known = _registry.get(setting.name)
    if known is not None:
        if known == setting:
            return known
        raise PluginError(f"setting {setting.name} is declared by {known.owner} and again, differently, by "
                          f"{setting.owner}; rename one of them (a backend's settings carry its own prefix)")
    if not setting.live:
        _values[setting.name] = setting.from_env()
    _registry[setting.name] = setting
    return setting


def settings() -> list[Setting]:
    """Every declared setting (core's and those of the backends imported so far), by name."""
    return sorted(_registry.values(), key=lambda s: s.name)


def lookup(name: str) -> Setting:
    """The declaration of `name`; UnknownSettingError naming the closest known setting if none."""
    setting = _registry.get(name)
    if setting is None:
        known = sorted(_registry)
        close = difflib.get_close_matches(str(name), known, n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        raise UnknownSettingError(f"unknown setting {name!r}; {hint}known settings are {', '.join(known)}")
    return setting


reload_from_env()


class _ThreadSettings(threading.local):
    """What the running thread reads: `values` is the process-wide dict, or inside a Context the copy it
    made; `frames` holds (that copy, the keys the Context restores) per open Context, innermost last."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = _values
        self.frames: list[tuple[dict[str, Any], frozenset[str]]] = []


# hot paths read current.values.get(name, 0) per launch, without a call (settings read once only:
# a live setting is in `values` only while a Context or set_value sets it)
current = _ThreadSettings()


def get(name: str) -> Any:
    """The value this thread sees: its innermost Context's, else the process-wide one (a live setting's
    from the environment now)."""
    values = current.values
    if name in values:
        return values[name]
    setting = lookup(name)
    if setting.live:
        return setting.from_env()
    return _values.get(name, setting.default)  # declared after this thread's Context began


def process_value(name: str) -> Any:
    """The process-wide value, whatever Context this thread is in: what a device fixes when it opens
    (the CPU backends split kernels over POLY_THREADS threads, a Context may only use fewer)."""
    setting = lookup(name)
    if name in _values:
        return _values[name]
    return setting.from_env() if setting.live else setting.default


def set_value(name: str, value: Any) -> None:
    """Change a setting for the rest of the process (or until the enclosing Context exits, when one of
    this thread's open Contexts sets the same name)."""
    value = lookup(name).check(value, "set_value")
    for values, keys in reversed(current.frames):
        values[name] = value
        if name in keys:
            return  # that Context restores the name when it exits: the change ends with it
    _values[name] = value


def env_device() -> str | None:
    """POLY_DEV beats DEV; read at each call so tests can set them."""
    return get("POLY_DEV") or get("DEV") or None


def cache_dir() -> str:
    """The root of the on-disk caches: POLY_CACHE_DIR, else $XDG_CACHE_HOME/polygrad, else
    ~/.cache/polygrad. Only `diskcache.cache_dir` calls it: every cache asks that for its folder."""
    return get("POLY_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "polygrad")


class Context:
    """Temporarily change settings: `with Context(TRAINING=1, BEAM=2): ...`; nests, restores on error.
    The change is seen by the thread that entered it alone; one Context object may be entered
    by several threads (as a decorator) at once."""

    def __init__(self, **kwargs: Any):
        self.kwargs = {k: lookup(k).check(v, "Context") for k, v in kwargs.items()}

    def __enter__(self) -> "Context":
        values = {**current.values, **self.kwargs}
        current.frames.append((values, frozenset(self.kwargs)))
        current.values = values
        return self

    def __exit__(self, *exc: Any) -> None:
        frames = current.frames
        frames.pop()
        current.values = frames[-1][0] if frames else _values
