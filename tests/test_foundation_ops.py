"""Foundation ops (issue 2) against NumPy, on every usable backend (the `device` fixture).

Covers creation, elementwise math, reductions over any axes with keepdim, movement, matmul, gather
and the data-exchange methods. The exhaustive op suite lives in test_tensor_core_*.py.
"""
from __future__ import annotations

import numpy as np
import pytest

from polygrad import Tensor, dtypes

RNG = np.random.default_rng(0)
X34 = RNG.standard_normal((3, 4)).astype(np.float32)
X234 = RNG.standard_normal((2, 3, 4)).astype(np.float32)
POS34 = (RNG.random((3, 4)) + 0.1).astype(np.float32)


def close(got: np.ndarray, ref: np.ndarray, atol: float = 1e-5, rtol: float = 1e-5) -> None:
    got, ref = np.asarray(got), np.asarray(ref)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    np.testing.assert_allclose(got, ref, atol=atol, rtol=rtol)


# ---------------------------------------------------------------------------------------------------
# creation


def test_from_lists(device):
    t = Tensor([[1.0, 2.0], [3.0, 4.0]], device=device)
    assert t.shape == (2, 2) and t.dtype == dtypes.float32 and t.device == device
    assert t.tolist() == [[1.0, 2.0], [3.0, 4.0]]
    i = Tensor([1, 2, 3], device=device)
    assert i.dtype == dtypes.int32 and i.numpy().dtype == np.int32 and i.tolist() == [1, 2, 3]
    b = Tensor([True, False], device=device)
    assert b.dtype == dtypes.bool and b.tolist() == [True, False]
    mixed = Tensor([1, 2.5], device=device)
    assert mixed.dtype == dtypes.float32 and mixed.tolist() == [1.0, 2.5]
    empty = Tensor([], device=device)
    assert empty.shape == (0,) and empty.numpy().shape == (0,)


@pytest.mark.parametrize("npdt", [np.float32, np.float64, np.int32, np.int64, np.uint8, np.bool_, np.float16])
def test_from_numpy(device, npdt):
    arr = (RNG.standard_normal((2, 3)) * 10).astype(npdt)
    t = Tensor(arr, device=device)
    assert t.shape == (2, 3)
    out = t.numpy()
    assert out.dtype == arr.dtype
    np.testing.assert_array_equal(out, arr)


def test_from_scalars(device):
    f = Tensor(2.5, device=device)
    assert f.shape == () and f.dtype == dtypes.float32 and f.item() == 2.5
    i = Tensor(7, device=device)
    assert i.dtype == dtypes.int32 and i.item() == 7 and isinstance(i.item(), int)
    b = Tensor(True, device=device)
    assert b.dtype == dtypes.bool and b.item() is True
    assert Tensor(np.float32(1.5), device=device).item() == 1.5


def test_empty_zeros_ones_full(device):
    e = Tensor.empty(2, 3, device=device)
    assert e.shape == (2, 3) and e.dtype == dtypes.float32 and e.numpy().shape == (2, 3)
    assert Tensor.empty(4, dtype=dtypes.int32, device=device).numpy().dtype == np.int32
    close(Tensor.zeros(2, 3, device=device).numpy(), np.zeros((2, 3), np.float32))
    close(Tensor.ones((3,), device=device).numpy(), np.ones(3, np.float32))
    full = Tensor.full((2, 2), 7, device=device)
    assert full.dtype == dtypes.int32 and full.tolist() == [[7, 7], [7, 7]]
    full_f = Tensor.full((2,), 1.5, device=device)
    assert full_f.dtype == dtypes.float32 and full_f.tolist() == [1.5, 1.5]
    assert Tensor.zeros(2, dtype=dtypes.int32, device=device).numpy().dtype == np.int32


@pytest.mark.parametrize("args", [(5,), (2, 7), (1, 10, 3), (10, 0, -2), (0.0, 1.0, 0.25), (-3, 3)])
def test_arange(device, args):
    got = Tensor.arange(*args, device=device).numpy()
    ref = np.arange(*args)
    ref = ref.astype(np.float32 if ref.dtype.kind == "f" else np.int32)
    assert got.dtype == ref.dtype
    close(got, ref)


