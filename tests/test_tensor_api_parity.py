"""Tensor API parity (issue 10 items 1-4, 6, 7): signatures and return values as tinygrad's, the methods it
has that we lacked, the exception classes programs catch, numbers that were wrong, and Python protocols.
Everything is checked against torch (values, dtypes, exception classes) on every installed backend.
"""
from __future__ import annotations

import copy
import pickle
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from polygrad import Tensor, dtypes
from polygrad.errors import DimensionError, DTypeError, InvalidArgumentError, PolygradError, ShapeError
from test_tensor_nn_util import compare, rand

# ---------------------------------------------------------------------------------------------------
# 1. signatures and return values


def test_cummax_cummin_return_values_and_indices(device: str) -> None:
    x = np.array([[1.0, 3, 3, 2, np.nan, 5, np.nan], [4, 2, 2, 1, 0, 7, 7]], np.float32)
    for name in ("cummax", "cummin"):
        for dim in (0, 1):
            values, indices = getattr(Tensor(x, device=device), name)(dim)
            ref = getattr(torch.tensor(x), name)(dim)
            np.testing.assert_array_equal(values.numpy(), ref.values.numpy())
            np.testing.assert_array_equal(indices.numpy(), ref.indices.numpy())
            assert indices.dtype is dtypes.int32
    out = Tensor(np.array([2, 1, 1, 3], np.int32), device=device).cummin(0)
    assert out.values.tolist() == [2, 1, 1, 1] and out.indices.tolist() == [0, 1, 2, 2]
    compare(lambda t: t.cummax(1)[0], lambda t: t.cummax(1)[0], [rand(3, 5)], device)


def test_isinf_detect_flags(device: str) -> None:
    x = np.array([1.0, np.inf, -np.inf, np.nan], np.float32)
    t = Tensor(x, device=device)
    assert t.isinf().tolist() == torch.isinf(torch.tensor(x)).tolist()
    assert t.isinf(detect_negative=False).tolist() == torch.isposinf(torch.tensor(x)).tolist()
    assert t.isinf(detect_positive=False).tolist() == torch.isneginf(torch.tensor(x)).tolist()
    assert t.isinf(False, False).tolist() == [False] * 4


def test_sdpa_enable_gqa_and_mask_with_causal(device: str) -> None:
    compare(lambda q, k, v: q.scaled_dot_product_attention(k, v, enable_gqa=True, is_causal=True),
            lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True, is_causal=True),
            [rand(1, 4, 3, 8), rand(1, 2, 3, 8, seed=1), rand(1, 2, 3, 8, seed=2)], device, atol=1e-5)
    q = Tensor(rand(1, 2, 4), device=device)
    with pytest.raises(RuntimeError, match="not both"):
        q.scaled_dot_product_attention(q, q, attn_mask=Tensor.ones(2, 2, dtype=dtypes.bool), is_causal=True)
    with pytest.raises(RuntimeError):  # torch raises the same class
        t = torch.tensor(q.numpy())
        F.scaled_dot_product_attention(t, t, t, attn_mask=torch.ones(2, 2, dtype=torch.bool), is_causal=True)


@pytest.mark.parametrize("op", ["sum", "prod", "mean"])
def test_reductions_take_dtype_objects(op: str, device: str) -> None:
    x = np.array([[1, 2, 3], [4, 5, 6]], np.int32)
    for pg_dt, t_dt in ((dtypes.float64, torch.float64), (dtypes.int64, torch.int64), ("float32", torch.float32)):
        if op == "mean" and t_dt is torch.int64:
            continue  # torch refuses an integer mean
        got = getattr(Tensor(x, device=device), op)(1, dtype=pg_dt)
        want = getattr(torch.tensor(x), op)(1, dtype=t_dt)
        assert got.dtype.name == {torch.float64: "double", torch.int64: "long", torch.float32: "float"}[t_dt]
        np.testing.assert_allclose(got.numpy(), want.numpy())


def test_reshape_and_expand_keep_none(device: str) -> None:
    t = Tensor.ones(2, 3, device=device)
    assert t.reshape(None, 3, 1).shape == (2, 3, 1)
    assert t.reshape((None, -1)).shape == (2, 3)
    assert Tensor.ones(1, 3, device=device).expand(4, None).shape == (4, 3)
    with pytest.raises(ShapeError):
        t.reshape(2, 3, None)


def test_roll_and_clamp_arguments(device: str) -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = Tensor(x, device=device)
    assert t.roll((1, 2), (0, 1)).tolist() == torch.tensor(x).roll((1, 2), (0, 1)).tolist()
    for bad in (lambda m: m.roll((1, 2), 0), lambda m: m.clamp()):
        with pytest.raises(RuntimeError):
            bad(torch.tensor(x))
        with pytest.raises(RuntimeError):
            bad(t)
    assert t.clip(2).tolist() == torch.tensor(x).clip(2).tolist()
    assert t.clip(max=2).tolist() == torch.tensor(x).clip(max=2).tolist()
    assert t.clip(min_=1, max_=4).tolist() == torch.tensor(x).clip(1, 4).tolist()  # tinygrad's keywords


