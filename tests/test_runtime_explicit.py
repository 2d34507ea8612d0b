"""Explicit runtimes: ownership, disposal, nn proxies, memory-pressure tools."""
import gc

import numpy as np
import pytest

import polygrad
from polygrad import Tensor
from polygrad.errors import RuntimeOwnershipError

import resident
from conftest import DEVICES  # every usable backend: CPU, INTERP, X86, ...


@pytest.mark.parametrize("device", DEVICES)
def test_tensors_and_constructors_are_owned(device):
    rt = polygrad.create(device=device)
    try:
        x = rt.Tensor([[1.0, 2.0]])
        r = rt.Tensor.rand(2, 3)
        z = rt.Tensor.zeros(2)
        assert x._runtime is rt and r._runtime is rt and z._runtime is rt
        assert x.device == device and r.device == device
        y = (x * 2 + 1).sum()
        assert y._runtime is rt and y.item() == 8.0
        assert 0.0 <= r.numpy().min() and r.numpy().max() < 1.0
    finally:
        rt.dispose()


def test_package_level_constructors_use_the_default_runtime():
    assert Tensor([1.0])._runtime is None
    assert Tensor.rand(2)._runtime is None


@pytest.mark.parametrize("op", ["add", "matmul", "where", "assign", "custom_kernel"])
def test_mixing_runtimes_names_them(op):
    a, b = polygrad.create(device="CPU"), polygrad.create(device="CPU")
    try:
        x, y = a.Tensor([[1.0, 2.0], [3.0, 4.0]]).realize(), b.Tensor([[1.0, 0.0], [0.0, 1.0]]).realize()
        with pytest.raises(RuntimeOwnershipError, match="runtime") as info:
            if op == "add":
                x + y
            elif op == "matmul":
                x @ y
            elif op == "where":
                (x > 1).where(x, y)
            elif op == "assign":
                x.assign(y)
            else:
                x.custom_kernel(y, fxn=lambda o, i: None)
        assert f"#{a.id}" in str(info.value) and f"#{b.id}" in str(info.value)
    finally:
        a.dispose()
        b.dispose()


@pytest.mark.parametrize("op", ["add", "radd", "matmul", "where", "assign", "cat", "realize_all"])
def test_default_runtime_tensor_does_not_mix_with_an_explicit_one(op):
    """The spec: mixing owners is rejected even when their devices match; package-level constructors use
    the default runtime (`rt.Tensor([1.]) + Tensor([2.])` used to succeed)."""
    rt = polygrad.create(device="CPU")
    try:
        x, y = rt.Tensor([[1.0, 2.0], [3.0, 4.0]]), Tensor([[1.0, 0.0], [0.0, 1.0]], device="CPU")
        with pytest.raises(RuntimeOwnershipError, match="default runtime") as info:
            if op == "add":
                x + y
            elif op == "radd":
                y + x
            elif op == "matmul":
                y @ x
            elif op == "where":
                (y > 0).where(x, 0.0)
            elif op == "assign":
                x.realize().assign(y)
            elif op == "cat":
                y.cat(x)
            else:
                Tensor.realize_all(x * 2, y * 2)
        assert f"#{rt.id}" in str(info.value)
    finally:
        rt.dispose()


def test_internal_helpers_take_the_runtime_of_their_operands():
    """Constants and aranges hold no memory: they mix with any runtime. Ops whose helpers hold data
    (index lists, masks, dropout keys, repeat counts) make them for the operand's runtime."""
    rt = polygrad.create(device="CPU")
    try:
        x = rt.Tensor(np.arange(12, dtype=np.float32).reshape(3, 4))
        assert (x + Tensor.arange(4)).tolist()[0] == [0.0, 2.0, 4.0, 6.0]
        assert (Tensor.zeros(3, 4) + x)._runtime is rt
        assert (Tensor.full((3, 4), 2.0) * x)._runtime is rt  # an unowned first operand gives the owner
        assert x[[0, 2]].tolist()[1] == [8.0, 9.0, 10.0, 11.0]
        assert x[[True, False, True]].shape == (2, 4)
        assert x.repeat_interleave([1, 0, 2], 0).shape == (3, 4)
        with polygrad.Context(TRAINING=1):
            assert x.dropout(0.5).shape == (3, 4)
        y = rt.Tensor(np.zeros((3, 4), np.float32)).realize()
        y[[0, 1]] = 1.0
        assert y.sum().item() == 8.0
        with pytest.raises(RuntimeOwnershipError):
            (Tensor.zeros(3, 4) + x) + Tensor(np.ones((3, 4), np.float32))  # the sum is rt's, not unowned
    finally:
        rt.dispose()


