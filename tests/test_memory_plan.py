"""A Model's temporaries share buffers when no entrypoint has two of them alive at once (model/executor.py
share_temporaries, as polygrad-js's planMemory): a 12-layer GPT-2 forward over 1024 tokens held 1.7 GB of
temporaries with a buffer each (peak RSS 2.4 GB), 107 MB shared (0.9 GB)."""
from __future__ import annotations

import numpy as np

from polygrad import Model, Tensor, nn
from polygrad.model.executor import share_temporaries


class Deep:
    def __init__(self, layers: int = 6, width: int = 32):
        self.layers = [nn.Linear(width, width) for _ in range(layers)]

    def __call__(self, x):
        for layer in self.layers:
            x = (layer(x).relu() * 2).softmax(-1) + x  # several kernels a layer: temporaries between them
        return {"y": x}


def _model() -> Model:
    Tensor.manual_seed(0)
    return Model(Deep(), inputs={"x": Tensor.empty(4, 32)}, targets={"t": Tensor.empty(4, 32)},
                 loss=lambda out, t: ((out["y"] - t) ** 2).mean())


def _live(prog) -> dict[int, list[tuple[str, int, int]]]:
    out: dict[int, list[tuple[str, int, int]]] = {}
    for name, entry in prog.entries.items():
        seen: dict[int, list[int]] = {}
        for i, call in enumerate(entry.calls):
            for s in call.args:
                seen.setdefault(s, [i, i])[1] = i
        for s, (lo, hi) in seen.items():
            out.setdefault(s, []).append((name, lo, hi))
    return out


def test_temporaries_alive_at_once_never_share_and_the_rest_do():
    model = _model()
    try:
        model.fit({"x": np.ones((8, 32), np.float32), "t": np.zeros((8, 32), np.float32)}, batch_size=4,
                  optimizer="adam", verbose=False)
        prog, bufs = model._p, model._x.bufs
        temps = [i for i, s in enumerate(prog.slots) if s.role == "temporary"]
        hosts = share_temporaries(prog)
        assert len(temps) > 8 and len({id(bufs[t]) for t in temps}) < len(temps) / 2, (len(temps), len(hosts))
        live = _live(prog)
        for a in temps:
            for b in temps:
                if a < b and bufs[a] is bufs[b]:
                    assert prog.slots[a].dtype == prog.slots[b].dtype
                    assert bufs[a].size >= max(prog.slots[a].size, prog.slots[b].size)
                    clash = [(x, y) for x in live.get(a, []) for y in live.get(b, [])
                             if x[0] == y[0] and x[1] <= y[2] and y[1] <= x[2]]
                    assert not clash, (a, b, clash)
        for s in range(len(prog.slots)):
            if s not in temps:  # parameters, gradients, optimizer state, inputs, outputs keep their own
                assert sum(bufs[s] is b for b in bufs) == 1, prog.slots[s].name
    finally:
        model.dispose()


def test_shared_temporaries_give_the_unshared_results(monkeypatch):
    rng = np.random.default_rng(1)
    x, t = rng.standard_normal((8, 32)).astype(np.float32), rng.standard_normal((8, 32)).astype(np.float32)
    runs = []
    for share in (True, False):
        if not share:
            monkeypatch.setattr("polygrad.model.executor.share_temporaries", lambda prog: {})
        model = _model()
        try:
            losses = model.fit({"x": x, "t": t}, batch_size=4, epochs=3, optimizer="adam", lr=0.01, verbose=False)
            runs.append((losses, model.forward(x=x[:4])["y"].numpy()))
        finally:
            model.dispose()
    assert runs[0][0] == runs[1][0]
    np.testing.assert_array_equal(runs[0][1], runs[1][1])