def test_dtype_helpers_match_torch() -> None:
    for name in ("int8", "uint8", "int16", "int32", "int64"):
        dt, info = getattr(dtypes, name), torch.iinfo(getattr(torch, name))
        assert (dtypes.min(dt), dtypes.max(dt), dt.min, dt.max) == (info.min, info.max, info.min, info.max)
    assert dtypes.max(dtypes.float32) == float("inf") and dtypes.min("float16") == -float("inf")
    assert dtypes.finfo(dtypes.float16) == (5, 10) and dtypes.finfo(dtypes.bfloat16) == (8, 7)
    assert dtypes.is_bool(dtypes.bool) and not dtypes.is_bool(dtypes.int8)
    assert dtypes.from_py(2**40) is dtypes.int64 and dtypes.from_py([1, 2.5]) is dtypes.float32
    assert dtypes.as_const(300, dtypes.uint8) == 44 and dtypes.float32.bitsize == 32
    assert set(dtypes.floats) == {dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64}
    assert dtypes.fields()["half"] is dtypes.float16


def test_default_dtypes_and_promotions(device: str) -> None:
    assert Tensor.arange(5, device=device).dtype is dtypes.int32 and Tensor.arange(5.0).dtype is dtypes.float32
    assert Tensor.full((2,), 7).dtype is dtypes.int32 and Tensor([1, 2]).dtype is dtypes.int32
    for exp in (0.5, 1.5):  # an int base to a float power promotes to float, as torch
        got = Tensor([1, 4], device=device) ** exp
        want = torch.tensor([1, 4], dtype=torch.int32) ** exp
        assert got.dtype is dtypes.float32 and want.dtype == torch.float32
        np.testing.assert_allclose(got.numpy(), want.numpy())
    assert (Tensor([1, 2]).pow(Tensor([0.5, 1.5]))).dtype is dtypes.float32
    _, idx = Tensor.ones(1, 1, 4, 4, device=device).max_pool2d(return_indices=True)
    assert idx.dtype is dtypes.int32  # tinygrad's (and polygrad's) index dtype; torch: int64


def test_large_python_ints_become_int64(device: str) -> None:
    assert Tensor(2**40).dtype is dtypes.int64 and Tensor(2**40, device=device).item() == 2**40
    assert Tensor([1, 2**40, -3], device=device).tolist() == [1, 2**40, -3]
    assert Tensor([1, 2**40]).dtype == dtypes.int64 and torch.tensor(2**40).dtype == torch.int64
    assert Tensor([-2**31, 2**31 - 1]).dtype is dtypes.int32
    assert Tensor.full((2,), 2**40, device=device).tolist() == [2**40] * 2
    with pytest.raises(InvalidArgumentError, match="int64"):
        Tensor(2**64)


def test_arange_past_int32(device: str) -> None:
    big = Tensor.arange(2**31 + 5, device=device)
    assert big.dtype is dtypes.int64 and torch.arange(2**31 + 4, 2**31 + 5).dtype == torch.int64
    assert big[-3:].tolist() == [2**31 + 2, 2**31 + 3, 2**31 + 4]  # lazy: only the slice is computed
    with pytest.raises(InvalidArgumentError, match="not representable"):
        Tensor.arange(2**31 + 5, dtype=dtypes.int32)


def test_tinygrad_signatures(device: str) -> None:
    """Positional orders and keywords of methods shared with tinygrad (tinygrad programs run unchanged)."""
    x = Tensor([[1.0, 2.0], [3.0, 4.0]], device=device)
    assert x.sub(1, True).tolist() == [[0.0, -1.0], [-2.0, -3.0]] and x.div(8, True).tolist()[0] == [8.0, 4.0]
    assert x.pow(2, True).tolist()[0] == [2.0, 4.0] and x.add(1, True).tolist()[0] == [2.0, 3.0]
    assert Tensor([7, -7], device=device).div(2, False, "trunc").tolist() == [3, -3]
    assert Tensor([1], device=device).lshift(3).tolist() == [8]
    assert x.pad((1, 1), "reflect").tolist()[0] == [2.0, 1.0, 2.0, 1.0]  # pad(padding, mode, value)
    assert x.pad((1, 0), "constant", 9.0).tolist()[0] == [9.0, 1.0, 2.0]
    assert x.matmul(x, True, dtypes.float64).dtype is dtypes.float64
    assert x.dot(x, dtype="float64").dtype is dtypes.float64
    swap = Tensor([[0.0, 1.0], [1.0, 0.0]], device=device)
    np.testing.assert_allclose(x.matmul(swap, reverse=True).numpy(), [[3, 4], [1, 2]])
    eye, ones = Tensor.eye(2, device=device), Tensor([1.0, 1.0], device=device)
    assert x.linear(eye, ones, dtype=dtypes.float64).dtype is dtypes.float64
    assert Tensor.arange(8, device=device).unfold(dim=0, size=2, step=3).tolist() == [[0, 1], [3, 4], [6, 7]]
    assert x.reshape(-1).topk(2, sorted_=True)[0].tolist() == [4.0, 3.0]
    compare(lambda a: a.selu(1.5, 2.0), lambda a: 2.0 * F.elu(a, 1.5), [rand(3, 4)], device)
    compare(lambda a: a.hardsigmoid(0.2, 0.4), lambda a: (0.2 * a + 0.4).clamp(0, 1), [rand(3, 4)], device)
    y = Tensor([1.0], device=device, requires_grad=True)
    assert (x * 2).sum().gradient(y)[0].tolist() == [0.0]
    with pytest.raises(RuntimeError, match="materialize_grads"):
        (x * 2).sum().gradient(y, materialize_grads=False)
    for bad in (lambda: Tensor.normal(2, std=-1.0), lambda: Tensor.uniform(2, low=1.0, high=0.0)):
        with pytest.raises(ValueError):
            bad()


