"""One capture layer: record what realizes ran, then replay it with new input buffers.

Stage: execution. Input: any work that launches kernels (realizes, or replays of other graphs) inside
`with capture() as cap:`. Output: `cap.launches`, the launches in order, and `cap.graph(inputs,
outputs)`, a `CapturedGraph` that replays them. TinyJit (`engine/jit.py`), linalg's step loops and the
model/bundle export build on this module; `realize.capture_hooks` is the low-level hook it installs
(nothing else should touch that list).

What a launch records: for a kernel, the device-independent kernel AST (the scheduler's `Step.ast`,
before lowering: its RANGEs are "global"/"reduce" only), the device, the CompiledProgram that ran
and the buffers passed in slot order; for a copy, [dst, src]. Every launch carries `var_vals` (the
values of symbolic integers; empty until symbolic shapes exist).

A graph gives each buffer one role:
  input         one of the caller's `inputs` (matched by identity), substituted on every replay;
  param         alive before the capture, or made outside kernels during it (weights, host data,
                RNG keys): replay uses it as it is, with whatever it holds then;
  intermediate  made by the captured work (a realize's new buffers, another graph's scratch): its
                contents are written before they are read, so replay may reuse it or swap in a
                fresh set (`new_scratch`, `replay(..., scratch=)`).
Outputs (`output_slots`) are a separate list; an output is usually an intermediate.

Captures nest: every active capture gets each launch, so a JIT capturing a function that uses linalg
(which captures its own steps) records linalg's kernels too. A capture remembers which Tensors were
alive when it began (`made_before`); work done for them inside `paused()` is not recorded (values a
write would otherwise change, computed for the program, not for the captured function).

Captures belong to the thread that opened them: a capture records the launches of its own thread
alone, and other threads realize as usual meanwhile, unrecorded (`recording` is per thread, and so is
the hook list it installs in `engine/realize.py`).

>>> from polygrad import Tensor
>>> from polygrad.engine.capture import capture
>>> x = Tensor([1.0, 2.0]).realize()
>>> with capture() as cap:
...     y = (x * 2 + 1).realize()
>>> g = cap.graph(inputs=[x._buffer()], outputs=[y._buffer()])
>>> (g.n_kernels, g.roles)
(1, ['intermediate', 'input'])
>>> g.replay([Tensor([5.0, 6.0]).realize()._buffer()])[0].numpy().tolist()
[11.0, 13.0]
"""
from __future__ import annotations

import contextlib
import functools
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, NamedTuple, Sequence

from polygrad import config
from polygrad.config import current as settings
from polygrad.device import Buffer, debug_alloc, note_overwrite
from polygrad.engine import programs, realize
from polygrad.engine.live import live_tensors
from polygrad.errors import PolygradError
from polygrad.random import next_key_values
from polygrad.uop.ops import Ops, UOp


class CaptureError(PolygradError, RuntimeError):
    """A capture or captured graph was used in a way it cannot serve (see the message for the fix)."""


@dataclass(eq=False)
class Launch:
    """One launch seen by a capture, with the real buffers it was given."""

    kind: str  # "kernel" | "copy"
    device: str
    ast: UOp | None  # the device-independent kernel SINK (None for a copy)
    program: Any  # programs.CompiledProgram (None for a copy)
    buffers: list[Buffer]  # slot order; [dst, src] for a copy
    var_vals: dict[str, int] = field(default_factory=dict)


@dataclass(eq=False)
class GraphLaunch:
    """One launch of a CapturedGraph: like Launch, with buffer-table slots instead of buffers."""

    kind: str
    device: str
    ast: UOp | None
    program: Any
    args: tuple[int, ...]  # indices into CapturedGraph.buffers, in the kernel's slot order
    var_vals: dict[str, int] = field(default_factory=dict)


class SlotInfo(NamedTuple):
    """What an exporter needs to know of one buffer-table slot."""

    size: int
    dtype: Any
    device: str
    role: str  # "input" | "param" | "intermediate"


