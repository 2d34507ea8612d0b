"""JIT speed: replay overhead per kernel, and a small MLP training step jitted vs eager (CPU).

    python -m pytest benchmarks/bench_jit.py --benchmark-only -q
or as a plain script that prints the figures:
    python benchmarks/bench_jit.py [--calls 2000] [--steps 200]
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import pytest

N_KERNELS = 10
BATCH, SIZES = 32, (64, 128, 10)


def ten_kernel_jit():
    """A jitted function launching N_KERNELS tiny elementwise kernels, already captured."""
    from polygrad import Tensor, jit

    @jit
    def f(x):
        y = x
        for _ in range(N_KERNELS):
            y = (y * 1.0001 + 1).contiguous()
        return y.realize()

    x = Tensor(np.ones(16, np.float32), device="CPU").realize()
    for _ in range(3):
        f(x)
    assert f.stats()["captured_kernels"] == N_KERNELS
    return f, x


def mlp_step(use_jit: bool):
    """A zero-argument SGD training step of a 64-128-10 MLP on fixed data (eager or jitted)."""
    from polygrad import Tensor, jit
    rng = np.random.default_rng(0)
    x = Tensor(rng.standard_normal((BATCH, SIZES[0])).astype(np.float32), device="CPU").realize()
    y = Tensor(rng.standard_normal((BATCH, SIZES[2])).astype(np.float32), device="CPU").realize()
    params = []
    for fan_in, fan_out in zip(SIZES[:-1], SIZES[1:]):
        w = rng.standard_normal((fan_in, fan_out)).astype(np.float32) / np.sqrt(fan_in)
        params += [Tensor(w, device="CPU", requires_grad=True).realize(),
                   Tensor(np.zeros(fan_out, np.float32), device="CPU", requires_grad=True).realize()]

    def step(x, y):
        w1, b1, w2, b2 = params
        loss = ((x @ w1 + b1).relu() @ w2 + b2 - y).square().mean()
        loss.backward()
        loss.realize()
        for p in params:
            p.assign(p - 0.01 * p.grad)
            p.grad = None
        Tensor.realize_all(*params)
        return loss

    fn = jit(step) if use_jit else step
    return lambda: fn(x, y)


def test_replay_ten_small_kernels(benchmark):
    f, x = ten_kernel_jit()
    benchmark(lambda: f(x))
    benchmark.extra_info["us_per_kernel"] = benchmark.stats.stats.mean * 1e6 / N_KERNELS


@pytest.mark.parametrize("use_jit", [False, True], ids=["eager", "jit"])
def test_mlp_train_step(benchmark, use_jit):
    step = mlp_step(use_jit)
    for _ in range(3):
        step()
    benchmark(step)


def _rate(fn, n: int) -> tuple[float, float]:
    """(wall seconds, process CPU seconds) per call: CPU time is the honest figure on a busy machine."""
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n, (time.process_time() - c0) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args()
    f, x = ten_kernel_jit()
    per_call, cpu = _rate(lambda: f(x), args.calls)
    print(f"replay: {per_call * 1e6:.1f} us per call, {per_call * 1e6 / N_KERNELS:.2f} us per kernel wall, "
          f"{cpu * 1e6 / N_KERNELS:.2f} us per kernel CPU ({N_KERNELS} kernels of 16 floats)")
    for use_jit in (False, True):
        step = mlp_step(use_jit)
        for _ in range(3):
            step()
        dt, _ = _rate(step, args.steps)
        print(f"MLP {'-'.join(map(str, SIZES))} batch {BATCH} SGD, {'jit  ' if use_jit else 'eager'}: "
              f"{1 / dt:8.1f} steps/s ({dt * 1e3:.2f} ms/step)")


if __name__ == "__main__":
    main()
