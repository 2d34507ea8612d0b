"""Every dtype on every backend: construction, casts, arithmetic (half/bfloat16 bit-exact with torch),
64-bit literals, promotion and the `dtypes` namespace."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from polygrad import Tensor, dtypes
from polygrad.dtype import ALL_DTYPES, DTypeError, least_upper_dtype, to_dtype
from tensor_core_ref import DEVICES, check_all, close, stack, to_np

TORCH = {
    dtypes.bool: torch.bool, dtypes.int8: torch.int8, dtypes.uint8: torch.uint8, dtypes.int16: torch.int16,
    dtypes.uint16: torch.uint16, dtypes.int32: torch.int32, dtypes.uint32: torch.uint32, dtypes.int64: torch.int64,
    dtypes.uint64: torch.uint64, dtypes.float16: torch.float16, dtypes.bfloat16: torch.bfloat16,
    dtypes.float32: torch.float32, dtypes.float64: torch.float64,
}
BASE = [0.0, 1.0, 2.5, 7.9, 100.0, 127.0, -1.0, -3.5]


def _base_for(dt) -> list[float]:
    return BASE[:6] if dt.is_unsigned or dt is dtypes.bool else BASE


@pytest.mark.parametrize("device", DEVICES)
def test_cast_matrix(device):
    """x.cast(dst) for every (src, dst) pair matches torch's .to() (non-negative values into unsigned)."""
    problems = []
    for src in ALL_DTYPES:
        vals = _base_for(src)
        x = Tensor(vals, device=device, dtype=dtypes.float64).cast(src)
        dsts = [d for d in ALL_DTYPES if src.is_unsigned or d is dtypes.bool or not d.is_unsigned
                or src is dtypes.bool]
        got = stack([x.cast(d).cast(dtypes.float64) for d in dsts]).numpy()
        t = torch.tensor(vals, dtype=torch.float64).to(TORCH[src])
        for i, d in enumerate(dsts):
            want = t.to(TORCH[d]).double().numpy()
            problems.append(close(f"{src.name}->{d.name}", got[i], want, 0, 0))
    check_all(problems)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dt", ALL_DTYPES, ids=lambda d: d.name)
def test_arithmetic_every_dtype(device, dt):
    """+ - * max sum comparisons and where, bit-exact against torch in the same dtype."""
    rng = np.random.default_rng(6)
    lo = 0 if dt.is_unsigned or dt is dtypes.bool else -6
    a = rng.uniform(lo, 6, (3, 4))
    b = rng.uniform(lo, 6, (4,))
    # torch has no arithmetic for uint16/32/64: compute those in int64 and wrap like the unsigned type
    wide = dt in (dtypes.uint16, dtypes.uint32, dtypes.uint64)
    ta = torch.tensor(a).to(torch.int64 if wide else TORCH[dt])
    tb = torch.tensor(b).to(torch.int64 if wide else TORCH[dt])
    pa = Tensor(to_np(ta) if dt is not dtypes.bfloat16 else to_np(ta), device=device).cast(dt)
    pb = Tensor(to_np(tb), device=device).cast(dt)
    ops = [
        ("add", lambda x, y: x + y if dt is not dtypes.bool else x | y),
        ("mul", lambda x, y: x * y if dt is not dtypes.bool else x & y),
        ("max", lambda x, y: x.maximum(y)),
        ("lt", lambda x, y: x < y),
        ("eq", lambda x, y: x == y),
    ]
    where_ops = [("where", lambda x, y: (x > y).where(x, y), lambda x, y: torch.where(x > y, x, y))]
    if dt is not dtypes.bool:
        ops.append(("sub", lambda x, y: x - y))
        ops.append(("fma", lambda x, y: x * y + x))
    ops = [(name, fn, fn) for name, fn in ops] + where_ops
    got = stack([fn(pa, pb).cast(dtypes.float64) for _, fn, _ in ops]).numpy()
    problems = []
    for i, (name, _, ref) in enumerate(ops):
        out = ref(ta, tb)
        want = to_np(out).astype(dt.np).astype(np.float64) if wide and out.dtype != torch.bool else to_np(out.double())
        # the CPU backend compiles with -ffp-contract=fast, so x*y+x may be one FMA (1 ulp from torch)
        tol = 1e-6 if dt in (dtypes.float32, dtypes.float64) else 0
        problems.append(close(f"{dt.name} {name}", got[i], want, tol, 0))
    problems.append(close(f"{dt.name} sum", pa.sum(1).cast(dtypes.float64).numpy(), to_np(ta.sum(1).double()),
                          1e-6 if dt.is_float else 0, 0))
    problems.append(close(f"{dt.name} max", pa.max(0).cast(dtypes.float64).numpy(),
                          to_np(ta.amax(0).double()), 0, 0))
    assert pa.numpy().dtype == (np.float32 if dt is dtypes.bfloat16 else dt.np)
    check_all(problems)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dt", [dtypes.float16, dtypes.bfloat16], ids=lambda d: d.name)
