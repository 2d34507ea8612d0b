"""Capture is per thread: a Model or TinyJit capturing in one thread records only that thread's work.

Three worker threads realize small graphs without pause (elementwise ops, matmuls, reductions,
random numbers, host reads, a jitted function of their own) and check every value against NumPy,
while the main thread builds, fits and saves a `models.Sequential` (or captures a TinyJit). The
interleaving is forced, not hoped for: each capture the main thread opens waits, while recording,
until every worker has run a whole step of work inside it (`_Workers.overlap`). Every bundle must
equal, byte for byte, the one a capture done alone gives from the same seed (so its calls per
entrypoint, its parameters and its RNG state too), and no thread may raise.
CI builds 50 models; POLY_LONG_TESTS=1 builds 500.
"""
from __future__ import annotations

import contextlib
import os
import threading
import time
from typing import Callable, Iterator

import numpy as np
import pytest

from polygrad import Tensor, bundle, models
from polygrad.engine import capture as capture_mod
from polygrad.engine.jit import TinyJit

LONG = os.environ.get("POLY_LONG_TESTS", "") not in ("", "0")
DEVICE = "CPU"
CFG = {"input": {"name": "x", "shape": [6]}, "batch": 8,
       "layers": [{"type": "linear", "out_features": 5, "activation": "relu"},
                  {"type": "linear", "out_features": 3}],
       "output": "logits", "loss": "cross_entropy", "seed": 7}
_rng = np.random.default_rng(0)
X = _rng.standard_normal((16, 6)).astype(np.float32)
Y = _rng.integers(0, 3, 16).astype(np.int32)
SHAPES = [(2, 3), (3, 4), (4, 4), (5, 2)]  # a short menu, so the workers' kernels compile once


def _build_fit_save() -> bytes:
    m = models.Sequential(CFG)
    try:
        m.fit({"x": X, "y": Y}, epochs=1, batch_size=8, optimizer="adam", lr=0.01, verbose=False)
        return m.save()
    finally:
        m.dispose()


def _calls(data: bytes) -> dict[str, int]:
    manifest, _ = bundle.read(data)
    return {name: len(e["calls"]) for name, e in manifest["entrypoints"].items()}


def _stored(data: bytes, role: str) -> dict[str, bytes]:
    """The stored bytes of every buffer of this role, by name."""
    manifest, body = bundle.read(data)
    return {b["name"]: bytes(body[b["data"]["offset"]:b["data"]["offset"] + b["data"]["nbytes"]])
            for b in manifest["buffers"] if b["role"] == role}


def _close(got: np.ndarray, want: np.ndarray, what: str) -> None:
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=what)


def _scaled_sum(x: Tensor) -> Tensor:
    return (x * 3 - 1).sum(1).realize()


