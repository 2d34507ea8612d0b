"""POLY_DEBUG_ALLOC=1: memory bugs fail loudly (poisoned new and freed blocks, guard zones, quarantine).

Fresh memory from np.empty or the reuse cache holds plausible stale numbers, which is how a kernel
reading memory it does not own returned 1.4e-19 and 2.8e+20 in one long process (issue 11). In this
mode every new or freed block reads as NaN (floats) / -1 (ints), host blocks sit between guard zones
checked after each launch, and freed blocks wait in a quarantine instead of being reused at once.
"""
from __future__ import annotations

import gc

import numpy as np
import pytest

from polygrad import Tensor, dtypes
from polygrad.device import Buffer, MemoryCheckError, debug_alloc
from polygrad.uop.ops import KernelInfo, UOp

DEVICES = ["CPU", "INTERP"]


@pytest.fixture
def checked():
    was = debug_alloc.on
    debug_alloc.enable()
    yield debug_alloc
    debug_alloc.enable(was)


@pytest.mark.parametrize("device", DEVICES)
def test_new_memory_is_poisoned(checked, device: str) -> None:
    assert np.isnan(Tensor.empty(5, device=device).numpy()).all()
    assert (Tensor.empty(3, dtype=dtypes.int32, device=device).numpy() == -1).all()
    x = Tensor(np.arange(4, dtype=np.float32), device=device)
    assert ((x * 2 + 1).tolist()) == [1.0, 3.0, 5.0, 7.0]  # written data reads back normally


@pytest.mark.parametrize("device", DEVICES)
def test_freed_memory_is_poisoned_and_not_reused(checked, device: str) -> None:
    a = Buffer(device, 8, dtypes.float32).copyin(np.arange(8, dtype=np.float32))
    handle = a.handle
    del a
    gc.collect()
    assert np.isnan(handle.arr.view(np.float32)).all()  # the stale handle shows NaN, not old data
    b = Buffer(device, 8, dtypes.float32).ensure_allocated()
    assert b.handle is not handle and np.isnan(b.numpy()).all()


def test_write_after_free_is_reported(checked) -> None:
    a = Buffer("CPU", 16, dtypes.float32).ensure_allocated()
    handle = a.handle
    del a
    gc.collect()
    handle.arr[:4] = 0  # what a kernel still holding the old pointer would do
    with pytest.raises(MemoryCheckError, match="after it was freed"):
        debug_alloc.check_quarantine()
    handle.arr[:] = 0xFF


def _one_past_the_end(out, a):
    i = UOp.range(out.ctx, 4, 0)
    return out.flatten()[i + 1].store(a.flatten()[i]).end(i).sink(arg=KernelInfo(name="off_by_one"))


def test_out_of_bounds_write_is_caught_after_the_launch(checked) -> None:
    out = Tensor.empty(4, device="CPU")
    y = out.custom_kernel(Tensor([1.0, 2.0, 3.0, 4.0], device="CPU"), fxn=_one_past_the_end)[0]
    with pytest.raises(MemoryCheckError, match="off_by_one wrote after the end"):
        y.realize()
    with pytest.warns(RuntimeWarning, match="guard zone changed"):  # reported again when it is freed
        del out, y
        gc.collect()


def test_mode_is_off_by_default_and_costs_nothing_then() -> None:
    if debug_alloc.on:
        pytest.skip("POLY_DEBUG_ALLOC is set for this run")
    before = debug_alloc.checks
    (Tensor([1.0, 2.0]) * 2).realize()
    assert debug_alloc.checks == before
