"""Property-based checks against NumPy: broadcasting arithmetic and chains of reshape/permute/expand."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from polygrad import Tensor
from polygrad.uop.shape import ShapeError
from tensor_core_ref import DEVICES

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
EXAMPLES = {"CPU": 5, "INTERP": 25, "X86": 25, "CUDA": 5}  # backends with a slow compiler get fewer

dims = st.integers(min_value=0, max_value=4)


@st.composite
def broadcastable_pair(draw):
    """Two shapes that broadcast: start from one shape, drop leading dims and set some to 1."""
    base = draw(st.lists(st.integers(1, 4), min_size=0, max_size=4))
    if draw(st.booleans()) and base:
        base[draw(st.integers(0, len(base) - 1))] = 0
    def variant():
        keep = draw(st.integers(0, len(base)))
        shape = base[len(base) - keep:]
        return tuple(1 if draw(st.booleans()) else s for s in shape)
    return variant(), variant()


@st.composite
def movement_chain(draw):
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=4)))
    steps = []
    current = shape
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["reshape", "permute", "expand", "flip", "transpose"]))
        if kind == "reshape":
            n = int(np.prod(current))
            factors = [f for f in range(1, n + 1) if n % f == 0]
            a = draw(st.sampled_from(factors))
            new = (a, n // a) if draw(st.booleans()) else (n // a, 1, a)
            steps.append(("reshape", new))
            current = new
        elif kind == "permute":
            order = tuple(draw(st.permutations(range(len(current)))))
            steps.append(("permute", order))
            current = tuple(current[i] for i in order)
        elif kind == "expand":
            new = tuple(3 if s == 1 and draw(st.booleans()) else s for s in current)
            steps.append(("expand", new))
            current = new
        elif kind == "flip":
            axis = draw(st.integers(-len(current), len(current) - 1))
            steps.append(("flip", axis))
        else:
            a = draw(st.integers(-len(current), len(current) - 1))
            b = draw(st.integers(-len(current), len(current) - 1))
            steps.append(("transpose", (a, b)))
            order = list(range(len(current)))
            order[a], order[b] = order[b], order[a]
            current = tuple(current[i] for i in order)
    return shape, steps


def _apply_np(x: np.ndarray, steps) -> np.ndarray:
    for kind, arg in steps:
        if kind == "reshape":
            x = x.reshape(arg)
        elif kind == "permute":
            x = x.transpose(arg)
        elif kind == "expand":
            x = np.broadcast_to(x, arg)
        elif kind == "flip":
            x = np.flip(x, arg)
        else:
            x = np.swapaxes(x, *arg)
    return x


def _apply_pg(x: Tensor, steps) -> Tensor:
    for kind, arg in steps:
        if kind == "reshape":
            x = x.reshape(arg)
        elif kind == "permute":
            x = x.permute(arg)
        elif kind == "expand":
            x = x.expand(arg)
        elif kind == "flip":
            x = x.flip(arg)
        else:
            x = x.transpose(*arg)
    return x


@pytest.mark.parametrize("device", DEVICES)
def test_broadcast_arithmetic_matches_numpy(device):
    @settings(max_examples=EXAMPLES.get(device, 5), **SETTINGS)
    @given(broadcastable_pair(), st.sampled_from(["add", "mul", "sub", "maximum", "where"]))
    def check(shapes, op):
        sa, sb = shapes
        rng = np.random.default_rng(0)
        a = rng.standard_normal(sa).astype(np.float32)
        b = rng.standard_normal(sb).astype(np.float32)
        pa, pb = Tensor(a, device=device), Tensor(b, device=device)
        if op == "where":
            got, want = (pa > 0).where(pa, pb), np.where(a > 0, a, b)
        elif op == "maximum":
            got, want = pa.maximum(pb), np.maximum(a, b)
        else:
            got, want = getattr(pa, op)(pb), getattr(np, {"add": "add", "mul": "multiply", "sub": "subtract"}[op])(a, b)
        assert got.shape == want.shape
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-6)
    check()


@pytest.mark.parametrize("device", DEVICES)
def test_incompatible_shapes_raise(device):
    @settings(max_examples=EXAMPLES.get(device, 5), **SETTINGS)
    @given(st.lists(st.integers(2, 4), min_size=1, max_size=3))
    def check(shape):
        other = tuple(s + 1 for s in shape)
        with pytest.raises(ShapeError, match="broadcast"):
            Tensor.zeros(*shape, device=device) + Tensor.zeros(*other, device=device)
    check()


@pytest.mark.parametrize("device", DEVICES)
def test_movement_chains_match_numpy(device):
    @settings(max_examples=EXAMPLES.get(device, 5), **SETTINGS)
    @given(movement_chain())
    def check(case):
        shape, steps = case
        x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
        got = _apply_pg(Tensor(x, device=device), steps)
        want = _apply_np(x, steps)
        assert got.shape == want.shape
        np.testing.assert_array_equal((got * 1).numpy(), want)
        np.testing.assert_allclose(got.sum(0).numpy() if want.ndim else got.numpy(),
                                   want.sum(0) if want.ndim else want, rtol=1e-6)
    check()


@pytest.mark.parametrize("device", DEVICES)
def test_reduce_axes_match_numpy(device):
    @settings(max_examples=EXAMPLES.get(device, 5), **SETTINGS)
    @given(st.lists(st.integers(0, 4), min_size=1, max_size=3), st.data())
    def check(shape, data):
        x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
        axis = data.draw(st.integers(-len(shape), len(shape) - 1))
        keep = data.draw(st.booleans())
        t = Tensor(x, device=device)
        np.testing.assert_allclose(t.sum(axis, keepdim=keep).numpy(), x.sum(axis, keepdims=keep), rtol=1e-5,
                                   atol=1e-6)
        if x.shape[axis]:
            np.testing.assert_array_equal(t.max(axis, keepdim=keep).numpy(), x.max(axis, keepdims=keep))
            np.testing.assert_array_equal(t.argmax(axis).numpy(), x.argmax(axis))
            np.testing.assert_allclose(t.cumsum(axis).numpy(), x.cumsum(axis), rtol=1e-5, atol=1e-5)
    check()
