"""The JIT: capture the kernels a function runs once, then replay them with new input buffers.

Stage: execution. Input: a Python function over Tensors. Output: the same results, computed on later
calls by launching the captured programs directly, with no scheduling, lowering or compiling.

The behaviour follows tinygrad's `TinyJit`:
  call 1   runs the function normally (kernels compile, lazy parameters get realized);
  call 2   runs it again while `realize.capture_hooks` records every (program, buffers) launched;
  call 3+  checks the inputs match what was captured (shape, dtype, device), swaps the new input
           buffers into the recorded argument lists and launches the programs in order.
Random numbers drawn inside the function (Tensor.rand, Dropout) are fresh on every replay: the key
buffers the capture made are refilled from the global RNG counter before each replay.
Replays return the very Tensor objects the capture returned, whose buffers the replay overwrote
(as tinygrad does): copy a result (`.numpy()`, `.clone().realize()`) before the next call if you
need to keep it. Work the function does outside kernels (Python side effects, `.numpy()` reads,
host-to-device data made inside it) is not replayed.
Symbolic sizes (tinygrad's `Variable.bind` pattern): an input of shape (v.bind(n), 16), or a bound
variable passed as an argument, may take a new value on every call without a new capture. Each
captured launch keeps the variable values it ran with; a replay reads the new values off the inputs
and hands them to the programs, and the returned tensors' shapes are rebound to them.

>>> from polygrad import Tensor, jit
>>> @jit
... def step(x):
...     return (x + 1).realize()
>>> [step(Tensor([i, i, i])).numpy().tolist() for i in range(3)]
[[1, 1, 1], [2, 2, 2], [3, 3, 3]]
"""
from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from polygrad import config
from polygrad.device import Buffer, GlobalCounters
from polygrad.engine import realize
from polygrad.errors import PolygradError
from polygrad.uop import sint
from polygrad.uop.ops import Ops, UOp


class JitError(PolygradError, RuntimeError):
    """A jitted function was called in a way its captured kernels cannot serve."""


@dataclass
class CapturedStep:
    """One launch recorded during capture: a program (None for a device copy) and its buffers."""

    program: Any  # realize.CompiledProgram, or None for a copy
    buffers: list[Buffer]
    input_slots: list[tuple[int, int]]  # (position in buffers, input index) to patch on replay
    handles: list[Any]  # the buffers' device handles, patched with the inputs' on replay
    var_vals: dict = field(default_factory=dict)  # {DEFINE_VAR: value} the launch ran with
    var_args: tuple = ()  # those values as the program's int arguments (spec.vars order)


_capturing: list["TinyJit"] = []


def note_rng_key(t: Any) -> None:
    """Called by polygrad.random for each key tensor it makes: a capturing JIT refills it on replay."""
    if _capturing:
        _capturing[-1].rng_keys.append(t)


def _input_tensors(args: tuple, kwargs: dict) -> list[tuple[Any, Any]]:
    """(name, Tensor) for every Tensor passed directly as a positional or keyword argument."""
    from polygrad.tensor import Tensor
    named = [(i, a) for i, a in enumerate(args) if isinstance(a, Tensor)]
    named += [(k, kwargs[k]) for k in sorted(kwargs) if isinstance(kwargs[k], Tensor)]
    return named


def _buffer_of(t: Any) -> Buffer:
    u = t.uop
    while u.op is Ops.RESHAPE:  # x.reshape(v.bind(n), 16) of a realized x is two reshapes
        u = u.src[0]
    if u.op is not Ops.BUFFER:
        raise JitError(f"JIT input {t!r} is not backed by a contiguous buffer after realize()")
    return u.arg.ensure_allocated()


def _prepare_inputs(args: tuple, kwargs: dict) -> tuple[list[Buffer], list[tuple], dict[UOp, int]]:
    """Realize the input tensors; return their buffers, the (name, shape, dtype, device) they had (shapes
    with their variables unbound) and this call's variable values (from those shapes and from the
    bound variables, v.bind(n), passed directly as arguments)."""
    from polygrad.tensor import Tensor, _is_realized
    named = _input_tensors(args, kwargs)
    pending = [t for _, t in named if not _is_realized(t.uop)]
    if pending:
        Tensor.realize_all(*pending)
    buffers = [_buffer_of(t) for _, t in named]
    if len({id(b) for b in buffers}) != len(buffers):
        raise JitError("the same realized buffer was passed as two JIT inputs; pass distinct tensors "
                       "(x.clone().realize() makes a copy)")
    var_vals: dict[UOp, int] = {}
    info = []
    for name, t in named:
        shape = t.shape
        if sint.has_sym(shape):
            sint.collect_binds(t.uop, var_vals)
            shape = sint.strip_binds(shape, {})
        info.append((name, shape, t.dtype, t.device))
    for k, a in list(enumerate(args)) + sorted(kwargs.items()):
        if isinstance(a, UOp) and a.op is Ops.BIND:
            sint.record(var_vals, *a.unbind())
            info.append((k, "variable", a.src[0]))
    return buffers, info, var_vals


