"""Write the small bundles the JavaScript unit tests load (test/fixtures/), with Python's results for them.

linear.pgb and the MLPs are version-1 bundles (mlp_wide.pgb is wide enough for the register tiles);
decoder.pgb is version 2 (an embedding gather, `cache`
buffers, a `decode` entrypoint taking the Variable `pos` as an int, Variables in two dimensions);
embedding_sgd.pgb trains an embedding, whose gradient is a scatter-add (accumulating stores).

Run from the repository root: `python polygrad-js/tools/make_fixtures.py [--out DIR]` (default
polygrad-js/test/fixtures). The cross-language tests (tests/test_js.py) build their own bundles every run;
these fixtures only let `node --test` run without Python. Everything is seeded, so the files change only
when polygrad's capture or format changes; tests/test_js_fixtures.py fails when they differ from what
this script writes now (regenerate them), and keeps loading the bundles of test/fixtures/saved_at_20af852/
(written by polygrad before issue 29) in both languages.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from polygrad import Model, Tensor, Variable, nn

OUT = Path(__file__).resolve().parent.parent / "test" / "fixtures"


class Linear:
    def __init__(self):
        self.a = Tensor([0.0])
        self.b = Tensor([0.0])

    def __call__(self, x):
        return {"prediction": self.a * x + self.b}


class MLP:
    def __init__(self):
        self.l1, self.l2 = nn.Linear(4, 8), nn.Linear(8, 3)

    def __call__(self, x):
        return {"logits": self.l2(self.l1(x).relu())}


class Wide:
    def __init__(self):
        self.l1, self.l2 = nn.Linear(32, 16), nn.Linear(16, 8)

    def __call__(self, x):
        return {"logits": self.l2(self.l1(x).relu())}


def xent(o, y):
    return o["logits"].sparse_categorical_crossentropy(y)


class Decoder:
    """A one-layer causal decoder over token ids with a key/value cache: forward(ids[batch, tokens]) fills the
    cache, decode(ids[batch, 1], pos) writes position pos and attends over cache[:, :pos + 1]."""

    def __init__(self, vocab: int = 13, dim: int = 8, batch: int = 2, seq: int = 8):
        self.emb = nn.Embedding(vocab, dim)
        self.q, self.k, self.v = (nn.Linear(dim, dim, bias=False) for _ in range(3))
        self.out = nn.Linear(dim, vocab)
        self.mask = Tensor(np.triu(np.full((seq, seq), -np.inf, np.float32), 1), requires_grad=False)
        self.k_cache = Tensor.zeros(batch, seq, dim).contiguous().realize()
        self.v_cache = Tensor.zeros(batch, seq, dim).contiguous().realize()

    def _attend(self, h, keys, values, mask=None):
        s = self.q(h) @ keys.transpose(-1, -2) / np.sqrt(h.shape[-1])
        return {"logits": self.out(h + (s if mask is None else s + mask).softmax(-1) @ values)}

    def __call__(self, ids):
        b, t = ids.shape[0], ids.shape[1]
        h = self.emb(ids)
        self.k_cache[:b, :t].assign(self.k(h)).realize()
        self.v_cache[:b, :t].assign(self.v(h)).realize()
        return self._attend(h, self.k_cache[:b, :t], self.v_cache[:b, :t], self.mask[:t, :t])

    def decode(self, ids, pos):
        b = ids.shape[0]
        h = self.emb(ids)
        self.k_cache[:b, pos:pos + 1].assign(self.k(h)).realize()
        self.v_cache[:b, pos:pos + 1].assign(self.v(h)).realize()
        return self._attend(h, self.k_cache[:b, :pos + 1], self.v_cache[:b, :pos + 1])


class Bag:
    def __init__(self):
        self.emb, self.out = nn.Embedding(13, 6), nn.Linear(6, 3)

    def __call__(self, ids):
        return {"logits": self.out(self.emb(ids).mean(1))}


def decoder_fixtures(ref: dict, out: Path) -> None:
    Tensor.manual_seed(2)
    dec = Decoder()
    batch, tokens = Variable("batch", 1, 2), Variable("tokens", 1, 8)
    model = Model(dec, inputs={"ids": Tensor.empty(batch, tokens, dtype="int32")},
                  params={k: v for k, v in nn.state.get_state_dict(dec).items() if "cache" not in k},
                  caches={"k_cache": dec.k_cache, "v_cache": dec.v_cache},
                  entrypoints={"decode": (dec.decode, {"ids": Tensor.empty(batch, 1, dtype="int32"),
                                                       "pos": Variable("pos", 0, 7)})})
    (out / "decoder.pgb").write_bytes(model.save())
    ids = np.array([[3, 1, 4, 1, 5, 9], [2, 6, 5, 3, 5, 8]], np.int32)
    r = {"ids": ids.tolist(), "forward": model.forward(ids=ids[:, :3])["logits"].numpy().tolist()}
    r["decode"] = [model.call("decode", {"ids": ids[:, p:p + 1], "pos": p})["logits"].numpy().tolist()
                   for p in range(3, 6)]
    model.dispose()
    fresh = Model.load(str(out / "decoder.pgb"))  # caches start zeroed
    r["fresh_decode"] = fresh.call("decode", {"ids": ids[:1, 2:3], "pos": 2})["logits"].numpy().tolist()
    fresh.dispose()
    ref["decoder"] = r

    Tensor.manual_seed(3)
    rng = np.random.default_rng(3)
    ids = rng.integers(0, 13, (8, 5)).astype(np.int32)
    y = rng.integers(0, 3, 8).astype(np.int32)
    bag = Model(Bag(), inputs={"ids": Tensor.empty(Variable("batch", 1, 8), 5, dtype="int32")},
                targets={"y": Tensor.empty(Variable("batch", 1, 8), dtype="int32")}, loss=xent)
    (out / "embedding_sgd.pgb").write_bytes(bag.save())
    bag.dispose()
    bag = Model.load(str(out / "embedding_sgd.pgb"))
    losses = bag.fit({"ids": ids, "y": y}, epochs=3, batch_size=4, optimizer="sgd", lr=0.5, verbose=False)
    ref["embedding"] = {"ids": ids.tolist(), "y": y.tolist(), "sgd": losses}
    bag.dispose()


def main(out: Path = OUT) -> None:
    """Write the fixtures and reference.json into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    ref: dict = {}
    Tensor.manual_seed(0)
    lin = Model(Linear(), inputs={"x": Tensor.empty(5)}, targets={"y": Tensor.empty(5)},
                loss=lambda o, y: (o["prediction"] - y).square().mean())
    lin.fit({"x": [-2, -1, 0, 1, 2], "y": [-4, -1, 2, 5, 8]}, epochs=100, optimizer="sgd", lr=0.1, verbose=False)
    (out / "linear.pgb").write_bytes(lin.save(include_optimizer=False))
    ref["linear"] = {"x": [3, 4, 5, 6, 7], "prediction": lin.forward(x=[3, 4, 5, 6, 7])["prediction"].numpy().tolist()}
    lin.dispose()

    Tensor.manual_seed(1)
    rng = np.random.default_rng(1)
    X = rng.standard_normal((12, 4)).astype(np.float32)
    Y = rng.integers(0, 3, 12).astype(np.int32)
    batch = Variable("batch", 1, 16)
    mlp = Model(MLP(), inputs={"x": Tensor.empty(batch, 4)}, targets={"y": Tensor.empty(batch, dtype="int32")},
                loss=xent)
    (out / "mlp_untrained.pgb").write_bytes(mlp.save())
    ref["mlp"] = {"x": X.tolist(), "y": Y.tolist(),
                  "logits_untrained": mlp.forward(x=X[:5])["logits"].numpy().tolist()}
    first = mlp.fit({"x": X, "y": Y}, epochs=1, batch_size=4, optimizer="adam", lr=0.01, verbose=False)
    (out / "mlp_adam.pgb").write_bytes(mlp.save())
    ref["mlp"]["adam_first"] = first
    ref["mlp"]["adam_resume"] = mlp.fit({"x": X, "y": Y}, epochs=2, batch_size=4, verbose=False)
    mlp.dispose()

    # wide enough for the register tiles and the few-rows variant (x @ W.T split into lanes, unrolled)
    Tensor.manual_seed(4)
    Xw = np.random.default_rng(4).standard_normal((8, 32)).astype(np.float32)
    wide = Model(Wide(), inputs={"x": Tensor.empty(Variable("batch", 1, 8), 32)})
    (out / "mlp_wide.pgb").write_bytes(wide.save())
    ref["wide"] = {"x": Xw.tolist(), **{str(n): wide.forward(x=Xw[:n])["logits"].numpy().tolist() for n in (1, 3, 8)}}
    wide.dispose()
    decoder_fixtures(ref, out)
    (out / "reference.json").write_text(json.dumps(ref, indent=1) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[sys.argv.index("--out") + 1]) if "--out" in sys.argv else OUT)
