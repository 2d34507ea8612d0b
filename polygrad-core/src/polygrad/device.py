"""Device registry (pluggy entry points), device-name resolution, and device Buffers.

Stage: runtime. Input: device names from users and the environment. Output: opened DeviceImpls and
Buffers. Selection order: explicit device= > POLY_DEV > DEV > highest-priority available backend.
"""
from __future__ import annotations

import importlib.metadata
import itertools
import threading
import warnings
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import pluggy

from polygrad import config
from polygrad.uop.ops import OWN_NODE_ARGS, SELF_KEYED_ARGS
from polygrad.contract import ENTRY_POINT_GROUP, PLUGIN_API, PROJECT, BackendHooks, BackendSpec, DeviceImpl, ProbeResult
from polygrad.hostmemory import RELEASE_ON_FREE_BYTES, HostAllocator, HostMemory
from polygrad.dtype import DType
from polygrad.errors import (DeviceError, DeviceUnavailableError, InvalidArgumentError, PluginError, PolygradError,
                             ReadOnlyBufferError, UnknownDeviceError)

KNOWN_PACKAGES = {
    "CPU": "polygrad-backend-cpu", "INTERP": "polygrad-backend-interp", "X86": "polygrad-backend-x86",
    "CUDA": "polygrad-backend-cuda",
}


@dataclass
class PluginFailure:
    plugin: str
    version: str
    error: str


class Registry:
    """Every backend found through entry points, loaded once, lazily."""

    def __init__(self) -> None:
        self._specs: dict[str, BackendSpec] | None = None
        self._aliases: dict[str, str] = {}
        self.failures: list[PluginFailure] = []
        self._opened: dict[tuple[str, int], DeviceImpl] = {}
        self._probes: dict[str, ProbeResult] = {}
        # device text -> (name, ordinal) and -> opened device: the per-launch fast paths of parse_device
        # and open_device; emptied whenever the registered backends change
        self.parsed: dict[str, tuple[str, int]] = {}
        self.opened_by_text: dict[str, DeviceImpl] = {}
        self._lock = threading.RLock()
        self.manager = pluggy.PluginManager(PROJECT)
        self.manager.add_hookspecs(BackendHooks)

    def register_plugin(self, plugin: Any, name: str, version: str = "") -> None:
        """Register a plugin object directly (tests, embedded use). Same checks as entry points."""
        with self._lock:
            self.specs()
            try:
                self.manager.register(plugin, name=name)
                specs = plugin.polygrad_register_backends()
                self._add_specs(specs, name, version)
            except Exception as e:  # a broken plugin is recorded, never fatal to the others
                self.failures.append(PluginFailure(name, version, f"{type(e).__name__}: {e}"))

    def _add_specs(self, specs: list[BackendSpec], plugin: str, version: str) -> None:
        assert self._specs is not None
        for spec in specs or []:
            if not isinstance(spec, BackendSpec):
                raise PluginError(f"plugin {plugin} returned {type(spec).__name__}, expected BackendSpec")
            if spec.api_version != PLUGIN_API:
                raise PluginError(f"plugin {plugin} {version} targets plugin API {spec.api_version}, "
                                  f"this polygrad speaks {PLUGIN_API}; upgrade the plugin or polygrad")
            name = spec.name.upper()
            self._specs[name] = spec
            for alias in spec.aliases:
                self._aliases[alias.upper()] = name
        self._probes.clear()
        self.parsed.clear()
        self.opened_by_text.clear()

    def specs(self) -> dict[str, BackendSpec]:
        with self._lock:
            if self._specs is None:
                self._specs = {}
                for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
                    dist = getattr(ep, "dist", None)
                    version = dist.version if dist is not None else ""
                    plugin_name = dist.name if dist is not None else ep.name
                    try:
                        plugin = ep.load()
                        if self.manager.get_plugin(ep.name) is None:
                            self.manager.register(plugin, name=ep.name)
                        self._add_specs(plugin.polygrad_register_backends(), plugin_name, version)
                    except Exception as e:
                        self.failures.append(PluginFailure(plugin_name, version, f"{type(e).__name__}: {e}"))
            return self._specs

    def canonical(self, name: str) -> str:
        up = name.upper()
        specs = self.specs()
        return self._aliases.get(up, up) if self._aliases.get(up, up) in specs else up

    def probe(self, name: str) -> ProbeResult:
        name = self.canonical(name)
        if name not in self._probes:
            try:
                self._probes[name] = self.specs()[name].probe()
            except Exception as e:
                self._probes[name] = ProbeResult(False, f"probe raised {type(e).__name__}: {e}")
        return self._probes[name]

    def installed_text(self) -> str:
        names = sorted(self.specs())
        return ", ".join(names) if names else "none"

    def default_name(self) -> str:
        env = config.env_device()
        if env:
            return parse_device(env)[0]
        best = None
        for name, spec in sorted(self.specs().items(), key=lambda kv: -kv[1].priority):
            if self.probe(name).ok:
                best = name
                break
        if best is None:
            reasons = "; ".join(f"{n}: {self.probe(n).reason}" for n in self.specs())
            raise DeviceUnavailableError(f"no usable backend ({reasons or 'none installed'}); "
                                         "pip install polygrad-backend-interp for a compiler-free backend")
        return best

    def open(self, name: str, ordinal: int = 0) -> DeviceImpl:
        key = (name, ordinal)
        impl = self._opened.get(key)
        if impl is not None:
            return impl
        with self._lock:
            if key not in self._opened:
                spec = self.specs()[name]
                result = self.probe(name)
                if not result.ok:
                    raise DeviceUnavailableError(f"device {name} is installed but unusable: {result.reason}")
                self._opened[key] = spec.open(ordinal)
            return self._opened[key]


