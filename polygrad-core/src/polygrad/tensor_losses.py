"""Losses on Tensor (a mixin of Tensor, through NNMixin).

Stage: graph construction. Input: Tensors (logits, probabilities, targets). Output: loss Tensors
composed from log_softmax, one-hot comparisons and reductions, matching PyTorch's values
(torch.nn.functional) and tinygrad's names (sparse_categorical_crossentropy, binary_crossentropy*).
Out-of-range class labels: IndexError when they are on the host, NaN when lazy (docs/tensor-semantics.md).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from polygrad.errors import InvalidArgumentError
from polygrad.dtype import dtypes
from polygrad.tensor_common import capture_guards
from polygrad.tensor_indexing import host_values
from polygrad.tensor_movement import move_axis
from polygrad.uop.shape import ShapeError

if TYPE_CHECKING:
    from polygrad.tensor import Tensor


def _reduce(loss: "Tensor", reduction: str) -> "Tensor":
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    if reduction == "mean":
        return loss.mean()
    raise InvalidArgumentError(f"reduction must be 'none', 'mean' or 'sum', got {reduction!r}")


def _class_onehot(target: "Tensor", n_classes: int, cdim: int) -> "Tensor":
    """Integer targets (N, d1, ...) -> bool one-hot (N, C, d1, ...) with the classes at cdim."""
    onehot = target.unsqueeze(-1).eq(type(target).arange(n_classes, device=target.device, dtype=target.dtype))
    return move_axis(onehot, onehot.ndim - 1, cdim)


def _nll_index(logp: "Tensor", target: "Tensor", weight: "Tensor | None", ignore_index: int,
               reduction: str, smoothing: float = 0.0) -> "Tensor":
    """PyTorch's nll_loss / cross_entropy for class-index targets, with weights, ignore_index, smoothing."""
    cdim = 1 if logp.ndim >= 2 else 0
    n_classes = logp.shape[cdim]
    if target.dtype.is_float:
        raise TypeError(f"class-index targets must be integers, got {target.dtype}")
    expected = logp.shape[:cdim] + logp.shape[cdim + 1:]
    if target.shape != expected:
        raise ShapeError(f"target shape {target.shape} does not match input {logp.shape} (expected {expected})")
    _check_labels(target, n_classes, cdim, ignore_index)
    onehot = _class_onehot(target, n_classes, cdim)  # O(N x C), as the log_softmax it reads
    keep = target.ne(ignore_index)
    wshape = tuple(n_classes if i == cdim else 1 for i in range(logp.ndim))
    w_all = weight.reshape(wshape) if weight is not None else None
    picked = onehot.where(logp if w_all is None else logp * w_all, 0).sum(cdim)
    w_target = onehot.where(w_all, 0).sum(cdim) if w_all is not None else keep.cast(logp.dtype)
    w_target = keep.where(w_target, 0)
    loss = -keep.where(picked, 0)
    if smoothing:
        smooth = (logp if w_all is None else logp * w_all).sum(cdim) / n_classes
        loss = loss * (1 - smoothing) - keep.where(smooth, 0) * smoothing
    # a lazy label outside [0, C) cannot be checked without a sync: its loss is NaN, never a silent 0
    bad = keep & ((target < 0) | (target >= n_classes))
    loss = bad.where(float("nan"), loss)
    if reduction == "mean":
        return loss.sum() / w_target.sum()
    return _reduce(loss, reduction)


def bad_label(host: np.ndarray, n_classes: int, ignore_index: int) -> int | None:
    """The first label of `host` outside [0, n_classes) that is not ignore_index; None when all fit."""
    bad = (host != ignore_index) & ((host < 0) | (host >= n_classes))
    return int(host[bad].flat[0]) if bad.any() else None