def test_half_math(device, dt):
    """Transcendentals on half types run in float32 and round once, like torch on CPU."""
    rng = np.random.default_rng(7)
    x = rng.uniform(0.1, 3, (16,)).astype(np.float32)
    tx = torch.tensor(x).to(TORCH[dt])
    px = Tensor(x, device=device).cast(dt)
    names = ["exp", "log", "sqrt", "sin", "tanh", "sigmoid", "erf", "reciprocal"]
    got = stack([getattr(px, n)().float() for n in names]).numpy()
    problems = []
    for i, n in enumerate(names):
        want = to_np(getattr(tx, n)().float())
        # one rounding to half from slightly different float32 values may differ by one half-ulp
        problems.append(close(n, got[i], want, 2e-3 if dt is dtypes.float16 else 1.6e-2, 1e-4))
    # round-to-nearest-even on store: 1 + 2**-11 is a tie in float16, 1 + 2**-8 in bfloat16
    tie = 1 + (2 ** -11 if dt is dtypes.float16 else 2 ** -8)
    vals = np.array([tie, tie + 2 ** -20, 70000.0, 1e-8, -0.0], np.float32)
    got = Tensor(vals, device=device).cast(dt).float().numpy()
    problems.append(close("rounding", got, to_np(torch.tensor(vals).to(TORCH[dt]).float()), 0, 0))
    check_all(problems)


