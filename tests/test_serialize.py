"""The serialised kernel form (polygrad.uop.serialize): every kernel the op suite schedules round-trips.

A module fixture runs a broad set of tensor ops on INTERP (no compiler, so it stays quick) and records
the AST of every kernel the runtime asks a program for (`programs.get_program(ast, device)`: the
scheduler's output, before lowering). Each AST, raw and after `simplify_indices` (the device-independent
form), must come back from `loads(dumps(ast))` as the very same hash-consed UOp, with deterministic
bytes. Error tests check that bad data raises `KernelFormatError` and never evaluates anything.
"""
from __future__ import annotations

import json
import math
import struct

import numpy as np
import pytest

from polygrad import Context, Tensor, dtypes, nn
from polygrad.codegen.passes import simplify_indices
from polygrad.engine import programs
from polygrad.errors import PolygradError
from polygrad.uop.ops import KernelInfo, Ops, UOp
from polygrad.uop.serialize import (FORMAT, VERSION, KernelFormatError, decode_arg, dumps, dumps_many,
                                    encode_arg, loads, loads_many)

DEV = "INTERP"


def _t(shape, dtype=dtypes.float32, seed=0, lo=-3.0, hi=3.0):
    rng = np.random.default_rng(seed)
    dt = dtypes.float32 if dtype in (dtypes.float16, dtypes.bfloat16) else dtype
    if dt.is_float:
        a = rng.uniform(lo, hi, shape).astype(dt.np)
    elif dt is dtypes.bool:
        a = rng.integers(0, 2, shape).astype(np.bool_)
    else:
        a = rng.integers(max(int(lo), dtypes.min(dt)), min(int(hi) + 1, dtypes.max(dt)), shape).astype(dt.np)
    t = Tensor(a, device=DEV)
    return t.cast(dtype) if dtype is not dt else t


def _mlp_step():
    Tensor.manual_seed(1)
    l1, l2 = nn.Linear(6, 8), nn.Linear(8, 3)
    params = nn.get_parameters([l1, l2])
    opt = nn.optim.Adam(params, lr=0.01)
    x, y = _t((5, 6)), Tensor(np.array([0, 1, 2, 1, 0], dtype=np.int32), device=DEV)
    with Context(TRAINING=1):
        opt.zero_grad()
        loss = l2(l1(x).relu()).sparse_categorical_crossentropy(y)
        loss.backward()
        opt.step()
    return loss


def _sgd_step():
    w = Tensor(np.ones((4, 3), np.float32), device=DEV, requires_grad=True)
    opt = nn.optim.SGD([w], lr=0.1, momentum=0.9)
    with Context(TRAINING=1):
        opt.zero_grad()
        ((_t((2, 4)) @ w).tanh() ** 2).mean().backward()
        opt.step()
    return w


def _custom():
    def double(out, a):
        i = UOp.range(out.ctx, a.numel(), 0)
        return out[i * 2].store(UOp.vectorize(a[i] * 2, a[i] + 1)).end(i).sink(arg=KernelInfo(name="dbl"))
    return Tensor.empty(8, device=DEV).custom_kernel(_t((4,)), fxn=double)[0]


def _unary(fn, dtype=dtypes.float32, lo=-3.0, hi=3.0):
    return lambda: fn(_t((3, 4), dtype, lo=lo, hi=hi))


def _binary(fn, dtype=dtypes.float32, lo=-5.0, hi=5.0):
    return lambda: fn(_t((3, 4), dtype, 0, lo, hi), _t((3, 4), dtype, 1, lo, hi))


UNARY_F = ["exp", "log", "sin", "cos", "tan", "sqrt", "rsqrt", "reciprocal", "neg", "abs", "relu", "sigmoid", "tanh",
           "gelu", "quick_gelu", "silu", "mish", "softplus", "elu", "selu", "celu", "leaky_relu", "hardswish",
           "hardsigmoid", "hardtanh", "relu6", "logsigmoid", "softsign", "erf", "floor", "ceil", "round", "trunc",
           "frac", "sign", "square", "exp2", "log2", "log10", "log1p", "expm1", "sinh", "cosh", "asin", "acos",
           "atan", "asinh", "isnan", "isinf", "isfinite", "signbit"]
CASES = {f"unary_{n}": _unary(lambda x, n=n: getattr(x, n)(), lo=-0.9 if n in ("asin", "acos") else -3.0,
                              hi=0.9 if n in ("asin", "acos") else 3.0) for n in UNARY_F}
