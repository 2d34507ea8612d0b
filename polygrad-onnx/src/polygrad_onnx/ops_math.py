"""Elementwise operators: arithmetic, comparisons, logic, activations, casts.

Stage: operator implementations (graph.py runs them). Input: a Node and its input Tensors (or NumPy arrays
for the host versions). Output: Tensors (or arrays). Each ONNX operator is a row or a few lines; the
NumPy versions fold values known at load (shape arithmetic) and follow ONNX's rules too (integer Div
truncates).
"""
from __future__ import annotations

import math

import numpy as np

from polygrad import Tensor, dtypes
from polygrad.uop import sint

from polygrad_onnx.node import Node, as_tensor, np_dtype, op, pg_dtype

UNARY = {
    "Abs": lambda x: x.abs(), "Neg": lambda x: -x, "Sqrt": lambda x: x.sqrt(), "Exp": lambda x: x.exp(),
    "Log": lambda x: x.log(), "Erf": lambda x: x.erf(), "Sin": lambda x: x.sin(), "Cos": lambda x: x.cos(),
    "Tan": lambda x: x.tan(), "Asin": lambda x: x.asin(), "Acos": lambda x: x.acos(), "Atan": lambda x: x.atan(),
    "Sinh": lambda x: x.sinh(), "Cosh": lambda x: x.cosh(), "Asinh": lambda x: x.asinh(),
    "Acosh": lambda x: x.acosh(), "Atanh": lambda x: x.atanh(), "Floor": lambda x: x.floor(),
    "Ceil": lambda x: x.ceil(), "Reciprocal": lambda x: x.reciprocal(), "Relu": lambda x: x.relu(),
    "Sigmoid": lambda x: x.sigmoid(), "Tanh": lambda x: x.tanh(), "Softsign": lambda x: x.softsign(),
    "Mish": lambda x: x.mish(), "HardSwish": lambda x: x.hardswish(), "Not": lambda x: x.logical_not(),
    "Sign": lambda x: x.sign(), "IsNaN": lambda x: x.isnan(), "BitwiseNot": lambda x: x.bitwise_not(),
    "Identity": lambda x: x,
    # round half to even, as ONNX specifies
    "Round": lambda x: x.round(),
    "Softplus": lambda x: (x.maximum(0) + (-x.abs()).exp().log1p()),
}

HOST_UNARY = {"Neg": np.negative, "Abs": np.abs, "Identity": lambda x: x, "Not": np.logical_not,
              "Floor": np.floor, "Ceil": np.ceil, "Sqrt": np.sqrt}

for _name, _fn in UNARY.items():
    _host = HOST_UNARY.get(_name)
    op(_name, host=None if _host is None else (lambda node, x, _h=_host: np.asarray(_h(x))))(
        lambda node, x, _fn=_fn: _fn(x))


