"""Scheduling and fixed costs (issue 17, items 2 and 5), side by side with PyTorch in one run.

    python benchmarks/bench_sched.py [--rounds 5] [--json out.jsonl] [--only tiny_op block ...]

Workloads (best of --rounds; a round is a mean over many calls):
  tiny_op      `(a + b).realize()` on 4 floats, no JIT: microseconds per call
  jit_replay   a jitted function of 20 tiny kernels replayed: microseconds per kernel
  first_call   first `(x @ w).relu().sum()` (256x256) in a fresh process: with an empty compile cache
               (first_cold) and with a filled one (first_warm), ms
  block        transformer block forward, d768 seq128, jitted (benchmarks/workloads.py): ms per call
  mlp_adam     MLP 784-512-512-10 Adam step, batch 128, jitted: steps/s (higher is better)
  op_counts    GlobalCounters.global_ops / analytic FLOPs of the block, the MLP step and a small conv
               net (deterministic; 1.0 means no recomputed work)
PyTorch's figure beside each is the same computation (eager; its first call in a fresh process).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import workloads  # noqa: E402

JIT_KERNELS = 20
FIRST_CALL = r'''
import sys, time
import numpy as np
lib = sys.argv[1]
rng = np.random.default_rng(0)
a, b = rng.standard_normal((256, 256), dtype=np.float32), rng.standard_normal((256, 256), dtype=np.float32)
if lib == "polygrad":
    from polygrad import Tensor
    x, w = Tensor(a).realize(), Tensor(b).realize()
    t = time.perf_counter()
    (x @ w).relu().sum().item()
else:
    import torch
    x, w = torch.tensor(a), torch.tensor(b)
    t = time.perf_counter()
    (x @ w).relu().sum().item()
print(time.perf_counter() - t)
'''


def best_mean(fn, rounds: int, inner: int) -> float:
    """Best over rounds of the mean time of `inner` calls, in seconds."""
    out = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(inner):
            fn()
        out = min(out, (time.perf_counter() - t) / inner)
    return out


def tiny_op(rounds: int) -> dict:
    from polygrad import Tensor
    a = Tensor([1.0, 2.0, 3.0, 4.0]).realize()
    b = Tensor([4.0, 3.0, 2.0, 1.0]).realize()
    fn = lambda: (a + b).realize()  # noqa: E731
    for _ in range(20):
        fn()
    import torch
    ta, tb = torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.tensor([4.0, 3.0, 2.0, 1.0])
    return {"polygrad": best_mean(fn, rounds, 2000) * 1e6, "torch": best_mean(lambda: ta + tb, rounds, 2000) * 1e6,
            "unit": "us/call"}


def jit_replay(rounds: int) -> dict:
    from polygrad import Tensor, jit

    @jit
    def f(x):
        y = x
        for _ in range(JIT_KERNELS):
            y = (y * 1.0001 + 1).contiguous()
        return y.realize()
    x = Tensor(np.ones(16, np.float32)).realize()
    for _ in range(5):
        f(x)
    assert f.stats()["captured_kernels"] == JIT_KERNELS
    import torch
    tx = torch.ones(16)

    def tf():
        y = tx
        for _ in range(JIT_KERNELS):
            y = y * 1.0001 + 1
        return y
    return {"polygrad": best_mean(lambda: f(x), rounds, 200) / JIT_KERNELS * 1e6,
            "torch": best_mean(tf, rounds, 200) / (2 * JIT_KERNELS) * 1e6, "unit": "us/kernel"}


def _first_call(lib: str, cache: str) -> float:
    env = dict(os.environ, POLY_CACHE_DIR=cache)
    out = subprocess.run([sys.executable, "-c", FIRST_CALL, lib], env=env, capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1]) * 1e3


def first_call(rounds: int) -> tuple[dict, dict]:
    cold, warm, torch_ms = [], [], []
    for _ in range(rounds):
        with tempfile.TemporaryDirectory() as cache:
            cold.append(_first_call("polygrad", cache))
            warm.append(_first_call("polygrad", cache))
        torch_ms.append(_first_call("torch", tempfile.gettempdir()))
    t = min(torch_ms)
    return ({"polygrad": min(cold), "torch": t, "unit": "ms"}, {"polygrad": min(warm), "torch": t, "unit": "ms"})


def block(rounds: int) -> dict:
    import torch
    from polygrad import Tensor, jit
    p = workloads.block_params()
    xs = np.random.default_rng(1).standard_normal((128, 768)).astype(np.float32)
    x = Tensor(xs).realize()
    f = jit(lambda x: workloads.block(x, p).realize())
    for _ in range(3):
        f(x)
    tp = {k: torch.tensor(v.numpy()) for k, v in p.items()}
    tx = torch.tensor(xs)
    with torch.no_grad():
        t = best_mean(lambda: workloads.block_torch(tx, tp), rounds, 10)
    return {"polygrad": best_mean(lambda: f(x), rounds, 3) * 1e3, "torch": t * 1e3, "unit": "ms"}


def mlp_adam(rounds: int) -> dict:
    import torch
    from polygrad import jit
    step, _ = workloads.mlp_adam_step()
    f = jit(step)
    for _ in range(3):
        f()
    torch.manual_seed(0)
    sizes = workloads.MLP_SIZES
    layers = []
    for a, b in zip(sizes, sizes[1:]):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers[:-1])
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    rng = np.random.default_rng(0)
    tx = torch.tensor(rng.standard_normal((workloads.MLP_BATCH, sizes[0])).astype(np.float32))
    ty = torch.tensor(rng.integers(0, sizes[-1], workloads.MLP_BATCH))

    def tstep():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(tx), ty)
        loss.backward()
        opt.step()
    return {"polygrad": 1 / best_mean(f, rounds, 5), "torch": 1 / best_mean(tstep, rounds, 5), "unit": "steps/s"}


def op_counts() -> dict[str, dict]:
    from polygrad import GlobalCounters, Tensor
    out = {}
    p = workloads.block_params()
    x = Tensor(np.random.default_rng(1).standard_normal((128, 768)).astype(np.float32)).realize()
    cases = {"ops_block": (lambda: workloads.block(x, p).realize(), workloads.block_flops())}
    mlp, _ = workloads.mlp_adam_step()
    cases["ops_mlp_adam"] = (mlp, workloads.mlp_flops())
    conv, _ = workloads.convnet_step()
    cases["ops_convnet"] = (conv, workloads.conv_flops())
    for name, (fn, flops) in cases.items():
        fn()
        GlobalCounters.reset()
        fn()
        out[name] = {"polygrad": GlobalCounters.global_ops / flops, "torch": 1.0, "unit": "x analytic FLOPs",
                     "kernels": GlobalCounters.kernel_count}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", help="append one JSON line per workload to this file")
    ap.add_argument("--only", nargs="*", help="workloads to run (default: all)")
    args = ap.parse_args()
    results: dict[str, dict] = {}
    todo = args.only or ["tiny_op", "jit_replay", "first_call", "block", "mlp_adam", "op_counts"]
    if "tiny_op" in todo:
        results["tiny_op"] = tiny_op(args.rounds)
    if "jit_replay" in todo:
        results["jit_replay"] = jit_replay(args.rounds)
    if "first_call" in todo:
        results["first_cold"], results["first_warm"] = first_call(args.rounds)
    if "block" in todo:
        results["block"] = block(args.rounds)
    if "mlp_adam" in todo:
        results["mlp_adam"] = mlp_adam(args.rounds)
    if "op_counts" in todo:
        results.update(op_counts())
    print(f"{'workload':12s} {'polygrad':>10s} {'torch':>10s} {'ratio':>7s}  unit")
    for name, r in results.items():
        print(f"{name:12s} {r['polygrad']:10.2f} {r['torch']:10.2f} {r['polygrad'] / r['torch']:7.2f}  {r['unit']}")
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps({"workload": name, **r}) + "\n")


if __name__ == "__main__":
    main()
