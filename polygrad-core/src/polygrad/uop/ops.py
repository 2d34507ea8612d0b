"""The IR: `UOp` (op, dtype, src, arg), immutable and hash-consed, used at every stage.

Stage: shared. Tensor graphs (BUFFER/CONST/movement/ALU/REDUCE_AXIS) and kernel IR
(DEFINE_GLOBAL/RANGE/INDEX/LOAD/STORE/REDUCE/END/SINK) are both made of UOps.
Custom kernels are written directly in kernel IR through the helpers on this class.
"""
from __future__ import annotations

import math
import struct
import sys
import types
import threading
import weakref
from _weakref import _remove_dead_weakref
from dataclasses import dataclass
from enum import Enum
from typing import Any

from polygrad.definitions import ops as op_table
from polygrad.dtype import DType, dtypes, normalize_const, to_dtype


class _OpBase(Enum):
    """The members of `Ops` are the rows of the op table, polygrad/definitions/ops.py (numbered in its order)."""

    def __repr__(self) -> str:
        return f"Ops.{self.name}"

    __hash__ = object.__hash__  # members are singletons; identity hashing keeps UOp creation cheap


# every op of the IR; their src counts, dtype classes and levels: polygrad/definitions/ops.py
Ops = _OpBase("Ops", [(name, i) for i, name in enumerate(op_table.NAMES, 1)], module=__name__, qualname="Ops")


def _without_member_getattr(enum_cls: type) -> None:
    """Make `Ops.ADD` a plain class-dictionary read on CPython before 3.12.

    There, EnumType defines `__getattr__` (a fallback for names that are not members), and any
    `__getattr__` on a metaclass routes every attribute read of its classes through a slow hook: each
    `Ops.X` cost about 900 instructions instead of 50, and the compiler and every realize read dozens.
    The members already live in the class dictionary, so the class moves to a copy of its metaclass
    without that fallback; iteration, Ops["ADD"], Ops(value), pickling and member protection are
    EnumType's own methods. Python 3.12 dropped the fallback itself, so nothing changes there."""
    meta = type(enum_cls)
    if sys.version_info >= (3, 12) or "__getattr__" not in vars(meta):
        return
    skip = ("__getattr__", "__dict__", "__weakref__", "__module__", "__doc__", "__qualname__")
    fast = type(f"Fast{meta.__name__}", (type,), {k: v for k, v in vars(meta).items() if k not in skip})
    for name, value in list(vars(fast).items()):
        # methods calling zero-argument super() (__setattr__, __delattr__) close over EnumType: rebind
        # their __class__ cell to the copy, so `Ops.x = ...` and mock.patch work as on EnumType
        func = value.__func__ if isinstance(value, staticmethod) else value
        if isinstance(func, types.FunctionType) and "__class__" in func.__code__.co_freevars:
            cells = tuple(types.CellType(fast) if v == "__class__" else c
                          for v, c in zip(func.__code__.co_freevars, func.__closure__ or ()))
            clone = types.FunctionType(func.__code__, func.__globals__, func.__name__, func.__defaults__, cells)
            clone.__kwdefaults__, clone.__qualname__ = func.__kwdefaults__, func.__qualname__
            setattr(fast, name, staticmethod(clone) if isinstance(value, staticmethod) else clone)
    enum_cls.__class__ = fast


_without_member_getattr(Ops)
_RANGE = Ops.RANGE  # UOp() tests it on every node: a module global is the cheapest read


class _AxisKindBase(str, Enum):
    """What a RANGE is (its arg is (axis id, AxisKind)). A str enum: compares equal to its value."""

    def __repr__(self) -> str:
        return f"AxisKind.{self.name}"

    __str__ = __repr__


# GLOBAL, REDUCE, UPCAST, UNROLL, THREAD, LOCAL, GROUP: polygrad/definitions/ops.py AXIS_KINDS says what each is
AxisKind = _AxisKindBase("AxisKind", list(op_table.AXIS_KINDS), module=__name__, qualname="AxisKind")


def _ops(names: tuple) -> set:
    return {Ops[n] for n in names}