def _int_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype == object or b.dtype == object:
        return np.asarray(a // b)  # symbolic sizes: shape arithmetic divides exactly or floors non-negatives
    if np.issubdtype(np.result_type(a, b), np.integer):
        q = np.abs(a) // np.maximum(np.abs(b), 1)
        return np.where((a < 0) != (b < 0), -q, q).astype(np.result_type(a, b))
    return a / b


BINARY = {"Add": (lambda a, b: a + b, np.add), "Sub": (lambda a, b: a - b, np.subtract),
          "Mul": (lambda a, b: a * b, np.multiply),
          "Div": (lambda a, b: a.idiv(b) if dtypes.is_int(a.dtype) else a / b, _int_div),
          "Equal": (lambda a, b: a == b, np.equal), "Less": (lambda a, b: a < b, np.less),
          "Greater": (lambda a, b: a > b, np.greater), "LessOrEqual": (lambda a, b: a <= b, np.less_equal),
          "GreaterOrEqual": (lambda a, b: a >= b, np.greater_equal),
          "And": (lambda a, b: a.logical_and(b), np.logical_and), "Or": (lambda a, b: a.logical_or(b), np.logical_or),
          "Xor": (lambda a, b: a.logical_xor(b), np.logical_xor),
          "BitwiseAnd": (lambda a, b: a.bitwise_and(b), np.bitwise_and),
          "BitwiseOr": (lambda a, b: a.bitwise_or(b), np.bitwise_or),
          "BitwiseXor": (lambda a, b: a.bitwise_xor(b), np.bitwise_xor)}

# shape arithmetic over symbolic sizes (object arrays): sint keeps results canonical, so equal sizes are one
# UOp; a comparison is decided from the bounds of the difference, never from the values bound at capture
SIZE_ARITHMETIC = {"Add": sint.sadd, "Sub": sint.ssub, "Mul": sint.smul, "Div": sint.sdiv}
# (decided true when the difference's bounds (lo, hi) satisfy the first test, false for the second)
SIZE_COMPARISONS = {
    "Equal": (lambda lo, hi: lo == hi == 0, lambda lo, hi: lo > 0 or hi < 0),
    "Less": (lambda lo, hi: hi < 0, lambda lo, hi: lo >= 0),
    "Greater": (lambda lo, hi: lo > 0, lambda lo, hi: hi <= 0),
    "LessOrEqual": (lambda lo, hi: hi <= 0, lambda lo, hi: lo > 0),
    "GreaterOrEqual": (lambda lo, hi: lo >= 0, lambda lo, hi: hi < 0),
}


def _size_compare(node: Node, kind: str, a, b) -> bool:
    """`a kind b` (kind a key of SIZE_COMPARISONS) for two sizes, one of them symbolic or not."""
    if not sint.is_sym(a) and not sint.is_sym(b):
        return bool(BINARY[kind][1](int(a), int(b)))
    diff = sint.ssub(a, b)
    lo, hi = sint.vmin(diff), sint.vmax(diff)
    true, false = SIZE_COMPARISONS[kind]
    if true(lo, hi):
        return True
    if false(lo, hi):
        return False
    raise node.fail(f"compares the sizes {sint.sym_str(a)} and {sint.sym_str(b)}, and the answer depends on their "
                    "values; give the dimension a fixed size (a captured model serves every value alike)")


def _host_binary(node: Node, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != object and b.dtype != object:
        return np.asarray(BINARY[node.op][1](a, b))
    if node.op in SIZE_ARITHMETIC:
        return np.asarray(np.frompyfunc(SIZE_ARITHMETIC[node.op], 2, 1)(a, b), dtype=object)
    if node.op in SIZE_COMPARISONS:
        return np.frompyfunc(lambda x, y: _size_compare(node, node.op, x, y), 2, 1)(a, b).astype(bool)
    raise node.fail("applies to symbolic sizes an operation polygrad.onnx cannot fold at load; give the dimension "
                    "a fixed size")


for _name, (_fn, _host) in BINARY.items():
    op(_name, host=_host_binary)(lambda node, a, b, _fn=_fn: _fn(a, b))


@op("Pow")
def pow_(node: Node, x: Tensor, y: Tensor) -> Tensor:
    if dtypes.is_int(x.dtype):
        return x.float().pow(y.float()).round().cast(x.dtype)
    return x.pow(y.cast(x.dtype))


@op("Mod")
def mod(node: Node, a: Tensor, b: Tensor) -> Tensor:
    if node.attr("fmod", 0):
        return a.fmod(b)
    return a.mod(b)  # the sign of the divisor, as Python's %


@op("BitShift")
def bit_shift(node: Node, a: Tensor, b: Tensor) -> Tensor:
    direction = node.only("direction", ("LEFT", "RIGHT"), None)
    return (a.lshift(b) if direction == "LEFT" else a.rshift(b)).cast(a.dtype)


def _variadic(fn):
    def run(node: Node, *xs: Tensor) -> Tensor:
        out = xs[0]
        for x in xs[1:]:
            out = fn(out, x)
        return out
    return run


def _host_extreme(pick_first: str):
    """Max/Min of values known at load; of sizes, decided from their bounds (GreaterOrEqual/LessOrEqual)."""
    def run(node: Node, *xs: np.ndarray) -> np.ndarray:
        xs = [np.asarray(x) for x in xs]
        if all(x.dtype != object for x in xs):
            return np.asarray(_variadic(np.maximum if pick_first == "GreaterOrEqual" else np.minimum)(node, *xs))
        pick = np.frompyfunc(lambda a, b: a if _size_compare(node, pick_first, a, b) else b, 2, 1)
        out = xs[0]
        for x in xs[1:]:
            out = pick(out, x)
        return np.asarray(out, dtype=object)
    return run


op("Max", host=_host_extreme("GreaterOrEqual"))(_variadic(lambda a, b: a.maximum(b)))
op("Min", host=_host_extreme("LessOrEqual"))(_variadic(lambda a, b: a.minimum(b)))
op("Sum")(_variadic(lambda a, b: a + b))


@op("Mean")
def mean(node: Node, *xs: Tensor) -> Tensor:
    return _variadic(lambda a, b: a + b)(node, *xs) / len(xs)


@op("IsInf")
def is_inf(node: Node, x: Tensor) -> Tensor:
    return x.isinf(bool(node.attr("detect_positive", 1)), bool(node.attr("detect_negative", 1)))


@op("Where", host=lambda node, c, a, b: np.asarray(np.where(c, a, b)))
def where(node: Node, cond: Tensor, a: Tensor, b: Tensor) -> Tensor:
    return cond.cast(dtypes.bool).where(a, b)


@op("Clip")
def clip(node: Node, x: Tensor, lo: Tensor | None = None, hi: Tensor | None = None) -> Tensor:
    if lo is not None:
        x = x.maximum(lo.cast(x.dtype))
    if hi is not None:
        x = x.minimum(hi.cast(x.dtype))
    return x


# ---- activations with attributes
@op("LeakyRelu")
def leaky_relu(node: Node, x: Tensor) -> Tensor:
    return x.leaky_relu(node.attr("alpha", 0.01))


@op("Elu")
def elu(node: Node, x: Tensor) -> Tensor:
    return x.elu(node.attr("alpha", 1.0))


@op("Celu")
def celu(node: Node, x: Tensor) -> Tensor:
    return x.celu(node.attr("alpha", 1.0))


@op("Selu")
def selu(node: Node, x: Tensor) -> Tensor:
    return x.selu(node.attr("alpha", 1.67326319217681884765625), node.attr("gamma", 1.05070102214813232421875))


@op("HardSigmoid")
def hard_sigmoid(node: Node, x: Tensor) -> Tensor:
    return (x * node.attr("alpha", 0.2) + node.attr("beta", 0.5)).clip(0, 1)


@op("ThresholdedRelu")
def thresholded_relu(node: Node, x: Tensor) -> Tensor:
    return (x > node.attr("alpha", 1.0)).where(x, 0)


@op("PRelu")
def prelu(node: Node, x: Tensor, slope: Tensor) -> Tensor:
    return (x < 0).where(x * slope, x)


@op("Gelu")
def gelu(node: Node, x: Tensor) -> Tensor:
    mode = node.only("approximate", ("none", "tanh"), "none")
    if mode == "tanh":
        return 0.5 * x * (1 + (math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)).tanh())
    return 0.5 * x * (1 + (x * (1 / math.sqrt(2))).erf())


@op("Swish")
def swish(node: Node, x: Tensor) -> Tensor:
    return x * (x * node.attr("alpha", 1.0)).sigmoid()


@op("Shrink")
def shrink(node: Node, x: Tensor) -> Tensor:
    bias, lambd = node.attr("bias", 0.0), node.attr("lambd", 0.5)
    return (x < -lambd).where(x + bias, (x > lambd).where(x - bias, 0)).cast(x.dtype)


# ---- casts
def _cast_host(node: Node, x: np.ndarray) -> np.ndarray:
    node.attr("saturate", 1)  # only meaningful for float8 targets, which np_dtype refuses
    to = np_dtype(node.attr("to"), node)
    if x.dtype == object and np.issubdtype(to, np.integer):
        return x
    if x.dtype == object and any(sint.is_sym(v) for v in x.reshape(-1)):
        return as_tensor(x, node).cast(dtypes.from_np(to))  # a size as float data: a tensor (size_tensor)
    return x.astype(to)


@op("Cast", host=_cast_host)
def cast(node: Node, x: Tensor) -> Tensor:
    node.attr("saturate", 1)
    node.only("round_mode", ("up",), "up")
    to = pg_dtype(node.attr("to"), node)
    if to == dtypes.bool:
        return x != 0
    return x.cast(to)


def _cast_like_host(node: Node, x: np.ndarray, like: np.ndarray) -> np.ndarray:
    node.attr("saturate", 1)
    return x.astype(like.dtype) if like.dtype != object else x


@op("CastLike", host=_cast_like_host)
def cast_like(node: Node, x: Tensor, like: Tensor) -> Tensor:
    node.attr("saturate", 1)
    node.only("round_mode", ("up",), "up")
    return (x != 0) if like.dtype == dtypes.bool else x.cast(like.dtype)
