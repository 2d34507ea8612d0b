"""Foundation speed (issue 2): fused elementwise+reduce chain, cached re-runs, first call, matmul.

Run: python -m pytest benchmarks/bench_foundation.py --benchmark-only -q
"""
import numpy as np
import pytest

from polygrad import Tensor
from polygrad.engine.programs import program_cache
from polygrad.schedule.template import clear_schedule_cache

N = 16 * 1024 * 1024


@pytest.fixture(scope="module")
def big():
    xn = np.random.default_rng(0).random(N, dtype=np.float32)
    return xn, Tensor(xn, device="CPU").realize()


def test_fused_chain_polygrad(benchmark, big):
    xn, x = big
    run = lambda: ((x * 2 + 1).relu() * x).sum().realize()  # noqa: E731
    out = benchmark(run)
    ref = float(((xn.astype(np.float64) * 2 + 1).clip(0) * xn).sum())
    assert abs(out.item() - ref) / ref < 1e-5


def test_fused_chain_numpy(benchmark, big):
    xn, _ = big
    benchmark(lambda: ((xn * 2 + 1).clip(0) * xn).sum())


def test_one_pass_sum_polygrad(benchmark, big):
    """One read of the 64 MB input: the memory-bandwidth floor the fused chain is compared to."""
    _, x = big
    benchmark(lambda: x.sum().realize())


def test_cached_small_add(benchmark):
    a = Tensor([1.0, 2.0, 3.0, 4.0], device="CPU").realize()
    b = Tensor([5.0, 6.0, 7.0, 8.0], device="CPU").realize()
    (a + b).realize()
    out = benchmark(lambda: (a + b).realize())
    assert out.numpy().tolist() == [6.0, 8.0, 10.0, 12.0]


def test_first_call_small_add(benchmark):
    """Schedule + lower + render + compile (the on-disk cache is warm after the first round)."""
    a = Tensor([1.0, 2.0, 3.0, 4.0], device="CPU").realize()
    b = Tensor([5.0, 6.0, 7.0, 8.0], device="CPU").realize()

    def first():
        clear_schedule_cache()
        program_cache.clear()
        return (a + b).realize()
    benchmark.pedantic(first, rounds=5, iterations=1)


@pytest.mark.parametrize("lib", ["polygrad", "numpy"])
def test_matmul_1024(benchmark, lib):
    rng = np.random.default_rng(0)
    an, bn = rng.random((1024, 1024), dtype=np.float32), rng.random((1024, 1024), dtype=np.float32)
    if lib == "numpy":
        benchmark(lambda: an @ bn)
    else:
        a, b = Tensor(an, device="CPU").realize(), Tensor(bn, device="CPU").realize()
        out = benchmark(lambda: (a @ b).realize())
        assert np.allclose(out.numpy(), an @ bn, rtol=1e-3, atol=1e-2)
    benchmark.extra_info["gflops"] = 2 * 1024**3 / benchmark.stats.stats.mean / 1e9
