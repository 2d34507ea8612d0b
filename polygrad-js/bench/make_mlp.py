"""Write bench/mlp784.pgb: the benchmark MLP 784-512-512-10 (ReLU), a Variable batch of 1..128, cross-entropy
loss, seeded weights. Run from the repository root: `python polygrad-js/bench/make_mlp.py`."""
from __future__ import annotations

import sys
from pathlib import Path

from polygrad import Model, Tensor, Variable, nn

OUT = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent / "mlp784.pgb"


class MLP:
    def __init__(self) -> None:
        self.l1, self.l2, self.l3 = nn.Linear(784, 512), nn.Linear(512, 512), nn.Linear(512, 10)

    def __call__(self, x):
        return {"logits": self.l3(self.l2(self.l1(x).relu()).relu())}


if __name__ == "__main__":
    Tensor.manual_seed(0)
    batch = Variable("batch", 1, 128)
    model = Model(MLP(), inputs={"x": Tensor.empty(batch, 784)}, targets={"y": Tensor.empty(batch, dtype="int32")},
                  loss=lambda o, y: o["logits"].sparse_categorical_crossentropy(y))
    model.save(str(OUT))
    model.dispose()
    print(f"wrote {OUT}")
