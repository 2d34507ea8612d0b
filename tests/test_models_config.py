"""polygrad.models: Sequential / Graph from JSON-compatible configs, checked against PyTorch and NumPy.

The config-built Model's parameters are copied into an equivalent torch module; forward outputs and
fit() losses must match torch's. Bundles round-trip, and every config mistake is a ModelConfigError.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import polygrad
from polygrad import Model, models
from polygrad.models import ModelConfigError

MLP = {
    "input": {"name": "x", "shape": [12]},
    "batch": {"name": "batch", "min": 1, "max": 16},
    "layers": [{"type": "linear", "out_features": 16, "activation": "relu"},
               {"type": "linear", "out_features": 16, "activation": "tanh"},
               {"type": "linear", "out_features": 5}],
    "output": "logits",
    "loss": "cross_entropy",
    "seed": 3,
}


def _torch_mlp(params: dict) -> torch.nn.Sequential:
    net = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16), torch.nn.Tanh(),
                              torch.nn.Linear(16, 5))
    with torch.no_grad():
        for i, k in enumerate((0, 2, 4)):
            prefix = f"layers.{i}."
            net[k].weight.copy_(torch.from_numpy(params[prefix + "weight"].numpy()))
            net[k].bias.copy_(torch.from_numpy(params[prefix + "bias"].numpy()))
    return net


def test_config_is_json_and_sequential_fits_like_torch():
    cfg = json.loads(json.dumps(MLP))
    rng = np.random.default_rng(0)
    X = rng.standard_normal((32, 12)).astype(np.float32)
    Y = rng.integers(0, 5, 32).astype(np.int32)
    m = models.Sequential(cfg)
    try:
        assert isinstance(m, Model)
        net = _torch_mlp(m.parameters())
        np.testing.assert_allclose(m.forward(x=X[:7])["logits"].numpy(), net(torch.from_numpy(X[:7])).detach().numpy(),
                                   rtol=1e-5, atol=1e-5)
        losses = m.fit({"x": X, "y": Y}, epochs=2, batch_size=16, optimizer="adam", lr=0.01, verbose=False)
        opt = torch.optim.Adam(net.parameters(), lr=0.01, eps=1e-8)
        ref = []
        for _ in range(2):
            for lo in (0, 16):
                opt.zero_grad()
                loss = torch.nn.functional.cross_entropy(net(torch.from_numpy(X[lo:lo + 16])),
                                                         torch.from_numpy(Y[lo:lo + 16]).long())
                ref.append(loss.item())
                loss.backward()
                opt.step()
        np.testing.assert_allclose(losses, ref, rtol=1e-4)
        again = Model.load(m.save())
        try:
            got, want = again.forward(x=X[:3])["logits"].numpy(), m.forward(x=X[:3])["logits"].numpy()
            np.testing.assert_array_equal(got, want)
            assert again.summary().inputs == m.summary().inputs
        finally:
            again.dispose()
    finally:
        m.dispose()


def test_seed_makes_construction_reproducible_and_restores_the_global_seed():
    polygrad.Tensor.manual_seed(11)
    before = polygrad.Tensor.rand(3).numpy()
    polygrad.Tensor.manual_seed(11)
    a, b = models.Sequential(MLP), models.Sequential(MLP)
    after = polygrad.Tensor.rand(3).numpy()
    try:
        pa, pb = a.parameters(), b.parameters()
        for k in pa:
            np.testing.assert_array_equal(pa[k].numpy(), pb[k].numpy())
        np.testing.assert_array_equal(before, after)  # building with "seed" did not move the global generator
    finally:
        a.dispose()
        b.dispose()


def test_conv_net_sequential_matches_torch_in_eval_mode():
    cfg = {"input": {"name": "img", "shape": [2, 8, 8]}, "batch": 4,
           "layers": [{"type": "conv2d", "out_channels": 3, "kernel_size": 3, "padding": 1},
                      {"type": "batchnorm", "activation": "relu"},
                      {"type": "max_pool2d", "kernel_size": 2},
                      {"type": "flatten"},
                      {"type": "linear", "out_features": 4}],
           "loss": "mse"}
    m = models.Sequential(cfg)
    try:
        p = {k: v.numpy() for k, v in m.parameters().items()}
        conv = torch.nn.Conv2d(2, 3, 3, padding=1)
        bn = torch.nn.BatchNorm2d(3).eval()
        lin = torch.nn.Linear(48, 4)
        with torch.no_grad():
            conv.weight.copy_(torch.from_numpy(p["layers.0.weight"]))
            conv.bias.copy_(torch.from_numpy(p["layers.0.bias"]))
            bn.weight.copy_(torch.from_numpy(p["layers.1.weight"]))
            bn.bias.copy_(torch.from_numpy(p["layers.1.bias"]))
            lin.weight.copy_(torch.from_numpy(p["layers.4.weight"]))
            lin.bias.copy_(torch.from_numpy(p["layers.4.bias"]))
        x = np.random.default_rng(1).standard_normal((4, 2, 8, 8)).astype(np.float32)
        ref = lin(torch.nn.functional.max_pool2d(torch.relu(bn(conv(torch.from_numpy(x)))), 2).flatten(1))
        np.testing.assert_allclose(m.forward(img=x)["output"].numpy(), ref.detach().numpy(), rtol=1e-4, atol=1e-5)
        assert [t["name"] for t in m.summary().targets] == ["y"] and m.summary().targets[0]["shape"] == (4, 4)
        losses = m.fit({"img": x, "y": np.zeros((4, 4), np.float32)}, epochs=3, optimizer="sgd", lr=0.05,
                       verbose=False)
        assert losses[-1] < losses[0]
    finally:
        m.dispose()


def test_graph_with_residual_and_concat_matches_numpy():
    cfg = {
        "inputs": [{"name": "a", "shape": [6]}, {"name": "b", "shape": [4]}],
        "batch": {"name": "n", "min": 1, "max": 8},
        "nodes": [
            {"name": "ha", "type": "linear", "inputs": ["a"], "out_features": 6, "activation": "relu"},
            {"name": "res", "type": "add", "inputs": ["ha", "a"]},
            {"name": "cat", "type": "concat"},
            {"name": "head", "type": "linear", "out_features": 3},
        ],
        "edges": [["res", "cat"], ["b", "cat"], ["cat", "head"]],
        "outputs": ["head", "res"],
        "loss": {"type": "mse", "output": "head"},
    }
    m = models.Graph(cfg)
    try:
        p = {k: v.numpy() for k, v in m.parameters().items()}
        rng = np.random.default_rng(2)
        a, b = rng.standard_normal((5, 6)).astype(np.float32), rng.standard_normal((5, 4)).astype(np.float32)
        res = np.maximum(a @ p["nodes.ha.weight"].T + p["nodes.ha.bias"], 0) + a
        head = np.concatenate([res, b], 1) @ p["nodes.head.weight"].T + p["nodes.head.bias"]
        out = m.forward(a=a, b=b)
        np.testing.assert_allclose(out["res"].numpy(), res, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(out["head"].numpy(), head, rtol=1e-5, atol=1e-6)
        loss = m.train_step({"a": a, "b": b}, {"y": np.zeros((5, 3), np.float32)})
        assert loss == pytest.approx(float((head ** 2).mean()), rel=1e-5)
    finally:
        m.dispose()


def test_models_on_an_explicit_runtime():
    rt = polygrad.create(device="cpu")
    try:
        m = rt.models.Sequential(MLP)
        assert m._runtime is rt
        assert m.forward(x=np.zeros((2, 12), np.float32))["logits"].shape == (2, 5)
        m.dispose()
    finally:
        rt.dispose()


@pytest.mark.parametrize("change, match", [
    (lambda c: c["layers"].append({"type": "linearr", "out_features": 2}), "unknown layer type 'linearr'"),
    (lambda c: c["layers"][0].pop("out_features"), r"layers\[0\] lacks 'out_features'"),
    (lambda c: c["layers"][0].update(out_features="8"), "out_features must be int"),
    (lambda c: c["layers"][0].update(activation="swishy"), "activation 'swishy'"),
    (lambda c: c["layers"][0].update(units=3), r"unknown fields \['units'\]"),
    (lambda c: c["layers"].append({"type": "add"}), "belongs in a models.Graph"),
    (lambda c: c.update(loss="hinge"), "'hinge' is not one of"),
    (lambda c: c.update(batch={"name": "batch", "min": 5, "max": 2}), "config.batch"),
    (lambda c: c.update(layers=[]), "layers is empty"),
    (lambda c: c["layers"].insert(0, {"type": "conv2d", "out_channels": 2, "kernel_size": 3}), "at least 4 dims"),
])
def test_sequential_config_errors(change, match):
    cfg = json.loads(json.dumps(MLP))
    change(cfg)
    with pytest.raises(ModelConfigError, match=match):
        models.Sequential(cfg)


GRAPH = {"inputs": [{"name": "x", "shape": [3]}], "batch": 2,
         "nodes": [{"name": "h", "type": "linear", "inputs": ["x"], "out_features": 3},
                   {"name": "s", "type": "add", "inputs": ["h", "x"]}],
         "outputs": ["s"]}


@pytest.mark.parametrize("change, match", [
    (lambda c: c["nodes"][1]["inputs"].append("ghost"), "takes 'ghost', which is neither an input nor a node"),
    (lambda c: c.update(edges=[["h", "nowhere"]]), "ends at 'nowhere'"),
    (lambda c: c["nodes"][0].update(inputs=["s"]), "cycle: .*h.*s.*h|cycle: .*s.*h.*s"),
    (lambda c: c["nodes"][0].update(inputs=["x", "x"]), "takes one input, got 2"),
    (lambda c: c.update(outputs=["zz"]), "outputs must list distinct node names"),
    (lambda c: c["nodes"][1].update(name="x"), "distinct from every input"),
    (lambda c: c["nodes"][0].update(inputs=[]), "has no inputs"),
    (lambda c: c["nodes"].append({"name": "t", "type": "embedding", "inputs": ["x"]}), "lacks 'num_embeddings'"),
])
def test_graph_config_errors(change, match):
    cfg = json.loads(json.dumps(GRAPH))
    change(cfg)
    with pytest.raises(ModelConfigError, match=match):
        models.Graph(cfg)


def test_graph_without_loss_has_only_forward():
    m = models.Graph(GRAPH)
    try:
        assert m.entrypoints == ["forward"]
        x = np.ones((2, 3), np.float32)
        p = {k: v.numpy() for k, v in m.parameters().items()}
        np.testing.assert_allclose(m.forward(x=x)["s"].numpy(),
                                   x @ p["nodes.h.weight"].T + p["nodes.h.bias"] + x, rtol=1e-6)
    finally:
        m.dispose()
