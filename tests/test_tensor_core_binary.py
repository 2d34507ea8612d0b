"""Binary elementwise ops with broadcasting and promotion: forward and gradients against torch CPU."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from polygrad import Tensor, dtypes
from tensor_core_ref import DEVICES, check_all, close, stack, to_np

# name -> (polygrad fn, torch fn, positive base?, differentiable)
BINARY = {
    "add": (lambda a, b: a + b, lambda a, b: a + b, False, True),
    "sub": (lambda a, b: a - b, lambda a, b: a - b, False, True),
    "mul": (lambda a, b: a * b, lambda a, b: a * b, False, True),
    "div": (lambda a, b: a / b, lambda a, b: a / b, False, True),
    "div_floor": (lambda a, b: a.div(b, rounding_mode="floor"), lambda a, b: torch.div(a, b, rounding_mode="floor"),
                  False, True),
    "div_trunc": (lambda a, b: a.div(b, rounding_mode="trunc"), lambda a, b: torch.div(a, b, rounding_mode="trunc"),
                  False, True),
    "floordiv": (lambda a, b: a // b, lambda a, b: a // b, False, False),
    "mod": (lambda a, b: a % b, lambda a, b: a % b, False, True),
    "fmod": (lambda a, b: a.fmod(b), torch.fmod, False, True),
    "pow": (lambda a, b: a ** b, lambda a, b: a ** b, True, True),
    "maximum": (lambda a, b: a.maximum(b), torch.maximum, False, True),
    "minimum": (lambda a, b: a.minimum(b), torch.minimum, False, True),
    "atan2": (lambda a, b: a.atan2(b), torch.atan2, False, True),
    "copysign": (lambda a, b: a.copysign(b), torch.copysign, False, True),
    "logaddexp": (lambda a, b: a.logaddexp(b), torch.logaddexp, False, True),
    "lerp_low": (lambda a, b: a.lerp(b, 0.3), lambda a, b: torch.lerp(a, b, 0.3), False, True),
    "lerp_high": (lambda a, b: a.lerp(b, 0.8), lambda a, b: torch.lerp(a, b, 0.8), False, True),
    "lerp_tensor": (lambda a, b: a.lerp(b, b.sigmoid()), lambda a, b: torch.lerp(a, b, b.sigmoid()), False, True),
    "clamp_tensor": (lambda a, b: a.clamp(b, b + 1), lambda a, b: a.clamp(b, b + 1), False, True),
    "where": (lambda a, b: (a > b).where(a, b * 2), lambda a, b: torch.where(a > b, a, b * 2), False, True),
    "masked_fill": (lambda a, b: a.masked_fill(b > 0, 1.5), lambda a, b: a.masked_fill(b > 0, 1.5), False, True),
    "eq": (lambda a, b: a.eq(b.round()), lambda a, b: a.eq(b.round()), False, False),
    "ne": (lambda a, b: a.ne(b), lambda a, b: a.ne(b), False, False),
    "lt": (lambda a, b: a < b, lambda a, b: a < b, False, False),
    "le": (lambda a, b: a <= b, lambda a, b: a <= b, False, False),
    "gt": (lambda a, b: a > b, lambda a, b: a > b, False, False),
    "ge": (lambda a, b: a >= b, lambda a, b: a >= b, False, False),
    "isclose": (lambda a, b: a.isclose(b, rtol=0.5), lambda a, b: torch.isclose(a, b, rtol=0.5), False, False),
    "logical_and": (lambda a, b: a.logical_and(b > 0), lambda a, b: torch.logical_and(a, b > 0), False, False),
    "logical_or": (lambda a, b: (a > 0).logical_or(b > 0), lambda a, b: torch.logical_or(a > 0, b > 0), False, False),
    "logical_xor": (lambda a, b: (a > 0).logical_xor(b > 0), lambda a, b: torch.logical_xor(a > 0, b > 0), False,
                    False),
}
SHAPES = [((2, 3), (2, 3)), ((2, 3), (3,)), ((4, 1), (1, 5)), ((), (3,))]


def _inputs(shape_a, shape_b, positive: bool, rng):
    a = rng.uniform(0.2, 3.0, shape_a) if positive else rng.uniform(-3.0, 3.0, shape_a)
    b = rng.uniform(0.4, 2.0, shape_b) * rng.choice([-1, 1], shape_b)
    return a.astype(np.float32), b.astype(np.float32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shapes", SHAPES, ids=str)
def test_binary_forward_and_grad(device, shapes):
    rng = np.random.default_rng(2)
    names = list(BINARY)
    data = {n: _inputs(*shapes, BINARY[n][2], rng) for n in names}
    out_shape = np.broadcast_shapes(*shapes)
    weight = rng.uniform(0.5, 1.5, out_shape).astype(np.float32)
    leaves = {n: (Tensor(a, device=device, requires_grad=True), Tensor(b, device=device, requires_grad=True))
              for n, (a, b) in data.items()}
    outs = [BINARY[n][0](*leaves[n]).float() for n in names]
    w = Tensor(weight, device=device)
    sum((o * w).sum() for n, o in zip(names, outs) if BINARY[n][3]).backward()
    fwd = stack(outs).numpy()
    diff = [n for n in names if BINARY[n][3]]
    ga = stack([leaves[n][0].grad for n in diff]).numpy()
    gb = stack([leaves[n][1].grad if leaves[n][1].grad is not None else leaves[n][1].zeros_like()
                for n in diff]).numpy()
    problems = []
    for i, n in enumerate(names):
        ta, tb = (torch.tensor(v, requires_grad=True) for v in data[n])
        ref = BINARY[n][1](ta, tb)
        problems.append(close(f"{n} forward", fwd[i], to_np(ref.float()), 2e-5, 1e-6))
        if BINARY[n][3]:
            (ref.float() * torch.tensor(weight)).sum().backward()
            j = diff.index(n)
            problems.append(close(f"{n} grad a", ga[j], to_np(ta.grad), 1e-4, 1e-5))
            want_b = to_np(tb.grad) if tb.grad is not None else np.zeros(shapes[1])
            problems.append(close(f"{n} grad b", gb[j], want_b, 1e-4, 1e-5))
    check_all(problems)


@pytest.mark.parametrize("device", DEVICES)
def test_binary_zero_size_broadcast(device):
    a = Tensor(np.zeros((0, 3), np.float32), device=device, requires_grad=True)
    b = Tensor(np.ones((1, 3), np.float32), device=device, requires_grad=True)
    for n, (fn, _, _, _) in BINARY.items():
        assert fn(a, b).numpy().shape == (0, 3), n
    (a * b).sum().backward()
    assert a.grad.numpy().shape == (0, 3)
    np.testing.assert_array_equal(b.grad.numpy(), np.zeros((1, 3), np.float32))


INT_CASES = [
    ("floordiv", lambda a, b: a // b, lambda a, b: a // b),
    ("div_trunc", lambda a, b: a.div(b, rounding_mode="trunc"), lambda a, b: torch.div(a, b, rounding_mode="trunc")),
    ("mod", lambda a, b: a % b, lambda a, b: a % b),
    ("fmod", lambda a, b: a.fmod(b), torch.fmod),
    ("truediv", lambda a, b: a / b, lambda a, b: a / b),
    ("pow", lambda a, b: a.abs() ** (b.abs() % 4), lambda a, b: a.abs() ** (b.abs() % 4)),
    ("maximum", lambda a, b: a.maximum(b), torch.maximum),
    ("minimum", lambda a, b: a.minimum(b), torch.minimum),
    ("and", lambda a, b: a & b, lambda a, b: a & b),
    ("or", lambda a, b: a | b, lambda a, b: a | b),
    ("xor", lambda a, b: a ^ b, lambda a, b: a ^ b),
    ("bitwise_and", lambda a, b: a.bitwise_and(b), torch.bitwise_and),
    ("bitwise_or", lambda a, b: a.bitwise_or(b), torch.bitwise_or),
    ("bitwise_xor", lambda a, b: a.bitwise_xor(b), torch.bitwise_xor),
    ("bitwise_not", lambda a, b: a.bitwise_not(), lambda a, b: torch.bitwise_not(a)),
    ("invert", lambda a, b: ~a, lambda a, b: ~a),
    ("lshift", lambda a, b: a << (b.abs() % 5), lambda a, b: a << (b.abs() % 5)),
    ("rshift", lambda a, b: a >> (b.abs() % 5), lambda a, b: a >> (b.abs() % 5)),
    ("abs", lambda a, b: a.abs(), lambda a, b: a.abs()),
    ("sign", lambda a, b: a.sign(), lambda a, b: a.sign()),
    ("neg", lambda a, b: -a, lambda a, b: -a),
    ("clamp", lambda a, b: a.clamp(-3, 4), lambda a, b: a.clamp(-3, 4)),
    ("int_pow3", lambda a, b: a ** 3, lambda a, b: a ** 3),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["int8", "int16", "int32", "int64"])
def test_integer_ops(device, dtype):
    """Integer arithmetic is exact and uses torch's floor/trunc conventions (negative operands too)."""
    rng = np.random.default_rng(3)
    a = rng.integers(-20, 20, (3, 4)).astype(dtype)
    b = rng.integers(1, 7, (4,)).astype(dtype) * np.array([1, -1, 1, -1], dtype=dtype)
    ta, tb = torch.tensor(a), torch.tensor(b)
    pa, pb = Tensor(a, device=device), Tensor(b, device=device)
    outs = [fn(pa, pb).cast(dtypes.float64) for _, fn, _ in INT_CASES]
    got = stack(outs).numpy()
    problems = []
    for i, (name, _, ref) in enumerate(INT_CASES):
        want = ref(ta, tb)
        problems.append(close(name, got[i], to_np(want.double()), 0, 0))
    check_all(problems)


