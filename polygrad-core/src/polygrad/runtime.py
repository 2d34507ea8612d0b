"""Explicit runtimes: `polygrad.create(device=...)` -> Runtime that owns the tensors and layers it makes.

Stage: user API (ownership and memory pressure). Input: a device name. Output: a Runtime whose
`Tensor`, `nn`, `models` and `Model` build objects owned by it, so mixing two runtimes in one op is
rejected (`RuntimeOwnershipError`), even on the same device. Package-level constructors
(`polygrad.Tensor(...)`, `polygrad.nn.Linear(...)`) use the default runtime, whose owner is `None`.

Ownership is recorded through `runtime_context.using(rt)`: everything built inside it records `rt`.
Compiled programs and schedules are cached process-wide (by graph structure, so sharing them is
safe); `clear_schedule_cache()` and `collect()` release them at an idle boundary.

>>> import polygrad
>>> rt = polygrad.create(device="cpu")
>>> (rt.Tensor([1.0, 2.0]) * 2).numpy().tolist()
[2.0, 4.0]
>>> rt.dispose()
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import importlib
import itertools
import types
from typing import Any, Callable

from polygrad import linalg, runtime_context, tensor
from polygrad.codegen import passes
from polygrad.device import canonicalize, free_cached
from polygrad.diskcache import forget_checks
from polygrad.engine import live, programs
from polygrad.errors import RuntimeOwnershipError
from polygrad.model import Model
from polygrad.schedule.template import clear_schedule_cache as _clear_schedules
from polygrad.tensor import Tensor
from polygrad.uop.ops import compact_uop_cache

_ids = itertools.count(1)


class Runtime:
    """An explicit owner of tensors, layers and optimizer state on one device."""

    def __init__(self, device: str | None = None):
        self.device = canonicalize(device)
        self.id = next(_ids)
        self.disposed = False
        self.Tensor = _TensorFactory(self)
        self.nn = _OwnedModule(self, "polygrad.nn")
        self.models = _models_namespace(self)

    def __repr__(self) -> str:
        state = " disposed" if self.disposed else ""
        return f"<Runtime #{self.id} {self.device}{state}>"

    # ---- ownership
    def check_alive(self) -> None:
        """Raise RuntimeOwnershipError if this runtime was disposed."""
        if self.disposed:
            raise RuntimeOwnershipError(f"{self!r} was disposed; create a new one with polygrad.create()")

    def owned(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """`fn` wrapped so that everything it creates belongs to this runtime."""
        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            self.check_alive()
            with runtime_context.using(self):
                return fn(*args, **kwargs)
        return call

    @property
    def Model(self) -> Any:  # noqa: N802 (spec name)
        """`rt.Model.load(path)` is `polygrad.Model.load(path, runtime=rt)`."""
        self.check_alive()
        return _ModelProxy(self, Model)

    # ---- memory pressure
    def clear_schedule_cache(self) -> None:
        """Drop cached schedules (they are rebuilt on next use)."""
        clear_schedule_cache()

    def collect(self) -> None:
        """Drop cached programs and schedules, then collect garbage and return free memory to the OS."""
        collect()

    def dispose(self) -> None:
        """Mark this runtime unusable; its tensors raise on further ops and their memory is freed
        when they are garbage collected."""
        self.disposed = True
        gc.collect()

    def __enter__(self) -> "Runtime":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.dispose()


class _TensorFactory:
    """`rt.Tensor(...)` and `rt.Tensor.rand(...)`: polygrad.Tensor constructors owned by rt."""

    def __init__(self, runtime: Runtime):
        self._runtime = runtime

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._runtime.owned(Tensor)(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(Tensor, name)
        return self._runtime.owned(attr) if callable(attr) else attr

    def __repr__(self) -> str:
        return f"<Tensor constructors of {self._runtime!r}>"


class _OwnedModule:
    """A module proxy whose classes and functions run inside the runtime (rt.nn, rt.nn.optim)."""

    def __init__(self, runtime: Runtime, module_name: str):
        self._runtime = runtime
        self._module_name = module_name

    def _module(self) -> types.ModuleType:
        return importlib.import_module(self._module_name)

    def __getattr__(self, name: str) -> Any:
        self._runtime.check_alive()
        try:
            attr = getattr(self._module(), name)
        except AttributeError:
            try:
                attr = importlib.import_module(f"{self._module_name}.{name}")
            except ImportError:
                raise AttributeError(f"{self._module_name} has no attribute {name!r}") from None
        if isinstance(attr, types.ModuleType):
            return _OwnedModule(self._runtime, attr.__name__)
        return self._runtime.owned(attr) if callable(attr) else attr

    def __dir__(self) -> list[str]:
        return dir(self._module())

    def __repr__(self) -> str:
        return f"<{self._module_name} owned by {self._runtime!r}>"


class _EmptyModels:
    """rt.models when polygrad.models is not installed in this build."""

    def __init__(self, runtime: Runtime):
        self._runtime = runtime

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"rt.models has no {name!r}: no model families are built into this polygrad "
                             "(polygrad.models is not available)")


def _models_namespace(runtime: Runtime) -> Any:
    try:
        importlib.import_module("polygrad.models")
    except ImportError:
        return _EmptyModels(runtime)
    return _OwnedModule(runtime, "polygrad.models")


class _ModelProxy:
    """rt.Model: calls polygrad.Model with runtime=rt (construction and Model.load)."""

    def __init__(self, runtime: Runtime, model_cls: Any):
        self._runtime, self._cls = runtime, model_cls

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("runtime", self._runtime)
        return self._runtime.owned(self._cls)(*args, **kwargs)

    def load(self, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("runtime", self._runtime)
        return self._runtime.owned(self._cls.load)(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._cls, name)
        return self._runtime.owned(attr) if callable(attr) else attr


def create(device: str | None = None) -> Runtime:
    """A new explicit runtime on `device` (default: the default device).

    >>> import polygrad
    >>> rt = polygrad.create(device="cpu"); rt.device
    'CPU'
    >>> rt.dispose()
    """
    return Runtime(device)


def clear_schedule_cache() -> None:
    """Drop every cached schedule; later realizes rebuild the ones they need."""
    _clear_schedules()


def collect() -> None:
    """Release cached schedules and compiled programs, collect garbage, and trim the C heap.

    Programs are reloaded from the on-disk compile cache when needed again (and its entries checked in
    full again: diskcache.forget_checks); live tensors and
    captured JIT functions keep their own buffers and programs. On CPU a program nothing holds any
    more closes its shared object (dlclose), so its mappings go too.
    """
    clear_schedule_cache()
    tensor._const_nodes.clear()  # kept scalar nodes (tensor._broadcast_const)
    forget_checks()
    programs.program_cache.clear()
    passes.clear_cache()  # simplified and split kernel ASTs
    linalg.clear_cache()  # its replayed steps hold programs and scratch buffers
    for _ in range(8):  # freeing one graph's cycles releases the hash-cons keys holding the next layer
        if gc.collect() == 0:
            break
    compact_uop_cache()
    live.live_tensors()  # drops the dead entries of the live-tensor list
    free_cached()
    trim_heap()


def trim_heap() -> None:
    """Ask glibc to give freed heap pages back to the OS (a no-op elsewhere): after a load that read and
    converted big arrays on the host, so they do not stay in the process's resident memory."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim() -> Any:
    """glibc's malloc_trim, or None: looked up once a process (find_library runs `ldconfig -p` each call)."""
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        return getattr(ctypes.CDLL(name), "malloc_trim", None)
    except OSError:
        return None
