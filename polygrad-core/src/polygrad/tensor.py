"""`Tensor`: the lazy, differentiable user API. Every op builds tensor-graph UOps; `realize()` runs them.

Stage: graph construction. Input: user calls. Output: UOp graphs handed to the scheduler.
This module holds the core: construction from data, properties, realize and data exchange, assign,
autograd, Python protocols, and the primitive builders every mixin uses (`_new(uop)`, the constructor
hook; `_alu`, `_broadcasted`, `_broadcast_to`). The methods live in mixins, one concern per module, each
written against `type(self)` / `cls` and never importing this module: tensor_create (constructors),
tensor_random (random draws), tensor_dtype (casts), tensor_elementwise (operators), tensor_math and
tensor_activation (functions), tensor_reduce (reductions, scans, sorting), tensor_contract (matmul,
einsum), tensor_movement (views, joins), tensor_indexing (indexing, gather/scatter), tensor_nn and
tensor_losses; shared helpers are in tensor_common. Everything is composed from the primitive ops, so
gradients come from `polygrad.gradient`. Modules above Tensor add their methods to it when imported
(linalg: solve, qr, ...; linalg_svd: svd; engine/custom: custom_kernel).
"""
from __future__ import annotations

import contextlib
import copy
import itertools
import weakref
from typing import Any, Iterable, Iterator

import numpy as np

from polygrad import config, runtime_context
from polygrad.device import Buffer, canonicalize
from polygrad.dtype import (DType, dtype_max, dtype_min, dtype_of_python, dtypes, from_numpy, least_upper_dtype,
                            to_dtype)
from polygrad.engine import realize as engine_realize
from polygrad.engine.capture import active as capture_active
from polygrad.engine.capture import made_before
from polygrad.engine.capture import paused as capture_paused
from polygrad.engine.live import all_tensors as _all_tensors
from polygrad.errors import DeviceError, DTypeError, InvalidArgumentError
from polygrad.gradient import compute_gradient, with_vjp
from polygrad.schedule.overwrites import is_view, mixed_frontier, readers_of, written_buffers
from polygrad.tensor_activation import ActivationMixin
from polygrad.uop import movement as mv
from polygrad.uop import sint
from polygrad.uop.ops import COMPARISONS, Ops, UOp, new_uop
from polygrad.uop.shape import ShapeError
from polygrad.tensor_common import (_buffer_uop, _check_operand, _check_runtimes, _default_device, _prod,
                                    _resolve_axis, _shape_arg, _sum_dtype, broadcast_shape, capture_guards,
                                    check_writable, is_tensor, size_tensor)
from polygrad.tensor_contract import ContractionMixin
from polygrad.tensor_create import CreationMixin
from polygrad.tensor_dtype import DTypeMixin
from polygrad.tensor_elementwise import ElementwiseMixin
from polygrad.tensor_math import MathMixin
from polygrad.tensor_movement import MovementMixin
from polygrad.tensor_nn import NNMixin
from polygrad.tensor_random import RandomMixin
from polygrad.tensor_reduce import ReduceMixin

# re-exported for the modules that import them from here
__all__ = ["Tensor", "broadcast_shape", "capture_guards", "is_tensor", "size_tensor", "_buffer_uop", "_check_runtimes",
           "_resolve_axis", "_shape_arg", "_sum_dtype"]


_effect_ids = itertools.count(1)  # makes every assign a distinct UOp