registry = Registry()


def parse_device(device: str) -> tuple[str, int]:
    """'cpu', 'CPU:0', 'cuda:1' -> (canonical name, ordinal). Rejects unknown and multi-device names."""
    hit = registry.parsed.get(device) if type(device) is str else None
    if hit is not None:
        return hit
    out = _parse_device(device)
    registry.parsed[device] = out
    return out


def _parse_device(device: str) -> tuple[str, int]:
    if not isinstance(device, str) or not device.strip():
        raise DeviceError(f"device must be a non-empty string like 'CPU', got {device!r}")
    text = device.strip()
    if "," in text or "+" in text:
        raise DeviceError(f"multi-device targets such as {device!r} are not supported; pick one device, e.g. 'CPU'")
    base, _, ord_text = text.partition(":")
    name = registry.canonical(base)
    specs = registry.specs()
    if name not in specs:
        pkg = KNOWN_PACKAGES.get(name, f"polygrad-backend-{base.lower()}")
        hint = f"pip install {pkg}" if name in KNOWN_PACKAGES else f"a plugin providing it (e.g. pip install {pkg})"
        raise UnknownDeviceError(f"unknown device {device!r}; installed backends: {registry.installed_text()}. "
                                 f"To add it: {hint}")
    ordinal = 0
    if ord_text:
        try:
            ordinal = int(ord_text)
        except ValueError as e:
            raise DeviceError(f"device ordinal in {device!r} must be an integer") from e
        if not 0 <= ordinal <= specs[name].max_ordinal:
            raise DeviceError(f"{name} has no device {ordinal}; valid ordinals are 0..{specs[name].max_ordinal}")
    return name, ordinal


def canonicalize(device: str | None) -> str:
    """The canonical device string ('CPU', 'CUDA:1'); None means the default device."""
    if device is None:
        return Device.DEFAULT
    name, ordinal = parse_device(device)
    return name if ordinal == 0 else f"{name}:{ordinal}"


def open_device(device: str) -> DeviceImpl:
    impl = registry.opened_by_text.get(device) if type(device) is str else None
    if impl is None:
        impl = registry.open(*parse_device(device))
        registry.opened_by_text[device] = impl
    return impl


class _Device:
    """`Device.DEFAULT`, `Device.cuda_available()`, `Device["CPU"]`."""

    @property
    def DEFAULT(self) -> str:  # noqa: N802 (spec name)
        return registry.default_name()

    def __getitem__(self, name: str) -> DeviceImpl:
        return open_device(name)

    def available(self, name: str) -> bool:
        try:
            return registry.probe(parse_device(name)[0]).ok
        except DeviceError:
            return False

    def cuda_available(self) -> bool:
        return self.available("CUDA")

    def installed(self) -> list[str]:
        return sorted(registry.specs())


