"""Gradients of the foundation ops (issue 2) against PyTorch CPU, on every usable backend.

Each case builds the same expression in polygrad and torch, reduces it with fixed random weights to a
scalar, calls backward() and compares every input's `.grad`.
"""
from __future__ import annotations

import numpy as np
import pytest

from polygrad import Tensor

from conftest import DEVICES

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(1)


def _data(shape, positive=False):
    arr = RNG.standard_normal(shape).astype(np.float32)
    return np.abs(arr) + 0.5 if positive else arr


# name -> (function applied to both libraries, input shapes, positive inputs?)
CASES = {
    "add_broadcast": (lambda a, b: a + b, [(3, 4), (4,)], False),
    "sub_broadcast": (lambda a, b: a - b, [(3, 1), (1, 4)], False),
    "mul": (lambda a, b: a * b, [(3, 4), (3, 4)], False),
    "div": (lambda a, b: a / b, [(3, 4), (3, 4)], True),
    "rdiv_scalar": (lambda a: 2.0 / a, [(3, 4)], True),
    "scalar_ops": (lambda a: (a * 3 - 1) / 2 + 0.5, [(5,)], False),
    "neg": (lambda a: -a, [(3, 4)], False),
    "exp": (lambda a: a.exp(), [(3, 4)], False),
    "log": (lambda a: a.log(), [(3, 4)], True),
    "sqrt": (lambda a: a.sqrt(), [(3, 4)], True),
    "relu": (lambda a: a.relu(), [(3, 4)], False),
    "sigmoid": (lambda a: a.sigmoid(), [(3, 4)], False),
    "tanh": (lambda a: a.tanh(), [(3, 4)], False),
    "maximum": (lambda a, b: a.maximum(b), [(3, 4), (4,)], False),
    "where": (lambda a, b: _where(a > b, a * 2, b * 3), [(3, 4), (3, 4)], False),
    "cast_roundtrip": (lambda a: _cast(_cast(a, "float64"), "float32") * 2, [(3, 4)], False),
    "sum_all": (lambda a: a.sum(), [(2, 3, 4)], False),
    "sum_axes_keepdim": (lambda a: a.sum((0, 2), keepdim=True) * a, [(2, 3, 4)], False),
    "max_axis": (lambda a: _max(a, 1), [(2, 3, 4)], False),
    "max_all": (lambda a: _max(a, None), [(3, 4)], False),
    "mean_axis": (lambda a: a.mean(-1), [(2, 3, 4)], False),
    "softmax": (lambda a: a.softmax(-1), [(3, 5)], False),
    "softmax_axis0": (lambda a: a.softmax(0), [(3, 5)], False),
    "log_softmax": (lambda a: a.log_softmax(-1), [(3, 5)], False),
    "reshape": (lambda a: a.reshape(4, 6) * _arange_like((4, 6), a), [(2, 3, 4)], False),
    "permute": (lambda a: a.permute(2, 0, 1), [(2, 3, 4)], False),
    "expand": (lambda a: a.expand(3, 2, 4), [(2, 1)], False),
    "pad": (lambda a: _pad(a), [(2, 3)], False),
    "shrink": (lambda a: a[1:, 1:3], [(3, 4)], False),
    "flip": (lambda a: a.flip(0) * _arange_like((3, 4), a), [(3, 4)], False),
    "transpose": (lambda a: a.transpose(0, 1), [(3, 4)], False),
    "squeeze_unsqueeze": (lambda a: a.unsqueeze(0).squeeze(0).unsqueeze(-1), [(3, 4)], False),
    "flatten": (lambda a: a.flatten(), [(2, 3, 4)], False),
    "matmul": (lambda a, b: a @ b, [(3, 4), (4, 5)], False),
    "matmul_batched": (lambda a, b: a @ b, [(2, 3, 4), (4, 2)], False),
    "gather": (lambda a: a.gather(1, _index(a)), [(3, 4)], False),
    "chain": (lambda a, b: ((a * 2 + 1).relu() * b).sum(1).exp(), [(3, 4), (3, 4)], False),
}


def _is_torch(t):
    return isinstance(t, torch.Tensor)


def _cast(t, name):
    return t.to(getattr(torch, name)) if _is_torch(t) else t.cast(name)


def _where(cond, a, b):
    return torch.where(cond, a, b) if _is_torch(cond) else cond.where(a, b)


def _max(a, axis):
    if _is_torch(a):
        return a.amax() if axis is None else a.amax(axis)
    return a.max(axis)


def _pad(a):
    if _is_torch(a):
        return torch.nn.functional.pad(a, (1, 2, 0, 1))
    return a.pad(((0, 1), (1, 2)))


def _arange_like(shape, a):
    vals = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    return torch.tensor(vals) if _is_torch(a) else Tensor(vals, device=a.device)