def _infer_list_dtype(data: Any) -> DType:
    flat = np.asarray(data, dtype=object).reshape(-1) if not isinstance(data, (int, float, bool)) else [data]
    kinds = {type(x) for x in flat}
    if kinds <= {bool, np.bool_}:
        return dtypes.bool
    if kinds <= {bool, int, np.bool_} or all(isinstance(x, (bool, int, np.integer)) for x in flat):
        ints = [int(x) for x in flat]  # int64 where int32 cannot hold the values, as torch
        if not ints:
            return dtypes.default_int
        lo, hi = dtype_of_python(min(ints)), dtype_of_python(max(ints))
        return dtypes.int64 if dtypes.int64 in (lo, hi) else dtypes.default_int
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
            arr = _np_cast(np.asarray(data, dtype=np.float32), dtype)
        else:
            arr = np.asarray(data, dtype=dtype.np)
    except OverflowError as e:  # torch raises RuntimeError; NumPy an OverflowError
        raise _overflow_error(dtype, e) from None
    except (ValueError, TypeError) as e:
        if _holds_none(data):
            raise _none_error() from None
        raise InvalidArgumentError(f"cannot build a tensor from {type(data).__name__}: {e}; "
                         "nested lists must be rectangular") from e
    # NumPy reads None as NaN in a float array; only a NaN can be one, so only then look for it
    if arr.dtype.kind == "f" and np.isnan(arr).any() and _holds_none(data):
        raise _none_error()
    return arr


def _holds_none(data: Any) -> bool:
    stack = [data]
    while stack:
        x = stack.pop()
        if x is None:
            return True
        if isinstance(x, (list, tuple)):
            stack.extend(x)
    return False


def _none_error() -> DTypeError:
    return DTypeError("cannot build a tensor from None or a list holding None; use a number (float('nan') for a "
                      "missing value), or Tensor.empty(0) for an empty tensor")


def _overflow_error(dtype: DType, detail: Any) -> InvalidArgumentError:
    return InvalidArgumentError(f"a value does not fit {dtype!r} ({detail}); pick a wider dtype, or build the "
                                "tensor first and .cast() it to wrap around")


def _check_scalar_fits(value: Any, dtype: DType) -> None:
    """An int/float scalar asked to be an integer dtype it cannot hold (300 as uint8, NaN as int32) raises, as a
    list of the same values does (and torch)."""
    if dtype.is_float or dtype is dtypes.bool or isinstance(value, bool):
        return
    if not dtype_min(dtype) <= value <= dtype_max(dtype):  # NaN compares False
        raise _overflow_error(dtype, f"got {value!r}")


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


class _TensorType(type):
    """Tensor's metaclass: `Tensor.training` reads and writes the TRAINING setting, so the two always agree."""

    @property
    def training(cls) -> bool:
        return bool(config.get("TRAINING"))

    @training.setter
    def training(cls, value: bool) -> None:
        config.set_value("TRAINING", int(bool(value)))


_new_object = object.__new__
_BUFFER, _RESHAPE = Ops.BUFFER, Ops.RESHAPE  # (a class attribute read is a dict lookup in CPython 3.11)


