"""`Tensor`: the lazy, differentiable user API. Every op builds tensor-graph UOps; `realize()` runs them.

Stage: graph construction. Input: user calls. Output: UOp graphs handed to the scheduler.
The primitive ops live in `Tensor._alu`/movement/reduce; everything else is composed from them so
gradients come for free from `polygrad.gradient`.
"""
from __future__ import annotations

import itertools
import math
import weakref
from typing import Any, Iterable, Sequence

import numpy as np

from polygrad import config
from polygrad.device import Buffer, canonicalize
from polygrad.dtype import DType, dtype_of_python, dtypes, least_upper_dtype, least_upper_float, to_dtype
from polygrad.errors import DeviceError, RuntimeOwnershipError
from polygrad.gradient import compute_gradient
from polygrad.uop import movement as mv
from polygrad.uop import sint
from polygrad.uop.ops import Ops, UOp
from polygrad.uop.shape import ShapeError
from polygrad.tensor_activation import ActivationMixin
from polygrad.tensor_create import CreationMixin
from polygrad.tensor_math import MathMixin
from polygrad.tensor_movement import MovementMixin
from polygrad.tensor_reduce import ReduceMixin, accepts_dim
from polygrad.tensor_nn import NNMixin

_all_tensors: "weakref.WeakSet[Tensor]" = weakref.WeakSet()
_effect_ids = itertools.count(1)  # makes every assign a distinct UOp
# Model capture (polygrad/model.py) pushes a guard here: it rejects effectful reads (numpy, item,
# tolist) and assignments to parameters or inputs while the user's callable is being recorded
capture_guards: list[Any] = []


def _prod(xs: Iterable[int]) -> int:
    return sint.sprod(xs)  # an int, or a symbolic size when a dimension is one


def _buffer_uop(buf: Buffer, shape: tuple[int, ...]) -> UOp:
    u = UOp(Ops.BUFFER, buf.dtype, (), buf)
    return mv.reshape(u, shape) if shape != (buf.size,) else u


def _infer_list_dtype(data: Any) -> DType:
    flat = np.asarray(data, dtype=object).reshape(-1) if not isinstance(data, (int, float, bool)) else [data]
    kinds = {type(x) for x in flat}
    if kinds <= {bool, np.bool_}:
        return dtypes.bool
    if kinds <= {bool, int, np.bool_} or all(isinstance(x, (bool, int, np.integer)) for x in flat):
        return dtypes.default_int
    return dtypes.default_float


def _to_numpy(data: Any, dtype: DType | None) -> np.ndarray:
    if isinstance(data, np.ndarray):
        arr = data
        if dtype is not None:
            arr = _np_cast(arr, dtype)
        return arr
    if dtype is None:
        dtype = _infer_list_dtype(data) if (not isinstance(data, (list, tuple)) or len(data)) else dtypes.default_float
    try:
        if dtype is dtypes.bfloat16:
            return _np_cast(np.asarray(data, dtype=np.float32), dtype)
        return np.asarray(data, dtype=dtype.np)
    except (ValueError, TypeError) as e:
        raise ValueError(f"cannot build a tensor from {type(data).__name__}: {e}; "
                         "nested lists must be rectangular") from e


def _np_cast(arr: np.ndarray, dtype: DType) -> np.ndarray:
    if dtype is dtypes.bfloat16:
        if arr.dtype == np.uint16:
            return arr
        bits = np.ascontiguousarray(arr, dtype=np.float32).view(np.uint32).astype(np.uint64)
        rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)  # nearest even
        nan = (bits & 0x7FFFFFFF) > 0x7F800000
        return np.where(nan, ((bits >> 16) | 0x40).astype(np.uint16), rounded)
    return arr.astype(dtype.np, copy=False)


def _storage_to_numpy(flat: np.ndarray, dtype: DType) -> np.ndarray:
    if dtype is dtypes.bfloat16:
        return (flat.astype(np.uint32) << 16).view(np.float32)
    return flat


def _resolve_axis(axis: int, ndim: int) -> int:
    if not -max(ndim, 1) <= axis < max(ndim, 1):
        raise IndexError(f"axis {axis} is out of range for a tensor with {ndim} dimensions")
    return axis % max(ndim, 1)


class _TensorType(type):
    """Tensor's metaclass: `Tensor.training` reads and writes the TRAINING setting, so the two always agree."""

    @property
    def training(cls) -> bool:
        return bool(config.get("TRAINING"))

    @training.setter
    def training(cls, value: bool) -> None:
        config.set_value("TRAINING", int(bool(value)))