UNARY = _ops(op_table.UNARY)
BINARY = _ops(op_table.BINARY)
ALU = _ops(op_table.ALU)
ELEMENTWISE = _ops(op_table.ELEMENTWISE_OPS)
COMPARISONS = _ops(op_table.COMPARISONS)
MOVEMENT = _ops(op_table.MOVEMENT_OPS)
COMMUTATIVE = _ops(op_table.COMMUTATIVE)


def reduce_identity(op: Ops, dt: DType) -> Any:
    """The value a reduction by `op` (ADD, MUL, MAX) starts from: what it gives over no elements."""
    if op is Ops.ADD:
        return 0
    if op is Ops.MUL:
        return 1
    if op is Ops.MAX:
        return -math.inf if dt.is_float else (dtypes.min(dt) if dt is not dtypes.bool else False)
    raise NotImplementedError(f"no identity for reduce {op}")


@dataclass(frozen=True)
class KernelInfo:
    """Marks the root SINK of an executable kernel; `name` shows up in dumps and stats."""

    name: str = "kernel"
    opts: tuple = ()


def _arg_key(arg: Any) -> Any:
    # -0.0 == 0.0 and 1 == 1.0 == True in Python; keep them apart in the hash-cons key.
    if isinstance(arg, float):
        return (float, struct.pack("<d", arg))
    if isinstance(arg, bool):
        return (bool, arg)
    if isinstance(arg, tuple):
        if _PLAIN_ARG_TYPES.issuperset(map(type, arg)):  # (checked in C: a shape arg, rebuilt often)
            return arg
        return tuple(_arg_key(a) for a in arg)
    return arg


# hash-cons table: key -> weak reference; an entry goes away with its UOp (_forget finds the key in
# _ref_keys: a plain weakref with a shared callback costs a third of a KeyedRef to make)
_uop_cache: dict[tuple, "weakref.ref"] = {}
_ref_keys: dict["weakref.ref", tuple] = {}
_compact_lock = threading.Lock()  # one compact_uop_cache at a time
# Two threads making the same node at once must get one node, or a graph (a kernel's RANGE, say) holds two
# copies of what must be one. Every change to the table is one atomic step under the GIL, so no lock is
# taken: a new node goes in with dict.setdefault, and an entry goes out with _remove_dead_weakref, which
# deletes it only if its node is dead at that moment (the C helper WeakValueDictionary uses). A live entry
# put under the same key meanwhile by another thread is never removed, and a lookup that finds a dead
# entry removes it the same way and tries again. A node's death costs one Python call and no lock, and a
# collection in any thread never waits on one (device.Buffer's finalizer takes the allocator's lock).
_PLAIN_ARGS = (type(None), int, str)
_PLAIN_ARG_TYPES = frozenset(_PLAIN_ARGS)
# arg types that are their own hash-cons key (compared by identity, or holding no floats or bools):
# modules that define such args (Buffer, SlotRef) add them, so UOp() skips _arg_key for them
SELF_KEYED_ARGS: set[type] = {type(None), int, str}
# arg types with a `_node` slot: a weak reference (or None) to the source-less node UOp.fresh made over that
# arg, which is kept there instead of in the hash-cons table (device.Buffer: one new node per eager op)
OWN_NODE_ARGS: set[type] = set()


def _forget(ref: "weakref.ref") -> None:
    key = _ref_keys.pop(ref, None)
    if key is not None:
        _remove_dead_weakref(_uop_cache, key)


def compact_uop_cache() -> None:
    """Rebuild the hash-cons table at its live size: a dict never shrinks as entries go, so after a
    burst of graphs the table kept its peak size (megabytes) until the process ended."""
    with _compact_lock:
        for table in (_uop_cache, _ref_keys):
            live = list(table.items())
            table.clear()
            table.update(live)
        # nodes that died meanwhile (a collection): their _forget found no entry, so it came back
        for key in [key for key, ref in _uop_cache.items() if ref() is None]:
            _remove_dead_weakref(_uop_cache, key)
        for ref in [ref for ref in _ref_keys if ref() is None]:
            _ref_keys.pop(ref, None)