def _check_labels(target: "Tensor", n_classes: int, cdim: int, ignore_index: int) -> None:
    """IndexError for a label outside [0, C) (other than ignore_index) when the labels are on the host.
    Under Model capture the labels are placeholders: the capture is told which input holds class labels
    of how many classes, and the Model checks the host data fed to it at each call (model/data.py)."""
    host = host_values(target)
    if host is None:
        note = getattr(capture_guards.stack[-1], "class_labels", None) if capture_guards.stack else None
        if note is not None and isinstance(n_classes, int):
            note(target, n_classes, ignore_index)
        return
    label = bad_label(host, n_classes, ignore_index)
    if label is not None:
        raise IndexError(f"class label {label} is out of bounds for dimension {cdim} with size {n_classes} "
                         f"(labels lie in [0, {n_classes}) or equal ignore_index={ignore_index})")


class LossMixin:
    __slots__ = ()

    def cross_entropy(self: "Tensor", Y: "Tensor", reduction: str = "mean", label_smoothing: float = 0.0,
                      weight: "Tensor | None" = None, ignore_index: int = -100) -> "Tensor":
        """torch.nn.functional.cross_entropy on logits (N, C, ...) or (C,); Y: class indices or probabilities."""
        if not 0.0 <= label_smoothing <= 1.0:
            raise InvalidArgumentError(f"label_smoothing must be in [0, 1], got {label_smoothing}")
        cdim = 1 if self.ndim >= 2 else 0
        logp = self.log_softmax(cdim)
        if not Y.dtype.is_float:
            return _nll_index(logp, Y, weight, ignore_index, reduction, label_smoothing)
        if Y.shape != self.shape:
            raise ShapeError(f"probability targets need the input's shape {self.shape}, got {Y.shape}")
        n_classes = self.shape[cdim]
        target = Y * (1 - label_smoothing) + label_smoothing / n_classes if label_smoothing else Y
        if weight is not None:
            target = target * weight.reshape(tuple(n_classes if i == cdim else 1 for i in range(self.ndim)))
        loss = -(logp * target).sum(cdim)
        return _reduce(loss, reduction)

    def nll_loss(self: "Tensor", Y: "Tensor", weight: "Tensor | None" = None, ignore_index: int = -100,
                 reduction: str = "mean") -> "Tensor":
        """torch.nn.functional.nll_loss on log-probabilities (N, C, ...) or (C,) with class indices Y."""
        return _nll_index(self, Y, weight, ignore_index, reduction)

    def binary_crossentropy(self: "Tensor", Y: "Tensor", reduction: str = "mean") -> "Tensor":
        """BCE on probabilities; logs are clamped at -100 as in PyTorch."""
        log_p = self.log().maximum(-100)
        log_q = (1 - self).log().maximum(-100)
        return _reduce(-(Y * log_p + (1 - Y) * log_q), reduction)

    def binary_crossentropy_logits(self: "Tensor", Y: "Tensor", reduction: str = "mean",
                                   pos_weight: "Tensor | None" = None) -> "Tensor":
        """BCE on logits, computed stably: (1-Y)*x + w*(log(1+exp(-|x|)) + max(-x, 0))."""
        softplus_neg = (1 + (-self.abs()).exp()).log() + (-self).maximum(0)
        log_weight = 1 if pos_weight is None else (pos_weight - 1) * Y + 1
        return _reduce((1 - Y) * self + log_weight * softplus_neg, reduction)

    def sparse_categorical_crossentropy(self: "Tensor", Y: "Tensor", ignore_index: int = -1,
                                        label_smoothing: float = 0.0, reduction: str = "mean") -> "Tensor":
        """tinygrad's loss: logits (..., C) with the classes last, integer targets Y (...)."""
        if self.ndim == 1:
            return self.reshape(1, -1).sparse_categorical_crossentropy(Y.reshape(1), ignore_index,
                                                                       label_smoothing, reduction)
        logits = move_axis(self, self.ndim - 1, 1)
        return logits.cross_entropy(Y, reduction, label_smoothing, ignore_index=ignore_index)

    # ---------------------------------------------------------------------------------------------


_ = dtypes