class _Recording(threading.local):
    """The captures open in the running thread, innermost last (each thread starts with none)."""

    def __init__(self) -> None:
        self.captures: list["Capture"] = []


recording = _Recording()  # hot paths test `recording.captures` without calling active()


def active() -> bool:
    """Whether a capture opened by this thread is recording now."""
    return bool(recording.captures)


def _on_launch(step: Any, program: Any, buffers: list[Buffer], n_inputs: int,
               var_vals: dict | None = None) -> None:
    """realize.capture_hooks entry: a template step just ran (args >= n_inputs are its new buffers);
    var_vals ({DEFINE_VAR: int}) are the bound variables' values it ran with."""
    created = [b for b, i in zip(buffers, step.args) if i >= n_inputs]
    names = {v.arg[0]: int(n) for v, n in var_vals.items()} if var_vals else {}
    _record(Launch(step.kind, step.device, step.ast, program, list(buffers), names), created)


def _record(launch: Launch, created: list[Buffer]) -> None:
    for cap in recording.captures:
        cap.launches.append(launch)
        cap._created.update(id(b) for b in created)


def made_before(tensors: Sequence[Any]) -> list[Any]:
    """The tensors among `tensors` that existed before an active capture began (not the captured work's)."""
    captures = recording.captures
    return [t for t in tensors if any(_was_alive(cap, t) for cap in captures)]


