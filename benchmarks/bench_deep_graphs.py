"""Build + realize time of a lazy chain of N elementwise ops (x = x + 1), for N = 1k, 10k, 100k.

Run: python benchmarks/bench_deep_graphs.py   (DEV=INTERP selects the interpreter backend)
Time per op should stay roughly flat as N grows (linear total time).
"""
import sys
import time

from polygrad import Tensor


def run(n: int) -> tuple[float, float]:
    t0 = time.perf_counter()
    x = Tensor.ones(4)
    for _ in range(n):
        x = x + 1
    t1 = time.perf_counter()
    out = x.numpy()
    t2 = time.perf_counter()
    assert float(out[0]) == n + 1, out
    return t1 - t0, t2 - t1


def main() -> None:
    sizes = [int(a) for a in sys.argv[1:]] or [1_000, 10_000, 100_000]
    run(100)  # warm up (backend import, compiler)
    print(f"{'ops':>8} {'build s':>9} {'realize s':>10} {'total s':>9} {'us/op':>8}")
    for n in sizes:
        b, r = run(n)
        print(f"{n:>8} {b:>9.3f} {r:>10.3f} {b + r:>9.3f} {1e6 * (b + r) / n:>8.1f}")


if __name__ == "__main__":
    main()
