"""Core Tensor API speed (issue 3): in-kernel RNG, transcendental series, scans and the rank sort.

Run: python -m pytest benchmarks/bench_tensor_core.py --benchmark-only -q
"""
import numpy as np
import pytest
import torch

from polygrad import Tensor

N = 4 * 1024 * 1024


@pytest.fixture(scope="module")
def big():
    xn = np.random.default_rng(0).standard_normal(N).astype(np.float32)
    return xn, Tensor(xn, device="CPU").realize()


def test_rand_sum_polygrad(benchmark):
    """Threefry bits, float conversion and the sum in one pass: nothing of size N is stored."""
    benchmark(lambda: Tensor.rand(N, device="CPU").sum().realize())


def test_rand_sum_torch(benchmark):
    benchmark(lambda: torch.rand(N).sum())


def test_erf_polygrad(benchmark, big):
    _, x = big
    benchmark(lambda: x.erf().realize())


def test_erf_torch(benchmark, big):
    xn, _ = big
    xt = torch.tensor(xn)
    benchmark(lambda: torch.erf(xt))


def test_gelu_backward_polygrad(benchmark, big):
    _, x = big

    def step():
        leaf = Tensor(x.uop, requires_grad=True)
        leaf._leaf = True
        return leaf.gelu().sum().gradient(leaf)[0].realize()
    benchmark(step)


def test_cumsum_long_axis_polygrad(benchmark):
    x = Tensor(np.random.default_rng(1).standard_normal((8, 65536)).astype(np.float32), device="CPU").realize()
    benchmark(lambda: x.cumsum(1).realize())


@pytest.mark.parametrize("n", [1024, 8192])
def test_sort_polygrad(benchmark, n):
    x = Tensor(np.random.default_rng(2).standard_normal(n).astype(np.float32), device="CPU").realize()

    def run():
        values, indices = x.sort()
        Tensor.realize_all(values, indices)
    benchmark(run)
