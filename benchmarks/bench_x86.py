"""X86 (machine code, no compiler) against CPU (C through clang), measured in one run.

Run: python benchmarks/bench_x86.py [--rounds 3]

Every (device, workload) pair runs in a fresh subprocess, rounds alternate the device order, and the
best figure per pair is kept. Workloads: a fused elementwise chain over 16M float32 (GB/s of input
and output); from bench_compare_trees, run with DEV set, matmul 1024 (GFLOP/s) and a JIT-replayed MLP
training step (784-256-10, batch 128, Adam; steps/s); and first-call latency: a new kernel realized in
a fresh process with an empty POLY_CACHE_DIR (ms: lowering, code generation or clang, loading and one
run; the packages' bytecode is written first, as pip install does). NumPy's elementwise and matmul
figures are printed alongside. Figures are noisy on a shared
machine: repeat before trusting them.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

# matmul1024 and mlp_step are bench_compare_trees' workloads, run with DEV set to each device
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_compare_trees import WORKLOAD as SHARED  # noqa: E402
from prepare_bytecode import prepare_bytecode  # noqa: E402

WORKLOAD = r'''
import json, sys, time
import numpy as np
from polygrad import Tensor
name, dev = sys.argv[1], sys.argv[2]

def best(fn, reps):
    fn()
    t = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        t = min(t, time.perf_counter() - t0)
    return t

if name == "first_call":
    x = Tensor(np.arange(1000, dtype=np.float32), device=dev).realize()
    t0 = time.perf_counter()
    ((x * 3 - 1).relu() * x + 0.5).sqrt().realize()
    out = (time.perf_counter() - t0) * 1e3
elif name == "elementwise":
    n = 1 << 24
    x = Tensor(np.random.rand(n).astype(np.float32), device=dev).realize()
    t = best(lambda: ((x * 2 + 1).relu() * x).realize(), 7)
    out = 2 * 4 * n / t / 1e9
elif name == "numpy_elementwise":
    x = np.random.rand(1 << 24).astype(np.float32)
    t = best(lambda: np.maximum(x * 2 + 1, 0) * x, 7)
    out = 2 * 4 * x.size / t / 1e9
elif name == "numpy_matmul":
    a = np.random.rand(1024, 1024).astype(np.float32)
    t = best(lambda: a @ a, 5)
    out = 2 * 1024 ** 3 / t / 1e9
print(json.dumps(out))
'''

UNITS = {"elementwise": "GB/s", "matmul1024": "GFLOP/s", "mlp_step": "steps/s", "first_call": "ms"}


def run(name: str, dev: str, cache: str) -> float:
    env = dict(os.environ, POLY_CACHE_DIR=cache, DEV=dev)
    script = SHARED if name in ("matmul1024", "mlp_step") else WORKLOAD
    proc = subprocess.run([sys.executable, "-c", script, name, dev], env=env, capture_output=True, text=True,
                          timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"{name} on {dev} failed:\n{proc.stderr}")
    return float(json.loads(proc.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    prepare_bytecode()  # as an installed package has it: no module compiled inside a timed first call
    results: dict[tuple[str, str], float] = {}
    devices = ["CPU", "X86"]
    for r in range(args.rounds):
        order = devices if r % 2 == 0 else devices[::-1]
        for name in UNITS:
            for dev in order:
                with tempfile.TemporaryDirectory() as fresh:
                    cache = fresh if name == "first_call" else os.path.join(tempfile.gettempdir(), f"bench-x86-{dev}")
                    v = run(name, dev, cache)
                key = (name, dev)
                better = min if name == "first_call" else max
                results[key] = better(results.get(key, v), v)
        for name in ("numpy_elementwise", "numpy_matmul"):
            v = run(name, "CPU", tempfile.gettempdir())
            results[(name, "numpy")] = max(results.get((name, "numpy"), v), v)
    print(f"{'workload':14s} {'CPU':>10s} {'X86':>10s} {'X86/CPU':>8s}  unit   (best of {args.rounds})")
    for name, unit in UNITS.items():
        c, x = results[(name, "CPU")], results[(name, "X86")]
        ratio = x / c if name != "first_call" else c / x
        print(f"{name:14s} {c:10.2f} {x:10.2f} {ratio:8.2f}  {unit}"
              + ("  (CPU/X86: how many times faster X86 starts)" if name == "first_call" else ""))
    print(f"numpy: elementwise {results[('numpy_elementwise', 'numpy')]:.2f} GB/s, "
          f"matmul {results[('numpy_matmul', 'numpy')]:.2f} GFLOP/s")


if __name__ == "__main__":
    main()