class Tensor(DTypeMixin, ElementwiseMixin, MathMixin, ActivationMixin, ReduceMixin, CreationMixin, RandomMixin,
             ContractionMixin, MovementMixin, NNMixin, metaclass=_TensorType):
    """A lazily evaluated n-dimensional array with automatic differentiation.

    >>> Tensor([1.0, 2.0, 3.0]).mul(2).numpy().tolist()
    [2.0, 4.0, 6.0]
    """

    __slots__ = ("uop", "requires_grad", "grad", "_leaf", "_runtime", "_graph", "__weakref__")

    class train(contextlib.ContextDecorator):
        """`with Tensor.train():` (or as a decorator) runs a block in training mode (tinygrad); train(False) out
        of it. Restores the previous mode on exit; like Context, it changes the mode for this thread alone."""

        def __init__(self, mode: bool = True):
            self.mode = mode
            self.context = config.Context(TRAINING=int(mode))  # for this thread alone, as any Context

        def __enter__(self) -> None:
            self.context.__enter__()

        def __exit__(self, *exc: Any) -> None:
            self.context.__exit__(*exc)
    training = property(lambda self: bool(config.get("TRAINING")), doc="Training mode (the TRAINING setting).")

    def __init__(self, data: Any = None, device: str | None = None, dtype: Any = None,
                 requires_grad: bool | None = None, _runtime: Any = None):
        dtype = to_dtype(dtype) if dtype is not None else None
        self.requires_grad = requires_grad
        self.grad: Tensor | None = None
        self._leaf = True
        self._graph: UOp | None = None  # the lazy graph before realize(), kept so backward() still works
        if _runtime is None:
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
                _check_scalar_fits(data, dt)
                self.uop = UOp.const(dt, data, dev)
            elif data is None:  # tinygrad builds an empty tensor here; torch refuses
                raise _none_error()
            elif isinstance(data, (bytes, bytearray)):
                arr = np.frombuffer(bytes(data), dtype=np.uint8)
                self.uop = _from_numpy(arr, dtype or dtypes.uint8, dev)
            elif isinstance(data, memoryview):  # keeps its format and shape (a float32 view stays float32)
                arr = _to_numpy(np.array(data), dtype)
                self.uop = _from_numpy(arr, dtype or _dtype_from_numpy(arr), dev)
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
        u = self.uop
        s = u._shape  # filled in the node (the common case), else the node's property fills it
        return s if s is not None else u.shape

    @property
    def dtype(self) -> DType:
        return self.uop.dtype

    @property
    def device(self) -> str:
        return self.uop.device or canonicalize(None)

    @property
    def ndim(self) -> int:
        u = self.uop
        s = u._shape
        return len(s if s is not None else u.shape)

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

    def __iter__(self):
        """Iterate over the first dimension (torch and NumPy); a 0-d tensor cannot be iterated."""
        if not self.shape:
            raise TypeError("iteration over a 0-d tensor; use .item() for its value")
        return (self[i] for i in range(self.shape[0]))

    def __format__(self, spec: str) -> str:
        """f"{t:.2f}" formats the value of a 0-d (or one-element) tensor; other tensors take no format spec."""
        if not spec:
            return str(self)
        if self.numel() == 1 and self.ndim == 0:
            return format(self.item(), spec)
        raise TypeError(f"unsupported format string {spec!r} for a tensor of shape {self.shape}; format its .item() "
                        "or its .numpy()")

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        """NumPy functions (np.sum, np.mean, np.concatenate...) see tensors as their values (host arrays)."""
        def host(x: Any) -> Any:
            if isinstance(x, Tensor):
                return x.numpy()
            if isinstance(x, (list, tuple)):
                return type(x)(host(v) for v in x)
            return x
        return func(*host(args), **{k: host(v) for k, v in kwargs.items()})

    def __reduce__(self):
        """Pickling (and copy.deepcopy) saves the values, dtype, device and requires_grad; a lazy tensor is
        realized first. A deep copy owns a new buffer."""
        data = self.numpy()
        return _rebuild_tensor, (data, self.dtype.name, self.device, self.requires_grad)

    def __deepcopy__(self, memo: dict) -> "Tensor":
        out = _rebuild_tensor(self.numpy().copy(), self.dtype.name, self.device, self.requires_grad)
        if self.grad is not None:
            out.grad = copy.deepcopy(self.grad, memo)
        memo[id(self)] = out
        return out

    def __hash__(self) -> int:
        return id(self)

    def _new(self, uop: UOp) -> "Tensor":
        """A non-leaf tensor over `uop` in this tensor's runtime: Tensor(uop, _runtime=...) without the
        argument checks, since every op builds one."""
        t = _new_object(Tensor)
        t.uop, t.requires_grad, t.grad, t._leaf, t._graph, t._runtime = uop, None, None, False, None, self._runtime
        refs = _all_tensors.refs  # _all_tensors.add(t), without the call: every op makes a tensor
        refs.append(weakref.ref(t))
        if len(refs) >= _all_tensors.limit:
            _all_tensors.sweep()
        return t

    # ---------------------------------------------------------------------------------------------
    # ---------------------------------------------------------------------------------------------
    # realization and data exchange
    def realize(self, *others: "Tensor") -> "Tensor":
        if others:
            Tensor.realize_all(self, *others)
        elif ((old := self.uop).op is not _BUFFER and old.op is not _RESHAPE) or not _is_realized(old):
            # an eager op seen before (a pure node: never an effect, so nothing to order around it)
            new = engine_realize.realize_eager(old) if self._runtime is None else None
            if new is None:
                _realize_tensors([self])
            else:
                self._graph, self.uop = old, new
        return self

    @staticmethod
    def realize_all(*tensors: "Tensor") -> None:
        todo = [t for t in tensors if not _is_realized(t.uop)]
        if todo:
            _realize_tensors(todo)

    def _buffer(self) -> Buffer:
        """The Buffer behind a realized contiguous tensor."""
        self.realize()
        u = mv.strip_reshapes(self.uop)
        if u.op is not Ops.BUFFER:
            self.uop = self.contiguous().realize().uop
            return self._buffer()
        return u.arg

    def numpy(self) -> np.ndarray:
        if capture_guards.stack:
            capture_guards.stack[-1].read(self, "numpy")
        shape = sint.concrete_shape(self.shape)  # symbolic sizes read at their bound values
        if _prod(shape) == 0:
            return np.zeros(shape, dtype=self.dtype.np if self.dtype is not dtypes.bfloat16 else np.float32)
        prefix = _prefix_buffer(self.uop)
        # of a prefix only its elements: the logits of a 32-token prompt, not the 100 MB sized for 520 tokens
        flat = prefix.numpy(_prod(shape)) if prefix is not None else self._buffer().numpy()
        # a realized symbolic result fills a prefix of a buffer sized for the variables' maxima
        return _storage_to_numpy(flat[:_prod(shape)], self.dtype).reshape(shape)

    def data(self) -> memoryview:
        return memoryview(self.numpy())

    def item(self) -> Any:
        if capture_guards.stack:
            capture_guards.stack[-1].read(self, "item")
        if self.numel() != 1:
            raise InvalidArgumentError(f"item() needs a tensor with one element, this one has shape {self.shape}")
        return self.numpy().reshape(()).item()

    def tolist(self) -> Any:
        if capture_guards.stack:
            capture_guards.stack[-1].read(self, "tolist")
        return self.numpy().tolist()

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        arr = self.numpy()
        return arr.astype(dtype) if dtype is not None else arr

    def copy_from(self, data: Any) -> "Tensor":
        """Write host data into this tensor's existing buffer (keeps identity for compiled replay)."""
        if capture_guards.stack:
            capture_guards.stack[-1].read(self, "copy_from")
        arr = np.asarray(data)
        if arr.size != self.numel():
            raise InvalidArgumentError(f"copy_from: {arr.shape} has {arr.size} elements, tensor {self.shape} has "
                                       f"{self.numel()}")
        if arr.ndim > 1 and arr.shape != self.shape:
            raise InvalidArgumentError(f"copy_from: shape {arr.shape} does not match tensor shape {self.shape}")
        self._buffer().copyin(_np_cast(arr.reshape(-1), self.dtype))
        return self

    update_from = copy_from

    def assign(self, x: Any) -> "Tensor":
        """Write x into this tensor's buffer (in place, lazily)."""
        if capture_guards.stack:
            capture_guards.stack[-1].assign(self)
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
        check_writable(self.uop, "assign")
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

    def contiguous_backward(self) -> "Tensor":
        """The same values (no kernel, no copy); the gradient flowing back through it is made contiguous,
        i.e. realized in its own kernel before it reaches this tensor's inputs (tinygrad's)."""
        node = UOp(Ops.CAST, self.dtype, (self.uop,))  # a same-dtype cast: free in every kernel
        with_vjp(node, (self.uop,), lambda g, wanted: {self.uop: UOp(Ops.CONTIGUOUS, g.dtype, (g,))})
        return self._new(node)

    def detach(self) -> "Tensor":
        return Tensor(UOp(Ops.DETACH, self.dtype, (self.uop,)), requires_grad=False, _runtime=self._runtime)

    def clone(self) -> "Tensor":
        return self.contiguous()

    # ---------------------------------------------------------------------------------------------
    # autograd
    def gradient(self, *targets: "Tensor", gradient: "Tensor | None" = None,
                 materialize_grads: bool = True) -> list["Tensor"]:
        """d(self)/d(target) for each target, as new lazy tensors (no `.grad` is touched). A target self does
        not depend on gets zeros, or a RuntimeError with materialize_grads=False (tinygrad's default)."""
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
            if g is None and not materialize_grads:
                raise RuntimeError(f"gradient: a target of shape {t.shape} is not used by this tensor's graph; pass "
                                   "materialize_grads=True for zeros")
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
        rt = self._runtime
        owner = rt
        if any(o._runtime is not rt for o in others):
            owner = _check_runtimes([self, *others])
        elif rt is not None and getattr(rt, "disposed", False):
            _check_runtimes([self])
        dev = self.uop.device
        if any(o.uop.device != dev for o in others):
            devs = {t.device for t in (self, *others)}
            if len(devs) > 1:
                raise DeviceError(f"operands are on different devices {sorted(devs)}; move them with .to(device)")
        out = self._new(self.uop.alu(op, *[o.uop for o in others]))
        if owner is not rt:  # an unowned constant first: the result is the other operand's
            out._runtime = owner
        return out

    def _broadcasted(self, y: Any, reverse: bool = False) -> tuple["Tensor", "Tensor"]:
        x = self
        if not isinstance(y, Tensor):
            if isinstance(y, (list, tuple, np.ndarray)):
                y = Tensor(y, device=self.device, _runtime=self._runtime)
            else:
                _check_operand(y)
                ydt = _scalar_dtype(y, x.dtype)
                u = x.uop
                if ydt is u.dtype:  # no promotion or cast: the constant's nodes straight at x's shape
                    c = x._new(_broadcast_const(ydt, y, u.shape, u.device))
                    return (c, x) if reverse else (x, c)
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
        return self._new(_broadcast_uop(self.uop, shape))

    def _binop(self, op: Ops, y: Any, reverse: bool = False) -> "Tensor":
        kind = type(y)
        if kind is Tensor:
            u, v = self.uop, y.uop
            # the shapes and devices as filled in the nodes' slots (the properties fill them when empty)
            us, vs = u._shape, v._shape
            if us is None or vs is None:
                us, vs = u.shape, v.shape
            if v.dtype is u.dtype and vs == us:  # same dtype and shape: nothing to broadcast
                rt = self._runtime
                ud, vd = u._device, v._device
                if ud is None or vd is None:
                    ud, vd = u.device, v.device
                if y._runtime is rt and rt is None and vd == ud:  # _alu's checks, passed: build here
                    # _elementwise_node, inline: every eager op takes this path
                    n = new_uop(UOp, op, dtypes.bool if op in COMPARISONS else u.dtype, (v, u) if reverse else (u, v))
                    if n._shape is None:
                        n._shape, n._device = us, ud
                    t = _new_object(Tensor)  # self._new(n), inline (its runtime is None here)
                    t.uop, t.requires_grad, t.grad, t._leaf, t._graph, t._runtime = n, None, None, False, None, None
                    refs = _all_tensors.refs
                    refs.append(weakref.ref(t))
                    if len(refs) >= _all_tensors.limit:
                        _all_tensors.sweep()
                    return t
                return y._alu(op, self) if reverse else self._alu(op, y)
        elif (kind is float or kind is int or kind is bool) and self._runtime is None:
            u = self.uop
            if _scalar_dtype(y, u.dtype) is u.dtype:  # no promotion: the kept constant nodes at u's shape
                us = u._shape if u._shape is not None else u.shape
                ud = u._device if u._device is not None else u.device
                return self._new(_elementwise_node(op, u, _broadcast_const(u.dtype, y, us, ud), reverse, us, ud))
        a, b = self._broadcasted(y, reverse)
        return a._alu(op, b)

    def replace(self, x: "Tensor") -> "Tensor":
        """Make this tensor hold x's value (same shape; tinygrad's replace): later uses of this tensor see x."""
        if x.shape != self.shape:
            raise ShapeError(f"replace: shape {x.shape} differs from the tensor's {self.shape}")
        self.uop = x.uop
        return self

    def to_(self, device: str) -> "Tensor":
        """Move this tensor to device in place (its gradient too)."""
        moved = self.to(device)
        if self.grad is not None:
            self.grad = self.grad.to(device)
        self.uop = moved.uop
        return self

    # ---------------------------------------------------------------------------------------------
    def __bool__(self) -> bool:
        if self.numel() != 1:
            raise RuntimeError(f"the truth value of a tensor with {self.numel()} elements is ambiguous")
        return bool(self.item())

    def __float__(self) -> float:
        return float(self.item())

    def __int__(self) -> int:
        return int(self.item())


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