class _Workers:
    """Threads that realize arbitrary small graphs, each value checked against NumPy, until they exit."""

    def __init__(self, n: int = 3):
        self.started = [0] * n  # steps (a realize and its check) begun so far, per worker
        self.finished = [0] * n
        self.errors: list[str] = []
        self.cond = threading.Condition()
        self.stopping = False
        self.threads = [threading.Thread(target=self._run, args=(k,), daemon=True) for k in range(n)]

    def __enter__(self) -> "_Workers":
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        for t in self.threads:
            t.join(60)
        assert not any(t.is_alive() for t in self.threads), "a worker thread hung"

    def overlap(self) -> None:
        """Block until every worker has run a whole step begun after this call."""
        with self.cond:
            target = [n + 1 for n in self.started]
            done = self.cond.wait_for(lambda: all(n >= t for n, t in zip(self.finished, target)), timeout=60)
        assert done, "the workers made no progress"

    def _run(self, k: int) -> None:
        rng = np.random.default_rng(100 + k)
        jitted = TinyJit(_scaled_sum)
        while not self.stopping:
            for step in self._round(rng, jitted):
                with self.cond:
                    self.started[k] += 1
                try:
                    step()
                except BaseException as e:  # noqa: BLE001 (any failure is reported by the test)
                    self.errors.append(f"worker {k}: {type(e).__name__}: {e}")
                with self.cond:
                    self.finished[k] += 1
                    self.cond.notify_all()
                time.sleep(0.005)  # leaves the main thread most of the interpreter between steps

    @staticmethod
    def _round(rng: np.random.Generator, jitted: TinyJit) -> list[Callable[[], None]]:
        """The steps of one pass over the kinds of work, each a realize checked against NumPy."""
        m, n = SHAPES[rng.integers(len(SHAPES))]
        a = rng.standard_normal((m, n)).astype(np.float32)
        b = rng.standard_normal((m, n)).astype(np.float32)
        c = rng.standard_normal((n, m)).astype(np.float32)
        x = rng.standard_normal((4, 3)).astype(np.float32)  # fixed shape: the jit replays after two calls
        ta, tb, tc = Tensor(a, device=DEVICE), Tensor(b, device=DEVICE), Tensor(c, device=DEVICE)

        def rand() -> None:
            r = Tensor.rand(m, n, device=DEVICE).realize()
            rv = r.numpy()
            assert ((rv >= 0) & (rv < 1)).all(), "rand range"
            _close((r * 2 + ta).numpy(), rv * 2 + a, "rand reuse")

        return [lambda: _close((ta * tb + 1).exp().numpy(), np.exp(a * b + 1), "elementwise"),
                lambda: _close((ta @ tc).numpy(), a @ c, "matmul"),
                lambda: _close(ta.sum(1).numpy(), a.sum(1), "sum"),
                lambda: _close(tb.max(0).numpy(), b.max(0), "max"),
                lambda: _close(np.float32((ta - tb).abs().mean().item()), np.abs(a - b).mean(), "mean"),
                rand,
                lambda: _close(jitted(Tensor(x, device=DEVICE).realize()).numpy(), (x * 3 - 1).sum(1), "jit")]


@contextlib.contextmanager
def _overlapping(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Workers]:
    """Workers running, and every capture the calling thread opens held open until each has done a step."""
    me = threading.current_thread()
    with _Workers() as workers:
        enter = capture_mod.Capture.__enter__

        def entered(self):
            out = enter(self)
            if threading.current_thread() is me:
                workers.overlap()
            return out

        monkeypatch.setattr(capture_mod.Capture, "__enter__", entered)
        try:
            yield workers
        finally:
            monkeypatch.undo()
    assert not workers.errors, workers.errors[:5]


def test_model_capture_records_only_its_own_thread(monkeypatch):
    alone = _build_fit_save()  # the reference, before any other thread runs
    calls, params = _calls(alone), _stored(alone, "parameter")
    assert calls["optimizer_step"] > 0 and calls["train_step"] == calls["loss"] + calls["optimizer_step"]
    assert len(params) == 4 and _stored(alone, "constant") == {}
    with _overlapping(monkeypatch) as workers:
        for i in range(500 if LONG else 50):
            got = _build_fit_save()
            assert _calls(got) == calls, f"build {i}: calls per entrypoint {_calls(got)}, alone {calls}"
            assert _stored(got, "parameter") == params, f"build {i}: the trained parameters differ"
            assert _stored(got, "constant") == {}, f"build {i}: another thread's data became constants"
            assert got == alone, f"build {i}: the bundle differs from the one captured alone"
            assert not workers.errors, workers.errors[:5]


def _jit_step(x: Tensor, w: Tensor) -> Tensor:
    return ((x @ w).relu() + 1).sum(0).realize()


def test_tinyjit_capture_records_only_its_own_thread(monkeypatch):
    rng = np.random.default_rng(5)
    w = rng.standard_normal((6, 4)).astype(np.float32)
    tw = Tensor(w, device=DEVICE).realize()
    alone = TinyJit(_jit_step)
    for _ in range(3):
        alone(Tensor(X[:8], device=DEVICE).realize(), tw)
    n_kernels = alone.graph.n_kernels
    with _overlapping(monkeypatch) as workers:
        for i in range(20 if LONG else 5):
            jitted = TinyJit(_jit_step)
            for step in range(4):  # warm-up, capture (with the workers' rounds inside it), two replays
                x = rng.standard_normal((8, 6)).astype(np.float32)
                got = jitted(Tensor(x, device=DEVICE).realize(), tw).numpy()
                _close(got, (np.maximum(x @ w, 0) + 1).sum(0), f"jit {i} call {step}")
            assert jitted.graph.n_kernels == n_kernels, \
                f"jit {i}: {jitted.graph.n_kernels} kernels, alone {n_kernels}"
            assert not workers.errors, workers.errors[:5]
