"""Running a Program's entrypoints on one device: a buffer per slot, kernels launched in call order.

Stage: execution (polygrad-js: runtime.js). Input: a Program (program.py) and the slots' initial
contents. Output: an `Executor` that allocates one Buffer per slot (caches zeroed), runs an entrypoint
over fed inputs (`run`: inputs copied into their buffers or a device Tensor's buffer bound in their
place, rng keys refilled, kernels launched with the call's Variable values) and hands results out
(`take`: the output's buffer becomes a Tensor the caller keeps, and the slot gets a fresh buffer, so
results stay valid across later calls and dispose()).

Each entrypoint's plan is a list of (compiled program, buffer handle list) pairs built on first use;
binding a caller's buffer patches those handle lists in place for one call. Where the device's programs
offer `launch_plan` (the CPU backend: its pool library runs a list of kernels in one foreign call), the
kernels between two copies run as one such plan, whose argument arrays a rebind and the call's Variable
values patch in place; otherwise each launch runs through the program's own launcher with its arguments
fixed (`bind`, where the backend has one), made again after a rebind touched its handles.

Temporaries share buffers (`share_temporaries`) when no entrypoint has two of them alive at once, as
polygrad-js's memory plan shares its memory: a GPT-2 forward over 1024 tokens held 1.7 GB of temporaries
with one buffer each.
"""
from __future__ import annotations

import bisect
import functools
import time
from typing import Any

import numpy as np

from polygrad.device import Buffer, note_overwrite
from polygrad.engine import programs, realize
from polygrad.model.program import Program, program_flow
from polygrad.tensor import Tensor, _buffer_uop


def share_temporaries(prog: Program) -> dict[int, int]:
    """{temporary slot: the slot whose buffer it uses instead of its own}. A temporary lives, in each
    entrypoint, from its first to its last call; two share when no entrypoint has both alive at once and
    they have one dtype. First fit, biggest first, so a shared buffer is its first slot's (the biggest)."""
    temps = [i for i, s in enumerate(prog.slots) if s.role == "temporary"]
    if len(temps) < 2:
        return {}
    live: dict[int, list[tuple[int, int, int]]] = {t: [] for t in temps}  # (entry, first call, last call)
    for e, entry in enumerate(prog.entries.values()):
        seen: dict[int, list[int]] = {}
        for i, call in enumerate(entry.calls):
            for s in call.args:
                if s in live:
                    seen.setdefault(s, [i, i])[1] = i
        for s, (lo, hi) in seen.items():
            live[s].append((e, lo, hi))

    size = {t: prog.slots[t].size * prog.slots[t].dtype.itemsize for t in temps}
    hosts: list[int] = []  # per buffer: its first slot (the biggest)
    # per buffer, per entrypoint: its slots' (first, last) calls, sorted; they never overlap, so a slot's
    # range meets one of them exactly when it meets the last one starting at or before the range's end
    # (a bisection: testing the slot against every slot of every buffer took 0.4-1.3 s of a Qwen2 load)
    busy: list[dict[int, list[tuple[int, int]]]] = []
    out: dict[int, int] = {}

    def meets(ranges: dict[int, list[tuple[int, int]]], t: int) -> bool:
        for e, lo, hi in live[t]:
            taken = ranges.get(e, ())
            k = bisect.bisect_left(taken, (hi + 1,))  # the ranges starting at or before hi
            if k and taken[k - 1][1] >= lo:
                return True
        return False

    for t in sorted(temps, key=lambda t: -size[t]):
        home = next((k for k, h in enumerate(hosts) if prog.slots[h].dtype == prog.slots[t].dtype
                     and not meets(busy[k], t)), None)
        if home is None:
            home = len(hosts)
            hosts.append(t)
            busy.append({})
        else:
            out[t] = hosts[home]
        for e, lo, hi in live[t]:
            bisect.insort(busy[home].setdefault(e, []), (lo, hi))
    return out