def _rebuild_tensor(data: np.ndarray, dtype_name: str, device: str, requires_grad: Any) -> "Tensor":
    """Unpickling: a realized tensor with these values (bfloat16 comes back from its float32 values exactly)."""
    return Tensor(data, device=device, dtype=getattr(dtypes, dtype_name), requires_grad=requires_grad)


def _dtype_from_numpy(arr: np.ndarray) -> DType:
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


def _broadcast_uop(u: UOp, shape: tuple) -> UOp:
    """u at `shape`, a broadcast shape of at least u's rank: RESHAPE to that rank with leading 1s, then
    EXPAND (the nodes Tensor.reshape/expand make, without their argument checks: broadcasting has
    checked the shapes)."""
    return mv.expand(mv.reshape(u, (1,) * (len(shape) - len(u.shape)) + u.shape), shape)


# CONST -> RESHAPE -> EXPAND of a Python scalar at a shape, kept for the next op with the same scalar,
# dtype, shape and device (`x * 2 + 1` in a loop): hash-consing would make the same nodes again, at about
# fifty Python calls each time. Keys tell 0.0 from -0.0 and 1 from 1.0 from True. Small, cleared when
# full and by collect(): kept nodes made at different times pin the allocator's arenas they sit in.
_CONST_NODES_MAX = 128
_const_nodes: dict[tuple, UOp] = {}