Device = _Device()


# ---------------------------------------------------------------------------------------------------
# Buffers


class CounterValues:
    """Where GlobalCounters keeps its numbers. Launch paths add to `counts` directly: writing a class
    attribute (GlobalCounters.kernel_count += 1) costs about a microsecond in CPython 3.11, since every
    write to a class invalidates its attribute caches, and a launch updated four of them."""

    __slots__ = ("global_ops", "global_mem", "time_sum_s", "kernel_count", "mem_used")

    def __init__(self) -> None:
        self.global_ops = self.global_mem = self.kernel_count = self.mem_used = 0
        self.time_sum_s = 0.0


counts = CounterValues()


# Called when buffers that may already hold a value are written: host copies into a buffer (with the
# Buffer), effects that ran (assign, custom kernels) and replays of captured graphs (with None: any
# buffer). Values computed from buffers and kept for later realizes are then no longer known to be
# current (schedule/computed.py listens here).
overwrite_listeners: list[Callable[[Any], Any]] = []


class _HostAccess(threading.local):
    """What must run before this thread reads or writes a buffer from the host: `before` is a callable
    (engine/realize.py's deferred launches, `realize.deferred()`) or None."""

    def __init__(self) -> None:
        self.before: Callable[[], None] | None = None


host_access = _HostAccess()


def note_overwrite(buf: "Buffer | None" = None) -> None:
    """Tell the listeners that `buf` (None: any buffer) may be overwritten."""
    for listener in overwrite_listeners:
        listener(buf)


def _counter(name: str) -> property:
    return property(lambda cls: getattr(counts, name), lambda cls, value: setattr(counts, name, value))


class _CountersType(type):
    """GlobalCounters.<name> reads and writes counts.<name>, so the tinygrad spelling keeps working."""

    global_ops = _counter("global_ops")
    global_mem = _counter("global_mem")
    time_sum_s = _counter("time_sum_s")
    kernel_count = _counter("kernel_count")
    mem_used = _counter("mem_used")


class GlobalCounters(metaclass=_CountersType):
    """tinygrad-compatible counters: global_ops, global_mem, time_sum_s, kernel_count, mem_used.
    reset() zeroes the per-run counters and keeps live memory.

    mem_used is the memory the runtime holds per device: live buffers plus freed allocations kept
    for reuse (see device.free_cached()); stats()["buffers_live"] counts live buffers alone.
    """

    mem_used_per_device: dict = {}

    @staticmethod
    def reset() -> None:
        counts.global_ops = counts.global_mem = counts.kernel_count = 0
        counts.time_sum_s = 0.0


# allocated Buffers per device (polygrad.stats()["buffers_live"]); not a GlobalCounters field in tinygrad
buffers_live: dict[str, int] = {}


def _account(device: str, nbytes: int, count: int = 0) -> None:
    with _alloc_lock:
        counts.mem_used += nbytes
        buffers_live[device] = buffers_live.get(device, 0) + count
        per = GlobalCounters.mem_used_per_device
        per[device] = per.get(device, 0) + nbytes


_serials = itertools.count()
_new_object = object.__new__