def _result_tensors(ret: Any) -> list[Any]:
    """The Tensors inside a function's return value (a Tensor, or lists/tuples/dicts of them)."""
    from polygrad.tensor import Tensor
    if isinstance(ret, Tensor):
        return [ret]
    if isinstance(ret, (list, tuple)):
        return [t for r in ret for t in _result_tensors(r)]
    if isinstance(ret, dict):
        return [t for r in ret.values() for t in _result_tensors(r)]
    return []


class TinyJit:
    """Wrap `fn` so its third and later calls replay the kernels captured on the second call.

    Inputs are the Tensors passed directly as arguments; their shapes, dtypes and devices must stay
    the same across calls (a new shape raises JitError), and one buffer may not be passed twice.
    Non-Tensor arguments are not checked: the captured kernels baked in the values of the capture.
    """

    def __init__(self, fn: Callable[..., Any]):
        self.fn = fn
        self.calls = 0
        self.replays = 0
        self.captures = 0
        self.steps: list[CapturedStep] = []
        self.expected: list[tuple] | None = None
        self.ret: Any = None
        self.replay_ops = 0
        self.replay_mem = 0
        self.disposed = False
        self.rng_keys: list[Any] = []  # key tensors made during capture (Tensors until capture ends)
        functools.update_wrapper(self, fn)  # type: ignore[arg-type]

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        """Jitted methods: bind the instance like a plain function would."""
        return self if obj is None else functools.partial(self.__call__, obj)

    # ---- the three phases
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.disposed:
            raise JitError("this jitted function was disposed; wrap the function again to use it")
        if _capturing:  # called inside another capture: run plainly so the outer JIT records it
            return self.fn(*args, **kwargs)
        buffers, info, var_vals = _prepare_inputs(args, kwargs)
        self.calls += 1
        if self.calls == 1:
            return self._run_plain(args, kwargs)
        if not self.steps and self.expected is None:
            return self._capture(args, kwargs, buffers, info)
        return self._replay(buffers, info, var_vals)

    def _run_plain(self, args: tuple, kwargs: dict) -> Any:
        from polygrad.tensor import Tensor
        ret = self.fn(*args, **kwargs)
        outs = _result_tensors(ret)
        if outs:
            Tensor.realize_all(*outs)
        return ret

    def _capture(self, args: tuple, kwargs: dict, buffers: list[Buffer], info: list[tuple]) -> Any:
        recorded: list[tuple[Any, list[Buffer]]] = []
        self.rng_keys = []

        def hook(item: tuple, bufs: list[Buffer]) -> None:
            vals = dict(item[2]) if len(item) > 2 else {}
            recorded.append((item[1] if item[0] == "kernel" else None, list(bufs), vals))

        realize.capture_hooks.append(hook)
        _capturing.append(self)
        try:
            ret = self._run_plain(args, kwargs)
        finally:
            _capturing.remove(self)
            realize.capture_hooks.remove(hook)
        if not recorded:
            raise JitError("the jitted function ran no kernels; return realized tensors (x.realize()) "
                           "or call it without @jit")
        where = {id(b): k for k, b in enumerate(buffers)}
        for program, bufs, vals in recorded:
            slots = [(pos, where[id(b)]) for pos, b in enumerate(bufs) if id(b) in where]
            var_args = program.var_args(vals) if program is not None else ()
            self.steps.append(CapturedStep(program, bufs, slots, [b.handle for b in bufs], vals, var_args))
        self.expected = info
        self.ret = ret
        self.captures += 1
        captured = {id(b) for s in self.steps for b in s.buffers}
        keys = [_buffer_of(t) for t in self.rng_keys if t.uop.op in (Ops.BUFFER, Ops.RESHAPE)]
        self.rng_keys = [b for b in keys if id(b) in captured]
        kernels = [s.program for s in self.steps if s.program is not None]
        self.replay_ops = sum(p.spec.ops for p in kernels)
        self.replay_mem = sum(p.spec.mem_bytes for p in kernels)
        if config.get("DEBUG") >= 1:
            print(f"JIT captured {len(kernels)} kernels and {len(self.steps) - len(kernels)} copies "
                  f"over {len(buffers)} inputs")
        return ret

    def _replay(self, buffers: list[Buffer], info: list[tuple], var_vals: dict | None = None) -> Any:
        if info != self.expected:
            raise JitError(f"JIT inputs changed since capture: expected (name, shape, dtype, device) "
                           f"{self.expected}, got {info}; call a new @jit function for other shapes")
        debug = config.get("DEBUG") >= 1
        t0 = time.perf_counter()
        if self.rng_keys:
            from polygrad.random import next_key_values
            for key in self.rng_keys:
                key.copyin(next_key_values())
        handles = [b.handle for b in buffers]
        for step in self.steps:
            bufs, hs = step.buffers, step.handles
            for pos, k in step.input_slots:
                bufs[pos] = buffers[k]
                hs[pos] = handles[k]
            if step.program is None:
                realize.copy_buffer(bufs[0], bufs[1])
            elif debug:
                step.program(bufs, {**step.var_vals, **var_vals} if var_vals else step.var_vals)
            else:
                va = step.program.var_args({**step.var_vals, **var_vals}) if var_vals and step.var_args \
                    else step.var_args
                step.program.program(hs, va, False)
        if not debug:
            n = sum(1 for s in self.steps if s.program is not None)
            GlobalCounters.kernel_count += n
            GlobalCounters.global_ops += self.replay_ops
            GlobalCounters.global_mem += self.replay_mem
            GlobalCounters.time_sum_s += time.perf_counter() - t0
            realize.runtime_stats["kernels_run"] += n
        self.replays += 1
        if var_vals:  # the results' symbolic shapes follow this call's values
            for t in _result_tensors(self.ret):
                if sint.has_sym(t.shape):
                    t.uop = sint.rebind(t.uop, var_vals)
        return self.ret

    # ---- introspection and cleanup
    def stats(self) -> dict[str, Any]:
        """Wrapper-level counters: calls, captures, replays, and what the capture holds."""
        kernels = sum(1 for s in self.steps if s.program is not None)
        return {"calls": self.calls, "captures": self.captures, "replays": self.replays,
                "captured_kernels": kernels, "captured_copies": len(self.steps) - kernels,
                "captured_buffers": len({id(b) for s in self.steps for b in s.buffers}),
                "state": "disposed" if self.disposed else ("captured" if self.expected is not None else "warmup")}

    def reset(self) -> None:
        """Forget the capture: the next call runs plainly and the one after captures again."""
        self.calls = 0
        self.steps = []
        self.expected = None
        self.ret = None
        self.rng_keys = []

    def dispose(self) -> None:
        """Release the captured programs and buffers; later calls raise JitError."""
        self.reset()
        self.disposed = True


