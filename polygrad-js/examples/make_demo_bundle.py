"""Write examples/demo.pgb for train-demo.html: a small MLP classifier of 2-D points (64 per batch) with a
cross-entropy loss, untrained. Run from the repository root: `python polygrad-js/examples/make_demo_bundle.py`,
then serve polygrad-js/ (e.g. `python -m http.server -d polygrad-js`) and open /examples/train-demo.html."""
from __future__ import annotations

import sys
from pathlib import Path

from polygrad import Model, Tensor, nn

OUT = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent / "demo.pgb"


class Net:
    def __init__(self) -> None:
        self.l1, self.l2, self.l3 = nn.Linear(2, 32), nn.Linear(32, 32), nn.Linear(32, 2)

    def __call__(self, x):
        return {"logits": self.l3(self.l2(self.l1(x).tanh()).tanh())}


if __name__ == "__main__":
    Tensor.manual_seed(0)
    model = Model(Net(), inputs={"x": Tensor.empty(64, 2)}, targets={"y": Tensor.empty(64, dtype="int32")},
                  loss=lambda o, y: o["logits"].sparse_categorical_crossentropy(y))
    model.save(str(OUT))
    model.dispose()
    print(f"wrote {OUT}")
