"""The JIT: capture the kernels a function runs once, then replay them with new input buffers.

Stage: execution (above Tensor: it builds on the Tensor class and the capture layer). Input: a Python
function over Tensors. Output: the same results, computed on later calls by launching the captured
programs directly, with no scheduling, lowering or compiling.

The behaviour follows tinygrad's `TinyJit`:
  call 1   runs the function normally (kernels compile, lazy parameters get realized);
  call 2   runs it again inside `engine.capture.capture()`, which records every kernel and copy
           launched; the record becomes a CapturedGraph with the input tensors' buffers as inputs;
  call 3+  checks the inputs match what was captured (shape, dtype, device) and replays the graph:
           the new input buffers are swapped into the recorded argument lists and the programs
           launch in order.
Symbolic sizes (tinygrad's `Variable.bind` pattern): an input of shape (v.bind(n), 16), or a bound
variable passed as an argument, may take a new value on every call without a new capture. Each
captured launch keeps the variable values it ran with; a replay reads the new values off the inputs
and hands them to the programs, and the returned tensors' shapes are rebound to them.
Random numbers drawn inside the function (Tensor.rand, Dropout) are fresh on every replay: the key
buffers the capture saw are refilled from the global RNG counter before each replay.
Inputs are the Tensors among the arguments, also inside lists, tuples and dicts (as tinygrad finds
them). Every other argument is part of the capture's key: a call with a different value (compared by
value for numbers, strings and containers of them, by identity for other objects) starts over with a
warm-up run and a new capture, since the captured kernels baked the old value in. A host readback
(`.numpy()`, `.item()`, `.tolist()`) while capturing raises JitError, and so does a jitted function
that calls itself.
Replays return the very Tensor objects the capture returned, whose buffers the replay overwrote
(as tinygrad does): copy a result (`.numpy()`, `.clone().realize()`) before the next call if you
need to keep it. Work the function does outside kernels (Python side effects, `.numpy()` reads,
host-to-device data made inside it) is not replayed.

>>> from polygrad import Tensor, jit
>>> @jit
... def step(x):
...     return (x + 1).realize()
>>> [step(Tensor([i, i, i])).numpy().tolist() for i in range(3)]
[[1, 1, 1], [2, 2, 2], [3, 3, 3]]
"""
from __future__ import annotations

import functools
import threading
from typing import Any, Callable

from polygrad import config
from polygrad.device import Buffer
from polygrad.engine.capture import CapturedGraph, capture, recording
from polygrad.errors import PolygradError
from polygrad.tensor import Tensor, _is_realized
from polygrad.tensor_common import guarded
from polygrad.uop import sint
from polygrad.uop.ops import Ops, UOp


class JitError(PolygradError, RuntimeError):
    """A jitted function was called in a way its captured kernels cannot serve."""


class _Same:
    """A non-Tensor argument of no value type, compared by identity in the capture key."""

    __slots__ = ("obj",)

    def __init__(self, obj: Any):
        self.obj = obj

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, _Same) and other.obj is self.obj

    def __hash__(self) -> int:
        return id(self.obj)

    def __repr__(self) -> str:
        return f"<{type(self.obj).__name__} object at {id(self.obj):#x}>"


_VALUE_TYPES = (int, float, complex, str, bytes, bool, type(None))


def _walk_args(value: Any, path: str, tensors: list[tuple[str, Any]], binds: list[tuple[str, UOp]]) -> Any:
    """The capture-key form of an argument; Tensors found inside lists, tuples and dicts are appended
    to `tensors` with their path (`0`, `1[2]`, `opts['x']`), bound Variables to `binds`."""
    if isinstance(value, Tensor):
        tensors.append((path, value))
        return ("tensor",)
    if isinstance(value, UOp) and value.op is Ops.BIND:
        binds.append((path, value))
        return ("variable", value.src[0])
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_walk_args(v, f"{path}[{i}]", tensors, binds)
                                            for i, v in enumerate(value)))
    if isinstance(value, dict):
        items = sorted(value.items(), key=lambda kv: repr(kv[0]))
        return ("dict", tuple((repr(k), _walk_args(v, f"{path}[{k!r}]", tensors, binds)) for k, v in items))
    if isinstance(value, float):
        return ("float", repr(value))  # nan equals itself, -0.0 differs from 0.0
    if isinstance(value, _VALUE_TYPES):
        return (type(value).__name__, value)
    return _Same(value)