# What the IR modules above ops.py give UOp's convenience methods: shape and device inference
# (uop/shape.py), symbolic sizes (uop/sint.py: printing, truth of a comparison, bind/unbind) and
# reshape (uop/movement.py). Each module fills its entries when it is imported, and polygrad.uop's
# __init__ imports them all, so they are present whenever a UOp exists; ops.py imports none of them
# (the IR core depends on nothing above it).
provided: dict[str, Any] = {}


class UOp:
    """One node of the IR. Built only through `UOp(...)`, which returns a shared instance."""

    __slots__ = ("op", "dtype", "src", "arg", "_shape", "_device", "_toposort", "__weakref__")

    def __new__(cls, op: Ops, dtype: DType | None = None, src: tuple = (), arg: Any = None):
        if op is _RANGE and type(arg) is tuple and len(arg) > 1 and type(arg[1]) is str:
            # a kind given as a plain string hashes and compares like its AxisKind: store the enum,
            # so one range never comes back with either spelling depending on which was made first
            arg = (arg[0], AxisKind(arg[1]), *arg[2:])
        key = (op, dtype, src, arg if type(arg) in SELF_KEYED_ARGS else _arg_key(arg))
        try:
            ref = _uop_cache.get(key)
        except TypeError as e:
            raise TypeError(f"UOp arg must be hashable, got {arg!r}") from e
        if ref is not None:
            hit = ref()
            if hit is not None:
                return hit
        if not src and type(arg) in OWN_NODE_ARGS:  # a node UOp.fresh made: found through its arg, not the table
            own = arg._node
            if own is not None:
                hit = own()
                if hit is not None and hit.op is op and hit.dtype is dtype:
                    return hit
        self = object.__new__(cls)  # made before the lock: a collection here runs no code under it
        self.op, self.dtype, self.src, self.arg = op, dtype, src, arg
        self._shape = self._device = self._toposort = None
        ref = weakref.ref(self, _forget)
        # insert if absent, in one step (dict.setdefault under the GIL): another thread may have made the node
        # since the lookup, and then that node is the one
        held = _uop_cache.setdefault(key, ref)
        while held is not ref:
            hit = held()
            if hit is not None:
                return hit
            _remove_dead_weakref(_uop_cache, key)  # a dead node's entry, its _forget not run yet
            held = _uop_cache.setdefault(key, ref)
        _ref_keys[ref] = key
        return self

    @staticmethod
    def fresh(op: Ops, dtype: DType | None, arg: Any) -> "UOp":
        """UOp(op, dtype, (), arg) for an arg of OWN_NODE_ARGS that no node can hold yet (a Buffer its caller
        just made and has shown no one: engine/realize.realize_eager's output). The node is not put in the
        hash-cons table: the arg's `_node` slot refers to it (weakly, without a callback), and UOp() looks
        there after a table miss, so the node is still the one every UOp(op, dtype, (), arg) returns. Its
        death then runs no Python code (a table entry needs _forget), and no key is built."""
        self = object.__new__(UOp)
        self.op, self.dtype, self.src, self.arg = op, dtype, (), arg
        self._shape = self._device = self._toposort = None
        arg._node = weakref.ref(self)
        return self

    def __reduce__(self):
        return UOp, (self.op, self.dtype, self.src, self.arg)

    def replace(self, **kw) -> "UOp":
        return UOp(kw.get("op", self.op), kw.get("dtype", self.dtype), kw.get("src", self.src),
                   kw.get("arg", self.arg))

    def __repr__(self) -> str:
        if self.op in (Ops.DEFINE_VAR, Ops.BIND) or (self.op in _SIZE_OPS and self.dtype is not None
                                                       and self.dtype.is_int and _is_size_expr(self)):
            return provided["sym_str"](self)  # a symbolic size in a shape: 'b=3', '(b*16)'
        return pretty(self)

    # ---- graph walking
    def toposort(self) -> list["UOp"]:
        """All nodes reachable from self, sources before users (the post-order of a depth-first walk
        taking sources in order). A node's order is cached on it; a walk reaching a node with a cached
        order splices it in (deduplicated) instead of walking below it, which gives the same order."""
        if self._toposort is not None:
            return [*self._toposort, self]
        merged: dict[UOp, None] = {}
        for s in self.src:  # every source a leaf or already ordered: merge their orders (the common case)
            sub = s._toposort
            if sub is None:
                if s.src:
                    break
            elif sub:
                merged.update(dict.fromkeys(sub))
            merged[s] = None
        else:
            order = self._toposort = tuple(merged)
            return [*order, self]
        out: list[UOp] = []
        seen: set[int] = set()
        stack: list[tuple[UOp, bool]] = [(self, False)]
        while stack:
            node, visited = stack.pop()
            if visited:
                out.append(node)
                continue
            if id(node) in seen:
                continue
            seen.add(id(node))
            sub = node._toposort
            if sub is not None or not node.src:
                for n in sub or ():
                    if id(n) not in seen:
                        seen.add(id(n))
                        out.append(n)
                out.append(node)
                continue
            stack.append((node, True))
            for s in reversed(node.src):
                if id(s) not in seen:
                    stack.append((s, False))
        # cached without self: a node holding itself would be a reference cycle, and its buffers
        # would wait for the garbage collector instead of being freed when the graph is dropped
        self._toposort = tuple(out[:-1])
        return out

    # ---- constants
    @staticmethod
    def const(dtype: DType, value: Any, device: str | None = None) -> "UOp":
        dtype = to_dtype(dtype)
        src = (UOp(Ops.DEVICE, None, (), device),) if device is not None else ()
        return UOp(Ops.CONST, dtype, src, normalize_const(value, dtype))

    def const_like(self, value: Any) -> "UOp":
        if self.op is Ops.CONST and self.src:
            return UOp.const(self.dtype, value, self.src[0].arg)
        return UOp.const(self.dtype, value)

    # ---- shape (tensor-graph level)
    @property
    def shape(self) -> tuple[int, ...]:
        if self._shape is None:
            _fill_bottom_up(self, "_shape", provided["infer_shape"])
        return self._shape

    @property
    def device(self) -> str | None:
        if self._device is None:
            _fill_bottom_up(self, "_device", provided["infer_device"])
        return self._device if self._device != "" else None

    # ---- elementwise builders (both levels)
    def alu(self, op: Ops, *srcs: "UOp") -> "UOp":
        out_dtype = dtypes.bool if op in COMPARISONS else self.dtype
        if op is Ops.WHERE:
            out_dtype = srcs[0].dtype
        return UOp(op, out_dtype, (self,) + srcs)

    def _operand(self, x: Any) -> "UOp":
        if isinstance(x, UOp):
            return x
        dt = self.dtype if self.dtype is not None else dtypes.int32
        return UOp.const(dt, x)

    def cast(self, dtype: DType) -> "UOp":
        dtype = to_dtype(dtype)
        return self if dtype == self.dtype else UOp(Ops.CAST, dtype, (self,))

    def bitcast(self, dtype: DType) -> "UOp":
        return UOp(Ops.BITCAST, to_dtype(dtype), (self,))

    def _value(self) -> "UOp":
        # an INDEX used as a value means "load it"
        return UOp(Ops.LOAD, self.dtype, (self,)) if self.op is Ops.INDEX else self

    def _bin(self, op: Ops, other: Any, reverse: bool = False) -> "UOp":
        a, b = self._value(), self._operand(other)._value()
        if reverse:
            a, b = b, a
        return a.alu(op, b)

    def __add__(self, x): return self._bin(Ops.ADD, x)  # noqa: E704
    def __radd__(self, x): return self._bin(Ops.ADD, x, True)  # noqa: E704
    def __mul__(self, x): return self._bin(Ops.MUL, x)  # noqa: E704
    def __rmul__(self, x): return self._bin(Ops.MUL, x, True)  # noqa: E704
    def __sub__(self, x): return self._bin(Ops.ADD, -self._operand(x)._value())  # noqa: E704
    def __rsub__(self, x): return self._operand(x)._value()._bin(Ops.ADD, -self._value())  # noqa: E704
    def __neg__(self): return self._value().alu(Ops.NEG)  # noqa: E704
    def __floordiv__(self, x): return self._bin(Ops.IDIV, x)  # noqa: E704
    def __mod__(self, x): return self._bin(Ops.MOD, x)  # noqa: E704
    def __truediv__(self, x): return self._bin(Ops.FDIV, x)  # noqa: E704
    def __lt__(self, x): return self._bin(Ops.CMPLT, x)  # noqa: E704
    def __gt__(self, x): return self._bin(Ops.CMPLT, x, True)  # noqa: E704
    def ne(self, x): return self._bin(Ops.CMPNE, x)  # noqa: E704
    def eq(self, x): return self._bin(Ops.CMPEQ, x)  # noqa: E704
    def maximum(self, x): return self._bin(Ops.MAX, x)  # noqa: E704
    def fma(self, b, c): return UOp(Ops.FMA, self.dtype, (self._value(), self._operand(b)._value(), self._operand(c)._value()))  # noqa: E501,E704
    def where(self, a, b): return self._value().alu(Ops.WHERE, self._operand(a)._value(), self._operand(b)._value())  # noqa: E501,E704
    def __and__(self, x): return self._bin(Ops.AND, x)  # noqa: E704
    def __or__(self, x): return self._bin(Ops.OR, x)  # noqa: E704
    def __xor__(self, x): return self._bin(Ops.XOR, x)  # noqa: E704

    __hash__ = object.__hash__

    def __bool__(self) -> bool:
        # a comparison between symbolic sizes (`n < 4` with n a bound Variable) is decided from the
        # values; every other node is truthy, as objects are
        if self.op in COMPARISONS:
            return provided["sym_truth"](self)
        return True

    # ---- symbolic sizes (polygrad.Variable)
    def bind(self, value: int) -> "UOp":
        """This Variable (a DEFINE_VAR) with this call's value: BIND(var, CONST value)."""
        return provided["bind"](self, value)

    def unbind(self) -> tuple["UOp", int]:
        """(Variable, value) of a bound variable."""
        return provided["unbind"](self)

    # ---- kernel-IR builders (custom kernels)
    @staticmethod
    def range(ctx: Any, end: "int | UOp", axis: int = 0, kind: "str | AxisKind" = "global") -> "UOp":
        """A loop variable 0 <= r < end. `ctx` is the kernel's placeholder context."""
        end_uop = end if isinstance(end, UOp) else UOp.const(dtypes.int32, int(end))
        return UOp(Ops.RANGE, dtypes.int32, (end_uop,), (axis, AxisKind(kind)))

    @property
    def ctx(self) -> Any:
        return ("kernel", self.arg[0] if self.op is Ops.DEFINE_GLOBAL else None)

    @staticmethod
    def placeholder(shape: tuple[int, ...], dtype: DType, slot: int) -> "UOp":
        return UOp(Ops.DEFINE_GLOBAL, to_dtype(dtype), (), (slot, tuple(shape)))

    def numel(self) -> int:
        return math.prod(self.arg[1]) if self.op is Ops.DEFINE_GLOBAL else math.prod(self.shape)

    def flatten(self) -> "UOp":
        if self.op is Ops.DEFINE_GLOBAL:
            return UOp(Ops.DEFINE_GLOBAL, self.dtype, (), (self.arg[0], (self.numel(),)))
        return provided["reshape"](self, (math.prod(self.shape),))

    def __getitem__(self, idx) -> "UOp":
        if self.op is not Ops.DEFINE_GLOBAL:
            raise TypeError("indexing a UOp is only for kernel placeholders (DEFINE_GLOBAL)")
        idxs = idx if isinstance(idx, tuple) else (idx,)
        shape = self.arg[1]
        if len(idxs) != len(shape):
            raise IndexError(f"placeholder of shape {shape} indexed with {len(idxs)} indices")
        flat: UOp = UOp.const(dtypes.int32, 0)
        for i, n in zip(idxs, shape):
            flat = flat * n + (i if isinstance(i, UOp) else UOp.const(dtypes.int32, int(i)))
        return UOp(Ops.INDEX, self.dtype, (self, flat))

    def load(self) -> "UOp":
        return self._value()

    def store(self, value: Any) -> "UOp":
        if self.op is not Ops.INDEX:
            raise TypeError("store() is called on an indexed placeholder, as out[i].store(v)")
        v = self._operand(value)._value()
        width = vector_width(v)
        if width > 1 and v.dtype != self.dtype:
            raise TypeError(f"vector STORE dtype mismatch: a {v.dtype.name}x{width} value into {self.dtype.name} "
                            f"memory; cast the value first, e.g. value.cast(dtypes.{self.dtype.name})")
        return UOp(Ops.STORE, None, (self, v))

    @staticmethod
    def vectorize(*elems: Any) -> "UOp":
        """A vector of scalars; storing it at out[i] writes out[i], out[i+1], ... (custom kernels)."""
        vals = [e._value() if isinstance(e, UOp) else UOp.const(dtypes.default_float, e) for e in elems]
        if len({v.dtype for v in vals}) != 1:
            raise TypeError(f"vectorize needs elements of one dtype, got {[v.dtype.name for v in vals]}")
        return UOp(Ops.VECTORIZE, vals[0].dtype, tuple(vals), len(vals))

    def end(self, *ranges: "UOp") -> "UOp":
        return UOp(Ops.END, None, (self,) + ranges)

    def sink(self, *more: "UOp", arg: Any = None) -> "UOp":
        return UOp(Ops.SINK, None, (self,) + more, arg)


