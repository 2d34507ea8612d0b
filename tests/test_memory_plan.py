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


def _first_fit_model(prog) -> dict[int, int]:
    """share_temporaries' rule, slot against slot: biggest first, each temporary joins the first buffer of its
    dtype none of whose slots is alive with it in one entrypoint (closed call ranges)."""
    temps = [i for i, s in enumerate(prog.slots) if s.role == "temporary"]
    live = _live(prog)
    hosts: list[list[int]] = []
    out = {}
    for t in sorted(temps, key=lambda t: -prog.slots[t].size * prog.slots[t].dtype.itemsize):
        for group in hosts:
            clash = any(x[0] == y[0] and x[1] <= y[2] and y[1] <= x[2]
                        for m in group for x in live.get(m, []) for y in live.get(t, []))
            if prog.slots[group[0]].dtype == prog.slots[t].dtype and not clash:
                group.append(t)
                out[t] = group[0]
                break
        else:
            hosts.append([t])
    return out if len(temps) > 1 else {}


def test_sharing_follows_the_first_fit_rule_on_random_plans():
    """Random plans (three entrypoints, two dtypes, ranges that touch at one call, slots unused by an
    entrypoint or by all): the bisection over each buffer's sorted ranges gives the slot-by-slot rule's
    buffers exactly."""
    from types import SimpleNamespace as NS

    from polygrad.dtype import dtypes
    rng = np.random.default_rng(3)
    for _ in range(200):
        n = int(rng.integers(2, 40))
        slots = [NS(role="temporary" if rng.random() < 0.8 else "parameter", size=int(rng.integers(1, 6)),
                    dtype=dtypes.float32 if rng.random() < 0.7 else dtypes.int8) for _ in range(n)]
        entries = {}
        for e in range(3):
            calls = [NS(args=tuple(int(a) for a in rng.choice(n, size=int(rng.integers(1, 3)), replace=False)))
                     for _ in range(int(rng.integers(1, 25)))]
            entries[f"e{e}"] = NS(calls=calls)
        prog = NS(slots=slots, entries=entries)
        assert share_temporaries(prog) == _first_fit_model(prog)