# ---------------------------------------------------------------------------------------------------
# 2. methods that were missing


def test_masked_select_nonzero_normalize_match_torch(device: str) -> None:
    x = np.array([[0, 1, 2], [3, 0, 0]], np.float32)
    t, tt = Tensor(x, device=device), torch.tensor(x)
    assert t.nonzero().tolist() == tt.nonzero().tolist()
    assert [a.tolist() for a in t.nonzero(as_tuple=True)] == [a.tolist() for a in tt.nonzero(as_tuple=True)]
    assert t.nonzero(size=5).tolist() == torch.nonzero_static(tt, size=5).tolist()
    assert t.nonzero(size=2, fill_value=9).tolist() == torch.nonzero_static(tt, size=2, fill_value=9).tolist()
    assert t.masked_select(Tensor(x > 0, device=device)).tolist() == tt.masked_select(tt > 0).tolist()
    row = np.array([True, False, True])
    assert t.masked_select(Tensor(row, device=device)).tolist() == tt.masked_select(torch.tensor(row)).tolist()
    src = np.array([7.0, 8, 9, 10], np.float32)
    assert t.masked_scatter(Tensor(x == 0, device=device), Tensor(src, device=device)).tolist() == \
        tt.masked_scatter(tt == 0, torch.tensor(src)).tolist()
    for kw in (dict(), dict(p=1, dim=0), dict(p=3.0, dim=-1)):
        compare(lambda a: a.normalize(**kw), lambda a: F.normalize(a, **kw), [rand(3, 4)], device)


def test_masked_fill_variants(device: str) -> None:
    x, m = rand(2, 3), np.array([[True, False, True], [False, False, True]])
    compare(lambda a: a.masked_fill(Tensor(m, device=device), -1.5),
            lambda a: a.masked_fill(torch.tensor(m), -1.5), [x], device)
    compare(lambda a, v: a.masked_fill(Tensor(m, device=device), v), lambda a, v: torch.where(torch.tensor(m), v, a),
            [x, rand(2, 3, seed=4)], device)
    t = Tensor(x, device=device).contiguous().realize()
    alias = t
    t.masked_fill_(Tensor(m, device=device), 0.0)
    np.testing.assert_array_equal(alias.numpy(), np.where(m, 0.0, x))


def test_more_tinygrad_methods(device: str) -> None:
    x = np.arange(2 * 3 * 4 * 5).reshape(2, 3, 4, 5).astype(np.float32)
    t = Tensor(x, device=device)
    np.testing.assert_array_equal(t.rearrange("b c h w -> b (h w) c").numpy(),
                                  x.transpose(0, 2, 3, 1).reshape(2, 20, 3))
    np.testing.assert_array_equal(t.rearrange("b c (h2 h) w -> (b h2) h c w", h2=2).numpy(),
                                  x.reshape(2, 3, 2, 2, 5).transpose(0, 2, 3, 1, 4).reshape(4, 2, 3, 5))
    assert t.rearrange("... w -> w 1 ...").shape == (5, 1, 2, 3, 4)
    assert Tensor([7, -7], device=device).idiv(2).tolist() == torch.div(torch.tensor([7, -7]), 2,
                                                                         rounding_mode="trunc").tolist()
    assert t.pad_to(3, None, None, 6).shape == (3, 3, 4, 6) and t.shrink_to(1, None, 2, None).shape == (1, 3, 2, 5)
    assert t.sequential([lambda a: a * 2, lambda a: a + 1]).numpy()[0, 0, 0, 1] == 3
    assert t.short().dtype is dtypes.int16 and t.bfloat16().dtype is dtypes.bfloat16 and t.is_floating_point()
    u = Tensor.ones(2, device=device)
    assert u.replace(Tensor([3.0, 4.0], device=device)).tolist() == [3.0, 4.0]
    with pytest.raises(TypeError):
        del u[0]
    with Tensor.train():
        assert Tensor.training
    assert not Tensor.training


