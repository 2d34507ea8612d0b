"""Custom kernels written in kernel IR: run on CPU and INTERP through the normal schedule and caches."""
import numpy as np
import pytest

import polygrad
from polygrad import Tensor, dtypes, jit
from polygrad.uop.ops import KernelInfo, UOp

from conftest import DEVICES  # every usable backend: CPU, INTERP, X86, ...


def add_kernel(out, a, b):
    out, a, b = out.flatten(), a.flatten(), b.flatten()
    i = UOp.range(out.ctx, out.numel(), 0)
    return out[i].store(a[i] + b[i]).end(i).sink(arg=KernelInfo(name="custom_add_4"))


@pytest.mark.parametrize("device", DEVICES)
def test_spec_example(device):
    out = Tensor.empty((4,), dtype="float32", device=device)
    y = out.custom_kernel(Tensor([1.0, 2.0, 3.0, 4.0], device=device),
                          Tensor([10.0, 20.0, 30.0, 40.0], device=device), fxn=add_kernel)[0]
    assert y.numpy().tolist() == [11.0, 22.0, 33.0, 44.0]


@pytest.mark.parametrize("device", DEVICES)
def test_two_dimensional_kernel_with_lazy_inputs_and_lazy_consumers(device):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((3, 5)).astype(np.float32)
    b = rng.standard_normal((5,)).astype(np.float32)

    def scale_rows(out, x, v):
        i = UOp.range(out.ctx, 3, 0)
        j = UOp.range(out.ctx, 5, 1)
        return out[i, j].store(x[i, j] * v[j] + 1.0).end(i, j).sink(arg=KernelInfo(name="scale_rows"))

    x = Tensor(a, device=device) * 2  # lazy: realized by the scheduler before the kernel
    out = Tensor.empty(3, 5, device=device).custom_kernel(x, Tensor(b, device=device), fxn=scale_rows)[0]
    result = (out.sum(1) - 1).numpy()
    np.testing.assert_allclose(result, (a * 2 * b + 1).sum(1) - 1, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_reuses_compiled_program(device):
    def run(vals):
        out = Tensor.empty((4,), device=device)
        a, b = Tensor(vals, device=device), Tensor([1.0, 1.0, 1.0, 1.0], device=device)
        return out.custom_kernel(a, b, fxn=add_kernel)[0].numpy().tolist()

    assert run([1.0, 2.0, 3.0, 4.0]) == [2.0, 3.0, 4.0, 5.0]
    before = polygrad.stats()["programs_compiled"]
    assert run([5.0, 6.0, 7.0, 8.0]) == [6.0, 7.0, 8.0, 9.0]
    assert polygrad.stats()["programs_compiled"] == before


@pytest.mark.parametrize("device", DEVICES)
def test_without_kernel_info_the_body_does_not_run(device):
    def no_info(out, a):
        i = UOp.range(out.ctx, out.numel(), 0)
        return out[i].store(a[i] * 100).end(i).sink()

    out = Tensor([1.0, 2.0, 3.0], device=device).realize()
    y = out.custom_kernel(Tensor([5.0, 5.0, 5.0], device=device), fxn=no_info)[0]
    assert y.numpy().tolist() == [1.0, 2.0, 3.0]


def test_mismatched_vector_store_is_rejected():
    def bad(out, a):
        i = UOp.range(out.ctx, 2, 0)
        vec = UOp.vectorize(a[i * 2].cast(dtypes.float64), a[i * 2 + 1].cast(dtypes.float64))
        return out[i * 2].store(vec).end(i).sink(arg=KernelInfo(name="bad_vec"))

    with pytest.raises(TypeError, match="vector STORE dtype mismatch"):
        Tensor.empty(4, device="CPU").custom_kernel(Tensor([1.0, 2.0, 3.0, 4.0], device="CPU"), fxn=bad)


@pytest.mark.parametrize("device", DEVICES)
def test_vector_store_with_matching_dtype(device):
    def pairs(out, a):
        i = UOp.range(out.ctx, 2, 0)
        vec = UOp.vectorize(a[i * 2 + 1], a[i * 2]).cast(dtypes.float64).cast(dtypes.float32)
        return out[i * 2].store(vec * 10).end(i).sink(arg=KernelInfo(name="swap_pairs"))

    y = Tensor.empty(4, device=device).custom_kernel(Tensor([1.0, 2.0, 3.0, 4.0], device=device), fxn=pairs)[0]
    assert y.numpy().tolist() == [20.0, 10.0, 40.0, 30.0]


def test_scalar_store_converts():
    def to_int(out, a):
        i = UOp.range(out.ctx, 3, 0)
        return out[i].store(a[i] * 2).end(i).sink(arg=KernelInfo(name="to_int"))

    out = Tensor.empty(3, dtype="int32", device="CPU")
    y = out.custom_kernel(Tensor([1.25, 2.5, 3.75], device="CPU"), fxn=to_int)[0]
    assert y.numpy().tolist() == [2, 5, 7]


def test_function_must_return_a_sink():
    with pytest.raises(TypeError, match="SINK"):
        Tensor.empty(2, device="CPU").custom_kernel(Tensor([1.0, 2.0], device="CPU"), fxn=lambda o, a: o)


def test_custom_kernel_is_captured_by_jit():
    @jit
    def f(a, b):
        return Tensor.empty(4, device="CPU").custom_kernel(a, b, fxn=add_kernel)[0].realize()

    for k in range(4):
        a = Tensor([k, k, k, k], dtype="float32", device="CPU").realize()
        b = Tensor([1.0, 2.0, 3.0, 4.0], device="CPU").realize()
        assert f(a, b).numpy().tolist() == [k + 1.0, k + 2.0, k + 3.0, k + 4.0]
    assert f.stats()["replays"] == 2


@pytest.mark.parametrize("name", ["double", "my kernel-1", "2x"])
def test_kernel_names_that_are_not_c_identifiers_still_compile(name):
    def double(out, a):
        i = UOp.range(out.ctx, out.numel(), 0)
        return out[i].store(a[i] * 2).end(i).sink(arg=KernelInfo(name=name))

    y = Tensor.empty(3, device="CPU").custom_kernel(Tensor([1.0, 2.0, 3.0], device="CPU"), fxn=double)[0]
    assert y.numpy().tolist() == [2.0, 4.0, 6.0]