def _input_tensors(args: tuple, kwargs: dict) -> tuple[list[tuple[str, Any]], list[tuple[str, UOp]], tuple]:
    """(path, Tensor) for every Tensor among the arguments (nested in lists, tuples and dicts too),
    (path, BIND) for bound Variables, and the key of every other argument's value."""
    tensors: list[tuple[str, Any]] = []
    binds: list[tuple[str, UOp]] = []
    key = tuple(_walk_args(a, str(i), tensors, binds) for i, a in enumerate(args))
    key += tuple((k, _walk_args(kwargs[k], k, tensors, binds)) for k in sorted(kwargs))
    return tensors, binds, key


def _buffer_of(t: Any) -> Buffer:
    u = t.uop
    while u.op is Ops.RESHAPE:  # x.reshape(v.bind(n), 16) of a realized x is two reshapes
        u = u.src[0]
    if u.op is not Ops.BUFFER:
        raise JitError(f"JIT input {t!r} is not backed by a contiguous buffer after realize()")
    return u.arg.ensure_allocated()


def _prepare_inputs(args: tuple, kwargs: dict) -> tuple[list[Buffer], list[tuple], dict[UOp, int], tuple]:
    """Realize the input tensors; return their buffers, the (path, shape, dtype, device) they had (shapes
    with their variables unbound), this call's variable values (from those shapes and from the bound
    variables, v.bind(n), among the arguments) and the key of the other arguments."""
    named, binds, key = _input_tensors(args, kwargs)
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
    for name, b in binds:
        sint.record(var_vals, *b.unbind())
        info.append((name, "variable", b.src[0]))
    return buffers, info, var_vals, key


class _NoReadback:
    """Guards this thread's reads while TinyJit captures (tensor_common.guarded): a host read would be frozen
    into the replay."""

    def read(self, t: Any, call: str) -> None:
        raise JitError(f"Tensor.{call}() was called while TinyJit captured the function; replays run only the "
                       f"captured kernels, so the value read here would never change again. Return the tensor "
                       f"and call .{call}() outside the jitted function, or do not @jit this function")

    def assign(self, t: Any) -> None:
        pass  # an assign is a kernel: it is captured and replayed like any other


def _result_tensors(ret: Any) -> list[Any]:
    """The Tensors inside a function's return value (a Tensor, or lists/tuples/dicts of them)."""
    if isinstance(ret, Tensor):
        return [ret]
    if isinstance(ret, (list, tuple)):
        return [t for r in ret for t in _result_tensors(r)]
    if isinstance(ret, dict):
        return [t for r in ret.values() for t in _result_tensors(r)]
    return []


def _result_buffer(t: Any) -> Buffer | None:
    """The buffer behind a realized result tensor (None for a view that is not a whole buffer)."""
    u = t.uop.src[0] if t.uop.op is Ops.RESHAPE else t.uop
    return u.arg if u.op is Ops.BUFFER else None


