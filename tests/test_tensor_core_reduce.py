"""Reductions, scans and ordering against torch CPU: forward, gradients, axes, keepdim, empty, NaN."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from polygrad import Tensor
from polygrad.errors import InvalidArgumentError
from tensor_core_ref import DEVICES, check_all, close, concat_flat, stack, to_np

DATA = np.random.default_rng(4).permutation(np.linspace(-2.0, 2.2, 24)).astype(np.float32).reshape(2, 3, 4)

# name -> (polygrad fn, torch fn, differentiable); distinct values so max/sort gradients are unique
REDUCE = {
    "sum": (lambda x: x.sum(), lambda x: x.sum(), True),
    "sum_axis": (lambda x: x.sum(1), lambda x: x.sum(1), True),
    "sum_neg_axes_keep": (lambda x: x.sum((-1, 0), keepdim=True), lambda x: x.sum((-1, 0), keepdim=True), True),
    "prod": (lambda x: x.prod(-1), lambda x: x.prod(-1), True),
    "mean": (lambda x: x.mean((0, 2)), lambda x: x.mean((0, 2)), True),
    "var": (lambda x: x.var(1), lambda x: x.var(1), True),
    "var_pop": (lambda x: x.var(-1, correction=0), lambda x: x.var(-1, correction=0), True),
    "std": (lambda x: x.std(), lambda x: x.std(), True),
    "std_keep": (lambda x: x.std(2, keepdim=True), lambda x: x.std(2, keepdim=True), True),
    "std_mean_std": (lambda x: x.std_mean(0)[0], lambda x: torch.std_mean(x, 0)[0], True),
    "std_mean_mean": (lambda x: x.std_mean(0)[1], lambda x: torch.std_mean(x, 0)[1], True),
    "max": (lambda x: x.max(), lambda x: x.max(), True),
    "max_axis": (lambda x: x.max(1), lambda x: x.amax(1), True),
    "min_keep": (lambda x: x.min(-1, keepdim=True), lambda x: x.amin(-1, keepdim=True), True),
    "argmax": (lambda x: x.argmax(1), lambda x: x.argmax(1), False),
    "argmax_flat": (lambda x: x.argmax(), lambda x: x.argmax(), False),
    "argmin_keep": (lambda x: x.argmin(-1, keepdim=True), lambda x: x.argmin(-1, keepdim=True), False),
    "any": (lambda x: (x > 1.5).any(1), lambda x: (x > 1.5).any(1), False),
    "all": (lambda x: (x > -1.5).all(-1), lambda x: (x > -1.5).all(-1), False),
    "logsumexp": (lambda x: x.logsumexp(1), lambda x: x.logsumexp(1), True),
    "softmax": (lambda x: x.softmax(1), lambda x: x.softmax(1), True),
    "log_softmax": (lambda x: x.log_softmax(), lambda x: x.log_softmax(-1), True),
    "softmin": (lambda x: x.softmin(0), lambda x: torch.nn.functional.softmin(x, 0), True),
    "cumsum": (lambda x: x.cumsum(1), lambda x: x.cumsum(1), True),
    "cumprod": (lambda x: x.cumprod(-1), lambda x: x.cumprod(-1), True),
    "cummax": (lambda x: x.cummax(2)[0], lambda x: x.cummax(2)[0], True),
    "cummin": (lambda x: x.cummin(0)[0], lambda x: x.cummin(0)[0], True),
    "logcumsumexp": (lambda x: x.logcumsumexp(1), lambda x: x.logcumsumexp(1), True),
    "sort": (lambda x: x.sort(-1)[0], lambda x: x.sort(-1)[0], True),
    "sort_desc_idx": (lambda x: x.sort(1, descending=True)[1], lambda x: x.sort(1, descending=True)[1], False),
    "argsort": (lambda x: x.argsort(0), lambda x: x.argsort(0), False),
    "topk": (lambda x: x.topk(2)[0], lambda x: x.topk(2)[0], True),
    "topk_idx_smallest": (lambda x: x.topk(3, 1, largest=False)[1], lambda x: x.topk(3, 1, largest=False)[1], False),
}


@pytest.mark.parametrize("device", DEVICES)
def test_reductions_forward_and_grad(device):
    rng = np.random.default_rng(5)
    names = list(REDUCE)
    leaves = {n: Tensor(DATA, device=device, requires_grad=True) for n in names}
    outs = {n: REDUCE[n][0](leaves[n]) for n in names}
    refs, weights, problems = {}, {}, []
    for n in names:
        t = torch.tensor(DATA, requires_grad=True)
        refs[n] = (t, REDUCE[n][1](t))
        weights[n] = rng.uniform(0.5, 1.5, refs[n][1].shape).astype(np.float32)
    diff = [n for n in names if REDUCE[n][2]]
    sum((outs[n] * Tensor(weights[n], device=device)).sum() for n in diff).backward()
    flat, spans = concat_flat([outs[n].float() for n in names])
    fwd = flat.numpy()
    grads = stack([leaves[n].grad for n in diff]).numpy()
    for n, (lo, hi) in zip(names, spans):
        t, ref = refs[n]
        problems.append(close(f"{n} forward", fwd[lo:hi], to_np(ref.float()).reshape(-1), 2e-5, 1e-6))
        if REDUCE[n][2]:
            (ref * torch.tensor(weights[n])).sum().backward()
            problems.append(close(f"{n} grad", grads[diff.index(n)], to_np(t.grad), 1e-4, 1e-5))
    check_all(problems)


@pytest.mark.parametrize("device", DEVICES)
def test_reductions_empty(device):
    x = Tensor(np.zeros((0, 3), np.float32), device=device)
    assert x.sum().item() == 0.0
    assert x.sum(0).tolist() == [0.0, 0.0, 0.0]
    assert x.sum(1).shape == (0,)
    assert x.prod(0).tolist() == [1.0, 1.0, 1.0]
    assert math.isnan(x.mean().item())
    assert all(math.isnan(v) for v in x.mean(0).tolist())
    assert x.any().item() is False and x.all().item() is True
    assert x.any(0).tolist() == [False] * 3
    assert x.logsumexp(0).tolist() == [-math.inf] * 3
    assert x.cumsum(0).shape == (0, 3) and x.cumsum(1).numpy().shape == (0, 3)
    assert x.max(1).shape == (0,)
    values, idx = x.sort(0)
    assert values.shape == (0, 3) and idx.shape == (0, 3)
    with pytest.raises(IndexError, match="empty dimension"):
        x.max()
    with pytest.raises(IndexError, match="empty dimension"):
        x.argmax(0)


@pytest.mark.parametrize("device", DEVICES)
def test_reductions_nan_and_inf(device):
    data = np.array([[1.0, math.nan, 3.0, -1.0], [-math.inf, -math.inf, -math.inf, -math.inf],
                     [2.0, 5.0, math.inf, 5.0]], np.float32)
    x, t = Tensor(data, device=device), torch.tensor(data)
    desc = t.sort(dim=1, descending=True, stable=True)
    problems = [
        close("max", x.max(1).numpy(), t.amax(1).numpy(), 0, 0),
        close("min", x.min(1).numpy(), t.amin(1).numpy(), 0, 0),
        close("argmax", x.argmax(1).numpy(), t.argmax(1).numpy(), 0, 0),
        close("argmin", x.argmin(1).numpy(), t.argmin(1).numpy(), 0, 0),
        close("logsumexp", x.logsumexp(1).numpy(), t.logsumexp(1).numpy(), 1e-6, 0),
        close("sum", x.sum(1).numpy(), t.sum(1).numpy(), 1e-6, 0),
        close("sort", x.sort(1)[0].numpy(), t.sort(dim=1, stable=True)[0].numpy(), 0, 0),
        close("sort idx", x.sort(1)[1].numpy(), t.sort(dim=1, stable=True)[1].numpy(), 0, 0),
        close("sort desc", x.sort(1, True)[0].numpy(), desc[0].numpy(), 0, 0),
        close("sort desc idx", x.sort(1, True)[1].numpy(), desc[1].numpy(), 0, 0),
        close("cummax", x.cummax(1)[0].numpy(), t.cummax(1)[0].numpy(), 0, 0),
    ]
    check_all(problems)


@pytest.mark.parametrize("device", DEVICES)
def test_integer_and_bool_reductions(device):
    a = np.array([[3, -7, 2], [-2147483648, 5, 5]], np.int32)
    x, t = Tensor(a, device=device), torch.tensor(a)
    assert x.max(1).tolist() == t.amax(1).tolist()
    assert x.min(1).tolist() == t.amin(1).tolist()
    assert x.argmax(1).tolist() == t.argmax(1).tolist() == [0, 1]
    assert x.argmin(1).tolist() == t.argmin(1).tolist()
    assert x.sum(1).tolist() == t.sum(1).tolist()
    assert x.cumsum(1).tolist() == t.cumsum(1).tolist()
    assert x.sort(1)[0].tolist() == t.sort(1)[0].tolist()
    assert x.cummin(1)[0].tolist() == t.cummin(1)[0].tolist()
    b = Tensor([[True, False], [False, False]], device=device)
    assert b.any(1).tolist() == [True, False] and b.all(0).tolist() == [False, False]
    assert b.sum().item() == 1 and b.max().item() is True and b.min().item() is False
    u = Tensor(np.array([7, 0, 250], np.uint8), device=device)
    assert u.min().item() == 0 and u.max().item() == 250 and u.sum().item() == 257


@pytest.mark.parametrize("device", DEVICES)
def test_ties_sort_is_stable_and_topk(device):
    data = np.array([3.0, 1.0, 3.0, 2.0, 1.0, 3.0], np.float32)
    x, t = Tensor(data, device=device), torch.tensor(data)
    assert x.argsort().tolist() == t.argsort(stable=True).tolist()
    assert x.argsort(descending=True).tolist() == t.argsort(descending=True, stable=True).tolist()
    v, i = x.topk(3)
    assert v.tolist() == [3.0, 3.0, 3.0] and i.tolist() == [0, 2, 5]
    with pytest.raises(RuntimeError):  # torch's class (tinygrad: ValueError; InvalidArgumentError is both)
        t.topk(7)
    with pytest.raises(InvalidArgumentError, match="out of range"):
        x.topk(7)


@pytest.mark.parametrize("device", DEVICES)
def test_long_scans_use_blocks(device):
    """Axes longer than SCAN_BLOCK scan in two levels; values and gradients still match torch."""
    data = np.random.default_rng(8).standard_normal((2, 600)).astype(np.float32)
    w = np.random.default_rng(9).standard_normal((2, 600)).astype(np.float32)
    problems = []
    for name in ("cumsum", "cummax", "logcumsumexp"):
        x, t = Tensor(data, device=device, requires_grad=True), torch.tensor(data, requires_grad=True)
        out = getattr(x, name)(-1)
        out = out[0] if isinstance(out, tuple) else out  # cummax: (values, indices)
        ref = getattr(t, name)(-1)
        ref = ref[0] if isinstance(ref, tuple) else ref
        (out * Tensor(w, device=device)).sum().backward()
        (ref * torch.tensor(w)).sum().backward()
        problems.append(close(f"{name} forward", out.numpy(), to_np(ref), 1e-4, 1e-4))
        problems.append(close(f"{name} grad", x.grad.numpy(), to_np(t.grad), 1e-4, 1e-4))
    check_all(problems)


def test_torch_dim_keyword():
    """Reductions accept torch's dim= as well as axis=."""
    x = Tensor(DATA, device="INTERP")
    t = torch.tensor(DATA)
    np.testing.assert_allclose(x.sum(dim=1).numpy(), t.sum(dim=1).numpy(), rtol=1e-6)
    np.testing.assert_allclose(x.mean(dim=(0, 2), keepdim=True).numpy(), t.mean(dim=(0, 2), keepdim=True).numpy(),
                               rtol=1e-6)
    np.testing.assert_allclose(x.softmax(dim=0).numpy(), t.softmax(dim=0).numpy(), rtol=1e-6)
    np.testing.assert_array_equal(x.argmax(dim=-1).numpy(), t.argmax(dim=-1).numpy())
    np.testing.assert_allclose(x.cumsum(dim=2).numpy(), t.cumsum(dim=2).numpy(), rtol=1e-6)
    with pytest.raises(TypeError, match="both dim and axis"):
        x.sum(1, dim=0)


