"""Linear algebra speed (issue 6): solve of a 256x256 system, polygrad beside numpy.linalg.solve.

Run: python -m pytest benchmarks/bench_linalg.py --benchmark-only -q
The factor reported in the issue is mean(polygrad) / mean(numpy) for the same float32 system.
Both sides return host values (numpy() on the polygrad result), so the comparison is end to end.
"""
import numpy as np
import pytest

from polygrad import Tensor

N = 256


@pytest.fixture(scope="module")
def system():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((N, N)).astype(np.float32)
    b = rng.standard_normal(N).astype(np.float32)
    return a, b


@pytest.mark.parametrize("device", ["CPU"])
def test_solve_256_polygrad(benchmark, system, device):
    a, b = system
    ta, tb = Tensor(a, device=device).realize(), Tensor(b, device=device).realize()
    ta.solve(tb).numpy()  # compile once, outside the timing
    x = benchmark(lambda: ta.solve(tb).numpy())
    r = a.astype(np.float64) @ x - b
    assert np.linalg.norm(r) / (np.linalg.norm(a) * np.linalg.norm(x)) < 1e-6


def test_solve_256_numpy(benchmark, system):
    a, b = system
    benchmark(lambda: np.linalg.solve(a, b))


def test_solve_2x2_polygrad(benchmark):
    a, b = Tensor([[4.0, 2.0], [2.0, 5.0]]).realize(), Tensor([1.0, 3.0]).realize()
    a.solve(b).numpy()
    x = benchmark(lambda: a.solve(b).numpy())
    assert np.allclose(x, [-0.0625, 0.625], atol=1e-5)