@pytest.mark.parametrize("device", DEVICES)
def test_64bit_end_to_end(device):
    big = [2 ** 40 + 3, -(2 ** 52) - 1, 2 ** 62]
    x = Tensor(big, device=device, dtype=dtypes.int64)
    assert (x + 2 ** 33).tolist() == [v + 2 ** 33 for v in big]
    assert (x * 2 - 1).tolist() == [v * 2 - 1 for v in big[:2]] + [(2 ** 63 - 1)]
    assert (x // 3).tolist() == [v // 3 for v in big]
    assert x.max().item() == 2 ** 62 and x.min().item() == -(2 ** 52) - 1
    u = Tensor(np.array([2 ** 63 + 5, 7], np.uint64), device=device)
    assert (u + 1).tolist() == [2 ** 63 + 6, 8]
    assert (u >> 60).tolist() == [8, 0]
    assert u.max().item() == 2 ** 63 + 5
    d = Tensor([1e-300, 1.0 + 2 ** -50, 1e300], device=device, dtype=dtypes.float64)
    np.testing.assert_array_equal((d * 1.0).numpy(), np.array([1e-300, 1.0 + 2 ** -50, 1e300]))
    assert (d - 1.0).numpy()[1] == 2 ** -50
    np.testing.assert_allclose(d.log().numpy(), np.log([1e-300, 1.0 + 2 ** -50, 1e300]), rtol=1e-15)
    assert x.cast(dtypes.float64).tolist() == [float(v) for v in big]
    assert Tensor([2 ** 40 + 0.5], device=device, dtype=dtypes.float64).cast(dtypes.int64).item() == 2 ** 40


@pytest.mark.parametrize("device", DEVICES)
def test_construction(device):
    for dt in ALL_DTYPES:
        arr = np.arange(6).reshape(2, 3).astype(np.float32 if dt is dtypes.bfloat16 else dt.np)
        t = Tensor(arr, device=device, dtype=dt) if dt is dtypes.bfloat16 else Tensor(arr, device=device)
        assert t.dtype is dt and t.shape == (2, 3)
        np.testing.assert_array_equal(t.numpy().astype(np.float64), arr.astype(np.float64))
    assert Tensor([True, False], device=device).dtype is dtypes.bool
    assert Tensor([1, 2], device=device).dtype is dtypes.int32
    assert Tensor([1, 2.5], device=device).dtype is dtypes.float32
    assert Tensor(3.5, device=device).shape == () and Tensor(3.5, device=device).item() == 3.5
    assert Tensor(b"\x01\xff", device=device).tolist() == [1, 255]
    assert Tensor(np.float64(2.0), device=device).dtype is dtypes.float64
    assert Tensor([[1, 2]], device=device, dtype="float16").dtype is dtypes.float16
    assert Tensor([], device=device).shape == (0,)
    with pytest.raises(ValueError, match="rectangular"):
        Tensor([[1, 2], [3]], device=device)


def test_dtype_namespace_and_promotion():
    assert dtypes.default_float is dtypes.float32 and dtypes.default_int is dtypes.int32
    assert dtypes.half is dtypes.float16 and dtypes.double is dtypes.float64 and dtypes.long is dtypes.int64
    assert to_dtype("bfloat16") is dtypes.bfloat16 and to_dtype(np.float16) is dtypes.float16
    for a, b in [(dtypes.int8, dtypes.uint8), (dtypes.int32, dtypes.float16), (dtypes.bool, dtypes.int8),
                 (dtypes.uint8, dtypes.int16), (dtypes.float16, dtypes.float32), (dtypes.int64, dtypes.float32),
                 (dtypes.bfloat16, dtypes.float32), (dtypes.int16, dtypes.int64)]:
        want = torch.promote_types(TORCH[a], TORCH[b])
        assert TORCH[least_upper_dtype(a, b)] == want, (a, b)
    # deliberate (docs/tensor-semantics.md): torch refuses to promote uint32; tinygrad's lattice gives int64
    assert least_upper_dtype(dtypes.uint32, dtypes.int32) is dtypes.int64
    assert (Tensor([1], dtype=dtypes.int8) + Tensor([1], dtype=dtypes.uint8)).dtype is dtypes.int16
    assert (Tensor([1]) + 1.5).dtype is dtypes.float32
    assert (Tensor([1.0], dtype=dtypes.float16) * 2).dtype is dtypes.float16
    assert (Tensor([True]) + 1).dtype is dtypes.int32
    assert Tensor([1]).float().dtype is dtypes.float32 and Tensor([1.0]).half().dtype is dtypes.float16
    assert Tensor([1.5]).int().dtype is dtypes.int32 and Tensor([1.5]).long().dtype is dtypes.int64
    assert Tensor([1.5]).bool().dtype is dtypes.bool and Tensor([1]).double().dtype is dtypes.float64
    assert Tensor([1.0], dtype=dtypes.float16).element_size() == 2
    with pytest.raises(DTypeError, match="unknown dtype"):
        to_dtype("float7")
    with pytest.raises(ValueError, match="multiple of 2"):
        Tensor([1.0]).bitcast(dtypes.int64)
    with pytest.raises(TypeError, match="at least 1 dim"):
        Tensor(1.0).bitcast(dtypes.uint8)


@pytest.mark.parametrize("device", DEVICES)
def test_bitcast(device):
    x = np.array([1.0, -2.5, math.inf], np.float32)
    t = Tensor(x, device=device)
    np.testing.assert_array_equal(t.bitcast(dtypes.uint32).numpy(), x.view(np.uint32))
    np.testing.assert_array_equal(t.bitcast(dtypes.int32).bitcast(dtypes.float32).numpy(), x)
    h = Tensor(x, device=device).half()
    np.testing.assert_array_equal(h.bitcast(dtypes.int16).numpy(), x.astype(np.float16).view(np.int16))
    bits = Tensor(np.array([0x3F80, 0xC020], np.uint16), device=device).bitcast(dtypes.bfloat16)
    assert bits.float().tolist() == [1.0, -2.5]
    # between item sizes the last axis grows or shrinks, like torch's view(dtype)
    m = np.array([[1.0, -2.5], [math.inf, 3.3]], np.float32)
    tm = torch.tensor(m)
    np.testing.assert_array_equal(Tensor(m, device=device).bitcast(dtypes.uint8).numpy(), tm.view(torch.uint8).numpy())
    np.testing.assert_array_equal(Tensor(m, device=device).bitcast(dtypes.float64).numpy(),
                                  tm.view(torch.float64).numpy())
    np.testing.assert_array_equal(Tensor(m, device=device).bitcast(dtypes.int16).numpy(), tm.view(torch.int16).numpy())
    raw = m.view(np.uint8)
    np.testing.assert_array_equal(Tensor(raw, device=device).bitcast(dtypes.float32).numpy(), m)
