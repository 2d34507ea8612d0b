"""Model.fit / train_step refuse what would train to NaN or crash (issue 28, item 12):

- optimizer hyperparameters are checked when the optimizer is configured, for every optimizer name
  (a string, a negative or non-finite rate, a beta outside [0, 1), nesterov without momentum): a
  ModelError naming the hyperparameter, and no step runs; the eager optimizers apply the same rules
  (InvalidArgumentError);
- class labels outside [0, classes) fed on the host to an input that the captured loss reads as labels
  raise ModelInputError, as eager cross_entropy raises IndexError, instead of NaN losses.

Loss values are checked against torch.nn.functional.cross_entropy on the model's own logits.
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from polygrad import Model, ModelError, Tensor, models, nn
from polygrad.errors import InvalidArgumentError
from polygrad.model import ModelInputError

CONFIG = {"input": {"name": "x", "shape": [4]}, "batch": {"name": "batch", "min": 1, "max": 8}, "seed": 0,
          "layers": [{"type": "linear", "out_features": 3}], "output": "logits", "loss": "cross_entropy"}
X = np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32)
Y = np.array([0, 2, 1, 2], np.int32)


@pytest.fixture
def model():
    m = models.Sequential(CONFIG)
    yield m
    m.dispose()


def _weights(m: Model) -> dict[str, np.ndarray]:
    return {k: t.numpy().copy() for k, t in m.parameters().items()}


# the configurations polygrad-js refuses too (its test/model.test.js reads the same file), and values
# JSON cannot hold
CORPUS = json.loads((Path(__file__).parents[1] / "polygrad-js/test/fixtures/optimizer_hyperparameters.json")
                    .read_text())
BAD_HYPER = [(c["optimizer"], c["hyper"], re.escape(c["message"])) for c in CORPUS["refused"]] + [
    ("sgd", dict(lr=math.nan), "lr must be"),
    ("sgd", dict(lr=math.inf), "lr must be"),
    ("sgd", dict(lr=10**400), "lr must be"),
    ("sgd", dict(lr=np.float64(-0.1)), "lr must be"),
    ("adam", dict(betas=(0.9, math.nan)), "betas must be"),
    ("adamw", dict(weight_decay=math.nan), "weight_decay must be"),
]


@pytest.mark.parametrize("optimizer, hyper, message", BAD_HYPER)
def test_fit_refuses_bad_hyperparameters_before_any_step(model, optimizer, hyper, message):
    before = _weights(model)
    with pytest.raises(ModelError, match=message):
        model.fit({"x": X, "y": Y}, optimizer=optimizer, **hyper)
    with pytest.raises(ModelError, match=message):
        model.train_step({"x": X}, {"y": Y}, optimizer=optimizer, **hyper)
    assert all(np.array_equal(before[k], v) for k, v in _weights(model).items())
    assert model.summary().optimizer is None  # nothing configured


def test_a_new_learning_rate_alone_is_checked_too(model):
    model.fit({"x": X, "y": Y}, optimizer="adam", lr=0.01)
    before = _weights(model)
    for lr in ("fast", -1, math.nan):
        with pytest.raises(ModelError, match="lr must be"):
            model.fit({"x": X, "y": Y}, lr=lr)
        with pytest.raises(ModelError, match="lr must be"):
            model.train_step({"x": X}, {"y": Y}, lr=lr)
    assert all(np.array_equal(before[k], v) for k, v in _weights(model).items())
    assert model.summary().optimizer["lr"] == 0.01


@pytest.mark.parametrize("case", CORPUS["accepted"], ids=lambda c: f"{c['optimizer']}-{sorted(c['hyper'])}")
def test_the_accepted_corpus_trains(model, case):
    losses = model.fit({"x": X, "y": Y}, optimizer=case["optimizer"], epochs=3, **case["hyper"])
    assert np.isfinite(losses).all() and all(np.isfinite(v).all() for v in _weights(model).values())


def test_edge_values_are_accepted_and_stored_as_plain_numbers(model, tmp_path):
    before = _weights(model)
    losses = model.fit({"x": X, "y": Y}, optimizer="sgd", lr=np.float32(0.0), momentum=0)
    assert all(np.array_equal(before[k], v) for k, v in _weights(model).items())  # lr 0 moves nothing
    assert model.summary().optimizer == {"name": "sgd", "lr": 0.0, "momentum": 0.0, "weight_decay": 0.0,
                                         "nesterov": False}
    model.fit({"x": X, "y": Y}, optimizer="adam", betas=[0.0, np.float64(0.5)], eps=np.float32(1e-12))
    assert model.summary().optimizer["betas"] == [0.0, 0.5]
    model.save(tmp_path / "m.pgb")  # the configuration is JSON in the bundle
    assert np.isfinite(losses).all()


@pytest.mark.parametrize("make, message", [
    (lambda p: nn.optim.SGD(p, lr=-1), "lr must be"),
    (lambda p: nn.optim.SGD(p, lr="fast"), "lr must be"),
    (lambda p: nn.optim.SGD(p, lr=0.1, nesterov=True), "nesterov momentum needs momentum > 0"),
    (lambda p: nn.optim.SGD(p, lr=0.1, momentum=math.nan), "momentum must be"),
    (lambda p: nn.optim.Adam(p, betas=(1.0, 0.9)), "betas must be"),
    (lambda p: nn.optim.Adam(p, betas=0.9), "betas must be"),  # was "'float' object is not subscriptable"
    (lambda p: nn.optim.AdamW(p, weight_decay=-0.01), "weight_decay must be"),
    (lambda p: nn.optim.LAMB(p, eps=math.inf), "eps must be"),
])
def test_eager_optimizers_apply_the_same_rules(make, message):
    with pytest.raises(InvalidArgumentError, match=message):
        make([Tensor([1.0, 2.0], requires_grad=True)])


def test_assigning_a_bad_learning_rate_to_an_eager_optimizer():
    opt = nn.optim.SGD([Tensor([1.0], requires_grad=True)], lr=0.1)
    for lr in ("fast", -0.1, math.nan):
        with pytest.raises(InvalidArgumentError, match="lr must be"):
            opt.lr = lr
    opt.lr = 0.5
    assert opt.lr.numpy() == pytest.approx(0.5)


# ---------------------------------------------------------------- class labels
@pytest.mark.parametrize("labels, bad", [([0, 1, 3, 2], 3), ([0, -2, 1, 2], -2), ([0, 1, 2, 2**31 - 1], 2**31 - 1)])
@pytest.mark.parametrize("form", ["list", "numpy", "tensor"])
def test_out_of_range_labels_are_refused_on_the_host(model, labels, bad, form):
    # they gave NaN losses (and NaN weights after the step) while eager cross_entropy raised IndexError
    y = {"list": labels, "numpy": np.array(labels, np.int32), "tensor": Tensor(np.array(labels, np.int32))}[form]
    before = _weights(model)
    message = rf"'y' holds the class label {bad}; the loss takes labels in \[0, 3\)"
    with pytest.raises(ModelInputError, match="fit data " + message):
        model.fit({"x": X, "y": y}, optimizer="sgd", lr=0.1)
    with pytest.raises(ModelInputError, match="input " + message):
        model.train_step({"x": X}, {"y": y}, optimizer="sgd", lr=0.1)
    with pytest.raises(ModelInputError, match="input " + message):
        model.call("loss", {"x": X, "y": y})
    assert all(np.array_equal(before[k], v) for k, v in _weights(model).items())
    with pytest.raises(IndexError, match=f"class label {bad} is out of bounds"):  # what eager code raises
        Tensor(X[:, :3]).sparse_categorical_crossentropy(Tensor(np.array(labels, np.int32)))


def test_a_later_batch_with_a_bad_label_stops_fit_before_the_first_step(model):
    x = np.concatenate([X, X])
    y = np.concatenate([Y, [0, 1, 2, 7]]).astype(np.int32)
    before = _weights(model)
    with pytest.raises(ModelInputError, match="class label 7"):
        model.fit({"x": x, "y": y}, batch_size=4, optimizer="sgd", lr=0.1)
    assert all(np.array_equal(before[k], v) for k, v in _weights(model).items())


def test_ignored_labels_pass_and_the_loss_matches_torch(model):
    y = np.array([0, -1, 1, 2], np.int32)  # -1: sparse_categorical_crossentropy's ignore_index
    logits = model.forward(x=X)["logits"].numpy()
    ref = torch.nn.functional.cross_entropy(torch.from_numpy(logits), torch.from_numpy(y).long(), ignore_index=-1)
    assert float(model.call("loss", {"x": X, "y": y})["loss"].numpy()) == pytest.approx(float(ref), rel=1e-5)
    assert model.fit({"x": X, "y": y}, optimizer="sgd", lr=0.1)[0] == pytest.approx(float(ref), rel=1e-5)


class Net:
    def __init__(self):
        self.l = nn.Linear(4, 3)

    def __call__(self, x):
        return {"logits": self.l(x)}


def test_any_captured_loss_that_reads_labels_is_covered():
    # a hand-written Model: torch's cross_entropy (ignore_index=-100) on a target reshaped first
    m = Model(Net(), inputs={"x": Tensor.empty(4, 4)}, targets={"y": Tensor.empty(2, 2, dtype="int32")},
              loss=lambda o, y: o["logits"].cross_entropy(y.reshape(4)))
    try:
        m.train_step({"x": X}, {"y": [[0, -100], [2, 1]]}, optimizer="sgd", lr=0.1)
        with pytest.raises(ModelInputError, match=r"class label -1; the loss takes labels in \[0, 3\) \(or -100"):
            m.train_step({"x": X}, {"y": [[0, -1], [2, 1]]})
    finally:
        m.dispose()


def test_targets_that_are_not_labels_take_any_value():
    m = models.Sequential({**CONFIG, "loss": "mse"})
    try:
        assert np.isfinite(m.fit({"x": X, "y": np.full((4, 3), 7.0, np.float32)}, optimizer="sgd", lr=0.01)).all()
    finally:
        m.dispose()
