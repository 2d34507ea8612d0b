"""Before/after speed of two checkouts, measured in one run (alternating, so machine noise hits both).

Run: python benchmarks/bench_compare_trees.py --before /path/to/old/checkout [--after .] [--rounds 5]

Each round runs every workload once per tree (the order alternating between rounds), in a fresh subprocess
whose PYTHONPATH points at that tree's packages, and keeps the best time per (tree, workload).
Workloads: matmul 512 and 1024 (GFLOP/s), a JIT-replayed MLP training step (steps/s), tiny-op dispatch
(cached 4-element add, launches/s), a 16M-element fused chain (GB/s of input) and a full sum of 16M floats.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

WORKLOAD = r'''
import json, sys, time
import numpy as np
from polygrad import Context, Tensor, TinyJit, nn
from polygrad.nn.optim import Adam
name = sys.argv[1]

def best(fn, reps, inner=1):
    fn()
    t = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        t = min(t, (time.perf_counter() - t0) / inner)
    return t

if name.startswith("matmul"):
    n = int(name[6:])
    a = Tensor(np.random.rand(n, n).astype(np.float32)).realize()
    b = Tensor(np.random.rand(n, n).astype(np.float32)).realize()
    t = best(lambda: (a @ b).realize(), 5)
    out = 2 * n ** 3 / t / 1e9
elif name == "mlp_step":
    rng = np.random.default_rng(0)
    l1, l2 = nn.Linear(784, 256), nn.Linear(256, 10)
    opt = Adam([l1.weight, l1.bias, l2.weight, l2.bias], lr=1e-3)
    x = Tensor(rng.random((128, 784), dtype=np.float32)).realize()
    y = Tensor(rng.integers(0, 10, 128).astype(np.int32)).realize()
    @TinyJit
    def step(x, y):
        opt.zero_grad()
        loss = l2(l1(x).relu()).cross_entropy(y)
        loss.backward()
        opt.step(loss)
        return loss
    def run():
        with Context(TRAINING=1):
            return step(x, y).realize()
    for _ in range(3):
        run()
    t = best(run, 5, 10)
    out = 1 / t
elif name == "tiny_add":
    a = Tensor([1.0, 2.0, 3.0, 4.0]).realize()
    b = Tensor([4.0, 3.0, 2.0, 1.0]).realize()
    t = best(lambda: (a + b).realize(), 5, 200)
    out = 1 / t
elif name == "fused_chain":
    x = Tensor(np.random.rand(1 << 24).astype(np.float32)).realize()
    t = best(lambda: ((x * 2 + 1).relu() * x).sum().realize(), 5)
    out = (1 << 24) * 4 / t / 1e9
elif name == "full_sum":
    x = Tensor(np.random.rand(1 << 24).astype(np.float32)).realize()
    t = best(lambda: x.sum().realize(), 5)
    out = (1 << 24) * 4 / t / 1e9
print(json.dumps(out))
'''
UNITS = {"matmul512": "GFLOP/s", "matmul1024": "GFLOP/s", "mlp_step": "steps/s", "tiny_add": "launches/s",
         "fused_chain": "GB/s", "full_sum": "GB/s"}


def tree_path(root: str) -> str:
    root = os.path.abspath(root)
    return os.pathsep.join(os.path.join(root, p, "src") for p in
                           ("polygrad-core", "polygrad-backend-cpu", "polygrad-backend-interp"))


def run(root: str, name: str, cache: str) -> float:
    env = dict(os.environ, PYTHONPATH=tree_path(root), POLY_CACHE_DIR=cache)
    out = subprocess.run([sys.executable, "-c", WORKLOAD, name], env=env, capture_output=True, text=True,
                         timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"{root} {name} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", required=True)
    ap.add_argument("--after", default=os.path.join(os.path.dirname(__file__), ".."))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", nargs="*", default=list(UNITS))
    args = ap.parse_args()
    trees = {"before": args.before, "after": args.after}
    caches = {k: tempfile.mkdtemp(prefix=f"pgbench-{k}-") for k in trees}
    results: dict[tuple[str, str], float] = {}
    for r in range(args.rounds):
        for name in args.only:
            order = list(trees.items())
            for label, root in (order if r % 2 == 0 else order[::-1]):  # neither tree always runs first
                v = run(root, name, caches[label])
                results[(label, name)] = max(results.get((label, name), 0.0), v)
    print(f"{'workload':12s} {'before':>12s} {'after':>12s} {'change':>8s}  unit (higher is better)")
    for name in args.only:
        b, a = results[("before", name)], results[("after", name)]
        print(f"{name:12s} {b:12.2f} {a:12.2f} {100 * (a / b - 1):+7.1f}%  {UNITS[name]}")


if __name__ == "__main__":
    main()