_SIZE_OPS = {Ops.ADD, Ops.MUL, Ops.IDIV, Ops.MOD, Ops.NEG, Ops.MAX}


def _is_size_expr(u: "UOp") -> bool:
    nodes = u.toposort()
    return len(nodes) < 40 and any(n.op in (Ops.DEFINE_VAR, Ops.BIND) for n in nodes) and \
        all(n.op in _SIZE_OPS or n.op in (Ops.CONST, Ops.DEFINE_VAR, Ops.BIND) for n in nodes)


def _fill_bottom_up(root: UOp, attr: str, rule) -> None:
    """Cache `attr` (computed by `rule`, which reads the sources' values) on root and every uncached node
    below it, sources first, with an explicit stack: deep graphs never hit Python's recursion limit, and
    the walk stops at nodes already cached, so a lazy chain built one op at a time stays linear."""
    stack: list[tuple[UOp, bool]] = [(root, False)]
    while stack:
        node, ready = stack.pop()
        if getattr(node, attr) is not None:
            continue
        if ready:
            if node is root:
                setattr(node, attr, rule(node))
                continue
            try:
                setattr(node, attr, rule(node))
            except Exception:  # a source whose value the user may not need: left for it to raise
                pass
            continue
        stack.append((node, True))
        stack.extend((s, False) for s in node.src if getattr(s, attr) is None)


