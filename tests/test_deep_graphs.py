"""Deep graphs: every walk on the realize path is iterative (issue 9 item 7).

Chains far deeper than Python's recursion limit build, realize and differentiate; very deep fused
elementwise chains are cut into several kernels (schedule/fusion.py MAX_FUSED_DEPTH) so the C renderer copes.
"""
import sys

import numpy as np
import pytest

from polygrad import Tensor
from polygrad.nn import Linear
from polygrad.schedule import fusion


def _chain(n: int) -> Tensor:
    x = Tensor.ones(4)
    for _ in range(n):
        x = x + 1
    return x


def test_recursion_limit_untouched():
    assert sys.getrecursionlimit() <= 10_000  # the tests below must not rely on raising it


def test_300_lazy_ops():
    np.testing.assert_array_equal(_chain(300).numpy(), np.full(4, 301.0, np.float32))


@pytest.mark.parametrize("n", [fusion.MAX_FUSED_DEPTH - 1, fusion.MAX_FUSED_DEPTH, fusion.MAX_FUSED_DEPTH + 1, 3000])
def test_chain_around_split_bound(n):
    np.testing.assert_array_equal(_chain(n).numpy(), np.full(4, n + 1.0, np.float32))


def test_100k_lazy_ops():
    np.testing.assert_array_equal(_chain(100_000).numpy(), np.full(4, 100_001.0, np.float32))


def test_deep_mixed_chain_values():
    # movement and binary ops interleaved, with a second input read at every level
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    w = Tensor(a)
    x = w
    for i in range(2000):
        x = (x * 0.5 + w) if i % 2 == 0 else x.reshape(3, 2).reshape(2, 3)
    ref = a.copy()
    for i in range(2000):
        if i % 2 == 0:
            ref = ref * np.float32(0.5) + a
    np.testing.assert_allclose(x.numpy(), ref, rtol=1e-5)


def test_backward_10k_ops():
    n = 10_000
    w = Tensor.ones(4, requires_grad=True)
    x = w
    for i in range(n):
        x = x * 1.0001 if i % 2 == 0 else x + w
    x.sum().backward()
    d = 1.0  # closed form of dx/dw: multiply by 1.0001 at even steps, add 1 at odd steps
    for i in range(n):
        d = d * 1.0001 if i % 2 == 0 else d + 1.0
    np.testing.assert_allclose(w.grad.numpy(), np.full(4, d), rtol=1e-3)


def test_deep_mlp_grad_per_parameter():
    layers = [Linear(8, 8) for _ in range(40)]
    x = Tensor.ones(2, 8)
    h = x
    for layer in layers:
        h = layer(h).tanh()
    h.sum().backward()
    grads = [layer.weight.grad.numpy() for layer in layers[::4]]  # one parameter per realize
    assert all(g.shape == (8, 8) and np.isfinite(g).all() for g in grads)
    # numpy reference for the whole chain
    hs = [np.ones((2, 8), np.float32)]
    ws = [layer.weight.numpy() for layer in layers]
    bs = [layer.bias.numpy() for layer in layers]
    for W, b in zip(ws, bs):
        hs.append(np.tanh(hs[-1] @ W.T + b))
    g = np.ones((2, 8), np.float32)
    ref = {}
    for k in reversed(range(len(layers))):
        g = g * (1 - hs[k + 1] ** 2)
        ref[k] = g.T @ hs[k]
        g = g @ ws[k]
    for k, got in zip(range(0, 40, 4), grads):
        np.testing.assert_allclose(got, ref[k], rtol=1e-3, atol=1e-5)


def test_reduce_walks_linear():
    # the reduce-buffer rule keeps its results; old schedule semantics (kernel count) unchanged
    a = Tensor.ones(4, 4)
    b = (a.sum(1, keepdim=True).expand(4, 4) * a).sum(1, keepdim=True).expand(4, 4).sum()
    assert b.numpy() == pytest.approx(256.0)
