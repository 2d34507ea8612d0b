"""Convolution and pooling speed (issue 3, part B) on CPU, with torch CPU as the yardstick.

Run: python -m pytest benchmarks/bench_tensor_nn.py --benchmark-only -q
"""
import numpy as np
import pytest

from polygrad import Tensor

torch = pytest.importorskip("torch")

X_SHAPE, W_SHAPE = (8, 16, 32, 32), (32, 16, 3, 3)


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    x = rng.standard_normal(X_SHAPE).astype(np.float32)
    w = rng.standard_normal(W_SHAPE).astype(np.float32)
    return x, w


def test_conv2d_forward_polygrad(benchmark, data):
    xn, wn = data
    x, w = Tensor(xn, device="CPU").realize(), Tensor(wn, device="CPU").realize()
    out = benchmark(lambda: x.conv2d(w, padding=1).realize())
    ref = torch.nn.functional.conv2d(torch.tensor(xn), torch.tensor(wn), padding=1).numpy()
    np.testing.assert_allclose(out.numpy(), ref, atol=1e-3, rtol=1e-3)


def test_conv2d_forward_torch(benchmark, data):
    xn, wn = data
    x, w = torch.tensor(xn), torch.tensor(wn)
    benchmark(lambda: torch.nn.functional.conv2d(x, w, padding=1))


def test_conv2d_forward_backward_polygrad(benchmark, data):
    xn, wn = data
    x = Tensor(xn, device="CPU", requires_grad=True).realize()
    w = Tensor(wn, device="CPU", requires_grad=True).realize()

    def step():
        x.grad = w.grad = None
        x.conv2d(w, padding=1, stride=2).relu().sum().backward()
        Tensor.realize_all(x.grad, w.grad)
    benchmark(step)


def test_max_pool2d_polygrad(benchmark, data):
    xn, _ = data
    x = Tensor(xn, device="CPU").realize()
    benchmark(lambda: x.max_pool2d(3, stride=2, padding=1).realize())