CASES.update({
    "unary_log_pos": _unary(lambda x: x.log() + x.sqrt(), lo=0.1),
    "unary_acosh": _unary(lambda x: x.acosh(), lo=1.0, hi=4.0),
    "unary_atanh": _unary(lambda x: x.atanh(), lo=-0.9, hi=0.9),
    "elementwise_chain": _binary(lambda a, b: ((a + b).exp() * b.sin() - a.sigmoid() / (b.abs() + 1)).gelu()),
    "add": _binary(lambda a, b: a + b), "sub": _binary(lambda a, b: a - b), "mul": _binary(lambda a, b: a * b),
    "div": _binary(lambda a, b: a / b), "pow": _binary(lambda a, b: a.abs() ** b),
    "pow_int": _unary(lambda a: a ** 3), "pow_half": _unary(lambda a: a.abs() ** 0.5),
    "maximum": _binary(lambda a, b: a.maximum(b)), "minimum": _binary(lambda a, b: a.minimum(b)),
    "fmod": _binary(lambda a, b: a.fmod(b)), "mod_float": _binary(lambda a, b: a % b),
    "atan2": _binary(lambda a, b: a.atan2(b)), "copysign": _binary(lambda a, b: a.copysign(b)),
    "logaddexp": _binary(lambda a, b: a.logaddexp(b)), "lerp": _binary(lambda a, b: a.lerp(b, 0.25)),
    "compare": _binary(lambda a, b: (a < b) | (a >= b * 2) ^ (a == b) & (a != 0)),
    "where": _binary(lambda a, b: (a > b).where(a, b * 2)),
    "where_scalar": _unary(lambda a: (a > 0).where(a, float("-inf")) + (a < -1).where(float("nan"), -0.0)),
    "clamp": _unary(lambda a: a.clamp(-1.0, 0.5)), "isclose": _binary(lambda a, b: a.isclose(b)),
    "masked_fill": _binary(lambda a, b: a.masked_fill(b > 0, 7.0)),
    # integers
    "int_idiv_mod": _binary(lambda a, b: a // (b.abs() + 1) + a % (b.abs() + 1), dtypes.int32, -20, 20),
    "int_bitwise": _binary(lambda a, b: (a & b) | (a ^ 3) | (b << 2) | (a >> 1), dtypes.int32, -50, 50),
    "int_not": _unary(lambda a: a.bitwise_not() + a.abs() + a.sign(), dtypes.int32, -9, 9),
    "int64_ops": _binary(lambda a, b: a * b - (a // 3), dtypes.int64, -1000, 1000),
    "uint8_wrap": _binary(lambda a, b: a + b + 250, dtypes.uint8, 0, 255),
    "int8_ops": _binary(lambda a, b: (a * b).maximum(a), dtypes.int8, -100, 100),
    "int16_ops": _binary(lambda a, b: a - b, dtypes.int16, -1000, 1000),
    "uint32_shift": _binary(lambda a, b: (a >> 3) ^ (b << 5), dtypes.uint32, 0, 10**6),
    "uint64_ops": _binary(lambda a, b: a * b + 1, dtypes.uint64, 0, 10**6),
    "bool_logic": _binary(lambda a, b: a.logical_and(b).logical_or(a.logical_not()).logical_xor(b), dtypes.bool),
    # casts across dtypes
    **{f"cast_{s.name}_{d.name}": (lambda s=s, d=d: _t((2, 5), s, lo=-100, hi=100).cast(d))
       for s, d in [(dtypes.float32, dtypes.float16), (dtypes.float32, dtypes.bfloat16), (dtypes.float32, dtypes.int8),
                    (dtypes.float32, dtypes.bool), (dtypes.float32, dtypes.int64), (dtypes.float32, dtypes.float64),
                    (dtypes.float64, dtypes.float32), (dtypes.int32, dtypes.float32), (dtypes.int8, dtypes.float16),
                    (dtypes.bool, dtypes.float32), (dtypes.uint8, dtypes.int32), (dtypes.float16, dtypes.bfloat16),
                    (dtypes.bfloat16, dtypes.float32), (dtypes.int64, dtypes.uint16), (dtypes.float16, dtypes.int32)]},
    "bitcast": _unary(lambda a: a.bitcast(dtypes.int32) >> 1),
    "f16_math": _binary(lambda a, b: (a * b + a.exp()).sqrt(), dtypes.float16, 0.1, 2.0),
    "bf16_math": _binary(lambda a, b: a * b - b.sigmoid(), dtypes.bfloat16),
    "f64_math": _binary(lambda a, b: (a * b).sin() + b.log2().abs(), dtypes.float64, 0.1, 5.0),
    # reductions
    **{f"reduce_{r}_{ax}": (lambda r=r, ax=ax: getattr(_t((3, 4, 5)), r)(axis=ax))
       for r in ("sum", "max", "min", "mean", "prod", "std", "var") for ax in (None, 1, (0, 2))},
    "reduce_keepdim": _unary(lambda a: a.sum(1, keepdim=True) - a),
    "argmax": _unary(lambda a: a.argmax(1) + a.argmin(0).sum()),
    "any_all": _unary(lambda a: (a > 0).any(1).logical_and((a > -5).all(1))),
    "int_sum": _unary(lambda a: a.sum(0) + a.max(1).sum(), dtypes.int32, -9, 9),
    "f16_sum": _unary(lambda a: a.sum(1), dtypes.float16),
    "logsumexp": _unary(lambda a: a.logsumexp(1)),
    "softmax": _unary(lambda a: a.softmax(1)), "log_softmax": _unary(lambda a: a.log_softmax(0)),
    "cumsum": _unary(lambda a: a.cumsum(1)), "cumprod": _unary(lambda a: a.cumprod(0)),
    "cummax": _unary(lambda a: a.cummax(1)[0] if isinstance(a.cummax(1), tuple) else a.cummax(1)),
    "logcumsumexp": _unary(lambda a: a.logcumsumexp(1)),
    "long_cumsum": lambda: _t((300,)).cumsum(0),
    # matmul / linear algebra
    "matmul": _binary(lambda a, b: a @ b.T), "matmul_big": lambda: _t((16, 32)) @ _t((32, 16), seed=2),
    "matvec": lambda: _t((5, 7)) @ _t((7,), seed=3), "batched_matmul": lambda: _t((2, 3, 4)) @ _t((2, 4, 5), seed=1),
    "dot_int": lambda: _t((4, 3), dtypes.int32, lo=-5, hi=5) @ _t((3, 2), dtypes.int32, 1, -5, 5),
    "einsum": lambda: Tensor.einsum("ij,jk->ik", _t((3, 4)), _t((4, 2), seed=1)),
    "linear": lambda: _t((3, 4)).linear(_t((4, 5), seed=1), _t((5,), seed=2)),
    # movement
    "permute": lambda: _t((2, 3, 4)).permute(2, 0, 1) + 1, "transpose": _unary(lambda a: a.T * 2),
    "reshape": lambda: _t((2, 3, 4)).reshape(4, 6) + 1, "expand": lambda: _t((3, 1)).expand(3, 4) + _t((1, 4)),
    "pad": _unary(lambda a: a.pad(((1, 2), (0, 3)))),
    "pad_value": _unary(lambda a: a.pad(((1, 1), (2, 0)), value=-1.5)),
    "pad_reflect": _unary(lambda a: a.pad(((1, 1), (1, 1)), mode="reflect")),
    "shrink": _unary(lambda a: a[1:, 1:3] * 2), "flip": _unary(lambda a: a.flip(1) + a.flip(0)),
    "strided_slice": lambda: _t((9, 8))[::2, 1::3] + 0, "roll": _unary(lambda a: a.roll(1, 1)),
    "cat": _binary(lambda a, b: a.cat(b, dim=1)), "stack": _binary(lambda a, b: Tensor.stack(a, b, dim=0)),
    "repeat": _unary(lambda a: a.repeat(2, 1)), "repeat_interleave": _unary(lambda a: a.repeat_interleave(2, dim=0)),
    "tril_triu": lambda: _t((4, 4)).tril() + _t((4, 4)).triu(1), "diag": lambda: _t((4, 4)).diagonal() * 2,
    "unfold": lambda: _t((10,)).unfold(0, 3, 2) * 1, "split": _unary(lambda a: a.split(2, dim=1)[1] * 3),
    # indexing / gather
    "index_tensor": lambda: _t((5, 4))[Tensor([0, 3, 1], device=DEV)],
    "index_two": lambda: _t((5, 4))[Tensor([0, 3, 1], device=DEV), Tensor([1, 1, 2], device=DEV)],
    "gather": lambda: _t((4, 5)).gather(1, Tensor([[0, 1], [1, 0], [2, 2], [3, 4]], device=DEV)),
    "take_along_axis": lambda: _t((3, 4)).take_along_axis(Tensor([[0], [2], [3]], device=DEV), 1),
    "index_select": lambda: _t((5, 3)).index_select(0, Tensor([4, 0], device=DEV)),
    "scatter": lambda: _t((3, 5)).scatter(1, Tensor([[0, 1], [2, 3], [4, 0]], device=DEV), 9.0),
    "scatter_add": lambda: _t((3, 5)).scatter_add(1, Tensor([[0, 1], [2, 3], [4, 0]], device=DEV), _t((3, 2))),
    "one_hot": lambda: Tensor([0, 3, 1, 2], device=DEV).one_hot(4),
    "setitem": lambda: _setitem(),
    "assign": lambda: _assign(),
    "sort_topk": lambda: _t((6,)).sort()[0] + _t((6,)).topk(2)[0].sum(),
    # creation
    "arange": lambda: Tensor.arange(10, device=DEV) * 2, "arange_float": lambda: Tensor.arange(0, 1, 0.25, device=DEV),
    "linspace": lambda: Tensor.linspace(-1, 1, 7, device=DEV), "eye": lambda: Tensor.eye(4, device=DEV) + 0,
    "full": lambda: Tensor.full((2, 3), 1.5, device=DEV).contiguous(),
    "zeros_i": lambda: Tensor.zeros(3, dtype=dtypes.int8, device=DEV).contiguous(),
    "rand": lambda: Tensor.rand(4, 3, device=DEV), "randn": lambda: Tensor.randn(5, device=DEV),
    "randint": lambda: Tensor.randint(6, low=-3, high=9, device=DEV),
    "rand_f16": lambda: Tensor.rand(3, dtype=dtypes.float16, device=DEV),
    "dropout": lambda: _dropout(),
    # nn
    "conv2d": lambda: _t((1, 2, 6, 6)).conv2d(_t((3, 2, 3, 3), seed=1), _t((3,), seed=2)),
    "conv2d_stride_pad": lambda: _t((2, 2, 7, 7)).conv2d(_t((4, 1, 3, 3), seed=1), stride=2, padding=1, groups=2),
    "conv_transpose2d": lambda: _t((1, 2, 4, 4)).conv_transpose2d(_t((2, 3, 3, 3), seed=1), stride=2),
    "max_pool2d": lambda: _t((1, 2, 6, 6)).max_pool2d(2), "avg_pool2d": lambda: _t((1, 2, 6, 6)).avg_pool2d(3, 1),
    "interpolate": lambda: _t((1, 1, 4, 4)).interpolate((7, 5), mode="linear"),
    "layernorm": lambda: _t((3, 8)).layernorm(), "batchnorm": lambda: _batchnorm(),
    "cross_entropy": lambda: _t((4, 5)).cross_entropy(Tensor([1, 0, 4, 2], device=DEV)),
    "bce": lambda: _t((6,), lo=0.05, hi=0.95).binary_crossentropy(_t((6,), seed=3, lo=0.0, hi=1.0)),
    "sdpa": lambda: _t((1, 2, 4, 8)).scaled_dot_product_attention(_t((1, 2, 4, 8), seed=1), _t((1, 2, 4, 8), seed=2),
                                                                    is_causal=True),
    "mlp_train_step": _mlp_step, "sgd_step": _sgd_step,
    "grad_chain": lambda: _grad_chain(),
    "custom_kernel": _custom,
})


def _setitem():
    a = _t((4, 5)).contiguous().realize()
    a[1:3, 2] = 5.0
    return a


def _assign():
    a = _t((3, 4)).contiguous().realize()
    a.assign(a.flip(1) * 2).realize()
    return a


def _dropout():
    Tensor.manual_seed(3)
    with Context(TRAINING=1):
        return _t((4, 4)).dropout(0.5)


def _batchnorm():
    x = _t((2, 3, 4))
    return x.batchnorm(_t((3,), seed=1), _t((3,), seed=2), _t((3,), seed=3), (_t((3,), seed=4, lo=0.5, hi=2.0)))


def _grad_chain():
    x = Tensor(np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4), device=DEV, requires_grad=True)
    y = (x.exp().sum(1) * x.max(1) + x.softmax(0).sin().mean()).sum()
    y.backward()
    return x.grad


def _realize(out):
    for t in out if isinstance(out, (tuple, list)) else [out]:
        t.realize()


@pytest.fixture(scope="module")
def kernels():
    """case name -> list of distinct kernel ASTs it scheduled (in first-run order)."""
    found: dict[str, dict[UOp, None]] = {}
    current: list[str] = [""]
    original = programs.get_program

    def recording(ast, device):
        found.setdefault(current[0], {}).setdefault(ast, None)
        return original(ast, device)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(programs, "get_program", recording)
        mp.setenv("POLY_DEV", DEV)
        for name, fn in CASES.items():
            current[0] = name
            found.setdefault(name, {})
            _realize(fn())
    return {name: list(asts) for name, asts in found.items()}


def _assert_round_trips(ast: UOp) -> None:
    data = dumps(ast)
    back = loads(data)
    assert back is ast
    assert dumps(back) == data
    assert loads(data.decode()) is ast  # str works too


@pytest.mark.parametrize("case", list(CASES))
def test_every_kernel_round_trips(kernels, case):
    asts = kernels[case]
    assert asts, f"{case} scheduled no kernel"
    for ast in asts:
        assert ast.op is Ops.SINK and isinstance(ast.arg, KernelInfo)
        _assert_round_trips(ast)
        _assert_round_trips(simplify_indices(ast))


def test_op_suite_covers_many_kernels(kernels):
    distinct = {a for asts in kernels.values() for a in asts}
    assert len(distinct) >= 150, len(distinct)
    ops = {n.op for a in distinct for n in simplify_indices(a).toposort()}
    for op in (Ops.REDUCE, Ops.WHERE, Ops.CAST, Ops.BITCAST, Ops.IDIV, Ops.MOD, Ops.SHL, Ops.SHR, Ops.MAX, Ops.EXP2,
               Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.TRUNC, Ops.END, Ops.STORE, Ops.LOAD, Ops.INDEX):
        assert op in ops, op
    dts = {n.dtype for a in distinct for n in a.toposort()}
    for dt in (dtypes.float16, dtypes.bfloat16, dtypes.int8, dtypes.bool, dtypes.int64, dtypes.float64, dtypes.uint8):
        assert dt in dts, dt


def test_bundle_round_trips(kernels):
    asts = [a for case in ("softmax", "matmul", "rand", "mlp_train_step") for a in kernels[case]]
    simplified = [simplify_indices(a) for a in asts]
    data = dumps_many(asts + simplified)
    back = loads_many(data)
    assert len(back) == 2 * len(asts)
    assert all(x is y for x, y in zip(back, asts + simplified))
    assert dumps_many(back) == data


def test_bytes_are_deterministic_and_name_based(kernels):
    ast = simplify_indices(kernels["f16_math"][0])
    data = dumps(ast)
    assert data == dumps(ast)
    obj = json.loads(data)
    assert obj["format"] == FORMAT and obj["version"] == 1 and VERSION == 2  # 1 when no arg holds a UOp
    assert sorted(obj) == ["format", "nodes", "roots", "version"]
    names = {n[0] for n in obj["nodes"]}
    assert {"SINK", "STORE", "DEFINE_GLOBAL"} <= names and all(isinstance(n, str) for n in names)
    assert "float16" in {n[1] for n in obj["nodes"]}
    # src indices point backwards (topological order): a reader needs no recursion
    assert all(s < i for i, n in enumerate(obj["nodes"]) for s in n[2])


# ---------------------------------------------------------------------------------------------------
# args and hand-built graphs


SPECIAL_FLOATS = [0.0, -0.0, 1.0, -1.5, float("inf"), float("-inf"), float("nan"), 5e-324, 1.7976931348623157e308,
                  struct.unpack("<d", struct.pack("<Q", 0x7FF8DEADBEEF0001))[0],  # NaN with a payload
                  struct.unpack("<d", struct.pack("<Q", 0xFFF0000000000001))[0]]  # negative signalling NaN


@pytest.mark.parametrize("value", SPECIAL_FLOATS, ids=lambda v: struct.pack(">d", v).hex())
def test_float_args_round_trip_bit_exactly(value):
    back = decode_arg(json.loads(json.dumps(encode_arg(value))))
    assert type(back) is float and struct.pack("<d", back) == struct.pack("<d", value)
    c = UOp(Ops.CONST, dtypes.float64, (), value)
    assert loads(dumps(c)) is c


@pytest.mark.parametrize("value", [None, True, False, 0, 1, -1, 2**64 + 3, -(2**70), "", "global", "ünï",
                                   (), (1, (2, 3)), (True, 1, 1.0, "1"), (0.0, -0.0), Ops.ADD, dtypes.bfloat16,
                                   KernelInfo(), KernelInfo("k", ("parallel", 3, (1.5,)))])
def test_args_round_trip_with_their_types(value):
    back = decode_arg(json.loads(json.dumps(encode_arg(value))))
    assert back == value and type(back) is type(value)
    if isinstance(value, tuple):
        assert [type(x) for x in back] == [type(x) for x in value]


def test_one_and_true_and_one_point_zero_stay_apart():
    nodes = [UOp(Ops.CONST, None, (), v) for v in (1, True, 1.0, -0.0, 0.0)]
    assert len(set(nodes)) == 5
    assert [loads(dumps(n)) for n in nodes] == nodes
    assert all(loads(dumps(n)) is n for n in nodes)


def test_hand_built_kernel_with_every_arg_form():
    n = UOp(Ops.DEFINE_VAR, dtypes.int32, (), ("n", 1, 64))
    out = UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), (0, (64,)))
    inp = UOp(Ops.DEFINE_GLOBAL, dtypes.float16, (), (1, (64,)))
    r = UOp(Ops.RANGE, dtypes.int64, (UOp.const(dtypes.int64, 64),), (0, "global"))
    k = UOp(Ops.RANGE, dtypes.int64, (UOp.const(dtypes.int64, 4),), (1, "reduce"))
    gate = r.cast(dtypes.int32) < n
    x = UOp(Ops.LOAD, dtypes.float16, (UOp(Ops.INDEX, dtypes.float16, (inp, r, gate)),)).cast(dtypes.float32)
    red = UOp(Ops.REDUCE, dtypes.float32, (x * k.cast(dtypes.float32),), Ops.MAX)
    val = gate.where(red + UOp.const(dtypes.float32, float("nan")), UOp.const(dtypes.float32, -0.0))
    vec = UOp(Ops.VECTORIZE, dtypes.float32, (val, val), 2)
    store = UOp(Ops.STORE, None, (UOp(Ops.INDEX, dtypes.float32, (out, r)), vec))
    sink = UOp(Ops.SINK, None, (UOp(Ops.END, None, (store, r, k)),), KernelInfo("hand", ("parallel",)))
    _assert_round_trips(sink)


