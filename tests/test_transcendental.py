"""Transcendentals are IR arithmetic (uop/transcendental.py): accurate, and the same bits on every backend."""
import math

import numpy as np
import pytest
import torch

from polygrad import Tensor
from polygrad.engine.programs import get_program
from polygrad.schedule.template import schedule
from polygrad.uop.ops import Ops
from tests.conftest import DEVICES

rng = np.random.default_rng(0)


def ulps(got: np.ndarray, want64: np.ndarray, dt) -> float:
    """Largest distance in units of the last place of dt (both NaN counts as equal)."""
    with np.errstate(all="ignore"):
        want = want64.astype(dt)
        same = (got == want) | (np.isnan(got) & np.isnan(want))
        err = np.abs(got.astype(np.float64) - want64) / np.spacing(np.abs(want)).astype(np.float64)
    return float(np.max(np.where(same, 0.0, err), initial=0.0))


EXP_X = np.concatenate([rng.uniform(-150, 150, 4000), rng.uniform(-1, 1, 500),
                        [0, -0.0, 1, 2, -1, 3, 127.9, -149.5, -126.0, 1e-8, -1e-8]])
LOG_X = np.concatenate([np.exp(rng.uniform(-85, 85, 4000)), rng.uniform(0.5, 2, 500),
                        [1e-40, 1e-45, 1.0, 2.0, 0.70710677, 1.4142135, 3.4e38]])
SIN_X = np.concatenate([rng.uniform(-10, 10, 4000), rng.uniform(-1e5, 1e5, 500),
                        [0, -0.0, 1e-30, -1e-30, 710, 88, math.pi, 1e-4, 1e20, -3e38, 1e30]])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_accuracy_against_float64_reference(device, dt):
    x = EXP_X.astype(dt)
    assert ulps(Tensor(x, device=device).exp2().numpy(), np.exp2(x.astype(np.float64)), dt) <= 2
    x = LOG_X.astype(dt)
    if dt is np.float64:
        x = np.concatenate([x, [1e-310, 1e300]])
    assert ulps(Tensor(x, device=device).log2().numpy(), np.log2(x.astype(np.float64)), dt) <= 3
    x = SIN_X.astype(dt)
    if dt is np.float64:
        x = x[np.abs(x) < 2.0 ** 64]  # beyond the reduction table (documented in docs/kernel-ir.md)
        x = np.concatenate([x, [1e7, 1e15, 3e18, 1.7e19]])
    assert ulps(Tensor(x, device=device).sin().numpy(), np.sin(x.astype(np.float64)), dt) <= 2


@pytest.mark.parametrize("device", DEVICES)
def test_special_values(device):
    x = np.array([math.nan, math.inf, -math.inf, 0.0, -0.0, -1.0], np.float32)
    with np.errstate(all="ignore"):
        for fn, ref in ((Tensor.exp2, np.exp2), (Tensor.log2, np.log2), (Tensor.sin, np.sin)):
            want = ref(x.astype(np.float64)).astype(np.float32)
            np.testing.assert_array_equal(fn(Tensor(x, device=device)).numpy(), want)


def _bits(fn, device, data):
    return fn(Tensor(data, device=device)).numpy().view(np.uint32 if data.dtype == np.float32 else np.uint64)


@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_same_bits_on_every_backend(dt):
    data = np.concatenate([rng.standard_normal(2000) * 20, [0.0, 1e-30, 1e30, 88.0]]).astype(dt)
    fns = [Tensor.exp, Tensor.log, Tensor.sin, Tensor.cos, Tensor.tanh, Tensor.sigmoid, Tensor.erf,
           Tensor.gelu, lambda t: t.abs().sqrt().log1p(), lambda t: t.softmax(0)]
    for fn in fns:
        ref = _bits(fn, DEVICES[0], data)
        for device in DEVICES[1:]:
            np.testing.assert_array_equal(_bits(fn, device, data), ref)


def test_float16_and_bfloat16_match_torch():
    x = np.linspace(-8, 8, 301).astype(np.float32)
    for dt, tdt in (("float16", torch.float16), ("bfloat16", torch.bfloat16)):
        got = Tensor(x).cast(dt).exp().cast("float32").numpy()
        want = torch.tensor(x).to(tdt).exp().float().numpy()
        np.testing.assert_allclose(got, want, rtol=1e-2)


def test_no_libm_transcendentals_reach_the_kernel():
    """The lowered kernel holds no EXP2/LOG2/SIN, and the C source calls no expf/logf/sinf."""
    t = (Tensor.rand(64) + 1).log().exp() + Tensor.rand(64).sin()
    tpl, _ = schedule([t.uop], [])
    for step in tpl.steps:
        if step.kind != "kernel":
            continue
        prog = get_program(step.ast, "CPU")
        assert not any(n.op in (Ops.EXP2, Ops.LOG2, Ops.SIN) for n in prog.spec.ast.toposort())
        for name in ("exp2f(", "log2f(", "sinf(", "exp2(", "log2(", "sin("):
            assert name not in prog.source


def test_cpu_builds_without_contraction():
    from polygrad_backend_cpu.compiler import FLAGS
    assert "-ffp-contract=off" in FLAGS


def test_odd_functions_evaluate_their_half_once():
    """tanh and asinh (tensor_math.odd_split) evaluate their formula once, on |x| as x times its sign: a tanh GELU
    held two expm1 an element (the half on x >= 0 and the one on x < 0, one of them of 0), most of its kernel. The
    values stay those of torch, +-0, NaN and the infinities included, and so do the finite points' gradients."""
    def count(t: Tensor, op) -> int:
        return [u.op for u in t.uop.toposort()].count(op)
    one = Tensor(np.float32([0.5]))
    assert count(one.tanh(), Ops.EXP2) == 1
    assert count(one.asinh(), Ops.LOG2) == 1
    assert count(one.gelu(approximate="tanh"), Ops.EXP2) == 1
    x = np.concatenate([rng.standard_normal(2000) * 3, rng.standard_normal(500) * 0.05,
                        [0.0, -0.0, 1e-8, -1e-8, 30, -30, np.inf, -np.inf, np.nan]]).astype(np.float32)
    for name in ("tanh", "asinh"):
        t, ref = Tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
        got = getattr(t, name)()
        got.sum().backward()
        want = getattr(ref, name)()
        want.sum().backward()
        np.testing.assert_allclose(got.numpy(), want.detach().numpy(), rtol=2e-6, atol=1e-7, equal_nan=True)
        finite = np.isfinite(x)  # asinh's gradient at +-inf is NaN (torch: 0), as before this rule
        np.testing.assert_allclose(t.grad.numpy()[finite], ref.grad.numpy()[finite], rtol=2e-6, atol=1e-7)
    assert np.signbit(Tensor(np.float32([-0.0])).tanh().numpy()[0])  # tanh(-0) = -0, as torch
