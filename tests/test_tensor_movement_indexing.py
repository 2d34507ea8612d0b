"""Advanced indexing, __setitem__, scatter/gather ops (issue 3, part B) against PyTorch and NumPy."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from polygrad import Tensor
from polygrad.uop.shape import ShapeError
from test_tensor_nn_util import compare, rand


def _both(index_fn):
    """The same indexing on both libraries, with index tensors built by each library."""
    return (lambda a: a[index_fn(lambda v: Tensor(v, device=a.device))],
            lambda a: a[index_fn(lambda v: torch.tensor(v))])


GETITEM = {
    "list_first": (lambda a: a[[0, 2]], None, (3, 4)),
    "list_second": (lambda a: a[:, [1, 0, 1]], None, (3, 4)),
    "list_repeated_negative": (lambda a: a[[-1, 0, -1]], None, (3, 4)),
    "two_lists": (lambda a: a[[0, 1], [1, 2]], None, (3, 4)),
    "broadcast_lists": (lambda a: a[[[0], [2]], [1, 3, 0]], None, (3, 4)),
    "ellipsis_list": (lambda a: a[..., [-1, 0]], None, (2, 3, 4)),
    "non_adjacent": (lambda a: a[[0, 1], :, [1, 2]], None, (2, 3, 4)),
    "none_between": (lambda a: a[:, [0, 1], None, [1, 2]], None, (2, 3, 4, 5)),
    "int_then_list": (lambda a: a[1, [0, 2]], None, (2, 3, 4)),
    "int_slice_list": (lambda a: a[0, :, [1, 2]], None, (2, 3, 4)),
    "list_int_list": (lambda a: a[:, [0, 1], 0, [1, 2]], None, (2, 3, 4, 5)),
    "slice_step_list": (lambda a: a[::2, [1]], None, (5, 3)),
    "slice_list_slice": (lambda a: a[1:, [2, 0], :2], None, (3, 4, 3)),
    "new_axis_list": (lambda a: a[None, [1, 0]], None, (2, 3)),
    "empty_list": (lambda a: a[[]], None, (3, 4)),
    "bool_list": (lambda a: a[[True, False, True]], None, (3, 2)),
    "bool_mask_2d": (lambda a: a[np.array([[True, False], [False, True], [True, True]])], None, (3, 2)),
    "tensor_index": _both(lambda mk: mk(np.array([2, 0, 1, 2]))) + ((3, 4),),
    "tensor_index_2d": _both(lambda mk: (slice(None), mk(np.array([[0, 3], [1, 1]])))) + ((2, 4),),
    "tensor_negative": _both(lambda mk: mk(np.array([-1, -3]))) + ((3, 2),),
    "tensor_0d": _both(lambda mk: (mk(np.array(1)), slice(None))) + ((3, 2),),
    "tensor_bool_mask": _both(lambda mk: mk(np.array([[True, False], [False, True]]))) + ((2, 2, 3),),
}


@pytest.mark.parametrize("name", list(GETITEM))
def test_getitem_matches_torch(name: str, device: str) -> None:
    fn, tfn, shape = GETITEM[name]
    compare(fn, tfn or fn, [rand(*shape)], device)


def test_getitem_int_and_bool_dtypes(device: str) -> None:
    x = np.arange(12, dtype=np.int32).reshape(3, 4)
    np.testing.assert_array_equal(Tensor(x, device=device)[[2, 0], 1:].numpy(), x[[2, 0], 1:])
    b = x % 3 == 0
    np.testing.assert_array_equal(Tensor(b, device=device)[:, [3, 0]].numpy(), b[:, [3, 0]])


INDEX_ERRORS = [
    (lambda x: x[[0, 3]], IndexError, "out of bounds"),
    (lambda x: x[:, [-5]], IndexError, "out of bounds"),
    (lambda x: x[Tensor([0.5])], IndexError, "integer or bool"),
    (lambda x: x[[0], [0], [0]], IndexError, "too many indices"),
    (lambda x: x[[0, 1], [0, 1, 2]], ShapeError, "broadcast"),
    (lambda x: x[..., [0], ...], IndexError, "single ellipsis"),
    (lambda x: x[["a"]], IndexError, "integers or bools"),
]


@pytest.mark.parametrize("i", range(len(INDEX_ERRORS)))
def test_getitem_errors(i: int) -> None:
    fn, exc, text = INDEX_ERRORS[i]
    with pytest.raises(exc, match=text):
        fn(Tensor(rand(3, 4)))


# -------------------------------------------------------------------------------------------------
# __setitem__
SETITEM = {
    "int": (lambda x: (1,), 5.0),
    "slice": (lambda x: (slice(1, 3),), np.arange(4, dtype=np.float32)),
    "negative_flip_slice": (lambda x: (slice(None, None, -1), 0), np.arange(3, dtype=np.float32)),
    "step_slice": (lambda x: (slice(None), slice(None, None, 2)), -1.0),
    "ellipsis_none": (lambda x: (Ellipsis, None, 2), np.array([[7.0], [8.0], [9.0]], dtype=np.float32)),
    "list": (lambda x: ([0, 2],), np.ones((2, 4), np.float32)),
    "list_duplicates": (lambda x: ([1, 1], [0, 3]), np.array([3.0, 4.0], np.float32)),
    "tensor": (lambda x: (x([2, 0]), slice(1, 3)), 2.0),
    "bool_mask": (lambda x: (np.array([True, False, True]),), 0.0),
    "leading_ones": (lambda x: (0,), np.ones((1, 4), np.float32)),
}


@pytest.mark.parametrize("name", list(SETITEM))
def test_setitem_matches_numpy(name: str, device: str) -> None:
    """NumPy is the reference here because PyTorch rejects negative slice steps."""
    make_index, value = SETITEM[name]
    data = rand(3, 4)
    ours = Tensor(data, device=device).realize()
    ref = data.copy()
    ours[make_index(lambda v: Tensor(v, device=device))] = value if np.isscalar(value) else Tensor(value, device=device)
    ref[make_index(np.array)] = value
    np.testing.assert_allclose(ours.numpy(), ref)


def test_setitem_value_reads_self(device: str) -> None:
    data = np.arange(6, dtype=np.float32)
    x = Tensor(data, device=device).realize()
    x[1:] = x[:-1]
    ref = data.copy()
    ref[1:] = data[:-1].copy()
    np.testing.assert_array_equal(x.numpy(), ref)
    x[[0, 2]] = x[[2, 0]] * 10
    ref[[0, 2]] = ref[[2, 0]] * 10
    np.testing.assert_array_equal(x.numpy(), ref)


def test_setitem_keeps_dtype_and_errors(device: str) -> None:
    x = Tensor(np.zeros((2, 3), np.int32), device=device).realize()
    x[:, 1] = 7.9
    assert x.numpy().tolist() == [[0, 7, 0], [0, 7, 0]]
    with pytest.raises(ShapeError, match="cannot fill"):
        x[0] = Tensor([1, 2], device=device)
    w = Tensor(rand(3), device=device, requires_grad=True)
    with pytest.raises(RuntimeError, match="requires grad"):
        w[0] = 1.0


# -------------------------------------------------------------------------------------------------
# gather / scatter family
IDX = np.array([[0, 2, 1], [2, 2, 0]], dtype=np.int64)
# scatter (replace) with duplicate targets: the last write wins here; PyTorch leaves the order undefined
# and its gradient sends to every duplicate, so these cases use distinct targets per row
UNIQUE = np.array([[0, 3, 1], [2, 1, 0]], dtype=np.int64)
SCATTER = {
    "gather": (lambda a: a.gather(1, Tensor(IDX, device=a.device)), lambda a: a.gather(1, torch.tensor(IDX)),
               [(2, 4)]),
    "take_along_axis": (lambda a: a.take_along_axis(Tensor(IDX[:1] - 2, device=a.device), 1),
                        lambda a: torch.take_along_dim(a, torch.tensor(IDX[:1] - 2) % 4, 1), [(3, 4)]),
    "take_along_axis_bcast": (lambda a: a.take_along_axis(Tensor(IDX.T[:, :1], device=a.device), 0),
                              lambda a: torch.take_along_dim(a, torch.tensor(IDX.T[:, :1]), 0), [(3, 2)]),
    "index_select": (lambda a: a.index_select(1, Tensor([3, 0, 0], device=a.device)),
                     lambda a: a.index_select(1, torch.tensor([3, 0, 0])), [(2, 4)]),
    "scatter": (lambda a, s: a.scatter(1, Tensor(UNIQUE, device=a.device), s),
                lambda a, s: a.scatter(1, torch.tensor(UNIQUE), s), [(3, 4), (2, 3)]),
    "scatter_dim0": (lambda a, s: a.scatter(0, Tensor(np.array([[0, 2], [2, 1]]), device=a.device), s),
                     lambda a, s: a.scatter(0, torch.tensor(np.array([[0, 2], [2, 1]])), s), [(3, 2), (2, 2)]),
    "scatter_value": (lambda a: a.scatter(1, Tensor(IDX, device=a.device), 1.5),
                      lambda a: a.scatter(1, torch.tensor(IDX), 1.5), [(2, 4)]),
    "scatter_add": (lambda a, s: a.scatter_add(1, Tensor(IDX, device=a.device), s),
                    lambda a, s: a.scatter_add(1, torch.tensor(IDX), s), [(2, 4), (2, 3)]),
    "scatter_reduce_add": (lambda a, s: a.scatter(1, Tensor(IDX, device=a.device), s, reduce="add"),
                           lambda a, s: a.scatter_add(1, torch.tensor(IDX), s), [(2, 4), (2, 3)]),
}
for _mode, _inc in (("sum", False), ("prod", True), ("mean", True), ("mean", False), ("amax", True),
                   ("amin", False)):
    SCATTER[f"scatter_reduce_{_mode}_{_inc}"] = (
        lambda a, s, m=_mode, i=_inc: a.scatter_reduce(1, Tensor(IDX, device=a.device), s, m, include_self=i),
        lambda a, s, m=_mode, i=_inc: a.scatter_reduce(1, torch.tensor(IDX), s, m, include_self=i),
        [(2, 4), (2, 3)])


@pytest.mark.parametrize("name", list(SCATTER))
def test_scatter_family_matches_torch(name: str, device: str) -> None:
    fn, tfn, shapes = SCATTER[name]
    # prod/amax gradients at ties differ by convention; keep values distinct and positive
    arrays = [np.abs(rand(*s, seed=i)) + 0.5 + i for i, s in enumerate(shapes)]
    compare(fn, tfn, arrays, device)


def test_scatter_duplicates_last_wins(device: str) -> None:
    out = Tensor.zeros(1, 3, device=device).scatter(1, Tensor([[2, 0, 2]], device=device),
                                                   Tensor([[1.0, 2.0, 3.0]], device=device))
    assert out.tolist() == [[2.0, 0.0, 3.0]]


def test_scatter_reduce_int_mean(device: str) -> None:
    base = np.array([[1, 2, 3, 4]], np.int64)
    src = np.array([[5, 6, 8]], np.int64)
    idx = np.array([[0, 0, 3]], np.int64)
    got = Tensor(base, device=device).scatter_reduce(1, Tensor(idx, device=device), Tensor(src, device=device),
                                                     "mean")
    want = torch.tensor(base).scatter_reduce(1, torch.tensor(idx), torch.tensor(src), "mean")
    np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_one_hot(device: str) -> None:
    y = np.array([[0, 2], [1, 1]])
    got = Tensor(y, device=device).one_hot(4).numpy()
    np.testing.assert_array_equal(got, torch.nn.functional.one_hot(torch.tensor(y), 4).numpy())
    assert Tensor(y, device=device).one_hot().shape == (2, 2, 3)


SCATTER_ERRORS = [
    (lambda x: x.scatter(1, Tensor([[0]]), Tensor([1.0])), ShapeError, "same"),
    (lambda x: x.scatter(1, Tensor([[0.0]]), Tensor([[1.0]])), TypeError, "integer"),
    (lambda x: x.scatter(1, Tensor([[0, 1, 2]]), Tensor([[1.0] * 2])), ShapeError, "must not exceed"),
    (lambda x: x.scatter(1, Tensor([[0], [1], [2]]), Tensor([[1.0]] * 3)), ShapeError, "must not exceed"),
    (lambda x: x.scatter(1, Tensor([[0]]), Tensor([[1.0]]), reduce="max"), ValueError, "add"),
    (lambda x: x.scatter_reduce(1, Tensor([[0]]), Tensor([[1.0]]), "max"), ValueError, "amax"),
    (lambda x: x.take_along_axis(Tensor([0]), 0), ShapeError, "same"),
]


@pytest.mark.parametrize("i", range(len(SCATTER_ERRORS)))
def test_scatter_errors(i: int) -> None:
    fn, exc, text = SCATTER_ERRORS[i]
    with pytest.raises(exc, match=text):
        fn(Tensor(rand(2, 4)))


# -------------------------------------------------------------------------------------------------
# property test: random mixes of slices, None, Ellipsis and integer lists against NumPy

@st.composite
def _index_case(draw):
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
    items, use_list = [], draw(st.booleans())
    list_len = draw(st.integers(1, 3))  # index lists must broadcast: this length or 1
    for size in shape:
        kind = draw(st.sampled_from(["slice", "list", "int", "none"] if use_list else ["slice", "int", "none"]))
        if kind == "int" and not use_list:
            items.append(draw(st.integers(-size, size - 1)))
        elif kind == "list" or (kind == "int" and use_list):
            n = draw(st.sampled_from([1, list_len]))
            items.append(draw(st.lists(st.integers(-size, size - 1), min_size=n, max_size=n)))
        elif kind == "none":
            items.extend([None, slice(None)])
        else:
            start = draw(st.none() | st.integers(-size - 1, size))
            stop = draw(st.none() | st.integers(-size - 1, size))
            step = draw(st.sampled_from([None, 1, 2, -1, -2]))
            items.append(slice(start, stop, step))
    if draw(st.booleans()) and len(items) > 1:
        items = items[:-1] + [Ellipsis]
    return shape, tuple(items)


@settings(max_examples=40, deadline=None)
@given(_index_case())
def test_indexing_property_against_numpy(case) -> None:
    shape, index = case
    data = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    np.testing.assert_array_equal(Tensor(data, device="INTERP")[index].numpy(), data[index])


def test_index_select_with_a_tensor_index_is_captured_in_a_model():
    """index_select(dim, tensor) reads the index's rank from its shape; it used to ask np.ndim(tensor), which
    reads the values back to Python and so failed inside Model capture (and realized the index eagerly)."""
    from polygrad import Model

    def pick(x, idx):
        return {"y": x.index_select(1, idx)}

    model = Model(pick, inputs={"x": Tensor.empty(3, 5), "idx": Tensor.empty(4, dtype="int32")})
    xn = np.arange(15, dtype=np.float32).reshape(3, 5)
    idx = np.array([4, 0, 2, 2], np.int32)
    np.testing.assert_array_equal(model.forward(x=xn, idx=idx)["y"].numpy(),
                                  torch.index_select(torch.tensor(xn), 1, torch.tensor(idx)).numpy())
    model.dispose()
