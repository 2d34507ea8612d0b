"""Model.fit speed against the hand-written TinyJit training loop of the same MLP, in one run.

MLP 784-512-512-10, cross-entropy, Adam, batch 128, 8 batches per epoch (data on the host, as a user
passes NumPy arrays). Also shows that a variable-batch Model compiles once: a second call at a new
batch size within the bounds compiles nothing (`polygrad.stats()["programs_compiled"]`).

    python benchmarks/bench_model_fit.py [--epochs 5] [--rounds 3]
"""
from __future__ import annotations

import argparse
import time

import numpy as np

SIZES, BATCH, BATCHES = (784, 512, 512, 10), 128, 8


class MLP:
    def __init__(self):
        from polygrad import nn
        self.layers = [nn.Linear(a, b) for a, b in zip(SIZES, SIZES[1:])]

    def __call__(self, x):
        for layer in self.layers[:-1]:
            x = layer(x).relu()
        return {"logits": self.layers[-1](x)}


def data():
    rng = np.random.default_rng(0)
    n = BATCH * BATCHES
    return rng.standard_normal((n, SIZES[0])).astype(np.float32), rng.integers(0, 10, n).astype(np.int32)


def jit_loop(epochs: int) -> float:
    """Steps/s of the hand-written loop: TinyJit step over host batches copied in each step."""
    from polygrad import Context, Tensor, TinyJit, nn
    from polygrad.nn.optim import Adam
    Tensor.manual_seed(0)
    model = MLP()
    opt = Adam(nn.get_parameters(model), lr=1e-3)
    X, Y = data()
    x, y = Tensor.empty(BATCH, SIZES[0]).realize(), Tensor.empty(BATCH, dtype="int32").realize()

    @TinyJit
    def step(x, y):
        opt.zero_grad()
        loss = model(x)["logits"].cross_entropy(y)
        loss.backward()
        opt.step()
        return loss.realize()

    losses = []
    with Context(TRAINING=1):
        for i in range(3):  # warm-up: run, capture, replay
            x.copy_from(X[:BATCH])
            y.copy_from(Y[:BATCH])
            step(x, y)
        t0 = time.perf_counter()
        for _ in range(epochs):
            for b in range(BATCHES):
                x.copy_from(X[b * BATCH:(b + 1) * BATCH])
                y.copy_from(Y[b * BATCH:(b + 1) * BATCH])
                losses.append(step(x, y).item())
        dt = time.perf_counter() - t0
    return epochs * BATCHES / dt


def model_fit(epochs: int) -> float:
    from polygrad import Model, Tensor
    Tensor.manual_seed(0)
    X, Y = data()
    m = Model(MLP(), inputs={"x": Tensor.empty(BATCH, SIZES[0])}, targets={"y": Tensor.empty(BATCH, dtype="int32")},
              loss=lambda out, y: out["logits"].cross_entropy(y))
    try:
        m.fit({"x": X[:BATCH * 2], "y": Y[:BATCH * 2]}, batch_size=BATCH, optimizer="adam", lr=1e-3, verbose=False)
        t0 = time.perf_counter()
        m.fit({"x": X, "y": Y}, epochs=epochs, batch_size=BATCH, verbose=False)
        return epochs * BATCHES / (time.perf_counter() - t0)
    finally:
        m.dispose()


def variable_batch_compiles_once() -> tuple[int, int, int]:
    """Programs compiled by construction, by a first call (batch 7) and by a second call (batch 50)."""
    import polygrad
    import polygrad.runtime
    from polygrad import Model, Tensor, Variable

    def compiled() -> int:
        return polygrad.stats()["programs_compiled"]

    polygrad.runtime.collect()  # drop cached programs so construction's compiles are counted
    start = compiled()
    m = Model(MLP(), inputs={"x": Tensor.empty(Variable("batch", 1, 64), SIZES[0])})
    try:
        x = np.ones((64, SIZES[0]), np.float32)
        built = compiled()
        m.forward(x=x[:7])
        first = compiled()
        m.forward(x=x[:50])
        return built - start, first - built, compiled() - first
    finally:
        m.dispose()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    jit, fit = [], []
    for _ in range(a.rounds):  # alternate, keep the best of each
        jit.append(jit_loop(a.epochs))
        fit.append(model_fit(a.epochs))
    print(f"MLP 784-512-512-10 Adam, batch {BATCH}, host data, best of {a.rounds}:")
    print(f"  TinyJit hand-written loop  {max(jit):8.1f} steps/s")
    print(f"  Model.fit                  {max(fit):8.1f} steps/s   ({max(fit) / max(jit):.2f}x)")
    built, first, second = variable_batch_compiles_once()
    print(f"variable batch 1..64, programs compiled: construction {built}, first call (batch 7) {first}, "
          f"second call (batch 50) {second}")


if __name__ == "__main__":
    main()
