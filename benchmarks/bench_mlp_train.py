"""Training-step speed: MLP 784-512-512-10, batch 128, cross-entropy, Adam.

polygrad eager, polygrad under the JIT (TinyJit) and PyTorch CPU, as pytest-benchmark cases:
    python -m pytest benchmarks/bench_mlp_train.py --benchmark-only
or as a plain script printing steps/s side by side (tinygrad too when a Python with tinygrad is
given: `--tinygrad /tmp/tg/bin/python`; the project itself never imports tinygrad):
    python benchmarks/bench_mlp_train.py [--steps 30] [--threads N] [--tinygrad PYTHON]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import numpy as np
import pytest

BATCH, SIZES = 128, (784, 512, 512, 10)


def _data(seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((BATCH, SIZES[0])).astype(np.float32), rng.integers(0, 10, BATCH).astype(np.int32)


def polygrad_step(use_jit: bool):
    """A zero-argument training step (data fixed, so only the step itself is timed)."""
    from polygrad import Context, Tensor, TinyJit, nn
    from polygrad.nn.optim import Adam

    class MLP:
        def __init__(self):
            self.layers = [nn.Linear(a, b) for a, b in zip(SIZES, SIZES[1:])]

        def __call__(self, x):
            for layer in self.layers[:-1]:
                x = layer(x).relu()
            return self.layers[-1](x)

    model = MLP()
    opt = Adam(nn.get_parameters(model), lr=1e-3)
    x_np, y_np = _data()
    x, y = Tensor(x_np), Tensor(y_np)

    def step(x, y):
        opt.zero_grad()
        loss = model(x).cross_entropy(y)
        loss.backward()
        opt.step(loss)
        return loss

    fn = TinyJit(step) if use_jit else step

    def run():
        with Context(TRAINING=1):
            return fn(x, y)
    return run


def torch_step():
    import torch
    torch.manual_seed(0)
    layers = []
    for a, b in zip(SIZES, SIZES[1:]):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers[:-1])
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x_np, y_np = _data()
    x, y = torch.tensor(x_np), torch.tensor(y_np).long()

    def run():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss
    return run


TINYGRAD_SCRIPT = f"""
import time, numpy as np
from tinygrad import Context, Tensor, TinyJit, nn
from tinygrad.nn.optim import Adam
SIZES, BATCH = {SIZES}, {BATCH}
layers = [nn.Linear(a, b) for a, b in zip(SIZES, SIZES[1:])]
opt = Adam(nn.state.get_parameters(layers), lr=1e-3)
rng = np.random.default_rng(0)
x = Tensor(rng.standard_normal((BATCH, SIZES[0])).astype(np.float32)).realize()
y = Tensor(rng.integers(0, 10, BATCH).astype(np.int32)).realize()
def step(x, y):
    opt.zero_grad()
    h = x
    for l in layers[:-1]: h = l(h).relu()
    loss = layers[-1](h).sparse_categorical_crossentropy(y)
    loss.backward()
    return loss.realize(*opt.schedule_step())
for name, fn in (("eager", step), ("jit", TinyJit(step))):
    with Context(TRAINING=1):
        for _ in range(3): fn(x, y).item()
        n = STEPS
        t0 = time.perf_counter()
        for _ in range(n): loss = fn(x, y)
        loss.item()
        print(name, n / (time.perf_counter() - t0))
"""


def _time(run, steps: int) -> float:
    for _ in range(3):  # compile, capture, first replay
        float(run().item())
    t0 = time.perf_counter()
    for _ in range(steps):
        loss = run()
    float(loss.item())
    return steps / (time.perf_counter() - t0)


def _tinygrad(python: str, steps: int) -> dict[str, float]:
    out = subprocess.run([python, "-c", TINYGRAD_SCRIPT.replace("STEPS", str(steps))], capture_output=True,
                         text=True, timeout=1200, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "DEV": "CPU",
                                                    "HOME": os.environ.get("HOME", "/tmp")})
    if out.returncode != 0:
        return {"error": out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "failed"}
    return {f"tinygrad {line.split()[0]}": float(line.split()[1]) for line in out.stdout.strip().splitlines()}


# -------------------------------------------------------------------------------------------------
# pytest-benchmark cases


@pytest.mark.parametrize("use_jit", [False, True], ids=["eager", "jit"])
def test_polygrad_mlp_train_step(benchmark, use_jit):
    run = polygrad_step(use_jit)
    for _ in range(3):
        run().item()
    benchmark(lambda: run().item())


def test_torch_mlp_train_step(benchmark):
    run = torch_step()
    benchmark(lambda: run().item())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--tinygrad", help="a Python interpreter that has tinygrad installed")
    parser.add_argument("--threads", type=int, help="CPU threads for polygrad (POLY_THREADS) and torch")
    args = parser.parse_args()
    if args.threads:  # before polygrad is imported, which reads POLY_THREADS then
        import torch
        os.environ["POLY_THREADS"] = str(args.threads)
        torch.set_num_threads(args.threads)
    results = {
        "polygrad eager": _time(polygrad_step(False), args.steps),
        "polygrad jit": _time(polygrad_step(True), args.steps),
        "torch cpu": _time(torch_step(), args.steps),
    }
    if args.tinygrad:
        results.update(_tinygrad(args.tinygrad, args.steps))
    for name, value in results.items():
        print(f"{name:18s} {value:8.2f} steps/s" if isinstance(value, float) else f"{name:18s} {value}")


if __name__ == "__main__":
    sys.exit(main())
