"""Optimizers against torch.optim: the parameter trajectory over 10 steps of a small MLP.

LAMB has no torch implementation; it is checked against a NumPy transcription of the paper's update.
Also: training-mode guard, learning-rate changes without recompiling, kernel counts of one step.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from polygrad import Context, GlobalCounters, Tensor, nn
from polygrad.errors import TrainingModeError
from polygrad.nn import get_state_dict, load_state_dict
from polygrad.nn.optim import LAMB, SGD, Adam, AdamW, OptimizerGroup

from conftest import DEVICES  # every usable backend: CPU, INTERP, X86, ...
STEPS = 10


class MLP:
    def __init__(self, device=None):
        self.l1 = nn.Linear(4, 8, device=device)
        self.l2 = nn.Linear(8, 3, device=device)

    def __call__(self, x):
        return self.l2(self.l1(x).relu())


def _data():
    rng = np.random.default_rng(0)
    return rng.standard_normal((6, 4)).astype(np.float32), rng.standard_normal((6, 3)).astype(np.float32)


def _torch_mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))


def _torch_names(name):
    return name.replace("0.", "l1.", 1) if name.startswith("0.") else name.replace("2.", "l2.", 1)


def _run_pair(make_ours, make_theirs, device, steps=STEPS, lr_change=None):
    """Train both models identically; return the list of (ours, theirs) state snapshots."""
    theirs_model = _torch_mlp()
    ours_model = MLP(device)
    load_state_dict(ours_model, {_torch_names(k): v.detach().numpy() for k, v in theirs_model.state_dict().items()})
    opt, topt = make_ours(ours_model), make_theirs(theirs_model)
    x_np, y_np = _data()
    x, y = Tensor(x_np, device=device), Tensor(y_np, device=device)
    tx, ty = torch.tensor(x_np), torch.tensor(y_np)
    snapshots = []
    with Context(TRAINING=1):
        for i in range(steps):
            if lr_change and i == lr_change[0]:
                opt.lr = lr_change[1]
                for g in topt.param_groups:
                    g["lr"] = lr_change[1]
            opt.zero_grad()
            topt.zero_grad()
            loss = (ours_model(x) - y).square().mean()
            loss.backward()
            opt.step()
            tloss = (theirs_model(tx) - ty).square().mean()
            tloss.backward()
            topt.step()
            ours = {k: v.numpy().copy() for k, v in get_state_dict(ours_model).items()}
            snapshots.append((ours, {_torch_names(k): v.detach().numpy().copy()
                                     for k, v in theirs_model.state_dict().items()}))
    return snapshots


def _assert_trajectory(snapshots, atol=1e-5, rtol=1e-4):
    for step, (ours, theirs) in enumerate(snapshots):
        for k in theirs:
            np.testing.assert_allclose(ours[k], theirs[k], atol=atol, rtol=rtol, err_msg=f"step {step + 1}, {k}")
    first, last = snapshots[0][1], snapshots[-1][1]
    assert any(np.abs(first[k] - last[k]).max() > 1e-4 for k in first), "the parameters did not move"


SGD_CASES = {
    "plain": dict(lr=0.1),
    "momentum": dict(lr=0.05, momentum=0.9),
    "nesterov_wd": dict(lr=0.05, momentum=0.8, nesterov=True, weight_decay=0.01),
    "wd": dict(lr=0.1, weight_decay=0.1),
}


# every case on the reference backend; on CPU (which compiles each new kernel) the two richest ones
SGD_RUNS = [("INTERP", case) for case in SGD_CASES] + [("CPU", "momentum"), ("CPU", "nesterov_wd")]


@pytest.mark.parametrize("device, case", SGD_RUNS)
def test_sgd_matches_torch(device, case):
    kw = SGD_CASES[case]
    snaps = _run_pair(lambda m: SGD(nn.get_parameters(m), **kw),
                      lambda m: torch.optim.SGD(m.parameters(), **kw), device)
    _assert_trajectory(snaps)


@pytest.mark.parametrize("device", DEVICES)
def test_adam_matches_torch(device):
    snaps = _run_pair(lambda m: Adam(nn.get_parameters(m), lr=0.01),
                      lambda m: torch.optim.Adam(m.parameters(), lr=0.01), device)
    _assert_trajectory(snaps)


def test_adam_l2_weight_decay_and_betas_match_torch():
    kw = dict(lr=0.02, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.05)
    snaps = _run_pair(lambda m: Adam(nn.get_parameters(m), **kw),
                      lambda m: torch.optim.Adam(m.parameters(), **kw), "CPU")
    _assert_trajectory(snaps)


@pytest.mark.parametrize("device", DEVICES)
def test_adamw_matches_torch(device):
    snaps = _run_pair(lambda m: AdamW(nn.get_parameters(m), lr=0.01, weight_decay=0.1),
                      lambda m: torch.optim.AdamW(m.parameters(), lr=0.01, weight_decay=0.1), device)
    _assert_trajectory(snaps)


class NumpyLAMB:
    """LAMB as in You et al. (2019), Algorithm 2, with bias correction; the torch.optim-like reference."""

    def __init__(self, params, lr=0.001, b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.0):
        self.params, self.lr, self.b1, self.b2, self.eps, self.wd = list(params), lr, b1, b2, eps, weight_decay
        self.m = [torch.zeros_like(p) for p in self.params]
        self.v = [torch.zeros_like(p) for p in self.params]
        self.param_groups, self.t = [{}], 0

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self):
        self.t += 1
        for p, m, v in zip(self.params, self.m, self.v):
            g = p.grad.double()
            m.mul_(self.b1).add_((1 - self.b1) * g)
            v.mul_(self.b2).add_((1 - self.b2) * g * g)
            m_hat, v_hat = m.double() / (1 - self.b1 ** self.t), v.double() / (1 - self.b2 ** self.t)
            up = m_hat / (v_hat.sqrt() + self.eps) + self.wd * p.double()
            r1, r2 = float(p.double().norm()), float(up.norm())
            ratio = r1 / r2 if r1 > 0 and r2 > 0 else 1.0
            p.sub_((self.lr * ratio * up).float())


@pytest.mark.parametrize("device", DEVICES)
def test_lamb_matches_reference(device):
    snaps = _run_pair(lambda m: LAMB(nn.get_parameters(m), lr=0.01, weight_decay=0.01),
                      lambda m: NumpyLAMB(m.parameters(), lr=0.01, weight_decay=0.01), device)
    _assert_trajectory(snaps)


def test_optimizer_group_matches_torch_param_groups():
    def ours(m):
        return OptimizerGroup(SGD(nn.get_parameters(m.l1), lr=0.1, momentum=0.5),
                              Adam(nn.get_parameters(m.l2), lr=0.01))

    class TorchGroup:
        def __init__(self, m):
            self.opts = [torch.optim.SGD(m[0].parameters(), lr=0.1, momentum=0.5),
                         torch.optim.Adam(m[2].parameters(), lr=0.01)]
            self.param_groups = []

        def zero_grad(self):
            for o in self.opts:
                o.zero_grad()

        def step(self):
            for o in self.opts:
                o.step()

    _assert_trajectory(_run_pair(ours, TorchGroup, "CPU"))


def test_lr_change_between_steps_matches_torch_without_recompiling():
    from polygrad.engine.programs import runtime_stats
    compiled = []

    def make(m):
        opt = Adam(nn.get_parameters(m), lr=0.01)
        orig = opt.step

        def step():
            orig()
            compiled.append(runtime_stats["programs_compiled"])
        opt.step = step
        return opt

    snaps = _run_pair(make, lambda m: torch.optim.Adam(m.parameters(), lr=0.01), "CPU", steps=6, lr_change=(3, 0.05))
    _assert_trajectory(snaps)
    assert compiled[2] == compiled[-1], "changing lr recompiled kernels"


def test_lr_is_a_buffer_and_accepts_a_tensor():
    opt = SGD([Tensor([1.0, 2.0], requires_grad=True)], lr=0.5)
    assert isinstance(opt.lr, Tensor) and opt.lr.numpy() == np.float32(0.5)
    opt.lr = Tensor(0.25)
    assert opt.lr.item() == 0.25


def test_step_outside_training_mode_raises():
    w = Tensor([1.0, 2.0], requires_grad=True)
    opt = SGD([w], lr=0.1)
    (w * w).sum().backward()
    with pytest.raises(TrainingModeError, match="TRAINING must be enabled") as err:
        opt.step()
    assert "with Context(TRAINING=1):" in str(err.value)
    np.testing.assert_array_equal(w.numpy(), [1.0, 2.0])


def test_step_without_gradients_and_bad_params():
    opt = SGD([Tensor([1.0], requires_grad=True)])
    with Context(TRAINING=1), pytest.raises(RuntimeError, match="backward"):
        opt.step()
    with pytest.raises(ValueError, match="no parameters"):
        SGD([Tensor([1.0], requires_grad=False)])
    with pytest.raises(TypeError, match="Tensors"):
        SGD([np.zeros(3)])


def test_batchnorm_buffers_update_with_step():
    bn = nn.BatchNorm1d(2)
    opt = SGD(nn.get_parameters(bn), lr=0.1)
    assert len(opt.params) == 2 and len(opt.buffers) == 3
    x = Tensor(np.array([[1.0, 2.0], [3.0, 6.0]], dtype=np.float32))
    with Context(TRAINING=1):
        opt.zero_grad()
        bn(x).square().sum().backward()
        opt.step()
    np.testing.assert_allclose(bn.running_mean.numpy(), [0.2, 0.4], rtol=1e-6)
    np.testing.assert_allclose(bn.running_var.numpy(), [0.9 + 0.1 * 2.0, 0.9 + 0.1 * 8.0], rtol=1e-6)
    assert bn.num_batches_tracked.item() == 1


@pytest.mark.parametrize("make, expected", [
    (lambda ps: Adam(ps, lr=0.01), lambda n: n + 3),  # each parameter, flat m, flat v, (b1**t, b2**t)
    (lambda ps: SGD(ps, lr=0.01, momentum=0.9), lambda n: n + 1),  # each parameter, flat momentum
    (lambda ps: SGD(ps, lr=0.01), lambda n: n),
])
def test_update_kernels_per_step(make, expected):
    """The update phase of a step: one kernel per parameter plus one per flat state buffer."""
    model = MLP("CPU")
    opt = make(nn.get_parameters(model))
    x_np, y_np = _data()
    x, y = Tensor(x_np), Tensor(y_np)
    counts = []
    with Context(TRAINING=1):
        for _ in range(2):
            opt.zero_grad()
            (model(x) - y).square().mean().backward()
            Tensor.realize_all(*[p.grad for p in opt.params])
            GlobalCounters.reset()
            opt.step()
            counts.append(GlobalCounters.kernel_count)
    assert counts == [expected(len(opt.params))] * 2


def test_big_parameters_keep_state_of_their_own():
    """A parameter over SOLO_NUMEL elements gets its own moment buffers (its state update is a plain
    elementwise kernel in vector lanes); small ones still share one flat buffer per group. The trajectory
    still matches torch, and the update phase is one kernel per parameter plus two per state group."""
    from polygrad.nn import optim
    torch.manual_seed(0)
    theirs = torch.nn.Sequential(torch.nn.Linear(200, 100), torch.nn.ReLU(), torch.nn.Linear(100, 3))
    big = 200 * 100
    assert big > optim.SOLO_NUMEL and 100 * 3 <= optim.SOLO_NUMEL
    l1, l2 = nn.Linear(200, 100), nn.Linear(100, 3)
    for ours, t in ((l1, theirs[0]), (l2, theirs[2])):
        ours.weight.assign(Tensor(t.weight.detach().numpy())).realize()
        ours.bias.assign(Tensor(t.bias.detach().numpy())).realize()
    params = [l1.weight, l1.bias, l2.weight, l2.bias]
    opt, topt = Adam(params, lr=0.01), torch.optim.Adam(theirs.parameters(), lr=0.01)
    assert [g.indices for g in opt.groups] == [[0], [1, 2, 3]]
    assert [m.shape for m in opt.m] == [(big,), (100 + 300 + 3,)]
    rng = np.random.default_rng(1)
    x_np, y_np = rng.standard_normal((16, 200)).astype(np.float32), rng.standard_normal((16, 3)).astype(np.float32)
    x, y = Tensor(x_np), Tensor(y_np)
    with Context(TRAINING=1):
        for _ in range(3):
            opt.zero_grad()
            (l2(l1(x).relu()) - y).square().mean().backward()
            Tensor.realize_all(*[p.grad for p in params])
            GlobalCounters.reset()
            opt.step()
            assert GlobalCounters.kernel_count == len(params) + 2 * 2 + 1  # + (b1**t, b2**t)
            topt.zero_grad()
            (theirs(torch.tensor(x_np)) - torch.tensor(y_np)).square().mean().backward()
            topt.step()
    np.testing.assert_allclose(l1.weight.numpy(), theirs[0].weight.detach().numpy(), atol=1e-5, rtol=1e-4)
    np.testing.assert_allclose(l2.bias.numpy(), theirs[2].bias.detach().numpy(), atol=1e-5, rtol=1e-4)
