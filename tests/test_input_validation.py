"""Bad shapes and host inputs get a typed error, and host data keeps its type (issue 11).

reshape(-3, -4) was accepted (its sizes multiply to 12) and reshape(-2, -6) reached the C compiler;
a memoryview of float32 data was read as bytes; Tensor([1, None]) silently held a NaN.
"""
from __future__ import annotations

import numpy as np
import pytest

from polygrad import Tensor, dtypes
from polygrad.uop.shape import ShapeError


@pytest.mark.parametrize("shape", [(-3, -4), (-2, -6), (-1, -1), (12, -2), (-12,), (2, -1, -6)])
def test_reshape_allows_one_minus_one_and_no_other_negative(shape):
    x = Tensor.ones(12)
    with pytest.raises(ShapeError):
        x.reshape(*shape)
    assert x.reshape(3, -1).shape == (3, 4) and x.reshape(-1).shape == (12,)
    assert x.reshape(-1, 2, 3).numpy().sum() == 12.0


def test_expand_rejects_negative_sizes_other_than_minus_one():
    x = Tensor.ones(1, 3)
    with pytest.raises(ShapeError):
        x.expand(-2, 3)
    assert x.expand(4, -1).shape == (4, 3)


@pytest.mark.parametrize("npdt", [np.float32, np.float64, np.int16, np.int64, np.uint8, np.bool_])
def test_memoryview_keeps_its_format_and_shape(npdt):
    arr = (np.arange(6) % 3).astype(npdt).reshape(2, 3)
    t = Tensor(memoryview(arr))
    assert t.dtype.np == np.dtype(npdt) and t.shape == (2, 3)
    np.testing.assert_array_equal(t.numpy(), arr)
    assert Tensor(memoryview(arr), dtype=dtypes.float32).numpy().dtype == np.float32


def test_bytes_stay_uint8():
    assert Tensor(b"\x01\x02").dtype is dtypes.uint8 and Tensor(bytearray(b"\x03")).tolist() == [3]
    assert Tensor(memoryview(b"\x01\x02")).tolist() == [1, 2]


@pytest.mark.parametrize("data", [[1, None], [[1.0, 2.0], [None, 3.0]], [None], [True, None]])
def test_none_in_a_list_raises(data):
    with pytest.raises(TypeError, match="None"):
        Tensor(data)
    with pytest.raises(TypeError, match="None"):
        Tensor(data, dtype=dtypes.float32)


def test_nan_is_still_a_number():
    assert np.isnan(Tensor([1.0, float("nan")]).numpy()[1])
