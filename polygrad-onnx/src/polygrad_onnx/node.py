"""What an operator implementation sees: a node's attributes (every one must be read) and the op table.

Stage: shared by the operator modules and graph.py. Input: a NodeProto. Output: `Node` (attribute access
that records what was read, so an attribute an implementation does not know is an error instead of being
ignored) and `OPS`, the operator table the ops_* modules fill through `op(...)`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from polygrad import Tensor, dtypes
from polygrad.uop import sint

from polygrad_onnx.errors import OnnxError, UnsupportedOpError
from polygrad_onnx.reader import NUMPY_TYPES, onnx_module


@dataclass(frozen=True)
class OpDef:
    """One operator: its Tensor implementation, the inputs it needs at load time as NumPy arrays (shapes,
    axes, pads), and an optional NumPy implementation used when every input is known at load (folding)."""

    fn: Callable
    static: tuple[int, ...] = ()
    host: Callable | None = None
    any_input: bool = False  # reads only its inputs' shapes (Shape, Size): runs on the host whatever they are
    scoped: bool = False  # control flow (If, Loop, Scan): gets the graph.Scope and its inputs as they are


OPS: dict[str, OpDef] = {}


def op(*names: str, static: tuple[int, ...] = (), host: Callable | None = None, any_input: bool = False,
       scoped: bool = False) -> Callable:
    """Register the decorated function as the implementation of the ONNX operators `names`."""
    def register(fn: Callable) -> Callable:
        for name in names:
            OPS[name] = OpDef(fn, static, host, any_input, scoped)
        return fn
    return register


class Node:
    """A node being run: its attributes (read through attr/ints/floats, each read recorded) and errors that
    name it."""

    def __init__(self, proto: Any, opset: int):
        onnx = onnx_module()
        self.proto = proto
        self.op = proto.op_type
        self.opset = opset
        self.attrs = {a.name: onnx.helper.get_attribute_value(a) for a in proto.attribute}
        self.used: set[str] = set()

    @property
    def label(self) -> str:
        return f"{self.op} node {self.proto.name!r}" if self.proto.name else \
            f"{self.op} node (output {self.proto.output[0]!r})"

    def attr(self, name: str, default: Any = None) -> Any:
        self.used.add(name)
        v = self.attrs.get(name, default)
        return v.decode() if isinstance(v, bytes) else v

    def ints(self, name: str, default: Any = None) -> list[int] | None:
        v = self.attr(name, default)
        return None if v is None else [int(x) for x in v]

    def fail(self, why: str) -> OnnxError:
        return OnnxError(f"{self.label}: {why}")

    def unsupported(self, name: str, value: Any) -> UnsupportedOpError:
        return UnsupportedOpError(f"{self.label}: attribute {name}={value!r} is not supported by polygrad.onnx")

    def only(self, name: str, allowed: tuple, default: Any) -> Any:
        """The attribute's value, or UnsupportedOpError when it is not one of `allowed`."""
        v = self.attr(name, default)
        if v not in allowed:
            raise self.unsupported(name, v)
        return v

    def check_all_read(self) -> None:
        unread = sorted(set(self.attrs) - self.used)
        if unread:
            raise UnsupportedOpError(f"{self.label}: attribute(s) {unread} are not supported by polygrad.onnx")


def np_dtype(onnx_type: int, node: Node | None = None) -> Any:
    """The NumPy dtype of an ONNX element type, or an UnsupportedOpError."""
    if onnx_type not in NUMPY_TYPES:
        name = onnx_module().TensorProto.DataType.Name(onnx_type) if onnx_type else "UNDEFINED"
        where = f"{node.label}: " if node is not None else ""
        raise UnsupportedOpError(f"{where}element type {name} is not supported by polygrad.onnx (it holds "
                                 "float16/32/64, int8..int64, uint8..uint64 and bool)")
    return np.dtype(NUMPY_TYPES[onnx_type])


def pg_dtype(onnx_type: int, node: Node | None = None) -> Any:
    return dtypes.from_np(np_dtype(onnx_type, node))


def ints_of(value: Any) -> list:
    """A 1-D static value (shape, axes, pads) as a list of ints (or symbolic sizes)."""
    return [v if not isinstance(v, (np.integer, int)) else int(v) for v in np.asarray(value).reshape(-1).tolist()]


def size_tensor(size: Any) -> Tensor:
    """A size as int64 tensor data, shape (1,): a symbolic one is the entry at that index of a range over its
    largest value (a shrink by the size, so one program serves every value of its variables)."""
    if not sint.is_sym(size):
        return Tensor(np.array([int(size)], dtype=np.int64))
    table = Tensor.arange(sint.vmax(size) + 1, dtype=dtypes.int64)
    return table.shrink(((size, sint.sadd(size, 1)),))


def as_tensor(value: Any, node: Node | None = None) -> Tensor:
    """A value of the graph as a Tensor: host arrays become constants, symbolic sizes size_tensor()s."""
    if isinstance(value, Tensor):
        return value
    arr = np.asarray(value)
    if arr.dtype != object:
        return Tensor(arr)
    if not all(isinstance(v, (int, np.integer)) or sint.is_sym(v) for v in arr.reshape(-1)):
        where = f"{node.label}: " if node is not None else ""
        raise OnnxError(f"{where}a value of the graph holds {sorted({type(v).__name__ for v in arr.reshape(-1)})}, "
                        "not numbers or sizes; re-export the model with these values computed in tensors")
    if all(not sint.is_sym(v) for v in arr.reshape(-1)):
        return Tensor(arr.astype(np.int64))
    parts = [size_tensor(v) for v in arr.reshape(-1)]
    flat = parts[0].cat(*parts[1:]) if len(parts) > 1 else parts[0]
    return flat.reshape(arr.shape)