def test_newton_schulz_and_multinomial(device: str) -> None:
    a = rand(3, 5)
    g = a / np.linalg.norm(a)
    for _ in range(5):
        gram = g @ g.T
        g = 3.4445 * g - 4.7750 * gram @ g + 2.0315 * gram @ gram @ g
    np.testing.assert_allclose(Tensor(a, device=device).newton_schulz(5, (3.4445, -4.7750, 2.0315)).numpy(), g,
                               rtol=1e-4, atol=1e-5)
    Tensor.manual_seed(0)
    w = Tensor([1.0, 2.0, 3.0, 4.0], device=device)
    freq = np.bincount(w.multinomial(20000, replacement=True).numpy(), minlength=4) / 20000
    np.testing.assert_allclose(freq, [0.1, 0.2, 0.3, 0.4], atol=0.02)
    picks = w.multinomial(4).numpy()
    assert sorted(picks.tolist()) == [0, 1, 2, 3] and w.multinomial(2).dtype is dtypes.int32
    with pytest.raises(ValueError):
        w.multinomial(5)


def test_parity_script_lists_what_is_still_missing() -> None:
    """tests/tinygrad_parity.py compares our Tensor with tinygrad's committed name list, without tinygrad."""
    import tinygrad_parity
    assert tinygrad_parity.missing() == []
    proc = subprocess.run([sys.executable, "tests/tinygrad_parity.py"], capture_output=True, text=True)
    assert proc.stdout.split() == [] and proc.returncode == 0


# ---------------------------------------------------------------------------------------------------
# 3. exception classes


def test_error_classes_live_in_errors_module() -> None:
    from polygrad import errors
    from polygrad.dtype import DTypeError as DTypeErrorFromDtype
    from polygrad.uop.shape import ShapeError as ShapeErrorFromShape
    assert ShapeErrorFromShape is errors.ShapeError and DTypeErrorFromDtype is errors.DTypeError
    for cls in (ShapeError, DTypeError, InvalidArgumentError, DimensionError):
        assert issubclass(cls, PolygradError)
    assert issubclass(ShapeError, RuntimeError) and issubclass(ShapeError, ValueError)
    assert issubclass(DimensionError, IndexError) and issubclass(DimensionError, RuntimeError)


SHAPE_MISMATCH = {
    "broadcast": (lambda m: m.ones(2) + m.ones(3)),
    "matmul": (lambda m: m.ones(2, 3) @ m.ones(2, 3)),
    "reshape": (lambda m: m.ones(6).reshape(4, 2)),
    "expand": (lambda m: m.ones(2, 3).expand(4, 3)),
    "cat": (lambda m: m.cat([m.ones(2, 3), m.ones(2, 4)])),
    "stack": (lambda m: m.stack([m.ones(2), m.ones(3)])),
    "stack_ndim": (lambda m: m.stack([m.ones(2), m.ones(2, 1)])),
}


@pytest.mark.parametrize("name", list(SHAPE_MISMATCH))
def test_shape_mismatch_is_a_runtime_error(name: str) -> None:
    fn = SHAPE_MISMATCH[name]
    with pytest.raises(RuntimeError):
        fn(torch)
    with pytest.raises(ShapeError) as info:
        fn(Tensor)
    assert isinstance(info.value, RuntimeError)


BAD_DIMS = {
    "cumsum": (lambda m: m.ones(2).cumsum(3)),
    "cumprod": (lambda m: m.ones(2).cumprod(-3)),
    "squeeze": (lambda m: m.ones(2).squeeze(3)),
    "flip": (lambda m: m.ones(2, 2).flip(2)),
    "flip_repeated": (lambda m: m.ones(2, 2).flip(0, 0)),
    "transpose": (lambda m: m.ones(2, 2).transpose(0, 5)),
    # a 0-d tensor takes dim 0 or -1 only (issue 28 item 15)
    "cumsum_0d": (lambda m: m.ones(()).cumsum(1)),
    "cumprod_0d": (lambda m: m.ones(()).cumprod(-2)),
    "cummax_0d": (lambda m: m.ones(()).cummax(1)),
    "cummin_0d": (lambda m: m.ones(()).cummin(-2)),
    "squeeze_0d": (lambda m: m.ones(()).squeeze(1)),
}


@pytest.mark.parametrize("name", list(BAD_DIMS))
def test_bad_dims_raise_index_error(name: str) -> None:
    fn = BAD_DIMS[name]
    with pytest.raises((IndexError, RuntimeError)):
        fn(torch)
    with pytest.raises(IndexError) as info:
        fn(Tensor)
    assert isinstance(info.value, RuntimeError)  # torch raises RuntimeError for a repeated dim