def _scalar_dtype(value: Any, dtype: DType) -> DType:
    """The dtype a Python scalar operand takes beside a tensor of `dtype` (before promotion)."""
    if isinstance(value, bool):
        return dtype
    if isinstance(value, int):
        return dtype if dtype is not dtypes.bool else dtypes.default_int
    return dtype if dtype.is_float else dtypes.default_float


def _elementwise_node(op: Ops, u: UOp, v: UOp, reverse: bool, shape: tuple, device: Any) -> UOp:
    """op over u and v (same dtype and shape), with the shape and device filled in its slots now rather
    than by a walk when the next op asks."""
    n = UOp(op, dtypes.bool if op in COMPARISONS else u.dtype, (v, u) if reverse else (u, v))
    if n._shape is None:
        n._shape, n._device = shape, device
    return n


def _broadcast_const(dtype: DType, value: Any, shape: tuple, device: Any) -> UOp:
    kind = type(value)
    if kind is not float and kind is not int and kind is not bool:  # NumPy scalars: 0.0 == -0.0 in any key
        return _broadcast_uop(UOp.const(dtype, value, device), shape)
    key = (dtype, kind, value.hex() if kind is float else value, shape, device)
    hit = _const_nodes.get(key)
    if hit is None:
        if len(_const_nodes) >= _CONST_NODES_MAX:
            _const_nodes.clear()
        hit = _const_nodes[key] = _broadcast_uop(UOp.const(dtype, value, device), shape)
    return hit