def _was_alive(cap: "Capture", t: Any) -> bool:
    ref = cap.older.get(id(t))
    return ref is not None and ref() is t


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Launches in the block are not recorded: work the captured function did not ask for (values
    computed before a write they would otherwise miss, schedule/overwrites.py) stays out of replays."""
    captures, hooks = recording.captures, realize.capture_hooks()
    saved = list(captures)
    captures.clear()
    hooked = _on_launch in hooks
    if hooked:
        hooks.remove(_on_launch)
    try:
        yield
    finally:
        captures.extend(saved)
        if hooked:
            hooks.append(_on_launch)


def note_rng_key(t: Any) -> None:
    """Called by tensor_random.py for each key tensor it makes: graphs refill these before each replay."""
    for cap in recording.captures:
        cap.rng_keys.append(t)


class Capture:
    """Records every launch while active (`with capture() as cap:`); one recording per object."""

    def __init__(self) -> None:
        self.launches: list[Launch] = []
        self.rng_keys: list[Any] = []  # key Tensors tensor_random.py made while active
        self._created: set[int] = set()  # ids of recorded buffers the captured work made
        self._state = "new"
        self._thread = 0  # threading.get_ident() of the thread recording
        # Tensors alive when recording began, by id (a weak reference tells a reused id apart; Tensor's
        # == is elementwise, so no WeakSet)
        self.older: dict[int, Any] = {}

    def __enter__(self) -> "Capture":
        if self._state != "new":
            raise CaptureError(f"this capture is {self._state}; a Capture records once, make a new "
                               "capture() for another recording")
        self.older = {id(t): weakref.ref(t) for t in live_tensors()}
        captures, hooks = recording.captures, realize.capture_hooks()
        if not captures:
            hooks.append(_on_launch)
        captures.append(self)
        self._state = "active"
        self._thread = threading.get_ident()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._state == "active" and self._thread != threading.get_ident():
            raise CaptureError("a capture must be closed by the thread that opened it (use `with capture():` "
                               "inside one thread)")
        captures, hooks = recording.captures, realize.capture_hooks()
        in_order = bool(captures) and captures[-1] is self
        if self in captures:
            captures.remove(self)
        if not captures and _on_launch in hooks:
            hooks.remove(_on_launch)
        self._state = "closed"
        if not in_order and exc[0] is None:
            raise CaptureError("captures must close in the reverse order they were opened (use `with`)")

    @property
    def kernels(self) -> list[Launch]:
        return [launch for launch in self.launches if launch.kind == "kernel"]

    def created(self, buf: Buffer) -> bool:
        """Whether the captured work made `buf` (a recorded buffer that will be an intermediate)."""
        return id(buf) in self._created

    def graph(self, inputs: Sequence[Buffer] = (), outputs: Sequence[Buffer] = ()) -> "CapturedGraph":
        """The replayable graph of what was recorded, `inputs` to be substituted on replay."""
        if self._state != "closed":
            raise CaptureError("the capture is still recording; leave the `with capture()` block before "
                               "building its graph")
        keys = []
        for t in self.rng_keys:
            u = t.uop.src[0] if t.uop.op is Ops.RESHAPE else t.uop
            if u.op is Ops.BUFFER:
                keys.append(u.arg)
        return CapturedGraph(self.launches, inputs, outputs, self._created, keys)


def capture() -> Capture:
    """A new Capture; use as `with capture() as cap: ...`."""
    return Capture()


def _copy(buffers: list[Buffer], var_vals: Any, timing: bool) -> None:
    realize.copy_buffer(buffers[0], buffers[1])


def _programs_of(launches: Sequence[Launch]) -> dict[tuple[UOp, str], Any]:
    """The programs of kernel launches recorded without one (under `realize.deferred()`), compiled
    together per device."""
    missing: dict[str, list[UOp]] = {}
    for x in launches:
        if x.kind == "kernel" and x.program is None:
            missing.setdefault(x.device, []).append(x.ast)  # type: ignore[arg-type]
    return {(a, d): p for d, asts in missing.items() for a, p in zip(asts, programs.get_programs(asts, d))}


class CapturedGraph:
    """Recorded launches over a buffer table with roles; `replay(inputs)` launches them again.

    Public layout (what an exporter reads): `launches` (GraphLaunch: kind, device, device-independent
    `ast`, `program`, `args` as table slots, `var_vals`), `buffers` (the table, bound to the buffers
    of the last replay), `roles`, `input_slots` (a slot per input, None where no launch used it),
    `output_slots`, `rng_slots` (keys refilled from the global RNG counter before each replay).
    """

    def __init__(self, launches: Sequence[Launch], inputs: Sequence[Buffer], outputs: Sequence[Buffer],
                 created: set[int] = frozenset(), rng_keys: Sequence[Buffer] = ()):  # type: ignore[assignment]
        inputs, outputs = list(inputs), list(outputs)
        where = {id(b): k for k, b in enumerate(inputs)}
        if len(where) != len(inputs):
            raise CaptureError("the same buffer was given twice as a graph input; inputs must be distinct")
        self.buffers: list[Buffer] = []
        self.roles: list[str] = []
        slot_of: dict[int, int] = {}

        def slot(b: Buffer) -> int:
            s = slot_of.get(id(b))
            if s is None:
                s = slot_of[id(b)] = len(self.buffers)
                self.buffers.append(b)
                self.roles.append("input" if id(b) in where else "intermediate" if id(b) in created else "param")
            return s

        compiled = _programs_of(launches)
        self.launches = [GraphLaunch(x.kind, x.device, x.ast, compiled.get((x.ast, x.device), x.program),
                                     tuple(slot(b) for b in x.buffers), dict(x.var_vals)) for x in launches]
        self.output_slots = [slot(b) for b in outputs]  # one no launch touched joins as input or param
        self.input_slots: list[int | None] = [slot_of.get(id(b)) for b in inputs]
        self.input_specs = [(b.size, b.dtype, b.device) for b in inputs]
        self.rng_slots = [slot_of[id(b)] for b in rng_keys if id(b) in slot_of]
        self.intermediate_slots = [s for s, r in enumerate(self.roles) if r == "intermediate"]
        kernels = [x.program for x in self.launches if x.kind == "kernel"]
        self.n_kernels, self.n_copies = len(kernels), len(self.launches) - len(kernels)
        self.ops = sum(p.spec.ops for p in kernels)
        self.mem_bytes = sum(p.spec.mem_bytes for p in kernels)
        self._build_plan()

    # ---- the replay plan: per launch a (function, argument list, var_vals tuple), patched in place
    def _build_plan(self) -> None:
        self._bufs = [[self.buffers[s] for s in x.args] for x in self.launches]
        self._plan: list[tuple[Any, list[Any], Any]] = []
        self._var_names: list[tuple[int, tuple[str, ...]]] = []  # (launch, its DEFINE_VAR names)
        self._names: list[tuple[str, ...]] = []  # per launch
        self._missing_vars = False
        hs_of = []
        for i, (x, bufs) in enumerate(zip(self.launches, self._bufs)):
            if x.kind == "copy":
                self._names.append(())
                hs_of.append(bufs)
                self._plan.append((_copy, bufs, ()))
                continue
            hs = [b.handle for b in bufs]
            hs_of.append(hs)
            names = tuple(v.arg[0] for v in x.program.spec.vars)
            self._names.append(names)
            if names:
                self._var_names.append((i, names))
                self._missing_vars |= any(n not in x.var_vals for n in names)
            vv = tuple(x.var_vals.get(n, 0) for n in names)
            self._plan.append((x.program.program, hs, vv))
        k_of = {s: k for k, s in enumerate(self.input_slots) if s is not None}
        j_of = {s: j for j, s in enumerate(self.intermediate_slots)}
        self._in_patch, self._mid_patch = [], []
        self._mid_pos: list[tuple[int, ...]] = []
        for x, bufs, hs in zip(self.launches, self._bufs, hs_of):
            for pos, s in enumerate(x.args):
                if s in k_of:
                    self._in_patch.append((hs, bufs, pos, k_of[s]))
                elif s in j_of:
                    self._mid_patch.append((hs, bufs, pos, j_of[s]))
            self._mid_pos.append(tuple(p for p, s in enumerate(x.args) if s in j_of))
        self._in_table = [(s, k) for k, s in enumerate(self.input_slots) if s is not None]
        self._in_launches = [i for i, x in enumerate(self.launches) if any(s in k_of for s in x.args)]
        self._mid_launches = [i for i, x in enumerate(self.launches) if any(s in j_of for s in x.args)]
        self._launchers = [self._launcher(i) for i in range(len(self.launches))]
        self._last_handles: list[Any] | None = None  # the input handles the launchers hold now
        self._segments: list | None = None  # launch plans and copies (_launch_plans), once made
        self._in_plan: dict[int, tuple[Any, int]] = {}  # launch -> (the launch plan holding it, its index there)
        self._no_plans = False  # the programs offer no launch plans: never asked again

    def _launcher(self, i: int) -> Callable[[], Any]:
        """Launch i with its arguments fixed: the program's own `bind` (no per-call conversion), else a
        call of the program over the plan's argument list (which input patches update in place)."""
        fn, args, vv = self._plan[i]
        bind = getattr(fn, "bind", None) if self.launches[i].kind == "kernel" else None
        return bind(args, vv) if bind is not None else functools.partial(fn, args, vv, False)

    def _rebind(self, indices: list[int]) -> None:
        for i in indices:
            self._launchers[i] = self._launcher(i)
            where = self._in_plan.get(i)
            if where is not None:
                for pos, h in enumerate(self._plan[i][1]):
                    where[0].set_handle(where[1], pos, h)

    def _launch_plans(self) -> list | None:
        """The launches as launch plans (two or more consecutive kernels of one device run by one call: the
        CPU pool library's pg_run_plan, a CUDA graph) and single launches (an index: copies, a kernel alone
        between them, kernels whose programs offer no `launch_plan`); None where no run of kernels can be a
        plan, or one cannot be made yet (the CPU pool library still building: asked again at the next
        replay)."""
        if self._segments is not None or self._no_plans:
            return self._segments
        makers = [getattr(x.program.program, "launch_plan", None) if x.kind == "kernel" else None
                  for x in self.launches]
        if not any(makers):
            self._no_plans = True
            return None
        out: list = []
        where: dict[int, tuple[Any, int]] = {}
        run: list[int] = []
        for i, make in enumerate(makers + [None]):  # None closes the last run
            if run and (make is None or make is not makers[run[0]] or
                        self.launches[i].device != self.launches[run[0]].device):
                if len(run) == 1:  # one kernel: its bound launcher costs less than a plan
                    out.append(run[0])
                else:
                    lp = makers[run[0]]([self._plan[j] for j in run])  # type: ignore[misc]
                    if lp is None:
                        return None
                    out.append((lp, [(k, j) for k, j in enumerate(run) if self._names[j]]))
                    where.update((j, (lp, k)) for k, j in enumerate(run))
                run = []
            if i == len(self.launches):
                break
            if make is None:
                out.append(i)
            else:
                run.append(i)
        if not where:  # no run of two kernels or more: the launchers as before
            self._no_plans = True
            return None
        self._segments, self._in_plan = out, where
        return out

    def _run_plans(self, segments: list, plan: list[tuple[Any, list[Any], Any]]) -> None:
        """Run launch plans and single launches (_launch_plans), with the Variables' values of `plan`."""
        bound = plan is self._plan  # the captured values: single launches run their bound launchers
        for seg in segments:
            if isinstance(seg, int):
                if bound:
                    self._launchers[seg]()
                else:
                    fn, args, vv = plan[seg]
                    fn(args, vv, False)
                continue
            lp, with_vars = seg
            for k, i in with_vars:
                lp.set_vars(k, plan[i][2])
            lp()

    def slots(self) -> list[SlotInfo]:
        """(size, dtype, device, role) of every buffer-table slot."""
        return [SlotInfo(b.size, b.dtype, b.device, r) for b, r in zip(self.buffers, self.roles)]

    def new_scratch(self) -> list[Buffer]:
        """A fresh, allocated set of intermediates (pass it as `replay(..., scratch=)`)."""
        return [Buffer(b.device, b.size, b.dtype).ensure_allocated()
                for b in (self.buffers[s] for s in self.intermediate_slots)]

    def bind_scratch(self, scratch: Sequence[Buffer]) -> None:
        """Use `scratch` (one buffer per intermediate slot) for this and later replays."""
        if len(scratch) != len(self.intermediate_slots):
            raise CaptureError(f"scratch has {len(scratch)} buffers; this graph has "
                               f"{len(self.intermediate_slots)} intermediates (use new_scratch())")
        handles = [b.handle for b in scratch]
        for hs, bufs, pos, j in self._mid_patch:
            hs[pos] = handles[j]
            bufs[pos] = scratch[j]
        for s, b in zip(self.intermediate_slots, scratch):
            self.buffers[s] = b
        self._rebind(self._mid_launches)

    # ---- replay
    def replay(self, inputs: Sequence[Buffer], var_vals: dict[str, int] | None = None,
               scratch: Sequence[Buffer] | None = None) -> list[Buffer]:
        """Launch the recorded programs with `inputs` substituted; returns the output buffers.

        The inputs must match the captured ones in count, size, dtype and device. `var_vals` gives
        the symbolic integers (forwarded to the programs); `scratch` swaps in other intermediates.
        """
        if len(inputs) != len(self.input_specs):
            raise CaptureError(f"replay got {len(inputs)} inputs; the graph was captured with {len(self.input_specs)}")
        for k, (b, spec) in enumerate(zip(inputs, self.input_specs)):
            if (b.size, b.dtype, b.device) != spec:
                raise CaptureError(f"replay input {k} is {b.size} x {b.dtype.name} on {b.device}; the graph was "
                                   f"captured with {spec[0]} x {spec[1].name} on {spec[2]}; capture again for "
                                   "other shapes")
        return self.launch(inputs, var_vals, scratch)

    def launch(self, inputs: Sequence[Buffer], var_vals: dict[str, int] | None = None,
               scratch: Sequence[Buffer] | None = None, outputs: bool = True) -> list[Buffer]:
        """replay() without the input checks, for callers that checked already (TinyJit, linalg); with
        outputs=False it returns [] (TinyJit hands back its captured tensors instead)."""
        realize.flush_deferred()  # launches held back before this one run first
        note_overwrite()  # it writes into buffers that may hold values (schedule/computed.py)
        if scratch is not None:
            self.bind_scratch(scratch)
        handles = [b._handle if b._handle is not None else b.handle for b in inputs]
        table = self.buffers
        if handles != self._last_handles:  # other input buffers than last time: patch them in
            for hs, bufs, pos, k in self._in_patch:
                hs[pos] = handles[k]
                bufs[pos] = inputs[k]
            for s, k in self._in_table:
                table[s] = inputs[k]
            self._rebind(self._in_launches)
            self._last_handles = handles
        # (the same handles are the same buffers: the graph holds the buffers it was last given, so
        # their allocations cannot have passed to others)
        if self.rng_slots:
            for s in self.rng_slots:
                table[s].copyin(next_key_values())
        if var_vals or self._missing_vars:
            plan = self._plan_with(var_vals)
            if recording.captures or config.get("DEBUG") >= 1 or debug_alloc.on:
                self._launch_recorded(plan)
            else:
                segments = self._launch_plans()
                t0 = time.perf_counter()
                if segments is not None:
                    self._run_plans(segments, plan)
                else:
                    for fn, args, vv in plan:
                        fn(args, vv, False)
                programs.count_kernels(self.n_kernels, self.ops, self.mem_bytes, time.perf_counter() - t0)
        elif recording.captures or settings.values.get("DEBUG", 0) >= 1 or debug_alloc.on:
            self._launch_recorded(self._plan)
        else:
            segments = self._segments if self._segments is not None or self._no_plans else self._launch_plans()
            t0 = time.perf_counter()
            if segments is not None:
                self._run_plans(segments, self._plan)
            else:
                for run in self._launchers:
                    run()
            programs.count_kernels(self.n_kernels, self.ops, self.mem_bytes, time.perf_counter() - t0)
        return [table[s] for s in self.output_slots] if outputs else []

    def _plan_with(self, var_vals: dict[str, int] | None) -> list[tuple[Any, list[Any], Any]]:
        var_vals = var_vals or {}
        known = {n for _, names in self._var_names for n in names}
        unknown = sorted(set(var_vals) - known)
        if unknown:
            raise CaptureError(f"no captured kernel takes the variable(s) {unknown}; it takes {sorted(known)}")
        plan = list(self._plan)
        for i, names in self._var_names:
            vals = {**self.launches[i].var_vals, **var_vals}
            missing = [n for n in names if n not in vals]
            if missing:
                raise CaptureError(f"replay needs values for the variable(s) {missing} (pass var_vals=)")
            fn, args, _ = plan[i]
            plan[i] = (fn, args, tuple(int(vals[n]) for n in names))
        return plan

    def _launch_recorded(self, plan: list[tuple[Any, list[Any], Any]]) -> None:
        """The slow path: launches one by one for DEBUG output and for the captures active now."""
        debug = config.get("DEBUG") >= 1
        n = ops = mem = 0
        dt = 0.0
        for x, (fn, args, vv), bufs, mid, names in zip(self.launches, plan, self._bufs, self._mid_pos,
                                                       self._names):
            if x.kind == "kernel" and debug and not vv:
                x.program(bufs)  # counts and prints itself
            else:
                t0 = time.perf_counter()
                fn(args, vv, False)
                dt += time.perf_counter() - t0
                if x.kind == "kernel":
                    n, ops, mem = n + 1, ops + x.program.spec.ops, mem + x.program.spec.mem_bytes
                if debug_alloc.on:
                    debug_alloc.check(bufs, f"replayed {x.kind} {getattr(x.ast, 'arg', '')}")
            if recording.captures:
                _record(Launch(x.kind, x.device, x.ast, x.program, list(bufs), dict(zip(names, vv))),
                        [bufs[p] for p in mid])
        programs.count_kernels(n, ops, mem, dt)