def test_layers_belong_to_their_runtime():
    nn = pytest.importorskip("polygrad.nn")
    if not hasattr(nn, "Linear"):
        pytest.skip("polygrad.nn.Linear is not available in this build")
    a, b = polygrad.create(device="CPU"), polygrad.create(device="CPU")
    try:
        lin = a.nn.Linear(2, 1)
        assert lin.weight._runtime is a
        out = lin(a.Tensor([[1.0, 2.0]])).numpy()
        w, bias = lin.weight.numpy(), lin.bias.numpy()
        np.testing.assert_allclose(out, np.array([[1.0, 2.0]]) @ w.T + bias, rtol=1e-5)
        with pytest.raises(RuntimeOwnershipError, match="runtime"):
            lin(b.Tensor([[1.0, 2.0]])).numpy()
    finally:
        a.dispose()
        b.dispose()


def test_disposed_runtime_raises_clearly():
    rt = polygrad.create(device="CPU")
    x = rt.Tensor([1.0, 2.0])
    rt.dispose()
    with pytest.raises(RuntimeOwnershipError, match="disposed"):
        rt.Tensor([1.0])
    with pytest.raises(RuntimeOwnershipError, match="disposed"):
        (x + 1).realize()
    with pytest.raises(RuntimeOwnershipError, match="disposed"):
        rt.nn.Linear(2, 1)


def test_models_and_model_namespaces():
    rt = polygrad.create(device="CPU")
    try:
        if getattr(polygrad, "Model", None) is None:
            with pytest.raises(AttributeError, match="Model"):
                rt.Model
        else:
            assert callable(rt.Model.load)
        if not hasattr(polygrad, "models"):
            with pytest.raises(AttributeError, match="models"):
                rt.models.Sequential
    finally:
        rt.dispose()


def test_unknown_device_is_rejected():
    with pytest.raises(polygrad.errors.DeviceError if hasattr(polygrad, "errors") else ValueError):
        polygrad.create(device="nosuchdevice")


def test_memory_returns_near_start_after_ten_thousand_graphs():
    """10,000 distinct-shape graphs (INTERP: no C compiler in the loop), then clear + collect."""
    rt = polygrad.create(device="INTERP")
    try:
        (rt.Tensor.ones(3) * 2).realize()
        rt.clear_schedule_cache()
        rt.collect()
        start = resident.rss()
        for n in range(1, 10_001):
            (rt.Tensor.ones(n) * 2).realize()
        peak = resident.rss()
        assert polygrad.stats()["schedules_cached"] >= 10_000
        rt.clear_schedule_cache()
        rt.collect()
        after = resident.rss()
        s = polygrad.stats()
        assert s["schedules_cached"] == 0 and s["programs_cached"] == 0
        growth, kept = peak - start, after - start
        assert growth > 0
        assert kept < 0.5 * growth and kept < 48 * 2**20, (start, peak, after)
        assert (rt.Tensor([1.0, 2.0]) * 2).numpy().tolist() == [2.0, 4.0]  # rebuilds what it needs
    finally:
        rt.dispose()
        gc.collect()


def test_collect_on_cpu_keeps_results_correct():
    rt = polygrad.create(device="CPU")
    try:
        for n in range(1, 12):
            out = (rt.Tensor.ones(n, 3) * n).sum().numpy()
            assert out == 3 * n * n
        rt.clear_schedule_cache()
        rt.collect()
        assert (rt.Tensor([1.0, 2.0]) * 2).numpy().tolist() == [2.0, 4.0]
    finally:
        rt.dispose()
