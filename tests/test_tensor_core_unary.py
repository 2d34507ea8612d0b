"""Unary elementwise ops and activations: forward and gradient against torch CPU, on every backend.

All ops of a shape are stacked into one kernel (see tensor_core_ref.stack) to keep compiles few.
"""
from __future__ import annotations

import math
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from polygrad import Tensor
from tensor_core_ref import DEVICES, check_all, close, stack, to_np

ANY, POS, UNIT, GE1, NONZERO, SMALL = "any", "pos", "unit", "ge1", "nonzero", "small"

# name -> (polygrad function, torch function, input domain, differentiable)
UNARY = {
    "neg": (lambda x: -x, lambda x: -x, ANY, True),
    "reciprocal": (lambda x: x.reciprocal(), torch.reciprocal, NONZERO, True),
    "sqrt": (lambda x: x.sqrt(), torch.sqrt, POS, True),
    "rsqrt": (lambda x: x.rsqrt(), torch.rsqrt, POS, True),
    "square": (lambda x: x.square(), torch.square, ANY, True),
    "abs": (lambda x: x.abs(), torch.abs, ANY, True),
    "sign": (lambda x: x.sign(), torch.sign, ANY, True),
    "exp": (lambda x: x.exp(), torch.exp, ANY, True),
    "exp2": (lambda x: x.exp2(), torch.exp2, ANY, True),
    "expm1": (lambda x: x.expm1(), torch.expm1, ANY, True),
    "expm1_small": (lambda x: x.expm1(), torch.expm1, SMALL, True),
    "log": (lambda x: x.log(), torch.log, POS, True),
    "log2": (lambda x: x.log2(), torch.log2, POS, True),
    "log10": (lambda x: x.log10(), torch.log10, POS, True),
    "log1p": (lambda x: x.log1p(), torch.log1p, POS, True),
    "log1p_small": (lambda x: x.log1p(), torch.log1p, SMALL, True),
    "sin": (lambda x: x.sin(), torch.sin, ANY, True),
    "cos": (lambda x: x.cos(), torch.cos, ANY, True),
    "tan": (lambda x: x.tan(), torch.tan, UNIT, True),
    "asin": (lambda x: x.asin(), torch.asin, UNIT, True),
    "acos": (lambda x: x.acos(), torch.acos, UNIT, True),
    "atan": (lambda x: x.atan(), torch.atan, ANY, True),
    "sinh": (lambda x: x.sinh(), torch.sinh, ANY, True),
    "sinh_small": (lambda x: x.sinh(), torch.sinh, SMALL, True),
    "cosh": (lambda x: x.cosh(), torch.cosh, ANY, True),
    "tanh": (lambda x: x.tanh(), torch.tanh, ANY, True),
    "asinh": (lambda x: x.asinh(), torch.asinh, ANY, True),
    "acosh": (lambda x: x.acosh(), torch.acosh, GE1, True),
    "atanh": (lambda x: x.atanh(), torch.atanh, UNIT, True),
    "erf": (lambda x: x.erf(), torch.erf, ANY, True),
    "erfc": (lambda x: x.erfc(), torch.erfc, ANY, True),
    "floor": (lambda x: x.floor(), torch.floor, ANY, True),
    "ceil": (lambda x: x.ceil(), torch.ceil, ANY, True),
    "round": (lambda x: x.round(), torch.round, ANY, True),
    "trunc": (lambda x: x.trunc(), torch.trunc, ANY, True),
    "frac": (lambda x: x.frac(), torch.frac, ANY, True),
    "relu": (lambda x: x.relu(), torch.relu, ANY, True),
    "relu6": (lambda x: x.relu6(), F.relu6, ANY, True),
    "leaky_relu": (lambda x: x.leaky_relu(0.1), lambda x: F.leaky_relu(x, 0.1), ANY, True),
    "elu": (lambda x: x.elu(0.7), lambda x: F.elu(x, 0.7), ANY, True),
    "celu": (lambda x: x.celu(1.3), lambda x: F.celu(x, 1.3), ANY, True),
    "selu": (lambda x: x.selu(), F.selu, ANY, True),
    "gelu": (lambda x: x.gelu(), F.gelu, ANY, True),
    "gelu_tanh": (lambda x: x.gelu("tanh"), lambda x: F.gelu(x, approximate="tanh"), ANY, True),
    "quick_gelu": (lambda x: x.quick_gelu(), lambda x: x * torch.sigmoid(1.702 * x), ANY, True),
    "silu": (lambda x: x.silu(), F.silu, ANY, True),
    "swish": (lambda x: x.swish(), F.silu, ANY, True),
    "mish": (lambda x: x.mish(), F.mish, ANY, True),
    "softplus": (lambda x: x.softplus(), F.softplus, ANY, True),
    "softplus_beta": (lambda x: x.softplus(2.0, 3.0), lambda x: F.softplus(x, 2.0, 3.0), ANY, True),
    "softsign": (lambda x: x.softsign(), F.softsign, ANY, True),
    "hardtanh": (lambda x: x.hardtanh(-0.5, 1.5), lambda x: F.hardtanh(x, -0.5, 1.5), ANY, True),
    "hardswish": (lambda x: x.hardswish(), F.hardswish, ANY, True),
    "hardsigmoid": (lambda x: x.hardsigmoid(), F.hardsigmoid, ANY, True),
    "sigmoid": (lambda x: x.sigmoid(), torch.sigmoid, ANY, True),
    "logsigmoid": (lambda x: x.logsigmoid(), F.logsigmoid, ANY, True),
    "isnan": (lambda x: x.isnan(), torch.isnan, ANY, False),
    "isinf": (lambda x: x.isinf(), torch.isinf, ANY, False),
    "isfinite": (lambda x: x.isfinite(), torch.isfinite, ANY, False),
    "logical_not": (lambda x: x.logical_not(), torch.logical_not, ANY, False),
    "clamp": (lambda x: x.clamp(-0.5, 0.7), lambda x: x.clamp(-0.5, 0.7), ANY, True),
    "clip_min": (lambda x: x.clip(min=0.2), lambda x: x.clip(min=0.2), ANY, True),
    "pow_scalar": (lambda x: x ** 3, lambda x: x ** 3, ANY, True),
    "pow_frac": (lambda x: x ** 1.7, lambda x: x ** 1.7, POS, True),
    "rpow": (lambda x: 2.5 ** x, lambda x: 2.5 ** x, ANY, True),
    "rsub": (lambda x: 3 - x, lambda x: 3 - x, ANY, True),
    "rdiv": (lambda x: 3 / x, lambda x: 3 / x, NONZERO, True),
    "copysign_scalar": (lambda x: x.copysign(-1.0), lambda x: torch.copysign(x, torch.tensor(-1.0)), NONZERO, True),
}
SPECIAL = np.array([math.nan, math.inf, -math.inf, 0.0, -0.0, 1e-30, -1e-30, 1e30, -1e30, 0.5, -0.5, 1.5,
                    2.5, -2.5, 1.0, -1.0, 3.0, 88.0, -88.0, 1e-4, 710.0], dtype=np.float32)


