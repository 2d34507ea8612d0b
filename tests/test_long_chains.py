"""Kernels far deeper than Python's recursion limit compile and compute (issue 28 item 6).

A validated bundle whose kernel held a 600-op dependency chain failed at its first call with
RecursionError in renderer/linearize.py on CPU and X86 (the validator allows 2**18 nodes). The
linearizer's walks and X86's expansion now run on an explicit stack (linearize.run_steps), so:
- x -> x*1.0001 + 0.5, 600 and 20,000 times inside one kernel (a custom kernel through the Tensor
  API, and the same kernel stored in a bundle), equals NumPy's float32 chain on every backend;
- 600 nested gathers (each index loaded through the previous one) equal NumPy's;
- 1,500 nested loops, and 1,500 nested reductions, run on X86 (C compilers refuse more than 256
  nested brackets: a CompileError; INTERP evaluates each loop as an array axis, at most 64).
Plain Tensor chains never reach such depths in one kernel: the scheduler cuts fused expressions at
MAX_FUSED_DEPTH (tests/test_deep_graphs.py).
"""
from __future__ import annotations

import sys

import numpy as np
import pytest

from conftest import DEVICES
from polygrad import Model, Tensor, bundle, dtypes
from polygrad.uop import serialize
from polygrad.uop.ops import AxisKind, KernelInfo, Ops, UOp

N = 16
X = np.linspace(-1, 1, N).astype(np.float32)


def test_recursion_limit_untouched():
    assert sys.getrecursionlimit() <= 10_000  # the tests below must not rely on raising it


def chain_kernel(steps: int):
    """fxn for custom_kernel: out[i] = a[i] after `steps` rounds of x*1.0001 + 0.5, one dependency chain."""
    def fxn(out, a):
        i = UOp.range(out.ctx, out.numel(), 0)
        x = a[i]
        for _ in range(steps):
            x = x * 1.0001 + 0.5
        return out[i].store(x).end(i).sink(arg=KernelInfo(name=f"chain_{steps}"))
    return fxn


def chain_reference(steps: int) -> np.ndarray:
    x = X.copy()
    for _ in range(steps):
        x = x * np.float32(1.0001) + np.float32(0.5)
    return x


@pytest.mark.parametrize("steps", [600, 20_000])
@pytest.mark.parametrize("device", DEVICES)
def test_long_chain_in_one_kernel_through_the_tensor_api(device, steps):
    out = Tensor.empty(N, device=device).custom_kernel(Tensor(X, device=device), fxn=chain_kernel(steps))[0]
    np.testing.assert_allclose(out.numpy(), chain_reference(steps), rtol=1e-6)


class _Scale:
    def __call__(self, x):
        return {"y": x * 2}


def chain_bundle(steps: int) -> bytes:
    """A bundle whose forward is one call of the chain kernel (a saved model's kernel swapped for it:
    buffer 0 is the output, 1 the input, as in the kernel's slots)."""
    m = Model(_Scale(), inputs={"x": Tensor.empty(N)})
    manifest, body = bundle.read(m.save())
    m.dispose()
    out, a = UOp.placeholder((N,), dtypes.float32, 0), UOp.placeholder((N,), dtypes.float32, 1)
    sink = chain_kernel(steps)(out, a)
    manifest["kernels"] = serialize.encode([sink])
    (call,) = manifest["entrypoints"]["forward"]["calls"]
    assert call["kernel"] == 0 and len(body) == 0
    forward = manifest["entrypoints"]["forward"]
    call["args"] = [forward["outputs"]["y"], forward["inputs"]["x"]]
    return bundle.write(manifest, [])


@pytest.fixture(scope="module")
def bundles() -> dict[int, bytes]:
    return {steps: chain_bundle(steps) for steps in (600, 20_000)}


@pytest.mark.parametrize("steps", [600, 20_000])
@pytest.mark.parametrize("device", DEVICES)
def test_long_chain_in_one_kernel_through_a_bundle(bundles, device, steps):
    m = Model.load(bundles[steps], device=device)
    np.testing.assert_allclose(m.forward(x=X)["y"].numpy(), chain_reference(steps), rtol=1e-6)
    m.dispose()


@pytest.mark.parametrize("device", DEVICES)
def test_600_nested_gathers(device):
    perm = np.random.default_rng(0).permutation(256).astype(np.uint8)

    def gathers(out, p):
        i = UOp.range(out.ctx, out.numel(), 0)
        x = i
        for _ in range(600):
            x = p[x].load().cast(dtypes.int32)
        return out[i].store(x).end(i).sink(arg=KernelInfo(name="gathers"))
    n = 3  # not a multiple of any vector width: scalar code (a vector gather chain is slow to compile)
    got = Tensor.empty(n, dtype=dtypes.int32, device=device).custom_kernel(Tensor(perm, device=device),
                                                                          fxn=gathers)[0].numpy()
    ref = np.arange(n)
    for _ in range(600):
        ref = perm[ref].astype(np.int64)
    np.testing.assert_array_equal(got, ref)


def _nested_loops(depth: int):
    """out[i + r1 + ... + r_depth] = 2 a[...] under `depth` nested loops of one point each."""
    def fxn(out, a):
        i = UOp.range(out.ctx, out.numel(), 0)
        rs = [UOp.range(out.ctx, 1, k + 1) for k in range(depth)]
        idx = i
        for r in rs:
            idx = idx + r
        return out[idx].store(a[idx] * 2).end(i, *rs).sink(arg=KernelInfo(name="nested_loops"))
    return fxn


def _nested_reduces(depth: int):
    """out[i] = a sum of a sum of ... (`depth` REDUCEs, each over one point) of 2 a[i]."""
    def fxn(out, a):
        i = UOp.range(out.ctx, out.numel(), 0)
        v = a[i].load() * 2
        for k in range(depth):
            r = UOp(Ops.RANGE, i.dtype, (UOp.const(i.dtype, 1),), (k + 1, AxisKind.REDUCE))
            v = UOp(Ops.REDUCE, v.dtype, (v, r), Ops.ADD)
        return out[i].store(v).end(i).sink(arg=KernelInfo(name="nested_reduces"))
    return fxn


@pytest.mark.skipif("X86" not in DEVICES, reason="the X86 backend is not usable here")
@pytest.mark.parametrize("nest", [_nested_loops, _nested_reduces])
def test_1500_nested_loops_on_x86(nest):
    """Loop nests deeper than the recursion limit lower (index sums, bounds, op counts), linearize and
    expand. X86 only: C compilers refuse more than 256 nested brackets (a CompileError on CPU) and
    INTERP makes each loop an array axis (at most 64)."""
    a = np.arange(8, dtype=np.float32)
    got = Tensor.empty(8, device="X86").custom_kernel(Tensor(a, device="X86"), fxn=nest(1500))[0].numpy()
    np.testing.assert_array_equal(got, a * 2)