def _index(a):
    idx = np.array([[0, 3], [2, 2], [1, 0]], dtype=np.int64)
    return torch.tensor(idx) if _is_torch(a) else Tensor(idx.astype(np.int32), device=a.device)


# Every case runs on INTERP (the reference semantics, no compile step); compiled backends run this
# subset, which still covers each kind of kernel the gradients produce (broadcast sums, reduces read
# through expands, max ties, padding/shrinking/flipping, matmul, gather), to keep compile time small.
COMPILED_SUBSET = {"add_broadcast", "mul", "div", "log", "relu", "sigmoid", "maximum", "where",
                   "sum_axes_keepdim", "max_axis", "softmax", "log_softmax", "permute", "expand", "pad",
                   "shrink", "flip", "matmul", "gather", "chain"}


GRAD_PARAMS = [(dev, name) for dev in DEVICES for name in CASES if dev == "INTERP" or name in COMPILED_SUBSET]


@pytest.mark.parametrize("device,name", GRAD_PARAMS)
def test_gradient_matches_torch(device, name):
    fn, shapes, positive = CASES[name]
    arrays = [_data(s, positive) for s in shapes]
    ours = [Tensor(a, device=device, requires_grad=True) for a in arrays]
    theirs = [torch.tensor(a, requires_grad=True) for a in arrays]
    out_ref = fn(*theirs)
    weights = RNG.standard_normal(tuple(out_ref.shape)).astype(np.float32)
    (out_ref * torch.tensor(weights)).sum().backward()
    out = fn(*ours)
    np.testing.assert_allclose(out.numpy(), out_ref.detach().numpy(), atol=1e-5, rtol=1e-5)
    (out * Tensor(weights, device=device)).sum().backward()
    for mine, ref in zip(ours, theirs):
        assert mine.grad is not None, f"{name}: no gradient reached an input"
        assert mine.grad.shape == tuple(ref.grad.shape)
        np.testing.assert_allclose(mine.grad.numpy(), ref.grad.numpy(), atol=1e-4, rtol=1e-4)


def test_grad_accumulates_and_shared_input(device):
    x = Tensor([1.0, 2.0, 3.0], device=device, requires_grad=True)
    (x * x + x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [3.0, 5.0, 7.0])
    (x * 2).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [5.0, 7.0, 9.0])


def test_no_grad_for_detached_and_int(device):
    x = Tensor([1.0, 2.0], device=device, requires_grad=True)
    y = Tensor([3.0, 4.0], device=device, requires_grad=False)
    (x * y.detach() * y).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [9.0, 16.0])
    assert y.grad is None
    with pytest.raises(RuntimeError):
        (x * 2).backward()  # non-scalar without gradient=


def test_backward_after_item_and_realize(device):
    """Reading a value (item/numpy/realize) before backward() must not cut the graph (PyTorch habit)."""
    x = Tensor([1.0, 2.0, 3.0], device=device, requires_grad=True)
    loss = (x * x).sum()
    assert loss.item() == 14.0
    loss.backward()
    np.testing.assert_allclose(x.grad.numpy(), [2.0, 4.0, 6.0])
    x.grad = None
    hidden = (x * 3).exp().realize()  # realized intermediate, then used
    out = (hidden * x).sum()
    out.numpy()
    out.backward()
    xs = np.array([1.0, 2.0, 3.0])
    np.testing.assert_allclose(x.grad.numpy(), np.exp(3 * xs) * (3 * xs + 1), rtol=1e-5)
    (dx,) = out.gradient(x)
    np.testing.assert_allclose(dx.numpy(), np.exp(3 * xs) * (3 * xs + 1), rtol=1e-5)


def test_backward_reaches_lazily_created_leaf(device):
    Tensor.manual_seed(3)
    w = Tensor.rand(4, device=device)
    loss = (w * w).sum()
    values = w.numpy()  # realizes w after loss was built
    loss.backward()
    np.testing.assert_allclose(w.grad.numpy(), 2 * values, rtol=1e-6)



def test_relu_gradient_at_special_values_matches_torch(device):
    """relu's gradient selects on its output (gradient._where_grad: x <= k exactly where the clamp's output
    is k): 0 at -1, -0 and +0, 1 above 0 and at +inf, and g at NaN, as torch; the same for a clamp at 0.5."""
    vals = np.array([-1.0, -0.0, 0.0, 1e-30, 2.0, 0.5, np.nan, np.inf, -np.inf], np.float32)
    cases = [(lambda t: t.relu(), 0.0), (lambda t: (t <= 0).where(0.0, t), 0.0),
             (lambda t: (t <= 0.5).where(0.5, t), 0.5)]
    for fn, k in cases:
        ours = Tensor(vals, device=device, requires_grad=True)
        fn(ours).sum().backward()
        theirs = torch.tensor(vals, requires_grad=True)
        torch.where(theirs <= k, torch.tensor(k), theirs).sum().backward()
        np.testing.assert_array_equal(ours.grad.numpy(), theirs.grad.numpy())