def sample(domain: str, shape: tuple, rng: np.random.Generator) -> np.ndarray:
    if domain == POS:
        x = rng.uniform(0.1, 4.0, shape)
    elif domain == UNIT:
        x = rng.uniform(-0.95, 0.95, shape)
    elif domain == GE1:
        x = rng.uniform(1.1, 5.0, shape)
    elif domain == NONZERO:
        x = rng.uniform(0.2, 3.0, shape) * rng.choice([-1, 1], shape)
    elif domain == SMALL:
        x = rng.uniform(-0.09, 0.09, shape)
    else:
        x = rng.uniform(-3.0, 3.0, shape)
        x = np.where(np.abs(x - np.round(x)) < 0.02, x + 0.05, x)  # keep away from kinks
    return x.astype(np.float32)


# X86 compiles each stacked kernel (every op, forward and gradient) in Python, about 8 s a shape on 2 cores,
# and CI runs the X86 tests twice (once with no C compiler): it takes the 2-D shape there, every shape with
# POLY_LONG_TESTS=1 (the other backends always take all three)
LONG = os.environ.get("POLY_LONG_TESTS", "") not in ("", "0")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(2, 3), (5,), ()])
def test_unary_forward_and_grad(device, shape):
    if device == "X86" and shape != (2, 3) and not LONG:
        pytest.skip("X86 takes the 2-D shape here; POLY_LONG_TESTS=1 runs every shape")
    rng = np.random.default_rng(0)
    names = list(UNARY)
    data = {n: sample(UNARY[n][2], shape, rng) for n in names}
    weight = rng.uniform(0.5, 1.5, shape).astype(np.float32)
    xs = {n: Tensor(data[n], device=device, requires_grad=True) for n in names}
    outs = [UNARY[n][0](xs[n]).float() for n in names]
    w = Tensor(weight, device=device)
    loss = sum((o * w).sum() for n, o in zip(names, outs) if UNARY[n][3])
    loss.backward()
    fwd = stack(outs).numpy()
    grads = stack([xs[n].grad if xs[n].grad is not None else xs[n].zeros_like() for n in names]).numpy()
    problems = []
    for i, n in enumerate(names):
        t = torch.tensor(data[n], requires_grad=True)
        ref = UNARY[n][1](t)
        problems.append(close(f"{n} forward", fwd[i], to_np(ref.float()), 2e-5, 1e-6))
        if UNARY[n][3]:
            (ref.float() * torch.tensor(weight)).sum().backward()
            problems.append(close(f"{n} grad", grads[i], to_np(t.grad), 1e-4, 1e-5))
    check_all(problems)