def vector_width(u: UOp) -> int:
    """Lanes of a kernel-IR value: a VECTORIZE's count, carried through elementwise ops; 1 for scalars."""
    widths = {n: n.arg for n in u.toposort() if n.op is Ops.VECTORIZE}
    if not widths:
        return 1
    for n in u.toposort():
        if n.op in ELEMENTWISE and any(s in widths for s in n.src):
            widths[n] = max(widths[s] for s in n.src if s in widths)
    return widths.get(u, 1)


def pretty(u: UOp, limit: int = 40) -> str:
    """A readable multi-line dump of a UOp graph (shared nodes printed once, as %n)."""
    nodes = u.toposort()
    if len(nodes) > limit:
        return f"UOp({u.op}, {u.dtype}, <{len(u.src)} srcs>, arg={u.arg!r}) [{len(nodes)} nodes]"
    names = {id(n): f"%{i}" for i, n in enumerate(nodes)}
    lines = []
    for n in nodes:
        srcs = ", ".join(names[id(s)] for s in n.src)
        lines.append(f"{names[id(n)]} = {n.op.name}({srcs}) {n.dtype} arg={n.arg!r}")
    return "\n".join(lines)


# UOp(...) goes through the type's call (slot dispatch, an argument tuple): calling __new__ itself makes the
# same node for a quarter less. The eager path, which makes two nodes a realize, calls new_uop(UOp, ...).
new_uop = UOp.__new__