def jit(fn: Callable[..., Any]) -> TinyJit:
    """Decorator form of TinyJit: `@jit def step(x): ...`."""
    return TinyJit(fn)


class CompiledCallable:
    """A function whose warm-up and capture already ran on sample inputs; `run(inputs)` replays.

    Inputs are a list (or tuple) of Tensors with the sample inputs' shapes, dtypes and devices.
    `run` returns the function's result objects, overwritten in place on every call (see TinyJit).
    """

    def __init__(self, fn: Callable[..., Any], sample_inputs: Any):
        self.jit = TinyJit(fn)
        samples = _as_list(sample_inputs)
        self.jit(*samples)
        self.jit(*samples)

    def run(self, inputs: Any) -> Any:
        """Replay the captured kernels on `inputs` (a list of Tensors, or one Tensor)."""
        if self.jit.disposed:
            raise JitError("this CompiledCallable was disposed; call polygrad.compile() again")
        return self.jit(*_as_list(inputs))

    __call__ = run

    def stats(self) -> dict[str, Any]:
        """Capture and replay counters (warm-up and capture count as the first two calls)."""
        return self.jit.stats()

    def dispose(self) -> None:
        """Release captured programs and buffers; `run` raises afterwards."""
        self.jit.dispose()


def _as_list(inputs: Any) -> list[Any]:
    from polygrad.tensor import Tensor
    if isinstance(inputs, Tensor):
        return [inputs]
    if not isinstance(inputs, (list, tuple)):
        raise TypeError(f"inputs must be a list of Tensors, got {type(inputs).__name__}")
    return list(inputs)


def compile(fn: Callable[..., Any], sample_inputs: Any) -> CompiledCallable:  # noqa: A001 (spec name)
    """Warm up and capture `fn` on `sample_inputs` now; returns a CompiledCallable.

    The function runs twice on the samples (warm-up, then capture), so side effects such as
    optimizer steps happen twice.

    >>> from polygrad import Tensor, compile
    >>> f = compile(lambda x: (x * 2).realize(), [Tensor([1.0, 2.0]).realize()])
    >>> f.run([Tensor([3.0, 4.0]).realize()]).numpy().tolist()
    [6.0, 8.0]
    """
    return CompiledCallable(fn, sample_inputs)
