"""Which explicit runtime (polygrad.create) owns newly created tensors: a context variable.

`rt.Tensor(...)`, `rt.nn.Linear(...)` and friends run inside `using(rt)`, so every tensor they make
records `rt` as its owner. Package-level constructors run with no current runtime (the default one).
"""
from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Iterator

_current: contextvars.ContextVar[Any] = contextvars.ContextVar("polygrad_runtime", default=None)


def current() -> Any:
    return _current.get()


@contextlib.contextmanager
def using(runtime: Any) -> Iterator[Any]:
    token = _current.set(runtime)
    try:
        yield runtime
    finally:
        _current.reset(token)