class Buffer:
    """Device memory for `size` elements of `dtype`. Allocated on first use, freed when collected.

    New memory reads as zeros, never as the bytes of an earlier computation (freed allocations are reused,
    and host memory comes from the process heap), unless whoever allocates it says every byte is written
    before anything reads it: `ensure_allocated(written=True)` (a full copy in, a kernel whose stores are
    proven to cover the buffer: uop/dataflow.py). POLY_DEBUG_ALLOC poisons it instead (see DebugAlloc).
    """

    # _node: the BUFFER node UOp.fresh made over this buffer (a weak reference), or None (uop/ops.py OWN_NODE_ARGS)
    __slots__ = ("device", "size", "dtype", "serial", "_handle", "_impl", "_node", "__weakref__")

    def __init__(self, device: str, size: int, dtype: DType):
        self._handle: Any = None  # first: __del__ of a Buffer whose size was rejected finds nothing to free
        self._impl: DeviceImpl | None = None
        self._node: Any = None
        self.device, self.size, self.dtype = device, size if type(size) is int else int(size), dtype
        self.serial = next(_serials)  # creation order: a capture tells buffers made during it from older ones

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def is_allocated(self) -> bool:
        return self._handle is not None

    @property
    def readonly(self) -> bool:
        """Whether this buffer is a caller's read-only host memory (adopt_host_array): nothing writes it."""
        return getattr(self._handle, "readonly", False)

    def check_writable(self, what: str) -> None:
        """ReadOnlyBufferError naming `what` when this buffer adopted read-only memory."""
        if getattr(self._handle, "readonly", False):
            raise ReadOnlyBufferError(f"{what} would write into a read-only buffer ({self.size} {self.dtype.name} "
                                      "values adopted from host memory, e.g. a memory-mapped weight file); write "
                                      "into a copy instead (t.contiguous().realize(), or Tensor(t.numpy()))")

    def impl(self) -> DeviceImpl:
        if self._impl is None:
            self._impl = open_device(self.device)
        return self._impl

    def ensure_allocated(self, written: bool = False) -> "Buffer":
        """Allocate now; zero-filled unless `written` (the caller writes every byte before any read)."""
        if self._handle is not None:
            return self
        impl = self._impl
        if impl is None:  # open_device, with its cache read here first
            impl = self._impl = registry.opened_by_text.get(self.device) or open_device(self.device)
        nbytes = self.size * self.dtype.itemsize
        if debug_alloc.on:
            self._handle = debug_alloc.alloc(impl.allocator, nbytes)
            _account(self.device, nbytes, 1)
            return self
        handle = _take_cached(self.device, nbytes)
        if handle is None:
            handle = impl.allocator.alloc(nbytes)
            _account(self.device, nbytes, 1)
            if getattr(handle, "zeroed", False):  # zero pages from the system (hostmemory.py): nothing to clear
                written = True
        if not written and nbytes:
            zero_fill(impl.allocator, handle, nbytes)
        self._handle = handle
        return self

    @staticmethod
    def written(device: str, size: int, dtype: DType) -> "Buffer":
        """Buffer(device, size, dtype).ensure_allocated(written=True) in one Python call, for an output whose
        every element a kernel writes (engine/realize.realize_eager: one per eager op); an allocation of this
        size freed earlier is taken without a zero fill, else ensure_allocated makes one."""
        if debug_alloc.on:  # poisoned, guarded memory (DebugAlloc)
            return Buffer(device, size, dtype).ensure_allocated(written=True)
        self = _new_object(Buffer)
        self._handle = self._node = None  # first: __del__ finds nothing to free until the handle is in
        self.device, self.size, self.dtype = device, size, dtype
        self.serial = next(_serials)
        handle = _take_cached(device, size * dtype.itemsize)
        if handle is None:
            self._impl = None
            return self.ensure_allocated(written=True)
        self._impl = registry.opened_by_text.get(device) or open_device(device)
        self._handle = handle
        return self

    def __reduce__(self):
        raise TypeError("a device Buffer cannot be pickled or copied; pickle or deepcopy the Tensor that holds it "
                        "(its values are saved)")

    def __del__(self) -> None:
        handle = self._handle
        if handle is None:
            return
        self._handle = None
        device, nbytes = self.device, self.size * self.dtype.itemsize
        if type(handle) is not GuardedMemory and nbytes and not getattr(handle, "readonly", False):
            # kept for the next buffer of this size (_release, inline: every realize frees a buffer)
            allocator = self._impl.allocator
            _alloc_lock.acquire()
            try:
                if alloc_cache_bytes["total"] + nbytes <= ALLOC_CACHE_LIMIT:
                    buffers_live[device] -= 1
                    free = _alloc_cache.get((device, nbytes))
                    if free is None:  # _cached_of_size, inline
                        free = _alloc_cache[(device, nbytes)] = deque()
                    free.append((allocator, handle))
                    alloc_cache_bytes["total"] += nbytes
                    if nbytes >= RELEASE_ON_FREE_BYTES:
                        _release_pages(allocator, handle, nbytes)
                    return
            finally:
                _alloc_lock.release()
        _release(self._impl.allocator, handle, nbytes, device)

    @property
    def handle(self) -> Any:
        return self.ensure_allocated()._handle

    def copyin(self, data: np.ndarray) -> "Buffer":
        arr = np.ascontiguousarray(data)
        if arr.nbytes != self.nbytes:
            raise ValueError(f"copy of {arr.nbytes} bytes into a buffer of {self.nbytes} bytes; shapes must match")
        self.check_writable("a copy in")
        if host_access.before is not None:
            host_access.before()
        note_overwrite(self)
        handle = self.ensure_allocated(written=True)._handle  # every byte: nothing to zero first
        self.impl().allocator.copyin(handle, memoryview(arr.reshape(-1).view(np.uint8)))
        return self

    def copyin_prefix(self, data: np.ndarray) -> "Buffer":
        """Write `data` into the first elements (a symbolic-size buffer holding fewer rows than its capacity)."""
        arr = np.ascontiguousarray(data)
        if arr.nbytes > self.nbytes:
            raise ValueError(f"copy of {arr.nbytes} bytes into a buffer of {self.nbytes} bytes")
        if arr.nbytes:
            self.check_writable("a copy in")
            if host_access.before is not None:
                host_access.before()
            note_overwrite(self)
            self.impl().allocator.copyin(self.handle, memoryview(arr.reshape(-1).view(np.uint8)))
        return self

    def numpy(self, count: int | None = None) -> np.ndarray:
        """A host copy of the contents (the first `count` elements: a variable-size result in a buffer sized
        for its maximum), as a flat array of the storage dtype."""
        n = self.size if count is None else min(max(int(count), 0), self.size)
        out = np.empty(n, dtype=self.dtype.np)
        if n:
            if host_access.before is not None:
                host_access.before()
            self.impl().synchronize()
            self.impl().allocator.copyout(memoryview(out.view(np.uint8)), self.handle)
        return out

    def __repr__(self) -> str:
        return f"<Buffer {self.device} {self.size} {self.dtype.name}>"