def test_deep_graph_does_not_recurse():
    x = UOp.const(dtypes.int32, 0)
    for i in range(20000):
        x = x + UOp.const(dtypes.int32, i % 7)
    assert loads(dumps(x)) is x


# ---------------------------------------------------------------------------------------------------
# errors


def _small() -> bytes:
    return dumps(UOp.const(dtypes.float32, 1.0) + UOp.const(dtypes.float32, 2.0))


def _edit(fn) -> bytes:
    obj = json.loads(_small())
    fn(obj)
    return json.dumps(obj).encode()


def _raises(data, *words):
    with pytest.raises(KernelFormatError) as e:
        loads(data)
    assert isinstance(e.value, PolygradError) and isinstance(e.value, ValueError)
    msg = str(e.value)
    for w in words:
        assert w in msg, msg
    return msg


def test_error_bad_version():
    _raises(_edit(lambda o: o.update(version=3)), "version 3", "Upgrade polygrad")
    _raises(_edit(lambda o: o.update(version=0)), "version 0", "Regenerate")
    _raises(_edit(lambda o: o.update(version="1")), "version")
    _raises(_edit(lambda o: o.pop("version")), "version")


def test_error_wrong_format():
    _raises(_edit(lambda o: o.update(format="tinygrad-kernel")), "not a polygrad kernel")
    _raises(b"[1, 2, 3]", "JSON object")
    _raises(_edit(lambda o: o.update(extra=1)), "unknown fields")


