"""Write the small bundles the JavaScript unit tests load (test/fixtures/), with Python's results for them.

Run from the repository root: `python polygrad-js/tools/make_fixtures.py`. The cross-language tests
(tests/test_js.py) build their own bundles every run; these fixtures only let `node --test` run without
Python. Everything is seeded, so the files change only when polygrad's capture or format changes.
"""
from __future__ import annotations

import json
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


def xent(o, y):
    return o["logits"].sparse_categorical_crossentropy(y)


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    ref: dict = {}
    Tensor.manual_seed(0)
    lin = Model(Linear(), inputs={"x": Tensor.empty(5)}, targets={"y": Tensor.empty(5)},
                loss=lambda o, y: (o["prediction"] - y).square().mean())
    lin.fit({"x": [-2, -1, 0, 1, 2], "y": [-4, -1, 2, 5, 8]}, epochs=100, optimizer="sgd", lr=0.1, verbose=False)
    (OUT / "linear.pgb").write_bytes(lin.save(include_optimizer=False))
    ref["linear"] = {"x": [3, 4, 5, 6, 7], "prediction": lin.forward(x=[3, 4, 5, 6, 7])["prediction"].numpy().tolist()}
    lin.dispose()

    Tensor.manual_seed(1)
    rng = np.random.default_rng(1)
    X = rng.standard_normal((12, 4)).astype(np.float32)
    Y = rng.integers(0, 3, 12).astype(np.int32)
    batch = Variable("batch", 1, 16)
    mlp = Model(MLP(), inputs={"x": Tensor.empty(batch, 4)}, targets={"y": Tensor.empty(batch, dtype="int32")},
                loss=xent)
    (OUT / "mlp_untrained.pgb").write_bytes(mlp.save())
    ref["mlp"] = {"x": X.tolist(), "y": Y.tolist(),
                  "logits_untrained": mlp.forward(x=X[:5])["logits"].numpy().tolist()}
    first = mlp.fit({"x": X, "y": Y}, epochs=1, batch_size=4, optimizer="adam", lr=0.01, verbose=False)
    (OUT / "mlp_adam.pgb").write_bytes(mlp.save())
    ref["mlp"]["adam_first"] = first
    ref["mlp"]["adam_resume"] = mlp.fit({"x": X, "y": Y}, epochs=2, batch_size=4, verbose=False)
    mlp.dispose()
    (OUT / "reference.json").write_text(json.dumps(ref, indent=1) + "\n")


if __name__ == "__main__":
    main()