SELF_KEYED_ARGS.add(Buffer)  # a BUFFER node's arg hashes and compares by identity
OWN_NODE_ARGS.add(Buffer)  # the node realize_eager makes over a new buffer is found through its _node


def adopt_host_array(device: str, arr: np.ndarray, dtype: DType) -> Buffer:
    """A Buffer on `device` whose memory is `arr`'s own (no copy): a read-only, C-contiguous host array of
    `dtype`'s values on their natural alignment, e.g. a view of a memory-mapped file. Only devices whose
    memory is host memory (CPU, X86, INTERP) can adopt it; every write into the buffer is refused
    (ReadOnlyBufferError), and it keeps `arr` alive. Tensor.from_host_view is the user-facing form."""
    if not isinstance(arr, np.ndarray) or arr.dtype != dtype.np:
        raise InvalidArgumentError(f"adopting host memory needs a numpy array of {dtype.np}, got "
                                   f"{getattr(arr, 'dtype', type(arr).__name__)}")
    if arr.flags.writeable:
        raise InvalidArgumentError("adopting host memory needs a read-only array (a view of a read-only memory map, "
                                   "or one with arr.flags.writeable = False), so nothing changes it under the "
                                   "tensor; use Tensor(arr) to copy a writable one")
    if not arr.flags.c_contiguous or arr.ctypes.data % arr.dtype.itemsize:
        raise InvalidArgumentError(f"adopting host memory needs a C-contiguous array on a multiple of "
                                   f"{arr.dtype.itemsize} bytes; use Tensor(arr) to copy this one")
    impl = open_device(canonicalize(device))
    adopt = getattr(impl.allocator, "adopt", None)
    if adopt is None or debug_alloc.on:
        why = "POLY_DEBUG_ALLOC guards every allocation" if adopt is not None else "its memory is not host memory"
        raise DeviceError(f"device {device} cannot adopt host memory ({why}); use Tensor(arr, device=...) to copy "
                          "the array instead")
    buf = Buffer(canonicalize(device), arr.size, dtype)
    buf._impl = impl
    buf._handle = adopt(arr)
    _account(buf.device, buf.nbytes, 1)
    return buf


