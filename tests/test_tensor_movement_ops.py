"""Movement, joining, splitting and window ops (issue 3, part B) against PyTorch CPU, values and grads."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

from polygrad import Tensor
from polygrad.uop.shape import ShapeError
from test_tensor_nn_util import compare, rand


def _cat(lib_cat):
    return lambda *ts: lib_cat(list(ts), dim=1)


# name -> (polygrad fn, torch fn (None: same as polygrad), input shapes)
CASES = {
    "view": (lambda a: a.view(6, 4), None, [(2, 3, 4)]),
    "unflatten": (lambda a: a.unflatten(1, (2, -1)), None, [(3, 6)]),
    "unflatten_neg_dim": (lambda a: a.unflatten(-1, (3, 1, 2)), None, [(2, 6)]),
    "roll_one": (lambda a: a.roll(2, 1), None, [(3, 5)]),
    "roll_many": (lambda a: a.roll((1, -7), (0, -1)), None, [(3, 5)]),
    "roll_flat": (lambda a: a.roll(4), None, [(3, 5)]),
    "roll_empty": (lambda a: a.roll(1, 0), None, [(0, 3)]),
    "repeat": (lambda a: a.repeat(2, 1, 3), None, [(2, 3)]),
    "repeat_zero": (lambda a: a.repeat(0, 2), None, [(2, 3)]),
    "repeat_interleave": (lambda a: a.repeat_interleave(2, dim=1), None, [(2, 3)]),
    "repeat_interleave_flat": (lambda a: a.repeat_interleave(3), None, [(2, 3)]),
    "repeat_interleave_list": (lambda a: a.repeat_interleave(Tensor([1, 0, 2]), dim=1),
                               lambda a: a.repeat_interleave(torch.tensor([1, 0, 2]), dim=1), [(2, 3)]),
    "cat_dim1": (_cat(Tensor.cat), _cat(torch.cat), [(2, 3), (2, 1), (2, 4)]),
    "cat_method": (lambda a, b: a.cat(b, b, dim=0), lambda a, b: torch.cat([a, b, b], 0), [(1, 3), (2, 3)]),
    "cat_static_varargs": (lambda a, b: Tensor.cat(a, b, dim=-1), lambda a, b: torch.cat([a, b], -1),
                           [(2, 2), (2, 3)]),
    "cat_zero_size": (lambda a, b: Tensor.cat([a, b]), lambda a, b: torch.cat([a, b]), [(0, 3), (2, 3)]),
    "cat_legacy_empty": (lambda a, b: Tensor.cat([a, b]), lambda a, b: torch.cat([a, b]), [(0,), (2, 3)]),
    "stack": (lambda a, b: Tensor.stack([a, b], dim=1), lambda a, b: torch.stack([a, b], 1), [(2, 3), (2, 3)]),
    "stack_last": (lambda a, b: a.stack(b, dim=-1), lambda a, b: torch.stack([a, b], -1), [(2, 3), (2, 3)]),
    "stack_0d": (lambda a, b: Tensor.stack(a, b), lambda a, b: torch.stack([a, b]), [(), ()]),
    "split_int": (lambda a: a.split(2, 1)[1] * 2 + a.split(2, 1)[0], None, [(3, 4)]),
    "split_uneven": (lambda a: a.split(2, 1)[-1], None, [(3, 5)]),
    "split_list": (lambda a: a.split([1, 3, 0], 0)[1], None, [(4, 2)]),
    "chunk": (lambda a: a.chunk(3, 1)[2], None, [(2, 7)]),
    "unfold": (lambda a: a.unfold(1, 3, 1), None, [(2, 5)]),
    "unfold_step": (lambda a: a.unfold(0, 2, 3), None, [(8, 3)]),
    "unfold_size_step": (lambda a: a.unfold(-1, 2, 2), None, [(2, 3, 6)]),
    "unfold_size_zero": (lambda a: a.unfold(0, 0, 2), None, [(5,)]),
    "unfold_empty_batch": (lambda a: a.unfold(1, 2, 1), None, [(0, 3)]),
    "diag_vec_neg": (lambda a: a.diag(-1), None, [(4,)]),
    "diag_vec_offset": (lambda a: a.diag(2), None, [(3,)]),
    "diag_mat": (lambda a: a.diag(1), None, [(3, 4)]),
    "diagonal": (lambda a: a.diagonal(), None, [(4, 3)]),
    "diagonal_dims": (lambda a: a.diagonal(-1, 0, 2), None, [(3, 2, 4)]),
    "diagonal_empty": (lambda a: a.diagonal(5), None, [(3, 4)]),
    "tril": (lambda a: a.tril(), None, [(4, 5)]),
    "tril_offset_batch": (lambda a: a.tril(-1), None, [(2, 3, 4)]),
    "triu": (lambda a: a.triu(1), None, [(4, 3)]),
    "triu_empty": (lambda a: a.triu(), None, [(0, 3)]),
    "pad_reflect": (lambda a: a.pad((2, 1), mode="reflect"), lambda a: F.pad(a, (2, 1), mode="reflect"),
                    [(2, 4)]),
    "pad_reflect_2d": (lambda a: a.pad((1, 2, 2, 0), mode="reflect"),
                       lambda a: F.pad(a, (1, 2, 2, 0), mode="reflect"), [(1, 3, 4)]),
    "pad_replicate": (lambda a: a.pad((3, 1, 0, 2), mode="replicate"),
                      lambda a: F.pad(a, (3, 1, 0, 2), mode="replicate"), [(1, 2, 3)]),
    "pad_circular": (lambda a: a.pad((2, 3, 1, 1), mode="circular"),
                     lambda a: F.pad(a, (2, 3, 1, 1), mode="circular"), [(1, 2, 3, 4)]),
    "pad_constant_value": (lambda a: a.pad((1, 1), value=2.5), lambda a: F.pad(a, (1, 1), value=2.5), [(2, 2)]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_movement_matches_torch(name: str, device: str) -> None:
    fn, tfn, shapes = CASES[name]
    arrays = [rand(*s, seed=i) for i, s in enumerate(shapes)]
    compare(fn, tfn or fn, arrays, device)


def test_cat_promotes_dtypes_and_bool(device: str) -> None:
    a = Tensor([1, 2], device=device)
    b = Tensor([0.5], device=device)
    out = Tensor.cat(a, b)
    assert out.dtype.is_float
    assert out.tolist() == [1.0, 2.0, 0.5]
    m = Tensor.cat(Tensor([True, False], device=device), Tensor([True], device=device))
    assert m.tolist() == [True, False, True]


def test_split_and_chunk_shapes(device: str) -> None:
    x = Tensor(rand(5, 4), device=device)
    assert [p.shape for p in x.split(2)] == [(2, 4), (2, 4), (1, 4)]
    assert [p.shape for p in x.chunk(2, dim=1)] == [(5, 2), (5, 2)]
    assert [p.shape for p in Tensor.empty(0, 3, device=device).split(2)] == [(0, 3)]
    assert [tuple(p.shape) for p in torch.empty(6, 2).chunk(4)] == [p.shape for p in Tensor.empty(6, 2).chunk(4)]


def test_unfold_int_dtype(device: str) -> None:
    x = Tensor(np.arange(10, dtype=np.int32), device=device)
    np.testing.assert_array_equal(x.unfold(0, 4, 3).numpy(), torch.arange(10).unfold(0, 4, 3).numpy())


ERRORS = [
    (lambda: Tensor.cat(Tensor.ones(2, 3), Tensor.ones(3, 2)), ShapeError, "differ outside"),
    (lambda: Tensor.cat(Tensor(1.0), Tensor(2.0)), ShapeError, "zero-dimensional"),
    (lambda: Tensor.cat(Tensor.ones(2), [1, 2]), TypeError, "Tensor"),
    (lambda: Tensor.stack(Tensor.ones(2), Tensor.ones(3)), ShapeError, "same shape"),
    (lambda: Tensor.ones(2, 3).cat(Tensor.ones(2, 3), dim=2), IndexError, "out of range"),
    (lambda: Tensor.ones(4).split([1, 2]), ValueError, "sum to 4"),
    (lambda: Tensor.ones(4).split(0), ValueError, "positive"),
    (lambda: Tensor.ones(4).chunk(0), ValueError, "positive"),
    (lambda: Tensor.ones(4).unfold(0, 5, 1), ShapeError, "size 5"),
    (lambda: Tensor.ones(4).unfold(0, 2, 0), ValueError, "step"),
    (lambda: Tensor.ones(4).roll((1, 2), (0,)), ValueError, "same length"),
    (lambda: Tensor.ones(2, 3).repeat(2), ShapeError, "at least one per dimension"),
    (lambda: Tensor.ones(1, 3).pad((3, 0), mode="reflect"), ValueError, "smaller than"),
    (lambda: Tensor.ones(1, 3).pad((4, 0), mode="circular"), ValueError, "wrap"),
    (lambda: Tensor.ones(1, 3).pad((1, 0), mode="wrap"), ValueError, "pad mode"),
    (lambda: Tensor.ones(3).diagonal(), ShapeError, "at least 2"),
    (lambda: Tensor.ones(2, 2).diagonal(0, 1, 1), ValueError, "differ"),
    (lambda: Tensor.ones(3).tril(), ShapeError, "at least 2"),
    (lambda: Tensor.ones(2, 2, 2).diag(), ShapeError, "1-d or 2-d"),
    (lambda: Tensor.ones(6).unflatten(0, (4, -1)), ShapeError, "cannot split"),
    (lambda: Tensor.ones(6).unflatten(0, (2, 2)), ShapeError, "multiply"),
    (lambda: Tensor.ones(2).repeat_interleave(Tensor([1, 2, 3])), ValueError, "repeat counts"),
]


@pytest.mark.parametrize("i", range(len(ERRORS)))
def test_movement_errors(i: int) -> None:
    fn, exc, text = ERRORS[i]
    with pytest.raises(exc, match=text):
        fn()


# -------------------------------------------------------------------------------------------------
# property test: random chains of movement ops against NumPy

def _np_step(arr: np.ndarray, op: str, arg):
    if op == "reshape":
        return arr.reshape(arg)
    if op == "permute":
        return arr.transpose(arg)
    if op == "flip":
        return np.flip(arr, arg)
    if op == "roll":
        return np.roll(arr, arg[0], arg[1])
    if op == "repeat":
        return np.tile(arr, arg)
    if op == "cat":
        return np.concatenate([arr, arr[tuple(slice(0, 1) if i == arg else slice(None) for i in range(arr.ndim))]],
                              axis=arg)
    return np.pad(arr, arg, mode=op)


def _pg_step(t: Tensor, op: str, arg):
    if op == "reshape":
        return t.reshape(arg)
    if op == "permute":
        return t.permute(arg)
    if op == "flip":
        return t.flip(arg)
    if op == "roll":
        return t.roll(arg[0], arg[1])
    if op == "repeat":
        return t.repeat(arg)
    if op == "cat":
        return t.cat(t.shrink(tuple((0, 1) if i == arg else None for i in range(t.ndim))), dim=arg)
    return t.pad(arg, mode={"edge": "replicate", "wrap": "circular"}.get(op, op))


@st.composite
def _chain(draw):
    start = shape = tuple(draw(st.lists(st.integers(1, 3), min_size=1, max_size=3)))
    steps = []
    for _ in range(draw(st.integers(1, 4))):
        nd = len(shape)
        op = draw(st.sampled_from(["reshape", "permute", "flip", "roll", "repeat", "cat", "reflect", "edge",
                                   "wrap"]))
        if op == "reshape":
            arg = (int(np.prod(shape)),) if draw(st.booleans()) else tuple(reversed(shape))
        elif op == "permute":
            arg = tuple(draw(st.permutations(range(nd))))
        elif op in ("flip", "cat"):
            arg = draw(st.integers(0, nd - 1))
        elif op == "roll":
            arg = (draw(st.integers(-4, 4)), draw(st.integers(0, nd - 1)))
        elif op == "repeat":
            arg = tuple(draw(st.integers(1, 2)) for _ in range(nd))
        else:
            limit = (lambda s: s - 1) if op == "reflect" else (lambda s: s)
            arg = tuple((draw(st.integers(0, limit(s))), draw(st.integers(0, limit(s)))) for s in shape)
        steps.append((op, arg))
        shape = _np_step(np.zeros(shape), op, arg).shape
    return start, steps


@settings(max_examples=30, deadline=None)
@given(_chain())
def test_movement_chain_property_against_numpy(case) -> None:
    start, steps = case
    arr = np.arange(int(np.prod(start)), dtype=np.float32).reshape(start)
    t = Tensor(arr, device="INTERP")
    for op, arg in steps:
        arr = _np_step(arr, op, arg)
        t = _pg_step(t, op, arg)
    np.testing.assert_array_equal(t.numpy(), arr)


DTYPES = ["float16", "bfloat16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16",
          "uint32", "uint64", "bool"]


@pytest.mark.parametrize("dtype", DTYPES)
def test_movement_chain_every_dtype(dtype: str, device: str) -> None:
    """cat, roll, reflect pad, tril, repeat, advanced indexing and setitem keep every dtype exact."""
    base = np.arange(12).reshape(3, 4) % 5
    data = (base % 2).astype(bool) if dtype == "bool" else base
    t = Tensor(data, device=device, dtype=dtype)
    out = Tensor.cat(t, t.roll(1, 1), dim=0).pad((1, 1), mode="reflect").tril(1).repeat(1, 2)[[0, 5, 2], 1:]
    want = np.concatenate([data, np.roll(data, 1, 1)], 0)
    want = np.tril(np.pad(want, ((0, 0), (1, 1)), mode="reflect"), 1)
    want = np.tile(want, (1, 2))[[0, 5, 2], 1:]
    assert out.dtype == t.dtype
    np.testing.assert_array_equal(out.numpy().astype(want.dtype), want)
    s = Tensor(data, device=device, dtype=dtype).realize()
    s[[2, 0], 1] = s[0, 3]
    ref = data.copy()
    ref[[2, 0], 1] = data[0, 3]
    np.testing.assert_array_equal(s.numpy().astype(ref.dtype), ref)