def _realize_tensors(todo: list["Tensor"]) -> None:
    """Realize these unrealized tensors in one schedule (Tensor.realize and realize_all)."""
    if len(todo) > 1 or (todo[0]._runtime is not None and getattr(todo[0]._runtime, "disposed", False)):
        _check_runtimes(todo)
    if len(todo) == 1:  # the common case: a graph without pending effects writes nothing, realized at once
        t = todo[0]
        old = t.uop
        news = engine_realize.realize_uops([old], effect_free=True)
        if news is not None:
            t._graph, t.uop = old if old.op is not Ops.ASSIGN else None, news[0]
            return
    olds = [t.uop for t in todo]
    written = written_buffers(olds)
    if written:  # values built before the writes keep their inputs' old values (schedule/overwrites.py)
        _compute_before_writes(written, todo)
        olds = [t.uop for t in todo]
        stale = realize_outside_captures(readers_of(written, lambda: lazy_values(todo), olds))
        todo += stale  # plain readers: computed in this schedule, which orders reads before writes
        olds += [t.uop for t in stale]
    news = engine_realize.realize_uops(olds)
    for t, old, new in zip(todo, olds, news):
        t._graph = old if old.op is not Ops.ASSIGN else None
        t.uop = new


def _is_realized(u: UOp) -> bool:
    if u.op is Ops.RESHAPE:
        u = mv.strip_reshapes(u)
    return u.op is Ops.BUFFER and (u.arg.is_allocated or u.arg.size == 0)