class Tensor(MathMixin, ActivationMixin, ReduceMixin, CreationMixin, MovementMixin, NNMixin, metaclass=_TensorType):
    """A lazily evaluated n-dimensional array with automatic differentiation.

    >>> Tensor([1.0, 2.0, 3.0]).mul(2).numpy().tolist()
    [2.0, 4.0, 6.0]
    """

    __slots__ = ("uop", "requires_grad", "grad", "_leaf", "_runtime", "_graph", "__weakref__")
    training = property(lambda self: bool(config.get("TRAINING")), doc="Training mode (the TRAINING setting).")

    def __init__(self, data: Any = None, device: str | None = None, dtype: Any = None,
                 requires_grad: bool | None = None, _runtime: Any = None):
        dtype = to_dtype(dtype) if dtype is not None else None
        self.requires_grad = requires_grad
        self.grad: Tensor | None = None
        self._leaf = True
        self._graph: UOp | None = None  # the lazy graph before realize(), kept so backward() still works
        if _runtime is None:
            from polygrad import runtime_context
            _runtime = runtime_context.current()
        self._runtime = _runtime
        if isinstance(data, UOp):
            self.uop = data
            self._leaf = False
        elif isinstance(data, Tensor):
            self.uop = data.uop if dtype is None else data.cast(dtype).uop
            self._leaf = False
        else:
            dev = canonicalize(device if device is not None else _default_device(_runtime))
            if isinstance(data, (bool, int, float)) and not isinstance(data, np.generic):
                dt = dtype or dtype_of_python(data)
                self.uop = UOp.const(dt, data, dev)
            elif data is None:
                self.uop = _buffer_uop(Buffer(dev, 0, dtype or dtypes.default_float), (0,))
            elif isinstance(data, (bytes, bytearray, memoryview)):
                arr = np.frombuffer(bytes(data), dtype=np.uint8)
                self.uop = _from_numpy(arr, dtype or dtypes.uint8, dev)
            else:
                if isinstance(data, np.generic):
                    data = np.asarray(data)
                arr = _to_numpy(data, dtype)
                dt = dtype or _dtype_from_numpy(arr)
                self.uop = _from_numpy(arr, dt, dev)
        _all_tensors.add(self)

    # ---------------------------------------------------------------------------------------------
    # properties
    @property
    def shape(self) -> tuple[int, ...]:
        return self.uop.shape

    @property
    def dtype(self) -> DType:
        return self.uop.dtype

    @property
    def device(self) -> str:
        return self.uop.device or canonicalize(None)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def numel(self) -> int:
        return _prod(self.shape)

    def size(self, dim: int | None = None):
        return self.shape if dim is None else self.shape[_resolve_axis(dim, self.ndim)]

    def element_size(self) -> int:
        return self.dtype.itemsize

    def nbytes(self) -> int:
        return self.numel() * self.element_size()

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __repr__(self) -> str:
        return f"<Tensor shape={self.shape} dtype={self.dtype} device={self.device}>"

    def __hash__(self) -> int:
        return id(self)

    def _new(self, uop: UOp) -> "Tensor":
        t = Tensor(uop, _runtime=self._runtime)
        return t

    # ---------------------------------------------------------------------------------------------
    # creation
    @staticmethod
    def empty(*shape: Any, dtype: Any = None, device: str | None = None, **kw: Any) -> "Tensor":
        shape = _shape_arg(shape)
        dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
        dev = canonicalize(device if device is not None else _default_device(kw.get("_runtime")))
        # a symbolic dimension allocates for its bound value (x.shape keeps the Variable); an unbound
        # Variable declares a size (Model inputs) and allocates for its maximum
        total = _prod(shape)
        bound = sint.resolve(total)
        buf = Buffer(dev, sint.vmax(total) if bound is None else bound, dt)
        return Tensor(_buffer_uop(buf, shape), requires_grad=kw.get("requires_grad"),
                      _runtime=kw.get("_runtime"))._as_leaf()

    def _as_leaf(self) -> "Tensor":
        self._leaf = True
        return self

    @staticmethod
    def full(shape: Any, fill_value: Any, dtype: Any = None, device: str | None = None, **kw: Any) -> "Tensor":
        shape = _shape_arg((shape,) if isinstance(shape, int) else tuple(shape))
        dt = to_dtype(dtype) if dtype is not None else dtype_of_python(fill_value)
        dev = canonicalize(device if device is not None else _default_device(kw.get("_runtime")))
        c = UOp.const(dt, fill_value, dev)
        u = mv.expand(mv.reshape(c, (1,) * len(shape)), shape) if shape else c
        return Tensor(u, requires_grad=kw.get("requires_grad"), _runtime=kw.get("_runtime"))._as_leaf()

    @staticmethod
    def zeros(*shape: Any, **kw: Any) -> "Tensor":
        return Tensor.full(_shape_arg(shape), 0.0, dtype=kw.pop("dtype", None) or dtypes.default_float, **kw)

    @staticmethod
    def ones(*shape: Any, **kw: Any) -> "Tensor":
        return Tensor.full(_shape_arg(shape), 1.0, dtype=kw.pop("dtype", None) or dtypes.default_float, **kw)

    @staticmethod
    def arange(start: Any, stop: Any = None, step: Any = 1, **kw: Any) -> "Tensor":
        if stop is None:
            start, stop = 0, start
        if step == 0:
            raise ValueError("arange: step must be non-zero")
        n = max(0, math.ceil((stop - start) / step))
        is_float = any(isinstance(v, float) for v in (start, stop, step))
        dt = to_dtype(kw.pop("dtype", None) or (dtypes.default_float if is_float else dtypes.default_int))
        if n == 0:
            return Tensor.empty(0, dtype=dt, **kw)
        idx = _iota(n, dt, kw)
        return (idx * step + start).cast(dt) if (step != 1 or start != 0) else idx

    @staticmethod
    def manual_seed(seed: int = 0) -> None:
        from polygrad import random
        random.manual_seed(seed)

    @staticmethod
    def rand(*shape: Any, dtype: Any = None, device: str | None = None, **kw: Any) -> "Tensor":
        from polygrad import random
        return random.rand(_shape_arg(shape), dtype=dtype, device=device, **kw)

    @staticmethod
    def randn(*shape: Any, dtype: Any = None, device: str | None = None, **kw: Any) -> "Tensor":
        from polygrad import random
        return random.randn(_shape_arg(shape), dtype=dtype, device=device, **kw)

    def full_like(self, fill_value: Any, **kw: Any) -> "Tensor":
        return Tensor.full(self.shape, fill_value, dtype=kw.pop("dtype", self.dtype),
                           device=kw.pop("device", self.device), _runtime=self._runtime, **kw)

    def zeros_like(self, **kw: Any) -> "Tensor":
        return self.full_like(0, **kw)

    def ones_like(self, **kw: Any) -> "Tensor":
        return self.full_like(1, **kw)

    # ---------------------------------------------------------------------------------------------
    # realization and data exchange
    def realize(self, *others: "Tensor") -> "Tensor":
        Tensor.realize_all(self, *others)
        return self

    @staticmethod
    def realize_all(*tensors: "Tensor") -> None:
        from polygrad.engine.realize import realize_uops
        todo = [t for t in tensors if not _is_realized(t.uop)]
        if not todo:
            return
        _check_runtimes(todo)
        olds = [t.uop for t in todo]
        news = realize_uops(olds)
        for t, old, new in zip(todo, olds, news):
            t._graph = old if old.op is not Ops.ASSIGN else None
            t.uop = new

    def _buffer(self) -> Buffer:
        """The Buffer behind a realized contiguous tensor."""
        self.realize()
        u = mv.strip_reshapes(self.uop)
        if u.op is not Ops.BUFFER:
            self.uop = self.contiguous().realize().uop
            return self._buffer()
        return u.arg

    def numpy(self) -> np.ndarray:
        if capture_guards:
            capture_guards[-1].read(self, "numpy")
        shape = sint.concrete_shape(self.shape)  # symbolic sizes read at their bound values
        if _prod(shape) == 0:
            return np.zeros(shape, dtype=self.dtype.np if self.dtype is not dtypes.bfloat16 else np.float32)
        prefix = _prefix_buffer(self.uop)
        flat = prefix.numpy() if prefix is not None else self._buffer().numpy()
        # a realized symbolic result fills a prefix of a buffer sized for the variables' maxima
        return _storage_to_numpy(flat[:_prod(shape)], self.dtype).reshape(shape)

    def data(self) -> memoryview:
        return memoryview(self.numpy())

    def item(self) -> Any:
        if capture_guards:
            capture_guards[-1].read(self, "item")
        if self.numel() != 1:
            raise ValueError(f"item() needs a tensor with one element, this one has shape {self.shape}")
        return self.numpy().reshape(()).item()

    def tolist(self) -> Any:
        if capture_guards:
            capture_guards[-1].read(self, "tolist")
        return self.numpy().tolist()

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        arr = self.numpy()
        return arr.astype(dtype) if dtype is not None else arr

    def copy_from(self, data: Any) -> "Tensor":
        """Write host data into this tensor's existing buffer (keeps identity for compiled replay)."""
        if capture_guards:
            capture_guards[-1].read(self, "copy_from")
        arr = np.asarray(data)
        if arr.size != self.numel():
            raise ValueError(f"copy_from: {arr.shape} has {arr.size} elements, tensor {self.shape} has {self.numel()}")
        if arr.ndim > 1 and arr.shape != self.shape:
            raise ValueError(f"copy_from: shape {arr.shape} does not match tensor shape {self.shape}")
        self._buffer().copyin(_np_cast(arr.reshape(-1), self.dtype))
        return self

    update_from = copy_from

    def assign(self, x: Any) -> "Tensor":
        """Write x into this tensor's buffer (in place, lazily)."""
        if capture_guards:
            capture_guards[-1].assign(self)
        if not isinstance(x, Tensor):
            x = Tensor(x, device=self.device, dtype=self.dtype, _runtime=self._runtime)
        if x.shape != self.shape:
            x = x.expand(self.shape) if x.ndim <= self.ndim else x
        if x.shape != self.shape:
            raise ShapeError(f"assign: value shape {x.shape} does not match {self.shape}")
        if x.device != self.device:
            raise DeviceError(f"assign: value is on {x.device}, tensor on {self.device}; use .to() first")
        if not _is_realized(self.uop) and not _is_view_of_realized(self.uop):
            self.realize()
        _check_runtimes([self, x])
        self.uop = UOp(Ops.ASSIGN, self.dtype, (self.uop, x.cast(self.dtype).uop), next(_effect_ids))
        return self

    def to(self, device: str) -> "Tensor":
        dev = canonicalize(device)
        if dev == self.device:
            return self
        t = self._new(UOp(Ops.COPY, self.dtype, (self.uop,), dev))
        t.requires_grad = self.requires_grad
        return t

    def contiguous(self) -> "Tensor":
        return self._new(UOp(Ops.CONTIGUOUS, self.dtype, (self.uop,)))

    def detach(self) -> "Tensor":
        return Tensor(UOp(Ops.DETACH, self.dtype, (self.uop,)), requires_grad=False, _runtime=self._runtime)

    def clone(self) -> "Tensor":
        return self.contiguous()

    # ---------------------------------------------------------------------------------------------
    # autograd
    def gradient(self, *targets: "Tensor", gradient: "Tensor | None" = None) -> list["Tensor"]:
        """d(self)/d(target) for each target, as new lazy tensors (no `.grad` is touched)."""
        if gradient is None:
            if self.numel() != 1:
                raise RuntimeError(f"gradient of a non-scalar tensor {self.shape} needs gradient= of the same shape")
            gradient = Tensor.full(self.shape, 1.0, dtype=self.dtype, device=self.device, _runtime=self._runtime)
        root, collapse = _autograd_graph(self.uop, set(targets))
        in_graph = set(root.toposort())
        keys = [t._graph if t._graph is not None and t._graph in in_graph else t.uop for t in targets]
        grads = compute_gradient(root, gradient.uop, set(keys))
        out = []
        for t, key in zip(targets, keys):
            g = grads.get(key)
            out.append(Tensor(_substitute(g, collapse), _runtime=self._runtime) if g is not None else t.zeros_like())
        return out

    def backward(self, gradient: "Tensor | None" = None) -> "Tensor":
        """Accumulate d(self)/d(leaf) into `.grad` of every tensor in the graph that wants a gradient."""
        wants = {t for t in list(_all_tensors) if t.dtype.is_float and
                 (t.requires_grad or (t.requires_grad is None and t._leaf))}
        root, collapse = _autograd_graph(self.uop, wants)
        in_graph = set(root.toposort())
        by_uop: dict[UOp, list[Tensor]] = {}
        for t in wants:
            # a tensor realized after this graph was built appears in it as its pre-realize graph
            for key in {t.uop, t._graph}:
                if key is not None and key in in_graph:
                    by_uop.setdefault(key, []).append(t)
        if not by_uop:
            raise RuntimeError("backward(): no tensor in this graph needs a gradient")
        if gradient is None:
            if self.numel() != 1:
                raise RuntimeError(f"backward() of a non-scalar tensor {self.shape} needs gradient=")
            gradient = Tensor.full(self.shape, 1.0, dtype=self.dtype, device=self.device, _runtime=self._runtime)
        grads = compute_gradient(root, gradient.uop, set(by_uop))
        for u, ts in by_uop.items():
            g = grads.get(u)
            if g is None:
                continue
            for t in ts:
                gt = Tensor(_substitute(g, collapse), _runtime=self._runtime)
                t.grad = gt if t.grad is None else t.grad + gt
        return self

    def requires_grad_(self, requires_grad: bool = True) -> "Tensor":
        self.requires_grad = requires_grad
        return self

    # ---------------------------------------------------------------------------------------------
    # primitive builders
    def _alu(self, op: Ops, *others: "Tensor") -> "Tensor":
        _check_runtimes([self, *others])
        devs = {t.device for t in (self, *others)}
        if len(devs) > 1:
            raise DeviceError(f"operands are on different devices {sorted(devs)}; move them with .to(device)")
        return self._new(self.uop.alu(op, *[o.uop for o in others]))

    def _broadcasted(self, y: Any, reverse: bool = False) -> tuple["Tensor", "Tensor"]:
        x = self
        if not isinstance(y, Tensor):
            if isinstance(y, (list, tuple, np.ndarray)):
                y = Tensor(y, device=self.device, _runtime=self._runtime)
            else:
                if isinstance(y, bool):
                    ydt = x.dtype
                elif isinstance(y, int):
                    ydt = x.dtype if x.dtype is not dtypes.bool else dtypes.default_int
                else:
                    ydt = x.dtype if x.dtype.is_float else dtypes.default_float
                y = Tensor(UOp.const(ydt, y, self.device), _runtime=self._runtime)
        if reverse:
            x, y = y, x
        out_dt = least_upper_dtype(x.dtype, y.dtype)
        x, y = x.cast(out_dt), y.cast(out_dt)
        shape = broadcast_shape(x.shape, y.shape)
        return x._broadcast_to(shape), y._broadcast_to(shape)

    def _broadcast_to(self, shape: tuple[int, ...]) -> "Tensor":
        if self.shape == shape:
            return self
        if self.ndim > len(shape):
            raise ShapeError(f"cannot broadcast {self.shape} to {shape}")
        padded = (1,) * (len(shape) - self.ndim) + self.shape
        return self.reshape(padded).expand(shape)

    def _binop(self, op: Ops, y: Any, reverse: bool = False) -> "Tensor":
        a, b = self._broadcasted(y, reverse)
        return a._alu(op, b)

    def cast(self, dtype: Any) -> "Tensor":
        dt = to_dtype(dtype)
        return self if dt == self.dtype else self._new(self.uop.cast(dt))

    def bitcast(self, dtype: Any) -> "Tensor":
        """Reinterpret the bits (torch's view(dtype)); between sizes the last axis grows or shrinks,
        little-endian, as in torch."""
        dt = to_dtype(dtype)
        if dt.itemsize == self.dtype.itemsize:
            return self if dt is self.dtype else self._new(UOp(Ops.BITCAST, dt, (self.uop,)))
        if dt is dtypes.bool or self.dtype is dtypes.bool:
            raise TypeError("bitcast to or from bool between sizes is not supported; cast to uint8 first")
        if self.ndim == 0:
            raise TypeError(f"bitcast from {self.dtype} to {dt} changes the element count; it needs at least 1 dim")
        return _bitcast_resize(self, dt)

    def float(self) -> "Tensor":
        return self.cast(dtypes.float32)

    def half(self) -> "Tensor":
        return self.cast(dtypes.float16)

    def int(self) -> "Tensor":
        return self.cast(dtypes.int32)

    def long(self) -> "Tensor":
        return self.cast(dtypes.int64)

    def bool(self) -> "Tensor":
        return self.cast(dtypes.bool)

    def double(self) -> "Tensor":
        return self.cast(dtypes.float64)

    # ---------------------------------------------------------------------------------------------
    # elementwise math
    def add(self, x: Any) -> "Tensor":
        return self._binop(Ops.ADD, x)

    def sub(self, x: Any) -> "Tensor":
        a, b = self._broadcasted(x)
        return a._alu(Ops.ADD, b._alu(Ops.NEG))

    def mul(self, x: Any) -> "Tensor":
        return self._binop(Ops.MUL, x)

    def div(self, x: Any, rounding_mode: str | None = None) -> "Tensor":
        a, b = self._broadcasted(x)
        if rounding_mode is None:
            a, b = a.cast(least_upper_float(a.dtype)), b.cast(least_upper_float(b.dtype))
            return a._alu(Ops.FDIV, b)
        if rounding_mode not in ("trunc", "floor"):
            raise ValueError(f"rounding_mode must be None, 'trunc' or 'floor', got {rounding_mode!r}")
        if a.dtype is dtypes.bool:
            a, b = a.cast(dtypes.default_int), b.cast(dtypes.default_int)
        if a.dtype.is_int:
            b = b.eq(0).where(1, b)  # integer division by zero traps in C; torch raises, we divide by 1
        if rounding_mode == "trunc":
            return a._alu(Ops.IDIV, b) if a.dtype.is_int else a._alu(Ops.FDIV, b).trunc()
        if rounding_mode == "floor":
            if a.dtype.is_int:
                q = a._alu(Ops.IDIV, b)
                fix = ((q * b).ne(a)) & ((a < 0).ne(b < 0))
                return fix.where(q - 1, q)
            return a._alu(Ops.FDIV, b).floor()
        raise ValueError(f"rounding_mode must be None, 'trunc' or 'floor', got {rounding_mode!r}")

    def neg(self) -> "Tensor":
        return self.logical_not() if self.dtype is dtypes.bool else self._alu(Ops.NEG)

    def maximum(self, x: Any) -> "Tensor":
        return self._binop(Ops.MAX, x)

    def where(self, x: Any, y: Any) -> "Tensor":
        cond = self if self.dtype is dtypes.bool else self.ne(0)
        if not isinstance(x, Tensor) and isinstance(y, Tensor):
            y2, x2 = y._broadcasted(x)
        elif isinstance(x, Tensor):
            x2, y2 = x._broadcasted(y)
        else:
            x2 = Tensor(x, device=self.device, _runtime=self._runtime)
            x2, y2 = x2._broadcasted(y)
        shape = broadcast_shape(cond.shape, x2.shape)
        cond, x2, y2 = cond._broadcast_to(shape), x2._broadcast_to(shape), y2._broadcast_to(shape)
        return cond._alu(Ops.WHERE, x2, y2)

    def exp2(self) -> "Tensor":
        return self.cast(least_upper_float(self.dtype))._alu(Ops.EXP2)

    def log2(self) -> "Tensor":
        return self.cast(least_upper_float(self.dtype))._alu(Ops.LOG2)

    def sqrt(self) -> "Tensor":
        return self.cast(least_upper_float(self.dtype))._alu(Ops.SQRT)

    def rsqrt(self) -> "Tensor":
        return self.sqrt().reciprocal()

    def reciprocal(self) -> "Tensor":
        return self.cast(least_upper_float(self.dtype))._alu(Ops.RECIPROCAL)

    def sin(self) -> "Tensor":
        return self.cast(least_upper_float(self.dtype))._alu(Ops.SIN)

    # comparisons
    def __lt__(self, x: Any) -> "Tensor":
        return self._binop(Ops.CMPLT, x)

    def __gt__(self, x: Any) -> "Tensor":
        return self._binop(Ops.CMPLT, x, reverse=True)

    def ne(self, x: Any) -> "Tensor":
        return self._binop(Ops.CMPNE, x)

    def eq(self, x: Any) -> "Tensor":
        return self._binop(Ops.CMPEQ, x)

    def __eq__(self, x: Any) -> "Tensor":  # type: ignore[override]
        return self.eq(x)

    def __ne__(self, x: Any) -> "Tensor":  # type: ignore[override]
        return self.ne(x)

    def logical_not(self) -> "Tensor":
        return self.cast(dtypes.bool)._binop(Ops.CMPNE, True)

    def __and__(self, x: Any) -> "Tensor":
        return self._binop(Ops.AND, x)

    def __or__(self, x: Any) -> "Tensor":
        return self._binop(Ops.OR, x)

    def __xor__(self, x: Any) -> "Tensor":
        return self._binop(Ops.XOR, x)

    __add__ = add
    __mul__ = mul
    __sub__ = sub
    __truediv__ = div

    def __radd__(self, x: Any) -> "Tensor":
        return self._binop(Ops.ADD, x, reverse=True)

    def __rmul__(self, x: Any) -> "Tensor":
        return self._binop(Ops.MUL, x, reverse=True)

    def __rsub__(self, x: Any) -> "Tensor":
        a, b = self._broadcasted(x, reverse=True)
        return a._alu(Ops.ADD, b._alu(Ops.NEG))

    def __rtruediv__(self, x: Any) -> "Tensor":
        a, b = self._broadcasted(x, reverse=True)
        return a.div(b)

    def __neg__(self) -> "Tensor":
        return self.neg()

    def __matmul__(self, x: "Tensor") -> "Tensor":
        return self.matmul(x)

    def __rmatmul__(self, x: "Tensor") -> "Tensor":
        return Tensor(x).matmul(self) if not isinstance(x, Tensor) else x.matmul(self)

    def __bool__(self) -> bool:
        if self.numel() != 1:
            raise RuntimeError(f"the truth value of a tensor with {self.numel()} elements is ambiguous")
        return bool(self.item())

    def __float__(self) -> float:
        return float(self.item())

    def __int__(self) -> int:
        return int(self.item())

    # ---------------------------------------------------------------------------------------------
    # movement
    def reshape(self, *shape: Any) -> "Tensor":
        shape = _shape_arg(shape, allow_neg=True)
        if shape.count(-1) > 1:
            raise ShapeError(f"reshape {shape}: only one dimension can be -1")
        if -1 in shape:
            known = _prod(s for s in shape if s != -1)
            numel = self.numel()
            if sint.has_sym((known, numel)):
                rest = 1 if known is numel else sint.sdiv(numel, known)
                if not sint.sym_equal(sint.smul(rest, known), numel):
                    raise ShapeError(f"cannot infer -1 in reshape {shape} of {self.shape}: give every size")
            elif known == 0 or numel % known:
                raise ShapeError(f"cannot reshape {self.shape} to {shape}")
            else:
                rest = numel // known
            shape = tuple(rest if s == -1 else s for s in shape)
        if sint.has_sym(shape) and sint.resolve(_prod(shape)) is None:
            sint.value(_prod(shape))  # an unbound Variable: VariableError says to bind it
        if not sint.sym_equal(_prod(shape), self.numel()):
            raise ShapeError(f"cannot reshape {self.shape} ({self.numel()} elements) to {shape}")
        return self._new(mv.reshape(self.uop, shape))

    view = reshape

    def permute(self, *order: Any) -> "Tensor":
        order = tuple(_resolve_axis(o, self.ndim) for o in _shape_arg(order, allow_neg=True))
        return self._new(mv.permute(self.uop, order))

    def expand(self, *shape: Any) -> "Tensor":
        shape = _shape_arg(shape, allow_neg=True)
        pad = (1,) * (len(shape) - self.ndim) + self.shape
        shape = tuple(p if s == -1 else s for s, p in zip(shape, pad))
        base = self.reshape(pad) if pad != self.shape else self
        return self._new(mv.expand(base.uop, shape))

    def pad(self, padding: Sequence[Any], value: float = 0.0, mode: str = "constant") -> "Tensor":
        """padding: per-axis ((before, after), ...) or torch-style flat (last axis first)."""
        flat = list(padding)
        if flat and not isinstance(flat[0], (tuple, list)) and flat[0] is not None:
            pairs = [(0, 0)] * self.ndim
            for i in range(len(flat) // 2):
                pairs[self.ndim - 1 - i] = (flat[2 * i], flat[2 * i + 1])
        else:
            pairs = [(0, 0) if p is None else tuple(p) for p in flat]
        if mode != "constant":
            return self._pad_mode(pairs, mode)
        grow = tuple((max(b, 0), max(a, 0)) for b, a in pairs)
        x = self
        if any(b < 0 or a < 0 for b, a in pairs):
            x = x.shrink(tuple((-min(b, 0), s + min(a, 0)) for (b, a), s in zip(pairs, self.shape)))
        out = x._new(mv.pad(x.uop, grow))
        if value != 0 and any(b or a for b, a in grow):
            mask = Tensor.ones(*x.shape, dtype=dtypes.bool, device=x.device)._new(
                mv.pad(Tensor.ones(*x.shape, dtype=dtypes.bool, device=x.device).uop, grow))
            out = mask.where(out, value)
        return out

    def shrink(self, bounds: Sequence[Any]) -> "Tensor":
        full = tuple((0, s) if b is None else (b[0], b[1]) for b, s in zip(bounds, self.shape))
        return self._new(mv.shrink(self.uop, full))

    def flip(self, *axis: Any) -> "Tensor":
        axes = {_resolve_axis(a, self.ndim) for a in _shape_arg(axis, allow_neg=True)}
        return self._new(mv.flip(self.uop, tuple(i in axes for i in range(self.ndim))))

    def transpose(self, dim0: int = 1, dim1: int = 0) -> "Tensor":
        order = list(range(self.ndim))
        a, b = _resolve_axis(dim0, self.ndim), _resolve_axis(dim1, self.ndim)
        order[a], order[b] = order[b], order[a]
        return self.permute(order)

    @property
    def T(self) -> "Tensor":  # noqa: N802
        return self.permute(tuple(reversed(range(self.ndim))))

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> "Tensor":
        if self.ndim == 0:
            return self.reshape(1)
        s, e = _resolve_axis(start_dim, self.ndim), _resolve_axis(end_dim, self.ndim)
        return self.reshape(self.shape[:s] + (_prod(self.shape[s:e + 1]),) + self.shape[e + 1:])

    def squeeze(self, dim: int | None = None) -> "Tensor":
        if dim is None:
            return self.reshape(tuple(s for s in self.shape if s != 1))
        if self.ndim == 0:
            return self
        d = _resolve_axis(dim, self.ndim)
        return self if self.shape[d] != 1 else self.reshape(self.shape[:d] + self.shape[d + 1:])

    def unsqueeze(self, dim: int) -> "Tensor":
        d = _resolve_axis(dim, self.ndim + 1)
        return self.reshape(self.shape[:d] + (1,) + self.shape[d:])

    # ---------------------------------------------------------------------------------------------
    # reductions
    def _reduce(self, op: Ops, axis: Any = None, keepdim: bool = False) -> "Tensor":
        axes = tuple(range(self.ndim)) if axis is None else tuple(
            _resolve_axis(a, self.ndim) for a in (axis if isinstance(axis, (tuple, list)) else (axis,)))
        axes = tuple(sorted(set(axes)))
        if self.ndim == 0:
            return self
        if any(self.shape[a] == 0 for a in axes) and op is Ops.MAX:
            raise RuntimeError("max() of an empty dimension has no identity; pass a non-empty tensor")
        x = self
        out = x._new(UOp(Ops.REDUCE_AXIS, x.dtype, (x.uop,), (op, axes)))
        return out if keepdim else out.reshape(tuple(s for i, s in enumerate(self.shape) if i not in axes))

    def sum(self, axis: Any = None, keepdim: bool = False, dtype: Any = None) -> "Tensor":
        x = self.cast(dtype) if dtype is not None else self.cast(_sum_dtype(self.dtype))
        out = x._reduce(Ops.ADD, axis, keepdim)
        return out.cast(self.dtype) if dtype is None and self.dtype in (dtypes.float16, dtypes.bfloat16) else out

    def prod(self, axis: Any = None, keepdim: bool = False, dtype: Any = None) -> "Tensor":
        x = self.cast(dtype) if dtype is not None else self.cast(_sum_dtype(self.dtype))
        out = x._reduce(Ops.MUL, axis, keepdim)
        return out.cast(self.dtype) if dtype is None and self.dtype in (dtypes.float16, dtypes.bfloat16) else out

    def squeeze_axes(self, axis: Any) -> "Tensor":
        if axis is None:
            return self.reshape(())
        axes = {_resolve_axis(a, self.ndim) for a in (axis if isinstance(axis, (tuple, list)) else (axis,))}
        return self.reshape(tuple(s for i, s in enumerate(self.shape) if i not in axes))

    # ---------------------------------------------------------------------------------------------
    # linear algebra and indexing
    def dot(self, w: "Tensor") -> "Tensor":
        return self.matmul(w)

    def matmul(self, w: Any) -> "Tensor":
        if not isinstance(w, Tensor):
            w = Tensor(w, device=self.device, _runtime=self._runtime)
        x = self
        if x.ndim == 0 or w.ndim == 0:
            raise ShapeError(f"matmul needs at least 1-d operands, got {x.shape} and {w.shape}")
        squeeze_x, squeeze_w = x.ndim == 1, w.ndim == 1
        if squeeze_x:
            x = x.reshape(1, x.shape[0])
        if squeeze_w:
            w = w.reshape(w.shape[0], 1)
        if x.shape[-1] != w.shape[-2]:
            raise ShapeError(f"matmul shapes {self.shape} and {w.shape} do not align ({x.shape[-1]} != {w.shape[-2]})")
        dt = least_upper_dtype(x.dtype, w.dtype)
        x, w = x.cast(dt), w.cast(dt)
        xs = x.reshape(*x.shape[:-1], 1, x.shape[-1])
        ws = w.transpose(-1, -2).reshape(*w.shape[:-2], 1, w.shape[-1], w.shape[-2])
        a, b = xs._broadcasted(ws)
        out = (a * b).sum(-1, dtype=_sum_dtype(dt) if not dt.is_float else None)
        if squeeze_x:
            out = out.squeeze(-2)
        if squeeze_w:
            out = out.squeeze(-1)
        return out

    def gather(self, dim: int, index: "Tensor") -> "Tensor":
        dim = _resolve_axis(dim, self.ndim)
        if index.ndim != self.ndim:
            raise ShapeError(f"gather: index has {index.ndim} dims, input has {self.ndim}")
        if any(i > s for d, (i, s) in enumerate(zip(index.shape, self.shape)) if d != dim):
            raise ShapeError(f"gather: index shape {index.shape} exceeds input {self.shape} outside dim {dim}")
        x = self.shrink(tuple((0, i) if d != dim else None for d, i in enumerate(index.shape)))
        x = x.unsqueeze(-1).transpose(-1, dim)  # the gathered axis moves last
        onehot = index.unsqueeze(-1).eq(Tensor.arange(self.shape[dim], device=self.device, dtype=index.dtype))
        return onehot.where(x, 0).sum(-1, dtype=self.dtype)

    def __lshift__(self, x: Any) -> "Tensor":
        return self._binop(Ops.SHL, x)

    def __rshift__(self, x: Any) -> "Tensor":
        return self._binop(Ops.SHR, x)

    def lshift(self, x: Any) -> "Tensor":
        return self << x

    def rshift(self, x: Any) -> "Tensor":
        return self >> x

    def __getitem__(self, index: Any) -> "Tensor":
        """Basic indexing: ints, slices (any step), None and Ellipsis; tensors go to tensor_ext."""
        items = list(index) if isinstance(index, tuple) else [index]
        if any(isinstance(i, (Tensor, list, np.ndarray)) for i in items):
            return self._advanced_getitem(items)
        n_real = sum(1 for i in items if i is not None and i is not Ellipsis)
        if n_real > self.ndim:
            raise IndexError(f"too many indices ({n_real}) for a tensor with {self.ndim} dimensions")
        if Ellipsis in items:
            at = items.index(Ellipsis)
            items = items[:at] + [slice(None)] * (self.ndim - n_real) + items[at + 1:]
        else:
            items = items + [slice(None)] * (self.ndim - n_real)
        x, dim, out_shape = self, 0, []
        bounds, flips, steps = [], [], []
        for it in items:
            if it is None:
                out_shape.append(("new", None))
                continue
            size = self.shape[dim]
            if isinstance(it, slice) and (sint.is_sym(size) or isinstance(it.start, UOp) or isinstance(it.stop, UOp)):
                bounds.append(_symbolic_slice(it, size))  # cache[:pos] with pos a bound Variable
                flips.append(False)
                steps.append(1)
                out_shape.append(("keep", dim))
                dim += 1
                continue
            if isinstance(it, (int, np.integer)) and not isinstance(it, bool):
                i = int(it)
                if not -size <= i < size:
                    raise IndexError(f"index {i} is out of bounds for dimension {dim} with size {size}")
                i %= size
                bounds.append((i, i + 1))
                flips.append(False)
                steps.append(1)
                out_shape.append(("drop", dim))
            elif isinstance(it, slice):
                start, stop, step = it.indices(size)
                if step == 0:
                    raise ValueError("slice step cannot be zero")
                if step > 0:
                    n = max(0, -(-(stop - start) // step))
                    bounds.append((start, start + max(n - 1, 0) * step + (1 if n else 0)))
                    flips.append(False)
                else:
                    n = max(0, -(-(start - stop) // -step))
                    lo = start - (n - 1) * -step if n else 0
                    bounds.append((lo, start + 1 if n else 0))
                    flips.append(True)
                steps.append(abs(step))
                out_shape.append(("keep", dim))
            else:
                raise TypeError(f"unsupported index {it!r}; use ints, slices, None, Ellipsis or integer tensors")
            dim += 1
        x = x.shrink(tuple(bounds))
        if any(flips):
            x = x.flip(*[i for i, f in enumerate(flips) if f])
        if any(s != 1 for s in steps):
            x = x._strided(steps)
        final = []
        for kind, d in out_shape:
            if kind == "new":
                final.append(1)
            elif kind == "keep":
                final.append(x.shape[d])
        return x.reshape(tuple(final))

    def _strided(self, steps: list[int]) -> "Tensor":
        x = self
        for d, st in enumerate(steps):
            if st == 1 or x.shape[d] == 0:
                continue
            n = x.shape[d]
            m = -(-n // st)
            x = x.pad(tuple((0, m * st - n) if i == d else (0, 0) for i in range(x.ndim)))
            x = x.reshape(x.shape[:d] + (m, st) + x.shape[d + 1:])
            x = x.shrink(tuple((0, 1) if i == d + 1 else (0, s) for i, s in enumerate(x.shape)))
            x = x.reshape(x.shape[:d + 1] + x.shape[d + 2:])
        return x

    def one_hot(self, num_classes: int = -1) -> "Tensor":
        if num_classes == -1:
            num_classes = int(self.max().item()) + 1
        return self.unsqueeze(-1).eq(Tensor.arange(num_classes, device=self.device, dtype=self.dtype)).cast(
            dtypes.int32)


# -------------------------------------------------------------------------------------------------
# Methods whose implementations live in their own modules (one concern per module).

def _delegate(module: str, name: str, doc: str):
    def method(self, *args: Any, **kwargs: Any):
        import importlib
        return getattr(importlib.import_module(f"polygrad.{module}"), name)(self, *args, **kwargs)
    method.__name__ = name
    method.__doc__ = doc
    return method


for _name in ("solve", "lstsq", "cholesky", "cholesky_solve", "qr", "solve_triangular", "triangular_solve", "inv",
              "det", "slogdet"):
    setattr(Tensor, _name, _delegate("linalg", _name, f"See polygrad.linalg.{_name}."))
for _name in ("sum", "prod"):  # torch's dim= keyword, as on every other reduction
    setattr(Tensor, _name, accepts_dim(getattr(Tensor, _name)))
Tensor.custom_kernel = _delegate("engine.custom", "custom_kernel", "Run a kernel written in kernel IR; see "
                                 "polygrad.engine.custom.custom_kernel.")  # type: ignore[attr-defined]


def _substitute(root: UOp, mapping: dict[UOp, UOp]) -> UOp:
    """root with every node found in `mapping` replaced (once, without looking inside the replacement)."""
    if not mapping:
        return root
    out: dict[UOp, UOp] = {}
    for node in root.toposort():
        hit = mapping.get(node)
        if hit is not None:
            out[node] = hit
            continue
        new_src = tuple(out[s] for s in node.src)
        out[node] = node if new_src == node.src else node.replace(src=new_src)
    return out[root]


def _autograd_graph(root: UOp, stop_at: "set[Tensor]") -> tuple[UOp, dict[UOp, UOp]]:
    """The graph gradients flow through, and the map that turns recomputed values back into buffers.

    realize() swaps a tensor's graph for its buffer; while that tensor is alive its `_graph` still
    says how the buffer was made, so gradients reach the leaves behind it (as in PyTorch). Tensors in
    `stop_at` (the gradient targets) stay as they are.
    """
    lineage = {t.uop: t._graph for t in list(_all_tensors)
               if t._graph is not None and t not in stop_at and _is_realized(t.uop)}
    if not lineage:
        return root, {}
    for _ in range(len(lineage) + 1):  # each pass reaches one realize() further back
        nodes = set(root.toposort())
        if not any(u in nodes for u in lineage):
            break
        root = _substitute(root, lineage)
    return root, {graph: buf for buf, graph in lineage.items()}


def size_tensor(n: Any, like: "Tensor") -> "Tensor":
    """A 0-d tensor (like's dtype and device) holding the size n, which may be symbolic: the kernel reads
    the variable's value, so one program serves every binding."""
    if not sint.is_sym(n):
        return Tensor(UOp.const(like.dtype, n, like.device), _runtime=like._runtime)
    zero = UOp.const(like.dtype, 0, like.device)  # carries the device
    return Tensor(UOp(Ops.ADD, like.dtype, (zero, n.cast(like.dtype))), _runtime=like._runtime)


def _iota(n: int, dt: DType, kw: dict) -> "Tensor":
    """0..n-1 computed in-kernel from the loop index (never materialised on the host)."""
    dev = canonicalize(kw.get("device") or _default_device(kw.get("_runtime")))
    it = dtypes.int64 if n > 2**31 - 1 else dtypes.int32
    u = UOp(Ops.IOTA, it, (UOp(Ops.DEVICE, None, (), dev),), n)
    return Tensor(u, _runtime=kw.get("_runtime")).cast(dt)


_UINT_OF_SIZE = {1: dtypes.uint8, 2: dtypes.uint16, 4: dtypes.uint32, 8: dtypes.uint64}


def _bitcast_resize(x: "Tensor", dt: DType) -> "Tensor":
    """Bitcast between item sizes by splitting or joining unsigned words with shifts."""
    small, big = sorted((x.dtype.itemsize, dt.itemsize))
    k = big // small
    lead = x.shape[:-1]
    if dt.itemsize < x.dtype.itemsize:
        words = x.bitcast(_UINT_OF_SIZE[big])
        out = None
        for i in range(k):
            part = (words >> (8 * small * i)).cast(_UINT_OF_SIZE[small]).unsqueeze(-1)
            part = part.pad(((0, 0),) * (part.ndim - 1) + ((i, k - 1 - i),))
            out = part if out is None else out + part
        return out.reshape(*lead, x.shape[-1] * k).bitcast(dt)
    if x.shape[-1] % k:
        raise ShapeError(f"bitcast from {x.dtype} to {dt} needs the last dimension ({x.shape[-1]}) to be a "
                         f"multiple of {k}")
    words = x.bitcast(_UINT_OF_SIZE[small]).reshape(*lead, x.shape[-1] // k, k).cast(_UINT_OF_SIZE[big])
    shifts = Tensor.arange(k, device=x.device, dtype=_UINT_OF_SIZE[big], _runtime=x._runtime) * (8 * small)
    return (words << shifts).sum(-1, dtype=_UINT_OF_SIZE[big]).bitcast(dt)


def _sum_dtype(dt: DType) -> DType:
    if dt is dtypes.bool or (dt.is_int and dt.itemsize < 4):
        return dtypes.uint32 if dt.is_unsigned else dtypes.int32
    if dt in (dtypes.float16, dtypes.bfloat16):
        return dtypes.float32
    return dt


def _dtype_from_numpy(arr: np.ndarray) -> DType:
    from polygrad.dtype import from_numpy
    return from_numpy(arr.dtype)


def _from_numpy(arr: np.ndarray, dt: DType, dev: str) -> UOp:
    arr = _np_cast(arr, dt)
    buf = Buffer(dev, arr.size, dt)
    if arr.size:
        buf.copyin(arr)
    return _buffer_uop(buf, arr.shape)


_WRITABLE_VIEW_OPS = (Ops.RESHAPE, Ops.PERMUTE, Ops.SHRINK, Ops.FLIP)


def _is_view_of_realized(u: UOp) -> bool:
    """A slice/transpose/flip/reshape of a realized buffer: an assign writes through it."""
    while u.op in _WRITABLE_VIEW_OPS:
        u = u.src[0]
    return u.op is Ops.BUFFER and u.arg.is_allocated


def _prefix_buffer(u: UOp) -> Buffer | None:
    """The allocated buffer whose leading elements, row-major, are this view (reshapes of
    buffer.reshape(-1)[:n], as Model hands out variable-size results), or None: read without a kernel."""
    u = mv.strip_reshapes(u)
    if u.op is not Ops.SHRINK or len(u.arg) != 1 or u.arg[0][0] != 0:
        return None
    base = mv.strip_reshapes(u.src[0])
    return base.arg if base.op is Ops.BUFFER and base.arg.is_allocated else None


def _is_realized(u: UOp) -> bool:
    u = mv.strip_reshapes(u)
    return u.op is Ops.BUFFER and (u.arg.is_allocated or u.arg.size == 0)


def _symbolic_slice(it: slice, size: Any) -> tuple[Any, Any]:
    """(start, stop) of a step-1 slice whose size or endpoints are symbolic (no negative indices)."""
    if it.step not in (None, 1):
        raise ValueError(f"a slice with a symbolic size or endpoint needs step 1, got step {it.step}")
    start = 0 if it.start is None else it.start
    stop = size if it.stop is None else it.stop
    for v in (start, stop):
        if not isinstance(v, UOp) and int(v) < 0:
            raise IndexError(f"negative slice index {v} next to a symbolic size; count from the start instead")
    return start, stop


def _shape_arg(shape: Any, allow_neg: bool = False) -> tuple[int, ...]:
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    out = []
    for s in shape:
        if isinstance(s, UOp):  # a symbolic size: a bound Variable (v.bind(n)) or an expression of them
            out.append(sint.canon(s))
            continue
        if isinstance(s, Tensor):
            s = s.item()
        if not isinstance(s, (int, np.integer)):
            raise TypeError(f"shape entries must be integers, got {s!r}")
        if s < 0 and not (allow_neg and s == -1 or allow_neg):
            raise ShapeError(f"negative dimension {s} in shape {tuple(shape)}")
        out.append(int(s))
    return tuple(out)


def broadcast_shape(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    n = max(len(s) for s in shapes)
    padded = [(1,) * (n - len(s)) + tuple(s) for s in shapes]
    out = []
    for dims in zip(*padded):
        sizes = {d for d in dims if d != 1}
        if len(sizes) > 1:
            raise ShapeError(f"shapes {list(shapes)} cannot be broadcast together")
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


def _default_device(runtime: Any) -> str | None:
    if runtime is not None:
        return runtime.device
    from polygrad import runtime_context
    current = runtime_context.current()
    return current.device if current is not None else None


def _check_runtimes(tensors: Sequence["Tensor"]) -> None:
    owners = {id(t._runtime): t._runtime for t in tensors if t._runtime is not None}
    if len(owners) > 1:
        raise RuntimeOwnershipError(
            f"operands belong to different runtimes ({', '.join(map(repr, owners.values()))}); create tensors "
            "and layers through the same runtime (rt.Tensor, rt.nn) or use the default API consistently")
    for rt in owners.values():
        if getattr(rt, "disposed", False):
            raise RuntimeOwnershipError(f"runtime {rt!r} was disposed; create a new one with polygrad.create()")


_ = config