def test_arange_empty(device):
    assert Tensor.arange(0, device=device).numpy().shape == (0,)


def test_rand_range_and_seed(device):
    Tensor.manual_seed(123)
    a = Tensor.rand(64, 32, device=device).numpy()
    assert a.shape == (64, 32) and a.dtype == np.float32
    assert a.min() >= 0.0 and a.max() < 1.0
    assert 0.45 < a.mean() < 0.55 and len(np.unique(a)) > 1900
    Tensor.manual_seed(123)
    b = Tensor.rand(64, 32, device=device).numpy()
    np.testing.assert_array_equal(a, b)
    c = Tensor.rand(64, 32, device=device).numpy()  # the next call differs
    assert not np.array_equal(b, c)


def test_randn_moments(device):
    Tensor.manual_seed(7)
    z = Tensor.randn(100, 100, device=device).numpy()
    assert z.shape == (100, 100) and z.dtype == np.float32 and np.isfinite(z).all()
    assert abs(z.mean()) < 0.05 and abs(z.std() - 1.0) < 0.05
    Tensor.manual_seed(7)
    np.testing.assert_array_equal(Tensor.randn(100, 100, device=device).numpy(), z)


def test_rand_same_on_every_backend(devices):
    outs = []
    for dev in devices:
        Tensor.manual_seed(5)
        outs.append(Tensor.rand(100, device=dev).numpy())
    for other in outs[1:]:
        np.testing.assert_array_equal(outs[0], other)


# ---------------------------------------------------------------------------------------------------
# elementwise

UNARY = {
    "neg": (lambda t: -t, lambda a: -a, X34),
    "neg_method": (lambda t: t.neg(), lambda a: -a, X34),
    "exp": (lambda t: t.exp(), np.exp, X34),
    "log": (lambda t: t.log(), np.log, POS34),
    "sqrt": (lambda t: t.sqrt(), np.sqrt, POS34),
    "relu": (lambda t: t.relu(), lambda a: np.maximum(a, 0), X34),
    "sigmoid": (lambda t: t.sigmoid(), lambda a: 1 / (1 + np.exp(-a)), X34),
    "tanh": (lambda t: t.tanh(), np.tanh, X34),
}


@pytest.mark.parametrize("name", UNARY)
def test_unary(device, name):
    fn, ref, arr = UNARY[name]
    close(fn(Tensor(arr, device=device)).numpy(), ref(arr.astype(np.float64)).astype(np.float32), atol=1e-5)


def test_unary_edge_values(device):
    arr = np.array([0.0, 1.0, -30.0, 30.0, 80.0, -80.0], np.float32)
    t = Tensor(arr, device=device)
    close(t.exp().numpy(), np.exp(arr), rtol=1e-5)
    close(t.sigmoid().numpy(), 1 / (1 + np.exp(-arr.astype(np.float64))), atol=1e-6)
    close(t.tanh().numpy(), np.tanh(arr), atol=1e-6)
    assert Tensor([0.0], device=device).log().numpy()[0] == -np.inf
    assert np.isnan(Tensor([-1.0], device=device).sqrt().numpy()[0])


BINARY = {
    "add": (lambda a, b: a + b, np.add),
    "sub": (lambda a, b: a - b, np.subtract),
    "mul": (lambda a, b: a * b, np.multiply),
    "div": (lambda a, b: a / b, np.divide),
    "maximum": (lambda a, b: a.maximum(b) if isinstance(a, Tensor) else b.maximum(a), np.maximum),
}


@pytest.mark.parametrize("name", BINARY)
@pytest.mark.parametrize("shapes", [((3, 4), (4,)), ((3, 1), (1, 4)), ((2, 3, 4), (3, 1)), ((), (3,))])
def test_binary_broadcast(device, name, shapes):
    fn, ref = BINARY[name]
    a = RNG.standard_normal(shapes[0]).astype(np.float32)
    b = (RNG.random(shapes[1]) + 0.5).astype(np.float32)
    close(fn(Tensor(a, device=device), Tensor(b, device=device)).numpy(), ref(a, b), atol=1e-6)