def _launcher(program: Any, hs: list, var_vals: tuple[int, ...]) -> Any:
    """A call of `program` over these handles and values with no arguments: its own `bind` where the backend
    has one, else a call of the program over the handle list (which a rebind patches in place)."""
    bind = getattr(program, "bind", None)
    return bind(hs, var_vals) if bind is not None else functools.partial(program, hs, var_vals, False)


class Executor:
    """The buffers and compiled programs of one Model; `run` an entrypoint, `take` its outputs."""

    def __init__(self, prog: Program, data: dict[int, Any], device: str, runtime: Any, adopt: bool = False):
        """`data`: a slot's initial value (a host array, or a Buffer copied in). With `adopt`, the caller hands
        the Buffers over (nothing else will read or write them: polygrad_hf's loader, whose weight tensors die
        with the load): a writable one of a parameter or state slot, of the slot's device, dtype and size,
        becomes the slot's buffer instead of being copied, each Buffer for one slot only (two slots of one
        Buffer would alias)."""
        self.prog = prog
        self.device = device
        self.runtime = runtime
        hosts = share_temporaries(prog)
        self.bufs: list[Buffer] = [Buffer(device, s.size, s.dtype) if hosts.get(i, i) == i else None  # type: ignore
                                   for i, s in enumerate(prog.slots)]
        for s, host in hosts.items():
            self.bufs[s] = self.bufs[host]
        adopted: set[int] = set()
        for s, arr in data.items():
            if isinstance(arr, Buffer) and arr.readonly and prog.slots[s].role != "parameter":
                # adopted read-only memory (a mapped weight file): nothing writes it, so the Model uses it
                # where it is instead of holding a second copy (a parameter is trained: it gets its own)
                self.bufs[s] = arr
            elif adopt and isinstance(arr, Buffer) and prog.slots[s].role in ("parameter", "state") \
                    and not arr.readonly and id(arr) not in adopted and arr.device == device \
                    and arr.dtype == prog.slots[s].dtype and arr.size == prog.slots[s].size:
                adopted.add(id(arr))
                self.bufs[s] = arr
            elif isinstance(arr, Buffer):
                realize.copy_buffer(self.bufs[s], arr)
            else:
                self.bufs[s].copyin(arr)
        for s, slot in enumerate(prog.slots):
            if slot.role == "cache":  # zeroed as it is allocated (a fresh map: the system's zero pages, which
                # become resident only as far as the positions used; no host array of zeros copied in)
                if self.bufs[s].is_allocated:
                    self.bufs[s].copyin(np.zeros(slot.size, dtype=slot.dtype.np))
                self.bufs[s].ensure_allocated()
        self.programs: dict[int, Any] = {}
        self.plans: dict[str, list] = {}
        # slot -> where its handle sits: (a plan's handle list, position, that plan's launchers, launch index)
        self.refs: dict[int, list[tuple[list, int, list, int]]] = {}
        self.launchers: dict[str, list] = {}  # per entrypoint, per launch: its bound launcher, None to make
        # per entrypoint: its plan as launch plans and copies (launch_plans), None where the programs have none
        self.segments: dict[str, list | None] = {}
        self.segment_refs: dict[int, list[tuple[Any, int, int]]] = {}  # slot -> (launch plan, launch, position)
        self.unwritten: set[int] | None = None  # outputs a call may leave partly unwritten (unwritten_outputs)

    def reset(self) -> None:
        """Forget every compiled program and plan (the slots or kernels were renumbered)."""
        self.programs, self.plans, self.refs, self.launchers, self.unwritten = {}, {}, {}, {}, None
        self.segments, self.segment_refs = {}, {}

    def replan(self) -> None:
        """Forget the plans (entrypoints changed; the kernels kept their numbers)."""
        self.plans.clear()
        self.launchers.clear()
        self.segments.clear()
        self.segment_refs.clear()
        self.unwritten = None

    def program(self, k: int) -> Any:
        prog = self.programs.get(k)
        if prog is None:
            prog = self.programs[k] = programs.get_program(self.prog.kernels[k], self.device)
        return prog

    def compile_kernels(self, ks: set[int]) -> None:
        """Compile the programs of kernels `ks` this Model has not looked up yet, together (on the CPU
        backend: one compile run of a few translation units side by side, where `program` alone runs the
        compiler once per kernel); `program` then finds them in the program cache."""
        todo = sorted(k for k in ks if k not in self.programs)
        if todo:
            programs.get_programs([self.prog.kernels[k] for k in todo], self.device)

    def plan(self, name: str) -> list:
        plan = self.plans.get(name)
        if plan is not None:
            return plan
        plan: list = []
        launchers: list = []
        calls = self.prog.entries[name].calls
        self.compile_kernels({c.kernel for c in calls if c.kernel >= 0})
        for call in calls:
            launchers.append(None)
            if call.kernel < 0:
                plan.append((None, call.args, ()))
                continue
            prog = self.program(call.kernel)
            hs = [self.bufs[s].handle for s in call.args]
            for pos, s in enumerate(call.args):
                self.refs.setdefault(s, []).append((hs, pos, launchers, len(plan)))
            plan.append((prog, hs, tuple(v.arg[0] for v in prog.spec.vars)))
        self.plans[name] = plan
        self.launchers[name] = launchers
        return plan

    def launch_plans(self, name: str, env: dict[str, int]) -> list | None:
        """Entrypoint `name`'s plan as a list of launch plans (each runs the kernels between two copies) and
        copies (a plan index), or None where a program has no `launch_plan` or cannot make one yet (the CPU
        pool library still building: asked again at the next call)."""
        if name in self.segments:
            return self.segments[name]
        plan = self.plan(name)
        make = next((getattr(p.program, "launch_plan", None) for p, _, _ in plan if p is not None), None)
        if make is None or any(p is not None and getattr(p.program, "launch_plan", None) is not make
                               for p, _, _ in plan):
            self.segments[name] = None
            return None
        out: list = []
        refs: list = []
        run: list[int] = []

        def close() -> bool:
            if not run:
                return True
            lp = make([(plan[i][0].program, plan[i][1], tuple(env[v] for v in plan[i][2])) for i in run])
            if lp is None:
                return False
            variables = [(k, plan[i][2]) for k, i in enumerate(run) if plan[i][2]]
            specs = [plan[i][0].spec for i in run]
            out.append((lp, variables, sum(sp.ops for sp in specs), sum(sp.mem_bytes for sp in specs)))
            for k, i in enumerate(run):
                for pos, s in enumerate(self.prog.entries[name].calls[i].args):
                    refs.append((s, (lp, k, pos)))
            run.clear()
            return True

        for i, (prog, _, _) in enumerate(plan):
            if prog is None:
                if not close():
                    return None
                out.append(i)
            else:
                run.append(i)
        if not close():
            return None
        for s, ref in refs:
            self.segment_refs.setdefault(s, []).append(ref)
        self.segments[name] = out
        return out

    def rebind(self, s: int, buf: Buffer) -> None:
        h = buf.handle
        for hs, pos, launchers, i in self.refs.get(s, ()):
            hs[pos] = h
            launchers[i] = None
        for lp, i, pos in self.segment_refs.get(s, ()):
            lp.set_handle(i, pos, h)

    def run(self, name: str, feeds: dict[int, Any], env: dict[str, int]) -> None:
        """Run entrypoint `name` with {slot: Buffer or flat host array} fed and the Variables' values."""
        realize.flush_deferred()  # launches held back before this call (realize.deferred()) run first
        entry = self.prog.entries[name]
        plan = self.plan(name)
        patched = []
        for s, value in feeds.items():
            # the caller's own buffer, bound; unless it is one of this model's (a parameters() view), which a
            # kernel of this call may write before the input is read
            if isinstance(value, Buffer) and value.size >= self.bufs[s].size and value not in self.bufs:
                self.rebind(s, value)
                patched.append(s)
            elif isinstance(value, Buffer):  # fewer rows than the slot: a kernel may read up to its capacity
                realize.copy_buffer(self.bufs[s], value)
            else:
                self.bufs[s].copyin_prefix(value)
        for s in entry.rng:
            self.bufs[s].copyin(np.array(self.prog.rng, dtype=np.uint32))
            self.prog.rng[1] = (self.prog.rng[1] + 1) & 0xFFFFFFFF
        note_overwrite()  # its programs write into buffers that may hold values (schedule/computed.py)
        segments = self.launch_plans(name, env)
        t0 = time.perf_counter()
        try:
            if segments is not None:
                n, ops, mem = self._run_plans(segments, plan, feeds, patched, env)
            else:
                n, ops, mem = self._run_launches(plan, self.launchers[name], feeds, patched, env)
        finally:
            for s in patched:
                self.rebind(s, self.bufs[s])
        programs.count_kernels(n, ops, mem, time.perf_counter() - t0)

    def _run_plans(self, segments: list, plan: list, feeds: dict, patched: list, env: dict) -> tuple[int, int, int]:
        """Run launch plans and copies (launch_plans); (kernels, ops, bytes)."""
        n = ops = mem = 0
        for seg in segments:
            if isinstance(seg, int):  # a copy
                dst, src = (feeds[s] if s in patched else self.bufs[s] for s in plan[seg][1])
                realize.copy_buffer(dst, src)
                continue
            lp, variables, seg_ops, seg_mem = seg
            for k, names in variables:
                lp.set_vars(k, tuple(env[v] for v in names))
            lp()
            n, ops, mem = n + lp.n, ops + seg_ops, mem + seg_mem
        return n, ops, mem

    def _run_launches(self, plan: list, launchers: list, feeds: dict, patched: list, env: dict) -> tuple[int, int, int]:
        """Run the plan one launch at a time, through bound launchers; (kernels, ops, bytes)."""
        n = ops = mem = 0
        for i, (prog, hs, names) in enumerate(plan):
            if prog is None:
                dst, src = (feeds[s] if s in patched else self.bufs[s] for s in hs)
                realize.copy_buffer(dst, src)
                continue
            launch = launchers[i]
            if launch is None:
                launch = launchers[i] = _launcher(prog.program, hs, tuple(env[v] for v in names))
                if names:  # a Variable's value changes between calls: bound for this call only
                    launchers[i] = None
            launch()
            n, ops, mem = n + 1, ops + prog.spec.ops, mem + prog.spec.mem_bytes
        return n, ops, mem

    def unwritten_outputs(self) -> set[int]:
        """Output slots that some entrypoint reads, or returns, without a proven full write before
        (uop/dataflow.py): their fresh buffers start zeroed. Temporaries and the rest start zeroed once,
        when first allocated, so a program only ever sees its own data."""
        if self.unwritten is None:
            p = self.prog
            flows = program_flow(p.slots, p.kernels, p.entries, p.variables)
            self.unwritten = {s for f in flows.values() for s in f.exposed if p.slots[s].role == "output"}
        return self.unwritten

    def take(self, s: int, shape: tuple[int | str, ...], env: dict[str, int]) -> Any:
        """The output buffer of slot s as a Tensor the caller keeps; the slot gets a fresh buffer."""
        buf = self.bufs[s]
        fresh = Buffer(self.device, buf.size, buf.dtype).ensure_allocated(written=s not in self.unwritten_outputs())
        self.bufs[s] = fresh
        self.rebind(s, fresh)
        full = tuple(self.prog.variables[d][1] if isinstance(d, str) else d for d in shape)
        now = tuple(env[d] if isinstance(d, str) else d for d in shape)
        if now == full:
            return Tensor(_buffer_uop(buf, full), _runtime=self.runtime)._as_leaf()
        # the buffer holds the Variables' maxima; this call's result is its first prod(now) elements, row-major
        t = Tensor(_buffer_uop(buf, (buf.size,)), _runtime=self.runtime)._as_leaf()
        return t.shrink(((0, int(np.prod(now, dtype=np.int64))),)).reshape(now)