# ---------------------------------------------------------------------------------------------------
# float16 / bfloat16 accumulate in float32 and round once, as torch (issue 28 item 11)

HALVES = [("float16", torch.float16, 2.0 ** -10), ("bfloat16", torch.bfloat16, 2.0 ** -7)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name,tdt,eps", HALVES)
def test_half_reductions_accumulate_in_float32(device, name, tdt, eps):
    """The sum of 70,000 float16 ones is past float16's range (inf, as torch), but their mean is 1: the sum
    stays in float32 until the division. var/std/cumsum the same; the result keeps the input dtype."""
    ones = Tensor.ones(2, 70000, dtype=name, device=device)
    assert ones.mean().item() == 1.0 and ones.mean(1).tolist() == [1.0, 1.0] and ones.mean().dtype.name == \
        {"float16": "half", "bfloat16": "bfloat16"}[name]
    assert ones.sum(1).tolist() == torch.ones(2, 70000, dtype=tdt).sum(1).float().tolist()
    # a constant past the half range rounds to inf when rendered (it was written "inff", a compile error)
    assert (Tensor.ones(3, dtype=name, device=device) * 70000.0).tolist() == \
        (torch.ones(3, dtype=tdt) * 70000.0).float().tolist()
    t = torch.tensor(np.random.default_rng(11).standard_normal((2, 40000)) * 300 + 1000).to(tdt)
    x = Tensor(to_np(t), device=device).cast(name)
    cases = {"mean": lambda a: a.mean(-1), "mean_all": lambda a: a.mean(), "var": lambda a: a.var(-1),
             "var_biased": lambda a: a.var(0, correction=0), "std": lambda a: a.std(-1),
             "cumsum": lambda a: a.cumsum(-1), "softmax": lambda a: (a / 300).softmax(-1),
             "logsumexp": lambda a: (a / 300).logsumexp(-1)}
    problems = []
    for case, fn in cases.items():
        got, want = fn(x), fn(t)
        assert got.dtype is x.dtype, case
        problems.append(close(f"{name} {case}", got.numpy().astype(np.float32), to_np(want), 2 * eps, 0))
    check_all(problems)


@pytest.mark.parametrize("name,tdt,eps", HALVES)
def test_half_normalisation_runs_in_float32(name, tdt, eps):
    """Layer/RMS/group norms and normalize() of half inputs with |x| ~ 1000: the squares overflow float16
    (NaN or 0 before); computed in float32 and rounded once they match torch to an ulp or two."""
    from polygrad import nn
    t = torch.tensor(np.random.default_rng(12).standard_normal((4, 6, 5, 5)) * 300 + 500).to(tdt)
    x = Tensor(to_np(t)).cast(name)
    ones, zeros = torch.ones(25, dtype=tdt), torch.zeros(25, dtype=tdt)
    flat, tflat = x.reshape(4, 6, 25), t.reshape(4, 6, 25)
    cases = [("layernorm", flat.layernorm(), F.layer_norm(tflat, (25,))),
             ("LayerNorm", nn.LayerNorm(25, dtype=name)(flat), F.layer_norm(tflat, (25,), ones, zeros)),
             ("RMSNorm", nn.RMSNorm(25, dtype=name)(flat), F.rms_norm(tflat, (25,), ones)),
             ("GroupNorm", nn.GroupNorm(3, 6, dtype=name)(x), F.group_norm(t, 3, ones[:6], zeros[:6])),
             ("normalize", x.normalize(dim=1), F.normalize(t, dim=1))]
    problems = []
    for case, got, want in cases:
        assert got.dtype is x.dtype, case
        problems.append(close(f"{name} {case}", got.numpy().astype(np.float32), to_np(want), eps, eps / 2))
    check_all(problems)
