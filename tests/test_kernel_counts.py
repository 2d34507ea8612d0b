"""Kernel counts: the scheduler fuses a graph into the fewest correct kernels (issue 2, item 4).

Counts come from GlobalCounters.kernel_count after GlobalCounters.reset(); values are checked too.
"""
from __future__ import annotations

import numpy as np
import pytest

from polygrad import GlobalCounters, Tensor

RNG = np.random.default_rng(2)
A = RNG.standard_normal((16, 8)).astype(np.float32)
from conftest import DEVICES as COUNT_DEVICES  # noqa: E402  (every usable backend)


def count_kernels(fn) -> tuple[int, np.ndarray]:
    """Realize fn()'s result and return (kernels run, value)."""
    out = fn()
    GlobalCounters.reset()
    out.realize()
    n = GlobalCounters.kernel_count
    return n, out.numpy()


def _x(device: str) -> Tensor:
    return Tensor(A, device=device).realize()


def _np_softmax(a: np.ndarray, axis: int = -1) -> np.ndarray:
    e = np.exp(a - a.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


# name -> (polygrad expression, NumPy reference, expected kernel count)
CASES = {
    "fused_chain_sum": (lambda x: ((x * 2 + 1).relu() * x).sum(),
                        lambda a: (np.maximum(a * 2 + 1, 0) * a).sum(), 1),
    "elementwise_chain": (lambda x: ((x * 2 + 1).exp() * x - 3).maximum(x).abs().sqrt(),
                          lambda a: np.sqrt(np.abs(np.maximum(np.exp(a * 2 + 1) * a - 3, a))), 1),
    "elementwise_broadcast": (lambda x: x * x[:1] + x[:, :1],
                              lambda a: a * a[:1] + a[:, :1], 1),
    "movement_in_chain": (lambda x: (x.permute(1, 0).flip(0) * 2).reshape(4, 32).pad(((1, 1), (0, 0))) + 1,
                          lambda a: np.pad((a.T[::-1] * 2).reshape(4, 32), ((1, 1), (0, 0))) + 1, 1),
    "reduce_then_elementwise": (lambda x: (x * 2).sum(1) + 1, lambda a: (a * 2).sum(1) + 1, 1),
    "elementwise_reduce_elementwise": (lambda x: ((x.exp() * 3).max(0, keepdim=True) - 1).sqrt(),
                                       lambda a: np.sqrt((np.exp(a) * 3).max(0, keepdims=True) - 1), 1),
    "mean_all": (lambda x: x.mean(), lambda a: a.mean(), 1),
    "two_reductions_one_output": (lambda x: x.sum() + x.max(), lambda a: a.sum() + a.max(), 1),
    "matmul": (lambda x: x @ x.T, lambda a: a @ a.T, 1),
    "matmul_relu": (lambda x: (x @ x.T + 1).relu(), lambda a: np.maximum(a @ a.T + 1, 0), 1),
    "centered": (lambda x: x - x.mean(1, keepdim=True), lambda a: a - a.mean(1, keepdims=True), 2),
    "softmax": (lambda x: x.softmax(-1), _np_softmax, 3),
}


@pytest.mark.parametrize("device", COUNT_DEVICES)
@pytest.mark.parametrize("name", CASES)
def test_kernel_count(device, name):
    fn, ref, expected = CASES[name]
    n, got = count_kernels(lambda: fn(_x(device)))
    np.testing.assert_allclose(got, ref(A), rtol=1e-5, atol=1e-5)
    assert n == expected, f"{name} ran {n} kernels on {device}, expected {expected}"


@pytest.mark.parametrize("device", COUNT_DEVICES)
def test_softmax_kernel_count_is_small(device):
    n, _ = count_kernels(lambda: _x(device).softmax(-1))
    assert n <= 3
    n, _ = count_kernels(lambda: _x(device).log_softmax(-1))
    assert n <= 3


@pytest.mark.parametrize("device", COUNT_DEVICES)
def test_realized_tensor_is_not_recomputed(device):
    x = _x(device)
    y = ((x * 2 + 1).exp()).realize()
    GlobalCounters.reset()
    a = (y + 1).realize()
    b = (y * 3).sum().realize()
    assert GlobalCounters.kernel_count == 2  # one each; y's kernel did not run again
    np.testing.assert_allclose(a.numpy(), np.exp(A * 2 + 1) + 1, rtol=1e-5)
    np.testing.assert_allclose(b.numpy(), (np.exp(A * 2 + 1) * 3).sum(), rtol=1e-4)
    GlobalCounters.reset()
    y.numpy()
    assert GlobalCounters.kernel_count == 0


@pytest.mark.parametrize("device", COUNT_DEVICES)
def test_realizing_twice_runs_nothing(device):
    t = (_x(device) * 2).realize()
    GlobalCounters.reset()
    t.realize()
    t.numpy()
    assert GlobalCounters.kernel_count == 0


@pytest.mark.parametrize("device", COUNT_DEVICES)
def test_realize_several_outputs_together(device):
    x = _x(device)
    a, b = x * 2, (x * 2).sum()
    GlobalCounters.reset()
    Tensor.realize_all(a, b)
    assert GlobalCounters.kernel_count <= 2
    np.testing.assert_allclose(b.numpy(), (A * 2).sum(), rtol=1e-5)
    np.testing.assert_allclose(a.numpy(), A * 2)


@pytest.mark.parametrize("device", COUNT_DEVICES)
def test_creation_ops_fuse_into_consumer(device):
    """zeros/ones/full/arange are computed in the kernel that uses them: no kernel of their own."""
    x = _x(device)
    n, got = count_kernels(lambda: x + Tensor.arange(8, device=device) + Tensor.ones(16, 8, device=device))
    assert n == 1
    np.testing.assert_allclose(got, A + np.arange(8) + 1)


@pytest.mark.parametrize("device", COUNT_DEVICES)
def test_backward_kernel_count_is_bounded(device):
    """The gradient of the fused chain stays a handful of kernels, not one per op."""
    x = Tensor(A, device=device, requires_grad=True)
    ((x * 2 + 1).relu() * x).sum().backward()
    n, got = count_kernels(lambda: x.grad)
    a = A.astype(np.float64)
    ref = np.where(a * 2 + 1 > 0, 2 * a + (a * 2 + 1), 0.0)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    assert n <= 2


def test_long_full_sum_takes_two_kernels():
    """A float sum of 2**22 elements is blocked (at most 128 terms per accumulator): 128-element sums,
    their 128-block sums, ... Each kernel holds its own reduction and one nested in it, also when the
    result is reshaped to a scalar: partial sums of 16384 elements, then their total (was three kernels)."""
    from polygrad.schedule.template import schedule
    tpl, _ = schedule([Tensor.empty(1 << 22).sum().uop])
    assert sum(s.kind == "kernel" for s in tpl.steps) == 2
    n, got = count_kernels(lambda: Tensor(np.ones(1 << 20, np.float32)).sum())
    assert n == 2 and got == 1 << 20


def test_contraction_inside_a_sum_keeps_its_own_kernel():
    """`(a @ b).relu().sum()`: the matmul nested in the full sum would lose its output axes and run as one
    serial loop nest (256x256x256 in one thread); it gets its own kernel (output axes kept, threaded),
    and the sum of its results a second. A plain nested sum (a blocked sum) still fuses (test above)."""
    from polygrad.schedule.template import schedule
    a_np = RNG.standard_normal((64, 32)).astype(np.float32)
    b_np = RNG.standard_normal((32, 48)).astype(np.float32)
    a, b = Tensor(a_np).realize(), Tensor(b_np).realize()
    tpl, _ = schedule([(a @ b).relu().sum().uop])
    assert [s.kind for s in tpl.steps] == ["kernel", "kernel"]
    assert [n for n, _, _ in tpl.new_buffers] == [64 * 48, 1]  # the matmul's whole output, then the sum
    n, got = count_kernels(lambda: (a @ b).relu().sum())
    assert n == 2
    np.testing.assert_allclose(got, np.maximum(a_np @ b_np, 0).sum(), rtol=1e-4)


@pytest.mark.parametrize("combine", ["swiglu", "rnn_cell"])
def test_contractions_side_by_side_get_a_kernel_each(combine):
    """`silu(x @ g) * (x @ u)` (SwiGLU) and `x @ wx + h @ wh` (an RNN cell): two matmuls under one
    elementwise expression get one kernel each (fusion.SIBLING_CONTRACTIONS), the expression fused into the
    second, so each is register-tiled as a matmul alone. Two plain sums side by side (not contractions)
    still share one kernel."""
    from polygrad.schedule.template import schedule
    x_np, h_np = (RNG.standard_normal((24, 40)).astype(np.float32) for _ in range(2))
    g_np, u_np = (RNG.standard_normal((40, 56)).astype(np.float32) for _ in range(2))
    x, h, g, u = (Tensor(v).realize() for v in (x_np, h_np, g_np, u_np))
    if combine == "swiglu":
        def fn():
            return (x @ g).silu() * (x @ u)
        a = x_np @ g_np
        want = a / (1 + np.exp(-a)) * (x_np @ u_np)
    else:
        def fn():
            return x @ g + h @ u
        want = x_np @ g_np + h_np @ u_np
    tpl, _ = schedule([fn().uop])
    assert [s.kind for s in tpl.steps] == ["kernel", "kernel"]
    assert [n for n, _, _ in tpl.new_buffers] == [24 * 56, 24 * 56]
    n, got = count_kernels(fn)
    assert n == 2
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    n, got = count_kernels(lambda: x.sum(1) * h.max(1))
    assert n == 1
    np.testing.assert_allclose(got, x_np.sum(1) * h_np.max(1), rtol=1e-5, atol=1e-5)


def test_contiguous_of_a_contiguous_nested_sum_keeps_it_fused():
    """`y.contiguous().contiguous()` (a captured output over a matvec made contiguous, nn/quant.py's 8-bit
    route) where y is a sum of block sums: the outer contiguous copies the inner one's buffer. Its walk
    went below that point and gave the nested block sums a buffer of their own (rows x blocks x 8)."""
    from polygrad.schedule.template import schedule
    x_np = RNG.standard_normal((1, 3, 4, 8)).astype(np.float32)
    w_np = RNG.standard_normal((24, 3, 4, 8)).astype(np.float32)
    x, w = Tensor(x_np).realize(), Tensor(w_np).realize()

    def matvec() -> Tensor:
        return ((x * w).sum(-2) * 2).sum((-2, -1)).contiguous()
    tpl, _ = schedule([matvec().contiguous().uop])
    assert [n for n, _, _ in tpl.new_buffers] == [24, 24]  # the matvec's rows, then the copy
    np.testing.assert_allclose(matvec().contiguous().numpy(), (x_np * w_np).sum((1, 2, 3)) * 2, rtol=1e-5)
