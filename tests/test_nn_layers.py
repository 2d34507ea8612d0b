"""Every nn layer against torch.nn: parameter names/shapes/init, forward values and gradients.

Weights are copied from the torch layer with load_state_dict (which also checks that the names and
shapes line up); the backward pass uses a random cotangent so every output element matters.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from polygrad import Context, Tensor, nn
from polygrad.nn import get_parameters, get_state_dict, load_state_dict

from conftest import DEVICES  # every usable backend: CPU, INTERP, X86, ...


def _assert_close(ours, theirs, what, atol=1e-5, rtol=1e-4):
    np.testing.assert_allclose(ours, theirs, atol=atol, rtol=rtol, err_msg=what)


def check_layer(ours, theirs, x_np, device, atol=1e-5, rtol=1e-4, int_input=False, seed=0):
    """Copy theirs' state into ours, then compare outputs and all gradients."""
    load_state_dict(ours, {k: v.detach().numpy() for k, v in theirs.state_dict().items()})
    x = Tensor(x_np, device=device, requires_grad=None if int_input else True)
    tx = torch.tensor(x_np, requires_grad=not int_input)
    out, tout = ours(x), theirs(tx)
    cot = np.random.default_rng(seed + 1).standard_normal(tout.shape).astype(np.float32)
    (out * Tensor(cot, device=device)).sum().backward()  # before realizing out: gradients need its graph
    (tout * torch.tensor(cot)).sum().backward()
    _assert_close(out.numpy(), tout.detach().numpy(), "forward", atol, rtol)
    if not int_input:
        _assert_close(x.grad.numpy(), tx.grad.numpy(), "input grad", atol, rtol)
    ours_sd = get_state_dict(ours)
    for name, p in theirs.named_parameters():
        _assert_close(ours_sd[name].grad.numpy(), p.grad.numpy(), f"grad of {name}", atol, rtol)
    return out


