"""A full training step (forward, backward, optimizer update) under @jit, checked against NumPy."""
import numpy as np
import pytest

from polygrad import Context, Tensor, jit

from conftest import DEVICES  # every usable backend: CPU, INTERP, X86, ...


def _data(n_steps, rng):
    xs = [rng.standard_normal((4, 3)).astype(np.float32) for _ in range(n_steps)]
    ys = [rng.standard_normal((4, 2)).astype(np.float32) for _ in range(n_steps)]
    return xs, ys


def _numpy_sgd(w0, b0, xs, ys, lr):
    w, b, losses = w0.copy(), b0.copy(), []
    for x, y in zip(xs, ys):
        h = x @ w + b
        r = h - y
        losses.append(float((r ** 2).mean()))
        g = 2 * r / r.size
        w, b = w - lr * (x.T @ g), b - lr * g.sum(0)
    return w, b, losses


@pytest.mark.parametrize("device", DEVICES)
def test_hand_written_sgd_step_is_jittable(device):
    rng = np.random.default_rng(1)
    w0, b0 = rng.standard_normal((3, 2)).astype(np.float32), rng.standard_normal(2).astype(np.float32)
    xs, ys = _data(6, rng)
    w = Tensor(w0, device=device, requires_grad=True).realize()
    b = Tensor(b0, device=device, requires_grad=True).realize()

    @jit
    def step(x, y):
        loss = ((x @ w + b - y) ** 2).mean()
        loss.backward()
        w.assign(w - 0.1 * w.grad)
        b.assign(b - 0.1 * b.grad)
        w.grad = b.grad = None
        return loss.realize(w, b)

    losses = [step(Tensor(x, device=device), Tensor(y, device=device)).item() for x, y in zip(xs, ys)]
    w_ref, b_ref, loss_ref = _numpy_sgd(w0, b0, xs, ys, 0.1)
    np.testing.assert_allclose(losses, loss_ref, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(w.numpy(), w_ref, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(b.numpy(), b_ref, rtol=1e-4, atol=1e-5)
    assert step.stats()["replays"] == 4


def test_library_optimizer_step_is_jittable():
    optim = pytest.importorskip("polygrad.nn.optim")
    nn = pytest.importorskip("polygrad.nn")
    if not hasattr(nn, "Linear") or not hasattr(optim, "SGD"):
        pytest.skip("polygrad.nn.Linear / optim.SGD not available in this build")
    rng = np.random.default_rng(2)
    xs, ys = _data(6, rng)
    layer = nn.Linear(3, 2)
    w0, b0 = layer.weight.numpy().T.copy(), layer.bias.numpy().copy()
    opt = optim.SGD(nn.get_parameters(layer), lr=0.1)

    @jit
    def step(x, y):
        opt.zero_grad()
        loss = (layer(x) - y).square().mean()
        loss.backward()
        loss.realize()  # read before the update: a lazy loss realized later would see the new weights
        opt.step()
        return loss

    with Context(TRAINING=1):
        losses = [step(Tensor(x), Tensor(y)).item() for x, y in zip(xs, ys)]
    w_ref, b_ref, loss_ref = _numpy_sgd(w0, b0, xs, ys, 0.1)
    np.testing.assert_allclose(losses, loss_ref, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(layer.weight.numpy().T, w_ref, rtol=1e-4, atol=1e-5)
