"""Real training on data made here: an MLP classifier and a small conv net with BatchNorm.

Sizes are small so the CPU run takes seconds; thresholds are far from chance, so a broken gradient,
optimizer or BatchNorm shows up as a failure.
"""
from __future__ import annotations

import numpy as np
import pytest

from polygrad import Context, Tensor, nn
from polygrad.nn.optim import SGD, Adam


def _clusters(n_per_class=40, classes=10, dims=12, seed=0):
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((classes, dims)) * 2.0
    y = np.repeat(np.arange(classes), n_per_class)
    x = centers[y] + rng.standard_normal((len(y), dims))
    order = rng.permutation(len(y))
    return x[order].astype(np.float32), y[order].astype(np.int32)


class MLP:
    def __init__(self, dims, hidden, classes):
        self.l1 = nn.Linear(dims, hidden)
        self.l2 = nn.Linear(hidden, classes)

    def __call__(self, x):
        return self.l2(self.l1(x).relu())


def test_mlp_learns_ten_classes():
    Tensor.manual_seed(0)
    all_x, all_y = _clusters()
    x_np, y_np = all_x[:300], all_y[:300]
    held_x, held_y = all_x[300:], all_y[300:]  # held-out samples of the same task
    model = MLP(12, 32, 10)
    opt = Adam(nn.get_parameters(model), lr=0.02)
    x, y = Tensor(x_np), Tensor(y_np)
    with Context(TRAINING=1):
        for _ in range(60):
            opt.zero_grad()
            loss = model(x).cross_entropy(y)
            loss.backward()
            opt.step(loss)
    first_loss = float(np.log(10))
    assert loss.item() < first_loss / 4
    train_acc = (model(x).argmax(-1).numpy() == y_np).mean()
    test_acc = (model(Tensor(held_x)).argmax(-1).numpy() == held_y).mean()
    assert train_acc > 0.95, train_acc
    assert test_acc > 0.9, test_acc


def _stripes(n=64, size=8, seed=0):
    """Images with a horizontal (class 0) or vertical (class 1) bright bar at a random place, plus noise."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 1, size, size)).astype(np.float32) * 0.3
    y = rng.integers(0, 2, n).astype(np.int32)
    pos = rng.integers(1, size - 1, n)
    for i in range(n):
        if y[i] == 0:
            x[i, 0, pos[i], :] += 1.5
        else:
            x[i, 0, :, pos[i]] += 1.5
    return x, y


class ConvNet:
    def __init__(self):
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4, 2)

    def __call__(self, x):
        h = self.bn(self.conv(x)).relu()
        return self.fc(h.mean((2, 3)))


def test_convnet_with_batchnorm_learns_stripes():
    Tensor.manual_seed(1)
    x_np, y_np = _stripes()
    model = ConvNet()
    opt = SGD(nn.get_parameters(model), lr=0.2, momentum=0.9)
    x, y = Tensor(x_np), Tensor(y_np)
    losses = []
    with Context(TRAINING=1):
        for _ in range(25):
            opt.zero_grad()
            loss = model(x).cross_entropy(y)
            loss.backward()
            opt.step(loss)
            losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses
    assert model.bn.num_batches_tracked.item() == 25
    assert np.abs(model.bn.running_mean.numpy()).sum() > 0  # running stats moved during training
    # evaluation mode uses the running statistics on unseen images
    test_x, test_y = _stripes(n=64, seed=3)
    acc = (model(Tensor(test_x)).argmax(-1).numpy() == test_y).mean()
    assert acc > 0.85, acc


def test_layers_and_optimizer_under_an_explicit_runtime():
    import polygrad
    from polygrad.errors import RuntimeOwnershipError
    rt = polygrad.create(device="interp")
    other = polygrad.create(device="interp")
    try:
        layer = rt.nn.Linear(2, 1)
        opt = rt.nn.optim.SGD(rt.nn.get_parameters(layer), lr=0.05)
        assert layer.weight.device == "INTERP" and layer.weight._runtime is rt and opt.lr._runtime is rt
        x, y = rt.Tensor([[1.0, 2.0], [3.0, 4.0]]), rt.Tensor([[5.0], [11.0]])
        with Context(TRAINING=1):
            for _ in range(40):
                opt.zero_grad()
                loss = (layer(x) - y).square().mean()
                loss.backward()
                opt.step(loss)
        assert loss.item() < 0.05
        with pytest.raises(RuntimeOwnershipError):
            layer(other.Tensor([[1.0, 2.0]])).numpy()
    finally:
        rt.dispose()
        other.dispose()


def test_linear_forward_kernel_is_register_tiled():
    """Regression: x @ W.T (Linear's layout: no operand contiguous along the output column) used to get
    only a split reduction, which made the forward pass of training several times slower."""
    from polygrad.engine.programs import program_cache
    rng = np.random.default_rng(0)
    x_np, w_np = rng.standard_normal((8, 72)).astype(np.float32), rng.standard_normal((48, 72)).astype(np.float32)
    y = (Tensor(x_np) @ Tensor(w_np).T).realize()
    np.testing.assert_allclose(y.numpy(), x_np @ w_np.T, rtol=1e-4, atol=1e-4)
    progs = [p for key, p in program_cache.items() if key[0].arg.name == "r_8_48"]  # key: (ast, device, ...)
    assert progs and all(any(o.kind == "UPCAST" for o in p.spec.opts) for p in progs), [p.spec.opts for p in progs]