@pytest.mark.parametrize("name", BINARY)
def test_binary_python_scalars(device, name):
    fn, ref = BINARY[name]
    t = Tensor(X34, device=device)
    close(fn(t, 2.5).numpy(), ref(X34, np.float32(2.5)), atol=1e-6)
    if name != "maximum":
        close(fn(2.5, t).numpy(), ref(np.float32(2.5), X34), atol=1e-5)


CMP = {"lt": (lambda a, b: a < b, np.less), "gt": (lambda a, b: a > b, np.greater),
       "le": (lambda a, b: a <= b, np.less_equal), "ge": (lambda a, b: a >= b, np.greater_equal),
       "eq": (lambda a, b: a == b, np.equal), "ne": (lambda a, b: a != b, np.not_equal)}


@pytest.mark.parametrize("name", CMP)
def test_comparisons(device, name):
    fn, ref = CMP[name]
    a = np.array([[1, 2, 3], [4, 5, 6]], np.float32)
    b = np.array([3, 2, 1], np.float32)
    out = fn(Tensor(a, device=device), Tensor(b, device=device))
    assert out.dtype == dtypes.bool
    np.testing.assert_array_equal(out.numpy(), ref(a, b))
    np.testing.assert_array_equal(fn(Tensor(a, device=device), 3).numpy(), ref(a, 3))
    ai = a.astype(np.int32)
    np.testing.assert_array_equal(fn(Tensor(ai, device=device), 2.5).numpy(), ref(ai, 2.5))


def test_where(device):
    cond = X34 > 0
    close(Tensor(cond, device=device).where(Tensor(X34, device=device), -1.0).numpy(), np.where(cond, X34, -1.0))
    close(Tensor(cond, device=device).where(1.0, Tensor(X34, device=device)).numpy(), np.where(cond, 1.0, X34))
    # broadcast condition and branches; a float condition means "nonzero"
    c = np.array([1.0, 0.0, 2.0, 0.0], np.float32)
    close(Tensor(c, device=device).where(Tensor(X34, device=device), Tensor([[9.0]], device=device)).numpy(),
          np.where(c != 0, X34, 9.0))


CASTS = [(np.float32, np.int32), (np.float32, np.bool_), (np.int32, np.float32), (np.bool_, np.float32),
         (np.int32, np.bool_), (np.float32, np.float16), (np.int32, np.int64), (np.float32, np.uint8)]


@pytest.mark.parametrize("src,dst", CASTS)
def test_cast(device, src, dst):
    base = np.array([-2.7, -1.0, 0.0, 0.4, 1.0, 3.9, 200.6], np.float64)
    if dst == np.uint8:
        base = np.abs(base)
    arr = base.astype(src)
    out = Tensor(arr, device=device).cast(dst).numpy()
    assert out.dtype == np.dtype(dst)
    np.testing.assert_array_equal(out, arr.astype(dst))


# ---------------------------------------------------------------------------------------------------
# dtype promotion and broadcasting rules (PyTorch/tinygrad)

PROMO_DTYPES = [np.bool_, np.int8, np.uint8, np.int16, np.int32, np.int64, np.float16, np.float32, np.float64]


