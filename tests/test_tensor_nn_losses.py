"""Losses (issue 3, part B) against torch.nn.functional on CPU: values and gradients, every backend."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from polygrad import Tensor
from polygrad.uop.shape import ShapeError
from test_tensor_nn_util import compare, rand

Y4 = np.array([0, 3, 1, 1, 2])
Y_IGN = np.array([0, -100, 1, 3, -100])
Y_SPATIAL = np.array([[[0, 2], [1, 1]], [[2, 0], [0, 1]]])
W = np.array([0.5, 2.0, 1.0, 1.5], np.float32)


def _t(v, device):
    return Tensor(v, device=device)


# name -> (polygrad fn(x, device), torch fn(x), logits shape)
CE = {
    "index_mean": (lambda x, d: x.cross_entropy(_t(Y4, d)), lambda x: F.cross_entropy(x, torch.tensor(Y4)), (5, 4)),
    "index_none": (lambda x, d: x.cross_entropy(_t(Y4, d), reduction="none"),
                   lambda x: F.cross_entropy(x, torch.tensor(Y4), reduction="none"), (5, 4)),
    "smoothing": (lambda x, d: x.cross_entropy(_t(Y4, d), label_smoothing=0.2),
                  lambda x: F.cross_entropy(x, torch.tensor(Y4), label_smoothing=0.2), (5, 4)),
    "ignore_index": (lambda x, d: x.cross_entropy(_t(Y_IGN, d)),
                     lambda x: F.cross_entropy(x, torch.tensor(Y_IGN)), (5, 4)),
    "weight": (lambda x, d: x.cross_entropy(_t(Y4, d), weight=_t(W, d)),
               lambda x: F.cross_entropy(x, torch.tensor(Y4), weight=torch.tensor(W)), (5, 4)),
    "weight_smooth_ignore": (lambda x, d: x.cross_entropy(_t(Y_IGN, d), weight=_t(W, d), label_smoothing=0.1),
                             lambda x: F.cross_entropy(x, torch.tensor(Y_IGN), weight=torch.tensor(W),
                                                       label_smoothing=0.1), (5, 4)),
    "spatial": (lambda x, d: x.cross_entropy(_t(Y_SPATIAL, d)),
                lambda x: F.cross_entropy(x, torch.tensor(Y_SPATIAL)), (2, 3, 2, 2)),
    "unbatched": (lambda x, d: x.cross_entropy(_t(np.array(2), d)),
                  lambda x: F.cross_entropy(x, torch.tensor(2)), (4,)),
    "probabilities": (lambda x, d: x.cross_entropy(_t(_probs(), d)),
                      lambda x: F.cross_entropy(x, torch.tensor(_probs())), (5, 4)),
    "probabilities_smooth_sum": (lambda x, d: x.cross_entropy(_t(_probs(), d), label_smoothing=0.3,
                                                              reduction="sum"),
                                 lambda x: F.cross_entropy(x, torch.tensor(_probs()), label_smoothing=0.3,
                                                           reduction="sum"), (5, 4)),
    "nll_weight_none": (lambda x, d: x.nll_loss(_t(Y_IGN, d), weight=_t(W, d), reduction="none"),
                        lambda x: F.nll_loss(x, torch.tensor(Y_IGN), weight=torch.tensor(W), reduction="none"),
                        (5, 4)),
    "sparse_cce_ignore_smooth": (lambda x, d: x.sparse_categorical_crossentropy(_t(Y4, d), ignore_index=1,
                                                                                 label_smoothing=0.1),
                                 lambda x: F.cross_entropy(x, torch.tensor(Y4), ignore_index=1,
                                                           label_smoothing=0.1), (5, 4)),
    "sparse_cce_classes_last": (lambda x, d: x.sparse_categorical_crossentropy(_t(Y_SPATIAL[:, 0], d)),
                                lambda x: F.cross_entropy(x.permute(0, 2, 1), torch.tensor(Y_SPATIAL[:, 0])),
                                (2, 2, 3)),
}


def _probs() -> np.ndarray:
    p = np.abs(rand(5, 4, seed=9)) + 0.1
    return (p / p.sum(1, keepdims=True)).astype(np.float32)


@pytest.mark.parametrize("name", list(CE))
def test_classification_losses_match_torch(name: str, device: str) -> None:
    fn, tfn, shape = CE[name]
    compare(lambda x: fn(x, device), tfn, [rand(*shape)], device, atol=1e-5)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return (1 / (1 + np.exp(-x))).astype(np.float32)


TARGET = (np.random.default_rng(4).random((3, 4)) > 0.5).astype(np.float32)
BCE = {
    "bce": (lambda p, y: p.binary_crossentropy(y), lambda p, y: F.binary_cross_entropy(p, y), True),
    "bce_sum": (lambda p, y: p.binary_crossentropy(y, reduction="sum"),
                lambda p, y: F.binary_cross_entropy(p, y, reduction="sum"), True),
    "bce_logits": (lambda x, y: x.binary_crossentropy_logits(y),
                   lambda x, y: F.binary_cross_entropy_with_logits(x, y), False),
    "bce_logits_none": (lambda x, y: x.binary_crossentropy_logits(y, reduction="none"),
                        lambda x, y: F.binary_cross_entropy_with_logits(x, y, reduction="none"), False),
}


@pytest.mark.parametrize("name", list(BCE))
def test_binary_losses_match_torch(name: str, device: str) -> None:
    fn, tfn, on_probs = BCE[name]
    x = rand(3, 4) * 3
    compare(fn, tfn, [_sigmoid(x) if on_probs else x, TARGET], device, atol=1e-5)


def test_bce_logits_pos_weight_and_soft_targets(device: str) -> None:
    pw = np.array([1.0, 2.0, 0.5, 3.0], np.float32)
    soft = np.random.default_rng(5).random((3, 4)).astype(np.float32)
    compare(lambda x, y: x.binary_crossentropy_logits(y, pos_weight=Tensor(pw, device=device)),
            lambda x, y: F.binary_cross_entropy_with_logits(x, y, pos_weight=torch.tensor(pw)),
            [rand(3, 4) * 20, soft], device, atol=1e-5)


def test_bce_clamps_log(device: str) -> None:
    p = Tensor([0.0, 1.0, 0.5], device=device)
    y = Tensor([1.0, 0.0, 1.0], device=device)
    want = F.binary_cross_entropy(torch.tensor([0.0, 1.0, 0.5]), torch.tensor([1.0, 0.0, 1.0]), reduction="none")
    np.testing.assert_allclose(p.binary_crossentropy(y, reduction="none").numpy(), want.numpy(), rtol=1e-6)


LOSS_ERRORS = [
    (lambda: Tensor.ones(3, 4).cross_entropy(Tensor([0, 1, 2]), reduction="avg"), ValueError, "reduction"),
    (lambda: Tensor.ones(3, 4).cross_entropy(Tensor([0, 1])), ShapeError, "target shape"),
    (lambda: Tensor.ones(3, 4).cross_entropy(Tensor.ones(3, 5)), ShapeError, "probability targets"),
    (lambda: Tensor.ones(3, 4).cross_entropy(Tensor([0, 1, 2]), label_smoothing=1.5), ValueError, "smoothing"),
    (lambda: Tensor.ones(3, 4).nll_loss(Tensor([0.0, 1.0, 2.0])), TypeError, "integers"),
]


@pytest.mark.parametrize("i", range(len(LOSS_ERRORS)))
def test_loss_errors(i: int) -> None:
    fn, exc, text = LOSS_ERRORS[i]
    with pytest.raises(exc, match=text):
        fn()
