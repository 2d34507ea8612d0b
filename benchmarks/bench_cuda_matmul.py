"""Matmul throughput on CUDA: polygrad fp32 (shared-memory tiles) and fp16 (tensor cores) beside torch CUDA.

Run: `python benchmarks/bench_cuda_matmul.py [N]` (N = 4096 by default) on a machine with a GPU; torch
is measured in a subprocess when it is installed with CUDA, else the line says it is missing. Prints
one line per measurement: TFLOP/s as the best of several timed runs (each run synchronised), and
checks a corner of the result against NumPy so a fast wrong kernel cannot pass, and names the opts the
matmul kernel was lowered with (TILE: shared-memory tiles, TC: tensor cores). Not a pass/fail test.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time

import numpy as np

TORCH_SNIPPET = """
import json, sys, time, torch
n, out = int(sys.argv[1]), {}
for name, dt in (("fp32", torch.float32), ("fp16", torch.float16)):
    torch.backends.cuda.matmul.allow_tf32 = False
    a, b = torch.randn(n, n, device="cuda", dtype=dt), torch.randn(n, n, device="cuda", dtype=dt)
    for _ in range(3): a @ b
    torch.cuda.synchronize()
    best = 1e9
    for _ in range(10):
        t0 = time.perf_counter(); a @ b; torch.cuda.synchronize(); best = min(best, time.perf_counter() - t0)
    out[name] = 2 * n ** 3 / best / 1e12
print(json.dumps(out))
"""


def polygrad_tflops(n: int, dtype: str, runs: int = 10, device: str = "CUDA") -> tuple[float, float, str]:
    """(best TFLOP/s, max relative error of a 64x64 corner against NumPy, the matmul kernel's opts)."""
    from polygrad import Device, Tensor, dtypes
    from polygrad.codegen.lower import lower
    from polygrad.engine import programs
    rng = np.random.default_rng(0)
    npdt = np.float16 if dtype == "fp16" else np.float32
    a_np, b_np = rng.standard_normal((n, n)).astype(npdt), rng.standard_normal((n, n)).astype(npdt)
    a, b = Tensor(a_np, device=device).realize(), Tensor(b_np, device=device).realize()
    assert a.dtype is (dtypes.float16 if dtype == "fp16" else dtypes.float32)
    dev = Device[device]
    asts = []
    orig = programs.get_program
    programs.get_program = lambda ast, device: asts.append(ast) or orig(ast, device)
    try:
        c = (a @ b).realize()  # compile once
    finally:
        programs.get_program = orig
    opts = " ".join(f"{o.kind.value}:{o.amount}" for o in lower(asts[-1], dev.capabilities).opts) if asts else "?"
    dev.synchronize()
    best = float("inf")
    for _ in range(runs):
        t0 = time.perf_counter()
        c = (a @ b).realize()
        dev.synchronize()
        best = min(best, time.perf_counter() - t0)
    corner = c.numpy()[:64, :64].astype(np.float64)
    want = a_np[:64].astype(np.float64) @ b_np[:, :64].astype(np.float64)
    err = float(np.max(np.abs(corner - want)) / (np.max(np.abs(want)) + 1e-9))
    return 2 * n ** 3 / best / 1e12, err, opts


def torch_tflops(n: int) -> dict | str:
    proc = subprocess.run([sys.executable, "-c", TORCH_SNIPPET, str(n)], capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        return (proc.stderr.strip().splitlines() or ["failed"])[-1]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
    from polygrad import Device
    if not Device.cuda_available():
        from polygrad.device import registry
        print(f"no CUDA device: {registry.probe('CUDA').reason}")
        return
    ref = torch_tflops(n)
    for dtype in ("fp32", "fp16"):
        tflops, err, opts = polygrad_tflops(n, dtype)
        beside = f"torch {ref[dtype]:.1f} TFLOP/s ({tflops / ref[dtype]:.0%})" if isinstance(ref, dict) else \
            f"torch CUDA unavailable: {ref}"
        print(f"matmul {n} {dtype}: polygrad {tflops:.2f} TFLOP/s (opts {opts}; corner rel err {err:.1e}); {beside}")


if __name__ == "__main__":
    main()