# Freed allocations are kept per (device, size) and handed to the next buffer of the same size, so a
# training loop stops paying the allocator (and, on the host, page faults) after its first step.
# GlobalCounters.mem_used counts them: it is the memory the runtime holds on each device, live or
# cached for reuse. free_cached() (and polygrad's collect()) gives the cached part back.
ALLOC_CACHE_LIMIT = config.get("POLY_ALLOC_CACHE_MB") << 20  # read when polygrad is imported
# (a deque per size: a list shrinking to empty and growing again reallocates at every realize)
_alloc_cache: dict[tuple[str, int], deque[tuple[Any, Any]]] = {}
alloc_cache_bytes = {"total": 0}
# Held while the cache or the counters change, so threads allocating and freeing at once never take
# one allocation twice nor lose a count. Reentrant: a collection inside it may free a Buffer.
_alloc_lock = threading.RLock()


def _take_cached(device: str, nbytes: int) -> Any:
    """An allocation of `nbytes` on `device` that a dead Buffer gave back (the reuse cache), counted live
    again; None when there is none. Buffer.ensure_allocated and Buffer.written both take through here."""
    # test and take at once: another thread may take the last one, or free_cached() all (acquire and
    # release, not `with`: every realize allocates, and `with` makes two bound methods)
    _alloc_lock.acquire()
    try:
        free = _alloc_cache.get((device, nbytes))  # freed allocations of this size (_release, Buffer.__del__)
        if free:
            alloc_cache_bytes["total"] -= nbytes
            buffers_live[device] += 1  # (its device's count exists: the allocation was counted)
            return free.pop()[1]
        return None
    finally:
        _alloc_lock.release()


def _cached_of_size(device: str, nbytes: int) -> deque[tuple[Any, Any]]:
    """The cached allocations of `nbytes` on `device` (with _alloc_lock held)."""
    free = _alloc_cache.get((device, nbytes))
    if free is None:
        free = _alloc_cache[(device, nbytes)] = deque()
    return free


def _release(allocator: Any, handle: Any, nbytes: int, device: str) -> None:
    with _alloc_lock:
        buffers_live[device] = buffers_live.get(device, 0) - 1
        if isinstance(handle, GuardedMemory):  # made while POLY_DEBUG_ALLOC was on
            _account(device, -nbytes, 0)
            debug_alloc.release(allocator, handle, nbytes)
            return
        # an adopted handle is the caller's memory: never handed to another buffer
        if nbytes and alloc_cache_bytes["total"] + nbytes <= ALLOC_CACHE_LIMIT and not getattr(handle, "readonly",
                                                                                                 False):
            _cached_of_size(device, nbytes).append((allocator, handle))
            alloc_cache_bytes["total"] += nbytes
            if nbytes >= RELEASE_ON_FREE_BYTES:
                _release_pages(allocator, handle, nbytes)
            return
        _account(device, -nbytes, 0)
    allocator.free(handle, nbytes)


def _release_pages(allocator: Any, handle: Any, nbytes: int) -> None:
    """A large allocation entering the reuse cache keeps its address, not its pages (hostmemory.py)."""
    release = getattr(allocator, "release_pages", None)
    if release is not None:
        release(handle, nbytes)


def zero_fill(allocator: Any, handle: Any, nbytes: int) -> None:
    """Zero an allocation: the allocator's own `zero` (a memset) where it has one, else a copy of zeros."""
    fill = getattr(allocator, "zero", None)
    if fill is not None:
        fill(handle, nbytes)
    else:
        allocator.copyin(handle, memoryview(bytes(nbytes)))


def free_cached() -> int:
    """Give every cached (free, reusable) allocation back to its device; returns the bytes freed."""
    freed = 0
    with _alloc_lock:  # no thread takes an allocation while it is given back
        for (device, nbytes), entries in list(_alloc_cache.items()):
            for allocator, handle in entries:
                _account(device, -nbytes, 0)
                allocator.free(handle, nbytes)
                freed += nbytes
        _alloc_cache.clear()
        alloc_cache_bytes["total"] = 0
    return freed


# ---------------------------------------------------------------------------------------------------
# POLY_DEBUG_ALLOC=1: allocations that make memory bugs fail loudly (slow; for tests and bug hunts)


class MemoryCheckError(PolygradError, RuntimeError):
    """A kernel wrote outside its buffer, or memory was used after it was freed (POLY_DEBUG_ALLOC=1)."""


POISON = 0xFF  # every float reads as NaN, every signed int as -1
GUARD_BYTES = 64


