"""Thousands of mixed ops, shapes and dtypes in one process, against NumPy, with POLY_DEBUG_ALLOC on.

The long randomized test of issue 11: values are created, combined, viewed, indexed, reduced,
assigned in place and differentiated while older ones die, so buffers are freed, poisoned and
replaced while other graphs are still lazy; schedules and programs are reused across structures that
look alike. A value that disagrees with NumPy, a kernel writing outside its buffer or a read of freed
memory fails here. CI runs a few hundred ops; POLY_LONG_TESTS=1 runs thousands per backend. Op chains
drawn by hypothesis (shrinkable to a minimal failing sequence) are in test_fuzz_op_chains.py.
"""
from __future__ import annotations

import pytest

from fuzz_budget import scale
from polygrad.device import debug_alloc
from random_programs import run_program

# (device, programs, ops per program): the CPU compiles each new kernel, so it gets fewer in CI
BUDGET = {"INTERP": (scale(3, 40), scale(120, 300)), "CPU": (scale(1, 15), scale(60, 300))}


@pytest.fixture
def checked_memory():
    was = debug_alloc.on
    debug_alloc.enable()
    yield
    debug_alloc.enable(was)
    debug_alloc.check_quarantine()


@pytest.mark.parametrize("device", ["INTERP", "CPU"])
def test_random_programs_in_one_process(device: str, checked_memory) -> None:
    programs, ops = BUDGET[device]
    compared = 0
    for seed in range(programs):
        compared += run_program(1000 * len(device) + seed, ops, device)
    debug_alloc.check_quarantine()
    assert compared >= programs * ops // 2