def randn(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def check_init(ours, theirs):
    """Same names, shapes and dtypes as torch; values drawn from the same kind of distribution."""
    ours_sd = get_state_dict(ours)
    theirs_sd = theirs.state_dict()
    assert list(ours_sd) == list(theirs_sd)
    for k, v in theirs_sd.items():
        assert ours_sd[k].shape == tuple(v.shape), k
        ov, tv = ours_sd[k].numpy().astype(np.float64), v.numpy().astype(np.float64)
        if tv.size > 1 and tv.std() > 0:  # random init: same range / spread, not the same numbers
            assert abs(ov.std() - tv.std()) < 0.35 * tv.std() + 1e-3, k
            assert np.abs(ov).max() <= np.abs(tv).max() * 1.5 + 1e-3, k
        else:
            np.testing.assert_array_equal(ov, tv, err_msg=k)


@pytest.mark.parametrize("device", DEVICES)
def test_linear(device):
    check_layer(nn.Linear(5, 3, device=device), torch.nn.Linear(5, 3), randn(4, 5), device)
    if device == "INTERP":  # more configurations on the reference backend only (no compiling)
        check_layer(nn.Linear(5, 3, bias=False, device=device), torch.nn.Linear(5, 3, bias=False), randn(2, 3, 5),
                    device)


def test_init_matches_torch_distributions():
    torch.manual_seed(0)
    Tensor.manual_seed(0)
    dev = "INTERP"  # the counter-based RNG gives the same numbers on every backend; INTERP needs no compiling
    check_init(nn.Linear(64, 32, device=dev), torch.nn.Linear(64, 32))
    check_init(nn.Conv2d(4, 8, 3, device=dev), torch.nn.Conv2d(4, 8, 3))
    check_init(nn.ConvTranspose2d(4, 8, 3, device=dev), torch.nn.ConvTranspose2d(4, 8, 3))
    check_init(nn.Embedding(50, 16, device=dev), torch.nn.Embedding(50, 16))
    check_init(nn.LayerNorm(8, device=dev), torch.nn.LayerNorm(8))
    check_init(nn.BatchNorm2d(6, device=dev), torch.nn.BatchNorm2d(6))
    check_init(nn.GroupNorm(2, 6, device=dev), torch.nn.GroupNorm(2, 6))
    check_init(nn.LSTMCell(8, 16, device=dev), torch.nn.LSTMCell(8, 16))
    check_init(nn.RMSNorm(8, device=dev), torch.nn.RMSNorm(8))


def test_parameters_require_grad_and_buffers_do_not():
    bn = nn.BatchNorm2d(3)
    sd = get_state_dict(bn)
    assert [k for k, v in sd.items() if v.requires_grad] == ["weight", "bias"]
    assert sd["num_batches_tracked"].dtype.name == "long"


@pytest.mark.parametrize("device", DEVICES)
def test_layernorm(device):
    check_layer(nn.LayerNorm(6, device=device), torch.nn.LayerNorm(6), randn(3, 6) * 3 + 1, device)
    if device == "INTERP":  # more configurations on the reference backend only (no compiling)
        check_layer(nn.LayerNorm((2, 3), elementwise_affine=False, device=device),
                    torch.nn.LayerNorm((2, 3), elementwise_affine=False), randn(4, 2, 3), device)
        torch_ln = torch.nn.LayerNorm(4, bias=False)
        with torch.no_grad():
            torch_ln.weight.uniform_(0.5, 1.5)
        check_layer(nn.LayerNorm(4, bias=False, device=device), torch_ln, randn(2, 4), device)


@pytest.mark.parametrize("device", DEVICES)
def test_layernorm2d(device):
    class TorchLayerNorm2d(torch.nn.LayerNorm):
        def forward(self, x):
            return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
    theirs = TorchLayerNorm2d(3)
    with torch.no_grad():
        theirs.weight.uniform_(0.5, 1.5)
        theirs.bias.uniform_(-1, 1)
    check_layer(nn.LayerNorm2d(3, device=device), theirs, randn(2, 3, 4, 5), device)


@pytest.mark.parametrize("device", DEVICES)
def test_rmsnorm(device):
    theirs = torch.nn.RMSNorm(6)
    with torch.no_grad():
        theirs.weight.uniform_(0.5, 1.5)
    check_layer(nn.RMSNorm(6, device=device), theirs, randn(3, 6), device)
    if device == "INTERP":  # more configurations on the reference backend only (no compiling)
        check_layer(nn.RMSNorm(6, eps=1e-3, device=device), torch.nn.RMSNorm(6, eps=1e-3), randn(2, 6) * 0.01,
                    device)


@pytest.mark.parametrize("device", DEVICES)
def test_groupnorm(device):
    theirs = torch.nn.GroupNorm(2, 6)
    with torch.no_grad():
        theirs.weight.uniform_(0.5, 1.5)
        theirs.bias.uniform_(-1, 1)
    check_layer(nn.GroupNorm(2, 6, device=device), theirs, randn(3, 6, 5), device)
    if device == "INTERP":  # more configurations on the reference backend only (no compiling)
        check_layer(nn.GroupNorm(3, 6, affine=False, device=device), torch.nn.GroupNorm(3, 6, affine=False),
                    randn(2, 6, 2, 2), device)


@pytest.mark.parametrize("device", DEVICES)
def test_instancenorm(device):
    check_layer(nn.InstanceNorm(3, device=device), torch.nn.InstanceNorm2d(3), randn(2, 3, 4, 4), device)
    if device == "INTERP":  # more configurations on the reference backend only (no compiling)
        theirs = torch.nn.InstanceNorm1d(3, affine=True)
        with torch.no_grad():
            theirs.weight.uniform_(0.5, 1.5)
            theirs.bias.uniform_(-1, 1)
        check_layer(nn.InstanceNorm1d(3, affine=True, device=device), theirs, randn(2, 3, 7), device)


@pytest.mark.parametrize("device", DEVICES)
def test_embedding(device):
    idx = np.array([[1, 4, 0], [9, 4, 4]], dtype=np.int32)
    check_layer(nn.Embedding(10, 5, device=device), torch.nn.Embedding(10, 5), idx, device, int_input=True)


def test_embedding_padding_idx_gets_no_gradient():
    idx = np.array([[0, 2, 2, 1]], dtype=np.int32)
    out = check_layer(nn.Embedding(4, 3, padding_idx=2, device="INTERP"), torch.nn.Embedding(4, 3, padding_idx=2),
                      idx, "INTERP", int_input=True)
    assert out.shape == (1, 4, 3)
    assert np.all(nn.Embedding(4, 3, padding_idx=-1).weight.numpy()[3] == 0)


def test_embedding_rejects_float_indices():
    with pytest.raises(TypeError, match="integers"):
        nn.Embedding(3, 2)(Tensor([0.0, 1.0]))


@pytest.mark.parametrize("device", DEVICES)
def test_lstmcell(device):
    x, h, c = randn(3, 4), randn(3, 5, seed=1), randn(3, 5, seed=2)
    theirs = torch.nn.LSTMCell(4, 5)
    ours = nn.LSTMCell(4, 5, device=device)

    class Wrap:
        def __init__(self, cell, hc):
            self.cell, self._state = cell, lambda: hc  # the state is an input, not part of the state dict

        def __call__(self, inp):
            h2, c2 = self.cell(inp, self._state())
            return h2 * 2 + c2

    class TorchWrap(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.cell = theirs

        def forward(self, inp):
            h2, c2 = self.cell(inp, (torch.tensor(h), torch.tensor(c)))
            return h2 * 2 + c2

    check_layer(Wrap(ours, (Tensor(h, device=device), Tensor(c, device=device))), TorchWrap(), x, device)
    # default zero state and unbatched input
    h1, c1 = ours(Tensor(x[0], device=device))
    th1, tc1 = theirs(torch.tensor(x[0]))
    _assert_close(h1.numpy(), th1.detach().numpy(), "unbatched h")
    _assert_close(c1.numpy(), tc1.detach().numpy(), "unbatched c")


@pytest.mark.parametrize("device", DEVICES)
def test_conv2d(device):
    check_layer(nn.Conv2d(3, 4, 3, device=device), torch.nn.Conv2d(3, 4, 3), randn(2, 3, 6, 6), device)
    if device == "INTERP":  # more configurations on the reference backend only (no compiling)
        check_layer(nn.Conv2d(4, 6, (3, 2), stride=2, padding=(1, 2), dilation=(1, 2), groups=2, device=device),
                    torch.nn.Conv2d(4, 6, (3, 2), stride=2, padding=(1, 2), dilation=(1, 2), groups=2),
                    randn(1, 4, 7, 8), device)


def test_conv2d_same_padding_and_no_bias():
    check_layer(nn.Conv2d(2, 3, 4, padding="same", bias=False, device="INTERP"),
                torch.nn.Conv2d(2, 3, 4, padding="same", bias=False), randn(1, 2, 5, 5), "INTERP")


@pytest.mark.parametrize("mode", ["reflect", "replicate", "circular"])
def test_conv2d_padding_modes(mode):
    check_layer(nn.Conv2d(2, 3, 3, padding=1, padding_mode=mode, device="INTERP"),
                torch.nn.Conv2d(2, 3, 3, padding=1, padding_mode=mode), randn(1, 2, 5, 5), "INTERP")


@pytest.mark.parametrize("device", DEVICES)
def test_conv1d(device):
    check_layer(nn.Conv1d(3, 4, 3, padding=2, device=device), torch.nn.Conv1d(3, 4, 3, padding=2),
                randn(2, 3, 9), device)
    if device == "INTERP":  # more configurations on the reference backend only (no compiling)
        check_layer(nn.Conv1d(2, 2, 2, stride=2, groups=2, device=device),
                    torch.nn.Conv1d(2, 2, 2, stride=2, groups=2), randn(1, 2, 6), device)


@pytest.mark.parametrize("device", DEVICES)
def test_conv_transpose2d(device):
    check_layer(nn.ConvTranspose2d(3, 2, 3, device=device), torch.nn.ConvTranspose2d(3, 2, 3), randn(2, 3, 4, 4),
                device)
    if device == "INTERP":  # more configurations on the reference backend only (no compiling)
        check_layer(nn.ConvTranspose2d(4, 2, (3, 2), stride=2, padding=1, output_padding=1, groups=2,
                                       device=device),
                    torch.nn.ConvTranspose2d(4, 2, (3, 2), stride=2, padding=1, output_padding=1, groups=2),
                    randn(1, 4, 3, 3), device)


@pytest.mark.parametrize("device", DEVICES)
def test_conv_transpose1d(device):
    check_layer(nn.ConvTranspose1d(2, 3, 3, stride=2, device=device), torch.nn.ConvTranspose1d(2, 3, 3, stride=2),
                randn(2, 2, 5), device)


def test_conv_rejects_bad_arguments():
    with pytest.raises(ValueError, match="divisible by groups"):
        nn.Conv2d(3, 4, 3, groups=2)
    with pytest.raises(ValueError, match="stride 1"):
        nn.Conv2d(3, 4, 3, padding="same", stride=2)
    with pytest.raises(ValueError, match="kernel_size"):
        nn.Conv2d(3, 4, (3, 3, 3))


@pytest.mark.parametrize("device", DEVICES)
def test_batchnorm_training_and_eval(device):
    theirs = torch.nn.BatchNorm2d(3)
    with torch.no_grad():
        theirs.weight.uniform_(0.5, 1.5)
        theirs.bias.uniform_(-1, 1)
    ours = nn.BatchNorm2d(3, device=device)
    with Context(TRAINING=1):
        theirs.train()
        check_layer(ours, theirs, randn(4, 3, 2, 2) * 2 + 1, device)
        # running statistics moved only in training mode; load_state_dict copied torch's *before* its step
    sd = get_state_dict(ours)
    _assert_close(sd["running_mean"].numpy(), theirs.running_mean.numpy(), "running_mean")
    _assert_close(sd["running_var"].numpy(), theirs.running_var.numpy(), "running_var")
    assert sd["num_batches_tracked"].item() == theirs.num_batches_tracked.item() == 1
    theirs.eval()
    before = sd["running_mean"].numpy().copy()
    x = randn(2, 3, 3, 3, seed=5)
    _assert_close(ours(Tensor(x, device=device)).numpy(), theirs(torch.tensor(x)).detach().numpy(), "eval forward")
    np.testing.assert_array_equal(sd["running_mean"].numpy(), before)


@pytest.mark.parametrize("device", DEVICES)
def test_batchnorm1d_and_3d_aliases(device):
    assert nn.BatchNorm1d is nn.BatchNorm and nn.BatchNorm3d is nn.BatchNorm
    with Context(TRAINING=1):
        check_layer(nn.BatchNorm1d(4, device=device), torch.nn.BatchNorm1d(4), randn(5, 4), device)
        if device == "INTERP":  # more configurations on the reference backend only (no compiling)
            check_layer(nn.BatchNorm3d(2, affine=False, device=device), torch.nn.BatchNorm3d(2, affine=False),
                        randn(2, 2, 2, 2, 3), device)


def test_batchnorm_cumulative_momentum_and_no_running_stats():
    theirs = torch.nn.BatchNorm1d(3, momentum=None)
    ours = nn.BatchNorm1d(3, momentum=None)
    with Context(TRAINING=1):
        for seed in range(3):
            x = randn(6, 3, seed=seed)
            ours(Tensor(x)).realize()
            theirs(torch.tensor(x))
    _assert_close(ours.running_mean.numpy(), theirs.running_mean.numpy(), "cumulative running_mean")
    _assert_close(ours.running_var.numpy(), theirs.running_var.numpy(), "cumulative running_var")
    plain = nn.BatchNorm1d(3, track_running_stats=False)
    assert "running_mean" not in get_state_dict(plain)
    x = randn(4, 3)
    _assert_close(plain(Tensor(x)).numpy(),
                  torch.nn.BatchNorm1d(3, track_running_stats=False).eval()(torch.tensor(x)).detach().numpy(),
                  "batch statistics without running stats")


@pytest.mark.parametrize("device", DEVICES)
def test_dropout(device):
    x = Tensor.ones(64, 64, device=device)
    drop = nn.Dropout(0.25)
    np.testing.assert_array_equal(drop(x).numpy(), np.ones((64, 64)))  # eval: identity
    with Context(TRAINING=1):
        x = Tensor.ones(64, 64, device=device, requires_grad=True)
        y = drop(x)
        out = y.numpy()
        y.sum().backward()
    kept = out != 0
    assert 0.65 < kept.mean() < 0.85
    np.testing.assert_allclose(out[kept], 1 / 0.75, rtol=1e-6)
    np.testing.assert_allclose(x.grad.numpy(), kept / 0.75, rtol=1e-6)
    with pytest.raises(ValueError):
        nn.Dropout(1.5)


def test_training_flag_follows_context():
    assert not Tensor.training and not nn.is_training()
    with Context(TRAINING=1):
        assert Tensor.training and nn.is_training() and Tensor([1.0]).training
        with Context(TRAINING=0):
            assert not Tensor.training
        assert Tensor.training
    assert not Tensor.training


def test_training_flag_is_settable_and_restored_by_context():
    with Context(TRAINING=0):
        Tensor.training = True
        assert nn.is_training()
        x = Tensor.ones(100)
        assert (nn.Dropout(0.5)(x).numpy() == 0).any()
    assert not Tensor.training


def test_context_restores_after_exception_and_nests():
    from polygrad import config
    with pytest.raises(ZeroDivisionError):
        with Context(TRAINING=1, BEAM=2):
            with Context(DEBUG=0, TRAINING=0):
                assert config.get("BEAM") == 2 and not Tensor.training
                1 / 0
    assert not Tensor.training and config.get("BEAM") == 0
    with pytest.raises(KeyError, match="unknown setting"):
        Context(NOT_A_SETTING=1)


def test_get_parameters_walks_nested_containers():
    class Block:
        def __init__(self):
            self.layers = [nn.Linear(2, 3), {"norm": nn.LayerNorm(3)}]
            self.shared = self.layers[0]  # shared: reported once by get_parameters
            self.parent = self  # cycles are ignored
            self.name = "block"

    b = Block()
    names = list(get_state_dict(b))
    assert names[:4] == ["layers.0.weight", "layers.0.bias", "layers.1.norm.weight", "layers.1.norm.bias"]
    assert "shared.weight" in names
    assert len(get_parameters(b)) == 4
    assert get_parameters(b)[0] is b.layers[0].weight
