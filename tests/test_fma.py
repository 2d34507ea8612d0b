"""The explicit FMA op (issue 9, item 2): one rounding, the same bits on every backend."""
import numpy as np
import pytest

from polygrad import Tensor, dtypes
from polygrad.uop.ops import KernelInfo, Ops, UOp

from conftest import DEVICES  # every usable backend: CPU, INTERP, X86, ...


def fma_kernel(out, a, b, c):
    i = UOp.range(out.ctx, out.numel(), 0)
    return out[i].store(a[i].fma(b[i], c[i])).end(i).sink(arg=KernelInfo(name=f"fma_{out.numel()}"))


def run(device, dt, a, b, c):
    ts = [Tensor(x, device=device) for x in (a, b, c)]
    out = Tensor.empty(len(a), dtype=dt, device=device)
    return out.custom_kernel(*ts, fxn=fma_kernel)[0].numpy()


@pytest.mark.parametrize("device", DEVICES)
def test_fma_rounds_once(device):
    x = np.float32(1 + 2.0 ** -12)
    a = np.array([x, 3.0], np.float32)
    c = np.array([-1.0, 1.0], np.float32)
    got = run(device, dtypes.float32, a, a, c)
    assert got[0] == np.float32(2.0 ** -11 + 2.0 ** -24)  # exact; a*a then +c would give 2**-11
    assert np.float32(a[0] * a[0]) + c[0] == np.float32(2.0 ** -11)
    assert got[1] == 10.0
    xd = 1 + 2.0 ** -30
    gd = run(device, dtypes.float64, np.array([xd]), np.array([xd]), np.array([-1.0]))
    assert gd[0] == 2.0 ** -29 + 2.0 ** -60


def test_fma_same_bits_on_cpu_and_interp():
    rng = np.random.default_rng(0)
    n = 20000
    a = (rng.standard_normal(n) * np.exp2(rng.integers(-30, 30, n))).astype(np.float32)
    b = (rng.standard_normal(n) * np.exp2(rng.integers(-30, 30, n))).astype(np.float32)
    c = -(a.astype(np.float64) * b).astype(np.float32)  # cancellation: where one rounding shows
    c[::7] = rng.standard_normal(len(c[::7])).astype(np.float32)
    special = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 1e-45, 3e38], np.float32)
    a[:7], b[:7], c[:7] = special, special[::-1], special
    outs = [run(d, dtypes.float32, a, b, c) for d in DEVICES]
    np.testing.assert_array_equal(outs[0].view(np.uint32), outs[1].view(np.uint32))
    # and against an exact reference on the finite elements: the float32 nearest to a*b+c
    from fractions import Fraction
    for i in range(7, 400):
        exact = Fraction(float(a[i])) * Fraction(float(b[i])) + Fraction(float(c[i]))
        got = Fraction(float(outs[0][i]))
        lo, hi = np.nextafter(outs[0][i], np.float32(-np.inf)), np.nextafter(outs[0][i], np.float32(np.inf))
        err = abs(got - exact)  # no float32 neighbour is nearer the exact value
        assert err <= abs(Fraction(float(lo)) - exact) and err <= abs(Fraction(float(hi)) - exact)


@pytest.mark.parametrize("dt", [dtypes.float64, dtypes.float16, dtypes.int32])
def test_fma_other_dtypes_agree(dt):
    rng = np.random.default_rng(1)
    if dt is dtypes.int32:
        a, b, c = (rng.integers(-2 ** 20, 2 ** 20, 300).astype(np.int32) for _ in range(3))
    else:
        a, b, c = (rng.standard_normal(300).astype(dt.np) for _ in range(3))
    outs = [run(d, dt, a, b, c) for d in DEVICES]
    np.testing.assert_array_equal(outs[0], outs[1])
    if dt is dtypes.int32:
        np.testing.assert_array_equal(outs[0], (a.astype(np.int64) * b + c).astype(np.int32))
    else:
        np.testing.assert_allclose(outs[0].astype(np.float64), a.astype(np.float64) * b + c, rtol=2e-3, atol=2e-3)


def test_fma_is_an_ir_op_the_serializer_knows():
    from polygrad.uop.serialize import dumps, loads
    g = [UOp.placeholder((4,), dtypes.float32, i) for i in range(4)]
    ast = fma_kernel(*g)
    assert any(n.op is Ops.FMA for n in ast.toposort())
    assert loads(dumps(ast)) is ast
