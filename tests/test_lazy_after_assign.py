"""A lazy tensor reads the values its inputs had when it was built, whatever is assigned to them later.

`loss = (w*w).sum(); loss.backward(); opt.step(); loss.item()` used to return the loss after the update
(in an MLP, polygrad's loss at step i equalled torch's at step i+1). Live lazy values that read an
overwritten buffer are now computed in the same schedule as the write, before it (schedule/overwrites.py),
and the optimizer computes them with the gradients, sharing their kernels: no extra kernels.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from polygrad import Context, GlobalCounters, Tensor, nn
from polygrad.nn.optim import SGD, Adam

DEVICES = ["CPU", "INTERP"]


def test_value_built_before_an_assign_keeps_the_old_inputs(device: str = "CPU") -> None:
    a = Tensor(np.array([1.0, 2.0], np.float32)).realize()
    b = a * 2 + 1
    s = a.sum()
    view = a[1:]  # a view aliases the buffer, as in PyTorch
    a.assign(Tensor(np.array([10.0, 20.0], np.float32))).realize()
    assert b.tolist() == [3.0, 5.0] and s.item() == 3.0
    assert view.tolist() == [20.0] and a.tolist() == [10.0, 20.0]
    c = a * 2  # built after the write: the new values
    assert c.tolist() == [20.0, 40.0]


def test_setitem_keeps_earlier_lazy_values() -> None:
    x = Tensor(np.zeros(4, np.float32)).realize()
    total = (x + 1).sum()
    x[1:3] = 5.0
    assert total.item() == 4.0 and x.tolist() == [0.0, 5.0, 5.0, 0.0]


class _MLP:
    def __init__(self, sizes: list[int], device: str):
        rng = np.random.default_rng(0)
        self.ws = [(rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32) for a, b in zip(sizes, sizes[1:])]
        self.bs = [np.zeros(b, np.float32) for b in sizes[1:]]
        self.params = [Tensor(w, device=device, requires_grad=True) for w in self.ws] + \
                      [Tensor(b, device=device, requires_grad=True) for b in self.bs]

    def __call__(self, x: Tensor) -> Tensor:
        n = len(self.ws)
        for i, (w, b) in enumerate(zip(self.params[:n], self.params[n:])):
            x = x @ w + b
            x = x.relu() if i < n - 1 else x
        return x


def _torch_losses(model: _MLP, x: np.ndarray, y: np.ndarray, opt_name: str, steps: int) -> list[float]:
    ws = [torch.tensor(w, requires_grad=True) for w in model.ws]
    bs = [torch.tensor(b, requires_grad=True) for b in model.bs]
    opt = torch.optim.SGD(ws + bs, lr=0.05) if opt_name == "sgd" else torch.optim.Adam(ws + bs, lr=0.01)
    out = []
    for _ in range(steps):
        h = torch.tensor(x)
        for i, (w, b) in enumerate(zip(ws, bs)):
            h = h @ w + b
            h = h.relu() if i < len(ws) - 1 else h
        loss = torch.nn.functional.cross_entropy(h, torch.tensor(y))
        opt.zero_grad()
        loss.backward()
        opt.step()
        out.append(loss.item())  # read after the step, as the polygrad loop below does
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("opt_name", ["sgd", "adam"])
def test_mlp_loss_read_after_step_matches_torch(device: str, opt_name: str) -> None:
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((16, 24)).astype(np.float32), rng.integers(0, 10, 16)
    model = _MLP([24, 32, 32, 10], device)  # the 784-512-512-10 MLP, scaled down
    want = _torch_losses(model, x, y, opt_name, 3)
    opt = SGD(model.params, lr=0.05) if opt_name == "sgd" else Adam(model.params, lr=0.01)
    got = []
    with Context(TRAINING=1):
        for _ in range(3):
            loss = model(Tensor(x, device=device)).cross_entropy(Tensor(y.astype(np.int32), device=device))
            opt.zero_grad()
            loss.backward()
            opt.step()
            got.append(loss.item())
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def _step_kernels(read: str) -> tuple[int, float]:
    """Kernels of one training step plus the loss read, the loss being read `read` the step."""
    model = _MLP([8, 16, 4], "CPU")
    opt = Adam(model.params, lr=0.01)
    rng = np.random.default_rng(2)
    x, y = Tensor(rng.standard_normal((6, 8)).astype(np.float32)), Tensor(rng.integers(0, 4, 6).astype(np.int32))
    counts, value = [], 0.0
    with Context(TRAINING=1):
        for _ in range(2):  # the second step runs with every program compiled
            loss = model(x).cross_entropy(y)
            opt.zero_grad()
            loss.backward()
            GlobalCounters.reset()
            if read == "with_step":
                opt.step(loss)
            elif read == "before_step":
                loss.realize()
                opt.step()
            else:
                opt.step()
            value = loss.item()
            counts.append(GlobalCounters.kernel_count)
    return counts[-1], value


def test_reading_the_loss_after_the_step_adds_no_kernels() -> None:
    """The loss read after step() is computed with the gradients, exactly as when passed to step(loss);
    before, it was recomputed from the new parameters (more kernels, and the wrong value)."""
    shared, value = _step_kernels("with_step")
    after, value_after = _step_kernels("after_step")
    before, value_before = _step_kernels("before_step")
    assert after == shared, (after, shared)
    assert before >= shared
    assert value_after == value == value_before


def test_step_without_live_lazy_values_is_unchanged() -> None:
    """No lazy reader, no extra work: a realized loss and dead temporaries leave the step as it was."""
    model = _MLP([8, 16, 4], "CPU")
    opt = SGD(model.params, lr=0.01)
    x = Tensor(np.ones((6, 8), np.float32))
    counts = []
    with Context(TRAINING=1):
        for _ in range(2):
            opt.zero_grad()
            model(x).square().mean().backward()
            Tensor.realize_all(*[p.grad for p in opt.params])
            GlobalCounters.reset()
            opt.step()
            counts.append(GlobalCounters.kernel_count)
    assert counts == [len(opt.params)] * 2  # one update kernel per parameter, as in test_optim_trajectories


def test_layer_training_loop_with_nn_modules() -> None:
    lin = nn.Linear(4, 3)
    opt = SGD(nn.state.get_parameters(lin), lr=0.1)
    x = Tensor(np.ones((2, 4), np.float32))
    with Context(TRAINING=1):
        out = lin(x)
        loss = out.square().sum()
        expected = float((lin(x).numpy() ** 2).sum())
        opt.zero_grad()
        loss.backward()
        opt.step()
        assert loss.item() == pytest.approx(expected, rel=1e-6)
        assert out.numpy().shape == (2, 3) and float((out.numpy() ** 2).sum()) == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_graph_mixing_old_values_and_the_write(device: str) -> None:
    """`a` was computed from x before the write, the assign is in the same graph: old*2 + new, as in
    PyTorch (before: a scheduler cycle error, or silently new*2 + new once the assign ran elsewhere)."""
    x = Tensor(np.array([1.0, 2.0], np.float32), device=device).realize()
    a = x * 2
    y = a + x.assign(Tensor(np.array([10.0, 20.0], np.float32), device=device))
    assert y.tolist() == [12.0, 24.0] and x.tolist() == [10.0, 20.0]
    x2 = Tensor(np.array([1.0, 2.0], np.float32), device=device).realize()
    b = x2 * 2
    y2 = b + x2.assign(Tensor(np.array([10.0, 20.0], np.float32), device=device))
    del b  # only y2's graph remembers the pre-write part
    assert (x2 + 0).tolist() == [10.0, 20.0]  # runs the assign through another graph first
    assert y2.tolist() == [12.0, 24.0]


def test_values_outside_a_capture_are_not_recorded_into_it() -> None:
    """A live value built before a jitted write is computed once, outside the capture: the replay runs
    only the function's own kernels."""
    from polygrad import TinyJit
    w = Tensor(np.array([1.0, 2.0], np.float32)).realize()

    @TinyJit
    def step(g: Tensor) -> Tensor:
        return w.assign(w - g).realize()

    step(Tensor(np.array([0.5, 0.5], np.float32)))  # the warm-up
    before = w * 2 + 1  # lazy, reads w; alive while the next call captures
    for _ in range(3):
        step(Tensor(np.array([0.5, 0.5], np.float32)))
    assert step.stats()["captured_kernels"] == 1
    assert before.tolist() == [2.0, 4.0] and w.tolist() == [-1.0, 0.0]