def _compute_before_writes(written: set[int], targets: list["Tensor"]) -> None:
    """Graphs (targets or live) that read a written buffer both before and after the write: realize
    their pre-write parts now (a copy each) and rewrite the graphs to read those copies."""
    live = [t for t, _ in lazy_values(targets)]
    older = made_before(live) if capture_active() else []
    inside = [t for t in live if not any(t is o for o in older)]
    for group, outside in ((targets + inside, False), (older, True)):
        mixed = [(t, parts) for t in group if (parts := mixed_frontier(t.uop, written))]
        if not mixed:
            continue
        nodes = list(dict.fromkeys(n for _, parts in mixed for n in parts))
        contiguous = [UOp(Ops.CONTIGUOUS, n.dtype, (n,)) for n in nodes]
        if outside:  # values the captured work did not compute: unrecorded
            with capture_paused():
                views = engine_realize.realize_uops(contiguous)
        else:
            views = engine_realize.realize_uops(contiguous)
        mapping = dict(zip(nodes, views))
        for t, _ in mixed:
            t.uop = _substitute(t.uop, mapping)


def realize_outside_captures(tensors: list["Tensor"]) -> list["Tensor"]:
    """Realize now, unrecorded, those of `tensors` that existed before the active captures began (values
    a capture must not replay: its function did not compute them); returns the others."""
    older = made_before(tensors) if capture_active() else []
    if older:
        with capture_paused():
            Tensor.realize_all(*older)
    return [t for t in tensors if not any(t is o for o in older)]


def lazy_values(exclude: Iterable["Tensor"] = ()) -> Iterator[tuple["Tensor", UOp]]:
    """(tensor, graph) for every live unrealized tensor that computes a value (not a view), except
    `exclude` and the gradients of tensors that did not ask for one (requires_grad None: backward fills
    them, tinygrad style, but a step does not compute them); schedule/overwrites.py picks its readers."""
    live = list(_all_tensors)
    skip = {id(t) for t in exclude}
    skip |= {id(t.grad) for t in live if t.grad is not None and t.requires_grad is not True}
    return ((t, t.uop) for t in live if id(t) not in skip and not is_view(t.uop))


_ = config