BAD_ARGS = {
    "empty_stack": (lambda: torch.stack([]), lambda: Tensor.stack()),
    "empty_stack_list": (lambda: torch.stack([]), lambda: Tensor.stack([])),
    "one_hot_negative": (lambda: F.one_hot(torch.tensor([1]), -2), lambda: Tensor([1]).one_hot(-2)),
    "pad_odd_length": (lambda: F.pad(torch.ones(2, 2), (1, 1, 1)), lambda: Tensor.ones(2, 2).pad((1, 1, 1))),
    "pad_too_long": (lambda: F.pad(torch.ones(2), (1, 1, 1, 1)), lambda: Tensor.ones(2).pad((1, 1, 1, 1))),
    "pad_grouped_length": (None, lambda: Tensor.ones(2, 2).pad(((1, 1),))),
    "negative_shift": (None, lambda: Tensor([4]) << -1),
    "linspace_negative": (lambda: torch.linspace(0, 1, -2), lambda: Tensor.linspace(0, 1, -2)),
    "rounding_mode": (lambda: torch.tensor([1.0]).div(2, rounding_mode="x"),
                      lambda: Tensor([1.0]).div(2, rounding_mode="x")),
    "shrink_length": (None, lambda: Tensor.ones(2, 2).shrink(((0, 1),))),
    # issue 28 item 15: torch raises RuntimeError (NotImplementedError for linspace), tinygrad ValueError
    "one_hot_negative_class": (lambda: F.one_hot(torch.tensor([-1, 1]), 3), lambda: Tensor([-1, 1]).one_hot(3)),
    "one_hot_class_too_big": (lambda: F.one_hot(torch.tensor([3]), 3), lambda: Tensor([3]).one_hot(3)),
    "one_hot_infer_negative": (lambda: F.one_hot(torch.tensor([-1])), lambda: Tensor([-1]).one_hot(-1)),
    "one_hot_infer_empty": (lambda: F.one_hot(torch.tensor([], dtype=torch.long)),
                            lambda: Tensor([], dtype="int32").one_hot(-1)),
    "topk_k_too_big": (lambda: torch.ones(3).topk(4), lambda: Tensor.ones(3).topk(4)),
    "topk_negative_k": (lambda: torch.ones(3).topk(-1), lambda: Tensor.ones(3).topk(-1)),
    "linspace_bool": (lambda: torch.linspace(0, 1, 5, dtype=torch.bool),
                      lambda: Tensor.linspace(0, 1, 5, dtype="bool")),
    "pad_crops_everything": (lambda: F.pad(torch.ones(1, 1, 4), (-2, -2), mode="reflect"),
                             lambda: Tensor.ones(1, 1, 4).pad((-2, -2), mode="reflect")),
    "value_overflows_dtype": (lambda: torch.tensor([300], dtype=torch.uint8), lambda: Tensor([300], dtype="uint8")),
}


@pytest.mark.parametrize("name", list(BAD_ARGS))
def test_invalid_arguments_are_value_and_runtime_errors(name: str) -> None:
    ref, ours = BAD_ARGS[name]
    if ref is not None:
        with pytest.raises(RuntimeError):
            ref()
    with pytest.raises(ValueError) as info:
        ours()
    assert isinstance(info.value, RuntimeError) and isinstance(info.value, PolygradError)


# ---------------------------------------------------------------------------------------------------
# 4. numbers that were wrong


def test_gradients_at_extreme_inputs_match_torch(device: str) -> None:
    xs = np.array([-300.0, -299.5, -1.5, 1.0001, 1.5, 299.5, 300.0], np.float32)
    sig = np.concatenate([np.linspace(-300, 300, 121), [44.5, 45, 60, 88.5]]).astype(np.float32)
    cases = [(lambda t: t.acosh(), xs), (lambda t: t.exp() / (1 + t.exp()), sig), (lambda t: t.cosh(), sig),
             (lambda t: t.sinh(), sig), (lambda t: t.abs().rsqrt(), np.array([1e-30, -1e-30, 2.0], np.float32))]
    for fn, a in cases:
        x = Tensor(a, device=device, requires_grad=True)
        fn(x).sum().backward()
        t = torch.tensor(a, requires_grad=True)
        fn(t).sum().backward()
        got, want = x.grad.numpy(), t.grad.numpy()
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-6)


def test_atanh_gradient_at_one_is_infinite(device: str) -> None:
    x = Tensor(np.array([-1.0, 1.0, 0.5], np.float32), device=device, requires_grad=True)
    x.atanh().sum().backward()
    t = torch.tensor([-1.0, 1.0, 0.5], requires_grad=True)
    t.atanh().sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), t.grad.numpy())


