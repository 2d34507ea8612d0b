"""Kernels whose sizes or offsets exceed int32 use 64-bit index arithmetic; all others keep int32."""
import numpy as np
import pytest

from polygrad import Tensor
from polygrad.dtype import dtypes
from polygrad.engine.programs import get_program
from polygrad.schedule.template import schedule
from polygrad.uop.ops import Ops
from tests.conftest import DEVICES

BIG = 2**31 + 8


def _range_dtypes(t: Tensor) -> set:
    tpl, _ = schedule([t.uop], [])
    out = set()
    for step in tpl.steps:
        if step.kind == "kernel":
            out |= {n.dtype for n in step.ast.toposort() if n.op is Ops.RANGE}
    return out


@pytest.mark.parametrize("device", DEVICES)
def test_lazy_arange_tail_past_int32(device):
    got = Tensor.arange(2**33, dtype="int64", device=device)[-3:].numpy()
    np.testing.assert_array_equal(got, [2**33 - 3, 2**33 - 2, 2**33 - 1])


@pytest.mark.parametrize("device", DEVICES)
def test_reshape_and_permute_offsets_past_int32(device):
    x = Tensor.arange(BIG, dtype="int64", device=device).reshape(2, BIG // 2)[:, -2:]
    np.testing.assert_array_equal(x.numpy(), [[BIG // 2 - 2, BIG // 2 - 1], [BIG - 2, BIG - 1]])
    y = Tensor.arange(BIG, dtype="int64", device=device).reshape(BIG // 2, 2).permute(1, 0)[:, -2:]
    np.testing.assert_array_equal(y.numpy(), [[BIG - 4, BIG - 2], [BIG - 3, BIG - 1]])


def test_reduction_over_more_than_int32_elements():
    # int32 sums wrap (two's complement), float64 is exact here: neither was 0 as with a wrapped loop bound
    assert Tensor.ones(2**31 + 1, dtype="int32").sum().item() == -(2**31) + 1
    assert Tensor.ones(2**31 + 1).cast("float64").sum().item() == 2**31 + 1


def test_small_kernels_keep_int32_and_big_ones_use_int64():
    assert _range_dtypes(Tensor.arange(1000)[-3:] + 1) == {dtypes.int32}
    assert _range_dtypes(Tensor.arange(2**33, dtype="int64")[-3:]) == {dtypes.int64}
    prog = get_program(schedule([Tensor.arange(2**33, dtype="int64")[-3:].uop], [])[0].steps[0].ast, "CPU")
    assert "long long gidx" in prog.source or "long long ridx" in prog.source


def test_tail_of_a_buffer_past_int32_elements():
    """A realized buffer of more than 2**31 bytes: its tail reads correctly (this segfaulted)."""
    n = 2**31 + 16
    t = (Tensor.arange(n, dtype="int64") % 251).cast("uint8").realize()
    tail = t[-5:].numpy()
    np.testing.assert_array_equal(tail, [(n - 5 + i) % 251 for i in range(5)])
    del t
