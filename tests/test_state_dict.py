"""get_state_dict / load_state_dict: dotted names, strictness, errors, in-place loading."""
from __future__ import annotations

from collections import namedtuple

import numpy as np
import pytest
import torch

from polygrad import Context, Tensor, nn
from polygrad.errors import StateDictError
from polygrad.nn import get_parameters, get_state_dict, load_state_dict
from polygrad.nn.optim import SGD


class Net:
    def __init__(self):
        self.conv = nn.Conv2d(1, 2, 3)
        self.bn = nn.BatchNorm2d(2)
        self.heads = [nn.Linear(8, 4), nn.Linear(4, 2)]


def test_names_match_torch_module_names():
    class TorchNet(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(1, 2, 3)
            self.bn = torch.nn.BatchNorm2d(2)
            self.heads = torch.nn.ModuleList([torch.nn.Linear(8, 4), torch.nn.Linear(4, 2)])

    ours, theirs = get_state_dict(Net()), TorchNet().state_dict()
    assert list(ours) == list(theirs)
    assert all(ours[k].shape == tuple(v.shape) for k, v in theirs.items())


def test_namedtuple_dict_and_prefix():
    Pair = namedtuple("Pair", ["a", "b"])
    obj = {"pair": Pair(Tensor([1.0]), Tensor([2.0])), "skip": 3, "text": "x"}
    assert list(get_state_dict(obj, prefix="model.")) == ["model.pair.a", "model.pair.b"]


def test_load_state_dict_writes_in_place_and_keeps_optimizer_links():
    net = Net()
    opt = SGD(get_parameters(net), lr=0.1)
    weight = net.heads[0].weight
    new = {k: np.full(v.shape, 0.5, dtype=np.float32) if v.dtype.is_float else np.array(7, dtype=np.int64)
           for k, v in get_state_dict(net).items()}
    result = load_state_dict(net, new)
    assert result == {"missing_keys": [], "unexpected_keys": []}
    assert net.heads[0].weight is weight
    np.testing.assert_array_equal(weight.numpy(), np.full((4, 8), 0.5, dtype=np.float32))
    assert net.bn.num_batches_tracked.item() == 7
    # the optimizer still updates the very tensors that were loaded
    with Context(TRAINING=1):
        opt.zero_grad()
        (weight * 2).sum().backward()
        opt.step()
    np.testing.assert_allclose(weight.numpy(), 0.5 - 0.1 * 2, rtol=1e-6)


def test_load_accepts_tensors_and_casts():
    lin = nn.Linear(2, 2)
    load_state_dict(lin, {"weight": Tensor([[1, 2], [3, 4]]), "bias": Tensor([0.5, 0.25], dtype="float64")})
    np.testing.assert_array_equal(lin.weight.numpy(), [[1, 2], [3, 4]])
    assert lin.weight.dtype.name == "float" and lin.bias.numpy().tolist() == [0.5, 0.25]


def test_strict_errors_name_every_key():
    lin = nn.Linear(2, 3)
    with pytest.raises(StateDictError) as err:
        load_state_dict(lin, {"weight": np.zeros((3, 2), np.float32), "extra": np.zeros(1)})
    msg = str(err.value)
    assert "missing keys: ['bias']" in msg and "unexpected keys: ['extra']" in msg and "strict=False" in msg
    with pytest.raises(StateDictError, match=r"wrong shape: weight: model has \(3, 2\), state dict has \(2, 3\)"):
        load_state_dict(lin, {"weight": np.zeros((2, 3), np.float32), "bias": np.zeros(3, np.float32)})
    assert isinstance(err.value, ValueError)


def test_non_strict_loads_what_matches():
    lin = nn.Linear(2, 3)
    bias = lin.bias.numpy().copy()
    result = load_state_dict(lin, {"weight": np.ones((3, 2), np.float32), "other": np.zeros(2)}, strict=False)
    assert result == {"missing_keys": ["bias"], "unexpected_keys": ["other"]}
    np.testing.assert_array_equal(lin.weight.numpy(), np.ones((3, 2)))
    np.testing.assert_array_equal(lin.bias.numpy(), bias)
    with pytest.raises(StateDictError, match="wrong shape"):
        load_state_dict(lin, {"weight": np.ones((1, 2), np.float32)}, strict=False)


def test_roundtrip_through_torch():
    theirs = torch.nn.Linear(3, 2)
    ours = nn.Linear(3, 2)
    load_state_dict(ours, {k: v.detach().numpy() for k, v in theirs.state_dict().items()})
    back = torch.nn.Linear(3, 2)
    back.load_state_dict({k: torch.tensor(v.numpy()) for k, v in get_state_dict(ours).items()})
    x = torch.randn(4, 3)
    torch.testing.assert_close(back(x), theirs(x))