def test_bilinear_interpolate_uint8_matches_torch_exactly(device: str) -> None:
    rng = np.random.default_rng(3)
    for h, w, oh, ow, corners in [(2, 2, 3, 3, False), (3, 3, 5, 4, False), (5, 7, 3, 9, True), (4, 1, 7, 2, False),
                                  (6, 6, 2, 2, False), (3, 5, 8, 8, True)]:
        x = rng.integers(0, 256, (2, 2, h, w)).astype(np.uint8)
        got = Tensor(x, device=device).interpolate((oh, ow), mode="bilinear", align_corners=corners)
        want = F.interpolate(torch.tensor(x), size=(oh, ow), mode="bilinear", align_corners=corners)
        assert got.dtype is dtypes.uint8
        np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_float32_sum_beyond_2_24_is_as_accurate_as_numpy() -> None:
    n = 2**24 + 2**23 + 3  # does not split into the scheduler's chunks
    assert Tensor.ones(n).sum().item() == np.ones(n, np.float32).sum() == float(np.float32(n))
    n = 2**24 + 3
    a = np.random.default_rng(0).standard_normal(n).astype(np.float32) + 1
    exact = a.astype(np.float64).sum()
    ulp = float(np.spacing(np.float32(exact)))
    assert abs(Tensor(a).sum().item() - exact) <= abs(float(a.sum()) - exact) + ulp
    rows = a[:3 * (n // 3)].reshape(3, -1)
    assert np.all(np.abs(Tensor(rows).sum(1).numpy() - rows.astype(np.float64).sum(1)) <= 2 * ulp)


def test_abs_of_signed_zero(device: str) -> None:
    x = np.array([-0.0, 0.0, -2.0], np.float32)
    got = Tensor(x, device=device).abs().numpy()
    want = torch.tensor(x).abs().numpy()
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
    assert not np.signbit(got).any()


# ---------------------------------------------------------------------------------------------------
# 6. out-of-range indices: see tests/test_gather_scatter.py
# 7. Python protocols


def test_iteration_and_format(device: str) -> None:
    with pytest.raises(TypeError):
        list(torch.tensor(3.0))
    with pytest.raises(TypeError, match="0-d"):
        list(Tensor(3.0, device=device))
    assert [r.tolist() for r in Tensor([[1, 2], [3, 4]], device=device)] == [[1, 2], [3, 4]]
    assert f"{Tensor(3.14159, device=device):.2f}" == f"{torch.tensor(3.14159):.2f}" == "3.14"
    assert f"{Tensor(7, device=device):>4d}" == "   7"
    with pytest.raises(TypeError):
        f"{Tensor([3.14159]):.2f}"  # as torch: a format spec needs a 0-d tensor


def test_numpy_protocols(device: str) -> None:
    t = Tensor([1.0, 2.5], device=device)
    np.testing.assert_array_equal(np.asarray(t), [1.0, 2.5])
    assert np.sum(t) == 3.5 and np.mean(t) == 1.75
    np.testing.assert_array_equal(np.concatenate([t, t]), [1.0, 2.5, 1.0, 2.5])


def test_deepcopy_and_pickle(device: str) -> None:
    t = Tensor([1.0, 2.0], device=device, requires_grad=True)
    t.grad = Tensor([0.5, 0.5], device=device)
    c = copy.deepcopy(t)
    assert c.tolist() == [1.0, 2.0] and c.requires_grad and c.grad.tolist() == [0.5, 0.5] and c.device == t.device
    c.assign(Tensor([9.0, 9.0], device=device)).realize()
    assert t.tolist() == [1.0, 2.0]  # the copy owns its buffer
    for dt in (dtypes.bfloat16, dtypes.int64, dtypes.bool):
        x = (Tensor([1.5, -2.0], device=device) * 3).cast(dt)  # lazy: realized for pickling
        y = pickle.loads(pickle.dumps(x))
        assert y.dtype is dt and y.tolist() == x.tolist()


def test_copying_a_buffer_is_a_clear_type_error_without_noise(run_python) -> None:
    proc = run_python("""
        import copy
        from polygrad import Tensor
        t = Tensor([1.0]).realize()
        try:
            copy.deepcopy(t.uop.arg)
        except TypeError as e:
            print("TypeError:", "pickle or deepcopy the Tensor" in str(e))
    """)
    assert proc.stdout.strip() == "TypeError: True" and proc.stderr == ""


def test_inplace_operators_write_into_the_tensor(device: str) -> None:
    a = Tensor([1.0, 2.0], device=device)
    alias = a
    a += 1
    a *= Tensor([2.0, 3.0], device=device)
    assert alias is a and alias.tolist() == [4.0, 9.0]
    i = Tensor([5, 6], device=device)
    i //= 2
    i <<= 1
    assert i.tolist() == [4, 6]
    with pytest.raises(DTypeError):
        i += 1.5  # torch refuses the float result too
    with pytest.raises(RuntimeError):
        t = torch.tensor([5, 6])
        t += 1.5


def test_inplace_on_requires_grad_follows_tinygrad(device: str) -> None:
    """tinygrad lets an in-place operator update a tensor that requires grad (torch refuses for leaves): the
    write itself is not differentiated, and later graphs differentiate with respect to the new value."""
    w = Tensor([1.0, 2.0], device=device, requires_grad=True)
    w -= 0.5
    (w * w).sum().backward()
    assert w.tolist() == [0.5, 1.5] and w.grad.tolist() == [1.0, 3.0]
    with pytest.raises(RuntimeError):
        tw = torch.tensor([1.0, 2.0], requires_grad=True)
        tw -= 0.5


# ---------------------------------------------------------------------------------------------------
# 8. tinygrad habits and constructor leftovers (issue 28 items 13 and 15)


def test_cummax_cummin_of_an_empty_axis(device: str) -> None:
    for shape, dim in (((0, 3), 0), ((3, 0), 1), ((0,), 0), ((2, 0, 3), 1)):
        for name in ("cummax", "cummin"):
            values, indices = getattr(Tensor.ones(*shape, device=device), name)(dim)
            ref = getattr(torch.ones(*shape), name)(dim)
            assert values.shape == tuple(ref.values.shape) and indices.shape == tuple(ref.indices.shape)
            assert values.numpy().shape == ref.values.shape and indices.dtype is dtypes.int32


def test_scans_and_squeeze_of_a_0d_tensor_take_dim_0_or_minus_1(device: str) -> None:
    x, t = Tensor(3.0, device=device), torch.tensor(3.0)
    for dim in (0, -1):
        assert x.cumsum(dim).item() == t.cumsum(dim).item() and x.squeeze(dim).item() == t.squeeze(dim).item()
        assert x.cummax(dim).indices.item() == t.cummax(dim).indices.item() == 0


@pytest.mark.parametrize("mode", ["reflect", "replicate", "circular"])
def test_negative_pads_crop_in_every_mode(mode: str, device: str) -> None:
    """torch crops for negative pads: reflect and replicate pad the whole dimension and crop after,
    circular wraps what is left after cropping."""
    cases = [(np.arange(40, dtype=np.float32).reshape(2, 2, 10), pads) for pads in
             ((-2, 3), (3, -2), (-2, -3), (-8, 5), (5, -8), (-9, 0), (-10, 0), (-3, 8), (7, -3))]
    cases += [(np.arange(60, dtype=np.float32).reshape(1, 2, 3, 10), pads) for pads in ((-1, 2, 1, -1), (2, -1, -1, 1))]
    for x, pads in cases:
        kept = [n + min(b, 0) + min(a, 0) for n, (b, a) in zip(x.shape[::-1], zip(pads[::2], pads[1::2]))]
        if mode == "circular" and any(max(b, a) > k for k, b, a in zip(kept, pads[::2], pads[1::2])):
            with pytest.raises(InvalidArgumentError, match="at most once"):  # torch reads out of bounds here
                Tensor(x, device=device).pad(pads, mode=mode)
            continue
        try:
            want = F.pad(torch.tensor(x), pads, mode=mode).numpy()
        except RuntimeError:  # more padding than the cropped dimension holds: torch refuses, and so do we
            with pytest.raises(RuntimeError):
                Tensor(x, device=device).pad(pads, mode=mode).realize()
            continue
        np.testing.assert_array_equal(Tensor(x, device=device).pad(pads, mode=mode).numpy(), want, err_msg=str(pads))
    compare(lambda a: a.pad((-1, 2, 1, -1), mode=mode), lambda a: F.pad(a, (-1, 2, 1, -1), mode=mode),
            [rand(1, 2, 3, 4)], device)


def test_masked_select_with_a_static_size(device: str) -> None:
    """size= gives exactly `size` elements without reading the mask on the host: the selected ones in
    row-major order, then fill_value (jax.numpy.extract(size=, fill_value=))."""
    x = np.arange(6, dtype=np.float32).reshape(2, 3) + 1
    row = np.array([True, False, True])
    picked = x[np.broadcast_to(row, x.shape)]
    t = Tensor(x, device=device)
    for size, fill in ((6, 0), (4, 0), (2, 0), (0, 0), (5, -9.5)):
        want = np.concatenate([picked, np.full(max(size - picked.size, 0), fill, np.float32)])[:size]
        got = t.masked_select(Tensor(row, device=device), size=size, fill_value=fill)
        assert got.dtype is dtypes.float32 and got.tolist() == want.tolist()
    ints = Tensor([1, 2, 3], device=device).masked_select(Tensor([True, False, True], device=device), size=3)
    assert ints.dtype is dtypes.int32 and ints.tolist() == [1, 3, 0]
    # differentiable: the gradient reaches exactly the selected elements (torch's masked_select gradient)
    compare(lambda a: a.masked_select(Tensor(row, device=device), size=4),
            lambda a: a.masked_select(torch.tensor(row)), [rand(2, 3)], device)
    with pytest.raises(TypeError):
        t.masked_select(Tensor([1, 0, 1], device=device), size=2)  # torch: RuntimeError; DTypeError is both
    with pytest.raises(RuntimeError):
        torch.tensor(x).masked_select(torch.tensor([1, 0, 1]))


def test_int_and_bool_powers_promote_as_torch(device: str) -> None:
    for base in ([1, 2, 3], [True, False]):
        for exp in (2, 2.0, 3, 3.0, 0, 0.0):
            got, want = Tensor(base, device=device) ** exp, torch.tensor(base) ** exp
            assert got.dtype.is_float == want.dtype.is_floating_point, (base, exp)
            assert got.tolist() == want.tolist(), (base, exp)


def test_sigmoid_gradient_at_extreme_inputs(device: str) -> None:
    a = np.array([-np.inf, -1e30, -1000, -300, -100, 0, 100, 300, 1000, 1e30, np.inf], np.float32)
    for dt in ("float32", "float16", "float64"):
        x = Tensor(a, device=device).cast(dt).requires_grad_(True)
        x.sigmoid().sum().backward()
        t = torch.tensor(a).to(getattr(torch, dt)).requires_grad_(True)
        t.sigmoid().sum().backward()
        got = x.grad.float().numpy()
        assert not np.isnan(got).any()
        np.testing.assert_allclose(got, t.grad.float().numpy(), atol=1e-30)


def test_double_ellipsis_is_named() -> None:
    t = Tensor.ones(2, 3)
    for index in ((..., ...), (..., 0, ...), (0, ..., ...), (Tensor([0]), ..., ...)):
        with pytest.raises(IndexError, match="single ellipsis"):
            t[index]
    assert t[..., 0].shape == (2,) and t[0, ...].shape == (3,)


def test_constructor_refuses_none_and_values_that_do_not_fit() -> None:
    """Tensor(None) built an empty tensor (tinygrad's habit); torch raises. A value outside the requested
    integer dtype raised NumPy's OverflowError (or wrapped, for a scalar); torch raises RuntimeError."""
    for ref in (lambda: torch.tensor(None), lambda: torch.Tensor(None)):
        with pytest.raises((TypeError, RuntimeError)):
            ref()
    for ours in (lambda: Tensor(None), lambda: Tensor([None, 1.0])):
        with pytest.raises(DTypeError, match="None") as info:
            ours()
        assert isinstance(info.value, TypeError) and isinstance(info.value, RuntimeError)
    cases = [([300], "uint8"), (300, "uint8"), ([1, 128], "int8"), ([2**31], "int32"), ([300.5], "uint8"),
             ([3e10], "int32"), (float("nan"), "int32")]
    for data, name in cases:
        with pytest.raises(RuntimeError):
            torch.tensor(data, dtype=getattr(torch, name))
        with pytest.raises(InvalidArgumentError, match="does not fit"):
            Tensor(data, dtype=name)
    assert Tensor([255, 0], dtype="uint8").tolist() == [255, 0] and Tensor(3.7, dtype="int32").item() == 3


OPERANDS = {
    "add": lambda x, v: x + v, "radd": lambda x, v: v + x, "sub": lambda x, v: x - v, "mul": lambda x, v: x * v,
    "div": lambda x, v: x / v, "pow": lambda x, v: x ** v, "lt": lambda x, v: x < v,
    "maximum": lambda x, v: x.maximum(v) if isinstance(x, Tensor) else torch.maximum(x, v),
    "masked_fill": lambda x, v: x.masked_fill(x > 0, v),
}


@pytest.mark.parametrize("op", list(OPERANDS))
def test_operands_that_are_not_numbers_raise_type_errors(op: str) -> None:
    fn = OPERANDS[op]
    for value in ("a", None):
        with pytest.raises(TypeError):
            fn(torch.tensor([1.0]), value)
        with pytest.raises(DTypeError, match="operand") as info:
            fn(Tensor([1.0]), value)
        assert isinstance(info.value, TypeError)


def test_contiguous_backward(device: str) -> None:
    """Identity forward (no kernel of its own); the gradient through it is realized in its own kernel."""
    from polygrad import GlobalCounters
    from polygrad.uop.ops import Ops
    a = rand(2, 3)
    x = Tensor(a, device=device).realize()
    plain, marked = (x * 2 + 1).sum(), (x.contiguous_backward() * 2 + 1).sum()
    counts = []
    for out in (plain, marked):
        GlobalCounters.reset()
        out.realize()
        counts.append(GlobalCounters.kernel_count)
    assert counts[0] == counts[1] and marked.item() == plain.item()
    for dt in (dtypes.float16, dtypes.int32, dtypes.bool):
        y = Tensor(a > 0, device=device).cast(dt)
        assert y.contiguous_backward().dtype is dt and y.contiguous_backward().tolist() == y.tolist()
    compare(lambda t: (t.contiguous_backward().reshape(3, 2).T * t.T.reshape(2, 3)).exp(),
            lambda t: (t.reshape(3, 2).T * t.T.reshape(2, 3)).exp(), [a], device)
    w = Tensor(a, device=device, requires_grad=True)
    grad, = (w.contiguous_backward() * 3).sum().gradient(w)
    assert any(n.op is Ops.CONTIGUOUS for n in grad.uop.toposort())
    plain_grad, = (w * 3).sum().gradient(w)
    assert not any(n.op is Ops.CONTIGUOUS for n in plain_grad.uop.toposort())