def test_error_unknown_op_and_dtype():
    _raises(_edit(lambda o: o["nodes"][-1].__setitem__(0, "NOT_AN_OP")), "unknown op 'NOT_AN_OP'", "Upgrade polygrad")
    _raises(_edit(lambda o: o["nodes"][-1].__setitem__(0, "__class__")), "unknown op")
    _raises(_edit(lambda o: o["nodes"][-1].__setitem__(0, 40)), "unknown op")  # enum numbers are not accepted
    _raises(_edit(lambda o: o["nodes"][0].__setitem__(1, "float8")), "unknown dtype 'float8'")
    _raises(_edit(lambda o: o["nodes"][0].__setitem__(1, "float")), "unknown dtype")  # C names are not accepted


def test_error_truncated_or_not_json():
    data = _small()
    for cut in (1, len(data) // 2, len(data) - 1):
        _raises(data[:cut], "not valid JSON", "truncated")
    _raises(b"\xff\xfe", "UTF-8")
    _raises(b"[" * 100000, "JSON")
    _raises(_small().replace(b'"roots":[2]', b'"roots":[NaN]'), "NaN")


def test_error_args_that_would_need_code_evaluation():
    # pickle payloads, Python expressions and unknown tags are refused, never run
    evil = [["pickle", "gASVIQAAAAAAAACMBXBvc2l4lIwGc3lzdGVtlJOUjAVlY2hvIGiUhZRSlC4="], ["eval", "__import__('os')"],
            ["repr", "float('nan')"], ["SlotRef", [0, 4, "CPU"]], ["float", "nan"], ["float", "1.5"],
            ["int", "5"], ["int", 1.5], ["bool", 1], ["tuple", 3], {"__class__": "KernelInfo"}, "ADD", 5, 1.5,
            ["kernel_info", {"name": "k", "opts": ["tuple", []], "code": "x"}], ["op", "ADD", "extra"]]
    for arg in evil:
        _raises(_edit(lambda o, arg=arg: o["nodes"][0].__setitem__(3, arg)), "node #0")


def test_error_bad_structure():
    _raises(_edit(lambda o: o["nodes"][2].__setitem__(2, [2, 0])), "earlier node")  # a cycle
    _raises(_edit(lambda o: o["nodes"][2].__setitem__(2, [5])), "earlier node")
    _raises(_edit(lambda o: o["nodes"][2].__setitem__(2, [True])), "earlier node")
    _raises(_edit(lambda o: o["nodes"][2].pop()), "expected [op, dtype")
    _raises(_edit(lambda o: o.update(roots=[9])), "root 9")
    _raises(_edit(lambda o: o.update(roots=[0, 1])), "loads_many")
    _raises(_edit(lambda o: o.update(nodes={})), "'nodes' list")


def test_dumps_refuses_what_it_cannot_write():
    from polygrad.schedule.normalize import SlotRef
    with pytest.raises(KernelFormatError, match="SlotRef"):
        dumps(UOp(Ops.BUFFER, dtypes.float32, (), SlotRef(0, 4, "CPU")))
    with pytest.raises(KernelFormatError, match="dumps_many"):
        dumps([UOp.const(dtypes.int32, 1)])
    assert math.isnan(loads(dumps(UOp.const(dtypes.float32, float("nan")))).arg)


def test_symbolic_sizes_in_args_round_trip(device):
    """A kernel over a Variable batch declares its buffers with symbolic sizes: version 2 writes them as
    ["uop", index] references to earlier nodes, and reading gives back the same UOp."""
    from polygrad import Tensor, Variable
    from polygrad.engine.capture import capture
    v = Variable("batch", 1, 16)
    x = Tensor(np.ones((16, 4), dtype=np.float32), device=device).realize()
    with capture() as cap:
        (x[:v.bind(3)] * 2).sum(1).realize()
    ast = cap.kernels[0].ast
    data = dumps(ast)
    obj = json.loads(data)
    assert obj["version"] == 2 and any(isinstance(n[3], list) and "uop" in json.dumps(n[3]) for n in obj["nodes"])
    assert loads(data) is ast
    bad = json.loads(data)
    for n in bad["nodes"]:
        if "uop" in json.dumps(n[3]):
            n[3] = json.loads(json.dumps(n[3]).replace('["uop", ', '["uop", 99999').replace("99999", "9999", 1))
            break
    _raises(json.dumps(bad).encode(), "uop arg")
    old = json.loads(data)
    old["version"] = 1
    _raises(json.dumps(old).encode(), "uop arg")