@pytest.mark.parametrize("device", DEVICES)
def test_unsigned_and_bool_ops(device):
    a = np.array([0, 1, 200, 255, 17], dtype=np.uint8)
    b = np.array([3, 255, 7, 1, 0], dtype=np.uint8)
    pa, pb = Tensor(a, device=device), Tensor(b, device=device)
    np.testing.assert_array_equal(pa.minimum(pb).numpy(), np.minimum(a, b))
    np.testing.assert_array_equal((~pa).numpy(), ~a)
    np.testing.assert_array_equal(pa.min().numpy(), a.min())
    np.testing.assert_array_equal(pa.abs().numpy(), a)
    np.testing.assert_array_equal((pa + pb).numpy(), a + b)  # wraps like torch uint8
    p, q = Tensor([True, False, True], device=device), Tensor([True, True, False], device=device)
    assert (p & q).tolist() == [True, False, False]
    assert (p | q).tolist() == [True, True, True]
    assert (p ^ q).tolist() == [False, True, True]
    assert (~p).tolist() == [False, True, False]
    assert p.logical_not().tolist() == [False, True, False]


def test_bitwise_on_float_raises():
    with pytest.raises(TypeError, match="integer and bool"):
        Tensor([1.0]).bitwise_and(Tensor([1.0]))
    with pytest.raises(TypeError, match="cast with .int"):
        ~Tensor([1.0])


def test_integer_division_by_zero_does_not_crash():
    for device in DEVICES:
        a = Tensor([7, -7], device=device)
        assert (a // 0).numpy().shape == (2,)
        assert (a % 0).numpy().shape == (2,)


@pytest.mark.parametrize("device", DEVICES)
def test_float_mod_by_zero_is_nan(device):
    """Regression: INTERP used to replace a zero float divisor by 1 (fmod(x, 0.0) is NaN in C and torch)."""
    a, b = Tensor([1.0, -2.5, 3.0], device=device), Tensor([0.0, 0.0, 2.0], device=device)
    ta, tb = torch.tensor([1.0, -2.5, 3.0]), torch.tensor([0.0, 0.0, 2.0])
    np.testing.assert_array_equal(a.fmod(b).numpy(), torch.fmod(ta, tb).numpy())
    np.testing.assert_array_equal((a % b).numpy(), (ta % tb).numpy())
    np.testing.assert_array_equal((a / b).numpy(), (ta / tb).numpy())
