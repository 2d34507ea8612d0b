"""Arbitrary Tensor op chains against NumPy, drawn by hypothesis (it shrinks a failure to a short chain).

Each example is a list of operation kinds (creation, elementwise, broadcasting, reductions, movement,
indexing, gather, matmul, cat, casts, softmax, cumsum, in-place assign, gradients) applied by
random_programs.Program to a pool of live values, every value compared with its NumPy mirror. CI runs
a small budget on INTERP (no compiles) and a smaller one on CPU; POLY_LONG_TESTS=1 runs many more.
"""
from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from fuzz_budget import fuzz_settings
from random_programs import Program, run_program

chains = st.lists(st.sampled_from(Program.OPS), min_size=1, max_size=12)


@fuzz_settings(30, 3000)
@given(st.integers(0, 2**32 - 1), chains)
def test_op_chains_interp(seed: int, names: list[str]) -> None:
    run_program(seed, 0, "INTERP", names)


@fuzz_settings(3, 500)
@given(st.integers(0, 2**32 - 1), chains)
def test_op_chains_cpu(seed: int, names: list[str]) -> None:
    run_program(seed, 0, "CPU", names)