class TinyJit:
    """Wrap `fn` so its third and later calls replay the kernels captured on the second call.

    Inputs are the Tensors among the arguments, directly or inside lists, tuples and dicts; their
    shapes, dtypes and devices must stay the same across calls (a new shape raises JitError), and one
    buffer may not be passed twice. A change in any other argument starts a new warm-up and capture.
    """

    def __init__(self, fn: Callable[..., Any]):
        self.fn = fn
        self.calls = 0
        self.replays = 0
        self.captures = 0
        self.graph: CapturedGraph | None = None
        self.expected: list[tuple] | None = None
        self.static_key: tuple | None = None  # the non-Tensor arguments of the capture
        self.ret: Any = None
        self.disposed = False
        self._running = threading.Lock()  # held by the call under way (a second one raises)
        # (input nodes, _prepare_inputs' result) of the last replay whose arguments were all Tensors
        self._last_inputs: tuple[tuple[UOp, ...], tuple] | None = None
        functools.update_wrapper(self, fn)  # type: ignore[arg-type]

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        """Jitted methods: bind the instance like a plain function would."""
        return self if obj is None else functools.partial(self.__call__, obj)

    # ---- the three phases
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.disposed:
            raise JitError("this jitted function was disposed; wrap the function again to use it")
        if not self._running.acquire(blocking=False):  # taken and tested at once: two threads cannot both pass
            raise JitError(f"jitted function {getattr(self.fn, '__name__', self.fn)!r} called itself (or was called "
                           "from two threads at once); a capture cannot contain a replay of itself. Jit only the "
                           "outermost function, and give each thread its own")
        try:
            if recording.captures:  # called inside this thread's capture: run plainly so that capture records it
                return self.fn(*args, **kwargs)
            buffers, info, var_vals, key = self._inputs(args, kwargs)
            if self.graph is not None and key != self.static_key:
                if config.get("DEBUG") >= 1:
                    print("JIT non-Tensor arguments changed since capture: warming up and capturing again")
                self.reset()  # the captured kernels baked the old values in
            self.calls += 1
            if self.calls == 1:
                return self._run_plain(args, kwargs)
            if self.graph is None:
                return self._capture(args, kwargs, buffers, info, key)
            return self._replay(buffers, info, var_vals)
        finally:
            self._running.release()

    def _inputs(self, args: tuple, kwargs: dict) -> tuple[list[Buffer], list[tuple], dict[UOp, int], tuple]:
        """_prepare_inputs, remembered while replaying: arguments that are all Tensors over the very nodes
        (realized buffers) of the last replay give the same buffers, shapes, variable values and key, so
        the checks ran already (a training loop passing the same input tensors each step)."""
        last = self._last_inputs
        if last is not None and not kwargs and len(args) == len(last[0]):
            for a, n in zip(args, last[0]):
                if type(a) is not Tensor or a.uop is not n:
                    break
            else:
                for b in last[1][0]:
                    if b._handle is None:
                        break
                else:
                    return last[1]  # type: ignore[return-value]
        prepared = _prepare_inputs(args, kwargs)
        plain = self.graph is not None and not kwargs and all(type(a) is Tensor for a in args)
        self._last_inputs = (tuple(a.uop for a in args), prepared) if plain else None
        return prepared

    def _run_plain(self, args: tuple, kwargs: dict) -> Any:
        ret = self.fn(*args, **kwargs)
        outs = _result_tensors(ret)
        if outs:
            Tensor.realize_all(*outs)
        return ret

    def _capture(self, args: tuple, kwargs: dict, buffers: list[Buffer], info: list[tuple], key: tuple) -> Any:
        with guarded(_NoReadback()), capture() as cap:
            ret = self._run_plain(args, kwargs)
        if not cap.launches:
            raise JitError("the jitted function ran no kernels; return realized tensors (x.realize()) "
                           "or call it without @jit")
        outs = [b for b in map(_result_buffer, _result_tensors(ret)) if b is not None]
        self.graph = graph = cap.graph(inputs=buffers, outputs=outs)
        self.expected = info
        self.static_key = key
        self.ret = ret
        self.captures += 1
        if config.get("DEBUG") >= 1:
            print(f"JIT captured {graph.n_kernels} kernels and {graph.n_copies} copies "
                  f"over {len(buffers)} inputs")
        return ret

    def _replay(self, buffers: list[Buffer], info: list[tuple], var_vals: dict | None = None) -> Any:
        if info is not self.expected:
            if info != self.expected:
                raise JitError(f"JIT inputs changed since capture: expected (name, shape, dtype, device) "
                               f"{self.expected}, got {info}; call a new @jit function for other shapes")
            self.expected = info  # equal: the next call with these inputs compares by identity
        names = {v.arg[0]: n for v, n in var_vals.items()} if var_vals else None
        self.graph.launch(buffers, names, outputs=False)  # type: ignore[union-attr]  (the info check covers replay()'s)
        if var_vals:  # the results' symbolic shapes follow this call's values
            for t in _result_tensors(self.ret):
                if sint.has_sym(t.shape):
                    t.uop = sint.rebind(t.uop, var_vals)
        self.replays += 1
        return self.ret

    # ---- introspection and cleanup
    def stats(self) -> dict[str, Any]:
        """Wrapper-level counters: calls, captures, replays, and what the capture holds."""
        g = self.graph
        return {"calls": self.calls, "captures": self.captures, "replays": self.replays,
                "captured_kernels": g.n_kernels if g else 0, "captured_copies": g.n_copies if g else 0,
                "captured_buffers": len({s for x in g.launches for s in x.args}) if g else 0,
                "state": "disposed" if self.disposed else ("captured" if self.expected is not None else "warmup")}

    def reset(self) -> None:
        """Forget the capture: the next call runs plainly and the one after captures again."""
        self.calls = 0
        self.graph = None
        self.expected = None
        self.static_key = None
        self.ret = None
        self._last_inputs = None

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