class GuardedMemory(HostMemory):
    """A host allocation inside guard zones: `arr` is the payload, `full` the guards around it."""

    __slots__ = ("full", "freed")

    def __init__(self, full: np.ndarray, nbytes: int):
        super().__init__(full[GUARD_BYTES:GUARD_BYTES + max(nbytes, 1)])
        self.full = full
        self.freed = False


class DebugAlloc:
    """POLY_DEBUG_ALLOC=1 (read when polygrad is imported; `enable()` switches it for new buffers).

    - New allocations are filled with 0xFF bytes: a kernel that reads memory no one wrote sees NaN
      (floats) or -1 (ints) instead of plausible stale values.
    - Host allocations sit between guard zones of 0xFF; `check(buffers, what)` (after every kernel
      launch) raises MemoryCheckError when a guard byte changed: a write out of bounds.
    - Freed allocations are filled with 0xFF and quarantined (not reused until QUARANTINE_BYTES of
      later frees push them out), so a read after free sees NaN and a late write is caught by
      `check_quarantine()` when it evicts the block.
    - The reuse cache is bypassed: every buffer gets fresh memory.
    """

    QUARANTINE_BYTES = 256 << 20

    def __init__(self) -> None:
        self.on = bool(config.get("POLY_DEBUG_ALLOC"))
        self.quarantine: list[tuple[Any, Any, int]] = []
        self.quarantined = 0
        self.checks = 0

    def enable(self, on: bool = True) -> None:
        self.on = on

    def alloc(self, allocator: Any, nbytes: int) -> Any:
        if isinstance(allocator, HostAllocator):
            full = np.full(max(nbytes, 1) + 2 * GUARD_BYTES, POISON, dtype=np.uint8)
            return GuardedMemory(full, nbytes)
        handle = allocator.alloc(nbytes)
        if nbytes:
            allocator.copyin(handle, memoryview(np.full(nbytes, POISON, dtype=np.uint8)))
        return handle

    def release(self, allocator: Any, handle: GuardedMemory, nbytes: int) -> None:
        try:  # runs in Buffer.__del__: report, never raise
            self._check_guards(handle, "something")
        except MemoryCheckError as e:
            warnings.warn(f"POLY_DEBUG_ALLOC: freeing a buffer whose guard zone changed: {e}", RuntimeWarning,
                          stacklevel=2)
        handle.full[:] = POISON
        handle.freed = True
        self.quarantine.append((allocator, handle, nbytes))
        self.quarantined += nbytes
        while self.quarantined > self.QUARANTINE_BYTES and self.quarantine:
            self._evict()

    def _evict(self) -> None:
        allocator, handle, nbytes = self.quarantine.pop(0)
        self.quarantined -= nbytes
        if not np.all(handle.full == POISON):
            warnings.warn(f"POLY_DEBUG_ALLOC: freed {nbytes}-byte block at {handle.addr:#x} was written after it "
                          "was freed (use after free)", RuntimeWarning, stacklevel=2)
        allocator.free(handle, nbytes)

    def check_quarantine(self) -> None:
        """Raise if any quarantined (freed) block was written since it was freed."""
        for _, handle, nbytes in self.quarantine:
            if not np.all(handle.full == POISON):
                raise MemoryCheckError(f"a freed {nbytes}-byte block at {handle.addr:#x} was written after it "
                                       "was freed (use after free)")

    def check(self, buffers: Any, what: str) -> None:
        """After a launch: every buffer's guards intact and none of them freed."""
        self.checks += 1
        for b in buffers:
            handle = getattr(b, "_handle", b)
            if isinstance(handle, GuardedMemory):
                if handle.freed:
                    raise MemoryCheckError(f"{what} used a buffer that was already freed (use after free)")
                self._check_guards(handle, what)

    @staticmethod
    def _check_guards(handle: GuardedMemory, what: str) -> None:
        head, tail = handle.full[:GUARD_BYTES], handle.full[GUARD_BYTES + handle.arr.nbytes:]
        if not (np.all(head == POISON) and np.all(tail == POISON)):
            where = "before" if not np.all(head == POISON) else "after"
            raise MemoryCheckError(f"{what} wrote {where} the end of its {handle.arr.nbytes}-byte buffer at "
                                   f"{handle.addr:#x} (POLY_DEBUG_ALLOC guard zone changed)")


debug_alloc = DebugAlloc()