@pytest.mark.parametrize("a", PROMO_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("b", PROMO_DTYPES, ids=lambda d: np.dtype(d).name)
def test_promotion_matches_torch(a, b):
    torch = pytest.importorskip("torch")
    tt = {np.dtype(k): v for k, v in [(np.bool_, torch.bool), (np.int8, torch.int8), (np.uint8, torch.uint8),
                                      (np.int16, torch.int16), (np.int32, torch.int32), (np.int64, torch.int64),
                                      (np.float16, torch.float16), (np.float32, torch.float32),
                                      (np.float64, torch.float64)]}
    want = torch.result_type(torch.zeros(1, dtype=tt[np.dtype(a)]), torch.zeros(1, dtype=tt[np.dtype(b)]))
    got = (Tensor(np.zeros(2, a), device="INTERP") + Tensor(np.zeros(2, b), device="INTERP")).dtype
    assert tt[got.np] == want


def test_python_scalar_promotion(device):
    i = Tensor([1, 2, 3], device=device)
    f = Tensor([1.0, 2.0], device=device)
    b = Tensor([True, False], device=device)
    h = Tensor(np.array([1, 2], np.float16), device=device)
    i8 = Tensor(np.array([1, 2], np.int8), device=device)
    assert (i + 2).dtype == dtypes.int32 and (i + 2).tolist() == [3, 4, 5]
    assert (i + 2.5).dtype == dtypes.float32 and (i + 2.5).tolist() == [3.5, 4.5, 5.5]
    assert (2.5 * i).dtype == dtypes.float32
    assert (f + 1).dtype == dtypes.float32 and (f + True).tolist() == [2.0, 3.0]
    assert (b + 1).dtype == dtypes.int32 and (b + 1).tolist() == [2, 1]
    assert (b + 1.5).dtype == dtypes.float32
    assert (h + 2.5).dtype == dtypes.float16 and (i8 * 3).dtype == dtypes.int8
    assert (i / 2).dtype == dtypes.float32 and (i / 2).tolist() == [0.5, 1.0, 1.5]
    assert (i[:2] + b.cast(dtypes.int32)).dtype == dtypes.int32


def test_tensor_mixed_dtypes(device):
    i = Tensor([1, 2, 3], device=device)
    f = Tensor([0.5, 0.5, 0.5], device=device)
    b = Tensor([True, False, True], device=device)
    assert (i + f).dtype == dtypes.float32 and (i + f).tolist() == [1.5, 2.5, 3.5]
    assert (b + i).dtype == dtypes.int32 and (b + i).tolist() == [2, 2, 4]
    assert (b * f).dtype == dtypes.float32 and (b * f).tolist() == [0.5, 0.0, 0.5]


def test_broadcast_error_is_typed(device):
    with pytest.raises(ValueError, match="broadcast"):
        Tensor.ones(3, 4, device=device) + Tensor.ones(3, device=device)


# ---------------------------------------------------------------------------------------------------
# reductions

AXES = [None, 0, 1, -1, (0, 2), (1, 2)]


def _np_axis(axis):
    return axis if axis is None or isinstance(axis, int) else tuple(axis)


@pytest.mark.parametrize("op", ["sum", "max", "mean"])
@pytest.mark.parametrize("axis", AXES, ids=str)
@pytest.mark.parametrize("keepdim", [False, True])
def test_reduce(device, op, axis, keepdim):
    got = getattr(Tensor(X234, device=device), op)(axis, keepdim=keepdim).numpy()
    ref = getattr(np, {"sum": "sum", "max": "max", "mean": "mean"}[op])(X234, axis=_np_axis(axis),
                                                                        keepdims=keepdim)
    close(got, ref.astype(np.float32), atol=1e-5)


def test_reduce_int_and_bool(device):
    ai = np.arange(12, dtype=np.int32).reshape(3, 4) - 5
    t = Tensor(ai, device=device)
    assert t.sum().dtype == dtypes.int32 and t.sum().item() == ai.sum()
    np.testing.assert_array_equal(t.max(1).numpy(), ai.max(1))
    assert t.mean().dtype == dtypes.float32 and abs(t.mean().item() - ai.mean()) < 1e-6
    b = Tensor(ai > 0, device=device)
    assert b.sum().dtype == dtypes.int32 and b.sum().item() == (ai > 0).sum()


@pytest.mark.parametrize("fn", ["softmax", "log_softmax"])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_softmax(device, fn, axis):
    x = X234 * 4
    m = x - x.max(axis=axis, keepdims=True)
    log_sm = m - np.log(np.exp(m).sum(axis=axis, keepdims=True))
    ref = np.exp(log_sm) if fn == "softmax" else log_sm
    close(getattr(Tensor(x, device=device), fn)(axis).numpy(), ref, atol=1e-5)


def test_softmax_large_values_are_stable(device):
    x = np.array([[1000.0, 1001.0, 1002.0]], np.float32)
    out = Tensor(x, device=device).softmax(-1).numpy()
    e = np.exp(x - x.max())
    close(out, e / e.sum(), atol=1e-6)


# ---------------------------------------------------------------------------------------------------
# movement

MOVEMENT = {
    "reshape": (lambda t: t.reshape(4, 6), lambda a: a.reshape(4, 6)),
    "reshape_neg": (lambda t: t.reshape(-1, 3), lambda a: a.reshape(-1, 3)),
    "permute": (lambda t: t.permute(2, 0, 1), lambda a: a.transpose(2, 0, 1)),
    "expand": (lambda t: t[:, :1].expand(2, 5, 4), lambda a: np.broadcast_to(a[:, :1], (2, 5, 4))),
    "expand_new_dim": (lambda t: t.expand(3, 2, 3, 4), lambda a: np.broadcast_to(a, (3, 2, 3, 4))),
    "pad": (lambda t: t.pad(((0, 1), (2, 0), (1, 1))), lambda a: np.pad(a, ((0, 1), (2, 0), (1, 1)))),
    "pad_value": (lambda t: t.pad(((1, 0), (0, 0), (0, 2)), value=-3.0),
                  lambda a: np.pad(a, ((1, 0), (0, 0), (0, 2)), constant_values=-3.0)),
    "shrink": (lambda t: t.shrink(((1, 2), (0, 2), (1, 4))), lambda a: a[1:2, 0:2, 1:4]),
    "flip0": (lambda t: t.flip(0), lambda a: a[::-1]),
    "flip_multi": (lambda t: t.flip(1, 2), lambda a: a[:, ::-1, ::-1]),
    "transpose": (lambda t: t.transpose(0, 2), lambda a: a.swapaxes(0, 2)),
    "transpose_default": (lambda t: t.reshape(6, 4).transpose(), lambda a: a.reshape(6, 4).T),
    "squeeze": (lambda t: t[:, :1].squeeze(1), lambda a: a[:, :1].squeeze(1)),
    "squeeze_all": (lambda t: t[:1, :, :1].squeeze(), lambda a: a[:1, :, :1].squeeze()),
    "unsqueeze": (lambda t: t.unsqueeze(1), lambda a: a[:, None]),
    "unsqueeze_neg": (lambda t: t.unsqueeze(-1), lambda a: a[..., None]),
    "flatten": (lambda t: t.flatten(), lambda a: a.reshape(-1)),
    "flatten_range": (lambda t: t.flatten(1), lambda a: a.reshape(2, -1)),
    "chain": (lambda t: t.permute(1, 2, 0).flip(0).pad(((1, 0), (0, 0), (0, 1))).reshape(4, -1)[1:],
              lambda a: np.pad(a.transpose(1, 2, 0)[::-1], ((1, 0), (0, 0), (0, 1))).reshape(4, -1)[1:]),
}


@pytest.mark.parametrize("name", MOVEMENT)
def test_movement(device, name):
    fn, ref = MOVEMENT[name]
    close(fn(Tensor(X234, device=device)).numpy(), ref(X234))


def test_movement_then_math(device):
    t = Tensor(X234, device=device)
    got = (t.permute(2, 0, 1) * t.flip(0).permute(2, 0, 1) + 1).sum(1)
    close(got.numpy(), (X234.transpose(2, 0, 1) * X234[::-1].transpose(2, 0, 1) + 1).sum(1), atol=1e-5)


def test_movement_errors(device):
    t = Tensor(X234, device=device)
    with pytest.raises(ValueError):
        t.reshape(5, 5)
    with pytest.raises(IndexError):
        t.permute(0, 1, 3)
    with pytest.raises(IndexError):
        t.sum(axis=3)


# ---------------------------------------------------------------------------------------------------
# matmul and gather


@pytest.mark.parametrize("sa,sb", [((3, 4), (4, 5)), ((4,), (4, 2)), ((3, 4), (4,)), ((4,), (4,)),
                                   ((2, 3, 4), (4, 5)), ((2, 3, 4), (2, 4, 2)), ((1, 3, 4), (2, 4, 5))])
def test_matmul(device, sa, sb):
    a = RNG.standard_normal(sa).astype(np.float32)
    b = RNG.standard_normal(sb).astype(np.float32)
    out = Tensor(a, device=device) @ Tensor(b, device=device)
    close(out.numpy(), a @ b, atol=1e-5)
    close(Tensor(a, device=device).matmul(Tensor(b, device=device)).numpy(), a @ b, atol=1e-5)


def test_matmul_int_and_shape_error(device):
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    out = Tensor(a, device=device) @ Tensor(a.T.copy(), device=device)
    assert out.dtype == dtypes.int32
    np.testing.assert_array_equal(out.numpy(), a @ a.T)
    with pytest.raises(ValueError):
        Tensor(a, device=device) @ Tensor(a, device=device)


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_gather(device, dim):
    idx = RNG.integers(0, X34.shape[dim], size=(2, 3)).astype(np.int32)
    got = Tensor(X34, device=device).gather(dim, Tensor(idx, device=device)).numpy()
    ref = np.take_along_axis(X34[:, :3] if dim == 0 else X34[:2], idx, axis=dim)
    close(got, ref)


# ---------------------------------------------------------------------------------------------------
# realize and data exchange


def test_realize_numpy_item_tolist(device):
    t = (Tensor(X34, device=device) * 2)
    assert t.realize() is t
    arr = t.numpy()
    assert isinstance(arr, np.ndarray) and arr.dtype == np.float32
    close(arr, X34 * 2)
    assert t.tolist() == (X34 * 2).tolist()
    s = Tensor(X34, device=device).sum()
    assert isinstance(s.item(), float) and abs(s.item() - X34.sum()) < 1e-4
    with pytest.raises(ValueError):
        t.item()


def test_shape_dtype_device(device):
    t = Tensor.ones(2, 3, dtype=dtypes.int32, device=device.lower())
    assert t.shape == (2, 3) and t.ndim == 2 and t.numel() == 6
    assert t.dtype == dtypes.int32 and t.device == device
    assert (t + 1.5).dtype == dtypes.float32 and (t + 1.5).shape == (2, 3)


def test_to_device(devices):
    for src in devices:
        for dst in devices:
            x = Tensor(X34, device=src)
            y = (x * 2).to(dst)
            assert y.device == dst
            close((y + 1).numpy(), X34 * 2 + 1)
            assert x.to(src) is x


def test_large_shapes_split_across_threads(device):
    """Big enough that the CPU backend splits the outer loop over cores; odd sizes leave ragged chunks."""
    a = RNG.standard_normal((257, 1031)).astype(np.float32)
    t = Tensor(a, device=device)
    close(((t * 2 + 1).relu() * t).numpy(), np.maximum(a * 2 + 1, 0) * a, atol=1e-5)
    close(t.sum(1).numpy(), a.sum(1), atol=1e-3, rtol=1e-4)
    close(t.max(0).numpy(), a.max(0))
    close(t.softmax(-1).numpy(), np.exp(a - a.max(-1, keepdims=True)) /
          np.exp(a - a.max(-1, keepdims=True)).sum(-1, keepdims=True), atol=1e-6)
    b = RNG.standard_normal((1031, 67)).astype(np.float32)
    close((t @ Tensor(b, device=device)).numpy(), a @ b, atol=1e-3, rtol=1e-4)
    big = RNG.standard_normal(1 << 19).astype(np.float32)
    assert abs(Tensor(big, device=device).sum().item() - big.astype(np.float64).sum()) < 0.05