@pytest.mark.parametrize("device", DEVICES)
def test_unary_special_values(device):
    """NaN, infinities, signed zeros and huge values behave like torch (forward)."""
    names = [n for n in UNARY if UNARY[n][2] in (ANY, POS, NONZERO)]
    x = Tensor(SPECIAL, device=device)
    fwd = stack([UNARY[n][0](x).float() for n in names]).numpy()
    problems = []
    for i, n in enumerate(names):
        with np.errstate(all="ignore"):
            want = to_np(UNARY[n][1](torch.tensor(SPECIAL)).float())
        if n.startswith("gelu"):
            # torch's vectorised erf gives gelu(+inf) = nan on some CPUs (AVX-512) and inf on others;
            # the limit x * Phi(x) -> inf is what we define, so the reference does not depend on the CPU
            want = np.where(SPECIAL == math.inf, np.float32(math.inf), want)
        problems.append(close(n, fwd[i], want, 1e-5, 1e-6))
    check_all(problems)


@pytest.mark.parametrize("device", DEVICES)
def test_unary_zero_size(device):
    x = Tensor(np.zeros((0, 3), np.float32), device=device, requires_grad=True)
    for n, (fn, _, _, diff) in UNARY.items():
        out = fn(x)
        assert out.shape == (0, 3), n
        assert out.numpy().shape == (0, 3), n
    (x.exp().sum() + x.erf().sum()).backward()
    assert x.grad.numpy().shape == (0, 3)


@pytest.mark.parametrize("device", DEVICES)
def test_unary_float64_precision(device):
    """float64 inputs give float64-accurate results (series and continued fractions included)."""
    names = ["exp", "expm1", "log1p", "erf", "erfc", "atan", "asin", "acos", "tanh", "asinh", "sinh", "sigmoid",
             "gelu", "softplus", "log10", "cos"]
    rng = np.random.default_rng(1)
    data = rng.uniform(-3, 3, (64,))
    data[:8] = [1e-8, -1e-7, 0.05, -0.09, 2.4, 2.6, 5.5, -7.0]
    problems = []
    outs = []
    for n in names:
        d = np.abs(data) + 0.01 if UNARY[n][2] == POS else (np.clip(data, -0.99, 0.99) if UNARY[n][2] == UNIT else data)
        leaf = Tensor(d, device=device, requires_grad=True)
        outs.append((n, d, leaf, UNARY[n][0](leaf)))
    sum(o.sum() for _, _, _, o in outs).backward()
    got = stack([o for _, _, _, o in outs]).numpy()
    grads = stack([leaf.grad for _, _, leaf, _ in outs]).numpy()
    assert got.dtype == np.float64 and grads.dtype == np.float64
    for i, (n, d, _, _) in enumerate(outs):
        t = torch.tensor(d, requires_grad=True)
        ref = UNARY[n][1](t)
        ref.sum().backward()
        problems.append(close(n, got[i], to_np(ref), 1e-12, 1e-14))
        problems.append(close(f"{n} grad", grads[i], to_np(t.grad), 1e-10, 1e-12))
    check_all(problems)


@pytest.mark.parametrize("device", DEVICES)
def test_unary_grad_at_special_points(device):
    """Gradients at 0, at kinks and far out in the tails (no NaN from an unused where branch)."""
    points = np.array([0.0, 1e-3, -1e-3, 3.0, -3.0, 6.0, 30.0, -30.0, 100.0, -100.0], np.float32)
    names = [n for n in UNARY if UNARY[n][2] == ANY and UNARY[n][3] and n not in ("rpow", "pow_scalar")]
    leaves = {n: Tensor(points, device=device, requires_grad=True) for n in names}
    sum(UNARY[n][0](leaves[n]).float().sum() for n in names).backward()
    grads = stack([leaves[n].grad if leaves[n].grad is not None else leaves[n].zeros_like() for n in names]).numpy()
    problems = []
    for i, n in enumerate(names):
        t = torch.tensor(points, requires_grad=True)
        UNARY[n][1](t).float().sum().backward()
        problems.append(close(n, grads[i], to_np(t.grad), 1e-4, 1e-6))
    check_all(problems)
